//! cudarc interop (feature `cuda`, docs/interop.md "cudarc"): a device on a
//! cudarc context, streams both ways, ferrotron ops on cudarc slices and
//! views, cudarc copies of ferrotron memory, and the named errors. GPU only:
//! without one every case is reported as SKIPPED, never as passed.
#![cfg(feature = "cuda")]

use std::io::Write as _;
use std::sync::Arc;

use cudarc::driver::CudaContext;
use ferrotron::ops::{BiasGelu, Gelu};
use ferrotron::{Device, DeviceSlice, DeviceSliceMut, Error};

/// The cudarc context of GPU 0, or `None` (reported as skipped).
fn gpu(test: &str, cases: usize) -> Option<Arc<CudaContext>> {
    match Device::cuda(0) {
        Ok(_) => Some(CudaContext::new(0).expect("a context on GPU 0")),
        Err(e) => {
            // Written to the process's stderr (not captured by the harness),
            // as tests/common does, so the skip is visible in every run.
            let _ = writeln!(
                std::io::stderr(),
                "[ferrotron] {test}: SKIPPED {cases} GPU case(s): {e}"
            );
            None
        }
    }
}

fn reference(x: &[f32], b: &[f32], cols: usize) -> Vec<f32> {
    let (xd, bd): (Vec<f64>, Vec<f64>) = (
        x.iter().map(|&v| v as f64).collect(),
        b.iter().map(|&v| v as f64).collect(),
    );
    let rows = x.len() / cols;
    let mut out = Vec::with_capacity(x.len());
    for r in 0..rows {
        for c in 0..cols {
            out.push(
                ferrotron::reference::bias_gelu::gelu(Gelu::Erf, xd[r * cols + c] + bd[c]) as f32,
            );
        }
    }
    out
}

#[test]
fn ops_run_on_cudarc_slices_and_views() {
    let Some(ctx) = gpu("ops_run_on_cudarc_slices_and_views", 3) else {
        return;
    };
    let dev = Device::from_cudarc(ctx.clone()).unwrap();
    assert!(Arc::ptr_eq(&dev.cudarc_context().unwrap(), &ctx));
    let cs = ctx.new_stream().unwrap();
    let stream = ferrotron::Stream::from_cudarc(&dev, cs.clone()).unwrap();
    assert_eq!(stream.cudarc_stream().unwrap().cu_stream(), cs.cu_stream());
    let (rows, cols) = (5, 48);
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| (i as f32 / 37.0).sin() * 3.0)
        .collect();
    let b: Vec<f32> = (0..cols).map(|i| i as f32 / 100.0).collect();
    let want = reference(&x, &b, cols);
    let op = BiasGelu::new(rows, cols).with_gelu(Gelu::Erf);

    // 1. Slices on their own stream.
    let xs = cs.clone_htod(x.as_slice()).unwrap();
    let bs = cs.clone_htod(b.as_slice()).unwrap();
    let mut ys = cs.alloc_zeros::<f32>(rows * cols).unwrap();
    {
        let (xv, bv) = (
            DeviceSlice::from_cudarc(&stream, &xs).unwrap(),
            DeviceSlice::from_cudarc(&stream, &bs).unwrap(),
        );
        let mut yv = DeviceSliceMut::from_cudarc(&stream, &mut ys).unwrap();
        op.forward(&stream, &xv, Some(&bv), &mut yv).unwrap();
    }
    let got = cs.clone_dtoh(&ys).unwrap();
    assert_close(&got, &want);

    // 2. Views, on another stream, through cudarc's event tracking.
    let other = ferrotron::Stream::from_cudarc(&dev, ctx.new_stream().unwrap()).unwrap();
    let mut ys2 = cs.alloc_zeros::<f32>(rows * cols).unwrap();
    other
        .with_cudarc(&xs.as_view(), |xv| {
            other.with_cudarc(&bs, |bv| {
                other.with_cudarc_mut(&mut ys2.as_view_mut(), |yv| {
                    op.forward(&other, xv, Some(bv), yv)
                })
            })
        })
        .unwrap();
    assert_close(&cs.clone_dtoh(&ys2).unwrap(), &want);

    // 3. cudarc reads ferrotron memory.
    let yb = dev.upload(&want).unwrap();
    let back = stream
        .as_cudarc(&yb, |cv| cs.clone_dtoh(cv).unwrap())
        .unwrap();
    assert_eq!(back, want);
}

#[test]
fn cudarc_misuse_is_a_named_error() {
    let Some(ctx) = gpu("cudarc_misuse_is_a_named_error", 2) else {
        return;
    };
    let dev = Device::from_cudarc(ctx.clone()).unwrap();
    let s1 = ferrotron::Stream::from_cudarc(&dev, ctx.new_stream().unwrap()).unwrap();
    let cs2 = ctx.new_stream().unwrap();
    let xs = cs2.alloc_zeros::<f32>(8).unwrap();
    // A view used on another stream than the slice's.
    match DeviceSlice::from_cudarc(&s1, &xs) {
        Err(Error::InvalidArgument { arg: "stream", .. }) => {}
        r => panic!("expected InvalidArgument on stream, got {r:?}"),
    }
    // `CudaContext::new(0)` again is the same primary context (the first
    // GPU run expected a mismatch here, wrongly): its streams are ours.
    let same = CudaContext::new(0).unwrap();
    assert_eq!(same.cu_ctx(), ctx.cu_ctx());
    ferrotron::Stream::from_cudarc(&dev, same.new_stream().unwrap()).unwrap();
    // A stream of another context of the same GPU.
    let other_ctx = CudaContext::new_non_primary(0, 0).unwrap();
    assert_ne!(other_ctx.cu_ctx(), ctx.cu_ctx());
    let foreign = other_ctx.new_stream().unwrap();
    match ferrotron::Stream::from_cudarc(&dev, foreign) {
        Err(Error::DeviceMismatch { arg: "stream", .. }) => {}
        r => panic!("expected DeviceMismatch on stream, got {r:?}"),
    }
}

#[test]
fn emulator_streams_are_refused_by_the_cudarc_calls() {
    // Runs everywhere: no GPU needed.
    let dev = Device::emu();
    let s = dev.new_stream().unwrap();
    assert!(dev.cudarc_context().is_none());
    assert!(s.cudarc_stream().is_none());
    let buf = dev.upload(&[1.0f32; 4]).unwrap();
    match s.as_cudarc(&buf, |_| ()) {
        Err(Error::InvalidArgument { arg: "stream", .. }) => {}
        r => panic!("expected InvalidArgument on stream, got {r:?}"),
    }
}

fn assert_close(got: &[f32], want: &[f32]) {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum::<f64>();
    let den: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum::<f64>();
    let e = (num / den).sqrt();
    assert!(e <= 1e-5, "relative error {e:.3e}");
}
