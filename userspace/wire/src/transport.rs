//! The transport level: BTH + extension headers + payload + pad + ICRC slot,
//! i.e. the UDP payload of a RoCEv2 packet, with no L2-L4 headers.

use crate::aeth::{AethRepr, Syndrome};
use crate::bth::{self, pad_count, BthRepr};
use crate::error::{Error, Layer, Result};
use crate::ext::{
    AtomicAckEthRepr, AtomicEthRepr, DethRepr, FethRepr, IethRepr, ImmDtRepr, RethRepr,
    CNP_RESERVED_LEN,
};
use crate::icrc::ICRC_LEN;
use crate::opcode::{HeaderSet, Opcode};

/// BTH plus the extension headers its opcode carries. Exactly the headers in
/// `bth.opcode.headers()` must be `Some` (checked by `emit`; `parse` yields
/// exactly those).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportRepr {
    pub bth: BthRepr,
    pub deth: Option<DethRepr>,
    pub feth: Option<FethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt (immediate data, as the 4 wire bytes read big-endian).
    pub imm_data: Option<u32>,
    /// IETH: the R_Key to invalidate.
    pub invalidate_rkey: Option<u32>,
}

impl TransportRepr {
    /// A repr with only the BTH set; fill the headers the opcode needs.
    pub const fn new(bth: BthRepr) -> Self {
        TransportRepr {
            bth,
            deth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            imm_data: None,
            invalidate_rkey: None,
        }
    }

