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
}

/// Checks a size-prefixed struct's pointer (non-NULL, aligned) and its
/// `size` field (at least the first version's size, at most
/// [`FTN_MAX_DESC_SIZE`]); returns `size`.
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
    if size < D::V1_SIZE || size > FTN_MAX_DESC_SIZE {
        return Err(invalid(
            op,
            arg,
            format!(
                "{arg}.size = sizeof({}) = {} in this version (at least {}, at most {FTN_MAX_DESC_SIZE}); set {arg}.size = sizeof(*{arg})",
                D::NAME,
                std::mem::size_of::<D>(),
                D::V1_SIZE
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
