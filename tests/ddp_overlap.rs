//! Overlap in the data-parallel path, on the in-process communicator:
//! the distributed optimizer's parameter all-gather overlapped with the next
//! forward (`overlap_param_gather`, waits in any order), overlapped gradient
//! reduction bitwise equal to the serialised one, and fp16 parameters with a
//! device loss scaler across dp 2 and 4 (an overflow on one rank skips the
//! step everywhere, with no host synchronisation in the step path).

mod common;

use common::ddp::{grad_of, numel, reference_grads, run_ranks, values};
use ferrotron::core::loss_scaler::GradScalerConfig;
use ferrotron::ops::adam::{
    default_weight_decay, AdamConfig, AdamScalars, AdamTensors, FusedAdam, Unscale,
};
use ferrotron::ops::multi_tensor::{DeviceGradScaler, GradRef, MultiTensor, TensorRef};
use ferrotron::parallel::ddp::{
    DdpConfig, DistOptConfig, DistributedDataParallel, DistributedOptimizer, ParamId, ParamRegistry,
};
use ferrotron::{DType, Device, Error, Stream};
use half::{bf16, f16};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

type Shapes = &'static [(&'static str, &'static [usize], DType)];

/// Several buckets at bucket size 60, two dtype groups.
const MIXED: Shapes = &[
    ("embed", &[10, 7], DType::F32),
    ("ln.gain", &[7], DType::BF16),
    ("w1", &[7, 12], DType::F32),
    ("b1", &[12], DType::F32),
    ("w2", &[12, 5], DType::BF16),
    ("head", &[5, 9], DType::F32),
];

/// fp16 parameters, fp32 gradients.
const HALF: Shapes = &[
    ("embed", &[10, 7], DType::F16),
    ("ln.gain", &[7], DType::F16),
    ("w1", &[7, 12], DType::F16),
    ("b1", &[12], DType::F16),
    ("w2", &[12, 5], DType::F16),
    ("head", &[5, 9], DType::F16),
];

fn registry(shapes: Shapes) -> (ParamRegistry, Vec<ParamId>) {
    let mut reg = ParamRegistry::new();
    let ids = shapes
        .iter()
        .map(|(n, s, d)| reg.register(n, s, *d).unwrap())
        .collect();
    (reg, ids)
}

fn round(d: DType, v: f64) -> f64 {
    match d {
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F16 => f16::from_f64(v).to_f64(),
        _ => v as f32 as f64,
    }
}

fn init_param(p: usize, d: DType, n: usize) -> Vec<f64> {
    values(777 + p as u64, n)
        .into_iter()
        .map(|v| round(d, v))
        .collect()
}

