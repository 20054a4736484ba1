#!/usr/bin/env python3
"""PyTorch-native baselines for moekit-bench configs, in moekit-bench's JSON schema.

What a user would write instead of moekit, timed the way moekit-bench times (CUDA events around each call, warm-up
apart, rounds of timed calls, median/min/max and the spread of the rounds' medians, inputs rotated past the L2
size, a layer backward as t(forward + backward) - t(forward)):

  moe_*         router linear, top-k, softmax over the top-k, stable sort of the pairs by expert, gather of the x
                rows, torch._grouped_mm up-projection, SwiGLU, torch._grouped_mm down-projection, score-weighted
                index_add; backward through autograd (input and weight gradients)
  sparse_ffn_*  the dense SwiGLU FFN of the same width d_ff (the baseline a sparse FFN must beat)
  gemm          torch._grouped_mm of the same grouped shapes, the gathered rows copied first, the epilogue's math
                (bias, SwiGLU, dgated) in eager PyTorch after it
  other ops     reported "not_supported" (no PyTorch-native counterpart written here)

Model FLOPs follow docs/benchmark.md, so the TFLOP/s of a case compare with moekit-bench's record of the same name;
join_results.py prints two result files side by side. Routing comes from random logits through torch.topk (the
same distribution as moekit-bench's routing, not the same bits).

Needs PyTorch 2.8 or later (torch._grouped_mm), a CUDA GPU (bf16 grouped GEMMs: sm_90 or newer).

usage: python3 bench/compare/torch_bench.py CONFIG.json [--out results.json] [--mode eager|compile]
                                            [--filter REGEX]
"""
import argparse
import datetime
import functools
import json
import os
import re
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}
DEFAULT_COUNTS = {"warmup": 10, "iterations": 100, "repeats": 3}


class NotSupported(Exception):
    pass


@functools.lru_cache(maxsize=None)
def compile_once(fn):
    """One torch.compile wrapper per function for the whole run, static shapes.

    Every case of a config has new shapes, so each recompiles; with a wrapper per case and the default recompile
    limit (8 per code object), dynamo would stop compiling after the eighth shape and run the rest eagerly, and its
    automatic dynamic shapes would compile the second shape onwards shape-generic. dynamic=False and a raised limit
    give every shape its own specialised graph; the forward and backward cases of one shape share it.
    """
    for name in ("recompile_limit", "cache_size_limit"):  # the limit's name since 2.6, and before
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    return torch.compile(fn, dynamic=False)


# ---------------------------------------------------------------------------------------------------------------
# Timing: the method of moekit-bench's CUDA backend
# ---------------------------------------------------------------------------------------------------------------

def rotation_sets(set_bytes):
    needed = 2 * torch.cuda.get_device_properties(0).L2_cache_size
    if set_bytes >= needed:
        return 1
    return min(64, needed // max(set_bytes, 1) + 1)


def time_calls(call, sets, warmup, iterations):
    for i in range(warmup):
        call(i % sets)
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iterations + 1)]
    for i in range(iterations):
        events[i].record()
        call(i % sets)
    events[-1].record()
    torch.cuda.synchronize()
    return [1000.0 * events[i].elapsed_time(events[i + 1]) for i in range(iterations)]


def time_rounds(call, sets, counts):
    medians, pooled = [], []
    for _ in range(counts["repeats"]):
        us = time_calls(call, sets, counts["warmup"], counts["iterations"])
        medians.append(statistics.median(us))
        pooled += us
    return medians, pooled


def spread(medians):
    if len(medians) < 2:
        return None
    return 100.0 * (max(medians) - min(medians)) / statistics.median(medians)


# ---------------------------------------------------------------------------------------------------------------
# The PyTorch-native code a user would write
# ---------------------------------------------------------------------------------------------------------------

def route(logits, top_k):
    """Top-k of the logits, softmax over the K values, pairs stably sorted by expert (no host synchronisation)."""
    experts = logits.shape[1]
    values, idx = torch.topk(logits, top_k, dim=-1)
    scores = torch.softmax(values.float(), dim=-1)
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int64, device=logits.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    return scores, idx, order, counts, offs


