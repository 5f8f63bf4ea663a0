//! Megatron's `DynamicGradScaler` (docs/semantics.md, "Multi-tensor ops")
//! as a `no_std` state machine.
//!
//! The scale is fp32, as Megatron keeps it in an fp32 tensor, and every
//! update is the same fp32 arithmetic the device kernel
//! `ftn_grad_scaler_update` does, so host and device states agree bit for bit
//! (see `ops::multi_tensor::DeviceGradScaler`).
//!
//! ```
//! use ferrotron::core::loss_scaler::{DynamicGradScaler, GradScalerConfig};
//! let mut s = DynamicGradScaler::new(GradScalerConfig::default())?;
//! assert_eq!(s.scale(), 4294967296.0);
//! s.update(true); // first overflow: hysteresis 2 -> 1, scale kept
//! assert_eq!(s.scale(), 4294967296.0);
//! s.update(true); // second: hysteresis hits 0, scale halves
//! assert_eq!(s.scale(), 2147483648.0);
//! # Ok::<(), ferrotron::Error>(())
//! ```

use alloc::format;

use super::error::{Error, Result};

const OP: &str = "DynamicGradScaler";

/// Hyper-parameters of [`DynamicGradScaler`]; `Default` is Megatron's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradScalerConfig {
    /// Scale at the start (Megatron: 2^32).
    pub initial_scale: f32,
    /// The scale never backs off below this (1.0).
    pub min_scale: f32,
    /// Multiplier after `growth_interval` clean steps in a row (2.0).
    pub growth_factor: f32,
    /// Multiplier on a backoff (0.5).
    pub backoff_factor: f32,
    /// Clean steps in a row before the scale grows (1000).
    pub growth_interval: u32,
    /// Overflows tolerated (since the last growth) before backing off (2).
    pub hysteresis: u32,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        GradScalerConfig {
            initial_scale: 4294967296.0, // 2^32
            min_scale: 1.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 1000,
            hysteresis: 2,
        }
    }
}

impl GradScalerConfig {
    /// Megatron's checks, plus what the device state needs: every float
    /// finite; `0 < min_scale <= initial_scale`; `growth_factor > 1`;
    /// `0 < backoff_factor < 1`; `1 <= growth_interval, hysteresis <= i32::MAX`.
    pub fn validate(&self) -> Result<()> {
        let bad = |arg: &'static str, expected: &str, got: f32| {
            Err(Error::invalid(OP, arg, expected, format!("{got:?}")))
        };
        if !(self.initial_scale.is_finite() && self.initial_scale > 0.0) {
            return bad("initial_scale", "a finite value > 0", self.initial_scale);
        }
        if !(self.min_scale.is_finite() && self.min_scale > 0.0) {
            return bad("min_scale", "a finite value > 0", self.min_scale);
        }
        if self.min_scale > self.initial_scale {
            return Err(Error::invalid(
                OP,
                "min_scale",
                format!("at most initial_scale ({:?})", self.initial_scale),
                format!("{:?}", self.min_scale),
            ));
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return bad("growth_factor", "a finite value > 1", self.growth_factor);
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return bad("backoff_factor", "a value in (0, 1)", self.backoff_factor);
        }
        for (arg, v) in [
            ("growth_interval", self.growth_interval),
            ("hysteresis", self.hysteresis),
        ] {
            if v == 0 || v > i32::MAX as u32 {
                return Err(Error::invalid(OP, arg, "1 ..= i32::MAX", v));
            }
        }
        Ok(())
    }
}

/// Megatron's dynamic loss scaler. Call [`update`](Self::update) once per
/// step with whether any gradient was non-finite (after the cross-rank MAX
/// reduction of found_inf); skip the optimizer step when it was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DynamicGradScaler {
    pub(crate) scale: f32,
    pub(crate) growth_tracker: i32,
    pub(crate) hysteresis_tracker: i32,
    pub(crate) config: GradScalerConfig,
}

impl DynamicGradScaler {
    /// A fresh scaler: scale = `initial_scale`, growth tracker 0, hysteresis
    /// tracker = `hysteresis`.
    pub fn new(config: GradScalerConfig) -> Result<Self> {
        config.validate()?;
        Ok(DynamicGradScaler {
            scale: config.initial_scale,
            growth_tracker: 0,
            hysteresis_tracker: config.hysteresis as i32,
            config,
        })
    }

