//! Data parallelism on the in-process communicator (one thread per rank,
//! emulator devices): bucketed gradient all-reduce / reduce-scatter against
//! the f64 mean over ranks, gradient accumulation with communication only
//! after the last micro-batch, overlap (a bucket's reduction runs before
//! later gradients exist), a tensor-parallel layer accumulating its weight
//! gradient straight into the contiguous buffer, the distributed optimizer
//! against a single-rank AdamW run, and the named errors.

mod common;

use common::ddp::{grad_of, numel, reference_grads, run_ranks, values};
use ferrotron::comm::Communicator;
use ferrotron::ops::adam::{
    default_weight_decay, AdamConfig, AdamScalars, AdamTensors, FusedAdam, Unscale,
};
use ferrotron::ops::multi_tensor::{GradRef, MultiTensor, TensorRef};
use ferrotron::parallel::ddp::{
    DdpConfig, DistOptConfig, DistributedDataParallel, DistributedOptimizer, GradAveraging,
    ParamId, ParamRegistry,
};
use ferrotron::parallel::linear::{ColumnOptions, ColumnParallelLinear, LinearGrads, WeightGrad};
use ferrotron::{DType, Device, Error, Stream};
use half::bf16;

/// Shapes of the test model (registration order): several buckets at the
/// bucket sizes used below, 1-D and 2-D tensors, and two dtype groups.
const SHAPES: &[(&str, &[usize], DType)] = &[
    ("embed", &[10, 7], DType::F32),
    ("ln.gain", &[7], DType::BF16),
    ("w1", &[7, 12], DType::F32),
    ("b1", &[12], DType::F32),
    ("w2", &[12, 5], DType::BF16),
    ("head", &[5, 9], DType::F32),
];

fn registry() -> (ParamRegistry, Vec<ParamId>) {
    let mut reg = ParamRegistry::new();
    let ids = SHAPES
        .iter()
        .map(|(n, s, d)| reg.register(n, s, *d).unwrap())
        .collect();
    (reg, ids)
}

#[track_caller]
fn close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    common::assert_close_each(what, got.iter().map(|&g| g as f64), want, tol);
}

/// Writes `vals` into `id`'s gradient on `stream`.
fn write_grad(ddp: &DistributedDataParallel<'_>, stream: &Stream, id: ParamId, vals: &[f64]) {
    let mut view = ddp.buffers().grad::<f32>(id).unwrap();
    let host: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
    stream.copy_from_host(&host, &mut view).unwrap();
}

fn read_grad(ddp: &DistributedDataParallel<'_>, stream: &Stream, id: ParamId) -> Vec<f32> {
    let view = ddp.buffers().grad::<f32>(id).unwrap();
    let mut out = vec![0f32; view.len()];
    stream.copy_to_host(&view, &mut out).unwrap();
    out
}

