#!/usr/bin/env python3
"""moekit against SonicMoE per MoE layer shape, by CUDA events and by GPU time, as one Markdown table.

Reads result files of moekit-bench run with --breakdown (backend cuda) and of bench/compare/sonicmoe_bench.py run
with --kernel-time (backend sonicmoe), several of each allowed (a later file's case replaces an earlier one's).
Per shape (T, H, I, E, K): the forward's median time per call by events, the backward's (t(fwd + bwd) - t(fwd)),
and the GPU time per call, the kernels' CUPTI durations summed, of the forward and of forward + backward; each
with SonicMoE's time over moekit's (moekit's speed-up: above 1, moekit is faster). A shape either side lacks
shows "-". Python 3 standard library only.

usage: python3 bench/device/gpu_time_table.py RESULT.json [RESULT.json ...]
"""
import json
import re
import sys


def gpu_us(case):
    """GPU time per call in us: moekit's breakdown summed, or SonicMoE's kernel_time_us; None if absent."""
    if case.get("status") != "ok":
        return None
    breakdown = case.get("breakdown")
    if isinstance(breakdown, dict) and breakdown.get("kernels"):
        return sum(k["us"] for k in breakdown["kernels"])
    kernel_time = case.get("kernel_time_us")
    if isinstance(kernel_time, dict) and "per_call_us" in kernel_time:
        return kernel_time["per_call_us"]
    return None


def event_us(case):
    return (case.get("time_us") or {}).get("median") if case.get("status") == "ok" else None


def load(paths):
    """{backend: {case name: case}} over the files, in order."""
    runs = {}
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        for case in result["cases"]:
            runs.setdefault(case["backend"], {})[case["name"]] = case
    return runs


def cells(ours, theirs):
    """moekit's time, SonicMoE's and SonicMoE / moekit, as table cells."""
    def us(value):
        return "-" if value is None else f"{value:.0f}"
    ratio = "-" if ours is None or theirs is None else f"{theirs / ours:.2f}"
    return [us(ours), us(theirs), ratio]


HEADER = ("| shape (T, H, I, E, K) | fwd events: moekit us | SonicMoE us | SonicMoE / moekit "
          "| bwd events: moekit us | SonicMoE us | SonicMoE / moekit "
          "| fwd GPU time: moekit us | SonicMoE us | SonicMoE / moekit "
          "| fwd + bwd GPU time: moekit us | SonicMoE us | SonicMoE / moekit |")


def table_lines(moekit, sonicmoe):
    """The table as Markdown lines, from {case name: case} of each side (perf_tables.py uses it too)."""
    shapes = []
    for name in list(moekit) + list(sonicmoe):
        match = re.match(r"moe_(?:fwd|bwd)_(T\d+_H\d+_I\d+_E\d+_K\d+)$", name)
        if match and match.group(1) not in shapes:
            shapes.append(match.group(1))
    lines = [HEADER, "|---" * 13 + "|"]
    for shape in shapes:
        fwd, bwd = f"moe_fwd_{shape}", f"moe_bwd_{shape}"
        row = ["(" + ", ".join(re.findall(r"\d+", shape)) + ")"]
        for name, timing in ((fwd, event_us), (bwd, event_us), (fwd, gpu_us), (bwd, gpu_us)):
            ours, theirs = moekit.get(name), sonicmoe.get(name)
            row += cells(timing(ours) if ours else None, timing(theirs) if theirs else None)
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n\n")[-1])
    runs = load(sys.argv[1:])
    print("\n".join(table_lines(runs.get("cuda", {}), runs.get("sonicmoe", {}))))


if __name__ == "__main__":
    main()
