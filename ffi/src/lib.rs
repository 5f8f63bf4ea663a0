//! The C ABI of ferrotron (skeleton). The full ABI — contexts, streams, every
//! op, communicators, the loss scaler, a cbindgen-generated header — is tracked
//! in its own issue; for now this crate builds `libferrotron` and exports the
//! version query so the library and its packaging exist from day one.

/// Library version as `major * 10000 + minor * 100 + patch`.
#[no_mangle]
pub extern "C" fn ftn_get_version() -> u32 {
    let v = |s: &str| s.parse::<u32>().unwrap_or(0);
    v(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + v(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + v(env!("CARGO_PKG_VERSION_PATCH"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_matches_the_crate() {
        assert_eq!(super::ftn_get_version(), 100); // 0.1.0
        let _ = ferrotron::core::DType::F32;
    }
}
