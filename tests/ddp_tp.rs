//! "Reduce every gradient exactly once" at tp 2 x dp 2 (four in-process
//! ranks): a LayerNorm on sequence-parallel rows followed by the TP MLP
//! under sequence parallelism. The LayerNorm gain and bias are replicated
//! over TP with per-rank partial gradients (`ParamKind::TpDuplicated`, summed
//! over TP by `finalize_model_grads`); the MLP's second bias comes back from
//! ferrotron already summed over TP (`ParamKind::Local`, must not be reduced
//! again). Every gradient of every rank is compared with one rank running
//! the whole batch; registering the LayerNorm gain `Local` (never reduced)
//! or the MLP's second bias `TpDuplicated` (reduced twice) must break the
//! comparison for exactly that parameter.

mod common;

use std::time::Duration;

use common::ranks::run_ranks_with_timeout;
use ferrotron::comm::Communicator;
use ferrotron::ops::LayerNorm;
use ferrotron::parallel::ddp::{
    DdpConfig, DistributedDataParallel, GradAveraging, ParamKind, ParamRegistry,
};
use ferrotron::parallel::linear::{LinearGrads, WeightGrad};
use ferrotron::parallel::mlp::{MlpGrads, MlpOptions, TpMlp};
use ferrotron::{DType, DeviceBuffer, DeviceWrite, Stream};
use half::bf16;

const H: usize = 8;
const F: usize = 16;
/// Tokens per data-parallel rank (split over TP by sequence parallelism).
const S: usize = 4;
const TP: usize = 2;
const DP: usize = 2;
const NAMES: [&str; 6] = [
    "ln.weight",
    "ln.bias",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
];

/// Seeded bf16 values in [-scale, scale).
fn values(key: u64, len: usize, scale: f64) -> Vec<bf16> {
    common::ddp::values(key, len)
        .into_iter()
        .map(|v| bf16::from_f64(v / 2.0 * scale))
        .collect()
}

/// Full (unsharded) parameters and the whole batch: `x`, `dy` `[DP*S, H]`.
struct Model {
    gamma: Vec<bf16>,
    beta: Vec<bf16>,
    w1: Vec<bf16>,
    b1: Vec<bf16>,
    w2: Vec<bf16>,
    b2: Vec<bf16>,
    x: Vec<bf16>,
    dy: Vec<bf16>,
}

fn model() -> Model {
    let mut gamma = values(1, H, 0.3);
    gamma
        .iter_mut()
        .for_each(|g| *g = bf16::from_f32(1.0 + g.to_f32()));
    Model {
        gamma,
        beta: values(2, H, 0.3),
        w1: values(3, F * H, 0.5),
        b1: values(4, F, 0.5),
        w2: values(5, H * F, 0.5),
        b2: values(6, H, 0.5),
        x: values(7, DP * S * H, 2.0),
        dy: values(8, DP * S * H, 1.0),
    }
}

/// Gradients of one rank, as f64, in `NAMES` order.
type Grads = Vec<Vec<f64>>;

fn host<T: ferrotron::Element + Into<f64>>(b: &DeviceBuffer<T>) -> Vec<f64> {
    b.to_host().unwrap().into_iter().map(Into::into).collect()
}

/// LayerNorm on `rows` rows, then the MLP; backward of `dy` into `grads`.
#[allow(clippy::too_many_arguments)]
fn forward_backward(
    tp: &Communicator,
    s: &Stream,
    m: &Model,
    mlp: &mut TpMlp<bf16>,
    x: &[bf16],
    dy: &[bf16],
    tokens: usize,
    g: [&mut dyn DeviceWrite<bf16>; 2],
    fc1: (&mut dyn DeviceWrite<f32>, &mut dyn DeviceWrite<bf16>),
    fc2: (&mut dyn DeviceWrite<f32>, &mut dyn DeviceWrite<bf16>),
) {
    let dev = tp.device();
    let rows = x.len() / H;
    let x = dev.upload(x).unwrap();
    let dy = dev.upload(dy).unwrap();
    let gamma = dev.upload(&m.gamma).unwrap();
    let beta = dev.upload(&m.beta).unwrap();
    let mut y = dev.alloc_zeros::<bf16>(rows * H).unwrap();
    let mut mean = dev.alloc_zeros::<f32>(rows).unwrap();
    let mut rstd = dev.alloc_zeros::<f32>(rows).unwrap();
    let ln = LayerNorm::new(rows, H);
    ln.forward(
        s,
        &x,
        Some(&gamma),
        Some(&beta),
        &mut y,
        &mut mean,
        &mut rstd,
    )
    .unwrap();
    let mut out = dev.alloc_zeros::<bf16>(rows * H).unwrap();
    mlp.forward(tp, s, &y, &mut out, tokens).unwrap();
    let mut dln = dev.alloc_zeros::<bf16>(rows * H).unwrap();
    let grads = MlpGrads {
        fc1: LinearGrads {
            weight: WeightGrad::Accumulate(fc1.0),
            bias: Some(fc1.1),
        },
        fc2: LinearGrads {
            weight: WeightGrad::Accumulate(fc2.0),
            bias: Some(fc2.1),
        },
    };
    mlp.backward(tp, s, &y, &dy, &mut dln, grads).unwrap();
    let mut dx = dev.alloc_zeros::<bf16>(rows * H).unwrap();
    let [dg, db] = g;
    ln.backward(
        s,
        &dln,
        &x,
        &mean,
        &rstd,
        Some(&gamma),
        &mut dx,
        Some(dg),
        Some(db),
    )
    .unwrap();
    s.synchronize().unwrap();
}

