//! xroce's XDP program.
//!
//! Parses Ethernet (+802.1Q/802.1ad) / IPv4 / IPv6 / UDP. Frames to UDP port
//! 4791 (RoCEv2) are validated (IP header, UDP length, BTH opcode), counted by
//! opcode class and ECN codepoint, optionally filtered by destination QPN, and
//! redirected into the AF_XDP socket of their RX queue, with their arrival
//! time in front of them (`xroce_common::rx_meta`: in the metadata area, or,
//! in `xroce_xdp_head` for kernels that refuse the metadata helper, in
//! front of the frame's own bytes; `xroce_xdp_plain`, for where both are
//! refused, sends them without). Malformed RoCEv2
//! frames are dropped and counted, never passed up. Everything else (ARP,
//! ICMP, the TCP used for connection setup) goes to the kernel untouched.
#![no_std]
#![no_main]

/// The delay bottleneck's TC program (`xroce::bottleneck`), in the same object.
mod bottleneck;

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps,
    helpers::{
        bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_xdp_adjust_head,
        bpf_xdp_adjust_meta, bpf_xdp_get_buff_len,
    },
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use xroce_common::{
    capture::{CaptureMeta, CONFIG_SNAPLEN, MAX_COPY},
    config_flags,
    congestion::{congestion_point, DropReason, EcnConfig, Verdict, VirtualQueue},
    ecn::{ipv4_ce_update, ipv6_ecn, Ecn},
    fault::{fault_should_drop, FaultConfig, FaultRng},
    opcode_class::OpcodeClass,
    opcode_is_known,
    qpn_block::{self, udp_checksum_update},
    rx_meta::{self, RxMeta},
    Counter, RxQueueCounters, CONFIG_SLOTS, COUNTER_SLOTS, MAX_FILTERED_QPNS, MAX_QUEUES,
    ROCEV2_UDP_PORT,
};

// Every map is BTF-defined: libbpf 1.x (libxdp, xdp-loader, bpftool) refuses
// an object with legacy `maps` definitions, and these need no pinning.
#[btf_map(name = "XROCE_COUNTERS")]
static COUNTERS: btf_maps::PerCpuArray<u64, { COUNTER_SLOTS as usize }> =
    btf_maps::PerCpuArray::new();

/// Per RX queue (`xroce stats --interval`): one lookup per frame.
#[btf_map(name = "XROCE_RXQ")]
static RXQ_COUNTERS: btf_maps::PerCpuArray<RxQueueCounters, { MAX_QUEUES as usize }> =
    btf_maps::PerCpuArray::new();

#[btf_map(name = "XROCE_XSKS")]
static XSKS: btf_maps::XskMap<{ MAX_QUEUES as usize }> = btf_maps::XskMap::new();

/// Copies of the frames for `xroce capture` (one perf buffer per CPU).
#[btf_map(name = "XROCE_CAPTURE")]
static CAPTURE: btf_maps::PerfEventArray = btf_maps::PerfEventArray::new();

#[btf_map(name = "XROCE_CONFIG")]
static CONFIG: btf_maps::Array<u32, { CONFIG_SLOTS as usize }> = btf_maps::Array::new();

/// Destination QPNs the local stack owns (value unused).
#[btf_map(name = "XROCE_QPNS")]
static QPNS: btf_maps::HashMap<u32, u8, { MAX_FILTERED_QPNS as usize }> = btf_maps::HashMap::new();

// The congestion point and loss injection. BTF maps: the queue's value holds
// a bpf_spin_lock, which the kernel only accepts in a BTF-described map.
#[btf_map(name = "XROCE_ECN_CFG")]
static ECN_CONFIG: btf_maps::Array<EcnConfig, 1> = btf_maps::Array::new();

#[btf_map(name = "XROCE_ECN_Q")]
static ECN_QUEUE: btf_maps::Array<VirtualQueue, 1> = btf_maps::Array::new();

