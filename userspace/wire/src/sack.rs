//! xroce's selective acknowledgement (SACK) block: an xroce-only extension
//! that two xroce peers which agreed on selective repeat at connection setup
//! append to an RC ACKNOWLEDGE (it is never sent to any other peer, and a
//! QP that did not agree ignores it).
//!
//! An ACK's BTH PSN stays the cumulative acknowledgement (everything up to
//! and including it arrived); the block says which later PSNs arrived too:
//!
//! ```text
//! 0        4        8                     8 + n (n = 4, 8, ... MAX_BITMAP_BYTES)
//! | "XRSK" | base   | bitmap, bit i (byte i / 8, LSB first) = PSN base + i arrived
//! ```
//!
//! `base` is a 24-bit PSN in a 32-bit big-endian word (top byte zero). The
//! block is a whole number of 4-byte words, so the ACK needs no pad. Parsing
//! accepts a payload on an ACK only when it is a well-formed block, so an
//! ACK with any other payload stays malformed.

use crate::error::{Error, Layer, Result};
use crate::psn::{psn_add, psn_diff};

/// The block's first four bytes.
pub const MAGIC: [u8; 4] = *b"XRSK";
/// Bytes before the bitmap.
pub const HEADER_LEN: usize = 8;
/// Largest bitmap (1,024 PSNs after `base`).
pub const MAX_BITMAP_BYTES: usize = 128;
/// Largest block.
pub const MAX_LEN: usize = HEADER_LEN + MAX_BITMAP_BYTES;

/// Whether `b` is a well-formed SACK block.
pub fn is_sack_block(b: &[u8]) -> bool {
    b.len() > HEADER_LEN
        && b.len() <= MAX_LEN
        && b.len().is_multiple_of(4)
        && b[..4] == MAGIC
        && b[4] == 0
}

/// A parsed SACK block (borrowing its bitmap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sack<'a> {
    /// PSN of bit 0.
    pub base: u32,
    pub bitmap: &'a [u8],
}

impl<'a> Sack<'a> {
    pub fn parse(b: &'a [u8]) -> Result<Sack<'a>> {
        if !is_sack_block(b) {
            return Err(Error::Truncated(Layer::Aeth));
        }
        Ok(Sack {
            base: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            bitmap: &b[HEADER_LEN..],
        })
    }

    /// Whether PSN `p` is marked received.
    pub fn contains(&self, p: u32) -> bool {
        let d = psn_diff(p, self.base);
        if d < 0 || d as usize >= self.bitmap.len() * 8 {
            return false;
        }
        let i = d as usize;
        self.bitmap[i / 8] & (1 << (i % 8)) != 0
    }

    /// The PSNs marked received, ascending from `base`.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let base = self.base;
        self.bitmap.iter().enumerate().flat_map(move |(k, &byte)| {
            (0..8u32)
                .filter(move |b| byte & (1 << b) != 0)
                .map(move |b| psn_add(base, k as u32 * 8 + b))
        })
    }

    /// Write a block for `base` and `bitmap` (its length is rounded up to
    /// whole words, at least one) into `buf`; returns the bytes written.
    pub fn emit(base: u32, bitmap: &[u8], buf: &mut [u8]) -> Result<usize> {
        let n = bitmap.len().max(1).div_ceil(4) * 4;
        if n > MAX_BITMAP_BYTES {
            return Err(Error::FieldOverflow("SACK bitmap"));
        }
        if base > crate::PSN_MASK {
            return Err(Error::FieldOverflow("SACK base PSN"));
        }
        let total = HEADER_LEN + n;
        if buf.len() < total {
            return Err(Error::BufferTooSmall {
                needed: total,
                have: buf.len(),
            });
        }
        buf[..4].copy_from_slice(&MAGIC);
        buf[4..8].copy_from_slice(&base.to_be_bytes());
        buf[8..8 + bitmap.len()].copy_from_slice(bitmap);
        buf[8 + bitmap.len()..total].fill(0);
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_wrap() {
        let mut buf = [0u8; MAX_LEN];
        let base = crate::PSN_MASK - 2; // bits 0..2 before the wrap, 3.. after
        let bitmap = [0b1010_0101u8, 0, 0x80];
        let n = Sack::emit(base, &bitmap, &mut buf).unwrap();
        assert_eq!(n, 12);
        let s = Sack::parse(&buf[..n]).unwrap();
        assert_eq!(s.base, base);
        let got: [u32; 5] = {
            let mut it = s.iter();
            core::array::from_fn(|_| it.next().unwrap())
        };
        assert_eq!(got, [base, base + 2, 2, 4, 20]);
        assert!(s.contains(2) && !s.contains(3) && !s.contains(base + 1));
        assert!(!s.contains(psn_add(base, 32)));
    }

    #[test]
    fn only_well_formed_blocks() {
        let mut buf = [0u8; MAX_LEN + 8];
        let n = Sack::emit(5, &[1], &mut buf).unwrap();
        assert!(is_sack_block(&buf[..n]));
        assert!(!is_sack_block(&buf[..n - 1]));
        assert!(!is_sack_block(&buf[..HEADER_LEN]));
        assert!(!is_sack_block(&[0]));
        buf[0] = b'Y';
        assert!(!is_sack_block(&buf[..n]));
        assert!(Sack::emit(5, &[0; MAX_BITMAP_BYTES + 1], &mut buf).is_err());
        assert!(Sack::emit(1 << 24, &[1], &mut buf).is_err());
    }

    #[test]
    fn rides_on_an_ack_only() {
        use crate::{AethRepr, BthRepr, Opcode, Syndrome, TransportRepr};
        let mut block = [0u8; MAX_LEN];
        let n = Sack::emit(9, &[0b11], &mut block).unwrap();
        let ack = TransportRepr::ack(3, 7, Syndrome::ACK, 1);
        let mut buf = [0u8; 256];
        let len = ack.emit(&block[..n], &mut buf).unwrap();
        let (back, payload) = TransportRepr::parse(&buf[..len]).unwrap();
        assert_eq!(back, ack);
        assert_eq!(Sack::parse(payload).unwrap().iter().count(), 2);
        // Not on other payload-less opcodes, and no other payload on an ACK.
        let mut atomic_ack = TransportRepr::new(BthRepr::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, 3, 7));
        atomic_ack.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK,
            msn: 1,
        });
        atomic_ack.atomic_ack_eth = Some(crate::AtomicAckEthRepr { orig_data: 0 });
        assert!(atomic_ack.emit(&block[..n], &mut buf).is_err());
        assert!(ack.emit(&[0; 12], &mut buf).is_err());
    }
}