    /// A scaler resumed from saved state (Megatron's `load_state_dict`).
    /// Accepted: every state [`update`](Self::update) can reach, and no
    /// other: `scale` > 0 and not NaN (`+inf` is reachable: growth has no
    /// maximum, as in Megatron; the device scaler continues from it too),
    /// `0 <= growth_tracker < growth_interval`, `hysteresis_tracker <=
    /// hysteresis` (it goes negative on repeated overflows, down to
    /// `i32::MIN`).
    pub fn from_state(
        config: GradScalerConfig,
        scale: f32,
        growth_tracker: i32,
        hysteresis_tracker: i32,
    ) -> Result<Self> {
        config.validate()?;
        if scale.is_nan() || scale <= 0.0 {
            return Err(Error::invalid(
                OP,
                "scale",
                "a value > 0 (+inf included), not NaN",
                format!("{scale:?}"),
            ));
        }
        if growth_tracker < 0 || growth_tracker >= config.growth_interval as i32 {
            return Err(Error::invalid(
                OP,
                "growth_tracker",
                format!("0 ..= {}", config.growth_interval - 1),
                growth_tracker,
            ));
        }
        if hysteresis_tracker > config.hysteresis as i32 {
            return Err(Error::invalid(
                OP,
                "hysteresis_tracker",
                format!("at most config.hysteresis ({})", config.hysteresis),
                hysteresis_tracker,
            ));
        }
        Ok(DynamicGradScaler {
            scale,
            growth_tracker,
            hysteresis_tracker,
            config,
        })
    }

    /// The current loss scale.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// `1 / scale` computed in fp64 and rounded to fp32, as Megatron's
    /// `scale.double().reciprocal().float()`.
    pub fn inv_scale(&self) -> f32 {
        (1.0 / self.scale as f64) as f32
    }

    /// Clean steps since the last overflow or growth.
    pub fn growth_tracker(&self) -> i32 {
        self.growth_tracker
    }

    /// Overflows still tolerated before backing off (<= 0: every overflow
    /// backs off).
    pub fn hysteresis_tracker(&self) -> i32 {
        self.hysteresis_tracker
    }

    pub fn config(&self) -> &GradScalerConfig {
        &self.config
    }

