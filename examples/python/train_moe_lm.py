"""A small MoE language model trained twice from the same initialisation on the same synthetic data: its MoE layers
once from moekit (moekit.moe), once in plain PyTorch (moekit.reference.moe_reference, a loop over the experts).
Prints a progress bar, the loss curves, the tokens/s of each run and a summary line; writes the loss curves as a PNG
(with matplotlib; without it the plot is skipped with a message); fails (exit 1) when the two loss curves, each
averaged over the last --window (10) steps, differ by more than --tolerance (1%) at any step. Single steps differ
more where the loss falls steeply: both runs round in bf16, and the optimiser amplifies a rounding difference into a
shift of the fall by a fraction of a step, so the largest single-step gap is printed beside the criterion.

    python3 examples/python/train_moe_lm.py --device cpu --steps 12          # the reference backend, tiny model
    MOEKIT_LIBRARY=<libmoekit.so of a CUDA build> python3 examples/python/train_moe_lm.py --device cuda
                                                                              # the H200 run: 200 steps, bf16

The model: token embedding, --layers blocks of (RMSNorm, causal attention, RMSNorm, MoE layer of --experts SwiGLU
experts, top --top-k), RMSNorm, tied output head. Parameters are fp32 (AdamW, lr 1e-3, cosine decay after a linear
warm-up); the MoE layers compute in --dtype (inputs and weights cast on the way in; bf16 on a GPU, fp32 on the CPU
by default), attention in bf16 under autocast on a GPU. The sizes default per device (SIZES). The data: token
sequences of a fixed random "language" whose next token depends on the previous one (one of 4 successors, with
probabilities 0.55 / 0.25 / 0.15 / 0.05), generated from a seed, so the loss can fall from ln(vocab) towards the
choices' entropy (1.1 nats) and both runs see the same batches. Exits 2 when the CUDA backend answers MOEKIT_STATUS_NOT_SUPPORTED for the layer (a GPU it does
not serve), 77 where torch cannot be imported.
"""
import argparse
import math
import pathlib
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as error:
    print("train_moe_lm: torch cannot be imported (%s): skipped" % error)
    sys.exit(77)

sys.path.append(str(pathlib.Path(__file__).resolve().parent))
import moekit  # noqa: E402
from moekit.reference import moe_reference  # noqa: E402

# Default sizes by device: the GPU's make 8192 tokens a step; the CPU's run a step in well under a second.
SIZES = {
    "cuda": dict(vocab=4096, d_model=512, layers=4, heads=8, experts=8, top_k=2, intermediate=1024, sequence=512,
                 batch=16, steps=200, dtype="bfloat16"),
    "cpu": dict(vocab=256, d_model=64, layers=2, heads=4, experts=8, top_k=2, intermediate=64, sequence=64,
                batch=8, steps=40, dtype="float32"),
}


class MoE(moekit.MoELayer):
    """The MoE feed-forward: fp32 parameters, computed in `dtype` through moekit or the plain-PyTorch layer."""

    def __init__(self, config, use_moekit):
        super().__init__(config.d_model, config.intermediate, config.experts, config.top_k, device=config.device,
                         dtype=torch.float32)
        self.use_moekit, self.compute_dtype = use_moekit, getattr(torch, config.dtype)

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1]).to(self.compute_dtype)
        weights = [w.to(self.compute_dtype) for w in (self.w_router, self.w1, self.w2)]
        layer = moekit.moe if self.use_moekit else moe_reference
        return layer(tokens, *weights, self.top_k).to(x.dtype).reshape(x.shape)


class Block(torch.nn.Module):
    def __init__(self, config, use_moekit):
        super().__init__()
        self.heads, self.device_type = config.heads, torch.device(config.device).type
        self.attention_norm = torch.nn.RMSNorm(config.d_model)
        self.qkv = torch.nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.projection = torch.nn.Linear(config.d_model, config.d_model, bias=False)
        self.moe_norm = torch.nn.RMSNorm(config.d_model)
        self.moe = MoE(config, use_moekit)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads, -1).unbind(dim=2)
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.device_type == "cuda"):
            attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=True)
        x = x + self.projection(attended.transpose(1, 2).reshape(batch, length, width).float())
        return x + self.moe(self.moe_norm(x))


