//! The XDP congestion point's maths: a virtual bottleneck queue and the
//! marking decision (RED as DCQCN switches run it, or a DCTCP-style step).
//! CE marking itself is in [`crate::ecn`], loss injection in [`crate::fault`],
//! fixed-point fractions in [`crate::fixed`].
//!
//! Everything here is integer-only and allocation-free so the eBPF program can
//! call it (the verifier forbids floating point). The few helpers that convert
//! from `f64` are for userspace and are compiled out for `target_arch = "bpf"`.
//!
//! # Concurrency
//!
//! [`VirtualQueue`] is updated by a read-modify-write of several fields
//! (drain since `last_ns`, tail-drop check, enqueue). The functions take
//! `&mut VirtualQueue` and **assume exclusive access**: the XDP side holds the
//! `bpf_spin_lock` that is the first field of the map value
//! ([`VirtualQueue::lock`]) for the whole [`congestion_point`] call. That needs
//! a BTF-described map (aya-ebpf `btf_maps::Array`) so the kernel finds the
//! lock, and the lock must not be held across helper calls other than the
//! spin-lock ones (draw the random number before taking the lock). A per-CPU
//! map works without the lock but then models one queue per CPU, not one
//! shared bottleneck.
//!
//! # Wiring in the XDP program (checked with the verifier of kernel 6.18)
//!
//! ```ignore
//! #[btf_map] static ECN_QUEUE: btf_maps::Array<VirtualQueue, 1> = Array::new();
//! #[btf_map] static ECN_CONFIG: btf_maps::Array<EcnConfig, 1> = Array::new();
//! #[btf_map] static FAULT_CONFIG: btf_maps::Array<FaultConfig, 1> = Array::new();
//! #[btf_map] static FAULT_RNG: btf_maps::PerCpuArray<FaultRng, 1> = PerCpuArray::new();
//!
//! // per RoCEv2 frame, after parsing (l3 = IP header, ecn from its TOS/TC):
//! let fault = FAULT_CONFIG.get(0)?;
//! let r = if fault.seed != 0 {
//!     unsafe { (*FAULT_RNG.get_ptr_mut(0)?).next(fault.seed, bpf_get_smp_processor_id()) }
//! } else { unsafe { bpf_get_prandom_u32() } };
//! if fault_should_drop(fault, bth_opcode, bth_dest_qpn, r) { return XDP_DROP }
//! let (cfg, q) = (ECN_CONFIG.get(0)?, ECN_QUEUE.get_ptr_mut(0)?);
//! let (rand, now) = unsafe { (bpf_get_prandom_u32(), bpf_ktime_get_ns()) };
//! let verdict = unsafe {
//!     bpf_spin_lock(addr_of_mut!((*q).lock).cast());
//!     let v = congestion_point(&mut *q, cfg, now, frame_len, ecn, rand);
//!     bpf_spin_unlock(addr_of_mut!((*q).lock).cast());
//!     v
//! };
//! // Mark -> ipv4_set_ce(slice of the 20-byte header) / ipv6_set_ce, count;
//! // Drop(TailDrop | NotEct) -> count, XDP_DROP; Pass -> carry on.
//! ```
//!
//! The program needs BTF (`-C link-arg=--btf`) for the spin lock.
//!

use crate::ecn::Ecn;
use crate::fixed::{fixed_threshold, FIXED_ONE};

/// Marking policy, stored as `u32` in [`EcnConfig::policy`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EcnPolicy {
    /// RED as DCQCN switches run it: no mark up to `kmin`, probability rising
    /// linearly to `pmax` at `kmax`, every packet above `kmax`.
    Red = 0,
    /// DCTCP-style step: mark every packet when the queue exceeds K (`kmin`).
    Step = 1,
}

impl EcnPolicy {
    /// From the raw map value; unknown values behave as RED.
    #[inline(always)]
    pub const fn from_u32(v: u32) -> EcnPolicy {
        match v {
            1 => EcnPolicy::Step,
            _ => EcnPolicy::Red,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            EcnPolicy::Red => "red",
            EcnPolicy::Step => "step",
        }
    }

    /// Parses "red" or "step" (as the CLI spells them).
    pub fn from_name(s: &str) -> Option<EcnPolicy> {
        match s {
            "red" => Some(EcnPolicy::Red),
            "step" => Some(EcnPolicy::Step),
            _ => None,
        }
    }
}

