//! Fused multi-tensor AdamW against a float64 oracle written here: three
//! steps (with an lr schedule) over a list of odd-sized tensors (1 element,
//! sizes straddling the 16384-element chunk, an empty one) with fp32 / fp16 /
//! bf16 gradients, no model copy or a bf16 / fp16 / fp32 one, decoupled and
//! L2 weight decay, per-tensor weight decay zero and non-zero. Capturable
//! inputs: found_inf = 1 leaves every output bitwise unchanged and the step
//! count put; inv_scale 1/1024 (device buffer or DeviceGradScaler) on scaled
//! gradients gives the unscaled step. Bad arguments are named errors.

mod common;

use common::{assert_close, devices, Rng};
use ferrotron::core::dtype::FloatElement;
use ferrotron::core::loss_scaler::GradScalerConfig;
use ferrotron::ops::adam::{
    default_weight_decay, AdamConfig, AdamScalars, AdamTensors, FusedAdam, Unscale, WeightDecayMode,
};
use ferrotron::ops::multi_tensor::{DeviceGradScaler, GradRef, TensorRef};
use ferrotron::{DType, Device, DeviceBuffer, Error, Stream};
use half::{bf16, f16};

/// A tensor of any of the three dtypes.
enum Buf {
    F32(DeviceBuffer<f32>),
    F16(DeviceBuffer<f16>),
    BF16(DeviceBuffer<bf16>),
}

impl Buf {
    /// `v` rounded to `d` on `dev`.
    fn new(dev: &Device, d: DType, v: &[f64]) -> Buf {
        match d {
            DType::F32 => Buf::F32(dev.upload(&conv::<f32>(v)).unwrap()),
            DType::F16 => Buf::F16(dev.upload(&conv::<f16>(v)).unwrap()),
            DType::BF16 => Buf::BF16(dev.upload(&conv::<bf16>(v)).unwrap()),
            _ => unreachable!(),
        }
    }
    fn tensor(&self) -> TensorRef<'_> {
        match self {
            Buf::F32(b) => b.into(),
            Buf::F16(b) => b.into(),
            Buf::BF16(b) => b.into(),
        }
    }
    fn grad(&mut self) -> GradRef<'_> {
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
    /// The raw bits, widened (for bitwise comparisons).
    fn bits(&self) -> Vec<u32> {
        match self {
            Buf::F32(b) => b.to_host().unwrap().iter().map(|x| x.to_bits()).collect(),
            Buf::F16(b) => b
                .to_host()
                .unwrap()
                .iter()
                .map(|x| x.to_bits() as u32)
                .collect(),
            Buf::BF16(b) => b
                .to_host()
                .unwrap()
                .iter()
                .map(|x| x.to_bits() as u32)
                .collect(),
        }
    }
    /// `x` rounded to this buffer's dtype.
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

