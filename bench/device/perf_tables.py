#!/usr/bin/env python3
"""Markdown tables for docs/performance.md from result files of moekit-bench and bench/compare/torch_bench.py.

One section per config file (matched by the basename of meta.config): where and how each result file was made
(date, commit, device, versions, ceilings, command line), then one row per case with moekit's median time and
rate, its cuBLAS baseline (measured in the same run) and the ratio, the PyTorch eager and torch.compile times
and moekit's speed-up over each, the routing's rows per expert where a case of the config has skewed (lognormal)
routing, torch._grouped_mm alone where the eager run timed it (torch_bench.py
--grouped-mm-alone), SonicMoE's layer where bench/compare/sonicmoe_bench.py timed it, and for sonicmoe_fig14.json
the SonicMoE paper's H100 TFLOP/s (quoted, or read off its figure) and moekit's rate over it.
Every ratio is other time / moekit time: > 1 means moekit is faster.

Several files of the same config and tool are merged by case name (the first file that has a case wins), so a
re-run of the cases a time limit cut off can be added. Python 3 standard library only.

usage: python3 bench/device/perf_tables.py RESULT.json [RESULT.json ...] [--steps steps.tsv] [--out tables.md]
"""
import argparse
import json
import os
import sys

# Config files in this order (the grouped GEMM at several rows per expert after gemm.json); others in name order.
CONFIG_ORDER = ("sonicmoe_fig14", "gemm", "gemm_rows_per_expert", "sparse_ffn", "smoke")
MOEKIT = "moekit"
TOOLS = {"cuda": MOEKIT, "reference": MOEKIT, "pytorch-eager": "eager", "pytorch-compile": "compile",
         "sonicmoe": "SonicMoE"}
OTHERS = ("eager", "compile", "SonicMoE")  # the tools timed against moekit, in column order

# The SonicMoE paper's H100 throughput figure (its Figure 14, model TFLOP/s, the FLOP convention of moekit-bench):
# (T, H, I, E, K) -> (forward, backward, how known). Two values are quoted in the project's notes
# (/work/shared/PERF-NOTES.md); the other ten are read off the figure itself, which prints no numbers: the image
# assets/tput.png of github.com/Dao-AILab/sonic-moe (the paper's figure with its caption), each SonicMoE bar's top
# measured against the 200 / 400 / 600 gridlines of its panel and corrected by the offset that makes the quoted
# values come out (about -4 TFLOP/s in the upper panels, -2 in the lower); two independent readings agreed within
# 1 TFLOP/s, and the two quoted values come out within 1. Read values are good to about +-3 TFLOP/s.
QUOTED, READ = "quoted", "read off the figure"
SONICMOE_H100 = {
    (40960, 768, 256, 128, 8): (334, 361, READ),
    (40960, 768, 512, 64, 4): (396, 399, READ),
    (40960, 768, 1024, 32, 2): (400, 432, READ),
    (24576, 1536, 256, 128, 8): (361, 402, QUOTED),
    (24576, 1536, 512, 64, 4): (430, 435, READ),
    (24576, 1536, 1024, 32, 2): (462, 463, READ),
    (32768, 4096, 256, 256, 16): (426, 458, READ),
    (32768, 4096, 512, 128, 8): (500, 510, READ),
    (32768, 4096, 1024, 64, 4): (550, 553, READ),
    (32768, 4096, 512, 256, 16): (516, 525, READ),
    (32768, 4096, 1024, 128, 8): (557, 566, QUOTED),
    (32768, 4096, 2048, 64, 4): (594, 585, READ),
}
SONICMOE_NOTE = (
    "SonicMoE H100: the SonicMoE paper's H100 throughput figure (Figure 14). Two values are quoted in the project's "
    "notes (PERF-NOTES.md): (32768, 4096, 1024, 128, 8) 557 forward / 566 backward TFLOP/s, (24576, 1536, 256, "
    "128, 8) 361 / 402. The others (marked ~) are read off the figure, which prints no numbers (the image "
    "assets/tput.png of github.com/Dao-AILab/sonic-moe; bar tops measured against the gridlines, calibrated by the "
    "two quoted values): good to about +-3 TFLOP/s. 'moekit / H100' is moekit's TFLOP/s over that figure (> 1: "
    "above it); the paper's GPU is an H100, this one an H200 (the same dense bf16 peak, 1.4x the memory bandwidth).")
