//! Completer: matches ACKs, READ responses and atomic ACKs to send WQEs,
//! completes them in order and maps errors to WC status (IBTA 9.7.5 /
//! rxe_comp.c).

use xroce_wire::{psn_add, psn_diff, psn_le, psn_lt, NakCode, Opcode, Syndrome, TransportRepr};

use super::completion::WcStatus;
use super::qp::QpCtx;
use super::timers::Timer;
use super::wqe::sgl_write;
use super::Env;

impl QpCtx {
    /// Complete the front WQE with `status` (an error) and move to ERR.
    /// The completion is the report: no async event (IBTA C9-221, as rxe's
    /// completer).
    pub(crate) fn fail_front(&mut self, env: &mut Env<'_>, status: WcStatus) {
        if let Some(w) = self.pop_send_wqe(env) {
            let wc = self.send_wc(&w, status);
            self.complete(env, true, wc);
        }
        self.go_error.get_or_insert(super::qp::ErrCause::Completion);
    }

    /// Pop the (finished) front WQE, with a completion if signaled.
    pub(crate) fn complete_front_ok(&mut self, env: &mut Env<'_>) {
        let Some(w) = self.pop_send_wqe(env) else {
            return;
        };
        if w.op.is_read_or_atomic() {
            self.req.rd_atomic_outstanding = self.req.rd_atomic_outstanding.saturating_sub(1);
        }
        if self.req.idx > 0 {
            self.req.idx -= 1;
        } else {
            self.req.offset = 0;
        }
        if w.signaled {
            let wc = self.send_wc(&w, WcStatus::Success);
            self.complete(env, true, wc);
        }
    }

    /// Everything before `end` (exclusive) is acknowledged: complete SEND and
    /// WRITE WQEs ending before it. Stops at a READ/atomic still waiting for
    /// its response. Returns true if the completer's PSN advanced.
    pub(crate) fn ack_up_to(&mut self, env: &mut Env<'_>, end: u32, now: u64) -> bool {
        let old = self.req.comp_psn;
        while let Some(w) = self.sq.front() {
            if !w.started {
                break;
            }
            if w.op.is_read_or_atomic() {
                break;
            }
            if psn_lt(w.last_psn, end) {
                let next = psn_add(w.last_psn, 1);
                if psn_lt(self.req.comp_psn, next) {
                    self.req.comp_psn = next;
                }
                self.complete_front_ok(env);
            } else {
                if psn_lt(self.req.comp_psn, end) {
                    self.req.comp_psn = end; // part of a multi-packet message
                }
                break;
            }
        }
        let advanced = self.req.comp_psn != old;
        if advanced {
            self.on_progress(env, old, now);
        }
        advanced
    }

    /// The completer PSN moved forward from `old`.
    pub(crate) fn on_progress(&mut self, env: &mut Env<'_>, old: u32, now: u64) {
        self.req.retry_left = self.attr.retry_cnt;
        self.req.rnr_left = self.attr.rnr_retry;
        self.req.started_retry = false;
        // Progress ends a run of timeouts: the next waits the QP's timeout.
        self.req.rto_backoff = 0;
        let acked = psn_diff(self.req.comp_psn, old).max(0) as usize;
        let mut rtt = None;
        if let Some((p, t)) = self.req.rtt_sample {
            if psn_lt(p, self.req.comp_psn) {
                let r = now.saturating_sub(t);
                rtt = Some(r);
                self.req.rtt_sample = None;
                // Smoothed as TCP does (RFC 6298: alpha 1/8, beta 1/4, the
                // variance against the smoothed value before this sample),
                // for the probe.
                self.req.rttvar_ns = match self.req.srtt_ns {
                    None => r / 2,
                    Some(s) => self.req.rttvar_ns - self.req.rttvar_ns / 4 + s.abs_diff(r) / 4,
                };
                self.req.srtt_ns = Some(self.req.srtt_ns.map_or(r, |s| s - s / 8 + r / 8));
                self.req.last_rtt_ns = Some(r);
                self.req.probe_backoff = 0;
            }
        }
        let cc_rtt = self.cc_rtt(rtt);
        self.cc.on_ack(now, acked * self.mtu as usize, cc_rtt);
        if self.psn_outstanding() {
            self.arm_rto(now);
        } else {
            self.req.timers.cancel(Timer::Retransmit);
            self.req.rto_after_probe = None;
        }
        if psn_lt(self.req.psn, self.req.comp_psn) {
            let p = self.req.comp_psn;
            self.seek_req(p);
        }
        let _ = env;
    }