fn bits32(b: &DeviceBuffer<f32>) -> Vec<u32> {
    b.to_host().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// The float64 oracle's state of one tensor.
#[derive(Clone)]
struct Ref {
    p: Vec<f64>,
    m: Vec<f64>,
    v: Vec<f64>,
    /// m's recurrence over |terms|: the scale of m's rounding error, which
    /// stays put when the terms cancel (L2 decay against the gradient) and
    /// m itself is near 0.
    m_mag: Vec<f64>,
}

/// ||m - m_ref|| <= tol(f32) * ||m_mag||: relative to the size of the terms
/// summed, not to m (which may be ~0 after cancellation).
fn assert_moment_close(what: &str, seed: u64, m: &[f64], r: &Ref) {
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    let err = norm(&mut m.iter().zip(&r.m).map(|(a, b)| a - b));
    let allowed = common::tolerance(DType::F32) * norm(&mut r.m_mag.iter().copied());
    if allowed > 0.0 {
        common::log_margin(err / allowed, what);
    }
    assert!(
        err <= allowed,
        "{what}: |m - oracle| = {err:e} > {allowed:e} (seed {seed}; rerun with FTN_TEST_SEED={seed})"
    );
}

/// One AdamW step on the oracle, step number `t` (1-based), gradients `g`
/// already unscaled.
fn oracle_step(r: &mut Ref, g: &[f64], lr: f64, cfg: &AdamConfig, wd: f64, t: i32) {
    let (b1, b2, eps) = (cfg.betas.0 as f64, cfg.betas.1 as f64, cfg.eps as f64);
    let bc1 = 1.0 - b1.powi(t);
    let bc2 = 1.0 - b2.powi(t);
    for (i, &g) in g.iter().enumerate() {
        let p = r.p[i];
        let mut gi = g;
        if cfg.mode == WeightDecayMode::L2 {
            gi += wd * p;
        }
        r.m[i] = b1 * r.m[i] + (1.0 - b1) * gi;
        let gi_mag = if cfg.mode == WeightDecayMode::L2 {
            g.abs() + (wd * p).abs()
        } else {
            g.abs()
        };
        r.m_mag[i] = b1 * r.m_mag[i] + (1.0 - b1) * gi_mag;
        r.v[i] = b2 * r.v[i] + (1.0 - b2) * gi * gi;
        let mhat = r.m[i] / bc1;
        let vhat = r.v[i] / bc2;
        let mut u = mhat / (vhat.sqrt() + eps);
        if cfg.mode == WeightDecayMode::Decoupled {
            u += wd * p;
        }
        r.p[i] = p - lr * u;
    }
}

/// Sizes: 1 element, not multiples of 8 (the widest vector) nor of the
/// 16384-element chunk, one chunk + 1, an empty tensor.
const SIZES: [usize; 7] = [1, 3, 17, 1000, 16384 + 5, 0, 2 * 16384 + 1];
const GRAD_DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// The device state of one list.
struct List {
    p: Vec<DeviceBuffer<f32>>,
    m: Vec<DeviceBuffer<f32>>,
    v: Vec<DeviceBuffer<f32>>,
    model: Option<Vec<Buf>>,
    wd: Vec<f32>,
    refs: Vec<Ref>,
}

impl List {
    /// Params N(0, 1), moments 0 (fresh optimizer), model copies NaN-poisoned;
    /// 2-D shapes get weight decay `wd`, the 1-D ones 0.
    fn new(dev: &Device, rng: &mut Rng, model: Option<DType>, wd: f32) -> List {
        let shapes: Vec<Vec<usize>> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| if i % 2 == 0 { vec![n] } else { vec![1, n] })
            .collect();
        let shape_refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
        let mut l = List {
            p: vec![],
            m: vec![],
            v: vec![],
            model: model.map(|_| vec![]),
            wd: default_weight_decay(&shape_refs, wd),
            refs: vec![],
        };
        for &n in &SIZES {
            let (h, f) = rng.tensor::<f32>(n, 1.0);
            l.p.push(dev.upload(&h).unwrap());
            l.m.push(dev.alloc_zeros(n).unwrap());
            l.v.push(dev.alloc_zeros(n).unwrap());
            if let (Some(ms), Some(d)) = (l.model.as_mut(), model) {
                ms.push(Buf::new(dev, d, &vec![f64::NAN; n]));
            }
            l.refs.push(Ref {
                p: f,
                m: vec![0.0; n],
                v: vec![0.0; n],
                m_mag: vec![0.0; n],
            });
        }
        l
    }

    /// One step on the device with gradients `g`.
    fn step(
        &mut self,
        stream: &Stream,
        adam: &mut FusedAdam,
        g: &[Buf],
        scalars: &mut AdamScalars,
        found_inf: Option<&DeviceBuffer<f32>>,
        unscale: Unscale<'_>,
    ) -> Result<(), Error> {
        let mut ps: Vec<&mut DeviceBuffer<f32>> = self.p.iter_mut().collect();
        let mut ms: Vec<&mut DeviceBuffer<f32>> = self.m.iter_mut().collect();
        let mut vs: Vec<&mut DeviceBuffer<f32>> = self.v.iter_mut().collect();
        let gs: Vec<TensorRef<'_>> = g.iter().map(Buf::tensor).collect();
        let mut models: Option<Vec<GradRef<'_>>> = self
            .model
            .as_mut()
            .map(|ms| ms.iter_mut().map(Buf::grad).collect());
        let mut t = AdamTensors {
            params: &mut ps,
            exp_avg: &mut ms,
            exp_avg_sq: &mut vs,
            grads: &gs,
            model: models.as_deref_mut(),
            weight_decay: &self.wd,
        };
        adam.step(stream, &mut t, scalars, found_inf.map(|b| b as _), unscale)
    }

    /// Compares everything with the oracle; the model copy must also be
    /// exactly the device params rounded.
    fn check(&self, what: &str, seed: u64) {
        for (i, r) in self.refs.iter().enumerate() {
            let w = format!("{what}: tensor {i} ({} elements)", r.p.len());
            let p = self.p[i].to_host().unwrap();
            let p64 = common::to_f64(&p);
            assert_close(&format!("{w}: p"), DType::F32, seed, &p64, &r.p);
            let m = common::to_f64(&self.m[i].to_host().unwrap());
            assert_moment_close(&format!("{w}: m"), seed, &m, r);
            let v = common::to_f64(&self.v[i].to_host().unwrap());
            assert_close(&format!("{w}: v"), DType::F32, seed, &v, &r.v);
            if let Some(models) = &self.model {
                let b = &models[i];
                let got = b.host();
                assert_close(&format!("{w}: model"), b.dtype(), seed, &got, &r.p);
                for (k, (&x, &y)) in p.iter().zip(&got).enumerate() {
                    assert_eq!(
                        b.round(x).to_bits(),
                        y.to_bits(),
                        "{w}: model[{k}] = {y} is not the params rounded ({x}) (seed {seed})"
                    );
                }
            }
        }
    }

    /// Every output's bits.
    fn bits(&self) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = vec![];
        for i in 0..self.p.len() {
            out.push(bits32(&self.p[i]));
            out.push(bits32(&self.m[i]));
            out.push(bits32(&self.v[i]));
            if let Some(ms) = &self.model {
                out.push(ms[i].bits());
            }
        }
        out
    }
}

