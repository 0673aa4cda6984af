//! ECN codepoints (RFC 3168) and CE marking in IPv4 and IPv6 headers, with
//! the IPv4 header checksum updated incrementally (RFC 1624), as the XDP
//! congestion point marks frames.

/// The two ECN bits of the IPv4 TOS / IPv6 traffic class.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ecn {
    /// 00: not ECN-capable transport.
    NotEct = 0b00,
    /// 01: ECT(1).
    Ect1 = 0b01,
    /// 10: ECT(0), what RoCEv2 senders set.
    Ect0 = 0b10,
    /// 11: congestion experienced.
    Ce = 0b11,
}

impl Ecn {
    /// From the low two bits of a TOS / traffic-class byte.
    #[inline(always)]
    pub const fn from_bits(tos: u8) -> Ecn {
        match tos & 0b11 {
            0b00 => Ecn::NotEct,
            0b01 => Ecn::Ect1,
            0b10 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// ECT(0), ECT(1) or already CE: the packet may be marked instead of dropped.
    #[inline(always)]
    pub const fn is_ecn_capable(self) -> bool {
        !matches!(self, Ecn::NotEct)
    }
}

/// One's-complement 16-bit checksum update for a changed 16-bit word,
/// RFC 1624 equation 3: `HC' = ~(~HC + ~m + m')`.
#[inline(always)]
pub const fn csum16_update(check: u16, old: u16, new: u16) -> u16 {
    let mut sum = (!check) as u32 + (!old) as u32 + new as u32;
    // Two folds always suffice for three 16-bit terms.
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// Sets CE in an IPv4 header given its first 16-bit word (version/IHL and
/// TOS, big-endian value) and header checksum (big-endian value). Returns
/// the new `(word0, checksum)`, or `None` when the packet is not ECN-capable
/// (Not-ECT must not be marked) or already CE (nothing to change).
#[inline(always)]
pub const fn ipv4_ce_update(word0: u16, check: u16) -> Option<(u16, u16)> {
    match Ecn::from_bits(word0 as u8) {
        Ecn::NotEct | Ecn::Ce => None,
        Ecn::Ect0 | Ecn::Ect1 => {
            let new = word0 | 0b11;
            Some((new, csum16_update(check, word0, new)))
        }
    }
}

/// Sets CE in the IPv4 header at the start of `hdr` (at least 12 bytes:
/// TOS at 1, checksum at 10..12) and fixes the checksum incrementally.
/// Returns `true` if the header changed. Not-ECT and short slices are left
/// alone (`false`).
#[inline(always)]
pub fn ipv4_set_ce(hdr: &mut [u8]) -> bool {
    if hdr.len() < 12 {
        return false;
    }
    let word0 = u16::from_be_bytes([hdr[0], hdr[1]]);
    let check = u16::from_be_bytes([hdr[10], hdr[11]]);
    match ipv4_ce_update(word0, check) {
        Some((w, c)) => {
            hdr[1] = w as u8;
            let c = c.to_be_bytes();
            hdr[10] = c[0];
            hdr[11] = c[1];
            true
        }
        None => false,
    }
}

/// The ECN field of an IPv6 header: the low two bits of the traffic class,
/// which sit in bits 5..4 of the header's second byte.
#[inline(always)]
pub const fn ipv6_ecn(byte1: u8) -> Ecn {
    Ecn::from_bits(byte1 >> 4)
}

/// Sets CE in the IPv6 header at the start of `hdr` (at least 2 bytes).
/// IPv6 has no header checksum and the UDP pseudo-header does not cover the
/// traffic class (nor does the RoCEv2 ICRC, which masks it). Returns `true`
/// if the header changed.
#[inline(always)]
pub fn ipv6_set_ce(hdr: &mut [u8]) -> bool {
    if hdr.len() < 2 {
        return false;
    }
    match ipv6_ecn(hdr[1]) {
        Ecn::Ect0 | Ecn::Ect1 => {
            hdr[1] |= 0b11 << 4;
            true
        }
        Ecn::NotEct | Ecn::Ce => false,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    #[test]
    fn checksum_update_matches_rfc1624_example() {
        // RFC 1624 section 4: HC = 0xDD2F, m = 0x5555 -> m' = 0x3285 gives 0x0000.
        assert_eq!(csum16_update(0xdd2f, 0x5555, 0x3285), 0x0000);
    }

    /// Full RFC 1071 checksum of an IPv4 header with its checksum field zeroed.
    fn full_checksum(hdr: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for (i, pair) in hdr.chunks(2).enumerate() {
            if i == 5 {
                continue;
            }
            sum += u16::from_be_bytes([pair[0], pair[1]]) as u32;
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    fn ipv4_header(ihl: u8, tos: u8, rest: &[u8]) -> Vec<u8> {
        let len = ihl as usize * 4;
        let mut h = Vec::from(&rest[..len]);
        h[0] = 0x40 | ihl;
        h[1] = tos;
        h[10] = 0;
        h[11] = 0;
        let c = full_checksum(&h).to_be_bytes();
        h[10] = c[0];
        h[11] = c[1];
        h
    }

    #[test]
    fn ipv4_ce_known_header() {
        // 20-byte UDP header as rxe sends it, ECT(0), from 10.0.0.1 to 10.0.0.2.
        let mut h = ipv4_header(
            5,
            0x02,
            &[
                0, 0, 0x04, 0x4c, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0, 0, 10, 0, 0, 1, 10, 0, 0,
                2,
            ],
        );
        assert!(ipv4_set_ce(&mut h));
        assert_eq!(h[1], 0x03);
        assert_eq!(u16::from_be_bytes([h[10], h[11]]), full_checksum(&h));
        // Second time: already CE, nothing changes.
        let before = h.clone();
        assert!(!ipv4_set_ce(&mut h));
        assert_eq!(h, before);
        // Not-ECT is never marked.
        let mut n = ipv4_header(5, 0xb8, &before);
        let n0 = n.clone();
        assert!(!ipv4_set_ce(&mut n));
        assert_eq!(n, n0);
        assert!(!ipv4_set_ce(&mut [0u8; 11]));
    }

    proptest! {
        #[test]
        fn ipv4_ce_incremental_equals_full(
            ihl in 5u8..=15,
            dscp in 0u8..64,
            ect1 in any::<bool>(),
            rest in proptest::collection::vec(any::<u8>(), 60),
        ) {
            let tos = dscp << 2 | if ect1 { 0b01 } else { 0b10 };
            let mut h = ipv4_header(ihl, tos, &rest);
            prop_assert!(ipv4_set_ce(&mut h));
            prop_assert_eq!(h[1], dscp << 2 | 0b11);
            prop_assert_eq!(u16::from_be_bytes([h[10], h[11]]), full_checksum(&h));
        }

        #[test]
        fn csum16_update_equals_full(
            words in proptest::collection::vec(any::<u16>(), 2..30),
            idx in any::<prop::sample::Index>(),
            new in any::<u16>(),
        ) {
            // Word 0 carries a non-zero version nibble as IPv4 does, so the
            // sum is never all zeros and the checksum never 0xFFFF.
            let mut words = words;
            words[0] |= 0x4000;
            let fold = |ws: &[u16]| {
                let mut s: u32 = ws.iter().map(|&w| w as u32).sum();
                while s > 0xffff { s = (s & 0xffff) + (s >> 16); }
                !(s as u16)
            };
            let i = 1 + idx.index(words.len() - 1);
            let before = fold(&words);
            let old = words[i];
            words[i] = new;
            prop_assert_eq!(csum16_update(before, old, new), fold(&words));
        }
    }

    #[test]
    fn ipv6_ce() {
        // Version 6, traffic class 0x02 (ECT(0)), flow label 0x12345.
        let mut h = [0x60, 0x21, 0x23, 0x45];
        assert_eq!(ipv6_ecn(h[1]), Ecn::Ect0);
        assert!(ipv6_set_ce(&mut h));
        assert_eq!(h, [0x60, 0x31, 0x23, 0x45]);
        assert_eq!(ipv6_ecn(h[1]), Ecn::Ce);
        assert!(!ipv6_set_ce(&mut h));
        // DSCP 46 (EF) with ECT(1): TC 0xb9 -> byte0 low nibble 0xb, byte1 high 0x9.
        let mut h = [0x6b, 0x90];
        assert_eq!(ipv6_ecn(h[1]), Ecn::Ect1);
        assert!(ipv6_set_ce(&mut h));
        assert_eq!(h, [0x6b, 0xb0]);
        let mut n = [0x6b, 0x80];
        assert!(!ipv6_set_ce(&mut n));
    }
}
