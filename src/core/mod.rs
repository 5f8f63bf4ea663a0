//! The `no_std` (+ `alloc`) core: dtypes, errors, argument validation and
//! launch plans. Everything here is pure logic, shared by both backends and
//! unit-tested once.

pub mod activation;
pub mod ddp_layout;
pub mod dtype;
pub mod error;
pub mod launch;
pub mod loss_scaler;
pub mod philox;
pub mod pipeline;
pub mod plan;
pub mod rank_grid;
pub mod rng;
pub mod validate;

pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use launch::{DeviceLimits, LaunchConfig};
