#!/usr/bin/env python3
"""Joins result files of moekit-bench and/or torch_bench.py (the same JSON schema) into one side-by-side table.

Cases are matched by name, in the order of the first file. For each file: the median time (us) and TFLOP/s (or
GB/s for memory-bound cases); then the time ratio of every other file to the first (> 1: the first is faster).

usage: python3 bench/compare/join_results.py FIRST.json OTHER.json [MORE.json ...] [--markdown]
"""
import argparse
import json


def label(results, path):
    meta = results.get("meta", {})
    return meta.get("backend") or path


def rate(record):
    for key, unit in (("tflops", "TF/s"), ("gbps", "GB/s")):
        value = record.get(key)
        if value is not None:
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return "-"


def median(record):
    t = (record or {}).get("time_us", {}).get("median")
    return t if (record or {}).get("status") == "ok" else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (for docs/performance.md)")
    args = parser.parse_args()
    if len(args.files) < 2:
        parser.error("give at least two result files")

    runs = []
    for path in args.files:
        with open(path) as f:
            results = json.load(f)
        name = label(results, path)
        if any(name == other for other, _ in runs):
            name += f"#{len(runs) + 1}"
        runs.append((name, {c["name"]: c for c in results["cases"]}))
    names = list(runs[0][1])

    header = ["case"]
    for name, _ in runs:
        header += [f"{name} us", f"{name} rate"]
    header += [f"{name} / {runs[0][0]}" for name, _ in runs[1:]]
    rows = []
    for case in names:
        row = [case]
        for _, records in runs:
            record = records.get(case)
            t = median(record)
            row += ["-" if t is None else f"{t:.1f}", rate(record) if t is not None else (record or {}).get(
                "status", "absent")]
        first = median(runs[0][1].get(case))
        for _, records in runs[1:]:
            other = median(records.get(case))
            row.append("-" if first is None or other is None or first <= 0 else f"{other / first:.2f}")
        rows.append(row)

    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))


if __name__ == "__main__":
    main()
