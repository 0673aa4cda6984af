//! Ethernet II header with optional 802.1Q (C-tag) and 802.1ad (S-tag) VLAN tags.

use crate::bytes::{be16, put16};
use crate::error::{Error, Layer, Result};

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// 802.1Q customer VLAN tag.
pub const TPID_8021Q: u16 = 0x8100;
/// 802.1ad service VLAN tag (QinQ outer tag).
pub const TPID_8021AD: u16 = 0x88a8;
/// Ethernet header length without tags.
pub const HEADER_LEN: usize = 14;
const TAG_LEN: usize = 4;

/// A 6-byte MAC address.
pub type MacAddr = [u8; 6];

/// Zero-copy view of an Ethernet header (untagged part: dst, src, first type field).
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }
    /// Wrap a buffer, checking it holds at least the 14-byte header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated(Layer::Ethernet));
        }
        Ok(EthernetFrame { buffer })
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    pub fn dst_addr(&self) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[0..6]);
        a
    }
    pub fn src_addr(&self) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[6..12]);
        a
    }
    /// The type field right after the addresses (a TPID if tagged).
    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), 12)
    }
    /// Bytes after the 14-byte header (tags, if any, are part of this).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[0..6].copy_from_slice(&a);
    }
    pub fn set_src_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[6..12].copy_from_slice(&a);
    }
    pub fn set_ethertype(&mut self, t: u16) {
        put16(self.buffer.as_mut(), 12, t)
    }
}

/// One VLAN tag (TCI plus the TPID that introduced it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// 0x8100 (802.1Q) or 0x88a8 (802.1ad).
    pub tpid: u16,
    /// Priority code point, 3 bits.
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN id, 12 bits.
    pub vid: u16,
}

impl VlanTag {
    /// An 802.1Q tag.
    pub const fn dot1q(pcp: u8, vid: u16) -> Self {
        VlanTag {
            tpid: TPID_8021Q,
            pcp,
            dei: false,
            vid,
        }
    }
    fn tci(&self) -> u16 {
        ((self.pcp as u16 & 7) << 13) | ((self.dei as u16) << 12) | (self.vid & 0x0fff)
    }
    fn from_tci(tpid: u16, tci: u16) -> Self {
        VlanTag {
            tpid,
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }
}

fn is_tpid(t: u16) -> bool {
    t == TPID_8021Q || t == TPID_8021AD
}

/// Parsed Ethernet header: addresses, up to two VLAN tags, inner ethertype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthRepr {
    pub dst: MacAddr,
    pub src: MacAddr,
    /// Outer (service, 802.1ad) tag; only with `vlan` also set.
    pub svlan: Option<VlanTag>,
    /// Inner (customer, 802.1Q) tag, or the only tag.
    pub vlan: Option<VlanTag>,
    /// Ethertype of what follows the tags. [`crate::emit_frame`] sets it from the IP version.
    pub ethertype: u16,
}

impl EthRepr {
    /// Parse the header (and tags). Returns the repr and the header length.
    pub fn parse(buf: &[u8]) -> Result<(EthRepr, usize)> {
        let f = EthernetFrame::new_checked(buf)?;
        let mut repr = EthRepr {
            dst: f.dst_addr(),
            src: f.src_addr(),
            svlan: None,
            vlan: None,
            ethertype: f.ethertype(),
        };
        let mut off = 12;
        let mut tags = [None; 2];
        let mut n = 0;
        while is_tpid(be16(buf, off)) {
            if n == 2 {
                // A third tag: not something a RoCE host sends.
                return Err(Error::NotIp(be16(buf, off)));
            }
            if buf.len() < off + TAG_LEN + 2 {
                return Err(Error::Truncated(Layer::Vlan));
            }
            tags[n] = Some(VlanTag::from_tci(be16(buf, off), be16(buf, off + 2)));
            n += 1;
            off += TAG_LEN;
        }
        repr.ethertype = be16(buf, off);
        match n {
            1 => repr.vlan = tags[0],
            2 => {
                repr.svlan = tags[0];
                repr.vlan = tags[1];
            }
            _ => {}
        }
        Ok((repr, off + 2))
    }

    /// Header length including tags.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + TAG_LEN * (self.vlan.is_some() as usize + self.svlan.is_some() as usize)
    }

    /// Write the header; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.header_len();
        if buf.len() < len {
            return Err(Error::BufferTooSmall {
                needed: len,
                have: buf.len(),
            });
        }
        if self.svlan.is_some() && self.vlan.is_none() {
            return Err(Error::FieldOverflow("eth.svlan without eth.vlan"));
        }
        buf[0..6].copy_from_slice(&self.dst);
        buf[6..12].copy_from_slice(&self.src);
        let mut off = 12;
        for t in [self.svlan, self.vlan].into_iter().flatten() {
            put16(buf, off, t.tpid);
            put16(buf, off + 2, t.tci());
            off += TAG_LEN;
        }
        put16(buf, off, self.ethertype);
        Ok(len)
    }
}
