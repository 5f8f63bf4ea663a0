//! # ferrotron
//!
//! The low-level layer of Megatron-style training in Rust: hand-written CUDA
//! kernels with typed, validated Rust wrappers, run on NVIDIA GPUs (feature
//! `cuda`) or on the CPU through a CUDA emulator that executes the very same
//! kernel source (always available; what the tests use).
//!
//! * [`core`] — `no_std` logic: dtypes and the one dtype dispatch
//!   ([`with_dtype!`]), errors, validation, launch plans, the loss scaler,
//!   the rank grid.
//! * [`Device`], [`Stream`], [`Event`], [`DeviceBuffer`], [`AnyBuffer`] —
//!   the two backends (the CUDA-on-CPU emulator, and CUDA).
//! * [`kernels`] — the generated table of every kernel and kernel family.
//! * [`ops`] — typed fused ops: bias + GeLU, bias + dropout + residual add
//!   (Philox RNG, [`core::rng`] streams), scale + mask + softmax,
//!   LayerNorm / RMSNorm, GEMM with epilogues, multi-tensor, copy,
//!   vocab-parallel kernels.
//! * [`comm`] — collectives (in-process and NCCL); [`parallel`] —
//!   tensor-parallel layers, mappings, vocab-parallel embedding and
//!   cross-entropy.
//! * [`mod@reference`] — float64 oracles every kernel is tested against.
//!
//! `docs/architecture.md` walks through the layers and how to extend them.
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
pub mod models;
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
pub use backend::{
    AnyBuffer, BackendKind, Device, DeviceBuffer, DeviceRead, DeviceSlice, DeviceSliceMut,
    DeviceWrite, Event, HostScope, Stream, MAX_EMU_WORKERS,
};
