"""moekit on CPU tensors (moekit's reference backend), against the plain-PyTorch layers:

    MOEKIT_LIBRARY=build/libmoekit.so python3 examples/python/test_moekit.py   # the package of the source tree
    python3 -P examples/python/test_moekit.py                                   # the installed package (a wheel)

Forward and every gradient (x, router, experts) of the MoE layer and the sparse SwiGLU FFN in fp64, fp32 and bf16
(test_options.py checks every option); the nn.Modules; no_grad inference; errors carrying the library's message; the
ctypes structs' sizes; the experts on token-major rows called through the ctypes bindings against plain PyTorch
(fp64); and, where torch has custom ops (2.4+), torch.library.opcheck and torch.compile(fullgraph=True). Exits 77
(CTest: skipped) with a message where torch cannot be imported.
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
from moekit import _runtime  # noqa: E402
from moekit.reference import moe_reference, sparse_swiglu_reference, token_experts_reference  # noqa: E402

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

    def test_the_loaded_library_is_version_0_2(self):
        self.assertEqual(moekit.load().moekit_get_version() // 100, 2)


def run_token_experts(x, topk_idx, topk_weights, w1, w2, dout):
    """moekit_token_experts_forward, then _backward, through the ctypes bindings: out and the gradients by name."""
    fields = dict(max_tokens=x.shape[0], hidden=x.shape[1], intermediate=w1.shape[1] // 2,
                  router_experts=w1.shape[0], experts=w1.shape[0], top_k=topk_idx.shape[1],
                  dtype=_runtime.moekit_dtype(x.dtype))
    plan = _runtime.plan_for(x.device, "moekit_token_experts_plan_create", _capi.MoeDesc, "moekit_moe_desc_init",
                             fields)
    saved = _runtime.buffer(plan.saved_bytes, x.device)
    workspace = _runtime.buffer(plan.workspace_bytes, x.device)
    buffers = (saved.data_ptr() or None, saved.numel(), workspace.data_ptr() or None, workspace.numel())
    inputs = dict(x=x, topk_idx=topk_idx, topk_weights=topk_weights, w1=w1, w2=w2)
    out = torch.empty_like(x)
    grads = dict(dx=torch.empty_like(x), dtopk_weights=torch.empty_like(topk_weights), dw1=torch.empty_like(w1),
                 dw2=torch.empty_like(w2))
    for function, struct, init, tensors in (
            ("moekit_token_experts_forward", _capi.TokenExpertsFwdArgs, "moekit_token_experts_fwd_args_init",
             dict(inputs, out=out)),
            ("moekit_token_experts_backward", _capi.TokenExpertsBwdArgs, "moekit_token_experts_bwd_args_init",
             dict(inputs, dout=dout, **grads))):
        args = _capi.initialised(struct, init)
        for name, tensor in tensors.items():
            setattr(args, name, _runtime.view(tensor))
        _runtime.run(plan, function, args, *buffers, device=x.device)
    return out, grads


class TokenExperts(unittest.TestCase):
    def test_forward_and_gradients_match_plain_pytorch_fp64(self):
        torch.manual_seed(0)
        n, h, i, e, k = 9, 16, 8, 3, 2
        x = torch.randn(n, h, dtype=torch.float64)
        w1 = torch.randn(e, 2 * i, h, dtype=torch.float64) / h ** 0.5
        w2 = torch.randn(e, h, i, dtype=torch.float64) / i ** 0.5
        topk_idx = torch.randint(-1, e + 2, (n, k))  # -1 and ids >= E are not on this rank
        topk_idx[3] = -1  # a token with no local pair
        topk_weights = torch.rand(n, k, dtype=torch.float64)
        dout = torch.randn(n, h, dtype=torch.float64)
        out, grads = run_token_experts(x, topk_idx, topk_weights, w1, w2, dout)

        leaves = [t.clone().requires_grad_() for t in (x, topk_weights, w1, w2)]
        want = token_experts_reference(leaves[0], topk_idx, leaves[1], leaves[2], leaves[3])
        want.backward(dout)
        torch.testing.assert_close(out, want.detach(), rtol=1e-10, atol=1e-12)
        self.assertTrue(torch.equal(out[3], torch.zeros(h, dtype=torch.float64)))
        for name, leaf in zip(("dx", "dtopk_weights", "dw1", "dw2"), leaves):
            torch.testing.assert_close(grads[name], leaf.grad, rtol=1e-10, atol=1e-12, msg=name)
        dropped = (topk_idx < 0) | (topk_idx >= e)
        self.assertTrue(bool((grads["dtopk_weights"][dropped] == 0).all()))


@unittest.skipUnless(moekit.CUSTOM_OPS, "torch %s has no torch.library.custom_op (2.4+)" % torch.__version__)
class CustomOps(unittest.TestCase):
    def test_opcheck(self):
        def leaf(*shape):
            return torch.randn(shape, dtype=torch.float64, requires_grad=True)

        x, w_router, w1, b1 = leaf(8, 16), leaf(4, 16), leaf(4, 16, 16), leaf(4, 16)
        w2, b2 = leaf(4, 16, 8), leaf(4, 16)
        # The options in the order of functional.MOE: top_k, router, renormalize, expert_begin, activation,
        # glu_layout, weight_grad_dtype, backward_overwrites_saved, backward_scratch_in_dw1; router_scale, glu_limit,
        # load_balance_coeff, z_loss_coeff.
        router_bias = torch.rand(4)
        # Training fills the saved-activation buffer, whose bytes the library does not all write (only what the
        # backward reads), so the check that compares every output of two runs is left to the inference plan
        # (inputs that need no gradient: an inference plan has no backward).
        training_checks = ("test_schema", "test_autograd_registration", "test_faketensor")
        for training in (True, False):
            checks = training_checks if training else training_checks + ("test_aot_dispatch_dynamic",)
            x, w_router, w1, b1, w2, b2 = (t.detach().requires_grad_(training) for t in (x, w_router, w1, b1, w2, b2))
            options = ([2, 3, 1, 0, 0, 1, 0, 0, 0], [2.0, 7.0, 0.0, 0.0])
            torch.library.opcheck(torch.ops.moekit.moe_forward.default,
                                  (x, w_router, router_bias, w1, b1, w2, b2, *options, training), test_utils=checks)
            options = ([2, 0, 0, 0, 0, 0, 0, 0, 0], [1.0, 7.0, 0.0, 0.0])
            torch.library.opcheck(torch.ops.moekit.moe_forward.default,
                                  (x, w_router, None, w1, None, w2, None, *options, training), test_utils=checks)

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
