//! Checkpoints of the distributed optimizer (feature `checkpoint`): a
//! checkpoint saved at dp = 4 loads at dp = 2 with another bucket size and
//! gives the same next step as dp = 4 taking both steps; save → load → save
//! reproduces the file's tensors bit for bit; plain DDP's replicated
//! optimizer writes and reads the same file; a checkpoint of another model
//! or an unreadable file is a named error.
#![cfg(feature = "checkpoint")]

mod common;

use common::ddp::{numel, run_ranks, values};
use ferrotron::ops::adam::AdamScalars;
use ferrotron::parallel::ddp::{
    load_checkpoint, save_checkpoint, DdpConfig, DistOptConfig, DistributedDataParallel,
    DistributedOptimizer, ParamId, ParamRegistry,
};
use ferrotron::{DType, Error};
use half::bf16;
use safetensors::tensor::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const LR: f32 = 1e-2;
/// The data-parallel size whose per-rank gradients define every step.
const VIRTUAL_DP: usize = 4;

type Shape = (&'static str, &'static [usize], DType);

/// Several buckets at the bucket sizes used, 1-D and 2-D, two dtype groups.
const SHAPES: &[Shape] = &[
    ("embed", &[10, 7], DType::F32),
    ("ln.gain", &[7], DType::BF16),
    ("w1", &[7, 12], DType::F32),
    ("b1", &[12], DType::F32),
    ("w2", &[12, 5], DType::BF16),
    ("head", &[5, 9], DType::F32),
];

fn registry(shapes: &[Shape]) -> (ParamRegistry, Vec<ParamId>) {
    let mut reg = ParamRegistry::new();
    let ids = shapes
        .iter()
        .map(|(n, s, d)| reg.register(n, s, *d).unwrap())
        .collect();
    (reg, ids)
}

/// The gradient of parameter `p` at `step` on rank `rank` of `dp`: the mean
/// of the gradients of the `VIRTUAL_DP / dp` virtual ranks it stands for,
/// so the mean over ranks is the same at every dp.
fn grad(step: usize, p: usize, rank: usize, dp: usize, len: usize) -> Vec<f32> {
    let k = VIRTUAL_DP / dp;
    let mut g = vec![0.0f64; len];
    for v in rank * k..(rank + 1) * k {
        let x = values(
            0xC0FFEE ^ ((v as u64) << 40) ^ ((step as u64) << 32) ^ ((p as u64) << 16),
            len,
        );
        g.iter_mut().zip(x).for_each(|(a, b)| *a += b / k as f64);
    }
    g.into_iter().map(|x| x as f32).collect()
}

fn write_param(
    ddp: &DistributedDataParallel<'_>,
    s: &ferrotron::Stream,
    id: ParamId,
    d: DType,
    v: &[f64],
) {
    if d == DType::BF16 {
        let mut view = ddp.buffers().param::<bf16>(id).unwrap();
        let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f64(x)).collect();
        s.copy_from_host(&h, &mut view).unwrap();
    } else {
        let mut view = ddp.buffers().param::<f32>(id).unwrap();
        let h: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        s.copy_from_host(&h, &mut view).unwrap();
    }
}

/// Runs steps `steps` at `dp` with `bucket_size` from the initial
/// parameters, or from `load` when given, then saves to `save` (when given).
/// Returns every rank's result of the load (errors are returned, not
/// unwrapped, so the mismatch tests can look at them).
/// The optimizer a run uses: ZeRO-1 (sharded over dp) or plain DDP's
/// replicated one.
#[derive(Clone, Copy, Debug)]
enum Opt {
    Sharded,
    Replicated,
}
use Opt::{Replicated, Sharded};

