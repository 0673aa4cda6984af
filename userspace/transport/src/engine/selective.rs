//! Selective repeat between two xroce peers (after IRN, SIGCOMM'18).
//!
//! # Design
//!
//! - **Agreement, in band.** Each RC QP has an [`SrMode`]: `Auto` (the
//!   engine's default, [`super::EngineConfig::selective_repeat`]), `Off`
//!   or `On` ([`super::Engine::set_selective_repeat`], while the QP is
//!   idle). Peers agree on the RoCE packets themselves, not at connection
//!   setup, so programs that exchange QP numbers their own way (UCX, MPI,
//!   Gloo, RDMA-CM) get it too. The signal is one bit of the BTH's byte 4
//!   (`xroce_wire::bth::SR_CAPABLE`, 0x01: the lowest of IBA's Resv6a
//!   bits, below FECN and BECN), which IBA has senders transmit as 0 and
//!   receivers ignore, and which the RoCEv2 ICRC covers masked to ones:
//!   rxe's hdr_check looks only at TVer, QPN, P_Key, type/state and
//!   addresses (bth_qpn masks the reserved byte off), and rxe_icrc.c ORs
//!   that byte to 0xff before the CRC. The bit means:
//!   - on a request: the sender's requester understands SACKs and
//!     switches when a response carries the bit. Auto and On QPs set it on
//!     every request, Off QPs never.
//!   - on a response (ACK/NAK, READ response, atomic ACK): the sender's
//!     responder runs selective repeat. Set only once it does.
//! - **Two halves.** The directions are independent (A's requester talks
//!   to B's responder, B's requester to A's responder), so the state is a
//!   requester half ([`SrReq`]) and a responder half ([`SrResp`]), each
//!   None until it switches (`On` QPs start with both; a QP reset starts
//!   its mode over, its next peer may be another).
//!   - An Auto **responder** switches when a request with the bit arrives,
//!     before handling it, from the expected PSN on: its peer reads SACKs.
//!     From then on its responses carry the bit and its ACKs SACKs.
//!   - An Auto **requester** switches when a response with the bit
//!     arrives, before handling it (so the ACK that switches it has its
//!     SACK read), from the oldest unacknowledged PSN on: the responder
//!     already runs SR. From then on every WRITE packet it sends, new or a
//!     retransmission of one first sent before, is SR format.
//!   - A peer that never sets the bit (rxe, a NIC, an Off xroce QP) turns
//!     neither half on: go-back-N both ways, the packets bit for bit those
//!     of an Off QP but for the bit on our requests.
//! - **Mixed formats.** A requester switches in the middle of a WRITE;
//!   its older packets (in flight, or sent again by a go-back-N retry
//!   before the switch) are go-back-N format. The SR responder takes an
//!   in-order WRITE packet by its place ([`SrInOrder`]): a FIRST outside a
//!   WRITE is the message's start in both formats and goes the go-back-N
//!   way (its whole range checked, so go-back-N MIDDLE/LAST packets can
//!   follow it); a FIRST inside a WRITE and every ONLY are SR packets
//!   placed by their own RETH (after which a go-back-N continuation no
//!   longer knows its place); a go-back-N MIDDLE/LAST whose place is
//!   unknown (after an SR packet, or after packets absorbed from the
//!   bitmap) is dropped as if lost and acknowledged, the requester (which
//!   has switched: it sent the SR packet before it) sends it again in SR
//!   format. Ahead of the expected PSN a go-back-N FIRST is placeable as
//!   an SR one (the same packet), MIDDLE/LAST are not.
//! - **WRITE packets carry a RETH each**, so the responder can place any of
//!   them at once. Opcodes stay standard ones that carry a RETH: every
//!   packet but the last is a WRITE FIRST, the last a WRITE ONLY (or ONLY
//!   with immediate); each RETH holds that packet's own address, the rkey
//!   and the message's total length (for the immediate's byte_len).
//! - **Responder.** A placeable packet (a WRITE packet of the above form,
//!   without immediate) ahead of the expected PSN is checked (rkey, bounds,
//!   access) and placed at once, and its PSN is marked in a bitmap
//!   ([`PsnRing`], [`RING_PSNS`] PSNs ahead of the expected one); a marked
//!   PSN is never placed again (exactly-once placement; duplicates are
//!   counted and re-acknowledged). The expected PSN, the MSN and every
//!   completion advance only over the contiguous prefix: after each in-order
//!   packet the responder absorbs the marked PSNs that follow. Everything
//!   else ahead of the expected PSN (SEND, READ and atomic requests, the
//!   last packet of a WRITE with immediate, PSNs beyond the bitmap) is
//!   dropped unmarked, as if lost: those run in order only, which keeps
//!   receive-WQE consumption, RNR NAKs and READ/atomic execution order
//!   exactly as in go-back-N. A placeable packet failing its check (R_Key,
//!   bounds, access, length) is the class C error it would be in order,
//!   under its own PSN: nothing more is placed ahead, and when the
//!   expected PSN reaches that PSN the responder NAKs it (remote access
//!   error or invalid request) and the QP goes to ERR with its
//!   asynchronous event, whatever the packet then at that PSN holds. So a
//!   guessed R_Key ahead writes nothing and costs the QP as in order, and
//!   the error fails the work request it belongs to (a NAK of the expected
//!   PSN at once would fail the one there, which may be a SEND waiting out
//!   an RNR NAK). A placed arrival that opens or moves past a gap (or
//!   asks for an ACK) is answered by an ACK carrying a SACK. A packet
//!   dropped ahead draws a sequence NAK, once per gap: the SR requester
//!   then resends everything neither acknowledged nor SACKed (what runs
//!   in order only must come again, the placed packets need not), where
//!   a SACK alone would name nothing to resend for it.
//! - **ACK.** The BTH PSN is the cumulative acknowledgement as always; an
//!   xroce-only SACK block (`xroce_wire::sack`) in the ACK's payload marks
//!   the PSNs received beyond it. Only SR QPs send or read it.
//! - **Requester.** SACKed PSNs are remembered ([`SrReq::sacked`]); every
//!   PSN below the highest SACKed that is neither acknowledged nor SACKed is
//!   a hole, queued once for retransmission of that one packet (a READ's
//!   response PSNs are not holes: only its request PSN is). A retransmission
//!   counts as lost again when a packet sent after it is SACKed while it is
//!   not (then it is sent again). The tail-loss probe comes after 4
//!   smoothed RTTs (at least 500 us, earlier than go-back-N's 2 ms: a
//!   needless probe costs one packet, not a window), repeats while nothing
//!   moves, and, when holes are known, resends the oldest unacknowledged
//!   packet (even if SACKed: it draws the ACK that may have been lost)
//!   instead of the last one. With nothing SACKed, a second probe queues
//!   every unacknowledged PSN, but only after a silence longer than the
//!   round trip and four times its variance, and each such probe makes the
//!   later ones wait four times as long until a fresh round-trip sample
//!   (copies are never samples, so behind a queue deeper than the estimate
//!   it would never catch up otherwise). The timeout queues every
//!   unacknowledged, unSACKed PSN. Retransmitted holes go before new data and outside the
//!   device's in-flight budget (their PSNs count already); SACKed PSNs do
//!   not count against the QP's window (IRN counts packets in flight).
//!   The early probe has a price: on a path whose queue holds packets for
//!   longer than its wait (engine_pressure's 1 Gb/s link with many QPs)
//!   it resends packets that were not lost.
//! - **READ responses** that arrive ahead of the completer's PSN are placed
//!   at once and only the gap before them is asked for again
//!   (`sr_read.rs`); RNR NAKs and sequence NAKs keep their go-back-N
//!   recovery; a READ/atomic answered late lets the cumulative ACK already
//!   received complete the WRITEs behind it.

