"""The Python binding on the emulator, against NumPy float64 references.

Run: `python3 python/tests/test_ferrotron.py` (unittest; pytest also
collects it) with `python/` on PYTHONPATH (or not: the test adds it) and
libferrotron.so built (`cargo build -p ferrotron-ffi`; FERROTRON_LIB
overrides where it is looked for). PyTorch is optional: without it its
test is skipped and reported as such.
"""

import ctypes
import gc
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import ferrotron as ft  # noqa: E402
from ferrotron import _dlpack  # noqa: E402

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
    print("SKIPPED: torch not installed (the PyTorch test is skipped, not passed)")

RNG = np.random.default_rng(int(os.environ.get("FTN_SEED", "1234")))


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- references (float64)

K0, K1 = 0.79788456, 0.044715


def gelu_ref(z, kind="tanh"):
    if kind == "tanh":
        return 0.5 * z * (1 + np.tanh(K0 * z * (1 + K1 * z * z)))
    return 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))


def gelu_grad_ref(z):
    t = np.tanh(K0 * z * (1 + K1 * z * z))
    return 0.5 * z * (1 - t * t) * (K0 + 0.1070322243 * z * z) + 0.5 * (1 + t)


def softmax_ref(x, scale, mask=None, causal=False):
    z = x.astype(np.float64) * scale
    sq, sk = z.shape[-2:]
    keep = np.ones(z.shape, bool)
    if mask is not None:
        z = np.where(mask != 0, -10000.0, z)
        full = np.broadcast_to(mask != 0, z.shape).all(axis=-1, keepdims=True)
    if causal:
        keep = np.broadcast_to(np.tril(np.ones((sq, sk), bool)), z.shape)
        z = np.where(keep, z, -np.inf)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    y = e / e.sum(axis=-1, keepdims=True)
    if mask is not None:
        y = np.where(full, 0.0, y)  # fully masked rows: zeros (Apex / TE)
    return y


