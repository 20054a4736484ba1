"""The moekit layers as differentiable PyTorch functions.

    out = moe(x, w_router, w1, w2, top_k)                                   x [T, H] -> out [T, H]
    out = sparse_swiglu(x, w_gate, w_up, w_down, group_size, top_groups)   x [T, D] -> out [T, D]

The backward of each is the library's backward, fed the saved-activation buffer its forward filled. Where torch has
torch.library.custom_op (2.4+), each layer is a pair of custom ops (moekit::<layer>_forward / _backward) joined by
register_autograd, so torch.compile traces them whole (fake implementations give the output shapes without running
anything); on an older torch the same calls sit in a torch.autograd.Function. Both layers take x and three weights of
one floating dtype (bf16, fp16, fp32; fp64 on CPU) on one device, and give gradients in that dtype.

Supported options: the MoE layer is SwiGLU (concatenated halves) with the softmax over the top-k logits, no biases;
the sparse FFN selects groups from all G rows, without a load-balance bias. The C API has the rest.
"""
from typing import List, Tuple

import torch

from . import _capi, _runtime


class _LayerSpec:
    """What differs between the two layers: the C names, the weights' names and how shapes fill the descriptor."""

    def __init__(self, name, c_name, desc_type, fwd_type, bwd_type, weight_names, desc_fields):
        self.name = name
        self.create = "moekit_%s_plan_create" % c_name
        self.desc_type, self.desc_init = desc_type, "moekit_%s_desc_init" % c_name
        self.fwd_type, self.fwd_init = fwd_type, "moekit_%s_fwd_args_init" % c_name
        self.bwd_type, self.bwd_init = bwd_type, "moekit_%s_bwd_args_init" % c_name
        self.forward, self.backward = "moekit_%s_forward" % c_name, "moekit_%s_backward" % c_name
        self.weight_names = weight_names
        self.desc_fields = desc_fields

    def plan(self, x, weights, options, inference):
        fields = self.desc_fields(x, weights, options)
        fields.update(max_tokens=x.shape[0], dtype=_runtime.moekit_dtype(x.dtype), inference=int(inference))
        # int(): under torch.compile the shapes may be symbolic; a plan is made for concrete ones (a guard).
        fields = {name: int(value) for name, value in fields.items()}
        return _runtime.plan_for(x.device, self.create, self.desc_type, self.desc_init, fields)


def _moe_fields(x, weights, options):
    w_router, w1, _ = weights
    return dict(hidden=x.shape[1], intermediate=w1.shape[1] // 2, router_experts=w_router.shape[0],
                experts=w1.shape[0], top_k=options[0])


def _sparse_fields(x, weights, options):
    w_gate = weights[0]
    return dict(d_model=x.shape[1], d_ff=w_gate.shape[0], group_size=options[0], top_groups=options[1])


MOE = _LayerSpec("moe", "moe", _capi.MoeDesc, _capi.MoeFwdArgs, _capi.MoeBwdArgs, ("w_router", "w1", "w2"), _moe_fields)
SPARSE_SWIGLU = _LayerSpec("sparse_swiglu", "sparse_ffn", _capi.SparseFfnDesc, _capi.SparseFfnFwdArgs,
                           _capi.SparseFfnBwdArgs, ("w_gate", "w_up", "w_down"), _sparse_fields)


def _pointer(tensor):
    return tensor.data_ptr() or None


def forward_impl(spec, x, weights, options, training):
    """Runs the layer: (out, saved), saved empty when not training (an inference plan stores nothing)."""
    plan = spec.plan(x, weights, options, inference=not training)
    out = torch.empty_like(x)
    saved = _runtime.buffer(plan.saved_bytes if training else 0, x.device)
    workspace = _runtime.buffer(plan.workspace_bytes, x.device)
    args = _capi.initialised(spec.fwd_type, spec.fwd_init)
    args.x = _runtime.view(x)
    for name, weight in zip(spec.weight_names, weights):
        setattr(args, name, _runtime.view(weight))
    args.out = _runtime.view(out)
    _runtime.run(plan, spec.forward, args, _pointer(saved), saved.numel(), _pointer(workspace), workspace.numel(),
                 device=x.device)
    return out, saved


def backward_impl(spec, dout, x, weights, saved, options, input_grad, weight_grad):
    """The gradients (dx, dW...) of the forward that filled `saved`; None for those not asked for."""
    plan = spec.plan(x, weights, options, inference=False)
    workspace = _runtime.buffer(plan.workspace_bytes, x.device)
    dx = torch.empty_like(x) if input_grad else None
    dweights = [torch.empty_like(w) if weight_grad else None for w in weights]
    args = _capi.initialised(spec.bwd_type, spec.bwd_init)
    args.x = _runtime.view(x)
    args.dout = _runtime.view(dout)
    args.dx = _runtime.view(dx)
    for name, weight, grad in zip(spec.weight_names, weights, dweights):
        setattr(args, name, _runtime.view(weight))
        setattr(args, "d" + name, _runtime.view(grad))
    args.compute_input_grad = int(input_grad)
    args.compute_weight_grad = int(weight_grad)
    _runtime.run(plan, spec.backward, args, _pointer(saved), saved.numel(), _pointer(workspace), workspace.numel(),
                 device=x.device)
    return (dx, *dweights)


