"""ctypes view of moekit.h: the structs, constants and functions the PyTorch layers use, and those of the experts on
token-major rows (for expert-parallel code that calls the C API itself).

Nothing is compiled: libmoekit.so is loaded at run time (dlopen) from, in order, the path given to `load`, the
MOEKIT_LIBRARY environment variable, the copy installed beside this file (a wheel's), or the loader's search path
(ldconfig, LD_LIBRARY_PATH) by its SONAME. The structs below mirror the header field for field;
examples/python/test_moekit.py checks their sizes against tests/abi/layout_lp64.txt, and every struct is filled by
the library's own *_init function, which then must have written the struct_size ctypes expects (checked at each
call).
"""
import ctypes
import os
import threading

c_int32, c_int64, c_uint32, c_uint64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint64
c_size_t, c_double, c_void_p = ctypes.c_size_t, ctypes.c_double, ctypes.c_void_p

VERSION_MAJOR, VERSION_MINOR = 0, 2
SONAME = "libmoekit.so.%d.%d" % (VERSION_MAJOR, VERSION_MINOR)  # 0.MINOR while MAJOR is 0
BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), SONAME)

try:
    from . import _build_info  # written by the wheel's build, beside the library it installs
except ImportError:
    _build_info = None

SUCCESS = 0
STATUS_INVALID_VALUE = 100
STATUS_VALIDATION_FAILED = 101
STATUS_NOT_SUPPORTED = 200
HANDLE_VALIDATE = 1

DTYPE_BF16, DTYPE_FP16, DTYPE_FP32, DTYPE_FP64, DTYPE_INT32, DTYPE_INT64 = 1, 2, 3, 4, 5, 6
DEVICE_CPU, DEVICE_CUDA = 1, 2
BACKEND_REFERENCE, BACKEND_CUDA = 0, 1
MAX_RANK = 4


class Device(ctypes.Structure):
    _fields_ = [("type", c_int32), ("index", c_int32)]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_int32),
        ("rank", c_int32),
        ("shape", c_int64 * MAX_RANK),
        ("stride", c_int64 * MAX_RANK),
        ("device", Device),
        ("reserved", c_uint64 * 2),
    ]


class HandleDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int32),
        ("device_index", c_int32),
        ("flags", c_uint32),
        ("num_threads", c_int32),
    ]


class MoeDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_tokens", c_int64),
        ("hidden", c_int64),
        ("intermediate", c_int64),
        ("router_experts", c_int64),
        ("experts", c_int64),
        ("expert_begin", c_int64),
        ("top_k", c_int64),
        ("activation", c_int32),
        ("glu_layout", c_int32),
        ("glu_limit", c_double),
        ("router", c_int32),
        ("renormalize", c_int32),
        ("router_scale", c_double),
        ("has_b1", c_int32),
        ("has_b2", c_int32),
        ("inference", c_int32),
        ("dtype", c_int32),
        ("weight_grad_dtype", c_int32),
        ("backward_overwrites_saved", c_int32),
        ("backward_scratch_in_dw1", c_int32),
        ("load_balance_coeff", c_double),
        ("z_loss_coeff", c_double),
    ]


def _tensors(*names):
    return [(name, Tensor) for name in names]


class MoeFwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("x", "w_router", "router_bias", "w1", "b1", "w2", "b2", "out", "scores", "indices", "counts")
        + [("beta_out", c_double)]
        + _tensors("load_balance_loss", "z_loss")
    )


class MoeBwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("x", "dout", "w_router", "w1", "w2", "b2", "dx", "dw_router", "dw1", "db1", "dw2", "db2")
        + [("compute_input_grad", c_int32), ("compute_weight_grad", c_int32)]
        + [(name, c_double) for name in ("beta_dx", "beta_dw_router", "beta_dw1", "beta_db1", "beta_dw2", "beta_db2")]
        + _tensors("dload_balance_loss", "dz_loss")
    )


class TokenExpertsFwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("x", "topk_idx", "topk_weights", "w1", "b1", "w2", "b2", "out")
        + [("beta_out", c_double)]
    )


class TokenExpertsBwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("x", "topk_idx", "topk_weights", "w1", "w2", "b2", "dout", "dx", "dtopk_weights", "dw1", "db1",
                   "dw2", "db2")
        + [("compute_input_grad", c_int32), ("compute_weight_grad", c_int32)]
        + [(name, c_double) for name in ("beta_dx", "beta_dw1", "beta_db1", "beta_dw2", "beta_db2")]
    )


class SparseFfnDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_tokens", c_int64),
        ("d_model", c_int64),
        ("d_ff", c_int64),
        ("group_size", c_int64),
        ("top_groups", c_int64),
        ("subsample", c_int64),
        ("dtype", c_int32),
        ("inference", c_int32),
        ("weight_grad_dtype", c_int32),
    ]


class SparseFfnFwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("x", "w_gate", "w_up", "w_down", "subsample_rows", "lb_bias", "out", "groups", "counts")
        + [("beta_out", c_double)]
    )


class SparseFfnBwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("x", "w_gate", "w_up", "w_down", "dout", "dx", "dw_gate", "dw_up", "dw_down")
        + [("compute_input_grad", c_int32), ("compute_weight_grad", c_int32)]
        + [(name, c_double) for name in ("beta_dx", "beta_dw_gate", "beta_dw_up", "beta_dw_down")]
    )


class DispatchDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_tokens", c_int64),
        ("top_k", c_int64),
        ("max_pairs", c_int64),
        ("experts", c_int64),
        ("expert_begin", c_int64),
    ]


class DispatchArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + _tensors("indices", "tok_offsets", "expert_offsets", "gather_idx",
                                                      "pair_idx", "grouped_pos")


class CombineDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_tokens", c_int64),
        ("top_k", c_int64),
        ("max_pairs", c_int64),
        ("hidden", c_int64),
        ("dtype", c_int32),
    ]


class CombineArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("grouped", "scores", "grouped_pos", "tok_offsets", "out")
        + [("beta", c_double)]
    )


class LoadBalanceArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("counts", "ema", "bias")
        + [("tokens", c_double), ("top_groups", c_int64), ("momentum", c_double), ("gamma", c_double),
           ("bias_max", c_double)]
    )


class ExpertsFwdArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + _tensors("x", "offsets", "w1", "b1", "w2", "b2", "y")


class ExpertsBwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("x", "offsets", "w1", "w2", "dy", "dx", "dw1", "db1", "dw2", "db2")
        + [("compute_input_grad", c_int32), ("compute_weight_grad", c_int32)]
        + [(name, c_double) for name in ("beta_dx", "beta_dw1", "beta_db1", "beta_dw2", "beta_db2")]
    )


# The structs above by their names in moekit.h (for the layout test).
STRUCTS = {
    "moekit_device_t": Device,
    "moekit_tensor_t": Tensor,
    "moekit_handle_desc_t": HandleDesc,
    "moekit_moe_desc_t": MoeDesc,
    "moekit_moe_fwd_args_t": MoeFwdArgs,
    "moekit_moe_bwd_args_t": MoeBwdArgs,
    "moekit_token_experts_fwd_args_t": TokenExpertsFwdArgs,
    "moekit_token_experts_bwd_args_t": TokenExpertsBwdArgs,
    "moekit_sparse_ffn_desc_t": SparseFfnDesc,
    "moekit_sparse_ffn_fwd_args_t": SparseFfnFwdArgs,
    "moekit_sparse_ffn_bwd_args_t": SparseFfnBwdArgs,
    "moekit_dispatch_desc_t": DispatchDesc,
    "moekit_dispatch_args_t": DispatchArgs,
    "moekit_combine_desc_t": CombineDesc,
    "moekit_combine_args_t": CombineArgs,
    "moekit_load_balance_args_t": LoadBalanceArgs,
    "moekit_experts_fwd_args_t": ExpertsFwdArgs,
    "moekit_experts_bwd_args_t": ExpertsBwdArgs,
}


class MoekitError(RuntimeError):
    """A moekit call that did not succeed: the status and the library's message."""

    def __init__(self, status, name, message):
        super().__init__("%s: %s" % (name, message))
        self.status, self.name, self.message = status, name, message


class NotSupportedError(MoekitError):
    """MOEKIT_STATUS_NOT_SUPPORTED: a valid request this build or device cannot serve (a caller may fall back)."""


class ValidationError(MoekitError):
    """MOEKIT_STATUS_VALIDATION_FAILED: a handle made with MOEKIT_HANDLE_VALIDATE found a bad value in a tensor."""


