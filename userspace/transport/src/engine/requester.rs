//! Requester: turns send WQEs into request packets (IBTA 9.7, rxe_req.c).
//!
//! - segmentation into FIRST/MIDDLE/LAST/ONLY by the path MTU, PSNs assigned
//!   per packet (a READ consumes one PSN per expected response packet);
//! - AckReq on the last packet of every message, every `ack_every` packets
//!   and when the in-flight window fills;
//! - at most `max_rd_atomic` READ/atomic WQEs outstanding; FENCE waits for
//!   every earlier READ/atomic to complete;
//! - go-back-N: a retry restarts transmission at the completer's PSN; the
//!   WQE and byte offset are recomputed from the PSN;
//! - the retransmission timer: tail-loss probes before the first timeout
//!   (once the round trip is known, repeated four times further apart each
//!   time, and on go-back-N each after the first a go-back-N retry: a
//!   responder that NAKed stays silent until the NAKed packet arrives), a
//!   timeout that doubles with consecutive expiries (capped);
//! - pacing by the congestion controller's rate (token bucket) and its hooks.

use xroce_wire::{
    psn_add, psn_diff, psn_le, psn_lt, psn_sub, AtomicEthRepr, DethRepr, Opcode, RethRepr, Service,
};

use super::codec;
use super::qp::QpCtx;
use super::qp_attr::QpState;
use super::timers::Timer;
use super::work::{SendFlags, WrOpcode};
use super::wqe::SendWqe;
use super::{Env, Transmit};

/// Consecutive retransmission timeouts double the timeout at most this many
/// times (8 x the QP's): with retry_cnt 7 a dead peer is reported after
/// 1+2+4+8+8+8+8+8 = 47 timeouts instead of 8 (3.2 s at timeout 14).
pub(crate) const RTO_BACKOFF_MAX: u8 = 3;
/// The shortest wait for an acknowledgement before a tail-loss probe.
pub(crate) const PROBE_MIN_NS: u64 = 2_000_000;
/// The shortest wait before a tail-loss probe on a selective-repeat QP.
pub(crate) const SR_PROBE_MIN_NS: u64 = 500_000;
/// ... and this many smoothed round trips ...
const PROBE_RTTS: u64 = 4;
/// ... but never longer than this: a host that keeps the peer off its
/// cores for tens of milliseconds inflates the RTT samples, and the probe
/// must still come within the 10 ms a stall may last (issue 13).
const PROBE_MAX_NS: u64 = 8_000_000;
/// The probe waits at most this fraction of the timeout (the probe is for
/// long timeouts; a short one recovers soon anyway).
const PROBE_RTO_RATIO: u64 = 4;

/// 4^n, n capped at 15: the probes' back-off factor.
fn four_to_the(n: u8) -> u64 {
    1 << (2 * n.min(15))
}

impl QpCtx {
    /// Point the requester at `p` (a PSN the completer has not yet seen
    /// acknowledged): find the started WQE containing it and the offset.
    pub(crate) fn seek_req(&mut self, p: u32) {
        let mtu = self.mtu as usize;
        for (i, w) in self.sq.iter().enumerate() {
            if !w.started {
                break;
            }
            if psn_le(w.first_psn, p) && psn_le(p, w.last_psn) {
                self.req.idx = i;
                self.req.offset = psn_diff(p, w.first_psn) as usize * mtu;
                self.req.psn = p;
                return;
            }
        }
        // Everything started is acknowledged: continue with the first
        // unstarted WQE at the highest PSN sent.
        self.req.idx = self.sq.iter().take_while(|w| w.started).count();
        self.req.offset = 0;
        self.req.psn = self.req.max_psn;
    }

    /// Start a go-back-N retransmission from the completer's PSN.
    pub(crate) fn start_retry(&mut self, env: &mut Env<'_>) {
        env.stats.retries_started += 1;
        self.req.started_retry = true;
        self.req.retry_psn = self.req.comp_psn;
        self.req.rtt_sample = None;
        self.req.noack = 0;
        let p = self.req.comp_psn;
        self.seek_req(p);
    }

