//! What Linux's rdma_cm puts into IB CM messages when it connects by IP
//! address: the service ID (port space and port) and, at the start of the
//! REQ's and SIDR_REQ's private data, a 36-byte header with the two IP
//! addresses and the active side's port.
//!
//! ```text
//! 0: cma version (0) | 1: IP version << 4 | 2-3: source port
//! 4-19: source IP | 20-35: destination IP
//! ```
//! An IPv4 address sits in the last 4 bytes of its 16 (the first 12 zero,
//! not the ::ffff: mapping GIDs use).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bytes::{be16, put16};
use crate::mad::MadError;

/// rdma_cm's port spaces (`enum rdma_ucm_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum PortSpace {
    Ipoib = 0x0002,
    Tcp = 0x0106,
    Udp = 0x0111,
    Ib = 0x013f,
}

impl PortSpace {
    pub fn from_u16(v: u16) -> Option<PortSpace> {
        match v {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013f => Some(PortSpace::Ib),
            _ => None,
        }
    }
    /// "RDMA_PS_TCP", ... (the names librdmacm programs use).
    pub const fn name(self) -> &'static str {
        match self {
            PortSpace::Ipoib => "RDMA_PS_IPOIB",
            PortSpace::Tcp => "RDMA_PS_TCP",
            PortSpace::Udp => "RDMA_PS_UDP",
            PortSpace::Ib => "RDMA_PS_IB",
        }
    }
}

/// The IB service IDs rdma_cm uses: 0x00000000_01xx_xxxx.
const CMA_SERVICE_ID: u64 = 0x0000_0000_0100_0000;
const CMA_SERVICE_ID_MASK: u64 = 0xffff_ffff_ff00_0000;

/// The service ID rdma_cm connects to / listens on for `port` in `ps`.
pub const fn service_id(ps: PortSpace, port: u16) -> u64 {
    CMA_SERVICE_ID | ((ps as u64) << 16) | port as u64
}

/// The port space and port of an rdma_cm service ID; `None` for IDs
/// outside rdma_cm's range or with an unknown port space.
pub fn split_service_id(sid: u64) -> Option<(PortSpace, u16)> {
    if sid & CMA_SERVICE_ID_MASK != CMA_SERVICE_ID {
        return None;
    }
    let ps = PortSpace::from_u16(((sid >> 16) & 0xffff) as u16)?;
    Some((ps, sid as u16))
}

/// rdma_cm's private-data header (`struct cma_hdr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// 0 in every Linux so far.
    pub cma_version: u8,
    /// The active side's port.
    pub src_port: u16,
    /// Both addresses are of one family (the IP version nibble).
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
}

/// The header's size.
pub const CMA_HEADER_LEN: usize = 36;
/// The cma_version Linux writes.
pub const CMA_VERSION: u8 = 0;

impl CmaHeader {
    /// Parses the header at the start of `private_data`.
    pub fn parse(private_data: &[u8]) -> Result<CmaHeader, MadError> {
        let b = private_data;
        if b.len() < CMA_HEADER_LEN {
            return Err(MadError::Truncated {
                needed: CMA_HEADER_LEN,
                have: b.len(),
            });
        }
        let addr = |at: usize| -> Result<IpAddr, MadError> {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[at..at + 16]);
            match b[1] >> 4 {
                4 => Ok(IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))),
                6 => Ok(IpAddr::V6(Ipv6Addr::from(a))),
                _ => Err(MadError::FieldOverflow("cma_hdr ip_version (4 or 6)")),
            }
        };
        Ok(CmaHeader {
            cma_version: b[0],
            src_port: be16(b, 2),
            src_ip: addr(4)?,
            dst_ip: addr(20)?,
        })
    }

    /// Writes the 36 header bytes into `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, MadError> {
        if buf.len() < CMA_HEADER_LEN {
            return Err(MadError::BufferTooSmall {
                needed: CMA_HEADER_LEN,
                have: buf.len(),
            });
        }
        let b = &mut buf[..CMA_HEADER_LEN];
        b.fill(0);
        b[0] = self.cma_version;
        put16(b, 2, self.src_port);
        for (at, ip) in [(4, self.src_ip), (20, self.dst_ip)] {
            match ip {
                IpAddr::V4(a) => b[at + 12..at + 16].copy_from_slice(&a.octets()),
                IpAddr::V6(a) => b[at..at + 16].copy_from_slice(&a.octets()),
            }
        }
        b[1] = match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4 << 4,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6 << 4,
            _ => return Err(MadError::FieldOverflow("cma_hdr addresses of one family")),
        };
        Ok(CMA_HEADER_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_of_each_port_space() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(service_id(PortSpace::Udp, 7174), 0x0000_0000_0111_1c06);
        assert_eq!(service_id(PortSpace::Ib, 1), 0x0000_0000_013f_0001);
        assert_eq!(service_id(PortSpace::Ipoib, 2), 0x0000_0000_0102_0002);
        assert_eq!(
            split_service_id(0x0000_0000_0106_1c06),
            Some((PortSpace::Tcp, 7174))
        );
        assert_eq!(split_service_id(0x0000_0000_0107_1c06), None);
        assert_eq!(split_service_id(0x0200_0000_0106_1c06), None);
    }

    #[test]
    fn header_round_trip_v4_v6_and_mixed_family_error() {
        let h = CmaHeader {
            cma_version: 0,
            src_port: 0xbeef,
            src_ip: "10.0.0.1".parse().unwrap(),
            dst_ip: "10.0.0.2".parse().unwrap(),
        };
        let mut b = [0xaau8; 40];
        assert_eq!(h.emit(&mut b), Ok(36));
        assert_eq!(&b[..4], &[0, 0x40, 0xbe, 0xef]);
        assert_eq!(
            &b[4..20],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1]
        );
        assert_eq!(CmaHeader::parse(&b), Ok(h));
        let h6 = CmaHeader {
            src_ip: "fd77::10".parse().unwrap(),
            dst_ip: "fd77::11".parse().unwrap(),
            ..h
        };
        h6.emit(&mut b).unwrap();
        assert_eq!(b[1], 0x60);
        assert_eq!(CmaHeader::parse(&b), Ok(h6));
        let mixed = CmaHeader {
            dst_ip: h.dst_ip,
            ..h6
        };
        assert_eq!(
            mixed.emit(&mut b),
            Err(MadError::FieldOverflow("cma_hdr addresses of one family"))
        );
        assert_eq!(
            CmaHeader::parse(&b[..35]),
            Err(MadError::Truncated {
                needed: 36,
                have: 35
            })
        );
        b[1] = 0x50;
        assert!(CmaHeader::parse(&b).is_err());
    }
}
