"""moekit.ep, the expert-parallel layer, over R = 2 and 4 in-process ranks (moekit.ep.LocalGroup, the reference
backend), each rank in a Python thread of its own, against the single-process layer moekit.moe on the same global
batch: the ranks' tokens are consecutive blocks of it and rank r holds experts [r*E, (r+1)*E). As docs/ep.md says,
out, dx, dw1 and dw2 of an fp32 layer without biases are bitwise the single-process layer's; dw_router, which the
test sums over the ranks, and everything of an fp64 layer with biases and the sigmoid router, are held to
docs/math.md section 9's whole-tensor bound (1e-5 relative in fp32, 1e-12 in fp64). The capacity mode: with room
for every pair, bitwise the exact mode; with a tight capacity, the dropped pairs counted by the rule of
moekit_ep.h and out and the expert weight gradients against the plain-PyTorch experts on the kept pairs. Also the
nn.Module, main_grad accumulation, the ctypes structs' sizes, bad arguments raising errors that name them, and
`import moekit.ep` without the library.

Run as test_moekit.py is (run_test.sh): MOEKIT_LIBRARY names libmoekit; libmoekit_ep is found beside it (or
through MOEKIT_EP_LIBRARY). Exits 77 (CTest: skipped) where torch cannot be imported or libmoekit_ep cannot be
loaded.
"""
import os
import pathlib
import subprocess
import sys
import threading
import unittest

try:
    import torch
except ImportError as error:
    print("test_ep: torch cannot be imported (%s): skipped" % error)
    sys.exit(77)

import moekit  # noqa: E402
from moekit import _capi, _ep_capi, reference  # noqa: E402

try:
    _ep_capi.load()
except moekit.NotSupportedError as error:
    print("test_ep: %s: skipped" % error)
    sys.exit(77)

from moekit import ep  # noqa: E402

H, I, K = 16, 8, 2
RANK_TIMEOUT_S = 120  # a rank that failed alone leaves the others waiting in the exchange


def run_ranks(ranks, body):
    """body(rank, communicator) on `ranks` threads at once, over one LocalGroup; the results by rank."""
    group = ep.LocalGroup(ranks)
    comms = [group.communicator(r) for r in range(ranks)]
    results, errors = [None] * ranks, []

    def run(rank):
        try:
            results[rank] = body(rank, comms[rank])
        except BaseException as error:  # re-raised below, on the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RANK_TIMEOUT_S)
    if errors:
        raise errors[0]
    if any(thread.is_alive() for thread in threads):
        raise AssertionError("a rank is still waiting in the exchange after %d s" % RANK_TIMEOUT_S)
    return results


def make_inputs(tokens, ranks, experts, dtype, activation="swiglu", bias=False):
    torch.manual_seed(7 + ranks)
    width = 2 * I if activation in moekit.functional.GATED_ACTIVATIONS else I
    total, all_experts = sum(tokens), ranks * experts
    inputs = dict(x=torch.randn(total, H), w_router=torch.randn(all_experts, H) / H ** 0.5,
                  w1=torch.randn(all_experts, width, H) / H ** 0.5, w2=torch.randn(all_experts, H, I) / I ** 0.5)
    if bias:
        inputs.update(b1=torch.randn(all_experts, width) * 0.1, b2=torch.randn(all_experts, H) * 0.1)
    inputs = {name: t.to(dtype) for name, t in inputs.items()}
    return inputs, torch.randn(total, H).to(dtype)


def single_process(inputs, dout, **options):
    """moekit.moe on the global batch: out, the gradients by input name, the Routing."""
    leaves = {name: t.clone().requires_grad_() for name, t in inputs.items()}
    out, routing = moekit.moe(leaves["x"], leaves["w_router"], leaves["w1"], leaves["w2"], K, b1=leaves.get("b1"),
                              b2=leaves.get("b2"), return_routing=True, **options)
    out.backward(dout)
    return out.detach(), {name: t.grad for name, t in leaves.items()}, routing