/// The congestion point's settings: value of a one-entry array map.
///
/// Layout (48 bytes, no implicit padding, same for bpfel and x86_64):
/// `enabled u32 | policy u32 | link_rate_bps u64 | kmin u64 | kmax u64 |
/// buffer_bytes u64 | pmax_fixed u32 | _pad u32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EcnConfig {
    /// 0: the congestion point is off (every packet passes, the queue is not
    /// updated); 1: on.
    pub enabled: u32,
    /// An [`EcnPolicy`] as `u32`.
    pub policy: u32,
    /// Drain rate of the virtual queue in bits per second. 0 = never drains.
    pub link_rate_bps: u64,
    /// RED: queue length in bytes up to which nothing is marked.
    /// Step: the threshold K.
    pub kmin: u64,
    /// RED: queue length in bytes at which the probability reaches `pmax`;
    /// above it every packet is marked. Unused by Step.
    pub kmax: u64,
    /// Virtual buffer size in bytes: a packet that would make the queue
    /// exceed it is tail-dropped. 0 = unlimited.
    pub buffer_bytes: u64,
    /// RED's maximum marking probability at `kmax`, fixed point (2^32 = 1).
    pub pmax_fixed: u32,
    /// Explicit padding: keep zero.
    pub _pad: u32,
}

impl EcnConfig {
    /// RED marking (DCQCN switch style) on a queue draining at `link_rate_bps`.
    pub const fn red(
        link_rate_bps: u64,
        kmin: u64,
        kmax: u64,
        pmax_fixed: u32,
        buffer_bytes: u64,
    ) -> Self {
        EcnConfig {
            enabled: 1,
            policy: EcnPolicy::Red as u32,
            link_rate_bps,
            kmin,
            kmax,
            buffer_bytes,
            pmax_fixed,
            _pad: 0,
        }
    }

    /// DCTCP-style step marking above `k` bytes.
    pub const fn step(link_rate_bps: u64, k: u64, buffer_bytes: u64) -> Self {
        EcnConfig {
            enabled: 1,
            policy: EcnPolicy::Step as u32,
            link_rate_bps,
            kmin: k,
            kmax: k,
            buffer_bytes,
            pmax_fixed: FIXED_ONE,
            _pad: 0,
        }
    }

    /// Checks a configuration before userspace writes it; the message says
    /// what to change.
    pub const fn validate(&self) -> Result<(), &'static str> {
        if self.enabled == 0 {
            return Ok(());
        }
        if self.link_rate_bps == 0 {
            return Err("the link rate must be above zero (e.g. --link-rate 5gbit)");
        }
        if self.policy > EcnPolicy::Step as u32 {
            return Err("unknown marking policy (use red or step)");
        }
        if self.policy == EcnPolicy::Red as u32 && self.kmax < self.kmin {
            return Err("kmax must be at least kmin");
        }
        if self.buffer_bytes != 0 && self.buffer_bytes < self.kmin {
            return Err("the buffer must be at least kmin, or nothing is ever marked");
        }
        if self.buffer_bytes > 1 << 31 {
            return Err("the buffer is limited to 2 GiB");
        }
        Ok(())
    }
}

// Layouts are part of the kernel/user contract.
const _: () = assert!(core::mem::size_of::<EcnConfig>() == 48);
const _: () = assert!(core::mem::align_of::<EcnConfig>() == 8);
const _: () = assert!(core::mem::size_of::<VirtualQueue>() == 56);

// SAFETY: plain #[repr(C)] integers with explicit padding; every bit pattern
// is a valid value.
#[cfg(feature = "user")]
unsafe impl aya::Pod for EcnConfig {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for VirtualQueue {}

/// Same layout as the kernel's `struct bpf_spin_lock` (one `u32`); the field
/// type is named `bpf_spin_lock` so the BTF the kernel checks carries that
/// name. Userspace never touches it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(non_camel_case_types)]
pub struct bpf_spin_lock {
    pub val: u32,
}

/// Nanoseconds in a second times bits in a byte: `bytes = bit_ns / BIT_NS_PER_BYTE`
/// where `bit_ns = dt_ns * rate_bps`.
const BIT_NS_PER_BYTE: u64 = 8_000_000_000;

/// The virtual bottleneck: value of a one-entry array map (56 bytes).
///
/// Layout: `lock (bpf_spin_lock, u32) | _pad u32 | backlog_bytes u64 |
/// last_ns u64 | residue u64 | peak_bytes u64 | enqueued_bytes u64 |
/// enqueued_packets u64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct VirtualQueue {
    /// Held by the XDP program around [`congestion_point`]; see the module docs.
    pub lock: bpf_spin_lock,
    pub _pad: u32,
    /// Bytes queued as of `last_ns`.
    pub backlog_bytes: u64,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) of the last update.
    pub last_ns: u64,
    /// Drain carried between updates, in bit·ns (< 8e9), so frequent small
    /// updates do not each lose a fraction of a byte.
    pub residue: u64,
    /// Largest backlog seen since the queue was (re)set.
    pub peak_bytes: u64,
    /// Total bytes admitted (not dropped) into the queue.
    pub enqueued_bytes: u64,
    /// Total packets admitted.
    pub enqueued_packets: u64,
}

