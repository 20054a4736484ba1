#!/usr/bin/env python3
"""Where a warp-specialized kernel's warps stall, by region of its SASS, from Nsight Compute's source page.

Reads the CSV that `ncu -i REPORT --page source --print-source sass --csv` prints (profile_gemm.sh saves one per
report as *.sass.csv): one row per SASS instruction with its warp-stall samples, in total and by reason. The
wgmma kernel's code falls into regions that tell its warpgroups apart:
  prologue           before the consumers raise their registers (USETMAXREG.TRY_ALLOC);
  consumer mainloop  from there through the wgmma wait that ends the last slice (WARPGROUP.DEPBAR.LE gsb0, 0x0
                     after the last HGMMA);
  consumer epilogue  from there to the producer's register release (USETMAXREG.DEALLOC);
  producer           from there to the first wait stub;
  wait stubs         the retry loops of mbarrier waits, which ptxas places after the code (a short, predicated
                     backward branch over a barrier poll): warps of either kind spinning on a barrier;
  subroutines        the rest after the first stub (e.g. 64-bit division helpers).
A kernel without those markers (the mma.sync one) is one region. Prints each region's share of the samples and
its top stall reasons, then the instructions with the most samples. Python 3 standard library only.

usage: python3 bench/device/stall_regions.py REPORT.sass.csv [--top N]
"""
import argparse
import csv
import sys

TOTAL = "Warp Stall Sampling (All Samples)"
REASON_PREFIX = "stall_"


def read_rows(path):
    """The instruction rows of the CSV: (address, source, samples, {reason: samples})."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    header_at = next((i for i, row in enumerate(lines) if TOTAL in row), None)
    if header_at is None:
        sys.exit(f"stall_regions.py: {path} has no '{TOTAL}' column (not an ncu source page CSV)")
    header = lines[header_at]
    total = header.index(TOTAL)
    reasons = [(i, name[len(REASON_PREFIX):]) for i, name in enumerate(header)
               if name.startswith(REASON_PREFIX) and "Not Issued" not in name]
    rows = []
    for row in lines[header_at + 1:]:
        if len(row) <= total or not row[0].startswith("0x"):
            continue
        count = lambda i: int(row[i]) if i < len(row) and row[i].isdigit() else 0
        rows.append((int(row[0], 16), row[1].strip(), count(total), {name: count(i) for i, name in reasons}))
    return rows


def opcode(source):
    """The opcode of a SASS line, its predicate (@P0, @!P1, ...) dropped."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def branch_target(source):
    """The absolute target address of a BRA line, or None."""
    if opcode(source) != "BRA":
        return None
    target = source.replace(";", " ").split()[-1]
    return int(target, 16) if target.startswith("0x") else None


def region_names(rows):
    """One region name per row (see the module docstring)."""
    sources = [source for _, source, _, _ in rows]
    find = lambda predicate, start=0: next((i for i in range(start, len(sources)) if predicate(sources[i])), None)
    consumers = find(lambda s: "USETMAXREG.TRY_ALLOC" in s)
    producer = find(lambda s: "USETMAXREG.DEALLOC" in s)
    if consumers is None or producer is None:
        return ["kernel"] * len(rows)
    last_mma = max((i for i in range(consumers, producer) if "HGMMA" in sources[i]), default=consumers)
    mainloop_end = find(lambda s: "WARPGROUP.DEPBAR.LE gsb0, 0x0" in s, last_mma) or last_mma
    stub = set()
    index_of = {row[0]: i for i, row in enumerate(rows)}
    for i in range(producer, len(rows)):
        start = index_of.get(branch_target(sources[i]))
        # A short, predicated backward branch over a barrier poll: the retry loop; then the branch back out of it.
        if start is None or not i - 3 <= start < i or not sources[i].startswith("@"):
            continue
        if any(opcode(sources[j]).startswith("SYNCS.PHASECHK") for j in range(start, i + 1)):
            stub.update(range(start, i + 1))
            if i + 1 < len(rows) and sources[i + 1].split()[:1] == ["BRA"]:
                stub.add(i + 1)
    first_stub = min(stub, default=len(rows))
    names = []
    for i in range(len(rows)):
        if i < consumers:
            names.append("prologue")
        elif i <= mainloop_end:
            names.append("consumer mainloop")
        elif i < producer:
            names.append("consumer epilogue")
        elif i < first_stub:
            names.append("producer")
        else:
            names.append("wait stubs" if i in stub else "subroutines")
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=12, help="instructions to list (default 12)")
    args = parser.parse_args()
    rows = read_rows(args.csv)
    names = region_names(rows)
    total = sum(samples for _, _, samples, _ in rows)
    if total == 0:
        sys.exit(f"stall_regions.py: {args.csv} has no stall samples")
    base = rows[0][0]
    order = []
    for name in names:
        if name not in order:
            order.append(name)
    print(f"{total} samples")
    for name in order:
        members = [row for row, n in zip(rows, names) if n == name]
        samples = sum(row[2] for row in members)
        reasons = {}
        for _, _, _, by_reason in members:
            for reason, count in by_reason.items():
                reasons[reason] = reasons.get(reason, 0) + count
        if samples == 0:
            continue
        top = sorted(reasons.items(), key=lambda item: -item[1])[:5]
        listed = ", ".join(f"{reason} {100 * count / total:.1f}%" for reason, count in top if count > 0)
        print(f"{name:18} {100 * samples / total:5.1f}%  {listed}")
    print(f"top {args.top} instructions (offset, share, region, SASS):")
    ranked = sorted(zip(rows, names), key=lambda item: -item[0][2])[:args.top]
    for (address, source, samples, _), name in ranked:
        print(f"  {address - base:#8x} {100 * samples / total:5.1f}%  {name:18} {source[:70]}")


if __name__ == "__main__":
    main()
