"""moekit's torch.library custom ops (torch 2.4+) for every layer (the MoE layer with and without its optional
inputs, the experts alone, the sparse SwiGLU FFN):

- torch.library.opcheck of each forward op (training and inference plans) and each backward op;
- torch.compile(fullgraph=True) with the default backend (Inductor) gives the eager output and gradients bit for
  bit;
- torch.autograd.gradcheck through the compiled layer in fp64 (central differences against the library's
  backward).

On CPU tensors (moekit's reference backend): opcheck in fp64, torch.compile in fp32. With MOEKIT_TEST_DEVICE=cuda on
CUDA tensors in bf16 (layer_checks.py), gradcheck (fp64) left out. Run as test_moekit.py is (run_test.sh); exits 77
where torch cannot be imported; skipped where torch has no custom ops (a failure off the CPU).
"""
import pathlib
import sys
import unittest

try:
    import torch
except ImportError as error:
    print("test_compile: torch cannot be imported (%s): skipped" % error)
    sys.exit(77)

sys.path.append(str(pathlib.Path(__file__).resolve().parent))
import layer_checks  # noqa: E402
import moekit  # noqa: E402
from moekit import functional  # noqa: E402

# Widths in whole 16-byte vectors and 8 experts: what the CUDA backend's kernels take.
T, H, I, E, K = 6, 8, 8, 8, 2
# Inductor's code around the layer in fp32 where the device's layers take it (the CPU), else in their dtype.
COMPILE_DTYPE = torch.float32 if torch.float32 in layer_checks.DTYPES else layer_checks.DTYPE


