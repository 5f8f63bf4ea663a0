//! CUDA-event timing and the device-to-device copy baseline.

use ferrotron::{Device, DeviceBuffer, Result, Stream};

/// Milliseconds per call of `f`: `warmup` calls, then one event pair around
/// `runs` back-to-back calls (launch overhead amortised as in a training
/// step), divided by `runs`.
pub fn per_call_ms(
    stream: &Stream,
    warmup: usize,
    runs: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let a = stream.record_event()?;
    for _ in 0..runs.max(1) {
        f()?;
    }
    let b = stream.record_event()?;
    b.synchronize()?;
    Ok(a.elapsed_ms(&b)? as f64 / runs.max(1) as f64)
}

/// GB/s (10^9 bytes) of moving `bytes` in `ms`.
pub fn gbps(bytes: f64, ms: f64) -> f64 {
    bytes / (ms * 1e-3) / 1e9
}

/// The device-to-device copy of `bytes` (read + write = 2 × bytes moved):
/// the bandwidth every memory-bound kernel is compared with.
pub struct CopyBaseline {
    pub bytes: usize,
    pub ms: f64,
}

impl CopyBaseline {
    pub fn measure(dev: &Device, stream: &Stream, bytes: usize) -> Result<CopyBaseline> {
        let n = bytes / 4;
        let src: DeviceBuffer<f32> = dev.alloc_zeros(n)?;
        let mut dst: DeviceBuffer<f32> = dev.alloc_zeros(n)?;
        let ms = per_call_ms(stream, 3, 20, || stream.copy_device(&src, &mut dst))?;
        Ok(CopyBaseline { bytes: n * 4, ms })
    }

    /// GB/s counting bytes read and written.
    pub fn gbps(&self) -> f64 {
        gbps(2.0 * self.bytes as f64, self.ms)
    }
}

/// A deterministic pseudo-random stream (splitmix64) for inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn sym(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}
