"""Handles, plans and tensor views: what every moekit call from PyTorch needs.

- One handle per device, made on first use: the reference backend for CPU tensors, the CUDA backend for a GPU's
  tensors. The C API allows one call at a time per handle (autograd may run a backward on another thread), so each
  handle carries a lock.
- Plans are cached by their descriptor (a plan holds the host decisions for one problem shape) and destroyed,
  before their handles, when the interpreter exits.
- A torch tensor becomes a moekit_tensor_t view of its memory (no copy); workspace and saved-activation buffers
  are uint8 tensors from PyTorch's allocator (the caching allocator on a GPU, which aligns to 512 bytes).
- On a GPU every call is enqueued on PyTorch's current stream of that device.
- With backward_overwrites_saved the backward writes dh over the saved buffer, so that buffer serves one backward
  only. The CUDA backend cannot tell a spent buffer from a fresh one (a second backward would compute garbage), so
  the spent buffers are recorded here, by device and address, and a second backward over one raises MoekitError on
  every device: see mark_saved_fresh and spend_saved.
"""
import atexit
import ctypes
import threading

import torch

from . import _capi

_DTYPES = {
    torch.bfloat16: _capi.DTYPE_BF16,
    torch.float16: _capi.DTYPE_FP16,
    torch.float32: _capi.DTYPE_FP32,
    torch.float64: _capi.DTYPE_FP64,
    torch.int32: _capi.DTYPE_INT32,
    torch.int64: _capi.DTYPE_INT64,
}


_TORCH_DTYPES = {value: key for key, value in _DTYPES.items()}


def torch_dtype(dtype):
    """The torch dtype of a moekit dtype; None for MOEKIT_DTYPE_INVALID (0), a descriptor's "the layer's dtype"."""
    return _TORCH_DTYPES.get(dtype)


def moekit_dtype(dtype):
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError("moekit has no dtype for %s" % dtype) from None


class Handle:
    def __init__(self, device):
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.raw = _capi.create_handle(_capi.BACKEND_CUDA, index)
        elif device.type == "cpu":
            self.raw = _capi.create_handle(_capi.BACKEND_REFERENCE, 0)
        else:
            raise _capi.NotSupportedError(_capi.STATUS_NOT_SUPPORTED, "MOEKIT_STATUS_NOT_SUPPORTED",
                                          "moekit runs on CPU (reference backend) and CUDA tensors, not %s" % device)
        self.lock = threading.Lock()


class Plan:
    """A plan with its sizes. `create` is a moekit_*_plan_create function, `desc` its filled descriptor.

    workspace_bytes serves every run (the building blocks take it); a layer's forward and backward each need only
    forward_workspace_bytes and backward_workspace_bytes (0 for an inference plan's backward)."""

    def __init__(self, handle, create, desc):
        lib = _capi.load()
        raw = ctypes.c_void_p()
        _capi.check(getattr(lib, create)(handle.raw, ctypes.byref(desc), ctypes.byref(raw)))
        self.raw = raw
        self.handle = handle
        workspace, saved = ctypes.c_size_t(), ctypes.c_size_t()
        _capi.check(lib.moekit_plan_workspace_size(raw, ctypes.byref(workspace)))
        _capi.check(lib.moekit_plan_saved_size(raw, ctypes.byref(saved)))
        self.workspace_bytes = workspace.value
        self.saved_bytes = saved.value
        forward, backward = ctypes.c_size_t(), ctypes.c_size_t()
        _capi.check(lib.moekit_plan_layer_workspace_sizes(raw, ctypes.byref(forward), ctypes.byref(backward)))
        self.forward_workspace_bytes = forward.value
        self.backward_workspace_bytes = backward.value


_handles = {}
_plans = {}
_cache_lock = threading.Lock()


def _device_key(device):
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def handle_for(device):
    device = _device_key(device)
    with _cache_lock:
        if device not in _handles:
            _handles[device] = Handle(device)
        return _handles[device]


