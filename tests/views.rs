//! Borrowed views (`DeviceSlice` / `DeviceSliceMut`): every op family, a
//! tensor-parallel layer, the vocab-parallel cross-entropy and a collective
//! run on views over host `Vec`s (the emulator's `host_scope`) give the same
//! bits as on `DeviceBuffer`s; sub-slices of buffers address the right
//! elements; misuse is a named error (docs/interop.md, "Borrowed views").

mod common;

use common::Rng;
use ferrotron::comm::{Communicator, ReduceOp};
use ferrotron::core::rng::PhiloxState;
use ferrotron::ops::adam::{AdamConfig, AdamScalars, AdamTensors, Unscale};
use ferrotron::ops::copy::{copy_2d, Block2d};
use ferrotron::ops::multi_tensor::{GradRef, MultiTensor, TensorRef};
use ferrotron::ops::{
    Aux, BiasDropoutAdd, BiasGelu, DropoutMode, Epilogue, FusedAdam, Gelu, Gemm, GemmInputs,
    LayerNorm, RmsNorm, ScaleMaskSoftmax, SoftmaxMask,
};
use ferrotron::parallel::linear::{ColumnOptions, ColumnParallelLinear};
use ferrotron::parallel::vocab::VocabParallelCrossEntropy;
use ferrotron::{
    Device, DeviceBuffer, DeviceRead, DeviceSlice, DeviceSliceMut, DeviceWrite, Element, Error,
    Result, Stream,
};
use half::bf16;

type Reads<'x, A> = [&'x dyn DeviceRead<A>];
type Writes<'x, O> = [&'x mut dyn DeviceWrite<O>];

/// Runs `f` on `DeviceBuffer`s holding `a`, `b` and `outs`, then on
/// host-scope views over copies of the same vectors, on `stream`; asserts
/// the outputs are bitwise equal and returns them.
fn both<A: Element, B: Element, O: Element>(
    what: &str,
    stream: &Stream,
    a: &[Vec<A>],
    b: &[Vec<B>],
    outs: &[Vec<O>],
    mut f: impl for<'x> FnMut(&Stream, &Reads<'x, A>, &Reads<'x, B>, &mut Writes<'x, O>) -> Result<()>,
) -> Vec<Vec<O>> {
    let dev = stream.device();
    // Through buffers.
    let ab: Vec<DeviceBuffer<A>> = a.iter().map(|v| dev.upload(v).unwrap()).collect();
    let bb: Vec<DeviceBuffer<B>> = b.iter().map(|v| dev.upload(v).unwrap()).collect();
    let mut ob: Vec<DeviceBuffer<O>> = outs.iter().map(|v| dev.upload(v).unwrap()).collect();
    {
        let ar: Vec<&dyn DeviceRead<A>> = ab.iter().map(|x| x as _).collect();
        let br: Vec<&dyn DeviceRead<B>> = bb.iter().map(|x| x as _).collect();
        let mut ow: Vec<&mut dyn DeviceWrite<O>> = ob.iter_mut().map(|x| x as _).collect();
        f(stream, &ar, &br, &mut ow).unwrap();
    }
    stream.synchronize().unwrap();
    let by_buffer: Vec<Vec<O>> = ob.iter().map(|x| x.to_host().unwrap()).collect();

    // Through views over host vectors (zero copies).
    let (a2, b2) = (a.to_vec(), b.to_vec());
    let mut o2 = outs.to_vec();
    let o2_ref = &mut o2;
    dev.host_scope(|s| {
        let av: Vec<DeviceSlice<'_, A>> = a2.iter().map(|v| s.slice(v)).collect::<Result<_>>()?;
        let bv: Vec<DeviceSlice<'_, B>> = b2.iter().map(|v| s.slice(v)).collect::<Result<_>>()?;
        let mut ov: Vec<DeviceSliceMut<'_, O>> = o2_ref
            .iter_mut()
            .map(|v| s.slice_mut(v))
            .collect::<Result<_>>()?;
        let ar: Vec<&dyn DeviceRead<A>> = av.iter().map(|x| x as _).collect();
        let br: Vec<&dyn DeviceRead<B>> = bv.iter().map(|x| x as _).collect();
        let mut ow: Vec<&mut dyn DeviceWrite<O>> = ov.iter_mut().map(|x| x as _).collect();
        f(stream, &ar, &br, &mut ow)?;
        stream.synchronize()
    })
    .unwrap();
    for (i, (x, y)) in by_buffer.iter().zip(&o2).enumerate() {
        let (x, y): (&[u8], &[u8]) = (bytemuck::cast_slice(x), bytemuck::cast_slice(y));
        assert!(
            x == y,
            "{what}: output {i} differs between DeviceBuffers and views"
        );
        assert!(
            x.iter().any(|&v| v != 0),
            "{what}: output {i} was not written"
        );
    }
    by_buffer
}