/// Fresh gradients N(0, 1) (rounded to their dtypes, cycling from `first`)
/// and their values.
fn grads(dev: &Device, rng: &mut Rng, first: usize) -> (Vec<Buf>, Vec<Vec<f64>>) {
    let mut vals = vec![];
    for (i, &n) in SIZES.iter().enumerate() {
        let (_, raw) = rng.tensor::<f32>(n, 1.0);
        // Round to the dtype first, so the oracle sees what the device reads.
        vals.push(Buf::new(dev, grad_dtype(i, first), &raw).host());
    }
    (scaled(dev, &vals, first, 1.0), vals)
}

fn grad_dtype(i: usize, first: usize) -> DType {
    GRAD_DTYPES[(i + first) % 3]
}

/// Device gradients `vals * scale` in the dtypes of [`grads`].
fn scaled(dev: &Device, vals: &[Vec<f64>], first: usize, scale: f64) -> Vec<Buf> {
    vals.iter()
        .enumerate()
        .map(|(i, v)| {
            let x: Vec<f64> = v.iter().map(|x| x * scale).collect();
            Buf::new(dev, grad_dtype(i, first), &x)
        })
        .collect()
}

fn flag(stream: &Stream, v: f32) -> DeviceBuffer<f32> {
    let mut b = stream.device().alloc_zeros::<f32>(1).unwrap();
    stream.copy_from_host(&[v], &mut b).unwrap();
    b
}

/// Three steps of one configuration, checked after each.
fn three_steps(dev: &Device, mode: WeightDecayMode, model: Option<DType>, salt: u64) {
    let (mut rng, seed) = Rng::new(salt);
    let what = format!("{mode:?}, model {model:?} on {dev:?}");
    let stream = dev.new_stream().unwrap();
    let cfg = AdamConfig {
        mode,
        ..AdamConfig::default()
    };
    let mut adam = FusedAdam::new(cfg).unwrap();
    let mut list = List::new(dev, &mut rng, model, 0.1);
    assert!(list.wd.contains(&0.0) && list.wd.contains(&0.1));
    let mut scalars = AdamScalars::new(&stream, 1e-2).unwrap();
    let found = flag(&stream, 0.0);
    for t in 1..=3 {
        let lr = 1e-2 * t as f32; // a schedule: lr changes every step
        scalars.set_lr(&stream, lr).unwrap();
        let (g, gv) = grads(dev, &mut rng, t as usize + salt as usize);
        list.step(
            &stream,
            &mut adam,
            &g,
            &mut scalars,
            Some(&found),
            Unscale::None,
        )
        .unwrap();
        for (i, r) in list.refs.iter_mut().enumerate() {
            oracle_step(r, &gv[i], lr as f64, &cfg, list.wd[i] as f64, t);
        }
        list.check(&format!("{what}, step {t}"), seed);
        assert_eq!(scalars.step().unwrap(), t, "{what}: step count");
    }
}

