"""Every option of moekit's Python layers and building blocks, against the plain-PyTorch oracles of moekit.reference
in fp64: the MoE layer's router kinds, renormalisation, scale and selection bias, activations, GLU layouts, biases,
local expert range, routing outputs and fused main_grad accumulation; the experts alone on grouped rows; dispatch,
gather_tokens and combine; the sparse FFN's subsample rows and load-balance bias and its update. Forward values,
every gradient (torch.autograd.gradcheck where it is cheap) and bad arguments raising MoekitError or ValueError that
name the argument. Run as test_moekit.py is (run_test.sh); exits 77 where torch cannot be imported.

On CPU tensors (moekit's reference backend) in fp64 by default; MOEKIT_TEST_DEVICE=cuda runs moekit on CUDA tensors
in bf16 against the same fp64 oracles (layer_checks.py), and skips, saying so, the checks only the CPU makes.
"""
import itertools
import pathlib
import sys
import unittest

try:
    import torch
except ImportError as error:
    print("test_options: torch cannot be imported (%s): skipped" % error)
    sys.exit(77)

sys.path.append(str(pathlib.Path(__file__).resolve().parent))
import layer_checks  # noqa: E402
import moekit  # noqa: E402
from layer_checks import assert_close, cpu_only, on_device, to_device  # noqa: E402
from moekit import _runtime, functional, reference  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

F64 = torch.float64
# Widths in whole 16-byte vectors and 8 experts: what the CUDA backend's kernels take.
T, H, I, E, K = 12, 8, 8, 8, 2


def _randn(*shape, scale=1.0, dtype=F64):
    return layer_checks.rounded(torch.randn(*shape, dtype=F64) * scale).to(dtype)


def _moe_inputs(activation="swiglu", bias=True, experts=E, router_experts=E, dtype=F64):
    width = 2 * I if activation in functional.GATED_ACTIVATIONS else I
    inputs = dict(x=_randn(T, H), w_router=_randn(router_experts, H, scale=0.7),
                  w1=_randn(experts, width, H, scale=0.5), w2=_randn(experts, H, I, scale=0.5))
    if bias:
        inputs.update(b1=_randn(experts, width, scale=0.5), b2=_randn(experts, H, scale=0.5))
    return {name: t.to(dtype) for name, t in inputs.items()}


def _run(fn, inputs, dout, **options):
    """fn's output and the gradients of sum(out * dout) for every floating input (0 where out does not depend on
    it: a plain-PyTorch layer of no token makes no graph)."""
    leaves = {name: t.clone().requires_grad_(t.is_floating_point()) for name, t in inputs.items()}
    out = fn(**leaves, **options)
    if out.requires_grad:
        (out * dout).sum().backward()
    return out.detach(), {name: t.grad if t.grad is not None else torch.zeros_like(t)
                          for name, t in leaves.items() if t.is_floating_point()}


class Case(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)

    def assert_matches(self, fn, ref, inputs, rtol=1e-9, atol=1e-11, **options):
        dout = _randn(*fn(**inputs, **options).shape)
        got, got_grads = _run(fn, inputs, dout, **options)
        want, want_grads = _run(ref, inputs, dout, **options)
        assert_close(got, want, rtol=rtol, atol=atol)
        for name in want_grads:
            assert_close(got_grads[name], want_grads[name], rtol=rtol, atol=atol, msg=name)

    def assert_names(self, error_type, argument, fn, *args, **kwargs):
        with self.assertRaises(error_type) as caught:
            fn(*args, **kwargs)
        self.assertIn(argument, str(caught.exception))


def _moe(x, w_router, w1, w2, **options):
    return on_device(moekit.moe)(x, w_router, w1, w2, K, **options)


def _moe_reference(x, w_router, w1, w2, storage_dtype=layer_checks.DTYPE, **options):
    return reference.moe_reference(x, w_router, w1, w2, K, storage_dtype, **options)


_dispatch, _gather_tokens, _experts = map(on_device, (moekit.dispatch, moekit.gather_tokens, moekit.experts))


def _combine(grouped, scores, grouped_pos, **options):
    return on_device(moekit.combine)(grouped, scores.to(layer_checks.WIDE), grouped_pos, **options)


# swiglu_oai's clamp, among the values of h: halfway between two bf16 numbers, so that rounding h to bf16 never
# takes it across (the fp64 oracle does not round h).
GLU_LIMIT = 1.0 + 2.0 ** -8
ROUTER_CASES = [
    dict(router="softmax_topk"),
    dict(router="topk_softmax"),
    dict(router="topk_softmax", renormalize=True),
    dict(router="topk"),
    dict(router="sigmoid", router_scale=2.5),
    dict(router="sigmoid", renormalize=True, router_scale=0.5),
]


