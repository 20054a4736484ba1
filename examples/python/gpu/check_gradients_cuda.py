"""moekit on CUDA tensors (the H200): the CPU test's checks on the GPU.

A CUDA handle that answers MOEKIT_STATUS_NOT_SUPPORTED for the MoE or sparse-FFN layer (a GPU the CUDA backend does
not serve) is reported with exit 2.

    MOEKIT_LIBRARY=<libmoekit.so of a CUDA build> python3 examples/python/gpu/check_gradients_cuda.py

1. Forward and every gradient (x, router, experts) of both layers, bf16 CUDA tensors, against the fp64 plain-PyTorch
   layers on the same inputs (logits / gate pre-activations rounded to bf16 for the selection, as moekit does):
   whole-tensor relative error <= 2e-2.
2. The same inputs through moekit's reference backend (CPU tensors): CUDA vs reference within docs/math.md
   section 9's bf16 bound, 1e-2 (whole tensor).
3. Streams: the layer run on a side stream (PyTorch's current stream is what moekit enqueues on) gives the bits of
   the default stream.
4. torch.compile(fullgraph=True) of both layers (custom ops, torch 2.4+): same output and gradients as eager.
5. CUDA graphs: the forward and backward of each layer captured in a torch.cuda.CUDAGraph (after a warm-up on a side
   stream) and replayed on new values copied into its static input and output gradient: output and every gradient
   bitwise equal to eager. The capture fails on any host synchronisation inside the layers.
Prints every error; exit 0 when all hold, 1 when one fails, 2 when the CUDA backend does not serve the layers yet.
"""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import layer_checks  # noqa: E402
import moekit  # noqa: E402


def backend_agreement(tolerance=1e-2):
    """CUDA vs reference backend on the same bf16 inputs, forward and gradients, for both layers."""
    torch.manual_seed(0)
    layers = [
        moekit.MoELayer(hidden=256, intermediate=128, experts=8, top_k=2, dtype=torch.bfloat16),
        moekit.SparseSwiGLU(d_model=256, d_ff=1024, group_size=64, top_groups=4, dtype=torch.bfloat16),
    ]
    for layer in layers:
        x = torch.randn(512, 256, dtype=torch.bfloat16)
        dout = torch.randn(512, 256, dtype=torch.bfloat16)
        results = []
        for device in ("cpu", "cuda"):
            layer.to(device)
            leaf = x.to(device).detach().requires_grad_()
            layer.zero_grad(set_to_none=True)
            out = layer(leaf)
            out.backward(dout.to(device))
            # NOTE: copies: moving the module to the next device swaps its gradients' storage in place.
            results.append([t.detach().to("cpu", copy=True) for t in [out, leaf.grad, *(q.grad for q in layer.parameters())]])
        errors = [layer_checks.relative_error(cuda, ref) for cuda, ref in zip(results[1], results[0])]
        print("  %s: CUDA vs reference backend, out / dx / weight grads: %s" % (
            type(layer).__name__, " ".join("%.2e" % e for e in errors)))
        assert max(errors) <= tolerance, "CUDA and reference backends differ by more than %g" % tolerance


def stream_independence():
    layer = moekit.MoELayer(hidden=256, intermediate=128, experts=8, top_k=2, device="cuda",
                            dtype=torch.bfloat16)
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        default_out = layer(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            side_out = layer(x)
        torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(default_out, side_out), "a side stream gave other bits"
    print("  side stream: bitwise identical to the default stream")


def compiled_matches_eager():
    assert moekit.CUSTOM_OPS, "torch %s has no custom ops: torch.compile cannot be checked" % torch.__version__
    model = torch.nn.Sequential(
        moekit.MoELayer(hidden=256, intermediate=128, experts=8, top_k=2, device="cuda", dtype=torch.bfloat16),
        moekit.SparseSwiGLU(d_model=256, d_ff=1024, group_size=64, top_groups=4, device="cuda",
                            dtype=torch.bfloat16))
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True)
    eager = [model(x)]
    eager += torch.autograd.grad(eager[0].float().square().sum(), [x, *model.parameters()])
    traced = [compiled(x)]
    traced += torch.autograd.grad(traced[0].float().square().sum(), [x, *model.parameters()])
    for got, want in zip(traced, eager):  # bf16: inductor may fuse the loss differently
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    print("  torch.compile(fullgraph=True): output and gradients equal eager")


def graph_replay_matches_eager(tokens=512):
    torch.manual_seed(0)
    layers = [
        moekit.MoELayer(hidden=256, intermediate=128, experts=8, top_k=2, device="cuda", dtype=torch.bfloat16),
        moekit.SparseSwiGLU(d_model=256, d_ff=1024, group_size=64, top_groups=4, device="cuda", dtype=torch.bfloat16,
                            subsample=16, load_balance=True),
    ]
    for layer in layers:
        parameters = list(layer.parameters())
        x = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16)
        # The warm-up makes the plans, cuBLASLt's algorithm choices and the allocator's blocks before the capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                layer(x).backward(dout)
        torch.cuda.current_stream().wait_stream(side)
        # Gradients of None: the captured backward makes them in the graph's memory, written again by every replay.
        x.grad = None
        layer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(x)
            out.backward(dout)
        for seed in (1, 2):
            generator = torch.Generator(device="cuda").manual_seed(seed)
            new_x, new_dout = (torch.randn(tokens, 256, device="cuda", generator=generator).to(torch.bfloat16)
                               for _ in range(2))
            with torch.no_grad():
                x.copy_(new_x)
                dout.copy_(new_dout)
            graph.replay()
            leaf = new_x.clone().requires_grad_()
            eager_out = layer(leaf)
            eager = [eager_out, *torch.autograd.grad(eager_out, [leaf, *parameters], new_dout)]
            replayed = [out, x.grad, *(p.grad for p in parameters)]
            names = ["out", "dx"] + ["d" + name for name, _ in layer.named_parameters()]
            for name, got, want in zip(names, replayed, eager):
                assert torch.equal(got, want), "%s: CUDA graph replay %d differs from eager in %s" % (
                    type(layer).__name__, seed, name)
        print("  %s: forward and backward captured; two replays on new inputs bitwise equal to eager" %
              type(layer).__name__)


def main():
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
    try:
        print("1. moekit (bf16, CUDA) vs plain PyTorch (fp64), relative errors:")
        print("  MoE layer:", layer_checks.check_moe("cuda", torch.bfloat16, layer_checks.TOLERANCE, tokens=1024,
                                                      hidden=256, intermediate=128, experts=8, top_k=2))
        print("  sparse SwiGLU:", layer_checks.check_sparse_swiglu("cuda", torch.bfloat16, layer_checks.TOLERANCE,
                                                                    tokens=1024, d_model=256, d_ff=1024,
                                                                    group_size=64, top_groups=4))
        print("2. backends:")
        backend_agreement()
        print("3. streams:")
        stream_independence()
        print("4. torch.compile:")
        compiled_matches_eager()
        print("5. CUDA graphs:")
        graph_replay_matches_eager()
    except moekit.NotSupportedError as error:
        print("the CUDA backend does not serve the layers yet: %s" % error)
        return 2
    except AssertionError as error:
        print("FAILED: %s" % error)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