fn arg_of(e: Error) -> &'static str {
    match e {
        Error::InvalidArgument { arg, .. } => arg,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

fn write_grad(ddp: &DistributedDataParallel<'_>, s: &Stream, id: ParamId, vals: &[f64]) {
    let mut view = ddp.buffers().grad::<f32>(id).unwrap();
    let host: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
    s.copy_from_host(&host, &mut view).unwrap();
}

/// `id`'s value in the parameter buffer, as bits (f32) or widened bits
/// (bf16 / f16), read on `s` (which synchronises it).
fn param_bits(ddp: &DistributedDataParallel<'_>, s: &Stream, d: DType, id: ParamId) -> Vec<u32> {
    let b = ddp.buffers();
    match d {
        DType::F32 => {
            let v = b.param::<f32>(id).unwrap();
            let mut out = vec![0f32; v.len()];
            s.copy_to_host(&v, &mut out).unwrap();
            out.iter().map(|x| x.to_bits()).collect()
        }
        DType::BF16 => {
            let v = b.param::<bf16>(id).unwrap();
            let mut out = vec![bf16::ZERO; v.len()];
            s.copy_to_host(&v, &mut out).unwrap();
            out.iter().map(|x| x.to_bits() as u32).collect()
        }
        _ => {
            let v = b.param::<f16>(id).unwrap();
            let mut out = vec![f16::ZERO; v.len()];
            s.copy_to_host(&v, &mut out).unwrap();
            out.iter().map(|x| x.to_bits() as u32).collect()
        }
    }
}

fn param_f64(ddp: &DistributedDataParallel<'_>, s: &Stream, d: DType, id: ParamId) -> Vec<f64> {
    param_bits(ddp, s, d, id)
        .into_iter()
        .map(|b| match d {
            DType::F32 => f32::from_bits(b) as f64,
            DType::BF16 => bf16::from_bits(b as u16).to_f64(),
            _ => f16::from_bits(b as u16).to_f64(),
        })
        .collect()
}

fn init_params(ddp: &DistributedDataParallel<'_>, s: &Stream, shapes: Shapes, ids: &[ParamId]) {
    for (p, &id) in ids.iter().enumerate() {
        let init = init_param(p, shapes[p].2, numel(shapes[p].1));
        match shapes[p].2 {
            DType::F32 => {
                let mut v = ddp.buffers().param::<f32>(id).unwrap();
                let h: Vec<f32> = init.iter().map(|&x| x as f32).collect();
                s.copy_from_host(&h, &mut v).unwrap();
            }
            DType::BF16 => {
                let mut v = ddp.buffers().param::<bf16>(id).unwrap();
                let h: Vec<bf16> = init.iter().map(|&x| bf16::from_f64(x)).collect();
                s.copy_from_host(&h, &mut v).unwrap();
            }
            _ => {
                let mut v = ddp.buffers().param::<f16>(id).unwrap();
                let h: Vec<f16> = init.iter().map(|&x| f16::from_f64(x)).collect();
                s.copy_from_host(&h, &mut v).unwrap();
            }
        }
    }
    s.synchronize().unwrap();
}

const CFG: DistOptConfig = DistOptConfig {
    adam: AdamConfig {
        betas: (0.9, 0.999),
        eps: 1e-8,
        mode: ferrotron::ops::adam::WeightDecayMode::Decoupled,
    },
    weight_decay: 0.1,
    max_grad_norm: Some(1.0),
};

/// A permutation of 0..n that depends on `key` (a different order per rank
/// and step).
fn permutation(n: usize, key: u64) -> Vec<usize> {
    let r = values(key, n);
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| r[a].partial_cmp(&r[b]).unwrap());
    idx
}

