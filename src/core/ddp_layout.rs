//! The layout of data-parallel gradient (and parameter) buffers, as
//! Megatron-Core's `ParamAndGradBuffer` computes it: pure index arithmetic,
//! no memory (docs/data-parallel.md).
//!
//! One buffer holds the parameters of one (param dtype, grad dtype) group.
//! Parameters are laid out in **reverse registration order** (the order
//! backprop produces their gradients) and cut into buckets: a bucket closes
//! at a parameter boundary once it holds at least `bucket_size` elements, and
//! the last bucket takes whatever remains. With the distributed optimizer
//! every parameter starts at a multiple of [`PARAM_START_ALIGN`] elements and
//! every bucket ends at a multiple of `lcm(dp, 128)` elements, so a bucket
//! splits into `dp` equal contiguous shards (one per data-parallel rank,
//! ignoring parameter boundaries). The padding belongs to no parameter.
//!
//! Also here: the bytes per parameter of plain DDP and of the distributed
//! optimizer ([`bytes_per_param`]), Megatron's memory table.

use alloc::format;
use alloc::vec::Vec;

use super::dtype::DType;
use super::error::{Error, Result};

const OP: &str = "ddp_layout";

/// With the distributed optimizer, each parameter starts at a multiple of
/// this many elements (Megatron's 64-element alignment).
pub const PARAM_START_ALIGN: usize = 64;

/// With the distributed optimizer, each bucket ends at a multiple of
/// `lcm(dp, BUCKET_END_ALIGN)` elements.
pub const BUCKET_END_ALIGN: usize = 128;

/// Megatron's default bucket size: `max(40_000_000, 1_000_000 * dp)` elements.
pub fn default_bucket_size(dp: usize) -> usize {
    core::cmp::max(40_000_000, 1_000_000usize.saturating_mul(dp))
}

/// How a group's buffer is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutConfig {
    /// Elements after which a bucket closes (at the next parameter end); > 0.
    pub bucket_size: usize,
    /// Data-parallel world size; > 0.
    pub dp: usize,
    /// Pad for the distributed optimizer (param starts, bucket ends).
    pub distributed_optimizer: bool,
}

/// Where one parameter lives in its group's buffer: elements
/// `[start, start + numel)`, in bucket `bucket`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamSlot {
    pub start: usize,
    pub numel: usize,
    pub bucket: usize,
}

impl ParamSlot {
    pub fn end(&self) -> usize {
        self.start + self.numel
    }
}

/// One bucket: elements `[start, end)` of the buffer (padding included) and
/// its parameters (indices into the group's registration order), in layout
/// order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketRange {
    pub start: usize,
    pub end: usize,
    pub params: Vec<usize>,
}

impl BucketRange {
    pub fn numel(&self) -> usize {
        self.end - self.start
    }
}

/// The layout of one group: a slot per parameter (registration order), the
/// buckets (layout order: bucket 0 holds the last registered parameters), and
/// the buffer length (padding included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLayout {
    pub params: Vec<ParamSlot>,
    pub buckets: Vec<BucketRange>,
    pub numel: usize,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `lcm(a, b)` or an error naming `arg` when it overflows.
fn lcm(arg: &'static str, a: usize, b: usize) -> Result<usize> {
    (a / gcd(a, b))
        .checked_mul(b)
        .ok_or_else(|| Error::invalid(OP, arg, "a value whose lcm with 128 fits in usize", a))
}

/// `x` rounded up to a multiple of `m`, or an overflow error.
fn round_up(x: usize, m: usize) -> Result<usize> {
    x.div_ceil(m).checked_mul(m).ok_or_else(|| {
        Error::invalid(
            OP,
            "numels",
            "a total size that fits in usize",
            "an overflowing sum",
        )
    })
}

