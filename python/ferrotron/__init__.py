"""ferrotron from Python: a small ctypes binding over the C ABI
(`include/ferrotron.h`), no compiled extension.

Inputs are any object with `__dlpack__` (NumPy arrays on the emulator;
PyTorch / CuPy / JAX tensors on a CUDA context): they are borrowed through
`ftn_dlpack_import`, which checks device, dtype, strides and alignment.
Outputs are allocated by the library (`ftn_malloc`) and handed out through
`ftn_dlpack_export`: on the emulator they come back as NumPy arrays
(`numpy.from_dlpack`), except bfloat16, which NumPy lacks; on a CUDA
context, and for bfloat16, as a `ferrotron.Tensor` that any framework's
`from_dlpack` takes (`torch.from_dlpack(t)`). Every op synchronizes its
stream before it returns.

    import numpy as np, ferrotron as ft
    x = np.random.randn(4, 8).astype(np.float32)
    b = np.zeros(8, np.float32)
    y = ft.bias_gelu(x, b)                 # numpy array, gelu(x + b)

See docs/interop.md.
"""

import ctypes
import os
import weakref

from . import _lib
from ._dlpack import Borrowed, Tensor, DTYPE_NAMES
from ._lib import (BackendUnavailableError, DeviceMismatchError, FerrotronError,
                   InvalidArgumentError, KernelFailedError, check, invalid, lib, new)

__all__ = [
    "Context", "Stream", "Tensor", "GradScaler", "default_context", "bias_gelu",
    "bias_gelu_backward", "scale_mask_softmax", "layer_norm", "rms_norm", "version",
    "FerrotronError", "InvalidArgumentError", "DeviceMismatchError",
    "BackendUnavailableError", "KernelFailedError",
]

version = _lib.version
_BACKENDS = {"emu": 0, "cuda": 1, "auto": 2}
_FLOATS = (0, 1, 2)


