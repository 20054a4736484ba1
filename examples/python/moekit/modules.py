"""torch.nn.Modules over the moekit layers. Leading dimensions of the input are flattened into tokens."""
import math

import torch

from . import functional


def _uniform(shape, fan_in, factory):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as nn.Linear initialises its weight."""
    bound = 1.0 / math.sqrt(fan_in)
    return torch.nn.Parameter(torch.empty(shape, **factory).uniform_(-bound, bound))


class MoELayer(torch.nn.Module):
    """Mixture of `experts` SwiGLU experts (hidden -> 2 x intermediate -> hidden), each token routed to `top_k`
    of them by a linear router with the softmax over its top-k logits. Runs on CPU tensors (moekit's reference
    backend) and CUDA tensors (the CUDA backend)."""

    def __init__(self, hidden, intermediate, experts, top_k, device=None, dtype=None):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        self.top_k = top_k
        self.w_router = _uniform((experts, hidden), hidden, factory)
        self.w1 = _uniform((experts, 2 * intermediate, hidden), hidden, factory)
        self.w2 = _uniform((experts, hidden, intermediate), intermediate, factory)

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        return functional.moe(tokens, self.w_router, self.w1, self.w2, self.top_k).reshape(x.shape)

    def extra_repr(self):
        experts, hidden = self.w_router.shape
        return "hidden=%d, intermediate=%d, experts=%d, top_k=%d" % (hidden, self.w2.shape[2], experts, self.top_k)


class SparseSwiGLU(torch.nn.Module):
    """A SwiGLU FFN (d_model -> d_ff -> d_model) whose d_ff neurons form groups of `group_size`; each token uses
    only its `top_groups` groups of highest gate energy (the selection passes no gradient)."""

    def __init__(self, d_model, d_ff, group_size, top_groups, device=None, dtype=None):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        self.group_size, self.top_groups = group_size, top_groups
        self.w_gate = _uniform((d_ff, d_model), d_model, factory)
        self.w_up = _uniform((d_ff, d_model), d_model, factory)
        self.w_down = _uniform((d_model, d_ff), d_ff, factory)

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        out = functional.sparse_swiglu(tokens, self.w_gate, self.w_up, self.w_down, self.group_size, self.top_groups)
        return out.reshape(x.shape)

    def extra_repr(self):
        d_ff, d_model = self.w_gate.shape
        return "d_model=%d, d_ff=%d, group_size=%d, top_groups=%d" % (d_model, d_ff, self.group_size, self.top_groups)
