//! The delay bottleneck's maths: a FIFO link at a fixed rate, modelled as a
//! virtual clock of departures: each packet leaves at
//! `max(now, last_departure) + len * 8 / rate`. A TC egress program
//! (ebpf/src/bottleneck.rs) runs it on a port whose `tbf` qdisc really
//! holds the packets at that rate (xroce::bottleneck), so packets wait and
//! RTT grows with the queue; the clock gives what tbf does not: marks,
//! drops and the queue's figures.
//!
//! Marking and drops reuse the XDP congestion point's [`EcnConfig`] and
//! [`mark_threshold`] (RED or step on the bytes queued, tail drop at the
//! buffer), decided on the backlog a packet finds on arrival. The backlog is
//! not counted packet by packet: it is what the clock says is still to be
//! sent, `(last_departure - now) * rate`.
//!
//! Integer-only and allocation-free, as the eBPF program calls it; the map
//! value carries a `bpf_spin_lock` held around [`delay_point`] (same rules as
//! [`crate::congestion`]: no other helper while it is held).

use crate::congestion::{bpf_spin_lock, mark_threshold, DropReason, EcnConfig, Verdict};
use crate::ecn::Ecn;

/// Map names of the TC program (15 characters at most).
pub mod names {
    /// The TC program (`SchedClassifier`).
    pub const PROGRAM: &str = "xroce_bneck";
    /// [`super::EcnConfig`] of the bottleneck (one entry).
    pub const CONFIG: &str = "XROCE_BN_CFG";
    /// [`super::DelayQueue`] (one entry).
    pub const QUEUE: &str = "XROCE_BN_Q";
}

/// The buffer used when the configuration leaves it unlimited (0): the
/// packets really sit in memory, so there is always a limit.
pub const DEFAULT_BUFFER_BYTES: u64 = 64 << 20;

/// Largest buffer: keeps `wait_ns * bytes_per_s` far from overflowing.
pub const MAX_BUFFER_BYTES: u64 = 1 << 31;

const NS_PER_S: u64 = 1_000_000_000;
/// Bits in a byte times ns in a second: `tx_ns = bytes * BIT_NS / rate_bps`.
const BIT_NS_PER_BYTE: u64 = 8 * NS_PER_S;

/// The link's state: value of a one-entry array map (96 bytes).
///
/// Layout: `lock u32 | _pad u32 | last_departure_ns | residue | peak_bytes |
/// peak_delay_ns | enqueued_bytes | enqueued_packets | delay_sum_ns | marked
/// | dropped_tail | dropped_congestion | burst_ns` (all u64 after the first
/// two).
///
/// The link is a token bucket, as the qdisc that holds the packets (tbf):
/// after an idle period up to `burst_ns` of transmission leaves at once.
/// In clock terms, the clock may lag real time by `burst_ns` and a packet
/// leaves when the clock has passed its last bit, or on arrival if it has
/// already (GCRA). With `burst_ns` 0 this is a plain FIFO link.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DelayQueue {
    /// Held by the TC program around [`delay_point`].
    pub lock: bpf_spin_lock,
    pub _pad: u32,
    /// The clock: CLOCK_MONOTONIC time at which the link has sent the last
    /// admitted packet's last bit (it left then, or on arrival if later).
    pub last_departure_ns: u64,
    /// Transmission time carried between packets in bit·ns (< the rate), so
    /// rounding each packet's time down does not speed the link up.
    pub residue: u64,
    /// Largest backlog (packet included) since the queue was reset.
    pub peak_bytes: u64,
    /// Largest sojourn (departure - arrival) since the reset.
    pub peak_delay_ns: u64,
    /// Bytes and packets admitted.
    pub enqueued_bytes: u64,
    pub enqueued_packets: u64,
    /// Sum of admitted packets' sojourn times: the mean over an interval is
    /// the difference of two samples over the difference of the packets.
    pub delay_sum_ns: u64,
    /// ECN-capable packets marked CE.
    pub marked: u64,
    /// Dropped because the buffer was full.
    pub dropped_tail: u64,
    /// Not-ECT packets dropped instead of marked.
    pub dropped_congestion: u64,
    /// The bucket in transmission time: how far the clock may lag real
    /// time (set by userspace with the queue; the program only reads it).
    pub burst_ns: u64,
}

