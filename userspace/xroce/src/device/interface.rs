//! Queries of one network interface: its MAC, MTU and IP addresses, read in
//! the calling thread's network namespace (getifaddrs and the ioctl socket
//! are both opened there).

use std::{
    io,
    net::{Ipv4Addr, Ipv6Addr},
    os::fd::OwnedFd,
};

use nix::{
    ifaddrs::{getifaddrs, InterfaceAddress},
    sys::socket::{socket, AddressFamily, SockFlag, SockType},
};

use super::NetDeviceError;

fn query_err(iface: &str, what: &'static str, source: io::Error) -> NetDeviceError {
    NetDeviceError::Query {
        iface: iface.into(),
        what,
        source,
    }
}

/// Every getifaddrs entry of `iface`: one per address, and one AF_PACKET
/// entry (its hardware address) per interface.
fn entries_of<'a>(
    iface: &'a str,
    what: &'static str,
) -> Result<impl Iterator<Item = InterfaceAddress> + 'a, NetDeviceError> {
    let all = getifaddrs().map_err(|e| query_err(iface, what, e.into()))?;
    Ok(all.filter(move |a| a.interface_name == iface))
}

/// MAC address of `iface` (all zeroes for an interface without one, such as
/// loopback).
pub fn interface_mac(iface: &str) -> Result<[u8; 6], NetDeviceError> {
    let mut exists = false;
    for entry in entries_of(iface, "MAC address")? {
        exists = true;
        if let Some(mac) = entry
            .address
            .as_ref()
            .and_then(|a| a.as_link_addr())
            .and_then(|l| l.addr())
        {
            return Ok(mac);
        }
    }
    if exists {
        Ok([0; 6])
    } else {
        Err(query_err(
            iface,
            "MAC address",
            io::Error::from_raw_os_error(libc::ENODEV),
        ))
    }
}

/// An `ifreq` naming `iface` (NUL-terminated, the rest zero) for the
/// interface ioctls; `None` for a name the kernel cannot hold.
pub(crate) fn ifreq_named(iface: &str) -> Option<libc::ifreq> {
    let name = iface.as_bytes();
    if name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return None;
    }
    let mut ifr = libc::ifreq {
        ifr_name: [0; libc::IFNAMSIZ],
        ifr_ifru: libc::__c_anonymous_ifr_ifru { ifru_mtu: 0 },
    };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    Some(ifr)
}

/// A socket to issue interface ioctls on, in this thread's namespace.
pub(crate) fn ioctl_socket() -> nix::Result<OwnedFd> {
    socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
}

nix::ioctl_read_bad!(siocgifmtu, libc::SIOCGIFMTU, libc::ifreq);

/// MTU of `iface` (SIOCGIFMTU).
pub fn interface_mtu(iface: &str) -> Result<u32, NetDeviceError> {
    let mut ifr =
        ifreq_named(iface).ok_or_else(|| NetDeviceError::NoSuchInterface(iface.into()))?;
    let sock = ioctl_socket().map_err(|e| query_err(iface, "socket", e.into()))?;
    // SAFETY: `ifr` is a valid ifreq with a NUL-terminated name that
    // SIOCGIFMTU only writes into; on success it filled the mtu member.
    let mtu = unsafe {
        siocgifmtu(std::os::fd::AsRawFd::as_raw_fd(&sock), &mut ifr)
            .map_err(|e| query_err(iface, "MTU", e.into()))?;
        ifr.ifr_ifru.ifru_mtu
    };
    Ok(mtu as u32)
}

/// IPv4 and IPv6 addresses of `iface` (getifaddrs, this namespace); both
/// empty for an interface that does not exist.
pub fn interface_addrs(iface: &str) -> Result<(Vec<Ipv4Addr>, Vec<Ipv6Addr>), NetDeviceError> {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for entry in entries_of(iface, "addresses")? {
        let Some(addr) = entry.address else { continue };
        if let Some(a) = addr.as_sockaddr_in() {
            v4.push(a.ip());
        } else if let Some(a) = addr.as_sockaddr_in6() {
            v6.push(a.ip());
        }
    }
    Ok((v4, v6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_queries_work_and_errors_name_the_problem() {
        assert_eq!(interface_mtu("lo").unwrap(), 65536);
        assert_eq!(interface_mac("lo").unwrap(), [0; 6]);
        let (v4, v6) = interface_addrs("lo").unwrap();
        assert!(v4.contains(&Ipv4Addr::LOCALHOST));
        assert!(v6.iter().all(|a| a.is_loopback()), "{v6:?}");
        for e in [
            interface_mtu("nosuchif0").unwrap_err(),
            interface_mac("nosuchif0").unwrap_err(),
        ] {
            assert!(
                e.to_string().contains("of nosuchif0: No such device"),
                "{e}"
            );
        }
        assert!(matches!(
            interface_mtu("a-name-longer-than-ifnamsiz"),
            Err(NetDeviceError::NoSuchInterface(_))
        ));
        assert_eq!(interface_addrs("nosuchif0").unwrap(), (vec![], vec![]));
    }
}
