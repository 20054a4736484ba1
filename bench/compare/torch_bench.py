#!/usr/bin/env python3
"""PyTorch-native baselines for moekit-bench configs, in moekit-bench's JSON schema.

What a user would write instead of moekit, timed the way moekit-bench times (CUDA events around each call, warm-up
apart, rounds of timed calls, median/min/max and the spread of the rounds' medians, inputs rotated past the L2
size, a layer backward as t(forward + backward) - t(forward)):

  moe_*         router linear, top-k, softmax over the top-k, stable sort of the pairs by expert, gather of the x
                rows, torch._grouped_mm up-projection (+ b1 of the row's expert), SwiGLU or SwiGLU-OAI (gate and
                up rows concatenated or interleaved, as the case's glu_layout), torch._grouped_mm down-projection
                (+ b2), score-weighted index_add; backward through autograd (input and weight gradients)
  sparse_ffn_*  the dense SwiGLU FFN of the same width d_ff (the baseline a sparse FFN must beat)
  gemm          torch._grouped_mm of the same grouped shapes, the gathered rows copied first, the epilogue's math
                (bias, SwiGLU, dgated) in eager PyTorch after it; an out_dtype other than dtype through
                _grouped_mm's out_dtype where this torch takes it, else the product converted after; a nonzero
                beta: the product added into C (c.mul_(beta) first unless beta = 1). The record's note says which.
                With --grouped-mm-alone, also the torch._grouped_mm call alone, on rows gathered beforehand, no
                epilogue and no accumulation (record field grouped_mm_alone)
  other ops     reported "not_supported" (no PyTorch-native counterpart written here)

--mode moekit times moekit itself from Python instead, as a user calls it (backend "moekit-python"): the package
examples/python/moekit of this checkout, the library it loads given by MOEKIT_LIBRARY (bench/device/run_all.sh: the
libmoekit.so.0.2 that bench/device/stage.sh packed into DEST). moe_* cases call moekit.moe on the same input sets
(the case's router, renormalize, router_scale, activation, glu_layout and biases), sparse_ffn_* cases
moekit.sparse_swiglu (subsample rows from the case's seed, as moekit-bench draws them); each call's custom-op
dispatch, plan cache lookup and torch allocations (output, saved buffer, workspace, gradients) are timed with it,
which moekit-bench's C++ calls do not pay. Other ops are "not_supported".

Layer cases (moe_*, sparse_ffn_*) also record the device memory of one untimed forward + backward after the
warm-up: peak_extra_bytes, torch.cuda.max_memory_allocated() during it less torch.cuda.memory_allocated() just
before it (the inputs and weights allocated, the previous gradients freed), so the saved activations, the
temporaries and the gradients the backward allocates; grad_bytes, the size of those gradients.

Model FLOPs follow docs/benchmark.md, so the TFLOP/s of a case compare with moekit-bench's record of the same name;
join_results.py prints two result files side by side. Routing comes from random logits through torch.topk (the
same distribution as moekit-bench's routing, not the same bits), uniform in [-1, 1) or, with "routing":
"lognormal", plus each expert's offset log w_e (w_e ~ lognormal(0, routing_sigma)) and -1e4 for the
routing_empty fraction of the experts, drawn with torch's RNG.

Needs PyTorch 2.8 or later (torch._grouped_mm), a CUDA GPU (bf16 grouped GEMMs: sm_90 or newer).

usage: python3 bench/compare/torch_bench.py CONFIG.json [--out results.json] [--mode eager|compile|moekit]
                                            [--filter REGEX] [--grouped-mm-alone]
"""
import argparse
import datetime
import functools
import json
import math
import os
import re
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}
DEFAULT_COUNTS = {"warmup": 10, "iterations": 100, "repeats": 3}
BACKENDS = {"eager": "pytorch-eager", "compile": "pytorch-compile", "moekit": "moekit-python"}  # --mode -> backend
MOEKIT_NOTE = "moekit from Python: the package examples/python/moekit ({call}), libmoekit.so from MOEKIT_LIBRARY"


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