fn randn(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| (rng.uniform() * 4.0 - 2.0) as f32).collect()
}

fn setup(salt: u64) -> (Stream, Rng) {
    let (rng, _seed) = Rng::new(salt);
    (Device::emu().new_stream().unwrap(), rng)
}

const NONE: &[Vec<u8>] = &[];

#[test]
fn bias_gelu_on_views_equals_buffers() {
    let (s, mut rng) = setup(1);
    let (r, c) = (7, 40);
    let (x, b, dy) = (
        randn(&mut rng, r * c),
        randn(&mut rng, c),
        randn(&mut rng, r * c),
    );
    let op = BiasGelu::new(r, c).with_gelu(Gelu::Erf);
    both(
        "bias_gelu fwd",
        &s,
        &[x.clone(), b.clone()],
        NONE,
        &[vec![0.0f32; r * c]],
        |s, a, _, o| op.forward(s, a[0], Some(a[1]), o[0]),
    );
    both(
        "bias_gelu bwd",
        &s,
        &[dy, x, b],
        NONE,
        &[vec![0.0f32; r * c], vec![0.0; c]],
        |s, a, _, o| {
            let (dx, db) = o.split_at_mut(1);
            op.backward(s, a[0], a[1], Some(a[2]), dx[0], Some(&mut *db[0]))
        },
    );
}

#[test]
fn dropout_on_views_equals_buffers() {
    let (s, mut rng) = setup(2);
    let (r, c) = (5, 33);
    let (x, b, res) = (
        randn(&mut rng, r * c),
        randn(&mut rng, c),
        randn(&mut rng, r * c),
    );
    let op = BiasDropoutAdd::new(r, c, 0.3);
    let mode = DropoutMode::Train(PhiloxState { seed: 7, offset: 0 });
    both(
        "dropout fwd",
        &s,
        &[x, b, res.clone()],
        NONE,
        &[vec![0.0f32; r * c]],
        |s, a, _, o| op.forward(s, a[0], Some(a[1]), a[2], o[0], mode),
    );
    both(
        "dropout bwd",
        &s,
        &[res],
        NONE,
        &[vec![0.0f32; r * c], vec![0.0; c]],
        |s, a, _, o| {
            let (dx, db) = o.split_at_mut(1);
            op.backward(s, a[0], dx[0], None, Some(&mut *db[0]), mode)
        },
    );
}

#[test]
fn softmax_on_views_equals_buffers() {
    let (s, mut rng) = setup(3);
    let (bt, h, sq) = (2, 3, 17);
    let n = bt * h * sq * sq;
    let (x, dy) = (randn(&mut rng, n), randn(&mut rng, n));
    let op = ScaleMaskSoftmax::new(bt, h, sq, sq, 0.7);
    let y = both(
        "softmax fwd",
        &s,
        &[x],
        NONE,
        &[vec![0.0f32; n]],
        |s, a, _, o| op.forward(s, a[0], SoftmaxMask::Causal, o[0]),
    );
    both(
        "softmax bwd",
        &s,
        &[y[0].clone(), dy],
        NONE,
        &[vec![0.0f32; n]],
        |s, a, _, o| op.backward(s, a[0], a[1], o[0]),
    );
    // A padding mask (u8) read through a view too.
    let x = randn(&mut rng, n);
    let mask: Vec<u8> = (0..sq * sq).map(|i| (i % 3 == 0) as u8).collect();
    let op = ScaleMaskSoftmax::new(bt, h, sq, sq, 1.0);
    both(
        "softmax padding",
        &s,
        &[x],
        &[mask],
        &[vec![0.0f32; n]],
        |s, a, m, o| op.forward(s, a[0], SoftmaxMask::Padding(m[0]), o[0]),
    );
}

