"""Loading libferrotron and calling the C ABI: prototypes, errors, structs.

The library is the shared `libferrotron.so` built by the `ffi/` crate
(`cargo build -p ferrotron-ffi [--release]`). It is found through the
`FERROTRON_LIB` environment variable (a path to the file), else in
`$CARGO_TARGET_DIR/{release,debug}`, else in `target/{release,debug}` of the
repository this package lives in.
"""

import ctypes
import os
from ctypes import (
    POINTER,
    Structure,
    byref,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_void_p,
)

# ---------------------------------------------------------------- errors

_STATUS_NAMES = {
    0: "ftnSuccess",
    1: "ftnInvalidArgument",
    2: "ftnBackendUnavailable",
    3: "ftnKernelFailed",
    4: "ftnInvalidLaunch",
    5: "ftnDeviceMismatch",
    6: "ftnBackendError",
    7: "ftnInternalError",
}


class FerrotronError(RuntimeError):
    """A failed C ABI call: `status` (the ftnResult_t value), `status_name`
    and `message` (the library's last error, naming the function and the
    failing argument)."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = _STATUS_NAMES.get(status, "unknown status %d" % status)
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message))


class InvalidArgumentError(FerrotronError, ValueError):
    """ftnInvalidArgument (also raised by the binding's own shape checks)."""


class DeviceMismatchError(FerrotronError, ValueError):
    """ftnDeviceMismatch: a tensor on another device than the context's."""


class BackendUnavailableError(FerrotronError):
    """ftnBackendUnavailable: e.g. a CUDA context without a GPU."""


class KernelFailedError(FerrotronError):
    """ftnKernelFailed, reported by a synchronize."""


_ERRORS = {1: InvalidArgumentError, 2: BackendUnavailableError, 3: KernelFailedError,
           5: DeviceMismatchError}


def invalid(op, arg, expected, got):
    """The binding's own argument error, worded as the C ABI words its own."""
    return InvalidArgumentError(
        1, "%s: argument `%s`: expected %s, got %s" % (op, arg, expected, got))


# ---------------------------------------------------------------- loading


def _candidates():
    env = os.environ.get("FERROTRON_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", ".."))
    dirs = []
    if os.environ.get("CARGO_TARGET_DIR"):
        dirs.append(os.environ["CARGO_TARGET_DIR"])
    dirs.append(os.path.join(repo, "target"))
    out = []
    for d in dirs:
        for profile in ("release", "debug"):
            out.append(os.path.join(d, profile, "libferrotron.so"))
    return out


def _load():
    tried = _candidates()
    for path in tried:
        if os.path.exists(path):
            return ctypes.CDLL(path), path
    raise OSError(
        "libferrotron.so not found (tried: %s); build it with "
        "`cargo build -p ferrotron-ffi --release` or set FERROTRON_LIB" % ", ".join(tried))


lib, path = _load()

# ---------------------------------------------------------------- structs (ferrotron.h)

FTN_DLPACK_MAX_DIMS = 8


class BiasGeluDesc(Structure):
    _fields_ = [("size", c_size_t), ("dtype", c_int32), ("gelu", c_int32),
                ("rows", c_int64), ("cols", c_int64)]


class NormDesc(Structure):
    _fields_ = [("size", c_size_t), ("dtype", c_int32), ("zero_centered_gamma", c_int32),
                ("rows", c_int64), ("hidden", c_int64), ("eps", c_float),
                ("reserved", c_uint32)]


class SoftmaxDesc(Structure):
    _fields_ = [("size", c_size_t), ("dtype", c_int32), ("mask", c_int32),
                ("batch", c_int64), ("heads", c_int64), ("sq", c_int64), ("sk", c_int64),
                ("scale", c_float), ("mask_broadcast", c_int32)]


class GradScalerConfig(Structure):
    _fields_ = [("size", c_size_t), ("initial_scale", c_float), ("min_scale", c_float),
                ("growth_factor", c_float), ("backoff_factor", c_float),
                ("growth_interval", c_uint32), ("hysteresis", c_uint32)]