    /// The retransmission timeout now: the QP's local ACK timeout, doubled
    /// by each consecutive expiry without progress up to
    /// 2^[`RTO_BACKOFF_MAX`] times it. A peer that is slow or gone is not
    /// hammered at the full rate; retry_cnt still counts expiries.
    pub(crate) fn backed_off_rto_ns(&self) -> Option<u64> {
        let shift = self.req.rto_backoff.min(RTO_BACKOFF_MAX);
        self.rto_ns().map(|t| t.saturating_mul(1 << shift))
    }

    /// How long the tail-loss probe waits for an acknowledgement: a few
    /// smoothed round trips, or the smoothed round trip and four times its
    /// variance if longer (RFC 6298's timeout: where a queue makes the
    /// round trip swing, a few smoothed ones are too short and the probe
    /// resends what is not lost), at least [`PROBE_MIN_NS`] (on a busy
    /// host the peer's thread can be off its core for a millisecond or
    /// two), at most [`PROBE_MAX_NS`] and a quarter of the timeout `rto`;
    /// then four times as long for each probe that sent a window again
    /// since the last round-trip sample (`probe_backoff`). None when that
    /// leaves less than the minimum: the timeout itself is short.
    fn probe_ns(&self, rto: u64) -> Option<u64> {
        let backoff = four_to_the(self.req.probe_backoff);
        let rtts = self.req.srtt_ns.map(|s| {
            s.saturating_mul(PROBE_RTTS)
                .max(s.saturating_add(self.req.rttvar_ns.saturating_mul(4)))
        });
        if self.sr_req.is_some() {
            // Selective repeat: a needless probe costs one packet, not a
            // window, so it comes sooner (IRN's low timeout).
            // None when the timeout itself comes within twice that.
            let p = rtts
                .unwrap_or(SR_PROBE_MIN_NS)
                .clamp(SR_PROBE_MIN_NS, PROBE_MAX_NS)
                .saturating_mul(backoff);
            return (p <= rto / 2).then_some(p);
        }
        let p = rtts
            .unwrap_or(PROBE_MIN_NS)
            .clamp(PROBE_MIN_NS, PROBE_MAX_NS)
            .saturating_mul(backoff)
            .min(rto / PROBE_RTO_RATIO);
        (p >= PROBE_MIN_NS).then_some(p)
    }

    /// Whether nothing was acknowledged for longer than the round trip and
    /// four times its variance (RFC 6298's timeout without its floor)
    /// since the timer that is due at `rto_at` was armed. The probe time
    /// is capped for hosts that stall, so behind a standing queue deeper
    /// than the cap the probes come before any ACK could: sending a window
    /// again then must wait for this, or each probe adds a window to the
    /// queue that delays the ACKs (4 senders into 200 Mbit/s collapsed to
    /// 7 % of the link). False without a round-trip estimate.
    fn silent_past_rtt(&self, now: u64, rto_at: u64) -> bool {
        let (Some(srtt), Some(rto)) = (self.req.srtt_ns, self.backed_off_rto_ns()) else {
            return false;
        };
        let armed_at = rto_at.saturating_sub(rto);
        let rtt_bound = srtt.saturating_add(self.req.rttvar_ns.saturating_mul(4));
        now.saturating_sub(armed_at) >= rtt_bound
    }

    /// (Re)arm the retransmission timer from `now`. Before any expiry, when
    /// the timeout is long next to the probe time, the timer first fires
    /// for a tail-loss probe and then, unchanged, at the full timeout.
    pub(crate) fn arm_rto(&mut self, now: u64) {
        self.req.probes = 0;
        let Some(rto) = self.backed_off_rto_ns() else {
            self.req.timers.cancel(Timer::Retransmit);
            self.req.rto_after_probe = None;
            return;
        };
        let probe = self.probe_ns(rto).filter(|_| self.req.rto_backoff == 0);
        if let Some(probe) = probe {
            self.req.timers.arm(Timer::Retransmit, now + probe);
            self.req.rto_after_probe = Some(now + rto);
        } else {
            self.req.timers.arm(Timer::Retransmit, now + rto);
            self.req.rto_after_probe = None;
        }
    }

