//! Step `nccl`: a one-rank NCCL communicator runs every collective, each
//! checked against its expected result, and refuses a send/recv to itself; then the
//! overlap of a GEMM on one stream with a device copy on another (what a
//! tensor-parallel layer relies on): the fraction of the shorter one hidden.
//! Multi-GPU bus bandwidth needs more than one GPU and is not measured here.

use std::time::Duration;

use ferrotron::comm::{Communicator, P2p, ReduceOp};
use ferrotron::ops::gemm::{Aux, Gemm, GemmInputs};
use ferrotron::{Device, Error, Result};
use half::bf16;

use crate::report::Report;
use crate::timing::per_call_ms;

const WAIT: Duration = Duration::from_secs(30);

fn expect(what: &str, got: Vec<f32>, want: &[f32]) -> Result<String> {
    if got == want {
        Ok(format!("{what}: ok"))
    } else {
        Err(Error::Backend {
            backend: "nccl",
            message: format!("{what}: got {got:?}, expected {want:?}"),
        })
    }
}

pub fn run(dev: &Device, r: &mut Report) -> Result<()> {
    r.line(&format!("- library: {}", Communicator::nccl_library()?));
    let id = Communicator::nccl_unique_id()?;
    let comm = Communicator::nccl(dev, 0, 1, &id)?;
    let s = dev.new_stream()?;
    let x = [1.0f32, -2.0, 3.5, 4.0];
    let a = dev.upload(&x)?;
    let mut b = dev.alloc_zeros::<f32>(4)?;
    let mut results = Vec::new();

    let h = comm.all_reduce(&s, &a, &mut b, ReduceOp::Sum)?;
    comm.wait(&h, WAIT)?;
    results.push(expect("all_reduce", b.to_host()?, &x)?);
    let h = comm.all_gather(&s, &a, &mut b)?;
    comm.wait(&h, WAIT)?;
    results.push(expect("all_gather", b.to_host()?, &x)?);
    let h = comm.reduce_scatter(&s, &a, &mut b, ReduceOp::Max)?;
    comm.wait(&h, WAIT)?;
    results.push(expect("reduce_scatter", b.to_host()?, &x)?);
    let mut c = dev.upload(&x)?;
    let h = comm.broadcast(&s, &mut c, 0)?;
    comm.wait(&h, WAIT)?;
    results.push(expect("broadcast", c.to_host()?, &x)?);
    let h = comm.barrier(&s)?;
    comm.wait(&h, WAIT)?;
    results.push("barrier: ok".into());
    // Point-to-point needs a peer: with one rank, a send to itself must be
    // refused with a clear error naming the argument (two GPUs test the
    // transfer itself).
    let mut got = dev.alloc_zeros::<f32>(4)?;
    match comm.group_p2p(&s, &mut [P2p::Send(&a, 0), P2p::Recv(&mut got, 0)]) {
        Err(e) if e.to_string().contains("send peer") => {
            results.push("send/recv to self: refused as expected".into())
        }
        Err(e) => return Err(e),
        Ok(_) => {
            return Err(Error::Backend {
                backend: "nccl",
                message: "group_p2p to this rank itself was accepted; expected an error".into(),
            })
        }
    }
    r.line(&format!("- one rank: {}", results.join(", ")));

    // Overlap: a GEMM on one stream, a 1 GiB copy on another.
    let (m, n, k) = (8192, 8192, 8192);
    let ga = dev.upload(&vec![bf16::from_f32(0.01); m * k])?;
    let gb = dev.upload(&vec![bf16::from_f32(0.01); n * k])?;
    let mut gy = dev.alloc_zeros::<bf16>(m * n)?;
    let src = dev.alloc_zeros::<u8>(1 << 30)?;
    let mut dst = dev.alloc_zeros::<u8>(1 << 30)?;
    let (compute, comm_stream) = (dev.new_stream()?, dev.new_stream()?);
    let gemm = Gemm::new(m, n, k).trans_b(true);
    let mut run_gemm = || {
        let inputs = GemmInputs {
            a: &ga,
            b: &gb,
            bias: None,
            c: None,
        };
        gemm.run(&compute, inputs, Aux::None, &mut gy)
    };
    let t_gemm = per_call_ms(&compute, 2, 5, &mut run_gemm)?;
    let t_copy = per_call_ms(&comm_stream, 2, 5, || {
        comm_stream.copy_device(&src, &mut dst)
    })?;
    // Both at once: start both streams after one event, end when both end.
    let start = compute.record_event()?;
    comm_stream.wait_event(&start)?;
    for _ in 0..5 {
        run_gemm()?;
        comm_stream.copy_device(&src, &mut dst)?;
    }
    let copy_done = comm_stream.record_event()?;
    compute.wait_event(&copy_done)?;
    let end = compute.record_event()?;
    end.synchronize()?;
    let t_both = start.elapsed_ms(&end)? as f64 / 5.0;
    let hidden = ((t_gemm + t_copy - t_both) / t_gemm.min(t_copy)).clamp(0.0, 1.0);
    r.line(&format!(
        "- overlap: GEMM 8192³ {t_gemm:.3} ms, 1 GiB copy {t_copy:.3} ms, both on two streams {t_both:.3} ms: {:.0} % of the shorter hidden",
        hidden * 100.0
    ));
    r.line("- multi-GPU bus bandwidth: not measured (one GPU)");
    Ok(())
}
