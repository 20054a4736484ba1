"""moekit from PyTorch through ctypes (no compiled extension): libmoekit.so's MoE layer and group-sparse SwiGLU FFN
as differentiable functions and nn.Modules, on CPU tensors (reference backend) and CUDA tensors (CUDA backend).

    import moekit
    layer = moekit.MoELayer(hidden=1024, intermediate=512, experts=32, top_k=4, device="cuda",
                            dtype=torch.bfloat16)
    out = layer(x)          # x [..., 1024]
    out.sum().backward()    # gradients of x, the router and the experts

libmoekit.so is found through MOEKIT_LIBRARY or the loader's path (see _capi). See docs/integration.md.
"""
from ._capi import MoekitError, NotSupportedError, load
from .functional import CUSTOM_OPS, moe, sparse_swiglu
from .modules import MoELayer, SparseSwiGLU

__all__ = ["MoELayer", "SparseSwiGLU", "moe", "sparse_swiglu", "MoekitError", "NotSupportedError", "load",
           "CUSTOM_OPS"]
