//! Unreliable Datagram receive side (IBTA 9.8.5 / rxe): one SEND per packet,
//! Q_Key checked against the QP's, no PSN ordering, no ACKs. As in ibverbs,
//! the first 40 bytes of the receive buffer get the GRH: the packet's IPv6
//! header, or for RoCEv2 over IPv4 20 zero bytes followed by its IPv4
//! header; the completion has the GRH flag and the sender's QPN.

use xroce_wire::{FrameRepr, IpRepr, Opcode};

use super::completion::{WcFlags, WcStatus};
use super::qp::QpCtx;
use super::wqe::sgl_write;
use super::Env;

pub(crate) const GRH_LEN: usize = 40;

impl QpCtx {
    pub(crate) fn ud_recv(&mut self, env: &mut Env<'_>, f: &FrameRepr, payload: &[u8]) {
        let t = &f.transport;
        if !matches!(
            t.bth.opcode,
            Opcode::UD_SEND_ONLY | Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
        ) {
            env.stats.rx_unsupported += 1;
            return;
        }
        let Some(deth) = t.deth else {
            env.stats.rx_malformed += 1;
            return;
        };
        // As rxe: QP1 takes only the GSI Q_Key, whatever INIT set.
        let qkey = if self.qpn == super::GSI_QPN {
            super::GSI_QKEY
        } else {
            self.attr.qkey
        };
        if deth.qkey != qkey {
            env.stats.rx_dropped_other += 1; // Q_Key violation: silently dropped
            return;
        }
        if payload.len() > self.mtu as usize {
            env.stats.rx_dropped_other += 1;
            return;
        }
        let Some(r) = self.take_recv_wqe(env) else {
            env.stats.rx_dropped_other += 1; // no receive WQE: UD drops
            return;
        };
        let mut wc = self.recv_wc(r.wr_id, WcStatus::Success);
        wc.src_qp = deth.src_qp;
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
        let emitted = match &f.ip {
            IpRepr::V4(ip) => ip.emit(&mut grh[GRH_LEN - xroce_wire::ipv4::HEADER_LEN..]),
            IpRepr::V6(ip) => ip.emit(&mut grh),
        };
        debug_assert!(emitted.is_ok(), "a parsed IP header emits: {emitted:?}");
        if !sgl_write(&r.sges, 0, &grh) || !sgl_write(&r.sges, GRH_LEN, payload) {
            wc.status = WcStatus::LocProtErr;
            self.complete(env, false, wc);
            return;
        }
        wc.byte_len = (GRH_LEN + payload.len()) as u32;
        wc.flags |= WcFlags::GRH;
        if t.bth.solicited {
            wc.flags |= WcFlags::SOLICITED;
        }
        if let Some(imm) = t.imm_data {
            wc.imm_data = imm;
            wc.flags |= WcFlags::WITH_IMM;
        }
        self.complete(env, false, wc);
    }
}