def time_alternating_rounds(full, part, sets, counts):
    """time_rounds of both calls, their rounds taking turns (moekit-bench's derived times do the same): a burst of
    load elsewhere slows a round of each instead of every round of one."""
    full_rounds, part_rounds = ([], []), ([], [])
    one_round = {"warmup": counts["warmup"], "iterations": counts["iterations"], "repeats": 1}
    for _ in range(counts["repeats"]):
        for call, (medians, pooled) in ((full, full_rounds), (part, part_rounds)):
            m, p = time_rounds(call, sets, one_round)
            medians += m
            pooled += p
    return full_rounds, part_rounds


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


GLU_LIMIT = 7.0  # SwiGLU-OAI's clamp limit: moekit's default (docs/math.md section 3), which moekit-bench keeps


def glu(h, activation, interleaved):
    """The gated activation of h [P, 2I]: SwiGLU, or SwiGLU-OAI (gpt-oss: gate clamped above at the limit, up to
    +-limit, gate * sigmoid(1.702 gate) * (up + 1)); gate and up rows concatenated or interleaved."""
    gate, up = (h[:, 0::2], h[:, 1::2]) if interleaved else h.chunk(2, dim=-1)
    if activation == "swiglu_oai":
        gate, up = gate.clamp(max=GLU_LIMIT), up.clamp(-GLU_LIMIT, GLU_LIMIT)
        return gate * torch.sigmoid(1.702 * gate) * (up + 1)
    return F.silu(gate) * up


def moe_layer(x, w_router, w1, w2, top_k, b1=None, b2=None, activation="swiglu", interleaved=False):
    """x [T, H], w_router [E, H], w1 [E, 2I, H] (gate rows, then up rows; or interleaved), w2 [E, H, I], optional
    b1 [E, 2I] and b2 [E, H] -> out [T, H]."""
    logits = F.linear(x, w_router)
    scores, _, order, counts, offs = route(logits, top_k)
    token = order // top_k
    h = torch._grouped_mm(x.index_select(0, token), w1.transpose(-2, -1), offs=offs)
    if b1 is not None or b2 is not None:  # the expert of each grouped row, without a host synchronisation
        expert = torch.repeat_interleave(torch.arange(w1.shape[0], device=x.device), counts, output_size=order.numel())
    if b1 is not None:
        h = h + b1.index_select(0, expert)
    y = torch._grouped_mm(glu(h, activation, interleaved), w2.transpose(-2, -1), offs=offs)
    if b2 is not None:
        y = y + b2.index_select(0, expert)
    weights = scores.reshape(-1).index_select(0, order).unsqueeze(1).to(y.dtype)
    return torch.zeros_like(x).index_add(0, token, y * weights)


