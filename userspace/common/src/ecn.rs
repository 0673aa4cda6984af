//! The XDP congestion point's maths: a virtual bottleneck queue, the marking
//! decision (RED as DCQCN switches run it, or a DCTCP-style step), CE marking
//! with an incremental IPv4 checksum update, and the loss-injection decision.
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
//! # Fixed-point fractions
//!
//! Probabilities and drop fractions are `u32` fixed point scaled by 2^32, so a
//! packet is picked when `bpf_get_prandom_u32() < fraction`. `u32::MAX` is
//! treated as exactly 1.0 ("always"), see [`fixed_threshold`].

/// Value of a fixed-point fraction that means 1.0 (always).
pub const FIXED_ONE: u32 = u32::MAX;

/// The comparison threshold for a fixed-point fraction: a uniformly random
/// `u32` `r` is selected when `(r as u64) < fixed_threshold(f)`. `u32::MAX`
/// maps to 2^32 so that it selects every packet.
#[inline(always)]
pub const fn fixed_threshold(fraction: u32) -> u64 {
    if fraction == FIXED_ONE {
        1 << 32
    } else {
        fraction as u64
    }
}

/// `true` when a random draw `rand` falls under the fixed-point `fraction`.
#[inline(always)]
pub const fn fixed_hit(fraction: u32, rand: u32) -> bool {
    (rand as u64) < fixed_threshold(fraction)
}

/// Converts a fraction in `[0, 1]` to the fixed-point form (userspace only).
/// Values outside the range and NaN are clamped (NaN to 0).
#[cfg(not(target_arch = "bpf"))]
pub fn fraction_to_fixed(fraction: f64) -> u32 {
    if fraction.is_nan() || fraction <= 0.0 {
        0
    } else if fraction >= 1.0 {
        FIXED_ONE
    } else {
        // 2^32 * f rounded to nearest (no `round` in core); values that round
        // to 2^32 - 1 or more mean "always".
        let v = (fraction * 4_294_967_296.0 + 0.5) as u64;
        if v >= FIXED_ONE as u64 {
            FIXED_ONE
        } else {
            v as u32
        }
    }
}

/// Converts a fixed-point fraction back to `f64` (userspace only).
#[cfg(not(target_arch = "bpf"))]
pub fn fixed_to_fraction(fixed: u32) -> f64 {
    fixed_threshold(fixed) as f64 / 4_294_967_296.0
}

// ---------------------------------------------------------------------------
// ECN codepoints (RFC 3168)
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Configuration (pinned map values)
// ---------------------------------------------------------------------------

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

/// Bit positions of [`OpcodeClass`] in [`FaultConfig::opcode_mask`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpcodeClass {
    /// SEND first/middle/last/only, with immediate or invalidate.
    Send = 0,
    /// RDMA WRITE first/middle/last/only, with immediate.
    Write = 1,
    /// RDMA READ request.
    ReadRequest = 2,
    /// RDMA READ response first/middle/last/only.
    ReadResponse = 3,
    /// ACKNOWLEDGE and ATOMIC ACKNOWLEDGE (also NAKs, which are ACKs).
    Ack = 4,
    /// CMP&SWAP and FETCH&ADD requests.
    Atomic = 5,
    /// Congestion Notification Packet (opcode 0x81).
    Cnp = 6,
    /// Anything else (reserved, vendor-specific, ...).
    Other = 7,
}

impl OpcodeClass {
    /// Classifies a BTH opcode. RC, UC, RD and UD share the low five bits
    /// (the operation); the top three bits are the transport.
    #[inline(always)]
    pub const fn of(opcode: u8) -> OpcodeClass {
        if opcode == 0x81 {
            return OpcodeClass::Cnp;
        }
        if opcode >> 5 > 3 {
            return OpcodeClass::Other;
        }
        match opcode & 0x1f {
            0x00..=0x05 | 0x16 | 0x17 => OpcodeClass::Send,
            0x06..=0x0b => OpcodeClass::Write,
            0x0c => OpcodeClass::ReadRequest,
            0x0d..=0x10 => OpcodeClass::ReadResponse,
            0x11 | 0x12 => OpcodeClass::Ack,
            0x13 | 0x14 => OpcodeClass::Atomic,
            _ => OpcodeClass::Other,
        }
    }