    /// After completions: a WQE at the front that failed local checks at
    /// post time completes now, in order, with its error. Not once an error
    /// has completed (the QP is on its way to ERR): the rest is flushed.
    pub(crate) fn complete_local_errors(&mut self, env: &mut Env<'_>) {
        if self.go_error.is_some() {
            return;
        }
        if let Some(w) = self.sq.front() {
            if !w.started {
                if let Some(st) = w.local_err {
                    self.fail_front(env, st);
                }
            }
        }
    }

    /// After `ack_up_to(p)` for a NAK of PSN `p`: the front WQE is a
    /// READ/atomic that ended before `p` and has not had its response (lost
    /// or late). The NAK is about a later request, not this one: retry it
    /// (as rxe's check_psn does) rather than complete it with the NAK's
    /// status.
    fn front_unanswered_before(&self, p: u32) -> bool {
        self.sq
            .front()
            .is_some_and(|w| w.started && w.op.is_read_or_atomic() && psn_lt(w.last_psn, p))
    }

    /// Retry from the completer PSN unless a retry for it already started.
    fn retry_if_new(&mut self, env: &mut Env<'_>) {
        if self.retry_running() {
            return;
        }
        self.start_retry(env);
    }

    /// A retry already runs from the completer's PSN (a duplicate NAK or
    /// out-of-sequence response asks for nothing new).
    fn retry_running(&self) -> bool {
        self.req.started_retry && self.req.retry_psn == self.req.comp_psn
    }

    pub(crate) fn comp_handle(
        &mut self,
        env: &mut Env<'_>,
        t: &TransportRepr,
        payload: &[u8],
        now: u64,
    ) {
        let p = t.bth.psn;
        let opcode = t.bth.opcode;
        // Valid responses are for PSNs we have sent and not yet completed.
        if !psn_lt(p, self.req.max_psn) {
            env.stats.rx_ghost_response += 1;
            return;
        }
        if psn_lt(p, self.req.comp_psn) && opcode != Opcode::RC_ACKNOWLEDGE {
            env.stats.rx_duplicate += 1;
            return;
        }
        match opcode {
            Opcode::RC_ACKNOWLEDGE => self.on_ack(env, t, payload, now),
            Opcode::RC_ATOMIC_ACKNOWLEDGE => {
                self.ack_up_to(env, p, now);
                if self.req.comp_psn != p {
                    self.retry_if_new(env);
                    return;
                }
                let Some(w) = self.sq.front() else {
                    env.stats.rx_bad_response += 1;
                    return;
                };
                if !w.op.is_atomic() || !w.started || w.first_psn != p {
                    env.stats.rx_bad_response += 1;
                    return;
                }
                let orig = t.atomic_ack_eth.map_or(0, |a| a.orig_data);
                if !sgl_write(&w.sges, 0, &orig.to_ne_bytes()) {
                    self.fail_front(env, WcStatus::LocProtErr);
                    return;
                }
                let old = self.req.comp_psn;
                self.req.comp_psn = psn_add(p, 1);
                self.complete_front_ok(env);
                self.on_progress(env, old, now);
            }
            _ => self.on_read_response(env, t, payload, now),
        }
        // Selective repeat: a READ/atomic answered at last lets the
        // cumulative ACK already received complete what follows it (the
        // peer will not acknowledge those PSNs again).
        if let Some(cum) = self.sr_req.as_ref().map(|s| s.cum) {
            if psn_lt(self.req.comp_psn, cum) && self.go_error.is_none() {
                self.ack_up_to(env, cum, now);
                // READ responses placed ahead may follow.
                self.sr_read_absorb(env, now);
            }
        }
        self.complete_local_errors(env);
    }

    fn on_read_response(&mut self, env: &mut Env<'_>, t: &TransportRepr, payload: &[u8], now: u64) {
        let p = t.bth.psn;
        self.ack_up_to(env, p, now);
        if self.req.comp_psn != p {
            // A response beyond the next expected one: something was lost.
            // Selective repeat places it and asks for the gap alone.
            if self.sr_read_ahead(env, t, payload) {
                return;
            }
            env.stats.rx_out_of_sequence += 1;
            self.retry_if_new(env);
            return;
        }
        let mtu = self.mtu as usize;
        let Some(w) = self.sq.front() else {
            env.stats.rx_bad_response += 1;
            return;
        };
        if !w.is_read_holding(p) {
            env.stats.rx_bad_response += 1;
            return;
        }
        let k = psn_diff(p, w.first_psn) as usize;
        let offset = k * mtu;
        let is_last_psn = p == w.last_psn;
        let ok_len = super::sr_read::read_payload_fits(
            t.bth.opcode,
            offset,
            payload.len(),
            w.len as usize,
            mtu,
            is_last_psn,
            self.sr_req.is_some(),
        );
        if !ok_len {
            env.stats.rx_bad_response += 1;
            return;
        }
        if !sgl_write(&w.sges, offset, payload) {
            self.fail_front(env, WcStatus::LocProtErr);
            return;
        }
        let old = self.req.comp_psn;
        self.req.comp_psn = psn_add(p, 1);
        if is_last_psn {
            self.complete_front_ok(env);
        }
        self.on_progress(env, old, now);
        self.sr_read_absorb(env, now);
    }

