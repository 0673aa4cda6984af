//! The fabric round trip between two xroce peers: what a delay-based
//! congestion controller (Swift, TIMELY) should see, not the round trip as
//! the engine meets it.
//!
//! The engine's round trip runs from building a request to handling its
//! response. On a host whose cores the work fills, most of it can be time a
//! frame waited for a process that was off its core: the responder's I/O
//! thread (its request sat in the RX ring) and ours (the response did).
//! Milliseconds of it, against a 200 us target, drove Swift and TIMELY to
//! their floors with no queue anywhere: an 8-rank allreduce took 10x (Swift)
//! and 70x (TIMELY) longer than with no congestion control.
//!
//! So, as Swift splits fabric from endpoint delay with NIC timestamps:
//! - each frame carries the time it reached the host
//!   ([`RxDatagram::arrived_ns`](super::RxDatagram::arrived_ns), the XDP
//!   program's timestamp where the backend has one);
//! - the responder of a selective-repeat QP (the peer is xroce) writes into
//!   each response how long the request it answers was in its host, from
//!   arrival to the response ([`xroce_wire::delay_echo`]);
//! - the requester keeps when it sent each recent PSN ([`SentTimes`]) and
//!   takes, for the congestion controller, the response's arrival minus the
//!   request's send time minus the echoed delay.
//!
//! The retransmission timer and tail probes keep the whole round trip: a
//! response comes when the peer's process gets to it, and waiting less
//! than that would only send again.

use xroce_wire::{delay_echo, psn_le, Opcode, TransportRepr};

use super::qp::QpCtx;

/// PSNs whose send times a requester remembers: the responses that give
/// samples answer packets sent within one window, and the window is at most
/// this many packets ahead of the oldest unacknowledged one more than rarely.
const SENT_TIMES: usize = 256;

/// When each of the last [`SENT_TIMES`] PSNs was sent (first transmissions
/// only: a PSN sent again answers to either copy, Karn's rule).
pub(crate) struct SentTimes {
    slots: Box<[(u32, Option<u64>); SENT_TIMES]>,
}

impl SentTimes {
    fn new() -> Self {
        Self {
            slots: Box::new([(u32::MAX, None); SENT_TIMES]),
        }
    }

    fn slot(psn: u32) -> usize {
        psn as usize % SENT_TIMES
    }

    /// PSN `psn` went out at `now`, or again (`None`: no sample from it).
    pub(crate) fn record(&mut self, psn: u32, now: Option<u64>) {
        self.slots[Self::slot(psn)] = (psn, now);
    }

    /// When `psn` was sent, if it was sent once and is still remembered.
    pub(crate) fn get(&self, psn: u32) -> Option<u64> {
        match self.slots[Self::slot(psn)] {
            (p, t) if p == psn => t,
            _ => None,
        }
    }
}

/// What a response said about its request's time in the peer's host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Echo {
    /// The request it answers: an ACK's PSN, an atomic's, a READ's first.
    pub anchor: u32,
    /// The peer's delay, ns.
    pub delay_ns: u64,
    /// When the response reached this host (engine clock).
    pub arrived_ns: u64,
}

impl QpCtx {
    /// The requester sent `psn` at `now` (`retransmission`: again). Kept
    /// only once the peer runs selective repeat: no other peer echoes.
    pub(crate) fn note_sent(&mut self, psn: u32, now: u64, retransmission: bool) {
        if self.sr_req.is_none() {
            return;
        }
        self.req
            .sent_times
            .get_or_insert_with(|| Box::new(SentTimes::new()))
            .record(psn, (!retransmission).then_some(now));
    }

    /// A response arrived (at `arrived_ns`) answering the request at
    /// `anchor`: keep its echo for the round-trip sample it may complete.
    pub(crate) fn note_echo(&mut self, code: u16, anchor: u32, arrived_ns: u64) {
        self.req.echo = match (self.sr_req.is_some(), delay_echo::decode(code)) {
            (true, Some(delay_ns)) => Some(Echo {
                anchor,
                delay_ns,
                arrived_ns,
            }),
            _ => None,
        };
    }

    /// The round trip the congestion controller gets for a sample that
    /// just completed (`rtt`, the engine's): with the response's echo, the
    /// fabric round trip (`None` if its request's send time is not known);
    /// without one (a peer that does not echo), `rtt` itself.
    pub(crate) fn cc_rtt(&mut self, rtt: Option<u64>) -> Option<u64> {
        let echo = self.req.echo.take();
        let rtt = rtt?;
        let Some(e) = echo else {
            return Some(rtt);
        };
        let sent = self.req.sent_times.as_ref()?.get(e.anchor)?;
        let fabric = e
            .arrived_ns
            .checked_sub(sent)?
            .saturating_sub(e.delay_ns)
            .max(1);
        self.req.last_fabric_rtt_ns = Some(fabric);
        Some(fabric)
    }

    /// The request a response answers, whose send time its echo needs: an
    /// ACK's or atomic ACK's own PSN, a READ response's READ.
    pub(crate) fn echo_anchor(&self, t: &TransportRepr) -> u32 {
        let p = t.bth.psn;
        match t.bth.opcode {
            Opcode::RC_ACKNOWLEDGE | Opcode::RC_ATOMIC_ACKNOWLEDGE => p,
            _ => self
                .sq
                .iter()
                .find(|w| {
                    w.started
                        && w.op.is_read_or_atomic()
                        && psn_le(w.first_psn, p)
                        && psn_le(p, w.last_psn)
                })
                .map_or(p, |w| w.first_psn),
        }
    }
}

/// The echo for a response answering a request that reached this host at
/// `arrived_ns`, sent at `now`, by a responder that `echoes` (it runs
/// selective repeat: the requester is another xroce); 0 (none) otherwise.
pub(crate) fn echo_code(echoes: bool, arrived_ns: Option<u64>, now: u64) -> u16 {
    match (echoes, arrived_ns) {
        (true, Some(t)) => delay_echo::encode(now.saturating_sub(t)),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_psn_sent_again_or_overwritten_has_no_send_time() {
        let mut s = SentTimes::new();
        s.record(7, Some(100));
        assert_eq!(s.get(7), Some(100));
        s.record(7, None);
        assert_eq!(s.get(7), None, "sent again: either copy may be answered");
        s.record(8, Some(200));
        s.record(8 + SENT_TIMES as u32, Some(300));
        assert_eq!(s.get(8), None, "its slot holds a later PSN");
        assert_eq!(s.get(8 + SENT_TIMES as u32), Some(300));
    }
}
