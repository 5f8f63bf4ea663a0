//! NCCL on a GPU: one-rank communicator smoke test (the multi-GPU path needs
//! several GPUs). Without feature `cuda` or a GPU it reports the case as
//! SKIPPED (never as passed) with the reason. With a GPU but no NCCL it
//! fails, naming every place searched and what to install (set
//! `FTN_SKIP_NCCL=1` to report it as skipped instead): a missing library is
//! not the same as a missing GPU.

use std::io::Write as _;

fn skipped(reason: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "[ferrotron] comm_nccl: SKIPPED 1 GPU case: {reason}"
    );
}

#[test]
#[cfg_attr(
    not(feature = "cuda"),
    ignore = "needs feature `cuda`, a GPU and libnccl"
)]
fn nccl_one_rank_all_reduce() {
    #[cfg(not(feature = "cuda"))]
    skipped("built without feature `cuda`");
    #[cfg(feature = "cuda")]
    {
        use ferrotron::comm::{Communicator, ReduceOp};
        let dev = match ferrotron::Device::cuda(0) {
            Ok(d) => d,
            Err(e) => return skipped(&e.to_string()),
        };
        match Communicator::nccl_library() {
            Ok(path) => {
                let _ = writeln!(std::io::stderr(), "[ferrotron] comm_nccl: NCCL from {path}");
            }
            Err(e) if std::env::var("FTN_SKIP_NCCL").is_ok_and(|v| v == "1") => {
                return skipped(&format!("NCCL missing (FTN_SKIP_NCCL=1): {e}"));
            }
            Err(e) => panic!("a GPU is present but NCCL is missing: {e}"),
        }
        let id = Communicator::nccl_unique_id().unwrap();
        let comm = Communicator::nccl(&dev, 0, 1, &id).unwrap();
        let s = dev.new_stream().unwrap();
        let a = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
        let mut b = dev.alloc_zeros::<f32>(3).unwrap();
        let h = comm.all_reduce(&s, &a, &mut b, ReduceOp::Sum).unwrap();
        comm.wait(&h, std::time::Duration::from_secs(30)).unwrap();
        assert_eq!(b.to_host().unwrap(), vec![1.0, 2.0, 3.0]);
        let mut wrong = dev.alloc_zeros::<f32>(2).unwrap();
        assert!(comm.all_gather(&s, &a, &mut wrong).is_err());
    }
}
