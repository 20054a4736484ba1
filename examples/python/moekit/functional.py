"""The moekit operations as differentiable PyTorch functions.

    out = moe(x, w_router, w1, w2, top_k, ...)                             x [T, H] -> out [T, H]
    y = experts(x, expert_offsets, w1, w2, ...)                            grouped rows [P, H] -> [P, H]
    out = sparse_swiglu(x, w_gate, w_up, w_down, group_size, top_groups)   x [T, D] -> out [T, D]
    routing = dispatch(indices, experts); gather_tokens(x, ...); combine(y, scores, grouped_pos)

The backward of each layer is the library's backward, fed the saved-activation buffer its forward filled. Where torch
has torch.library.custom_op (2.4+), each layer is a pair of custom ops (moekit::<layer>_forward / _backward) joined by
register_autograd, so torch.compile traces them whole (fake implementations give the output shapes without running
anything); on an older torch the same calls sit in a torch.autograd.Function. The layers take x and weights of one
floating dtype (bf16, fp16, fp32; fp64 on CPU) on one device, and give gradients in that dtype, or, with
fuse_wgrad_accumulation, add the weight gradients into each weight's `main_grad` (Megatron-LM's convention).
"""
import collections
from typing import List, Optional, Tuple

import torch

from . import _capi, _runtime

ROUTERS = {"softmax_topk": 0, "topk_softmax": 1, "topk": 2, "sigmoid": 3}
ACTIVATIONS = {"swiglu": 0, "geglu": 1, "reglu": 2, "swiglu_oai": 3, "gelu": 16, "relu": 17, "silu": 18, "relu2": 19}
GATED_ACTIVATIONS = ("swiglu", "geglu", "reglu", "swiglu_oai")
GLU_LAYOUTS = {"concat": 0, "interleaved": 1}

Routing = collections.namedtuple("Routing", ["scores", "indices", "counts"])
Routing.__doc__ = ("The MoE layer's routing: scores [T, K] fp32 and indices [T, K] int64 (global expert ids) in "
                   "selection order, counts [router_experts] int32 (pairs per expert, before dropping).")
AuxLosses = collections.namedtuple("AuxLosses", ["load_balance", "z"])
AuxLosses.__doc__ = ("The router's auxiliary losses (docs/math.md section 1.1), 0-dim fp32 tensors with gradients "
                     "through the router: 0 for a loss whose coefficient is 0.")
Selection = collections.namedtuple("Selection", ["groups", "counts"])
Selection.__doc__ = "The sparse FFN's selection: groups [T, kg] int32, counts [F/G] int32 (tokens per group)."
Dispatch = collections.namedtuple("Dispatch", ["expert_offsets", "gather_idx", "pair_idx", "grouped_pos"])
Dispatch.__doc__ = ("The grouping of dispatch (docs/math.md section 2), all int32: expert_offsets [E+1], gather_idx "
                    "[P] (token of grouped row i), pair_idx [P] (pair of grouped row i), grouped_pos [P] (grouped row "
                    "of pair p, -1 when dropped). Rows past expert_offsets[E] of gather_idx and pair_idx are 0.")


def _bound(rows):
    """A plan's row bound for a call of `rows` rows: a plan needs a bound >= 1, a call may have 0 rows."""
    return max(int(rows), 1)


def _choice(name, value, table):
    if value not in table:
        raise ValueError("%s: expected one of %s, got %r" % (name, ", ".join(table), value))
    return table[value]


def _dense(gradient):
    """A contiguous output gradient; an empty one gets fresh strides (contiguous() keeps those of an expanded empty
    tensor, e.g. 0, which the library rejects)."""
    return gradient.contiguous() if gradient.numel() else gradient.new_zeros(gradient.shape)


def _pointer(tensor):
    return tensor.data_ptr() or None


class _LayerSpec:
    """What differs between the layers: the C names, the tensors of each call and how they fill the descriptor.

    `inputs` are the forward's tensors in argument order (x first; None for an absent optional one), `weights`
    those of them that have a gradient, `bwd_inputs` those the backward reads besides the output gradient."""

    def __init__(self, name, c_name, desc_type, desc_init, fwd_type, bwd_type, inputs, weights, bwd_inputs, out,
                 extras, int_options, float_options, desc_fields, extra_outputs, losses=()):
        self.name = name
        self.create = "moekit_%s_plan_create" % c_name
        self.desc_type, self.desc_init = desc_type, desc_init
        self.fwd_type, self.fwd_init = fwd_type, "moekit_%s_fwd_args_init" % c_name
        self.bwd_type, self.bwd_init = bwd_type, "moekit_%s_bwd_args_init" % c_name
        self.forward, self.backward = "moekit_%s_forward" % c_name, "moekit_%s_backward" % c_name
        self.inputs, self.weights, self.bwd_inputs = inputs, weights, bwd_inputs
        self.out, self.dout = out, "d" + out
        self.extras = extras
        self.int_options, self.float_options = int_options, float_options
        self.desc_fields = desc_fields
        self.extra_outputs = extra_outputs
        # {extra output: its coefficient option}: the differentiable scalar extras, passed only while on.
        self.losses = dict(losses)

    def plan(self, tensors, options, inference):
        x = tensors["x"]
        fields = {name: int(value) for name, value in self.desc_fields(tensors, options).items()}
        fields.update({name: int(options[name]) for name in self.int_options})
        fields.update({name: float(options[name]) for name in self.float_options})
        # int(): under torch.compile the shapes may be symbolic; a plan is made for concrete ones (a guard).
        fields.update(max_tokens=_bound(x.shape[0]), dtype=_runtime.moekit_dtype(x.dtype), inference=int(inference))
        return _runtime.plan_for(x.device, self.create, self.desc_type, self.desc_init, fields)

    def options(self, int_values, float_values):
        return dict(zip(self.int_options, int_values), **dict(zip(self.float_options, float_values)))


