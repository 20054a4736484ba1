"""tuning_table.py on a hand-written winners.tsv: a case whose candidate won in the median and in every round by at
least --min-gain becomes a class row with the candidate's tile, cluster and schedule; a case the default won, or
one whose win did not hold in every round, or fell short of the gain, gives none, as does a varlen-K case won by a
ping-pong candidate (no such kernel); a candidate naming no tile is an error."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "tuning_table.py")
HEADER = "case\tmode\tepilogue\tgather\tb_layout\tn\tk\trows_per_group\tdefault_tflops\tbest\tbest_tflops\t" \
         "best_over_default\tper_round\n"
WINNERS = HEADER + "".join("\t".join(row) + "\n" for row in [
    ["a", "varlen_m", "gated", "a", "nk", "512", "768", "512.0", "100", "MOEKIT_GEMM_PATH=wgmma,MOEKIT_GEMM_TILE=128x128",
     "120", "1.200", "1.150-1.250"],
    ["b", "varlen_k", "store", "none", "nk", "256", "1024", "", "200", "default", "200", "1.000", "1.000-1.000"],
    ["c", "varlen_m", "store", "none", "kn", "1024", "512", "300.0", "100",
     "MOEKIT_GEMM_PATH=wgmma_pair,MOEKIT_GEMM_SCHEDULE=pingpong", "103", "1.030", "0.990-1.060"],
    ["d", "varlen_m", "store", "none", "kn", "1024", "512", "300.0", "100",
     "MOEKIT_GEMM_PATH=wgmma_pair,MOEKIT_GEMM_SCHEDULE=pingpong", "108", "1.080", "1.065-1.095"],
    ["e", "varlen_m", "bias", "none", "nk", "64", "64", "64.0", "100", "MOEKIT_GEMM_PATH=wgmma,MOEKIT_GEMM_TILE=128x128",
     "101", "1.010", "1.005-1.020"],
    ["g", "varlen_k", "store", "b", "nk", "4096", "2048", "256.0", "100",
     "MOEKIT_GEMM_PATH=wgmma,MOEKIT_GEMM_SCHEDULE=pingpong", "110", "1.100", "1.080-1.120"],
])


def run(text, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, SCRIPT, f.name, *args], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


def main():
    out = run(WINNERS)
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    assert [r[:13] for r in rows] == [
        ["varlen_m", "gated", "a", "nk", "512", "512", "768", "768", "256", "1024", "128x128", "1", "cooperative"],
        ["varlen_m", "store", "none", "kn", "1024", "1024", "512", "512", "150", "600", "128x128", "2", "pingpong"],
    ], rows
    assert all(len(r) == 14 for r in rows), rows
    assert rows[0][13].startswith("a 1.200x (1.150-1.250 per round) with "), rows[0][13]
    # A lower bar takes case e too.
    low = run(WINNERS, "--min-gain", "1.005")
    assert [line.split("\t")[1] for line in low.stdout.splitlines()] == ["gated", "store", "bias"], low.stdout
    # A candidate that names no tile cannot become a row.
    bad = run(HEADER + "f\tvarlen_m\tstore\tnone\tnk\t64\t64\t64.0\t100\tMOEKIT_GEMM_PATH=wgmma\t110\t1.100\t1.100-1.100\n")
    assert bad.returncode != 0 and "names no tile" in bad.stderr, bad.stderr
    print("tuning_table.py: all checks passed")


if __name__ == "__main__":
    main()
