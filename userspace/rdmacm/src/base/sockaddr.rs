//! C socket addresses (`struct sockaddr *` from the program, the unions of
//! `struct rdma_addr`) to and from Rust's `SocketAddr`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// The address and port of an AF_INET / AF_INET6 sockaddr; None for NULL
/// or another family.
///
/// # Safety
/// `sa` is NULL or points at a sockaddr as large as its family says.
pub(crate) unsafe fn read(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise: a sockaddr of its family's size.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                    u16::from_be(sin6.sin6_port),
                    u32::from_be(sin6.sin6_flowinfo),
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// [`read`]'s address only.
///
/// # Safety
/// As [`read`].
pub(crate) unsafe fn ip_of(sa: *const libc::sockaddr) -> Option<IpAddr> {
    // SAFETY: forwarded.
    unsafe { read(sa) }.map(|a| a.ip())
}

/// The sockaddr of `addr` in a `sockaddr_storage`, and its length.
pub(crate) fn storage(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Writes `addr` over the sockaddr_storage at `dst`.
///
/// # Safety
/// `dst` points at a writable `struct sockaddr_storage`.
pub(crate) unsafe fn write(dst: *mut libc::sockaddr_storage, addr: SocketAddr) {
    // SAFETY: the caller's promise.
    unsafe { *dst = storage(addr).0 };
}

/// The RoCEv2 GID of an IP address: IPv4-mapped for IPv4 (::ffff:a.b.c.d),
/// the address itself for IPv6.
pub(crate) fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// rdma_cm's `cma_any_addr`: a wildcard or a loopback address. The kernel
/// treats both alike: binding one attaches no device, a listener on one
/// takes requests to any address of its family, and resolving one as a
/// destination is a loopback to the first active device.
pub(crate) fn is_any_addr(ip: IpAddr) -> bool {
    ip.is_unspecified() || ip.is_loopback()
}

/// The loopback address of `ip`'s family (the kernel's `cma_set_loopback`).
pub(crate) fn loopback_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddrs_round_trip() {
        for text in ["10.1.2.3:4791", "[fe80::1]:18515", "0.0.0.0:0"] {
            let addr: SocketAddr = text.parse().unwrap();
            let (ss, len) = storage(addr);
            // SAFETY: ss is a sockaddr_storage storage() filled.
            let back = unsafe { read(&ss as *const _ as *const libc::sockaddr) };
            assert_eq!(back, Some(addr), "{text}");
            let want = if addr.is_ipv4() { 16 } else { 28 };
            assert_eq!(len, want);
        }
    }

    #[test]
    fn sin_port_is_big_endian() {
        let (ss, _) = storage("1.2.3.4:4660".parse().unwrap());
        // SAFETY: storage() wrote a sockaddr_in.
        let sin = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_port.to_ne_bytes(), [0x12, 0x34]);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [1, 2, 3, 4]);
    }

    #[test]
    fn roce_v2_gids() {
        assert_eq!(
            gid_of("10.0.0.1".parse().unwrap()),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]
        );
        let v6: Ipv6Addr = "2001:db8::7".parse().unwrap();
        assert_eq!(gid_of(IpAddr::V6(v6)), v6.octets());
    }

    #[test]
    fn any_addresses_are_wildcards_and_loopbacks_as_in_the_kernel() {
        for any in ["0.0.0.0", "127.0.0.1", "127.1.2.3", "::", "::1"] {
            assert!(is_any_addr(any.parse().unwrap()), "{any}");
        }
        for not in ["10.0.0.1", "fe80::1", "::ffff:127.0.0.1", "2001:db8::1"] {
            assert!(!is_any_addr(not.parse().unwrap()), "{not}");
        }
        assert_eq!(
            loopback_like("10.0.0.1".parse().unwrap()),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            loopback_like("::".parse().unwrap()),
            "::1".parse::<IpAddr>().unwrap()
        );
    }
}
