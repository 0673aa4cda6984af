//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`,
//! `ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`,
//! `ibv_resolve_eth_l2_from_gid`) and the addressing both they and
//! `ibv_modify_qp` use: the GID table and the way from an `ibv_ah_attr` to
//! the engine's [`AddressVector`] (next-hop MAC, peer IP address, DSCP).
//!
//! The GID table is rxe's: index 0 the fe80 link-local GID derived from
//! the MAC, index 1 the interface's IPv4 address mapped into IPv6
//! (`::ffff:a.b.c.d`), then the interface's other IPv6 addresses, all
//! RoCE v2. An IPv4-mapped destination GID means RoCEv2 over IPv4, any
//! other RoCEv2 over IPv6.

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use xroce::io::wire::ipv4::Ipv4Packet;
use xroce::io::wire::ipv6::NEXT_HEADER_UDP;
use xroce::verbs::AddressVector;

use crate::abi::*;
use crate::base::errno::{fail, ffi, ffi_int, ffi_ptr, set_errno};
use crate::objects::context::context;
use crate::objects::device::OpenDevice;
use crate::objects::{outer, Ah, Pd};

/// The IPv4-mapped GID: what `-g 1` / `-x 1` names.
pub(crate) const GID_INDEX_IPV4: u32 = 1;
/// How long MAC resolution may take (rdma-core waits as long for the
/// kernel's neighbour table).
pub(crate) const NEIGH_TIMEOUT: Duration = Duration::from_secs(3);
/// The VLAN id rdma-core reports for an interface without a VLAN.
const NO_VLAN: u16 = 0xffff;

/// `::ffff:a.b.c.d`.
pub(crate) fn ipv4_mapped(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// The IPv4 address of an IPv4-mapped GID.
pub(crate) fn mapped_ipv4(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    Ipv6Addr::from(*gid).to_ipv4_mapped()
}

/// The index of `gid` in a GID table ([`crate::objects::device::gid_table`]; every
/// entry is RoCE v2).
pub(crate) fn gid_index_of(gids: &[[u8; 16]], gid: &[u8; 16]) -> Option<u32> {
    gids.iter().position(|g| g == gid).map(|i| i as u32)
}

fn gid_bytes(g: &ibv_gid) -> [u8; 16] {
    // SAFETY: both members of the union are plain bytes of the same size.
    unsafe { g.raw }
}

/// The peer's IP address named by an `ibv_ah_attr`, checked as a RoCE
/// provider checks it: a GRH is required and its source GID index must
/// name an entry of the table (`gids` entries populated). An IPv4-mapped
/// destination GID is an IPv4 peer, any other an IPv6 one. `what` names
/// the verb in the XROCE_VERBS_DEBUG explanation.
pub(crate) fn grh_target(a: &ibv_ah_attr, gids: usize, what: &str) -> Result<IpAddr, i32> {
    if a.is_global == 0 {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "{what}: RoCE needs a GRH: set ah_attr.is_global = 1 and grh.dgid (e.g. ibv_rc_pingpong -g 1)"
            ),
        ));
    }
    if usize::from(a.grh.sgid_index) >= gids {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "{what}: sgid_index {} names no GID (the table holds {gids}; {GID_INDEX_IPV4} is the IPv4 one)",
                a.grh.sgid_index
            ),
        ));
    }
    Ok(peer_ip(&gid_bytes(&a.grh.dgid)))
}

/// The IP address a destination GID names: IPv4 if it is IPv4-mapped.
fn peer_ip(dgid: &[u8; 16]) -> IpAddr {
    match mapped_ipv4(dgid) {
        Some(ip) => IpAddr::V4(ip),
        None => IpAddr::V6(Ipv6Addr::from(*dgid)),
    }
}

