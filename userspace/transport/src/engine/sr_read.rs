//! Selective repeat of READ responses at the requester (after IRN): on a
//! QP whose requester runs selective repeat, a response packet of a READ
//! under way that arrives ahead of the completer's PSN is placed at once
//! (its offset follows from its PSN: (PSN - the READ's first PSN) x MTU)
//! and its PSN remembered ([`SrReq::read_got`]). A responder sends a
//! READ's packets in order, so the PSNs between the last one seen and it
//! are lost: each such gap is asked for at once, by a READ request for just
//! that range (its first PSN, its address and length), which an xroce
//! responder answers with those packets alone (`responder.rs`, a duplicate
//! READ naming part of what it executed), ahead of the rest of a READ it
//! is still sending. An ACK beyond the front READ asks for what followed
//! its last response seen, not for the READ again. In-order responses then
//! move the completer's PSN over the PSNs placed ahead. A gap whose
//! re-request is lost too is the tail-loss probe's (it asks for the gap at
//! the completer's PSN again) and the timeout's (the READ's rest from the
//! completer's PSN, as before). With nothing placed ahead, the probe asks
//! for the READ's last response alone: late responses cost a packet, lost
//! ones show as a gap before it. A response packet ending a partial
//! re-request (LAST or ONLY short of the READ's last PSN) is accepted on
//! such a QP when it carries a full MTU.
//!
//! [`SrReq::read_got`]: super::selective::SrReq::read_got

use xroce_wire::{psn_add, psn_diff, psn_le, psn_lt, Opcode, RethRepr, TransportRepr};

use super::codec;
use super::qp::QpCtx;
use super::selective::SrReq;
use super::work::WrOpcode;
use super::wqe::sgl_write;
use super::{Env, Transmit};

/// Whether a READ response packet's payload fits its place in a READ of
/// `len` bytes and `mtu`: the READ's last PSN ends it exactly (LAST/ONLY);
/// any other is a full MTU (with selective repeat `partial_end`: a LAST or
/// ONLY may end a re-requested part there).
pub(crate) fn read_payload_fits(
    opcode: Opcode,
    offset: usize,
    payload: usize,
    len: usize,
    mtu: usize,
    is_last_psn: bool,
    partial_end: bool,
) -> bool {
    let final_pkt = matches!(
        opcode,
        Opcode::RC_RDMA_READ_RESPONSE_LAST | Opcode::RC_RDMA_READ_RESPONSE_ONLY
    );
    if is_last_psn {
        final_pkt && offset + payload == len
    } else {
        payload == mtu && (!final_pkt || partial_end)
    }
}

impl QpCtx {
    /// A READ response at a PSN ahead of the completer's on an SR
    /// requester: placed if it belongs to a READ under way (true), else
    /// false (the caller goes back N as before).
    pub(crate) fn sr_read_ahead(
        &mut self,
        env: &mut Env<'_>,
        t: &TransportRepr,
        payload: &[u8],
    ) -> bool {
        let p = t.bth.psn;
        let comp = self.req.comp_psn;
        let mtu = self.mtu as usize;
        let Some(sr) = self.sr_req.as_deref_mut() else {
            return false;
        };
        let Some(w) = self
            .sq
            .iter()
            .take_while(|w| w.started)
            .find(|w| w.is_read_holding(p))
        else {
            return false;
        };
        sr.read_got.advance_to(comp);
        if !psn_lt(comp, p) || !sr.read_got.in_range(p) {
            return false;
        }
        env.stats.rx_out_of_sequence += 1;
        if sr.read_got.contains(p) {
            env.stats.rx_duplicate += 1;
            return true;
        }
        let offset = psn_diff(p, w.first_psn) as usize * mtu;
        let fits = read_payload_fits(
            t.bth.opcode,
            offset,
            payload.len(),
            w.len as usize,
            mtu,
            p == w.last_psn,
            true,
        );
        if !fits {
            env.stats.rx_bad_response += 1;
            return true;
        }
        if !sgl_write(&w.sges, offset, payload) {
            // The front WQE fails only if it is this one; a later READ's
            // SGE fails when its turn comes (its data is placed again).
            env.stats.rx_bad_response += 1;
            return true;
        }
        sr.read_got.insert(p);
        env.stats.sr_read_placed_out_of_order += 1;
        self.sr_read_note_gaps(p);
        true
    }