class GradScalerState(Structure):
    _fields_ = [("size", c_size_t), ("scale", c_float), ("growth_tracker", c_int32),
                ("hysteresis_tracker", c_int32), ("reserved", c_int32)]


class TensorView(Structure):
    _fields_ = [("size", c_size_t), ("data", c_void_p), ("dtype", c_int32),
                ("ndim", c_int32), ("shape", c_int64 * FTN_DLPACK_MAX_DIMS),
                ("numel", c_int64), ("read_only", c_int32), ("reserved", c_int32)]


# The sizes of ferrotron.h (version 1 of every struct): a drift is a bug here.
for _s, _n in ((BiasGeluDesc, 32), (NormDesc, 40), (SoftmaxDesc, 56),
               (GradScalerConfig, 32), (GradScalerState, 24), (TensorView, 104)):
    assert ctypes.sizeof(_s) == _n, (_s.__name__, ctypes.sizeof(_s), _n)


def new(struct):
    """A zeroed struct with `size` set, as the C ABI asks."""
    s = struct()
    s.size = ctypes.sizeof(struct)
    return s


# ---------------------------------------------------------------- prototypes

_H = c_void_p  # every handle is an opaque pointer

_PROTOS = {
    "ftn_get_last_error": (c_char_p, []),
    "ftn_get_version": (c_int, [POINTER(c_int)]),
    "ftn_context_create": (c_int, [c_int, c_int, POINTER(_H)]),
    "ftn_context_destroy": (c_int, [_H]),
    "ftn_context_get_backend": (c_int, [_H, POINTER(c_int)]),
    "ftn_context_synchronize": (c_int, [_H]),
    "ftn_malloc": (c_int, [_H, POINTER(c_void_p), c_size_t]),
    "ftn_free": (c_int, [_H, c_void_p]),
    "ftn_stream_create": (c_int, [_H, POINTER(_H)]),
    "ftn_stream_destroy": (c_int, [_H]),
    "ftn_stream_synchronize": (c_int, [_H]),
    "ftn_dlpack_import": (c_int, [_H, c_void_p, c_int, POINTER(TensorView)]),
    "ftn_dlpack_export": (c_int, [_H, c_void_p, c_int, c_int, POINTER(c_int64), c_int,
                                  POINTER(c_void_p)]),
    "ftn_bias_gelu_forward": (c_int, [_H, POINTER(BiasGeluDesc), c_void_p, c_void_p,
                                      c_void_p]),
    "ftn_bias_gelu_backward": (c_int, [_H, POINTER(BiasGeluDesc), c_void_p, c_void_p,
                                       c_void_p, c_void_p, c_void_p]),
    "ftn_softmax_forward": (c_int, [_H, POINTER(SoftmaxDesc), c_void_p, c_void_p, c_void_p]),
    "ftn_layer_norm_forward": (c_int, [_H, POINTER(NormDesc), c_void_p, c_void_p, c_void_p,
                                       c_void_p, c_void_p, c_void_p]),
    "ftn_rms_norm_forward": (c_int, [_H, POINTER(NormDesc), c_void_p, c_void_p, c_void_p,
                                     c_void_p]),
    "ftn_grad_scaler_config_default": (c_int, [POINTER(GradScalerConfig)]),
    "ftn_grad_scaler_host_init": (c_int, [POINTER(GradScalerConfig),
                                          POINTER(GradScalerState)]),
    "ftn_grad_scaler_host_update": (c_int, [POINTER(GradScalerConfig),
                                            POINTER(GradScalerState), c_int]),
}

for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


def last_error():
    return (lib.ftn_get_last_error() or b"").decode("utf-8", "replace")


def check(status):
    """Raises the FerrotronError of a non-zero status, with the last error."""
    if status != 0:
        raise _ERRORS.get(status, FerrotronError)(status, last_error())


def version():
    v = c_int()
    check(lib.ftn_get_version(byref(v)))
    return v.value
