//! Responder: executes incoming requests (IBTA 9.7.4 / rxe_resp.c).
//!
//! - PSN check: in order -> execute; duplicate -> re-ACK (SEND/WRITE),
//!   re-execute a READ recorded among the responder's resources from its
//!   record (same R_Key, range inside the recorded one; anything else is
//!   dropped, as rxe), replay from the cache (atomics, never executed
//!   twice); ahead -> one NAK-PSN-sequence-error per gap;
//! - READs and atomics not yet answered count together against
//!   `max_dest_rd_atomic`; one beyond it is an invalid request;
//! - opcode sequence and length checks -> NAK invalid request;
//! - rkey / bounds / permission failures -> NAK remote access error (class
//!   C: the QP then moves to ERR after the NAK is sent, as rxe does, and
//!   raises IBV_EVENT_QP_ACCESS_ERR unless a consumed receive WQE's error
//!   completion reports it; invalid requests likewise QP_REQ_ERR);
//! - a WRITE or READ of DMA length 0 names no memory: its R_Key and VA are
//!   not checked (IBTA C9-88, rxe's check_rkey);
//! - no receive WQE -> RNR NAK with the QP's min_rnr_timer;
//! - ACKs are coalesced: consecutive ACKs in the output queue merge;
//! - output (ACK/NAK, READ responses, atomic ACKs) leaves in PSN order.

use xroce_wire::{psn_add, psn_diff, psn_le, psn_lt, psn_sub};
use xroce_wire::{
    AethRepr, AtomicAckEthRepr, FrameRepr, NakCode, Opcode, RethRepr, Syndrome, TransportRepr,
};

use super::codec;
use super::completion::{WcFlags, WcOpcode, WcStatus};
use super::delay_echo::echo_code;
use super::memory::AccessFlags;
use super::qp::{ErrCause, InMsg, QpCtx, ReadRecord, RemoteMr, RespItem, WriteCtx};
use super::qp_attr::QpState;
use super::selective::SrInOrder;
use super::wqe::{sgl_write, RecvWqe};
use super::{Env, Transmit};

/// Bound on queued responder output items (the requester retries whatever
/// is dropped beyond it).
const MAX_OUT: usize = 64;

/// Resolves the remote address a request names, for a QP of PD `pd`: the
/// R_Key, VA and DMA length of an RDMA WRITE or READ's RETH (or an
/// atomic's AtomicETH as `r`), of which `len` bytes from `r.va` are
/// accessed now (the whole DMA length, or one selective-repeat packet's
/// part). Gives the MR and the offset of `r.va` in it, `None` on an R_Key,
/// PD, bounds or permission violation. A DMA length of 0 names no memory,
/// so neither its R_Key nor its VA is checked (IBTA C9-88; rxe's
/// check_rkey): no MR, offset 0. The one place the engine checks an
/// R_Key.
pub(super) fn resolve_remote(
    env: &Env<'_>,
    pd: u32,
    r: &RethRepr,
    len: u64,
    need: AccessFlags,
) -> Option<(RemoteMr, usize)> {
    if r.dma_len == 0 {
        return Some((None, 0));
    }
    let mr = env.mrs.by_rkey(r.rkey)?;
    let off = mr.check(pd, r.va, len, need).ok()?;
    Some((Some(mr), off))
}

impl QpCtx {
    pub(super) fn queue_ack(&mut self, psn: u32) {
        let msn = self.resp.msn;
        if let Some(RespItem::Ack {
            psn: p,
            syndrome,
            msn: m,
            fatal: None,
        }) = self.resp.out.back_mut()
        {
            if *syndrome == Syndrome::ACK {
                *p = psn;
                *m = msn;
                return;
            }
        }
        if self.resp.out.len() < MAX_OUT {
            self.resp.out.push_back(RespItem::Ack {
                psn,
                syndrome: Syndrome::ACK,
                msn,
                fatal: None,
            });
        }
    }