use std::collections::VecDeque;

use xroce_wire::sack::{Sack, MAX_BITMAP_BYTES};
use xroce_wire::{psn_add, psn_diff, psn_lt, psn_sub, NakCode, Opcode, Syndrome, TransportRepr};

use super::completion::WcStatus;
use super::memory::AccessFlags;
use super::qp::{InMsg, QpCtx};
use super::timers::Timer;
use super::{Env, Transmit};

/// PSNs a [`PsnRing`] tracks from its base (the SACK block's reach).
pub const RING_PSNS: u32 = (MAX_BITMAP_BYTES * 8) as u32;
const RING_WORDS: usize = RING_PSNS as usize / 64;
/// Words of the ring of READ response PSNs placed ahead: 16,384 PSNs, a
/// READ of 16 MiB at MTU 1024 (UCX's rendezvous READs of Open MPI's 8 MiB
/// ring segments). It stays on this side, so it need not fit a SACK; with
/// the SACK's 1,024, every response a loss left more than that ahead was
/// refused and the READ went back N (a 64 MiB allreduce of 8 ranks at 1 %
/// loss took 2.2x its lossless time and 2.6x its frames).
const READ_RING_WORDS: usize = 256;

/// A set of PSNs in [base, base + 64 x WORDS), a bit per PSN indexed by
/// the PSN modulo the ring size (a power of two dividing 2^24, so the index
/// is the same across the PSN wrap).
pub(crate) struct PsnRing<const WORDS: usize = RING_WORDS> {
    base: u32,
    bits: [u64; WORDS],
    /// Marked PSNs.
    count: u32,
}

/// The front READ's response PSNs placed ahead ([`SrReq::read_got`]).
pub(crate) type ReadRing = PsnRing<READ_RING_WORDS>;

impl<const WORDS: usize> PsnRing<WORDS> {
    const PSNS: u32 = (WORDS * 64) as u32;

    fn new(base: u32) -> Self {
        Self {
            base,
            bits: [0; WORDS],
            count: 0,
        }
    }