#[btf_map(name = "XROCE_FAULT")]
static FAULT_CONFIG: btf_maps::Array<FaultConfig, 1> = btf_maps::Array::new();

#[btf_map(name = "XROCE_FAULT_RNG")]
static FAULT_RNG: btf_maps::PerCpuArray<FaultRng, 1> = btf_maps::PerCpuArray::new();

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_UDP: u8 = 17;
const IPV6_HLEN: usize = 40;
const UDP_HLEN: usize = 8;
const BTH_LEN: usize = 12;
const ICRC_LEN: usize = 4;
const OPCODE_ACK: u8 = 0x11;

/// The program: frames to an AF_XDP socket carry their arrival time in
/// their XDP metadata area.
#[xdp(frags)]
pub fn xroce_xdp(ctx: XdpContext) -> u32 {
    handle(ctx, Arrival::Metadata)
}

/// The same program for kernels whose verifier refuses
/// `bpf_xdp_adjust_meta` to XDP programs (some builds do): the arrival
/// time goes in front of the frame's own bytes instead, and the AF_XDP
/// side, told which program runs, takes it off there.
#[xdp(frags)]
pub fn xroce_xdp_head(ctx: XdpContext) -> u32 {
    handle(ctx, Arrival::Head)
}

/// The same program without arrival times, for where the kernel refuses
/// both of the above: as a component of libxdp's dispatcher, kernels from
/// 6.12 on refuse an extension program that moves packet data when the
/// dispatcher's slot does not.
#[xdp(frags)]
pub fn xroce_xdp_plain(ctx: XdpContext) -> u32 {
    handle(ctx, Arrival::Unstamped)
}

/// Where a frame redirected to AF_XDP carries its arrival time; a constant
/// in each entry point, so none has another's helper call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arrival {
    /// In the metadata area (`bpf_xdp_adjust_meta`).
    Metadata,
    /// In [`rx_meta::LEN`] bytes the frame grows at its head
    /// (`bpf_xdp_adjust_head`).
    Head,
    /// Nowhere.
    Unstamped,
}

#[inline(always)]
fn handle(ctx: XdpContext, arrival: Arrival) -> u32 {
    count(Counter::Seen);
    let rxq = RXQ_COUNTERS.get_ptr_mut(ctx.rx_queue_index());
    if let Some(q) = rxq {
        // SAFETY: per-CPU slot, XDP runs with preemption off; the helper
        // gives the whole frame's length, fragments included.
        unsafe {
            (*q).frames += 1;
            (*q).bytes += bpf_xdp_get_buff_len(ctx.ctx);
        }
    }
    let action = match classify(&ctx) {
        Class::Other => xdp_action::XDP_PASS,
        Class::Drop(reason) => {
            copy_to_capture(&ctx);
            count(reason);
            if reason.is_malformed() {
                count(Counter::Malformed);
            }
            xdp_action::XDP_DROP
        }
        Class::Roce { block, dport_at } => {
            count(Counter::Roce);
            // As it arrived: before steer rewrites the port or redirects.
            copy_to_capture(&ctx);
            steer(&ctx, block, dport_at, arrival)
        }
    };
    if action == xdp_action::XDP_PASS {
        count(Counter::Passed);
    }
    if let Some(q) = rxq {
        // SAFETY: as above.
        unsafe {
            match action {
                xdp_action::XDP_REDIRECT => (*q).redirected += 1,
                xdp_action::XDP_PASS => (*q).passed += 1,
                _ => {}
            }
        }
    }
    action
}

enum Class {
    /// A RoCEv2 frame for QPN block `block` (qpn_block) whose UDP
    /// destination port is at `dport_at`.
    Roce {
        block: u32,
        dport_at: usize,
    },
    Drop(Counter),
    Other,
}

#[inline(always)]
fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // Per-CPU slot: no other CPU writes it, a plain add is enough.
        unsafe { *slot += 1 };
    }
}

