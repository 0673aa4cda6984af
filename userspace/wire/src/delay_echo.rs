//! xroce's responder delay echo: an xroce-only use of reserved BTH bits that
//! a responder sets on its responses (ACK, READ response, atomic ACK) to a
//! requester that agreed on selective repeat, i.e. another xroce. It says
//! how long the request that the response answers spent in the responder's
//! host: from the moment it reached the host (the XDP program's timestamp)
//! to the moment the response was written. The requester subtracts it from
//! its round trip, and its own host's wait the same way, so a delay-based
//! congestion controller (Swift, TIMELY) sees the fabric's delay, not the
//! time a frame waited for a process that was off its core. That split is
//! the paper's (Swift: fabric vs endpoint delay, from NIC timestamps); on a
//! busy 2-core host the endpoint part is milliseconds and, read as queueing,
//! it drove both controllers to their floors with no queue anywhere.
//!
//! The 12 bits are the five IBA reserves of BTH byte 4 below FECN/BECN
//! above [`SR_CAPABLE`](crate::bth::SR_CAPABLE) (bits 1..=5, the code's low
//! five bits) and the seven of byte 8 below AckReq (Resv7, the code's high
//! seven bits). Other RoCE devices send 0 there and ignore them; xroce never
//! sets them towards one (it sets them only where the peer runs selective
//! repeat, which only xroce does).
//!
//! The code is a small float: exponent `e` in its top 4 bits, mantissa `m`
//! in its low 8, value `m << e` in [`UNIT_NS`] units: exact to 256 ns below
//! 65 us, within 1/128 above, up to about 2.1 s. Code 0 is "no echo"; a
//! delay shorter than one unit is sent as one unit. Encoding rounds down,
//! so a requester never subtracts more than the responder measured.

/// Nanoseconds per unit of the code's value.
pub const UNIT_NS: u64 = 256;
/// The largest code: mantissa 255, exponent 15.
pub const MAX_CODE: u16 = 0x0fff;
/// The largest delay a code says (longer delays are sent as this).
pub const MAX_NS: u64 = (255u64 << 15) * UNIT_NS;

/// Mask of the code's low five bits in BTH byte 4 (bits 1..=5).
pub const BYTE4_MASK: u8 = 0x3e;
/// Mask of the code's high seven bits in BTH byte 8 (below AckReq).
pub const BYTE8_MASK: u8 = 0x7f;

/// The code for a delay of `ns` (never 0: 0 means no echo).
pub fn encode(ns: u64) -> u16 {
    let units = (ns / UNIT_NS).clamp(1, 255 << 15);
    let e = (64 - units.leading_zeros()).saturating_sub(8);
    let m = units >> e;
    ((e as u16) << 8) | m as u16
}

/// The delay a code says, in ns; `None` for code 0 (no echo).
pub fn decode(code: u16) -> Option<u64> {
    let code = code & MAX_CODE;
    if code == 0 {
        return None;
    }
    let (e, m) = (u64::from(code >> 8), u64::from(code & 0xff));
    Some((m << e) * UNIT_NS)
}

/// The code in BTH bytes 4 and 8.
pub fn from_bth_bytes(b4: u8, b8: u8) -> u16 {
    u16::from((b4 & BYTE4_MASK) >> 1) | (u16::from(b8 & BYTE8_MASK) << 5)
}

/// The bits of BTH bytes 4 and 8 that carry `code` (to be OR-ed in).
pub fn to_bth_bytes(code: u16) -> (u8, u8) {
    let code = code & MAX_CODE;
    (((code & 0x1f) as u8) << 1, (code >> 5) as u8 & BYTE8_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_delays_are_exact_to_a_unit_and_long_ones_to_a_128th() {
        for ns in [
            0u64,
            1,
            255,
            256,
            300,
            65_279,
            65_280,
            100_000,
            2_000_000,
            1_500_000_000,
        ] {
            let back = decode(encode(ns)).unwrap();
            assert!(back <= ns.max(UNIT_NS), "{ns} came back as {back}: more");
            let floor = ns / UNIT_NS * UNIT_NS;
            if ns < 256 * UNIT_NS {
                assert_eq!(back, floor.max(UNIT_NS), "{ns}");
            } else {
                assert!(ns - back <= ns / 128 + UNIT_NS, "{ns} came back as {back}");
            }
        }
    }

    #[test]
    fn no_delay_is_code_zero_and_the_largest_is_clamped() {
        assert_eq!(decode(0), None);
        assert_ne!(encode(0), 0, "a zero delay still echoes");
        assert_eq!(encode(u64::MAX), MAX_CODE);
        assert_eq!(decode(MAX_CODE), Some(MAX_NS));
    }

    #[test]
    fn every_code_survives_the_bth_bytes_and_leaves_the_others_alone() {
        for code in 0..=MAX_CODE {
            let (b4, b8) = to_bth_bytes(code);
            assert_eq!(b4 & !BYTE4_MASK, 0);
            assert_eq!(b8 & !BYTE8_MASK, 0);
            // FECN, BECN, SR_CAPABLE and AckReq set around it.
            assert_eq!(from_bth_bytes(b4 | 0xc1, b8 | 0x80), code);
        }
    }
}