    fn slot(p: u32) -> (usize, u64) {
        let i = (p % Self::PSNS) as usize;
        (i / 64, 1 << (i % 64))
    }

    /// PSNs it tracks from its base.
    pub(crate) fn reach(&self) -> u32 {
        Self::PSNS
    }

    pub(crate) fn in_range(&self, p: u32) -> bool {
        let d = psn_diff(p, self.base);
        (0..Self::PSNS as i32).contains(&d)
    }

    pub(crate) fn contains(&self, p: u32) -> bool {
        let (w, b) = Self::slot(p);
        self.in_range(p) && self.bits[w] & b != 0
    }

    /// Mark `p`; false if already marked or out of range.
    pub(crate) fn insert(&mut self, p: u32) -> bool {
        if !self.in_range(p) {
            return false;
        }
        let (w, b) = Self::slot(p);
        if self.bits[w] & b != 0 {
            return false;
        }
        self.bits[w] |= b;
        self.count += 1;
        true
    }

    fn remove(&mut self, p: u32) {
        let (w, b) = Self::slot(p);
        if self.in_range(p) && self.bits[w] & b != 0 {
            self.bits[w] &= !b;
            self.count -= 1;
        }
    }

    /// Move the base to `nb`, forgetting what falls below it; a base that
    /// jumped backwards or out of reach (a reset QP) empties the ring.
    pub(crate) fn advance_to(&mut self, nb: u32) {
        let d = psn_diff(nb, self.base);
        if d < 0 || d >= Self::PSNS as i32 {
            *self = Self::new(nb);
            return;
        }
        while self.base != nb {
            if self.count == 0 {
                self.base = nb;
                break;
            }
            let p = self.base;
            self.remove(p);
            self.base = psn_add(p, 1);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The lowest marked PSN: a word at a time from the base's slot round
    /// the ring (every marked PSN is within reach of the base).
    pub(crate) fn first(&self) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        let start = (self.base % Self::PSNS) as usize;
        let (w0, b0) = (start / 64, start % 64);
        for k in 0..=WORDS {
            let w = (w0 + k) % WORDS;
            let word = match k {
                0 => self.bits[w] & (!0u64 << b0),
                // Back at the base's word: the slots before the base's.
                _ if k == WORDS => self.bits[w] & !(!0u64 << b0),
                _ => self.bits[w],
            };
            if word != 0 {
                let slot = w * 64 + word.trailing_zeros() as usize;
                let d = (slot + Self::PSNS as usize - start) % Self::PSNS as usize;
                return Some(psn_add(self.base, d as u32));
            }
        }
        None
    }

    /// One past the highest marked PSN (the base when empty).
    fn end(&self) -> u32 {
        if self.count == 0 {
            return self.base;
        }
        let mut p = psn_add(self.base, Self::PSNS - 1);
        while !self.contains(p) {
            p = psn_sub(p, 1);
        }
        psn_add(p, 1)
    }
}

/// Requester side.
pub(crate) struct SrReq {
    /// PSNs at or after the completer's the responder reported received.
    pub sacked: PsnRing,
    /// One past the highest SACKed PSN.
    high: u32,
    /// One past the highest cumulatively acknowledged PSN: ahead of the
    /// completer's while it waits for a READ's or atomic's response.
    pub cum: u32,
    /// Holes below here have been queued already.
    scanned: u32,
    /// Holes to retransmit, oldest first.
    retx: VecDeque<u32>,
    /// A probe: this PSN goes once more even if SACKed (a timeout or
    /// tail-loss probe must draw an ACK: the one that would have moved the
    /// cumulative PSN may be lost).
    force: Option<u32>,
    /// Retransmitted holes not yet acknowledged: (PSN, the first new PSN
    /// sent after it). A SACK beyond that second PSN means it was lost again.
    sent: VecDeque<(u32, u32)>,
    /// Response PSNs of READs under way placed ahead of the completer's
    /// (`sr_read.rs`).
    pub read_got: ReadRing,
    /// Gaps [start, end) of READs under way to ask for, oldest first.
    pub read_asks: VecDeque<(u32, u32)>,
    /// Every response PSN below this one was seen or asked for (each
    /// missing one once).
    pub read_asked: u32,
}

impl SrReq {
    /// Keep the marks within [comp, max] (a QP reset and connected again
    /// starts a new PSN space).
    fn clamp(&mut self, comp: u32, max: u32) {
        let inside = |p: u32| !psn_lt(p, comp) && !psn_lt(max, p);
        for p in [&mut self.high, &mut self.cum, &mut self.scanned] {
            if !inside(*p) {
                *p = comp;
            }
        }
        self.sacked.advance_to(comp);
    }
}

/// Responder side.
pub(crate) struct SrResp {
    /// PSNs beyond the expected one that were placed.
    got: PsnRing,
    /// Of those, the last packets of messages (each advances the MSN).
    ends: PsnRing,
    /// One past the highest PSN placed ahead of the expected one.
    high: u32,
    /// A packet ahead failed its check (R_Key, bounds, access, length):
    /// its PSN and the NAK it earns once the expected PSN reaches it.
    /// Nothing is placed ahead from then on.
    refused: Option<(u32, NakCode)>,
}

impl SrReq {
    pub(crate) fn new(comp_psn: u32) -> Self {
        Self {
            sacked: PsnRing::new(comp_psn),
            high: comp_psn,
            cum: comp_psn,
            scanned: comp_psn,
            retx: VecDeque::new(),
            force: None,
            sent: VecDeque::new(),
            read_got: ReadRing::new(comp_psn),
            read_asks: VecDeque::new(),
            read_asked: comp_psn,
        }
    }
}

impl SrResp {
    pub(crate) fn new(epsn: u32) -> Self {
        Self {
            got: PsnRing::new(epsn),
            ends: PsnRing::new(epsn),
            high: epsn,
            refused: None,
        }
    }
}

/// How an RC QP chooses between go-back-N and selective repeat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SrMode {
    /// Never: the capable bit is never sent and the peer's is ignored
    /// (go-back-N in both directions, bit for bit as before).
    Off,
    /// Advertise with the capable bit and switch each half on by itself
    /// once the peer's bit shows it can (see the module header).
    #[default]
    Auto,
    /// Both halves on from the start, whatever the peer says (both sides
    /// agreed out of band; a peer that does not understand it fails).
    On,
}

