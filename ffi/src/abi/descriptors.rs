//! `size`-prefixed descriptors: the pointer and `size` checks every op
//! runs before it reads (or writes) a caller's struct.

use ferrotron::Result;

use crate::abi::boundary::invalid;

/// Largest `size` a descriptor may claim: larger values are almost always an
/// uninitialised `size` field.
pub const FTN_MAX_DESC_SIZE: usize = 4096;

/// A `size`-prefixed descriptor: `#[repr(C)]`, `size_t size` first, only
/// integer and float fields and explicit padding, so all-zero bytes and any
/// bytes are valid values.
///
/// # Safety
/// Implementors must satisfy the above.
pub(crate) unsafe trait Desc: Copy {
    const NAME: &'static str;
    /// `sizeof` of the first published version.
    const V1_SIZE: usize;
    /// `sizeof` of every later published version older than this one (for
    /// a descriptor that grew more than once; `V1_SIZE` and the current
    /// size are implied). A `size` below the current size must be one of
    /// these: anything else would cut a field in half.
    const OLDER_SIZES: &'static [usize] = &[];
}

/// Checks a size-prefixed struct's pointer (non-NULL, aligned) and its
/// `size` field (at most [`FTN_MAX_DESC_SIZE`]; below the current size
/// only the exact size of a published version); returns `size`.
///
/// # Safety
/// `p` is NULL or valid for reads of a `size_t`.
unsafe fn desc_size<D: Desc>(op: &'static str, arg: &'static str, p: *const D) -> Result<usize> {
    if p.is_null() {
        return Err(invalid(
            op,
            arg,
            format!("a non-NULL pointer to a {}", D::NAME),
            "NULL",
        ));
    }
    if (p as usize) % std::mem::align_of::<D>() != 0 {
        return Err(invalid(
            op,
            arg,
            format!("a pointer aligned for {}", D::NAME),
            format!("{p:p}"),
        ));
    }
    // SAFETY: non-NULL, aligned; every descriptor starts with a size_t.
    let size = unsafe { (p as *const usize).read() };
    let ours = std::mem::size_of::<D>();
    let older = size == D::V1_SIZE || D::OLDER_SIZES.contains(&size);
    if size < D::V1_SIZE || size > FTN_MAX_DESC_SIZE || (size < ours && !older) {
        let versions = if D::V1_SIZE < ours {
            let mut v = vec![D::V1_SIZE];
            v.extend_from_slice(D::OLDER_SIZES);
            let v: Vec<String> = v.iter().map(usize::to_string).collect();
            format!(", or an older version's size: {}", v.join(", "))
        } else {
            String::new()
        };
        return Err(invalid(
            op,
            arg,
            format!(
                "{arg}.size = sizeof({}) = {ours} in this version (at most {FTN_MAX_DESC_SIZE}{versions}); set {arg}.size = sizeof(*{arg})",
                D::NAME,
            ),
            size,
        ));
    }
    Ok(size)
}

/// Checks a descriptor's pointer and `size` field and copies the fields this
/// library knows (a smaller `size` than ours but at least the first
/// version's leaves the newer fields zero; a larger one must have its unknown
/// trailing bytes zero).
///
/// # Safety
/// `p` is NULL or valid for reads of `p->size` bytes.
pub(crate) unsafe fn read_desc<D: Desc>(
    op: &'static str,
    arg: &'static str,
    p: *const D,
) -> Result<D> {
    let ours = std::mem::size_of::<D>();
    // SAFETY: forwarded contract.
    let size = unsafe { desc_size(op, arg, p)? };
    // SAFETY: the caller's struct is `size` bytes long by the contract.
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
    if let Some(i) = bytes.iter().skip(ours).position(|&b| b != 0) {
        return Err(invalid(
            op,
            arg,
            format!(
                "unknown trailing fields of {arg} (bytes {ours}..{arg}.size = {size}) to be zero: this library knows {} up to byte {ours}",
                D::NAME
            ),
            format!("a non-zero byte at offset {}", ours + i),
        ));
    }
    // SAFETY: any bytes are a valid D (trait contract); copy the known prefix.
    let mut d: D = unsafe { std::mem::zeroed() };
    // SAFETY: both ranges are at least min(size, ours) bytes and disjoint.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), &mut d as *mut D as *mut u8, size.min(ours))
    };
    Ok(d)
}