def _uniform(generator, dtype, scale, *shape):
    values = (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * scale
    return values.to(layer_checks.DEVICE, dtype)


def _layers(dtype, seed=0, overwrites=True):
    """{name: (function of the differentiable inputs, the inputs)}: each layer with every input it takes.
    overwrites: backward_overwrites_saved of the MoE layer and the experts (on by default, one backward per forward;
    off for the checks that run one forward's backward several times, opcheck and gradcheck)."""
    g = torch.Generator().manual_seed(seed)
    x = _uniform(g, dtype, 1.0, T, H)
    # Logits spread over a few units: a gradcheck step never changes the selection.
    w_router = _uniform(g, dtype, 3.0, E, H)
    w1, b1 = _uniform(g, dtype, 0.5, E, 2 * I, H), _uniform(g, dtype, 0.5, E, 2 * I)
    w2, b2 = _uniform(g, dtype, 0.5, E, H, I), _uniform(g, dtype, 0.5, E, H)
    router_bias, offsets, rows, lb_bias = layer_checks.to_device((
        torch.rand(E, generator=g) * 0.1,
        torch.tensor([0, 3, 3, 5, 7, 7, 8, 9, 10], dtype=torch.int32),  # empty experts, rows past the last one
        functional.subsample_rows(7, 4, 16, 4),
        torch.rand(4, generator=g) * 0.1))
    grouped = _uniform(g, dtype, 1.0, 12, H)
    w_gate, w_up = _uniform(g, dtype, 1.0, 64, H), _uniform(g, dtype, 0.5, 64, H)
    w_down = _uniform(g, dtype, 0.5, H, 64)
    return {
        "moe": (lambda x, w_router, w1, b1, w2, b2: moekit.moe(
            x, w_router, w1, w2, K, b1=b1, b2=b2, router="sigmoid", router_bias=router_bias, renormalize=True,
            router_scale=1.5, activation="geglu", glu_layout="interleaved", backward_overwrites_saved=overwrites),
            (x, w_router, w1, b1, w2, b2)),
        "moe_plain": (lambda x, w_router, w1, w2: moekit.moe(x, w_router, w1, w2, K,
                                                             backward_overwrites_saved=overwrites),
                      (x, w_router, w1, w2)),
        "experts": (lambda x, w1, b1, w2, b2: moekit.experts(x, offsets, w1, w2, b1=b1, b2=b2,
                                                             backward_overwrites_saved=overwrites),
                    (grouped, w1, b1, w2, b2)),
        "sparse_swiglu": (lambda x, w_gate, w_up, w_down: moekit.sparse_swiglu(
            x, w_gate, w_up, w_down, 16, 2, subsample_rows=rows, lb_bias=lb_bias), (x, w_gate, w_up, w_down)),
    }


def _forward_calls(fn, inputs):
    """The (op name, arguments) of every moekit forward op that fn(*inputs) calls."""
    calls, original = [], dict(functional._FORWARD_OPS)

    def recorder(name):
        def call(*args):
            calls.append((name, args))
            return original[name](*args)
        return call

    functional._FORWARD_OPS.update({name: recorder(name) for name in original})
    try:
        fn(*inputs)
    finally:
        functional._FORWARD_OPS.update(original)
    return calls


def _leaves(inputs, requires_grad=True):
    return [t.detach().clone().requires_grad_(requires_grad) for t in inputs]


@layer_checks.skip_unless(moekit.CUSTOM_OPS, "torch %s has no torch.library.custom_op (2.4+)" % torch.__version__)
class CustomOps(unittest.TestCase):
    def test_opcheck_every_forward_and_backward_op(self):
        # A training forward fills the saved-activation buffer, of which the library writes only what its backward
        # reads: the check that compares every output of two runs is made on the inference plan and the backward.
        # opcheck runs a backward op several times on one saved buffer: backward_overwrites_saved off.
        partial = ("test_schema", "test_autograd_registration", "test_faketensor")
        for name, (fn, inputs) in _layers(layer_checks.DTYPE, overwrites=False).items():
            with self.subTest(layer=name):
                calls = _forward_calls(fn, _leaves(inputs))
                self.assertEqual(len(calls), 1)
                op_name, args = calls[0]
                forward = getattr(torch.ops.moekit, op_name + "_forward").default
                backward = getattr(torch.ops.moekit, op_name + "_backward").default
                *tensors, int_options, float_options, training = args
                self.assertTrue(training)
                torch.library.opcheck(forward, args, test_utils=partial)
                plain = [t.detach() if t is not None else None for t in tensors]
                torch.library.opcheck(forward, (*plain, int_options, float_options, False))
                results = forward(*plain, int_options, float_options, True)
                dout = torch.rand_like(results[0])
                for input_grad, weight_grad in ((True, True), (True, False), (False, True)):
                    torch.library.opcheck(backward, (dout, results[1], *plain, None, None, int_options,
                                                     float_options, input_grad, weight_grad))

    def test_compile_fullgraph_equals_eager_bitwise(self):
        torch._dynamo.reset()
        for name, (fn, inputs) in _layers(COMPILE_DTYPE).items():
            with self.subTest(layer=name):
                results = []
                for run in (fn, torch.compile(fn, fullgraph=True)):
                    leaves = _leaves(inputs)
                    out = run(*leaves)
                    # The output's gradient given as it is: a loss op could round differently in Inductor's code.
                    dout = _uniform(torch.Generator().manual_seed(1), out.dtype, 1.0, *out.shape)
                    grads = torch.autograd.grad(out, leaves, dout)
                    results.append((out.detach(), *grads))
                for got, want in zip(*results):
                    self.assertTrue(torch.equal(got, want), name)

    def test_compiled_second_backward_over_a_spent_saved_buffer_is_refused(self):
        # The custom ops' implementations run at runtime under torch.compile: the record of spent saved buffers
        # (moekit._runtime) holds there too, on every device. aot_eager: Inductor's backward (donated buffers)
        # refuses retain_graph=True itself.
        torch._dynamo.reset()
        layers = _layers(COMPILE_DTYPE)
        for name in ("moe_plain", "experts"):
            fn, inputs = layers[name]
            with self.subTest(layer=name):
                compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
                for step in range(2):  # a new forward each time: its buffer is fresh, its backward runs once
                    loss = compiled(*_leaves(inputs)).float().square().sum()
                    loss.backward(retain_graph=True)
                    with self.assertRaises(moekit.MoekitError) as caught:
                        loss.backward()
                    self.assertIn("saved", str(caught.exception))
                    self.assertIn("backward_overwrites_saved=False", str(caught.exception))

    @layer_checks.cpu_only("gradcheck needs fp64, which the CUDA backend does not store")
    def test_gradcheck_through_the_compiled_layer_fp64(self):
        torch._dynamo.reset()
        for name, (fn, inputs) in _layers(torch.float64, overwrites=False).items():
            with self.subTest(layer=name):
                compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
                self.assertTrue(torch.autograd.gradcheck(compiled, _leaves(inputs), eps=1e-6, atol=1e-7,
                                                         rtol=1e-5))


if __name__ == "__main__":
    print("test_compile: torch %s, on %s" % (torch.__version__, layer_checks.DEVICE))
    unittest.main(verbosity=2)