    /// This class's bit in [`FaultConfig::opcode_mask`].
    #[inline(always)]
    pub const fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// The mask for a CLI name: "send", "write", "read" (request and
    /// response), "read-request", "read-response", "ack", "atomic", "cnp",
    /// "other". `None` for anything else.
    pub fn mask_from_name(name: &str) -> Option<u32> {
        Some(match name {
            "send" => OpcodeClass::Send.bit(),
            "write" => OpcodeClass::Write.bit(),
            "read" => OpcodeClass::ReadRequest.bit() | OpcodeClass::ReadResponse.bit(),
            "read-request" => OpcodeClass::ReadRequest.bit(),
            "read-response" => OpcodeClass::ReadResponse.bit(),
            "ack" => OpcodeClass::Ack.bit(),
            "atomic" => OpcodeClass::Atomic.bit(),
            "cnp" => OpcodeClass::Cnp.bit(),
            "other" => OpcodeClass::Other.bit(),
            _ => return None,
        })
    }

    /// The names [`OpcodeClass::mask_from_name`] accepts, for error messages.
    pub const NAMES: &'static str =
        "send, write, read, read-request, read-response, ack, atomic, cnp, other";
}

/// [`FaultConfig::qpn`] value meaning "every QP" (QPNs are 24 bits).
pub const ANY_QPN: u32 = u32::MAX;

/// Loss injection settings: value of a one-entry array map.
///
/// Layout (24 bytes, no implicit padding):
/// `enabled u32 | drop_fixed u32 | opcode_mask u32 | qpn u32 | seed u64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultConfig {
    /// 0: off; 1: on.
    pub enabled: u32,
    /// Fraction of matching RoCEv2 frames to drop, fixed point (2^32 = 1).
    pub drop_fixed: u32,
    /// Bit set of [`OpcodeClass::bit`]s that may be dropped; 0 = all classes.
    pub opcode_mask: u32,
    /// Only frames to this destination QPN (BTH DestQP); [`ANY_QPN`] = all.
    pub qpn: u32,
    /// Seed of the drop decisions' pseudo-random sequence; 0 = use the
    /// kernel's `bpf_get_prandom_u32` (not reproducible). See [`FaultRng`].
    pub seed: u64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            enabled: 0,
            drop_fixed: 0,
            opcode_mask: 0,
            qpn: ANY_QPN,
            seed: 0,
        }
    }
}

impl FaultConfig {
    /// Drop `drop_fixed` of the frames in `opcode_mask` (0 = all) to `qpn`
    /// (`None` = all QPs), with `seed` (0 = unseeded).
    pub const fn new(drop_fixed: u32, opcode_mask: u32, qpn: Option<u32>, seed: u64) -> Self {
        FaultConfig {
            enabled: 1,
            drop_fixed,
            opcode_mask,
            qpn: match qpn {
                Some(q) => q & 0x00ff_ffff,
                None => ANY_QPN,
            },
            seed,
        }
    }
}

// Layouts are part of the kernel/user contract.
const _: () = assert!(core::mem::size_of::<EcnConfig>() == 48);
const _: () = assert!(core::mem::align_of::<EcnConfig>() == 8);
const _: () = assert!(core::mem::size_of::<FaultConfig>() == 24);
const _: () = assert!(core::mem::size_of::<FaultRng>() == 16);
const _: () = assert!(core::mem::size_of::<VirtualQueue>() == 56);