_P = ctypes.POINTER
_status = c_int32
# name: (argument types); every function here returns moekit_status_t unless listed in _RESTYPES.
_PROTOTYPES = {
    "moekit_get_version": [],
    "moekit_status_string": [_status],
    "moekit_get_last_error": [ctypes.c_char_p, c_size_t],
    "moekit_handle_desc_init": [_P(HandleDesc)],
    "moekit_handle_create": [_P(HandleDesc), _P(c_void_p)],
    "moekit_handle_destroy": [c_void_p],
    "moekit_plan_destroy": [c_void_p],
    "moekit_plan_workspace_size": [c_void_p, _P(c_size_t)],
    "moekit_plan_layer_workspace_sizes": [c_void_p, _P(c_size_t), _P(c_size_t)],
    "moekit_plan_saved_size": [c_void_p, _P(c_size_t)],
    "moekit_plan_describe": [c_void_p, ctypes.c_char_p, c_size_t],
    "moekit_moe_desc_init": [_P(MoeDesc)],
    "moekit_moe_plan_create": [c_void_p, _P(MoeDesc), _P(c_void_p)],
    "moekit_moe_fwd_args_init": [_P(MoeFwdArgs)],
    "moekit_moe_bwd_args_init": [_P(MoeBwdArgs)],
    "moekit_moe_forward": [c_void_p, _P(MoeFwdArgs), c_void_p, c_size_t, c_void_p, c_size_t, c_void_p],
    "moekit_moe_backward": [c_void_p, _P(MoeBwdArgs), c_void_p, c_size_t, c_void_p, c_size_t, c_void_p],
    "moekit_token_experts_plan_create": [c_void_p, _P(MoeDesc), _P(c_void_p)],
    "moekit_token_experts_fwd_args_init": [_P(TokenExpertsFwdArgs)],
    "moekit_token_experts_bwd_args_init": [_P(TokenExpertsBwdArgs)],
    "moekit_token_experts_forward": [c_void_p, _P(TokenExpertsFwdArgs), c_void_p, c_size_t, c_void_p, c_size_t,
                                     c_void_p],
    "moekit_token_experts_backward": [c_void_p, _P(TokenExpertsBwdArgs), c_void_p, c_size_t, c_void_p, c_size_t,
                                      c_void_p],
    "moekit_sparse_ffn_desc_init": [_P(SparseFfnDesc)],
    "moekit_sparse_ffn_plan_create": [c_void_p, _P(SparseFfnDesc), _P(c_void_p)],
    "moekit_sparse_ffn_fwd_args_init": [_P(SparseFfnFwdArgs)],
    "moekit_sparse_ffn_bwd_args_init": [_P(SparseFfnBwdArgs)],
    "moekit_sparse_ffn_forward": [c_void_p, _P(SparseFfnFwdArgs), c_void_p, c_size_t, c_void_p, c_size_t, c_void_p],
    "moekit_sparse_ffn_backward": [c_void_p, _P(SparseFfnBwdArgs), c_void_p, c_size_t, c_void_p, c_size_t, c_void_p],
    "moekit_experts_plan_create": [c_void_p, _P(MoeDesc), _P(c_void_p)],
    "moekit_experts_fwd_args_init": [_P(ExpertsFwdArgs)],
    "moekit_experts_bwd_args_init": [_P(ExpertsBwdArgs)],
    "moekit_experts_forward": [c_void_p, _P(ExpertsFwdArgs), c_void_p, c_size_t, c_void_p, c_size_t, c_void_p],
    "moekit_experts_backward": [c_void_p, _P(ExpertsBwdArgs), c_void_p, c_size_t, c_void_p, c_size_t, c_void_p],
    "moekit_dispatch_desc_init": [_P(DispatchDesc)],
    "moekit_dispatch_plan_create": [c_void_p, _P(DispatchDesc), _P(c_void_p)],
    "moekit_dispatch_args_init": [_P(DispatchArgs)],
    "moekit_dispatch": [c_void_p, _P(DispatchArgs), c_void_p, c_size_t, c_void_p],
    "moekit_combine_desc_init": [_P(CombineDesc)],
    "moekit_combine_plan_create": [c_void_p, _P(CombineDesc), _P(c_void_p)],
    "moekit_combine_args_init": [_P(CombineArgs)],
    "moekit_combine": [c_void_p, _P(CombineArgs), c_void_p, c_size_t, c_void_p],
    "moekit_broadcast_backward": [c_void_p, _P(CombineArgs), c_void_p, c_size_t, c_void_p],
    "moekit_load_balance_args_init": [_P(LoadBalanceArgs)],
    "moekit_load_balance_update": [c_void_p, _P(LoadBalanceArgs), c_void_p],
    "moekit_subsample_rows": [c_uint64, c_int64, c_int64, c_int64, _P(c_int32)],
}
_RESTYPES = {"moekit_get_version": c_int32, "moekit_status_string": ctypes.c_char_p, "moekit_get_last_error": c_size_t,
             "moekit_plan_describe": c_size_t}

_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def library_path():
    """The libmoekit.so that `load` opened, or would open now (see the module's docstring)."""
    if _lib_path is not None:
        return _lib_path
    return os.environ.get("MOEKIT_LIBRARY") or (BUNDLED if os.path.exists(BUNDLED) else SONAME)


