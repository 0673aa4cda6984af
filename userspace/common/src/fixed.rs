//! Fixed-point fractions the XDP program can compare against a random
//! draw without floating point (which the verifier forbids).
//!
//! Probabilities and drop fractions are `u32` fixed point scaled by 2^32, so a
//! packet is picked when `bpf_get_prandom_u32() < fraction`. `u32::MAX` is
//! treated as exactly 1.0 ("always"), see [`fixed_threshold`].

/// Value of a fixed-point fraction that means 1.0 (always).
pub const FIXED_ONE: u32 = u32::MAX;

/// The comparison threshold for a fixed-point fraction: a uniformly random
/// `u32` `r` is selected when `(r as u64) < fixed_threshold(f)`. `u32::MAX`
/// maps to 2^32 so that it selects every packet.
#[inline(always)]
pub const fn fixed_threshold(fraction: u32) -> u64 {
    if fraction == FIXED_ONE {
        1 << 32
    } else {
        fraction as u64
    }
}

/// `true` when a random draw `rand` falls under the fixed-point `fraction`.
#[inline(always)]
pub const fn fixed_hit(fraction: u32, rand: u32) -> bool {
    (rand as u64) < fixed_threshold(fraction)
}

/// Converts a fraction in `[0, 1]` to the fixed-point form (userspace only).
/// Values outside the range and NaN are clamped (NaN to 0).
#[cfg(not(target_arch = "bpf"))]
pub fn fraction_to_fixed(fraction: f64) -> u32 {
    if fraction.is_nan() || fraction <= 0.0 {
        0
    } else if fraction >= 1.0 {
        FIXED_ONE
    } else {
        // 2^32 * f rounded to nearest (no `round` in core); values that round
        // to 2^32 - 1 or more mean "always".
        let v = (fraction * 4_294_967_296.0 + 0.5) as u64;
        if v >= FIXED_ONE as u64 {
            FIXED_ONE
        } else {
            v as u32
        }
    }
}

/// Converts a fixed-point fraction back to `f64` (userspace only).
#[cfg(not(target_arch = "bpf"))]
pub fn fixed_to_fraction(fixed: u32) -> f64 {
    fixed_threshold(fixed) as f64 / 4_294_967_296.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_point_conversions() {
        assert_eq!(fraction_to_fixed(0.0), 0);
        assert_eq!(fraction_to_fixed(-1.0), 0);
        assert_eq!(fraction_to_fixed(f64::NAN), 0);
        assert_eq!(fraction_to_fixed(1.0), FIXED_ONE);
        assert_eq!(fraction_to_fixed(0.5), 1 << 31);
        assert_eq!(fraction_to_fixed(0.25), 1 << 30);
        // 0.01 * 2^32 = 42_949_672.96 -> 42_949_673
        assert_eq!(fraction_to_fixed(0.01), 42_949_673);
        assert_eq!(fixed_threshold(FIXED_ONE), 1 << 32);
        assert!(fixed_hit(FIXED_ONE, u32::MAX));
        assert!(!fixed_hit(0, 0));
        assert!(fixed_hit(1 << 31, (1 << 31) - 1));
        assert!(!fixed_hit(1 << 31, 1 << 31));
        assert_eq!(fixed_to_fraction(1 << 30), 0.25);
        assert_eq!(fixed_to_fraction(FIXED_ONE), 1.0);
    }
}