    fn on_ack(&mut self, env: &mut Env<'_>, t: &TransportRepr, payload: &[u8], now: u64) {
        let p = t.bth.psn;
        let Some(aeth) = t.aeth else {
            env.stats.rx_bad_response += 1;
            return;
        };
        match aeth.syndrome {
            Syndrome::Ack { .. } => {
                // ACK: everything up to and including p is done.
                if psn_lt(p, self.req.comp_psn) {
                    if self.sr_req.is_some() && psn_add(p, 1) == self.req.comp_psn {
                        // Selective repeat: the same cumulative PSN with
                        // news of what arrived beyond the hole at it.
                        self.sr_on_ack(psn_add(p, 1), payload);
                    } else {
                        env.stats.rx_duplicate += 1;
                    }
                    return;
                }
                self.ack_up_to(env, psn_add(p, 1), now);
                if self.sr_req.is_some() {
                    self.sr_on_ack(psn_add(p, 1), payload);
                }
                // An ACK covering a READ/atomic whose response we have not
                // seen means the response was lost: retry it. Selective
                // repeat with responses of that READ placed ahead: its gaps
                // were asked for when seen, and what followed the last
                // response seen is missing too (going back would ask for
                // all it placed again).
                if let Some(w) = self.sq.front() {
                    if w.started && w.op.is_read_or_atomic() && psn_le(self.req.comp_psn, p) {
                        if self.sr_read_placed_ahead() {
                            self.sr_read_ask_tail();
                        } else {
                            self.retry_if_new(env);
                        }
                    }
                }
            }
            Syndrome::RnrNak { timer } => {
                // RNR NAK for PSN p.
                env.stats.rx_rnr_naks += 1;
                self.qstats.rnr_naks_received += 1;
                if psn_lt(p, self.req.comp_psn) {
                    return;
                }
                self.ack_up_to(env, p, now);
                if self.front_unanswered_before(p) {
                    self.retry_if_new(env);
                    return;
                }
                if self.req.timers.is_armed(Timer::RnrBackoff) {
                    return;
                }
                if self.req.rnr_left == 0 {
                    self.fail_front(env, WcStatus::RnrRetryExcErr);
                    return;
                }
                if self.req.rnr_left != 7 {
                    self.req.rnr_left -= 1;
                }
                self.req.timers.arm(
                    Timer::RnrBackoff,
                    now + u64::from(xroce_wire::rnr_timer_us(timer)) * 1_000,
                );
                self.req.timers.cancel(Timer::Retransmit);
                self.req.rto_after_probe = None;
                // Stop sending now; the retry starts when the timer fires.
                let cp = self.req.comp_psn;
                self.seek_req(cp);
            }
            Syndrome::Nak(code) => {
                if psn_lt(p, self.req.comp_psn) {
                    env.stats.rx_duplicate += 1;
                    return;
                }
                self.ack_up_to(env, p, now);
                let st = match code {
                    NakCode::PsnSequenceError => {
                        env.stats.rx_seq_naks += 1;
                        self.qstats.seq_naks_received += 1;
                        let sr_repeat = self.sr_req.is_some()
                            && self.req.psn == self.req.max_psn
                            && !self.retry_running();
                        if sr_repeat {
                            // Selective repeat: the responder dropped
                            // something that runs in order only behind the
                            // gap. What is neither acknowledged nor SACKed
                            // goes again; the packets it placed do not.
                            self.req.started_retry = true;
                            self.req.retry_psn = self.req.comp_psn;
                            env.stats.retries_started += 1;
                            self.sr_on_timeout();
                        } else {
                            self.retry_if_new(env);
                        }
                        return;
                    }
                    NakCode::InvalidRequest | NakCode::InvalidRdRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                };
                if self.front_unanswered_before(p) {
                    self.retry_if_new(env);
                    return;
                }
                if self.sq.front().is_some_and(|w| w.started) {
                    self.fail_front(env, st);
                }
            }
            Syndrome::Reserved(_) => env.stats.rx_bad_response += 1,
        }
    }
}