class MoELayerOptions(Case):
    def test_every_router_activation_and_layout_against_the_reference(self):
        for activation, layout, router in itertools.product(functional.ACTIVATIONS, functional.GLU_LAYOUTS,
                                                            ROUTER_CASES):
            if layout == "interleaved" and activation not in functional.GATED_ACTIVATIONS:
                continue
            with self.subTest(activation=activation, glu_layout=layout, **router):
                options = dict(router, activation=activation, glu_layout=layout, glu_limit=GLU_LIMIT)
                if router["router"] == "sigmoid":
                    options["router_bias"] = torch.rand(E) * 0.2
                self.assert_matches(_moe, _moe_reference, _moe_inputs(activation), **options)

    def test_without_biases(self):
        self.assert_matches(_moe, _moe_reference, _moe_inputs(bias=False), router="topk_softmax", renormalize=True)

    def test_bf16_against_the_fp64_reference_of_its_inputs(self):
        for options in (dict(router="sigmoid", renormalize=True, router_scale=2.0, activation="geglu",
                             glu_layout="interleaved", router_bias=torch.rand(E) * 0.1),
                        dict(router="topk_softmax", activation="relu2", expert_begin=1)):
            with self.subTest(**options):
                inputs = _moe_inputs(options["activation"], dtype=torch.bfloat16, experts=E - 1)
                dout = _randn(T, H)
                got, got_grads = _run(lambda **t: _moe(**t, **options).double(), inputs, dout)
                wide = {name: t.double() for name, t in inputs.items()}
                want, want_grads = _run(lambda **t: _moe_reference(**t, storage_dtype=torch.bfloat16, **options),
                                        wide, dout)
                for name, value in [("out", got)] + list(got_grads.items()):
                    reference_value = want if name == "out" else want_grads[name]
                    error = (value.double() - reference_value).norm() / reference_value.norm()
                    self.assertLess(error.item(), layer_checks.TOLERANCE, name)

    @cpu_only("gradcheck needs fp64, which the CUDA backend does not store; the options meet the fp64 oracle above")
    def test_gradcheck(self):
        cases = [dict(activation="swiglu_oai", glu_limit=1.5, router="sigmoid", renormalize=True, router_scale=2.0),
                 dict(activation="geglu", glu_layout="interleaved", router="topk_softmax"),
                 dict(activation="relu2", router="softmax_topk")]
        for options in cases:
            with self.subTest(**options):
                inputs = _moe_inputs(options["activation"])
                leaves = [t.requires_grad_() for t in inputs.values()]
                names = list(inputs)

                # gradcheck runs the backward of one forward several times: the saved buffer must outlive each.
                def fn(*tensors, options=options):
                    return _moe(**dict(zip(names, tensors)), backward_overwrites_saved=False, **options)

                self.assertTrue(torch.autograd.gradcheck(fn, leaves))

    def test_local_experts_drop_the_pairs_routed_elsewhere(self):
        inputs = _moe_inputs(experts=3, router_experts=8)
        self.assert_matches(_moe, _moe_reference, inputs, expert_begin=2, router="topk_softmax")
        out, routing = _moe(**inputs, expert_begin=2, return_routing=True)
        _, want = _moe_reference(**inputs, expert_begin=2, return_routing=True)
        self.assertEqual(routing.counts.shape, (8,))
        self.assertTrue(torch.equal(routing.counts, want.counts))
        dropped = ((routing.indices < 2) | (routing.indices >= 5)).all(dim=1)
        self.assertTrue(dropped.any())
        self.assertTrue(torch.equal(out[dropped], torch.zeros_like(out[dropped])))

    def test_routing_outputs(self):
        inputs = _moe_inputs()
        for options in ROUTER_CASES:
            with self.subTest(**options):
                out, routing = _moe(**inputs, return_routing=True, **options)
                want_out, want = _moe_reference(**inputs, return_routing=True, **options)
                self.assertEqual((routing.scores.dtype, routing.indices.dtype, routing.counts.dtype),
                                 (torch.float32, torch.int64, torch.int32))
                self.assertTrue(torch.equal(routing.indices, want.indices))
                self.assertTrue(torch.equal(routing.counts, want.counts))
                assert_close(routing.scores, want.scores)
                assert_close(out, want_out)

    def test_the_router_bias_steers_the_selection_not_the_scores(self):
        inputs = _moe_inputs()
        bias = torch.zeros(E)
        bias[4] = 10.0
        _, routing = _moe(**inputs, router="sigmoid", router_bias=bias, return_routing=True)
        self.assertTrue(torch.equal(routing.indices[:, 0], torch.full((T,), 4)))
        logits = inputs["x"] @ inputs["w_router"].t()
        assert_close(routing.scores[:, 0], torch.sigmoid(logits[:, 4]).float())

    def test_no_grad_gives_the_training_output(self):
        inputs = _moe_inputs("gelu")
        leaves = {name: t.requires_grad_() for name, t in inputs.items()}
        options = dict(activation="gelu", router="sigmoid", router_bias=torch.rand(E))
        training = _moe(**leaves, **options)
        with torch.no_grad():
            inference, routing = _moe(**leaves, return_routing=True, **options)
        self.assertTrue(torch.equal(training.detach(), inference))
        self.assertFalse(routing.scores.requires_grad)

    def test_input_and_weight_gradients_alone(self):
        inputs = _moe_inputs()
        dout = _randn(T, H)
        _, want = _run(_moe, inputs, dout)
        for trained in (["x"], ["w1", "b2"]):
            leaves = {name: t.clone().requires_grad_(name in trained) for name, t in inputs.items()}
            (_moe(**leaves) * dout).sum().backward()
            for name, leaf in leaves.items():
                if name in trained:
                    assert_close(leaf.grad, want[name], msg=name)
                else:
                    self.assertIsNone(leaf.grad, name)

    def test_backward_overwrites_saved_gives_the_same_gradients_once(self):
        inputs = _moe_inputs()
        dout = _randn(T, H)
        want_out, want = _run(_moe, inputs, dout, backward_overwrites_saved=False)
        for options in (dict(backward_overwrites_saved=True), {}):  # {}: the default, on
            got_out, got = _run(_moe, inputs, dout, **options)
            self.assertTrue(torch.equal(got_out, want_out))
            for name in want:
                self.assertTrue(torch.equal(got[name], want[name]), name)

    def assert_spent(self, backward):
        """backward() is refused by the Python-side record of spent saved buffers, on every device."""
        with self.assertRaises(moekit.MoekitError) as caught:
            backward()
        self.assertEqual(caught.exception.status, moekit._capi.STATUS_INVALID_VALUE)
        self.assertIn("saved", str(caught.exception))
        self.assertIn("backward_overwrites_saved=False", str(caught.exception))

    def test_backward_overwrites_saved_refuses_a_second_backward(self):
        # The saved buffer is spent by the first backward: a second one through the same graph is refused.
        inputs = _moe_inputs()
        dout = _randn(T, H)
        leaves = {name: t.clone().requires_grad_() for name, t in inputs.items()}
        loss = (_moe(**leaves, backward_overwrites_saved=True) * dout).sum()
        loss.backward(retain_graph=True)
        self.assert_spent(loss.backward)

    def test_backward_overwrites_saved_is_the_default(self):
        inputs = _moe_inputs()
        dout = _randn(T, H)
        leaves = {name: t.clone().requires_grad_() for name, t in inputs.items()}
        loss = (_moe(**leaves) * dout).sum()
        loss.backward(retain_graph=True)
        self.assert_spent(loss.backward)
        experts = self._grouped_experts()
        loss = experts().square().sum()
        loss.backward(retain_graph=True)
        self.assert_spent(loss.backward)
        for module, args in ((moekit.MoELayer(H, I, E, K, layer_checks.DEVICE, layer_checks.DTYPE), (_randn(T, H),)),
                             (moekit.Experts(H, I, 4, layer_checks.DEVICE, layer_checks.DTYPE),
                              (_randn(16, H), ExpertsOnGroupedRows.OFFSETS))):
            with self.subTest(module=type(module).__name__):
                self.assertTrue(module.backward_overwrites_saved)
                loss = on_device(module)(*args).square().sum()
                loss.backward(retain_graph=True)
                self.assert_spent(loss.backward)

    def _grouped_experts(self, **options):
        inputs = _moe_inputs(experts=4)
        leaves = dict(x=_randn(16, H).requires_grad_(), w1=inputs["w1"].requires_grad_(),
                      w2=inputs["w2"].requires_grad_())
        return lambda: _experts(leaves["x"], ExpertsOnGroupedRows.OFFSETS, leaves["w1"], leaves["w2"], **options)

    def test_backward_overwrites_saved_off_allows_a_second_backward(self):
        inputs = _moe_inputs()
        dout = _randn(T, H)
        leaves = {name: t.clone().requires_grad_() for name, t in inputs.items()}
        loss = (_moe(**leaves, backward_overwrites_saved=False) * dout).sum()
        first = torch.autograd.grad(loss, list(leaves.values()), retain_graph=True)
        second = torch.autograd.grad(loss, list(leaves.values()))
        for name, a, b in zip(leaves, first, second):
            self.assertTrue(torch.equal(a, b), name)

    def test_a_fresh_forward_after_a_spent_backward_runs_again(self):
        # Each training forward fills a new saved buffer, which the caching allocator may place where the spent one
        # was: it is fresh again, its one backward runs, as many times over as forwards are made.
        inputs = _moe_inputs()
        dout = _randn(T, H)
        _, want = _run(_moe, inputs, dout, backward_overwrites_saved=False)
        leaves = {name: t.clone().requires_grad_() for name, t in inputs.items()}
        for step in range(3):
            for leaf in leaves.values():
                leaf.grad = None
            loss = (_moe(**leaves) * dout).sum()
            loss.backward(retain_graph=True)
            for name, leaf in leaves.items():
                self.assertTrue(torch.equal(leaf.grad, want[name]), "step %d: %s" % (step, name))
            self.assert_spent(loss.backward)
            del loss  # the graph and its saved buffer go: the next forward may take the same memory

    def test_the_record_of_spent_saved_buffers(self):
        # Whether the allocator gives a new forward the spent buffer's address is its own choice: the record's rules
        # on one buffer, as a forward (mark_saved_fresh) and backwards (spend_saved) use them.
        saved = _runtime.buffer(64, layer_checks.DEVICE)
        # A forward filled it: the allocator may have given it the address of an earlier test's spent buffer.
        _runtime.mark_saved_fresh(saved)
        calls = []
        _runtime.spend_saved(saved, lambda: calls.append(1))
        self.assert_spent(lambda: _runtime.spend_saved(saved, lambda: calls.append(2)))
        self.assertEqual(calls, [1])
        _runtime.mark_saved_fresh(saved)  # a forward filled it again
        with self.assertRaises(ZeroDivisionError):  # a backward that fails leaves the buffer unspent
            _runtime.spend_saved(saved, lambda: 1 / 0)
        _runtime.spend_saved(saved, lambda: calls.append(3))
        self.assertEqual(calls, [1, 3])
        empty = _runtime.buffer(0, layer_checks.DEVICE)  # an inference forward's: never recorded
        for _ in range(2):
            _runtime.spend_saved(empty, lambda: calls.append(4))
        self.assertEqual(calls, [1, 3, 4, 4])
        _runtime.mark_saved_fresh(saved)

    def test_bad_arguments_name_themselves(self):
        inputs = _moe_inputs()
        self.assert_names(ValueError, "router", _moe, **inputs, router="softmax")
        self.assert_names(ValueError, "activation", _moe, **inputs, activation="swish")
        self.assert_names(ValueError, "glu_layout", _moe, **inputs, glu_layout="split")
        self.assert_names(moekit.MoekitError, "router_bias", _moe, **inputs, router_bias=torch.zeros(E))
        self.assert_names(moekit.MoekitError, "router_bias", _moe, **inputs, router="sigmoid",
                          router_bias=torch.zeros(E + 1))
        self.assert_names(moekit.MoekitError, "b1", _moe, **dict(inputs, b1=inputs["b1"][:, :I]))
        self.assert_names(moekit.MoekitError, "expert_begin", _moe, **inputs, expert_begin=-1)
        self.assert_names(ValueError, "w1", _moe, **dict(inputs, w1=inputs["w1"][0]))
        self.assert_names(ValueError, "router", moekit.MoELayer, H, I, E, K, router="dense")
        self.assert_names(ValueError, "router_bias", moekit.MoELayer, H, I, E, K, router_bias=True)