    /// An RC ACKNOWLEDGE (or NAK / RNR NAK, by `syndrome`) for `psn`.
    pub const fn ack(dest_qp: u32, psn: u32, syndrome: Syndrome, msn: u32) -> Self {
        let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, dest_qp, psn));
        t.aeth = Some(AethRepr { syndrome, msn });
        t
    }

    /// A RoCEv2 CNP to `dest_qp` (the QP whose packet arrived CE-marked):
    /// opcode 0x81, BECN set, PSN 0, P_Key 0xffff (annex A17.9.3).
    pub const fn cnp(dest_qp: u32) -> Self {
        let mut bth = BthRepr::new(Opcode::CNP, dest_qp, 0);
        bth.mig_req = false;
        bth.becn = true;
        TransportRepr::new(bth)
    }

    /// The set of extension headers that are `Some` (CNP's reserved block
    /// counts as present for a CNP opcode).
    pub fn headers_present(&self) -> HeaderSet {
        let mut s = HeaderSet::EMPTY;
        let mut add = |p: bool, h: HeaderSet| {
            if p {
                s = s | h
            }
        };
        add(self.deth.is_some(), HeaderSet::DETH);
        add(self.feth.is_some(), HeaderSet::FETH);
        add(self.reth.is_some(), HeaderSet::RETH);
        add(self.atomic_eth.is_some(), HeaderSet::ATOMIC_ETH);
        add(self.aeth.is_some(), HeaderSet::AETH);
        add(self.atomic_ack_eth.is_some(), HeaderSet::ATOMIC_ACK_ETH);
        add(self.imm_data.is_some(), HeaderSet::IMM_DT);
        add(self.invalidate_rkey.is_some(), HeaderSet::IETH);
        add(
            self.bth.opcode.headers().contains(HeaderSet::CNP_RESERVED),
            HeaderSet::CNP_RESERVED,
        );
        s
    }

    /// BTH + extension headers, in bytes.
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.bth.opcode.headers().len()
    }

    /// Bytes `emit` writes for a payload of `payload_len` bytes: headers,
    /// payload, pad and the 4-byte ICRC (= the UDP payload length).
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + pad_count(payload_len) as usize + ICRC_LEN
    }

    /// Parse a UDP payload (BTH ... ICRC). The ICRC is not checked here (it
    /// needs the IP/UDP headers: see [`crate::icrc`]). Returns the repr and
    /// the payload without pad.
    pub fn parse(buf: &[u8]) -> Result<(TransportRepr, &[u8])> {
        let (bth, pad) = BthRepr::parse(buf)?;
        let op = bth.opcode;
        let hs = op.headers();
        let mut r = TransportRepr::new(bth);
        let mut off = bth::HEADER_LEN;
        for (h, len) in HeaderSet::ORDER {
            if !hs.contains(h) {
                continue;
            }
            let b = buf.get(off..).unwrap_or(&[]);
            match h {
                HeaderSet::DETH => r.deth = Some(DethRepr::parse(b)?),
                HeaderSet::FETH => r.feth = Some(FethRepr::parse(b)?),
                HeaderSet::RETH => r.reth = Some(RethRepr::parse(b)?),
                HeaderSet::ATOMIC_ETH => r.atomic_eth = Some(AtomicEthRepr::parse(b)?),
                HeaderSet::AETH => r.aeth = Some(AethRepr::parse(b)?),
                HeaderSet::ATOMIC_ACK_ETH => r.atomic_ack_eth = Some(AtomicAckEthRepr::parse(b)?),
                HeaderSet::IMM_DT => r.imm_data = Some(ImmDtRepr::parse(b)?.imm),
                HeaderSet::IETH => r.invalidate_rkey = Some(IethRepr::parse(b)?.rkey),
                _ => {
                    if b.len() < CNP_RESERVED_LEN {
                        return Err(Error::Truncated(Layer::Cnp));
                    }
                }
            }
            off += len;
        }
        if buf.len() < off + ICRC_LEN {
            return Err(Error::Truncated(Layer::Icrc));
        }
        let body = &buf[off..buf.len() - ICRC_LEN];
        // Payload + pad fill whole 4-byte words (IBTA: the pad aligns the
        // payload), so the pad count is the one `pad_count` gives.
        let pad = pad as usize;
        if pad > body.len() || body.len() & 3 != 0 {
            return Err(Error::BadPad(pad as u8));
        }
        let payload = &body[..body.len() - pad];
        // An ACK may carry xroce's SACK block (an extension only peers that
        // agreed on selective repeat send; see `sack`), nothing else.
        if !op.has_payload() && !body.is_empty() && !sack_on_ack(op, payload) {
            return Err(Error::UnexpectedPayload(op as u8));
        }
        Ok((r, payload))
    }

    /// Write BTH, extension headers, `payload`, zero pad and a zero ICRC
    /// slot into `buf`; returns the bytes written ([`Self::buffer_len`]).
    pub fn emit(&self, payload: &[u8], buf: &mut [u8]) -> Result<usize> {
        let op = self.bth.opcode;
        if !op.has_payload() && !payload.is_empty() && !sack_on_ack(op, payload) {
            return Err(Error::UnexpectedPayload(op as u8));
        }
        self.emit_with(payload.len(), buf, |p| {
            p.copy_from_slice(payload);
            Ok(())
        })
    }

    /// [`Self::emit`] with the payload's `payload_len` bytes written in
    /// place by `fill` instead of copied from a slice: a sender gathers
    /// them straight from where they live. An error of `fill` is returned.
    pub fn emit_in_place(
        &self,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<usize> {
        let op = self.bth.opcode;
        if !op.has_payload() && payload_len > 0 {
            return Err(Error::UnexpectedPayload(op as u8));
        }
        self.emit_with(payload_len, buf, fill)
    }

    fn emit_with(
        &self,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<usize> {
        let op = self.bth.opcode;
        if self.headers_present() != op.headers() {
            return Err(Error::HeaderMismatch(op as u8));
        }
        let total = self.buffer_len(payload_len);
        if buf.len() < total {
            return Err(Error::BufferTooSmall {
                needed: total,
                have: buf.len(),
            });
        }
        let pad = pad_count(payload_len);
        let mut off = self.bth.emit(buf, pad)?;
        if let Some(h) = &self.deth {
            off += h.emit(&mut buf[off..])?;
        }
        if let Some(h) = &self.feth {
            off += h.emit(&mut buf[off..])?;
        }
        if let Some(h) = &self.reth {
            off += h.emit(&mut buf[off..])?;
        }
        if let Some(h) = &self.atomic_eth {
            off += h.emit(&mut buf[off..])?;
        }
        if let Some(h) = &self.aeth {
            off += h.emit(&mut buf[off..])?;
        }
        if let Some(h) = &self.atomic_ack_eth {
            off += h.emit(&mut buf[off..])?;
        }
        if let Some(imm) = self.imm_data {
            off += ImmDtRepr { imm }.emit(&mut buf[off..])?;
        }
        if let Some(rkey) = self.invalidate_rkey {
            off += IethRepr { rkey }.emit(&mut buf[off..])?;
        }
        if op.headers().contains(HeaderSet::CNP_RESERVED) {
            buf[off..off + CNP_RESERVED_LEN].fill(0);
            off += CNP_RESERVED_LEN;
        }
        fill(&mut buf[off..off + payload_len])?;
        off += payload_len;
        buf[off..off + pad as usize + ICRC_LEN].fill(0);
        off += pad as usize + ICRC_LEN;
        debug_assert_eq!(off, total);
        Ok(off)
    }
}

/// `body` is a SACK block on an RC ACKNOWLEDGE.
fn sack_on_ack(op: Opcode, body: &[u8]) -> bool {
    op == Opcode::RC_ACKNOWLEDGE && crate::sack::is_sack_block(body)
}