/// Three micro-batches of random gradients per rank (accumulated in the
/// buffers, communication only after the last), then checks every rank's
/// reduced gradients (all of them, or its shards) against the f64 mean.
fn accumulate_and_reduce(
    dp: usize,
    distributed_optimizer: bool,
    averaging: GradAveraging,
    seed: u64,
) {
    run_ranks(dp, |comm| {
        let (reg, ids) = registry();
        let config = DdpConfig {
            bucket_size: Some(60),
            distributed_optimizer,
            averaging,
            check_for_nan_in_grad: true,
        };
        let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
        assert!(
            ddp.buckets().len() >= 3,
            "several buckets: {:?}",
            ddp.buckets()
        );
        let compute = comm.device().new_stream().unwrap();
        let rank = comm.rank();
        let mut local: Vec<Vec<f64>> = SHAPES.iter().map(|s| vec![0.0; numel(s.1)]).collect();
        for mb in 0..3 {
            ddp.set_is_last_microbatch(mb == 2).unwrap();
            // Backward: gradients appear in reverse registration order.
            for (p, &id) in ids.iter().enumerate().rev() {
                let g = grad_of(seed, rank, mb, p, local[p].len());
                local[p].iter_mut().zip(&g).for_each(|(a, b)| *a += b);
                write_grad(&ddp, &compute, id, &local[p]);
                ddp.mark_grad_ready(&compute, id).unwrap();
            }
            if mb < 2 {
                // no_sync: nothing was reduced, the buffers are this rank's own.
                assert!(ddp
                    .buckets()
                    .iter()
                    .all(|&b| ddp.bucket_event(b).unwrap().is_none()));
                for (p, &id) in ids.iter().enumerate() {
                    close(
                        &format!("rank {rank} mb {mb} local {}", SHAPES[p].0),
                        &read_grad(&ddp, &compute, id),
                        &local[p]
                            .iter()
                            .map(|&x| x as f32 as f64)
                            .collect::<Vec<_>>(),
                        0.0,
                    );
                }
            }
        }
        ddp.finish_grad_sync(&compute).unwrap();
        compute.synchronize().unwrap();
        // The f64 mean over ranks of the accumulated gradients.
        let mean: Vec<Vec<f64>> = SHAPES
            .iter()
            .enumerate()
            .map(|(p, s)| {
                let n = numel(s.1);
                let mut m = vec![0.0; n];
                for r in 0..dp {
                    for mb in 0..3 {
                        let g = grad_of(seed, r, mb, p, n);
                        m.iter_mut().zip(&g).for_each(|(a, b)| *a += b / dp as f64);
                    }
                }
                m
            })
            .collect();
        let want_scale = if averaging == GradAveraging::Sum {
            dp as f64
        } else {
            1.0
        };
        let b = ddp.buffers();
        if !distributed_optimizer {
            for (p, &id) in ids.iter().enumerate() {
                let want: Vec<f64> = mean[p].iter().map(|v| v * want_scale).collect();
                close(
                    &format!("rank {rank} {}", SHAPES[p].0),
                    &read_grad(&ddp, &compute, id),
                    &want,
                    1e-5,
                );
            }
        } else {
            // Each rank's shard of every bucket holds the mean of its range.
            let mut checked = 0;
            for g in 0..b.num_groups() {
                let mut full = vec![0.0f64; b.group_grad::<f32>(g).unwrap().len()];
                for (p, &id) in ids.iter().enumerate() {
                    if b.bucket_of(id).unwrap().group == g {
                        let (lo, hi) = b.param_range(id).unwrap();
                        full[lo..hi]
                            .iter_mut()
                            .zip(&mean[p])
                            .for_each(|(a, m)| *a = m * want_scale);
                    }
                }
                let got = b.group_grad::<f32>(g).unwrap().to_host().unwrap();
                for &bid in ddp.buckets().iter().filter(|x| x.group == g) {
                    let bucket = b.bucket_range(bid).unwrap();
                    let each = (bucket.1 - bucket.0) / dp;
                    assert_eq!(
                        each * dp,
                        bucket.1 - bucket.0,
                        "bucket padded to a multiple of dp"
                    );
                    let (lo, hi) = (bucket.0 + rank * each, bucket.0 + (rank + 1) * each);
                    close(
                        &format!("rank {rank} group {g} shard {lo}..{hi}"),
                        &got[lo..hi],
                        &full[lo..hi],
                        1e-5,
                    );
                    checked += hi - lo;
                }
            }
            assert!(checked > 0);
        }
    });
}

#[test]
fn all_reduce_equals_mean_over_ranks() {
    for dp in [1, 2, 4] {
        accumulate_and_reduce(dp, false, GradAveraging::PreScale, 11 + dp as u64);
    }
}

#[test]
fn all_reduce_with_collective_average_and_plain_sum() {
    accumulate_and_reduce(2, false, GradAveraging::Average, 5);
    accumulate_and_reduce(4, false, GradAveraging::Sum, 6);
}

#[test]
fn reduce_scatter_shard_equals_mean_of_its_range() {
    for dp in [1, 2, 4] {
        accumulate_and_reduce(dp, true, GradAveraging::PreScale, 21 + dp as u64);
    }
}