class _ZerosMade(TorchDispatchMode):
    """The dtype and shape of every tensor an aten zeros op makes while active (the autograd engine makes a missing
    output gradient as at::zeros of the output's shape: the ops this mode sees, on the device's backward thread too,
    since the engine carries the dispatch modes there)."""

    def __init__(self):
        super().__init__()
        self.zeros, self.ops = [], set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(str(func.overloadpacket))
        if "zeros" in str(func.overloadpacket) and isinstance(out, torch.Tensor):
            self.zeros.append((out.dtype, tuple(out.shape)))
        return out


class BackwardAllocations(Case):
    """The backward allocates no zero gradient for the outputs nothing differentiates: the saved-activation buffer
    (an output of the forward custom op, often over a GiB) and the routing outputs."""

    def _zeros_of_backward(self, fused):
        inputs = _moe_inputs()
        leaves = {name: to_device(t.clone()).requires_grad_() for name, t in inputs.items()}
        for name in list(leaves)[1:] if fused else ():
            leaves[name].main_grad = torch.zeros_like(leaves[name], dtype=layer_checks.WIDE)
        out, routing = moekit.moe(leaves.pop("x"), leaves.pop("w_router"), leaves.pop("w1"), leaves.pop("w2"), K,
                                  **leaves, return_routing=True, fuse_wgrad_accumulation=fused)
        loss = (out.float() * to_device(_randn(T, H)).float()).sum()
        with _ZerosMade() as made:
            loss.backward()
        # The backward itself: the backward op, or (fused, no op) the dx it allocates.
        self.assertTrue(made.ops & {"moekit.moe_backward", "aten.empty_like"}, "the mode saw no backward")
        # Not the layer's own zeros (the loss gradients of the losses that are off, dx of grouped rows: floating):
        return [(dtype, shape) for dtype, shape in made.zeros
                if not dtype.is_floating_point or shape == tuple(routing.scores.shape)]

    def test_no_zero_gradient_of_saved_or_the_routing_outputs(self):
        for fused in (False, True):  # the custom ops, the torch.autograd.Function (fused main_grad)
            with self.subTest(fuse_wgrad_accumulation=fused):
                self.assertEqual(self._zeros_of_backward(fused), [])

    def test_the_check_sees_materialised_gradients(self):
        # Autograd's default (materialize_grads) made them: the check above would fail.
        original = functional._no_zero_grads
        functional._no_zero_grads = lambda ctx: None
        try:
            made = self._zeros_of_backward(fused=False)
        finally:
            functional._no_zero_grads = original
        self.assertIn(torch.uint8, [dtype for dtype, _ in made])  # the saved buffer's gradient
        self.assertIn((torch.int64, (T, K)), made)  # the indices'


