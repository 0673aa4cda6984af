//! 24-bit serial-number arithmetic for PSNs and MSNs (RFC 1982 style, modulo
//! 2^24): wraparound compare, signed distance, windows.
//!
//! A PSN `a` is "before" `b` when the forward distance from `a` to `b` is in
//! `1..2^23`. Exactly opposite values (distance 2^23, where [`psn_diff`]
//! returns -2^23 both ways) are ordered by their plain numeric value, so
//! [`psn_cmp`] is antisymmetric: `psn_lt(a,b)` and `psn_lt(b,a)` are never
//! both true, and one of them is whenever `a != b`.

use core::cmp::Ordering;

/// Number of distinct PSNs.
pub const PSN_MODULUS: u32 = 1 << 24;
/// Mask of the 24 PSN bits.
pub const PSN_MASK: u32 = PSN_MODULUS - 1;
/// Half the PSN space: the largest window a sender may have outstanding is below this.
pub const PSN_HALF: u32 = 1 << 23;

/// `a + n` modulo 2^24.
#[inline]
pub const fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// `a - n` modulo 2^24.
#[inline]
pub const fn psn_sub(a: u32, n: u32) -> u32 {
    a.wrapping_sub(n) & PSN_MASK
}

/// Forward distance from `from` to `to` (`to - from` modulo 2^24), in `0..2^24`.
#[inline]
pub const fn psn_distance(from: u32, to: u32) -> u32 {
    to.wrapping_sub(from) & PSN_MASK
}

/// Signed distance `a - b` in `-2^23..2^23`: positive when `a` is after `b`.
#[inline]
pub const fn psn_diff(a: u32, b: u32) -> i32 {
    // Shift the 24-bit difference into the top of an i32, then back down with sign.
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// Serial comparison of `a` and `b`.
#[inline]
pub const fn psn_cmp(a: u32, b: u32) -> Ordering {
    let d = psn_distance(b, a);
    if d == 0 {
        Ordering::Equal
    } else if d < PSN_HALF {
        Ordering::Greater
    } else if d > PSN_HALF || (a & PSN_MASK) < (b & PSN_MASK) {
        // Behind, or exactly opposite and numerically smaller.
        Ordering::Less
    } else {
        Ordering::Greater
    }
}

#[inline]
pub const fn psn_lt(a: u32, b: u32) -> bool {
    matches!(psn_cmp(a, b), Ordering::Less)
}
#[inline]
pub const fn psn_le(a: u32, b: u32) -> bool {
    !matches!(psn_cmp(a, b), Ordering::Greater)
}
#[inline]
pub const fn psn_gt(a: u32, b: u32) -> bool {
    matches!(psn_cmp(a, b), Ordering::Greater)
}
#[inline]
pub const fn psn_ge(a: u32, b: u32) -> bool {
    !matches!(psn_cmp(a, b), Ordering::Less)
}

/// Whether `psn` is in the window of `len` PSNs starting at `start`
/// (`start <= psn < start + len`, modulo 2^24).
#[inline]
pub const fn psn_in_window(start: u32, len: u32, psn: u32) -> bool {
    psn_distance(start, psn) < len
}

/// A 24-bit sequence number (PSN or MSN) with serial arithmetic.
/// No `Ord`: serial order is not transitive; use [`Psn::serial_cmp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    pub const ZERO: Psn = Psn(0);
    /// The value masked to 24 bits.
    pub const fn new(v: u32) -> Psn {
        Psn(v & PSN_MASK)
    }
    pub const fn get(self) -> u32 {
        self.0
    }
    pub const fn add(self, n: u32) -> Psn {
        Psn(psn_add(self.0, n))
    }
    pub const fn sub(self, n: u32) -> Psn {
        Psn(psn_sub(self.0, n))
    }
    /// Next value (+1 modulo 2^24).
    pub const fn next(self) -> Psn {
        self.add(1)
    }
    /// Forward distance from `self` to `to`.
    pub const fn distance_to(self, to: Psn) -> u32 {
        psn_distance(self.0, to.0)
    }
    /// Signed `self - other`.
    pub const fn diff(self, other: Psn) -> i32 {
        psn_diff(self.0, other.0)
    }
    pub const fn serial_cmp(self, other: Psn) -> Ordering {
        psn_cmp(self.0, other.0)
    }
    pub const fn is_before(self, other: Psn) -> bool {
        psn_lt(self.0, other.0)
    }
    pub const fn is_after(self, other: Psn) -> bool {
        psn_gt(self.0, other.0)
    }
    /// `start <= self < start + len` modulo 2^24.
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        psn_in_window(start.0, len, self.0)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl core::fmt::Display for Psn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// Message sequence numbers use the same 24-bit arithmetic.
pub type Msn = Psn;