class Context:
    """A device: `Context("emu")` (the CPU emulator), `Context("cuda", 0)`
    or `Context("auto")`. `close()` (or leaving a `with` block) destroys its
    streams and then the context, freeing what it allocated that was not
    handed out through DLPack."""

    def __init__(self, backend="emu", device=0):
        if backend not in _BACKENDS:
            raise invalid("ferrotron.Context", "backend", "'emu', 'cuda' or 'auto'",
                          repr(backend))
        h = ctypes.c_void_p()
        check(lib.ftn_context_create(_BACKENDS[backend], int(device), ctypes.byref(h)))
        self._h = h.value
        b = ctypes.c_int()
        check(lib.ftn_context_get_backend(self._h, ctypes.byref(b)))
        self.backend = "cuda" if b.value == 1 else "emu"
        self.device = int(device) if self.backend == "cuda" else 0
        self._streams = weakref.WeakSet()
        self._default = None

    @property
    def stream(self):
        """The context's default stream (created on first use)."""
        if self._default is None:
            self._default = Stream(self)
        return self._default

    def synchronize(self):
        check(lib.ftn_context_synchronize(self._h))

    def close(self):
        if self._h is None:
            return
        for s in list(self._streams):
            s.close()
        h, self._h = self._h, None
        check(lib.ftn_context_destroy(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return "ferrotron.Context(%r, %d)" % (self.backend, self.device)


class Stream:
    """An in-order queue of work on a context."""

    def __init__(self, ctx):
        h = ctypes.c_void_p()
        check(lib.ftn_stream_create(ctx._h, ctypes.byref(h)))
        self._h = h.value
        self.ctx = ctx
        ctx._streams.add(self)

    def synchronize(self):
        check(lib.ftn_stream_synchronize(self._h))

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            check(lib.ftn_stream_destroy(h))


_default_ctx = None


def default_context():
    """The context the ops use without `stream=`: the backend named by the
    FERROTRON_BACKEND environment variable ('emu' when unset)."""
    global _default_ctx
    if _default_ctx is None or _default_ctx._h is None:
        _default_ctx = Context(os.environ.get("FERROTRON_BACKEND", "emu"))
    return _default_ctx


def _stream(stream):
    return stream if stream is not None else default_context().stream


# ---------------------------------------------------------------- helpers


def _result(t):
    """A finished output: a NumPy array on the emulator (bfloat16 aside),
    else the Tensor for the caller's own from_dlpack."""
    if t.ctx.backend == "emu" and t.dtype != 2:
        import numpy

        return numpy.from_dlpack(t)
    return t


def _check_dtype(op, arg, b, dtype):
    if b.view.dtype != dtype:
        raise invalid(op, arg, "%s (as `x`)" % DTYPE_NAMES[dtype],
                      DTYPE_NAMES.get(b.view.dtype, b.view.dtype))


def _check_numel(op, arg, b, n, what):
    if b.view.numel != n:
        raise invalid(op, arg, "%d elements (%s)" % (n, what), "shape %r" % (b.shape,))


def _rows_cols(op, b):
    if b.view.ndim < 1:
        raise invalid(op, "x", "a tensor of at least 1 dimension", "a 0-d tensor")
    cols = b.view.shape[b.view.ndim - 1]
    rows = b.view.numel // cols if cols else 0
    return rows, cols


def _float_x(op, b):
    if b.view.dtype not in _FLOATS:
        raise invalid(op, "x", "float32, float16 or bfloat16",
                      DTYPE_NAMES.get(b.view.dtype, b.view.dtype))


class _Borrows:
    """Borrowed inputs of one op: released (deleters called) after the
    stream is synchronized, also when the op fails."""

    def __init__(self, stream, op):
        self.stream, self.op, self.items, self.outs = stream, op, [], []

    def __call__(self, obj, arg, optional=False):
        if obj is None:
            if optional:
                return None
            raise invalid(self.op, arg, "a tensor", "None")
        b = Borrowed(self.stream.ctx, obj, self.op, arg)
        self.items.append(b)
        return b

    def out(self, shape, dtype):
        t = Tensor(self.stream.ctx, shape, dtype)
        self.outs.append(t)
        return t

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.stream.synchronize()
            else:
                try:
                    self.stream.synchronize()
                except FerrotronError:
                    pass
                for t in self.outs:
                    t.close()
        finally:
            for b in self.items:
                b.release()
        return False


def _ptr(b):
    return None if b is None else b.data


_GELU = {"tanh": 0, "erf": 1}


def _gelu(op, gelu):
    if gelu not in _GELU:
        raise invalid(op, "gelu", "'tanh' or 'erf'", repr(gelu))
    return _GELU[gelu]


# ---------------------------------------------------------------- ops


def bias_gelu(x, bias=None, *, gelu="tanh", stream=None):
    """`gelu(x + bias)` over the last dimension of `x` (`bias`: that many
    elements, or None). fp32, fp16 or bf16; Megatron's tanh form by default."""
    op = "ferrotron.bias_gelu"
    s = _stream(stream)
    with _Borrows(s, op) as borrow:
        bx = borrow(x, "x")
        _float_x(op, bx)
        rows, cols = _rows_cols(op, bx)
        bb = borrow(bias, "bias", optional=True)
        if bb is not None:
            _check_dtype(op, "bias", bb, bx.view.dtype)
            _check_numel(op, "bias", bb, cols, "the last dimension of `x`")
        y = borrow.out(bx.shape, bx.view.dtype)
        d = new(_lib.BiasGeluDesc)
        d.dtype, d.gelu, d.rows, d.cols = bx.view.dtype, _gelu(op, gelu), rows, cols
        check(lib.ftn_bias_gelu_forward(s._h, ctypes.byref(d), bx.data, _ptr(bb), y.ptr))
    return _result(y)


def bias_gelu_backward(dy, x, bias=None, *, gelu="tanh", stream=None):
    """`(dx, dbias)`: `dx = dy * gelu'(x + bias)`, `dbias` the column sums
    of `dx` (None when `bias` is None)."""
    op = "ferrotron.bias_gelu_backward"
    s = _stream(stream)
    with _Borrows(s, op) as borrow:
        bx = borrow(x, "x")
        _float_x(op, bx)
        rows, cols = _rows_cols(op, bx)
        bdy = borrow(dy, "dy")
        _check_dtype(op, "dy", bdy, bx.view.dtype)
        _check_numel(op, "dy", bdy, bx.view.numel, "as `x`")
        bb = borrow(bias, "bias", optional=True)
        if bb is not None:
            _check_dtype(op, "bias", bb, bx.view.dtype)
            _check_numel(op, "bias", bb, cols, "the last dimension of `x`")
        dx = borrow.out(bx.shape, bx.view.dtype)
        db = borrow.out((cols,), bx.view.dtype) if bb is not None else None
        d = new(_lib.BiasGeluDesc)
        d.dtype, d.gelu, d.rows, d.cols = bx.view.dtype, _gelu(op, gelu), rows, cols
        check(lib.ftn_bias_gelu_backward(s._h, ctypes.byref(d), bdy.data, bx.data, _ptr(bb),
                                         dx.ptr, None if db is None else db.ptr))
    return _result(dx), (None if db is None else _result(db))


def scale_mask_softmax(x, *, scale=1.0, mask=None, causal=False, stream=None):
    """`softmax(mask(scale * x))` over the last dimension of `x`
    `[batch, heads, sq, sk]`. `mask`: uint8, nonzero = masked,
    `[batch, 1, sq, sk]` or `[1, 1, sq, sk]` (shared by the batch);
    `causal=True` instead keeps columns <= row (`sq == sk`)."""
    op = "ferrotron.scale_mask_softmax"
    s = _stream(stream)
    with _Borrows(s, op) as borrow:
        bx = borrow(x, "x")
        _float_x(op, bx)
        if bx.view.ndim != 4:
            raise invalid(op, "x", "a 4-d tensor [batch, heads, sq, sk]", "shape %r" % (bx.shape,))
        b, h, sq, sk = bx.shape
        d = new(_lib.SoftmaxDesc)
        d.dtype, d.batch, d.heads, d.sq, d.sk, d.scale = bx.view.dtype, b, h, sq, sk, scale
        bm = None
        if mask is not None and causal:
            raise invalid(op, "mask", "None with causal=True", "a mask")
        if mask is not None:
            bm = borrow(mask, "mask")
            if bm.view.dtype != 3:
                raise invalid(op, "mask", "uint8 (nonzero = masked)",
                              DTYPE_NAMES.get(bm.view.dtype, bm.view.dtype))
            if bm.shape == (1, 1, sq, sk) and b != 1:
                d.mask_broadcast = 1
            elif bm.shape != (b, 1, sq, sk):
                raise invalid(op, "mask", "shape %r or %r" % ((b, 1, sq, sk), (1, 1, sq, sk)),
                              "shape %r" % (bm.shape,))
            d.mask = 1
        elif causal:
            d.mask = 2
        y = borrow.out(bx.shape, bx.view.dtype)
        check(lib.ftn_softmax_forward(s._h, ctypes.byref(d), bx.data, _ptr(bm), y.ptr))
    return _result(y)


def _norm(op, x, gamma, beta, eps, zero_centered_gamma, return_stats, stream, rms):
    s = _stream(stream)
    with _Borrows(s, op) as borrow:
        bx = borrow(x, "x")
        _float_x(op, bx)
        rows, hidden = _rows_cols(op, bx)
        params = []
        for arg, obj in (("gamma", gamma),) + (() if rms else (("beta", beta),)):
            bp = borrow(obj, arg, optional=True)
            if bp is not None:
                _check_dtype(op, arg, bp, bx.view.dtype)
                _check_numel(op, arg, bp, hidden, "the last dimension of `x`")
            params.append(bp)
        d = new(_lib.NormDesc)
        d.dtype, d.rows, d.hidden, d.eps = bx.view.dtype, rows, hidden, eps
        d.zero_centered_gamma = int(bool(zero_centered_gamma))
        y = borrow.out(bx.shape, bx.view.dtype)
        rstd = borrow.out((rows,), 0)
        if rms:
            check(lib.ftn_rms_norm_forward(s._h, ctypes.byref(d), bx.data, _ptr(params[0]), y.ptr,
                                           rstd.ptr))
            stats = (rstd,)
        else:
            mean = borrow.out((rows,), 0)
            check(lib.ftn_layer_norm_forward(s._h, ctypes.byref(d), bx.data, _ptr(params[0]),
                                             _ptr(params[1]), y.ptr, mean.ptr, rstd.ptr))
            stats = (mean, rstd)
    if return_stats:
        return (_result(y),) + tuple(_result(t) for t in stats)
    for t in stats:
        t.close()
    return _result(y)


def layer_norm(x, gamma=None, beta=None, *, eps=1e-5, zero_centered_gamma=False,
               return_stats=False, stream=None):
    """LayerNorm over the last dimension; with `return_stats=True`,
    `(y, mean, rstd)` (fp32, one per row) for a backward."""
    return _norm("ferrotron.layer_norm", x, gamma, beta, eps, zero_centered_gamma,
                 return_stats, stream, rms=False)


def rms_norm(x, gamma=None, *, eps=1e-5, zero_centered_gamma=False, return_stats=False,
             stream=None):
    """RMSNorm over the last dimension; with `return_stats=True`,
    `(y, rstd)`."""
    return _norm("ferrotron.rms_norm", x, gamma, None, eps, zero_centered_gamma, return_stats,
                 stream, rms=True)


# ---------------------------------------------------------------- loss scaler


class GradScaler:
    """Megatron's dynamic loss scaler, the host state machine
    (`ftn_grad_scaler_host_*`). Keyword arguments override the defaults
    (initial_scale 2**32, min_scale 1, growth_factor 2, backoff_factor 0.5,
    growth_interval 1000, hysteresis 2)."""

    _FIELDS = ("initial_scale", "min_scale", "growth_factor", "backoff_factor",
               "growth_interval", "hysteresis")

    def __init__(self, **config):
        self.config = new(_lib.GradScalerConfig)
        check(lib.ftn_grad_scaler_config_default(ctypes.byref(self.config)))
        for k, v in config.items():
            if k not in self._FIELDS:
                raise invalid("ferrotron.GradScaler", k, "one of %s" % ", ".join(self._FIELDS),
                              repr(k))
            setattr(self.config, k, v)
        self.state = new(_lib.GradScalerState)
        check(lib.ftn_grad_scaler_host_init(ctypes.byref(self.config), ctypes.byref(self.state)))

    def update(self, found_inf):
        """One step: `found_inf` true after an overflow (skip that step)."""
        check(lib.ftn_grad_scaler_host_update(ctypes.byref(self.config),
                                              ctypes.byref(self.state), int(bool(found_inf))))

    @property
    def scale(self):
        return self.state.scale

    @property
    def growth_tracker(self):
        return self.state.growth_tracker

    @property
    def hysteresis_tracker(self):
        return self.state.hysteresis_tracker

    def state_dict(self):
        return {"scale": self.scale, "growth_tracker": self.growth_tracker,
                "hysteresis_tracker": self.hysteresis_tracker}