class ScratchInDw1(Case):
    """The MoE layer and the experts make their plan with backward_scratch_in_dw1 exactly where the backward
    allocates dW1 itself (w1 needs its gradient, no fused accumulation, a training forward): its rules on the call
    (the weight gradients computed, beta_dw1 0, a contiguous dw1) then always hold, on the reference backend too."""

    def _flags(self, fn):
        """backward_scratch_in_dw1 of the layer plans fn() asks for."""
        flags, original = [], _runtime.plan_for

        def plan_for(device, create, desc_type, desc_init, fields):
            if "backward_scratch_in_dw1" in fields:
                flags.append(fields["backward_scratch_in_dw1"])
            return original(device, create, desc_type, desc_init, fields)

        _runtime.plan_for = plan_for
        try:
            fn()
        finally:
            _runtime.plan_for = original
        return flags

    def _step(self, inputs, dout, frozen=(), fused=False):
        """The gradients of one forward + backward of the MoE layer with the inputs in `frozen` needing none."""
        leaves = {name: to_device(t.clone()).requires_grad_(name not in frozen) for name, t in inputs.items()}
        for name in ("w_router", "w1", "b1", "w2", "b2") if fused else ():
            if name not in frozen:
                leaves[name].main_grad = torch.zeros_like(leaves[name], dtype=layer_checks.WIDE)
        out = moekit.moe(leaves["x"], leaves["w_router"], leaves["w1"], leaves["w2"], K, b1=leaves["b1"],
                         b2=leaves["b2"], fuse_wgrad_accumulation=fused)
        (out.float() * dout.float()).sum().backward()
        return {name: (t.main_grad if fused and name != "x" and name not in frozen else t.grad)
                for name, t in leaves.items()}

    def test_the_flag_follows_who_allocates_dw1(self):
        grads = {}
        inputs, dout = _moe_inputs(dtype=layer_checks.DTYPE), to_device(_randn(T, H))
        for case, options, want in (("default", {}, [1, 1]), ("fused", dict(fused=True), [0, 0]),
                                     ("w1 frozen", dict(frozen=("w1",)), [0, 0])):
            with self.subTest(case=case):
                step = lambda: grads.setdefault(case, self._step(inputs, dout, **options))  # noqa: E731
                self.assertEqual(self._flags(step), want)
        # The same gradients whichever plan ran: the scratch leaves no trace in dW1 or anything else.
        for name in ("x", "w_router", "w2", "b1", "b2"):
            self.assertTrue(torch.equal(grads["w1 frozen"][name], grads["default"][name]), name)
        assert_close(grads["fused"]["w1"].to(grads["default"]["w1"].dtype), grads["default"]["w1"])
        inputs = {name: to_device(t) for name, t in _moe_inputs().items()}
        with torch.no_grad():
            self.assertEqual(self._flags(lambda: _moe(**{n: inputs[n] for n in ("x", "w_router", "w1", "w2")})), [0])

    def test_the_experts_take_the_flag_too(self):
        x16, offsets = to_device((_randn(16, H), ExpertsOnGroupedRows.OFFSETS))
        w1, w2 = (to_device(t).requires_grad_() for t in (_randn(4, 2 * I, H, scale=0.5), _randn(4, H, I, scale=0.5)))
        step = lambda: moekit.experts(x16, offsets, w1, w2).float().square().sum().backward()  # noqa: E731
        self.assertEqual(self._flags(step), [1, 1])