/// The next-hop MAC for `ip`: our own for our own address (the runtime
/// loops those frames back), else the neighbour table's (ARP / NDP).
pub(crate) fn dest_mac(dev: &OpenDevice, ip: IpAddr) -> Result<[u8; 6], i32> {
    dev.stack
        .neighbour(ip, NEIGH_TIMEOUT)
        .map_err(|e| fail(libc::EHOSTUNREACH, format_args!("no MAC for {ip}: {e}")))
}

/// The engine's address vector for an `ibv_ah_attr` (resolves the MAC).
pub(crate) fn av_from_ah_attr(
    dev: &OpenDevice,
    a: &ibv_ah_attr,
    what: &str,
) -> Result<AddressVector, i32> {
    let dest_ip = grh_target(a, dev.gids.len(), what)?;
    Ok(AddressVector {
        dest_mac: dest_mac(dev, dest_ip)?,
        dest_ip,
        dscp: a.grh.traffic_class >> 2,
        udp_sport: None,
    })
}

fn next_handle() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> Result<*mut ibv_ah, i32> {
    // SAFETY: the program passes a live PD of ours.
    let p = unsafe { outer::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
    // SAFETY: the program passes a valid ibv_ah_attr (or NULL).
    let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
    // SAFETY: a PD's context is the open context it was allocated on.
    let c = unsafe { context(p.pd.context) }.ok_or(libc::EINVAL)?;
    if a.port_num != 1 {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "ibv_create_ah: port_num {} (the device has port 1)",
                a.port_num
            ),
        ));
    }
    let av = av_from_ah_attr(&c.dev, a, "ibv_create_ah")?;
    let ah = Box::leak(Box::new(Ah {
        ah: ibv_ah {
            context: p.pd.context,
            pd,
            handle: next_handle(),
        },
        av,
        attr: *a,
    }));
    crate::base::handles::born(&*ah as *const crate::objects::Ah);
    crate::base::handles::born(&*ah as *const crate::objects::Ah);
    Ok(&mut ah.ah as *mut ibv_ah)
}

/// `ibv_create_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ffi_ptr(|| create_ah(pd, attr))
}

/// `ibv_destroy_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    ffi_int(|| {
        // SAFETY: an AH this library created, destroyed once.
        let a = unsafe { outer::<_, Ah>(ah) }.ok_or(libc::EINVAL)?;
        // SAFETY: as above; the Box was leaked by create_ah.
        crate::base::handles::free(unsafe { Box::from_raw(a as *mut Ah) });
        Ok(())
    })
}

