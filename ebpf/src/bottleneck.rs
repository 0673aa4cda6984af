//! The delay bottleneck's TC egress program: it runs every packet through
//! the departure clock of a FIFO link at the configured rate
//! (xroce_common::bottleneck) that mirrors the `tbf` qdisc holding the
//! packets on the same port, and marks (CE) or drops RoCEv2 packets by the
//! same policy as the XDP congestion point on the bytes the clock says are
//! queued; any packet is dropped when the buffer is full.
//!
//! Loaded from the same object as the XDP program (userspace's
//! xroce::bottleneck), with maps of its own.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    btf_maps,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{btf_map, classifier},
    programs::TcContext,
};
use xroce_common::{
    bottleneck::{delay_point, DelayQueue},
    congestion::{EcnConfig, Verdict},
    ecn::Ecn,
    ROCEV2_UDP_PORT,
};

#[btf_map(name = "XROCE_BN_CFG")]
static BN_CONFIG: btf_maps::Array<EcnConfig, 1> = btf_maps::Array::new();

#[btf_map(name = "XROCE_BN_Q")]
static BN_QUEUE: btf_maps::Array<DelayQueue, 1> = btf_maps::Array::new();

const ETH_HLEN: usize = 14;
const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_UDP: u8 = 17;
/// bpf_l3_csum_replace's flag: the changed field is 2 bytes.
const CSUM_2_BYTES: u64 = 2;

/// Where the IP header is and what it says, for RoCEv2 packets only.
#[derive(Clone, Copy)]
enum Roce {
    No,
    V4(Ecn),
    V6(Ecn),
}

#[classifier]
pub fn xroce_bneck(ctx: TcContext) -> i32 {
    let (Some(cfg), Some(queue)) = (BN_CONFIG.get(0), BN_QUEUE.get_ptr_mut(0)) else {
        return TC_ACT_OK as i32;
    };
    if cfg.enabled == 0 {
        return TC_ACT_OK as i32;
    }
    let roce = classify(&ctx);
    let ecn = match roce {
        Roce::No => None,
        Roce::V4(e) | Roce::V6(e) => Some(e),
    };
    // At egress skb->len is the whole frame from the Ethernet header on.
    let frame_bytes = ctx.len() as u64;
    // SAFETY: plain helper calls, made before the lock is taken.
    let (rand, now) = unsafe { (bpf_get_prandom_u32(), bpf_ktime_get_ns()) };
    // SAFETY: the map value lives as long as the program; the lock makes the
    // read-modify-write of the clock exclusive across CPUs.
    let departure = unsafe {
        let lock = core::ptr::addr_of_mut!((*queue).lock).cast();
        aya_ebpf::helpers::bpf_spin_lock(lock);
        let d = delay_point(&mut *queue, cfg, now, frame_bytes, ecn, rand);
        aya_ebpf::helpers::bpf_spin_unlock(lock);
        d
    };
    // tbf, not the packet's timestamp, holds it: no departure time is set
    // (a qdisc that honours one, fq, is not in the kernels here).
    match departure.verdict {
        Verdict::Drop(_) => TC_ACT_SHOT as i32,
        Verdict::Mark => {
            mark_ce(&ctx, roce);
            TC_ACT_OK as i32
        }
        Verdict::Pass => TC_ACT_OK as i32,
    }
}

/// RoCEv2 over IPv4 (no options) or IPv6 (no extension headers) right
/// after an untagged Ethernet header, with its ECN field.
#[inline(always)]
fn classify(ctx: &TcContext) -> Roce {
    let Ok(ethertype) = ctx.load::<u16>(12) else {
        return Roce::No;
    };
    match u16::from_be(ethertype) {
        ETH_P_IPV4 => {
            let (Ok(ver_ihl), Ok(tos), Ok(proto), Ok(dport)) = (
                ctx.load::<u8>(ETH_HLEN),
                ctx.load::<u8>(ETH_HLEN + 1),
                ctx.load::<u8>(ETH_HLEN + 9),
                ctx.load::<u16>(ETH_HLEN + 20 + 2),
            ) else {
                return Roce::No;
            };
            if ver_ihl == 0x45 && proto == IPPROTO_UDP && u16::from_be(dport) == ROCEV2_UDP_PORT {
                Roce::V4(Ecn::from_bits(tos))
            } else {
                Roce::No
            }
        }
        ETH_P_IPV6 => {
            let (Ok(b0), Ok(b1), Ok(next), Ok(dport)) = (
                ctx.load::<u8>(ETH_HLEN),
                ctx.load::<u8>(ETH_HLEN + 1),
                ctx.load::<u8>(ETH_HLEN + 6),
                ctx.load::<u16>(ETH_HLEN + 40 + 2),
            ) else {
                return Roce::No;
            };
            if b0 >> 4 == 6 && next == IPPROTO_UDP && u16::from_be(dport) == ROCEV2_UDP_PORT {
                let tclass = ((b0 & 0x0f) << 4) | (b1 >> 4);
                Roce::V6(Ecn::from_bits(tclass))
            } else {
                Roce::No
            }
        }
        _ => Roce::No,
    }
}

/// Sets CE (the verdict says the packet is ECN-capable), fixing the IPv4
/// header checksum; IPv6 has none.
#[inline(always)]
fn mark_ce(ctx: &TcContext, roce: Roce) {
    match roce {
        Roce::V4(_) => {
            let Ok(word0) = ctx.load::<u16>(ETH_HLEN) else {
                return;
            };
            let new = u16::from_be(word0) | 0b11;
            let new_be = new.to_be();
            if ctx
                .l3_csum_replace(ETH_HLEN + 10, word0 as u64, new_be as u64, CSUM_2_BYTES)
                .is_ok()
            {
                let _ = ctx.store(ETH_HLEN, &new_be, 0);
            }
        }
        Roce::V6(_) => {
            if let Ok(b1) = ctx.load::<u8>(ETH_HLEN + 1) {
                let _ = ctx.store(ETH_HLEN + 1, &(b1 | (0b11 << 4)), 0);
            }
        }
        Roce::No => {}
    }
}
