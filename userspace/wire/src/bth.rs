//! InfiniBand Base Transport Header (12 bytes).
//!
//! ```text
//! 0: opcode | 1: SE M PadCnt(2) TVer(4) | 2-3: P_Key
//! 4: F B resv6 (resv8a) | 5-7: DestQP | 8: A resv7 | 9-11: PSN
//! ```
//!
//! xroce uses the lowest bit of byte 4 (in IBA's Resv6a) as
//! [`BthRepr::sr_capable`]; see [`SR_CAPABLE`]. Between two xroce peers the
//! other five bits there and Resv7 carry a response's
//! [`BthRepr::delay_echo`]; see [`crate::delay_echo`].

use crate::bytes::{be16, be24, put16, put24};
use crate::delay_echo;
use crate::error::{Error, Layer, Result};
use crate::opcode::Opcode;
use crate::psn::PSN_MASK;

pub const HEADER_LEN: usize = 12;
/// Default partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// Largest QP number (24 bits); PSNs have [`PSN_MASK`].
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// The bit of BTH byte 4 xroce sends as [`BthRepr::sr_capable`]: the
/// lowest of the six IBA reserves there (Resv6a, below FECN 0x80 and BECN
/// 0x40). IBA transmits reserved bits as 0 and has receivers ignore them,
/// and the RoCEv2 ICRC covers byte 4 masked to all ones, so the bit
/// changes neither what another RoCE device does nor the ICRC.
pub const SR_CAPABLE: u8 = 0x01;