/// Three steps of the distributed optimizer; with `overlap`, the forward of
/// each next step waits for the parameters in a rank- and step-dependent
/// order (in step 1 only for those of the first bucket: the next `step`
/// waits for the rest). Returns, per rank, the parameter bits each forward read, per step.
fn param_gather_run(dp: usize, overlap: bool) -> Vec<Vec<Vec<Vec<u32>>>> {
    let seed = 4242 + dp as u64;
    let steps = 3;
    run_ranks(dp, |comm| {
        let (reg, ids) = registry(MIXED);
        let config = DdpConfig {
            bucket_size: Some(60),
            distributed_optimizer: true,
            ..DdpConfig::default()
        };
        let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
        let compute = comm.device().new_stream().unwrap();
        let rank = comm.rank();
        init_params(&ddp, &compute, MIXED, &ids);
        let nb = ddp.buckets().len();
        assert!(nb >= 3, "several buckets");
        // Forward order: the bucket of the first registered parameter first.
        let order = ddp.param_gather_order();
        assert_eq!(order[0], ddp.buffers().bucket_of(ids[0]).unwrap());
        // ... then by the first parameter each bucket holds (the order in
        // which a forward first needs them), across dtype groups.
        let first = |b| {
            ids.iter()
                .position(|&id| ddp.buffers().bucket_of(id).unwrap() == b)
                .unwrap()
        };
        assert!(order.windows(2).all(|w| first(w[0]) < first(w[1])));
        assert_eq!(order.len(), nb);
        let mut opt = DistributedOptimizer::new(&ddp, CFG).unwrap();
        opt.set_overlap_param_gather(overlap);
        let mut scalars = AdamScalars::new(&compute, 1e-2).unwrap();
        let mut seen = Vec::new();
        for step in 0..=steps {
            if step > 0 {
                // The forward of this step.
                let mut perm = permutation(ids.len(), 31 * step as u64 + rank as u64);
                if step == 1 {
                    // Only the parameters of the first bucket in forward order.
                    perm.retain(|&p| ddp.buffers().bucket_of(ids[p]).unwrap() == order[0]);
                }
                let mut read = vec![Vec::new(); ids.len()];
                for &p in &perm {
                    if overlap {
                        ddp.wait_param_gather(&compute, ids[p]).unwrap();
                    }
                    read[p] = param_bits(&ddp, &compute, MIXED[p].2, ids[p]);
                }
                if overlap && step == 1 {
                    // The next step waits for the other buckets itself.
                    assert_eq!(ddp.param_gathers_pending(), nb - 1);
                }
                seen.push(read);
            }
            if step == steps {
                break;
            }
            ddp.zero_grad_buffer(&compute).unwrap();
            for (p, &id) in ids.iter().enumerate().rev() {
                write_grad(
                    &ddp,
                    &compute,
                    id,
                    &grad_of(seed, rank, step, p, numel(MIXED[p].1)),
                );
                ddp.mark_grad_ready(&compute, id).unwrap();
            }
            ddp.finish_grad_sync(&compute).unwrap();
            opt.step(&mut ddp, &compute, &mut scalars, None).unwrap();
            assert_eq!(
                ddp.param_gathers_pending(),
                if overlap { nb } else { 0 },
                "rank {rank} step {step}: pending all-gathers"
            );
        }
        ddp.finish_param_gather(&compute).unwrap();
        assert_eq!(ddp.param_gathers_pending(), 0);
        compute.synchronize().unwrap();
        seen
    })
}

/// Waiting for parameters in any order after an overlapped step reads the
/// same bits as the serialised all-gather (dp 2 and 4); stepping with
/// all-gathers still pending waits for them; a hang fails on the
/// communicator's timeout.
#[test]
fn overlapped_param_gather_waits_in_any_order_and_matches_serialised() {
    for dp in [2, 4] {
        let want = param_gather_run(dp, false);
        let got = param_gather_run(dp, true);
        assert_eq!(got.len(), dp);
        for (rank, (g, w)) in got.iter().zip(&want).enumerate() {
            for (step, (gs, ws)) in g.iter().zip(w).enumerate() {
                for p in 0..MIXED.len() {
                    assert_eq!(
                        gs[p], ws[p],
                        "dp {dp} rank {rank} forward {step} {}",
                        MIXED[p].0
                    );
                }
            }
        }
        // Every rank read the same (replicated) parameters.
        for other in &got[1..] {
            for (a, b) in got[0].iter().zip(other) {
                for (x, y) in a.iter().zip(b) {
                    if !x.is_empty() && !y.is_empty() {
                        assert_eq!(x, y);
                    }
                }
            }
        }
    }
}

#[test]
fn param_gather_misuse_is_a_named_error() {
    run_ranks(2, |comm| {
        let s = comm.device().new_stream().unwrap();
        // A parameter of a larger registry is unknown here.
        let mut big = ParamRegistry::new();
        let mut stranger = None;
        for i in 0..10 {
            stranger = Some(big.register(&format!("p{i}"), &[3], DType::F32).unwrap());
        }
        let (reg, _) = registry(MIXED);
        let mut ddp = DistributedDataParallel::new(
            &comm,
            reg,
            DdpConfig {
                bucket_size: Some(60),
                distributed_optimizer: true,
                ..DdpConfig::default()
            },
        )
        .unwrap();
        let e = ddp.wait_param_gather(&s, stranger.unwrap()).unwrap_err();
        assert_eq!(arg_of(e), "param");
        // Nothing dispatched yet: waiting is a no-op.
        let w1 = ddp.buffers().id("w1").unwrap();
        ddp.wait_param_gather(&s, w1).unwrap();
        // Plain data parallelism has no parameter buffer to gather.
        let (reg, ids) = registry(MIXED);
        let mut plain = DistributedDataParallel::new(&comm, reg, DdpConfig::default()).unwrap();
        assert_eq!(
            arg_of(plain.wait_param_gather(&s, ids[0]).unwrap_err()),
            "ddp"
        );
    });
}

