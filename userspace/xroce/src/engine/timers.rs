//! Encoded IBTA timers: the local ACK timeout and the RNR NAK timer.

/// Local ACK timeout for the encoded `timeout` attribute: 4.096 us * 2^t;
/// 0 means "infinite" (no retransmission timer).
pub fn ack_timeout_ns(t: u8) -> Option<u64> {
    if t == 0 {
        None
    } else {
        Some(4096u64 << t.min(31))
    }
}

/// IBTA Table 45 (RNR NAK timer field encodings), in microseconds * 100.
const RNR_TABLE_10US: [u32; 32] = [
    65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// Duration of the encoded RNR NAK timer (5 bits) in nanoseconds.
pub fn rnr_timer_ns(code: u8) -> u64 {
    RNR_TABLE_10US[(code & 0x1f) as usize] as u64 * 10_000
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn encodings() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(1), Some(8192));
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }
}
