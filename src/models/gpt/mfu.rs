//! Model FLOPs utilisation: the model's training FLOPs per second (see
//! [`GptConfig::flops_per_token`]) over the peak dense tensor-core rate of
//! the devices that ran it.
//!
//! [`GptConfig::flops_per_token`]: super::GptConfig::flops_per_token

/// The variable that overrides the peak (TFLOP/s per device), for GPUs the
/// table does not know or clocks that differ from the datasheet.
pub const PEAK_ENV: &str = "FTN_PEAK_TFLOPS";

/// Dense (no sparsity) 16-bit tensor-core peak of one device in FLOP/s,
/// from NVIDIA's datasheets, by a substring of the device name; `None`
/// when the name is not in the table. Longer names are matched first, so
/// "H100 PCIe" is not read as an SXM part.
pub fn peak_flops_16bit(device_name: &str) -> Option<f64> {
    const TABLE: &[(&str, f64)] = &[
        ("H100 PCIe", 756e12),
        ("H100 NVL", 835e12),
        ("GH200", 989e12),
        ("H200", 989e12),
        ("H100", 989e12),
        ("H800", 989e12),
        ("A100", 312e12),
        ("A800", 312e12),
        ("L40S", 362e12),
    ];
    TABLE
        .iter()
        .find(|(k, _)| device_name.contains(k))
        .map(|&(_, f)| f)
}

/// The peak to divide by: `FTN_PEAK_TFLOPS` when set to a positive number
/// (given through `lookup`, so tests need no environment), else the table.
pub fn peak_flops(device_name: &str, lookup: impl Fn(&str) -> Option<String>) -> Option<f64> {
    lookup(PEAK_ENV)
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|t| t.is_finite() && *t > 0.0)
        .map(|t| t * 1e12)
        .or_else(|| peak_flops_16bit(device_name))
}

/// `model_flops` done in `seconds` on `devices` devices of `peak` FLOP/s
/// each, as a fraction (0.4 = 40 % MFU).
pub fn mfu(model_flops: f64, seconds: f64, devices: usize, peak: f64) -> f64 {
    model_flops / seconds / (devices as f64 * peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_tells_parts_apart_and_knows_nothing_of_the_emulator() {
        assert_eq!(peak_flops_16bit("NVIDIA H200"), Some(989e12));
        assert_eq!(peak_flops_16bit("NVIDIA H100 PCIe"), Some(756e12));
        assert_eq!(peak_flops_16bit("NVIDIA H100 80GB HBM3"), Some(989e12));
        assert_eq!(peak_flops_16bit("NVIDIA A100-SXM4-80GB"), Some(312e12));
        assert_eq!(peak_flops_16bit("CPU emulator (2 worker threads)"), None);
    }

    #[test]
    fn the_environment_overrides_the_table_only_with_a_positive_number() {
        let env = |v: &'static str| move |k: &str| (k == PEAK_ENV).then(|| v.to_string());
        assert_eq!(peak_flops("NVIDIA H200", env("500")), Some(500e12));
        assert_eq!(peak_flops("NVIDIA H200", env("-1")), Some(989e12));
        assert_eq!(peak_flops("NVIDIA H200", env("fast")), Some(989e12));
        assert_eq!(peak_flops("some GPU", env("100")), Some(100e12));
        assert_eq!(peak_flops("some GPU", |_| None), None);
    }

    #[test]
    fn mfu_is_achieved_over_peak() {
        // 8 devices at 1 PFLOP/s peak doing 4 PFLOP in 1 s: 50 %.
        assert!((mfu(4e15, 1.0, 8, 1e15) - 0.5).abs() < 1e-12);
    }
}