def layer_norm_ref(x, g, b, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b, mu[..., 0], 1 / np.sqrt(var[..., 0] + eps)


def rms_norm_ref(x, g, eps):
    x = x.astype(np.float64)
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x * r * g, r[..., 0]


def assert_close(test, got, want, tol, what):
    got = np.asarray(got, np.float64)
    err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    test.assertTrue(np.all(err <= tol), "%s: worst relative error %.3g > %g" % (what, err.max(), tol))


# ---------------------------------------------------------------- producers for the protocol tests


class CountingProducer:
    """A DLPack producer written here: its managed tensor (versioned or
    not) counts deleter calls; `device_type` may claim another device."""

    def __init__(self, array, versioned=True, device_type=_dlpack.kDLCPU):
        self.array = np.ascontiguousarray(array)
        self.deleted = 0
        self.versioned = versioned
        self._shape = (ctypes.c_int64 * self.array.ndim)(*self.array.shape)
        kind = _dlpack.DLManagedTensorVersioned if versioned else _dlpack.DLManagedTensor
        self.managed = kind()
        t = self.managed.dl_tensor
        t.data = self.array.ctypes.data
        t.device.device_type = device_type
        t.ndim = self.array.ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = 2, 32, 1
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        if versioned:
            self.managed.version.major = 1

        def deleter(_ptr):
            self.deleted += 1

        self._deleter = _dlpack._DELETER(deleter)
        self.managed.deleter = self._deleter
        self.capsule = None

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        name = _dlpack.VERSIONED if self.versioned else _dlpack.LEGACY
        null = ctypes.cast(None, _dlpack._CapsuleDestructor)
        self.capsule = _dlpack._New(ctypes.addressof(self.managed), name, null)
        return self.capsule

    def __dlpack_device__(self):
        return (self.managed.dl_tensor.device.device_type, 0)


class LegacyOnly:
    """A producer older than the DLPack 1.0 Python API: `__dlpack__` takes
    no `max_version` (and gives an unversioned "dltensor" capsule)."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, stream=None):
        return self.inner.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


def capsule_name(capsule):
    get = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName",
                                                                 ctypes.pythonapi))
    return get(capsule)


# ---------------------------------------------------------------- tests


class Ops(unittest.TestCase):
    def test_bias_gelu_fp32_tanh_and_erf(self):
        x, b = randn(7, 33), randn(33)
        z = x.astype(np.float64) + b
        y = ft.bias_gelu(x, b)
        self.assertIsInstance(y, np.ndarray)
        self.assertEqual((y.shape, y.dtype), (x.shape, np.float32))
        assert_close(self, y, gelu_ref(z), 1e-5, "bias_gelu tanh")
        assert_close(self, ft.bias_gelu(x, b, gelu="erf"), gelu_ref(z, "erf"), 1e-5, "erf")
        assert_close(self, ft.bias_gelu(x), gelu_ref(x.astype(np.float64)), 1e-5, "no bias")
        # 3-d input: the bias runs along the last dimension
        x3 = randn(2, 3, 33)
        assert_close(self, ft.bias_gelu(x3, b), gelu_ref(x3.astype(np.float64) + b), 1e-5, "3-d")

    def test_bias_gelu_fp16(self):
        x, b = randn(5, 16, dtype=np.float16), randn(16, dtype=np.float16)
        y = ft.bias_gelu(x, b)
        self.assertEqual(y.dtype, np.float16)
        z = x.astype(np.float64) + b.astype(np.float64)
        assert_close(self, y, gelu_ref(z), 2e-3, "bias_gelu fp16")

    def test_bias_gelu_backward(self):
        x, b, dy = randn(6, 20), randn(20), randn(6, 20)
        dx, db = ft.bias_gelu_backward(dy, x, b)
        want = dy.astype(np.float64) * gelu_grad_ref(x.astype(np.float64) + b)
        assert_close(self, dx, want, 1e-5, "dx")
        assert_close(self, db, want.sum(axis=0), 1e-4, "dbias")
        dx2, none = ft.bias_gelu_backward(dy, x)
        self.assertIsNone(none)
        assert_close(self, dx2, dy * gelu_grad_ref(x.astype(np.float64)), 1e-5, "dx, no bias")

    def test_scale_mask_softmax(self):
        x = randn(2, 3, 5, 7)
        assert_close(self, ft.scale_mask_softmax(x, scale=0.5), softmax_ref(x, 0.5), 1e-5, "plain")
        mask = (RNG.random((2, 1, 5, 7)) < 0.3).astype(np.uint8)
        mask[1, 0, 2, :] = 1  # a fully masked row: zeros
        y = ft.scale_mask_softmax(x, scale=0.5, mask=mask)
        assert_close(self, y, softmax_ref(x, 0.5, mask), 1e-5, "padding mask")
        self.assertTrue(np.all(y[1, :, 2, :] == 0))
        shared = mask[:1]
        assert_close(self, ft.scale_mask_softmax(x, mask=shared), softmax_ref(x, 1.0, shared),
                     1e-5, "broadcast mask")
        xs = randn(2, 2, 6, 6)
        yc = ft.scale_mask_softmax(xs, scale=2.0, causal=True)
        assert_close(self, yc, softmax_ref(xs, 2.0, causal=True), 1e-5, "causal")

    def test_layer_norm_and_rms_norm(self):
        x, g, b = randn(9, 40), randn(40), randn(40)
        y, mean, rstd = ft.layer_norm(x, g, b, eps=1e-5, return_stats=True)
        ry, rmu, rr = layer_norm_ref(x, g, b, 1e-5)
        assert_close(self, y, ry, 1e-5, "layer_norm")
        assert_close(self, mean, rmu, 1e-5, "mean")
        assert_close(self, rstd, rr, 1e-5, "rstd")
        assert_close(self, ft.layer_norm(x), layer_norm_ref(x, 1.0, 0.0, 1e-5)[0], 1e-5, "no affine")
        assert_close(self, ft.layer_norm(x, g, zero_centered_gamma=True),
                     layer_norm_ref(x, g + 1.0, 0.0, 1e-5)[0], 1e-5, "zero-centred gamma")
        y, r = ft.rms_norm(x, g, eps=1e-6, return_stats=True)
        ry, rr = rms_norm_ref(x, g, 1e-6)
        assert_close(self, y, ry, 1e-5, "rms_norm")
        assert_close(self, r, rr, 1e-5, "rms rstd")

    def test_grad_scaler_host_state_machine(self):
        s = ft.GradScaler(initial_scale=2.0 ** 16, growth_interval=3, hysteresis=2)
        # Megatron's DynamicGradScaler, written out
        scale, growth, hyst = 2.0 ** 16, 0, 2
        for found_inf in [False, False, True, True, False, False, False, True, False]:
            s.update(found_inf)
            if found_inf:
                growth, hyst = 0, hyst - 1
                if hyst <= 0:
                    scale = max(scale * 0.5, 1.0)
            else:
                growth += 1
                if growth == 3:
                    growth, hyst, scale = 0, 2, scale * 2.0
            self.assertEqual(s.state_dict(), {"scale": scale, "growth_tracker": growth,
                                              "hysteresis_tracker": hyst})
        self.assertEqual(ft.GradScaler().scale, 2.0 ** 32)
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.GradScaler(min_scale=-1.0)
        self.assertIn("ftn_grad_scaler_host_init", str(e.exception))


class BadInput(unittest.TestCase):
    def test_non_contiguous_is_a_named_error(self):
        x = randn(8, 6)
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.bias_gelu(x.T)
        msg = str(e.exception)
        self.assertIn("ftn_dlpack_import", msg)
        self.assertIn("strides", msg)
        self.assertIn("dimension 1", msg)
        with self.assertRaises(ft.InvalidArgumentError):
            ft.bias_gelu(x[:, ::2])
        # a contiguous copy works
        ft.bias_gelu(np.ascontiguousarray(x.T))

    def test_wrong_dtype_is_a_named_error(self):
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.bias_gelu(randn(3, 4, dtype=np.float64))
        self.assertIn("dl_tensor.dtype", str(e.exception))
        self.assertIn("64 bits", str(e.exception))
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.bias_gelu(randn(3, 4), randn(4, dtype=np.float16))
        self.assertIn("`bias`", str(e.exception))
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.bias_gelu(np.arange(12, dtype=np.int32).reshape(3, 4))
        self.assertIn("float32, float16 or bfloat16", str(e.exception))
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.scale_mask_softmax(randn(1, 1, 2, 2), mask=np.zeros((1, 1, 2, 2), bool))
        self.assertIn("mask", str(e.exception))

    def test_shapes_the_op_would_overrun_are_refused(self):
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.bias_gelu(randn(3, 4), randn(5))
        self.assertIn("4 elements", str(e.exception))
        with self.assertRaises(ft.InvalidArgumentError):
            ft.bias_gelu_backward(randn(3, 5), randn(3, 4))
        with self.assertRaises(ft.InvalidArgumentError):
            ft.scale_mask_softmax(randn(2, 3, 4))
        with self.assertRaises(ft.InvalidArgumentError):
            ft.scale_mask_softmax(randn(2, 1, 3, 3), mask=np.zeros((2, 1, 3, 4), np.uint8))
        # a C-side check (hidden 0) comes back with the C ABI's message
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.layer_norm(randn(3, 0))
        self.assertIn("ftn_layer_norm_forward", str(e.exception))

    def test_misaligned_data_is_a_named_error(self):
        raw = np.zeros(4 * 9, np.uint8)
        x = np.frombuffer(raw.data, np.float32, count=8, offset=2).reshape(2, 4)
        self.assertFalse(x.flags.aligned)
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.bias_gelu(x)
        self.assertIn("x", str(e.exception))

    def test_not_a_tensor(self):
        with self.assertRaises(ft.InvalidArgumentError) as e:
            ft.bias_gelu([[1.0, 2.0]])
        self.assertIn("__dlpack__", str(e.exception))

    def test_device_mismatch_is_a_named_error(self):
        p = CountingProducer(randn(2, 3), device_type=_dlpack.kDLCUDA)
        with self.assertRaises(ft.DeviceMismatchError) as e:
            ft.bias_gelu(p)
        self.assertIn("managed->dl_tensor.device", str(e.exception))
        self.assertEqual(p.deleted, 1)


class Protocol(unittest.TestCase):
    def test_consumed_capsule_is_renamed_and_its_deleter_called_once(self):
        for versioned in (True, False):
            x = randn(3, 4)
            p = CountingProducer(x, versioned=versioned)
            y = ft.bias_gelu(p)
            assert_close(self, y, gelu_ref(x.astype(np.float64)), 1e-5, "counting producer")
            self.assertEqual(p.deleted, 1)
            used = b"used_dltensor_versioned" if versioned else b"used_dltensor"
            self.assertEqual(capsule_name(p.capsule), used)
            del p.capsule
            gc.collect()
            self.assertEqual(p.deleted, 1)

    def test_refused_tensor_still_gets_its_deleter_once(self):
        p = CountingProducer(randn(2, 3))
        p.managed.dl_tensor.dtype.bits = 64
        with self.assertRaises(ft.InvalidArgumentError):
            ft.bias_gelu(p)
        self.assertEqual(p.deleted, 1)

    def test_legacy_producer(self):
        x = randn(3, 4)
        y = ft.bias_gelu(LegacyOnly(x))
        assert_close(self, y, gelu_ref(x.astype(np.float64)), 1e-5, "unversioned capsule")

    def test_export_moves_ownership(self):
        ctx = ft.Context("emu")
        x = randn(4, 5)
        y = ft.bias_gelu(x, stream=ctx.stream)
        ctx.close()  # y's memory left the context when it was exported
        assert_close(self, y, gelu_ref(x.astype(np.float64)), 1e-5, "after ctx.close")
        y[0, 0] = 1.0  # writable: flags 0

    def test_tensor_dlpack_paths(self):
        with ft.Context("emu") as ctx:
            t = ft.Tensor(ctx, (2, 3), 0)
            a = np.from_dlpack(LegacyOnly(t))  # an unversioned consumer
            self.assertEqual(a.shape, (2, 3))
            with self.assertRaises(BufferError):
                t.__dlpack__()
            u = ft.Tensor(ctx, (5,), 4)
            cap = u.__dlpack__(max_version=(1, 0))
            self.assertEqual(capsule_name(cap), b"dltensor_versioned")
            del cap  # never consumed: the capsule's destructor calls the deleter
            gc.collect()
            v = ft.Tensor(ctx, (), 0)
            self.assertEqual(np.from_dlpack(v).shape, ())
            w = ft.Tensor(ctx, (3,), 2)  # bfloat16: no NumPy dtype, stays a Tensor
            self.assertIn("bfloat16", repr(w))
            del a
            gc.collect()


@unittest.skipUnless(HAVE_TORCH, "torch not installed")
class Torch(unittest.TestCase):
    def test_torch_cpu_tensors(self):
        import torch

        x = torch.randn(4, 6)
        b = torch.randn(6)
        y = ft.bias_gelu(x, b)
        assert_close(self, y, gelu_ref(x.double().numpy() + b.double().numpy()), 1e-5, "torch")
        xb = x.to(torch.bfloat16)
        t = ft.bias_gelu(xb)
        self.assertIsInstance(t, ft.Tensor)
        yb = torch.from_dlpack(t)
        self.assertEqual(yb.dtype, torch.bfloat16)
        assert_close(self, yb.float().numpy(), gelu_ref(xb.double().numpy()), 1e-2, "bf16")
        with self.assertRaises(ft.InvalidArgumentError):
            ft.bias_gelu(x.t())


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    if result.skipped:
        print("SKIPPED: %d test(s): %s" % (len(result.skipped),
                                           "; ".join(r for _, r in result.skipped)))
    sys.exit(0 if result.wasSuccessful() else 1)