impl VirtualQueue {
    /// Drains the queue at `link_rate_bps` for the time since `last_ns`.
    /// A `now_ns` earlier than `last_ns` (another CPU's clock read raced this
    /// one) drains nothing and leaves `last_ns` alone.
    #[inline(always)]
    pub fn drain(&mut self, now_ns: u64, link_rate_bps: u64) {
        if now_ns <= self.last_ns {
            return;
        }
        let dt = now_ns - self.last_ns;
        self.last_ns = now_ns;
        if self.backlog_bytes == 0 {
            self.residue = 0;
            return;
        }
        if link_rate_bps == 0 {
            return;
        }
        // dt * rate + residue must fit in u64; when it does not, the drain is
        // over (2^64 - 8e9) / 8e9 > 2.3e9 bytes: more than any sane buffer.
        let limit = (u64::MAX - BIT_NS_PER_BYTE) / link_rate_bps;
        if dt > limit {
            self.backlog_bytes = 0;
            self.residue = 0;
            return;
        }
        let bit_ns = dt * link_rate_bps + self.residue;
        let drained = bit_ns / BIT_NS_PER_BYTE;
        if drained >= self.backlog_bytes {
            self.backlog_bytes = 0;
            self.residue = 0;
        } else {
            self.backlog_bytes -= drained;
            self.residue = bit_ns % BIT_NS_PER_BYTE;
        }
    }

    /// Adds `bytes` to the queue (after [`VirtualQueue::drain`]).
    #[inline(always)]
    pub fn enqueue(&mut self, bytes: u64) {
        self.backlog_bytes += bytes;
        if self.backlog_bytes > self.peak_bytes {
            self.peak_bytes = self.backlog_bytes;
        }
        self.enqueued_bytes += bytes;
        self.enqueued_packets += 1;
    }

    /// The backlog as it would be at `now_ns` with no arrivals, without
    /// changing the state: for `xroce stats` (userspace's CLOCK_MONOTONIC is
    /// the clock `bpf_ktime_get_ns` reads).
    pub fn backlog_at(&self, now_ns: u64, link_rate_bps: u64) -> u64 {
        let mut copy = *self;
        copy.drain(now_ns, link_rate_bps);
        copy.backlog_bytes
    }
}

/// The marking probability for a queue of `backlog` bytes, as a threshold
/// for a random `u32` (0 = never, 2^32 = always); see [`fixed_threshold`].
///
/// RED: 0 while `backlog <= kmin`; `pmax * (backlog - kmin) / (kmax - kmin)`
/// up to and including `kmax`; 2^32 above `kmax`. (If `kmax <= kmin` it
/// degenerates to a step at `kmin` with probability 1.)
/// Step: 0 while `backlog <= kmin` (K), 2^32 above.
#[inline(always)]
pub fn mark_threshold(cfg: &EcnConfig, backlog: u64) -> u64 {
    if backlog <= cfg.kmin {
        return 0;
    }
    match EcnPolicy::from_u32(cfg.policy) {
        EcnPolicy::Step => 1 << 32,
        EcnPolicy::Red => {
            if backlog > cfg.kmax || cfg.kmax <= cfg.kmin {
                return 1 << 32;
            }
            let span = cfg.kmax - cfg.kmin;
            let over = backlog - cfg.kmin; // 0 < over <= span
            let pmax = fixed_threshold(cfg.pmax_fixed); // <= 2^32
                                                        // pmax (<= 2^32) * over fits u64 while span < 2^31; for larger
                                                        // spans scale over and span down alike first (over <= span).
            if span < (1 << 31) {
                pmax * over / span
            } else if span < (1 << 32) {
                pmax * (over >> 1) / (span >> 1)
            } else {
                pmax * (over >> 32) / (span >> 32)
            }
        }
    }
}

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The virtual buffer is full.
    TailDrop,
    /// Over the marking threshold but not ECN-capable: dropped instead.
    NotEct,
}

