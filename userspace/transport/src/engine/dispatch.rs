//! The per-QP dispatch: a parsed packet to the requester, completer or
//! responder (and the UC/UD paths), whose turn it is to transmit, and
//! which timers are due.

use super::codec;
use super::qp::{QpCtx, RespItem};
use super::qp_attr::{QpState, QpType};
use super::timers::Timer;
use super::{Env, Transmit};
use xroce_wire::{IpRepr, Opcode, Service, TransportRepr};

impl QpCtx {
    /// Dispatch one parsed packet addressed to this QP, which came with
    /// IP header `ip`.
    pub(crate) fn handle_packet(
        &mut self,
        env: &mut Env<'_>,
        ip: &IpRepr,
        t: &TransportRepr,
        payload: &[u8],
        now: u64,
    ) {
        let opcode = t.bth.opcode;
        // As rxe: default P_Key only, and for connected QPs only packets
        // from the peer this QP was connected to.
        if t.bth.pkey & 0x7fff != 0x7fff {
            env.stats.rx_bad_header += 1;
            return;
        }
        if self.qp_type != QpType::Ud
            && self.state != QpState::Init
            && ip.src_gid() != self.tmpl.ip.dst_gid()
        {
            env.stats.rx_bad_header += 1;
            return;
        }
        self.qstats.rx_packets += 1;
        if self.state == QpState::Rtr && !self.comm_est {
            self.comm_est = true;
            env.event(super::AsyncEvent::CommEstablished { qpn: self.qpn });
        }
        if opcode == Opcode::CNP {
            env.stats.rx_cnps += 1;
            self.qstats.cnps_received += 1;
            self.cc.on_cnp(now);
            return;
        }
        let service = match self.qp_type {
            QpType::Rc => Service::Rc,
            QpType::Uc => Service::Uc,
            QpType::Ud => Service::Ud,
        };
        if opcode.service() != service {
            env.stats.rx_unsupported += 1; // UC opcodes to an RC QP or v.v.
            return;
        }
        if self.qp_type == QpType::Ud {
            if matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                self.ud_recv(env, ip, t, payload);
            } else {
                env.stats.rx_bad_state += 1;
            }
            return;
        }
        if self.qp_type == QpType::Uc {
            if matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                self.uc_recv(env, t, payload);
            } else {
                env.stats.rx_bad_state += 1;
            }
            return;
        }
        let ce = ip.ecn() == 3;
        // A receive ring under pressure marks what fills it: data (WRITE
        // and SEND payload, READ responses), not ACKs or CNPs.
        // (An ACK's payload is a selective-repeat SACK block, not data.)
        let pressure =
            env.rx_pressure && !ce && !payload.is_empty() && opcode != Opcode::RC_ACKNOWLEDGE;
        if pressure {
            env.stats.rx_pressure_marked += 1;
        }
        if ce || pressure {
            if ce {
                env.stats.rx_ce_marked += 1;
            }
            self.qstats.ce_marked_received += 1;
            let due = self
                .last_cnp_ns
                .is_none_or(|t| now.saturating_sub(t) >= env.cfg.cnp_interval_ns);
            if due
                && self.qp_type != QpType::Ud
                && matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
            {
                self.cnp_due = true;
                self.last_cnp_ns = Some(now);
            }
        }
        if opcode.is_response() {
            match self.state {
                QpState::Rts | QpState::Sqd | QpState::Sqe => {
                    self.sr_saw_response(t);
                    self.note_echo(t.bth.delay_echo, self.echo_anchor(t), env.arrived_ns);
                    self.comp_handle(env, t, payload, now)
                }
                _ => env.stats.rx_bad_state += 1,
            }
        } else {
            match self.state {
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe => {
                    self.sr_saw_request(t);
                    let in_order = t.bth.psn == self.resp.epsn;
                    self.resp_handle(env, t, payload, now);
                    // What an ACK of this PSN echoes (see `delay_echo`).
                    if in_order && self.resp.epsn != t.bth.psn {
                        self.resp.arrival = Some((t.bth.psn, env.arrived_ns));
                    }
                }
                _ => env.stats.rx_bad_state += 1,
            }
        }
    }

    pub(crate) fn poll_transmit(
        &mut self,
        env: &mut Env<'_>,
        now: u64,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Err) {
            return None;
        }
        if self.cnp_due {
            self.cnp_due = false;
            let mut f = codec::packet(&self.tmpl, Opcode::CNP, 0);
            f.transport.bth.becn = true;
            f.ip.set_ecn(0);
            if let Ok(t) = codec::emit_copy(&f, &[], buf) {
                env.stats.tx_cnps += 1;
                self.qstats.cnps_sent += 1;
                return Some(t);
            }
        }
        // ACK/NAK/atomic responses go first; READ response data and request
        // data alternate so neither direction starves the other.
        let read_first = matches!(self.resp.out.front(), Some(RespItem::Read { .. }));
        let req_turn = read_first && self.prefer_req;
        if !req_turn {
            if let Some(t) = self.resp_poll(env, now, buf) {
                self.prefer_req = read_first;
                return Some(t);
            }
        }
        if matches!(self.state, QpState::Rts | QpState::Sqd) {
            // Selective repeat: holes go before new data, outside the
            // device budget (their PSNs are counted already).
            if let Some(t) = self.sr_read_request(env, now, buf) {
                self.prefer_req = false;
                return Some(t);
            }
            if let Some(t) = self.sr_retransmit(env, now, buf) {
                self.prefer_req = false;
                return Some(t);
            }
        }
        if matches!(self.state, QpState::Rts | QpState::Sqd) && self.budget_allows(env) {
            let new_data = self.req.psn == self.req.max_psn;
            let sent_psn = self.req.psn;
            if let Some(t) = self.req_poll(env, now, buf) {
                let in_chunk = self
                    .reserved_end
                    .is_some_and(|r| xroce_wire::psn_lt(sent_psn, r));
                if new_data && self.qp_type == QpType::Rc && !in_chunk {
                    // Mid-message: the next chunk of it keeps its room.
                    let chunk = reserve_chunk(env);
                    self.reserved_end = self.sq.get(self.req.idx).filter(|w| w.started).map(|w| {
                        let end = xroce_wire::psn_add(w.last_psn, 1);
                        let cap = xroce_wire::psn_add(sent_psn, chunk);
                        if xroce_wire::psn_lt(cap, end) {
                            cap
                        } else {
                            end
                        }
                    });
                }
                self.prefer_req = false;
                return Some(t);
            }
        }
        if req_turn {
            return self.resp_poll(env, now, buf);
        }
        None
    }

    /// Whether the device's in-flight budget has room for the requester's
    /// next packet. A retransmission always has (its PSNs are counted
    /// already), and so has the rest of a chunk of a started message (its
    /// room was taken when the chunk started). A message takes room a chunk
    /// ([`reserve_chunk`] PSNs) at a time, so a chunk can always finish and
    /// its last packet asks for the ACK that frees the room, while a big
    /// message holds no more than a chunk beyond what is on the wire: it
    /// used to take room for all its PSNs, and every other QP's messages
    /// waited until it ended. A READ needs room for its response packets,
    /// but no more than a chunk. Sets `budget_blocked` when new data waits,
    /// so the engine queues the QP for room.
    fn budget_allows(&mut self, env: &Env<'_>) -> bool {
        if self.qp_type != QpType::Rc
            || self.req.psn != self.req.max_psn
            || self.req.timers.is_armed(Timer::RnrBackoff)
        {
            return true;
        }
        let Some(w) = self.sq.get(self.req.idx) else {
            return true;
        };
        let window = self.req_window(env) as i32;
        if xroce_wire::psn_diff(self.req.psn, self.req.comp_psn) >= window {
            return true; // the QP's own window holds it; an ACK wakes it
        }
        let need = if w.started {
            if self
                .reserved_end
                .is_some_and(|r| xroce_wire::psn_lt(self.req.psn, r))
            {
                return true;
            }
            let end = xroce_wire::psn_add(w.last_psn, 1);
            xroce_wire::psn_diff(end, self.req.psn).max(1) as u32
        } else if w.op.is_atomic() {
            1
        } else {
            w.len.div_ceil(self.mtu).max(1)
        };
        if env.inflight_room >= need.min(reserve_chunk(env)) {
            return true;
        }
        self.budget_blocked = true;
        false
    }

    pub(crate) fn next_timeout(&self) -> Option<u64> {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Err) {
            return None;
        }
        let mut t = self.cc.next_timer_ns();
        let mut m = |x: Option<u64>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t: u64| t.min(x)));
            }
        };
        m(self.req.timers.earliest());
        let req_ready = (self.req.idx < self.sq.len() || self.sr_retx_pending())
            && !self.req.timers.is_armed(Timer::RnrBackoff);
        let read_ready = matches!(self.resp.out.front(), Some(RespItem::Read { .. }));
        if req_ready || read_ready {
            // Rate 0 holds the data until the controller changes its rate,
            // which only its own timer or an arriving packet does.
            m(self
                .pacer
                .held_until_ns(self.cc.rate_bps(), self.pacing_frame_bytes())
                .filter(|&t| t != u64::MAX));
        }
        t
    }

    pub(crate) fn handle_timeout(&mut self, env: &mut Env<'_>, now: u64) {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Err) {
            return;
        }
        // Book the pacer's credit so far (at the rate that earned it, before
        // the controller's timer may change it): a send time that has come
        // while the window or a fence holds the data leaves next_timeout.
        self.pacer.catch_up(now, self.cc.rate_bps());
        if self.cc.next_timer_ns().is_some_and(|t| t <= now) {
            self.cc.on_timer(now);
        }
        for timer in Timer::ALL {
            if self.req.timers.take_due(timer, now) {
                match timer {
                    Timer::RnrBackoff => self.start_retry(env),
                    Timer::Retransmit => self.on_retransmit_timeout(env, now),
                }
            }
        }
    }
}

/// PSNs a message takes room for at a time in the device's in-flight budget:
/// the smallest the device window gets, so a chunk always fits in time.
pub(crate) fn reserve_chunk(env: &Env<'_>) -> u32 {
    super::DEVICE_WINDOW_MIN_PKTS
        .min(env.cfg.max_device_inflight_pkts)
        .max(1)
}