@functools.lru_cache(maxsize=None)
def moekit_package():
    """moekit's Python package of this checkout (examples/python), its library loaded now, so that a missing or
    mismatched libmoekit.so ends the run before the first case."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
    import moekit
    import moekit.functional  # noqa: F401  (its GATED_ACTIVATIONS)
    moekit.load()
    return moekit


def moekit_moe(case):
    """moekit.moe in moe_layer's signature, routing by the case's router options."""
    router = dict(router=case.get("router", "softmax_topk"), renormalize=bool(case.get("renormalize")),
                  router_scale=case.get("router_scale", 1.0))

    def layer(x, w_router, w1, w2, top_k, b1=None, b2=None, activation="swiglu", interleaved=False):
        return moekit_package().moe(x, w_router, w1, w2, top_k, b1=b1, b2=b2, activation=activation,
                                    glu_layout="interleaved" if interleaved else "concat", **router)
    return layer


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


def empty_experts(experts, fraction):
    """The experts lognormal routing leaves empty (docs/benchmark.md): floor(fraction * E), at least 1 when E >= 16
    and the fraction is not 0."""
    if fraction <= 0:
        return 0
    count = math.floor(fraction * experts)
    return max(count, 1) if experts >= 16 else count


def routing_logits(case, T, E, dtype):
    """The router logits [T, E] of a case with real routing, drawn as moekit-bench draws them (torch's RNG: the same
    distribution, not the same values): uniform in [-1, 1); with "routing": "lognormal", plus each expert's offset
    log w_e = routing_sigma * N(0, 1) (w_e ~ lognormal(0, sigma)) and -1e4 for routing_empty of the experts (a
    random subset), so that nobody routes to them. Rounded to dtype once, after the offset."""
    if case.get("routing", "uniform") != "lognormal":
        return uniform((T, E), 1.0, dtype)
    logits = torch.rand((T, E), device="cuda", dtype=torch.float32) * 2 - 1
    offsets = torch.randn(E, device="cuda") * case.get("routing_sigma", 1.0)
    offsets[torch.randperm(E, device="cuda")[:empty_experts(E, case.get("routing_empty", 1 / 16))]] = -1e4
    return (logits + offsets).to(dtype)


@functools.lru_cache(maxsize=None)
def grouped_mm_takes_out_dtype(out_dtype, dtype, varlen_k):
    """Whether this torch's _grouped_mm computes an `out_dtype` output from `dtype` operands itself (a small probe
    of the case's operand layout); where it does not, the product is converted after."""
    offs = torch.tensor([16, 32], device="cuda", dtype=torch.int32)
    a = torch.zeros((32, 16), device="cuda", dtype=dtype)
    b = torch.zeros((32, 16) if varlen_k else (2, 16, 16), device="cuda", dtype=dtype)
    try:
        out = torch._grouped_mm(a.t() if varlen_k else a, b if varlen_k else b.transpose(-2, -1), offs=offs,
                                out_dtype=out_dtype)
        return out.dtype == out_dtype
    except (RuntimeError, TypeError):
        return False


def layer_case(case, dtype, mode, moe_fn=None):
    """Returns (input set builder, forward call, bytes of one input set) for a layer case in --mode `mode`. moe_fn:
    another MoE layer of moe_layer's signature to time instead of the PyTorch-native one
    (bench/compare/sonicmoe_bench.py)."""
    op = case["op"]
    if mode == "moekit" and case.get("weight_grad_dtype", case.get("dtype", "bf16")) != case.get("dtype", "bf16"):
        raise NotSupported("the moekit calls here give weight gradients in the weights' dtype")
    if op.startswith("moe_"):
        T, H, I, E, K = (case[k] for k in ("tokens", "hidden", "intermediate", "experts", "top_k"))
        activation, has_b1, has_b2 = case.get("activation", "swiglu"), case.get("has_b1"), case.get("has_b2")
        interleaved = case.get("glu_layout", "concat") == "interleaved"
        if mode == "moekit":
            # The input sets hold a gated W1 [E, 2I, H].
            if activation not in moekit_package().functional.GATED_ACTIVATIONS:
                raise NotSupported(f"the moekit calls here time the gated activations, not {activation}")
            fn = moekit_moe(case)
        else:
            if case.get("router", "softmax_topk") != "softmax_topk":
                raise NotSupported("the MoE layers timed here route by softmax over the top-k only")
            if moe_fn is not None and (activation != "swiglu" or has_b1 or has_b2):
                raise NotSupported(f"the other layer is timed with SwiGLU and no biases only (this case: {activation}"
                                   + (", biases" if has_b1 or has_b2 else "") + ")")
            if activation not in ("swiglu", "swiglu_oai"):
                raise NotSupported(f"the PyTorch MoE layer here is SwiGLU or SwiGLU-OAI, not {activation}")
            fn = moe_fn or (compile_once(moe_layer) if mode == "compile" else moe_layer)

        def make_set():
            s = dict(x=uniform((T, H), 1.0, dtype, True), w_router=uniform((E, H), H ** -0.5, dtype, True),
                     w1=uniform((E, 2 * I, H), H ** -0.5, dtype, True), w2=uniform((E, H, I), I ** -0.5, dtype, True),
                     dout=uniform((T, H), 1.0, dtype))
            if has_b1:
                s["b1"] = uniform((E, 2 * I), 0.1, dtype, True)
            if has_b2:
                s["b2"] = uniform((E, H), 0.1, dtype, True)
            return s

        def forward(s):
            if moe_fn is not None:
                return fn(s["x"], s["w_router"], s["w1"], s["w2"], K)
            return fn(s["x"], s["w_router"], s["w1"], s["w2"], K, s.get("b1"), s.get("b2"), activation, interleaved)
        set_bytes = 2 * (2 * T * H + E * H + 3 * E * I * H + (2 * E * I if has_b1 else 0) + (E * H if has_b2 else 0))
    else:
        if moe_fn is not None:
            raise NotSupported(f"{op}: only MoE layer cases are timed with another layer")
        if mode == "moekit":
            return sparse_moekit_case(case, dtype)
        T, D, Fw = case["tokens"], case["d_model"], case["d_ff"]
        fn = compile_once(dense_swiglu_ffn) if mode == "compile" else dense_swiglu_ffn

        def make_set():
            return dict(x=uniform((T, D), 1.0, dtype, True), w_gate_up=uniform((2 * Fw, D), D ** -0.5, dtype, True),
                        w_down=uniform((D, Fw), Fw ** -0.5, dtype, True), dout=uniform((T, D), 1.0, dtype))

        def forward(s):
            return fn(s["x"], s["w_gate_up"], s["w_down"])
        set_bytes = 2 * (2 * T * D + 3 * Fw * D)
    return make_set, forward, set_bytes


