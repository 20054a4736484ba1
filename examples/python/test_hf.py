"""moekit.hf.replace_moe_blocks on tiny random Mixtral, Qwen3-MoE (norm_topk_prob on and off) and OLMoE models built
from their configs (nothing downloaded): every sparse MoE block is replaced and shares the original parameters; each
replaced block's output and the gradients of its input, router and experts match the original block's in fp32 and
bf16; the whole causal LM's loss, logits and every parameter's gradient match the original model's in fp32, with
output_router_logits (the load-balancing loss) included; Mixtral's router jitter in training draws the block's
noise. On CPU tensors (moekit's reference backend); with MOEKIT_TEST_DEVICE=cuda on CUDA tensors, in bf16 alone and
the causal LMs of one layer (layer_checks.py). Run as test_moekit.py is (run_test.sh); exits 77 where torch cannot be
imported, and skips the cases where transformers cannot be (or is older than 5, whose fused experts moekit.hf reads):
on the CPU; off it that is a failure.
"""
import copy
import pathlib
import sys
import unittest

try:
    import torch
except ImportError as error:
    print("test_hf: torch cannot be imported (%s): skipped" % error)
    sys.exit(77)

try:
    import transformers
except ImportError:
    transformers = None

sys.path.append(str(pathlib.Path(__file__).resolve().parent))
import layer_checks  # noqa: E402
import moekit.hf  # noqa: E402

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K, VOCAB = 32, 16, 8, 2, 64
# relative error of the whole tensor, by dtype: the two compute the same math with other summation orders.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
# The causal LM's loss and aux loss, and every parameter's gradient (its logits: TOLERANCE), by dtype.
LM_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-3, 5e-2)}
# Those the device's layers store; the first for the whole model (fp32 on the CPU, bf16 on a GPU).
DTYPES = tuple(dtype for dtype in TOLERANCE if dtype in layer_checks.DTYPES)


def relative_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _common():
    return dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=VOCAB, num_experts_per_tok=TOP_K, max_position_embeddings=64)


def _models():
    """(name, config) of each model family, tiny."""
    if transformers is None:
        return []
    return [
        ("mixtral", transformers.MixtralConfig(intermediate_size=INTERMEDIATE, num_local_experts=EXPERTS,
                                               **_common())),
        ("qwen3_moe", transformers.Qwen3MoeConfig(moe_intermediate_size=INTERMEDIATE, intermediate_size=48,
                                                  num_experts=EXPERTS, norm_topk_prob=True, head_dim=8,
                                                  **_common())),
        ("qwen3_moe_unnormalised", transformers.Qwen3MoeConfig(moe_intermediate_size=INTERMEDIATE,
                                                               intermediate_size=48, num_experts=EXPERTS,
                                                               norm_topk_prob=False, head_dim=8, **_common())),
        ("olmoe", transformers.OlmoeConfig(intermediate_size=INTERMEDIATE, num_experts=EXPERTS, eos_token_id=None,
                                           **_common())),
    ]


