"""The router's auxiliary losses through moekit's Python layers, against a plain-PyTorch oracle in fp64: the
load-balancing loss and the z-loss of functional.moe and MoELayer against the oracle of docs/math.md section 1.1,
their gradients (reaching x and w_router through moekit's router backward, scaled by the losses' upstream gradients;
also alone, without the output's) against torch.autograd on the oracle, and the refusal of a load-balancing loss on
a sigmoid router. On CPU tensors (the reference backend) in fp64, or with MOEKIT_TEST_DEVICE=cuda on CUDA tensors in
bf16 (layer_checks.py). Run as test_moekit.py is (run_test.sh); exits 77 where torch cannot be imported.
"""
import pathlib
import sys
import unittest

try:
    import torch
except ImportError as error:
    print("test_aux_losses: torch cannot be imported (%s): skipped" % error)
    sys.exit(77)

sys.path.append(str(pathlib.Path(__file__).resolve().parent))
import layer_checks  # noqa: E402
import moekit  # noqa: E402
from layer_checks import assert_close, on_device  # noqa: E402
from moekit import reference  # noqa: E402

F64 = torch.float64
# Widths in whole 16-byte vectors and 8 experts: what the CUDA backend's kernels take.
T, H, I, E, K = 10, 8, 8, 8, 2
LB_COEFF, Z_COEFF = 0.3, 0.05
LB_WEIGHT, Z_WEIGHT = 0.7, 1.3
moe = on_device(moekit.moe)


def _inputs():
    inputs = dict(x=torch.randn(T, H, dtype=F64), w_router=torch.randn(E, H, dtype=F64) * 0.7,
                  w1=torch.randn(E, 2 * I, H, dtype=F64) * 0.5, w2=torch.randn(E, H, I, dtype=F64) * 0.5)
    return {name: layer_checks.rounded(t) for name, t in inputs.items()}


def aux_losses_oracle(x, w_router, indices):
    """LB = a E sum_e f_e P_e (f from the indices, no gradient), Z = b mean_t logsumexp(logits_t)^2."""
    logits = x @ w_router.t()
    f = torch.bincount(indices.reshape(-1), minlength=E).to(F64) / indices.numel()
    p = torch.softmax(logits, dim=-1)
    lb = LB_COEFF * E * (f * p.mean(dim=0)).sum()
    z = Z_COEFF * (torch.logsumexp(logits, dim=-1) ** 2).mean()
    return lb, z