#[test]
fn layernorm_and_rmsnorm_on_views_equal_buffers() {
    let (s, mut rng) = setup(4);
    let (r, hd) = (6, 96);
    let (x, g, b, dy) = (
        randn(&mut rng, r * hd),
        randn(&mut rng, hd),
        randn(&mut rng, hd),
        randn(&mut rng, r * hd),
    );
    let ln = LayerNorm::new(r, hd);
    let outs = [vec![0.0f32; r * hd], vec![0.0; r], vec![0.0; r]];
    let fwd = both(
        "layernorm fwd",
        &s,
        &[x.clone(), g.clone(), b.clone()],
        NONE,
        &outs,
        |s, a, _, o| {
            let (y, rest) = o.split_at_mut(1);
            let (mean, rstd) = rest.split_at_mut(1);
            ln.forward(s, a[0], Some(a[1]), Some(a[2]), y[0], mean[0], rstd[0])
        },
    );
    let ins = [
        dy.clone(),
        x.clone(),
        fwd[1].clone(),
        fwd[2].clone(),
        g.clone(),
    ];
    let outs = [vec![0.0f32; r * hd], vec![0.0; hd], vec![0.0; hd]];
    both("layernorm bwd", &s, &ins, NONE, &outs, |s, a, _, o| {
        let (dx, rest) = o.split_at_mut(1);
        let (dg, db) = rest.split_at_mut(1);
        ln.backward(
            s,
            a[0],
            a[1],
            a[2],
            a[3],
            Some(a[4]),
            dx[0],
            Some(&mut *dg[0]),
            Some(&mut *db[0]),
        )
    });
    let rms = RmsNorm::new(r, hd);
    let fwd = both(
        "rmsnorm fwd",
        &s,
        &[x.clone(), g.clone()],
        NONE,
        &[vec![0.0f32; r * hd], vec![0.0; r]],
        |s, a, _, o| {
            let (y, rstd) = o.split_at_mut(1);
            rms.forward(s, a[0], Some(a[1]), y[0], rstd[0])
        },
    );
    let ins = [dy, x, fwd[1].clone(), g];
    both(
        "rmsnorm bwd",
        &s,
        &ins,
        NONE,
        &[vec![0.0f32; r * hd], vec![0.0; hd]],
        |s, a, _, o| {
            let (dx, dg) = o.split_at_mut(1);
            rms.backward(s, a[0], a[1], a[2], Some(a[3]), dx[0], Some(&mut *dg[0]))
        },
    );
}

#[test]
fn multi_tensor_and_adam_on_views_equal_buffers() {
    let (s, mut rng) = setup(5);
    let sizes = [37usize, 5, 130];
    let grads: Vec<Vec<f32>> = sizes.iter().map(|&n| randn(&mut rng, n)).collect();
    both(
        "l2_norm",
        &s,
        &grads,
        NONE,
        &[vec![0.0f32; 1]],
        |s, a, _, o| {
            let list: Vec<TensorRef<'_>> = a.iter().map(|&t| TensorRef::F32(t)).collect();
            MultiTensor::new().l2_norm(s, &list, o[0])
        },
    );
    // In-place unscale: the gradients are the outputs (found_inf last).
    let mut outs = grads.clone();
    outs[1][2] = f32::INFINITY; // so found_inf is written too
    outs.push(vec![0.0f32; 1]);
    both(
        "unscale",
        &s,
        &[] as &[Vec<f32>],
        NONE,
        &outs,
        |s, _, _, o| {
            let (g, fi) = o.split_at_mut(sizes.len());
            let mut list: Vec<GradRef<'_>> = g.iter_mut().map(|t| GradRef::F32(&mut **t)).collect();
            MultiTensor::new().unscale(s, &mut list, 0.25, fi[0])
        },
    );
    // AdamW over three fp32 lists of views (`P = dyn DeviceWrite<f32>`).
    let mut outs: Vec<Vec<f32>> = Vec::new();
    for _ in 0..3 {
        outs.extend(sizes.iter().map(|&n| randn(&mut rng, n)));
    }
    for v in &mut outs[2 * sizes.len()..] {
        v.iter_mut().for_each(|x| *x = x.abs()); // second moments are >= 0
    }
    both("adam", &s, &grads, NONE, &outs, |s, g, _, o| {
        let k = sizes.len();
        let mut adam = FusedAdam::new(AdamConfig::default()).unwrap();
        let mut scalars = AdamScalars::new(s, 1e-2)?;
        let (p, rest) = o.split_at_mut(k);
        let (m, v) = rest.split_at_mut(k);
        let gl: Vec<TensorRef<'_>> = g.iter().map(|&t| TensorRef::F32(t)).collect();
        let mut t = AdamTensors {
            params: p,
            exp_avg: m,
            exp_avg_sq: v,
            grads: &gl,
            model: None,
            weight_decay: &[0.1, 0.0, 0.1],
        };
        adam.step(s, &mut t, &mut scalars, None, Unscale::None)
    });
}

