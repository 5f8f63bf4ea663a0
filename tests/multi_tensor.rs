//! Multi-tensor unscale, L2 norm and clipping against the float64 oracle and
//! against the exact fp32 arithmetic: mixed fp32/fp16/bf16 lists with empty
//! tensors, one huge tensor, 1000 tiny tensors; found_inf on one planted
//! NaN / inf among 100 tensors; determinism; argument validation.

mod common;

use common::{assert_close, devices, Rng};
use ferrotron::core::dtype::FloatElement;
use ferrotron::ops::multi_tensor::{DeviceGradScaler, GradRef, MultiTensor, TensorRef};
use ferrotron::reference::multi_tensor as oracle;
use ferrotron::{DType, Device, DeviceBuffer, Stream};
use half::{bf16, f16};

/// A gradient of any of the three dtypes.
enum Buf {
    F32(DeviceBuffer<f32>),
    F16(DeviceBuffer<f16>),
    BF16(DeviceBuffer<bf16>),
}

impl Buf {
    fn grad(&mut self) -> GradRef<'_> {
        match self {
            Buf::F32(b) => b.into(),
            Buf::F16(b) => b.into(),
            Buf::BF16(b) => b.into(),
        }
    }
    fn tensor(&self) -> TensorRef<'_> {
        match self {
            Buf::F32(b) => b.into(),
            Buf::F16(b) => b.into(),
            Buf::BF16(b) => b.into(),
        }
    }
    fn dtype(&self) -> DType {
        self.tensor().dtype()
    }
    fn host(&self) -> Vec<f64> {
        match self {
            Buf::F32(b) => common::to_f64(&b.to_host().unwrap()),
            Buf::F16(b) => common::to_f64(&b.to_host().unwrap()),
            Buf::BF16(b) => common::to_f64(&b.to_host().unwrap()),
        }
    }
    /// A new buffer of the same dtype holding `v` (rounded).
    fn like(&self, dev: &Device, v: &[f64]) -> Buf {
        match self {
            Buf::F32(_) => Buf::F32(upload(dev, &conv::<f32>(v))),
            Buf::F16(_) => Buf::F16(upload(dev, &conv::<f16>(v))),
            Buf::BF16(_) => Buf::BF16(upload(dev, &conv::<bf16>(v))),
        }
    }
    /// `x` rounded to this buffer's dtype, in f64.
    fn round(&self, x: f32) -> f64 {
        match self {
            Buf::F32(_) => x as f64,
            Buf::F16(_) => f16::from_f32(x).to_f64(),
            Buf::BF16(_) => bf16::from_f32(x).to_f64(),
        }
    }
}

fn conv<T: FloatElement>(v: &[f64]) -> Vec<T> {
    v.iter().map(|&x| T::from_f64(x)).collect()
}

fn upload<T: FloatElement>(dev: &Device, v: &[T]) -> DeviceBuffer<T> {
    dev.upload(v).unwrap()
}

/// A list of tensors of `sizes`, dtypes cycling fp32, fp16, bf16 from
/// `first`, values `scale * N(0, 1)`; returns the buffers and their values.
fn make_list(
    dev: &Device,
    rng: &mut Rng,
    sizes: &[usize],
    first: usize,
    scale: f64,
) -> (Vec<Buf>, Vec<Vec<f64>>) {
    let mut bufs = Vec::new();
    let mut vals = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let (b, v) = match (i + first) % 3 {
            0 => {
                let (h, f) = rng.tensor::<f32>(n, scale);
                (Buf::F32(upload(dev, &h)), f)
            }
            1 => {
                let (h, f) = rng.tensor::<f16>(n, scale);
                (Buf::F16(upload(dev, &h)), f)
            }
            _ => {
                let (h, f) = rng.tensor::<bf16>(n, scale);
                (Buf::BF16(upload(dev, &h)), f)
            }
        };
        bufs.push(b);
        vals.push(v);
    }
    (bufs, vals)
}

fn grads(bufs: &mut [Buf]) -> Vec<GradRef<'_>> {
    bufs.iter_mut().map(Buf::grad).collect()
}

fn tensors(bufs: &[Buf]) -> Vec<TensorRef<'_>> {
    bufs.iter().map(Buf::tensor).collect()
}

