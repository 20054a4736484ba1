#!/usr/bin/env python3
"""stall_regions.py on a hand-written source-page CSV of 11 instructions, 100 samples: each region's share and top
reason, and the most-sampled instruction listed first."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "stall_regions.py")
FIXTURE = os.path.join(HERE, "stall_regions_fixture.sass.csv")


def run(*args):
    done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def main():
    code, out, err = run(FIXTURE, "--top", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "100 samples", lines[0]
    regions = {line[:18].strip(): line[18:].split() for line in lines[1:] if line[:1] != " " and "%" in line[18:25]}
    expected = {
        "prologue": ("2.0%", "long_sb"),
        "consumer mainloop": ("18.0%", "wait"),
        "consumer epilogue": ("20.0%", "no_inst"),
        "producer": ("30.0%", "long_sb"),
        "wait stubs": ("30.0%", "long_sb"),
    }
    assert set(regions) == set(expected), regions
    for name, (share, reason) in expected.items():
        assert regions[name][0] == share and regions[name][1] == reason, (name, regions[name])
    listed = [line for line in lines if line.startswith("  ")]
    assert len(listed) == 2 and "LDGSTS" in listed[0] and "producer" in listed[0], listed
    assert "BRA 0x7f0000000080" in listed[1] and "wait stubs" in listed[1], listed
    # Not a source page: a clear error, exit status 1.
    code, _, err = run(__file__)
    assert code == 1 and "no 'Warp Stall Sampling (All Samples)' column" in err, (code, err)
    print("test_stall_regions: ok")


if __name__ == "__main__":
    main()