def _moe_fields(t, options):
    gated = options["activation"] in [ACTIVATIONS[name] for name in GATED_ACTIVATIONS]
    w1 = t["w1"]
    if w1.dim() != 3:
        raise ValueError("w1: expected rank 3 ([E, 2I, H] or [E, I, H]), got shape %s" % list(w1.shape))
    fields = dict(hidden=t["x"].shape[-1], intermediate=w1.shape[1] // 2 if gated else w1.shape[1],
                  experts=w1.shape[0], has_b1=t["b1"] is not None, has_b2=t["b2"] is not None)
    if "w_router" in t:
        fields.update(router_experts=t["w_router"].shape[0])
    return fields


def _loss_dtype(x):
    # fp64 in an fp64 plan (gradient checks on the reference backend), fp32 otherwise.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _moe_extras(t, options):
    x = t["x"]
    k = options["top_k"]
    # The losses are 0-dim (moekit reads one element flat); zeros stand for a loss that is off.
    loss_dtype = _loss_dtype(x)
    return dict(scores=x.new_empty((x.shape[0], k), dtype=torch.float32),
                indices=x.new_empty((x.shape[0], k), dtype=torch.int64),
                counts=x.new_empty((t["w_router"].shape[0],), dtype=torch.int32),
                load_balance_loss=x.new_zeros((), dtype=loss_dtype),
                z_loss=x.new_zeros((), dtype=loss_dtype))


def _sparse_fields(t, options):
    rows = t["subsample_rows"]
    return dict(d_model=t["x"].shape[-1], d_ff=t["w_gate"].shape[0],
                subsample=rows.shape[-1] if rows is not None and rows.dim() > 0 else 0)


