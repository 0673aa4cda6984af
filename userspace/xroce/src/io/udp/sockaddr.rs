//! Socket addresses to and from the C `sockaddr_storage` that mmsghdr
//! points at, in place (once per datagram: no allocation, no zeroing).

use std::{
    mem,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

/// Writes `addr` into `out`; returns the length the kernel is to read.
pub(super) fn sockaddr_of(addr: SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    // SAFETY: sockaddr_storage is large and aligned enough for both.
    unsafe {
        match addr {
            SocketAddr::V4(a) => {
                let sin = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
            }
            SocketAddr::V6(a) => {
                let sin6 = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr.s6_addr = a.ip().octets();
                sin6.sin6_scope_id = a.scope_id();
                mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
            }
        }
    }
}

/// The address the kernel wrote into `ss`; `None` for a family other
/// than IPv4/IPv6.
pub(super) fn addr_of(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the family field says which view is valid.
    unsafe {
        match ss.ss_family as libc::c_int {
            libc::AF_INET => {
                let sin = &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes())),
                    u16::from_be(sin.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let sin6 = &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                // A v4-mapped peer on a dual-stack socket is really IPv4.
                let ip = match ip.to_ipv4_mapped() {
                    Some(v4) => IpAddr::V4(v4),
                    None => IpAddr::V6(ip),
                };
                Some(SocketAddr::new(ip, u16::from_be(sin6.sin6_port)))
            }
            _ => None,
        }
    }
}