/// The layout of a group whose parameters have `numels` elements each, in
/// registration order. Errors: `bucket_size` or `dp` 0, an empty list, an
/// overflowing total.
pub fn layout(numels: &[usize], cfg: LayoutConfig) -> Result<GroupLayout> {
    if cfg.bucket_size == 0 {
        return Err(Error::invalid(OP, "bucket_size", "at least 1 element", 0));
    }
    if cfg.dp == 0 {
        return Err(Error::invalid(OP, "dp", "at least 1 rank", 0));
    }
    if numels.is_empty() {
        return Err(Error::invalid(
            OP,
            "numels",
            "at least one parameter",
            "none",
        ));
    }
    let (param_align, end_align) = if cfg.distributed_optimizer {
        (PARAM_START_ALIGN, lcm("dp", cfg.dp, BUCKET_END_ALIGN)?)
    } else {
        (1, 1)
    };
    let mut params = alloc::vec![
        ParamSlot {
            start: 0,
            numel: 0,
            bucket: 0
        };
        numels.len()
    ];
    let mut buckets = Vec::new();
    let mut bucket_start = 0usize;
    let mut in_bucket: Vec<usize> = Vec::new();
    let mut next = 0usize;
    for (i, &n) in numels.iter().enumerate().rev() {
        let start = round_up(next, param_align)?;
        let end = start
            .checked_add(n)
            .ok_or_else(|| Error::invalid(OP, "numels", "a total size that fits in usize", n))?;
        params[i] = ParamSlot {
            start,
            numel: n,
            bucket: buckets.len(),
        };
        in_bucket.push(i);
        if end - bucket_start >= cfg.bucket_size {
            let bucket_end = round_up(end, end_align)?;
            buckets.push(BucketRange {
                start: bucket_start,
                end: bucket_end,
                params: core::mem::take(&mut in_bucket),
            });
            bucket_start = bucket_end;
            next = bucket_end;
        } else {
            next = end;
        }
    }
    if !in_bucket.is_empty() {
        let bucket_end = round_up(next, end_align)?;
        buckets.push(BucketRange {
            start: bucket_start,
            end: bucket_end,
            params: in_bucket,
        });
        bucket_start = bucket_end;
    }
    Ok(GroupLayout {
        params,
        buckets,
        numel: bucket_start,
    })
}

/// The elements `[start, end)` of the buffer that data-parallel rank `rank`
/// of `dp` owns in `bucket`: its `rank`-th of `dp` equal contiguous shards.
/// Errors when `dp` does not divide the bucket or `rank >= dp`.
pub fn shard(bucket: &BucketRange, dp: usize, rank: usize) -> Result<(usize, usize)> {
    if dp == 0 || rank >= dp {
        return Err(Error::invalid(
            OP,
            "rank",
            format!("a rank in 0..{dp}"),
            rank,
        ));
    }
    let n = bucket.numel();
    if n % dp != 0 {
        return Err(Error::invalid(
            OP,
            "dp",
            format!("a divisor of the bucket's {n} elements (pad with the distributed optimizer)"),
            dp,
        ));
    }
    let each = n / dp;
    Ok((bucket.start + rank * each, bucket.start + (rank + 1) * each))
}

/// The part `[start, end)` of parameter `slot` inside `range`, if any.
pub fn overlap(slot: &ParamSlot, range: (usize, usize)) -> Option<(usize, usize)> {
    let lo = core::cmp::max(slot.start, range.0);
    let hi = core::cmp::min(slot.end(), range.1);
    (lo < hi).then_some((lo, hi))
}

/// Bytes per parameter, split into what every rank holds (`replicated`) and
/// what the distributed optimizer divides by `dp` (`sharded`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BytesPerParam {
    pub replicated: usize,
    pub sharded: usize,
}

impl BytesPerParam {
    /// `replicated + sharded / dp` bytes.
    pub fn at(&self, dp: usize) -> f64 {
        self.replicated as f64 + self.sharded as f64 / dp as f64
    }
}