// SAFETY: plain #[repr(C)] integers with explicit padding; every bit pattern
// is a valid value.
#[cfg(feature = "user")]
unsafe impl aya::Pod for EcnConfig {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for FaultConfig {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for VirtualQueue {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for FaultRng {}

// ---------------------------------------------------------------------------
// Virtual queue
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Marking decision
// ---------------------------------------------------------------------------

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
    /// Enqueued; set CE ([`ipv4_set_ce`] / [`ipv6_set_ce`]). Also returned
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

// ---------------------------------------------------------------------------
// CE marking
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Loss injection
// ---------------------------------------------------------------------------

/// Whether the fault injector drops a RoCEv2 frame with BTH `opcode` to
/// destination QP `dest_qpn` (24 bits), given a uniformly random `rand`.
#[inline(always)]
pub fn fault_should_drop(cfg: &FaultConfig, opcode: u8, dest_qpn: u32, rand: u32) -> bool {
    if cfg.enabled == 0 || cfg.drop_fixed == 0 {
        return false;
    }
    if cfg.opcode_mask != 0 && cfg.opcode_mask & OpcodeClass::of(opcode).bit() == 0 {
        return false;
    }
    if cfg.qpn != ANY_QPN && cfg.qpn != dest_qpn & 0x00ff_ffff {
        return false;
    }
    fixed_hit(cfg.drop_fixed, rand)
}

/// Per-CPU state of the seeded drop sequence: value of a per-CPU array map.
///
/// When [`FaultConfig::seed`] is non-zero, the XDP side draws its random
/// numbers with [`FaultRng::next`] instead of `bpf_get_prandom_u32`, so a run
/// with the same seed, traffic and CPU placement drops the same frames. The
/// state reseeds itself when the configured seed changes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FaultRng {
    /// The seed the state was derived from (0 = not seeded yet).
    pub seed: u64,
    /// SplitMix64 state.
    pub state: u64,
}

impl FaultRng {
    /// Next pseudo-random `u32` of the sequence for `seed` on CPU `cpu`
    /// (`bpf_get_smp_processor_id()`), reseeding first if `seed` changed.
    #[inline(always)]
    pub fn next(&mut self, seed: u64, cpu: u32) -> u32 {
        if self.seed != seed {
            self.seed = seed;
            self.state = seed ^ ((cpu as u64) << 32 | 0x5eed);
        }
        // SplitMix64 (Steele, Lea, Flood 2014): one add, three xor-shift-multiplies.
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 32) as u32
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

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
    fn fixed_point_conversions() {
        assert_eq!(fraction_to_fixed(0.0), 0);
        assert_eq!(fraction_to_fixed(-1.0), 0);
        assert_eq!(fraction_to_fixed(f64::NAN), 0);
        assert_eq!(fraction_to_fixed(1.0), FIXED_ONE);
        assert_eq!(fraction_to_fixed(0.5), 1 << 31);
        assert_eq!(fraction_to_fixed(0.25), 1 << 30);
        // 0.01 * 2^32 = 42_949_672.96 -> 42_949_673
        assert_eq!(fraction_to_fixed(0.01), 42_949_673);
        assert_eq!(fixed_threshold(FIXED_ONE), 1 << 32);
        assert!(fixed_hit(FIXED_ONE, u32::MAX));
        assert!(!fixed_hit(0, 0));
        assert!(fixed_hit(1 << 31, (1 << 31) - 1));
        assert!(!fixed_hit(1 << 31, 1 << 31));
        assert_eq!(fixed_to_fraction(1 << 30), 0.25);
        assert_eq!(fixed_to_fraction(FIXED_ONE), 1.0);
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

    #[test]
    fn opcode_classes() {
        assert_eq!(OpcodeClass::of(0x04), OpcodeClass::Send); // RC SEND_ONLY
        assert_eq!(OpcodeClass::of(0x64), OpcodeClass::Send); // UD SEND_ONLY
        assert_eq!(OpcodeClass::of(0x17), OpcodeClass::Send); // SEND_ONLY_INV
        assert_eq!(OpcodeClass::of(0x06), OpcodeClass::Write);
        assert_eq!(OpcodeClass::of(0x0b), OpcodeClass::Write);
        assert_eq!(OpcodeClass::of(0x2a), OpcodeClass::Write); // UC WRITE_ONLY
        assert_eq!(OpcodeClass::of(0x0c), OpcodeClass::ReadRequest);
        assert_eq!(OpcodeClass::of(0x10), OpcodeClass::ReadResponse);
        assert_eq!(OpcodeClass::of(0x11), OpcodeClass::Ack);
        assert_eq!(OpcodeClass::of(0x12), OpcodeClass::Ack);
        assert_eq!(OpcodeClass::of(0x14), OpcodeClass::Atomic);
        assert_eq!(OpcodeClass::of(0x81), OpcodeClass::Cnp);
        assert_eq!(OpcodeClass::of(0x15), OpcodeClass::Other);
        assert_eq!(OpcodeClass::of(0xc0), OpcodeClass::Other);
        assert_eq!(OpcodeClass::mask_from_name("read"), Some(0b1100));
        assert_eq!(OpcodeClass::mask_from_name("writes"), None);
    }

    #[test]
    fn fault_filters() {
        let mut cfg = FaultConfig {
            enabled: 1,
            drop_fixed: fraction_to_fixed(0.25),
            ..Default::default()
        };
        assert!(fault_should_drop(&cfg, 0x0a, 7, 0));
        assert!(fault_should_drop(&cfg, 0x0a, 7, (1 << 30) - 1));
        assert!(!fault_should_drop(&cfg, 0x0a, 7, 1 << 30));
        cfg.opcode_mask = OpcodeClass::mask_from_name("write").unwrap();
        assert!(fault_should_drop(&cfg, 0x0a, 7, 0));
        assert!(!fault_should_drop(&cfg, 0x04, 7, 0));
        cfg.qpn = 7;
        assert!(fault_should_drop(&cfg, 0x0a, 7, 0));
        assert!(!fault_should_drop(&cfg, 0x0a, 8, 0));
        // QPN compared on 24 bits.
        assert!(fault_should_drop(&cfg, 0x0a, 0xff00_0007, 0));
        cfg.drop_fixed = FIXED_ONE;
        assert!(fault_should_drop(&cfg, 0x0a, 7, u32::MAX));
        cfg.enabled = 0;
        assert!(!fault_should_drop(&cfg, 0x0a, 7, 0));
    }

    #[test]
    fn seeded_fault_rng_is_reproducible_and_fair() {
        let mut a = FaultRng::default();
        let mut b = FaultRng::default();
        let xs: Vec<u32> = (0..1000).map(|_| a.next(42, 0)).collect();
        let ys: Vec<u32> = (0..1000).map(|_| b.next(42, 0)).collect();
        assert_eq!(xs, ys);
        let mut c = FaultRng::default();
        let zs: Vec<u32> = (0..1000).map(|_| c.next(42, 1)).collect();
        assert_ne!(xs, zs, "CPUs get different sequences");
        // Changing the seed restarts the sequence.
        let first = a.next(7, 0);
        let mut d = FaultRng::default();
        assert_eq!(d.next(7, 0), first);
        // Roughly 1% of 100_000 draws fall under 1%.
        let f = fraction_to_fixed(0.01);
        let mut r = FaultRng::default();
        let hits = (0..100_000).filter(|_| fixed_hit(f, r.next(1, 0))).count();
        assert!((800..1200).contains(&hits), "{hits}");
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
        let f = FaultConfig::new(1, 2, Some(0x0100_0007), 9);
        assert_eq!((f.enabled, f.qpn, f.seed), (1, 7, 9));
        assert_eq!(FaultConfig::new(1, 0, None, 0).qpn, ANY_QPN);
    }

    #[test]
    fn layouts() {
        use core::mem::offset_of;
        assert_eq!(offset_of!(EcnConfig, link_rate_bps), 8);
        assert_eq!(offset_of!(EcnConfig, pmax_fixed), 40);
        assert_eq!(offset_of!(FaultConfig, seed), 16);
        assert_eq!(offset_of!(VirtualQueue, backlog_bytes), 8);
        assert_eq!(offset_of!(VirtualQueue, enqueued_packets), 48);
    }
}