def moe_layer(x, w_router, w1, w2, top_k):
    """x [T, H], w_router [E, H], w1 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I] -> out [T, H]."""
    logits = F.linear(x, w_router)
    scores, _, order, _, offs = route(logits, top_k)
    token = order // top_k
    h = torch._grouped_mm(x.index_select(0, token), w1.transpose(-2, -1), offs=offs)
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, w2.transpose(-2, -1), offs=offs)
    weights = scores.reshape(-1).index_select(0, order).unsqueeze(1).to(y.dtype)
    return torch.zeros_like(x).index_add(0, token, y * weights)


def dense_swiglu_ffn(x, w_gate_up, w_down):
    """x [T, D], w_gate_up [2F, D], w_down [D, F] -> [T, D]."""
    gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w_down)


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------

def uniform(shape, scale, dtype, requires_grad=False):
    t = (torch.rand(shape, device="cuda", dtype=torch.float32) * 2 - 1) * scale
    return t.to(dtype).requires_grad_(requires_grad)


def layer_case(case, dtype, compile_mode):
    """Returns (forward-only call, forward+backward call, bytes of one input set) builders for a layer case."""
    op = case["op"]
    if op.startswith("moe_"):
        T, H, I, E, K = (case[k] for k in ("tokens", "hidden", "intermediate", "experts", "top_k"))
        if case.get("activation", "swiglu") != "swiglu" or case.get("router", "softmax_topk") != "softmax_topk":
            raise NotSupported("the PyTorch layer here is SwiGLU with softmax over the top-k only")
        fn = compile_once(moe_layer) if compile_mode else moe_layer

        def make_set():
            return dict(x=uniform((T, H), 1.0, dtype, True), w_router=uniform((E, H), H ** -0.5, dtype, True),
                        w1=uniform((E, 2 * I, H), H ** -0.5, dtype, True), w2=uniform((E, H, I), I ** -0.5, dtype, True),
                        dout=uniform((T, H), 1.0, dtype))

        def forward(s):
            return fn(s["x"], s["w_router"], s["w1"], s["w2"], K)
        set_bytes = 2 * (2 * T * H + E * H + 3 * E * I * H)
    else:
        T, D, Fw = case["tokens"], case["d_model"], case["d_ff"]
        fn = compile_once(dense_swiglu_ffn) if compile_mode else dense_swiglu_ffn

        def make_set():
            return dict(x=uniform((T, D), 1.0, dtype, True), w_gate_up=uniform((2 * Fw, D), D ** -0.5, dtype, True),
                        w_down=uniform((D, Fw), Fw ** -0.5, dtype, True), dout=uniform((T, D), 1.0, dtype))

        def forward(s):
            return fn(s["x"], s["w_gate_up"], s["w_down"])
        set_bytes = 2 * (2 * T * D + 3 * Fw * D)
    return make_set, forward, set_bytes


def gemm_case(case, dtype):
    """Returns (make_set, call, set_bytes) for a grouped GEMM case."""
    T, E, K, n, k = (case[key] for key in ("tokens", "experts", "top_k", "n", "k"))
    P = T * K
    mode, epilogue = case["mode"], case.get("epilogue", "store")
    gather, layout = case.get("gather", "none"), case.get("b_layout", "nk")
    if case.get("activation", "swiglu") != "swiglu" or case.get("glu_layout", "concat") != "concat":
        raise NotSupported("the PyTorch epilogues here are SwiGLU with the concat layout only")
    scores, _, order, counts, offs = route(uniform((T, E), 1.0, dtype), K)
    token, pair = order // K, order
    expert_of_row = torch.repeat_interleave(torch.arange(E, device="cuda"), counts, output_size=P)
    row_scale = scores.reshape(-1).index_select(0, pair)

    if mode == "varlen_k":
        def make_set():
            return dict(a=uniform((T if gather == "a" else P, k), 1.0, dtype),
                        b=uniform((T if gather == "b" else P, n), 1.0, dtype))

        def call(s):
            a = s["a"].index_select(0, token) if gather == "a" else s["a"]
            b = s["b"].index_select(0, token) if gather == "b" else s["b"]
            return torch._grouped_mm(a.t(), b, offs=offs)  # [E, k, n]
        return make_set, call, 2 * ((T if gather == "a" else P) * k + (T if gather == "b" else P) * n + E * k * n)

    product_n = n // 2 if epilogue == "dgated" else n

    def make_set():
        s = dict(a=uniform((T if gather == "a" else P, k), 1.0, dtype),
                 b=uniform((E, product_n, k) if layout == "nk" else (E, k, product_n), k ** -0.5, dtype))
        if epilogue == "bias":
            s["bias"] = uniform((E, n), 1.0, dtype)
        if epilogue == "dgated":
            s["h"] = uniform((P, n), 1.0, dtype)
        return s

    def call(s):
        a = s["a"].index_select(0, token) if gather == "a" else s["a"]
        b = s["b"].transpose(-2, -1) if layout == "nk" else s["b"]
        c = torch._grouped_mm(a, b, offs=offs)
        if epilogue == "bias":
            return c + s["bias"].index_select(0, expert_of_row)
        if epilogue == "gated":
            gate, up = c.chunk(2, dim=-1)
            return c, F.silu(gate) * up
        if epilogue == "dgated":
            gate, up = s["h"].float().chunk(2, dim=-1)
            sig = torch.sigmoid(gate)
            act = gate * sig * up
            d_a = c.float()
            ds = (d_a * act).sum(-1)
            da = row_scale.unsqueeze(1) * d_a
            dh = torch.cat([da * up * sig * (1 + gate * (1 - sig)), da * gate * sig], dim=-1).to(dtype)
            return dh, (row_scale.unsqueeze(1) * act).to(dtype), ds
        return c
    a_rows = T if gather == "a" else P
    return make_set, call, 2 * (a_rows * k + E * product_n * k + P * n)