/// A bucket's reduction is enqueued (and completes) as soon as its last
/// gradient is marked ready, while later buckets' gradients are not even
/// written: reductions are not deferred to `finish_grad_sync`.
#[test]
fn first_bucket_reduces_before_later_gradients_exist() {
    for distributed_optimizer in [false, true] {
        run_ranks(2, |comm| {
            let (reg, ids) = registry();
            let config = DdpConfig {
                bucket_size: Some(60),
                distributed_optimizer,
                ..DdpConfig::default()
            };
            let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
            let compute = comm.device().new_stream().unwrap();
            let rank = comm.rank();
            let first = ddp.buckets()[0];
            let in_first = ddp.buffers().bucket_params(first).unwrap();
            for &id in &in_first {
                write_grad(
                    &ddp,
                    &compute,
                    id,
                    &vec![rank as f64 + 1.0; ddp.buffers().info(id).unwrap().numel],
                );
                ddp.mark_grad_ready(&compute, id).unwrap();
            }
            let ev = ddp
                .bucket_event(first)
                .unwrap()
                .expect("bucket 0's reduction started");
            ev.synchronize().unwrap();
            for &b in &ddp.buckets()[1..] {
                assert!(ddp.bucket_event(b).unwrap().is_none(), "{b:?} not started");
            }
            // Bucket 0 holds the mean ((1 + 2) / 2) already (its shard, with
            // the distributed optimizer).
            let (lo, hi) = ddp.buffers().bucket_range(first).unwrap();
            let all = ddp
                .buffers()
                .group_grad::<f32>(first.group)
                .unwrap()
                .to_host()
                .unwrap();
            let (lo, hi) = if distributed_optimizer {
                let each = (hi - lo) / 2;
                (lo + rank * each, lo + (rank + 1) * each)
            } else {
                (lo, hi)
            };
            let owned: Vec<(usize, usize)> = in_first
                .iter()
                .map(|&id| ddp.buffers().param_range(id).unwrap())
                .collect();
            for (i, &v) in all.iter().enumerate().take(hi).skip(lo) {
                let in_param = owned.iter().any(|&(a, z)| (a..z).contains(&i));
                assert_eq!(
                    v,
                    if in_param { 1.5 } else { 0.0 },
                    "rank {rank} element {i}"
                );
            }
            // The rest of the backward, then the sync.
            for &id in ids.iter().rev().filter(|id| !in_first.contains(id)) {
                write_grad(
                    &ddp,
                    &compute,
                    id,
                    &vec![1.0; ddp.buffers().info(id).unwrap().numel],
                );
                ddp.mark_grad_ready(&compute, id).unwrap();
            }
            ddp.finish_grad_sync(&compute).unwrap();
            compute.synchronize().unwrap();
            assert!(ddp
                .buckets()
                .iter()
                .all(|&b| ddp.bucket_event(b).unwrap().is_none()));
        });
    }
}

/// A column-parallel layer's weight-gradient GEMM accumulates (`beta = 1`,
/// fp32) straight into its gradient view of the contiguous buffer, over two
/// micro-batches; the data-parallel reduction then averages it.
#[test]
fn tensor_parallel_layer_accumulates_into_the_grad_buffer() {
    let (tokens, inp, out) = (4, 8, 6);
    run_ranks(2, |comm| {
        let dev = comm.device().clone();
        let tp = Communicator::in_process(std::slice::from_ref(&dev))
            .unwrap()
            .remove(0);
        let w: Vec<bf16> = values(1, out * inp)
            .iter()
            .map(|&v| bf16::from_f64(v))
            .collect();
        let options = ColumnOptions {
            bias: false,
            ..ColumnOptions::default()
        };
        let mut layer = ColumnParallelLinear::from_full(&tp, inp, out, &w, None, options).unwrap();
        let mut reg = ParamRegistry::new();
        let id = reg.register("fc.weight", &[out, inp], DType::BF16).unwrap();
        let mut ddp = DistributedDataParallel::new(&comm, reg, DdpConfig::default()).unwrap();
        let stream = dev.new_stream().unwrap();
        let rank = comm.rank();
        let data = |r: usize, mb: usize| {
            let x: Vec<bf16> = values(100 + 10 * r as u64 + mb as u64, tokens * inp)
                .iter()
                .map(|&v| bf16::from_f64(v))
                .collect();
            let dy: Vec<bf16> = values(200 + 10 * r as u64 + mb as u64, tokens * out)
                .iter()
                .map(|&v| bf16::from_f64(v))
                .collect();
            (x, dy)
        };
        for mb in 0..2 {
            ddp.set_is_last_microbatch(mb == 1).unwrap();
            let (x, dy) = data(rank, mb);
            let (x, dy) = (dev.upload(&x).unwrap(), dev.upload(&dy).unwrap());
            let mut dx = dev.alloc_zeros::<bf16>(tokens * inp).unwrap();
            {
                let mut main_grad = ddp.buffers().grad::<f32>(id).unwrap();
                let grads = LinearGrads {
                    weight: WeightGrad::Accumulate(&mut main_grad),
                    bias: None,
                };
                layer
                    .backward(&tp, &stream, &x, &dy, None, &mut dx, grads, tokens)
                    .unwrap();
            }
            ddp.mark_grad_ready(&stream, id).unwrap();
        }
        ddp.finish_grad_sync(&stream).unwrap();
        let got = read_grad(&ddp, &stream, id);
        // mean over ranks of sum over micro-batches of dY^T X (bf16 inputs).
        let mut want = vec![0.0f64; out * inp];
        for r in 0..2 {
            for mb in 0..2 {
                let (x, dy) = data(r, mb);
                for o in 0..out {
                    for i in 0..inp {
                        let s: f64 = (0..tokens)
                            .map(|t| dy[t * out + o].to_f64() * x[t * inp + i].to_f64())
                            .sum();
                        want[o * inp + i] += s / 2.0;
                    }
                }
            }
        }
        close(
            &format!("rank {rank} fc.weight main_grad"),
            &got,
            &want,
            1e-4,
        );
    });
}