#[test]
fn decoupled_without_model_copy_matches_oracle() {
    for dev in devices("decoupled_without_model_copy", 1) {
        three_steps(&dev, WeightDecayMode::Decoupled, None, 1);
    }
}

#[test]
fn decoupled_with_bf16_model_copy_matches_oracle() {
    for dev in devices("decoupled_with_bf16_model_copy", 1) {
        three_steps(&dev, WeightDecayMode::Decoupled, Some(DType::BF16), 2);
    }
}

#[test]
fn l2_with_fp16_model_copy_matches_oracle() {
    for dev in devices("l2_with_fp16_model_copy", 1) {
        three_steps(&dev, WeightDecayMode::L2, Some(DType::F16), 3);
    }
}

#[test]
fn l2_without_model_copy_and_fp32_copy_match_oracle() {
    for dev in devices("l2_without_model_copy", 2) {
        three_steps(&dev, WeightDecayMode::L2, None, 4);
        three_steps(&dev, WeightDecayMode::Decoupled, Some(DType::F32), 5);
    }
}

/// found_inf = 1: nothing written, step count unchanged; then a clean step
/// continues from the untouched state with t = 2.
#[test]
fn overflow_skips_the_step_on_the_device() {
    for dev in devices("overflow_skips_the_step", 1) {
        let (mut rng, seed) = Rng::new(6);
        let stream = dev.new_stream().unwrap();
        let cfg = AdamConfig::default();
        let mut adam = FusedAdam::new(cfg).unwrap();
        let mut list = List::new(&dev, &mut rng, Some(DType::BF16), 0.01);
        let mut scalars = AdamScalars::new(&stream, 1e-3).unwrap();
        let mut found = flag(&stream, 0.0);
        let (g, gv) = grads(&dev, &mut rng, 0);
        list.step(
            &stream,
            &mut adam,
            &g,
            &mut scalars,
            Some(&found),
            Unscale::None,
        )
        .unwrap();
        for (i, r) in list.refs.iter_mut().enumerate() {
            oracle_step(r, &gv[i], 1e-3, &cfg, list.wd[i] as f64, 1);
        }
        let before = list.bits();
        // An overflowing step: other gradients, found_inf = 1.
        stream.copy_from_host(&[1.0f32], &mut found).unwrap();
        let (g2, _) = grads(&dev, &mut rng, 1);
        list.step(
            &stream,
            &mut adam,
            &g2,
            &mut scalars,
            Some(&found),
            Unscale::None,
        )
        .unwrap();
        assert!(
            before == list.bits(),
            "found_inf = 1 changed an output on {dev:?}"
        );
        assert_eq!(
            scalars.step().unwrap(),
            1,
            "found_inf = 1 advanced the step"
        );
        // Clean again: step 2 from the untouched state.
        stream.copy_from_host(&[0.0f32], &mut found).unwrap();
        let (g3, gv3) = grads(&dev, &mut rng, 2);
        list.step(
            &stream,
            &mut adam,
            &g3,
            &mut scalars,
            Some(&found),
            Unscale::None,
        )
        .unwrap();
        for (i, r) in list.refs.iter_mut().enumerate() {
            oracle_step(r, &gv3[i], 1e-3, &cfg, list.wd[i] as f64, 2);
        }
        list.check(&format!("after a skipped step on {dev:?}"), seed);
        assert_eq!(scalars.step().unwrap(), 2);
    }
}