#[test]
fn gemm_copy_and_streams_on_views_equal_buffers() {
    let (s, mut rng) = setup(6);
    let (m, n, k) = (19, 24, 40);
    let conv = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let (a, b, bias) = (
        conv(randn(&mut rng, m * k)),
        conv(randn(&mut rng, n * k)),
        conv(randn(&mut rng, n)),
    );
    let gemm = Gemm::new(m, n, k)
        .trans_b(true)
        .epilogue(Epilogue::BiasGelu(Gelu::Tanh));
    both(
        "gemm bias+gelu",
        &s,
        &[a, b, bias],
        NONE,
        &[vec![0.0f32; m * n], vec![0.0; m * n]],
        |s, x, _, o| {
            let (d, pre) = o.split_at_mut(1);
            let inputs = GemmInputs {
                a: x[0],
                b: x[1],
                bias: Some(x[2]),
                c: None,
            };
            gemm.run(s, inputs, Aux::Store(&mut *pre[0]), d[0])
        },
    );
    let (rows, cols) = (4, 9);
    let src = randn(&mut rng, 10 * 12);
    both(
        "copy_2d",
        &s,
        std::slice::from_ref(&src),
        NONE,
        &[vec![0.0f32; 8 * 16]],
        |s, a, _, o| {
            let from = Block2d {
                offset: 3 * 12 + 2,
                pitch: 12,
            };
            let to = Block2d {
                offset: 16 + 5,
                pitch: 16,
            };
            copy_2d(s, a[0], from, o[0], to, rows, cols)
        },
    );
    both(
        "stream copies",
        &s,
        &[src],
        NONE,
        &[vec![0.0f32; 120], vec![0.0; 120]],
        |s, a, _, o| {
            let (d, f) = o.split_at_mut(1);
            s.copy_device(a[0], d[0])?;
            s.copy_from_host(&[1.5f32; 60], f[0])?;
            s.fill_bytes(&mut f[0].view_mut().slice_mut(60..)?, 0x3f)
        },
    );
}

#[test]
fn parallel_layer_cross_entropy_and_collective_on_views_equal_buffers() {
    let dev = Device::emu();
    let comm = Communicator::in_process(std::slice::from_ref(&dev))
        .unwrap()
        .remove(0);
    let (_, mut rng) = setup(7);
    let (tokens, inp, out) = (6, 16, 24);
    let conv = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let w = conv(randn(&mut rng, out * inp));
    let bias = conv(randn(&mut rng, out));
    let zeros = vec![bf16::ZERO; tokens * out];
    let o = ColumnOptions {
        bias: true,
        ..Default::default()
    };
    let mut layer = ColumnParallelLinear::from_full(&comm, inp, out, &w, Some(&bias), o).unwrap();
    let s = comm.stream().clone();
    let x = conv(randn(&mut rng, tokens * inp));
    let logits = both(
        "column linear",
        &s,
        &[x],
        NONE,
        std::slice::from_ref(&zeros),
        |s, a, _, o| layer.forward(&comm, s, a[0], o[0], None, tokens),
    );
    let labels: Vec<i64> = (0..tokens as i64).map(|t| (t * 5) % out as i64).collect();
    let ce = VocabParallelCrossEntropy::new(tokens, out);
    both(
        "cross-entropy",
        &s,
        &logits,
        &[labels],
        &[vec![0.0f32; tokens]],
        |s, a, l, o| ce.forward(&comm, s, a[0], l[0], o[0]).map(drop),
    );
    both("all_reduce", &s, &logits, NONE, &[zeros], |s, a, _, o| {
        comm.all_reduce(s, a[0], o[0], ReduceOp::Sum).map(drop)
    });
}