/// Initial parameter values (rounded to the param dtype).
fn init_param(p: usize, d: DType, n: usize) -> Vec<f64> {
    values(777 + p as u64, n)
        .into_iter()
        .map(|v| match d {
            DType::BF16 => bf16::from_f64(v).to_f64(),
            _ => v as f32 as f64,
        })
        .collect()
}

/// The single-rank reference: full gradient = mean over ranks, clip, plain
/// FusedAdam over every parameter with a model copy in the param dtype.
fn reference_params(
    dp: usize,
    steps: usize,
    seed: u64,
    cfg: &DistOptConfig,
    lr: f32,
) -> (Vec<Vec<f64>>, f32) {
    let dev = Device::emu();
    let s = dev.new_stream().unwrap();
    let n = SHAPES.len();
    let mut master: Vec<_> = (0..n)
        .map(|p| {
            dev.upload(
                &init_param(p, SHAPES[p].2, numel(SHAPES[p].1))
                    .iter()
                    .map(|&v| v as f32)
                    .collect::<Vec<_>>(),
            )
            .unwrap()
        })
        .collect();
    let mut m: Vec<_> = (0..n)
        .map(|p| dev.alloc_zeros::<f32>(numel(SHAPES[p].1)).unwrap())
        .collect();
    let mut v: Vec<_> = (0..n)
        .map(|p| dev.alloc_zeros::<f32>(numel(SHAPES[p].1)).unwrap())
        .collect();
    let mut models32: Vec<_> = (0..n)
        .map(|p| dev.alloc_zeros::<f32>(numel(SHAPES[p].1)).unwrap())
        .collect();
    let mut models16: Vec<_> = (0..n)
        .map(|p| dev.alloc_zeros::<bf16>(numel(SHAPES[p].1)).unwrap())
        .collect();
    let shapes: Vec<&[usize]> = SHAPES.iter().map(|s| s.1).collect();
    let wd = default_weight_decay(&shapes, cfg.weight_decay);
    let mut adam = FusedAdam::new(cfg.adam).unwrap();
    let mut mt = MultiTensor::new();
    let mut scalars = AdamScalars::new(&s, lr).unwrap();
    let mut norm = dev.alloc_zeros::<f32>(1).unwrap();
    let lens: Vec<usize> = SHAPES.iter().map(|s| numel(s.1)).collect();
    for step in 0..steps {
        let grads = reference_grads(
            &s,
            &mut mt,
            &mut norm,
            (seed, dp, step),
            &lens,
            cfg.max_grad_norm,
        );
        let gl: Vec<TensorRef<'_>> = grads.iter().map(TensorRef::from).collect();
        let mut ml: Vec<GradRef<'_>> = Vec::new();
        for (p, (a, b)) in models32.iter_mut().zip(models16.iter_mut()).enumerate() {
            ml.push(if SHAPES[p].2 == DType::BF16 {
                GradRef::from(b)
            } else {
                GradRef::from(a)
            });
        }
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
    }
    s.synchronize().unwrap();
    let params = (0..n)
        .map(|p| {
            if SHAPES[p].2 == DType::BF16 {
                models16[p]
                    .to_host()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_f64())
                    .collect()
            } else {
                models32[p]
                    .to_host()
                    .unwrap()
                    .iter()
                    .map(|&x| x as f64)
                    .collect()
            }
        })
        .collect();
    (params, norm.to_host().unwrap()[0])
}

