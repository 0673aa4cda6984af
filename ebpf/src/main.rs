//! xroce's XDP program.
//!
//! Parses Ethernet (+802.1Q/802.1ad) / IPv4 / IPv6 / UDP. Frames to UDP port
//! 4791 (RoCEv2) are checked, counted and redirected into the AF_XDP socket of
//! their RX queue; everything else (ARP, ICMP, the TCP used for connection
//! setup) is passed to the kernel untouched.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::{PerCpuArray, XskMap},
    programs::XdpContext,
};
use xroce_common::{Counter, COUNTER_SLOTS, MAX_QUEUES, ROCEV2_UDP_PORT};

#[map(name = "XROCE_COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::pinned(COUNTER_SLOTS, 0);

#[map(name = "XROCE_XSKS")]
static XSKS: XskMap = XskMap::pinned(MAX_QUEUES, 0);

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_UDP: u8 = 17;
const IPV6_HLEN: usize = 40;
const UDP_HLEN: usize = 8;
/// Smallest RoCEv2 payload: a BTH (12 bytes) and the ICRC (4 bytes).
const MIN_ROCE_PAYLOAD: usize = 12 + 4;

#[xdp(frags)]
pub fn xroce_xdp(ctx: XdpContext) -> u32 {
    count(Counter::Seen);
    let action = match classify(&ctx) {
        Class::Other => xdp_action::XDP_PASS,
        Class::Malformed => {
            count(Counter::Malformed);
            xdp_action::XDP_DROP
        }
        Class::Roce => {
            count(Counter::Roce);
            let queue = ctx.rx_queue_index();
            // A missing socket makes the helper return the low bits of flags:
            // XDP_PASS, so the kernel treats it like any unbound UDP port.
            match XSKS.redirect(queue, xdp_action::XDP_PASS as u64) {
                Ok(action) => {
                    count(Counter::Redirected);
                    action
                }
                Err(_) => {
                    count(Counter::NoSocket);
                    xdp_action::XDP_PASS
                }
            }
        }
    };
    if action == xdp_action::XDP_PASS {
        count(Counter::Passed);
    }
    action
}

enum Class {
    Roce,
    Malformed,
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

#[inline(always)]
fn classify(ctx: &XdpContext) -> Class {
    let Some(mut ethertype) = be16(ctx, 12) else {
        return Class::Other;
    };
    let mut l3 = ETH_HLEN;
    // Up to two VLAN tags (802.1ad outer, 802.1Q inner).
    if ethertype == ETH_P_8021AD || ethertype == ETH_P_8021Q {
        let Some(inner) = be16(ctx, l3 + 2) else {
            return Class::Other;
        };
        ethertype = inner;
        l3 += VLAN_HLEN;
        if ethertype == ETH_P_8021Q {
            let Some(inner) = be16(ctx, l3 + 2) else {
                return Class::Other;
            };
            ethertype = inner;
            l3 += VLAN_HLEN;
        }
    }
    let l4 = match ethertype {
        ETH_P_IPV4 => match ipv4_udp(ctx, l3) {
            Some(l4) => l4,
            None => return Class::Other,
        },
        ETH_P_IPV6 => {
            // Next header must be UDP directly: RoCEv2 uses no extension headers.
            match byte(ctx, l3 + 6) {
                Some(IPPROTO_UDP) => l3 + IPV6_HLEN,
                _ => return Class::Other,
            }
        }
        _ => return Class::Other,
    };
    match be16(ctx, l4 + 2) {
        Some(port) if port == ROCEV2_UDP_PORT => {}
        _ => return Class::Other,
    }
    // From here on it claims to be RoCEv2: anything inconsistent is malformed.
    let Some(udp_len) = be16(ctx, l4 + 4) else {
        return Class::Malformed;
    };
    let udp_len = udp_len as usize;
    if udp_len < UDP_HLEN + MIN_ROCE_PAYLOAD {
        return Class::Malformed;
    }
    // The BTH must be in the linear part of the frame.
    if bytes_at(ctx, l4 + UDP_HLEN, 12).is_none() {
        return Class::Malformed;
    }
    Class::Roce
}

/// Offset of the UDP header if this is an unfragmented IPv4/UDP datagram.
#[inline(always)]
fn ipv4_udp(ctx: &XdpContext, l3: usize) -> Option<usize> {
    let ver_ihl = byte(ctx, l3)?;
    if ver_ihl >> 4 != 4 {
        return None;
    }
    let ihl = ((ver_ihl & 0x0f) as usize) * 4;
    if ihl < 20 || byte(ctx, l3 + 9)? != IPPROTO_UDP {
        return None;
    }
    // Later fragments carry no UDP header; leave reassembly to the kernel.
    let frag = be16(ctx, l3 + 6)?;
    if frag & 0x1fff != 0 || frag & 0x2000 != 0 {
        return None;
    }
    bytes_at(ctx, l3 + ihl, UDP_HLEN)?;
    Some(l3 + ihl)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