/// Gradients scaled by 1024 with inv_scale 1/1024 (a device buffer, or the
/// DeviceGradScaler's state at scale 1024): the oracle of the unscaled
/// gradients, and bitwise the run on the unscaled gradients (a power of two
/// unscales exactly).
#[test]
fn device_inv_scale_unscales_the_gradients() {
    for dev in devices("device_inv_scale_unscales", 1) {
        let (mut rng, seed) = Rng::new(7);
        let stream = dev.new_stream().unwrap();
        let cfg = AdamConfig::default();
        let scaler = DeviceGradScaler::new(
            &dev,
            GradScalerConfig {
                initial_scale: 1024.0,
                ..GradScalerConfig::default()
            },
        )
        .unwrap();
        let inv = flag(&stream, 1.0 / 1024.0);
        let found = flag(&stream, 0.0);
        let mut list0 = List::new(&dev, &mut rng, Some(DType::F16), 0.01);
        // Identical copies of the initial state.
        let copy = |l: &List| List {
            p: l.p
                .iter()
                .map(|b| dev.upload(&b.to_host().unwrap()).unwrap())
                .collect(),
            m: l.m
                .iter()
                .map(|b| dev.upload(&b.to_host().unwrap()).unwrap())
                .collect(),
            v: l.v
                .iter()
                .map(|b| dev.upload(&b.to_host().unwrap()).unwrap())
                .collect(),
            model: Some(
                SIZES
                    .iter()
                    .map(|&n| Buf::new(&dev, DType::F16, &vec![f64::NAN; n]))
                    .collect(),
            ),
            wd: l.wd.clone(),
            refs: l.refs.clone(),
        };
        let mut list1 = copy(&list0);
        let mut list2 = copy(&list0);
        let (mut a0, mut a1, mut a2) = (
            FusedAdam::new(cfg).unwrap(),
            FusedAdam::new(cfg).unwrap(),
            FusedAdam::new(cfg).unwrap(),
        );
        let mut s0 = AdamScalars::new(&stream, 1e-3).unwrap();
        let mut s1 = AdamScalars::new(&stream, 1e-3).unwrap();
        let mut s2 = AdamScalars::new(&stream, 1e-3).unwrap();
        for t in 1..=2 {
            let first = t as usize;
            let (g, gv) = grads(&dev, &mut rng, first);
            let gs = scaled(&dev, &gv, first, 1024.0);
            list0
                .step(&stream, &mut a0, &g, &mut s0, Some(&found), Unscale::None)
                .unwrap();
            list1
                .step(
                    &stream,
                    &mut a1,
                    &gs,
                    &mut s1,
                    Some(&found),
                    Unscale::Device(&inv),
                )
                .unwrap();
            list2
                .step(
                    &stream,
                    &mut a2,
                    &gs,
                    &mut s2,
                    None,
                    Unscale::Scaler(&scaler),
                )
                .unwrap();
            for (i, r) in list1.refs.iter_mut().enumerate() {
                oracle_step(r, &gv[i], 1e-3, &cfg, list1.wd[i] as f64, t);
            }
            list1.check(&format!("inv_scale buffer, step {t} on {dev:?}"), seed);
            assert!(
                list0.bits() == list1.bits(),
                "inv_scale buffer: not the unscaled run"
            );
            assert!(list0.bits() == list2.bits(), "scaler: not the unscaled run");
        }
    }
}

/// A list that is empty or holds only empty tensors launches no update, but
/// the step still counts.
#[test]
fn empty_lists_only_advance_the_step() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let mut adam = FusedAdam::new(AdamConfig::default()).unwrap();
    let mut s = AdamScalars::new(&stream, 1e-3).unwrap();
    let mut t: AdamTensors = AdamTensors {
        params: &mut [],
        exp_avg: &mut [],
        exp_avg_sq: &mut [],
        grads: &[],
        model: None,
        weight_decay: &[],
    };
    adam.step(&stream, &mut t, &mut s, None, Unscale::None)
        .unwrap();
    assert_eq!(s.step().unwrap(), 1);
}

fn arg_of(e: Error) -> &'static str {
    match e {
        Error::InvalidArgument { arg, op, .. } => {
            assert_eq!(op, "FusedAdam");
            arg
        }
        other => panic!("not an InvalidArgument: {other:?}"),
    }
}