fn train(
    shapes: &[Shape],
    (dp, kind): (usize, Opt),
    bucket_size: usize,
    steps: std::ops::Range<usize>,
    load: Option<&Path>,
    save: Option<&Path>,
) -> Vec<Result<(), Error>> {
    run_ranks(dp, |comm| {
        let (reg, ids) = registry(shapes);
        let config = DdpConfig {
            bucket_size: Some(bucket_size),
            distributed_optimizer: matches!(kind, Sharded),
            ..DdpConfig::default()
        };
        let mut ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
        if matches!(kind, Replicated) {
            ddp.allocate_param_buffers().unwrap();
        }
        let compute = comm.device().new_stream().unwrap();
        for (p, &id) in ids.iter().enumerate() {
            let init = values(777 + p as u64, numel(shapes[p].1));
            write_param(&ddp, &compute, id, shapes[p].2, &init);
        }
        compute.synchronize().unwrap();
        let cfg = DistOptConfig {
            weight_decay: 0.1,
            max_grad_norm: Some(1.0),
            ..DistOptConfig::default()
        };
        let mut opt = DistributedOptimizer::new(&ddp, cfg).unwrap();
        let mut scalars = AdamScalars::new(&compute, LR).unwrap();
        if let Some(path) = load {
            load_checkpoint(&mut ddp, &mut opt, &mut scalars, &compute, path)?;
            assert_eq!(scalars.step().unwrap(), steps.start as i32);
        }
        for step in steps.clone() {
            ddp.zero_grad_buffer(&compute).unwrap();
            for (p, &id) in ids.iter().enumerate().rev() {
                let g = grad(step, p, comm.rank(), dp, numel(shapes[p].1));
                let mut view = ddp.buffers().grad::<f32>(id).unwrap();
                compute.copy_from_host(&g, &mut view).unwrap();
                drop(view);
                ddp.mark_grad_ready(&compute, id).unwrap();
            }
            ddp.finish_grad_sync(&compute).unwrap();
            opt.step(&mut ddp, &compute, &mut scalars, None).unwrap();
        }
        if let Some(path) = save {
            save_checkpoint(&ddp, &opt, &scalars, &compute, path).unwrap();
        }
        Ok(())
    })
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "ferrotron-ckpt-{}-{name}.safetensors",
        std::process::id()
    ))
}

/// Every tensor of a checkpoint as f64 values, with its dtype and shape.
fn read_all(path: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<f64>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| {
            let d = t.data();
            let v: Vec<f64> = match t.dtype() {
                Dtype::F32 => d
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                    .collect(),
                Dtype::BF16 => d
                    .chunks_exact(2)
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
                    .collect(),
                Dtype::I64 => d
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                other => panic!("unexpected dtype {other:?} of {n}"),
            };
            (n, (t.dtype(), t.shape().to_vec(), v))
        })
        .collect()
}

fn compare(a: &Path, b: &Path, f32_tol: f64, bf16_tol: f64) {
    let (a, b) = (read_all(a), read_all(b));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "tensor names"
    );
    assert_eq!(a.len(), 4 * SHAPES.len() + 1);
    for (name, (da, sa, va)) in &a {
        let (db, sb, vb) = &b[name];
        assert_eq!((da, sa), (db, sb), "{name}: dtype and shape");
        let tol = if *da == Dtype::BF16 {
            bf16_tol
        } else {
            f32_tol
        };
        common::assert_close_each(name, va.iter().copied(), vb, tol);
    }
}

#[test]
fn saved_at_dp4_loads_at_dp2_with_other_buckets_and_gives_the_same_next_step() {
    let direct = tmp("direct");
    let first = tmp("first");
    let resumed = tmp("resumed");
    let again = tmp("again");
    // dp 4 takes two steps directly.
    for r in train(SHAPES, (4, Sharded), 60, 0..2, None, Some(&direct)) {
        r.unwrap();
    }
    // dp 4 takes one step and saves; dp 2 with other buckets loads it and
    // takes the second step.
    for r in train(SHAPES, (4, Sharded), 60, 0..1, None, Some(&first)) {
        r.unwrap();
    }
    for r in train(SHAPES, (2, Sharded), 37, 1..2, Some(&first), Some(&resumed)) {
        r.unwrap();
    }
    // Same masters, moments, parameters and step count: fp32 within
    // reduction-order rounding, bf16 parameters at most one rounding apart.
    compare(&resumed, &direct, 1e-5, 8e-3);
    let step = &read_all(&resumed)["optimizer/step"].2;
    assert_eq!(step, &vec![2.0]);

    // Load at dp 2 with yet another bucket size and save at once: the same
    // tensors, bit for bit (the layout does not leak into the file).
    for r in train(SHAPES, (2, Sharded), 1000, 1..1, Some(&first), Some(&again)) {
        r.unwrap();
    }
    compare(&again, &first, 0.0, 0.0);
    for p in [direct, first, resumed, again] {
        let _ = std::fs::remove_file(p);
    }
}

/// Plain DDP's replicated optimizer writes the file ZeRO-1 writes, and
/// each loads the other's: replicated dp 2 after one step gives sharded dp
/// 4's checkpoint; replicated dp 2 resuming the sharded checkpoint, and
/// sharded dp 2 resuming the replicated one, both give the two-step run.
#[test]
fn replicated_and_sharded_optimizers_share_one_checkpoint_format() {
    let [direct, first, rep_first, rep_resumed, resumed] = [
        "kinds-direct",
        "kinds-first",
        "kinds-rep-first",
        "kinds-rep-resumed",
        "kinds-resumed",
    ]
    .map(tmp);
    let run = |dp, kind, steps, load: Option<&Path>, save: &Path| {
        for r in train(SHAPES, (dp, kind), 60, steps, load, Some(save)) {
            r.unwrap();
        }
    };
    run(4, Sharded, 0..2, None, &direct);
    run(4, Sharded, 0..1, None, &first);
    run(2, Replicated, 0..1, None, &rep_first);
    // fp32 within reduction-order rounding (all-reduce against
    // reduce-scatter), bf16 parameters at most one rounding apart.
    compare(&rep_first, &first, 1e-5, 8e-3);
    run(2, Replicated, 1..2, Some(&first), &rep_resumed);
    compare(&rep_resumed, &direct, 1e-5, 8e-3);
    run(2, Sharded, 1..2, Some(&rep_first), &resumed);
    compare(&resumed, &direct, 1e-5, 8e-3);
    assert_eq!(&read_all(&rep_resumed)["optimizer/step"].2, &vec![2.0]);
    for p in [direct, first, rep_first, rep_resumed, resumed] {
        let _ = std::fs::remove_file(p);
    }
}

