//! Unreliable Datagram receive side (IBTA 9.8.5 / rxe): one SEND per packet,
//! Q_Key checked against the QP's, no PSN ordering, no ACKs. As in ibverbs,
//! the first 40 bytes of the receive buffer get the GRH; for RoCEv2 over
//! IPv4 that is 20 zero bytes followed by the packet's IPv4 header, and the
//! completion has the GRH flag and the sender's QPN.

use super::codec::{op, PktHdr};
use super::qp::{sgl_write, QpCtx};
use super::Env;
use crate::verbs::wc::{WcFlags, WcStatus};

pub(crate) const GRH_LEN: usize = 40;

impl QpCtx {
    pub(crate) fn ud_recv(&mut self, env: &mut Env<'_>, h: &PktHdr, payload: &[u8]) {
        if !matches!(h.opcode, op::UD_SEND_ONLY | op::UD_SEND_ONLY_IMM) {
            env.stats.rx_unsupported += 1;
            return;
        }
        let Some((qkey, src_qp)) = h.deth else {
            env.stats.rx_malformed += 1;
            return;
        };
        if qkey != self.attr.qkey {
            env.stats.rx_dropped_other += 1; // Q_Key violation: silently dropped
            return;
        }
        if payload.len() > self.mtu as usize {
            env.stats.rx_dropped_other += 1;
            return;
        }
        let r = match &self.srq {
            Some(srq) => srq.pop(),
            None => self.rq.pop_front(),
        };
        let Some(r) = r else {
            env.stats.rx_dropped_other += 1; // no receive WQE: UD drops
            return;
        };
        let mut wc = self.recv_wc(r.wr_id, WcStatus::Success);
        wc.src_qp = src_qp;
        if let Some(st) = r.local_err {
            wc.status = st;
            self.complete(env, false, wc);
            return;
        }
        if GRH_LEN + payload.len() > r.len {
            wc.status = WcStatus::LocLenErr;
            self.complete(env, false, wc);
            return;
        }
        let mut grh = [0u8; GRH_LEN];
        let ip = &mut grh[20..];
        ip[0] = 0x45;
        ip[1] = (h.dscp << 2) | (h.ecn & 3);
        let tot = (20 + 8 + 12 + 4 + 4 + payload.len()) as u16;
        ip[2..4].copy_from_slice(&tot.to_be_bytes());
        ip[6] = 0x40;
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&h.src_ip);
        ip[16..20].copy_from_slice(&h.dst_ip);
        if !sgl_write(&r.sges, 0, &grh) || !sgl_write(&r.sges, GRH_LEN, payload) {
            wc.status = WcStatus::LocProtErr;
            self.complete(env, false, wc);
            return;
        }
        wc.byte_len = (GRH_LEN + payload.len()) as u32;
        wc.flags |= WcFlags::GRH;
        if h.se {
            wc.flags |= WcFlags::SOLICITED;
        }
        if let Some(imm) = h.imm {
            wc.imm_data = imm;
            wc.flags |= WcFlags::WITH_IMM;
        }
        self.complete(env, false, wc);
    }
}
