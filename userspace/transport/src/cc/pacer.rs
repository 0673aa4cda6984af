//! The pacer: a token bucket that turns a congestion controller's rate into
//! "when may the next packet go". There is one: every QP of the engine owns
//! one (its requester and its READ responder send through it and
//! `poll_timeout` reports when it opens), and the closed-loop tests in
//! `cc::sim_tests` run the same calls.
//!
//! Credit accrues at `rate_bps` up to `burst_bytes`. A packet of `n` bytes
//! may go once the credit covers `min(n, burst_bytes)`; sending it takes `n`
//! bytes of credit, which may leave a debt when `n > burst_bytes`, so
//! packets larger than the bucket still flow at exactly the configured rate.
//! A caller that does not know the size of its next packet gates on the
//! largest it may send (the engine: path MTU plus the largest headers): the
//! long-run rate is the same and bursts stay within `burst_bytes`.
//!
//! Conformance: while no packet is larger than the size gated on, nor that
//! larger than `burst_bytes`, the credit never goes negative, so the bytes
//! sent in any interval of `t` ns are at most
//! `burst_bytes + rate_bps * t / 8e9` (back to back: `burst_bytes`).
//!
//! Arithmetic is exact: credit is held in nano-bits (bit/s x ns), so no
//! rounding accumulates however often the pacer is asked or at what rate; a
//! full bucket simply stops accruing. Every call is O(1) and the pacer never
//! reads a clock: time comes in as `now_ns`, the rate on every call (feed it
//! [`CongestionControl::rate_bps`](super::CongestionControl::rate_bps); a
//! rate change takes effect at the next call). Time going backwards adds no
//! credit. Rates up to `u64::MAX` bit/s and idle gaps up to `u64::MAX` ns
//! neither overflow nor wrap.

/// Nano-bits in one byte: 8 bits x 1e9 (so `bit/s * ns` is in nano-bits).
const NANOBITS_PER_BYTE: i128 = 8_000_000_000;

/// Token bucket; see the module docs.
#[derive(Debug, Clone)]
pub struct Pacer {
    burst_bytes: u64,
    /// Credit in nano-bits as of `last_ns`, at most the bucket; negative
    /// while in debt.
    credit: i128,
    /// When `credit` was last brought up to date ([`Pacer::on_send`],
    /// [`Pacer::catch_up`]); never moves back.
    last_ns: u64,
}

impl Pacer {
    /// A pacer whose bucket holds `burst_bytes` (at least 1) and starts full.
    /// One MTU-sized packet is the smoothest useful burst; a few packets
    /// lower the per-packet scheduling cost.
    pub fn new(burst_bytes: u64) -> Self {
        let burst_bytes = burst_bytes.max(1);
        Pacer {
            burst_bytes,
            credit: Self::nanobits(burst_bytes),
            last_ns: 0,
        }
    }

    pub fn burst_bytes(&self) -> u64 {
        self.burst_bytes
    }

    fn nanobits(bytes: u64) -> i128 {
        // At most 1.8e19 x 8e9 = 1.5e29 < i128::MAX = 1.7e38.
        bytes as i128 * NANOBITS_PER_BYTE
    }

    /// Credit at `now_ns`: the stored credit plus what accrued since
    /// `last_ns`, never more than the bucket (nor less than the stored
    /// credit).
    fn credit_at(&self, now_ns: u64, rate_bps: u64) -> i128 {
        let cap = Self::nanobits(self.burst_bytes);
        if now_ns <= self.last_ns || self.credit >= cap {
            return self.credit;
        }
        // u64 x u64 always fits in u128: exact at any rate and gap, and one
        // widening multiply.
        let refill = rate_bps as u128 * (now_ns - self.last_ns) as u128;
        if refill >= cap.abs_diff(self.credit) {
            cap
        } else {
            self.credit + refill as i128
        }
    }

