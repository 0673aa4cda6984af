//! Peer MACs from the kernel's neighbour table (ARP for IPv4, NDP for
//! IPv6): an RTM_GETNEIGH dump over rtnetlink, in the calling thread's
//! network namespace, and a datagram to the peer to make the kernel
//! resolve an entry it does not have yet.
//!
//! One lookup for xroce's devices (`xroce::device::neighbour_mac`) and for
//! the drop-in librdmacm, which must not link the xroce crate (it shares
//! xroce's device state through libibverbs.so.1 at run time).
//!
//! [`xdp`]: which XDP program an interface runs (RTM_GETLINK's IFLA_XDP) and
//! attaching or detaching one over RTM_SETLINK, as `ip link set xdp` does.

pub mod xdp;

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket},
};

use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLMSG_ALIGNTO, NLM_F_DUMP,
    NLM_F_REQUEST,
};
use netlink_packet_route::{
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage},
    AddressFamily, RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr as NetlinkAddr};

/// NUD_INCOMPLETE | NUD_FAILED: an entry without a usable MAC.
const NUD_UNRESOLVED: u16 = 0x01 | 0x20;

/// The MAC of a neighbour-table entry if it is `peer` on `ifindex` and
/// resolved (not absent, incomplete or failed).
fn usable_entry(entry: &NeighbourMessage, ifindex: u32, peer: IpAddr) -> Option<[u8; 6]> {
    let state = u16::from(entry.header.state);
    if entry.header.ifindex != ifindex || state == 0 || state & NUD_UNRESOLVED != 0 {
        return None;
    }
    let mut dst = None;
    let mut mac = None;
    for attr in &entry.attributes {
        match attr {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                dst = Some(IpAddr::from(*a))
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                dst = Some(IpAddr::from(*a))
            }
            NeighbourAttribute::LinkLayerAddress(ll) => mac = <[u8; 6]>::try_from(&ll[..]).ok(),
            _ => {}
        }
    }
    (dst == Some(peer)).then_some(mac).flatten()
}

/// Where a dump stands after one datagram.
#[derive(Debug, PartialEq, Eq)]
enum Dump {
    More,
    Done,
}

/// Reads one datagram of an RTM_GETNEIGH dump, recording in `found` the
/// usable entry of `peer` on `ifindex`. A message the crate cannot decode
/// (an entry of a kind it does not know) is skipped, not fatal.
fn scan_datagram(
    mut datagram: &[u8],
    ifindex: u32,
    peer: IpAddr,
    found: &mut Option<[u8; 6]>,
) -> io::Result<Dump> {
    while !datagram.is_empty() {
        let len = NetlinkBuffer::new_checked(datagram)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
            .length() as usize;
        if let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&datagram[..len]) {
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(Dump::Done),
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(entry)) => {
                    if let Some(mac) = usable_entry(&entry, ifindex, peer) {
                        *found = Some(mac);
                    }
                }
                _ => {}
            }
        }
        datagram = datagram
            .get(len.next_multiple_of(NLMSG_ALIGNTO.into())..)
            .unwrap_or_default();
    }
    Ok(Dump::More)
}

/// The RTM_GETNEIGH dump request for `peer`'s address family.
fn dump_request(peer: IpAddr) -> Vec<u8> {
    let mut entry = NeighbourMessage::default();
    entry.header.family = if peer.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetNeighbour(entry)),
    );
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    buf
}

/// The neighbour table entry of `peer` on interface `ifindex`, from an
/// RTM_GETNEIGH dump over rtnetlink (this thread's namespace). `Ok(None)`:
/// no usable entry (absent, incomplete or failed).
pub fn neighbour(ifindex: u32, peer: IpAddr) -> io::Result<Option<[u8; 6]>> {
    let socket = Socket::new(NETLINK_ROUTE)?;
    socket.send_to(&dump_request(peer), &NetlinkAddr::new(0, 0), 0)?;
    let mut found = None;
    loop {
        let (datagram, _) = socket.recv_from_full()?;
        if datagram.is_empty() || scan_datagram(&datagram, ifindex, peer, &mut found)? == Dump::Done
        {
            return Ok(found);
        }
    }
}

