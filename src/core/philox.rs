//! Philox 4x32-10, the counter-based RNG of Salmon et al. ("Parallel Random
//! Numbers: As Easy as 1, 2, 3", SC'11; the Random123 library) — the host
//! twin of `cuda/philox.cuh`, bit-identical to it (`tests/dropout.rs`
//! compares the two, and this file checks the Random123 known answers).
//!
//! ferrotron's stream convention (docs/semantics.md, "Dropout"): random value
//! number `j` of the stream with seed `s` is word `j % 4` of
//! `philox4x32_10(counter = [lo32(j/4), hi32(j/4), 0, 0], key = [lo32(s), hi32(s)])`.
//! A dropout call with `(seed, offset)` gives element `i` the value
//! `offset + i`, so a mask bit is a pure function of `(seed, offset, i)`.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// `philox4x32_10(ctr, key)`: ten rounds, the key bumped by the Weyl
/// constants before every round but the first (Random123's order).
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = ctr;
    let [mut k0, mut k1] = key;
    for r in 0..10 {
        if r > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0];
    }
    c
}

/// The four random words of block `b` (values `4b .. 4b + 3`) of stream `seed`.
pub fn block(seed: u64, b: u64) -> [u32; 4] {
    philox4x32_10(
        [b as u32, (b >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// Random value number `j` of stream `seed`.
pub fn value(seed: u64, j: u64) -> u32 {
    block(seed, j >> 2)[(j & 3) as usize]
}

/// The integer threshold of drop probability `p` in `[0, 1)`: an element is
/// kept iff its random word is `>= drop_threshold(p)`, so it is dropped with
/// probability `drop_threshold(p) / 2^32` (`round(p * 2^32)`, exact in f64).
/// The kernels receive this integer: host and device compare the same bits.
pub fn drop_threshold(p: f32) -> u32 {
    let t = libm::round(p as f64 * 4_294_967_296.0); // core has no f64::round
    if t >= u32::MAX as f64 {
        u32::MAX
    } else if t > 0.0 {
        t as u32
    } else {
        0
    }
}

/// Whether dropout with `threshold` keeps element `i` of a call made with
/// `(seed, offset)`.
pub fn keep(seed: u64, offset: u64, i: u64, threshold: u32) -> bool {
    threshold == 0 || value(seed, offset.wrapping_add(i)) >= threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_walk_the_blocks_in_order() {
        let b0 = block(7, 0);
        let b1 = block(7, 1);
        for k in 0..4 {
            assert_eq!(value(7, k), b0[k as usize]);
            assert_eq!(value(7, 4 + k), b1[k as usize]);
        }
        assert_eq!(block(7, 1 << 32), philox4x32_10([0, 1, 0, 0], [7, 0]));
        assert_eq!(block(1 << 32, 0), philox4x32_10([0, 0, 0, 0], [0, 1]));
    }

    #[test]
    fn thresholds() {
        assert_eq!(drop_threshold(0.0), 0);
        assert_eq!(drop_threshold(0.5), 1 << 31);
        assert_eq!(drop_threshold(0.25), 1 << 30);
        assert_eq!(drop_threshold(1.0 - f32::EPSILON / 2.0), 0xFFFF_FF00); // (1 - 2^-24) * 2^32
        assert!(keep(1, 2, 3, 0));
    }
}