def _sparse_extras(t, options):
    x = t["x"]
    return dict(groups=x.new_empty((x.shape[0], options["top_groups"]), dtype=torch.int32),
                counts=x.new_empty((t["w_gate"].shape[0] // options["group_size"],), dtype=torch.int32))


_EXPERT_OPTIONS = ("activation", "glu_layout", "weight_grad_dtype", "backward_overwrites_saved",
                   "backward_scratch_in_dw1")
MOE = _LayerSpec("moe", "moe", _capi.MoeDesc, "moekit_moe_desc_init", _capi.MoeFwdArgs, _capi.MoeBwdArgs,
                 inputs=("x", "w_router", "router_bias", "w1", "b1", "w2", "b2"),
                 weights=("w_router", "w1", "b1", "w2", "b2"), bwd_inputs=("x", "w_router", "w1", "w2", "b2"),
                 out="out", extras=("scores", "indices", "counts", "load_balance_loss", "z_loss"),
                 int_options=("top_k", "router", "renormalize", "expert_begin") + _EXPERT_OPTIONS,
                 float_options=("router_scale", "glu_limit", "load_balance_coeff", "z_loss_coeff"),
                 desc_fields=_moe_fields, extra_outputs=_moe_extras,
                 losses=(("load_balance_loss", "load_balance_coeff"), ("z_loss", "z_loss_coeff")))
EXPERTS = _LayerSpec("experts", "experts", _capi.MoeDesc, "moekit_moe_desc_init", _capi.ExpertsFwdArgs,
                     _capi.ExpertsBwdArgs, inputs=("x", "offsets", "w1", "b1", "w2", "b2"),
                     weights=("w1", "b1", "w2", "b2"), bwd_inputs=("x", "offsets", "w1", "w2"), out="y", extras=(),
                     int_options=_EXPERT_OPTIONS, float_options=("glu_limit",), desc_fields=_moe_fields,
                     extra_outputs=lambda t, options: {})
SPARSE_SWIGLU = _LayerSpec("sparse_swiglu", "sparse_ffn", _capi.SparseFfnDesc, "moekit_sparse_ffn_desc_init",
                           _capi.SparseFfnFwdArgs, _capi.SparseFfnBwdArgs,
                           inputs=("x", "w_gate", "w_up", "w_down", "subsample_rows", "lb_bias"),
                           weights=("w_gate", "w_up", "w_down"), bwd_inputs=("x", "w_gate", "w_up", "w_down"),
                           out="out", extras=("groups", "counts"),
                           int_options=("group_size", "top_groups", "weight_grad_dtype"), float_options=(),
                           desc_fields=_sparse_fields, extra_outputs=_sparse_extras)
SPECS = (MOE, EXPERTS, SPARSE_SWIGLU)


def _zeroed_rows(spec, x):
    # The experts op leaves grouped rows past offsets[E] untouched: they read as 0, as their gradient is.
    return torch.zeros_like(x) if spec is EXPERTS else torch.empty_like(x)


def forward_impl(spec, tensors, options, training):
    """Runs the layer: (out, saved, extras), saved empty when not training (an inference plan stores nothing)."""
    plan = spec.plan(tensors, options, inference=not training)
    x = tensors["x"]
    out = _zeroed_rows(spec, x)
    extras = spec.extra_outputs(tensors, options)
    saved = _runtime.buffer(plan.saved_bytes if training else 0, x.device)
    workspace = _runtime.buffer(plan.forward_workspace_bytes, x.device)
    args = _capi.initialised(spec.fwd_type, spec.fwd_init)
    for name in spec.inputs:
        setattr(args, name, _runtime.view(tensors[name]))
    setattr(args, spec.out, _runtime.view(out))
    for name, tensor in extras.items():
        if name not in spec.losses or options[spec.losses[name]] != 0:
            setattr(args, name, _runtime.view(tensor.view(1) if name in spec.losses else tensor))
    _runtime.run(plan, spec.forward, args, _pointer(saved), saved.numel(), _pointer(workspace), workspace.numel(),
                 device=x.device)
    _runtime.mark_saved_fresh(saved)
    return out, saved, [extras[name] for name in spec.extras]


def backward_impl(spec, dout, tensors, saved, options, input_grad, weight_grad, grad_into=None, loss_grads=None):
    """The gradients (dx, {weight: grad}) of the forward that filled `saved`: None for those not asked for. A weight
    named in `grad_into` has its gradient added (beta = 1) to that tensor, which is then its gradient. loss_grads:
    {loss: the gradient of that scalar output}; a loss without one has a gradient of 0. dout None: the output has
    no gradient (only a loss was used), taken as 0. With backward_overwrites_saved, `saved` serves one backward:
    a second one over it raises MoekitError (_runtime.spend_saved)."""
    grad_into = grad_into or {}
    loss_grads = loss_grads or {}
    # A plan with backward_scratch_in_dw1 computes the weight gradients in every backward (its rule on the call): a
    # call for the input gradient alone (the backward op called directly) computes them too and drops them.
    dropped = bool(options.get("backward_scratch_in_dw1")) and not weight_grad
    weight_grad = weight_grad or dropped
    plan = spec.plan(tensors, options, inference=False)
    x = tensors["x"]
    if dout is None:
        dout = torch.zeros_like(x)  # out has x's shape and dtype in every layer (see _zeroed_rows)
    workspace = _runtime.buffer(plan.backward_workspace_bytes, x.device)
    dx = _zeroed_rows(spec, x) if input_grad else None
    grad_dtype = _runtime.torch_dtype(options["weight_grad_dtype"])
    grads = {}
    args = _capi.initialised(spec.bwd_type, spec.bwd_init)
    for name in spec.bwd_inputs:
        setattr(args, name, _runtime.view(tensors[name]))
    setattr(args, spec.dout, _runtime.view(dout))
    args.dx = _runtime.view(dx)
    for name in spec.weights:
        if tensors[name] is None or not weight_grad:
            continue
        if name in grad_into:
            grads[name] = grad_into[name]
            setattr(args, "beta_d" + name, 1.0)
        else:
            grads[name] = torch.empty_like(tensors[name], dtype=grad_dtype)
        setattr(args, "d" + name, _runtime.view(grads[name]))
    args.compute_input_grad = int(input_grad)
    args.compute_weight_grad = int(weight_grad)
    held = []  # the loss gradients' tensors: each view borrows its memory until the call returns
    for name, coeff in spec.losses.items():
        if options[coeff] != 0:
            grad = loss_grads.get(name)
            dtype = _loss_dtype(x)
            held.append(x.new_zeros(1, dtype=dtype) if grad is None else grad.reshape(1).to(dtype).contiguous())
            setattr(args, "d" + name, _runtime.view(held[-1]))

    def call():
        _runtime.run(plan, spec.backward, args, _pointer(saved), saved.numel(), _pointer(workspace),
                     workspace.numel(), device=x.device)

    if options.get("backward_overwrites_saved"):
        _runtime.spend_saved(saved, call)
    else:
        call()
    return dx, {} if dropped else grads


def _fused_grad(weight):
    """What a weight whose gradient went into its main_grad gets as .grad: as Transformer Engine does, an unused
    tensor flagged by `grad_added_to_main_grad` where the weight carries that attribute (Megatron-LM's), else None."""
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    weight.grad_added_to_main_grad = True
    if getattr(weight, "zero_out_wgrad", False):
        return torch.zeros_like(weight)
    return torch.empty_like(weight)


class LayerFunction(torch.autograd.Function):
    """out = layer(inputs); the backward runs the library's backward on the saved buffer."""

    @staticmethod
    def forward(ctx, spec, options, owners, *inputs):
        tensors = dict(zip(spec.inputs, inputs))
        out, saved, extras = forward_impl(spec, tensors, options, training=True)
        # An output without a gradient (the routing outputs, an unused out) reaches backward as None, not zeros.
        _no_zero_grads(ctx)
        # owners: {weight name: the tensor whose main_grad takes its gradient} (fused accumulation), else empty.
        ctx.spec, ctx.options, ctx.owners = spec, options, owners
        ctx.present = [t is not None for t in inputs]
        ctx.save_for_backward(saved, *[t for t in inputs if t is not None])
        ctx.mark_non_differentiable(*[t for name, t in zip(spec.extras, extras) if name not in spec.losses])
        return (out, *extras)

    @staticmethod
    def backward(ctx, dout, *dextras):
        spec = ctx.spec
        saved, *present = ctx.saved_tensors
        present = iter(present)
        inputs = [next(present) if here else None for here in ctx.present]
        tensors = dict(zip(spec.inputs, inputs))
        needs = dict(zip(spec.inputs, ctx.needs_input_grad[3:]))
        fused = {name: owner.main_grad for name, owner in ctx.owners.items() if needs[name]}
        weight_grad = any(needs[name] for name in spec.weights)
        loss_grads = {name: g for name, g in zip(spec.extras, dextras) if name in spec.losses}
        dx, grads = backward_impl(spec, None if dout is None else _dense(dout), tensors, saved, ctx.options,
                                  needs["x"], weight_grad, fused, loss_grads)
        result = {"x": dx if needs["x"] else None}
        for name in spec.weights:
            if needs[name]:
                result[name] = _fused_grad(ctx.owners[name]) if name in fused else grads[name]
        return (None, None, None) + tuple(result.get(name) for name in spec.inputs)


# Custom ops have one signature for every layer: x and up to six more tensors (absent ones None), the options as two
# lists; the forward returns out, saved and up to five extra outputs (empty where a layer has fewer), the backward
# takes the gradients of the loss outputs (None where a layer has none).
_SLOTS, _EXTRA_SLOTS = 7, 5


def _no_zero_grads(ctx):
    """Has autograd pass None, not a materialised zero tensor, for an output without a gradient. The forward op
    returns the saved-activation buffer as an output (the backward op takes it): a zero gradient of it would be as
    large as the buffer, allocated in every backward for nothing; the routing outputs would get zeros as well."""
    ctx.set_materialize_grads(False)


def _padded(values, length):
    return list(values) + [None] * (length - len(values))


def _register_custom_ops(spec):
    """moekit::<layer>_forward and moekit::<layer>_backward, with fake implementations and autograd."""

    def tensors_of(t):
        return dict(zip(spec.inputs, t))

    @torch.library.custom_op("moekit::%s_forward" % spec.name, mutates_args=())
    def forward_op(x: torch.Tensor, t1: Optional[torch.Tensor], t2: Optional[torch.Tensor],
                   t3: Optional[torch.Tensor], t4: Optional[torch.Tensor], t5: Optional[torch.Tensor],
                   t6: Optional[torch.Tensor], int_options: List[int], float_options: List[float],
                   training: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor, torch.Tensor]:
        tensors = tensors_of((x, t1, t2, t3, t4, t5, t6))
        out, saved, extras = forward_impl(spec, tensors, spec.options(int_options, float_options), training)
        extras += [x.new_empty(0) for _ in range(_EXTRA_SLOTS - len(extras))]
        return (out, saved, *extras)

    @forward_op.register_fake
    def _(x, t1, t2, t3, t4, t5, t6, int_options, float_options, training):
        tensors = tensors_of((x, t1, t2, t3, t4, t5, t6))
        options = spec.options(int_options, float_options)
        saved_bytes = spec.plan(tensors, options, inference=False).saved_bytes if training else 0
        extras = spec.extra_outputs(tensors, options)
        # Distinct empty tensors, as the real implementation returns: one repeated would alias itself.
        extras = [extras[name] for name in spec.extras] + [x.new_empty(0) for _ in
                                                            range(_EXTRA_SLOTS - len(spec.extras))]
        return (torch.empty_like(x), x.new_empty(saved_bytes, dtype=torch.uint8), *extras)

    @torch.library.custom_op("moekit::%s_backward" % spec.name, mutates_args=())
    def backward_op(dout: torch.Tensor, saved: torch.Tensor, x: torch.Tensor, t1: Optional[torch.Tensor],
                    t2: Optional[torch.Tensor], t3: Optional[torch.Tensor], t4: Optional[torch.Tensor],
                    t5: Optional[torch.Tensor], t6: Optional[torch.Tensor], dloss1: Optional[torch.Tensor],
                    dloss2: Optional[torch.Tensor], int_options: List[int], float_options: List[float],
                    input_grad: bool,
                    weight_grad: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                torch.Tensor, torch.Tensor]:
        tensors = tensors_of((x, t1, t2, t3, t4, t5, t6))
        loss_grads = dict(zip(spec.losses, (dloss1, dloss2)))
        dx, grads = backward_impl(spec, dout, tensors, saved, spec.options(int_options, float_options), input_grad,
                                  weight_grad, loss_grads=loss_grads)
        grads["x"] = dx
        # Custom ops return tensors, never None: an empty tensor stands for a gradient not asked for.
        return tuple(grads.get(name) if grads.get(name) is not None else x.new_empty(0)
                     for name in _padded(spec.inputs, _SLOTS))

    @backward_op.register_fake
    def _(dout, saved, x, t1, t2, t3, t4, t5, t6, dloss1, dloss2, int_options, float_options, input_grad,
          weight_grad):
        tensors = tensors_of((x, t1, t2, t3, t4, t5, t6))
        wanted = {name: weight_grad and tensors[name] is not None for name in spec.weights}
        wanted["x"] = input_grad
        return tuple(torch.empty_like(tensors[name]) if wanted.get(name) else x.new_empty(0)
                     for name in _padded(spec.inputs, _SLOTS))

    def setup_context(ctx, inputs, output):
        *tensors, int_options, float_options, _ = inputs
        _no_zero_grads(ctx)
        ctx.int_options, ctx.float_options = int_options, float_options
        ctx.present = [t is not None for t in tensors]
        ctx.save_for_backward(output[1], *[t for t in tensors if t is not None])

    def backward(ctx, dout, _dsaved, *dextras):
        # _dsaved and the gradients of the routing outputs are None (no use of them has a gradient); dout is None
        # where only a loss output was used, and stands for zeros of out's shape, which is x's.
        saved, *present = ctx.saved_tensors
        present = iter(present)
        tensors = [next(present) if here else None for here in ctx.present]
        dout = torch.zeros_like(tensors[0]) if dout is None else _dense(dout)
        needs = dict(zip(spec.inputs, ctx.needs_input_grad[:_SLOTS]))
        weight_grad = any(needs[name] for name in spec.weights)
        dlosses = _padded([g for name, g in zip(spec.extras, dextras) if name in spec.losses], 2)
        grads = backward_op(dout, saved, *tensors, *dlosses, ctx.int_options, ctx.float_options, needs["x"],
                            weight_grad)
        differentiable = ("x",) + spec.weights
        return tuple(g if needs.get(name) and name in differentiable else None
                     for g, name in zip(grads, _padded(spec.inputs, _SLOTS))) + (None, None, None)

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op


CUSTOM_OPS = hasattr(torch.library, "custom_op")  # torch 2.4+
_FORWARD_OPS = {spec.name: _register_custom_ops(spec) for spec in SPECS} if CUSTOM_OPS else {}


def _main_grad_dtype(spec, tensors):
    """weight_grad_dtype for fused accumulation: that of every trained weight's main_grad, which must agree."""
    dtypes = {}
    for name in spec.weights:
        weight = tensors[name]
        if weight is None or not weight.requires_grad:
            continue
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is None:
            raise ValueError("%s: fuse_wgrad_accumulation needs a main_grad tensor on every trained weight" % name)
        dtypes[name] = main_grad.dtype
    if len(set(dtypes.values())) > 1:
        raise ValueError("main_grad: one dtype for every weight of a layer, got %s"
                         % ", ".join("%s %s" % item for item in dtypes.items()))
    return _runtime.moekit_dtype(next(iter(dtypes.values()))) if dtypes else 0


def _apply(spec, tensors, options, fused):
    """The layer's (out, *extras) for these inputs; fused: weight gradients go into main_grad."""
    training = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors.values())
    # 0 = MOEKIT_DTYPE_INVALID: the gradients in the layer's dtype.
    options["weight_grad_dtype"] = _main_grad_dtype(spec, tensors) if fused and training else 0
    if "backward_scratch_in_dw1" in spec.int_options:
        # dW1 is then allocated by the backward (beta 0), which may keep its scratch there first: the workspace
        # shrinks by [T * top_k, max(I, H)] elements where dW1 holds them (docs/api.md, "Scratch in dW1").
        options["backward_scratch_in_dw1"] = int(training and not fused and tensors["w1"].requires_grad)
    owners = {name: tensors[name] for name in spec.weights
              if fused and tensors[name] is not None and tensors[name].requires_grad}
    tensors = {name: t.contiguous() if t is not None else None for name, t in tensors.items()}
    inputs = [tensors[name] for name in spec.inputs]
    if CUSTOM_OPS and not fused:
        int_options = [int(options[name]) for name in spec.int_options]
        float_options = [float(options[name]) for name in spec.float_options]
        results = _FORWARD_OPS[spec.name](*_padded(inputs, _SLOTS), int_options, float_options, training)
        # The routing outputs pass no gradient (as LayerFunction marks them): detached, a use of them in a loss
        # cannot reach the forward op's backward. The auxiliary losses keep theirs.
        extras = zip(spec.extras, results[2:2 + len(spec.extras)])
        return (results[0],) + tuple(t if name in spec.losses else t.detach() for name, t in extras)
    if training:
        return LayerFunction.apply(spec, options, owners, *inputs)
    out, _, extras = forward_impl(spec, tensors, options, training=False)
    return (out, *extras)


def moe(x, w_router, w1, w2, top_k, *, b1=None, b2=None, router="softmax_topk", renormalize=False,
        router_scale=1.0, router_bias=None, activation="swiglu", glu_layout="concat", glu_limit=7.0, expert_begin=0,
        fuse_wgrad_accumulation=False, return_routing=False, load_balance_coeff=0.0, z_loss_coeff=0.0,
        return_aux_losses=False, backward_overwrites_saved=True):
    """The MoE layer: x [T, H], w_router [router_experts, H], w1 [E, 2I, H] ([E, I, H] for a non-gated activation),
    w2 [E, H, I], optional biases b1 [E, 2I] and b2 [E, H] -> out [T, H]; with return_routing, (out, Routing); with
    return_aux_losses, AuxLosses comes last ((out, AuxLosses) or (out, Routing, AuxLosses)).

    load_balance_coeff, z_loss_coeff (0 = off): the router's load-balancing loss (softmax router kinds only) and
    z-loss, docs/math.md section 1.1. Add the returned AuxLosses to the training loss: their gradients reach
    w_router and x through moekit's router backward.

    router: "softmax_topk" (softmax over the top-k logits), "topk_softmax" (top-k of the softmax), "topk" (of the
    logits as they are) or "sigmoid" (with an optional fp32 selection bias router_bias [router_experts] and the
    factor router_scale); renormalize: scores divided by their sum (all kinds but softmax_topk). activation: one of
    ACTIVATIONS; glu_layout "concat" (gate rows, then up rows) or "interleaved"; glu_limit: swiglu_oai's clamp.
    W1 and W2 hold the local experts expert_begin .. expert_begin + E - 1 of the router's; pairs routed to other
    experts are dropped. fuse_wgrad_accumulation: the backward adds each weight's gradient into its `main_grad`
    (fp32 or the weight dtype) instead of returning it. backward_overwrites_saved (default on): the backward writes
    dh over the saved h, so it needs [T * top_k, 2I] elements less memory (docs/api.md), and the graph's backward
    may run once only: a second backward over the same forward (retain_graph=True, torch.autograd.gradcheck) raises
    MoekitError naming "saved", on every device; pass False for those."""
    options = dict(top_k=top_k, router=_choice("router", router, ROUTERS), renormalize=int(bool(renormalize)),
                   expert_begin=expert_begin, activation=_choice("activation", activation, ACTIVATIONS),
                   glu_layout=_choice("glu_layout", glu_layout, GLU_LAYOUTS), router_scale=router_scale,
                   glu_limit=glu_limit, load_balance_coeff=float(load_balance_coeff), z_loss_coeff=float(z_loss_coeff),
                   backward_overwrites_saved=int(bool(backward_overwrites_saved)))
    tensors = dict(x=x, w_router=w_router, router_bias=router_bias, w1=w1, b1=b1, w2=w2, b2=b2)
    out, scores, indices, counts, lb_loss, z_loss = _apply(MOE, tensors, options, fuse_wgrad_accumulation)
    result = (out,) + ((Routing(scores, indices, counts),) if return_routing else ())
    result += (AuxLosses(lb_loss, z_loss),) if return_aux_losses else ()
    return result if len(result) > 1 else out


def offsets_from_counts(counts):
    """expert_offsets [E+1] int32 from per-expert row counts [E], on their device (no host synchronisation)."""
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)


def experts(x, expert_offsets, w1, w2, *, b1=None, b2=None, activation="swiglu", glu_layout="concat", glu_limit=7.0,
            fuse_wgrad_accumulation=False, backward_overwrites_saved=True):
    """The experts alone on rows already grouped by expert: y_i = act(x_i W1[e]^T + b1[e]) W2[e]^T + b2[e] for the
    rows expert_offsets[e] .. expert_offsets[e+1] of x [P, H] (expert_offsets [E+1] int32, read on x's device, so
    P bounds the rows and the host never waits for the counts) -> y [P, H], 0 past expert_offsets[E]. The options
    are moe()'s (backward_overwrites_saved on by default: one backward per forward)."""
    options = dict(activation=_choice("activation", activation, ACTIVATIONS),
                   glu_layout=_choice("glu_layout", glu_layout, GLU_LAYOUTS), glu_limit=glu_limit,
                   backward_overwrites_saved=int(bool(backward_overwrites_saved)))
    tensors = dict(x=x, offsets=expert_offsets, w1=w1, b1=b1, w2=w2, b2=b2)
    return _apply(EXPERTS, tensors, options, fuse_wgrad_accumulation)[0]


def sparse_swiglu(x, w_gate, w_up, w_down, group_size, top_groups, *, subsample_rows=None, lb_bias=None,
                  fuse_wgrad_accumulation=False, return_selection=False):
    """The group-sparse SwiGLU FFN: x [T, D], w_gate and w_up [F, D], w_down [D, F]; each token keeps the
    `top_groups` groups of `group_size` neurons of highest energy -> [T, D]; with return_selection,
    (out, Selection). subsample_rows [F/G, spg] int32 (see subsample_rows()): the energy is estimated from those
    rows of each group; lb_bias [F/G] fp32: the load-balance bias (energy *= exp(bias), see load_balance_update)."""
    options = dict(group_size=group_size, top_groups=top_groups)
    tensors = dict(x=x, w_gate=w_gate, w_up=w_up, w_down=w_down, subsample_rows=subsample_rows, lb_bias=lb_bias)
    out, groups, counts = _apply(SPARSE_SWIGLU, tensors, options, fuse_wgrad_accumulation)
    return (out, Selection(groups, counts)) if return_selection else out


def subsample_rows(seed, num_groups, group_size, rows_per_group):
    """[num_groups, rows_per_group] int32 CPU tensor of distinct global neuron ids per group, drawn reproducibly
    from `seed` (moekit_subsample_rows; docs/math.md section 7)."""
    out = torch.empty((num_groups, rows_per_group), dtype=torch.int32)
    pointer = _capi.ctypes.cast(out.data_ptr(), _capi.ctypes.POINTER(_capi.c_int32))
    _capi.check(_capi.load().moekit_subsample_rows(seed, num_groups, group_size, rows_per_group, pointer))
    return out


def load_balance_update(counts, ema, bias, tokens, top_groups, *, momentum=0.99, gamma=1e-3, bias_max=0.5):
    """The aux-loss-free bias update, in place on ema and bias ([NG] fp32): freq = counts / tokens,
    ema = m ema + (1 - m) freq, bias -= gamma sign(ema - target) where ema is off target = top_groups / NG by more
    than a factor 2, then clamped to +-bias_max. counts [NG] (int32, int64 or fp32) may be summed over micro-batches
    and ranks first. Serves the sparse FFN's lb_bias (top_groups = kg) and the sigmoid router's bias (top_k)."""
    args = _capi.initialised(_capi.LoadBalanceArgs, "moekit_load_balance_args_init")
    args.counts, args.ema, args.bias = _runtime.view(counts), _runtime.view(ema), _runtime.view(bias)
    args.tokens, args.top_groups = float(tokens), int(top_groups)
    args.momentum, args.gamma, args.bias_max = momentum, gamma, bias_max
    handle = _runtime.handle_for(ema.device)
    with handle.lock:
        _capi.check(_capi.load().moekit_load_balance_update(handle.raw, _capi.ctypes.byref(args),
                                                            _runtime.stream_for(ema.device)))


def dispatch(indices, experts, *, expert_begin=0, tok_offsets=None):
    """The deterministic grouping of token-expert pairs by local expert (docs/math.md section 2): indices [T, K]
    (int32/int64 global ids; ids outside expert_begin .. expert_begin + experts - 1 drop the pair), or, with
    tok_offsets [T+1] int32 (general routing), indices [P] sorted by token -> Dispatch (not differentiable)."""
    if tok_offsets is None:
        if indices.dim() != 2:
            raise ValueError("indices: expected [T, K], got shape %s" % list(indices.shape))
        tokens, top_k, pairs = indices.shape[0], indices.shape[1], indices.numel()
    else:
        tokens, top_k, pairs = tok_offsets.shape[0] - 1, 0, indices.shape[0]
    fields = dict(max_tokens=_bound(tokens), top_k=top_k, max_pairs=_bound(pairs), experts=experts,
                  expert_begin=expert_begin)
    plan = _runtime.plan_for(indices.device, "moekit_dispatch_plan_create", _capi.DispatchDesc,
                             "moekit_dispatch_desc_init", {name: int(value) for name, value in fields.items()})
    result = Dispatch(indices.new_empty(experts + 1, dtype=torch.int32),
                      indices.new_zeros(pairs, dtype=torch.int32), indices.new_zeros(pairs, dtype=torch.int32),
                      indices.new_empty(pairs, dtype=torch.int32))
    args = _capi.initialised(_capi.DispatchArgs, "moekit_dispatch_args_init")
    indices = indices.contiguous()  # held: the view borrows its memory
    args.indices, args.tok_offsets = _runtime.view(indices), _runtime.view(tok_offsets)
    for name, tensor in result._asdict().items():
        setattr(args, name, _runtime.view(tensor))
    workspace = _runtime.buffer(plan.workspace_bytes, indices.device)
    _runtime.run(plan, "moekit_dispatch", args, _pointer(workspace), workspace.numel(), device=indices.device)
    return result


def _reduce(function, grouped, scores, grouped_pos, tok_offsets, tokens, top_k):
    """moekit_combine (scores given) or moekit_broadcast_backward (scores None) into a new [T, H] tensor."""
    pairs = grouped_pos.shape[0]
    fields = dict(max_tokens=_bound(tokens), top_k=0 if tok_offsets is not None else top_k, max_pairs=_bound(pairs),
                  hidden=grouped.shape[-1], dtype=_runtime.moekit_dtype(grouped.dtype))
    plan = _runtime.plan_for(grouped.device, "moekit_combine_plan_create", _capi.CombineDesc,
                             "moekit_combine_desc_init", {name: int(value) for name, value in fields.items()})
    out = grouped.new_empty((tokens, grouped.shape[-1]))
    args = _capi.initialised(_capi.CombineArgs, "moekit_combine_args_init")
    args.grouped, args.scores, args.grouped_pos = _runtime.view(grouped), _runtime.view(scores), \
        _runtime.view(grouped_pos)
    args.tok_offsets, args.out = _runtime.view(tok_offsets), _runtime.view(out)
    workspace = _runtime.buffer(plan.workspace_bytes, grouped.device)
    _runtime.run(plan, function, args, _pointer(workspace), workspace.numel(), device=grouped.device)
    return out


def _pair_tokens(grouped_pos, tok_offsets, top_k):
    """The token of every pair, on the device."""
    pairs = torch.arange(grouped_pos.shape[0], device=grouped_pos.device)
    if tok_offsets is None:
        return pairs // top_k
    # Slots past tok_offsets[T] hold no pair (grouped_pos -1): any token will do.
    last = max(tok_offsets.shape[0] - 2, 0)
    return torch.bucketize(pairs, tok_offsets[1:].long(), right=True).clamp(max=last)


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, grouped, scores, grouped_pos, tok_offsets):
        tokens = scores.shape[0] if tok_offsets is None else tok_offsets.shape[0] - 1
        top_k = scores.shape[1] if tok_offsets is None else 0
        ctx.top_k = top_k
        ctx.save_for_backward(grouped, scores, grouped_pos, tok_offsets)
        return _reduce("moekit_combine", grouped, scores, grouped_pos, tok_offsets, tokens, top_k)

    @staticmethod
    def backward(ctx, dout):
        # d grouped[pos[p]] = s_p dout_t and ds_p = dout_t . grouped[pos[p]]; a dropped pair (pos -1) gets 0.
        grouped, scores, grouped_pos, tok_offsets = ctx.saved_tensors
        valid = grouped_pos >= 0
        rows = grouped_pos.clamp(min=0).long()
        flat_scores = scores.reshape(-1)
        token_rows = dout[_pair_tokens(grouped_pos, tok_offsets, ctx.top_k)].to(grouped.dtype)
        dgrouped = dscores = None
        if ctx.needs_input_grad[0]:
            weights = torch.where(valid, flat_scores, flat_scores.new_zeros(())).to(grouped.dtype)
            dgrouped = torch.zeros_like(grouped).index_put((rows,), token_rows * weights[:, None], accumulate=True)
        if ctx.needs_input_grad[1]:
            dots = (token_rows.to(scores.dtype) * grouped[rows].to(scores.dtype)).sum(-1)
            dscores = torch.where(valid, dots, dots.new_zeros(())).reshape(scores.shape)
        return dgrouped, dscores, None, None