class MoELanguageModel(torch.nn.Module):
    def __init__(self, config, use_moekit):
        super().__init__()
        self.embedding = torch.nn.Embedding(config.vocab, config.d_model)
        # The head is tied: unit-variance rows would make logits of std sqrt(d_model) at the start.
        torch.nn.init.normal_(self.embedding.weight, std=config.d_model ** -0.5)
        self.blocks = torch.nn.ModuleList(Block(config, use_moekit) for _ in range(config.layers))
        self.norm = torch.nn.RMSNorm(config.d_model)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embedding.weight.t()


def synthetic_batches(config, seed):
    """[steps, batch, sequence + 1] tokens on the device: each next token one of 4 successors of the previous one,
    from a fixed random table. (One token of context, not two: with vocab^2 contexts a 200-step run sees each only a
    few times, and the loss stays at the unigram floor ln(vocab).)"""
    vocab, rows, device = config.vocab, config.steps * config.batch, config.device
    generator = torch.Generator(device=device).manual_seed(seed)
    successors = torch.randint(0, vocab, (vocab, 4), generator=generator, device=device)
    choice_probabilities = torch.tensor([0.55, 0.25, 0.15, 0.05], device=device)
    tokens = torch.empty(rows, config.sequence + 1, dtype=torch.long, device=device)
    tokens[:, 0] = torch.randint(0, vocab, (rows,), generator=generator, device=device)
    choices = torch.multinomial(choice_probabilities, rows * config.sequence, replacement=True,
                                generator=generator).view(rows, config.sequence)
    for position in range(1, config.sequence + 1):
        tokens[:, position] = successors[tokens[:, position - 1], choices[:, position - 1]]
    return tokens.view(config.steps, config.batch, config.sequence + 1)


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def progress_due(step, steps):
    """Whether the progress bar is drawn after this step: every step on a terminal, every tenth of the run
    elsewhere (a drawing reads the loss, which waits for the GPU)."""
    return sys.stdout.isatty() or step == steps or step % max(steps // 10, 1) == 0


def progress(label, step, steps, loss, rate):
    """A plain-text progress bar: redrawn in place on a terminal, a new line elsewhere."""
    interactive = sys.stdout.isatty()
    done = 30 * step // steps
    line = "%-13s [%s%s] %4d/%d  loss %.4f  %s tokens/s" % (label, "#" * done, "." * (30 - done), step, steps,
                                                           loss, "%.0f" % rate if rate else "-")
    print("\r" + line if interactive else line, end="" if interactive and step < steps else "\n", flush=True)


def train(model, batches, config, label):
    """(losses, tokens/s) over the run; tokens/s leaves out the first steps (allocator, plans, autotuning)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warm_up_steps = max(min(20, config.steps // 10), 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warm_up_steps) * 0.5 * (1 + math.cos(math.pi * step /
                                                                                           config.steps)))
    losses, start, rate = [], None, None
    untimed = min(max(config.steps // 10, 1), config.steps - 1)
    tokens_per_step = config.batch * config.sequence
    for step in range(config.steps):
        if step == untimed:
            synchronize(config.device)
            start = time.perf_counter()
        batch = batches[step]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, config.vocab), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.detach())
        if progress_due(step + 1, config.steps):
            if start is not None:
                synchronize(config.device)
                rate = (step + 1 - untimed) * tokens_per_step / (time.perf_counter() - start)
            progress(label, step + 1, config.steps, losses[-1].item(), rate)
    synchronize(config.device)
    rate = (config.steps - untimed) * tokens_per_step / (time.perf_counter() - start)
    return [loss.item() for loss in losses], rate


def plot(path, moekit_losses, reference_losses, config):
    try:
        import matplotlib
    except ImportError:
        print("matplotlib cannot be imported: no plot (pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    steps = range(1, len(moekit_losses) + 1)
    axes.plot(steps, reference_losses, label="plain PyTorch", linewidth=2.5, alpha=0.6)
    axes.plot(steps, moekit_losses, label="moekit", linewidth=1.0)
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy loss")
    axes.set_title("MoE LM, %s, %s: %d layers, %d experts, top-%d" % (config.device, config.dtype, config.layers,
                                                                      config.experts, config.top_k))
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print("loss curves: %s" % path)


def trailing_means(values, window):
    """Each value averaged with the window - 1 before it (fewer at the start)."""
    return [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def parse_args():
    parser = argparse.ArgumentParser(description="Trains a small MoE language model with moekit and with plain "
                                     "PyTorch and compares the losses.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu (moekit's reference backend) or cuda (its CUDA backend); default cuda if present")
    for name in SIZES["cpu"]:
        kind = str if name == "dtype" else int
        parser.add_argument("--" + name.replace("_", "-"), type=kind, help="default: %s (cpu), %s (cuda)" % (
            SIZES["cpu"][name], SIZES["cuda"][name]))
    parser.add_argument("--tolerance", type=float, default=0.01,
                        help="largest relative gap of the window-averaged losses (default 0.01)")
    parser.add_argument("--window", type=int, default=10, help="steps each loss is averaged over (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="train_moe_lm_loss.png", help="the loss-curve PNG ('' for none)")
    config = parser.parse_args()
    for name, value in SIZES[torch.device(config.device).type].items():
        if getattr(config, name) is None:
            setattr(config, name, value)
    return config


def main():
    config = parse_args()
    device_name = torch.cuda.get_device_name(config.device) if config.device.startswith("cuda") else "CPU"
    print("torch %s, %s; vocab %d, d_model %d, %d layers, %d heads, %d experts, top-%d, intermediate %d, "
          "%d x %d tokens a step, %d steps, MoE in %s" % (
              torch.__version__, device_name, config.vocab, config.d_model, config.layers, config.heads,
              config.experts, config.top_k, config.intermediate, config.batch, config.sequence, config.steps,
              config.dtype))
    batches = synthetic_batches(config, seed=1234 + config.seed)
    torch.manual_seed(config.seed)
    reference_model = MoELanguageModel(config, use_moekit=False).to(config.device)
    moekit_model = MoELanguageModel(config, use_moekit=True).to(config.device)
    moekit_model.load_state_dict(reference_model.state_dict())  # the same initialisation

    try:
        moekit_losses, moekit_rate = train(moekit_model, batches, config, "moekit")
    except moekit.NotSupportedError as error:
        print("the CUDA backend does not serve this MoE layer: %s" % error)
        return 2
    reference_losses, reference_rate = train(reference_model, batches, config, "plain PyTorch")

    print("step  moekit    plain PyTorch  relative gap")
    gaps = [abs(m - r) / r for m, r in zip(moekit_losses, reference_losses)]
    shown = sorted(set(range(0, config.steps, max(config.steps // 10, 1))) | {config.steps - 1})
    for step in shown:
        print("%4d  %.5f   %.5f        %.2e" % (step + 1, moekit_losses[step], reference_losses[step], gaps[step]))
    worst = max(range(config.steps), key=gaps.__getitem__)
    smoothed = [abs(m - r) / r for m, r in zip(trailing_means(moekit_losses, config.window),
                                               trailing_means(reference_losses, config.window))]
    worst_smoothed = max(range(config.steps), key=smoothed.__getitem__)
    if config.plot:
        plot(config.plot, moekit_losses, reference_losses, config)
    agree = smoothed[worst_smoothed] <= config.tolerance
    print("summary: %s %s, %d steps of %d tokens, MoE in %s: moekit %.0f tokens/s, plain PyTorch %.0f tokens/s "
          "(%.2fx); final loss %.4f vs %.4f; largest gap of %d-step means %.2e at step %d (limit %g): %s; largest "
          "single-step gap %.2e at step %d" % (
              config.device, device_name, config.steps, config.batch * config.sequence, config.dtype, moekit_rate,
              reference_rate, moekit_rate / reference_rate, moekit_losses[-1], reference_losses[-1], config.window,
              smoothed[worst_smoothed], worst_smoothed + 1, config.tolerance, "agree" if agree else "FAILED",
              gaps[worst], worst + 1))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