fn flag(stream: &Stream, v: f32) -> DeviceBuffer<f32> {
    let mut b = stream.device().alloc_zeros::<f32>(1).unwrap();
    stream.copy_from_host(&[v], &mut b).unwrap();
    b
}

fn read1(b: &DeviceBuffer<f32>) -> f32 {
    b.to_host().unwrap()[0]
}

/// Unscales the list and checks every tensor against the f64 oracle and
/// bitwise against `T(fp32(x) * inv_scale)`; found_inf stays 0.
fn unscale_case(dev: &Device, what: &str, sizes: &[usize], salt: u64) {
    let (mut rng, seed) = Rng::new(salt);
    let scale = (256.0 + 4096.0 * rng.uniform()) as f32; // not a power of two
    let (mut bufs, vals) = make_list(dev, &mut rng, sizes, salt as usize, scale as f64);
    let stream = dev.new_stream().unwrap();
    let mut found = flag(&stream, 0.0);
    let mut mt = MultiTensor::new();
    mt.unscale(&stream, &mut grads(&mut bufs), scale, &mut found)
        .unwrap();
    stream.synchronize().unwrap();
    let inv = oracle::inv_scale(scale);
    let (reference, any_bad) = oracle::scale(&vals, inv as f64);
    assert!(!any_bad);
    assert_eq!(
        read1(&found),
        0.0,
        "{what}: found_inf set on a clean list (seed {seed})"
    );
    for (i, (b, v)) in bufs.iter().zip(&vals).enumerate() {
        let out = b.host();
        assert_close(
            &format!("{what}: tensor {i} ({} elements) on {dev:?}", v.len()),
            b.dtype(),
            seed,
            &out,
            &reference[i],
        );
        for (j, (&o, &x)) in out.iter().zip(v).enumerate() {
            let want = b.round(x as f32 * inv);
            assert!(
                o == want,
                "{what}: tensor {i} [{j}]: {o} != {want} = {:?}({x} * {inv}) (seed {seed})",
                b.dtype()
            );
        }
    }
}

#[test]
fn unscale_mixed_list_with_awkward_sizes() {
    let sizes = [0, 1, 7, 8, 2047, 16383, 16384, 16385, 0, 40_001, 3, 0];
    for dev in devices("unscale_mixed_list_with_awkward_sizes", 1) {
        for first in 0..3 {
            unscale_case(&dev, "mixed list", &sizes, 11 + first);
        }
    }
}

#[test]
fn unscale_one_huge_tensor() {
    for dev in devices("unscale_one_huge_tensor", 1) {
        unscale_case(&dev, "huge fp32 tensor", &[(1 << 22) + 5], 21);
        unscale_case(&dev, "huge fp16 tensor", &[(1 << 21) + 3], 22);
    }
}

#[test]
fn unscale_a_thousand_tiny_tensors() {
    let (mut rng, _) = Rng::new(31);
    let sizes: Vec<usize> = (0..1000).map(|_| (rng.next_u64() % 40) as usize).collect();
    for dev in devices("unscale_a_thousand_tiny_tensors", 1) {
        unscale_case(&dev, "1000 tiny tensors", &sizes, 32);
    }
}

#[test]
fn unscale_with_device_scaler_equals_host_scale() {
    for dev in devices("unscale_with_device_scaler_equals_host_scale", 1) {
        let (mut rng, seed) = Rng::new(41);
        let stream = dev.new_stream().unwrap();
        let sizes = [5000, 0, 17, 20_000];
        let (mut a, _) = make_list(&dev, &mut rng, &sizes, 0, 1000.0);
        let mut b: Vec<Buf> = a.iter().map(|x| x.like(&dev, &x.host())).collect();
        let cfg = ferrotron::core::loss_scaler::GradScalerConfig {
            initial_scale: 3000.0,
            ..Default::default()
        };
        let scaler = DeviceGradScaler::new(&dev, cfg).unwrap();
        let mut mt = MultiTensor::new();
        let mut f1 = flag(&stream, 0.0);
        let mut f2 = flag(&stream, 0.0);
        mt.unscale(&stream, &mut grads(&mut a), 3000.0, &mut f1)
            .unwrap();
        mt.unscale_with_scaler(&stream, &mut grads(&mut b), &scaler, &mut f2)
            .unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.host(), y.host(), "seed {seed}");
        }
        assert_eq!((read1(&f1), read1(&f2)), (0.0, 0.0));
    }
}