/// Pointer to `len` bytes at `offset`, or None if the frame is shorter.
#[inline(always)]
fn bytes_at(ctx: &XdpContext, offset: usize, len: usize) -> Option<*const u8> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + len > end {
        return None;
    }
    Some((start + offset) as *const u8)
}

#[inline(always)]
fn be16(ctx: &XdpContext, offset: usize) -> Option<u16> {
    let p = bytes_at(ctx, offset, 2)?;
    Some(unsafe { u16::from_be_bytes([*p, *p.add(1)]) })
}

#[inline(always)]
fn byte(ctx: &XdpContext, offset: usize) -> Option<u8> {
    let p = bytes_at(ctx, offset, 1)?;
    Some(unsafe { *p })
}

/// What the IP header says about the datagram that follows it.
struct IpInfo {
    /// Bytes after the IP header according to the IP header.
    ip_payload: usize,
    ecn: Ecn,
    /// The IP header's lengths disagree with each other.
    inconsistent: bool,
}

// Offsets are compile-time constants on every path (one copy of the parser
// per VLAN depth and IP version): the verifier cannot follow a bounds check
// on a variable packet offset once LLVM re-associates it. RoCEv2 never uses
// IPv4 options, so an IHL other than 5 goes to the kernel.
#[inline(always)]
fn classify(ctx: &XdpContext) -> Class {
    let Some(ethertype) = be16(ctx, 12) else {
        return Class::Other;
    };
    match ethertype {
        ETH_P_IPV4 => ipv4::<14>(ctx).map_or(Class::Other, |l3| roce::<14, 34, false>(ctx, l3)),
        ETH_P_IPV6 => ipv6::<14>(ctx).map_or(Class::Other, |l3| roce::<14, 54, true>(ctx, l3)),
        ETH_P_8021Q | ETH_P_8021AD => match be16(ctx, ETH_HLEN + 2) {
            Some(ETH_P_IPV4) => {
                ipv4::<18>(ctx).map_or(Class::Other, |l3| roce::<18, 38, false>(ctx, l3))
            }
            Some(ETH_P_IPV6) => {
                ipv6::<18>(ctx).map_or(Class::Other, |l3| roce::<18, 58, true>(ctx, l3))
            }
            Some(ETH_P_8021Q) => match be16(ctx, ETH_HLEN + VLAN_HLEN + 2) {
                Some(ETH_P_IPV4) => {
                    ipv4::<22>(ctx).map_or(Class::Other, |l3| roce::<22, 42, false>(ctx, l3))
                }
                Some(ETH_P_IPV6) => {
                    ipv6::<22>(ctx).map_or(Class::Other, |l3| roce::<22, 62, true>(ctx, l3))
                }
                _ => Class::Other,
            },
            _ => Class::Other,
        },
        _ => Class::Other,
    }
}