/// Zero-copy view of a BTH.
#[derive(Debug, Clone)]
pub struct BthHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BthHeader<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        BthHeader { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated(Layer::Bth));
        }
        Ok(BthHeader { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Raw opcode byte (see [`Opcode::from_u8`]).
    pub fn opcode_raw(&self) -> u8 {
        self.b()[0]
    }
    pub fn opcode(&self) -> Result<Opcode> {
        Opcode::from_u8(self.b()[0])
    }
    pub fn solicited(&self) -> bool {
        self.b()[1] & 0x80 != 0
    }
    pub fn mig_req(&self) -> bool {
        self.b()[1] & 0x40 != 0
    }
    pub fn pad_count(&self) -> u8 {
        (self.b()[1] >> 4) & 3
    }
    pub fn tver(&self) -> u8 {
        self.b()[1] & 0x0f
    }
    pub fn pkey(&self) -> u16 {
        be16(self.b(), 2)
    }
    pub fn fecn(&self) -> bool {
        self.b()[4] & 0x80 != 0
    }
    pub fn becn(&self) -> bool {
        self.b()[4] & 0x40 != 0
    }
    /// [`SR_CAPABLE`], see [`BthRepr::sr_capable`].
    pub fn sr_capable(&self) -> bool {
        self.b()[4] & SR_CAPABLE != 0
    }
    pub fn dest_qp(&self) -> u32 {
        be24(self.b(), 5)
    }
    pub fn ack_req(&self) -> bool {
        self.b()[8] & 0x80 != 0
    }
    /// [`BthRepr::delay_echo`]'s code (0: none).
    pub fn delay_echo(&self) -> u16 {
        delay_echo::from_bth_bytes(self.b()[4], self.b()[8])
    }
    pub fn psn(&self) -> u32 {
        be24(self.b(), 9)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthHeader<T> {
    pub fn set_psn(&mut self, psn: u32) {
        put24(self.buffer.as_mut(), 9, psn & PSN_MASK)
    }
    pub fn set_dest_qp(&mut self, qpn: u32) {
        put24(self.buffer.as_mut(), 5, qpn & QPN_MASK)
    }
    pub fn set_ack_req(&mut self, a: bool) {
        let b = self.buffer.as_mut();
        b[8] = (b[8] & 0x7f) | ((a as u8) << 7);
    }
    pub fn set_becn(&mut self, v: bool) {
        let b = self.buffer.as_mut();
        b[4] = (b[4] & !0x40) | ((v as u8) << 6);
    }
    pub fn set_fecn(&mut self, v: bool) {
        let b = self.buffer.as_mut();
        b[4] = (b[4] & !0x80) | ((v as u8) << 7);
    }
    pub fn set_sr_capable(&mut self, v: bool) {
        let b = self.buffer.as_mut();
        b[4] = (b[4] & !SR_CAPABLE) | if v { SR_CAPABLE } else { 0 };
    }
}

/// Parsed BTH. The pad count is not here: it is derived from the payload
/// length on emit and used to trim the payload on parse. Reserved bits
/// (but [`SR_CAPABLE`] and the [`delay_echo`](Self::delay_echo) bits) are
/// ignored on parse and written as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    pub opcode: Opcode,
    /// SE: solicited event.
    pub solicited: bool,
    /// M: migration state (rxe sends 1: path migrated).
    pub mig_req: bool,
    pub pkey: u16,
    /// F: forward ECN (resv8a bit 7; masked in the ICRC).
    pub fecn: bool,
    /// B: backward ECN (resv8a bit 6; masked in the ICRC).
    pub becn: bool,
    /// xroce's "selective repeat capable" ([`SR_CAPABLE`], resv8a bit 0, a
    /// reserved bit in IBA; masked in the ICRC). On an RC request: the
    /// sender's requester understands SACKs and switches to selective
    /// repeat once a response carries the bit; on an RC response: the
    /// sender's responder runs selective repeat (see the transport's
    /// `engine::selective`). Other RoCE devices send 0 and ignore it.
    pub sr_capable: bool,
    /// xroce's responder delay echo ([`crate::delay_echo`]): on a response
    /// to a selective-repeat peer, the code of the time the request it
    /// answers spent in the responder's host; 0: none. Other RoCE devices
    /// send 0 and ignore it.
    pub delay_echo: u16,
    /// Destination QP number, 24 bits.
    pub dest_qp: u32,
    /// A: acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number, 24 bits.
    pub psn: u32,
}

impl BthRepr {
    /// A BTH with defaults rxe uses (P_Key 0xffff, M=1, flags clear).
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: true,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            sr_capable: false,
            delay_echo: 0,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parse; returns the repr and the pad count.
    pub fn parse(buf: &[u8]) -> Result<(BthRepr, u8)> {
        let h = BthHeader::new_checked(buf)?;
        let opcode = h.opcode()?;
        if h.tver() != 0 {
            return Err(Error::BadTver(h.tver()));
        }
        Ok((
            BthRepr {
                opcode,
                solicited: h.solicited(),
                mig_req: h.mig_req(),
                pkey: h.pkey(),
                fecn: h.fecn(),
                becn: h.becn(),
                sr_capable: h.sr_capable(),
                delay_echo: h.delay_echo(),
                dest_qp: h.dest_qp(),
                ack_req: h.ack_req(),
                psn: h.psn(),
            },
            h.pad_count(),
        ))
    }

    /// Write the 12-byte BTH with the given pad count (0..=3).
    pub fn emit(&self, buf: &mut [u8], pad: u8) -> Result<usize> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: HEADER_LEN,
                have: buf.len(),
            });
        }
        if self.dest_qp > QPN_MASK {
            return Err(Error::FieldOverflow("bth.dest_qp"));
        }
        if self.psn > PSN_MASK {
            return Err(Error::FieldOverflow("bth.psn"));
        }
        if pad > 3 {
            return Err(Error::FieldOverflow("bth.pad_count"));
        }
        if self.delay_echo > delay_echo::MAX_CODE {
            return Err(Error::FieldOverflow("bth.delay_echo"));
        }
        let (echo4, echo8) = delay_echo::to_bth_bytes(self.delay_echo);
        buf[0] = self.opcode as u8;
        buf[1] = ((self.solicited as u8) << 7) | ((self.mig_req as u8) << 6) | (pad << 4);
        put16(buf, 2, self.pkey);
        buf[4] = ((self.fecn as u8) << 7)
            | ((self.becn as u8) << 6)
            | if self.sr_capable { SR_CAPABLE } else { 0 }
            | echo4;
        put24(buf, 5, self.dest_qp);
        buf[8] = ((self.ack_req as u8) << 7) | echo8;
        put24(buf, 9, self.psn);
        Ok(HEADER_LEN)
    }
}

/// Pad bytes that bring a payload of `len` bytes to a multiple of 4.
pub const fn pad_count(len: usize) -> u8 {
    ((4 - (len & 3)) & 3) as u8
}