class WorkspaceSizes(Case):
    """A layer's forward and backward each take the workspace of their direction (moekit_plan_layer_workspace_sizes),
    the building blocks the plan's one workspace size. The reference backend needs no workspace (all sizes 0): the
    sizes that differ are the CUDA backend's (MOEKIT_TEST_DEVICE=cuda)."""

    def _calls(self, fn):
        """fn()'s moekit run calls: (plan, C function, workspace bytes passed)."""
        calls, original = [], _runtime.run

        def run(plan, function, args, *pointer_and_sizes, device):
            calls.append((plan, function, pointer_and_sizes[-1]))
            return original(plan, function, args, *pointer_and_sizes, device=device)

        _runtime.run = run
        try:
            fn()
        finally:
            _runtime.run = original
        return calls

    def test_each_direction_takes_its_own_size(self):
        inputs = {name: to_device(t) for name, t in _moe_inputs().items()}
        experts_inputs = {name: to_device(t) for name, t in _moe_inputs(experts=4).items()}
        x16, offsets = to_device((_randn(16, H), ExpertsOnGroupedRows.OFFSETS))
        sparse = dict(x=_randn(T, H), w_gate=_randn(64, H, scale=0.7), w_up=_randn(64, H, scale=0.5),
                      w_down=_randn(H, 64, scale=0.3))
        sparse = {name: to_device(t) for name, t in sparse.items()}
        layers = {
            "moekit_moe": lambda **t: moekit.moe(t.pop("x"), t.pop("w_router"), t.pop("w1"), t.pop("w2"), K, **t),
            "moekit_experts": lambda **t: moekit.experts(t["x"], offsets, t["w1"], t["w2"], b1=t["b1"], b2=t["b2"]),
            "moekit_sparse_ffn": lambda **t: moekit.sparse_swiglu(t["x"], t["w_gate"], t["w_up"], t["w_down"], 16, 2),
        }
        tensors = {"moekit_moe": inputs, "moekit_experts": dict(experts_inputs, x=x16), "moekit_sparse_ffn": sparse}
        for prefix, fn in layers.items():
            with self.subTest(layer=prefix):
                leaves = {name: t.clone().requires_grad_() for name, t in tensors[prefix].items()}

                def step():
                    fn(**dict(leaves)).float().square().sum().backward()

                calls = self._calls(step)
                self.assertEqual([function for _, function, _ in calls], [prefix + "_forward", prefix + "_backward"])
                (plan, _, forward_bytes), (backward_plan, _, backward_bytes) = calls
                self.assertIs(plan, backward_plan)
                self.assertEqual(forward_bytes, plan.forward_workspace_bytes)
                self.assertEqual(backward_bytes, plan.backward_workspace_bytes)
                self.assertEqual(max(plan.forward_workspace_bytes, plan.backward_workspace_bytes),
                                 plan.workspace_bytes)
                with torch.no_grad():
                    (inference, function, inference_bytes), = self._calls(lambda: fn(**dict(leaves)))
                self.assertEqual(function, prefix + "_forward")
                self.assertEqual(inference_bytes, inference.forward_workspace_bytes)
                self.assertLessEqual(inference.forward_workspace_bytes, inference.workspace_bytes)
                self.assertEqual(inference.backward_workspace_bytes, 0)

    def test_the_building_blocks_take_the_plan_size(self):
        indices = to_device(torch.randint(0, E, (T, K)))
        x = to_device(_randn(T, H)).requires_grad_()

        def chain():
            routing = moekit.dispatch(indices, E)
            rows = moekit.gather_tokens(x, routing.gather_idx, routing.grouped_pos)
            scores = torch.ones(T, K, device=x.device, dtype=layer_checks.WIDE)
            moekit.combine(rows, scores, routing.grouped_pos).sum().backward()

        calls = self._calls(chain)
        self.assertEqual([function for _, function, _ in calls],
                         ["moekit_dispatch", "moekit_combine", "moekit_broadcast_backward"])
        for plan, function, workspace_bytes in calls:
            self.assertEqual(workspace_bytes, plan.workspace_bytes, function)
            self.assertEqual((plan.forward_workspace_bytes, plan.backward_workspace_bytes),
                             (plan.workspace_bytes, plan.workspace_bytes), function)


class FewTokens(Case):
    def test_no_token_and_one_token(self):
        for tokens in (0, 1):
            with self.subTest(tokens=tokens):
                inputs = dict(_moe_inputs(), x=_randn(tokens, H))
                for options in ROUTER_CASES:
                    self.assert_matches(_moe, _moe_reference, inputs, **options)
                sparse = dict(x=_randn(tokens, H), w_gate=_randn(32, H), w_up=_randn(32, H), w_down=_randn(H, 32))
                rows = moekit.subsample_rows(1, 2, 16, 3)
                self.assert_matches(_sparse, _sparse_reference, sparse, subsample_rows=rows)
                routing = _dispatch(torch.zeros(tokens, K, dtype=torch.int64), E)
                x = _randn(tokens, H).requires_grad_()
                rows = _gather_tokens(x, routing.gather_idx, routing.grouped_pos)
                out = _combine(rows, torch.ones(tokens, K, dtype=F64), routing.grouped_pos)
                out.sum().backward()
                assert_close(out, K * x.detach())
                assert_close(x.grad, torch.full_like(x, K))