impl SrMode {
    /// The names [`FromStr`](std::str::FromStr) accepts.
    pub const NAMES: &'static str = "off, auto or on";

    pub fn name(self) -> &'static str {
        match self {
            SrMode::Off => "off",
            SrMode::Auto => "auto",
            SrMode::On => "on",
        }
    }
}

impl std::fmt::Display for SrMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SrMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(SrMode::Off),
            "auto" => Ok(SrMode::Auto),
            "on" => Ok(SrMode::On),
            _ => Err(format!("{s:?}: use {}", Self::NAMES)),
        }
    }
}

/// Where an RC QP stands on selective repeat
/// ([`super::Engine::selective_repeat`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrStatus {
    pub mode: SrMode,
    /// The requester runs it (WRITEs with a RETH per packet, SACKs read).
    pub requester: bool,
    /// The responder runs it (WRITE packets placed ahead, SACKs sent).
    pub responder: bool,
}

/// How the responder of an SR QP takes an in-order WRITE packet.
pub(crate) enum SrInOrder {
    /// The go-back-N path: a message's first packet (the same in both
    /// formats), a go-back-N packet continuing one, anything not a WRITE.
    Gbn,
    /// [`QpCtx::sr_in_order`]: an SR-format packet (its own RETH).
    Sr,
    /// A go-back-N MIDDLE/LAST whose place in the message is unknown (the
    /// packets before it came in SR format or were placed ahead): dropped
    /// as if lost; the requester, which sent SR packets before it, has
    /// switched and sends it again in SR format.
    Lost,
}

impl QpCtx {
    // ------------------------------------------------------------ agreement

    /// Set the QP's [`SrMode`] and start it over (see [`Self::sr_restart`]).
    pub(crate) fn set_sr_mode(&mut self, mode: SrMode) {
        self.sr_mode = mode;
        self.sr_restart();
    }

    /// Start the mode over (a new QP, or a reset one, whose next peer may
    /// be another): both halves on under [`SrMode::On`], else both off
    /// until the peer's bits turn them on ([`SrMode::Auto`]).
    pub(crate) fn sr_restart(&mut self) {
        let on = self.sr_mode == SrMode::On;
        self.sr_req = on.then(|| Box::new(SrReq::new(self.req.comp_psn)));
        self.sr_resp = on.then(|| Box::new(SrResp::new(self.resp.epsn)));
    }

    /// Whether a request this QP sends carries the capable bit: our
    /// requester reads SACKs and switches when a response has the bit.
    pub(crate) fn sr_bit_on_request(&self) -> bool {
        self.sr_mode != SrMode::Off
    }

    /// Whether a response this QP sends carries the capable bit: only once
    /// our responder runs selective repeat, so a requester that sees it
    /// may send SR-format WRITEs and read the SACKs at once.
    pub(crate) fn sr_bit_on_response(&self) -> bool {
        self.sr_resp.is_some()
    }

    /// A request arrived (before it is handled): one with the capable bit
    /// comes from a requester that reads SACKs, so an [`SrMode::Auto`]
    /// responder switches to selective repeat now, from the expected PSN.
    pub(crate) fn sr_saw_request(&mut self, t: &TransportRepr) {
        if t.bth.sr_capable && self.sr_mode == SrMode::Auto && self.sr_resp.is_none() {
            self.sr_resp = Some(Box::new(SrResp::new(self.resp.epsn)));
        }
    }

