//! Unreliable Connected service (IBTA 9.8.4 / rxe): the RC machinery
//! without ACKs, retransmission, READ or atomics. The requester completes a
//! WQE once its last packet is sent; the responder accepts packets in PSN
//! order only and silently drops a whole message on a gap, an error or a
//! missing receive WQE (the receive WQE is reused for the next message),
//! resynchronising on the next FIRST/ONLY packet.

use xroce_wire::{psn_add, psn_diff, TransportRepr};

use super::completion::{WcFlags, WcStatus};
use super::memory::AccessFlags;
use super::qp::{InMsg, QpCtx, WriteCtx};
use super::wqe::sgl_write;
use super::Env;

impl QpCtx {
    pub(crate) fn uc_complete_sent(&mut self, env: &mut Env<'_>) {
        if let Some(w) = self.pop_send_wqe(env) {
            self.req.idx = self.req.idx.saturating_sub(1);
            if w.signaled {
                let wc = self.send_wc(&w, WcStatus::Success);
                self.complete(env, true, wc);
            }
        }
    }

    fn uc_drop_msg(&mut self, env: &mut Env<'_>) {
        env.stats.rx_dropped_other += 1;
        self.resp.in_msg = InMsg::None;
        self.resp.write = None;
        self.resp.recv_off = 0;
        self.resp.nak_sent = true; // "drop until the next FIRST/ONLY"
    }

    /// One UC request packet (SEND or RDMA WRITE, by the QP's service).
    pub(crate) fn uc_recv(&mut self, env: &mut Env<'_>, t: &TransportRepr, payload: &[u8]) {
        let o = t.bth.opcode;
        let p = t.bth.psn;
        let first = o.is_first() || o.is_only();
        let d = psn_diff(p, self.resp.epsn);
        if d < 0 {
            // Behind: a duplicate (rxe would accept a duplicated FIRST/ONLY
            // and deliver the message twice; we drop it).
            env.stats.rx_duplicate += 1;
            return;
        }
        if d > 0 {
            env.stats.rx_out_of_sequence += 1;
            // Lost packets: abandon the message in progress, resync here.
            self.uc_drop_msg(env);
            self.resp.epsn = p;
        }
        if self.resp.nak_sent && !first {
            env.stats.rx_dropped_other += 1;
            self.resp.epsn = psn_add(p, 1);
            return;
        }
        self.resp.nak_sent = false;
        self.resp.epsn = psn_add(p, 1);
        let mtu = self.mtu as usize;
        let in_seq = match self.resp.in_msg {
            InMsg::Send => o.is_send() && (o.is_middle() || o.is_last()),
            InMsg::Write => o.is_rdma_write() && (o.is_middle() || o.is_last()),
            InMsg::None => first,
        };
        let last = o.is_last() || o.is_only();
        let len_ok = if last {
            payload.len() <= mtu
        } else {
            payload.len() == mtu
        };
        if !in_seq || !len_ok {
            self.uc_drop_msg(env);
            return;
        }
        if o.is_send() {
            if first {
                if self.resp.recv.is_none() {
                    match self.take_recv_wqe(env) {
                        Some(r) => self.resp.recv = Some(r),
                        None => {
                            self.uc_drop_msg(env);
                            return;
                        }
                    }
                }
                self.resp.recv_off = 0;
            }
            let Some(r) = self.resp.recv.as_ref() else {
                self.uc_drop_msg(env);
                return;
            };
            if r.local_err.is_some() || self.resp.recv_off + payload.len() > r.len {
                // The receive WQE cannot take it: complete it in error.
                let r = self.resp.recv.take().expect("checked");
                let st = r.local_err.unwrap_or(WcStatus::LocLenErr);
                let wc = self.recv_wc(r.wr_id, st);
                self.complete(env, false, wc);
                self.uc_drop_msg(env);
                return;
            }
            if !sgl_write(&r.sges, self.resp.recv_off, payload) {
                self.uc_drop_msg(env);
                return;
            }
            self.resp.recv_off += payload.len();
            if last {
                let r = self.resp.recv.take().expect("checked");
                let mut wc = self.recv_wc(r.wr_id, WcStatus::Success);
                wc.byte_len = self.resp.recv_off as u32;
                if t.bth.solicited {
                    wc.flags |= WcFlags::SOLICITED;
                }
                if let Some(imm) = t.imm_data {
                    wc.imm_data = imm;
                    wc.flags |= WcFlags::WITH_IMM;
                }
                self.resp.in_msg = InMsg::None;
                self.complete(env, false, wc);
            } else {
                self.resp.in_msg = InMsg::Send;
            }
            return;
        }
        // RDMA WRITE.
        if first {
            // A zero-length WRITE needs no valid R_Key or VA (C9-88).
            let ok = t.reth.and_then(|r| {
                let (mr, off) = super::responder::resolve_remote(
                    env,
                    self.pd,
                    &r,
                    u64::from(r.dma_len),
                    AccessFlags::REMOTE_WRITE,
                )?;
                Some(WriteCtx {
                    mr,
                    off,
                    remaining: r.dma_len as u64,
                    total: r.dma_len,
                })
            });
            if ok.is_none()
                || !self
                    .attr
                    .qp_access_flags
                    .contains(AccessFlags::REMOTE_WRITE)
            {
                self.uc_drop_msg(env);
                return;
            }
            self.resp.write = ok;
        }
        let with_imm = o.has_immediate();
        let Some(w) = self.resp.write.as_mut() else {
            self.uc_drop_msg(env);
            return;
        };
        let n = payload.len() as u64;
        if n > w.remaining
            || (last && n != w.remaining)
            || w.mr.as_ref().is_some_and(|m| !m.is_valid())
        {
            self.uc_drop_msg(env);
            return;
        }
        if let Some(mr) = &w.mr {
            mr.write_at(w.off, payload);
        }
        w.off += payload.len();
        w.remaining -= n;
        let total = w.total;
        if !last {
            self.resp.in_msg = InMsg::Write;
            return;
        }
        self.resp.write = None;
        self.resp.in_msg = InMsg::None;
        if with_imm {
            // A receive WQE kept from a dropped SEND is the oldest: use it.
            let r = match self.resp.recv.take() {
                Some(r) => Some(r),
                None => self.take_recv_wqe(env),
            };
            if let Some(r) = r {
                self.complete_write_imm(env, r.wr_id, t, total);
            }
        }
    }
}