class FusedWeightGradAccumulation(Case):
    def test_main_grad_receives_the_gradient(self):
        inputs = _moe_inputs()
        dout = _randn(T, H)
        _, want = _run(_moe, inputs, dout)
        # The weights that own a main_grad are the layer's own tensors on the device (fp64 on the CPU, fp32 beside
        # bf16 weights).
        leaves = {name: to_device(t.clone()).requires_grad_() for name, t in inputs.items()}
        before = {}
        for name, leaf in leaves.items():
            if name != "x":
                before[name] = _randn(*leaf.shape)
                leaf.main_grad = before[name].to(layer_checks.DEVICE, layer_checks.WIDE, copy=True)
        leaves["w2"].grad_added_to_main_grad = False
        (_moe(**leaves, fuse_wgrad_accumulation=True) * dout).sum().backward()
        assert_close(leaves["x"].grad, want["x"])
        for name in before:
            assert_close(leaves[name].main_grad.cpu() - before[name], want[name], msg=name)
        self.assertIsNone(leaves["w1"].grad)
        self.assertTrue(leaves["w2"].grad_added_to_main_grad)

    def test_fp32_main_grad_of_bf16_weights(self):
        layer = moekit.MoELayer(H, I, E, K, layer_checks.DEVICE, torch.bfloat16, bias=True,
                                fuse_wgrad_accumulation=True)
        for parameter in layer.parameters():
            parameter.main_grad = torch.ones_like(parameter, dtype=torch.float32)
        x = _randn(T, H, dtype=torch.bfloat16)
        dout = _randn(T, H)
        on_device(layer)(x).float().mul(dout).sum().backward()
        weights = {name: p.detach().cpu().double().requires_grad_() for name, p in layer.named_parameters()}
        out = reference.moe_reference(x.double(), weights["w_router"], weights["w1"], weights["w2"], K,
                                      storage_dtype=torch.bfloat16, b1=weights["b1"], b2=weights["b2"])
        (out * dout).sum().backward()
        for name, parameter in layer.named_parameters():
            self.assertEqual(parameter.main_grad.dtype, torch.float32)
            got, want = parameter.main_grad.cpu().double() - 1, weights[name].grad
            self.assertLess(((got - want).norm() / want.norm()).item(), layer_checks.TOLERANCE, name)

    def test_sparse_ffn_and_experts_accumulate_too(self):
        sparse = moekit.SparseSwiGLU(16, 64, 16, 2, layer_checks.DEVICE, layer_checks.DTYPE)
        experts = moekit.Experts(H, I, 3, layer_checks.DEVICE, layer_checks.DTYPE, bias=True)
        offsets = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
        for module, args in ((sparse, (_randn(5, 16),)), (experts, (_randn(9, H), offsets))):
            args = to_device(args)
            with self.subTest(module=type(module).__name__):
                module.fuse_wgrad_accumulation = False
                plain = torch.autograd.grad(module(*args).square().sum(), module.parameters())
                module.fuse_wgrad_accumulation = True
                for parameter in module.parameters():
                    parameter.main_grad = torch.zeros_like(parameter)
                module(*args).square().sum().backward()
                for parameter, want in zip(module.parameters(), plain):
                    self.assertIsNone(parameter.grad)
                    assert_close(parameter.main_grad, want)

    def test_every_trained_weight_needs_a_main_grad_of_one_dtype(self):
        inputs = {name: to_device(t).requires_grad_() for name, t in _moe_inputs().items()}
        for name in ("w_router", "w1", "b1", "w2"):
            inputs[name].main_grad = torch.zeros_like(inputs[name])
        self.assert_names(ValueError, "b2", _moe, **inputs, fuse_wgrad_accumulation=True)
        inputs["b2"].main_grad = torch.zeros_like(inputs["b2"], dtype=torch.float32)
        self.assert_names(ValueError, "main_grad", _moe, **inputs, fuse_wgrad_accumulation=True)


class ExpertsOnGroupedRows(Case):
    OFFSETS = torch.tensor([0, 4, 4, 9, 13], dtype=torch.int32)  # an empty expert, and 3 rows past the last

    def _inputs(self, activation="swiglu"):
        inputs = _moe_inputs(activation, experts=4)
        del inputs["w_router"]
        inputs["x"] = _randn(16, H)
        return inputs

    def _experts(self, x, w1, w2, **options):
        return _experts(x, self.OFFSETS, w1, w2, **options)

    def _reference(self, x, w1, w2, **options):
        return reference.experts_reference(x, self.OFFSETS, w1, w2, **options)

    def test_every_activation_against_the_reference(self):
        for activation in functional.ACTIVATIONS:
            with self.subTest(activation=activation):
                self.assert_matches(self._experts, self._reference, self._inputs(activation), activation=activation)
        self.assert_matches(self._experts, self._reference, self._inputs(), glu_layout="interleaved")

    def test_rows_past_the_offsets_are_zero(self):
        y = self._experts(**self._inputs("swiglu_oai"), activation="swiglu_oai", glu_limit=1.0)
        self.assertTrue(torch.equal(y[13:], torch.zeros(3, H, dtype=y.dtype)))

    @cpu_only("gradcheck needs fp64, which the CUDA backend does not store; the activations meet the fp64 oracle")
    def test_gradcheck(self):
        inputs = self._inputs("swiglu_oai")
        leaves = [t.requires_grad_() for t in inputs.values()]
        names = list(inputs)

        def fn(*tensors):  # one forward, several backwards: the saved buffer kept (backward_overwrites_saved off)
            return self._experts(**dict(zip(names, tensors)), activation="swiglu_oai", glu_limit=1.0,
                                 backward_overwrites_saved=False)

        self.assertTrue(torch.autograd.gradcheck(fn, leaves))

    def test_offsets_from_counts_and_the_module(self):
        counts = torch.tensor([4, 0, 5, 4])
        self.assertTrue(torch.equal(on_device(moekit.offsets_from_counts)(counts), self.OFFSETS))
        module = moekit.Experts(H, I, 4, layer_checks.DEVICE, layer_checks.DTYPE, activation="relu")
        x = _randn(16, H)
        w1, w2 = (w.detach().cpu().double() for w in (module.w1, module.w2))
        want = reference.experts_reference(x, self.OFFSETS, w1, w2, activation="relu")
        assert_close(on_device(module)(x, self.OFFSETS), want)

    def test_bad_offsets_name_themselves(self):
        inputs = self._inputs()
        self.assert_names(moekit.MoekitError, "offsets", _experts, inputs["x"], self.OFFSETS.long(), inputs["w1"],
                          inputs["w2"])
        self.assert_names(moekit.MoekitError, "offsets", _experts, inputs["x"], self.OFFSETS[:3], inputs["w1"],
                          inputs["w2"])


