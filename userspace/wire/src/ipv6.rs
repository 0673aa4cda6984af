//! IPv6 fixed header (40 bytes; extension headers are not carried by RoCEv2).

use crate::bytes::{be16, be32, put16, put32};
use crate::error::{Error, Layer, Result};

pub const HEADER_LEN: usize = 40;
pub const NEXT_HEADER_UDP: u8 = 17;

/// Zero-copy view of an IPv6 header.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated(Layer::Ipv6));
        }
        Ok(Ipv6Packet { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    pub fn version(&self) -> u8 {
        self.b()[0] >> 4
    }
    pub fn traffic_class(&self) -> u8 {
        ((be16(self.b(), 0) >> 4) & 0xff) as u8
    }
    pub fn flow_label(&self) -> u32 {
        be32(self.b(), 0) & 0x000f_ffff
    }
    pub fn payload_len(&self) -> u16 {
        be16(self.b(), 4)
    }
    pub fn next_header(&self) -> u8 {
        self.b()[6]
    }
    pub fn hop_limit(&self) -> u8 {
        self.b()[7]
    }
    pub fn src_addr(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.b()[8..24]);
        a
    }
    pub fn dst_addr(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.b()[24..40]);
        a
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Set the ECN bits (low two bits of the traffic class).
    pub fn set_ecn(&mut self, ecn: u8) {
        let b = self.buffer.as_mut();
        b[1] = (b[1] & !0x30) | ((ecn & 3) << 4);
    }
}

/// Parsed IPv6 header; next header is always UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Traffic class (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// Flow label, 20 bits.
    pub flow_label: u32,
    pub hop_limit: u8,
    /// Bytes after the fixed header (UDP header + UDP payload).
    pub payload_len: u16,
}

impl Ipv6Repr {
    pub fn parse(buf: &[u8]) -> Result<Ipv6Repr> {
        let p = Ipv6Packet::new_checked(buf)?;
        if p.version() != 6 {
            return Err(Error::BadIpVersion(p.version()));
        }
        if p.next_header() != NEXT_HEADER_UDP {
            return Err(Error::NotUdp(p.next_header()));
        }
        if HEADER_LEN + p.payload_len() as usize > buf.len() {
            return Err(Error::Truncated(Layer::Ipv6));
        }
        Ok(Ipv6Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            hop_limit: p.hop_limit(),
            payload_len: p.payload_len(),
        })
    }

    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: HEADER_LEN,
                have: buf.len(),
            });
        }
        if self.flow_label > 0xf_ffff {
            return Err(Error::FieldOverflow("ipv6.flow_label"));
        }
        let w0 = (6u32 << 28) | ((self.traffic_class as u32) << 20) | self.flow_label;
        put32(buf, 0, w0);
        put16(buf, 4, self.payload_len);
        buf[6] = NEXT_HEADER_UDP;
        buf[7] = self.hop_limit;
        buf[8..24].copy_from_slice(&self.src);
        buf[24..40].copy_from_slice(&self.dst);
        Ok(HEADER_LEN)
    }
}