    /// During a go-back-N retry (not yet all sent again), or while an RNR
    /// NAK holds the requester, a probe has nothing to add.
    fn can_probe(&self) -> bool {
        self.req.psn == self.req.max_psn && !self.req.timers.is_armed(Timer::RnrBackoff)
    }

    /// Tail-loss probe: nothing acknowledged for the probe time, so the last
    /// packet sent may be lost with nothing after it to reveal the gap
    /// (always so in a ping-pong), and waiting for the local ACK timeout
    /// (67 ms at perftest's timeout 14) would stall the application. Send
    /// that packet again: a repeated request is always legal (the responder
    /// answers a duplicate with an ACK, a READ or atomic replay), and a
    /// responder missing an earlier packet answers with a sequence NAK,
    /// which starts go-back-N. Not an expiry: retry_cnt is untouched, and
    /// the timeout still fires at its time if the probe is not answered.
    fn send_tail_probe(&mut self, env: &Env<'_>) {
        if !self.can_probe() {
            return;
        }
        if self.sr_has_holes() {
            // Selective repeat with known holes: the oldest one is what
            // holds everything up (its retransmission may be lost too).
            self.sr_probe_oldest();
            return;
        }
        if self.sr_read_ask_last() {
            // Selective repeat, the front READ under way and nothing of it
            // placed ahead: its last response alone (sr_read.rs).
            return;
        }
        let last = psn_sub(self.req.max_psn, 1);
        // A READ's last PSN is its last response's: a request for just
        // that one may lie beyond the window (a READ spans more PSNs than
        // the window holds), and then nothing went and no later probe came
        // (the QP waited out its local ACK timeout, 1 s under UCX). Ask
        // again for what the completer still waits for of it instead.
        let comp = self.req.comp_psn;
        let at = match self
            .sq
            .iter()
            .find(|w| w.started && psn_le(w.first_psn, last) && psn_le(last, w.last_psn))
        {
            Some(w) if w.op.is_read_or_atomic() => {
                if psn_lt(comp, w.first_psn) {
                    w.first_psn
                } else {
                    comp
                }
            }
            _ => last,
        };
        self.seek_req(at);
        // The probe asks for an ACK even when that packet did not (a
        // middle packet the pacer or the device budget left last).
        self.req.noack = env.cfg.ack_every.saturating_sub(1);
        // A probe is never an RTT sample (Karn), as any retransmission.
        if self.req.rtt_sample.is_some_and(|(p, _)| !psn_lt(p, at)) {
            self.req.rtt_sample = None;
        }
    }