fn load_error(shapes: &[Shape], path: &Path) -> Error {
    let mut errs = train(shapes, (2, Sharded), 60, 1..1, Some(path), None);
    let e = errs.pop().unwrap().unwrap_err();
    // Every rank reports the same error.
    assert_eq!(errs.pop().unwrap().unwrap_err(), e);
    e
}

fn arg_and_text(e: &Error) -> (&'static str, String) {
    match e {
        Error::InvalidArgument { arg, .. } => (arg, e.to_string()),
        other => panic!("not an InvalidArgument: {other:?}"),
    }
}

#[test]
fn a_checkpoint_of_another_model_or_an_unreadable_file_is_a_named_error() {
    let ckpt = tmp("model");
    for r in train(SHAPES, (1, Sharded), 60, 0..1, None, Some(&ckpt)) {
        r.unwrap();
    }

    // A model with one more parameter: its tensors are missing.
    let mut more = SHAPES.to_vec();
    more.push(("extra.bias", &[3], DType::F32));
    let (arg, text) = arg_and_text(&load_error(&more, &ckpt));
    assert_eq!(arg, "checkpoint");
    assert!(text.contains("missing tensor 'model/extra.bias'"), "{text}");

    // A model with one parameter fewer: the file has extra tensors.
    let (arg, text) = arg_and_text(&load_error(&SHAPES[..5], &ckpt));
    assert_eq!(arg, "checkpoint");
    assert!(
        text.contains("extra tensor") && text.contains("head"),
        "{text}"
    );

    // Another shape.
    let mut shape = SHAPES.to_vec();
    shape[2] = ("w1", &[12, 7], DType::F32);
    let (arg, text) = arg_and_text(&load_error(&shape, &ckpt));
    assert_eq!(arg, "checkpoint");
    assert!(text.contains("'model/w1' of shape [12, 7]"), "{text}");
    assert!(text.contains("shape [7, 12]"), "{text}");

    // Another parameter dtype.
    let mut dtype = SHAPES.to_vec();
    dtype[1] = ("ln.gain", &[7], DType::F32);
    let (arg, text) = arg_and_text(&load_error(&dtype, &ckpt));
    assert_eq!(arg, "checkpoint");
    assert!(text.contains("'model/ln.gain' of dtype F32"), "{text}");
    assert!(text.contains("dtype BF16"), "{text}");

    // No file; not a safetensors file.
    let missing = tmp("does-not-exist");
    let (arg, text) = arg_and_text(&load_error(SHAPES, &missing));
    assert_eq!(arg, "path");
    assert!(text.contains("does-not-exist"), "{text}");
    let garbage = tmp("garbage");
    std::fs::write(&garbage, b"not a checkpoint").unwrap();
    let (arg, text) = arg_and_text(&load_error(SHAPES, &garbage));
    assert_eq!(arg, "path");
    assert!(text.contains("a safetensors file"), "{text}");

    // The file itself loads into its own model.
    for r in train(SHAPES, (2, Sharded), 60, 1..1, Some(&ckpt), None) {
        r.unwrap();
    }
    for p in [ckpt, garbage] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn an_unwritable_path_fails_on_every_rank() {
    let bad = std::env::temp_dir()
        .join(format!("ferrotron-no-such-dir-{}", std::process::id()))
        .join("x.safetensors");
    let errs = run_ranks(2, |comm| {
        let (reg, _) = registry(SHAPES);
        let config = DdpConfig {
            bucket_size: Some(60),
            distributed_optimizer: true,
            ..DdpConfig::default()
        };
        let ddp = DistributedDataParallel::new(&comm, reg, config).unwrap();
        let compute = comm.device().new_stream().unwrap();
        let opt = DistributedOptimizer::new(&ddp, DistOptConfig::default()).unwrap();
        let scalars = AdamScalars::new(&compute, LR).unwrap();
        save_checkpoint(&ddp, &opt, &scalars, &compute, &bad).unwrap_err()
    });
    for e in errs {
        assert_eq!(arg_and_text(&e).0, "path", "{e}");
    }
}