const _: () = assert!(core::mem::size_of::<DelayQueue>() == 96);

// SAFETY: plain #[repr(C)] integers with explicit padding.
#[cfg(feature = "user")]
unsafe impl aya::Pod for DelayQueue {}

/// What the link does with one packet: the verdict, and when it leaves (0
/// when dropped or when the bottleneck is off).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Departure {
    pub verdict: Verdict,
    pub departure_ns: u64,
}

/// `ns * bytes_per_s / 1e9`, saturating (a wait past 78 hours reads as a
/// full buffer). Bounds are constants, not a division by the rate: LLVM
/// turns a `ns > MAX / rate` check into a 128-bit multiply, which BPF has
/// not. Rates above 2^39 bit/s (550 Gbit/s) count as 2^39.
#[inline(always)]
pub const fn bytes_in(ns: u64, link_rate_bps: u64) -> u64 {
    let mut bytes_per_s = link_rate_bps / 8;
    if bytes_per_s > 1 << 36 {
        bytes_per_s = 1 << 36;
    }
    // Each branch keeps the product under 2^64; coarser time units only
    // for waits long enough that the rounding is below a millionth.
    if ns < 1 << 28 {
        ns * bytes_per_s / NS_PER_S
    } else if ns < 1 << 38 {
        (ns / 1_000) * bytes_per_s / 1_000_000
    } else if ns < 1 << 48 {
        (ns / 1_000_000) * bytes_per_s / 1_000
    } else {
        u64::MAX
    }
}

/// The buffer a configuration stands for (0 means the default).
#[inline(always)]
pub const fn effective_buffer(cfg: &EcnConfig) -> u64 {
    if cfg.buffer_bytes == 0 {
        DEFAULT_BUFFER_BYTES
    } else if cfg.buffer_bytes > MAX_BUFFER_BYTES {
        MAX_BUFFER_BYTES
    } else {
        cfg.buffer_bytes
    }
}

impl DelayQueue {
    /// How long a packet arriving at `now_ns` waits before its own
    /// transmission starts.
    #[inline(always)]
    pub const fn wait_at(&self, now_ns: u64) -> u64 {
        self.last_departure_ns.saturating_sub(now_ns)
    }

    /// Bytes still to send at `now_ns` (for samplers: userspace's
    /// CLOCK_MONOTONIC is the clock `bpf_ktime_get_ns` reads).
    #[inline(always)]
    pub const fn backlog_at(&self, now_ns: u64, link_rate_bps: u64) -> u64 {
        bytes_in(self.wait_at(now_ns), link_rate_bps)
    }
}