/// Reduced gradients (and, with the distributed optimizer, the parameters
/// after a step) of one step where each bucket's reduction starts during
/// backward, or where every gradient is written first and all are marked
/// at the end. Returns the bits of every gradient buffer and parameter.
fn reduction_run(dp: usize, dist: bool, serialised: bool) -> Vec<Vec<Vec<u32>>> {
    let seed = 1717 + dp as u64;
    run_ranks(dp, |comm| {
        let (reg, ids) = registry(MIXED);
        let config = DdpConfig {
            bucket_size: Some(60),
            distributed_optimizer: dist,
            ..DdpConfig::default()
        };
        let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
        let compute = comm.device().new_stream().unwrap();
        let rank = comm.rank();
        let mut opt = if dist {
            init_params(&ddp, &compute, MIXED, &ids);
            Some(DistributedOptimizer::new(&ddp, CFG).unwrap())
        } else {
            None
        };
        let mut scalars = AdamScalars::new(&compute, 1e-2).unwrap();
        let mut out = Vec::new();
        for step in 0..2 {
            ddp.zero_grad_buffer(&compute).unwrap();
            let grads: Vec<Vec<f64>> = (0..ids.len())
                .map(|p| grad_of(seed, rank, step, p, numel(MIXED[p].1)))
                .collect();
            for (p, &id) in ids.iter().enumerate().rev() {
                write_grad(&ddp, &compute, id, &grads[p]);
                if !serialised {
                    ddp.mark_grad_ready(&compute, id).unwrap();
                }
            }
            if serialised {
                for &id in ids.iter().rev() {
                    ddp.mark_grad_ready(&compute, id).unwrap();
                }
            }
            ddp.finish_grad_sync(&compute).unwrap();
            for g in 0..ddp.buffers().num_groups() {
                let v = ddp.buffers().group_grad::<f32>(g).unwrap();
                let mut h = vec![0f32; v.len()];
                compute.copy_to_host(&v, &mut h).unwrap();
                out.push(h.iter().map(|x| x.to_bits()).collect());
            }
            if let Some(opt) = opt.as_mut() {
                opt.step(&mut ddp, &compute, &mut scalars, None).unwrap();
                for (p, &id) in ids.iter().enumerate() {
                    out.push(param_bits(&ddp, &compute, MIXED[p].2, id));
                }
            }
        }
        out
    })
}

#[test]
fn overlapped_reduction_equals_serialised_bitwise() {
    for dp in [2, 4] {
        for dist in [false, true] {
            let a = reduction_run(dp, dist, false);
            let b = reduction_run(dp, dist, true);
            assert_eq!(a.len(), b.len());
            for (rank, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(!x.is_empty());
                for (i, (u, v)) in x.iter().zip(y).enumerate() {
                    assert_eq!(u, v, "dp {dp} dist {dist} rank {rank} tensor {i}");
                }
            }
        }
    }
}

