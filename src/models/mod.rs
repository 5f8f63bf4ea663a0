//! Whole models assembled from ferrotron's kernels, parallel layers,
//! pipeline executor and data-parallel optimizer.

pub mod gpt;