def plan_for(device, create, desc_type, desc_init, fields):
    """The cached plan for these descriptor fields on this device (made on first use)."""
    device = _device_key(device)
    key = (device, create, tuple(sorted(fields.items())))
    handle = handle_for(device)
    with _cache_lock:
        if key not in _plans:
            desc = _capi.initialised(desc_type, desc_init)
            for name, value in fields.items():
                setattr(desc, name, value)
            _plans[key] = Plan(handle, create, desc)
        return _plans[key]


@atexit.register
def _release():
    lib = _capi.load() if (_plans or _handles) else None
    for plan in _plans.values():
        lib.moekit_plan_destroy(plan.raw)
    for handle in _handles.values():
        lib.moekit_handle_destroy(handle.raw)
    _plans.clear()
    _handles.clear()


def view(tensor):
    """moekit_tensor_t over a tensor's memory (shape and strides in elements, as both count them)."""
    if tensor is None:
        return _capi.Tensor()  # absent: NULL data, rank 0
    if tensor.dim() > _capi.MAX_RANK:
        raise ValueError("moekit views have at most %d dimensions, got %d" % (_capi.MAX_RANK, tensor.dim()))
    result = _capi.Tensor()
    result.data = tensor.data_ptr() or None
    result.dtype = moekit_dtype(tensor.dtype)
    result.rank = tensor.dim()
    for i, (size, stride) in enumerate(zip(tensor.shape, tensor.stride())):
        result.shape[i] = size
        result.stride[i] = stride
    if tensor.device.type == "cuda":
        result.device = _capi.Device(_capi.DEVICE_CUDA, tensor.device.index)
    else:
        result.device = _capi.Device(_capi.DEVICE_CPU, 0)
    return result


def stream_for(device):
    """PyTorch's current stream of a GPU as the cudaStream_t moekit takes; None (ignored) on the CPU."""
    if device.type == "cuda":
        return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
    return None


def buffer(nbytes, device):
    """Workspace or saved-activation memory from PyTorch's allocator (empty for 0 bytes: then NULL is passed)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


_spent_saved = set()  # (device, data_ptr) of the saved buffers a backward_overwrites_saved backward has spent
_spent_lock = threading.Lock()


def _saved_key(saved):
    return (_device_key(saved.device), saved.data_ptr())


def mark_saved_fresh(saved):
    """A training forward has just filled `saved`: a buffer at this address, spent before and freed since, is fresh
    again. An empty buffer (inference) is never recorded."""
    if saved.numel():
        with _spent_lock:
            _spent_saved.discard(_saved_key(saved))


def spend_saved(saved, backward):
    """Runs backward() (a backward_overwrites_saved backward over `saved`) once per filled buffer: raises
    MoekitError, naming "saved", where an earlier one has spent it. The buffer is claimed before the call (two
    threads cannot both pass) and stays spent once backward() returns; a call that raises gives it back."""
    if not saved.numel():
        return backward()
    key = _saved_key(saved)
    with _spent_lock:
        if key in _spent_saved:
            raise _capi.MoekitError(
                _capi.STATUS_INVALID_VALUE, "MOEKIT_STATUS_INVALID_VALUE",
                "saved: already spent by an earlier backward of this forward (backward_overwrites_saved=True writes "
                "dh over it); pass backward_overwrites_saved=False to run a graph's backward more than once "
                "(retain_graph=True, torch.autograd.gradcheck)")
        _spent_saved.add(key)
    try:
        return backward()
    except BaseException:
        with _spent_lock:
            _spent_saved.discard(key)
        raise


def run(plan, function, args, *pointer_and_sizes, device):
    """Calls a moekit run function under the handle's lock: function(plan, &args, <pointers and sizes>, stream)."""
    lib = _capi.load()
    with plan.handle.lock:
        _capi.check(getattr(lib, function)(plan.raw, ctypes.byref(args), *pointer_and_sizes, stream_for(device)))