def expert_parallel(inputs, dout, tokens, experts, **options):
    """moekit.ep.moe on len(tokens) ranks: out, the gradients (dw_router summed over the ranks) and the routing,
    put back together as global tensors, and each rank's dropped count."""
    ranks = len(tokens)
    begins = [sum(tokens[:r]) for r in range(ranks)]

    def body(rank, comm):
        rows = slice(begins[rank], begins[rank] + tokens[rank])
        mine = slice(rank * experts, (rank + 1) * experts)
        leaves = {name: (t[rows] if name == "x" else t if name == "w_router" else t[mine]).clone().requires_grad_()
                  for name, t in inputs.items()}
        out, routing = ep.moe(leaves["x"], leaves["w_router"], leaves["w1"], leaves["w2"], K, comm,
                              max_tokens=max(tokens), b1=leaves.get("b1"), b2=leaves.get("b2"), return_routing=True,
                              **options)
        out.backward(dout[rows])
        return out.detach(), {name: t.grad for name, t in leaves.items()}, routing

    results = run_ranks(ranks, body)
    grads = {name: torch.cat([r[1][name] for r in results]) for name in inputs if name != "w_router"}
    grads["w_router"] = sum(r[1]["w_router"].double() for r in results).to(inputs["w_router"].dtype)
    routing = ep.EPRouting(*(torch.cat([r[2][i] for r in results]) for i in range(3)),
                           [int(r[2].dropped) for r in results])
    return torch.cat([r[0] for r in results]), grads, routing


def relative(got, want):
    """docs/math.md section 9's whole-tensor metric."""
    return float((got.double() - want.double()).norm() / want.double().norm())


class ExactMode(unittest.TestCase):
    def check(self, tokens, experts, dtype, bitwise, bound, bias=False, **options):
        inputs, dout = make_inputs(tokens, len(tokens), experts, dtype, options.get("activation", "swiglu"), bias)
        want_out, want_grads, want_routing = single_process(inputs, dout, **options)
        out, grads, routing = expert_parallel(inputs, dout, tokens, experts, **options)
        self.assertTrue(torch.equal(routing.indices.long(), want_routing.indices))
        # moekit.moe gives fp32 scores whatever the layer's dtype, the expert-parallel layer the layer's own.
        self.assertTrue(torch.equal(routing.scores.to(want_routing.scores.dtype), want_routing.scores))
        self.assertEqual(routing.dropped, [0] * len(tokens))
        for name, got, want in [("out", out, want_out)] + [(name, grads[name], want_grads[name]) for name in grads]:
            if bitwise and name != "w_router":
                self.assertTrue(torch.equal(got, want), "%s differs from the single-process layer's by %g"
                                % (name, relative(got, want)))
            else:
                self.assertLess(relative(got, want), bound, name)

    def test_fp32_over_2_and_4_ranks_is_bitwise_the_single_process_layer(self):
        for tokens in ([7, 5], [5, 8, 3, 6]):
            with self.subTest(ranks=len(tokens)):
                self.check(tokens, 3, torch.float32, True, 1e-5)

    def test_one_rank_without_tokens(self):
        self.check([6, 0, 4, 1], 2, torch.float32, True, 1e-5)

    def test_fp64_with_biases_and_the_sigmoid_router_within_bounds(self):
        bias = torch.rand(2 * 3, dtype=torch.float32) * 0.1
        self.check([6, 4], 3, torch.float64, False, 1e-12, bias=True, router="sigmoid", router_bias=bias,
                   renormalize=True, router_scale=2.0)

    def test_non_gated_and_interleaved_activations(self):
        self.check([4, 7], 2, torch.float32, True, 1e-5, activation="relu2")
        self.check([5, 2, 6, 3], 2, torch.float32, True, 1e-5, activation="geglu", glu_layout="interleaved",
                   router="topk_softmax")