class AuxLosses(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(7)

    def _check(self, router, renormalize=False, out_weight=1.0):
        """out_weight: the output's part of the training loss (0: the losses' gradients alone, which are small next
        to the output's)."""
        inputs = _inputs()
        dout = layer_checks.rounded(torch.randn(T, H, dtype=F64)) * out_weight
        leaves = {name: t.clone().requires_grad_() for name, t in inputs.items()}
        out, routing, losses = moe(leaves["x"], leaves["w_router"], leaves["w1"], leaves["w2"], K, router=router,
                                   renormalize=renormalize, load_balance_coeff=LB_COEFF, z_loss_coeff=Z_COEFF,
                                   return_routing=True, return_aux_losses=True)
        ((out * dout).sum() + LB_WEIGHT * losses.load_balance + Z_WEIGHT * losses.z).backward()

        oracle = {name: t.clone().requires_grad_() for name, t in inputs.items()}
        want_out = reference.moe_reference(oracle["x"], oracle["w_router"], oracle["w1"], oracle["w2"], K,
                                           layer_checks.DTYPE, router=router, renormalize=renormalize)
        lb, z = aux_losses_oracle(oracle["x"], oracle["w_router"], routing.indices)
        ((want_out * dout).sum() + LB_WEIGHT * lb + Z_WEIGHT * z).backward()

        self.assertEqual(losses.load_balance.shape, torch.Size([]))
        assert_close(losses.load_balance.detach(), lb.detach(), rtol=1e-12, atol=0)
        assert_close(losses.z.detach(), z.detach(), rtol=1e-12, atol=0)
        for name in inputs:
            assert_close(leaves[name].grad, oracle[name].grad, rtol=1e-9, atol=1e-11, msg=name)

    def test_softmax_topk(self):
        self._check("softmax_topk")

    def test_topk_softmax_renormalised(self):
        self._check("topk_softmax", renormalize=True)

    def test_the_losses_gradients_alone(self):
        for router in ("softmax_topk", "topk_softmax"):
            with self.subTest(router=router):
                self._check(router, out_weight=0.0)

    def test_the_losses_alone_without_the_output(self):
        # Only the losses in the training loss: out has no gradient, which the backward takes as 0 (autograd passes
        # None, not a materialised zero tensor), through the custom ops and the fused main_grad path alike.
        inputs = _inputs()
        for fused in (False, True):
            with self.subTest(fuse_wgrad_accumulation=fused):
                grads = []
                for with_out in (True, False):
                    leaves = {name: layer_checks.to_device(t.clone()).requires_grad_() for name, t in inputs.items()}
                    for name in ("w_router", "w1", "w2") if fused else ():
                        leaves[name].main_grad = torch.zeros_like(leaves[name], dtype=layer_checks.WIDE)
                    out, losses = moekit.moe(*leaves.values(), K, load_balance_coeff=LB_COEFF, z_loss_coeff=Z_COEFF,
                                             return_aux_losses=True, fuse_wgrad_accumulation=fused)
                    loss = LB_WEIGHT * losses.load_balance + Z_WEIGHT * losses.z
                    (loss + (out * 0).sum() if with_out else loss).backward()
                    grads.append({name: t.main_grad if fused and name != "x" else t.grad
                                  for name, t in leaves.items()})
                for name in inputs:
                    self.assertIsNotNone(grads[1][name], name)
                    assert_close(grads[1][name].cpu(), grads[0][name].cpu(), rtol=0, atol=0, msg=name)
                self.assertGreater(grads[1]["w_router"].abs().sum().item(), 0.0)

    def test_unused_losses_pass_no_gradient(self):
        # A loss left out of the training loss has an upstream gradient of 0: the gradients equal those without it.
        inputs = _inputs()
        dout = torch.randn(T, H, dtype=F64)
        grads = []
        for coeffs in ((0.0, 0.0), (LB_COEFF, Z_COEFF)):
            leaves = {name: t.clone().requires_grad_() for name, t in inputs.items()}
            out = moe(leaves["x"], leaves["w_router"], leaves["w1"], leaves["w2"], K, load_balance_coeff=coeffs[0],
                      z_loss_coeff=coeffs[1])
            (out * dout).sum().backward()
            grads.append({name: t.grad for name, t in leaves.items()})
        for name in inputs:
            torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=0, msg=name)

    def test_module_returns_the_losses_last(self):
        layer = moekit.MoELayer(H, I, E, K, layer_checks.DEVICE, layer_checks.DTYPE, load_balance_coeff=LB_COEFF,
                                z_loss_coeff=Z_COEFF)
        x = torch.randn(2, T // 2, H, dtype=F64, requires_grad=True)
        out, losses = on_device(layer)(x, return_aux_losses=True)
        self.assertEqual(out.shape, x.shape)
        self.assertGreater(float(losses.load_balance), 0.0)
        self.assertGreater(float(losses.z), 0.0)
        (out.sum() + losses.load_balance + losses.z).backward()
        self.assertTrue(torch.isfinite(layer.w_router.grad).all())
        self.assertIn("load_balance_coeff=0.3", repr(layer))

    def test_a_loss_that_is_off_is_zero(self):
        inputs = _inputs()
        _, losses = moe(*inputs.values(), K, z_loss_coeff=Z_COEFF, return_aux_losses=True)
        self.assertEqual(float(losses.load_balance), 0.0)
        self.assertGreater(float(losses.z), 0.0)

    def test_a_sigmoid_router_has_no_load_balancing_loss(self):
        inputs = _inputs()
        with self.assertRaises(moekit.NotSupportedError) as caught:
            moe(*inputs.values(), K, router="sigmoid", load_balance_coeff=LB_COEFF)
        self.assertIn("load_balance_coeff", str(caught.exception))
        moe(*inputs.values(), K, router="sigmoid", z_loss_coeff=Z_COEFF)


if __name__ == "__main__":
    print("test_aux_losses: torch %s, library %s, on %s" % (torch.__version__, moekit.library_path(),
                                                            layer_checks.DEVICE))
    unittest.main(verbosity=2)
