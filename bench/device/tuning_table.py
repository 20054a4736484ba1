#!/usr/bin/env python3
"""Rows of the grouped GEMM's table of measured winners (cuda/gemm/gemm_tuning_sm90.tsv) from tune_gemm.sh's
winners.tsv files: every case whose fastest candidate beat the plan's default by at least --min-gain (default 1.06)
in the median and in every round becomes a class row — its mode, epilogue, gather and B layout, its n and k, rows per
group from half to twice the case's mean — with the candidate's tile, cluster and schedule. Cases the default won
give no row (the heuristic keeps them), and so do varlen-K cases won by a ping-pong candidate (varlen-K products have
no ping-pong kernel: that candidate ran the heuristic's tile, unpaired). Rows are printed tab-separated, without
the table's header.

NOTE: measured on the H200 (gemm_rows_per_expert.json, 2 rounds): a candidate that ran the very kernel of the
default came out 1.049x (1.022-1.077 per round), so gains of a few percent at 2 rounds are the position of a run in
the round, not the kernel; hence the 1.06 bar.

    bench/device/tuning_table.py WINNERS.tsv [WINNERS.tsv ...] [--min-gain G] >> cuda/gemm/gemm_tuning_sm90.tsv
"""
import argparse
import csv
import sys


def choice(settings):
    """(tile, cluster, schedule) of a candidate's settings, e.g. MOEKIT_GEMM_PATH=wgmma_pair,MOEKIT_GEMM_TILE=128x128."""
    env = dict(item.split("=", 1) for item in settings.split(",") if "=" in item)
    schedule = env.get("MOEKIT_GEMM_SCHEDULE", "cooperative")
    tile = "128x128" if schedule == "pingpong" else env.get("MOEKIT_GEMM_TILE")
    if tile is None:
        raise ValueError(f"candidate {settings!r} names no tile: tune with candidates that set MOEKIT_GEMM_TILE")
    cluster = "2" if env.get("MOEKIT_GEMM_PATH") == "wgmma_pair" else "1"
    return tile, cluster, schedule


def rows(paths, min_gain):
    out = []
    for path in paths:
        with open(path, newline="") as f:
            for w in csv.DictReader(f, delimiter="\t"):
                if w["best"] == "default":
                    continue
                if w["mode"] == "varlen_k" and "MOEKIT_GEMM_SCHEDULE=pingpong" in w["best"]:
                    continue
                gain = float(w["best_over_default"])
                low = float(w["per_round"].split("-")[0])
                if gain < min_gain or low < 1.0:
                    continue
                mean = float(w["rows_per_group"])
                tile, cluster, schedule = choice(w["best"])
                measured = f"{w['case']} {gain:.3f}x ({w['per_round']} per round) with {w['best']}"
                out.append([w["mode"], w["epilogue"], w["gather"], w["b_layout"], w["n"], w["n"], w["k"], w["k"],
                            str(int(mean / 2)), str(int(mean * 2)), tile, cluster, schedule, measured])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("winners", nargs="+")
    parser.add_argument("--min-gain", type=float, default=1.06)
    args = parser.parse_args()
    writer = csv.writer(sys.stdout, delimiter="\t", lineterminator="\n")
    for row in rows(args.winners, args.min_gain):
        writer.writerow(row)


if __name__ == "__main__":
    main()
