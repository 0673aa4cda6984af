//! Whole Ethernet RoCEv2 frames: Ethernet (+VLAN) / IPv4|IPv6 / UDP 4791 /
//! BTH + extension headers / payload / pad / ICRC.

use crate::error::{Error, Layer, Result};
use crate::eth::{EthRepr, MacAddr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::gid::Gid;
use crate::icrc::{self, ICRC_LEN};
use crate::ipv4::{self, Ipv4Repr};
use crate::ipv6::{self, Ipv6Repr};
use crate::transport::TransportRepr;
use crate::udp::{self, UdpChecksum, UdpRepr, ROCEV2_PORT};

/// The most bytes a frame adds to its payload: untagged Ethernet, IPv6 (the
/// longer IP header), UDP, BTH, the longest extension headers, the largest
/// pad and the ICRC. A frame of `n` payload bytes is at most `n + MAX_OVERHEAD`.
pub const MAX_OVERHEAD: usize = crate::eth::HEADER_LEN
    + ipv6::HEADER_LEN
    + udp::HEADER_LEN
    + crate::bth::HEADER_LEN
    + crate::opcode::HeaderSet::MAX_LEN
    + 3
    + ICRC_LEN;

/// IPv4 or IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    V4(Ipv4Repr),
    V6(Ipv6Repr),
}

impl IpRepr {
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => ipv4::HEADER_LEN,
            IpRepr::V6(_) => ipv6::HEADER_LEN,
        }
    }
    /// ECN bits (0b11 = CE: the receiver owes the sender a CNP).
    pub const fn ecn(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.ecn,
            IpRepr::V6(r) => r.traffic_class & 3,
        }
    }
    pub fn set_ecn(&mut self, ecn: u8) {
        match self {
            IpRepr::V4(r) => r.ecn = ecn & 3,
            IpRepr::V6(r) => r.traffic_class = (r.traffic_class & !3) | (ecn & 3),
        }
    }
    /// DSCP, the traffic class's upper six bits.
    pub const fn dscp(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.dscp,
            IpRepr::V6(r) => r.traffic_class >> 2,
        }
    }
    pub fn set_dscp(&mut self, dscp: u8) {
        match self {
            IpRepr::V4(r) => r.dscp = dscp & 0x3f,
            IpRepr::V6(r) => r.traffic_class = (dscp << 2) | (r.traffic_class & 3),
        }
    }
    /// Source GID (IPv4-mapped for IPv4).
    pub const fn src_gid(&self) -> Gid {
        match self {
            IpRepr::V4(r) => Gid::from_ipv4(r.src),
            IpRepr::V6(r) => Gid::from_ipv6(r.src),
        }
    }
    /// Destination GID (IPv4-mapped for IPv4).
    pub const fn dst_gid(&self) -> Gid {
        match self {
            IpRepr::V4(r) => Gid::from_ipv4(r.dst),
            IpRepr::V6(r) => Gid::from_ipv6(r.dst),
        }
    }
    /// IP header for a GID pair: IPv4 (TTL 64, DF, DSCP 0, as rxe) when both
    /// GIDs are IPv4-mapped, else IPv6 (hop limit 64). Lengths are filled on emit.
    pub fn from_gids(src: Gid, dst: Gid) -> IpRepr {
        match (src.to_ipv4(), dst.to_ipv4()) {
            (Some(s), Some(d)) => IpRepr::V4(Ipv4Repr {
                src: s,
                dst: d,
                dscp: 0,
                ecn: 0,
                ident: 0,
                dont_frag: true,
                ttl: 64,
                payload_len: 0,
            }),
            _ => IpRepr::V6(Ipv6Repr {
                src: src.0,
                dst: dst.0,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
                payload_len: 0,
            }),
        }
    }
    /// The IP payload length (UDP header and payload); `emit_headers` sets it.
    pub fn set_payload_len(&mut self, n: u16) {
        match self {
            IpRepr::V4(r) => r.payload_len = n,
            IpRepr::V6(r) => r.payload_len = n,
        }
    }
}

/// Every header of a RoCEv2 frame. On emit, `eth.ethertype`, the IP payload
/// length, the IPv4 checksum, the UDP length, the BTH pad count and the ICRC
/// are computed; whatever the repr holds for them is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    pub eth: EthRepr,
    pub ip: IpRepr,
    pub udp: UdpRepr,
    pub transport: TransportRepr,
}