/// 100 tensors; `plant` writes one bad value into one element of one tensor.
fn found_inf_case(dev: &Device, bad: Option<f32>, salt: u64) {
    let (mut rng, seed) = Rng::new(salt);
    let sizes: Vec<usize> = (0..100)
        .map(|_| 1 + (rng.next_u64() % 3000) as usize)
        .collect();
    let (mut bufs, vals) = make_list(dev, &mut rng, &sizes, 0, 100.0);
    let stream = dev.new_stream().unwrap();
    let victim = (rng.next_u64() % 100) as usize;
    let elem = (rng.next_u64() % sizes[victim] as u64) as usize;
    if let Some(v) = bad {
        let mut host = vals[victim].clone();
        host[elem] = v as f64;
        bufs[victim] = bufs[victim].like(dev, &host);
    }
    let mut found = flag(&stream, 0.0);
    MultiTensor::new()
        .unscale(&stream, &mut grads(&mut bufs), 128.0, &mut found)
        .unwrap();
    let want = if bad.is_some() { 1.0 } else { 0.0 };
    assert_eq!(
        read1(&found),
        want,
        "{bad:?} planted in tensor {victim} ({:?}, {} elements) at {elem} on {dev:?} (seed {seed})",
        bufs[victim].dtype(),
        sizes[victim]
    );
    // Every other element was still unscaled.
    let other = &bufs[(victim + 1) % 100];
    let v = &vals[(victim + 1) % 100];
    let out = other.host();
    assert!(
        out.iter()
            .zip(v)
            .all(|(&o, &x)| o == other.round(x as f32 / 128.0)),
        "seed {seed}"
    );
}

#[test]
fn found_inf_flags_one_nan_or_inf_among_100_tensors() {
    for dev in devices("found_inf_flags_one_nan_or_inf_among_100_tensors", 1) {
        for rep in 0..3 {
            found_inf_case(&dev, None, 50 + rep);
            found_inf_case(&dev, Some(f32::NAN), 60 + rep);
            found_inf_case(&dev, Some(f32::INFINITY), 70 + rep);
            found_inf_case(&dev, Some(f32::NEG_INFINITY), 80 + rep);
        }
    }
}

#[test]
fn found_inf_flags_overflow_after_scaling_and_is_never_cleared() {
    for dev in devices("found_inf_flags_overflow_after_scaling", 1) {
        let stream = dev.new_stream().unwrap();
        // 60000 is finite in fp16; 60000 / 0.5 = 120000 is not.
        let mut h = upload(&dev, &[f16::from_f32(1.0), f16::from_f32(60000.0)]);
        let mut found = flag(&stream, 0.0);
        let mut mt = MultiTensor::new();
        mt.unscale(&stream, &mut [GradRef::from(&mut h)], 0.5, &mut found)
            .unwrap();
        assert_eq!(read1(&found), 1.0, "fp16 overflow after scaling on {dev:?}");
        assert_eq!(h.to_host().unwrap(), [f16::from_f32(2.0), f16::INFINITY]);
        // A clean list afterwards leaves the flag set.
        let mut g = upload(&dev, &[1.0f32; 10]);
        mt.unscale(&stream, &mut [GradRef::from(&mut g)], 2.0, &mut found)
            .unwrap();
        assert_eq!(read1(&found), 1.0);
        assert_eq!(g.to_host().unwrap(), [0.5f32; 10]);
    }
}