    pub(crate) fn on_retransmit_timeout(&mut self, env: &mut Env<'_>, now: u64) {
        if !self.psn_outstanding() && self.sq.front().is_none_or(|w| !w.started) {
            self.req.timers.cancel(Timer::Retransmit);
            self.req.rto_after_probe = None;
            return;
        }
        if let Some(at) = self.req.rto_after_probe.take() {
            if at > now {
                self.req.timers.arm(Timer::Retransmit, at);
                let earlier = self.req.probes;
                self.req.probes = earlier.saturating_add(1);
                // Only with a round-trip estimate: without one the probe
                // time may be shorter than the path's round trip.
                let rtt_known = self.req.srtt_ns.is_some();
                let mut went_back = self.sr_req.is_none();
                if self.sr_req.is_none() && earlier > 0 && rtt_known && self.can_probe() {
                    // Go-back-N: the last packet's probe drew nothing. A
                    // responder that NAKed a gap answers no later packet
                    // until the one it NAKed arrives, so if that NAK or the
                    // retransmission it asked for was lost, only going back
                    // ends the silence; the local ACK timeout may be long
                    // (UCX asks for a second). Not an expiry: retry_cnt and
                    // the back-off are the timeout's.
                    env.stats.probe_retries += 1;
                    self.req.probe_backoff = self.req.probe_backoff.saturating_add(1);
                    self.start_retry(env);
                } else if self.sr_req.is_some()
                    && earlier > 0
                    && !self.sr_has_holes()
                    && self.req.psn == self.req.max_psn
                    && self.silent_past_rtt(now, at)
                {
                    // Selective repeat with nothing SACKed: the last
                    // packet's probe drew nothing. The responder drops what
                    // runs in order only behind a gap and NAKs the gap
                    // once; if that NAK was lost, the oldest unacknowledged
                    // packet ends the silence: it fills the gap (or, if it
                    // arrived, draws an ACK up to the gap), and the next
                    // tail probe then lands ahead of a gap the responder
                    // NAKs anew. Not everything again: on a busy host the
                    // usual silence is a peer off its core for a few
                    // milliseconds, and a window sent again there was a
                    // window of duplicates (760 a second, 64 KiB WRITEs on
                    // 2 cores). The local ACK timeout still sends
                    // everything. Not an expiry either.
                    env.stats.probe_retries += 1;
                    self.req.probe_backoff = self.req.probe_backoff.saturating_add(1);
                    // A READ under way with nothing of it placed ahead:
                    // its last response again tells as much (sr_read.rs).
                    if !self.sr_read_ask_last() {
                        self.sr_probe_oldest();
                    }
                    went_back = true;
                } else {
                    self.send_tail_probe(env);
                }
                // Probe again while nothing moves, up to the timeout
                // (go-back-N: once the round trip is known):
                // selective repeat every probe time (a probe costs one
                // packet; the re-sent hole may be lost too), but four times
                // as late as the probe before after a second probe, as
                // go-back-N always (each may resend a window, so a host
                // stalled for a few milliseconds, which the first probe
                // allows for, must not cost many; and behind a standing
                // queue deeper than the probe time, single packets every
                // probe time would add up to windows).
                let rto = self
                    .backed_off_rto_ns()
                    .filter(|_| self.sr_req.is_some() || rtt_known);
                if let Some(p) = rto.and_then(|rto| self.probe_ns(rto)) {
                    let next = if went_back {
                        p.saturating_mul(four_to_the(self.req.probes))
                    } else {
                        p
                    };
                    if now + next < at {
                        self.req.timers.arm(Timer::Retransmit, now + next);
                        self.req.rto_after_probe = Some(at);
                    }
                }
                return;
            }
            // The probe's time passed unnoticed up to the timeout's own.
        }
        env.stats.retry_timeouts += 1;
        self.qstats.timeouts += 1;
        if self.req.retry_left == 0 {
            self.fail_front(env, super::completion::WcStatus::RetryExcErr);
            return;
        }
        if self.req.retry_left != 7 {
            self.req.retry_left -= 1;
        }
        if self.sr_req.is_some() && self.req.psn == self.req.max_psn {
            // Selective repeat: what is neither acknowledged nor SACKed.
            env.stats.retries_started += 1;
            self.sr_on_timeout();
        } else {
            self.start_retry(env);
        }
        self.req.rto_backoff = self.req.rto_backoff.saturating_add(1).min(RTO_BACKOFF_MAX);
        self.arm_rto(now);
    }

    /// Produce the next request packet, if the window, the READ/atomic
    /// limit, fences, RNR back-off and the pacer allow one.
    pub(crate) fn req_poll(
        &mut self,
        env: &mut Env<'_>,
        now: u64,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let window = self.req_may_send(env, now)?;
        let idx = self.req.idx;
        self.start_wqe(idx);
        let w = &self.sq[idx];
        let k = psn_diff(self.req.psn, w.first_psn) as u32;
        let offset = self.req.offset;
        let plan = plan_packet(w, k, offset, self.mtu, self.sr_req.is_some());
        let f = self.request_frame(env, now, &plan, window);
        let ack_req = f.transport.bth.ack_req;
        // The payload goes from the WR's MRs straight into the datagram,
        // or stays there for the backend to send from.
        let wqe = &self.sq[idx];
        let base = buf.as_ptr() as usize;
        let mut gather = env.gather.as_deref_mut();
        let sent = codec::emit(&f, plan.payload_len, buf, |p| {
            if let Some(g) = gather.as_deref_mut().filter(|_| !p.is_empty()) {
                g.start(p.as_ptr() as usize - base);
                if wqe.gather_payload(offset, p.len(), g) {
                    return Ok(());
                }
            }
            if p.is_empty() || wqe.read_payload(offset, p) {
                Ok(())
            } else {
                Err(xroce_wire::Error::PayloadUnavailable)
            }
        });
        if sent.is_err() {
            if let Some(g) = gather {
                g.clear();
            }
        }
        let t = match sent {
            Ok(t) => t,
            Err(xroce_wire::Error::PayloadUnavailable) => {
                // An MR of the WR was deregistered while it was being sent.
                self.fail_front(env, super::completion::WcStatus::LocProtErr);
                return None;
            }
            Err(_) => return None,
        };
        self.after_request_sent(env, now, &plan, ack_req, t.frame_len());
        Some(t)
    }

