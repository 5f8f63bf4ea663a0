//! The plumbing every export shares: the panic boundary and last error
//! ([`boundary`]), opaque handles ([`handles`]), `size`-prefixed descriptors
//! ([`descriptors`]), C dtypes ([`dtype`]) and C enums ([`enums`]), caller
//! memory ([`views`]) and scalar arguments ([`args`]).

pub(crate) mod args;
pub(crate) mod boundary;
pub(crate) mod descriptors;
pub(crate) mod dtype;
pub(crate) mod enums;
pub(crate) mod handles;
pub(crate) mod views;