SPARSE_FFN_NOTE = (
    "The PyTorch columns time the dense SwiGLU FFN of the same width (what the sparse layer replaces), so their "
    "ratio is moekit's speed-up over dense PyTorch. For reference, the project's notes (PERF-NOTES.md) quote the "
    "EUGEN Triton sparse SwiGLU FFN at these shapes as 1.73-1.89x faster than the dense FFN forward and "
    "1.06-1.59x forward+backward (a range over the four shapes, not per shape).")
SONICMOE_MEASURED_NOTE = (
    "SonicMoE: its layer (sonicmoe.functional.moe_TC_softmax_topk_layer, the one its own benchmark times) run by "
    "bench/compare/sonicmoe_bench.py on this device, timed by the same method as the PyTorch columns; the run's "
    "first forward case checked against the PyTorch layer on the same inputs: {check}.")
GROUPED_MM_ALONE_NOTE = (
    "grouped_mm: the torch._grouped_mm call of the case alone, from the PyTorch eager run with --grouped-mm-alone: "
    "its rows gathered beforehand (untimed), no epilogue, no accumulation into C. The eager columns time the code a "
    "user writes: gather (index_select), torch._grouped_mm, the epilogue in eager PyTorch (each record's note says "
    "what exactly).")


def load(paths):
    """{config: {tool: {"metas": [meta, ...], "cases": {name: record}, "order": [name, ...]}}}"""
    configs = {}
    for path in paths:
        with open(path) as f:
            results = json.load(f)
        meta = results["meta"]
        config = os.path.splitext(os.path.basename(meta["config"]))[0]
        tool = TOOLS.get(meta["backend"])
        if tool is None:
            sys.exit(f"perf_tables.py: {path}: unknown backend {meta['backend']!r}")
        run = configs.setdefault(config, {}).setdefault(tool, {"metas": [], "cases": {}, "order": []})
        run["metas"].append(meta)
        for record in results["cases"]:
            if record["name"] not in run["cases"]:
                run["cases"][record["name"]] = record
                run["order"].append(record["name"])
    return configs


def median_us(record):
    if record is None or record.get("status") != "ok":
        return None
    return record["time_us"]["median"]


def status_text(record):
    if record is None:
        return "not run"
    return {"not_supported": "n/s", "failed": "failed"}.get(record["status"], record["status"])


def number(value, digits):
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def describe_meta(tool, meta):
    device = meta.get("device", {})
    where = device.get("name", "?")
    if device.get("sm_count"):
        where += f" ({device['sm_count']} SMs"
        if device.get("sm_clock_mhz"):
            where += f", {device['sm_clock_mhz']} / {device.get('memory_clock_mhz', '?')} MHz SM / memory clocks"
        where += ")"
    versions = []
    if device.get("driver"):
        versions.append(f"driver {device['driver']}")
    if device.get("cuda_runtime") or meta.get("cuda_runtime"):
        versions.append(f"CUDA runtime {device.get('cuda_runtime') or meta.get('cuda_runtime')}")
    if meta.get("torch_version"):
        versions.append(f"torch {meta['torch_version']}")
    for package, version in meta.get("sonicmoe_versions", {}).items():
        versions.append(f"{package} {version}")
    label = {MOEKIT: f"moekit-bench ({meta['backend']} backend)", "eager": "PyTorch eager",
             "compile": "PyTorch torch.compile", "SonicMoE": "SonicMoE"}[tool]
    line = (f"- {label}: {meta.get('date', '?')}, commit `{meta.get('git_sha', '?')}`, {where}"
            + (f", {', '.join(versions)}" if versions else ""))
    ceilings = meta.get("ceilings")
    if ceilings:
        line += (f"; ceilings measured in the run: dense bf16 GEMM {ceilings['dense_bf16_gemm_tflops']:.0f} TFLOP/s,"
                 f" device copy {ceilings['device_copy_gbps']:.0f} GB/s")
    return line + f". Command: `{meta.get('command_line', '?')}`"