/// What `ibv_init_ah_from_wc` needs of the work completion.
#[derive(Clone, Copy, Default)]
pub(crate) struct WcAddr {
    pub grh: bool,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// Which header the 40-byte GRH area holds, as rdma-core decides it: an
/// IPv4 header in bytes 20..40 (RoCEv2 over IPv4) or an IPv6 header.
fn grh_is_ipv4(grh: &[u8; 40]) -> Result<bool, i32> {
    let ip6_version = grh[0] >> 4;
    let ip4 = &grh[20..40];
    if ip6_version != 6 {
        return if ip4[0] >> 4 == 4 {
            Ok(true)
        } else {
            Err(libc::EPROTONOSUPPORT)
        };
    }
    // Version 6 in byte 0 may still be an IPv4 packet whose GRH area
    // starts with garbage: believe a well-formed IPv4 header.
    Ok(ip4[0] & 0xf == 5 && Ipv4Packet::new_unchecked(ip4).verify_checksum())
}

/// The `ibv_ah_attr` answering the sender of a received message
/// (rdma-core's `ibv_init_ah_from_wc`): `our_gid_index` finds the index
/// of the GID the message was sent to.
pub(crate) fn ah_attr_from_grh(
    wc: WcAddr,
    port_num: u8,
    grh: &[u8; 40],
    our_gid_index: impl Fn(&[u8; 16]) -> Option<u32>,
) -> Result<ibv_ah_attr, i32> {
    let mut a = ibv_ah_attr::default();
    a.grh.flow_label = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]) & 0xf_ffff;
    a.dlid = wc.slid;
    a.sl = wc.sl;
    a.src_path_bits = wc.dlid_path_bits;
    a.port_num = port_num;
    if !wc.grh {
        return Ok(a);
    }
    a.is_global = 1;
    if grh_is_ipv4(grh)? {
        let ip4 = &grh[20..40];
        let saddr = Ipv4Addr::new(ip4[12], ip4[13], ip4[14], ip4[15]);
        let daddr = Ipv4Addr::new(ip4[16], ip4[17], ip4[18], ip4[19]);
        if daddr.is_multicast() {
            return Err(libc::EINVAL);
        }
        let idx = our_gid_index(&ipv4_mapped(daddr)).ok_or(libc::EINVAL)?;
        a.grh.dgid.raw = ipv4_mapped(saddr);
        a.grh.sgid_index = idx as u8;
        a.grh.hop_limit = ip4[8];
        a.grh.traffic_class = ip4[1];
    } else {
        let mut sgid = [0u8; 16];
        sgid.copy_from_slice(&grh[8..24]);
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&grh[24..40]);
        if dgid[0] == 0xff {
            return Err(libc::EINVAL);
        }
        if grh[6] != NEXT_HEADER_UDP {
            // RoCE v1 (or anything else): no such GID here.
            return Err(libc::EPROTONOSUPPORT);
        }
        let idx = our_gid_index(&dgid).ok_or(libc::EINVAL)?;
        a.grh.dgid.raw = sgid;
        a.grh.sgid_index = idx as u8;
        a.grh.hop_limit = grh[7];
        let vtf = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
        a.grh.traffic_class = (vtf >> 20) as u8;
    }
    Ok(a)
}

fn init_ah_from_wc(
    ctx: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    out: *mut ibv_ah_attr,
) -> Result<(), i32> {
    // SAFETY: the program passes an open context.
    let c = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
    // SAFETY: the program passes a completion it polled.
    let w = unsafe { wc.as_ref() }.ok_or(libc::EINVAL)?;
    if out.is_null() || grh.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `grh` is the start of the receive buffer, whose first 40
    // bytes the UD receive filled (any alignment).
    let bytes = unsafe { std::ptr::read_unaligned(grh as *const [u8; 40]) };
    let wa = WcAddr {
        grh: w.wc_flags & IBV_WC_GRH != 0,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    };
    let r = ah_attr_from_grh(wa, port_num, &bytes, |g| gid_index_of(&c.dev.gids, g));
    // SAFETY: `out` is the program's ibv_ah_attr; rdma-core clears it
    // even when it fails.
    unsafe { *out = r.unwrap_or_default() };
    r.map(|_| ())
}

/// `ibv_init_ah_from_wc`: 0, or -1 with errno set.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    ffi(-1, || {
        match init_ah_from_wc(context, port_num, wc, grh, ah_attr) {
            Ok(()) => 0,
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// `ibv_create_ah_from_wc`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    ffi_ptr(|| {
        // SAFETY: the program passes a live PD of ours.
        let p = unsafe { outer::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
        let mut attr = ibv_ah_attr::default();
        init_ah_from_wc(p.pd.context, port_num, wc, grh, &mut attr)?;
        create_ah(pd, &mut attr)
    })
}

/// The VLAN id of `iface` (rdma-core: 0xffff when it is not a VLAN).
fn vlan_id(iface: &str) -> u16 {
    std::fs::read_to_string(format!("/proc/net/vlan/{iface}"))
        .ok()
        .and_then(|t| {
            let rest = t.split("VID:").nth(1)?;
            rest.split_whitespace().next()?.parse::<u16>().ok()
        })
        .filter(|v| *v <= 0xfff)
        .unwrap_or(NO_VLAN)
}

