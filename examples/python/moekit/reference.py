"""The two layers in plain PyTorch, as docs/math.md sections 1, 3 and 7 define them, and the experts on token-major
rows (section 3.1): what the tests compare moekit with, and the baseline of the GPU training comparison. Gradients come from autograd. They compute in the input
dtype; call them on fp64 (or fp32) tensors for a reference."""
import torch
import torch.nn.functional as F


def _rounded(values, storage_dtype):
    """values rounded to the storage dtype and back, as moekit stores them (or untouched for None)."""
    return values if storage_dtype is None else values.to(storage_dtype).to(values.dtype)


def _top(values, k):
    """The k largest of each row, value-descending, ties to the lower index (docs/math.md section 1's order)."""
    values, indices = torch.sort(values, dim=-1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


def moe_reference(x, w_router, w1, w2, top_k, storage_dtype=None):
    """x [T, H] -> [T, H]: logits = x Wr^T; the top-k logits, softmax over them; sum over the selected experts of
    score * W2[e] (silu(gate) * up), [gate; up] = W1[e] x. With `storage_dtype`, the logits are rounded to it
    before the selection and the softmax, as moekit's layer rounds them (compare a bf16 layer with the reference of
    its inputs in fp64, storage_dtype=torch.bfloat16)."""
    logits = _rounded(x @ w_router.t(), storage_dtype)
    values, experts = _top(logits, top_k)
    return token_experts_reference(x, experts, torch.softmax(values, dim=-1), w1, w2)


def token_experts_reference(x, topk_idx, topk_weights, w1, w2):
    """x [N, H] -> [N, H]: for each token, the sum over its pairs (topk_idx [N, K] local expert ids, topk_weights
    [N, K]) of weight * W2[e] (silu(gate) * up), [gate; up] = W1[e] x; an id outside [0, E) (-1: not here) adds
    nothing."""
    out = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        tokens, slots = (topk_idx == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        gate, up = (x[tokens] @ w1[e].t()).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w2[e].t()
        out = out.index_add(0, tokens, y * topk_weights[tokens, slots, None])
    return out


def sparse_swiglu_reference(x, w_gate, w_up, w_down, group_size, top_groups, storage_dtype=None):
    """x [T, D] -> [T, D]: a SwiGLU FFN keeping, per token, the `top_groups` groups of `group_size` neurons with the
    largest energy sum |silu(gate)| (the selection is not differentiated; with `storage_dtype`, it is made from the
    gate pre-activation rounded to it, as moekit does)."""
    gate = x @ w_gate.t()
    energy = F.silu(_rounded(gate.detach(), storage_dtype)).abs().reshape(x.shape[0], -1, group_size).sum(dim=-1)
    groups = _top(energy, top_groups)[1]
    keep = torch.zeros_like(energy).scatter(1, groups, 1.0).repeat_interleave(group_size, dim=1)
    return (F.silu(gate) * (x @ w_up.t()) * keep) @ w_down.t()
