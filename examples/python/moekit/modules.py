"""torch.nn.Modules over the moekit layers. Leading dimensions of the input are flattened into tokens."""
import math

import torch

from . import functional


def _uniform(shape, fan_in, factory):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as nn.Linear initialises its weight (and its bias)."""
    bound = 1.0 / math.sqrt(fan_in)
    return torch.nn.Parameter(torch.empty(shape, **factory).uniform_(-bound, bound))


def _h_width(intermediate, activation):
    functional._choice("activation", activation, functional.ACTIVATIONS)
    return 2 * intermediate if activation in functional.GATED_ACTIVATIONS else intermediate


class _Fp32Buffers(torch.nn.Module):
    """Keeps the buffers named in FP32_BUFFERS in fp32 through Module.to(dtype), half() and the like, which cast
    floating buffers: the library takes the selection biases and their EMA in fp32 only."""

    FP32_BUFFERS = ()

    def _apply(self, fn, *args, **kwargs):
        before = {name: getattr(self, name) for name in self.FP32_BUFFERS if getattr(self, name, None) is not None}
        result = super()._apply(fn, *args, **kwargs)
        for name, old in before.items():
            new = getattr(self, name)
            if new.dtype != torch.float32:
                setattr(self, name, old.to(new.device))
        return result


class _ExpertWeights(_Fp32Buffers):
    """w1 [E, 2I, H] (or [E, I, H]), w2 [E, H, I] and, with bias, b1 and b2; the expert options."""

    def _init_experts(self, hidden, intermediate, experts, activation, glu_layout, glu_limit, bias, factory):
        width = _h_width(intermediate, activation)
        functional._choice("glu_layout", glu_layout, functional.GLU_LAYOUTS)
        self.activation, self.glu_layout, self.glu_limit = activation, glu_layout, glu_limit
        self.w1 = _uniform((experts, width, hidden), hidden, factory)
        self.b1 = _uniform((experts, width), hidden, factory) if bias else None
        self.w2 = _uniform((experts, hidden, intermediate), intermediate, factory)
        self.b2 = _uniform((experts, hidden), intermediate, factory) if bias else None

    def _expert_options(self):
        return dict(b1=self.b1, b2=self.b2, activation=self.activation, glu_layout=self.glu_layout,
                    glu_limit=self.glu_limit, fuse_wgrad_accumulation=self.fuse_wgrad_accumulation,
                    backward_overwrites_saved=self.backward_overwrites_saved)

    def _expert_repr(self):
        experts, hidden, intermediate = self.w2.shape
        return "hidden=%d, intermediate=%d, experts=%d, activation=%s, glu_layout=%s, bias=%s" % (
            hidden, intermediate, experts, self.activation, self.glu_layout, self.b1 is not None)


class MoELayer(_ExpertWeights):
    """Mixture of experts (hidden -> 2 x intermediate -> hidden for a gated activation), each token routed to
    `top_k` of `router_experts` (default `experts`) by a linear router of kind `router`; this layer holds the local
    experts expert_begin .. expert_begin + experts - 1 (expert parallelism: pairs routed to other experts are
    dropped). router_bias=True (sigmoid router) keeps an fp32 selection bias `router_bias` and its `router_bias_ema`
    as buffers, moved by update_router_bias. Runs on CPU tensors (moekit's reference backend) and CUDA tensors (the
    CUDA backend). The options are those of moekit.functional.moe; with load_balance_coeff or z_loss_coeff set,
    forward(x, return_aux_losses=True) also returns the router's AuxLosses for the training loss.
    backward_overwrites_saved (default on) allows one backward per forward: pass False to run a graph's backward
    more than once (retain_graph=True, torch.autograd.gradcheck)."""

    FP32_BUFFERS = ("router_bias", "router_bias_ema")

    def __init__(self, hidden, intermediate, experts, top_k, device=None, dtype=None, *, router="softmax_topk",
                 renormalize=False, router_scale=1.0, router_bias=False, activation="swiglu", glu_layout="concat",
                 glu_limit=7.0, bias=False, router_experts=None, expert_begin=0, fuse_wgrad_accumulation=False,
                 load_balance_coeff=0.0, z_loss_coeff=0.0, backward_overwrites_saved=True):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        functional._choice("router", router, functional.ROUTERS)
        if router_bias and router != "sigmoid":
            raise ValueError("router_bias: only the sigmoid router takes a selection bias, not %r" % router)
        router_experts = experts if router_experts is None else router_experts
        self.top_k, self.router, self.renormalize, self.router_scale = top_k, router, renormalize, router_scale
        self.expert_begin, self.fuse_wgrad_accumulation = expert_begin, fuse_wgrad_accumulation
        self.backward_overwrites_saved = backward_overwrites_saved
        self.load_balance_coeff, self.z_loss_coeff = load_balance_coeff, z_loss_coeff
        self.w_router = _uniform((router_experts, hidden), hidden, factory)
        self._init_experts(hidden, intermediate, experts, activation, glu_layout, glu_limit, bias, factory)
        if router_bias:
            self.register_buffer("router_bias", torch.zeros(router_experts, device=device, dtype=torch.float32))
            self.register_buffer("router_bias_ema", torch.zeros(router_experts, device=device, dtype=torch.float32))
        else:
            self.router_bias = None

    def forward(self, x, return_routing=False, return_aux_losses=False):
        """out with x's shape; with return_routing, (out, Routing) over the flattened tokens; with
        return_aux_losses, AuxLosses comes last."""
        tokens = x.reshape(-1, x.shape[-1])
        result = functional.moe(tokens, self.w_router, self.w1, self.w2, self.top_k, router=self.router,
                                renormalize=self.renormalize, router_scale=self.router_scale,
                                router_bias=self.router_bias, expert_begin=self.expert_begin,
                                return_routing=return_routing, load_balance_coeff=self.load_balance_coeff,
                                z_loss_coeff=self.z_loss_coeff, return_aux_losses=return_aux_losses,
                                **self._expert_options())
        if return_routing or return_aux_losses:
            return (result[0].reshape(x.shape),) + tuple(result[1:])
        return result.reshape(x.shape)

    def update_router_bias(self, counts, tokens, *, momentum=0.99, gamma=1e-3, bias_max=0.5):
        """The aux-loss-free update of router_bias (target top_k / router_experts) from Routing.counts summed over
        `tokens` tokens (micro-batches and data-parallel ranks summed first keep every replica's bias equal)."""
        if self.router_bias is None:
            raise ValueError("router_bias: this layer was made without one (router_bias=True, router='sigmoid')")
        functional.load_balance_update(counts, self.router_bias_ema, self.router_bias, tokens, self.top_k,
                                       momentum=momentum, gamma=gamma, bias_max=bias_max)

    def extra_repr(self):
        text = "%s, top_k=%d, router=%s, router_experts=%d, expert_begin=%d" % (
            self._expert_repr(), self.top_k, self.router, self.w_router.shape[0], self.expert_begin)
        if self.load_balance_coeff or self.z_loss_coeff:
            text += ", load_balance_coeff=%g, z_loss_coeff=%g" % (self.load_balance_coeff, self.z_loss_coeff)
        return text


class Experts(_ExpertWeights):
    """The experts of an MoE layer without router or combine, on rows already grouped by expert (what an
    expert-parallel framework runs between its all-to-all dispatch and combine): forward(x [P, hidden],
    expert_offsets [experts + 1] int32) -> [P, hidden]. The options are those of moekit.functional.experts
    (backward_overwrites_saved on by default, as in MoELayer)."""

    def __init__(self, hidden, intermediate, experts, device=None, dtype=None, *, activation="swiglu",
                 glu_layout="concat", glu_limit=7.0, bias=False, fuse_wgrad_accumulation=False,
                 backward_overwrites_saved=True):
        super().__init__()
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.backward_overwrites_saved = backward_overwrites_saved
        self._init_experts(hidden, intermediate, experts, activation, glu_layout, glu_limit, bias,
                           dict(device=device, dtype=dtype))

    def forward(self, x, expert_offsets):
        return functional.experts(x, expert_offsets, self.w1, self.w2, **self._expert_options())

    def extra_repr(self):
        return self._expert_repr()


class SparseSwiGLU(_Fp32Buffers):
    """A SwiGLU FFN (d_model -> d_ff -> d_model) whose d_ff neurons form groups of `group_size`; each token uses
    only its `top_groups` groups of highest gate energy (the selection passes no gradient). subsample > 0: the
    energy is estimated from that many rows per group, drawn once from subsample_seed (buffer `subsample_rows`).
    load_balance: an fp32 bias `lb_bias` (and `lb_ema`) as buffers, moved by update_load_balance."""

    FP32_BUFFERS = ("lb_bias", "lb_ema")

    def __init__(self, d_model, d_ff, group_size, top_groups, device=None, dtype=None, *, subsample=0,
                 subsample_seed=0, load_balance=False, fuse_wgrad_accumulation=False):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        if group_size <= 0 or d_ff % group_size:
            raise ValueError("group_size: expected a positive divisor of d_ff = %d, got %d" % (d_ff, group_size))
        groups = d_ff // group_size
        self.group_size, self.top_groups = group_size, top_groups
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.w_gate = _uniform((d_ff, d_model), d_model, factory)
        self.w_up = _uniform((d_ff, d_model), d_model, factory)
        self.w_down = _uniform((d_model, d_ff), d_ff, factory)
        rows = functional.subsample_rows(subsample_seed, groups, group_size, subsample) if subsample else None
        self.register_buffer("subsample_rows", rows.to(device) if rows is not None else None)
        for name in ("lb_bias", "lb_ema"):
            value = torch.zeros(groups, device=device, dtype=torch.float32) if load_balance else None
            self.register_buffer(name, value)

    def forward(self, x, return_selection=False):
        """out with x's shape; with return_selection, (out, Selection) over the flattened tokens."""
        tokens = x.reshape(-1, x.shape[-1])
        result = functional.sparse_swiglu(tokens, self.w_gate, self.w_up, self.w_down, self.group_size,
                                          self.top_groups, subsample_rows=self.subsample_rows, lb_bias=self.lb_bias,
                                          fuse_wgrad_accumulation=self.fuse_wgrad_accumulation,
                                          return_selection=return_selection)
        if return_selection:
            return result[0].reshape(x.shape), result[1]
        return result.reshape(x.shape)

    def update_load_balance(self, counts, tokens, *, momentum=0.99, gamma=1e-3, bias_max=0.5):
        """The aux-loss-free update of lb_bias (target top_groups / groups) from Selection.counts summed over
        `tokens` tokens."""
        if self.lb_bias is None:
            raise ValueError("lb_bias: this layer was made without load_balance=True")
        functional.load_balance_update(counts, self.lb_ema, self.lb_bias, tokens, self.top_groups,
                                       momentum=momentum, gamma=gamma, bias_max=bias_max)

    def extra_repr(self):
        d_ff, d_model = self.w_gate.shape
        spg = self.subsample_rows.shape[1] if self.subsample_rows is not None else 0
        return "d_model=%d, d_ff=%d, group_size=%d, top_groups=%d, subsample=%d, load_balance=%s" % (
            d_model, d_ff, self.group_size, self.top_groups, spg, self.lb_bias is not None)
