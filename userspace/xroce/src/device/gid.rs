//! A device's GIDs, as rxe numbers them: index 0 the link-local GID
//! derived from the MAC, 1 the IPv4-mapped address, then the interface's
//! other IPv6 addresses. The drop-in libibverbs reports this table and
//! resolves source GID indexes against it; `xroce bench -x` picks from it.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The node GUID rxe derives from the MAC (modified EUI-64), in host order.
pub fn guid_from_mac(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

/// The link-local GID the kernel gives a RoCE port (and the IPv6
/// link-local address it gives the interface): fe80::/64 with the
/// modified EUI-64 interface identifier of the MAC.
pub fn link_local_gid(mac: [u8; 6]) -> Ipv6Addr {
    Ipv6Addr::from((0xfe80u128 << 112) | u128::from(guid_from_mac(mac)))
}

/// The populated GID table: the link-local GID, the IPv4-mapped address,
/// then the IPv6 addresses but the link-local one already at index 0.
pub fn gid_table(mac: [u8; 6], v4: Option<Ipv4Addr>, v6: &[Ipv6Addr]) -> Vec<Ipv6Addr> {
    let ll = link_local_gid(mac);
    let mut t = vec![ll];
    t.extend(v4.map(|a| a.to_ipv6_mapped()));
    t.extend(v6.iter().copied().filter(|a| *a != ll));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rxe_numbering() {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let ll: Ipv6Addr = "fe80::5054:ff:fe12:3456".parse().unwrap();
        assert_eq!(link_local_gid(mac), ll);
        let global: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            gid_table(mac, Some(Ipv4Addr::new(10, 0, 0, 1)), &[ll, global]),
            [ll, "::ffff:10.0.0.1".parse().unwrap(), global]
        );
    }
}
