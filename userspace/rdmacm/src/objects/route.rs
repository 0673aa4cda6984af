//! The kernel's routing and neighbour tables over rtnetlink, in the calling
//! thread's network namespace: where a destination is reached from (the
//! egress interface and source address of `ip route get`), as the kernel's
//! rdma_cm asks before it reports an address resolved. Whether the next hop
//! has a link-layer address (ARP / NDP) is xroce-netlink's lookup, shared
//! with xroce's devices (this library must not link the xroce crate: that
//! lives in libibverbs.so.1 only, so that a process has one device state).

use std::{io, net::IpAddr};

use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLMSG_ALIGNTO, NLM_F_DUMP,
    NLM_F_REQUEST,
};
use netlink_packet_route::{
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteType},
    AddressFamily, RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr as NetlinkAddr};

/// What `ip route get DST [from SRC]` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    /// The egress interface.
    pub(crate) oif: u32,
    /// The preferred source address, when the route names one.
    pub(crate) src: Option<IpAddr>,
    /// The next hop when it is a gateway (else the destination itself).
    pub(crate) gateway: Option<IpAddr>,
    /// The destination is one of this host's addresses.
    pub(crate) local: bool,
}

fn family(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// Sends one request and hands every decoded reply message to `each` until
/// the kernel says done (a dump) or answers once (a get).
fn exchange(
    request: RouteNetlinkMessage,
    flags: u16,
    mut each: impl FnMut(RouteNetlinkMessage),
) -> io::Result<()> {
    let socket = Socket::new(NETLINK_ROUTE)?;
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::from(request));
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    socket.send_to(&buf, &NetlinkAddr::new(0, 0), 0)?;
    let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
    loop {
        let (datagram, _) = socket.recv_from_full()?;
        let mut rest = &datagram[..];
        while !rest.is_empty() {
            let len = NetlinkBuffer::new_checked(rest)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
                .length() as usize;
            if len == 0 || len > rest.len() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "netlink length"));
            }
            // A message the crate cannot decode is skipped, not fatal.
            if let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len]) {
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::Error(e) => match e.code {
                        Some(_) => return Err(e.to_io()),
                        None if !dump => return Ok(()),
                        None => {}
                    },
                    NetlinkPayload::InnerMessage(m) => {
                        each(m);
                        if !dump {
                            return Ok(());
                        }
                    }
                    _ => {}
                }
            }
            rest = rest
                .get(len.next_multiple_of(NLMSG_ALIGNTO.into())..)
                .unwrap_or_default();
        }
    }
}

/// The route to `dst` (from `src` when bound to one). Errors are the
/// kernel's: ENETUNREACH, EHOSTUNREACH, EINVAL for a source not ours.
pub(crate) fn lookup(dst: IpAddr, src: Option<IpAddr>) -> io::Result<Route> {
    let mut query = RouteMessage::default();
    query.header.address_family = family(dst);
    query.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
    query
        .attributes
        .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    if let Some(src) = src.filter(|s| !s.is_unspecified()) {
        query.header.source_prefix_length = if src.is_ipv4() { 32 } else { 128 };
        query
            .attributes
            .push(RouteAttribute::Source(RouteAddress::from(src)));
    }
    let mut found = None;
    exchange(RouteNetlinkMessage::GetRoute(query), NLM_F_REQUEST, |m| {
        if let RouteNetlinkMessage::NewRoute(r) = m {
            found = Some(r);
        }
    })?;
    let reply = found.ok_or_else(|| io::Error::from_raw_os_error(libc::ENETUNREACH))?;
    match reply.header.kind {
        RouteType::Unicast | RouteType::Local => {}
        RouteType::Prohibit => return Err(io::Error::from_raw_os_error(libc::EACCES)),
        _ => return Err(io::Error::from_raw_os_error(libc::ENETUNREACH)),
    }
    let mut route = Route {
        oif: 0,
        src: None,
        gateway: None,
        local: reply.header.kind == RouteType::Local,
    };
    for attr in &reply.attributes {
        match attr {
            RouteAttribute::Oif(i) => route.oif = *i,
            RouteAttribute::PrefSource(a) => route.src = ip_of(a),
            RouteAttribute::Gateway(a) => route.gateway = ip_of(a),
            _ => {}
        }
    }
    if route.oif == 0 {
        return Err(io::Error::from_raw_os_error(libc::ENETUNREACH));
    }
    Ok(route)
}

/// The index of interface `name`, 0 if there is none.
pub(crate) fn if_index(name: &str) -> u32 {
    let Ok(c) = std::ffi::CString::new(name) else {
        return 0;
    };
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

/// The name of interface `index`.
pub(crate) fn if_name(index: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// Every (interface, address) of this namespace (getifaddrs).
pub(crate) fn local_addresses() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return out;
    }
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        // SAFETY: ifa_addr is NULL or a sockaddr of the family it names.
        if let Some(ip) =
            unsafe { crate::base::sockaddr::ip_of(ifa.ifa_addr as *const libc::sockaddr) }
        {
            // SAFETY: ifa_name is a NUL-terminated interface name.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            out.push((name.to_string_lossy().into_owned(), ip));
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_routes_are_local_through_lo() {
        let r = lookup("127.0.0.1".parse().unwrap(), None).unwrap();
        assert!(r.local);
        assert_eq!(r.oif, if_index("lo"));
        assert_eq!(if_name(r.oif).as_deref(), Some("lo"));
        assert_eq!(r.src, Some("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn a_source_that_is_not_ours_is_refused() {
        // The kernel refuses `ip route get 127.0.0.1 from 192.0.2.1`.
        let e = lookup(
            "127.0.0.1".parse().unwrap(),
            Some("192.0.2.1".parse().unwrap()),
        );
        assert!(e.is_err(), "{e:?}");
    }
}
