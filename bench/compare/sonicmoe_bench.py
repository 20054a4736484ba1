#!/usr/bin/env python3
"""SonicMoE's MoE layer on moekit-bench's layer configs, timed as torch_bench.py times PyTorch (moekit-bench's
method), in moekit-bench's JSON schema (backend "sonicmoe").

The layer is sonicmoe.functional.moe_TC_softmax_topk_layer, the one SonicMoE's own benchmark
(benchmarks/moe-cute.py) times: router linear, top-k, softmax over the top-k, the gathered up-projection with
SwiGLU, the down-projection and the weighted combine; backward through autograd (x, W1, W2 and the router weight
get gradients), so moe_backward is t(forward + backward) - t(forward) as in moekit-bench and in SonicMoE's
benchmark. W1 in SonicMoE's default layout (gate and up rows interleaved), no biases, bf16. The input sets,
warm-up, rounds and rotation are torch_bench.py's (its layer_case / measure with SonicMoE's layer in place of the
PyTorch one), and so is the device memory of one untimed forward + backward (record fields peak_extra_bytes and
grad_bytes); the first forward case of a run is also checked against torch_bench.py's PyTorch layer on the same
inputs (record field "check"). Every MoE layer case of any config runs (moe_forward, moe_backward,
moe_forward_backward); one that this layer does not compute (another router, an activation other than SwiGLU,
biases) and every other operation are reported "not_supported".

SonicMoE is not a dependency of moekit: bench/device/stage_sonicmoe.sh packs the wheels this was written against
(sonic-moe 0.1.2.post1, quack-kernels 0.3.11, nvidia-cutlass-dsl 4.4.2, apache-tvm-ffi, torch-c-dlpack-ext; Python
3.12) for the GPU machine, and bench/device/run_all.sh's steps sonicmoe:sonicmoe_fig14 and sonicmoe:models run
this with them.

usage: python3 bench/compare/sonicmoe_bench.py CONFIG.json [--out results.json] [--filter REGEX] [--kernel-time]
"""
import importlib.metadata
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench  # noqa: E402  (the timing method and input sets shared with the PyTorch baselines)

BACKEND = "sonicmoe"
PACKAGES = ("sonic-moe", "quack-kernels", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "apache-tvm-ffi")


def sonicmoe_layer():
    """moe_layer's signature (x, w_router, w1 [E, 2I, H], w2 [E, H, I], top_k) -> out, run by SonicMoE."""
    from sonicmoe.functional import moe_TC_softmax_topk_layer

    def layer(x, w_router, w1, w2, top_k):
        stream = torch.cuda.current_stream().cuda_stream
        out, _, _ = moe_TC_softmax_topk_layer(x, w_router, w1.permute(1, 2, 0), None, w2.permute(1, 2, 0), None,
                                              top_k, stream, "swiglu")
        return out
    return layer


def check(case, layer):
    """SonicMoE's forward against torch_bench.moe_layer on one random input set (W1 reordered from SonicMoE's
    interleaved gate/up rows to the PyTorch layer's gate rows then up rows). Rows whose top-k differ between the two
    (ties of bf16 logits) differ wholly, so the check counts rows: a row passes within 2% relative (its error's
    max over the row's max)."""
    dtype = torch_bench.DTYPES[case.get("dtype", "bf16")]
    make_set, _, _ = torch_bench.layer_case(case, dtype, "eager")
    torch.manual_seed(case.get("seed", 1))
    s = make_set()
    with torch.no_grad():
        ours = layer(s["x"], s["w_router"], s["w1"], s["w2"], case["top_k"]).float()
        w1 = torch.cat([s["w1"][:, 0::2], s["w1"][:, 1::2]], dim=1)
        ref = torch_bench.moe_layer(s["x"], s["w_router"], w1, s["w2"], case["top_k"]).float()
    row_err = (ours - ref).abs().amax(dim=1) / ref.abs().amax(dim=1).clamp_min(1e-20)
    bad = int((row_err > 0.02).sum())
    return {"against": "bench/compare/torch_bench.py moe_layer (PyTorch, bf16) on the same inputs",
            "rows": ref.shape[0], "rows_over_2pct": bad, "median_row_rel_err": float(row_err.median()),
            "passed": bad <= max(1, ref.shape[0] // 200)}


def kernel_time(case, layer, calls=10):
    """GPU time per call of the case's work (forward, or forward + backward for the other ops), summed over every
    kernel, memcpy and memset that the profiler's CUPTI records show, and per kernel name: what the GPU spends,
    without the host's gaps between launches that the event timing includes (moekit-bench --breakdown reports the
    same for moekit)."""
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    dtype = torch_bench.DTYPES[case.get("dtype", "bf16")]
    make_set, forward, _ = torch_bench.layer_case(case, dtype, "eager", layer)
    s = make_set()
    backward = case["op"] != "moe_forward"

    def call():
        for t in s.values():
            t.grad = None
        out = forward(s)
        if backward:
            out.backward(s["dout"])
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    records = [e for e in prof.profiler.kineto_results.events() if e.device_type() == DeviceType.CUDA]
    # Per kernel name, in order of first launch (moekit-bench --breakdown's form): launches and GPU time per call.
    kernels = {}
    for e in records:
        entry = kernels.setdefault(e.name(), {"kernel": e.name(), "calls": 0.0, "us": 0.0})
        entry["calls"] += 1.0 / calls
        entry["us"] += e.duration_ns() / 1000.0 / calls
    return {"per_call_us": sum(e.duration_ns() for e in records) / 1000.0 / calls, "calls": calls,
            "what": "forward + backward" if backward else "forward", "kernels": list(kernels.values())}


def versions():
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"sonicmoe_versions": found}


def main():
    parser = torch_bench.tool_arguments(__doc__.split("\n")[0])
    parser.add_argument("--kernel-time", action="store_true",
                        help="also record the GPU time per call summed over the profiler's kernel records, and "
                             "each kernel's (field kernel_time_us; moe_backward: per forward + backward call)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sonicmoe_bench.py: needs a CUDA device")
    try:
        layer = sonicmoe_layer()
    except ImportError as e:
        sys.exit(f"sonicmoe_bench.py: SonicMoE is not importable ({e}); see bench/device/stage_sonicmoe.sh")
    config, cases = torch_bench.load_cases(args.config, args.filter, "sonicmoe_bench.py")
    meta = torch_bench.run_meta(args.config, config, BACKEND, versions())
    checked = []

    def run_one(case):
        command = (f"python3 bench/compare/sonicmoe_bench.py {args.config} "
                   f"--filter '^{re.escape(case['name'])}$'")
        record = torch_bench.run_case(case, "eager", args.config, False, moe_fn=layer, backend=BACKEND,
                                      command=command)
        record["note"] = "sonicmoe.functional.moe_TC_softmax_topk_layer (W1 gate/up interleaved, no biases)"
        if record["status"] == "ok" and args.kernel_time:
            try:
                record["kernel_time_us"] = kernel_time(case, layer)
            except Exception as e:  # the timing above stands without it
                record["kernel_time_us"] = {"error": f"{type(e).__name__}: {e}"}
        if record["status"] == "ok" and case["op"] == "moe_forward" and not checked:
            record["check"] = check(case, layer)
            checked.append(case["name"])
            if not record["check"]["passed"]:
                record["message"] = "check failed: SonicMoE's output differs from the PyTorch layer's"
        return record

    torch_bench.run_all(cases, meta, args.out, run_one)


if __name__ == "__main__":
    main()