/// Megatron's memory table: bytes per parameter for the model parameter, its
/// gradient and the Adam state (fp32 master copy unless the params are fp32,
/// an fp32 main-gradient copy unless the grads are fp32, fp32 `m` and `v`).
/// Plain DDP replicates all of it; the distributed optimizer shards the
/// optimizer part. Only float dtypes are accepted.
///
/// | params / grads | DDP | distributed optimizer |
/// | --- | --- | --- |
/// | bf16 / fp32 | 18 | 6 + 12/dp |
/// | fp16 / fp16 | 20 | 4 + 16/dp |
/// | fp32 / fp32 | 16 | 8 + 8/dp |
pub fn bytes_per_param(
    param: DType,
    grad: DType,
    distributed_optimizer: bool,
) -> Result<BytesPerParam> {
    for (arg, d) in [("param", param), ("grad", grad)] {
        if !matches!(d, DType::F32 | DType::F16 | DType::BF16) {
            return Err(Error::invalid(
                "bytes_per_param",
                arg,
                "f32, f16 or bf16",
                d,
            ));
        }
    }
    let model = param.size() + grad.size();
    let master = if param == DType::F32 { 0 } else { 4 };
    let main_grad = if grad == DType::F32 { 0 } else { 4 };
    let optim = master + main_grad + 8;
    Ok(if distributed_optimizer {
        BytesPerParam {
            replicated: model,
            sharded: optim,
        }
    } else {
        BytesPerParam {
            replicated: model + optim,
            sharded: 0,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn cfg(bucket_size: usize, dp: usize, distributed_optimizer: bool) -> LayoutConfig {
        LayoutConfig {
            bucket_size,
            dp,
            distributed_optimizer,
        }
    }

    #[test]
    fn default_bucket_size_is_megatrons() {
        assert_eq!(default_bucket_size(1), 40_000_000);
        assert_eq!(default_bucket_size(40), 40_000_000);
        assert_eq!(default_bucket_size(64), 64_000_000);
    }

    #[test]
    fn plain_ddp_reverse_order_and_bucket_boundaries() {
        // Registered a(10) b(20) c(5) d(30); laid out d c b a.
        // bucket_size 30: d (0..30) closes bucket 0 at 30; c (30..35) and
        // b (35..55) hold 25 < 30; a (55..65) brings 35 >= 30: bucket 1.
        let l = layout(&[10, 20, 5, 30], cfg(30, 4, false)).unwrap();
        assert_eq!(
            l.params[3],
            ParamSlot {
                start: 0,
                numel: 30,
                bucket: 0
            }
        );
        assert_eq!(
            l.params[2],
            ParamSlot {
                start: 30,
                numel: 5,
                bucket: 1
            }
        );
        assert_eq!(
            l.params[1],
            ParamSlot {
                start: 35,
                numel: 20,
                bucket: 1
            }
        );
        assert_eq!(
            l.params[0],
            ParamSlot {
                start: 55,
                numel: 10,
                bucket: 1
            }
        );
        assert_eq!(
            l.buckets,
            vec![
                BucketRange {
                    start: 0,
                    end: 30,
                    params: vec![3]
                },
                BucketRange {
                    start: 30,
                    end: 65,
                    params: vec![2, 1, 0]
                },
            ]
        );
        assert_eq!(l.numel, 65);
    }

    #[test]
    fn last_bucket_takes_the_rest_and_huge_bucket_is_one() {
        let l = layout(&[3, 4, 5], cfg(4, 1, false)).unwrap();
        // c(5) closes bucket 0; b(4) closes bucket 1; a(3) is the rest.
        let b: Vec<(usize, usize)> = l.buckets.iter().map(|b| (b.start, b.end)).collect();
        assert_eq!(b, vec![(0, 5), (5, 9), (9, 12)]);
        let one = layout(&[3, 4, 5], cfg(1000, 1, false)).unwrap();
        assert_eq!(one.buckets.len(), 1);
        assert_eq!(one.buckets[0].params, vec![2, 1, 0]);
        assert_eq!(one.numel, 12);
    }

    #[test]
    fn distributed_optimizer_padding() {
        // dp 3: bucket ends at multiples of lcm(3, 128) = 384; params at 64.
        // Registered a(100) b(70) c(10); laid out c b a, bucket_size 150.
        // c: 0..10; b: start 64, 64..134 (134 < 150); a: start 192, 192..292
        // >= 150 closes the bucket at 384.
        let l = layout(&[100, 70, 10], cfg(150, 3, true)).unwrap();
        assert_eq!(l.params[2].start, 0);
        assert_eq!(l.params[1].start, 64);
        assert_eq!(l.params[0].start, 192);
        assert_eq!(l.buckets.len(), 1);
        assert_eq!((l.buckets[0].start, l.buckets[0].end), (0, 384));
        assert_eq!(l.numel, 384);
        assert_eq!(shard(&l.buckets[0], 3, 1).unwrap(), (128, 256));
        // b (64..134) and a (192..292) overlap rank 1's shard.
        assert_eq!(overlap(&l.params[1], (128, 256)), Some((128, 134)));
        assert_eq!(overlap(&l.params[0], (128, 256)), Some((192, 256)));
        assert_eq!(overlap(&l.params[2], (128, 256)), None);
    }

    #[test]
    fn distributed_optimizer_two_buckets() {
        // dp 2: lcm(2, 128) = 128. a(200) b(64); laid out b a; bucket_size 64.
        // b 0..64 closes bucket 0 at 128; a starts at 128, 128..328 closes
        // bucket 1 at 384.
        let l = layout(&[200, 64], cfg(64, 2, true)).unwrap();
        assert_eq!(
            l.params[1],
            ParamSlot {
                start: 0,
                numel: 64,
                bucket: 0
            }
        );
        assert_eq!(
            l.params[0],
            ParamSlot {
                start: 128,
                numel: 200,
                bucket: 1
            }
        );
        let b: Vec<(usize, usize)> = l.buckets.iter().map(|b| (b.start, b.end)).collect();
        assert_eq!(b, vec![(0, 128), (128, 384)]);
        assert_eq!(shard(&l.buckets[1], 2, 0).unwrap(), (128, 256));
        assert_eq!(shard(&l.buckets[1], 2, 1).unwrap(), (256, 384));
    }

    #[test]
    fn bad_input_is_a_named_error() {
        let arg = |e: Error| match e {
            Error::InvalidArgument { arg, .. } => arg,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            arg(layout(&[1], cfg(0, 1, false)).unwrap_err()),
            "bucket_size"
        );
        assert_eq!(arg(layout(&[1], cfg(1, 0, false)).unwrap_err()), "dp");
        assert_eq!(arg(layout(&[], cfg(1, 1, false)).unwrap_err()), "numels");
        assert_eq!(
            arg(layout(&[usize::MAX, 1], cfg(1, 1, false)).unwrap_err()),
            "numels"
        );
        let l = layout(&[5], cfg(10, 1, false)).unwrap();
        assert_eq!(arg(shard(&l.buckets[0], 2, 0).unwrap_err()), "dp");
        assert_eq!(arg(shard(&l.buckets[0], 1, 1).unwrap_err()), "rank");
    }

    #[test]
    fn memory_table_matches_megatron() {
        let b = |p, g, d| bytes_per_param(p, g, d).unwrap();
        assert_eq!(b(DType::BF16, DType::F32, false).at(8), 18.0);
        assert_eq!(b(DType::F16, DType::F16, false).at(8), 20.0);
        assert_eq!(b(DType::F32, DType::F32, false).at(8), 16.0);
        for dp in [1usize, 2, 4, 8, 64] {
            let d = dp as f64;
            assert_eq!(b(DType::BF16, DType::F32, true).at(dp), 6.0 + 12.0 / d);
            assert_eq!(b(DType::F16, DType::F16, true).at(dp), 4.0 + 16.0 / d);
            assert_eq!(b(DType::F32, DType::F32, true).at(dp), 8.0 + 8.0 / d);
        }
        assert!(bytes_per_param(DType::I32, DType::F32, false).is_err());
    }
}