/// Sends one byte to `peer`'s discard port (9): the kernel resolves the
/// neighbour on the first send. A link-local IPv6 peer is scoped to
/// `ifindex`.
pub fn solicit(peer: IpAddr, ifindex: u32) {
    let (bind, to): (SocketAddr, SocketAddr) = match peer {
        IpAddr::V4(p) => ((Ipv4Addr::UNSPECIFIED, 0).into(), (p, 9).into()),
        IpAddr::V6(p) => {
            let scope = if p.is_unicast_link_local() {
                ifindex
            } else {
                0
            };
            (
                (Ipv6Addr::UNSPECIFIED, 0).into(),
                SocketAddrV6::new(p, 9, 0, scope).into(),
            )
        }
    };
    if let Ok(s) = UdpSocket::bind(bind) {
        let _ = s.send_to(&[0], to);
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{DoneMessage, ErrorMessage};
    use netlink_packet_route::neighbour::NeighbourState;

    use super::*;

    const MAC: [u8; 6] = [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 1];

    fn entry(ifindex: u32, state: NeighbourState, dst: IpAddr, mac: &[u8]) -> NeighbourMessage {
        let mut e = NeighbourMessage::default();
        e.header.family = if dst.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        e.header.ifindex = ifindex;
        e.header.state = state;
        e.attributes
            .push(NeighbourAttribute::Destination(match dst {
                IpAddr::V4(a) => NeighbourAddress::Inet(a),
                IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }));
        if !mac.is_empty() {
            e.attributes
                .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        }
        e
    }

    /// One datagram holding `payloads`, serialized by the crate.
    fn datagram(payloads: Vec<NetlinkPayload<RouteNetlinkMessage>>) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            let mut m = NetlinkMessage::new(NetlinkHeader::default(), p);
            m.finalize();
            let mut buf = vec![0; m.buffer_len()];
            m.serialize(&mut buf);
            buf.resize(buf.len().next_multiple_of(NLMSG_ALIGNTO.into()), 0);
            out.extend(buf);
        }
        out
    }

    fn new_neigh(e: NeighbourMessage) -> NetlinkPayload<RouteNetlinkMessage> {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(e))
    }

    #[test]
    fn a_dump_yields_only_the_resolved_entry_of_the_peer_on_the_interface() {
        let p4: IpAddr = Ipv4Addr::new(10, 77, 3, 2).into();
        let p6: IpAddr = "fd00::2".parse().unwrap();
        let other: IpAddr = Ipv4Addr::new(10, 77, 3, 3).into();
        let dgram = datagram(vec![
            new_neigh(entry(7, NeighbourState::Reachable, other, &[9; 6])),
            new_neigh(entry(8, NeighbourState::Reachable, p4, &[8; 6])),
            new_neigh(entry(7, NeighbourState::Stale, p4, &MAC)),
            new_neigh(entry(7, NeighbourState::Incomplete, p6, &[])),
            new_neigh(entry(7, NeighbourState::Failed, other, &[6; 6])),
        ]);
        let mut found = None;
        assert_eq!(
            scan_datagram(&dgram, 7, p4, &mut found).unwrap(),
            Dump::More
        );
        assert_eq!(found, Some(MAC));
        let mut found = None;
        scan_datagram(&dgram, 8, p4, &mut found).unwrap();
        assert_eq!(found, Some([8; 6]));
        // Incomplete, failed, or on another interface: not usable.
        for (ifindex, peer) in [(7, p6), (8, other), (9, p4)] {
            let mut found = None;
            scan_datagram(&dgram, ifindex, peer, &mut found).unwrap();
            assert_eq!(found, None, "{ifindex} {peer}");
        }
        // NDP entries read the same; a malformed MAC is no MAC.
        let dgram = datagram(vec![
            new_neigh(entry(
                3,
                NeighbourState::Delay,
                p6,
                &[2, 0x11, 0x22, 0x33, 0x44],
            )),
            new_neigh(entry(4, NeighbourState::Permanent, p6, &MAC)),
            new_neigh(entry(5, NeighbourState::None, p6, &MAC)),
        ]);
        for (ifindex, want) in [(3, None), (4, Some(MAC)), (5, None)] {
            let mut found = None;
            scan_datagram(&dgram, ifindex, p6, &mut found).unwrap();
            assert_eq!(found, want, "{ifindex}");
        }
    }

    #[test]
    fn a_dump_ends_at_done_and_fails_on_an_error() {
        let p4: IpAddr = Ipv4Addr::new(10, 0, 0, 2).into();
        let dgram = datagram(vec![
            new_neigh(entry(2, NeighbourState::Reachable, p4, &MAC)),
            NetlinkPayload::Done(DoneMessage::default()),
        ]);
        let mut found = None;
        assert_eq!(
            scan_datagram(&dgram, 2, p4, &mut found).unwrap(),
            Dump::Done
        );
        assert_eq!(found, Some(MAC));
        let mut err = ErrorMessage::default();
        err.code = std::num::NonZeroI32::new(-libc::EPERM);
        let e = scan_datagram(
            &datagram(vec![NetlinkPayload::Error(err)]),
            2,
            p4,
            &mut None,
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        assert!(scan_datagram(&[1, 2, 3], 2, p4, &mut None).is_err());
    }

    #[test]
    fn the_request_is_a_neighbour_dump_of_the_peers_family() {
        for (peer, family) in [
            (IpAddr::from(Ipv4Addr::LOCALHOST), libc::AF_INET),
            (IpAddr::from(Ipv6Addr::LOCALHOST), libc::AF_INET6),
        ] {
            let req = dump_request(peer);
            // nlmsghdr (16) + ndmsg (12), as `ip neigh show` sends.
            assert_eq!(req.len(), 28);
            let hdr = NetlinkBuffer::new_checked(&req[..]).unwrap();
            assert_eq!(hdr.message_type(), libc::RTM_GETNEIGH);
            assert_eq!(hdr.flags(), NLM_F_REQUEST | NLM_F_DUMP);
            assert_eq!(req[16], family as u8);
            // No state, flags, type or attributes: every entry is listed.
            assert!(req[17..].iter().all(|b| *b == 0), "{req:?}");
        }
    }

    #[test]
    fn the_loopback_table_has_no_entry() {
        let lo = lo_index();
        let ghost = IpAddr::from(Ipv4Addr::new(127, 9, 9, 9));
        assert_eq!(neighbour(lo, ghost).unwrap(), None);
    }

    fn lo_index() -> u32 {
        // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
        unsafe { libc::if_nametoindex(c"lo".as_ptr()) }
    }
}
