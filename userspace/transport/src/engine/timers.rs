//! The local ACK timeout as IBTA encodes it in the QP attributes (the RNR
//! NAK timer is a wire encoding: [`xroce_wire::rnr_timer_us`]).

/// Local ACK timeout for the encoded `timeout` attribute: 4.096 us * 2^t;
/// 0 means "infinite" (no retransmission timer).
pub fn ack_timeout_ns(t: u8) -> Option<u64> {
    if t == 0 {
        None
    } else {
        Some(4096u64 << t.min(31))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn encodings() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(1), Some(8192));
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
    }
}