def combine(grouped, scores, grouped_pos, *, tok_offsets=None):
    """out_t = sum over the pairs p of token t of s_p grouped[grouped_pos[p]] (docs/math.md section 6): grouped
    [P, H] expert outputs, scores [T, K] fp32 (or [P] with tok_offsets [T+1], variable top-k), grouped_pos [P]
    int32 (-1: the pair contributes 0) -> [T, H]. Differentiable in grouped and scores."""
    return _Combine.apply(grouped.contiguous(), scores.contiguous(), grouped_pos.contiguous(), tok_offsets)


class _GatherTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gather_idx, grouped_pos, tok_offsets):
        ctx.save_for_backward(grouped_pos, tok_offsets)
        ctx.tokens = x.shape[0]
        # Rows past the valid pairs are 0, as the backward gives them no gradient (the count stays on the device).
        valid = torch.arange(gather_idx.shape[0], device=x.device) < (grouped_pos >= 0).sum()
        return torch.where(valid[:, None], x[gather_idx.long()], x.new_zeros(()))

    @staticmethod
    def backward(ctx, dgrouped):
        grouped_pos, tok_offsets = ctx.saved_tensors
        top_k = grouped_pos.shape[0] // ctx.tokens if ctx.tokens else 1
        dx = _reduce("moekit_broadcast_backward", _dense(dgrouped), None, grouped_pos, tok_offsets, ctx.tokens,
                     top_k)
        return dx, None, None, None


def gather_tokens(x, gather_idx, grouped_pos, *, tok_offsets=None):
    """x [T, H] -> grouped rows x[gather_idx] [P, H] (0 past the valid pairs), the experts' input in dispatch's
    order; the backward sums each token's rows with moekit_broadcast_backward (in ascending pair order,
    deterministic)."""
    return _GatherTokens.apply(x, gather_idx, grouped_pos.contiguous(), tok_offsets)