    /// A response arrived (before it is handled, so an ACK that switches
    /// the requester has its SACK read): one with the capable bit comes
    /// from a responder running selective repeat, so an [`SrMode::Auto`]
    /// requester switches: its WRITE packets from now on (retransmissions
    /// of older ones too) carry a RETH each, and its ACKs' SACKs count.
    pub(crate) fn sr_saw_response(&mut self, t: &TransportRepr) {
        if t.bth.sr_capable && self.sr_mode == SrMode::Auto && self.sr_req.is_none() {
            self.sr_req = Some(Box::new(SrReq::new(self.req.comp_psn)));
        }
    }

    // ------------------------------------------------------------ responder

    /// SR responder entry for a packet ahead of the expected PSN.
    pub(crate) fn sr_out_of_order(&mut self, env: &mut Env<'_>, t: &TransportRepr, payload: &[u8]) {
        let p = t.bth.psn;
        env.stats.rx_out_of_sequence += 1;
        let Some(sr) = self.sr_resp.as_mut() else {
            return;
        };
        sr.got.advance_to(self.resp.epsn);
        sr.ends.advance_to(self.resp.epsn);
        if sr.got.contains(p) {
            env.stats.rx_duplicate += 1;
            self.queue_ack(psn_sub(self.resp.epsn, 1));
            return;
        }
        // Opens or moves past a gap: the requester learns of it now.
        let tell = t.bth.ack_req || p != sr.high || psn_lt(sr.high, self.resp.epsn);
        let o = t.bth.opcode;
        let placeable = matches!(o, Opcode::RC_RDMA_WRITE_FIRST | Opcode::RC_RDMA_WRITE_ONLY)
            && sr.got.in_range(p)
            && sr.refused.is_none();
        let placed = if placeable {
            match self.sr_place(env, t, payload) {
                Ok(()) => true,
                Err(code) => {
                    // A failed check is the class C error it is in order,
                    // under its own PSN, once the expected PSN reaches it
                    // ([`Self::sr_refused_now`]): a NAK now would have to
                    // name the expected PSN (one naming `p` acknowledges
                    // the holes before it) and so fail the request there,
                    // which may be well (a SEND waiting out an RNR NAK).
                    // Until then nothing more is placed ahead, so guessed
                    // R_Keys ahead write nothing, and the guess costs the
                    // QP when its PSN comes.
                    let sr = self.sr_resp.as_mut().expect("checked");
                    sr.refused = Some((p, code));
                    false
                }
            }
        } else {
            false
        };
        if placed {
            let sr = self.sr_resp.as_mut().expect("checked");
            sr.got.insert(p);
            if o == Opcode::RC_RDMA_WRITE_ONLY {
                sr.ends.insert(p);
            }
            if psn_lt(sr.high, psn_add(p, 1)) {
                sr.high = psn_add(p, 1);
            }
            env.stats.sr_placed_out_of_order += 1;
        } else {
            env.stats.sr_dropped_out_of_order += 1;
            if !self.resp.nak_sent {
                // What runs in order only (a SEND, READ, atomic) waits
                // behind the gap, and a SACK names nothing to resend for
                // it: every packet from the gap on must come again, as in
                // go-back-N, so say so now with a sequence NAK, once per
                // gap. Without it the requester found out by probing one
                // packet at a time or by its local ACK timeout (UCX's
                // eager SENDs at 1 % loss: 64 KiB allreduces took 3 s).
                self.resp.nak_sent = true;
                let e = self.resp.epsn;
                self.queue_nak(env, e, Syndrome::Nak(NakCode::PsnSequenceError), None);
                return;
            }
        }
        if tell {
            self.queue_ack(psn_sub(self.resp.epsn, 1));
        }
    }

    /// Before an in-order packet at PSN `p`: if a packet ahead under this
    /// PSN failed its check, the QP gets that class C error now (NAK of
    /// `p`, the QP to ERR) whatever the packet now at `p` holds. True when
    /// it did.
    pub(crate) fn sr_refused_now(&mut self, env: &mut Env<'_>, p: u32) -> bool {
        let Some((at, code)) = self.sr_resp.as_ref().and_then(|sr| sr.refused) else {
            return false;
        };
        if at != p {
            return false;
        }
        if let Some(sr) = self.sr_resp.as_mut() {
            sr.refused = None;
        }
        self.class_c(env, p, Syndrome::Nak(code), None);
        true
    }

    /// Check and place one SR WRITE packet (its RETH gives its address).
    fn sr_place(
        &mut self,
        env: &mut Env<'_>,
        t: &TransportRepr,
        payload: &[u8],
    ) -> Result<(), NakCode> {
        let Some(r) = t.reth else {
            return Err(NakCode::InvalidRequest);
        };
        if !self
            .attr
            .qp_access_flags
            .contains(AccessFlags::REMOTE_WRITE)
        {
            return Err(NakCode::InvalidRequest);
        }
        let mtu = self.mtu as usize;
        let len_ok = if t.bth.opcode == Opcode::RC_RDMA_WRITE_FIRST {
            payload.len() == mtu
        } else {
            payload.len() <= mtu && payload.len() as u64 <= u64::from(r.dma_len)
        };
        if !len_ok {
            return Err(NakCode::InvalidRequest);
        }
        if r.dma_len == 0 {
            // A zero-length WRITE (its payload is empty, checked above)
            // names no memory and needs no valid R_Key or VA (C9-88).
            return Ok(());
        }
        // Each packet's RETH names its own part: check that much.
        let access = AccessFlags::REMOTE_WRITE;
        let Some((Some(mr), off)) =
            super::responder::resolve_remote(env, self.pd, &r, payload.len() as u64, access)
        else {
            return Err(NakCode::RemoteAccessError);
        };
        mr.write_at(off, payload);
        Ok(())
    }