/// `sharded = false`: plain DDP (all-reduce) with the optimizer replicated
/// on every rank over the whole buckets (`allocate_param_buffers`).
fn distributed_optimizer_matches_single_rank(dp: usize, max_grad_norm: Option<f64>, sharded: bool) {
    let steps = 2;
    let seed = 99 + dp as u64;
    let lr = 1e-2;
    let cfg = DistOptConfig {
        adam: AdamConfig::default(),
        weight_decay: 0.1,
        max_grad_norm,
    };
    let (want, want_norm) = reference_params(dp, steps, seed, &cfg, lr);
    run_ranks(dp, |comm| {
        let (reg, ids) = registry();
        let config = DdpConfig {
            bucket_size: Some(60),
            distributed_optimizer: sharded,
            ..DdpConfig::default()
        };
        let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
        if !sharded {
            assert_eq!(
                arg_of(DistributedOptimizer::new(&ddp, cfg).unwrap_err()),
                "ddp"
            );
            ddp.allocate_param_buffers().unwrap();
        }
        let compute = comm.device().new_stream().unwrap();
        let rank = comm.rank();
        for (p, &id) in ids.iter().enumerate() {
            let init = init_param(p, SHAPES[p].2, numel(SHAPES[p].1));
            if SHAPES[p].2 == DType::BF16 {
                let mut view = ddp.buffers().param::<bf16>(id).unwrap();
                compute
                    .copy_from_host(
                        &init.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>(),
                        &mut view,
                    )
                    .unwrap();
            } else {
                let mut view = ddp.buffers().param::<f32>(id).unwrap();
                compute
                    .copy_from_host(
                        &init.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                        &mut view,
                    )
                    .unwrap();
            }
        }
        compute.synchronize().unwrap();
        let mut opt = DistributedOptimizer::new(&ddp, cfg).unwrap();
        let mut scalars = AdamScalars::new(&compute, lr).unwrap();
        for step in 0..steps {
            ddp.zero_grad_buffer(&compute).unwrap();
            for (p, &id) in ids.iter().enumerate().rev() {
                write_grad(
                    &ddp,
                    &compute,
                    id,
                    &grad_of(seed, rank, step, p, numel(SHAPES[p].1)),
                );
                ddp.mark_grad_ready(&compute, id).unwrap();
            }
            if step == 0 {
                // Stepping on gradients that were not synchronised is an error.
                let e = opt
                    .step(&mut ddp, &compute, &mut scalars, None)
                    .unwrap_err();
                assert_eq!(arg_of(e), "ddp");
            }
            ddp.finish_grad_sync(&compute).unwrap();
            opt.step(&mut ddp, &compute, &mut scalars, None).unwrap();
        }
        compute.synchronize().unwrap();
        assert_eq!(scalars.step().unwrap(), steps as i32);
        // The global gradient norm of the last step (sum, not mean, would
        // pass the parameter check: Adam is scale-invariant).
        let norm = opt.grad_norm().to_host().unwrap()[0];
        assert!(
            (norm - want_norm).abs() <= 1e-5 * want_norm,
            "rank {rank}: grad norm {norm}, want {want_norm}"
        );
        for (p, &id) in ids.iter().enumerate() {
            let got: Vec<f32> = if SHAPES[p].2 == DType::BF16 {
                ddp.buffers()
                    .param::<bf16>(id)
                    .unwrap()
                    .to_host()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_f32())
                    .collect()
            } else {
                ddp.buffers().param::<f32>(id).unwrap().to_host().unwrap()
            };
            // fp32: reduction order only; bf16: at most one rounding step apart.
            let tol = if SHAPES[p].2 == DType::BF16 {
                8e-3
            } else {
                1e-5
            };
            close(
                &format!("dp {dp} rank {rank} {}", SHAPES[p].0),
                &got,
                &want[p],
                tol,
            );
        }
    });
}

#[test]
fn distributed_optimizer_two_steps_equal_single_rank_adam() {
    for dp in [2, 4] {
        distributed_optimizer_matches_single_rank(dp, Some(1.0), true);
    }
    distributed_optimizer_matches_single_rank(2, None, true);
}

#[test]
fn replicated_optimizer_over_plain_ddp_equals_single_rank_adam() {
    distributed_optimizer_matches_single_rank(2, Some(1.0), false);
    distributed_optimizer_matches_single_rank(4, None, false);
}

fn arg_of(e: Error) -> &'static str {
    match e {
        Error::InvalidArgument { arg, .. } => arg,
        other => panic!("not an InvalidArgument: {other:?}"),
    }
}

