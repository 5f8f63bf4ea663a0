//! # ferrotron
//!
//! The low-level layer of Megatron-style training in Rust: hand-written CUDA
//! kernels with typed, validated Rust wrappers, run on NVIDIA GPUs (feature
//! `cuda`) or on the CPU through a CUDA emulator that executes the very same
//! kernel source (always available; what the tests use).
//!
//! * [`core`] — `no_std` logic: dtypes, errors, validation, launch plans.
//! * [`Device`], [`Stream`], [`Event`], [`DeviceBuffer`] — the two backends.
//! * [`ops`] — typed ops (bias + GeLU so far), [`reference`] — float64 oracles.
#![cfg_attr(not(feature = "std"), no_std)]

extern crate alloc;

pub mod core;
#[rustfmt::skip]
pub mod kernel_params;

#[cfg(feature = "std")]
pub mod backend;
#[cfg(feature = "std")]
pub mod comm;
#[cfg(feature = "std")]
pub mod kernels;
#[cfg(feature = "std")]
pub mod ops;
#[cfg(feature = "std")]
pub mod parallel;
#[cfg(feature = "std")]
pub mod reference;

pub use crate::core::{DType, Element, Error, Result};

/// The README's Rust examples, compiled and run as doctests.
#[cfg(all(doctest, feature = "std"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
#[cfg(feature = "std")]
pub use backend::{AnyBuffer, BackendKind, Device, DeviceBuffer, Event, Stream};
