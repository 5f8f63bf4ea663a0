"""The DLPack Python protocol over ctypes: borrowing a caller's tensor
(`borrow`) and handing a ferrotron allocation out (`Tensor.__dlpack__`).

Borrowing (the consumer side of the protocol): `obj.__dlpack__()` gives a
PyCapsule named "dltensor_versioned" (DLPack 1.x, asked for with
`max_version=(1, 0)`) or "dltensor" (older producers). The binding takes
the pointer, renames the capsule "used_dltensor_versioned" /
"used_dltensor" (the protocol's mark that a consumer owns it: the capsule's
destructor then leaves the tensor alone), checks the tensor through
`ftn_dlpack_import` and, once the op's stream is synchronized, calls the
tensor's deleter exactly once. If the import refuses the tensor the deleter
is called at once, and the error raised.

Handing out (the producer side): a `Tensor` owns an `ftn_malloc`
allocation; its `__dlpack__` moves the allocation into a DLPack tensor
(`ftn_dlpack_export`) inside a capsule. A consumer such as
`numpy.from_dlpack` renames the capsule and calls the deleter when its
array dies; a capsule never consumed calls it from its destructor.
"""

import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16
from ctypes import c_uint32, c_uint64, c_void_p

from . import _lib
from ._lib import TensorView, check, invalid, lib, new

# ---------------------------------------------------------------- structs


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, c_void_p)


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", _DELETER)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p),
                ("deleter", _DELETER), ("flags", c_uint64), ("dl_tensor", DLTensor)]


assert ctypes.sizeof(DLManagedTensor) == 64 and ctypes.sizeof(DLManagedTensorVersioned) == 80

kDLCPU, kDLCUDA = 1, 2

# ---------------------------------------------------------------- capsules

# The names live as long as the module: PyCapsule_SetName keeps the pointer.
VERSIONED = b"dltensor_versioned"
LEGACY = b"dltensor"
USED_VERSIONED = b"used_dltensor_versioned"
USED_LEGACY = b"used_dltensor"

_api = ctypes.pythonapi
_IsValid = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_char_p)(("PyCapsule_IsValid", _api))
_GetPointer = ctypes.PYFUNCTYPE(c_void_p, ctypes.py_object, c_char_p)(
    ("PyCapsule_GetPointer", _api))
_SetName = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_char_p)(("PyCapsule_SetName", _api))
_CapsuleDestructor = ctypes.CFUNCTYPE(None, c_void_p)
_New = ctypes.PYFUNCTYPE(ctypes.py_object, c_void_p, c_char_p, _CapsuleDestructor)(
    ("PyCapsule_New", _api))
