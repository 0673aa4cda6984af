//! QP state transitions: `ibv_modify_qp` applied to the context, reset,
//! and the move to ERR with its flush (deferred to the end of each event).

use super::codec;
use super::completion::WcStatus;
use super::qp::{ErrCause, InMsg, QpCtx, ReqState};
use super::qp_attr::{Mtu, QpAttr, QpAttrMask, QpState};
use super::{AsyncEvent, Env};

impl QpCtx {
    /// Called after every event: applies deferred transitions to ERR.
    pub(crate) fn after_event(&mut self, env: &mut Env<'_>) {
        if matches!(self.state, QpState::Rts | QpState::Sqd) {
            self.complete_local_errors(env);
        }
        if let Some(cause) = self.go_error.take() {
            if self.state != QpState::Err {
                let qpn = self.qpn;
                let event = match cause {
                    ErrCause::Completion => None,
                    ErrCause::AccessViolation => Some(AsyncEvent::QpAccessError { qpn }),
                    ErrCause::InvalidRequest => Some(AsyncEvent::QpRequestError { qpn }),
                    ErrCause::Fatal => Some(AsyncEvent::QpFatal {
                        qpn,
                        cq_overflow: self.cq_overflowed,
                    }),
                };
                self.enter_error(env);
                // After the move: whoever handles the event finds the QP in ERR.
                if let Some(e) = event {
                    env.event(e);
                }
            }
        }
        if self.state == QpState::Sqd
            && !self.sqd_notified
            && self.sq.front().is_none_or(|w| !w.started)
        {
            self.sqd_notified = true;
            env.event(super::AsyncEvent::SqDrained { qpn: self.qpn });
        }
    }

    /// Move to ERR and flush every outstanding WR with WR_FLUSH_ERR.
    pub(crate) fn enter_error(&mut self, env: &mut Env<'_>) {
        self.state = QpState::Err;
        // A poster outside the engine learns of it (take_retired).
        self.note_changed(env);
        while let Some(w) = self.pop_send_wqe(env) {
            let wc = self.send_wc(&w, WcStatus::WrFlushErr);
            self.complete(env, true, wc);
        }
        if let Some(r) = self.resp.recv.take() {
            let wc = self.recv_wc(r.wr_id, WcStatus::WrFlushErr);
            self.complete(env, false, wc);
        }
        while let Some(r) = self.pop_recv_wqe(env) {
            let wc = self.recv_wc(r.wr_id, WcStatus::WrFlushErr);
            self.complete(env, false, wc);
        }
        self.go_error = None;
        self.resp.out.clear();
        self.resp.write = None;
        self.resp.in_msg = InMsg::None;
        self.req.idx = 0;
        self.req.offset = 0;
        self.req.rd_atomic_outstanding = 0;
        self.req.timers.cancel_all();
        self.cnp_due = false;
    }

    fn reset(&mut self, env: &mut Env<'_>) {
        self.state = QpState::Reset;
        self.comm_est = false;
        self.cq_overflowed = false;
        self.note_retired(env, self.sq.len() as u32, self.rq.len() as u32);
        self.sq.clear();
        self.rq.clear();
        self.req = ReqState::default();
        self.resp.recv = None;
        self.resp.out.clear();
        self.resp.replay.clear();
        self.resp.reads.clear();
        self.resp.write = None;
        self.resp.in_msg = InMsg::None;
        self.resp.nak_sent = false;
        self.resp.msn = 0;
        self.cnp_due = false;
        self.sr_restart();
    }

    pub(crate) fn apply_modify(
        &mut self,
        env: &mut Env<'_>,
        to: QpState,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) {
        let from = self.state;
        // A poster outside the engine learns the new state and MTU
        // (take_retired).
        self.note_changed(env);
        copy_masked_attrs(&mut self.attr, attr, mask);
        // Setting the retry counts also refills what is left of them.
        if mask.contains(QpAttrMask::RETRY_CNT) {
            self.req.retry_left = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            self.req.rnr_left = attr.rnr_retry;
        }
        match (from, to) {
            (_, QpState::Reset) => self.reset(env),
            (_, QpState::Err) => {
                if from != QpState::Err {
                    self.enter_error(env);
                }
            }
            (QpState::Init, QpState::Rtr) => {
                self.state = to;
                self.resp.epsn = self.attr.rq_psn;
                self.resp.msn = 0;
                self.mtu = self.attr.path_mtu.bytes();
                self.build_template(env);
            }
            (QpState::Rtr, QpState::Rts) => {
                self.state = to;
                let p = self.attr.sq_psn;
                self.req.psn = p;
                self.req.max_psn = p;
                self.req.comp_psn = p;
                self.req.retry_left = self.attr.retry_cnt;
                self.req.rnr_left = self.attr.rnr_retry;
            }
            _ => {
                // The path MTU only takes effect at INIT -> RTR (segments in
                // flight are numbered with it).
                self.attr.path_mtu = Mtu::from_bytes(self.mtu).unwrap_or_default();
                if to == QpState::Sqd && from != QpState::Sqd {
                    self.sqd_notified = false;
                }
                self.state = to;
            }
        }
    }

    fn build_template(&mut self, env: &Env<'_>) {
        let av = &self.attr.ah_attr;
        // rxe's choice (rdma_get_udp_sport): a hash of the two QPNs.
        let sport = av
            .udp_sport
            .unwrap_or_else(|| xroce_wire::rocev2_src_port(0, self.qpn, self.attr.dest_qp_num));
        self.tmpl = codec::template(env.cfg, av, self.attr.dest_qp_num, sport);
    }
}

/// Copies into `to` each attribute of `from` whose bit `mask` sets.
fn copy_masked_attrs(to: &mut QpAttr, from: &QpAttr, mask: QpAttrMask) {
    macro_rules! copy_if_masked {
        ($($bit:ident => $field:ident),+ $(,)?) => {
            $(if mask.contains(QpAttrMask::$bit) {
                to.$field = from.$field;
            })+
        };
    }
    copy_if_masked!(
        ACCESS_FLAGS => qp_access_flags,
        PKEY_INDEX => pkey_index,
        PORT => port_num,
        AV => ah_attr,
        PATH_MTU => path_mtu,
        DEST_QPN => dest_qp_num,
        RQ_PSN => rq_psn,
        SQ_PSN => sq_psn,
        TIMEOUT => timeout,
        RETRY_CNT => retry_cnt,
        RNR_RETRY => rnr_retry,
        MIN_RNR_TIMER => min_rnr_timer,
        MAX_QP_RD_ATOMIC => max_rd_atomic,
        MAX_DEST_RD_ATOMIC => max_dest_rd_atomic,
        QKEY => qkey,
    );
}
