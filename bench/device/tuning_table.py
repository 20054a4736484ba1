#!/usr/bin/env python3
"""Rows of the grouped GEMM's table of measured winners (cuda/gemm/gemm_tuning_sm90.tsv) from tune_gemm.sh's
winners.tsv files: every case whose fastest candidate beat the plan's default by at least --min-gain (default 1.02)
in the median and in every round becomes a class row — its mode, epilogue, gather and B layout, its n and k, rows per
group from half to twice the case's mean — with the candidate's tile, cluster and schedule. Cases the default won
give no row (the heuristic keeps them). Rows are printed tab-separated, without the table's header.

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
    parser.add_argument("--min-gain", type=float, default=1.02)
    args = parser.parse_args()
    writer = csv.writer(sys.stdout, delimiter="\t", lineterminator="\n")
    for row in rows(args.winners, args.min_gain):
        writer.writerow(row)


if __name__ == "__main__":
    main()
