"""Checks of the moekit layers against moekit.reference, for any device and dtype: the forward output and the
gradients of x and every weight (the router's included) of sum(out * dout). Shared by test_moekit.py (CPU
tensors, moekit's reference backend) and gpu/check_gradients_cuda.py (CUDA tensors).

The reference runs in fp64 on the same (rounded) inputs; the error is the whole-tensor relative norm
||got - want|| / ||want||, which must stay within the tolerance given for the dtype.

It also holds the device that test_options.py, test_aux_losses.py, test_compile.py and test_hf.py run moekit on
(MOEKIT_TEST_DEVICE: cpu, the reference backend, by default; cuda, the CUDA backend), its dtypes and the bf16
tolerance. Those tests make their data on the CPU and compare there: to_device and on_device carry it to the device
and the results back.
"""
import os
import sys
import unittest

import torch

import moekit
from moekit.reference import moe_reference, sparse_swiglu_reference

DEVICE = torch.device(os.environ.get("MOEKIT_TEST_DEVICE", "cpu"))
ON_CPU = DEVICE.type == "cpu"
# The floating dtypes the device's layers store, widest first: the CUDA backend stores bf16 or fp16 (bf16 tested).
DTYPES = (torch.float64, torch.float32, torch.bfloat16) if ON_CPU else (torch.bfloat16,)
DTYPE = DTYPES[0]
# Beside DTYPE storage: the dtype of router scores and of main_grad (fp32; fp64 in an fp64 plan).
WIDE = torch.float64 if DTYPE == torch.float64 else torch.float32
# bf16 layers against the fp64 layers of the same inputs, whole-tensor relative error: the fp64 side rounds nothing,
# moekit rounds at docs/math.md section 8's points (section 9 holds it within 1e-2 of the reference backend).
TOLERANCE = 2e-2


def relative_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _random(shape, scale, generator, device, dtype):
    values = (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * scale
    return values.to(device=device, dtype=dtype)


def _compare(layer, fn, reference, tensors, extra, device, dtype, tolerance, seed):
    """Runs fn and reference on the same leaves; returns {name: relative error} over out and every gradient."""
    generator = torch.Generator().manual_seed(seed)
    inputs = {name: _random(shape, scale, generator, device, dtype) for name, (shape, scale) in tensors.items()}
    dout = _random(tensors["x"][0], 1.0, generator, device, dtype)
    storage = None if dtype == torch.float64 else dtype

    leaves = {name: t.clone().requires_grad_() for name, t in inputs.items()}
    out = fn(*leaves.values(), *extra)
    (out.double() * dout.double()).sum().backward()

    ref_leaves = {name: t.double().requires_grad_() for name, t in inputs.items()}
    ref_out = reference(*ref_leaves.values(), *extra, storage_dtype=storage)
    (ref_out * dout.double()).sum().backward()

    errors = {"out": relative_error(out, ref_out)}
    for name in inputs:
        errors["d" + name] = relative_error(leaves[name].grad, ref_leaves[name].grad)
    worst = max(errors, key=errors.get)
    if not errors[worst] <= tolerance:
        raise AssertionError("%s %s on %s: %s relative error %.3g > %.3g (all: %s)" % (
            layer, dtype, device, worst, errors[worst], tolerance,
            ", ".join("%s %.2g" % item for item in errors.items())))
    return errors


def check_moe(device, dtype, tolerance, tokens=64, hidden=32, intermediate=16, experts=8, top_k=2, seed=0):
    tensors = {
        "x": ((tokens, hidden), 1.0),
        # Logits spread over a few units: selection gaps far above the storage dtype's rounding.
        "w_router": ((experts, hidden), 4.0 / hidden ** 0.5),
        "w1": ((experts, 2 * intermediate, hidden), 1.0 / hidden ** 0.5),
        "w2": ((experts, hidden, intermediate), 1.0 / intermediate ** 0.5),
    }
    return _compare("MoE layer", moekit.moe, moe_reference, tensors, (top_k,), device, dtype, tolerance, seed)


def check_sparse_swiglu(device, dtype, tolerance, tokens=64, d_model=32, d_ff=128, group_size=16, top_groups=3,
                        seed=1):
    tensors = {
        "x": ((tokens, d_model), 1.0),
        "w_gate": ((d_ff, d_model), 2.0 / d_model ** 0.5),
        "w_up": ((d_ff, d_model), 1.0 / d_model ** 0.5),
        "w_down": ((d_model, d_ff), 1.0 / (group_size * top_groups) ** 0.5),
    }
    return _compare("sparse SwiGLU", moekit.sparse_swiglu, sparse_swiglu_reference, tensors,
                    (group_size, top_groups), device, dtype, tolerance, seed)


def rounded(values):
    """fp64 values rounded to DTYPE, kept in fp64: inputs that moekit on DEVICE and the fp64 oracle read alike."""
    return values.to(DTYPE).to(values.dtype)


def _mapped(value, move):
    if isinstance(value, torch.Tensor):
        return move(value)
    if isinstance(value, tuple):
        items = [_mapped(item, move) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def to_device(value):
    """A test's value as the layers on DEVICE take it: fp64 tensors in DTYPE, other tensors only moved, tuples item by
    item. Differentiable: gradients reach the tensors given. On the CPU, the value itself."""
    return _mapped(value, lambda t: t.to(DEVICE, DTYPE if t.dtype == torch.float64 else t.dtype))


def to_host(value):
    """Results on DEVICE as CPU tensors of their dtype, tuples item by item; differentiable."""
    return _mapped(value, lambda t: t.cpu())


def on_device(fn):
    """fn (a moekit function or module) called on to_device of its arguments, its results through to_host."""
    def call(*args, **kwargs):
        return to_host(fn(*to_device(args), **{name: to_device(value) for name, value in kwargs.items()}))
    return call


def assert_close(got, want, rtol=None, atol=None, msg=None):
    """A moekit result against the oracle's (or another moekit result): torch.testing.assert_close with these
    tolerances on the CPU (fp64); elsewhere (bf16) the whole-tensor relative error within TOLERANCE, and exactly 0
    where want is 0."""
    if ON_CPU:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=msg)
        return
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    if got.shape != want.shape:
        raise AssertionError("%s: shape %s, expected %s" % (msg or "result", list(got.shape), list(want.shape)))
    error, scale = (got - want).norm().item(), want.norm().item()
    if not error <= TOLERANCE * scale:
        raise AssertionError("%s on %s: relative error %.3g > %g" % (msg or "result", DEVICE, error / scale
                                                                     if scale else float("inf"), TOLERANCE))


def cpu_only(reason):
    """Skips, off the CPU, a check that only the reference backend makes; the skip says why."""
    return unittest.skipUnless(ON_CPU, "CPU only: " + reason)


def skip_unless(condition, reason):
    """unittest.skipUnless(condition, reason) on the CPU. Off it, a test run is there to make its checks on the device:
    a missing condition ends the run, failed (exit 1), with the reason."""
    if not (condition or ON_CPU):
        sys.exit("FAILED on %s: %s" % (DEVICE, reason))
    return unittest.skipUnless(condition, reason)