class CapacityMode(unittest.TestCase):
    def test_room_for_every_pair_is_bitwise_the_exact_mode(self):
        tokens = [7, 5]
        inputs, dout = make_inputs(tokens, 2, 3, torch.float32)
        exact = expert_parallel(inputs, dout, tokens, 3)
        capacity = expert_parallel(inputs, dout, tokens, 3, mode="capacity", capacity=max(tokens) * K)
        self.assertTrue(torch.equal(exact[0], capacity[0]))
        for name in inputs:
            self.assertTrue(torch.equal(exact[1][name], capacity[1][name]), name)
        self.assertEqual(capacity[2].dropped, [0, 0])

    def test_pairs_over_capacity_are_dropped_counted_and_add_nothing(self):
        tokens, experts, capacity = [9, 6], 3, 4
        ranks = len(tokens)
        inputs, dout = make_inputs(tokens, ranks, experts, torch.float64)
        out, grads, routing = expert_parallel(inputs, dout, tokens, experts, mode="capacity", capacity=capacity)
        # The rule: the rows one rank sends to one rank, in (expert, token) order, past the first `capacity`.
        kept = torch.ones_like(routing.indices, dtype=torch.bool)
        for rank in range(ranks):
            begin = sum(tokens[:rank])
            dropped = 0
            for destination in range(ranks):
                sent = 0
                for expert in range(destination * experts, (destination + 1) * experts):
                    for token in range(begin, begin + tokens[rank]):
                        for k in range(K):
                            if routing.indices[token, k] == expert:
                                sent += 1
                                if sent > capacity:
                                    kept[token, k] = False
                                    dropped += 1
            self.assertEqual(routing.dropped[rank], dropped, "rank %d" % rank)
        self.assertGreater(sum(routing.dropped), 0)
        leaves = {name: inputs[name].clone().requires_grad_() for name in ("w1", "w2")}
        want = reference.token_experts_reference(inputs["x"], torch.where(kept, routing.indices.long(), -1),
                                                 routing.scores, leaves["w1"], leaves["w2"])
        want.backward(dout)
        self.assertLess(relative(out, want.detach()), 1e-12)
        for name in ("w1", "w2"):
            self.assertLess(relative(grads[name], leaves[name].grad), 1e-12, name)


class Module(unittest.TestCase):
    def test_layers_over_the_ranks_are_the_single_process_layer(self):
        ranks, experts, tokens = 2, 2, [5, 7]
        torch.manual_seed(3)
        whole = moekit.MoELayer(H, I, experts * ranks, K, activation="geglu")
        x = torch.randn(sum(tokens), H, requires_grad=True)
        want = whole(x)
        want.sum().backward()

        def body(rank, comm):
            layer = ep.EPMoELayer(H, I, experts, K, comm, max_tokens=max(tokens), activation="geglu")
            self.assertEqual((layer.w_router.shape[0], layer.expert_begin), (experts * ranks, experts * rank))
            mine = slice(rank * experts, (rank + 1) * experts)
            with torch.no_grad():
                layer.w_router.copy_(whole.w_router)
                layer.w1.copy_(whole.w1[mine])
                layer.w2.copy_(whole.w2[mine])
            rows = x.detach()[sum(tokens[:rank]):sum(tokens[:rank + 1])].reshape(1, -1, H).requires_grad_()
            out = layer(rows)
            out.sum().backward()  # an expanded output gradient, which the layer makes dense
            return out.reshape(-1, H).detach(), layer, rows.grad.reshape(-1, H)

        results = run_ranks(ranks, body)
        self.assertTrue(torch.equal(torch.cat([r[0] for r in results]), want.detach()))
        self.assertTrue(torch.equal(torch.cat([r[2] for r in results]), x.grad))
        self.assertTrue(torch.equal(torch.cat([r[1].w1.grad for r in results]), whole.w1.grad))
        self.assertTrue(torch.equal(torch.cat([r[1].w2.grad for r in results]), whole.w2.grad))
        self.assertLess(relative(sum(r[1].w_router.grad for r in results), whole.w_router.grad), 1e-5)
        self.assertIn("ranks=2", repr(results[0][1]))

    def test_fused_accumulation_adds_into_main_grad(self):
        tokens, experts = [4, 6], 2
        inputs, dout = make_inputs(tokens, 2, experts, torch.float32)
        _, grads, _ = expert_parallel(inputs, dout, tokens, experts)

        def body(rank, comm):
            rows = slice(sum(tokens[:rank]), sum(tokens[:rank + 1]))
            mine = slice(rank * experts, (rank + 1) * experts)
            leaves = {name: (t[rows] if name == "x" else t if name == "w_router" else t[mine]).clone().requires_grad_()
                      for name, t in inputs.items()}
            for name in ("w_router", "w1", "w2"):
                leaves[name].main_grad = torch.ones_like(leaves[name])
            out = ep.moe(leaves["x"], leaves["w_router"], leaves["w1"], leaves["w2"], K, comm,
                         max_tokens=max(tokens), fuse_wgrad_accumulation=True)
            out.backward(dout[rows])
            self.assertIsNone(leaves["w1"].grad)
            return {name: leaves[name].main_grad for name in ("w1", "w2")}, leaves["x"].grad

        results = run_ranks(2, body)
        for name in ("w1", "w2"):
            got = torch.cat([r[0][name] for r in results])
            torch.testing.assert_close(got, 1 + grads[name], rtol=1e-6, atol=1e-6)
        self.assertTrue(torch.equal(torch.cat([r[1] for r in results]), grads["x"]))


