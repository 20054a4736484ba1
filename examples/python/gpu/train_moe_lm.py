"""A small MoE language model trained 200 steps twice on the H200 — its MoE layers once from moekit, once in plain
PyTorch — from the same initialisation on the same data; the two loss curves must agree within 1% at every step.
Prints both curves (every 10 steps), the largest relative gap, and the tokens/s of each run.

A CUDA handle that answers MOEKIT_STATUS_NOT_SUPPORTED for the MoE layer (a GPU the CUDA backend does not serve) is
reported with exit 2.

    MOEKIT_LIBRARY=<libmoekit.so of a CUDA build> python3 examples/python/gpu/train_moe_lm.py [--steps 200]

The model: token embedding, 4 blocks of (RMSNorm, causal attention, RMSNorm, MoE layer of 8 SwiGLU experts, top-2),
RMSNorm, tied output head; d_model 512, experts' intermediate 1024, 8 heads, sequences of 512, batches of 16
(8192 tokens a step). Parameters are fp32 (AdamW, lr 1e-3, cosine decay after 20 warm-up steps); the MoE layers
compute in bf16 (inputs and weights cast on the way in), as does attention (autocast). The data: token sequences
of a fixed random "language" whose next token depends on the previous two (a few likely successors each, entropy
well below log(vocab)), generated on the GPU from a seed, so the loss has somewhere to go and both runs see the
same batches.
"""
import argparse
import math
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import moekit  # noqa: E402
from moekit.reference import moe_reference  # noqa: E402

VOCAB, D_MODEL, LAYERS, HEADS, EXPERTS, TOP_K, INTERMEDIATE = 4096, 512, 4, 8, 8, 2, 1024
SEQUENCE, BATCH = 512, 16


class MoE(moekit.MoELayer):
    """The MoE feed-forward: fp32 parameters, bf16 compute, through moekit or the plain-PyTorch layer."""

    def __init__(self, use_moekit):
        super().__init__(D_MODEL, INTERMEDIATE, EXPERTS, TOP_K, device="cuda", dtype=torch.float32)
        self.use_moekit = use_moekit

    def forward(self, x):
        tokens = x.reshape(-1, D_MODEL).to(torch.bfloat16)
        weights = [w.to(torch.bfloat16) for w in (self.w_router, self.w1, self.w2)]
        layer = moekit.moe if self.use_moekit else moe_reference
        return layer(tokens, *weights, self.top_k).to(x.dtype).reshape(x.shape)


class Block(torch.nn.Module):
    def __init__(self, use_moekit):
        super().__init__()
        self.attention_norm = torch.nn.RMSNorm(D_MODEL)
        self.qkv = torch.nn.Linear(D_MODEL, 3 * D_MODEL, bias=False)
        self.projection = torch.nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.moe_norm = torch.nn.RMSNorm(D_MODEL)
        self.moe = MoE(use_moekit)

    def forward(self, x):
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).view(batch, length, 3, HEADS, -1).unbind(dim=2)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=True)
        x = x + self.projection(attended.transpose(1, 2).reshape(batch, length, D_MODEL).float())
        return x + self.moe(self.moe_norm(x))


class MoELanguageModel(torch.nn.Module):
    def __init__(self, use_moekit):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, D_MODEL)
        self.blocks = torch.nn.ModuleList(Block(use_moekit) for _ in range(LAYERS))
        self.norm = torch.nn.RMSNorm(D_MODEL)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embedding.weight.t()


def synthetic_batches(steps, seed):
    """[steps, BATCH, SEQUENCE + 1] tokens: each next token one of 4 successors of the previous two, drawn with
    probabilities 0.55 / 0.25 / 0.15 / 0.05 from a fixed random table."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    successors = torch.randint(0, VOCAB, (VOCAB, VOCAB // 64, 4), generator=generator, device="cuda")
    choice_probabilities = torch.tensor([0.55, 0.25, 0.15, 0.05], device="cuda")
    tokens = torch.empty(steps * BATCH, SEQUENCE + 1, dtype=torch.long, device="cuda")
    tokens[:, :2] = torch.randint(0, VOCAB, (steps * BATCH, 2), generator=generator, device="cuda")
    choices = torch.multinomial(choice_probabilities, steps * BATCH * (SEQUENCE - 1), replacement=True,
                                generator=generator).view(steps * BATCH, SEQUENCE - 1)
    for position in range(2, SEQUENCE + 1):
        context = (tokens[:, position - 2], tokens[:, position - 1] % (VOCAB // 64))
        tokens[:, position] = successors[context[0], context[1], choices[:, position - 2]]
    return tokens.view(steps, BATCH, SEQUENCE + 1)


def train(model, batches, steps):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / steps)))
    losses = []
    warm_up = min(10, steps - 1)  # tokens/s leaves out the first steps (allocator, plans, autotuning)
    for step in range(steps):
        if step == warm_up:
            torch.cuda.synchronize()
            start = time.perf_counter()
        batch = batches[step]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    tokens_per_second = (steps - warm_up) * BATCH * SEQUENCE / (time.perf_counter() - start)
    return [loss.item() for loss in losses], tokens_per_second


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--tolerance", type=float, default=0.01)
    args = parser.parse_args()
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))

    batches = synthetic_batches(args.steps, seed=1234)
    torch.manual_seed(0)
    reference_model = MoELanguageModel(use_moekit=False).cuda()
    moekit_model = MoELanguageModel(use_moekit=True).cuda()
    moekit_model.load_state_dict(reference_model.state_dict())  # the same initialisation

    try:
        moekit_losses, moekit_rate = train(moekit_model, batches, args.steps)
    except moekit.NotSupportedError as error:
        print("the CUDA backend does not serve the MoE layer yet: %s" % error)
        return 2
    reference_losses, reference_rate = train(reference_model, batches, args.steps)

    print("step  moekit    plain PyTorch  relative gap")
    gaps = [abs(m - r) / r for m, r in zip(moekit_losses, reference_losses)]
    for step in list(range(0, args.steps, 10)) + [args.steps - 1]:
        print("%4d  %.5f   %.5f        %.2e" % (step, moekit_losses[step], reference_losses[step], gaps[step]))
    worst = max(range(args.steps), key=gaps.__getitem__)
    print("largest relative gap: %.3e at step %d (limit %g)" % (gaps[worst], worst, args.tolerance))
    print("tokens/s: moekit %.0f, plain PyTorch %.0f (%.2fx)" % (moekit_rate, reference_rate,
                                                                moekit_rate / reference_rate))
    if gaps[worst] > args.tolerance:
        print("FAILED: the loss curves differ by more than %g" % args.tolerance)
        return 1
    print("the loss curves agree within %g" % args.tolerance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