/// Classifies a UDP datagram whose header is at `L4` behind an IP header at
/// `L3` (IPv6 if `V6`), and runs RoCEv2 frames through loss injection and
/// the congestion point.
#[inline(always)]
fn roce<const L3: usize, const L4: usize, const V6: bool>(ctx: &XdpContext, l3: IpInfo) -> Class {
    match be16(ctx, L4 + 2) {
        Some(ROCEV2_UDP_PORT) => {}
        _ => return Class::Other,
    }
    // From here on the frame claims to be RoCEv2: anything inconsistent is
    // dropped and counted by reason.
    if l3.inconsistent {
        return Class::Drop(Counter::DropBadIp);
    }
    let Some(udp_len) = be16(ctx, L4 + 4) else {
        return Class::Drop(Counter::DropTruncated);
    };
    let udp_len = udp_len as usize;
    if udp_len < UDP_HLEN + BTH_LEN + ICRC_LEN || udp_len > l3.ip_payload {
        return Class::Drop(Counter::DropBadUdpLength);
    }
    let bth = L4 + UDP_HLEN;
    // The BTH must be in the linear part of the frame.
    let Some(p) = bytes_at(ctx, bth, BTH_LEN) else {
        return Class::Drop(Counter::DropTruncated);
    };
    // SAFETY: bytes_at checked that BTH_LEN bytes are there.
    let (opcode, qpn) = unsafe { (*p, [*p.add(5), *p.add(6), *p.add(7)]) };
    if !opcode_is_known(opcode) {
        return Class::Drop(Counter::DropBadOpcode);
    }
    let dest_qpn = u32::from_be_bytes([0, qpn[0], qpn[1], qpn[2]]);
    if qpn_filter_on() && unsafe { QPNS.get(&dest_qpn) }.is_none() {
        return Class::Drop(Counter::DropUnknownQpn);
    }
    if fault_injected(opcode, dest_qpn) {
        return Class::Drop(Counter::DropFault);
    }
    match congestion(l3.ecn, (L4 + udp_len) as u64) {
        Verdict::Pass => {}
        Verdict::Mark => {
            if mark_ce::<L3, V6>(ctx) {
                count(Counter::EcnMarked);
            }
        }
        Verdict::Drop(DropReason::TailDrop) => return Class::Drop(Counter::DropTail),
        Verdict::Drop(DropReason::NotEct) => return Class::Drop(Counter::DropCongestion),
    }
    // AETH syndrome (first byte after the BTH), for telling NAKs from ACKs.
    count_class(opcode, byte(ctx, bth + BTH_LEN));
    // The codepoint as the frame arrived, before any marking here.
    count(match l3.ecn {
        Ecn::NotEct => Counter::EcnNotEct,
        Ecn::Ect1 => Counter::EcnEct1,
        Ecn::Ect0 => Counter::EcnEct0,
        Ecn::Ce => Counter::EcnCe,
    });
    Class::Roce {
        block: qpn_block::of_qpn(dest_qpn),
        dport_at: L4 + 2,
    }
}

/// While a capture runs, copies the frame (up to its snap length) after a
/// [`CaptureMeta`] into this CPU's perf buffer. A full buffer loses the
/// copy (the reader learns how many), never the frame.
#[inline(always)]
fn copy_to_capture(ctx: &XdpContext) {
    let snaplen = CONFIG.get(CONFIG_SNAPLEN).copied().unwrap_or(0);
    if snaplen == 0 {
        return;
    }
    // SAFETY: the helpers read the context the kernel passed us.
    let (frame_len, ts_ns) = unsafe { (bpf_xdp_get_buff_len(ctx.ctx) as u32, bpf_ktime_get_ns()) };
    let meta = CaptureMeta {
        ts_ns,
        frame_len,
        rx_queue: ctx.rx_queue_index(),
    };
    let copy = frame_len.min(snaplen).min(MAX_COPY);
    // The upper 32 bits of the flags ask bpf_xdp_output for `copy` bytes of
    // the frame after `meta`.
    CAPTURE.output(ctx, &meta, copy);
}

/// Hands a RoCEv2 frame for QPN block `block` to the process holding it:
/// the AF_XDP socket of this RX queue when the AF_XDP owner holds the block
/// (one of its blocks, with several I/O threads),
/// otherwise the kernel's UDP stack, on the block's own port.
#[inline(always)]
fn steer(ctx: &XdpContext, block: u32, dport_at: usize, arrival: Arrival) -> u32 {
    let queue = ctx.rx_queue_index();
    let xsk_block = CONFIG
        .get(qpn_block::CONFIG_XSK_BLOCK)
        .copied()
        .unwrap_or(0);
    // Several I/O threads of one device hold consecutive blocks; a thread's
    // sockets take what arrives on its queues, the others' frames included
    // (it hands those over): the socket must be this queue's.
    let xsk_blocks = CONFIG
        .get(qpn_block::CONFIG_XSK_BLOCKS)
        .copied()
        .unwrap_or(0)
        .max(1);
    if block.wrapping_sub(xsk_block) < xsk_blocks && XSKS.get(queue).is_some() {
        // The arrival time goes with the frame to the socket; a frame that
        // cannot carry it goes all the same, without.
        let stamped = stamp_arrival(ctx, arrival);
        // The socket can still go away between the lookup and here: then
        // the helper returns the low bits of flags, XDP_PASS.
        return match XSKS.redirect(queue, xdp_action::XDP_PASS as u64) {
            Ok(action) => {
                count(Counter::Redirected);
                action
            }
            Err(_) => {
                if stamped {
                    // The kernel's stack gets the frame as it came.
                    unstamp(ctx, arrival);
                }
                count(Counter::NoSocket);
                xdp_action::XDP_PASS
            }
        };
    }
    if block != 0 {
        if !set_dport(ctx, dport_at, qpn_block::udp_port(block)) {
            return xdp_action::XDP_DROP;
        }
        count(Counter::ToBlockPort);
    } else {
        count(Counter::NoSocket);
    }
    xdp_action::XDP_PASS
}