impl FrameRepr {
    /// An untagged frame between two GIDs with rxe's defaults (see
    /// [`IpRepr::from_gids`]), UDP checksum 0 over IPv4 and computed over IPv6.
    pub fn new(
        src_mac: MacAddr,
        dst_mac: MacAddr,
        src: Gid,
        dst: Gid,
        udp_src_port: u16,
        transport: TransportRepr,
    ) -> FrameRepr {
        let ip = IpRepr::from_gids(src, dst);
        let mut udp = UdpRepr::rocev2(udp_src_port);
        if let IpRepr::V6(_) = ip {
            udp.checksum = UdpChecksum::Compute;
        }
        FrameRepr {
            eth: EthRepr {
                dst: dst_mac,
                src: src_mac,
                svlan: None,
                vlan: None,
                ethertype: 0,
            },
            ip,
            udp,
            transport,
        }
    }

    /// Length of the frame `emit_frame` writes for `payload_len` payload bytes.
    pub fn frame_len(&self, payload_len: usize) -> usize {
        self.eth.header_len()
            + self.ip.header_len()
            + udp::HEADER_LEN
            + self.transport.buffer_len(payload_len)
    }
}

/// Parse an Ethernet RoCEv2 frame. Returns the headers and the payload
/// (without pad and ICRC). The ICRC is NOT checked: call
/// [`icrc::verify_frame`] or use [`parse_frame_checked`]. Bytes after the IP
/// datagram (Ethernet padding) are ignored. Non-RoCEv2 frames give an error
/// for which [`Error::is_not_roce`] is true.
pub fn parse_frame(buf: &[u8]) -> Result<(FrameRepr, &[u8])> {
    let (mut eth, off) = EthRepr::parse(buf)?;
    let rest = &buf[off..];
    classify(eth.ethertype, rest)?;
    let (ip, l4) = match eth.ethertype {
        ETHERTYPE_IPV4 => {
            let r = Ipv4Repr::parse(rest)?;
            let end = ipv4::HEADER_LEN + r.payload_len as usize;
            (IpRepr::V4(r), &rest[ipv4::HEADER_LEN..end])
        }
        ETHERTYPE_IPV6 => {
            let r = Ipv6Repr::parse(rest)?;
            let end = ipv6::HEADER_LEN + r.payload_len as usize;
            (IpRepr::V6(r), &rest[ipv6::HEADER_LEN..end])
        }
        t => return Err(Error::NotIp(t)),
    };
    let (udp, udp_payload) = UdpRepr::parse(l4)?;
    if udp.dst_port != ROCEV2_PORT {
        return Err(Error::NotRoceV2Port(udp.dst_port));
    }
    if l4.len() != udp::HEADER_LEN + udp_payload.len() {
        return Err(Error::BadLength(Layer::Udp));
    }
    let (transport, payload) = TransportRepr::parse(udp_payload)?;
    // emit_frame fills the ethertype from the IP version: keep it canonical.
    eth.ethertype = match ip {
        IpRepr::V4(_) => ETHERTYPE_IPV4,
        IpRepr::V6(_) => ETHERTYPE_IPV6,
    };
    Ok((
        FrameRepr {
            eth,
            ip,
            udp,
            transport,
        },
        payload,
    ))
}

/// Reject what is plainly not RoCEv2 (other protocol, other UDP port) before
/// validating anything, so that e.g. a TCP packet with IP options or a UDP
/// packet with a bad IPv4 checksum is "not RoCEv2" rather than "malformed".
fn classify(ethertype: u16, ip: &[u8]) -> Result<()> {
    let (proto, l4) = match ethertype {
        ETHERTYPE_IPV4 => {
            let (Some(&vihl), Some(&proto)) = (ip.first(), ip.get(9)) else {
                return Ok(());
            };
            (proto, (vihl & 0x0f) as usize * 4)
        }
        ETHERTYPE_IPV6 => match ip.get(6) {
            Some(&nh) => (nh, ipv6::HEADER_LEN),
            None => return Ok(()),
        },
        t => return Err(Error::NotIp(t)),
    };
    if proto != ipv4::PROTO_UDP {
        return Err(Error::NotUdp(proto));
    }
    match ip.get(l4 + 2..l4 + 4) {
        Some(&[a, b]) if u16::from_be_bytes([a, b]) != ROCEV2_PORT => {
            // Later IPv4 fragments have no UDP header at l4: leave them to
            // Ipv4Repr::parse (which calls them not RoCEv2 as well).
            Err(Error::NotRoceV2Port(u16::from_be_bytes([a, b])))
        }
        _ => Ok(()),
    }
}

/// [`parse_frame`], then check the ICRC.
pub fn parse_frame_checked(buf: &[u8]) -> Result<(FrameRepr, &[u8])> {
    let r = parse_frame(buf)?;
    icrc::verify_frame(buf)?;
    Ok(r)
}

/// [`parse_frame_checked`], returning the whole UDP payload (BTH .. pad,
/// then the ICRC, which was checked) instead of the payload: the datagram
/// a UDP socket would deliver.
pub fn parse_frame_datagram(buf: &[u8]) -> Result<(FrameRepr, &[u8])> {
    let (repr, payload) = parse_frame_checked(buf)?;
    let at = headers_len(&repr.eth, &repr.ip);
    let len = repr.transport.buffer_len(payload.len());
    Ok((repr, &buf[at..at + len]))
}

