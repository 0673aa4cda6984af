//! A token-bucket pacer for the requester: turns the congestion controller's
//! rate into "when may the next packet go".
//!
//! Credit accrues at `rate_bps` up to `burst_bytes`. A packet of `n` bytes
//! may go once the credit covers `min(n, burst_bytes)`; sending it takes `n`
//! bytes of credit, which may leave a debt when `n > burst_bytes`, so packets
//! larger than the bucket still flow at exactly the configured rate. Integer
//! arithmetic in nano-bits (bit/s x ns): while a sender keeps the bucket
//! from filling, rounding never accumulates; a full bucket drops the
//! sub-nanosecond remainder (at most 1 ns per packet).
//!
//! The rate is passed on every call: feed it
//! [`CongestionControl::rate_bps`](super::CongestionControl::rate_bps) and a
//! rate change takes effect at the next call.

/// Nano-bits in one byte: 8 bits x 1e9 (so `bit/s * ns` is in nano-bits).
const NANOBITS_PER_BYTE: i128 = 8_000_000_000;

/// Token bucket; see the module docs.
#[derive(Debug, Clone)]
pub struct Pacer {
    burst_bytes: u64,
    /// Credit in nano-bits as of `last_ns`; may be negative (debt).
    credit: i128,
    last_ns: Option<u64>,
}

impl Pacer {
    /// A pacer whose bucket holds `burst_bytes` (at least 1) and starts full.
    /// One MTU-sized packet is the smoothest useful burst; a few packets
    /// lower the per-packet scheduling cost.
    pub fn new(burst_bytes: u64) -> Self {
        let burst_bytes = burst_bytes.max(1);
        Pacer {
            burst_bytes,
            credit: burst_bytes as i128 * NANOBITS_PER_BYTE,
            last_ns: None,
        }
    }

    pub fn burst_bytes(&self) -> u64 {
        self.burst_bytes
    }

    /// Changes the bucket size; the current credit is clipped to it.
    pub fn set_burst_bytes(&mut self, burst_bytes: u64) {
        self.burst_bytes = burst_bytes.max(1);
        self.credit = self.credit.min(self.cap());
    }

    /// Credit in whole bytes at `now_ns` (negative while in debt).
    pub fn credit_bytes(&self, now_ns: u64, rate_bps: u64) -> i64 {
        (self.credit_at(now_ns, rate_bps) / NANOBITS_PER_BYTE) as i64
    }

    fn cap(&self) -> i128 {
        self.burst_bytes as i128 * NANOBITS_PER_BYTE
    }

    fn credit_at(&self, now_ns: u64, rate_bps: u64) -> i128 {
        let elapsed = match self.last_ns {
            Some(last) if now_ns > last => now_ns - last,
            _ => 0,
        };
        let refill = rate_bps as i128 * elapsed as i128;
        (self.credit + refill).min(self.cap().max(self.credit))
    }

    /// Earliest time (>= `now_ns`) at which a packet of `bytes` may go at
    /// `rate_bps`; `u64::MAX` if the rate is 0 and the credit does not cover it.
    pub fn earliest_send_ns(&self, now_ns: u64, rate_bps: u64, bytes: usize) -> u64 {
        let need = (bytes as u64).min(self.burst_bytes) as i128 * NANOBITS_PER_BYTE;
        let have = self.credit_at(now_ns, rate_bps);
        if have >= need {
            return now_ns;
        }
        if rate_bps == 0 {
            return u64::MAX;
        }
        let rate = rate_bps as i128;
        let wait = (need - have + rate - 1) / rate;
        u64::try_from(wait)
            .ok()
            .and_then(|w| now_ns.checked_add(w))
            .unwrap_or(u64::MAX)
    }

    /// `true` if a packet of `bytes` may go now.
    pub fn can_send(&self, now_ns: u64, rate_bps: u64, bytes: usize) -> bool {
        self.earliest_send_ns(now_ns, rate_bps, bytes) <= now_ns
    }