#[test]
fn l2_norm_matches_oracle_and_is_bitwise_deterministic() {
    let (mut rng, seed) = Rng::new(90);
    let mut sizes = vec![0, 1, 5, 16384, 16385, 70_001, 0, 333];
    sizes.extend((0..200).map(|_| (rng.next_u64() % 100) as usize));
    for dev in devices("l2_norm_matches_oracle", 1) {
        let stream = dev.new_stream().unwrap();
        let (bufs, vals) = make_list(&dev, &mut rng, &sizes, 1, 3.0);
        let mut mt = MultiTensor::new();
        let mut norm = dev.alloc_zeros::<f32>(1).unwrap();
        let mut bits = Vec::new();
        for _ in 0..3 {
            stream.fill_bytes(&mut norm, 0xFF).unwrap();
            mt.l2_norm(&stream, &tensors(&bufs), &mut norm).unwrap();
            bits.push(read1(&norm).to_bits());
        }
        // A fresh MultiTensor (fresh tables) gives the same bits too.
        stream.fill_bytes(&mut norm, 0xFF).unwrap();
        MultiTensor::new()
            .l2_norm(&stream, &tensors(&bufs), &mut norm)
            .unwrap();
        bits.push(read1(&norm).to_bits());
        assert!(
            bits.iter().all(|&b| b == bits[0]),
            "{bits:x?} (seed {seed})"
        );
        let got = f32::from_bits(bits[0]) as f64;
        let want = oracle::l2_norm(&vals);
        assert!(
            ((got - want) / want).abs() <= 1e-5,
            "norm {got} vs {want} on {dev:?} (seed {seed})"
        );

        // One huge tensor.
        let (big, bv) = make_list(&dev, &mut rng, &[3_000_017], 2, 1.0);
        mt.l2_norm(&stream, &tensors(&big), &mut norm).unwrap();
        let got = read1(&norm) as f64;
        let want = oracle::l2_norm(&bv);
        assert!(
            ((got - want) / want).abs() <= 1e-5,
            "huge: {got} vs {want} (seed {seed})"
        );

        // Empty lists and lists of empty tensors have norm 0.
        for list in [vec![], vec![0usize, 0]] {
            let (e, _) = make_list(&dev, &mut rng, &list, 0, 1.0);
            stream.fill_bytes(&mut norm, 0xFF).unwrap();
            mt.l2_norm(&stream, &tensors(&e), &mut norm).unwrap();
            assert_eq!(read1(&norm), 0.0);
        }
    }
}

#[test]
fn clip_scales_when_over_and_is_a_no_op_when_under() {
    let sizes = [1000, 0, 16385, 37, 5000];
    for dev in devices("clip_scales_when_over", 1) {
        let (mut rng, seed) = Rng::new(100);
        let stream = dev.new_stream().unwrap();
        let mut mt = MultiTensor::new();
        let mut norm = dev.alloc_zeros::<f32>(1).unwrap();
        for (factor, clips) in [(0.3, true), (2.0, false)] {
            let (mut bufs, vals) = make_list(&dev, &mut rng, &sizes, 0, 2.0);
            let true_norm = oracle::l2_norm(&vals);
            let max_norm = factor * true_norm;
            mt.clip_grad_norm(&stream, &mut grads(&mut bufs), max_norm, &mut norm)
                .unwrap();
            let n32 = read1(&norm);
            assert!(((n32 as f64 - true_norm) / true_norm).abs() <= 1e-5);
            let coeff = oracle::clip_coeff(n32 as f64, max_norm);
            assert_eq!(coeff.is_some(), clips, "seed {seed}");
            let c32 = coeff.unwrap_or(1.0) as f32;
            let exact = oracle::clip_coeff(true_norm, max_norm).unwrap_or(1.0);
            let (reference, _) = oracle::scale(&vals, exact);
            for (i, (b, v)) in bufs.iter().zip(&vals).enumerate() {
                let out = b.host();
                assert_close(
                    &format!("clip x{factor} tensor {i} on {dev:?}"),
                    b.dtype(),
                    seed,
                    &out,
                    &reference[i],
                );
                for (&o, &x) in out.iter().zip(v) {
                    let want = if clips { b.round(x as f32 * c32) } else { x };
                    assert!(o == want, "{o} != {want} (seed {seed})");
                }
            }
            // After clipping the norm is max_norm (or unchanged).
            mt.l2_norm(&stream, &tensors(&bufs), &mut norm).unwrap();
            let after = read1(&norm) as f64;
            let target = if clips { max_norm } else { true_norm };
            assert!(
                ((after - target) / target).abs() < 2e-3,
                "{after} vs {target}"
            );
        }

        // A NaN norm clips nothing.
        let (mut bufs, vals) = make_list(&dev, &mut rng, &[100, 3], 0, 1.0);
        stream.fill_bytes(&mut norm, 0xFF).unwrap();
        mt.clip_by_norm(&stream, &mut grads(&mut bufs), &norm, 1e-3)
            .unwrap();
        for (b, v) in bufs.iter().zip(&vals) {
            assert_eq!(&b.host(), v);
        }
    }
}