class Bindings(unittest.TestCase):
    def test_struct_sizes_match_the_library(self):
        for name, (struct, init) in _ep_capi.STRUCTS.items():
            self.assertEqual(_ep_capi.initialised(struct, init).struct_size, _capi.ctypes.sizeof(struct), name)
        self.assertEqual(_ep_capi.EpDesc.layer.offset, _capi.ctypes.sizeof(_capi.c_size_t))

    def test_bad_arguments_name_themselves(self):
        with self.assertRaisesRegex(moekit.MoekitError, "ranks"):
            ep.LocalGroup(0)
        comm = ep.LocalGroup(1).communicator(0)
        self.assertEqual((comm.rank, comm.ranks), (0, 1))
        inputs, _ = make_inputs([4], 1, 2, torch.float32)
        args = (inputs["x"], inputs["w_router"], inputs["w1"], inputs["w2"], K, comm)
        with self.assertRaises(moekit.MoekitError) as caught:
            ep.moe(*args, max_tokens=4, mode="capacity", capacity=0)
        self.assertIn("desc.capacity", str(caught.exception))
        self.assertEqual(caught.exception.status, 100)  # MOEKIT_STATUS_INVALID_VALUE
        with self.assertRaisesRegex(moekit.MoekitError, "x: T = 4"):
            ep.moe(*args, max_tokens=3)
        with self.assertRaisesRegex(moekit.MoekitError, "w2"):
            ep.moe(*args[:3], inputs["w2"][:, :, :-1], K, comm, max_tokens=4)
        with self.assertRaisesRegex(ValueError, "mode"):
            ep.moe(*args, max_tokens=4, mode="sometimes")
        if not ep.has_nccl():
            with self.assertRaisesRegex(moekit.NotSupportedError, "NCCL"):
                ep.Communicator.from_nccl(1)

    def test_import_without_the_library_fails_on_use_only(self):
        environment = dict(os.environ, MOEKIT_EP_LIBRARY="/nonexistent/" + _ep_capi.SONAME,
                           PYTHONPATH=str(pathlib.Path(moekit.__file__).resolve().parents[1]))
        script = ("import moekit, moekit.ep\n"
                  "try:\n    moekit.ep.LocalGroup(2)\n"
                  "except moekit.NotSupportedError as error:\n    print(error)\n")
        result = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("MOEKIT_EP_LIBRARY", result.stdout)


if __name__ == "__main__":
    unittest.main()
