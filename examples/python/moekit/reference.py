"""The moekit operations in plain PyTorch, as docs/math.md sections 1, 2, 3, 6 and 7 define them, and the experts
on token-major rows (section 3.1): what the tests compare moekit with, and the baseline of the GPU training
comparison. Gradients come from autograd. They compute in the input dtype; call them on fp64 (or fp32) tensors for a
reference. Options take the names of moekit.functional."""
import collections

import torch
import torch.nn.functional as F

Routing = collections.namedtuple("Routing", ["scores", "indices", "counts"])
Dispatch = collections.namedtuple("Dispatch", ["expert_offsets", "gather_idx", "pair_idx", "grouped_pos"])


def _rounded(values, storage_dtype):
    """values rounded to the storage dtype and back, as moekit stores them (or untouched for None)."""
    return values if storage_dtype is None else values.to(storage_dtype).to(values.dtype)


def _top(values, k):
    """The k largest of each row, value-descending, ties to the lower index, compared as fp32 keys (docs/math.md
    section 1's order)."""
    values, indices = torch.sort(values.detach().float(), dim=-1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


def route(logits, top_k, router="softmax_topk", renormalize=False, router_scale=1.0, router_bias=None):
    """(scores [T, K], indices [T, K]) of a router kind (docs/math.md section 1); the scores are differentiable."""
    if router == "sigmoid":
        q = torch.sigmoid(logits)
        key = q.detach().double()
        if router_bias is not None:
            key = key + router_bias.double()
        indices = _top(key, top_k)[1]
        values = q.gather(1, indices)
    else:
        indices = _top(logits, top_k)[1]
        values = logits.gather(1, indices)
        if router == "softmax_topk":
            return torch.softmax(values, dim=-1), indices
        if router == "topk_softmax":
            values = torch.softmax(logits, dim=-1).gather(1, indices)
    if renormalize:
        values = values / values.sum(dim=-1, keepdim=True)
    return (values * router_scale if router == "sigmoid" else values), indices


def activate(h, activation="swiglu", glu_layout="concat", glu_limit=7.0):
    """a = act(h) of docs/math.md section 3; a gated activation halves the width (gate and up of glu_layout)."""
    single = {"gelu": lambda z: F.gelu(z, approximate="tanh"), "relu": F.relu, "silu": F.silu,
              "relu2": lambda z: F.relu(z).square()}
    if activation in single:
        return single[activation](h)
    if glu_layout == "interleaved":
        gate, up = h[..., 0::2], h[..., 1::2]
    else:
        gate, up = h.chunk(2, dim=-1)
    if activation == "swiglu_oai":
        gate, up = gate.clamp(max=glu_limit), up.clamp(-glu_limit, glu_limit)
        return gate * torch.sigmoid(1.702 * gate) * (up + 1)
    gates = {"swiglu": F.silu, "geglu": lambda z: F.gelu(z, approximate="tanh"), "reglu": F.relu}
    return gates[activation](gate) * up


def _expert(rows, e, w1, w2, b1, b2, options):
    h = rows @ w1[e].t() + (b1[e] if b1 is not None else 0)
    return activate(h, **options) @ w2[e].t() + (b2[e] if b2 is not None else 0)


def moe_reference(x, w_router, w1, w2, top_k, storage_dtype=None, *, b1=None, b2=None, router="softmax_topk",
                  renormalize=False, router_scale=1.0, router_bias=None, activation="swiglu", glu_layout="concat",
                  glu_limit=7.0, expert_begin=0, return_routing=False):
    """x [T, H] -> [T, H]: logits = x Wr^T; the router's scores and experts; sum over the selected local experts of
    score * (act(W1[e] x + b1[e]) W2[e]^T + b2[e]). With `storage_dtype`, the logits are rounded to it before the
    selection and the scores, as moekit's layer rounds them (compare a bf16 layer with the reference of its inputs
    in fp64, storage_dtype=torch.bfloat16). With return_routing, (out, Routing) as moekit.functional.moe gives."""
    logits = _rounded(x @ w_router.t(), storage_dtype)
    scores, experts = route(logits, top_k, router, renormalize, router_scale, router_bias)
    options = dict(activation=activation, glu_layout=glu_layout, glu_limit=glu_limit)
    out = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        tokens, slots = (experts == expert_begin + e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        y = _expert(x[tokens], e, w1, w2, b1, b2, options)
        out = out.index_add(0, tokens, y * scores[tokens, slots, None])
    if return_routing:
        counts = torch.bincount(experts.reshape(-1), minlength=w_router.shape[0]).to(torch.int32)
        return out, Routing(scores.float(), experts, counts)
    return out


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


def experts_reference(x, expert_offsets, w1, w2, *, b1=None, b2=None, activation="swiglu", glu_layout="concat",
                      glu_limit=7.0):
    """Grouped rows x [P, H] -> y [P, H]: expert e on rows expert_offsets[e] .. expert_offsets[e+1], 0 past the
    last expert's rows (docs/math.md section 3, the experts alone)."""
    options = dict(activation=activation, glu_layout=glu_layout, glu_limit=glu_limit)
    offsets = [int(v) for v in expert_offsets]
    pieces = [_expert(x[offsets[e]:offsets[e + 1]], e, w1, w2, b1, b2, options) for e in range(w1.shape[0])]
    return torch.cat(pieces + [torch.zeros_like(x[offsets[-1]:])])


def dispatch_reference(indices, experts, expert_begin=0, tok_offsets=None):
    """The stable grouping of valid pairs by local expert (docs/math.md section 2), as moekit.functional.dispatch
    gives it (rows of gather_idx and pair_idx past the valid pairs are 0)."""
    flat = indices.reshape(-1).long() - expert_begin
    pairs = torch.arange(flat.numel())
    if tok_offsets is None:
        tokens = pairs // max(indices.shape[-1], 1)
    else:
        tokens = torch.bucketize(pairs, tok_offsets[1:].long(), right=True)
        flat = torch.where(pairs < int(tok_offsets[-1]), flat, torch.full_like(flat, -1))
    order = [pairs[flat == e] for e in range(experts)]
    grouped = torch.cat(order) if order else pairs[:0]
    offsets = torch.tensor([0] + [len(o) for o in order]).cumsum(0)
    gather_idx = torch.zeros(flat.numel(), dtype=torch.int32)
    pair_idx = torch.zeros(flat.numel(), dtype=torch.int32)
    grouped_pos = torch.full((flat.numel(),), -1, dtype=torch.int32)
    pair_idx[:grouped.numel()] = grouped.int()
    gather_idx[:grouped.numel()] = tokens[grouped].int()
    grouped_pos[grouped] = torch.arange(grouped.numel(), dtype=torch.int32)
    return Dispatch(offsets.int(), gather_idx, pair_idx, grouped_pos)


def combine_reference(grouped, scores, grouped_pos, tok_offsets=None):
    """out_t = sum over the pairs p of token t of s_p grouped[grouped_pos[p]] (docs/math.md section 6)."""
    flat = scores.reshape(-1)
    pairs = torch.arange(flat.numel())
    if tok_offsets is None:
        tokens, count = pairs // scores.shape[1], scores.shape[0]
    else:
        tokens, count = torch.bucketize(pairs, tok_offsets[1:].long(), right=True), tok_offsets.numel() - 1
    valid = grouped_pos.long() >= 0
    rows = grouped[grouped_pos.long()[valid]] * flat[valid, None].to(grouped.dtype)
    return grouped.new_zeros((count, grouped.shape[1])).index_add(0, tokens[valid], rows)


def group_energy(x, w_gate, group_size, subsample_rows=None, lb_bias=None, storage_dtype=None):
    """en [T, F/G] of docs/math.md section 7: sum of |silu(gate)| over a group's rows (or its subsample, scaled by
    G / spg), times exp(lb_bias)."""
    silu = F.silu(_rounded((x @ w_gate.t()).detach(), storage_dtype)).abs()
    if subsample_rows is None:
        energy = silu.reshape(x.shape[0], w_gate.shape[0] // group_size, group_size).sum(dim=-1)
    else:
        rows = subsample_rows.long()
        energy = silu[:, rows.reshape(-1)].reshape(x.shape[0], *rows.shape).sum(dim=-1)
        energy = energy * (group_size / rows.shape[1])
    if lb_bias is not None:
        energy = energy * torch.exp(lb_bias.to(energy.dtype))
    return energy


def sparse_swiglu_reference(x, w_gate, w_up, w_down, group_size, top_groups, storage_dtype=None, *,
                            subsample_rows=None, lb_bias=None, return_selection=False):
    """x [T, D] -> [T, D]: a SwiGLU FFN keeping, per token, the `top_groups` groups of `group_size` neurons with the
    largest energy (group_energy; the selection is not differentiated; with `storage_dtype`, it is made from the
    gate pre-activation rounded to it, as moekit does). With return_selection, (out, (groups, counts))."""
    gate = x @ w_gate.t()
    energy = group_energy(x, w_gate, group_size, subsample_rows, lb_bias, storage_dtype)
    groups = _top(energy, top_groups)[1]
    keep = torch.zeros_like(energy).scatter(1, groups, 1.0).repeat_interleave(group_size, dim=1)
    out = (F.silu(gate) * (x @ w_up.t()) * keep) @ w_down.t()
    if return_selection:
        return out, (groups.int(), torch.bincount(groups.reshape(-1), minlength=energy.shape[1]).int())
    return out


def load_balance_reference(counts, ema, bias, tokens, top_groups, momentum=0.99, gamma=1e-3, bias_max=0.5):
    """(ema, bias) after one aux-loss-free update (docs/math.md section 7), each step rounded to fp32."""
    freq = counts.double() / tokens
    ema = (momentum * ema.double() + (1 - momentum) * freq).float()
    target = top_groups / counts.numel()
    off = (ema.double() < target / 2) | (ema.double() > 2 * target)
    step = torch.where(off, gamma * torch.sign(ema.double() - target), torch.zeros_like(freq))
    return ema, (bias.double() - step).clamp(-bias_max, bias_max).float()


def subsample_rows_reference(seed, num_groups, group_size, rows_per_group):
    """moekit_subsample_rows's draw (SplitMix64 and a partial Fisher-Yates), in Python integers."""
    mask = (1 << 64) - 1
    state, out = seed, []
    for g in range(num_groups):
        perm = list(range(group_size))
        for j in range(rows_per_group):
            state = (state + 0x9E3779B97F4A7C15) & mask
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            z ^= z >> 31
            r = j + z % (group_size - j)
            perm[j], perm[r] = perm[r], perm[j]
            out.append(g * group_size + perm[j])
    return torch.tensor(out, dtype=torch.int32).reshape(num_groups, rows_per_group)
