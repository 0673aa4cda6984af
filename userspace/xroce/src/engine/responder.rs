//! Responder: executes incoming requests (IBTA 9.7.4 / rxe_resp.c).
//!
//! - PSN check: in order -> execute; duplicate -> re-ACK (SEND/WRITE),
//!   re-execute (READ), replay from the cache (atomics, never executed
//!   twice); ahead -> one NAK-PSN-sequence-error per gap;
//! - opcode sequence and length checks -> NAK invalid request;
//! - rkey / bounds / permission failures -> NAK remote access error (class
//!   C: the QP then moves to ERR after the NAK is sent, as rxe does);
//! - no receive WQE -> RNR NAK with the QP's min_rnr_timer;
//! - ACKs are coalesced: consecutive ACKs in the output queue merge;
//! - output (ACK/NAK, READ responses, atomic ACKs) leaves in PSN order.

use super::codec::{self, aeth, op, PktHdr};
use super::psn;
use super::qp::{sgl_write, InMsg, QpCtx, RecvWqe, RespItem, WriteCtx};
use super::Env;
use crate::verbs::mr::AccessFlags;
use crate::verbs::qp::QpState;
use crate::verbs::wc::{WcFlags, WcOpcode, WcStatus};

/// Bound on queued responder output items (the requester retries whatever
/// is dropped beyond it).
const MAX_OUT: usize = 64;

impl QpCtx {
    fn queue_ack(&mut self, psn: u32) {
        let msn = self.resp.msn;
        if let Some(RespItem::Ack {
            psn: p,
            syndrome,
            msn: m,
            fatal: false,
        }) = self.resp.out.back_mut()
        {
            if *syndrome == aeth::ACK_UNLIMITED {
                *p = psn;
                *m = msn;
                return;
            }
        }
        if self.resp.out.len() < MAX_OUT {
            self.resp.out.push_back(RespItem::Ack {
                psn,
                syndrome: aeth::ACK_UNLIMITED,
                msn,
                fatal: false,
            });
        }
    }

    fn queue_nak(&mut self, env: &mut Env<'_>, psn: u32, syndrome: u8, fatal: bool) {
        match syndrome >> 5 {
            1 => env.stats.tx_naks_rnr += 1,
            3 if syndrome & 0x1f == 0 => env.stats.tx_naks_seq += 1,
            _ => env.stats.tx_naks_other += 1,
        }
        if fatal {
            // Nothing queued after a fatal NAK will ever be sent.
            self.resp.out.push_back(RespItem::Ack {
                psn,
                syndrome,
                msn: self.resp.msn,
                fatal,
            });
            self.resp.nak_sent = true;
            self.resp.in_msg = InMsg::None;
            return;
        }
        if self.resp.out.len() < MAX_OUT {
            self.resp.out.push_back(RespItem::Ack {
                psn,
                syndrome,
                msn: self.resp.msn,
                fatal,
            });
        }
    }

    /// RNR NAK for the packet at the expected PSN (sent for every retry of
    /// it; the requester backs off by the encoded timer).
    fn rnr_nak(&mut self, env: &mut Env<'_>, p: u32) {
        let t = aeth::RNR_NAK | (self.attr.min_rnr_timer & 0x1f);
        self.queue_nak(env, p, t, false);
    }

    fn take_recv_wqe(&mut self) -> Option<RecvWqe> {
        match &self.srq {
            Some(srq) => srq.pop(),
            None => self.rq.pop_front(),
        }
    }

    fn have_recv_wqe(&self) -> bool {
        match &self.srq {
            Some(srq) => !srq.is_empty(),
            None => !self.rq.is_empty(),
        }
    }

    /// Class C error on a request: NAK it, complete a consumed receive WQE
    /// with `recv_status`, and let the QP go to ERR once the NAK is out.
    fn class_c(&mut self, env: &mut Env<'_>, p: u32, syndrome: u8, recv_status: Option<WcStatus>) {
        if let Some(st) = recv_status {
            if let Some(r) = self.resp.recv.take() {
                let wc = self.recv_wc(r.wr_id, st);
                self.complete(env, false, wc);
            }
        }
        self.queue_nak(env, p, syndrome, true);
    }