/// One rank, the whole batch, no parallelism: the full gradients.
fn reference(m: &Model) -> Grads {
    run_ranks_with_timeout(1, Duration::from_secs(60), |comm| {
        let dev = comm.device().clone();
        let s = dev.new_stream().unwrap();
        let mut mlp = TpMlp::from_full(
            &comm,
            H,
            F,
            &m.w1,
            &m.b1,
            &m.w2,
            &m.b2,
            MlpOptions::default(),
        )
        .unwrap();
        let mut dg = dev.alloc_zeros::<bf16>(H).unwrap();
        let mut db = dev.alloc_zeros::<bf16>(H).unwrap();
        let mut w1 = dev.alloc_zeros::<f32>(F * H).unwrap();
        let mut b1 = dev.alloc_zeros::<bf16>(F).unwrap();
        let mut w2 = dev.alloc_zeros::<f32>(H * F).unwrap();
        let mut b2 = dev.alloc_zeros::<bf16>(H).unwrap();
        forward_backward(
            &comm,
            &s,
            m,
            &mut mlp,
            &m.x,
            &m.dy,
            DP * S,
            [&mut dg, &mut db],
            (&mut w1, &mut b1),
            (&mut w2, &mut b2),
        );
        vec![
            host(&dg),
            host(&db),
            host(&w1),
            host(&b1),
            host(&w2),
            host(&b2),
        ]
    })
    .pop()
    .unwrap()
}

/// tp 2 x dp 2 with the given kinds; returns (tp rank, gradients) per rank.
fn parallel(m: &Model, kinds: &[ParamKind; 6]) -> Vec<(usize, Grads)> {
    run_ranks_with_timeout(TP * DP, Duration::from_secs(60), |world| {
        let w = world.rank();
        let (t, d) = (w % TP, w / TP);
        let tp = world.split(Some(d), t).unwrap().unwrap();
        let dp = world.split(Some(TP + t), d).unwrap().unwrap();
        assert_eq!((tp.rank(), tp.size(), dp.rank(), dp.size()), (t, TP, d, DP));
        let shapes: [(&[usize], DType); 6] = [
            (&[H], DType::BF16),
            (&[H], DType::BF16),
            (&[F / TP, H], DType::F32),
            (&[F / TP], DType::BF16),
            (&[H, F / TP], DType::F32),
            (&[H], DType::BF16),
        ];
        let mut reg = ParamRegistry::new();
        let ids: Vec<_> = NAMES
            .iter()
            .zip(shapes)
            .zip(kinds)
            .map(|((n, (shape, gd)), &k)| reg.register_kind(n, shape, DType::BF16, gd, k).unwrap())
            .collect();
        let config = DdpConfig {
            bucket_size: Some(40),
            averaging: GradAveraging::Sum,
            ..DdpConfig::default()
        };
        let mut ddp = DistributedDataParallel::new(&dp, reg, config).unwrap();
        let s = world.device().new_stream().unwrap();
        ddp.zero_grad_buffer(&s).unwrap();
        let mut mlp = TpMlp::from_full(
            &tp,
            H,
            F,
            &m.w1,
            &m.b1,
            &m.w2,
            &m.b2,
            MlpOptions {
                sequence_parallel: true,
                ..MlpOptions::default()
            },
        )
        .unwrap();
        // This rank's sequence-parallel rows of its data-parallel batch.
        let rows = S / TP;
        let lo = (d * S + t * rows) * H;
        let hi = lo + rows * H;
        {
            let b = ddp.buffers();
            let mut dg = b.grad::<bf16>(ids[0]).unwrap();
            let mut db = b.grad::<bf16>(ids[1]).unwrap();
            let mut w1 = b.grad::<f32>(ids[2]).unwrap();
            let mut b1 = b.grad::<bf16>(ids[3]).unwrap();
            let mut w2 = b.grad::<f32>(ids[4]).unwrap();
            let mut b2 = b.grad::<bf16>(ids[5]).unwrap();
            forward_backward(
                &tp,
                &s,
                m,
                &mut mlp,
                &m.x[lo..hi],
                &m.dy[lo..hi],
                S,
                [&mut dg, &mut db],
                (&mut w1, &mut b1),
                (&mut w2, &mut b2),
            );
        }
        for &id in ids.iter().rev() {
            ddp.mark_grad_ready(&s, id).unwrap();
        }
        ddp.finalize_model_grads(&s, &tp).unwrap();
        s.synchronize().unwrap();
        let b = ddp.buffers();
        let g: Grads = ids
            .iter()
            .zip(shapes)
            .map(|(&id, (_, gd))| {
                if gd == DType::F32 {
                    host(&b.grad::<f32>(id).unwrap())
                } else {
                    host(&b.grad::<bf16>(id).unwrap())
                }
            })
            .collect();
        (t, g)
    })
}

