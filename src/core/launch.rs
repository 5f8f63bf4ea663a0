//! Launch configurations and the device limits they are checked against.
//! Both backends take the same [`LaunchConfig`] from a plan and check it with
//! [`DeviceLimits::check`] before enqueueing, so a bad launch is a synchronous
//! error on every backend.

use alloc::format;

use super::error::{Error, Result};

/// Grid, block and dynamic shared memory of one kernel launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_smem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch.
    pub const fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            dynamic_smem_bytes: 0,
        }
    }

    /// Threads per block.
    pub const fn threads_per_block(&self) -> u64 {
        self.block[0] as u64 * self.block[1] as u64 * self.block[2] as u64
    }
}

/// What a device accepts. `SM90` is what the emulator enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    pub max_threads_per_block: u32,
    pub max_block: [u32; 3],
    pub max_grid: [u32; 3],
    pub max_smem_per_block: u32,
    /// Most blocks of a thread block cluster (8, the portable size, on sm_90
    /// and later; 1 before: no clusters).
    pub max_cluster_size: u32,
}

impl DeviceLimits {
    /// Limits of an sm_90 (Hopper) part; also the emulator's.
    pub const SM90: DeviceLimits = DeviceLimits {
        max_threads_per_block: 1024,
        max_block: [1024, 1024, 64],
        max_grid: [i32::MAX as u32, 65535, 65535],
        max_smem_per_block: 232_448,
        max_cluster_size: 8,
    };

    /// An sm_80 (A100) part: 163 KiB of shared memory per block, no clusters.
    pub const SM80: DeviceLimits = DeviceLimits {
        max_smem_per_block: 166_912,
        max_cluster_size: 1,
        ..DeviceLimits::SM90
    };

    /// Checks that a kernel declared for clusters of `cluster` blocks can run
    /// here with this grid.
    pub fn check_cluster(&self, kernel: &str, cluster: u32, cfg: &LaunchConfig) -> Result<()> {
        if cluster <= 1 {
            return Ok(());
        }
        let message = if cluster > self.max_cluster_size {
            format!(
                "the kernel runs in clusters of {cluster} blocks; this device takes at most {} (clusters need sm_90 or later)",
                self.max_cluster_size
            )
        } else if cfg.grid[0] % cluster != 0 {
            format!(
                "gridDim.x = {} is not a multiple of the kernel's cluster size {cluster}",
                cfg.grid[0]
            )
        } else {
            return Ok(());
        };
        Err(Error::InvalidLaunch {
            kernel: kernel.into(),
            message,
        })
    }

    /// Checks a launch of `kernel` against these limits.
    pub fn check(&self, kernel: &str, cfg: &LaunchConfig) -> Result<()> {
        let bad = |message| {
            Err(Error::InvalidLaunch {
                kernel: kernel.into(),
                message,
            })
        };
        for (axis, name) in ["x", "y", "z"].iter().enumerate() {
            if cfg.grid[axis] == 0 || cfg.grid[axis] > self.max_grid[axis] {
                return bad(format!(
                    "gridDim.{name} = {} outside 1..={}",
                    cfg.grid[axis], self.max_grid[axis]
                ));
            }
            if cfg.block[axis] == 0 || cfg.block[axis] > self.max_block[axis] {
                return bad(format!(
                    "blockDim.{name} = {} outside 1..={}",
                    cfg.block[axis], self.max_block[axis]
                ));
            }
        }
        if cfg.threads_per_block() > self.max_threads_per_block as u64 {
            return bad(format!(
                "{} threads per block exceed the limit of {}",
                cfg.threads_per_block(),
                self.max_threads_per_block
            ));
        }
        if cfg.dynamic_smem_bytes > self.max_smem_per_block {
            return bad(format!(
                "{} bytes of dynamic shared memory exceed the limit of {}",
                cfg.dynamic_smem_bytes, self.max_smem_per_block
            ));
        }
        Ok(())
    }
}

/// Shared memory, static and dynamic together, that a block of any kernel
/// may use without opting in (CUDA's default on every architecture since
/// sm_70).
pub const SMEM_WITHOUT_OPT_IN: u32 = 48 * 1024;

/// The dynamic shared memory `kernel` (with `static_smem` bytes of
/// `__shared__` arrays) must be opted into before a launch asking for
/// `dynamic` bytes: `None` when static + dynamic fit the 48 KiB every block
/// gets, `Some(dynamic)` when they do not, and an `InvalidLaunch` naming
/// both sizes when they exceed `max_opt_in`, the device's per-block limit.
/// (Counting the static part matters: a kernel with a 256-byte reduction
/// buffer cannot take 48 KiB of dynamic memory without an opt-in.)
pub fn dynamic_smem_opt_in(
    kernel: &str,
    static_smem: u32,
    dynamic: u32,
    max_opt_in: u32,
) -> Result<Option<u32>> {
    let total = u64::from(static_smem) + u64::from(dynamic);
    if total <= u64::from(SMEM_WITHOUT_OPT_IN) {
        return Ok(None);
    }
    if total > u64::from(max_opt_in) {
        return Err(Error::InvalidLaunch {
            kernel: kernel.into(),
            message: format!(
                "{dynamic} B of dynamic shared memory + {static_smem} B static exceed the {max_opt_in} B a block may opt into"
            ),
        });
    }
    Ok(Some(dynamic))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opt_in_counts_static_shared_memory() {
        let max = DeviceLimits::SM90.max_smem_per_block;
        // LayerNorm forward at hidden 12288: 48 KiB of gamma and beta plus a
        // 256-byte reduction buffer (failed to launch on an H200 when only
        // the dynamic part was counted).
        assert_eq!(
            dynamic_smem_opt_in("k", 256, 49152, max).unwrap(),
            Some(49152)
        );
        assert_eq!(dynamic_smem_opt_in("k", 0, 49152, max).unwrap(), None);
        assert_eq!(dynamic_smem_opt_in("k", 256, 48896, max).unwrap(), None);
        assert_eq!(
            dynamic_smem_opt_in("k", 256, max - 256, max).unwrap(),
            Some(max - 256)
        );
        let e = dynamic_smem_opt_in("kern", 256, max - 255, max)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kern") && e.contains("+ 256 B static") && e.contains(&format!("{max} B")),
            "{e}"
        );
    }

    #[test]
    fn accepts_the_limits_and_rejects_one_past() {
        let l = DeviceLimits::SM90;
        assert!(l.check("k", &LaunchConfig::linear(1, 1024)).is_ok());
        let e = l.check("k", &LaunchConfig::linear(1, 1025)).unwrap_err();
        assert!(format!("{e}").contains("blockDim.x = 1025"), "{e}");
        let mut c = LaunchConfig::linear(1, 32);
        c.block = [32, 32, 2];
        let e = l.check("kern", &c).unwrap_err();
        assert!(format!("{e}").contains("2048 threads"), "{e}");
        assert!(l.check("k", &LaunchConfig::linear(0, 32)).is_err());
        c = LaunchConfig::linear(1, 32);
        c.grid[1] = 65536;
        assert!(l.check("k", &c).is_err());
        c = LaunchConfig::linear(1, 32);
        c.dynamic_smem_bytes = 232_449;
        assert!(l.check("k", &c).is_err());
    }
}
