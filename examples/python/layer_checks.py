"""Checks of the moekit layers against moekit.reference, for any device and dtype: the forward output and the
gradients of x and every weight (the router's included) of sum(out * dout). Shared by test_moekit.py (CPU
tensors, moekit's reference backend) and gpu/check_gradients_cuda.py (CUDA tensors).

The reference runs in fp64 on the same (rounded) inputs; the error is the whole-tensor relative norm
||got - want|| / ||want||, which must stay within the tolerance given for the dtype.
"""
import torch

import moekit
from moekit.reference import moe_reference, sparse_swiglu_reference


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