    /// Whether the requester may send now (no RNR back-off, room in the
    /// window, the next WQE not held by SQD, a local error, a fence or the
    /// READ/atomic limit, the pacer open): the window in PSNs if so.
    fn req_may_send(&mut self, env: &Env<'_>, now: u64) -> Option<u32> {
        if self.req.timers.is_armed(Timer::RnrBackoff) {
            return None;
        }
        let w = self.sq.get(self.req.idx)?;
        let window = self.req_window(env);
        if psn_diff(self.req.psn, self.req.comp_psn) >= window as i32 {
            return None;
        }
        if !w.started {
            if self.state == QpState::Sqd || w.local_err.is_some() {
                return None;
            }
            if w.flags.contains(SendFlags::FENCE) && self.req.rd_atomic_outstanding > 0 {
                return None;
            }
            if w.op.is_read_or_atomic()
                && self.req.rd_atomic_outstanding >= (self.attr.max_rd_atomic.max(1)) as u32
            {
                return None;
            }
        }
        self.pacer_open(now).then_some(window)
    }

    /// The WQE at `idx` starts at the current PSN if it has not yet.
    fn start_wqe(&mut self, idx: usize) {
        let (psn, mtu) = (self.req.psn, self.mtu);
        let w = &mut self.sq[idx];
        if w.started {
            return;
        }
        w.started = true;
        w.first_psn = psn;
        w.npkts = if w.op.is_atomic() {
            1
        } else {
            w.len.div_ceil(mtu).max(1)
        };
        w.last_psn = psn_add(w.first_psn, w.npkts - 1);
        if w.op.is_read_or_atomic() {
            self.req.rd_atomic_outstanding += 1;
        }
    }

    /// The frame of `plan` at the current PSN: the QP's headers (a UD WR's
    /// own destination), the opcode's extension headers, SE and AckReq.
    fn request_frame(
        &self,
        env: &Env<'_>,
        now: u64,
        plan: &PacketPlan,
        window: u32,
    ) -> xroce_wire::FrameRepr {
        let ud = self.qp_type == super::qp_attr::QpType::Ud;
        let uc = ud || self.qp_type == super::qp_attr::QpType::Uc;
        let mut f = if ud {
            // One packet per message to the WR's own destination.
            let d = self.sq[self.req.idx].ud.expect("checked at post");
            let sport =
                d.av.udp_sport
                    .unwrap_or_else(|| xroce_wire::rocev2_src_port(0, self.qpn, d.remote_qpn));
            let tmpl = codec::template(env.cfg, &d.av, d.remote_qpn, sport);
            let mut f = codec::packet(&tmpl, in_service(plan.opcode, Service::Ud), self.req.psn);
            let qkey = if d.remote_qkey & 0x8000_0000 != 0 {
                self.attr.qkey
            } else {
                d.remote_qkey
            };
            f.transport.deth = Some(DethRepr {
                qkey,
                src_qp: self.qpn,
            });
            f
        } else if uc {
            codec::packet(
                &self.tmpl,
                in_service(plan.opcode, Service::Uc),
                self.req.psn,
            )
        } else {
            let mut f = codec::packet(&self.tmpl, plan.opcode, self.req.psn);
            f.transport.bth.sr_capable = self.sr_bit_on_request();
            f
        };
        let t = &mut f.transport;
        t.reth = plan.reth;
        t.imm_data = plan.imm;
        t.invalidate_rkey = plan.ieth;
        t.atomic_eth = plan.atomic;
        // IBTA 9.2.3: the solicited-event bit goes on the last packet only.
        t.bth.solicited = plan.solicited && plan.last_pkt;
        let next = psn_add(self.req.psn, plan.consumed);
        let window_fill = psn_diff(next, self.req.comp_psn) >= window as i32;
        // The last packet of the message's chunk of room in the device
        // budget asks too: its ACK frees the room (see `budget_allows`).
        let chunk_end = self.reserved_end.is_some_and(|r| next == r);
        let ack_due = self.req.unrequested_since.is_some_and(|t| {
            env.cfg.ack_req_interval_ns > 0 && now.saturating_sub(t) >= env.cfg.ack_req_interval_ns
        });
        t.bth.ack_req = !uc
            && (plan.last_pkt
                || self.req.noack + 1 >= env.cfg.ack_every
                || window_fill
                || chunk_end
                || ack_due);
        f
    }

