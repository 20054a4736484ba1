"""The installed moekit wheel, run by python_wheel.sh in a fresh virtualenv with no torch:

    python python_wheel_check.py WHEEL

The wheel holds the package and its two libraries (libmoekit, libmoekit_ep), nothing else; `import moekit` loads
the library installed beside the package, compiles nothing and imports no torch; the metadata names the CUDA target; a CUDA handle from this
reference-only build is refused with the build's note (and a CUDA build's note names its target); and an MoE layer forward on the reference backend, in fp64
through the package's ctypes bindings, matches the layer worked out here in plain Python (docs/math.md section 3:
softmax over the top-k router logits, SwiGLU experts).
"""
import ctypes
import importlib.metadata
import math
import os
import sys
import types
import zipfile

import moekit
from moekit import _capi, _ep_capi

T, H, I, E, K = 3, 2, 1, 3, 2
X = [[1.0, -0.5], [0.25, 2.0], [-1.5, 0.75]]                        # [T, H]
W_ROUTER = [[0.5, -1.0], [-0.25, 0.75], [0.125, 0.5]]               # [E, H]
W1 = [[[0.3, -0.2], [0.1, 0.4]], [[-0.6, 0.5], [0.2, -0.1]], [[0.45, 0.15], [-0.35, 0.25]]]  # [E, 2I, H]: gate, up
W2 = [[[0.7], [-0.3]], [[0.9], [0.4]], [[-0.2], [0.65]]]            # [E, H, I]


def check_wheel_contents(wheel):
    payload = [name for name in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in name]
    strays = [name for name in payload if not name.startswith("moekit/")]
    assert not strays, "the wheel holds files outside the package: %s" % strays
    binaries = sorted(name for name in payload if not name.endswith(".py"))
    want = sorted("moekit/" + soname for soname in (_capi.SONAME, _ep_capi.SONAME))
    assert binaries == want, "the wheel's files other than modules: %s" % binaries


def check_import():
    assert "torch" not in sys.modules, "import moekit imported torch"
    assert os.path.dirname(moekit.__file__).startswith(sys.prefix), "moekit came from %s" % moekit.__file__
    assert moekit.library_path() == _capi.BUNDLED, moekit.library_path()
    version = moekit.load().moekit_get_version()
    assert moekit.library_path() == _capi.BUNDLED, moekit.library_path()
    _ep_capi.load()
    beside = os.path.join(os.path.dirname(_capi.BUNDLED), _ep_capi.SONAME)
    assert _ep_capi.library_path() == beside, _ep_capi.library_path()
    info = moekit.build_info()
    assert info["cuda"] is False and info["cuda_architectures"] == "", info
    installed = importlib.metadata.version("moekit")
    assert info["version"] == installed, (info, installed)
    major, minor, patch = (int(part) for part in installed.split("."))
    assert version == major * 10000 + minor * 100 + patch, (version, installed)
    summary = importlib.metadata.metadata("moekit")["Summary"]
    assert "sm_90a" in summary, summary


def check_cuda_refused():
    try:
        _capi.create_handle(_capi.BACKEND_CUDA, 0)
    except moekit.NotSupportedError as error:
        assert "built without the CUDA backend" in str(error), str(error)
    else:
        raise AssertionError("a reference-only build made a CUDA handle")


def check_cuda_note_of_a_cuda_build():
    """The note a CUDA build of the wheel adds, from its build info (this build has none to show)."""
    built = _capi._build_info
    _capi._build_info = types.SimpleNamespace(VERSION=built.VERSION, CUDA=True, CUDA_ARCHITECTURES="90a",
                                              CUDA_VERSION="13.0")
    try:
        note = _capi.cuda_build_note()
    finally:
        _capi._build_info = built
    assert "built for sm_90a with CUDA 13.0" in note, note