# In the destructor the capsule is dying: raw pointers, no references.
_IsValidRaw = ctypes.PYFUNCTYPE(c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", _api))
_GetPointerRaw = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", _api))


def _call_deleter(ptr, versioned):
    kind = DLManagedTensorVersioned if versioned else DLManagedTensor
    deleter = kind.from_address(ptr).deleter
    if deleter:  # NULL: nothing to release
        deleter(ptr)


def _capsule_destructor(capsule):
    # Unconsumed capsules (still named "dltensor*") own their tensor.
    for name, versioned in ((VERSIONED, True), (LEGACY, False)):
        if _IsValidRaw(capsule, name):
            _call_deleter(_GetPointerRaw(capsule, name), versioned)
            return


_DESTRUCTOR = _CapsuleDestructor(_capsule_destructor)


def _capsule_of(obj, op, arg):
    """`obj.__dlpack__()`, asking for DLPack 1.x first."""
    if not hasattr(obj, "__dlpack__"):
        raise invalid(op, arg, "an object with __dlpack__ (a NumPy array, a PyTorch / CuPy / "
                      "JAX tensor)", type(obj).__name__)
    try:
        return obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer older than the DLPack 1.0 Python API
        return obj.__dlpack__()
    except BufferError as e:
        raise invalid(op, arg, "a tensor its producer can export through DLPack", e) from None


class Borrowed:
    """A caller's tensor borrowed for one op (a context manager): `view` is
    the checked `ftnTensorView_t`; leaving the block calls the deleter (the
    caller synchronizes the stream first)."""

    def __init__(self, ctx, obj, op, arg):
        self.arg = arg
        capsule = _capsule_of(obj, op, arg)
        if _IsValid(capsule, VERSIONED):
            name, used, self.versioned = VERSIONED, USED_VERSIONED, True
        elif _IsValid(capsule, LEGACY):
            name, used, self.versioned = LEGACY, USED_LEGACY, False
        else:
            raise invalid(op, arg, 'a PyCapsule named "dltensor_versioned" or "dltensor"',
                          "another object from __dlpack__")
        self._ptr = _GetPointer(capsule, name)
        # Consumed: from here on the deleter is ours to call, exactly once.
        _SetName(capsule, used)
        self._capsule = capsule
        self.view = new(TensorView)
        try:
            check(lib.ftn_dlpack_import(ctx._h, self._ptr, int(self.versioned),
                                        ctypes.byref(self.view)))
        except _lib.FerrotronError as e:
            self.release()
            # Say which of the op's tensors it was; the C ABI's message follows.
            raise type(e)(e.status, "%s: tensor `%s`: %s" % (op, arg, e.message)) from None
        except BaseException:
            self.release()
            raise

    @property
    def shape(self):
        return tuple(self.view.shape[i] for i in range(self.view.ndim))

    @property
    def data(self):
        return self.view.data

    def release(self):
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            _call_deleter(ptr, self.versioned)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


# ---------------------------------------------------------------- outputs

DTYPE_SIZES = {0: 4, 1: 2, 2: 2, 3: 1, 4: 4, 5: 8}
DTYPE_NAMES = {0: "float32", 1: "float16", 2: "bfloat16", 3: "uint8", 4: "int32", 5: "int64"}


class Tensor:
    """Memory from `ftn_malloc` on a context, `shape` and `dtype` (an
    ftnDataType_t value). Until `__dlpack__` hands it out, the context owns
    it (freed by `close` or when this object is collected); afterwards the
    consumer's deleter frees it. One `__dlpack__` per Tensor (a second is a
    BufferError)."""

    def __init__(self, ctx, shape, dtype):
        self.ctx = ctx
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        n = 1
        for d in self.shape:
            n *= d
        self.numel = n
        p = c_void_p()
        # At least one byte: ftn_dlpack_export needs a live allocation.
        check(lib.ftn_malloc(ctx._h, ctypes.byref(p), max(1, n * DTYPE_SIZES[dtype])))
        self.ptr = p.value

    def close(self):
        if self.ptr is not None and self.ctx._h is not None:
            ptr, self.ptr = self.ptr, None
            check(lib.ftn_free(self.ctx._h, ptr))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __dlpack_device__(self):
        return (kDLCUDA, self.ctx.device) if self.ctx.backend == "cuda" else (kDLCPU, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if self.ptr is None:
            raise BufferError("ferrotron.Tensor: already exported (or closed)")
        if copy:
            raise BufferError("ferrotron.Tensor: copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("ferrotron.Tensor: lives on %r, asked for %r"
                              % (self.__dlpack_device__(), tuple(dl_device)))
        # The ops synchronize before returning a Tensor: no stream to wait on.
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        shape = (c_int64 * max(1, len(self.shape)))(*self.shape)
        out = c_void_p()
        check(lib.ftn_dlpack_export(self.ctx._h, self.ptr, self.dtype, len(self.shape), shape,
                                    int(versioned), ctypes.byref(out)))
        self.ptr = None  # the DLPack tensor owns the memory now
        return _New(out.value, VERSIONED if versioned else LEGACY, _DESTRUCTOR)

    def __repr__(self):
        return "ferrotron.Tensor(shape=%r, dtype=%s, %s)" % (
            self.shape, DTYPE_NAMES[self.dtype], "exported" if self.ptr is None else "owned")


__all__ = ["Borrowed", "Tensor", "DTYPE_SIZES", "DTYPE_NAMES", "_lib"]
