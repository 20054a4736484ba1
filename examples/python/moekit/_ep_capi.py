"""ctypes view of moekit_ep.h, the expert-parallel layer's library libmoekit_ep (docs/ep.md).

libmoekit_ep is a library of its own over libmoekit, loaded at run time from, in order, the MOEKIT_EP_LIBRARY
environment variable, the folder of the libmoekit that _capi loaded (a wheel installs both there; a build tree puts
both in its top folder), or the loader's search path by its SONAME. libmoekit is loaded first, so that the EP
library's dependency on it is the very library the package uses. A build of moekit without it leaves `import
moekit` working: `load` raises NotSupportedError, saying where it looked.

The structs mirror the header field for field; each is filled by the library's own *_init function, which must
write the struct_size ctypes expects (checked at each call, and by examples/python/test_ep.py).
"""
import ctypes
import os
import threading

from . import _capi
from ._capi import MoeDesc, Tensor, c_double, c_int32, c_int64, c_size_t, c_void_p

SONAME = "libmoekit_ep.so.%d.%d" % (_capi.VERSION_MAJOR, _capi.VERSION_MINOR)

EXACT, CAPACITY = 0, 1  # moekit_ep_mode_t


def _tensors(*names):
    return [(name, Tensor) for name in names]


class EpDesc(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("layer", MoeDesc), ("mode", c_int32), ("capacity", c_int64)]


class EpFwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("x", "w_router", "router_bias", "w1", "b1", "w2", "b2", "out", "scores", "indices", "counts",
                   "dropped")
        + [("beta_out", c_double)]
    )


class EpBwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", c_size_t)]
        + _tensors("x", "dout", "w_router", "w1", "w2", "b2", "dx", "dw_router", "dw1", "db1", "dw2", "db2")
        + [("compute_input_grad", c_int32), ("compute_weight_grad", c_int32)]
        + [(name, c_double) for name in ("beta_dx", "beta_dw_router", "beta_dw1", "beta_db1", "beta_dw2", "beta_db2")]
    )


# The structs above by their names in moekit_ep.h, with their *_init functions.
STRUCTS = {
    "moekit_ep_desc_t": (EpDesc, "moekit_ep_desc_init"),
    "moekit_ep_fwd_args_t": (EpFwdArgs, "moekit_ep_fwd_args_init"),
    "moekit_ep_bwd_args_t": (EpBwdArgs, "moekit_ep_bwd_args_init"),
}

_P = ctypes.POINTER


def _run(args_type):
    """plan, &args, saved, saved_bytes, workspace, workspace_bytes, stream."""
    return [c_void_p, _P(args_type), c_void_p, c_size_t, c_void_p, c_size_t, c_void_p]


# name: (argument types); every function returns moekit_status_t unless listed in _RESTYPES (see _capi.bind).
_PROTOTYPES = {
    "moekit_ep_has_nccl": [],
    "moekit_ep_get_last_error": [ctypes.c_char_p, c_size_t],
    "moekit_ep_local_group_create": [c_int32, _P(c_void_p)],
    "moekit_ep_local_group_destroy": [c_void_p],
    "moekit_ep_comm_create_local": [c_void_p, c_int32, _P(c_void_p)],
    "moekit_ep_comm_create_nccl": [c_void_p, _P(c_void_p)],
    "moekit_ep_comm_destroy": [c_void_p],
    "moekit_ep_comm_rank": [c_void_p, _P(c_int32), _P(c_int32)],
    "moekit_ep_desc_init": [_P(EpDesc)],
    "moekit_ep_plan_create": [c_void_p, c_void_p, _P(EpDesc), _P(c_void_p)],
    "moekit_ep_plan_destroy": [c_void_p],
    "moekit_ep_plan_sizes": [c_void_p, _P(c_size_t), _P(c_size_t)],
    "moekit_ep_fwd_args_init": [_P(EpFwdArgs)],
    "moekit_ep_bwd_args_init": [_P(EpBwdArgs)],
    "moekit_ep_forward": _run(EpFwdArgs),
    "moekit_ep_backward": _run(EpBwdArgs),
}
_RESTYPES = {"moekit_ep_has_nccl": c_int32, "moekit_ep_get_last_error": c_size_t}

_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def library_path():
    """The libmoekit_ep that `load` opened, or would try now (see the module's docstring)."""
    if _lib_path is not None:
        return _lib_path
    if os.environ.get("MOEKIT_EP_LIBRARY"):
        return os.environ["MOEKIT_EP_LIBRARY"]
    folder = os.path.dirname(_capi.library_path())
    beside = os.path.join(folder, SONAME)
    return beside if folder and os.path.exists(beside) else SONAME


def load():
    """Loads libmoekit_ep once (after libmoekit) and returns the ctypes library; NotSupportedError where there is
    none to load."""
    global _lib, _lib_path
    with _lib_lock:
        if _lib is None:
            _capi.load()
            path = library_path()
            try:
                lib = _capi.bind(ctypes.CDLL(path), _PROTOTYPES, _RESTYPES)
            except OSError as error:
                raise _capi.NotSupportedError(
                    _capi.STATUS_NOT_SUPPORTED, "MOEKIT_STATUS_NOT_SUPPORTED",
                    "the expert-parallel layer needs libmoekit_ep (%s), which could not be loaded (%s): build the "
                    "CMake target moekit_ep, or set MOEKIT_EP_LIBRARY to its path" % (path, error)) from None
            _lib, _lib_path = lib, path
        return _lib


def check(status):
    """_capi.check with this component's last error."""
    _capi.check(status, load().moekit_ep_get_last_error)


def initialised(struct_type, init_name):
    """_capi.initialised for this component's structs."""
    lib = load()
    return _capi.initialised(struct_type, init_name, lib, lib.moekit_ep_get_last_error)