#[test]
fn empty_lists_are_no_ops() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let mut mt = MultiTensor::new();
    let mut found = flag(&stream, 0.0);
    let mut norm = flag(&stream, 5.0);
    mt.unscale(&stream, &mut [], 2.0, &mut found).unwrap();
    let mut e = dev.alloc_zeros::<bf16>(0).unwrap();
    mt.unscale(&stream, &mut [GradRef::from(&mut e)], 2.0, &mut found)
        .unwrap();
    mt.clip_by_norm(&stream, &mut [], &norm, 1.0).unwrap();
    mt.clip_grad_norm(&stream, &mut [GradRef::from(&mut e)], 1.0, &mut norm)
        .unwrap();
    assert_eq!((read1(&found), read1(&norm)), (0.0, 0.0));
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dev = Device::emu();
    let other = Device::emu();
    let stream = dev.new_stream().unwrap();
    let mut mt = MultiTensor::new();
    let mut a = dev.alloc_zeros::<f32>(10).unwrap();
    let mut found = dev.alloc_zeros::<f32>(1).unwrap();
    let msg = |e: ferrotron::Error| e.to_string();

    // A tensor from another device, named by its index.
    let mut foreign = other.alloc_zeros::<f16>(4).unwrap();
    let e = mt
        .unscale(
            &stream,
            &mut [GradRef::from(&mut a), GradRef::from(&mut foreign)],
            2.0,
            &mut found,
        )
        .unwrap_err();
    assert!(msg(e.clone()).contains("tensor 1") && msg(e).contains("multi_tensor_unscale"));
    let mut norm = dev.alloc_zeros::<f32>(1).unwrap();
    let e = mt
        .l2_norm(&stream, &[TensorRef::from(&foreign)], &mut norm)
        .unwrap_err();
    assert!(msg(e).contains("tensor 0"));

    // Scales that are not finite and positive, or whose reciprocal is not.
    for s in [0.0f32, -1.0, f32::NAN, f32::INFINITY, 1e-45] {
        let e = mt
            .unscale(&stream, &mut [GradRef::from(&mut a)], s, &mut found)
            .unwrap_err();
        assert!(msg(e.clone()).contains("`scale`"), "{s}: {}", msg(e));
    }

    // found_inf / norm: one element, on the stream's device.
    let mut two = dev.alloc_zeros::<f32>(2).unwrap();
    let e = mt
        .unscale(&stream, &mut [GradRef::from(&mut a)], 2.0, &mut two)
        .unwrap_err();
    assert!(msg(e).contains("`found_inf`"));
    let mut far = other.alloc_zeros::<f32>(1).unwrap();
    let e = mt
        .unscale(&stream, &mut [GradRef::from(&mut a)], 2.0, &mut far)
        .unwrap_err();
    assert!(msg(e).contains("found_inf"));
    let e = mt
        .l2_norm(&stream, &[TensorRef::from(&a)], &mut two)
        .unwrap_err();
    assert!(msg(e).contains("`norm`"));

    // max_norm must be finite and positive.
    for m in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = mt
            .clip_by_norm(&stream, &mut [GradRef::from(&mut a)], &norm, m)
            .unwrap_err();
        assert!(msg(e).contains("`max_norm`"));
        let e = mt
            .clip_grad_norm(&stream, &mut [GradRef::from(&mut a)], m, &mut norm)
            .unwrap_err();
        assert!(msg(e).contains("`max_norm`"));
    }

    // A scaler from another device.
    let scaler = DeviceGradScaler::new(&other, Default::default()).unwrap();
    let e = mt
        .unscale_with_scaler(&stream, &mut [GradRef::from(&mut a)], &scaler, &mut found)
        .unwrap_err();
    assert!(msg(e).contains("scaler"));

    // Nothing was written by the failed calls.
    assert_eq!(a.to_host().unwrap(), vec![0.0f32; 10]);
    assert_eq!(read1(&found), 0.0);
}