#[test]
fn bad_input_is_a_named_error() {
    run_ranks(1, |comm| {
        let mut reg = ParamRegistry::new();
        reg.register("w", &[4, 4], DType::F32).unwrap();
        let e = reg.register("w", &[2], DType::F32).unwrap_err();
        assert_eq!(arg_of(e.clone()), "name");
        assert!(e.to_string().contains("registered twice"), "{e}");
        assert_eq!(
            arg_of(reg.register("x", &[2], DType::I32).unwrap_err()),
            "param_dtype"
        );
        assert_eq!(
            arg_of(reg.register("y", &[usize::MAX, 2], DType::F32).unwrap_err()),
            "shape"
        );
        let b = reg.register("b", &[4], DType::F32).unwrap();

        let zero = DdpConfig {
            bucket_size: Some(0),
            ..DdpConfig::default()
        };
        assert_eq!(
            arg_of(DistributedDataParallel::new(&comm, reg.clone(), zero).unwrap_err()),
            "bucket_size"
        );
        assert_eq!(
            arg_of(
                DistributedDataParallel::new(&comm, ParamRegistry::new(), DdpConfig::default())
                    .unwrap_err()
            ),
            "registry"
        );

        let mut ddp = DistributedDataParallel::new(&comm, reg, DdpConfig::default()).unwrap();
        let s = comm.device().new_stream().unwrap();
        let e = ddp.buffers().id("nope").unwrap_err();
        assert!(e.to_string().contains("unknown parameter"), "{e}");
        let mut other = ParamRegistry::new();
        for i in 0..5 {
            other.register(&format!("p{i}"), &[1], DType::F32).unwrap();
        }
        let foreign = other.register("p5", &[1], DType::F32).unwrap();
        let e = ddp.mark_grad_ready(&s, foreign).unwrap_err();
        assert!(e.to_string().contains("unknown parameter"), "{e}");
        assert_eq!(arg_of(ddp.buffers().grad::<bf16>(b).unwrap_err()), "grad");
        assert_eq!(arg_of(ddp.buffers().param::<f32>(b).unwrap_err()), "param");

        ddp.mark_grad_ready(&s, b).unwrap();
        let e = ddp.mark_grad_ready(&s, b).unwrap_err();
        assert!(e.to_string().contains("'b' (marked ready twice)"), "{e}");
        assert_eq!(
            arg_of(ddp.set_is_last_microbatch(false).unwrap_err()),
            "is_last_microbatch"
        );
        let e = ddp.finish_grad_sync(&s).unwrap_err();
        assert!(
            e.to_string().contains("'w'"),
            "names the missing parameter: {e}"
        );

        // Configs checked at construction, before the DDP (as the C ABI does).
        for (cfg, arg) in [
            (
                DistOptConfig {
                    weight_decay: f32::NAN,
                    ..DistOptConfig::default()
                },
                "weight_decay",
            ),
            (
                DistOptConfig {
                    weight_decay: -0.1,
                    ..DistOptConfig::default()
                },
                "weight_decay",
            ),
            (
                DistOptConfig {
                    max_grad_norm: Some(-1.0),
                    ..DistOptConfig::default()
                },
                "max_grad_norm",
            ),
        ] {
            assert_eq!(
                arg_of(DistributedOptimizer::new(&ddp, cfg).unwrap_err()),
                arg
            );
        }
        // ZeRO-1 on a plain-DDP model.
        assert_eq!(
            arg_of(DistributedOptimizer::new(&ddp, DistOptConfig::default()).unwrap_err()),
            "ddp"
        );
    });

    // dp that does not divide an (unpadded) bucket cannot be sharded.
    use ferrotron::core::ddp_layout::{layout, shard, LayoutConfig};
    let l = layout(
        &[7],
        LayoutConfig {
            bucket_size: 10,
            dp: 2,
            distributed_optimizer: false,
        },
    )
    .unwrap();
    assert_eq!(arg_of(shard(&l.buckets[0], 2, 0).unwrap_err()), "dp");
}

#[test]
fn nan_check_names_the_parameter() {
    run_ranks(1, |comm| {
        let (reg, ids) = registry();
        let config = DdpConfig {
            check_for_nan_in_grad: true,
            ..DdpConfig::default()
        };
        let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
        let s = comm.device().new_stream().unwrap();
        for (p, &id) in ids.iter().enumerate().rev() {
            let mut g = vec![0.5; numel(SHAPES[p].1)];
            if SHAPES[p].0 == "w1" {
                g[3] = f64::INFINITY;
            }
            write_grad(&ddp, &s, id, &g);
            let r = ddp.mark_grad_ready(&s, id);
            if p == 0 {
                let e = r.unwrap_err();
                assert!(e.to_string().contains("'w1'"), "{e}");
            } else {
                r.unwrap();
            }
        }
    });
}