    pub(crate) fn resp_handle(&mut self, env: &mut Env<'_>, h: &PktHdr, payload: &[u8], _now: u64) {
        if self
            .resp
            .out
            .back()
            .is_some_and(|i| matches!(i, RespItem::Ack { fatal: true, .. }))
        {
            env.stats.rx_dropped_other += 1;
            return;
        }
        let d = psn::diff(h.psn, self.resp.epsn);
        if d > 0 {
            env.stats.rx_out_of_sequence += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                let e = self.resp.epsn;
                self.queue_nak(env, e, aeth::NAK_PSN_SEQ, false);
            }
            return;
        }
        if d < 0 {
            env.stats.rx_duplicate += 1;
            self.resp_duplicate(env, h);
            return;
        }
        self.resp_in_order(env, h, payload);
    }

    fn resp_duplicate(&mut self, env: &mut Env<'_>, h: &PktHdr) {
        match h.opcode {
            op::READ_REQ => {
                let Some(r) = h.reth else { return };
                // Re-execute the (possibly partial) READ from its PSN.
                let need = AccessFlags::REMOTE_READ;
                let Some(mr) = env.mrs.by_rkey(r.rkey) else {
                    return;
                };
                let Ok(off) = mr.check(self.pd, r.va, r.len as u64, need) else {
                    return;
                };
                if self.resp.out.len() >= MAX_OUT {
                    return;
                }
                env.stats.read_reexecuted += 1;
                let npkts = r.len.div_ceil(self.mtu).max(1);
                // A queued response covering this PSN restarts in place
                // (order kept, later READs untouched); otherwise queue it.
                let covering = self.resp.out.iter().position(|i| {
                    matches!(i, RespItem::Read { psn, npkts, .. }
                        if psn::le(*psn, h.psn) && psn::lt(h.psn, psn::add(*psn, *npkts)))
                });
                let msn = match covering.map(|k| &self.resp.out[k]) {
                    Some(RespItem::Read { msn, .. }) => *msn,
                    _ => self.resp.msn,
                };
                let dup_was = match covering.map(|k| &self.resp.out[k]) {
                    Some(RespItem::Read { dup, .. }) => *dup,
                    _ => true,
                };
                let item = RespItem::Read {
                    mr,
                    off,
                    len: r.len,
                    psn: h.psn,
                    sent: 0,
                    npkts,
                    msn,
                    dup: dup_was,
                };
                match covering {
                    Some(k) => self.resp.out[k] = item,
                    None => self.resp.out.push_back(item),
                }
            }
            op::CMP_SWAP | op::FETCH_ADD => {
                let hit = self.resp.replay.iter().find(|(p, _)| *p == h.psn).copied();
                if let Some((p, orig)) = hit {
                    env.stats.atomic_replays += 1;
                    if self.resp.out.len() < MAX_OUT {
                        self.resp.out.push_back(RespItem::Atomic {
                            psn: p,
                            orig,
                            msn: self.resp.msn,
                            dup: true,
                        });
                    }
                }
            }
            _ => {
                let p = psn::sub(self.resp.epsn, 1);
                self.queue_ack(p);
            }
        }
    }

    fn resp_in_order(&mut self, env: &mut Env<'_>, h: &PktHdr, payload: &[u8]) {
        let p = h.psn;
        let o = h.opcode;
        let mtu = self.mtu as usize;
        // Opcode sequence (IBTA 9.7.4.1.5).
        let ok_seq = match self.resp.in_msg {
            InMsg::Send => matches!(
                o,
                op::SEND_MIDDLE | op::SEND_LAST | op::SEND_LAST_IMM | op::SEND_LAST_INV
            ),
            InMsg::Write => matches!(o, op::WRITE_MIDDLE | op::WRITE_LAST | op::WRITE_LAST_IMM),
            InMsg::None => !matches!(
                o,
                op::SEND_MIDDLE
                    | op::SEND_LAST
                    | op::SEND_LAST_IMM
                    | op::SEND_LAST_INV
                    | op::WRITE_MIDDLE
                    | op::WRITE_LAST
                    | op::WRITE_LAST_IMM
            ),
        };
        let len_ok = match o {
            op::SEND_FIRST | op::SEND_MIDDLE | op::WRITE_FIRST | op::WRITE_MIDDLE => {
                payload.len() == mtu
            }
            op::READ_REQ | op::CMP_SWAP | op::FETCH_ADD => payload.is_empty(),
            _ => payload.len() <= mtu,
        };
        if !ok_seq || !len_ok {
            self.class_c(env, p, aeth::NAK_INV_REQ, Some(WcStatus::RemInvReqErr));
            return;
        }
        // QP-level permission for RDMA operations.
        let qp_acc = self.attr.qp_access_flags;
        let qp_ok = match o {
            op::WRITE_FIRST | op::WRITE_ONLY | op::WRITE_ONLY_IMM => {
                qp_acc.contains(AccessFlags::REMOTE_WRITE)
            }
            op::READ_REQ => qp_acc.contains(AccessFlags::REMOTE_READ),
            op::CMP_SWAP | op::FETCH_ADD => qp_acc.contains(AccessFlags::REMOTE_ATOMIC),
            _ => true,
        };
        if !qp_ok {
            self.class_c(env, p, aeth::NAK_INV_REQ, None);
            return;
        }
        match o {
            op::SEND_FIRST
            | op::SEND_MIDDLE
            | op::SEND_LAST
            | op::SEND_LAST_IMM
            | op::SEND_ONLY
            | op::SEND_ONLY_IMM
            | op::SEND_LAST_INV
            | op::SEND_ONLY_INV => self.resp_send(env, h, payload),
            op::WRITE_FIRST
            | op::WRITE_MIDDLE
            | op::WRITE_LAST
            | op::WRITE_LAST_IMM
            | op::WRITE_ONLY
            | op::WRITE_ONLY_IMM => self.resp_write(env, h, payload),
            op::READ_REQ => self.resp_read(env, h),
            op::CMP_SWAP | op::FETCH_ADD => self.resp_atomic(env, h),
            _ => {
                env.stats.rx_unsupported += 1;
                self.class_c(env, p, aeth::NAK_INV_REQ, None);
            }
        }
    }

    fn accept(&mut self, env: &mut Env<'_>, h: &PktHdr, npsn: u32) {
        let _ = env;
        self.resp.epsn = psn::add(h.psn, npsn);
        self.resp.nak_sent = false;
    }

    fn resp_send(&mut self, env: &mut Env<'_>, h: &PktHdr, payload: &[u8]) {
        let o = h.opcode;
        let first = matches!(
            o,
            op::SEND_FIRST | op::SEND_ONLY | op::SEND_ONLY_IMM | op::SEND_ONLY_INV
        );
        let last = !matches!(o, op::SEND_FIRST | op::SEND_MIDDLE);
        if first {
            let Some(r) = self.take_recv_wqe() else {
                self.rnr_nak(env, h.psn);
                return;
            };
            self.resp.recv = Some(r);
            self.resp.recv_off = 0;
        }
        let Some(r) = self.resp.recv.as_ref() else {
            self.class_c(env, h.psn, aeth::NAK_INV_REQ, None);
            return;
        };
        if let Some(st) = r.local_err {
            self.class_c(env, h.psn, aeth::NAK_REM_OP, Some(st));
            return;
        }
        if self.resp.recv_off + payload.len() > r.len {
            self.class_c(env, h.psn, aeth::NAK_INV_REQ, Some(WcStatus::LocLenErr));
            return;
        }
        if !sgl_write(&r.sges, self.resp.recv_off, payload) {
            self.class_c(env, h.psn, aeth::NAK_REM_OP, Some(WcStatus::LocProtErr));
            return;
        }
        self.resp.recv_off += payload.len();
        self.accept(env, h, 1);
        if last {
            let r = self.resp.recv.take().expect("checked above");
            let mut wc = self.recv_wc(r.wr_id, WcStatus::Success);
            wc.byte_len = self.resp.recv_off as u32;
            if h.se {
                wc.flags |= WcFlags::SOLICITED;
            }
            if let Some(imm) = h.imm {
                wc.imm_data = imm;
                wc.flags |= WcFlags::WITH_IMM;
            }
            if let Some(k) = h.ieth {
                wc.invalidated_rkey = k;
                wc.flags |= WcFlags::WITH_INV;
            }
            self.resp.msn = psn::add(self.resp.msn, 1);
            self.resp.in_msg = InMsg::None;
            self.complete(env, false, wc);
        } else {
            self.resp.in_msg = InMsg::Send;
        }
        if h.ack_req {
            self.queue_ack(h.psn);
        }
    }

    fn resp_write(&mut self, env: &mut Env<'_>, h: &PktHdr, payload: &[u8]) {
        let o = h.opcode;
        let first = matches!(o, op::WRITE_FIRST | op::WRITE_ONLY | op::WRITE_ONLY_IMM);
        let last = !matches!(o, op::WRITE_FIRST | op::WRITE_MIDDLE);
        let with_imm = matches!(o, op::WRITE_LAST_IMM | op::WRITE_ONLY_IMM);
        if with_imm && !self.have_recv_wqe() {
            self.rnr_nak(env, h.psn);
            return;
        }
        if first {
            let Some(r) = h.reth else {
                self.class_c(env, h.psn, aeth::NAK_INV_REQ, None);
                return;
            };
            let Some(mr) = env.mrs.by_rkey(r.rkey) else {
                self.class_c(env, h.psn, aeth::NAK_REM_ACCESS, None);
                return;
            };
            let Ok(off) = mr.check(self.pd, r.va, r.len as u64, AccessFlags::REMOTE_WRITE) else {
                self.class_c(env, h.psn, aeth::NAK_REM_ACCESS, None);
                return;
            };
            self.resp.write = Some(WriteCtx {
                mr,
                off,
                remaining: r.len as u64,
                total: r.len,
            });
        }
        let Some(w) = self.resp.write.as_mut() else {
            self.class_c(env, h.psn, aeth::NAK_INV_REQ, None);
            return;
        };
        let n = payload.len() as u64;
        if n > w.remaining || (last && n != w.remaining) {
            self.class_c(env, h.psn, aeth::NAK_INV_REQ, None);
            return;
        }
        if !w.mr.is_valid() {
            // Deregistered while the WRITE was in flight.
            self.class_c(env, h.psn, aeth::NAK_REM_ACCESS, None);
            return;
        }
        w.mr.write_at(w.off, payload);
        w.off += payload.len();
        w.remaining -= n;
        let total = w.total;
        self.accept(env, h, 1);
        if last {
            self.resp.write = None;
            self.resp.in_msg = InMsg::None;
            self.resp.msn = psn::add(self.resp.msn, 1);
            if with_imm {
                if let Some(r) = self.take_recv_wqe() {
                    let mut wc = self.recv_wc(r.wr_id, WcStatus::Success);
                    wc.opcode = WcOpcode::RecvRdmaWithImm;
                    if h.se {
                        wc.flags |= WcFlags::SOLICITED;
                    }
                    wc.byte_len = total;
                    wc.imm_data = h.imm.unwrap_or(0);
                    wc.flags |= WcFlags::WITH_IMM;
                    self.complete(env, false, wc);
                }
            }
        } else {
            self.resp.in_msg = InMsg::Write;
        }
        if h.ack_req {
            self.queue_ack(h.psn);
        }
    }

    fn resp_read(&mut self, env: &mut Env<'_>, h: &PktHdr) {
        let Some(r) = h.reth else {
            self.class_c(env, h.psn, aeth::NAK_INV_REQ, None);
            return;
        };
        let outstanding = self
            .resp
            .out
            .iter()
            .filter(|i| {
                matches!(
                    i,
                    RespItem::Read { dup: false, .. } | RespItem::Atomic { dup: false, .. }
                )
            })
            .count();
        if outstanding >= self.attr.max_dest_rd_atomic.max(1) as usize {
            self.class_c(env, h.psn, aeth::NAK_INV_RD_REQ, None);
            return;
        }
        let Some(mr) = env.mrs.by_rkey(r.rkey) else {
            self.class_c(env, h.psn, aeth::NAK_REM_ACCESS, None);
            return;
        };
        let Ok(off) = mr.check(self.pd, r.va, r.len as u64, AccessFlags::REMOTE_READ) else {
            self.class_c(env, h.psn, aeth::NAK_REM_ACCESS, None);
            return;
        };
        let npkts = r.len.div_ceil(self.mtu).max(1);
        self.accept(env, h, npkts);
        self.resp.msn = psn::add(self.resp.msn, 1);
        self.resp.out.push_back(RespItem::Read {
            mr,
            off,
            len: r.len,
            psn: h.psn,
            sent: 0,
            npkts,
            msn: self.resp.msn,
            dup: false,
        });
    }

    fn resp_atomic(&mut self, env: &mut Env<'_>, h: &PktHdr) {
        let Some(a) = h.atomic else {
            self.class_c(env, h.psn, aeth::NAK_INV_REQ, None);
            return;
        };
        if !a.va.is_multiple_of(8) {
            self.class_c(env, h.psn, aeth::NAK_INV_REQ, None);
            return;
        }
        let Some(mr) = env.mrs.by_rkey(a.rkey) else {
            self.class_c(env, h.psn, aeth::NAK_REM_ACCESS, None);
            return;
        };
        let Ok(off) = mr.check(self.pd, a.va, 8, AccessFlags::REMOTE_ATOMIC) else {
            self.class_c(env, h.psn, aeth::NAK_REM_ACCESS, None);
            return;
        };
        let Some(cell) = mr.atomic_at(off) else {
            self.class_c(env, h.psn, aeth::NAK_INV_REQ, None);
            return;
        };
        use std::sync::atomic::Ordering::SeqCst;
        let orig = if h.opcode == op::CMP_SWAP {
            match cell.compare_exchange(a.compare, a.swap_add, SeqCst, SeqCst) {
                Ok(v) | Err(v) => v,
            }
        } else {
            cell.fetch_add(a.swap_add, SeqCst)
        };
        let cap = self.attr.max_dest_rd_atomic.max(1) as usize;
        while self.resp.replay.len() >= cap.max(16) {
            self.resp.replay.pop_front();
        }
        self.resp.replay.push_back((h.psn, orig));
        self.accept(env, h, 1);
        self.resp.msn = psn::add(self.resp.msn, 1);
        self.resp.out.push_back(RespItem::Atomic {
            psn: h.psn,
            orig,
            msn: self.resp.msn,
            dup: false,
        });
    }

    /// Next responder packet (ACK/NAK, READ response, atomic ACK).
    pub(crate) fn resp_poll(
        &mut self,
        env: &mut Env<'_>,
        now: u64,
        buf: &mut [u8],
    ) -> Option<usize> {
        let mtu = self.mtu as usize;
        let tmpl = self.tmpl;
        if matches!(self.resp.out.front(), Some(RespItem::Read { .. })) {
            // READ response data is paced like request data: the QP's
            // congestion controller governs everything it sends.
            if !self.pacer_open(now) {
                return None;
            }
        }
        let item = self.resp.out.front_mut()?;
        match item {
            RespItem::Ack {
                psn,
                syndrome,
                msn,
                fatal,
            } => {
                let h = PktHdr {
                    opcode: op::ACK,
                    psn: *psn,
                    aeth: Some((*syndrome, *msn)),
                    ..tmpl
                };
                let fatal = *fatal;
                let syn = *syndrome;
                let n = codec::emit(&h, &[], buf)?;
                self.resp.out.pop_front();
                if syn == aeth::ACK_UNLIMITED {
                    env.stats.tx_acks += 1;
                }
                if fatal {
                    self.go_error = true;
                }
                Some(n)
            }
            RespItem::Atomic { psn, orig, msn, .. } => {
                let h = PktHdr {
                    opcode: op::ATOMIC_ACK,
                    psn: *psn,
                    aeth: Some((aeth::ACK_UNLIMITED, *msn)),
                    atomic_ack: Some(*orig),
                    ..tmpl
                };
                let n = codec::emit(&h, &[], buf)?;
                self.resp.out.pop_front();
                env.stats.tx_atomic_acks += 1;
                Some(n)
            }
            RespItem::Read {
                mr,
                off,
                len,
                psn: first,
                sent,
                npkts,
                msn,
                ..
            } => {
                if !mr.is_valid() {
                    let p = psn::add(*first, *sent);
                    self.resp.out.pop_front();
                    self.class_c(env, p, aeth::NAK_REM_ACCESS, None);
                    return self.resp_poll(env, now, buf);
                }
                let k = *sent;
                let o = k as usize * mtu;
                let plen = (*len as usize - o).min(mtu);
                let opcode = match (*npkts, k) {
                    (1, _) => op::READ_RESP_ONLY,
                    (_, 0) => op::READ_RESP_FIRST,
                    (n, k) if k + 1 == n => op::READ_RESP_LAST,
                    _ => op::READ_RESP_MIDDLE,
                };
                let h = PktHdr {
                    opcode,
                    psn: psn::add(*first, k),
                    aeth: (opcode != op::READ_RESP_MIDDLE).then_some((aeth::ACK_UNLIMITED, *msn)),
                    ..tmpl
                };
                let src = &*mr;
                let at = *off + o;
                if env.scratch.len() < plen {
                    env.scratch.resize(plen, 0);
                }
                src.read_at(at, &mut env.scratch[..plen]);
                let n = codec::emit(&h, &env.scratch[..plen], buf)?;
                *sent += 1;
                if *sent >= *npkts {
                    self.resp.out.pop_front();
                }
                env.stats.tx_read_responses += 1;
                self.qstats.tx_packets += 1;
                self.qstats.tx_bytes += n as u64;
                self.paced_send(now, n);
                if self.state == QpState::Err {
                    return None;
                }
                Some(n)
            }
        }
    }
}