def model_flops(case):
    """Model FLOPs of docs/benchmark.md."""
    op = case["op"]
    if op == "gemm":
        P = case["tokens"] * case["top_k"]
        if case["mode"] == "varlen_k":
            return 2.0 * P * case["k"] * case["n"]
        n = case["n"] // 2 if case.get("epilogue") == "dgated" else case["n"]
        return 2.0 * P * n * case["k"]
    if op.startswith("moe_"):
        forward = 6.0 * case["tokens"] * case["top_k"] * case["hidden"] * case["intermediate"]
    elif op.startswith("sparse_ffn_"):
        groups = case.get("top_groups") or max(1, round(case["density"] * case["d_ff"] / case["group_size"]))
        forward = 6.0 * case["tokens"] * case["d_model"] * groups * case["group_size"]
    else:
        return 0.0
    direction = op.replace("sparse_ffn_", "").replace("moe_", "")
    return {"forward": forward, "backward": 2 * forward, "forward_backward": 3 * forward}[direction]


def counts_of(case):
    return {key: case.get(key, DEFAULT_COUNTS[key]) for key in DEFAULT_COUNTS}


def measure(case, compiled):
    dtype = DTYPES[case.get("dtype", "bf16")]
    op = case["op"]
    counts = counts_of(case)
    torch.manual_seed(case.get("seed", 1))
    derived = ""
    if op.startswith("moe_") or op.startswith("sparse_ffn_"):
        make_set, forward, set_bytes = layer_case(case, dtype, compiled)
        sets = [make_set() for _ in range(rotation_sets(set_bytes))]

        def fwd(i):  # a training forward: the autograd graph is recorded, then dropped
            return forward(sets[i])

        def fwd_bwd(i):
            for t in sets[i].values():
                t.grad = None  # as optimizer.zero_grad(set_to_none=True) leaves them
            forward(sets[i]).backward(sets[i]["dout"])

        fwd_bwd(0)  # compiles and warms both directions
        subtract = None
        if op.endswith("_forward"):
            medians, pooled = time_rounds(fwd, len(sets), counts)
        else:
            medians, pooled = time_rounds(fwd_bwd, len(sets), counts)
        if op.endswith("_backward") and not op.endswith("_forward_backward"):
            subtract = time_rounds(fwd, len(sets), counts)
            derived = "t(forward + backward) - t(forward), medians of each round"
        n_sets = len(sets)
    elif op == "gemm":
        if compiled:
            raise NotSupported("grouped GEMM cases run eager only")
        make_set, call, set_bytes = gemm_case(case, dtype)
        sets = [make_set() for _ in range(rotation_sets(set_bytes))]
        call(sets[0])
        medians, pooled = time_rounds(lambda i: call(sets[i]), len(sets), counts)
        subtract, n_sets = None, len(sets)
    else:
        raise NotSupported(f"no PyTorch-native counterpart of {op} here")

    if subtract is None:
        time = (statistics.median(pooled), min(pooled), max(pooled))
        spread_pct = spread(medians)
    else:
        part = statistics.median(subtract[1])
        time = (statistics.median(pooled) - part, min(pooled) - part, max(pooled) - part)
        spread_pct = spread([a - b for a, b in zip(medians, subtract[0])])
    return time, spread_pct, counts, n_sets, derived


