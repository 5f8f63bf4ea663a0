//! Element types collectives move, and how they reduce: floats accumulate in
//! fp32 (f64 for nothing: fp32 sums in rank order, rounded once to the
//! storage type), integers wrap like NCCL's. The order over ranks is fixed
//! (0, 1, ...), so every rank gets bitwise identical results.

use half::{bf16, f16};

use super::ReduceOp;
use crate::core::Element;

/// An element a communicator can reduce.
pub trait CommElement: Element {
    /// The accumulator type.
    type Acc: Copy;
    fn load(self) -> Self::Acc;
    fn store(acc: Self::Acc) -> Self;
    fn combine(op: ReduceOp, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Divides by the rank count (ReduceOp::Avg).
    fn average(acc: Self::Acc, ranks: usize) -> Self::Acc;
}

macro_rules! float_element {
    ($t:ty, $load:expr, $store:expr) => {
        impl CommElement for $t {
            type Acc = f32;
            fn load(self) -> f32 {
                ($load)(self)
            }
            fn store(acc: f32) -> Self {
                ($store)(acc)
            }
            fn combine(op: ReduceOp, a: f32, b: f32) -> f32 {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                }
            }
            fn average(acc: f32, ranks: usize) -> f32 {
                acc / ranks as f32
            }
        }
    };
}

float_element!(f32, |x: f32| x, |a: f32| a);
float_element!(f16, |x: f16| x.to_f32(), f16::from_f32);
float_element!(bf16, |x: bf16| x.to_f32(), bf16::from_f32);

macro_rules! int_element {
    ($t:ty) => {
        impl CommElement for $t {
            type Acc = $t;
            fn load(self) -> $t {
                self
            }
            fn store(acc: $t) -> Self {
                acc
            }
            fn combine(op: ReduceOp, a: $t, b: $t) -> $t {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                }
            }
            fn average(acc: $t, ranks: usize) -> $t {
                (acc as i128 / ranks as i128) as $t
            }
        }
    };
}

int_element!(i32);
int_element!(i64);
int_element!(u8);

/// `out[i] = op over r of inputs[r][i]`, in rank order.
pub(crate) fn reduce_into<T: CommElement>(op: ReduceOp, inputs: &[&[T]], out: &mut [T]) {
    for (i, o) in out.iter_mut().enumerate() {
        let mut acc = inputs[0][i].load();
        for input in &inputs[1..] {
            acc = T::combine(op, acc, input[i].load());
        }
        if op == ReduceOp::Avg {
            acc = T::average(acc, inputs.len());
        }
        *o = T::store(acc);
    }
}