fn resolve_l2(
    ctx: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    mac_out: *mut u8,
    vid: *mut u16,
) -> c_int {
    // SAFETY: the program passes an open context.
    let Some(c) = (unsafe { context(ctx) }) else {
        return -libc::EINVAL;
    };
    // SAFETY: the program passes a valid ibv_ah_attr (or NULL).
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return -libc::EINVAL;
    };
    if mac_out.is_null() {
        return -libc::EINVAL;
    }
    if usize::from(a.grh.sgid_index) >= c.dev.gids.len() {
        // rdma-core returns ibv_query_gid's failure as it is.
        return -1;
    }
    let peer = peer_ip(&gid_bytes(&a.grh.dgid));
    let mac = c.dev.stack.neighbour(peer, NEIGH_TIMEOUT);
    let Ok(mac) = mac else {
        return -libc::EHOSTUNREACH;
    };
    // SAFETY: the program passes 6 writable bytes (ETHERNET_LL_SIZE) and,
    // if not NULL, a u16.
    unsafe {
        std::ptr::copy_nonoverlapping(mac.as_ptr(), mac_out, 6);
        if let Some(v) = vid.as_mut() {
            *v = vlan_id(&c.dev.iface);
        }
    }
    0
}

/// `ibv_resolve_eth_l2_from_gid`: the destination MAC (and VLAN id) for
/// an `ibv_ah_attr`; 0, or a negative errno as rdma-core returns.
#[no_mangle]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    context: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    ffi(-libc::EIO, || resolve_l2(context, attr, eth_mac, vid))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
    const IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const GLOBAL_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

    /// The table of an interface with MAC, IP, its EUI-64 link-local
    /// address and one global IPv6 address.
    fn gids() -> Vec<[u8; 16]> {
        let ll = xroce::device::link_local_gid(MAC);
        crate::objects::device::gid_table(MAC, Some(IP), &[ll, GLOBAL_V6])
    }

    #[test]
    fn gid_table() {
        let t = gids();
        let g0 = t[0];
        assert_eq!(
            Ipv6Addr::from(g0),
            "fe80::5054:ff:fe12:3456".parse::<Ipv6Addr>().unwrap()
        );
        let g1 = t[1];
        assert_eq!(
            Ipv6Addr::from(g1),
            "::ffff:10.0.0.1".parse::<Ipv6Addr>().unwrap()
        );
        // The link-local address is GID 0 already: only the global follows.
        assert_eq!(t[2..], [GLOBAL_V6.octets()]);
        assert_eq!(gid_index_of(&t, &g1), Some(1));
        assert_eq!(gid_index_of(&t, &g0), Some(0));
        assert_eq!(gid_index_of(&t, &GLOBAL_V6.octets()), Some(2));
        assert_eq!(
            gid_index_of(&t, &ipv4_mapped(Ipv4Addr::new(10, 0, 0, 2))),
            None
        );
        assert_eq!(mapped_ipv4(&g1), Some(IP));
        assert_eq!(mapped_ipv4(&g0), None);
    }

    fn attr(dgid: [u8; 16], global: bool, sgid_index: u8) -> ibv_ah_attr {
        let mut a = ibv_ah_attr {
            is_global: global as u8,
            port_num: 1,
            ..Default::default()
        };
        a.grh.dgid.raw = dgid;
        a.grh.sgid_index = sgid_index;
        a.grh.traffic_class = 0x6a;
        a
    }

    #[test]
    fn grh_target_checks() {
        let peer = Ipv4Addr::new(192, 168, 1, 7);
        let n = gids().len();
        let v4 = Ok(IpAddr::V4(peer));
        assert_eq!(grh_target(&attr(ipv4_mapped(peer), true, 1), n, "t"), v4);
        assert_eq!(grh_target(&attr(ipv4_mapped(peer), true, 0), n, "t"), v4);
        assert_eq!(
            grh_target(&attr(ipv4_mapped(peer), false, 1), n, "t"),
            Err(libc::EINVAL)
        );
        assert_eq!(
            grh_target(&attr(ipv4_mapped(peer), true, 3), n, "t"),
            Err(libc::EINVAL)
        );
        // Not IPv4-mapped: an IPv6 peer (RoCEv2 over IPv6).
        let v6: Ipv6Addr = "fe80::1".parse().unwrap();
        assert_eq!(
            grh_target(&attr(v6.octets(), true, 0), n, "t"),
            Ok(IpAddr::V6(v6))
        );
    }

    /// The GRH area ud.rs writes: 20 zero bytes and the IPv4 header.
    fn ud_grh(src: Ipv4Addr, dst: Ipv4Addr, tos: u8, ttl: u8) -> [u8; 40] {
        let mut g = [0u8; 40];
        let ip = &mut g[20..];
        ip[0] = 0x45;
        ip[1] = tos;
        ip[8] = ttl;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&src.octets());
        ip[16..20].copy_from_slice(&dst.octets());
        g
    }

    #[test]
    fn ah_from_ipv4_grh() {
        let peer = Ipv4Addr::new(10, 0, 0, 2);
        let wc = WcAddr {
            grh: true,
            ..Default::default()
        };
        let a = ah_attr_from_grh(wc, 1, &ud_grh(peer, IP, 0x60, 64), |g| {
            gid_index_of(&gids(), g)
        })
        .unwrap();
        assert_eq!(a.is_global, 1);
        assert_eq!(a.port_num, 1);
        assert_eq!(gid_bytes(&a.grh.dgid), ipv4_mapped(peer));
        assert_eq!(a.grh.sgid_index, GID_INDEX_IPV4 as u8);
        assert_eq!(a.grh.hop_limit, 64);
        assert_eq!(a.grh.traffic_class, 0x60);
        // Sent to an address that is not ours: no GID to answer from.
        let other = ud_grh(peer, Ipv4Addr::new(10, 0, 0, 9), 0, 64);
        assert_eq!(
            ah_attr_from_grh(wc, 1, &other, |g| gid_index_of(&gids(), g)).err(),
            Some(libc::EINVAL)
        );
        // Without a GRH: no global route, no error.
        let a = ah_attr_from_grh(WcAddr::default(), 1, &[0; 40], |_| None).unwrap();
        assert_eq!(a.is_global, 0);
        // Garbage is neither IPv4 nor IPv6.
        assert_eq!(
            ah_attr_from_grh(wc, 1, &[0; 40], |_| Some(1)).err(),
            Some(libc::EPROTONOSUPPORT)
        );
    }

    #[test]
    fn ah_from_ipv6_grh() {
        let ours = gids()[0];
        let theirs: Ipv6Addr = "fe80::2".parse().unwrap();
        let mut g = [0u8; 40];
        g[0..4].copy_from_slice(&((6u32 << 28) | (0x28 << 20) | 0x12345).to_be_bytes());
        g[6] = NEXT_HEADER_UDP;
        g[7] = 3;
        g[8..24].copy_from_slice(&theirs.octets());
        g[24..40].copy_from_slice(&ours);
        let wc = WcAddr {
            grh: true,
            ..Default::default()
        };
        let a = ah_attr_from_grh(wc, 1, &g, |x| gid_index_of(&gids(), x)).unwrap();
        assert_eq!(gid_bytes(&a.grh.dgid), theirs.octets());
        assert_eq!(a.grh.sgid_index, 0);
        assert_eq!(a.grh.hop_limit, 3);
        assert_eq!(a.grh.traffic_class, 0x28);
        assert_eq!(a.grh.flow_label, 0x12345);
    }

    #[test]
    fn ipv4_checksum() {
        // A header with a correct checksum (RFC 1071 example values).
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        h[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert!(Ipv4Packet::new_unchecked(&h).verify_checksum());
        h[11] ^= 1;
        assert!(!Ipv4Packet::new_unchecked(&h).verify_checksum());
    }
}