    /// Bookkeeping after the packet of `plan` (`n` bytes) went out: PSNs,
    /// the WQE cursor, AckReq spacing, RTT sample, UC completion, the
    /// retransmission timer, counters and the pacer.
    fn after_request_sent(
        &mut self,
        env: &mut Env<'_>,
        now: u64,
        plan: &PacketPlan,
        ack_req: bool,
        n: usize,
    ) {
        let uc = matches!(
            self.qp_type,
            super::qp_attr::QpType::Ud | super::qp_attr::QpType::Uc
        );
        let sent_psn = self.req.psn;
        let retransmission = psn_lt(sent_psn, self.req.max_psn);
        self.req.psn = psn_add(self.req.psn, plan.consumed);
        if psn_lt(self.req.max_psn, self.req.psn) {
            self.req.max_psn = self.req.psn;
        }
        if plan.last_pkt {
            self.req.idx += 1;
            self.req.offset = 0;
        } else {
            self.req.offset += plan.payload_len;
        }
        self.req.noack = if ack_req { 0 } else { self.req.noack + 1 };
        self.req.unrequested_since = if ack_req {
            None
        } else {
            self.req.unrequested_since.or(Some(now))
        };
        if ack_req && self.req.rtt_sample.is_none() && !retransmission {
            self.req.rtt_sample = Some((sent_psn, now));
        }
        self.note_sent(sent_psn, now, retransmission);
        if uc {
            // UC: nothing is acknowledged; a WQE completes once sent.
            self.req.comp_psn = self.req.psn;
            if plan.last_pkt {
                self.uc_complete_sent(env);
            }
        } else if !self.req.timers.is_armed(Timer::Retransmit) {
            self.arm_rto(now);
        }
        env.stats.tx_data_packets += 1;
        self.qstats.tx_packets += 1;
        self.qstats.tx_bytes += n as u64;
        if retransmission {
            env.stats.tx_retransmitted += 1;
            self.qstats.retransmitted += 1;
        }
        self.paced_send(now, n);
    }
}

/// What the next packet of a WQE is: its opcode, the extension headers it
/// carries, its payload and the PSNs it consumes.
pub(crate) struct PacketPlan {
    opcode: Opcode,
    reth: Option<RethRepr>,
    imm: Option<u32>,
    ieth: Option<u32>,
    atomic: Option<AtomicEthRepr>,
    payload_len: usize,
    /// PSNs it takes: 1, or a READ request's response packets.
    consumed: u32,
    last_pkt: bool,
    solicited: bool,
}

/// Packet `k` (at byte `offset`) of the started WQE `w` at path MTU `mtu`;
/// `sr`: selective repeat (a RETH in every WRITE packet).
fn plan_packet(w: &SendWqe, k: u32, offset: usize, mtu: u32, sr: bool) -> PacketPlan {
    let mut p = PacketPlan {
        opcode: Opcode::RC_SEND_ONLY,
        reth: None,
        imm: None,
        ieth: None,
        atomic: None,
        payload_len: 0,
        consumed: 1,
        last_pkt: true,
        solicited: w.flags.contains(SendFlags::SOLICITED),
    };
    match w.op {
        WrOpcode::RdmaRead { remote_addr, rkey } => {
            p.reth = Some(RethRepr {
                va: remote_addr + offset as u64,
                rkey,
                dma_len: w.len.saturating_sub(offset as u32),
            });
            p.consumed = w.npkts - k;
            p.opcode = Opcode::RC_RDMA_READ_REQUEST;
        }
        WrOpcode::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            p.atomic = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: swap,
                compare,
            });
            p.opcode = Opcode::RC_COMPARE_SWAP;
        }
        WrOpcode::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        } => {
            p.atomic = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: add,
                compare: 0,
            });
            p.opcode = Opcode::RC_FETCH_ADD;
        }
        _ => plan_segment(&mut p, w, k, offset, mtu, sr),
    }
    p
}