    /// One step of Megatron's `DynamicGradScaler.update(found_inf)`:
    ///
    /// * overflow: growth tracker <- 0; hysteresis tracker -= 1 (saturating);
    ///   if it is now <= 0: scale <- max(scale * backoff, min_scale). The
    ///   hysteresis tracker is not reset, so further overflows back off at once.
    /// * clean: growth tracker += 1; when it reaches `growth_interval` both
    ///   trackers reset and scale *= growth_factor (no maximum: it may reach
    ///   +inf in fp32, as in Megatron).
    pub fn update(&mut self, found_inf: bool) {
        let c = &self.config;
        if found_inf {
            self.growth_tracker = 0;
            self.hysteresis_tracker = self.hysteresis_tracker.saturating_sub(1);
            if self.hysteresis_tracker <= 0 {
                self.scale = (self.scale * c.backoff_factor).max(c.min_scale);
            }
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == c.growth_interval as i32 {
                self.growth_tracker = 0;
                self.hysteresis_tracker = c.hysteresis as i32;
                self.scale *= c.growth_factor;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(interval: u32, hysteresis: u32) -> DynamicGradScaler {
        DynamicGradScaler::new(GradScalerConfig {
            initial_scale: 8.0,
            min_scale: 1.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: interval,
            hysteresis,
        })
        .unwrap()
    }

    fn state(s: &DynamicGradScaler) -> (f32, i32, i32) {
        (s.scale(), s.growth_tracker(), s.hysteresis_tracker())
    }

    #[test]
    fn every_reachable_state_can_be_resumed() {
        // Growth past fp32 max reaches +inf; from there it continues.
        let mut s = DynamicGradScaler::new(GradScalerConfig {
            initial_scale: f32::MAX,
            growth_interval: 1,
            ..GradScalerConfig::default()
        })
        .unwrap();
        s.update(false);
        assert_eq!(s.scale(), f32::INFINITY);
        let r = DynamicGradScaler::from_state(
            *s.config(),
            s.scale(),
            s.growth_tracker(),
            s.hysteresis_tracker(),
        )
        .unwrap();
        assert_eq!(r, s);
        for _ in 0..5 {
            s.update(true);
        }
        assert!(s.hysteresis_tracker() < 0);
        let r = DynamicGradScaler::from_state(
            *s.config(),
            s.scale(),
            s.growth_tracker(),
            s.hysteresis_tracker(),
        )
        .unwrap();
        assert_eq!(r, s);
        let c = GradScalerConfig::default();
        assert!(DynamicGradScaler::from_state(c, f32::NAN, 0, 2).is_err());
        assert!(DynamicGradScaler::from_state(c, 0.0, 0, 2).is_err());
        assert!(DynamicGradScaler::from_state(c, 1.0, 0, 3).is_err());
        assert!(DynamicGradScaler::from_state(c, 1.0, 0, i32::MIN).is_ok());
    }

    #[test]
    fn megatron_defaults() {
        let c = GradScalerConfig::default();
        assert_eq!(c.initial_scale, 2f32.powi(32));
        assert_eq!(
            (c.min_scale, c.growth_factor, c.backoff_factor),
            (1.0, 2.0, 0.5)
        );
        assert_eq!((c.growth_interval, c.hysteresis), (1000, 2));
        let s = DynamicGradScaler::new(c).unwrap();
        assert_eq!(state(&s), (4294967296.0, 0, 2));
        assert_eq!(s.inv_scale(), 2f32.powi(-32));
    }

    #[test]
    fn hand_worked_sequence() {
        // interval 3, hysteresis 2, scale 8, min 1.
        let mut s = small(3, 2);
        let steps: &[(bool, (f32, i32, i32))] = &[
            (false, (8.0, 1, 2)),
            (false, (8.0, 2, 2)),
            (false, (16.0, 0, 2)), // 3 clean: grow, trackers reset
            (true, (16.0, 0, 1)),  // first overflow absorbed by hysteresis
            (false, (16.0, 1, 1)),
            (true, (8.0, 0, 0)),  // second overflow: back off
            (true, (4.0, 0, -1)), // not reset: backs off again at once
            (true, (2.0, 0, -2)),
            (true, (1.0, 0, -3)),
            (true, (1.0, 0, -4)), // clamped at min_scale
            (false, (1.0, 1, -4)),
            (false, (1.0, 2, -4)),
            (false, (2.0, 0, 2)), // growth resets hysteresis
            (true, (2.0, 0, 1)),
            (false, (2.0, 1, 1)),
            (false, (2.0, 2, 1)),
            (false, (4.0, 0, 2)),
        ];
        for (i, &(found, want)) in steps.iter().enumerate() {
            s.update(found);
            assert_eq!(state(&s), want, "step {i} (found_inf = {found})");
        }
    }

    #[test]
    fn hysteresis_one_backs_off_on_every_overflow() {
        let mut s = small(1000, 1);
        s.update(true);
        assert_eq!(state(&s), (4.0, 0, 0));
        s.update(true);
        assert_eq!(state(&s), (2.0, 0, -1));
    }

    #[test]
    fn backoff_respects_an_awkward_minimum() {
        let mut s = DynamicGradScaler::new(GradScalerConfig {
            initial_scale: 10.0,
            min_scale: 3.0,
            hysteresis: 1,
            ..GradScalerConfig::default()
        })
        .unwrap();
        s.update(true);
        assert_eq!(s.scale(), 5.0);
        s.update(true);
        assert_eq!(s.scale(), 3.0);
        s.update(true);
        assert_eq!(s.scale(), 3.0);
    }

    #[test]
    fn growth_has_no_maximum() {
        let mut s = DynamicGradScaler::new(GradScalerConfig {
            initial_scale: 2f32.powi(126),
            growth_interval: 1,
            ..GradScalerConfig::default()
        })
        .unwrap();
        s.update(false);
        assert_eq!(s.scale(), 2f32.powi(127));
        s.update(false);
        assert_eq!(s.scale(), f32::INFINITY);
        assert_eq!(s.inv_scale(), 0.0);
    }

    #[test]
    fn hysteresis_tracker_saturates() {
        let mut s =
            DynamicGradScaler::from_state(small(3, 2).config, 4.0, 0, i32::MIN + 1).unwrap();
        s.update(true);
        s.update(true);
        assert_eq!(state(&s), (1.0, 0, i32::MIN));
    }

    #[test]
    fn config_errors_name_the_argument() {
        let d = GradScalerConfig::default();
        let cases: &[(GradScalerConfig, &str)] = &[
            (
                GradScalerConfig {
                    initial_scale: 0.0,
                    ..d
                },
                "initial_scale",
            ),
            (
                GradScalerConfig {
                    initial_scale: f32::INFINITY,
                    ..d
                },
                "initial_scale",
            ),
            (
                GradScalerConfig {
                    min_scale: -1.0,
                    ..d
                },
                "min_scale",
            ),
            (
                GradScalerConfig {
                    min_scale: f32::NAN,
                    ..d
                },
                "min_scale",
            ),
            (
                GradScalerConfig {
                    initial_scale: 0.5,
                    ..d
                },
                "min_scale",
            ),
            (
                GradScalerConfig {
                    growth_factor: 1.0,
                    ..d
                },
                "growth_factor",
            ),
            (
                GradScalerConfig {
                    backoff_factor: 1.0,
                    ..d
                },
                "backoff_factor",
            ),
            (
                GradScalerConfig {
                    backoff_factor: f32::NAN,
                    ..d
                },
                "backoff_factor",
            ),
            (
                GradScalerConfig {
                    growth_interval: 0,
                    ..d
                },
                "growth_interval",
            ),
            (GradScalerConfig { hysteresis: 0, ..d }, "hysteresis"),
            (
                GradScalerConfig {
                    hysteresis: u32::MAX,
                    ..d
                },
                "hysteresis",
            ),
        ];
        for (c, arg) in cases {
            let e = DynamicGradScaler::new(*c).unwrap_err();
            let msg = format!("{e}");
            assert!(msg.contains(&format!("`{arg}`")), "{msg}");
            assert!(msg.contains("DynamicGradScaler"), "{msg}");
        }
        assert!(DynamicGradScaler::from_state(d, 0.0, 0, 2).is_err());
        assert!(DynamicGradScaler::from_state(d, 1.0, 1000, 2).is_err());
        assert!(DynamicGradScaler::from_state(d, 1.0, -1, 2).is_err());
        assert!(DynamicGradScaler::from_state(d, 1.0, 999, -7).is_ok());
    }
}