/// Single-rank fp16 reference: mean gradient over ranks, clip, FusedAdam
/// on fp32 masters with an fp16 model copy.
/// The single-rank run: the fp16 model after `steps` steps, and each
/// step's gradient norm (before clipping).
fn reference_fp16(dp: usize, steps: usize, seed: u64, lr: f32) -> (Vec<Vec<f64>>, Vec<f64>) {
    let dev = Device::emu();
    let s = dev.new_stream().unwrap();
    let n = HALF.len();
    let mut master: Vec<_> = (0..n)
        .map(|p| {
            let h: Vec<f32> = init_param(p, DType::F16, numel(HALF[p].1))
                .iter()
                .map(|&v| v as f32)
                .collect();
            dev.upload(&h).unwrap()
        })
        .collect();
    let zeros = |p: usize| dev.alloc_zeros::<f32>(numel(HALF[p].1)).unwrap();
    let mut m: Vec<_> = (0..n).map(zeros).collect();
    let mut v: Vec<_> = (0..n).map(zeros).collect();
    let mut model: Vec<_> = (0..n)
        .map(|p| dev.alloc_zeros::<f16>(numel(HALF[p].1)).unwrap())
        .collect();
    let shapes: Vec<&[usize]> = HALF.iter().map(|s| s.1).collect();
    let wd = default_weight_decay(&shapes, CFG.weight_decay);
    let mut adam = FusedAdam::new(CFG.adam).unwrap();
    let mut mt = MultiTensor::new();
    let mut scalars = AdamScalars::new(&s, lr).unwrap();
    let mut norm = dev.alloc_zeros::<f32>(1).unwrap();
    let lens: Vec<usize> = HALF.iter().map(|s| numel(s.1)).collect();
    let mut norms = Vec::with_capacity(steps);
    for step in 0..steps {
        let grads = reference_grads(
            &s,
            &mut mt,
            &mut norm,
            (seed, dp, step),
            &lens,
            CFG.max_grad_norm,
        );
        let gl: Vec<TensorRef<'_>> = grads.iter().map(TensorRef::from).collect();
        let mut ml: Vec<GradRef<'_>> = model.iter_mut().map(GradRef::from).collect();
        let mut pl: Vec<_> = master.iter_mut().collect();
        let mut al: Vec<_> = m.iter_mut().collect();
        let mut vl: Vec<_> = v.iter_mut().collect();
        let mut t = AdamTensors {
            params: &mut pl,
            exp_avg: &mut al,
            exp_avg_sq: &mut vl,
            grads: &gl,
            model: Some(&mut ml),
            weight_decay: &wd,
        };
        adam.step(&s, &mut t, &mut scalars, None, Unscale::None)
            .unwrap();
        norms.push(norm.to_host().unwrap()[0] as f64);
    }
    s.synchronize().unwrap();
    let model = model
        .iter()
        .map(|b| b.to_host().unwrap().iter().map(|x| x.to_f64()).collect())
        .collect();
    (model, norms)
}