    /// Credit in whole bytes at `now_ns` (negative while in debt).
    pub fn credit_bytes(&self, now_ns: u64, rate_bps: u64) -> i64 {
        let c = self.credit_at(now_ns, rate_bps) / NANOBITS_PER_BYTE;
        c.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// When a packet of `bytes` may go at `rate_bps`: `None` if the credit
    /// already covers it (the pacer holds nothing back, whatever the time),
    /// else `Some(t)`, the first time at which it will; `Some(u64::MAX)`
    /// (never) at rate 0. What the engine's `poll_timeout` reports.
    pub fn held_until_ns(&self, rate_bps: u64, bytes: usize) -> Option<u64> {
        let need = Self::nanobits((bytes as u64).min(self.burst_bytes));
        let deficit = need.saturating_sub(self.credit);
        if deficit <= 0 {
            return None;
        }
        if rate_bps == 0 {
            return Some(u64::MAX);
        }
        // The deficit fits in u64 unless the debt exceeds ~2.3 GB: keep the
        // common case on 64-bit division.
        let wait = match u64::try_from(deficit) {
            Ok(d) => d.div_ceil(rate_bps),
            Err(_) => {
                let w = (deficit as u128).div_ceil(rate_bps as u128);
                u64::try_from(w).unwrap_or(u64::MAX)
            }
        };
        Some(self.last_ns.saturating_add(wait))
    }

    /// `true` if a packet of `bytes` may go at `now_ns` at `rate_bps`: the
    /// gate the engine's requester and READ responder pass before building
    /// a packet.
    pub fn may_send(&self, now_ns: u64, rate_bps: u64, bytes: usize) -> bool {
        self.held_until_ns(rate_bps, bytes)
            .is_none_or(|t| t <= now_ns)
    }

    /// Records that `bytes` went out at `now_ns` at `rate_bps`.
    pub fn on_send(&mut self, now_ns: u64, rate_bps: u64, bytes: usize) {
        self.catch_up(now_ns, rate_bps);
        self.credit = self.credit.saturating_sub(Self::nanobits(bytes as u64));
    }

    /// Books the credit accrued up to `now_ns` at `rate_bps` without
    /// sending. Call it when the time [`Pacer::held_until_ns`] named has
    /// come but something else holds the packet back (a full window, say),
    /// so that time stops being reported; and before a rate change, so the
    /// old rate applies up to it.
    pub fn catch_up(&mut self, now_ns: u64, rate_bps: u64) {
        self.credit = self.credit_at(now_ns, rate_bps);
        self.last_ns = self.last_ns.max(now_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 Gbit/s: one byte per nanosecond.
    const R8G: u64 = 8_000_000_000;

    /// Sends `count` packets of `size(k)` bytes as early as the pacer lets
    /// them, the clock jumping to each `held_until_ns` (an event-driven
    /// caller, like the engine under the simulator). Returns the send times.
    fn run_event_driven(
        p: &mut Pacer,
        rate: u64,
        count: usize,
        mut size: impl FnMut(usize) -> usize,
    ) -> Vec<u64> {
        let mut now = 0;
        let mut times = Vec::with_capacity(count);
        for k in 0..count {
            let n = size(k);
            if let Some(t) = p.held_until_ns(rate, n) {
                assert!(!p.may_send(t - 1, rate, n), "held until {t}");
                now = now.max(t);
            }
            assert!(p.may_send(now, rate, n), "open at the time it named");
            p.on_send(now, rate, n);
            times.push(now);
        }
        times
    }

    #[test]
    fn full_bucket_then_one_packet_per_service_time() {
        let mut p = Pacer::new(4096);
        assert_eq!(p.held_until_ns(R8G, 4096), None);
        assert!(p.may_send(0, R8G, 4096));
        p.on_send(0, R8G, 4096);
        assert_eq!(p.held_until_ns(R8G, 4096), Some(4096));
        assert!(!p.may_send(1000, R8G, 4096));
        assert!(!p.may_send(4095, R8G, 4096));
        assert!(p.may_send(4096, R8G, 4096));
        // A smaller packet goes sooner.
        assert_eq!(p.held_until_ns(R8G, 1024), Some(1024));
    }

    #[test]
    fn long_run_rate_is_exact() {
        // 1 Gbit/s, 1000-byte packets: one every 8 us.
        let mut p = Pacer::new(1000);
        let t = run_event_driven(&mut p, 1_000_000_000, 1000, |_| 1000);
        // The first packet used the initial burst at t = 0.
        assert_eq!(t[999], 999 * 8_000);
    }

    #[test]
    fn odd_rates_do_not_drift() {
        // 3 Gbit/s and 1500-byte packets: 4 us each.
        let mut p = Pacer::new(1500);
        let t = run_event_driven(&mut p, 3_000_000_000, 100, |_| 1500);
        assert_eq!(t[99], 99 * 4_000);
        // With a two-packet bucket the first two go at once and packet k
        // (k >= 1) at ceil((k - 1) * 12_000 bits / 333e6 bit/s): no rounding
        // accumulates. k = 10_000: 360_324_324.3 ns.
        let mut p = Pacer::new(3000);
        let t = run_event_driven(&mut p, 333_000_000, 10_001, |_| 1500);
        assert_eq!(t[1], 0);
        assert_eq!(t[10_000], 360_324_325);
    }

    /// A caller polling on a coarse grid (the engine under a real clock, or
    /// the closed-loop tests' 100 ns steps) and gating on the largest packet
    /// it may send holds the rate within 1% over a long run, at rates from
    /// 10 Mbit/s to 400 Gbit/s, with the engine's default 64 KB bucket.
    #[test]
    fn polled_rate_holds_over_a_long_run() {
        const MAX_FRAME: usize = 4096 + 78;
        for (rate, step_ns) in [
            (10_000_000u64, 100_000u64),
            (1_000_000_000, 1_000),
            (10_000_000_000, 100),
            (100_000_000_000, 100),
            // 12 frames' worth per poll: the bucket carries it.
            (400_000_000_000, 1_000),
        ] {
            let mut p = Pacer::new(64 * 1024);
            // Mixed sizes, small to full (xorshift, fixed seed).
            let mut rng = 0x9e37_79b9_7f4a_7c15u64;
            let mut sent = 0u64;
            let mut now = 0u64;
            // Long enough for ~20_000 full frames.
            let duration = (20_000 * MAX_FRAME as u64 * 8_000_000_000) / rate;
            while now < duration {
                while p.may_send(now, rate, MAX_FRAME) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let n = 64 + (rng % (MAX_FRAME as u64 - 63)) as usize;
                    p.on_send(now, rate, n);
                    sent += n as u64;
                }
                now += step_ns;
            }
            let want = rate as f64 * now as f64 / 8e9;
            // The initial bucket is on top of the rate.
            let got = (sent - 64 * 1024) as f64;
            assert!(
                (got / want - 1.0).abs() < 0.01,
                "rate {rate}: sent {got} bytes, want {want}"
            );
        }
    }

    #[test]
    fn burst_caps_idle_credit() {
        let mut p = Pacer::new(8192);
        p.on_send(0, R8G, 8192);
        // After a long idle only 8192 bytes may go back to back.
        let t = 1_000_000;
        assert_eq!(p.credit_bytes(t, R8G), 8192);
        p.on_send(t, R8G, 4096);
        p.on_send(t, R8G, 4096);
        assert_eq!(p.held_until_ns(R8G, 4096), Some(t + 4096));
        // Gating on a 4096-byte worst case, 64-byte packets also stop at
        // the bucket: 8192 - 4096 + 64 bytes of them, then one per 64 ns.
        let mut p = Pacer::new(8192);
        let mut n = 0;
        while p.may_send(t, R8G, 4096) {
            p.on_send(t, R8G, 64);
            n += 1;
        }
        assert_eq!(n, (8192 - 4096) / 64 + 1);
        assert_eq!(p.held_until_ns(R8G, 4096), Some(t + 64));
    }

    /// Token-bucket conformance over every interval of a long run of mixed
    /// packet sizes, idle gaps and late callers: bytes sent in [t_i, t_j]
    /// never exceed burst + rate x (t_j - t_i), with the gate on the largest
    /// packet.
    #[test]
    fn bursts_stay_within_the_bucket() {
        const BURST: u64 = 16 * 1024;
        const MAX: usize = 4096;
        let mut p = Pacer::new(BURST);
        let mut rng = 0x0123_4567_89ab_cdefu64;
        let rate = 5_000_000_000u64;
        let mut sends: Vec<(u64, u64)> = Vec::new(); // (time, bytes)
        let mut now = 0u64;
        for k in 0..3000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let n = 1 + (rng % MAX as u64) as usize;
            if k % 500 == 0 {
                now += 1_000_000;
            }
            if let Some(t) = p.held_until_ns(rate, MAX) {
                now = now.max(t);
            }
            // Sometimes arrive late: the credit keeps accruing to the cap.
            now += rng >> 60;
            p.on_send(now, rate, n);
            sends.push((now, n as u64));
        }
        let mut prefix = vec![0u64];
        for s in &sends {
            prefix.push(prefix.last().unwrap() + s.1);
        }
        for i in 0..sends.len() {
            for j in i..sends.len() {
                let bytes = (prefix[j + 1] - prefix[i]) as u128;
                let allowed = BURST as u128 * 8_000_000_000
                    + rate as u128 * (sends[j].0 - sends[i].0) as u128;
                assert!(
                    bytes * 8_000_000_000 <= allowed,
                    "{bytes} bytes in sends {i}..={j}"
                );
            }
        }
        // And back to back, a full bucket lets exactly BURST bytes of
        // MAX-sized packets out.
        let mut p = Pacer::new(BURST);
        let mut out = 0;
        while p.may_send(5, R8G, MAX) {
            p.on_send(5, R8G, MAX);
            out += MAX as u64;
        }
        assert_eq!(out, BURST);
    }

    #[test]
    fn packets_larger_than_burst_flow_at_rate() {
        let mut p = Pacer::new(1000);
        assert!(p.may_send(0, R8G, 4096));
        p.on_send(0, R8G, 4096); // debt of 3096 bytes
        assert_eq!(p.credit_bytes(0, R8G), -3096);
        // Waits until 1000 bytes of credit: 4096 ns.
        assert_eq!(p.held_until_ns(R8G, 4096), Some(4096));
        let t = run_event_driven(&mut Pacer::new(1000), R8G, 100, |_| 4096);
        assert_eq!(t[99], 99 * 4096);
    }

    /// At a few bit/s, credit still accrues between frequent polls: nothing
    /// is lost to rounding and each packet goes exactly when its bits have
    /// accrued.
    #[test]
    fn very_low_rates_do_not_starve() {
        for rate in [1u64, 7, 1_000, 64_000] {
            let mut p = Pacer::new(100);
            p.on_send(0, rate, 100);
            let due = (800 * 1_000_000_000u64).div_ceil(rate);
            assert_eq!(p.held_until_ns(rate, 100), Some(due));
            // Polled every ns for a while, then every ms: unchanged.
            for now in (0..10_000).chain((0..due).step_by(1_000_000)) {
                assert!(!p.may_send(now, rate, 100));
            }
            assert!(p.may_send(due, rate, 100));
            // With a two-packet bucket (so the credit never reaches the cap
            // and drops its remainder) packets 0 and 1 go at once and packet
            // k at ceil((k - 1) x 800 bits / rate): no drift.
            let t = run_event_driven(&mut Pacer::new(200), rate, 11, |_| 100);
            assert_eq!(t[1], 0);
            for (k, &t) in t.iter().enumerate().skip(1) {
                assert_eq!(t, ((k as u64 - 1) * 800 * 1_000_000_000).div_ceil(rate));
            }
        }
        // 1 bit/s and a 4 KB frame: a long wait, but a finite one.
        let mut p = Pacer::new(64 * 1024);
        p.on_send(0, 1, 64 * 1024);
        assert_eq!(p.held_until_ns(1, 4096), Some(4096 * 8 * 1_000_000_000));
    }

    #[test]
    fn no_overflow_at_high_rates_and_long_idle() {
        for rate in [100_000_000_000u64, 400_000_000_000, 1 << 50, u64::MAX] {
            let mut p = Pacer::new(64 * 1024);
            p.on_send(1, rate, 64 * 1024);
            // A gap of ~584 years, and one to the end of time.
            for now in [u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                assert_eq!(p.credit_bytes(now, rate), 64 * 1024);
                assert!(p.may_send(now, rate, 9000));
            }
            p.on_send(u64::MAX, rate, 64 * 1024);
            p.on_send(u64::MAX, rate, 9000);
            assert_eq!(p.credit_bytes(u64::MAX, rate), -9000);
            // Time cannot pass u64::MAX: the wait saturates to "never".
            assert_eq!(p.held_until_ns(rate, 9000), Some(u64::MAX));
            assert!(!p.may_send(u64::MAX - 1, rate, 9000));
        }
        // 100 Gbit/s for an hour, packet by packet, with an hour idle in the
        // middle: exact.
        let rate = 100_000_000_000;
        let mut p = Pacer::new(4096);
        p.on_send(0, rate, 4096);
        let hour = 3_600_000_000_000u64;
        assert_eq!(p.credit_bytes(hour, rate), 4096);
        // 4096 bytes at 100 Gbit/s: 327.68 ns.
        assert_eq!(p.held_until_ns(rate, 4096), Some(328));
        assert!(p.may_send(hour, rate, 4096));
        p.on_send(hour, rate, 4096);
        assert_eq!(p.held_until_ns(rate, 4096), Some(hour + 328));
        // Huge sizes and debts saturate instead of wrapping.
        let mut p = Pacer::new(u64::MAX);
        p.on_send(0, rate, usize::MAX);
        p.on_send(0, rate, usize::MAX);
        assert!(p.credit_bytes(0, rate) < 0);
        // A 3e29 nano-bit deficit: past u64, still exact in u128.
        let wait = (2 * u64::MAX as u128 * 8_000_000_000).div_ceil(rate as u128);
        assert_eq!(p.held_until_ns(rate, usize::MAX), Some(wait as u64));
    }

    #[test]
    fn zero_rate_and_rate_changes() {
        let mut p = Pacer::new(1000);
        p.on_send(0, R8G, 1000);
        assert_eq!(p.held_until_ns(0, 1000), Some(u64::MAX));
        assert!(!p.may_send(u64::MAX - 1, 0, 1000));
        // The rate given at each call applies: 1 Gbit/s now, 8 ns per byte.
        assert_eq!(p.held_until_ns(1_000_000_000, 1000), Some(8_000));
        // Time going backwards adds no credit and does not move time back.
        p.on_send(5_000, R8G, 0);
        assert_eq!(p.credit_bytes(4_000, R8G), 1000);
        p.on_send(4_000, R8G, 500);
        assert_eq!(p.credit_bytes(5_000, R8G), 500);
        assert_eq!(p.held_until_ns(R8G, 1000), Some(5_500));
    }

    #[test]
    fn catch_up_books_credit_without_sending() {
        let mut p = Pacer::new(4096);
        p.on_send(0, R8G, 4096);
        assert_eq!(p.held_until_ns(R8G, 4096), Some(4096));
        // The send time passes with nothing sent: once booked, nothing is
        // held any more (so no stale deadline is reported again and again).
        p.catch_up(10_000, R8G);
        assert_eq!(p.held_until_ns(R8G, 4096), None);
        assert!(p.may_send(10_000, R8G, 4096));
        // Early: partial credit kept, the deadline unchanged.
        p.on_send(10_000, R8G, 4096);
        p.catch_up(11_000, R8G);
        assert_eq!(p.held_until_ns(R8G, 4096), Some(14_096));
        // Booked before a rate cut, 1000 bytes earned at 8 Gbit/s stay
        // earned; the rest comes at 1 Gbit/s (8 ns per byte).
        assert_eq!(
            p.held_until_ns(1_000_000_000, 4096),
            Some(11_000 + 3096 * 8)
        );
        // Calls in any order, clock included, never go back in time.
        p.catch_up(0, R8G);
        assert_eq!(p.credit_bytes(11_000, R8G), 1000);
    }
}