    /// Response `p` was placed ahead: every PSN between the last one seen
    /// and `p` is lost (a responder sends a READ's packets in order), so
    /// each run of them within a READ is asked for now. Asked only when
    /// the completer reached it, each gap after the first waited for all
    /// that was queued ahead of the answer to the one before: a round trip
    /// and a queue per loss (a 64 MiB stream of 512 KiB READs at 1 % loss
    /// ran at 0.66x its lossless rate in simulation).
    fn sr_read_note_gaps(&mut self, p: u32) {
        let comp = self.req.comp_psn;
        let Some(sr) = self.sr_req.as_deref_mut() else {
            return;
        };
        let mut x = sr.seen_from(comp);
        if !psn_lt(x, p) {
            return;
        }
        sr.read_asked = psn_add(p, 1);
        for w in self.sq.iter().take_while(|w| w.started) {
            if !psn_lt(x, p) {
                break;
            }
            if !matches!(w.op, WrOpcode::RdmaRead { .. }) || psn_lt(w.last_psn, x) {
                continue;
            }
            if psn_lt(x, w.first_psn) {
                x = w.first_psn;
            }
            let end = if psn_lt(w.last_psn, p) {
                psn_add(w.last_psn, 1)
            } else {
                p
            };
            // Runs of PSNs not placed in [x, end).
            while psn_lt(x, end) {
                while psn_lt(x, end) && sr.read_got.contains(x) {
                    x = psn_add(x, 1);
                }
                let s = x;
                while psn_lt(x, end) && !sr.read_got.contains(x) {
                    x = psn_add(x, 1);
                }
                if psn_lt(s, x) {
                    sr.read_asks.push_back((s, x));
                }
            }
        }
    }

    /// After a response moved the completer's PSN: move on over the PSNs
    /// placed ahead, completing each READ that reaches its end, and over
    /// the WRITEs and SENDs before a READ answered ahead (the responder
    /// ran them, in order, before it). Its gaps were asked for when seen.
    pub(crate) fn sr_read_absorb(&mut self, env: &mut Env<'_>, now: u64) {
        loop {
            let comp = self.req.comp_psn;
            let Some(sr) = self.sr_req.as_deref_mut() else {
                return;
            };
            sr.read_got.advance_to(comp);
            let Some(first_got) = sr.read_got.first() else {
                return;
            };
            let Some(w) = self.sq.front().filter(|w| w.started) else {
                return;
            };
            if first_got != comp {
                if !w.op.is_read_or_atomic() && self.ack_up_to(env, first_got, now) {
                    continue;
                }
                break;
            }
            if !w.is_read_holding(comp) {
                break;
            }
            let last = w.last_psn;
            let mut e = comp;
            while psn_le(e, last) && sr.read_got.contains(e) {
                e = psn_add(e, 1);
            }
            sr.read_got.advance_to(e);
            self.req.comp_psn = e;
            if e == psn_add(last, 1) {
                self.complete_front_ok(env);
            }
            self.on_progress(env, comp, now);
        }
    }

    /// Whether responses of the front READ wait, placed ahead of the
    /// completer's PSN, for a gap before them.
    pub(crate) fn sr_read_placed_ahead(&mut self) -> bool {
        let comp = self.req.comp_psn;
        self.sr_req.as_deref_mut().is_some_and(|sr| {
            sr.read_got.advance_to(comp);
            !sr.read_got.is_empty()
        })
    }

    /// An ACK beyond the front READ: the responder sent all of it, so what
    /// follows the last response seen of it was lost; ask for that once.
    pub(crate) fn sr_read_ask_tail(&mut self) {
        let comp = self.req.comp_psn;
        let (Some(sr), Some(w)) = (self.sr_req.as_deref_mut(), self.sq.front()) else {
            return;
        };
        let s = sr.seen_from(comp);
        if !w.is_read_holding(comp) || psn_lt(w.last_psn, s) {
            return;
        }
        let end = psn_add(w.last_psn, 1);
        sr.read_asks.push_back((s, end));
        sr.read_asked = end;
    }

    /// The tail-loss probe: ask again for the front READ's gap at the
    /// completer's PSN (up to the first PSN placed ahead), whether asked
    /// before or not (the request or its answer may be lost). False when
    /// no response of it waits ahead.
    pub(crate) fn sr_read_ask_front_gap(&mut self) -> bool {
        let comp = self.req.comp_psn;
        let (Some(sr), Some(w)) = (self.sr_req.as_deref_mut(), self.sq.front()) else {
            return false;
        };
        sr.read_got.advance_to(comp);
        let Some(first_got) = sr.read_got.first() else {
            return false;
        };
        if !w.is_read_holding(comp) || !psn_lt(comp, first_got) {
            return false;
        }
        let end = psn_add(w.last_psn, 1);
        let e = if psn_lt(first_got, end) {
            first_got
        } else {
            end
        };
        sr.read_asks.push_front((comp, e));
        true
    }