class DispatchAndCombine(Case):
    def test_dispatch_against_the_reference(self):
        indices = torch.randint(-1, 9, (T, 3))
        for begin, experts in ((0, 8), (2, 4)):
            with self.subTest(expert_begin=begin):
                got = _dispatch(indices, experts, expert_begin=begin)
                want = reference.dispatch_reference(indices, experts, begin)
                for name, tensor in got._asdict().items():
                    self.assertTrue(torch.equal(tensor, getattr(want, name)), name)

    def test_general_routing(self):
        tok_offsets = torch.tensor([0, 2, 2, 5, 6], dtype=torch.int32)
        indices = torch.tensor([0, 3, 1, 2, 3, 0, 7, 7], dtype=torch.int32)  # two slots past tok_offsets[T]
        got = _dispatch(indices, 4, tok_offsets=tok_offsets)
        want = reference.dispatch_reference(indices, 4, tok_offsets=tok_offsets)
        for name, tensor in got._asdict().items():
            self.assertTrue(torch.equal(tensor, getattr(want, name)), name)
        grouped = _randn(8, H)
        scores = _randn(8)
        assert_close(_combine(grouped, scores, got.grouped_pos, tok_offsets=tok_offsets),
                     reference.combine_reference(grouped, scores, got.grouped_pos, tok_offsets))

    @cpu_only("gradcheck needs fp64, which the CUDA backend does not store; combine and gather_tokens meet the fp64 "
              "oracle in the other tests")
    def test_combine_and_gather_tokens_gradcheck(self):
        routing = moekit.dispatch(torch.randint(-1, 4, (T, K)), 4)
        grouped = _randn(T * K, H).requires_grad_()
        scores = _randn(T, K).requires_grad_()
        x = _randn(T, H).requires_grad_()
        combine = lambda g, s: moekit.combine(g, s, routing.grouped_pos)  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(combine, (grouped, scores)))
        torch.testing.assert_close(combine(grouped, scores),
                                   reference.combine_reference(grouped, scores, routing.grouped_pos))
        gather = lambda t: moekit.gather_tokens(t, routing.gather_idx, routing.grouped_pos)  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(gather, (x,)))

    def test_the_expert_parallel_chain_is_the_layer(self):
        inputs = _moe_inputs()
        leaves = {name: t.requires_grad_() for name, t in inputs.items()}
        dout = _randn(T, H)
        out, routing = _moe(**leaves, return_routing=True)
        (out * dout).sum().backward()
        want = {name: t.grad.clone() for name, t in leaves.items()}
        for leaf in leaves.values():
            leaf.grad = None
        plan = _dispatch(routing.indices, E)
        rows = _gather_tokens(leaves["x"], plan.gather_idx, plan.grouped_pos)
        y = _experts(rows, plan.expert_offsets, leaves["w1"], leaves["w2"], b1=leaves["b1"], b2=leaves["b2"])
        chained = _combine(y, routing.scores, plan.grouped_pos)
        assert_close(chained, out.detach())
        (chained * dout).sum().backward()
        for name in ("w1", "b1", "w2", "b2"):
            assert_close(leaves[name].grad, want[name], msg=name)

    def test_bad_arguments_name_themselves(self):
        self.assert_names(ValueError, "indices", _dispatch, torch.zeros(T, dtype=torch.int64), E)
        self.assert_names(moekit.MoekitError, "indices", _dispatch, torch.zeros(T, K), E)
        routing = _dispatch(torch.zeros(T, K, dtype=torch.int64), E)
        self.assert_names(moekit.MoekitError, "grouped", _combine, _randn(T * K - 1, H), _randn(T, K),
                          routing.grouped_pos)


def _sparse(x, w_gate, w_up, w_down, **options):
    return on_device(moekit.sparse_swiglu)(x, w_gate, w_up, w_down, 16, 2, **options)


def _sparse_reference(x, w_gate, w_up, w_down, storage_dtype=layer_checks.DTYPE, **options):
    return reference.sparse_swiglu_reference(x, w_gate, w_up, w_down, 16, 2, storage_dtype, **options)