/// Checks an output struct's pointer and `size` field (same rules, trailing
/// bytes left alone) before the library writes the fields it knows.
///
/// # Safety
/// As [`read_desc`].
pub(crate) unsafe fn check_out_desc<D: Desc>(
    op: &'static str,
    arg: &'static str,
    p: *mut D,
) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { desc_size(op, arg, p as *const D) }.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;
    use std::mem::size_of;

    #[test]
    fn first_version_sizes_are_the_current_sizes() {
        assert_eq!(size_of::<ftnBiasGeluDesc_t>(), ftnBiasGeluDesc_t::V1_SIZE);
        assert_eq!(size_of::<ftnNormDesc_t>(), ftnNormDesc_t::V1_SIZE);
        assert_eq!(
            size_of::<ftnMultiTensorDesc_t>(),
            ftnMultiTensorDesc_t::V1_SIZE
        );
        assert_eq!(
            size_of::<ftnGradScalerConfig_t>(),
            ftnGradScalerConfig_t::V1_SIZE
        );
        assert_eq!(
            size_of::<ftnGradScalerState_t>(),
            ftnGradScalerState_t::V1_SIZE
        );
        assert_eq!(size_of::<ftnPipelineDesc_t>(), ftnPipelineDesc_t::V1_SIZE);
        assert_eq!(size_of::<ftnPipelineCosts_t>(), ftnPipelineCosts_t::V1_SIZE);
        assert_eq!(size_of::<ftnPipelineOp_t>(), 56);
        assert_eq!(size_of::<ftnPipelineSpan_t>(), 40);
        assert_eq!(size_of::<ftnTensor_t>(), 24);
        assert_eq!(size_of::<ftnAdamConfig_t>(), ftnAdamConfig_t::V1_SIZE);
        assert_eq!(size_of::<ftnAdamStepDesc_t>(), ftnAdamStepDesc_t::V1_SIZE);
        assert_eq!(size_of::<ftnAdamTensor_t>(), 64);
        assert_eq!(size_of::<ftnDdpConfig_t>(), ftnDdpConfig_t::V1_SIZE);
        assert_eq!(size_of::<ftnDistOptConfig_t>(), ftnDistOptConfig_t::V1_SIZE);
    }

    /// The one descriptor that has grown: version 2 of the cross-entropy
    /// descriptor appended the ignore index; a version-1 caller (40 bytes)
    /// reads as "nothing ignored" whatever lies past its struct.
    #[test]
    fn cross_entropy_desc_version_1_still_reads() {
        assert_eq!(ftnCrossEntropyDesc_t::V1_SIZE, 40);
        assert_eq!(size_of::<ftnCrossEntropyDesc_t>(), 56);
        assert_eq!(
            std::mem::offset_of!(ftnCrossEntropyDesc_t, ignore_index),
            40
        );
        let v2 = ftnCrossEntropyDesc_t {
            size: 56,
            dtype: 0,
            label_dtype: 5,
            tokens: 3,
            shard_vocab: 7,
            label_smoothing: 0.1,
            reserved: 0,
            ignore_index: -100,
            has_ignore_index: 1,
            reserved2: 0,
        };
        // SAFETY: a live, aligned descriptor of `size` bytes.
        let r = unsafe { read_desc("t", "desc", &v2) }.unwrap();
        assert_eq!((r.ignore_index, r.has_ignore_index), (-100, 1));
        let v1 = ftnCrossEntropyDesc_t { size: 40, ..v2 };
        // SAFETY: as above (40 <= sizeof bytes readable).
        let r = unsafe { read_desc("t", "desc", &v1) }.unwrap();
        assert_eq!((r.tokens, r.shard_vocab, r.label_smoothing), (3, 7, 0.1));
        assert_eq!((r.ignore_index, r.has_ignore_index, r.reserved2), (0, 0, 0));
        // A size between the versions would cut a field: refused.
        for size in [39, 41, 48, 55] {
            let d = ftnCrossEntropyDesc_t { size, ..v2 };
            // SAFETY: as above.
            let e = unsafe { read_desc("t", "desc", &d) }
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("desc.size") && e.contains("older version's size: 40"),
                "{e}"
            );
        }
    }

    #[test]
    fn descriptors_grow_and_shrink_by_the_rules() {
        #[repr(C, align(8))]
        struct Big([u8; 64]);
        let mut b = Big([0; 64]);
        let d = ftnBiasGeluDesc_t {
            size: 48,
            dtype: 0,
            gelu: 1,
            rows: 3,
            cols: 4,
        };
        // SAFETY: Big is 64 bytes, more than the descriptor.
        unsafe { std::ptr::copy_nonoverlapping(&d as *const _ as *const u8, b.0.as_mut_ptr(), 32) };
        let p = b.0.as_ptr() as *const ftnBiasGeluDesc_t;
        // SAFETY: p points to 64 readable bytes, size = 48.
        let r = unsafe { read_desc("t", "desc", p) }.unwrap();
        assert_eq!((r.rows, r.cols, r.gelu), (3, 4, 1));
        b.0[40] = 1;
        // SAFETY: as above.
        let e = unsafe { read_desc("t", "desc", p) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("trailing") && e.contains("offset 40"), "{e}");
        b.0[..8].copy_from_slice(&16usize.to_ne_bytes());
        // SAFETY: as above.
        let e = unsafe { read_desc("t", "desc", p) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("desc.size") && e.contains("got 16"), "{e}");
    }
}