/// fp16 parameters (fp32 gradients) with the device loss scaler, dp 2 and 4,
/// overlapped parameter all-gather: three steps equal the single-rank run
/// within fp16 tolerance; then an Inf on one rank only is skipped on every
/// rank and the scale backs off, while the compute stream is held at a gate
/// for the whole step path (marks, finish_grad_sync, step, scaler update):
/// any host synchronisation there would block until the gate times out,
/// which the test detects.
#[test]
fn fp16_loss_scaling_skips_one_rank_overflow_everywhere_without_host_sync() {
    for dp in [2, 4] {
        let (seed, lr, scale, steps) = (2718 + dp as u64, 1e-2f32, 1024.0f32, 3);
        let (want, want_norms) = reference_fp16(dp, steps, seed, lr);
        run_ranks(dp, |comm| {
            let (reg, ids) = registry(HALF);
            let config = DdpConfig {
                bucket_size: Some(60),
                distributed_optimizer: true,
                ..DdpConfig::default()
            };
            let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
            let compute = comm.device().new_stream().unwrap();
            let rank = comm.rank();
            init_params(&ddp, &compute, HALF, &ids);
            let mut opt = DistributedOptimizer::new(&ddp, CFG).unwrap();
            opt.set_overlap_param_gather(true);
            let mut scalars = AdamScalars::new(&compute, lr).unwrap();
            let scaler_cfg = GradScalerConfig {
                initial_scale: scale,
                growth_interval: 1000,
                hysteresis: 1,
                ..GradScalerConfig::default()
            };
            let mut scaler = DeviceGradScaler::new(comm.device(), scaler_cfg).unwrap();
            let mut found_inf = comm.device().alloc_zeros::<f32>(1).unwrap();
            let mut before = Vec::new();
            for step in 0..=steps {
                ddp.finish_param_gather(&compute).unwrap();
                if step == steps {
                    before = (0..ids.len())
                        .map(|p| param_bits(&ddp, &compute, DType::F16, ids[p]))
                        .collect();
                }
                ddp.zero_grad_buffer(&compute).unwrap();
                let s_step = if step == steps { 0 } else { step };
                for (p, &id) in ids.iter().enumerate().rev() {
                    let mut g: Vec<f64> = grad_of(seed, rank, s_step, p, numel(HALF[p].1))
                        .iter()
                        .map(|x| x * scale as f64)
                        .collect();
                    if step == steps && rank == dp - 1 && p == 2 {
                        g[3] = f64::INFINITY;
                    }
                    write_grad(&ddp, &compute, id, &g);
                }
                // Hold the compute stream at a gate during the step path.
                let (open, gate) = mpsc::channel::<()>();
                let timed_out = Arc::new(AtomicBool::new(false));
                let flag = timed_out.clone();
                compute
                    .launch_host_fn(move || {
                        if gate.recv_timeout(Duration::from_secs(20)).is_err() {
                            flag.store(true, Ordering::SeqCst);
                        }
                    })
                    .unwrap();
                for &id in ids.iter().rev() {
                    ddp.mark_grad_ready(&compute, id).unwrap();
                }
                ddp.finish_grad_sync(&compute).unwrap();
                opt.step(
                    &mut ddp,
                    &compute,
                    &mut scalars,
                    Some((&scaler, &mut found_inf)),
                )
                .unwrap();
                scaler.update(&compute, &mut found_inf, false).unwrap();
                // Everything above returned with the gate still closed (if
                // it synchronised, the gate timed out and the receiver is
                // gone: the flag below says so).
                let _ = open.send(());
                compute.synchronize().unwrap();
                assert!(
                    !timed_out.load(Ordering::SeqCst),
                    "dp {dp} rank {rank} step {step}: the step path waited for the compute stream"
                );
                // Adam (and clipping to norm 1) hide a gradient's scale from
                // the parameters; its norm does not. fp32 sums in another
                // order: a few ulps. (The last, skipped step has no entry.)
                if let Some(&w) = want_norms.get(step) {
                    let g = opt.grad_norm().to_host().unwrap()[0] as f64;
                    assert!(
                        (g - w).abs() <= 1e-5 * w,
                        "dp {dp} rank {rank} step {step}: gradient norm {g} vs the single-rank {w}"
                    );
                }
                let f = found_inf.to_host().unwrap()[0];
                assert_eq!(
                    f,
                    if step == steps { 1.0 } else { 0.0 },
                    "dp {dp} rank {rank} step {step} found_inf"
                );
            }
            ddp.finish_param_gather(&compute).unwrap();
            compute.synchronize().unwrap();
            assert_eq!(scalars.step().unwrap(), steps as i32, "skipped step");
            assert_eq!(scaler.to_host().unwrap().scale(), scale * 0.5, "backoff");
            for (p, &id) in ids.iter().enumerate() {
                assert_eq!(
                    param_bits(&ddp, &compute, DType::F16, id),
                    before[p],
                    "dp {dp} rank {rank} {}: the skipped step changed it",
                    HALF[p].0
                );
                let got = param_f64(&ddp, &compute, DType::F16, id);
                // fp16: a few roundings of 2^-11 relative.
                common::assert_close_each(
                    &format!("dp {dp} rank {rank} {}", HALF[p].0),
                    got.into_iter(),
                    &want[p],
                    2e-3,
                );
            }
        });
    }
}