#[test]
fn sub_slices_address_the_right_elements() {
    let dev = Device::emu();
    let s = dev.new_stream().unwrap();
    let (r, c) = (3, 8);
    let host: Vec<f32> = (0..2 * r * c).map(|i| i as f32 / 16.0).collect();
    let mut big = dev.upload(&host).unwrap();
    let bias = dev.upload(&vec![0.25f32; c]).unwrap();
    // Run on the second half of `big`, in place, through a sub-view.
    let op = BiasGelu::new(r, c);
    {
        let mut half = big.slice_mut(r * c..).unwrap();
        op.forward_in_place(&s, &mut half, Some(&bias)).unwrap();
    }
    // The same op on a buffer holding just that half.
    let mut alone = dev.upload(&host[r * c..]).unwrap();
    op.forward_in_place(&s, &mut alone, Some(&bias)).unwrap();
    let (got, want) = (big.to_host().unwrap(), alone.to_host().unwrap());
    assert_eq!(&got[..r * c], &host[..r * c], "the first half is untouched");
    assert_eq!(
        bytemuck::cast_slice::<f32, u8>(&got[r * c..]),
        bytemuck::cast_slice::<f32, u8>(&want)
    );
    // split_at / slices of slices / to_host of a view.
    let v = big.slice(2..10).unwrap();
    let (a, b) = v.clone().split_at(3).unwrap();
    assert_eq!((a.len(), b.len()), (3, 5));
    assert_eq!(
        b.slice(1..=2).unwrap().to_host().unwrap(),
        got[6..8].to_vec()
    );
    assert_eq!(v.slice(..).unwrap().addr(), big.addr() + 8);
    assert!(big.slice(0..0).unwrap().is_empty());
}

fn expect_invalid(r: Result<impl std::fmt::Debug>, op: &str, arg: &str) {
    match r {
        Err(Error::InvalidArgument { op: o, arg: a, .. }) if o == op && a == arg => {}
        other => panic!("expected InvalidArgument {{ op: {op}, arg: {arg} }}, got {other:?}"),
    }
}

#[test]
fn misuse_is_a_named_error() {
    let dev = Device::emu();
    let other = Device::emu();
    let s = dev.new_stream().unwrap();
    let buf = dev.upload(&[1.0f32; 10]).unwrap();
    let mut out = dev.alloc_zeros::<f32>(10).unwrap();
    // Bounds of sub-slices.
    expect_invalid(buf.slice(4..11), "DeviceRead::slice", "range");
    #[allow(clippy::reversed_empty_ranges)]
    expect_invalid(buf.slice(5..4), "DeviceRead::slice", "range");
    expect_invalid(out.slice_mut(..=10), "DeviceWrite::slice_mut", "range");
    expect_invalid(
        buf.slice(..).unwrap().split_at(11),
        "DeviceSlice::split_at",
        "mid",
    );
    expect_invalid(
        out.view_mut().split_at_mut(11),
        "DeviceSliceMut::split_at_mut",
        "mid",
    );
    // Raw parts: alignment, null, size, a stream of another device.
    // SAFETY (all): each call is refused before any view exists.
    unsafe {
        expect_invalid(
            DeviceSlice::<f32>::from_raw(&dev, buf.addr() + 2, 4, &s),
            "DeviceSlice::from_raw",
            "addr",
        );
        expect_invalid(
            DeviceSliceMut::<f32>::from_raw(&dev, 0, 4, &s),
            "DeviceSliceMut::from_raw",
            "addr",
        );
        expect_invalid(
            DeviceSlice::<f32>::from_raw(&dev, buf.addr(), usize::MAX / 2, &s),
            "DeviceSlice::from_raw",
            "len",
        );
        let foreign = other.new_stream().unwrap();
        match DeviceSlice::<f32>::from_raw(&dev, buf.addr(), 10, &foreign) {
            Err(Error::DeviceMismatch {
                op: "DeviceSlice::from_raw",
                arg: "stream",
                ..
            }) => {}
            r => panic!("a stream of another device must be refused, got {r:?}"),
        }
        let v = DeviceSlice::<f32>::from_raw(&dev, buf.addr(), 10, &s).unwrap();
        assert!(v.ordered_on().is_some());
    }
    // A view of one device passed to an op on another device's stream.
    let s_other = other.new_stream().unwrap();
    let view = buf.slice(..).unwrap();
    let mut out_other = other.alloc_zeros::<f32>(10).unwrap();
    match BiasGelu::new(2, 5).forward(&s_other, &view, None, &mut out_other) {
        Err(Error::DeviceMismatch { arg: "x", .. }) => {}
        r => panic!("expected DeviceMismatch on x, got {r:?}"),
    }
    // A view of the wrong length.
    let short = buf.slice(..9).unwrap();
    expect_invalid(
        BiasGelu::new(2, 5).forward(&s, &short, None, &mut out),
        "bias_gelu_forward",
        "x",
    );
    // Host views belong to the scope's device only.
    let data = vec![1.0f32; 10];
    let r = dev.host_scope(|sc| {
        let v = sc.slice(&data)?;
        let mut o = out_other.view_mut();
        BiasGelu::new(2, 5).forward(&s_other, &v, None, &mut o)
    });
    assert!(
        matches!(r, Err(Error::DeviceMismatch { arg: "x", .. })),
        "{r:?}"
    );
}