def _build(config, seed, dtype):
    """The causal LM of `config`, with router weights large enough that the top-k gaps stand far above bf16's
    rounding (the default init, std 0.02, makes near-ties that round differently in two implementations)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                parameter.copy_(torch.randn_like(parameter, dtype=torch.float32) * 4.0 / HIDDEN ** 0.5)
            elif "experts" in name:
                parameter.copy_(torch.randn_like(parameter, dtype=torch.float32) / HIDDEN ** 0.5)
    return model.to(layer_checks.DEVICE)


def _block_names(model):
    return [name for name, module in model.named_modules() if type(module).__name__.endswith("SparseMoeBlock")]


@layer_checks.skip_unless(transformers is not None and int(transformers.__version__.split(".")[0]) >= 5,
                          "transformers 5+ is not installed")
class ReplaceMoeBlocks(unittest.TestCase):
    def test_every_block_is_replaced_over_the_same_parameters(self):
        for name, config in _models():
            with self.subTest(model=name):
                model = _build(config, 0, torch.float32)
                blocks = _block_names(model)
                before = dict(model.named_parameters())
                keys = list(model.state_dict())
                replaced = moekit.hf.replace_moe_blocks(model)
                self.assertEqual(replaced, blocks)
                self.assertEqual(len(replaced), config.num_hidden_layers)
                for block in replaced:
                    self.assertIsInstance(model.get_submodule(block), moekit.hf.MoEBlock)
                after = dict(model.named_parameters())
                self.assertEqual(list(after), list(before))
                for key, parameter in after.items():
                    self.assertIs(parameter, before[key], key)
                self.assertEqual(list(model.state_dict()), keys)
                self.assertEqual(moekit.hf.replace_moe_blocks(model), [])

    def test_block_output_and_gradients_match_the_original(self):
        for dtype in DTYPES:
            for name, config in _models():
                with self.subTest(model=name, dtype=dtype):
                    self._check_blocks(config, dtype)

    def _check_blocks(self, config, dtype):
        original = _build(config, 1, dtype)
        model = copy.deepcopy(original)
        moekit.hf.replace_moe_blocks(model)
        generator = torch.Generator().manual_seed(2)
        for block_name in _block_names(original):
            block, replacement = original.get_submodule(block_name), model.get_submodule(block_name)
            x = torch.randn(3, 7, HIDDEN, generator=generator).to(layer_checks.DEVICE, dtype)
            dout = torch.randn(3, 7, HIDDEN, generator=generator).to(layer_checks.DEVICE, dtype)
            results = []
            for module in (block, replacement):
                leaf = x.clone().requires_grad_()
                out = module(leaf)
                parameters = dict(module.named_parameters())
                grads = torch.autograd.grad((out.double() * dout.double()).sum(), [leaf, *parameters.values()])
                results.append(dict(out=out, dx=grads[0], **{"d" + k: g for k, g in zip(parameters, grads[1:])}))
            self.assertEqual(results[1]["out"].dtype, dtype)
            self.assertEqual(results[1].keys(), results[0].keys())
            for key in results[0]:
                error = relative_error(results[1][key], results[0][key])
                self.assertLessEqual(error, TOLERANCE[dtype], "%s %s %s" % (block_name, key, dtype))

    def test_causal_lm_loss_and_every_gradient_match_the_original(self):
        dtype = DTYPES[0]
        values, gradients = LM_TOLERANCE[dtype]
        for name, config in _models():
            with self.subTest(model=name, dtype=dtype):
                config.output_router_logits = True
                if dtype == torch.bfloat16:
                    # One layer: a later layer's router would read hidden states that the blocks' bf16 roundings
                    # set apart, and a near-tie there could route the two models differently.
                    config.num_hidden_layers = 1
                original = _build(config, 3, dtype)
                model = copy.deepcopy(original)
                moekit.hf.replace_moe_blocks(model)
                tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
                tokens = tokens.to(layer_checks.DEVICE)
                outputs = []
                for m in (original, model):
                    result = m(input_ids=tokens, labels=tokens)
                    result.loss.backward()
                    outputs.append(result)
                self.assertIsNotNone(outputs[1].aux_loss)
                self.assertEqual(len(outputs[1].router_logits), config.num_hidden_layers)
                torch.testing.assert_close(outputs[1].aux_loss, outputs[0].aux_loss, rtol=values, atol=1e-6)
                torch.testing.assert_close(outputs[1].loss, outputs[0].loss, rtol=values, atol=1e-6)
                self.assertLessEqual(relative_error(outputs[1].logits, outputs[0].logits), TOLERANCE[dtype])
                replaced = dict(model.named_parameters())
                for key, want in original.named_parameters():
                    self.assertLessEqual(relative_error(replaced[key].grad, want.grad), gradients, key)

    def test_mixtral_router_jitter_in_training_draws_as_the_block_does(self):
        config = _models()[0][1]
        config.router_jitter_noise = 0.2
        dtype = DTYPES[0]
        original = _build(config, 5, dtype).train()
        model = copy.deepcopy(original)
        moekit.hf.replace_moe_blocks(model)
        block_name = _block_names(original)[0]
        x = torch.randn(2, 5, HIDDEN, generator=torch.Generator().manual_seed(6)).to(layer_checks.DEVICE, dtype)
        outs = []
        for module in (original.get_submodule(block_name), model.get_submodule(block_name)):
            torch.manual_seed(7)  # the same noise, drawn by the same call
            outs.append(module(x.clone()))
        self.assertLessEqual(relative_error(outs[1], outs[0]), TOLERANCE[dtype])
        with torch.no_grad():
            model.eval()  # no jitter: another output
            self.assertFalse(torch.allclose(outs[1], model.get_submodule(block_name)(x)))

    def test_a_block_of_another_layout_is_refused(self):
        block = torch.nn.Module()
        block.gate = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        block.experts = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, INTERMEDIATE) for _ in range(EXPERTS))
        with self.assertRaises(ValueError) as caught:
            moekit.hf.MoEBlock(block, True)
        self.assertIn("gate_up_proj", str(caught.exception))


if __name__ == "__main__":
    print("test_hf: torch %s, transformers %s, on %s" % (torch.__version__,
                                                         transformers.__version__ if transformers else "missing",
                                                         layer_checks.DEVICE))
    unittest.main(verbosity=2)
