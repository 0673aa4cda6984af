//! IPv4 header (20 bytes, no options: RoCEv2 never sends any).

use crate::bytes::{be16, put16};
use crate::error::{Error, Layer, Result};

pub const HEADER_LEN: usize = 20;
pub const PROTO_UDP: u8 = 17;

/// Internet checksum (RFC 1071) over `data`, folded, not complemented.
pub fn ones_complement_sum(data: &[u8], mut acc: u32) -> u16 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [b] = chunks.remainder() {
        acc += (*b as u32) << 8;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Zero-copy view of an IPv4 header.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }
    /// Wrap a buffer holding at least a 20-byte header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated(Layer::Ipv4));
        }
        Ok(Ipv4Packet { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    pub fn version(&self) -> u8 {
        self.b()[0] >> 4
    }
    /// Header length in 32-bit words.
    pub fn ihl(&self) -> u8 {
        self.b()[0] & 0x0f
    }
    pub fn dscp(&self) -> u8 {
        self.b()[1] >> 2
    }
    pub fn ecn(&self) -> u8 {
        self.b()[1] & 3
    }
    pub fn total_len(&self) -> u16 {
        be16(self.b(), 2)
    }
    pub fn ident(&self) -> u16 {
        be16(self.b(), 4)
    }
    pub fn dont_frag(&self) -> bool {
        self.b()[6] & 0x40 != 0
    }
    pub fn more_frags(&self) -> bool {
        self.b()[6] & 0x20 != 0
    }
    pub fn frag_offset(&self) -> u16 {
        be16(self.b(), 6) & 0x1fff
    }
    pub fn ttl(&self) -> u8 {
        self.b()[8]
    }
    pub fn protocol(&self) -> u8 {
        self.b()[9]
    }
    pub fn checksum(&self) -> u16 {
        be16(self.b(), 10)
    }
    pub fn src_addr(&self) -> [u8; 4] {
        let b = self.b();
        [b[12], b[13], b[14], b[15]]
    }
    pub fn dst_addr(&self) -> [u8; 4] {
        let b = self.b();
        [b[16], b[17], b[18], b[19]]
    }
    /// True when the header checksum verifies (over `ihl * 4` bytes).
    pub fn verify_checksum(&self) -> bool {
        let n = (self.ihl() as usize * 4).min(self.b().len());
        ones_complement_sum(&self.b()[..n], 0) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Set the ECN bits (e.g. to 0b11 = CE), leaving DSCP alone. Does not fix the checksum.
    pub fn set_ecn(&mut self, ecn: u8) {
        let b = self.buffer.as_mut();
        b[1] = (b[1] & 0xfc) | (ecn & 3);
    }
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[8] = ttl;
    }
    /// Recompute the header checksum.
    pub fn fill_checksum(&mut self) {
        let b = self.buffer.as_mut();
        put16(b, 10, 0);
        let c = !ones_complement_sum(&b[..HEADER_LEN], 0);
        put16(b, 10, c);
    }
}

/// Parsed IPv4 header. Protocol is always UDP; lengths and checksum are derived on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    /// DSCP, 6 bits.
    pub dscp: u8,
    /// ECN, 2 bits (0b11 = CE).
    pub ecn: u8,
    pub ident: u16,
    /// DF bit (rxe sets it).
    pub dont_frag: bool,
    pub ttl: u8,
    /// Bytes after the IP header (UDP header + UDP payload).
    pub payload_len: u16,
}

impl Ipv4Repr {
    /// Parse and validate (version, IHL 5, not a fragment, UDP, length, checksum).
    /// Returns the repr; the payload is `buf[20..20 + payload_len]`.
    pub fn parse(buf: &[u8]) -> Result<Ipv4Repr> {
        let p = Ipv4Packet::new_checked(buf)?;
        if p.version() != 4 {
            return Err(Error::BadIpVersion(p.version()));
        }
        if p.ihl() != 5 {
            return Err(Error::Ipv4Options(p.ihl()));
        }
        if p.protocol() != PROTO_UDP {
            return Err(Error::NotUdp(p.protocol()));
        }
        if p.frag_offset() != 0 {
            return Err(Error::Ipv4LaterFragment);
        }
        if p.more_frags() {
            // First fragment: RoCEv2 if it is for port 4791 (then malformed).
            return match buf.get(HEADER_LEN + 2..HEADER_LEN + 4) {
                Some(&[a, b]) if u16::from_be_bytes([a, b]) != crate::udp::ROCEV2_PORT => {
                    Err(Error::NotRoceV2Port(u16::from_be_bytes([a, b])))
                }
                _ => Err(Error::Ipv4Fragment),
            };
        }
        let tl = p.total_len() as usize;
        if tl < HEADER_LEN {
            return Err(Error::BadLength(Layer::Ipv4));
        }
        if tl > buf.len() {
            return Err(Error::Truncated(Layer::Ipv4));
        }
        if !p.verify_checksum() {
            return Err(Error::BadIpv4Checksum);
        }
        Ok(Ipv4Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            dscp: p.dscp(),
            ecn: p.ecn(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            ttl: p.ttl(),
            payload_len: (tl - HEADER_LEN) as u16,
        })
    }

    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the 20-byte header with total length and checksum.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: HEADER_LEN,
                have: buf.len(),
            });
        }
        if self.dscp > 63 || self.ecn > 3 {
            return Err(Error::FieldOverflow("ipv4.dscp/ecn"));
        }
        let total = self.payload_len as usize + HEADER_LEN;
        if total > 0xffff {
            return Err(Error::FieldOverflow("ipv4.total_len"));
        }
        let b = &mut buf[..HEADER_LEN];
        b[0] = 0x45;
        b[1] = (self.dscp << 2) | self.ecn;
        put16(b, 2, total as u16);
        put16(b, 4, self.ident);
        put16(b, 6, if self.dont_frag { 0x4000 } else { 0 });
        b[8] = self.ttl;
        b[9] = PROTO_UDP;
        b[12..16].copy_from_slice(&self.src);
        b[16..20].copy_from_slice(&self.dst);
        Ipv4Packet::new_unchecked(&mut *b).fill_checksum();
        Ok(HEADER_LEN)
    }
}