/// [`plan_packet`] for SENDs and WRITEs: segment `k` of the message.
fn plan_segment(p: &mut PacketPlan, w: &SendWqe, k: u32, offset: usize, mtu: u32, sr: bool) {
    p.payload_len = (w.len as usize).saturating_sub(offset).min(mtu as usize);
    let first = k == 0;
    let last = k + 1 >= w.npkts;
    p.last_pkt = last;
    // A WRITE's RETH: on the first packet, or (selective repeat) on each,
    // with that packet's own address and the message's length.
    let write_reth = |remote_addr: u64, rkey: u32| {
        if sr {
            Some(RethRepr {
                va: remote_addr + offset as u64,
                rkey,
                dma_len: w.len,
            })
        } else {
            first.then_some(RethRepr {
                va: remote_addr,
                rkey,
                dma_len: w.len,
            })
        }
    };
    use Opcode as O;
    // (only, first, middle, last); selective repeat sends every WRITE
    // packet as FIRST / ONLY, see selective.rs.
    let (only, first_op, mid, last_op) = match w.op {
        WrOpcode::Send => (
            O::RC_SEND_ONLY,
            O::RC_SEND_FIRST,
            O::RC_SEND_MIDDLE,
            O::RC_SEND_LAST,
        ),
        WrOpcode::SendWithImm { imm } => {
            p.imm = last.then_some(imm);
            (
                O::RC_SEND_ONLY_WITH_IMMEDIATE,
                O::RC_SEND_FIRST,
                O::RC_SEND_MIDDLE,
                O::RC_SEND_LAST_WITH_IMMEDIATE,
            )
        }
        WrOpcode::SendWithInv { invalidate_rkey } => {
            p.ieth = last.then_some(invalidate_rkey);
            (
                O::RC_SEND_ONLY_WITH_INVALIDATE,
                O::RC_SEND_FIRST,
                O::RC_SEND_MIDDLE,
                O::RC_SEND_LAST_WITH_INVALIDATE,
            )
        }
        WrOpcode::RdmaWrite { remote_addr, rkey } => {
            p.reth = write_reth(remote_addr, rkey);
            if sr {
                (
                    O::RC_RDMA_WRITE_ONLY,
                    O::RC_RDMA_WRITE_FIRST,
                    O::RC_RDMA_WRITE_FIRST,
                    O::RC_RDMA_WRITE_ONLY,
                )
            } else {
                (
                    O::RC_RDMA_WRITE_ONLY,
                    O::RC_RDMA_WRITE_FIRST,
                    O::RC_RDMA_WRITE_MIDDLE,
                    O::RC_RDMA_WRITE_LAST,
                )
            }
        }
        WrOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            p.reth = write_reth(remote_addr, rkey);
            p.imm = last.then_some(imm);
            let mid = if sr {
                O::RC_RDMA_WRITE_FIRST
            } else {
                O::RC_RDMA_WRITE_MIDDLE
            };
            let last_op = if sr {
                O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
            } else {
                O::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
            };
            (
                O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                O::RC_RDMA_WRITE_FIRST,
                mid,
                last_op,
            )
        }
        _ => unreachable!("READ and atomics are planned by plan_packet"),
    };
    p.opcode = match (first, last) {
        (true, true) => only,
        (true, false) => first_op,
        (false, true) => last_op,
        (false, false) => mid,
    };
}

/// `rc` (a SEND or RDMA WRITE) in UC or UD, which post_send allowed.
fn in_service(rc: Opcode, service: Service) -> Opcode {
    rc.in_service(service)
        .expect("post_send admits only operations the QP's service has")
}
