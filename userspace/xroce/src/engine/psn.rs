//! 24-bit packet sequence number arithmetic (IBTA 9.7.1: half the space is
//! "ahead", half "behind").

pub const PSN_MASK: u32 = 0x00ff_ffff;

#[inline]
pub fn add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

#[inline]
pub fn sub(psn: u32, n: u32) -> u32 {
    psn.wrapping_sub(n) & PSN_MASK
}

/// Signed distance `a - b` in the 24-bit ring, in -2^23..2^23.
#[inline]
pub fn diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

#[inline]
pub fn lt(a: u32, b: u32) -> bool {
    diff(a, b) < 0
}

#[inline]
pub fn le(a: u32, b: u32) -> bool {
    diff(a, b) <= 0
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn wraps() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(sub(0, 1), PSN_MASK);
        assert_eq!(diff(0, PSN_MASK), 1);
        assert_eq!(diff(PSN_MASK, 0), -1);
        assert!(lt(PSN_MASK - 3, 2));
        assert!(!lt(2, PSN_MASK - 3));
        assert!(le(5, 5));
    }
}