class SparseFfnOptions(Case):
    def _inputs(self, d_model=8, d_ff=64):
        return dict(x=_randn(T, d_model), w_gate=_randn(d_ff, d_model, scale=0.7),
                    w_up=_randn(d_ff, d_model, scale=0.5), w_down=_randn(d_model, d_ff, scale=0.3))

    def test_subsample_rows_and_the_load_balance_bias_against_the_reference(self):
        rows = moekit.subsample_rows(7, 4, 16, 5)
        bias = torch.randn(4) * 0.3
        for options in (dict(subsample_rows=rows), dict(lb_bias=bias), dict(subsample_rows=rows, lb_bias=bias)):
            with self.subTest(**{name: True for name in options}):
                inputs = self._inputs()
                self.assert_matches(_sparse, _sparse_reference, inputs, **options)
                _, got = _sparse(**inputs, return_selection=True, **options)
                _, want = _sparse_reference(**inputs, return_selection=True, **options)
                self.assertTrue(torch.equal(got.groups, want[0]))
                self.assertTrue(torch.equal(got.counts, want[1]))

    @cpu_only("gradcheck needs fp64, which the CUDA backend does not store; the options meet the fp64 oracle above")
    def test_gradcheck(self):
        inputs = self._inputs()
        leaves = [t.requires_grad_() for t in inputs.values()]
        rows, bias = moekit.subsample_rows(3, 4, 16, 8), torch.randn(4) * 0.3
        fn = lambda *t: _sparse(*t, subsample_rows=rows, lb_bias=bias)  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(fn, leaves))

    def test_subsample_rows_are_the_documented_draw(self):
        for seed, groups, size, rows in ((0, 3, 16, 16), (12345, 5, 32, 7), (2 ** 64 - 1, 2, 128, 1)):
            self.assertTrue(torch.equal(moekit.subsample_rows(seed, groups, size, rows),
                                        reference.subsample_rows_reference(seed, groups, size, rows)))
        self.assert_names(moekit.MoekitError, "rows_per_group", moekit.subsample_rows, 0, 4, 16, 17)

    def test_load_balance_update(self):
        counts = torch.tensor([0, 3, 40, 9, 200, 12], dtype=torch.int32)
        ema = torch.tensor([0.0, 0.1, 0.5, 0.2, 0.9, 0.35])
        bias = torch.tensor([0.0, 0.4999, -0.2, 0.1, -0.5, 0.3])
        want_ema, want_bias = reference.load_balance_reference(counts, ema, bias, 100.0, 2, 0.9, 0.01, 0.5)
        # In place on the device's tensors; fp32 there too, each step rounded as the reference rounds it.
        counts, ema, bias = to_device((counts, ema, bias))
        moekit.load_balance_update(counts, ema, bias, 100.0, 2, momentum=0.9, gamma=0.01)
        torch.testing.assert_close(ema.cpu(), want_ema)
        torch.testing.assert_close(bias.cpu(), want_bias)
        self.assert_names(moekit.MoekitError, "tokens", moekit.load_balance_update, counts, ema, bias, 0.0, 2)
        self.assert_names(moekit.MoekitError, "ema", moekit.load_balance_update, counts, ema[:3], bias, 1.0, 2)

    def test_the_module_keeps_its_subsample_and_bias(self):
        module = moekit.SparseSwiGLU(8, 64, 16, 2, layer_checks.DEVICE, layer_checks.DTYPE, subsample=4,
                                     subsample_seed=9, load_balance=True)
        self.assertIn("subsample_rows", module.state_dict())
        self.assertTrue(torch.equal(module.subsample_rows.cpu(), moekit.subsample_rows(9, 4, 16, 4)))
        x = _randn(3, T, 8)
        out, selection = on_device(module)(x, return_selection=True)
        weights = (w.detach().cpu().double() for w in (module.w_gate, module.w_up, module.w_down))
        want = _sparse_reference(x.reshape(-1, 8), *weights, subsample_rows=module.subsample_rows.cpu(),
                                 lb_bias=module.lb_bias.cpu())
        assert_close(out.reshape(-1, 8), want)
        self.assertEqual(int(selection.counts.sum()), 3 * T * 2)
        module.update_load_balance(to_device(selection.counts), 3 * T, gamma=0.1)
        ema, bias = reference.load_balance_reference(selection.counts, torch.zeros(4), torch.zeros(4), 3 * T, 2,
                                                     gamma=0.1)
        torch.testing.assert_close(module.lb_bias.cpu(), bias)
        torch.testing.assert_close(module.lb_ema.cpu(), ema)
        self.assert_names(ValueError, "lb_bias", moekit.SparseSwiGLU(8, 64, 16, 2).update_load_balance,
                          selection.counts, 1)
        self.assert_names(ValueError, "group_size", moekit.SparseSwiGLU, 8, 64, 24, 2)

    def test_the_moe_module_moves_its_router_bias(self):
        layer = moekit.MoELayer(H, I, E, K, layer_checks.DEVICE, layer_checks.DTYPE, router="sigmoid",
                                router_bias=True, renormalize=True, router_scale=2.0, bias=True,
                                activation="swiglu_oai", glu_layout="interleaved")
        x = _randn(2, T, H)
        out, routing = on_device(layer)(x, return_routing=True)
        parameters = {name: p.detach().cpu().double() for name, p in layer.named_parameters()}
        want = _moe_reference(x.reshape(-1, H), parameters["w_router"], parameters["w1"], parameters["w2"],
                              b1=parameters["b1"], b2=parameters["b2"], router="sigmoid", renormalize=True,
                              router_scale=2.0, router_bias=layer.router_bias.cpu(), activation="swiglu_oai",
                              glu_layout="interleaved")
        assert_close(out.reshape(-1, H), want)
        layer.update_router_bias(to_device(routing.counts), 2 * T, gamma=0.1)
        ema, bias = reference.load_balance_reference(routing.counts, torch.zeros(E), torch.zeros(E), 2 * T, K,
                                                     gamma=0.1)
        torch.testing.assert_close(layer.router_bias.cpu(), bias)
        torch.testing.assert_close(layer.router_bias_ema.cpu(), ema)
        self.assert_names(ValueError, "router_bias", moekit.MoELayer(H, I, E, K).update_router_bias,
                          routing.counts, 1)

    def test_the_biases_stay_fp32_when_the_module_is_cast(self):
        moe = moekit.MoELayer(H, I, E, K, router="sigmoid", router_bias=True).to(layer_checks.DEVICE, torch.bfloat16)
        sparse = moekit.SparseSwiGLU(H, 64, 16, 2, load_balance=True).to(layer_checks.DEVICE, layer_checks.DTYPE)
        for module, names in ((moe, ("router_bias", "router_bias_ema")), (sparse, ("lb_bias", "lb_ema"))):
            self.assertNotEqual(module.w1.dtype if module is moe else module.w_gate.dtype, torch.float32)
            for name in names:
                self.assertEqual(getattr(module, name).dtype, torch.float32, name)
                self.assertEqual(getattr(module, name).device.type, layer_checks.DEVICE.type, name)
        on_device(moe)(_randn(T, H, dtype=torch.bfloat16))
        on_device(sparse)(_randn(T, H))


if __name__ == "__main__":
    print("test_options: torch %s, library %s, on %s" % (torch.__version__, moekit.library_path(),
                                                         layer_checks.DEVICE))
    unittest.main(verbosity=2)
