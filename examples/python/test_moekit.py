"""moekit on CPU tensors (moekit's reference backend), against the plain-PyTorch layers:

    MOEKIT_LIBRARY=build/libmoekit.so python3 examples/python/test_moekit.py   # the package of the source tree
    python3 -P examples/python/test_moekit.py                                   # the installed package (a wheel)

Forward and every gradient (x, router, experts) of the MoE layer and the sparse SwiGLU FFN in fp64, fp32 and bf16
(test_options.py checks every option); the nn.Modules; no_grad inference; errors carrying the library's message; the
ctypes structs' sizes; and, where torch has custom ops (2.4+), torch.library.opcheck and
torch.compile(fullgraph=True). Exits 77 (CTest: skipped) with a message where torch cannot be imported.
"""
import os
import pathlib
import sys
import unittest

try:
    import torch
except ImportError as error:
    print("test_moekit: torch cannot be imported (%s): skipped" % error)
    sys.exit(77)

# Appended for layer_checks: with -P (no script folder first on the path), an installed moekit comes before this one.
sys.path.append(str(pathlib.Path(__file__).resolve().parent))
import layer_checks  # noqa: E402
import moekit  # noqa: E402
from moekit import _capi  # noqa: E402
from moekit.reference import moe_reference, sparse_swiglu_reference  # noqa: E402

LAYOUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "abi" / "layout_lp64.txt"


class Layers(unittest.TestCase):
    def test_moe_fp64(self):
        layer_checks.check_moe("cpu", torch.float64, 1e-10)

    def test_moe_fp32(self):
        layer_checks.check_moe("cpu", torch.float32, 1e-5)

    def test_moe_bf16(self):
        layer_checks.check_moe("cpu", torch.bfloat16, 1e-2)

    def test_sparse_swiglu_fp64(self):
        layer_checks.check_sparse_swiglu("cpu", torch.float64, 1e-10)

    def test_sparse_swiglu_fp32(self):
        layer_checks.check_sparse_swiglu("cpu", torch.float32, 1e-5)

    def test_sparse_swiglu_bf16(self):
        layer_checks.check_sparse_swiglu("cpu", torch.bfloat16, 1e-2)

    def test_modules_flatten_tokens_and_fill_every_gradient(self):
        torch.manual_seed(0)
        moe = moekit.MoELayer(hidden=16, intermediate=8, experts=4, top_k=2, dtype=torch.float64)
        sparse = moekit.SparseSwiGLU(d_model=16, d_ff=64, group_size=16, top_groups=2, dtype=torch.float64)
        x = torch.randn(2, 5, 16, dtype=torch.float64)
        for module, reference in ((moe, moe_reference), (sparse, sparse_swiglu_reference)):
            out = module(x)
            self.assertEqual(out.shape, x.shape)
            extra = (module.top_k,) if module is moe else (module.group_size, module.top_groups)
            want = reference(x.reshape(-1, 16), *module.parameters(), *extra).reshape(x.shape)
            torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
            out.square().sum().backward()
            for name, parameter in module.named_parameters():
                self.assertIsNotNone(parameter.grad, name)
                self.assertTrue(torch.isfinite(parameter.grad).all(), name)

    def test_no_grad_runs_an_inference_plan_with_the_same_output(self):
        moe = moekit.MoELayer(hidden=16, intermediate=8, experts=4, top_k=2, dtype=torch.float32)
        x = torch.randn(8, 16)
        training_out = moe(x)
        with torch.no_grad():
            inference_out = moe(x)
        self.assertTrue(training_out.requires_grad)
        self.assertFalse(inference_out.requires_grad)
        self.assertTrue(torch.equal(training_out.detach(), inference_out))

    def test_a_wrong_shape_raises_the_librarys_message(self):
        x, w_router = torch.randn(8, 16), torch.randn(4, 16)
        w1, w2 = torch.randn(4, 16, 16), torch.randn(4, 16, 4)  # w2 should be [4, 16, 8]
        with self.assertRaises(moekit.MoekitError) as caught:
            moekit.moe(x, w_router, w1, w2, 2)
        self.assertIn("w2", str(caught.exception))
        self.assertEqual(caught.exception.status, 100)  # MOEKIT_STATUS_INVALID_VALUE


class Bindings(unittest.TestCase):
    @unittest.skipUnless(sys.maxsize > 2 ** 32, "layout_lp64.txt holds the LP64 sizes")
    def test_struct_sizes_match_the_header(self):
        sizes = {}
        for line in LAYOUT.read_text().splitlines():
            if line.startswith("sizeof("):
                name, size = line[len("sizeof("):].split(") = ")
                sizes[name] = int(size)
        for name, struct in _capi.STRUCTS.items():
            self.assertEqual(_capi.ctypes.sizeof(struct), sizes[name], name)

    def test_the_loaded_library_is_version_0_1(self):
        self.assertEqual(moekit.load().moekit_get_version() // 100, 1)


@unittest.skipUnless(moekit.CUSTOM_OPS, "torch %s has no torch.library.custom_op (2.4+)" % torch.__version__)
class CustomOps(unittest.TestCase):
    def test_opcheck(self):
        def leaf(*shape):
            return torch.randn(shape, dtype=torch.float64, requires_grad=True)

        x, w_router, w1, b1 = leaf(8, 16), leaf(4, 16), leaf(4, 16, 16), leaf(4, 16)
        w2, b2 = leaf(4, 16, 8), leaf(4, 16)
        # The options in the order of functional.MOE: top_k, router, renormalize, expert_begin, activation,
        # glu_layout, weight_grad_dtype; router_scale, glu_limit.
        router_bias = torch.rand(4)
        torch.library.opcheck(torch.ops.moekit.moe_forward.default,
                              (x, w_router, router_bias, w1, b1, w2, b2, [2, 3, 1, 0, 0, 1, 0], [2.0, 7.0], True))
        torch.library.opcheck(torch.ops.moekit.moe_forward.default,
                              (x, w_router, None, w1, None, w2, None, [2, 0, 0, 0, 0, 0, 0], [1.0, 7.0], True))

    def test_compile_traces_the_layers_without_graph_breaks(self):
        moe = moekit.MoELayer(hidden=16, intermediate=8, experts=4, top_k=2, dtype=torch.float64, router="sigmoid",
                              router_bias=True, renormalize=True, bias=True, activation="geglu",
                              glu_layout="interleaved")
        sparse = moekit.SparseSwiGLU(d_model=16, d_ff=64, group_size=16, top_groups=2, dtype=torch.float64,
                                     subsample=8, load_balance=True)
        model = torch.nn.Sequential(moe, sparse)
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        x = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
        eager_out = model(x)
        eager_grads = torch.autograd.grad(eager_out.sum(), [x, *model.parameters()])
        compiled_out = compiled(x)
        compiled_grads = torch.autograd.grad(compiled_out.sum(), [x, *model.parameters()])
        torch.testing.assert_close(compiled_out, eager_out)
        for got, want in zip(compiled_grads, eager_grads):
            torch.testing.assert_close(got, want)


if __name__ == "__main__":
    print("test_moekit: torch %s, moekit %s, library %s"
          % (torch.__version__, os.path.dirname(moekit.__file__), moekit.library_path()))
    unittest.main(verbosity=2)