/// What the congestion point does with one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Enqueued, left alone.
    Pass,
    /// Enqueued; set CE ([`crate::ecn::ipv4_set_ce`] / [`crate::ecn::ipv6_set_ce`]). Also returned
    /// for packets that already carry CE (setting it again changes nothing).
    Mark,
    /// Not enqueued; drop the frame.
    Drop(DropReason),
}

/// One packet through the congestion point: drains the queue to `now_ns`,
/// tail-drops if the buffer would overflow, decides on the queue length the
/// packet finds (before it joins), marks ECN-capable packets or drops
/// non-ECT ones over the threshold, and enqueues what is not dropped.
///
/// `frame_bytes` is what the packet occupies on the link (the caller's
/// choice; the whole Ethernet frame is natural), `ecn` its IP ECN field,
/// `rand` a uniformly random `u32` (`bpf_get_prandom_u32()`, drawn before the
/// spin lock is taken). Assumes exclusive access to `q` (module docs).
#[inline(always)]
pub fn congestion_point(
    q: &mut VirtualQueue,
    cfg: &EcnConfig,
    now_ns: u64,
    frame_bytes: u64,
    ecn: Ecn,
    rand: u32,
) -> Verdict {
    if cfg.enabled == 0 {
        return Verdict::Pass;
    }
    q.drain(now_ns, cfg.link_rate_bps);
    let backlog = q.backlog_bytes;
    if cfg.buffer_bytes != 0 && backlog + frame_bytes > cfg.buffer_bytes {
        return Verdict::Drop(DropReason::TailDrop);
    }
    let mark = (rand as u64) < mark_threshold(cfg, backlog);
    if mark && !ecn.is_ecn_capable() {
        return Verdict::Drop(DropReason::NotEct);
    }
    q.enqueue(frame_bytes);
    if mark {
        Verdict::Mark
    } else {
        Verdict::Pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixed::fraction_to_fixed;
    use proptest::prelude::*;

    fn red(kmin: u64, kmax: u64, pmax: f64) -> EcnConfig {
        EcnConfig {
            enabled: 1,
            policy: EcnPolicy::Red as u32,
            link_rate_bps: 0,
            kmin,
            kmax,
            buffer_bytes: 0,
            pmax_fixed: fraction_to_fixed(pmax),
            _pad: 0,
        }
    }

    #[test]
    fn red_probability_hand_worked() {
        // DCQCN's switch settings: Kmin 5 KB, Kmax 200 KB, Pmax 1%.
        let cfg = red(5_000, 200_000, 0.01);
        let pmax = 42_949_673u64;
        assert_eq!(mark_threshold(&cfg, 0), 0);
        assert_eq!(mark_threshold(&cfg, 4_999), 0);
        assert_eq!(mark_threshold(&cfg, 5_000), 0, "no mark at Kmin");
        // Midpoint 102_500: half of Pmax. 42_949_673 * 97_500 / 195_000.
        assert_eq!(mark_threshold(&cfg, 102_500), pmax / 2);
        // A quarter of the way: 53_750.
        assert_eq!(mark_threshold(&cfg, 53_750), pmax * 48_750 / 195_000);
        assert_eq!(mark_threshold(&cfg, 200_000), pmax, "Pmax at Kmax");
        assert_eq!(mark_threshold(&cfg, 200_001), 1 << 32, "all above Kmax");
        // Probability 1% at Kmax: 1% of draws are under the threshold.
        let t = mark_threshold(&cfg, 200_000) as f64 / 4_294_967_296.0;
        assert!((t - 0.01).abs() < 1e-9);
        // Pmax = 1 reaches certainty at Kmax.
        let cfg1 = red(0, 100, 1.0);
        assert_eq!(mark_threshold(&cfg1, 50), 1 << 31);
        assert_eq!(mark_threshold(&cfg1, 100), 1 << 32);
    }

    #[test]
    fn red_degenerate_and_huge_spans() {
        // kmax <= kmin: a step at kmin.
        let cfg = red(10, 10, 0.5);
        assert_eq!(mark_threshold(&cfg, 10), 0);
        assert_eq!(mark_threshold(&cfg, 11), 1 << 32);
        // Spans beyond 2^31 do not overflow and stay monotone.
        let cfg = red(0, 1 << 40, 1.0);
        let a = mark_threshold(&cfg, 1 << 38);
        let b = mark_threshold(&cfg, 1 << 39);
        assert!(a < b && b <= 1 << 32);
        assert!((b as f64 / (1u64 << 32) as f64 - 0.5).abs() < 0.01);
    }

    #[test]
    fn step_policy() {
        let mut cfg = red(30_000, 0, 0.0);
        cfg.policy = EcnPolicy::Step as u32;
        assert_eq!(mark_threshold(&cfg, 30_000), 0);
        assert_eq!(mark_threshold(&cfg, 30_001), 1 << 32);
        assert_eq!(EcnPolicy::from_u32(1), EcnPolicy::Step);
        assert_eq!(EcnPolicy::from_u32(7), EcnPolicy::Red);
        assert_eq!(EcnPolicy::from_name("step"), Some(EcnPolicy::Step));
        assert_eq!(EcnPolicy::from_name("wred"), None);
    }

    #[test]
    fn queue_drains_at_link_rate() {
        let mut q = VirtualQueue::default();
        let rate = 8_000_000_000; // 8 Gbit/s = 1 byte per ns
        q.drain(1_000, rate);
        q.enqueue(10_000);
        assert_eq!(q.backlog_bytes, 10_000);
        q.drain(1_000 + 4_000, rate);
        assert_eq!(q.backlog_bytes, 6_000);
        // Saturates at zero.
        q.drain(1_000 + 100_000, rate);
        assert_eq!(q.backlog_bytes, 0);
        assert_eq!(q.peak_bytes, 10_000);

        // 5 Gbit/s: 625 bytes per microsecond.
        let rate = 5_000_000_000;
        let mut q = VirtualQueue::default();
        q.enqueue(200_000);
        q.drain(100_000, rate); // 100 us -> 62_500 bytes
        assert_eq!(q.backlog_bytes, 137_500);
        // backlog_at does not modify the state.
        assert_eq!(q.backlog_at(200_000, rate), 75_000);
        assert_eq!(q.backlog_bytes, 137_500);
    }

    #[test]
    fn queue_residue_keeps_small_steps_exact() {
        // 1 Gbit/s drains 0.125 byte per ns; step 100 ns at a time (12.5 B).
        let rate = 1_000_000_000;
        let mut q = VirtualQueue::default();
        q.enqueue(1_000_000);
        for i in 1..=1_000u64 {
            q.drain(i * 100, rate);
        }
        // 100 us at 1 Gbit/s = 12_500 bytes exactly.
        assert_eq!(q.backlog_bytes, 1_000_000 - 12_500);
    }

    #[test]
    fn queue_ignores_time_going_backwards_and_huge_gaps() {
        let rate = 8_000_000_000;
        let mut q = VirtualQueue {
            last_ns: 10_000,
            ..Default::default()
        };
        q.enqueue(5_000);
        q.drain(9_000, rate);
        assert_eq!((q.backlog_bytes, q.last_ns), (5_000, 10_000));
        q.drain(u64::MAX, 400_000_000_000);
        assert_eq!(q.backlog_bytes, 0);
        // Rate 0 never drains.
        let mut q = VirtualQueue::default();
        q.enqueue(100);
        q.drain(1_000_000, 0);
        assert_eq!(q.backlog_bytes, 100);
    }

    #[test]
    fn congestion_point_marks_drops_and_tail_drops() {
        let mut cfg = red(5_000, 200_000, 0.01);
        cfg.link_rate_bps = 8_000_000_000; // 1 B/ns
        cfg.buffer_bytes = 300_000;
        let mut q = VirtualQueue::default();
        // Empty queue: pass even with the smallest draw.
        assert_eq!(
            congestion_point(&mut q, &cfg, 0, 4_000, Ecn::Ect0, 0),
            Verdict::Pass
        );
        assert_eq!(
            congestion_point(&mut q, &cfg, 0, 4_000, Ecn::Ect0, 0),
            Verdict::Pass
        );
        // Queue 8_000 > Kmin: p = pmax * 3000 / 195000; draw 0 marks, a big draw does not.
        assert_eq!(
            congestion_point(&mut q, &cfg, 0, 4_000, Ecn::Ect0, 0),
            Verdict::Mark
        );
        assert_eq!(
            congestion_point(&mut q, &cfg, 0, 4_000, Ecn::Ect0, u32::MAX),
            Verdict::Pass
        );
        assert_eq!(q.backlog_bytes, 16_000);
        // Non-ECT over the threshold with a marking draw: dropped, not enqueued.
        assert_eq!(
            congestion_point(&mut q, &cfg, 0, 4_000, Ecn::NotEct, 0),
            Verdict::Drop(DropReason::NotEct)
        );
        assert_eq!(q.backlog_bytes, 16_000);
        // Fill beyond Kmax: everything marked regardless of the draw.
        q.enqueue(200_000 - 16_000 + 1);
        assert_eq!(
            congestion_point(&mut q, &cfg, 0, 1_000, Ecn::Ect1, u32::MAX),
            Verdict::Mark
        );
        assert_eq!(
            congestion_point(&mut q, &cfg, 0, 1_000, Ecn::Ce, u32::MAX),
            Verdict::Mark
        );
        // Tail drop: 202_001 + 98_000 > 300_000.
        assert_eq!(
            congestion_point(&mut q, &cfg, 0, 98_000, Ecn::Ect0, u32::MAX),
            Verdict::Drop(DropReason::TailDrop)
        );
        // 2 us later 2_000 bytes drained: 200_001 + 99_999 = 300_000 fits.
        assert_eq!(
            congestion_point(&mut q, &cfg, 2_000, 99_999, Ecn::Ect0, u32::MAX),
            Verdict::Mark
        );
        assert_eq!(q.backlog_bytes, 300_000);
        // Disabled: pass and leave the queue alone.
        cfg.enabled = 0;
        assert_eq!(
            congestion_point(&mut q, &cfg, 1_000_000, 1, Ecn::NotEct, 0),
            Verdict::Pass
        );
        assert_eq!(q.backlog_bytes, 300_000);
    }

    proptest! {
        #[test]
        fn drain_in_pieces_equals_drain_at_once(
            start in 0u64..10_000_000,
            rate in 1u64..400_000_000_000,
            steps in proptest::collection::vec(1u64..50_000, 1..50),
        ) {
            let mut a = VirtualQueue::default();
            a.enqueue(start);
            let mut b = a;
            let mut now = 0;
            for s in &steps {
                now += s;
                a.drain(now, rate);
            }
            b.drain(now, rate);
            prop_assert_eq!(a.backlog_bytes, b.backlog_bytes);
            // And it matches the closed form floor(start - now * rate / 8e9).
            let drained = (now as u128 * rate as u128 / 8_000_000_000) as u64;
            prop_assert_eq!(b.backlog_bytes, start.saturating_sub(drained));
        }

        #[test]
        fn red_is_monotone_and_bounded(
            kmin in 0u64..1_000_000,
            span in 1u64..1_000_000,
            pmax in any::<u32>(),
            q1 in 0u64..3_000_000,
            q2 in 0u64..3_000_000,
        ) {
            let cfg = EcnConfig { pmax_fixed: pmax, ..red(kmin, kmin + span, 0.0) };
            let (lo, hi) = if q1 <= q2 { (q1, q2) } else { (q2, q1) };
            let (tl, th) = (mark_threshold(&cfg, lo), mark_threshold(&cfg, hi));
            prop_assert!(tl <= th);
            prop_assert!(th <= 1 << 32);
            if hi <= kmin + span { prop_assert!(th <= fixed_threshold(pmax)); }
        }
    }

    #[test]
    fn constructors_and_validation() {
        let c = EcnConfig::red(5_000_000_000, 5_000, 200_000, fraction_to_fixed(0.01), 0);
        assert_eq!(
            c,
            EcnConfig {
                link_rate_bps: 5_000_000_000,
                ..red(5_000, 200_000, 0.01)
            }
        );
        assert_eq!(c.validate(), Ok(()));
        assert!(EcnConfig::red(0, 1, 2, 0, 0).validate().is_err());
        assert!(EcnConfig::red(1, 3, 2, 0, 0).validate().is_err());
        assert!(EcnConfig::red(1, 3, 4, 0, 2).validate().is_err());
        assert!(EcnConfig::red(1, 3, 4, 0, 1 << 32).validate().is_err());
        assert_eq!(
            EcnConfig::default().validate(),
            Ok(()),
            "off is always valid"
        );
        let s = EcnConfig::step(1_000_000_000, 30_000, 0);
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(mark_threshold(&s, 30_001), 1 << 32);
    }

    #[test]
    fn layouts() {
        use core::mem::offset_of;
        assert_eq!(offset_of!(EcnConfig, link_rate_bps), 8);
        assert_eq!(offset_of!(EcnConfig, pmax_fixed), 40);
        assert_eq!(offset_of!(VirtualQueue, backlog_bytes), 8);
        assert_eq!(offset_of!(VirtualQueue, enqueued_packets), 48);
    }
}
