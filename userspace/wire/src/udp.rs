//! UDP header and RoCEv2's use of it (destination port 4791, source port entropy).

use crate::bytes::{be16, put16};
use crate::error::{Error, Layer, Result};
use crate::ipv4::ones_complement_sum;

pub const HEADER_LEN: usize = 8;
/// IANA port for RoCEv2. Defined in xroce-common, which the XDP program
/// (built for BPF, without this crate) shares.
pub use xroce_common::ROCEV2_UDP_PORT as ROCEV2_PORT;

/// Zero-copy view of a UDP header.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated(Layer::Udp));
        }
        Ok(UdpPacket { buffer })
    }
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 0)
    }
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    pub fn len(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    pub fn is_empty(&self) -> bool {
        self.len() as usize <= HEADER_LEN
    }
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
}

/// What UDP checksum to put on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum UdpChecksum {
    /// 0: "no checksum" (what rxe sends over IPv4; RoCEv2 relies on the ICRC).
    #[default]
    Zero,
    /// Compute the real checksum over the pseudo header and the datagram.
    Compute,
    /// Write this exact value (parse yields it for a non-zero checksum, so
    /// emit(parse(frame)) reproduces the frame).
    Value(u16),
}

/// Parsed UDP header; length is derived on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    pub checksum: UdpChecksum,
}

impl UdpRepr {
    /// A RoCEv2 UDP header with the given source port and a zero checksum.
    pub const fn rocev2(src_port: u16) -> Self {
        UdpRepr {
            src_port,
            dst_port: ROCEV2_PORT,
            checksum: UdpChecksum::Zero,
        }
    }

    /// Parse; `buf` is the IP payload. Returns the repr and the UDP payload
    /// (bounded by the UDP length field). Does not verify the checksum.
    pub fn parse(buf: &[u8]) -> Result<(UdpRepr, &[u8])> {
        let p = UdpPacket::new_checked(buf)?;
        let len = p.len() as usize;
        if len < HEADER_LEN || len > buf.len() {
            return Err(Error::BadLength(Layer::Udp));
        }
        let checksum = match p.checksum() {
            0 => UdpChecksum::Zero,
            c => UdpChecksum::Value(c),
        };
        Ok((
            UdpRepr {
                src_port: p.src_port(),
                dst_port: p.dst_port(),
                checksum,
            },
            &buf[HEADER_LEN..len],
        ))
    }

    /// Write the header for a UDP payload of `payload_len` bytes. A
    /// `Compute` checksum is written as 0 here; [`fill_checksum`] fixes it
    /// once the payload is in place (emit_frame does this).
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: HEADER_LEN,
                have: buf.len(),
            });
        }
        let len = payload_len + HEADER_LEN;
        if len > 0xffff {
            return Err(Error::FieldOverflow("udp.len"));
        }
        put16(buf, 0, self.src_port);
        put16(buf, 2, self.dst_port);
        put16(buf, 4, len as u16);
        let c = match self.checksum {
            UdpChecksum::Zero | UdpChecksum::Compute => 0,
            UdpChecksum::Value(v) => v,
        };
        put16(buf, 6, c);
        Ok(HEADER_LEN)
    }
}

/// Compute the UDP checksum of `datagram` (header + payload, its checksum
/// field treated as 0) with the pseudo header of `src`/`dst` (4 or 16 bytes).
pub fn udp_checksum(src: &[u8], dst: &[u8], datagram: &[u8]) -> u16 {
    let len = datagram.len() as u32;
    let mut acc = ones_complement_sum(src, 0) as u32;
    acc += ones_complement_sum(dst, 0) as u32;
    acc += 17 + (len & 0xffff) + (len >> 16);
    acc += ones_complement_sum(&datagram[..6.min(datagram.len())], 0) as u32;
    if datagram.len() > 8 {
        acc += ones_complement_sum(&datagram[8..], 0) as u32;
    }
    let c = !ones_complement_sum(&[], acc);
    if c == 0 {
        0xffff
    } else {
        c
    }
}

/// Compute and store the checksum of the UDP datagram in `datagram`.
pub fn fill_checksum(src: &[u8], dst: &[u8], datagram: &mut [u8]) {
    let c = udp_checksum(src, dst, datagram);
    put16(datagram, 6, c);
}

/// RoCEv2 UDP source port from a flow label, as rdma_flow_label_to_udp_sport:
/// fold the 20-bit label to 14 bits and put it in 0xC000..=0xFFFF.
pub const fn flow_label_to_udp_sport(fl: u32) -> u16 {
    let low = fl & 0x3fff;
    let high = fl & 0xf_c000;
    ((low ^ (high >> 14)) as u16) | 0xc000
}

/// A 20-bit flow label from the local and remote QPNs, as rdma_calc_flow_label.
pub const fn qp_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = (lqpn as u64) * (rqpn as u64);
    v ^= v >> 20;
    v ^= v >> 40;
    (v as u32) & 0xf_ffff
}

/// RoCEv2 UDP source port for a QP pair, the way rxe (rdma_get_udp_sport)
/// picks it: `0xC000 | fold14(flow_label)`, where the flow label is the
/// given one, or (when 0) a hash of the local and remote QPNs.
pub const fn rocev2_src_port(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if flow_label == 0 {
        qp_flow_label(lqpn, rqpn)
    } else {
        flow_label
    };
    flow_label_to_udp_sport(fl)
}