def counts_text(record):
    """moekit-bench's routing record as "min / max, N empty" rows per expert, or "-"."""
    counts = ((record or {}).get("routing") or {}).get("counts")
    return "-" if not counts else f"{counts['min']} / {counts['max']}, {counts['empty']} empty"


def grouped_mm_alone(record):
    """The eager record's timing of torch._grouped_mm alone, or None."""
    return (record or {}).get("grouped_mm_alone") if median_us(record) is not None else None


def sonicmoe_h100(record):
    config = (record or {}).get("config", {})
    key = tuple(config.get(k) for k in ("tokens", "hidden", "intermediate", "experts", "top_k"))
    values = SONICMOE_H100.get(key)
    direction = {"moe_forward": 0, "moe_backward": 1}.get(config.get("op"))
    return None if values is None or direction is None else (values[direction], values[2])


def section(config, runs, steps):
    lines = [f"### `bench/configs/{config}.json`", ""]
    for tool in (MOEKIT,) + OTHERS:
        for meta in runs.get(tool, {}).get("metas", []):
            lines.append(describe_meta(tool, meta))
    for name, row in steps.items():
        if name.split(":", 1)[1] == config and row["exit"] != "0":
            lines.append(f"- step `{name}`: exit {row['exit']} after {row['seconds']} s (limit {row['limit']} s)")
    lines.append("")

    names = []
    for tool in (MOEKIT,) + OTHERS:
        names += [n for n in runs.get(tool, {}).get("order", []) if n not in names]
    record = {tool: runs[tool]["cases"] for tool in runs}
    all_times = [median_us(record[t].get(n)) for t in record for n in names]
    scale, unit = (1000.0, "ms") if max((t for t in all_times if t is not None), default=0) >= 1000 else (1.0, "us")
    moekit_records = [record.get(MOEKIT, {}).get(n) for n in names]
    flop_rates = all(r["tflops"] is not None for r in moekit_records if median_us(r) is not None)

    def rate(r):
        if median_us(r) is None:
            return "-"
        if r.get("tflops") is not None:
            return number(r["tflops"], 3) if flop_rates else f"{number(r['tflops'], 3)} TFLOP/s"
        return f"{number(r['gbps'], 3)} GB/s" if r.get("gbps") is not None else "-"

    def duration(us):
        value = us / scale
        return f"{value:.2f}" if value < 100 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"

    def time_cell(r):
        return status_text(r) if median_us(r) is None else duration(median_us(r))

    rate_header = "TFLOP/s" if flop_rates else "rate"
    header = ["case"]
    skewed = any(((r or {}).get("routing") or {}).get("kind") == "lognormal" for r in moekit_records)
    if MOEKIT in record:
        header += [f"moekit {unit}", f"moekit {rate_header}", "spread %", f"cuBLAS {unit}", "moekit vs cuBLAS"]
        if skewed:
            header.append("rows/expert min / max")
    alone = "eager" in record and any(grouped_mm_alone(r) for r in record["eager"].values())
    for tool in OTHERS:
        if tool in record:
            header += [f"{tool} {unit}", f"{tool} {rate_header}"] + (["moekit vs " + tool] if MOEKIT in record else [])
        if tool == "eager" and alone:
            header += [f"grouped_mm {unit}", f"grouped_mm {rate_header}"] + (
                ["moekit vs grouped_mm"] if MOEKIT in record else [])
    h100 = config == "sonicmoe_fig14"
    if h100:
        header.append("SonicMoE H100 TFLOP/s")
        if MOEKIT in record:
            header.append("moekit / H100")
    rows = []
    for name in names:
        mine = record.get(MOEKIT, {}).get(name)
        row = [name]
        if MOEKIT in record:
            baseline = (mine or {}).get("baseline") or {}
            base_us = baseline.get("time_us", {}).get("median") if median_us(mine) is not None else None
            spread = (mine or {}).get("spread_pct")
            row += [time_cell(mine), rate(mine), "-" if spread is None or median_us(mine) is None else f"{spread:.2f}",
                    "-" if base_us is None else duration(base_us),
                    "-" if mine is None or mine.get("ratio") is None else f"{mine['ratio']:.2f}"]
            if skewed:
                row.append(counts_text(mine))
        for tool in OTHERS:
            if tool not in record:
                continue
            other = record[tool].get(name)
            row += [time_cell(other), rate(other)]
            if MOEKIT in record:
                a, b = median_us(mine), median_us(other)
                row.append("-" if a is None or b is None or a <= 0 else f"{b / a:.2f}")
            if tool == "eager" and alone:
                timing = grouped_mm_alone(other)
                b = None if timing is None else timing["time_us"]["median"]
                row += ["-" if b is None else duration(b), "-" if b is None else rate(
                    {"status": "ok", "time_us": timing["time_us"], "tflops": timing.get("tflops"), "gbps": None})]
                if MOEKIT in record:
                    a = median_us(mine)
                    row.append("-" if a is None or b is None or a <= 0 else f"{b / a:.2f}")
        if h100:
            figure = sonicmoe_h100(mine or next((record[t].get(name) for t in record if record[t].get(name)), None))
            row.append("-" if figure is None else ("" if figure[1] == QUOTED else "~") + str(figure[0]))
            if MOEKIT in record:
                tflops = (mine or {}).get("tflops") if median_us(mine) is not None else None
                row.append("-" if figure is None or tflops is None else f"{tflops / figure[0]:.2f}")
        rows.append(row)
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines.append("")
    lines.append(f"Times are medians in {unit}; every 'vs' column is the other time / moekit's time (> 1: moekit is "
                 "faster); the cuBLAS baseline is moekit-bench's equal-work baseline of the same run "
                 "(docs/benchmark.md).")
    if h100:
        lines += ["", SONICMOE_NOTE]
    if "SonicMoE" in record:
        checks = [r["check"] for r in record["SonicMoE"].values() if r.get("check")]
        check = "; ".join(f"{c['rows_over_2pct']} of {c['rows']} rows off by more than 2% "
                          f"({'passed' if c['passed'] else 'FAILED'})" for c in checks) or "not run"
        lines += ["", SONICMOE_MEASURED_NOTE.format(check=check)]
    if config == "sparse_ffn" and ("eager" in record or "compile" in record):
        lines += ["", SPARSE_FFN_NOTE]
    if alone:
        lines += ["", GROUPED_MM_ALONE_NOTE]
    lines.append("")
    return lines


def read_steps(path):
    if not path:
        return {}
    with open(path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    return {r[0]: {"exit": r[1], "seconds": r[2], "limit": r[3]} for r in rows[1:]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--steps", help="run_all.sh's steps.tsv: steps that did not end with exit 0 are listed")
    parser.add_argument("--out", help="write the Markdown here instead of stdout")
    args = parser.parse_args()
    configs = load(args.files)
    steps = read_steps(args.steps)
    order = [c for c in CONFIG_ORDER if c in configs] + sorted(c for c in configs if c not in CONFIG_ORDER)
    lines = []
    for config in order:
        lines += section(config, configs[config], steps)
    text = "\n".join(lines)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