def top_groups(case):
    """The sparse FFN's groups per token: top_groups, or the density's share of the groups (moekit-bench's rule)."""
    return case.get("top_groups") or max(1, round(case["density"] * case["d_ff"] / case["group_size"]))


def sparse_moekit_case(case, dtype):
    """layer_case's triple for a sparse_ffn_* case run by moekit.sparse_swiglu: W_gate and W_up [F, D], W_down
    [D, F], the case's subsample rows per group drawn from its seed (moekit_subsample_rows), on the device once."""
    moekit = moekit_package()
    T, D, Fw, G = case["tokens"], case["d_model"], case["d_ff"], case["group_size"]
    kg, spg = top_groups(case), case.get("subsample", 0)
    rows = moekit.subsample_rows(case.get("seed", 1), Fw // G, G, spg).cuda() if spg else None

    def make_set():
        return dict(x=uniform((T, D), 1.0, dtype, True), w_gate=uniform((Fw, D), D ** -0.5, dtype, True),
                    w_up=uniform((Fw, D), D ** -0.5, dtype, True), w_down=uniform((D, Fw), Fw ** -0.5, dtype, True),
                    dout=uniform((T, D), 1.0, dtype))

    def forward(s):
        return moekit.sparse_swiglu(s["x"], s["w_gate"], s["w_up"], s["w_down"], G, kg, subsample_rows=rows)
    return make_set, forward, 2 * (2 * T * D + 3 * Fw * D)


class GemmCase:
    """A grouped GEMM case: make_set() builds one input set, call(s) is the user code timed, set_bytes sizes the
    rotation, note says what call() times; with_gathered(s) adds the rows gathered beforehand and alone(s) times
    torch._grouped_mm alone on them (no gather, no epilogue, no accumulation)."""

    def __init__(self, make_set, call, set_bytes, note, with_gathered, alone):
        self.make_set, self.call, self.set_bytes, self.note = make_set, call, set_bytes, note
        self.with_gathered, self.alone = with_gathered, alone


def gemm_case(case, dtype):
    """The GemmCase of a grouped GEMM case."""
    T, E, K, n, k = (case[key] for key in ("tokens", "experts", "top_k", "n", "k"))
    P = T * K
    mode, epilogue = case["mode"], case.get("epilogue", "store")
    gather, layout = case.get("gather", "none"), case.get("b_layout", "nk")
    beta = case.get("beta", 0)
    if case.get("activation", "swiglu") != "swiglu" or case.get("glu_layout", "concat") != "concat":
        raise NotSupported("the PyTorch epilogues here are SwiGLU with the concat layout only")
    scores, _, order, counts, offs = route(routing_logits(case, T, E, dtype), K)
    token, pair = order // K, order
    expert_of_row = torch.repeat_interleave(torch.arange(E, device="cuda"), counts, output_size=P)
    row_scale = scores.reshape(-1).index_select(0, pair)
    a_rows, b_rows = T if gather == "a" else P, T if gather == "b" else P
    product_n = n // 2 if epilogue == "dgated" else n
    c_shape = (E, k, n) if mode == "varlen_k" else (P, n)

    # The output: STORE/BIAS (and varlen K) in out_dtype; GATED/DGATED keep the operand dtype, as moekit's do.
    out_dtype = DTYPES[case.get("out_dtype", case.get("dtype", "bf16"))] if epilogue in ("store", "bias") else dtype
    direct = out_dtype == dtype or grouped_mm_takes_out_dtype(out_dtype, dtype, mode == "varlen_k")
    dtype_name = str(out_dtype).replace("torch.", "")

    def mm(a, b):
        if out_dtype == dtype:
            return torch._grouped_mm(a, b, offs=offs)
        if direct:
            return torch._grouped_mm(a, b, offs=offs, out_dtype=out_dtype)
        return torch._grouped_mm(a, b, offs=offs).to(out_dtype)

    if out_dtype == dtype:
        note = "torch._grouped_mm"
    elif direct:
        note = f"torch._grouped_mm(out_dtype={dtype_name})"
    else:
        note = f"torch._grouped_mm in the operand dtype (this torch takes no out_dtype={dtype_name}), then .to()"
    if beta:
        note += (", then c.add_(product) into the random " + dtype_name + " c"
                 + ("" if beta == 1 else f" after c.mul_({beta})") + f" (beta = {beta})")
    note = ("rows gathered by index_select, then " if gather != "none" else "") + note

    def accumulate(s, product):
        """C = product + beta C where beta is nonzero (C starts random, as in moekit-bench)."""
        if not beta:
            return product
        if beta != 1:
            s["c"].mul_(beta)
        return s["c"].add_(product)

    def rows(s, operand):
        """Operand "a" or "b" of set s, its rows gathered by token when the case gathers it."""
        return s[operand].index_select(0, token) if gather == operand else s[operand]

    def with_gathered(s):
        s["a_rows"], s["b_rows"] = rows(s, "a"), rows(s, "b")

    if mode == "varlen_k":
        def make_set():
            s = dict(a=uniform((a_rows, k), 1.0, dtype), b=uniform((b_rows, n), 1.0, dtype))
            if beta:
                s["c"] = uniform(c_shape, 1.0, out_dtype)
            return s

        def call(s):
            return accumulate(s, mm(rows(s, "a").t(), rows(s, "b")))  # [E, k, n]

        def alone(s):
            return mm(s["a_rows"].t(), s["b_rows"])
        set_bytes = 2 * (a_rows * k + b_rows * n) + (out_dtype.itemsize * E * k * n if beta else 0)
        return GemmCase(make_set, call, set_bytes, note, with_gathered, alone)

    def make_set():
        s = dict(a=uniform((a_rows, k), 1.0, dtype),
                 b=uniform((E, product_n, k) if layout == "nk" else (E, k, product_n), k ** -0.5, dtype))
        if epilogue == "bias":
            s["bias"] = uniform((E, n), 1.0, dtype)
        if epilogue == "dgated":
            s["h"] = uniform((P, n), 1.0, dtype)
        if beta:
            s["c"] = uniform(c_shape, 1.0, out_dtype)
        return s

    def alone(s):
        return mm(s["a_rows"], s["b"].transpose(-2, -1) if layout == "nk" else s["b"])

    def call(s):
        b = s["b"].transpose(-2, -1) if layout == "nk" else s["b"]
        c = mm(rows(s, "a"), b)
        if epilogue == "bias":
            return accumulate(s, c + s["bias"].index_select(0, expert_of_row))
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
        return accumulate(s, c)
    if epilogue == "gated":
        note += ", SwiGLU (F.silu(gate) * up)"
    elif epilogue == "dgated":
        note += ", the SwiGLU backward and the score reduction in eager fp32"
    elif epilogue == "bias":
        note += ", + bias[expert of the row]"
    set_bytes = 2 * (a_rows * k + E * product_n * k + P * n) + (out_dtype.itemsize * P * n if beta else 0)
    return GemmCase(make_set, call, set_bytes, note, with_gathered, alone)


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
        forward = 6.0 * case["tokens"] * case["d_model"] * top_groups(case) * case["group_size"]
    else:
        return 0.0
    direction = op.replace("sparse_ffn_", "").replace("moe_", "")
    return {"forward": forward, "backward": 2 * forward, "forward_backward": 3 * forward}[direction]


def counts_of(case):
    return {key: case.get(key, DEFAULT_COUNTS[key]) for key in DEFAULT_COUNTS}


def step_memory(set_tensors, forward_backward):
    """(peak_extra_bytes, grad_bytes) of one untimed forward_backward(): the peak of torch.cuda.max_memory_allocated
    during it over torch.cuda.memory_allocated() just before it, the previous gradients of the set freed first (as
    the call itself frees them, zero_grad(set_to_none=True)); and the bytes of the gradients it leaves."""
    for t in set_tensors:
        t.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    forward_backward()
    torch.cuda.synchronize()
    peak_extra = torch.cuda.max_memory_allocated() - before
    return peak_extra, sum(t.grad.numel() * t.grad.element_size() for t in set_tensors if t.grad is not None)


def summary(medians, pooled):
    return (statistics.median(pooled), min(pooled), max(pooled)), spread(medians)


def measure(case, mode, grouped_mm_alone, moe_fn=None):
    """Times a case. Returns (median, min, max), spread %, counts, input sets, derivation, and a dict of the
    record's extra fields (gemm: its note, and with grouped_mm_alone the timing of torch._grouped_mm alone).
    moe_fn: as layer_case's."""
    dtype = DTYPES[case.get("dtype", "bf16")]
    op = case["op"]
    counts = counts_of(case)
    torch.manual_seed(case.get("seed", 1))
    derived = ""
    extra = {}
    if op.startswith("moe_") or op.startswith("sparse_ffn_"):
        make_set, forward, set_bytes = layer_case(case, dtype, mode, moe_fn)
        sets = [make_set() for _ in range(rotation_sets(set_bytes))]

        def fwd(i):  # a training forward: the autograd graph is recorded, then dropped
            return forward(sets[i])

        def fwd_bwd(i):
            for t in sets[i].values():
                t.grad = None  # as optimizer.zero_grad(set_to_none=True) leaves them
            forward(sets[i]).backward(sets[i]["dout"])

        fwd_bwd(0)  # compiles and warms both directions
        extra["peak_extra_bytes"], extra["grad_bytes"] = step_memory(list(sets[0].values()), lambda: fwd_bwd(0))
        subtract = None
        if op.endswith("_forward"):
            medians, pooled = time_rounds(fwd, len(sets), counts)
        elif op.endswith("_forward_backward"):
            medians, pooled = time_rounds(fwd_bwd, len(sets), counts)
        else:
            (medians, pooled), subtract = time_alternating_rounds(fwd_bwd, fwd, len(sets), counts)
            derived = "t(forward + backward) - t(forward), medians of each round"
        n_sets = len(sets)
    elif op == "gemm" and moe_fn is None and mode != "moekit":
        if mode == "compile":
            raise NotSupported("grouped GEMM cases run eager only")
        gemm = gemm_case(case, dtype)
        sets = [gemm.make_set() for _ in range(rotation_sets(gemm.set_bytes))]
        gemm.call(sets[0])
        medians, pooled = time_rounds(lambda i: gemm.call(sets[i]), len(sets), counts)
        subtract, n_sets = None, len(sets)
        extra["note"] = "times " + gemm.note
        if grouped_mm_alone:
            for s in sets:
                gemm.with_gathered(s)
            gemm.alone(sets[0])
            (median, lo, hi), alone_spread = summary(*time_rounds(lambda i: gemm.alone(sets[i]), len(sets), counts))
            flops = model_flops(case)
            extra["grouped_mm_alone"] = {
                "what": "the torch._grouped_mm call of the case alone, on rows gathered beforehand (untimed): no "
                        "gather, no epilogue, no accumulation into C",
                "time_us": {"median": median, "min": lo, "max": hi}, "spread_pct": alone_spread,
                "tflops": flops / (median * 1e-6) / 1e12 if flops and median > 0 else None}
    else:
        raise NotSupported("moekit's layers alone are timed from Python (moe_*, sparse_ffn_*)" if mode == "moekit"
                           else f"no counterpart of {op} here")

    if subtract is None:
        time, spread_pct = summary(medians, pooled)
    else:
        part = statistics.median(subtract[1])
        time = (statistics.median(pooled) - part, min(pooled) - part, max(pooled) - part)
        spread_pct = spread([a - b for a, b in zip(medians, subtract[0])])
    return time, spread_pct, counts, n_sets, derived, extra


def run_case(case, mode, config_path, grouped_mm_alone, moe_fn=None, backend=None, command=None):
    """One case's record in --mode `mode`. moe_fn, backend, command: another MoE layer timed in place of the
    PyTorch-native one, its backend name and the command line that re-runs the case
    (bench/compare/sonicmoe_bench.py)."""
    backend = backend or BACKENDS[mode]
    record = {"name": case["name"], "op": case["op"], "backend": backend, "status": "ok", "message": "",
              "shape": " ".join(f"{k}={case[k]}" for k in ("tokens", "hidden", "intermediate", "experts", "top_k", "n",
                                                           "k", "width", "d_model", "d_ff", "group_size", "top_groups",
                                                           "subsample") if k in case),
              "config": case}
    flops = model_flops(case)
    extra = {}
    try:
        (median, lo, hi), spread_pct, counts, sets, derived, extra = measure(case, mode, grouped_mm_alone, moe_fn)
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
    note = extra.get("note", "")
    if mode == "moekit" and case["op"].startswith(("moe_", "sparse_ffn_")):
        note = MOEKIT_NOTE.format(call="moekit.moe" if case["op"].startswith("moe_") else "moekit.sparse_swiglu")
    elif case["op"].startswith("sparse_ffn_") and moe_fn is None:
        note = "sparse_ffn_* cases time the dense SwiGLU FFN of width d_ff; flops are the sparse case's model FLOPs"
    record.update(bytes=None, gbps=None, baseline=None, ratio=None, check=None, note=note,
                  command=command or (f"python3 bench/compare/torch_bench.py {config_path} --mode {mode} "
                                      f"--filter '^{re.escape(case['name'])}$'"
                                      + (" --grouped-mm-alone" if grouped_mm_alone else "")))
    for key in ("peak_extra_bytes", "grad_bytes", "grouped_mm_alone"):
        if key in extra:
            record[key] = extra[key]
    return record


def tool_arguments(description):
    """The arguments every bench/compare tool takes: the config, --out and --filter."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("config")
    parser.add_argument("--out")
    parser.add_argument("--filter", default="")
    return parser


def load_cases(config_path, name_filter, tool):
    """(config, the cases of config_path whose names match name_filter, each with the config's defaults)."""
    with open(config_path) as f:
        config = json.load(f)
    defaults = config.get("defaults", {})
    cases = [{**defaults, **c} for c in config["cases"] if re.search(name_filter, c["name"])]
    if not cases:
        sys.exit(f"{tool}: no case of {config_path} matches --filter {name_filter}")
    return config, cases


def run_meta(config_path, config, backend, versions):
    """The result file's meta: versions (a dict of library versions), device, date, the commit of these sources."""
    # MOEKIT_GIT_SHA: where the sources are a copy without .git (bench/device/run_all.sh passes the staged commit).
    sha = os.environ.get("MOEKIT_GIT_SHA", "")
    try:
        sha = sha or subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()
    except OSError:
        pass
    prop = torch.cuda.get_device_properties(0)
    return {"torch_version": torch.__version__, **versions, "cuda_runtime": torch.version.cuda,
            "git_sha": sha or "unknown", "backend": backend,
            "device": {"name": prop.name, "sm_count": prop.multi_processor_count, "l2_bytes": prop.L2_cache_size},
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "config": config_path, "config_description": config.get("description", ""),
            "command_line": " ".join(sys.argv)}


def run_all(cases, meta, out, run_one):
    """Runs run_one(case) -> record over the cases, rewriting out after each, prints a summary table and exits 1
    if a case failed."""
    results = []
    for i, case in enumerate(cases):
        record = run_one(case)
        median = record["time_us"]["median"]
        print(f"[{i + 1}/{len(cases)}] {case['name']}: "
              f"{f'{median:.2f} us' if median is not None else record['status'] + ' ' + record['message']}",
              file=sys.stderr)
        results.append(record)
        if out:  # rewritten after every case (then renamed): a run stopped by a time limit keeps what it finished
            with open(out + ".partial", "w") as f:
                json.dump({"meta": meta, "cases": results}, f, indent=2)
            os.replace(out + ".partial", out)

    def cell(value, digits):
        return "-" if value is None else f"{value:.{digits}f}"

    print(f"{'case':<48} {'status':<14} {'median us':>11} {'spread%':>8} {'TFLOP/s':>8}")
    for r in results:
        print(f"{r['name']:<48} {r['status']:<14} {cell(r['time_us']['median'], 1):>11} "
              f"{cell(r.get('spread_pct'), 2):>8} {cell(r['tflops'], 1):>8}")
    sys.exit(1 if any(r["status"] == "failed" for r in results) else 0)


def main():
    parser = tool_arguments(__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=tuple(BACKENDS), default="eager",
                        help="eager / compile: the PyTorch-native layers; moekit: moekit's own from Python")
    parser.add_argument("--grouped-mm-alone", action="store_true",
                        help="gemm cases: also time the torch._grouped_mm call alone (rows gathered beforehand, no "
                             "epilogue, no accumulation), recorded as grouped_mm_alone")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_bench.py: needs a CUDA device")
    versions = {}
    if args.mode == "moekit":
        try:
            moekit = moekit_package()
        except (ImportError, OSError) as e:
            sys.exit(f"torch_bench.py: moekit's Python package or its library does not load ({e}); set "
                     "MOEKIT_LIBRARY to a CUDA build's libmoekit.so.0.2")
        version = moekit.load().moekit_get_version()  # major * 10000 + minor * 100 + patch
        versions = {"moekit_version": f"{version // 10000}.{version // 100 % 100}.{version % 100}"}
    config, cases = load_cases(args.config, args.filter, "torch_bench.py")
    meta = run_meta(args.config, config, BACKENDS[args.mode], versions)
    if args.mode == "moekit":
        meta.update(moekit_library=moekit.library_path(),
                    note=MOEKIT_NOTE.format(call="moekit.moe, moekit.sparse_swiglu"))
    run_all(cases, meta, args.out, lambda case: run_case(case, args.mode, args.config, args.grouped_mm_alone))


if __name__ == "__main__":
    main()
