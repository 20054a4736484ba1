"""moekit in place of the MoE blocks of Hugging Face transformers models:

    import moekit.hf
    model = transformers.AutoModelForCausalLM.from_pretrained(...)
    replaced = moekit.hf.replace_moe_blocks(model)    # the names of the blocks now run by moekit

Mixtral (MixtralSparseMoeBlock), Qwen3-MoE (Qwen3MoeSparseMoeBlock) and OLMoE (OlmoeSparseMoeBlock) blocks become a
MoEBlock that runs the block as one moekit MoE layer (moekit.moe) on the block's own parameters: the router
`gate.weight` [E, H] is moekit's w_router, the fused experts' `gate_up_proj` [E, 2I, H] (gate rows, then up rows)
its w1 with glu_layout "concat", `down_proj` [E, H, I] its w2. Nothing is copied: the MoEBlock holds the original
`gate` and `experts` modules, so the parameters, their names in the state dict, checkpoints and optimizers stay as
they were. These are the blocks of transformers 5 (experts as fused 3-D parameters); older releases, with one
nn.Linear per expert, are refused with a ValueError.

The router math is the block's: a softmax over all experts' logits, then the top-k of it (moekit's "topk_softmax"),
and, where the block renormalises the k scores to sum 1 (Mixtral always; Qwen3-MoE and OLMoE with norm_topk_prob),
the softmax over the k selected logits ("softmax_topk", the same values). Mixtral's router jitter (training with
router_jitter_noise > 0) is applied as the block applies it. Where the model records the router's logits
(output_router_logits, for the load-balancing loss), the block's own router runs too, for that record only.
"""
import importlib

import torch

from . import functional

# (module of transformers.models, block class, whether the block renormalises the top-k scores always).
_BLOCKS = (
    ("mixtral.modeling_mixtral", "MixtralSparseMoeBlock", True),
    ("qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock", False),
    ("olmoe.modeling_olmoe", "OlmoeSparseMoeBlock", False),
)

# The experts' act_fn (transformers.activations.ACT2FN) by class name -> moekit's gated activation.
_ACTIVATIONS = {"SiLU": "swiglu", "SiLUActivation": "swiglu", "GELUTanh": "geglu", "NewGELUActivation": "geglu",
                "ReLU": "reglu"}


def _block_classes():
    """{block class: renormalises always} for the blocks this transformers has."""
    classes = {}
    for module_name, class_name, renormalise in _BLOCKS:
        try:
            module = importlib.import_module("transformers.models." + module_name)
        except ImportError:
            continue
        if hasattr(module, class_name):
            classes[getattr(module, class_name)] = renormalise
    return classes


class MoEBlock(torch.nn.Module):
    """A transformers MoE block run by moekit: forward(hidden_states [..., H]) -> [..., H], as the block's. Holds
    the block's `gate` (router) and `experts` modules and reads their parameters at every call."""

    def __init__(self, block, renormalize_always):
        super().__init__()
        gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
        if not (hasattr(gate, "weight") and hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj")
                and set(dict(block.named_children())) == {"gate", "experts"}):
            raise ValueError("%s: expected a router `gate.weight` and fused experts `experts.gate_up_proj`, "
                             "`experts.down_proj` (transformers 5); this block has another layout"
                             % type(block).__name__)
        if getattr(experts, "has_bias", False):
            raise ValueError("%s: experts with biases are not supported" % type(block).__name__)
        act_name = type(experts.act_fn).__name__
        if act_name not in _ACTIVATIONS:
            raise ValueError("%s: the experts' activation %s has no moekit equivalent (known: %s)"
                             % (type(block).__name__, act_name, ", ".join(sorted(_ACTIVATIONS))))
        for name, child in block.named_children():  # in the block's order, as its parameters were listed
            self.add_module(name, child)
        self.top_k = gate.top_k
        self.renormalize = bool(renormalize_always or getattr(gate, "norm_topk_prob", False))
        self.activation = _ACTIVATIONS[act_name]
        self.jitter_noise = getattr(block, "jitter_noise", 0.0)
        self.block_class = type(block).__name__

    def forward(self, hidden_states):
        if self.training and self.jitter_noise > 0:
            hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(1.0 - self.jitter_noise,
                                                                                     1.0 + self.jitter_noise)
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])
        if self.gate._forward_hooks:
            self.gate(tokens)  # the router's logits for the hooks that record them; moekit routes on its own
        out = functional.moe(tokens, self.gate.weight, self.experts.gate_up_proj, self.experts.down_proj,
                             self.top_k, router="softmax_topk" if self.renormalize else "topk_softmax",
                             activation=self.activation, glu_layout="concat")
        return out.reshape(hidden_states.shape)

    def extra_repr(self):
        experts, width, hidden = self.experts.gate_up_proj.shape
        return "%s: hidden=%d, intermediate=%d, experts=%d, top_k=%d, renormalize=%s, activation=%s" % (
            self.block_class, hidden, width // 2, experts, self.top_k, self.renormalize, self.activation)


def replace_moe_blocks(model):
    """Replaces, in place, every Mixtral, Qwen3-MoE and OLMoE sparse MoE block of `model` (any nn.Module) by a
    MoEBlock over the same parameters; returns the qualified names of the replaced blocks (empty if none)."""
    classes = _block_classes()
    targets = [(name, module) for name, module in model.named_modules() if name and type(module) in classes]
    for name, block in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        replacement = MoEBlock(block, classes[type(block)])
        replacement.train(block.training)
        setattr(parent, child, replacement)
    return [name for name, _ in targets]