def view(values, shape, ctype=ctypes.c_double, dtype=_capi.DTYPE_FP64):
    """(buffer, moekit_tensor_t): a row-major CPU tensor holding `values` (flat)."""
    buffer = (ctype * len(values))(*values)
    tensor = _capi.Tensor()
    tensor.data = ctypes.addressof(buffer)
    tensor.dtype, tensor.rank = dtype, len(shape)
    stride = 1
    for axis in reversed(range(len(shape))):
        tensor.shape[axis], tensor.stride[axis] = shape[axis], stride
        stride *= shape[axis]
    tensor.device = _capi.Device(_capi.DEVICE_CPU, 0)
    return buffer, tensor


def flat(nested):
    return [v for item in nested for v in (flat(item) if isinstance(item, list) else [item])]


def aligned(nbytes, alignment=16):
    """(buffer, address): at least `nbytes` of memory aligned to `alignment` bytes, as moekit's buffers must be."""
    buffer = ctypes.create_string_buffer(nbytes + alignment)
    return buffer, (ctypes.addressof(buffer) + alignment - 1) // alignment * alignment


def moe_forward_through_moekit():
    lib = moekit.load()
    handle = _capi.create_handle(_capi.BACKEND_REFERENCE, 0)
    desc = _capi.initialised(_capi.MoeDesc, "moekit_moe_desc_init")
    desc.max_tokens, desc.hidden, desc.intermediate, desc.router_experts, desc.experts, desc.top_k = T, H, I, E, E, K
    desc.dtype, desc.inference = _capi.DTYPE_FP64, 1
    plan = ctypes.c_void_p()
    _capi.check(lib.moekit_moe_plan_create(handle, ctypes.byref(desc), ctypes.byref(plan)))
    workspace_bytes = ctypes.c_size_t()
    _capi.check(lib.moekit_plan_workspace_size(plan, ctypes.byref(workspace_bytes)))
    workspace, workspace_address = aligned(workspace_bytes.value)

    args = _capi.initialised(_capi.MoeFwdArgs, "moekit_moe_fwd_args_init")
    keep = []  # the buffers behind the views, alive until the call returns
    for name, values, shape in (("x", X, [T, H]), ("w_router", W_ROUTER, [E, H]), ("w1", W1, [E, 2 * I, H]),
                                ("w2", W2, [E, H, I]), ("out", [float("nan")] * (T * H), [T, H])):
        buffer, tensor = view(flat(values), shape)
        keep.append(buffer)
        setattr(args, name, tensor)
    _capi.check(lib.moekit_moe_forward(plan, ctypes.byref(args), None, 0, workspace_address, workspace_bytes.value,
                                       None))
    out = list(keep[-1])
    _capi.check(lib.moekit_plan_destroy(plan))
    _capi.check(lib.moekit_handle_destroy(handle))
    del workspace
    return [out[t * H:(t + 1) * H] for t in range(T)]


def moe_forward_in_python():
    dot = lambda a, b: sum(p * q for p, q in zip(a, b))  # noqa: E731
    silu = lambda v: v / (1.0 + math.exp(-v))  # noqa: E731
    out = []
    for x in X:
        logits = [dot(x, w) for w in W_ROUTER]
        top = sorted(range(E), key=lambda e: (-logits[e], e))[:K]  # descending, ties to the lower index
        weights = [math.exp(logits[e] - logits[top[0]]) for e in top]
        row = [0.0] * H
        for e, weight in zip(top, weights):
            a = silu(dot(x, W1[e][0])) * dot(x, W1[e][1])
            for h in range(H):
                row[h] += weight / sum(weights) * W2[e][h][0] * a
        out.append(row)
    return out


def main(wheel):
    check_wheel_contents(wheel)
    check_import()
    check_cuda_refused()
    check_cuda_note_of_a_cuda_build()
    got, want = moe_forward_through_moekit(), moe_forward_in_python()
    for t in range(T):
        for h in range(H):
            assert math.isclose(got[t][h], want[t][h], rel_tol=1e-12, abs_tol=1e-15), (t, h, got, want)
    print("python_wheel_check: %s from %s; MoE layer forward [%d, %d] on the reference backend matches (max |out| %.3f)"
          % (os.path.basename(wheel), moekit.library_path(), T, H, max(abs(v) for row in got for v in row)))


if __name__ == "__main__":
    main(sys.argv[1])