    /// Records that `bytes` went out at `now_ns`.
    pub fn consume(&mut self, now_ns: u64, rate_bps: u64, bytes: usize) {
        self.credit = self.credit_at(now_ns, rate_bps);
        if self.last_ns.is_none_or(|last| now_ns > last) {
            self.last_ns = Some(now_ns);
        }
        self.credit -= bytes as i128 * NANOBITS_PER_BYTE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 Gbit/s: one byte per nanosecond.
    const R8G: u64 = 8_000_000_000;

    #[test]
    fn full_bucket_then_one_packet_per_service_time() {
        let mut p = Pacer::new(4096);
        assert_eq!(p.earliest_send_ns(0, R8G, 4096), 0);
        p.consume(0, R8G, 4096);
        assert_eq!(p.earliest_send_ns(0, R8G, 4096), 4096);
        assert_eq!(p.earliest_send_ns(1000, R8G, 4096), 4096);
        assert!(!p.can_send(4095, R8G, 4096));
        assert!(p.can_send(4096, R8G, 4096));
        // A smaller packet goes sooner.
        assert_eq!(p.earliest_send_ns(0, R8G, 1024), 1024);
    }

    #[test]
    fn long_run_rate_is_exact() {
        // 1 Gbit/s, 1000-byte packets: one every 8 us.
        let rate = 1_000_000_000;
        let mut p = Pacer::new(1000);
        let mut now = 0;
        for _ in 0..1000 {
            now = p.earliest_send_ns(now, rate, 1000);
            p.consume(now, rate, 1000);
        }
        // The first packet used the initial burst at t = 0.
        assert_eq!(now, 999 * 8_000);
    }

    #[test]
    fn odd_rates_do_not_drift() {
        // 3 Gbit/s and 1500-byte packets: 4 us each.
        let rate = 3_000_000_000;
        let mut p = Pacer::new(1500);
        let mut now = 0;
        for _ in 0..100 {
            now = p.earliest_send_ns(now, rate, 1500);
            p.consume(now, rate, 1500);
        }
        assert_eq!(now, 99 * 4_000);
        // With a two-packet bucket the first two go at once and packet k
        // (k >= 1) at ceil((k - 1) * 12_000 bits / 333e6 bit/s): no rounding
        // accumulates. k = 10_000: 360_324_324.3 ns.
        let rate = 333_000_000;
        let mut p = Pacer::new(3000);
        let mut now = 0;
        for _ in 0..10_001 {
            now = p.earliest_send_ns(now, rate, 1500);
            p.consume(now, rate, 1500);
        }
        assert_eq!(now, 360_324_325);
    }

    #[test]
    fn burst_caps_idle_credit() {
        let mut p = Pacer::new(8192);
        p.consume(0, R8G, 8192);
        // After a long idle only 8192 bytes may go back to back.
        let t = 1_000_000;
        assert_eq!(p.credit_bytes(t, R8G), 8192);
        p.consume(t, R8G, 4096);
        p.consume(t, R8G, 4096);
        assert_eq!(p.earliest_send_ns(t, R8G, 4096), t + 4096);
    }

    #[test]
    fn packets_larger_than_burst_flow_at_rate() {
        let mut p = Pacer::new(1000);
        assert_eq!(p.earliest_send_ns(0, R8G, 4096), 0);
        p.consume(0, R8G, 4096); // debt of 3096 bytes
        assert_eq!(p.credit_bytes(0, R8G), -3096);
        // Waits until 1000 bytes of credit: 4096 ns.
        assert_eq!(p.earliest_send_ns(0, R8G, 4096), 4096);
    }

    #[test]
    fn zero_rate_and_rate_changes() {
        let mut p = Pacer::new(1000);
        p.consume(0, R8G, 1000);
        assert_eq!(p.earliest_send_ns(10, 0, 1000), u64::MAX);
        // The rate given at each call applies: 1 Gbit/s now, 8 ns per byte.
        assert_eq!(p.earliest_send_ns(0, 1_000_000_000, 1000), 8_000);
        // Time going backwards adds no credit.
        p.consume(5_000, R8G, 0);
        assert_eq!(p.credit_bytes(4_000, R8G), 1000);
        p.set_burst_bytes(10);
        assert_eq!(p.credit_bytes(5_000, R8G), 10);
    }
}