def run_case(case, compiled, config_path):
    backend = "pytorch-compile" if compiled else "pytorch-eager"
    record = {"name": case["name"], "op": case["op"], "backend": backend, "status": "ok", "message": "",
              "shape": " ".join(f"{k}={case[k]}" for k in ("tokens", "hidden", "intermediate", "experts", "top_k", "n",
                                                           "k", "width", "d_model", "d_ff", "group_size", "top_groups",
                                                           "subsample") if k in case),
              "config": case}
    flops = model_flops(case)
    try:
        (median, lo, hi), spread_pct, counts, sets, derived = measure(case, compiled)
        tflops = flops / (median * 1e-6) / 1e12 if flops and median > 0 else None
        record.update(time_us={"median": median, "min": lo, "max": hi}, spread_pct=spread_pct,
                      timing={"method": "CUDA events around each call (torch.cuda.Event)", **counts,
                              "input_sets": sets, "graph": False, "derived": derived},
                      flops=flops, tflops=tflops)
    except NotSupported as e:
        record.update(status="not_supported", message=str(e))
    except Exception as e:  # a failure of one case must not end the run
        record.update(status="failed", message=f"{type(e).__name__}: {e}")
    record.setdefault("time_us", {"median": None, "min": None, "max": None})
    record.setdefault("flops", flops)
    record.setdefault("tflops", None)
    record.update(bytes=None, gbps=None, baseline=None, ratio=None, check=None,
                  note="sparse_ffn_* cases time the dense SwiGLU FFN of width d_ff; flops are the sparse case's "
                       "model FLOPs" if case["op"].startswith("sparse_ffn_") else "",
                  command=f"python3 bench/compare/torch_bench.py {config_path} --mode "
                          f"{'compile' if compiled else 'eager'} --filter '^{re.escape(case['name'])}$'")
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--out")
    parser.add_argument("--mode", choices=("eager", "compile"), default="eager")
    parser.add_argument("--filter", default="")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_bench.py: needs a CUDA device")
    with open(args.config) as f:
        config = json.load(f)
    defaults = config.get("defaults", {})
    cases = [{**defaults, **c} for c in config["cases"] if re.search(args.filter, c["name"])]
    if not cases:
        sys.exit(f"torch_bench.py: no case of {args.config} matches --filter {args.filter}")

    # MOEKIT_GIT_SHA: where the sources are a copy without .git (bench/device/run_all.sh passes the staged commit).
    sha = os.environ.get("MOEKIT_GIT_SHA", "")
    try:
        sha = sha or subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()
    except OSError:
        pass
    prop = torch.cuda.get_device_properties(0)
    meta = {"torch_version": torch.__version__, "cuda_runtime": torch.version.cuda, "git_sha": sha or "unknown",
            "backend": "pytorch-compile" if args.mode == "compile" else "pytorch-eager",
            "device": {"name": prop.name, "sm_count": prop.multi_processor_count, "l2_bytes": prop.L2_cache_size},
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "config": args.config, "config_description": config.get("description", ""),
            "command_line": " ".join(sys.argv)}
    results = []
    for i, case in enumerate(cases):
        record = run_case(case, args.mode == "compile", args.config)
        median = record["time_us"]["median"]
        print(f"[{i + 1}/{len(cases)}] {case['name']}: "
              f"{f'{median:.2f} us' if median is not None else record['status']}", file=sys.stderr)
        results.append(record)
        if args.out:  # rewritten after every case (then renamed): a run stopped by a time limit keeps what it finished
            with open(args.out + ".partial", "w") as f:
                json.dump({"meta": meta, "cases": results}, f, indent=2)
            os.replace(args.out + ".partial", args.out)
    def cell(value, digits):
        return "-" if value is None else f"{value:.{digits}f}"

    print(f"{'case':<48} {'status':<14} {'median us':>11} {'spread%':>8} {'TFLOP/s':>8}")
    for r in results:
        print(f"{r['name']:<48} {r['status']:<14} {cell(r['time_us']['median'], 1):>11} "
              f"{cell(r.get('spread_pct'), 2):>8} {cell(r['tflops'], 1):>8}")
    failed = any(r["status"] == "failed" for r in results)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