class LayerFunction(torch.autograd.Function):
    """out = layer(x, weights); the backward runs the library's backward on the saved buffer."""

    @staticmethod
    def forward(ctx, spec, options, x, *weights):
        out, saved = forward_impl(spec, x, weights, options, training=True)
        ctx.spec, ctx.options = spec, options
        ctx.save_for_backward(x, saved, *weights)
        return out

    @staticmethod
    def backward(ctx, dout):
        x, saved, *weights = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]  # x, then the weights
        grads = backward_impl(ctx.spec, dout.contiguous(), x, weights, saved, ctx.options, needs[0], any(needs[1:]))
        return (None, None) + tuple(g if need else None for g, need in zip(grads, needs))


def _register_custom_ops(spec):
    """moekit::<layer>_forward and moekit::<layer>_backward, with fake implementations and autograd."""

    @torch.library.custom_op("moekit::%s_forward" % spec.name, mutates_args=())
    def forward_op(x: torch.Tensor, w_a: torch.Tensor, w_b: torch.Tensor, w_c: torch.Tensor, options: List[int],
                   training: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        return forward_impl(spec, x, (w_a, w_b, w_c), options, training)

    @forward_op.register_fake
    def _(x, w_a, w_b, w_c, options, training):
        saved_bytes = spec.plan(x, (w_a, w_b, w_c), options, inference=not training).saved_bytes if training else 0
        return torch.empty_like(x), x.new_empty(saved_bytes, dtype=torch.uint8)

    @torch.library.custom_op("moekit::%s_backward" % spec.name, mutates_args=())
    def backward_op(dout: torch.Tensor, x: torch.Tensor, w_a: torch.Tensor, w_b: torch.Tensor, w_c: torch.Tensor,
                    saved: torch.Tensor, options: List[int], input_grad: bool,
                    weight_grad: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        grads = backward_impl(spec, dout, x, (w_a, w_b, w_c), saved, options, input_grad, weight_grad)
        # Custom ops return tensors, never None: an empty tensor stands for a gradient not asked for.
        return tuple(g if g is not None else x.new_empty(0) for g in grads)

    @backward_op.register_fake
    def _(dout, x, w_a, w_b, w_c, saved, options, input_grad, weight_grad):
        like = lambda t, wanted: torch.empty_like(t) if wanted else t.new_empty(0)  # noqa: E731
        return like(x, input_grad), like(w_a, weight_grad), like(w_b, weight_grad), like(w_c, weight_grad)

    def setup_context(ctx, inputs, output):
        x, w_a, w_b, w_c, options, _ = inputs
        ctx.options = options
        ctx.save_for_backward(x, w_a, w_b, w_c, output[1])

    def backward(ctx, dout, _dsaved):
        x, w_a, w_b, w_c, saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[:4]
        grads = backward_op(dout.contiguous(), x, w_a, w_b, w_c, saved, ctx.options, needs[0], any(needs[1:]))
        return tuple(g if need else None for g, need in zip(grads, needs)) + (None, None)

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op


CUSTOM_OPS = hasattr(torch.library, "custom_op")  # torch 2.4+
_FORWARD_OPS = {spec.name: _register_custom_ops(spec) for spec in (MOE, SPARSE_SWIGLU)} if CUSTOM_OPS else {}


def _apply(spec, x, weights, options):
    x = x.contiguous()
    weights = tuple(w.contiguous() for w in weights)
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (x,) + weights)
    if CUSTOM_OPS:
        return _FORWARD_OPS[spec.name](x, *weights, list(options), training)[0]
    if training:
        return LayerFunction.apply(spec, list(options), x, *weights)
    return forward_impl(spec, x, weights, options, training=False)[0]


def moe(x, w_router, w1, w2, top_k):
    """The MoE layer (SwiGLU experts, softmax over the top-k router logits): x [T, H], w_router [E, H],
    w1 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I] -> [T, H]."""
    return _apply(MOE, x, (w_router, w1, w2), [top_k])


def sparse_swiglu(x, w_gate, w_up, w_down, group_size, top_groups):
    """The group-sparse SwiGLU FFN: x [T, D], w_gate and w_up [F, D], w_down [D, F]; each token keeps the
    `top_groups` groups of `group_size` neurons of highest energy -> [T, D]."""
    return _apply(SPARSE_SWIGLU, x, (w_gate, w_up, w_down), [group_size, top_groups])
