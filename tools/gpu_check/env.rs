//! Step `env`: what the check runs on — the GPU, its driver and clocks
//! (from nvidia-smi when present), the libraries that were loaded, and the
//! cost of creating a device (every module loaded up front).

use std::process::Command;
use std::time::Instant;

use ferrotron::comm::Communicator;
use ferrotron::{Device, Result};

use crate::report::Report;

pub fn run(dev: Option<&Device>, r: &mut Report) -> Result<()> {
    r.line(&format!(
        "- ferrotron {} (commit {})",
        env!("CARGO_PKG_VERSION"),
        option_env!("FTN_COMMIT").unwrap_or("unknown")
    ));
    let smi = Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,memory.total",
            "--format=csv,noheader",
        ])
        .output();
    match smi {
        Ok(o) if o.status.success() => r.line(&format!(
            "- nvidia-smi: {}",
            String::from_utf8_lossy(&o.stdout).trim()
        )),
        _ => r.line("- nvidia-smi: not available"),
    }
    r.line(&format!("- libcuda: {}", loaded_library("libcuda.so")));
    match Communicator::nccl_library() {
        Ok(p) => r.line(&format!("- NCCL: {p}")),
        Err(e) => r.line(&format!("- NCCL: MISSING: {e}")),
    }
    match dev {
        Some(_) => {
            // Creating another device handle loads every module again: the
            // cost `Device::cuda` pays up front so no first launch can block.
            let t = Instant::now();
            let again = Device::cuda(0)?;
            r.line(&format!(
                "- device: {}; `Device::cuda(0)` with every kernel loaded: {:.1} ms",
                again.name(),
                t.elapsed().as_secs_f64() * 1e3
            ));
            memory(&again, r)?;
        }
        None => r.line("- device: SKIPPED: no usable GPU"),
    }
    Ok(())
}

/// Which allocator the device uses and what an allocation and a free cost
/// the host (a 1 MiB zeroed buffer, dropped at once; stream-ordered frees
/// return without waiting for the device).
fn memory(dev: &Device, r: &mut Report) -> Result<()> {
    const N: usize = 200;
    let t = Instant::now();
    for _ in 0..N {
        drop(dev.alloc_zeros::<u8>(1 << 20)?);
    }
    dev.synchronize()?;
    r.line(&format!(
        "- memory: {}; alloc_zeros(1 MiB) + drop: {:.1} us per pair",
        if dev.stream_ordered_memory() {
            "stream-ordered pool (cuMemAllocFromPoolAsync / cuMemFreeAsync)"
        } else {
            "cuMemAlloc / cuMemFree after a context synchronisation (no pool support)"
        },
        t.elapsed().as_secs_f64() * 1e6 / N as f64
    ));
    Ok(())
}

/// The path of a shared library this process has mapped (from
/// `/proc/self/maps`), or "not loaded".
pub fn loaded_library(stem: &str) -> String {
    std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| {
            maps.lines()
                .filter_map(|l| l.split_whitespace().nth(5))
                .find(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with(stem)))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "not loaded".into())
}