def build_info():
    """How the library installed with the package was built: a dict of `version`, `cuda` (whether it has the CUDA
    backend), `cuda_architectures` (e.g. "90a") and `cuda_version` (the toolkit's); None where the package has no
    library of its own (run from the source tree)."""
    if _build_info is None:
        return None
    return {"version": _build_info.VERSION, "cuda": _build_info.CUDA,
            "cuda_architectures": _build_info.CUDA_ARCHITECTURES, "cuda_version": _build_info.CUDA_VERSION}


def cuda_build_note():
    """A sentence on the loaded library's CUDA build, for a CUDA handle that cannot be made; empty where the library
    is not the package's own (nothing is known of how it was built)."""
    if _build_info is None or _lib_path != BUNDLED:
        return ""
    if not _build_info.CUDA:
        return ("this moekit was built without the CUDA backend (no nvcc, or MOEKIT_CUDA=OFF); for CUDA tensors, "
                "install it again from source with nvcc on PATH")
    targets = ", ".join("sm_" + arch for arch in _build_info.CUDA_ARCHITECTURES.split(";"))
    return ("this moekit's CUDA backend is built for %s with CUDA %s: Hopper GPUs, compute capability 9.0 "
            "(H100, H200)" % (targets, _build_info.CUDA_VERSION))


def bind(lib, prototypes, restypes):
    """Sets the argument and result types of a ctypes library's functions: prototypes {name: argument types},
    restypes {name: result type} for those that return something else than moekit_status_t. Returns lib."""
    for name, argtypes in prototypes.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = restypes.get(name, _status)
    return lib


def load(path=None):
    """Loads libmoekit.so once (see the module's docstring for where from) and returns the ctypes library."""
    global _lib, _lib_path
    with _lib_lock:
        if _lib is None:
            path = path or library_path()
            lib = bind(ctypes.CDLL(path), _PROTOTYPES, _RESTYPES)
            version = lib.moekit_get_version()
            if version // 100 != VERSION_MAJOR * 100 + VERSION_MINOR:
                raise ImportError("%s is moekit %d; these bindings mirror moekit %d.%d"
                                  % (path, version, VERSION_MAJOR, VERSION_MINOR))
            _lib, _lib_path = lib, path
        return _lib


def check(status, last_error=None):
    """Raises MoekitError (NotSupportedError for NOT_SUPPORTED, ValidationError for VALIDATION_FAILED) unless status
    is success; the message is this thread's last error, read at once since it is thread-local. last_error: the
    function that holds it, of moekit_get_last_error's signature (a component's own, e.g. moekit_ep_get_last_error),
    else moekit_get_last_error."""
    if status == SUCCESS:
        return
    lib = load()
    last_error = last_error or lib.moekit_get_last_error
    length = last_error(None, 0)
    buffer = ctypes.create_string_buffer(length + 1)
    last_error(buffer, length + 1)
    name = lib.moekit_status_string(status).decode()
    error = {STATUS_NOT_SUPPORTED: NotSupportedError, STATUS_VALIDATION_FAILED: ValidationError}.get(status, MoekitError)
    raise error(status, name, buffer.value.decode(errors="replace"))


def create_handle(backend, device_index, flags=0):
    """A moekit_handle_t (as a c_void_p) for the backend and device; flags HANDLE_VALIDATE for the validation mode.
    A CUDA handle that this build or device cannot serve raises NotSupportedError whose message adds what the
    package's own library was built for."""
    desc = initialised(HandleDesc, "moekit_handle_desc_init")
    desc.backend, desc.device_index, desc.flags = backend, device_index, flags
    raw = c_void_p()
    try:
        check(load().moekit_handle_create(ctypes.byref(desc), ctypes.byref(raw)))
    except NotSupportedError as error:
        note = cuda_build_note() if backend == BACKEND_CUDA else ""
        if not note:
            raise
        raise NotSupportedError(error.status, error.name, "%s; %s" % (error.message, note)) from None
    return raw


def initialised(struct_type, init_name, lib=None, last_error=None):
    """A struct filled by the library's *_init function, after checking the library's idea of its size; lib and
    last_error: a component's ctypes library and its last-error function (see check), else libmoekit's."""
    value = struct_type()
    check(getattr(lib or load(), init_name)(ctypes.byref(value)), last_error)
    if value.struct_size != ctypes.sizeof(struct_type):
        raise ImportError("%s: the library's struct is %d bytes, these bindings' %d (a different moekit.h)"
                          % (struct_type.__name__, value.struct_size, ctypes.sizeof(struct_type)))
    return value
