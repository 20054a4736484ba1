"""moekit from PyTorch through ctypes (no compiled extension): libmoekit.so's MoE layer, its experts alone, dispatch and
combine, and the group-sparse SwiGLU FFN, with every option of the C API's layers, as differentiable functions and
nn.Modules, on CPU tensors (reference backend) and CUDA tensors (CUDA backend).

    import torch, moekit
    layer = moekit.MoELayer(hidden=1024, intermediate=512, experts=32, top_k=4, device="cuda",
                            dtype=torch.bfloat16)
    out = layer(x)          # x [..., 1024]
    out.sum().backward()    # gradients of x, the router and the experts

libmoekit.so is found through MOEKIT_LIBRARY, beside this package (a wheel installs it there) or on the loader's
path (see _capi). `import moekit` needs no torch: the layers import it when first used. See docs/integration.md.
"""
import importlib

from ._capi import MoekitError, NotSupportedError, ValidationError, build_info, library_path, load

# The names that need torch, by the module that defines them.
_TORCH_NAMES = dict(
    {name: "modules" for name in ("MoELayer", "Experts", "SparseSwiGLU")},
    **{name: "functional" for name in ("moe", "experts", "sparse_swiglu", "dispatch", "gather_tokens", "combine",
                                       "offsets_from_counts", "subsample_rows", "load_balance_update", "Routing",
                                       "AuxLosses", "Selection", "Dispatch", "CUSTOM_OPS")})

__all__ = sorted(_TORCH_NAMES) + ["MoekitError", "NotSupportedError", "ValidationError", "load", "library_path",
                                  "build_info"]


def __getattr__(name):
    if name not in _TORCH_NAMES:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    try:
        module = importlib.import_module("." + _TORCH_NAMES[name], __name__)
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        raise ModuleNotFoundError("moekit.%s needs PyTorch, which this Python cannot import" % name,
                                  name="torch") from error
    return getattr(module, name)


def __dir__():
    return sorted(set(globals()) | set(_TORCH_NAMES))