#[test]
fn memory_per_param_matches_megatrons_table() {
    use ferrotron::parallel::ddp::bytes_per_param;
    let b = |p, g, d| bytes_per_param(p, g, d).unwrap();
    for dp in [1usize, 8, 64] {
        assert_eq!(b(DType::BF16, DType::F32, false).at(dp), 18.0);
        assert_eq!(
            b(DType::BF16, DType::F32, true).at(dp),
            6.0 + 12.0 / dp as f64
        );
        assert_eq!(
            b(DType::F16, DType::F16, true).at(dp),
            4.0 + 16.0 / dp as f64
        );
        assert_eq!(
            b(DType::F32, DType::F32, true).at(dp),
            8.0 + 8.0 / dp as f64
        );
    }
}

/// With a loss scaler: gradients scaled by 1024 and unscaled on the shard
/// give the unscaled single-rank result; an Inf on one rank only (in a shard
/// another rank owns, for some ranks) skips the step on every rank.
#[test]
fn distributed_optimizer_unscales_and_skips_overflow_on_every_rank() {
    use ferrotron::core::loss_scaler::GradScalerConfig;
    use ferrotron::ops::multi_tensor::DeviceGradScaler;
    let (dp, seed, lr, scale) = (2, 314, 1e-2, 1024.0);
    let cfg = DistOptConfig {
        adam: AdamConfig::default(),
        weight_decay: 0.1,
        max_grad_norm: Some(1.0),
    };
    let (want, _) = reference_params(dp, 1, seed, &cfg, lr);
    run_ranks(dp, |comm| {
        let (reg, ids) = registry();
        let config = DdpConfig {
            bucket_size: Some(60),
            distributed_optimizer: true,
            ..DdpConfig::default()
        };
        let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
        let compute = comm.device().new_stream().unwrap();
        let rank = comm.rank();
        for (p, &id) in ids.iter().enumerate() {
            let init = init_param(p, SHAPES[p].2, numel(SHAPES[p].1));
            if SHAPES[p].2 == DType::BF16 {
                let mut view = ddp.buffers().param::<bf16>(id).unwrap();
                let host: Vec<bf16> = init.iter().map(|&x| bf16::from_f64(x)).collect();
                compute.copy_from_host(&host, &mut view).unwrap();
            } else {
                let mut view = ddp.buffers().param::<f32>(id).unwrap();
                let host: Vec<f32> = init.iter().map(|&x| x as f32).collect();
                compute.copy_from_host(&host, &mut view).unwrap();
            }
        }
        compute.synchronize().unwrap();
        let mut opt = DistributedOptimizer::new(&ddp, cfg).unwrap();
        let mut scalars = AdamScalars::new(&compute, lr).unwrap();
        let scaler_cfg = GradScalerConfig {
            initial_scale: scale,
            growth_interval: 1000,
            ..GradScalerConfig::default()
        };
        let scaler = DeviceGradScaler::new(comm.device(), scaler_cfg).unwrap();
        let mut found_inf = comm.device().alloc_zeros::<f32>(1).unwrap();
        for step in 0..2 {
            ddp.zero_grad_buffer(&compute).unwrap();
            for (p, &id) in ids.iter().enumerate().rev() {
                let mut g: Vec<f64> = grad_of(seed, rank, 0, p, numel(SHAPES[p].1))
                    .iter()
                    .map(|x| x * scale as f64)
                    .collect();
                if step == 1 && rank == 1 && p == 0 {
                    g[0] = f64::INFINITY;
                }
                write_grad(&ddp, &compute, id, &g);
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
            let flag = found_inf.to_host().unwrap()[0];
            assert_eq!(
                flag,
                if step == 1 { 1.0 } else { 0.0 },
                "rank {rank} step {step} found_inf"
            );
        }
        compute.synchronize().unwrap();
        assert_eq!(
            scalars.step().unwrap(),
            1,
            "the overflowing step was skipped"
        );
        for (p, &id) in ids.iter().enumerate() {
            let got: Vec<f32> = if SHAPES[p].2 == DType::BF16 {
                let v = ddp.buffers().param::<bf16>(id).unwrap().to_host().unwrap();
                v.iter().map(|x| x.to_f32()).collect()
            } else {
                ddp.buffers().param::<f32>(id).unwrap().to_host().unwrap()
            };
            let tol = if SHAPES[p].2 == DType::BF16 {
                8e-3
            } else {
                1e-5
            };
            close(&format!("rank {rank} {}", SHAPES[p].0), &got, &want[p], tol);
        }
    });
}

/// Groups by (param dtype, grad dtype), reverse registration order inside a
/// group, distributed-optimizer alignment, and views that alias the
/// contiguous buffer.
#[test]
fn buffers_are_contiguous_in_reverse_order_grouped_by_dtype() {
    run_ranks(2, |comm| {
        let (reg, ids) = registry();
        let config = DdpConfig {
            bucket_size: Some(60),
            distributed_optimizer: true,
            ..DdpConfig::default()
        };
        let ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
        let b = ddp.buffers();
        assert_eq!(b.num_groups(), 2, "f32 and bf16 params (both fp32 grads)");
        let range = |i: usize| b.param_range(ids[i]).unwrap();
        let group = |i: usize| b.bucket_of(ids[i]).unwrap().group;
        // f32 group: embed(70), w1(84), b1(12), head(45) laid out head, b1, w1, embed.
        assert_eq!([group(0), group(2), group(3), group(5)], [0; 4]);
        assert_eq!(range(5), (0, 45));
        assert_eq!(range(3), (64, 76));
        assert_eq!(range(2), (128, 212));
        // b1 closes bucket 0 (76 >= 60 elements), whose end is padded to a
        // multiple of lcm(2, 128) = 128; w1 and embed get a bucket each.
        let bucket = |i: usize| b.bucket_range(b.bucket_of(ids[i]).unwrap()).unwrap();
        assert_eq!(bucket(3), (0, 128));
        assert_eq!(bucket(5), (0, 128));
        assert_eq!(bucket(2), (128, 256));
        assert_eq!(range(0), (256, 326));
        assert_eq!(bucket(0), (256, 384));
        assert_eq!([group(1), group(4)], [1, 1]);
        assert_eq!(range(4), (0, 60));
        assert_eq!(bucket(4), (0, 128));
        assert_eq!(range(1), (128, 135));
        assert_eq!(bucket(1), (128, 256));
        // A write through a parameter's view lands in the group buffer.
        let s = comm.device().new_stream().unwrap();
        write_grad(&ddp, &s, ids[3], &[7.0; 12]);
        s.synchronize().unwrap();
        let all = b.group_grad::<f32>(0).unwrap().to_host().unwrap();
        assert!(all[64..76].iter().all(|&v| v == 7.0));
        assert!(all[..64].iter().chain(&all[76..]).all(|&v| v == 0.0));
    });
}

/// bf16 gradients (their own group) are reduced in bf16, in both modes.
#[test]
fn bf16_gradients_reduce_in_their_own_group() {
    for distributed_optimizer in [false, true] {
        run_ranks(2, |comm| {
            let mut reg = ParamRegistry::new();
            let a = reg.register("a", &[3, 50], DType::BF16).unwrap();
            let h = reg
                .register_with_grad("h", &[40], DType::BF16, DType::BF16)
                .unwrap();
            let config = DdpConfig {
                bucket_size: Some(16),
                distributed_optimizer,
                ..DdpConfig::default()
            };
            let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
            assert_eq!(ddp.buffers().num_groups(), 2);
            assert!(ddp.buffers().grad::<f32>(h).is_err());
            let s = comm.device().new_stream().unwrap();
            let r = comm.rank() as f32;
            // Small multiples of 1/4: sums and halves are exact in bf16.
            let host: Vec<bf16> = (0..40)
                .map(|i| bf16::from_f32((i % 8) as f32 * 0.25 + r))
                .collect();
            {
                let mut v = ddp.buffers().grad::<bf16>(h).unwrap();
                s.copy_from_host(&host, &mut v).unwrap();
            }
            ddp.mark_grad_ready(&s, h).unwrap();
            ddp.mark_grad_ready(&s, a).unwrap();
            ddp.finish_grad_sync(&s).unwrap();
            s.synchronize().unwrap();
            let got = ddp.buffers().grad::<bf16>(h).unwrap().to_host().unwrap();
            let (lo, hi) = ddp.buffers().param_range(h).unwrap();
            let bucket = ddp
                .buffers()
                .bucket_range(ddp.buffers().bucket_of(h).unwrap())
                .unwrap();
            for (i, g) in got.iter().enumerate() {
                let at = lo + i;
                let owned = if distributed_optimizer {
                    let each = (bucket.1 - bucket.0) / 2;
                    let start = bucket.0 + comm.rank() * each;
                    (start..start + each).contains(&at)
                } else {
                    true
                };
                if owned {
                    assert_eq!(
                        g.to_f32(),
                        (i % 8) as f32 * 0.25 + 0.5,
                        "rank {} h[{i}]",
                        comm.rank()
                    );
                }
            }
            assert!(hi > lo);
        });
    }
}