#[test]
fn bad_arguments_are_named_errors() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    // Config.
    for (betas, arg) in [
        ((1.0, 0.999), "beta1"),
        ((-0.1, 0.999), "beta1"),
        ((f32::NAN, 0.999), "beta1"),
        ((0.9, 1.0), "beta2"),
        ((0.9, f32::INFINITY), "beta2"),
    ] {
        let cfg = AdamConfig {
            betas,
            ..AdamConfig::default()
        };
        assert_eq!(arg_of(FusedAdam::new(cfg).unwrap_err()), arg, "{betas:?}");
    }
    for eps in [0.0, -1e-8, f32::NAN, f32::INFINITY] {
        let cfg = AdamConfig {
            eps,
            ..AdamConfig::default()
        };
        assert_eq!(arg_of(FusedAdam::new(cfg).unwrap_err()), "eps", "{eps}");
    }
    // lr.
    for lr in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(arg_of(AdamScalars::new(&stream, lr).unwrap_err()), "lr");
    }
    let mut s = AdamScalars::new(&stream, 1e-3).unwrap();
    assert_eq!(arg_of(s.set_lr(&stream, f32::NAN).unwrap_err()), "lr");
    assert_eq!(arg_of(s.set_step(&stream, -1).unwrap_err()), "step");

    // Lists.
    let mut adam = FusedAdam::new(AdamConfig::default()).unwrap();
    let mut p = [
        dev.alloc_zeros::<f32>(5).unwrap(),
        dev.alloc_zeros(3).unwrap(),
    ];
    let mut m = [
        dev.alloc_zeros::<f32>(5).unwrap(),
        dev.alloc_zeros(3).unwrap(),
    ];
    let mut v = [
        dev.alloc_zeros::<f32>(5).unwrap(),
        dev.alloc_zeros(3).unwrap(),
    ];
    let g = [
        dev.alloc_zeros::<f32>(5).unwrap(),
        dev.alloc_zeros(3).unwrap(),
    ];
    let g_short = dev.alloc_zeros::<bf16>(2).unwrap();
    let mut model = [
        dev.alloc_zeros::<bf16>(5).unwrap(),
        dev.alloc_zeros(4).unwrap(),
    ];
    let found2 = dev.alloc_zeros::<f32>(2).unwrap();
    let wd = [0.01f32, 0.0];

    // A step with the given lists (`n_m` exp_avg entries), which must fail.
    macro_rules! run {
        ($n_m:expr, $grads:expr, $model:expr, $wd:expr, $found:expr) => {{
            let [p0, p1] = &mut p;
            let [m0, m1] = &mut m;
            let [v0, v1] = &mut v;
            let mut ps = [p0, p1];
            let mut ms = [m0, m1];
            let mut vs = [v0, v1];
            let mut t = AdamTensors {
                params: &mut ps,
                exp_avg: &mut ms[..$n_m],
                exp_avg_sq: &mut vs,
                grads: $grads,
                model: $model,
                weight_decay: $wd,
            };
            adam.step(&stream, &mut t, &mut s, $found, Unscale::None)
                .unwrap_err()
        }};
    }
    let gl = [TensorRef::from(&g[0]), TensorRef::from(&g[1])];
    // Mismatched list lengths.
    assert_eq!(arg_of(run!(1, &gl, None, &wd, None)), "exp_avg");
    assert_eq!(arg_of(run!(2, &gl[..1], None, &wd, None)), "grads");
    assert_eq!(arg_of(run!(2, &gl, None, &wd[..1], None)), "weight_decay");
    {
        let [m0, _] = &mut model;
        let mut one = [GradRef::from(m0)];
        assert_eq!(arg_of(run!(2, &gl, Some(&mut one), &wd, None)), "model");
    }
    // Mismatched tensor lengths.
    let bad_g = [TensorRef::from(&g[0]), TensorRef::from(&g_short)];
    let e = run!(2, &bad_g, None, &wd, None);
    assert!(format!("{e}").contains("tensor 1"), "{e}");
    assert_eq!(arg_of(e), "grads");
    {
        let [m0, m1] = &mut model;
        let mut ml = [GradRef::from(m0), GradRef::from(m1)];
        assert_eq!(arg_of(run!(2, &gl, Some(&mut ml), &wd, None)), "model");
    }
    // Weight decay, found_inf.
    for w in [-0.1f32, f32::NAN, f32::INFINITY] {
        assert_eq!(arg_of(run!(2, &gl, None, &[0.0, w], None)), "weight_decay");
    }
    assert_eq!(arg_of(run!(2, &gl, None, &wd, Some(&found2))), "found_inf");
}

/// Two blocks for the list's 9 chunks: the grid-stride loop wraps. (The caps
/// are process-wide; lowering them only changes other tests' grids, never
/// their results.)
#[test]
fn grid_stride_wrap_matches_oracle() {
    use ferrotron::core::plan::{set_grid_caps_for_tests, GridCaps};
    set_grid_caps_for_tests(GridCaps {
        grid_stride_blocks: 2,
        ..GridCaps::REAL
    });
    let r = std::panic::catch_unwind(|| {
        three_steps(
            &Device::emu(),
            WeightDecayMode::Decoupled,
            Some(DType::BF16),
            8,
        )
    });
    set_grid_caps_for_tests(GridCaps::REAL);
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}
