//! DynamicGradScaler: the device kernel against the host state machine, bit
//! for bit after every one of 10,000 random overflow / clean steps, and a
//! whole fp16 training step (unscale, update) with no host synchronisation.

mod common;

use common::{devices, Rng};
use ferrotron::core::loss_scaler::{DynamicGradScaler, GradScalerConfig};
use ferrotron::ops::multi_tensor::{DeviceGradScaler, GradRef, MultiTensor};
use ferrotron::{Device, DeviceBuffer, Stream};
use half::f16;

fn state(s: &DynamicGradScaler) -> (u32, i32, i32) {
    (
        s.scale().to_bits(),
        s.growth_tracker(),
        s.hysteresis_tracker(),
    )
}

fn set_flag(stream: &Stream, buf: &mut DeviceBuffer<f32>, v: f32) {
    stream.copy_from_host(&[v], buf).unwrap();
}

/// Drives host and device scalers with the same 10,000 steps. The overflow
/// probability switches between phases (storms of overflows that drive the
/// scale to its minimum, calm stretches that let it grow), so every branch
/// is taken many times; the states must agree after every step.
fn lockstep(dev: &Device, config: GradScalerConfig, salt: u64) {
    let (mut rng, seed) = Rng::new(salt);
    let stream = dev.new_stream().unwrap();
    let mut host = DynamicGradScaler::new(config).unwrap();
    let mut device = DeviceGradScaler::new(dev, config).unwrap();
    let mut found = dev.alloc_zeros::<f32>(1).unwrap();
    let (mut grew, mut backed_off, mut at_min) = (0, 0, 0);
    let mut p_overflow = 0.0;
    for step in 0..10_000 {
        if step % 400 == 0 {
            p_overflow = [0.002, 0.4, 0.0005, 0.05, 0.9][(step / 400) % 5];
        }
        let overflow = rng.uniform() < p_overflow;
        // Any positive flag counts as an overflow, as in Megatron (> 0).
        let flag = if overflow {
            [1.0, 0.5, 7.0][step % 3]
        } else {
            [0.0, -0.0, -1.0][step % 3]
        };
        set_flag(&stream, &mut found, flag);
        let before = host.scale();
        host.update(overflow);
        device.update(&stream, &mut found, true).unwrap();
        let got = device.to_host().unwrap();
        assert_eq!(
            state(&got),
            state(&host),
            "step {step} (found_inf = {flag}) on {dev:?}: device {got:?} vs host {host:?} (seed {seed})"
        );
        if step % 97 == 0 {
            assert_eq!(found.to_host().unwrap()[0], 0.0, "found_inf not reset");
        }
        grew += (host.scale() > before) as u32;
        backed_off += (host.scale() < before) as u32;
        at_min += (overflow && host.scale() == config.min_scale) as u32;
    }
    assert!(
        grew >= 5 && backed_off >= 5 && at_min >= 5,
        "sequence too tame: {grew} growths, {backed_off} backoffs, {at_min} overflows at the minimum (seed {seed})"
    );
}

#[test]
fn device_matches_host_bit_for_bit_over_10k_random_steps() {
    for dev in devices("device_matches_host_bit_for_bit", 2) {
        // Megatron's factors, a short interval so growth happens.
        lockstep(
            &dev,
            GradScalerConfig {
                initial_scale: 65536.0,
                growth_interval: 40,
                ..GradScalerConfig::default()
            },
            1,
        );
        // Awkward factors: rounding in every multiply, an odd minimum.
        lockstep(
            &dev,
            GradScalerConfig {
                initial_scale: 1000.0,
                min_scale: 3.0,
                growth_factor: 1.7,
                backoff_factor: 0.37,
                growth_interval: 23,
                hysteresis: 3,
            },
            2,
        );
    }
}

#[test]
fn flag_is_kept_unless_reset() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let mut s = DeviceGradScaler::new(&dev, GradScalerConfig::default()).unwrap();
    let mut found = dev.alloc_zeros::<f32>(1).unwrap();
    set_flag(&stream, &mut found, 1.0);
    s.update(&stream, &mut found, false).unwrap();
    assert_eq!(found.to_host().unwrap(), [1.0]);
    s.update(&stream, &mut found, true).unwrap();
    assert_eq!(found.to_host().unwrap(), [0.0]);
    let h = s.to_host().unwrap();
    assert_eq!(state(&h), (2147483648f32.to_bits(), 0, 0));
}

/// fp16 steps with the scale living on the device: unscale by the device
/// scale, flag overflow, update, repeat; the host only looks at the end.
#[test]
fn training_steps_without_host_sync() {
    for dev in devices("training_steps_without_host_sync", 1) {
        let (mut rng, seed) = Rng::new(7);
        let stream = dev.new_stream().unwrap();
        let config = GradScalerConfig {
            initial_scale: 1024.0,
            growth_interval: 2,
            hysteresis: 1,
            ..GradScalerConfig::default()
        };
        let mut host = DynamicGradScaler::new(config).unwrap();
        let mut scaler = DeviceGradScaler::new(&dev, config).unwrap();
        let mut found = dev.alloc_zeros::<f32>(1).unwrap();
        let mut mt = MultiTensor::new();
        let mut grads: Vec<DeviceBuffer<f16>> = Vec::new();
        let mut expect = Vec::new();
        for step in 0..12 {
            let overflow = step % 4 == 3;
            let (mut g, gv) = rng.tensor::<f16>(3000, 10.0);
            if overflow {
                g[(rng.next_u64() % 3000) as usize] = f16::INFINITY;
            }
            let mut gd = dev.upload(&g).unwrap();
            let mut w = dev.upload(&[1.0f32; 5]).unwrap();
            mt.unscale_with_scaler(
                &stream,
                &mut [GradRef::from(&mut gd), GradRef::from(&mut w)],
                &scaler,
                &mut found,
            )
            .unwrap();
            scaler.update(&stream, &mut found, true).unwrap();
            let inv = host.inv_scale();
            expect.push((
                gv.iter()
                    .map(|&x| f16::from_f32(x as f32 * inv))
                    .collect::<Vec<_>>(),
                overflow,
            ));
            host.update(overflow);
            grads.push(gd);
        }
        stream.synchronize().unwrap();
        assert_eq!(state(&scaler.to_host().unwrap()), state(&host));
        for (step, (g, (want, overflow))) in grads.iter().zip(&expect).enumerate() {
            let got = g.to_host().unwrap();
            if !overflow {
                assert_eq!(&got, want, "step {step} (seed {seed})");
            }
        }
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dev = Device::emu();
    let other = Device::emu();
    let stream = dev.new_stream().unwrap();
    let bad = GradScalerConfig {
        backoff_factor: 2.0,
        ..GradScalerConfig::default()
    };
    let e = DeviceGradScaler::new(&dev, bad).unwrap_err().to_string();
    assert!(e.contains("`backoff_factor`"), "{e}");
    let mut s = DeviceGradScaler::new(&other, GradScalerConfig::default()).unwrap();
    let mut found = dev.alloc_zeros::<f32>(1).unwrap();
    let e = s.update(&stream, &mut found, true).unwrap_err().to_string();
    assert!(e.contains("DeviceGradScaler"), "{e}");
    let mut s = DeviceGradScaler::new(&dev, GradScalerConfig::default()).unwrap();
    let mut two = dev.alloc_zeros::<f32>(2).unwrap();
    let e = s.update(&stream, &mut two, true).unwrap_err().to_string();
    assert!(e.contains("`found_inf`"), "{e}");
}
