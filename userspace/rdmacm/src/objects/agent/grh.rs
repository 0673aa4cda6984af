//! Who sent a received MAD and to which of our GIDs, from the 40-byte GRH
//! area a UD receive fills: the packet's IPv6 header, or for RoCEv2 over
//! IPv4 20 bytes of anything followed by its IPv4 header (rdma-core's and
//! xroce's layout).

use xroce_wire::ipv4::{self, Ipv4Packet};
use xroce_wire::Gid;

/// The bytes before the MAD in every receive buffer.
pub(super) const GRH_LEN: usize = 40;

/// The source and destination GIDs of a received packet: for IPv4 the
/// IPv4-mapped GIDs of its addresses, for IPv6 its addresses. `None` when
/// the area holds neither header.
pub(super) fn addresses(grh: &[u8; GRH_LEN]) -> Option<(Gid, Gid)> {
    let ip4 = &grh[GRH_LEN - ipv4::HEADER_LEN..];
    let v4 = Ipv4Packet::new_unchecked(ip4);
    // Version 6 in byte 0 may still be an IPv4 packet whose GRH area
    // starts with garbage: believe a well-formed IPv4 header first.
    let well_formed_v4 = v4.version() == 4 && v4.ihl() == 5 && v4.verify_checksum();
    if well_formed_v4 || (grh[0] >> 4 != 6 && v4.version() == 4) {
        return Some((Gid::from_ipv4(v4.src_addr()), Gid::from_ipv4(v4.dst_addr())));
    }
    if grh[0] >> 4 == 6 {
        let mut src = [0u8; 16];
        src.copy_from_slice(&grh[8..24]);
        let mut dst = [0u8; 16];
        dst.copy_from_slice(&grh[24..40]);
        return Some((Gid::from_ipv6(src), Gid::from_ipv6(dst)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GRH area of a RoCEv2-over-IPv4 packet 10.0.0.2 -> 10.0.0.1 as
    /// xroce (and rxe) fill it: 20 zero bytes, then the IPv4 header.
    fn ipv4_grh() -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        let h = [
            0x45, 0x00, 0x01, 0x40, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 0, 0, 2,
            10, 0, 0, 1,
        ];
        g[20..].copy_from_slice(&h);
        Ipv4Packet::new_unchecked(&mut g[20..]).fill_checksum();
        g
    }

    #[test]
    fn ipv4_source_and_destination_are_mapped_gids() {
        let (src, dst) = addresses(&ipv4_grh()).unwrap();
        assert_eq!(src, Gid::from_ipv4([10, 0, 0, 2]));
        assert_eq!(dst, Gid::from_ipv4([10, 0, 0, 1]));
    }

    #[test]
    fn ipv4_header_wins_over_a_version_6_nibble_in_front() {
        let mut g = ipv4_grh();
        g[0] = 0x60;
        let (src, _) = addresses(&g).unwrap();
        assert_eq!(src, Gid::from_ipv4([10, 0, 0, 2]));
    }

    #[test]
    fn ipv6_addresses_are_the_gids() {
        let src: [u8; 16] = "fd77:1::2".parse::<std::net::Ipv6Addr>().unwrap().octets();
        let dst: [u8; 16] = "fd77:1::1".parse::<std::net::Ipv6Addr>().unwrap().octets();
        let mut g = [0u8; GRH_LEN];
        g[0] = 0x60;
        g[4..6].copy_from_slice(&0x0128u16.to_be_bytes()); // payload length
        g[6] = 17; // UDP
        g[7] = 64; // hop limit
        g[8..24].copy_from_slice(&src);
        g[24..40].copy_from_slice(&dst);
        assert_eq!(
            addresses(&g),
            Some((Gid::from_ipv6(src), Gid::from_ipv6(dst)))
        );
    }

    #[test]
    fn neither_header_is_none() {
        assert_eq!(addresses(&[0u8; GRH_LEN]), None);
    }
}