    pub(super) fn queue_nak(
        &mut self,
        env: &mut Env<'_>,
        psn: u32,
        syndrome: Syndrome,
        fatal: Option<ErrCause>,
    ) {
        match syndrome {
            Syndrome::RnrNak { .. } => env.stats.tx_naks_rnr += 1,
            Syndrome::Nak(NakCode::PsnSequenceError) => env.stats.tx_naks_seq += 1,
            _ => env.stats.tx_naks_other += 1,
        }
        if fatal.is_some() {
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
    pub(super) fn rnr_nak(&mut self, env: &mut Env<'_>, p: u32) {
        let timer = self.attr.min_rnr_timer & 0x1f;
        self.queue_nak(env, p, Syndrome::RnrNak { timer }, None);
    }

    /// Completes receive WQE `wr_id` for the WRITE with immediate that `t`
    /// ended, `byte_len` bytes written.
    pub(super) fn complete_write_imm(
        &mut self,
        env: &mut Env<'_>,
        wr_id: u64,
        t: &TransportRepr,
        byte_len: u32,
    ) {
        let mut wc = self.recv_wc(wr_id, WcStatus::Success);
        wc.opcode = WcOpcode::RecvRdmaWithImm;
        if t.bth.solicited {
            wc.flags |= WcFlags::SOLICITED;
        }
        wc.byte_len = byte_len;
        wc.imm_data = t.imm_data.unwrap_or(0);
        wc.flags |= WcFlags::WITH_IMM;
        self.complete(env, false, wc);
    }

    /// The next receive WQE: the SRQ's if the QP has one, else its own.
    pub(super) fn take_recv_wqe(&mut self, env: &mut Env<'_>) -> Option<RecvWqe> {
        match &self.srq {
            Some(srq) => srq.pop(env),
            None => self.pop_recv_wqe(env),
        }
    }

    pub(super) fn have_recv_wqe(&self) -> bool {
        match &self.srq {
            Some(srq) => !srq.is_empty(),
            None => !self.rq.is_empty(),
        }
    }

    /// Class C error on a request: NAK it, complete a consumed receive WQE
    /// with `recv_status`, and let the QP go to ERR once the NAK is out.
    /// An error tied to a receive WQE is reported by its completion; one
    /// that is not raises the affiliated asynchronous error of its NAK
    /// (IBTA C9-222.1.1; rxe raises IB_EVENT_QP_ACCESS_ERR for an R_Key
    /// violation without immediate data).
    pub(super) fn class_c(
        &mut self,
        env: &mut Env<'_>,
        p: u32,
        syndrome: Syndrome,
        recv_status: Option<WcStatus>,
    ) {
        let mut cause = match syndrome {
            Syndrome::Nak(NakCode::RemoteAccessError) => ErrCause::AccessViolation,
            Syndrome::Nak(NakCode::InvalidRequest | NakCode::InvalidRdRequest) => {
                ErrCause::InvalidRequest
            }
            _ => ErrCause::Fatal,
        };
        if let Some(st) = recv_status {
            if let Some(r) = self.resp.recv.take() {
                let wc = self.recv_wc(r.wr_id, st);
                self.complete(env, false, wc);
                cause = ErrCause::Completion;
            }
        }
        self.queue_nak(env, p, syndrome, Some(cause));
    }

    pub(crate) fn resp_handle(
        &mut self,
        env: &mut Env<'_>,
        t: &TransportRepr,
        payload: &[u8],
        _now: u64,
    ) {
        if self
            .resp
            .out
            .back()
            .is_some_and(|i| matches!(i, RespItem::Ack { fatal: Some(_), .. }))
        {
            env.stats.rx_dropped_other += 1;
            return;
        }
        let d = psn_diff(t.bth.psn, self.resp.epsn);
        if d > 0 && self.sr_resp.is_some() {
            self.sr_out_of_order(env, t, payload);
            return;
        }
        if d > 0 {
            env.stats.rx_out_of_sequence += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                let e = self.resp.epsn;
                self.queue_nak(env, e, Syndrome::Nak(NakCode::PsnSequenceError), None);
            }
            return;
        }
        if d < 0 {
            env.stats.rx_duplicate += 1;
            self.resp_duplicate(env, t);
            return;
        }
        if self.sr_refused_now(env, t.bth.psn) {
            return;
        }
        match self.sr_route(t) {
            SrInOrder::Gbn => self.resp_in_order(env, t, payload),
            SrInOrder::Sr => self.sr_in_order(env, t, payload),
            SrInOrder::Lost => self.sr_in_order_lost(env),
        }
        self.sr_absorb();
    }

    fn resp_duplicate(&mut self, env: &mut Env<'_>, t: &TransportRepr) {
        match t.bth.opcode {
            Opcode::RC_RDMA_READ_REQUEST => {
                let Some(asked) = t.reth else { return };
                // Only a READ executed before runs again, from what was
                // checked then: its R_Key, and its range from this PSN on.
                let Some((mut r, mut npkts)) = self.recorded_read(t.bth.psn, &asked) else {
                    env.stats.dup_read_unmatched += 1;
                    return;
                };
                // Or a part of that range from here (a selective-repeat
                // requester asks for a gap alone): only those packets.
                let gap_only = asked.va == r.va && asked.dma_len < r.dma_len;
                if gap_only {
                    r.dma_len = asked.dma_len;
                    npkts = asked.dma_len.div_ceil(self.mtu).max(1);
                }
                let Some((mr, off)) = resolve_remote(
                    env,
                    self.pd,
                    &r,
                    u64::from(r.dma_len),
                    AccessFlags::REMOTE_READ,
                ) else {
                    env.stats.dup_read_unmatched += 1;
                    return;
                };
                let q = t.bth.psn;
                // A response still queued that covers this PSN goes back to
                // it if it went past it (what it sent from there may be
                // lost); one yet to reach it is left alone. Never forward:
                // a tail-loss probe names the last PSN of the last READ,
                // and cutting the packets before it would show the
                // requester a gap where nothing was lost (go-back-N for
                // nothing, issue 27).
                let covering = self.resp.out.iter_mut().find_map(|i| match i {
                    RespItem::Read {
                        psn, npkts, sent, ..
                    } if psn_le(*psn, q) && psn_lt(q, psn_add(*psn, *npkts)) => {
                        Some((psn_diff(q, *psn) as u32, sent))
                    }
                    _ => None,
                });
                // A gap alone, of a READ still under way, goes next, and
                // then the rest from where it was: going back sent again
                // all it had sent since the gap, a round trip of responses
                // per loss, which the requester had placed already (a
                // 16 MiB allreduce at 1 % loss carried 2.6x the frames of
                // the lossless one).
                let mut next = false;
                if let Some((k, sent)) = covering {
                    if k >= *sent {
                        return;
                    }
                    if !gap_only {
                        *sent = k;
                        env.stats.read_reexecuted += 1;
                        return;
                    }
                    next = true;
                }
                if self.resp.out.len() >= MAX_OUT {
                    return;
                }
                env.stats.read_reexecuted += 1;
                let item = RespItem::Read {
                    mr,
                    off,
                    len: r.dma_len,
                    psn: q,
                    sent: 0,
                    npkts,
                    msn: self.resp.msn,
                    dup: true,
                    arrived_ns: env.arrived_ns,
                };
                if next {
                    self.resp.out.push_front(item);
                } else {
                    self.resp.out.push_back(item);
                }
            }
            Opcode::RC_COMPARE_SWAP | Opcode::RC_FETCH_ADD => {
                let hit = self
                    .resp
                    .replay
                    .iter()
                    .find(|(p, _)| *p == t.bth.psn)
                    .copied();
                if let Some((p, orig)) = hit {
                    env.stats.atomic_replays += 1;
                    if self.resp.out.len() < MAX_OUT {
                        self.resp.out.push_back(RespItem::Atomic {
                            psn: p,
                            orig,
                            msn: self.resp.msn,
                            dup: true,
                            arrived_ns: env.arrived_ns,
                        });
                    }
                }
            }
            _ => {
                let p = psn_sub(self.resp.epsn, 1);
                self.queue_ack(p);
            }
        }
    }

    /// The READ recorded at a duplicate READ request's PSN `psn`, if the
    /// request `r` names it: the same R_Key and a range inside the
    /// recorded one (rxe's check). Returns the part left from `psn` on
    /// (the recorded VA and length moved by whole MTUs) and its packets.
    fn recorded_read(&self, psn: u32, r: &RethRepr) -> Option<(RethRepr, u32)> {
        let rec = self
            .resp
            .reads
            .iter()
            .rev()
            .find(|rec| psn_le(rec.psn, psn) && psn_lt(psn, psn_add(rec.psn, rec.npkts)))?;
        let end = r.va.checked_add(u64::from(r.dma_len))?;
        let inside = r.va >= rec.va && end <= rec.va + u64::from(rec.len);
        if r.rkey != rec.rkey || !inside {
            return None;
        }
        let k = psn_diff(psn, rec.psn) as u32;
        // k < npkts = ceil(len / mtu), so the skipped bytes are < len.
        let skip = k * self.mtu;
        let part = RethRepr {
            va: rec.va + u64::from(skip),
            rkey: rec.rkey,
            dma_len: rec.len - skip,
        };
        Some((part, rec.npkts - k))
    }

    /// READs and atomics remembered for duplicates: at least
    /// `max_dest_rd_atomic` (all a requester within its `max_rd_atomic`
    /// can retry), and no fewer than 16 so a requester allowed more than
    /// this side's limit still recovers.
    fn resources(&self) -> usize {
        usize::from(self.attr.max_dest_rd_atomic).max(16)
    }

    /// Whether a new READ or atomic request fits in `max_dest_rd_atomic`:
    /// READs and atomics not yet answered count together (IBTA 9.7.4.1.3
    /// responder resources; rxe's resources hold both).
    fn rd_atomic_room(&self) -> bool {
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
        outstanding < self.attr.max_dest_rd_atomic.max(1) as usize
    }

    /// The READ or atomic request at `p` exceeds `max_dest_rd_atomic`: an
    /// invalid request (NAK invalid request, the QP to ERR with
    /// IBV_EVENT_QP_REQ_ERR; rxe's RESPST_ERR_TOO_MANY_RDMA_ATM_REQ).
    fn too_many_rd_atomic(&mut self, env: &mut Env<'_>, p: u32) {
        self.class_c(env, p, Syndrome::Nak(NakCode::InvalidRequest), None);
    }

    fn resp_in_order(&mut self, env: &mut Env<'_>, t: &TransportRepr, payload: &[u8]) {
        let p = t.bth.psn;
        let o = t.bth.opcode;
        let mtu = self.mtu as usize;
        // Opcode sequence (IBTA 9.7.4.1.5).
        let ok_seq = match self.resp.in_msg {
            InMsg::Send => matches!(
                o,
                Opcode::RC_SEND_MIDDLE
                    | Opcode::RC_SEND_LAST
                    | Opcode::RC_SEND_LAST_WITH_IMMEDIATE
                    | Opcode::RC_SEND_LAST_WITH_INVALIDATE
            ),
            InMsg::Write => matches!(
                o,
                Opcode::RC_RDMA_WRITE_MIDDLE
                    | Opcode::RC_RDMA_WRITE_LAST
                    | Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
            ),
            InMsg::None => !matches!(
                o,
                Opcode::RC_SEND_MIDDLE
                    | Opcode::RC_SEND_LAST
                    | Opcode::RC_SEND_LAST_WITH_IMMEDIATE
                    | Opcode::RC_SEND_LAST_WITH_INVALIDATE
                    | Opcode::RC_RDMA_WRITE_MIDDLE
                    | Opcode::RC_RDMA_WRITE_LAST
                    | Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
            ),
        };
        let len_ok = match o {
            Opcode::RC_SEND_FIRST
            | Opcode::RC_SEND_MIDDLE
            | Opcode::RC_RDMA_WRITE_FIRST
            | Opcode::RC_RDMA_WRITE_MIDDLE => payload.len() == mtu,
            Opcode::RC_RDMA_READ_REQUEST | Opcode::RC_COMPARE_SWAP | Opcode::RC_FETCH_ADD => {
                payload.is_empty()
            }
            _ => payload.len() <= mtu,
        };
        if !ok_seq || !len_ok {
            self.class_c(
                env,
                p,
                Syndrome::Nak(NakCode::InvalidRequest),
                Some(WcStatus::RemInvReqErr),
            );
            return;
        }
        // QP-level permission for RDMA operations.
        let qp_acc = self.attr.qp_access_flags;
        let qp_ok = match o {
            Opcode::RC_RDMA_WRITE_FIRST
            | Opcode::RC_RDMA_WRITE_ONLY
            | Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE => {
                qp_acc.contains(AccessFlags::REMOTE_WRITE)
            }
            Opcode::RC_RDMA_READ_REQUEST => qp_acc.contains(AccessFlags::REMOTE_READ),
            Opcode::RC_COMPARE_SWAP | Opcode::RC_FETCH_ADD => {
                qp_acc.contains(AccessFlags::REMOTE_ATOMIC)
            }
            _ => true,
        };
        if !qp_ok {
            self.class_c(env, p, Syndrome::Nak(NakCode::InvalidRequest), None);
            return;
        }
        match o {
            Opcode::RC_SEND_FIRST
            | Opcode::RC_SEND_MIDDLE
            | Opcode::RC_SEND_LAST
            | Opcode::RC_SEND_LAST_WITH_IMMEDIATE
            | Opcode::RC_SEND_ONLY
            | Opcode::RC_SEND_ONLY_WITH_IMMEDIATE
            | Opcode::RC_SEND_LAST_WITH_INVALIDATE
            | Opcode::RC_SEND_ONLY_WITH_INVALIDATE => self.resp_send(env, t, payload),
            Opcode::RC_RDMA_WRITE_FIRST
            | Opcode::RC_RDMA_WRITE_MIDDLE
            | Opcode::RC_RDMA_WRITE_LAST
            | Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
            | Opcode::RC_RDMA_WRITE_ONLY
            | Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE => self.resp_write(env, t, payload),
            Opcode::RC_RDMA_READ_REQUEST => self.resp_read(env, t),
            Opcode::RC_COMPARE_SWAP | Opcode::RC_FETCH_ADD => self.resp_atomic(env, t),
            _ => {
                env.stats.rx_unsupported += 1;
                self.class_c(env, p, Syndrome::Nak(NakCode::InvalidRequest), None);
            }
        }
    }

    fn accept(&mut self, env: &mut Env<'_>, t: &TransportRepr, npsn: u32) {
        let _ = env;
        self.resp.epsn = psn_add(t.bth.psn, npsn);
        self.resp.nak_sent = false;
    }

    fn resp_send(&mut self, env: &mut Env<'_>, t: &TransportRepr, payload: &[u8]) {
        let o = t.bth.opcode;
        let first = matches!(
            o,
            Opcode::RC_SEND_FIRST
                | Opcode::RC_SEND_ONLY
                | Opcode::RC_SEND_ONLY_WITH_IMMEDIATE
                | Opcode::RC_SEND_ONLY_WITH_INVALIDATE
        );
        let last = !matches!(o, Opcode::RC_SEND_FIRST | Opcode::RC_SEND_MIDDLE);
        if first {
            let Some(r) = self.take_recv_wqe(env) else {
                self.rnr_nak(env, t.bth.psn);
                return;
            };
            self.resp.recv = Some(r);
            self.resp.recv_off = 0;
        }
        let Some(r) = self.resp.recv.as_ref() else {
            self.class_c(env, t.bth.psn, Syndrome::Nak(NakCode::InvalidRequest), None);
            return;
        };
        if let Some(st) = r.local_err {
            self.class_c(
                env,
                t.bth.psn,
                Syndrome::Nak(NakCode::RemoteOperationalError),
                Some(st),
            );
            return;
        }
        if self.resp.recv_off + payload.len() > r.len {
            self.class_c(
                env,
                t.bth.psn,
                Syndrome::Nak(NakCode::InvalidRequest),
                Some(WcStatus::LocLenErr),
            );
            return;
        }
        if !sgl_write(&r.sges, self.resp.recv_off, payload) {
            self.class_c(
                env,
                t.bth.psn,
                Syndrome::Nak(NakCode::RemoteOperationalError),
                Some(WcStatus::LocProtErr),
            );
            return;
        }
        self.resp.recv_off += payload.len();
        self.accept(env, t, 1);
        if last {
            let r = self.resp.recv.take().expect("checked above");
            let mut wc = self.recv_wc(r.wr_id, WcStatus::Success);
            wc.byte_len = self.resp.recv_off as u32;
            if t.bth.solicited {
                wc.flags |= WcFlags::SOLICITED;
            }
            if let Some(imm) = t.imm_data {
                wc.imm_data = imm;
                wc.flags |= WcFlags::WITH_IMM;
            }
            if let Some(k) = t.invalidate_rkey {
                wc.invalidated_rkey = k;
                wc.flags |= WcFlags::WITH_INV;
            }
            self.resp.msn = psn_add(self.resp.msn, 1);
            self.resp.in_msg = InMsg::None;
            self.complete(env, false, wc);
        } else {
            self.resp.in_msg = InMsg::Send;
        }
        if t.bth.ack_req {
            self.queue_ack(t.bth.psn);
        }
    }

    fn resp_write(&mut self, env: &mut Env<'_>, t: &TransportRepr, payload: &[u8]) {
        let o = t.bth.opcode;
        let first = matches!(
            o,
            Opcode::RC_RDMA_WRITE_FIRST
                | Opcode::RC_RDMA_WRITE_ONLY
                | Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
        );
        let last = !matches!(
            o,
            Opcode::RC_RDMA_WRITE_FIRST | Opcode::RC_RDMA_WRITE_MIDDLE
        );
        let with_imm = matches!(
            o,
            Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE | Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
        );
        if with_imm && !self.have_recv_wqe() {
            self.rnr_nak(env, t.bth.psn);
            return;
        }
        if first {
            let Some(r) = t.reth else {
                self.class_c(env, t.bth.psn, Syndrome::Nak(NakCode::InvalidRequest), None);
                return;
            };
            let Some((mr, off)) = resolve_remote(
                env,
                self.pd,
                &r,
                u64::from(r.dma_len),
                AccessFlags::REMOTE_WRITE,
            ) else {
                self.write_access_error(env, t, with_imm);
                return;
            };
            self.resp.write = Some(WriteCtx {
                mr,
                off,
                remaining: r.dma_len as u64,
                total: r.dma_len,
            });
        }
        let Some(w) = self.resp.write.as_mut() else {
            self.class_c(env, t.bth.psn, Syndrome::Nak(NakCode::InvalidRequest), None);
            return;
        };
        let n = payload.len() as u64;
        if n > w.remaining || (last && n != w.remaining) {
            self.class_c(env, t.bth.psn, Syndrome::Nak(NakCode::InvalidRequest), None);
            return;
        }
        if w.mr.as_ref().is_some_and(|m| !m.is_valid()) {
            // Deregistered while the WRITE was in flight.
            self.write_access_error(env, t, with_imm);
            return;
        }
        if let Some(mr) = &w.mr {
            mr.write_at(w.off, payload);
        }
        w.off += payload.len();
        w.remaining -= n;
        let total = w.total;
        self.accept(env, t, 1);
        if last {
            self.resp.write = None;
            self.resp.in_msg = InMsg::None;
            self.resp.msn = psn_add(self.resp.msn, 1);
            if with_imm {
                if let Some(r) = self.take_recv_wqe(env) {
                    self.complete_write_imm(env, r.wr_id, t, total);
                }
            }
        } else {
            self.resp.in_msg = InMsg::Write;
        }
        if t.bth.ack_req {
            self.queue_ack(t.bth.psn);
        }
    }

    /// An RDMA WRITE failed its R_Key, bounds or permission check, or its
    /// MR went away: NAK remote access error. A WRITE with immediate whose
    /// only packet this is consumes its receive WQE, which completes with
    /// REM_ACCESS_ERR and reports the error (rxe's RKEY_VIOLATION with
    /// immediate data); otherwise the QP raises the access error event.
    pub(super) fn write_access_error(
        &mut self,
        env: &mut Env<'_>,
        t: &TransportRepr,
        with_imm: bool,
    ) {
        let p = t.bth.psn;
        let syndrome = Syndrome::Nak(NakCode::RemoteAccessError);
        if with_imm && t.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE {
            if let Some(r) = self.take_recv_wqe(env) {
                self.resp.recv = Some(r);
                self.class_c(env, p, syndrome, Some(WcStatus::RemAccessErr));
                return;
            }
        }
        self.class_c(env, p, syndrome, None);
    }

    fn resp_read(&mut self, env: &mut Env<'_>, t: &TransportRepr) {
        let Some(r) = t.reth else {
            self.class_c(env, t.bth.psn, Syndrome::Nak(NakCode::InvalidRequest), None);
            return;
        };
        if !self.rd_atomic_room() {
            self.too_many_rd_atomic(env, t.bth.psn);
            return;
        }
        let Some((mr, off)) = resolve_remote(
            env,
            self.pd,
            &r,
            u64::from(r.dma_len),
            AccessFlags::REMOTE_READ,
        ) else {
            self.class_c(
                env,
                t.bth.psn,
                Syndrome::Nak(NakCode::RemoteAccessError),
                None,
            );
            return;
        };
        let npkts = r.dma_len.div_ceil(self.mtu).max(1);
        self.accept(env, t, npkts);
        self.resp.msn = psn_add(self.resp.msn, 1);
        while self.resp.reads.len() >= self.resources() {
            self.resp.reads.pop_front();
        }
        self.resp.reads.push_back(ReadRecord {
            psn: t.bth.psn,
            npkts,
            rkey: r.rkey,
            va: r.va,
            len: r.dma_len,
        });
        self.resp.out.push_back(RespItem::Read {
            mr,
            off,
            len: r.dma_len,
            psn: t.bth.psn,
            sent: 0,
            npkts,
            msn: self.resp.msn,
            dup: false,
            arrived_ns: env.arrived_ns,
        });
    }

    fn resp_atomic(&mut self, env: &mut Env<'_>, t: &TransportRepr) {
        let Some(a) = t.atomic_eth else {
            self.class_c(env, t.bth.psn, Syndrome::Nak(NakCode::InvalidRequest), None);
            return;
        };
        if !self.rd_atomic_room() {
            self.too_many_rd_atomic(env, t.bth.psn);
            return;
        }
        if !a.va.is_multiple_of(8) {
            self.class_c(env, t.bth.psn, Syndrome::Nak(NakCode::InvalidRequest), None);
            return;
        }
        let target = RethRepr {
            va: a.va,
            rkey: a.rkey,
            dma_len: 8,
        };
        let Some((Some(mr), off)) =
            resolve_remote(env, self.pd, &target, 8, AccessFlags::REMOTE_ATOMIC)
        else {
            self.class_c(
                env,
                t.bth.psn,
                Syndrome::Nak(NakCode::RemoteAccessError),
                None,
            );
            return;
        };
        let Some(cell) = mr.atomic_at(off) else {
            self.class_c(env, t.bth.psn, Syndrome::Nak(NakCode::InvalidRequest), None);
            return;
        };
        use std::sync::atomic::Ordering::SeqCst;
        let orig = if t.bth.opcode == Opcode::RC_COMPARE_SWAP {
            match cell.compare_exchange(a.compare, a.swap_add, SeqCst, SeqCst) {
                Ok(v) | Err(v) => v,
            }
        } else {
            cell.fetch_add(a.swap_add, SeqCst)
        };
        while self.resp.replay.len() >= self.resources() {
            self.resp.replay.pop_front();
        }
        self.resp.replay.push_back((t.bth.psn, orig));
        self.accept(env, t, 1);
        self.resp.msn = psn_add(self.resp.msn, 1);
        self.resp.out.push_back(RespItem::Atomic {
            psn: t.bth.psn,
            orig,
            msn: self.resp.msn,
            dup: false,
            arrived_ns: env.arrived_ns,
        });
    }

    /// Next responder packet (ACK/NAK, READ response, atomic ACK).
    pub(crate) fn resp_poll(
        &mut self,
        env: &mut Env<'_>,
        now: u64,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let mtu = self.mtu as usize;
        if matches!(self.resp.out.front(), Some(RespItem::Read { .. })) {
            // READ response data is paced like request data: the QP's
            // congestion controller governs everything it sends.
            if !self.pacer_open(now) {
                return None;
            }
        }
        let alone = self.resp.out.len() == 1;
        let sr_bit = self.sr_bit_on_response();
        let echoes = self.sr_resp.is_some();
        let item = self.resp.out.front_mut()?;
        match item {
            RespItem::Ack {
                psn,
                syndrome,
                msn,
                fatal,
            } => {
                if self.sr_resp.is_some() && *syndrome == Syndrome::ACK && alone {
                    // Nothing queued behind it: acknowledge all there is.
                    *psn = psn_sub(self.resp.epsn, 1);
                    *msn = self.resp.msn;
                }
                let mut f = response_packet(&self.tmpl, sr_bit, Opcode::RC_ACKNOWLEDGE, *psn);
                // The echo is of the packet it acknowledges, if that is the
                // latest accepted (not of PSNs placed ahead of it).
                let arrived = self.resp.arrival.filter(|(p, _)| p == psn).map(|(_, t)| t);
                f.transport.bth.delay_echo = echo_code(echoes, arrived, now);
                f.transport.aeth = Some(AethRepr {
                    syndrome: *syndrome,
                    msn: *msn,
                });
                let fatal = *fatal;
                let syn = *syndrome;
                // SR QPs: a positive ACK of the latest PSN carries a SACK.
                let mut sack = [0u8; xroce_wire::sack::MAX_LEN];
                let sack_len = if syn == Syndrome::ACK {
                    self.sr_sack_block(f.transport.bth.psn, &mut sack)
                } else {
                    0
                };
                let t = codec::emit_copy(&f, &sack[..sack_len], buf).ok()?;
                self.resp.out.pop_front();
                if syn == Syndrome::ACK {
                    env.stats.tx_acks += 1;
                }
                if sack_len > 0 {
                    env.stats.tx_sacks += 1;
                }
                if let Some(cause) = fatal {
                    self.go_error.get_or_insert(cause);
                }
                Some(t)
            }
            RespItem::Atomic {
                psn,
                orig,
                msn,
                arrived_ns,
                ..
            } => {
                let mut f =
                    response_packet(&self.tmpl, sr_bit, Opcode::RC_ATOMIC_ACKNOWLEDGE, *psn);
                f.transport.bth.delay_echo = echo_code(echoes, Some(*arrived_ns), now);
                f.transport.aeth = Some(AethRepr {
                    syndrome: Syndrome::ACK,
                    msn: *msn,
                });
                f.transport.atomic_ack_eth = Some(AtomicAckEthRepr { orig_data: *orig });
                let t = codec::emit_copy(&f, &[], buf).ok()?;
                self.resp.out.pop_front();
                env.stats.tx_atomic_acks += 1;
                Some(t)
            }
            RespItem::Read {
                mr,
                off,
                len,
                psn: first,
                sent,
                npkts,
                msn,
                arrived_ns,
                ..
            } => {
                if mr.as_ref().is_some_and(|m| !m.is_valid()) {
                    let p = psn_add(*first, *sent);
                    self.resp.out.pop_front();
                    self.class_c(env, p, Syndrome::Nak(NakCode::RemoteAccessError), None);
                    return self.resp_poll(env, now, buf);
                }
                let k = *sent;
                let o = k as usize * mtu;
                let plen = (*len as usize - o).min(mtu);
                let opcode = match (*npkts, k) {
                    (1, _) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (_, 0) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (n, k) if k + 1 == n => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    _ => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                };
                let mut f = response_packet(&self.tmpl, sr_bit, opcode, psn_add(*first, k));
                f.transport.bth.delay_echo = echo_code(echoes, Some(*arrived_ns), now);
                f.transport.aeth =
                    (opcode != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE).then_some(AethRepr {
                        syndrome: Syndrome::ACK,
                        msn: *msn,
                    });
                let at = *off + o;
                // From the MR straight into the datagram, or left there
                // for the backend to send from (checked valid above).
                let base = buf.as_ptr() as usize;
                let mut gather = env.gather.as_deref_mut();
                let t = codec::emit(&f, plen, buf, |p| {
                    if let Some(src) = mr.as_ref() {
                        match gather.as_deref_mut().filter(|_| !p.is_empty()) {
                            Some(g) => {
                                g.start(p.as_ptr() as usize - base);
                                g.push(src, at, p.len());
                            }
                            None => src.read_at(at, p),
                        }
                    }
                    Ok(())
                });
                let Ok(t) = t else {
                    if let Some(g) = gather {
                        g.clear();
                    }
                    return None;
                };
                *sent += 1;
                if *sent >= *npkts {
                    self.resp.out.pop_front();
                }
                env.stats.tx_read_responses += 1;
                self.qstats.tx_packets += 1;
                self.qstats.tx_bytes += t.frame_len() as u64;
                self.paced_send(now, t.frame_len());
                if self.state == QpState::Err {
                    return None;
                }
                Some(t)
            }
        }
    }
}

/// A response of `opcode` at `psn` from the QP's template `tmpl`, with
/// the selective-repeat capable bit if `sr_bit` (the responder runs it).
fn response_packet(tmpl: &FrameRepr, sr_bit: bool, opcode: Opcode, psn: u32) -> FrameRepr {
    let mut f = codec::packet(tmpl, opcode, psn);
    f.transport.bth.sr_capable = sr_bit;
    f
}