/// One packet of `frame_bytes` arriving at `now_ns`. `ecn` is the packet's
/// ECN field when the marking policy applies to it (RoCEv2), `None` when it
/// only queues (and may be tail-dropped). `rand`: a uniform `u32` drawn
/// before the lock. Assumes exclusive access to `q`.
#[inline(always)]
pub fn delay_point(
    q: &mut DelayQueue,
    cfg: &EcnConfig,
    now_ns: u64,
    frame_bytes: u64,
    ecn: Option<Ecn>,
    rand: u32,
) -> Departure {
    let rate = cfg.link_rate_bps;
    if cfg.enabled == 0 || rate == 0 {
        return Departure {
            verdict: Verdict::Pass,
            departure_ns: 0,
        };
    }
    let wait = q.wait_at(now_ns);
    let backlog = bytes_in(wait, rate);
    if backlog.saturating_add(frame_bytes) > effective_buffer(cfg) {
        q.dropped_tail += 1;
        return Departure {
            verdict: Verdict::Drop(DropReason::TailDrop),
            departure_ns: 0,
        };
    }
    let mut mark = false;
    if let Some(ecn) = ecn {
        if (rand as u64) < mark_threshold(cfg, backlog) {
            if !ecn.is_ecn_capable() {
                q.dropped_congestion += 1;
                return Departure {
                    verdict: Verdict::Drop(DropReason::NotEct),
                    departure_ns: 0,
                };
            }
            mark = true;
        }
    }
    // A clock lagging more than the bucket has lost the credit beyond it.
    let floor = now_ns.saturating_sub(q.burst_ns);
    let start = if q.last_departure_ns > floor {
        q.last_departure_ns
    } else {
        // An idle link: the carried fraction belongs to the last busy period.
        q.residue = 0;
        floor
    };
    // frame_bytes is at most a 64 KiB GSO packet: the product fits easily.
    let bit_ns = frame_bytes * BIT_NS_PER_BYTE + q.residue;
    let tx_ns = bit_ns / rate;
    q.residue = bit_ns % rate;
    let finish = start + tx_ns;
    q.last_departure_ns = finish;
    let departure = if finish > now_ns { finish } else { now_ns };
    let sojourn = departure - now_ns;
    let queued = backlog + frame_bytes;
    if queued > q.peak_bytes {
        q.peak_bytes = queued;
    }
    if sojourn > q.peak_delay_ns {
        q.peak_delay_ns = sojourn;
    }
    q.enqueued_bytes += frame_bytes;
    q.enqueued_packets += 1;
    q.delay_sum_ns += sojourn;
    if mark {
        q.marked += 1;
    }
    Departure {
        verdict: if mark { Verdict::Mark } else { Verdict::Pass },
        departure_ns: departure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GBIT: u64 = 1_000_000_000;

    #[test]
    fn a_burst_departs_back_to_back_at_the_rate() {
        // 1 Gbit/s: 1500 bytes take 12 us.
        let cfg = EcnConfig::step(GBIT, 1 << 30, 0);
        let mut q = DelayQueue::default();
        let t0 = 1_000_000;
        for i in 1..=10u64 {
            let d = delay_point(&mut q, &cfg, t0, 1500, None, 0);
            assert_eq!(d.verdict, Verdict::Pass);
            assert_eq!(d.departure_ns, t0 + i * 12_000);
        }
        // Half-way through, 5 packets are left: 7_500 bytes, 60 us.
        assert_eq!(q.backlog_at(t0 + 60_000, GBIT), 7_500);
        assert_eq!(q.wait_at(t0 + 60_000), 60_000);
        assert_eq!(q.peak_bytes, 15_000);
        assert_eq!(q.peak_delay_ns, 120_000);
        assert_eq!(q.delay_sum_ns, 12_000 * 55);
        // An idle link sends at once.
        let d = delay_point(&mut q, &cfg, t0 + 1_000_000, 1500, None, 0);
        assert_eq!(d.departure_ns, t0 + 1_000_000 + 12_000);
    }

    #[test]
    fn marks_on_the_backlog_found_and_drops_not_ect() {
        // 8 Gbit/s = 1 byte per ns; step at 3_000 bytes.
        let cfg = EcnConfig::step(8 * GBIT, 3_000, 10_000);
        let mut q = DelayQueue::default();
        let t = 500;
        for _ in 0..3 {
            let d = delay_point(&mut q, &cfg, t, 1_000, Some(Ecn::Ect0), u32::MAX);
            assert_eq!(d.verdict, Verdict::Pass);
        }
        // Backlog 3_000: not above K.
        let d = delay_point(&mut q, &cfg, t, 1_000, Some(Ecn::Ect0), u32::MAX);
        assert_eq!(d.verdict, Verdict::Pass);
        // 4_000 > K: marked; a Not-ECT packet is dropped; non-RoCE queues.
        let d = delay_point(&mut q, &cfg, t, 1_000, Some(Ecn::Ect1), u32::MAX);
        assert_eq!(d.verdict, Verdict::Mark);
        let d = delay_point(&mut q, &cfg, t, 1_000, Some(Ecn::NotEct), u32::MAX);
        assert_eq!(d.verdict, Verdict::Drop(DropReason::NotEct));
        let d = delay_point(&mut q, &cfg, t, 1_000, None, 0);
        assert_eq!((d.verdict, d.departure_ns), (Verdict::Pass, t + 6_000));
        // 6_000 queued: 5_000 more would overflow the 10_000 buffer.
        let d = delay_point(&mut q, &cfg, t, 5_000, None, 0);
        assert_eq!(d.verdict, Verdict::Drop(DropReason::TailDrop));
        // 2 us later 2_000 bytes left: 4_000 + 5_000 fit.
        let d = delay_point(&mut q, &cfg, t + 2_000, 5_000, None, 0);
        assert_eq!(d.departure_ns, t + 11_000);
        assert_eq!((q.marked, q.dropped_congestion, q.dropped_tail), (1, 1, 1));
        assert_eq!(q.enqueued_packets, 7);
        assert_eq!(q.enqueued_bytes, 11_000);
    }

    #[test]
    fn a_bucket_lets_a_burst_through_then_the_rate_holds() {
        // 8 Gbit/s (1 B/ns), a 3_000-byte bucket.
        let cfg = EcnConfig::step(8 * GBIT, 1 << 30, 0);
        let mut q = DelayQueue {
            burst_ns: 3_000,
            ..Default::default()
        };
        let t = 1_000_000;
        // Three 1_000-byte packets leave on arrival, the fourth waits for
        // its own 1_000 ns, the fifth 2_000 ns.
        for want in [t, t, t, t + 1_000, t + 2_000] {
            let d = delay_point(&mut q, &cfg, t, 1_000, None, 0);
            assert_eq!(d.departure_ns, want);
        }
        // Queue found by the next: the clock is 2_000 ns ahead.
        assert_eq!(q.backlog_at(t, 8 * GBIT), 2_000);
        // Long idle: the credit is back to the bucket, no more.
        let t2 = t + 1_000_000;
        for want in [t2, t2, t2, t2 + 1_000] {
            let d = delay_point(&mut q, &cfg, t2, 1_000, None, 0);
            assert_eq!(d.departure_ns, want);
        }
        assert_eq!(q.peak_delay_ns, 2_000);
    }

    #[test]
    fn off_passes_without_a_departure_time() {
        let mut q = DelayQueue::default();
        let d = delay_point(&mut q, &EcnConfig::default(), 10, 1500, None, 0);
        assert_eq!((d.verdict, d.departure_ns), (Verdict::Pass, 0));
        assert_eq!(q, DelayQueue::default());
    }

    #[test]
    fn backlog_never_overflows() {
        assert_eq!(bytes_in(u64::MAX, 400 * GBIT), u64::MAX);
        // Each range is exact to the unit it keeps.
        assert_eq!(bytes_in((1 << 28) - 1, 8 * GBIT), (1 << 28) - 1);
        assert_eq!(bytes_in(10_000_000_000, 8 * GBIT), 10_000_000_000);
        assert_eq!(bytes_in(1_000_000_000_000, 8 * GBIT), 1_000_000_000_000);
        assert_eq!(
            bytes_in(1 << 40, 1 << 50),
            (1u64 << 40) / 1_000_000 * (1 << 36) / 1_000
        );
        assert_eq!(bytes_in(1_000_000_000, 8), 1);
        assert_eq!(bytes_in(1_000, 0), 0);
        let cfg = EcnConfig::step(GBIT, 1, 0);
        assert_eq!(effective_buffer(&cfg), DEFAULT_BUFFER_BYTES);
    }

    proptest! {
        /// However packets arrive, the link never sends faster than its rate:
        /// the last departure is at least the first arrival plus all bytes at
        /// the rate, and (back to back) within one ns per packet of it.
        #[test]
        fn departures_follow_the_rate(
            rate in 1_000_000u64..100_000_000_000,
            sizes in proptest::collection::vec(60u64..9_000, 1..200),
        ) {
            let cfg = EcnConfig::step(rate, MAX_BUFFER_BYTES, MAX_BUFFER_BYTES);
            let mut q = DelayQueue::default();
            let t0 = 1_000;
            let mut last = 0;
            for s in &sizes {
                let d = delay_point(&mut q, &cfg, t0, *s, None, 0);
                prop_assert!(d.departure_ns >= last);
                last = d.departure_ns;
            }
            let total: u64 = sizes.iter().sum();
            let exact = total as f64 * 8e9 / rate as f64;
            let got = (last - t0) as f64;
            prop_assert!(got <= exact + 1.0 && got >= exact - 1.0, "{got} vs {exact}");
        }
    }
}