    /// How an in-order packet is taken: by the go-back-N path, as an
    /// SR-format WRITE packet, or dropped as lost (see [`SrInOrder`]). A
    /// WRITE's packets may come in both formats: the requester switches
    /// to SR format in the middle of a message (its older packets in
    /// flight and retransmitted ones then differ).
    pub(crate) fn sr_route(&self, t: &TransportRepr) -> SrInOrder {
        if self.sr_resp.is_none() {
            return SrInOrder::Gbn;
        }
        let in_write = self.resp.in_msg == InMsg::Write;
        match t.bth.opcode {
            // Not inside a WRITE: the message's first packet, at its
            // start in either format; the go-back-N path checks its whole
            // range and can go on with go-back-N MIDDLE/LAST packets. (A
            // FIRST inside a SEND is the sequence error that path reports.)
            Opcode::RC_RDMA_WRITE_FIRST if !in_write => SrInOrder::Gbn,
            // Inside a WRITE: an SR-format packet at its own address.
            Opcode::RC_RDMA_WRITE_FIRST => SrInOrder::Sr,
            Opcode::RC_RDMA_WRITE_ONLY | Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE => SrInOrder::Sr,
            Opcode::RC_RDMA_WRITE_MIDDLE
            | Opcode::RC_RDMA_WRITE_LAST
            | Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
                if in_write && self.resp.write.is_none() =>
            {
                SrInOrder::Lost
            }
            _ => SrInOrder::Gbn,
        }
    }

    /// SR responder: an in-order go-back-N packet that cannot be placed
    /// ([`SrInOrder::Lost`]): dropped, and an ACK (with its SACK) tells
    /// the requester where the hole is.
    pub(crate) fn sr_in_order_lost(&mut self, env: &mut Env<'_>) {
        env.stats.sr_dropped_out_of_order += 1;
        self.queue_ack(psn_sub(self.resp.epsn, 1));
    }

    /// SR responder: an in-order WRITE packet.
    pub(crate) fn sr_in_order(&mut self, env: &mut Env<'_>, t: &TransportRepr, payload: &[u8]) {
        let p = t.bth.psn;
        let o = t.bth.opcode;
        if self.resp.in_msg == InMsg::Send {
            // A WRITE inside a multi-packet SEND: the opcode sequence broke.
            self.class_c(
                env,
                p,
                Syndrome::Nak(NakCode::InvalidRequest),
                Some(WcStatus::RemInvReqErr),
            );
            return;
        }
        let with_imm = o == Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
        if with_imm && !self.have_recv_wqe() {
            self.rnr_nak(env, p);
            return;
        }
        match self.sr_place(env, t, payload) {
            Ok(()) => {}
            Err(NakCode::RemoteAccessError) => {
                self.write_access_error(env, t, with_imm);
                return;
            }
            Err(code) => {
                self.class_c(env, p, Syndrome::Nak(code), None);
                return;
            }
        }
        self.resp.epsn = psn_add(p, 1);
        self.resp.nak_sent = false;
        // A go-back-N continuation no longer knows where the message is.
        self.resp.write = None;
        if o == Opcode::RC_RDMA_WRITE_FIRST {
            self.resp.in_msg = InMsg::Write;
        } else {
            self.resp.in_msg = InMsg::None;
            self.resp.msn = psn_add(self.resp.msn, 1);
        }
        if with_imm {
            if let Some(r) = self.take_recv_wqe(env) {
                self.complete_write_imm(env, r.wr_id, t, t.reth.map_or(0, |r| r.dma_len));
            }
        }
        if t.bth.ack_req {
            self.queue_ack(p);
        }
    }

    /// After an in-order packet: move the expected PSN (and the MSN) over
    /// the PSNs already placed after it; acknowledge if it moved.
    pub(crate) fn sr_absorb(&mut self) {
        let Some(sr) = self.sr_resp.as_mut() else {
            return;
        };
        let mut e = self.resp.epsn;
        sr.got.advance_to(e);
        sr.ends.advance_to(e);
        if sr.got.is_empty() {
            return;
        }
        let start = e;
        let mut ended = true;
        while sr.got.contains(e) {
            ended = sr.ends.contains(e);
            if ended {
                self.resp.msn = psn_add(self.resp.msn, 1);
            }
            e = psn_add(e, 1);
        }
        sr.got.advance_to(e);
        sr.ends.advance_to(e);
        if e != start {
            // The last packet absorbed decides whether a WRITE goes on
            // (placed by its own RETH: no go-back-N continuation).
            self.resp.write = None;
            self.resp.in_msg = if ended { InMsg::None } else { InMsg::Write };
            self.resp.epsn = e;
            self.resp.nak_sent = false;
            // The hole closed: the requester's window may move on.
            self.queue_ack(psn_sub(e, 1));
        }
    }