/// This TP rank's shard of each full reference gradient.
fn shard(full: &Grads, t: usize) -> Grads {
    let f = F / TP;
    let w2: Vec<f64> = (0..H)
        .flat_map(|r| full[4][r * F + t * f..r * F + (t + 1) * f].to_vec())
        .collect();
    vec![
        full[0].clone(),
        full[1].clone(),
        full[2][t * f * H..(t + 1) * f * H].to_vec(),
        full[3][t * f..(t + 1) * f].to_vec(),
        w2,
        full[5].clone(),
    ]
}

/// The names of the gradients that differ from the reference on any rank
/// (bf16 gradients: a few roundings of the tensor's largest value).
fn mismatches(m: &Model, full: &Grads, kinds: &[ParamKind; 6]) -> Vec<&'static str> {
    let mut bad = Vec::new();
    for (t, got) in parallel(m, kinds) {
        let want = shard(full, t);
        for (i, name) in NAMES.iter().enumerate() {
            assert_eq!(got[i].len(), want[i].len(), "{name}: length");
            let max = want[i].iter().fold(0f64, |a, x| a.max(x.abs()));
            assert!(max > 0.0, "{name}: a non-zero reference");
            let off = got[i]
                .iter()
                .zip(&want[i])
                .any(|(g, w)| (g - w).abs() > 2e-2 * max);
            if off && !bad.contains(name) {
                bad.push(*name);
            }
        }
    }
    bad
}

#[test]
fn every_gradient_is_reduced_exactly_once_at_tp2_dp2() {
    use ParamKind::{Local, TpDuplicated};
    let m = model();
    let full = reference(&m);
    let right = [TpDuplicated, TpDuplicated, Local, Local, Local, Local];
    assert_eq!(mismatches(&m, &full, &right), Vec::<&str>::new());
    // The LayerNorm gain never reduced over TP: a per-rank partial.
    let mut never = right;
    never[0] = Local;
    assert_eq!(mismatches(&m, &full, &never), vec!["ln.weight"]);
    // The row-parallel bias (already summed by ferrotron) reduced again.
    let mut twice = right;
    twice[5] = TpDuplicated;
    assert_eq!(mismatches(&m, &full, &twice), vec!["fc2.bias"]);
}

#[test]
fn finalize_model_grads_rejects_a_tp_communicator_on_another_device() {
    let other = Communicator::in_process(&[ferrotron::Device::emu()])
        .unwrap()
        .pop()
        .unwrap();
    run_ranks_with_timeout(1, Duration::from_secs(60), |comm| {
        let mut reg = ParamRegistry::new();
        let id = reg
            .register_kind(
                "ln.weight",
                &[H],
                DType::BF16,
                DType::F32,
                ParamKind::TpDuplicated,
            )
            .unwrap();
        let mut ddp = DistributedDataParallel::new(&comm, reg, DdpConfig::default()).unwrap();
        let s = comm.device().new_stream().unwrap();
        ddp.mark_grad_ready(&s, id).unwrap();
        match ddp.finalize_model_grads(&s, &other).unwrap_err() {
            ferrotron::Error::DeviceMismatch { arg, .. } => assert_eq!(arg, "tp_comm"),
            e => panic!("{e:?}"),
        }
        // With its own (size 1) communicator it is finish_grad_sync.
        ddp.finalize_model_grads(&s, &comm).unwrap();
        assert!(ddp.grads_synced());
    });
}