/// Write a complete frame (headers, payload, pad, ICRC) into `buf`; returns
/// its length ([`FrameRepr::frame_len`]).
pub fn emit_frame(repr: &FrameRepr, payload: &[u8], buf: &mut [u8]) -> Result<usize> {
    emit_frame_with(repr, payload.len(), buf, |t| {
        repr.transport.emit(payload, t)
    })
}

/// [`emit_frame`] with the payload's `payload_len` bytes written into the
/// frame by `fill` ([`TransportRepr::emit_in_place`]): the sender reads
/// them from its memory region straight into the frame, with no copy in
/// between. An error of `fill` is returned ([`Error::PayloadUnavailable`]
/// for a source that is gone).
pub fn emit_frame_in_place(
    repr: &FrameRepr,
    payload_len: usize,
    buf: &mut [u8],
    fill: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<usize> {
    emit_frame_with(repr, payload_len, buf, |t| {
        repr.transport.emit_in_place(payload_len, t, fill)
    })
}

/// The frame around a transport part that `emit_transport` writes into
/// the buffer it is given (from the BTH on).
fn emit_frame_with(
    repr: &FrameRepr,
    payload_len: usize,
    buf: &mut [u8],
    emit_transport: impl FnOnce(&mut [u8]) -> Result<usize>,
) -> Result<usize> {
    let total = repr.frame_len(payload_len);
    if buf.len() < total {
        return Err(Error::BufferTooSmall {
            needed: total,
            have: buf.len(),
        });
    }
    let t_off = headers_len(&repr.eth, &repr.ip);
    let t_len = emit_transport(&mut buf[t_off..total])?;
    emit_headers(&repr.eth, &repr.ip, &repr.udp, t_len, &mut buf[..total])
}

/// Bytes of the Ethernet, IP and UDP headers in front of a UDP payload.
pub fn headers_len(eth: &EthRepr, ip: &IpRepr) -> usize {
    eth.header_len() + ip.header_len() + udp::HEADER_LEN
}

/// Completes a frame whose UDP payload (BTH .. pad, then a 4-byte ICRC
/// slot), `udp_payload_len` bytes, is in place at [`headers_len`] in
/// `buf`: writes the Ethernet, IP and UDP headers in front of it (lengths,
/// ethertype, IPv4 checksum, UDP checksum if asked), then the ICRC into
/// the slot, in one pass over the datagram. Returns the frame's length.
pub fn emit_headers(
    eth: &EthRepr,
    ip: &IpRepr,
    udp: &UdpRepr,
    udp_payload_len: usize,
    buf: &mut [u8],
) -> Result<usize> {
    let total = headers_len(eth, ip) + udp_payload_len;
    if buf.len() < total {
        return Err(Error::BufferTooSmall {
            needed: total,
            have: buf.len(),
        });
    }
    if udp_payload_len < ICRC_LEN {
        return Err(Error::Truncated(Layer::Icrc));
    }
    let buf = &mut buf[..total];
    let udp_len = udp::HEADER_LEN + udp_payload_len;
    let max = match ip {
        IpRepr::V4(_) => 0xffff - ipv4::HEADER_LEN,
        IpRepr::V6(_) => 0xffff,
    };
    if udp_len > max {
        return Err(Error::FieldOverflow("frame too long for IP"));
    }
    let mut eth = *eth;
    let mut ip = *ip;
    eth.ethertype = match ip {
        IpRepr::V4(_) => ETHERTYPE_IPV4,
        IpRepr::V6(_) => ETHERTYPE_IPV6,
    };
    ip.set_payload_len(udp_len as u16);
    let ip_off = eth.emit(buf)?;
    let l4_off = ip_off
        + match &ip {
            IpRepr::V4(r) => r.emit(&mut buf[ip_off..])?,
            IpRepr::V6(r) => r.emit(&mut buf[ip_off..])?,
        };
    udp.emit(&mut buf[l4_off..], udp_payload_len)?;
    let c = icrc::compute(&buf[ip_off..l4_off], &buf[l4_off..total - ICRC_LEN])?;
    buf[total - ICRC_LEN..].copy_from_slice(&c.to_le_bytes());
    if udp.checksum == UdpChecksum::Compute {
        let (hdr, l4) = buf[ip_off..].split_at_mut(l4_off - ip_off);
        match ip {
            IpRepr::V4(_) => udp::fill_checksum(&hdr[12..16], &hdr[16..20], l4),
            IpRepr::V6(_) => udp::fill_checksum(&hdr[8..24], &hdr[24..40], l4),
        }
    }
    Ok(total)
}