    /// The SACK block for an ACK of `psn` about to leave, into `out`; 0 if
    /// none (not an SR QP, nothing beyond, or `psn` is not the latest
    /// cumulative acknowledgement).
    pub(crate) fn sr_sack_block(&self, psn: u32, out: &mut [u8]) -> usize {
        let Some(sr) = self.sr_resp.as_ref() else {
            return 0;
        };
        if psn != psn_sub(self.resp.epsn, 1) || sr.got.is_empty() {
            return 0;
        }
        let base = self.resp.epsn;
        let end = sr.got.end();
        let n = psn_diff(end, base).max(0) as usize;
        let mut bitmap = [0u8; MAX_BITMAP_BYTES];
        let bytes = n.div_ceil(8).min(MAX_BITMAP_BYTES);
        for i in 0..n.min(MAX_BITMAP_BYTES * 8) {
            if sr.got.contains(psn_add(base, i as u32)) {
                bitmap[i / 8] |= 1 << (i % 8);
            }
        }
        Sack::emit(base, &bitmap[..bytes], out).unwrap_or(0)
    }

    // ------------------------------------------------------------ requester

    /// An ACK of everything before `cum` (already applied to the
    /// completer) with `payload` arrived on an SR QP: record what it SACKs
    /// and queue the holes.
    pub(crate) fn sr_on_ack(&mut self, cum: u32, payload: &[u8]) {
        let comp = self.req.comp_psn;
        let max = self.req.max_psn;
        let Some(r) = self.sr_req.as_deref_mut() else {
            return;
        };
        r.clamp(comp, max);
        if psn_lt(r.cum, cum) {
            r.cum = if psn_lt(cum, comp) { comp } else { cum };
        }
        let comp = r.cum;
        if let Ok(s) = Sack::parse(payload) {
            for p in s.iter() {
                if psn_lt(p, max) && r.sacked.insert(p) && psn_lt(r.high, psn_add(p, 1)) {
                    r.high = psn_add(p, 1);
                }
            }
        }
        if psn_lt(r.high, comp) {
            r.high = comp;
        }
        if psn_lt(r.scanned, comp) {
            r.scanned = comp;
        }
        // Retransmissions a later packet overtook are lost again.
        let high = r.high;
        let mut again = Vec::new();
        r.sent.retain(|&(q, after)| {
            if psn_lt(q, comp) || r.sacked.contains(q) {
                return false;
            }
            if psn_lt(after, high) {
                again.push(q);
                return false;
            }
            true
        });
        r.retx.extend(again);
        let mut q = r.scanned;
        while psn_lt(q, r.high) {
            if !r.sacked.contains(q) {
                r.retx.push_back(q);
            }
            q = psn_add(q, 1);
        }
        r.scanned = r.high;
    }

    /// PSNs the requester may have outstanding past the completer's: the
    /// configured window, plus, with selective repeat, what was SACKed
    /// beyond it (those packets left the network: IRN counts packets in
    /// flight, so one hole does not stall the window), within half the
    /// bitmap's reach.
    pub(crate) fn req_window(&self, env: &Env<'_>) -> u32 {
        self.send_window_pkts(env.cfg.max_inflight_pkts)
    }

    /// [`req_window`](Self::req_window) under a configured window of
    /// `max_inflight_pkts`.
    pub(crate) fn send_window_pkts(&self, max_inflight_pkts: u32) -> u32 {
        let w = max_inflight_pkts.max(1);
        match self.sr_req.as_ref() {
            Some(sr) => (w + sr.sacked.count).min((RING_PSNS / 2).max(w)),
            None => w,
        }
    }

    /// Whether SR holes wait for retransmission.
    pub(crate) fn sr_retx_pending(&self) -> bool {
        self.sr_req
            .as_ref()
            .is_some_and(|s| !s.retx.is_empty() || s.force.is_some())
    }

    /// Known holes exist (something beyond the completer PSN was SACKed,
    /// or READ responses beyond it placed).
    pub(crate) fn sr_has_holes(&self) -> bool {
        self.sr_req
            .as_ref()
            .is_some_and(|s| !s.sacked.is_empty() || !s.read_got.is_empty())
    }

