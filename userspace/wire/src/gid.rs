//! GIDs and their mapping to IP addresses: RoCEv2 uses the IPv6 address as
//! the GID, and an IPv4 address as the IPv4-mapped GID `::ffff:a.b.c.d`.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A 128-bit global identifier, network byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID `::ffff:a.b.c.d`.
    pub const fn from_ipv4(a: [u8; 4]) -> Gid {
        Gid([
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
        ])
    }
    /// The GID of an IPv6 address (the same 16 bytes).
    pub const fn from_ipv6(a: [u8; 16]) -> Gid {
        Gid(a)
    }
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
    /// Whether this is an IPv4-mapped GID.
    pub const fn is_ipv4_mapped(&self) -> bool {
        let g = &self.0;
        g[0] == 0
            && g[1] == 0
            && g[2] == 0
            && g[3] == 0
            && g[4] == 0
            && g[5] == 0
            && g[6] == 0
            && g[7] == 0
            && g[8] == 0
            && g[9] == 0
            && g[10] == 0xff
            && g[11] == 0xff
    }
    /// The IPv4 address of an IPv4-mapped GID.
    pub const fn to_ipv4(&self) -> Option<[u8; 4]> {
        if self.is_ipv4_mapped() {
            Some([self.0[12], self.0[13], self.0[14], self.0[15]])
        } else {
            None
        }
    }
    /// The IP address RoCEv2 uses for this GID (IPv4 for mapped GIDs, else IPv6).
    pub fn to_ip(&self) -> IpAddr {
        match self.to_ipv4() {
            Some(a) => IpAddr::V4(Ipv4Addr::from(a)),
            None => IpAddr::V6(Ipv6Addr::from(self.0)),
        }
    }
    /// Parse 32 hex digits (the ibv_rc_pingpong / sysfs form without colons;
    /// colons are skipped, so `fe80:0000:...` works too).
    pub fn from_hex(s: &str) -> Option<Gid> {
        let mut g = [0u8; 16];
        let mut n = 0;
        for c in s.bytes().filter(|&c| c != b':') {
            let v = (c as char).to_digit(16)? as u8;
            if n >= 32 {
                return None;
            }
            g[n / 2] |= if n % 2 == 0 { v << 4 } else { v };
            n += 1;
        }
        (n == 32).then_some(Gid(g))
    }
    /// A formatter for the 32-hex-digit form.
    pub fn hex(&self) -> GidHex<'_> {
        GidHex(self)
    }
}

/// Displays a GID as 32 lowercase hex digits.
pub struct GidHex<'a>(&'a Gid);
impl fmt::Display for GidHex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 .0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Displays the GID as an IP address (`10.0.0.1` for mapped GIDs).
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_ip())
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(a: Ipv4Addr) -> Gid {
        Gid::from_ipv4(a.octets())
    }
}
impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Gid {
        Gid(a.octets())
    }
}
impl From<IpAddr> for Gid {
    fn from(a: IpAddr) -> Gid {
        match a {
            IpAddr::V4(a) => a.into(),
            IpAddr::V6(a) => a.into(),
        }
    }
}
impl From<Gid> for IpAddr {
    fn from(g: Gid) -> IpAddr {
        g.to_ip()
    }
}