    /// The tail-loss probe of a front READ with no response placed ahead:
    /// ask for its last response alone (TLP's last segment). Responses
    /// that are only late (a peer or this host off its cores for longer
    /// than the probe waits) then cost one packet again, where asking for
    /// the rest from the completer's PSN made the responder go back and
    /// send all of it again; lost ones are revealed by the answer, which
    /// lands ahead of them and asks for the gap before it. Like any
    /// probe, never a round-trip sample (Karn). False when the front is
    /// not a READ under way short of its last PSN.
    pub(crate) fn sr_read_ask_last(&mut self) -> bool {
        let comp = self.req.comp_psn;
        let (Some(sr), Some(w)) = (self.sr_req.as_deref_mut(), self.sq.front()) else {
            return false;
        };
        if !w.is_read_holding(comp) || comp == w.last_psn {
            return false;
        }
        sr.read_asks
            .push_front((w.last_psn, psn_add(w.last_psn, 1)));
        self.req.rtt_sample = None;
        true
    }

    /// The READ request for the oldest gap still missing, if any (one
    /// packet); gaps the completer passed or whose responses came since
    /// are dropped.
    pub(crate) fn sr_read_request(
        &mut self,
        env: &mut Env<'_>,
        now: u64,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let comp = self.req.comp_psn;
        let mtu = self.mtu;
        let (s, reth) = loop {
            let sr = self.sr_req.as_deref_mut()?;
            let &(mut s, e) = sr.read_asks.front()?;
            if psn_lt(s, comp) {
                s = comp;
            }
            while psn_lt(s, e) && sr.read_got.contains(s) {
                s = psn_add(s, 1);
            }
            let part = self
                .sq
                .iter()
                .take_while(|w| w.started)
                .find_map(|w| match w.op {
                    WrOpcode::RdmaRead { remote_addr, rkey }
                        if psn_lt(s, e)
                            && psn_le(w.first_psn, s)
                            && psn_le(e, psn_add(w.last_psn, 1)) =>
                    {
                        let off = psn_diff(s, w.first_psn) as u32 * mtu;
                        let len = (psn_diff(e, s) as u32 * mtu).min(w.len - off);
                        Some(RethRepr {
                            va: remote_addr + u64::from(off),
                            rkey,
                            dma_len: len,
                        })
                    }
                    _ => None,
                });
            match part {
                Some(reth) => break (s, reth),
                None => {
                    sr.read_asks.pop_front();
                }
            }
        };
        if !self.pacer_open(now) {
            return None;
        }
        let mut f = codec::packet(&self.tmpl, Opcode::RC_RDMA_READ_REQUEST, s);
        f.transport.bth.sr_capable = self.sr_bit_on_request();
        f.transport.reth = Some(reth);
        let t = codec::emit_copy(&f, &[], buf).ok()?;
        self.sr_req.as_deref_mut()?.read_asks.pop_front();
        let n = t.frame_len();
        env.stats.sr_read_gaps_requested += 1;
        env.stats.tx_data_packets += 1;
        env.stats.tx_retransmitted += 1;
        self.qstats.tx_packets += 1;
        self.qstats.tx_bytes += n as u64;
        self.qstats.retransmitted += 1;
        self.paced_send(now, n);
        Some(t)
    }
}

impl SrReq {
    /// The first response PSN not yet seen or asked for: `read_asked`,
    /// unless the completer's PSN `comp` passed it. A mark further than the
    /// ring's reach from `comp` is stale (responses in order moved the
    /// completer on, far enough for the PSN to wrap) and counts as passed.
    fn seen_from(&self, comp: u32) -> u32 {
        let ahead = psn_diff(self.read_asked, comp);
        if (0..self.read_got.reach() as i32).contains(&ahead) {
            self.read_asked
        } else {
            comp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_seen_mark_counts_as_passed() {
        let comp = 100;
        let mut sr = SrReq::new(comp);
        // Ahead within the ring's reach: still the mark.
        sr.read_asked = 150;
        assert_eq!(sr.seen_from(comp), 150);
        // Behind the completer: the completer's PSN.
        sr.read_asked = 90;
        assert_eq!(sr.seen_from(comp), comp);
        // Left behind so long that the PSN wrapped and it looks ahead by
        // millions: the completer's PSN, not a walk over millions of PSNs.
        sr.read_asked = psn_add(comp, 5_000_000);
        assert_eq!(sr.seen_from(comp), comp);
        // Across the wrap, within reach.
        let comp = (1 << 24) - 10;
        let mut sr = SrReq::new(comp);
        sr.read_asked = 5;
        assert_eq!(sr.seen_from(comp), 5);
    }
}