    /// The SR tail-loss probe: queue the oldest unacknowledged PSN; when
    /// the front READ has responses placed ahead, ask for its gap again
    /// instead (its re-request or those responses were lost).
    pub(crate) fn sr_probe_oldest(&mut self) {
        let comp = self.req.comp_psn;
        if !self.sr_read_ask_front_gap() {
            // Nothing to ask of the front READ (or no READ in front, e.g.
            // an atomic whose answer was lost): the oldest PSN again.
            if let Some(sr) = self.sr_req.as_mut() {
                sr.force = Some(comp);
            }
        }
    }

    /// Every unacknowledged, unSACKed PSN again (an SR QP's timeout, a
    /// sequence NAK, a second probe that drew nothing).
    pub(crate) fn sr_on_timeout(&mut self) {
        // What goes again is never a round-trip sample (Karn).
        self.req.rtt_sample = None;
        let (comp, max) = (self.req.comp_psn, self.req.max_psn);
        let Some(r) = self.sr_req.as_deref_mut() else {
            return;
        };
        r.clamp(comp, max);
        r.retx.clear();
        r.sent.clear();
        // The oldest unfinished request (a READ waiting for the rest of
        // its response resumes there), then what the peer did not ACK.
        r.force = Some(comp);
        let mut q = if psn_lt(comp, r.cum) {
            r.cum
        } else {
            psn_add(comp, 1)
        };
        while psn_lt(q, max) {
            if !r.sacked.contains(q) {
                r.retx.push_back(q);
            }
            q = psn_add(q, 1);
        }
        r.scanned = max;
        if psn_lt(r.high, max) {
            r.high = max;
        }
    }

    /// Send the next queued hole, if any (one packet, asking for an ACK).
    pub(crate) fn sr_retransmit(
        &mut self,
        env: &mut Env<'_>,
        now: u64,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if self.req.timers.is_armed(Timer::RnrBackoff) || !self.sr_retx_pending() {
            return None;
        }
        loop {
            let sr = self.sr_req.as_mut()?;
            let forced = sr.force;
            let q = forced.or_else(|| sr.retx.front().copied())?;
            let comp = self.req.comp_psn;
            let stale = psn_lt(q, comp)
                || !psn_lt(q, self.req.max_psn)
                || (forced.is_none() && sr.sacked.contains(q))
                || (psn_lt(q, sr.cum) && q != comp);
            // Only a request's first PSN is sent again (a READ's other
            // PSNs are its responses'; one partly answered resumes at the
            // completer's PSN), and only of a started WQE.
            let wqe_ok = !stale
                && self.sq.iter().any(|w| {
                    w.started
                        && !psn_lt(q, w.first_psn)
                        && !psn_lt(w.last_psn, q)
                        && (!w.op.is_read_or_atomic() || q == w.first_psn || q == comp)
                });
            let take = |sr: &mut SrReq| {
                if forced.is_some() {
                    sr.force = None;
                } else {
                    sr.retx.pop_front();
                }
            };
            if !wqe_ok {
                take(self.sr_req.as_mut()?);
                continue;
            }
            if !self.pacer_open(now) {
                return None;
            }
            take(self.sr_req.as_mut()?);
            let saved = (self.req.psn, self.req.idx, self.req.offset, self.req.noack);
            self.seek_req(q);
            self.req.noack = env.cfg.ack_every.saturating_sub(1);
            let r = self.req_poll(env, now, buf);
            (self.req.psn, self.req.idx, self.req.offset, self.req.noack) = saved;
            if r.is_some() {
                let after = self.req.max_psn;
                if let Some(sr) = self.sr_req.as_mut() {
                    sr.sent.push_back((q, after));
                }
                env.stats.sr_holes_retransmitted += 1;
            }
            return r;
        }
    }
}

#[cfg(test)]
mod ring_tests {
    use super::*;

    /// The lowest marked PSN, one PSN at a time.
    fn first_slowly<const W: usize>(r: &PsnRing<W>) -> Option<u32> {
        (0..PsnRing::<W>::PSNS)
            .map(|i| psn_add(r.base, i))
            .find(|&p| r.contains(p))
    }

    fn check<const W: usize>(base: u32, marks: &[u32]) {
        let mut r = PsnRing::<W>::new(base);
        assert_eq!(r.first(), None);
        for &m in marks {
            r.insert(psn_add(base, m % PsnRing::<W>::PSNS));
            assert_eq!(
                r.first(),
                first_slowly(&r),
                "base {base:#x} marks {marks:?}"
            );
        }
        // Forget them from the bottom up.
        for m in (0..PsnRing::<W>::PSNS).step_by(61) {
            r.advance_to(psn_add(base, m));
            assert_eq!(r.first(), first_slowly(&r), "base {base:#x} advanced {m}");
        }
    }

    #[test]
    fn first_finds_the_lowest_mark_across_words_the_ring_and_the_psn_wraps() {
        for base in [0, 5, 63, 64, 1000, (1 << 24) - 3, (1 << 24) - 700] {
            check::<RING_WORDS>(base, &[900, 70, 1023, 64, 1, 0]);
            check::<READ_RING_WORDS>(base, &[16_000, 9_000, 16_383, 128, 65, 2]);
        }
    }
}