/// Puts an [`RxMeta`] with the time now (bpf_ktime_get_ns: CLOCK_MONOTONIC)
/// in front of the frame: in its XDP metadata area, which the kernel copies
/// into the AF_XDP socket's UMEM right in front of the frame's data, or
/// (`Arrival::Head`) in bytes the frame grows at its head. False if there
/// is no room (no metadata support or headroom): the frame then goes
/// without. Invalidates every packet pointer.
#[inline(always)]
fn stamp_arrival(ctx: &XdpContext, arrival: Arrival) -> bool {
    let len = rx_meta::LEN as i32;
    // SAFETY: each helper moves data_meta or data within the frame's
    // headroom, or fails and changes nothing.
    let at = match arrival {
        Arrival::Unstamped => return false,
        Arrival::Metadata => {
            if unsafe { bpf_xdp_adjust_meta(ctx.ctx, -len) } != 0 {
                return false;
            }
            ctx.metadata()
        }
        Arrival::Head => {
            if unsafe { bpf_xdp_adjust_head(ctx.ctx, -len) } != 0 {
                return false;
            }
            ctx.data()
        }
    };
    // Re-read after the helper: it moved the pointers, and the verifier
    // wants the bytes bounded before they are written.
    let end = match arrival {
        Arrival::Metadata => ctx.data(),
        Arrival::Head | Arrival::Unstamped => ctx.data_end(),
    };
    if at + rx_meta::LEN > end {
        unstamp(ctx, arrival);
        return false;
    }
    // SAFETY: the check above proved LEN writable bytes at `at` (the
    // metadata area or the packet, both of which XDP may write); it may be
    // unaligned.
    unsafe {
        core::ptr::write_unaligned(at as *mut RxMeta, RxMeta::new(bpf_ktime_get_ns()));
    }
    true
}

/// Gives back the room [`stamp_arrival`] took.
#[inline(always)]
fn unstamp(ctx: &XdpContext, arrival: Arrival) {
    let len = rx_meta::LEN as i32;
    // SAFETY: undoes a move of the same helper by the same length.
    unsafe {
        match arrival {
            Arrival::Metadata => bpf_xdp_adjust_meta(ctx.ctx, len),
            Arrival::Head => bpf_xdp_adjust_head(ctx.ctx, len),
            Arrival::Unstamped => 0,
        };
    }
}

/// Rewrites the UDP destination port at `at` to `port`, keeping a non-zero
/// checksum right (RFC 1624 incremental update; 0 means none over IPv4).
#[inline(always)]
fn set_dport(ctx: &XdpContext, at: usize, port: u16) -> bool {
    let Some(p) = bytes_at(ctx, at, 6) else {
        return false;
    };
    let p = p as *mut u8;
    // SAFETY: bytes_at checked the 6 bytes (port, length, checksum); XDP
    // may write the packet.
    unsafe {
        let old = u16::from_be_bytes([*p, *p.add(1)]);
        let check = u16::from_be_bytes([*p.add(4), *p.add(5)]);
        let [hi, lo] = port.to_be_bytes();
        *p = hi;
        *p.add(1) = lo;
        if check != 0 {
            let c = udp_checksum_update(check, old, port).to_be_bytes();
            *p.add(4) = c[0];
            *p.add(5) = c[1];
        }
    }
    true
}

