//! Peer MACs from the kernel's neighbour table (ARP for IPv4, NDP for
//! IPv6) through xroce-netlink, polling until the kernel has resolved the
//! peer.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

pub use xroce_netlink::neighbour as netlink_neighbour;

use super::NetDeviceError;
use crate::xdp;

/// Looks up the MAC of `peer` on `iface` in the neighbour table (rtnetlink
/// RTM_GETNEIGH), sending one small UDP datagram (to the discard port) to
/// make the kernel resolve it when it is not known, and polling until
/// `timeout`.
pub fn neighbour_mac(
    iface: &str,
    peer: IpAddr,
    timeout: Duration,
) -> Result<[u8; 6], NetDeviceError> {
    let ifindex =
        xdp::if_index(iface).map_err(|_| NetDeviceError::NoSuchInterface(iface.into()))?;
    let deadline = Instant::now() + timeout;
    let mut poked = false;
    loop {
        let found = netlink_neighbour(ifindex, peer).map_err(|source| NetDeviceError::Query {
            iface: iface.into(),
            what: "neighbour table",
            source,
        })?;
        if let Some(mac) = found {
            return Ok(mac);
        }
        if Instant::now() >= deadline {
            return Err(NetDeviceError::NeighbourTimeout {
                iface: iface.into(),
                peer,
                proto: if peer.is_ipv4() { "ARP" } else { "NDP" },
                timeout,
            });
        }
        if !poked {
            poked = true;
            xroce_netlink::solicit(peer, ifindex);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn the_loopback_table_has_no_entry_and_a_lookup_times_out_clearly() {
        let lo = xdp::if_index("lo").unwrap();
        let ghost = IpAddr::from(Ipv4Addr::new(127, 9, 9, 9));
        assert_eq!(netlink_neighbour(lo, ghost).unwrap(), None);
        let e = neighbour_mac("lo", ghost, Duration::from_millis(50)).unwrap_err();
        assert!(e.to_string().contains("no ARP reply from 127.9.9.9"), "{e}");
        let e = neighbour_mac("nosuchif0", ghost, Duration::from_millis(50)).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }
}