/// Loss injection (`xroce fault`): seeded per CPU when a seed is set.
#[inline(always)]
fn fault_injected(opcode: u8, dest_qpn: u32) -> bool {
    let Some(cfg) = FAULT_CONFIG.get(0) else {
        return false;
    };
    if cfg.enabled == 0 {
        return false;
    }
    let rand = if cfg.seed != 0 {
        match FAULT_RNG.get_ptr_mut(0) {
            // SAFETY: per-CPU value; XDP runs with preemption off.
            Some(rng) => unsafe { (*rng).next(cfg.seed, bpf_get_smp_processor_id()) },
            None => return false,
        }
    } else {
        // SAFETY: plain helper call.
        unsafe { bpf_get_prandom_u32() }
    };
    fault_should_drop(cfg, opcode, dest_qpn, rand)
}

/// The virtual bottleneck (`xroce ecn`), shared by every CPU under its lock.
#[inline(always)]
fn congestion(ecn: Ecn, frame_bytes: u64) -> Verdict {
    let (Some(cfg), Some(queue)) = (ECN_CONFIG.get(0), ECN_QUEUE.get_ptr_mut(0)) else {
        return Verdict::Pass;
    };
    if cfg.enabled == 0 {
        return Verdict::Pass;
    }
    // Helpers other than the lock ones may not run while it is held.
    // SAFETY: plain helper calls.
    let (rand, now) = unsafe { (bpf_get_prandom_u32(), bpf_ktime_get_ns()) };
    // SAFETY: the map value lives as long as the program; the lock makes the
    // read-modify-write of the queue exclusive across CPUs.
    unsafe {
        let lock = core::ptr::addr_of_mut!((*queue).lock).cast();
        aya_ebpf::helpers::bpf_spin_lock(lock);
        let verdict = congestion_point(&mut *queue, cfg, now, frame_bytes, ecn, rand);
        aya_ebpf::helpers::bpf_spin_unlock(lock);
        verdict
    }
}

/// Sets CE in the IP header at `L3`; false if the frame is not ECN-capable.
#[inline(always)]
fn mark_ce<const L3: usize, const V6: bool>(ctx: &XdpContext) -> bool {
    let Some(p) = bytes_at(ctx, L3, 12) else {
        return false;
    };
    let p = p as *mut u8;
    // SAFETY: bytes_at checked the 12 bytes; XDP may write the packet.
    unsafe {
        if V6 {
            // The traffic class's ECN bits are bits 5:4 of byte 1; IPv6 has
            // no header checksum to fix.
            match ipv6_ecn(*p.add(1)) {
                Ecn::Ect0 | Ecn::Ect1 => {
                    *p.add(1) |= 0b11 << 4;
                    true
                }
                Ecn::NotEct | Ecn::Ce => false,
            }
        } else {
            let word0 = u16::from_be_bytes([*p, *p.add(1)]);
            let check = u16::from_be_bytes([*p.add(10), *p.add(11)]);
            match ipv4_ce_update(word0, check) {
                Some((new, check)) => {
                    let (w, c) = (new.to_be_bytes(), check.to_be_bytes());
                    *p.add(1) = w[1];
                    *p.add(10) = c[0];
                    *p.add(11) = c[1];
                    true
                }
                None => false,
            }
        }
    }
}

#[inline(always)]
fn qpn_filter_on() -> bool {
    match CONFIG.get(0) {
        Some(flags) => *flags & config_flags::QPN_FILTER != 0,
        None => false,
    }
}

#[inline(always)]
fn count_class(opcode: u8, syndrome: Option<u8>) {
    let counter = match OpcodeClass::of(opcode) {
        OpcodeClass::Send => Counter::OpSend,
        OpcodeClass::Write => Counter::OpWrite,
        OpcodeClass::ReadRequest => Counter::OpReadRequest,
        OpcodeClass::ReadResponse => Counter::OpReadResponse,
        OpcodeClass::Atomic => Counter::OpAtomic,
        OpcodeClass::Cnp => Counter::OpCnp,
        OpcodeClass::Ack => {
            // AETH syndrome bits 7:5: 000 ACK, 001 RNR NAK, 011 NAK.
            match syndrome {
                Some(syndrome) if opcode & 0x1f == OPCODE_ACK && syndrome >> 5 != 0 => {
                    Counter::OpNak
                }
                _ => Counter::OpAck,
            }
        }
        OpcodeClass::Other => return,
    };
    count(counter);
}

/// An unfragmented IPv4/UDP datagram with a 20-byte header at `L3`.
#[inline(always)]
fn ipv4<const L3: usize>(ctx: &XdpContext) -> Option<IpInfo> {
    let p = bytes_at(ctx, L3, 20)?;
    // SAFETY: bytes_at checked that the 20-byte header is there.
    let (ver_ihl, tos, total, frag, proto) = unsafe {
        (
            *p,
            *p.add(1),
            u16::from_be_bytes([*p.add(2), *p.add(3)]) as usize,
            u16::from_be_bytes([*p.add(6), *p.add(7)]),
            *p.add(9),
        )
    };
    // Fragments: leave reassembly to the kernel (RoCEv2 sets DF).
    if proto != IPPROTO_UDP || ver_ihl != 0x45 || frag & 0x3fff != 0 {
        return None;
    }
    // The total length must cover the UDP header and end within the frame
    // (Ethernet padding may follow it); a frame shorter than its IP header
    // claims would hand the transport bytes that were never received.
    let inconsistent = total < 20 + UDP_HLEN || L3 + total > frame_len(ctx);
    Some(IpInfo {
        ip_payload: if inconsistent { 0 } else { total - 20 },
        ecn: Ecn::from_bits(tos),
        inconsistent,
    })
}

/// An IPv6 packet at `L3` whose next header is UDP (RoCEv2 uses no
/// extension headers).
#[inline(always)]
fn ipv6<const L3: usize>(ctx: &XdpContext) -> Option<IpInfo> {
    let p = bytes_at(ctx, L3, IPV6_HLEN)?;
    // SAFETY: bytes_at checked that the 40-byte header is there.
    let (b0, b1, payload, next) = unsafe {
        (
            *p,
            *p.add(1),
            u16::from_be_bytes([*p.add(4), *p.add(5)]) as usize,
            *p.add(6),
        )
    };
    if next != IPPROTO_UDP || b0 >> 4 != 6 {
        return None;
    }
    // Traffic class straddles bytes 0 and 1; ECN is its low two bits.
    let tclass = ((b0 & 0x0f) << 4) | (b1 >> 4);
    Some(IpInfo {
        ip_payload: payload,
        ecn: Ecn::from_bits(tclass),
        inconsistent: payload < UDP_HLEN || L3 + IPV6_HLEN + payload > frame_len(ctx),
    })
}

/// The whole frame's length, fragments (multi-buffer XDP) included.
#[inline(always)]
fn frame_len(ctx: &XdpContext) -> usize {
    // SAFETY: the helper only reads the xdp_buff the kernel handed us.
    unsafe { bpf_xdp_get_buff_len(ctx.ctx) as usize }
}

/// The program's license as the kernel reads it: it lets only
/// GPL-compatible programs call bpf_perf_event_output (the capture's
/// copies, `copy_to_capture`), so the XDP object is offered under MIT or
/// GPL, as aya-template's are. Without it libbpf (libxdp's loads) declares
/// none and the verifier refuses the call; aya's loader said GPL for us.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
