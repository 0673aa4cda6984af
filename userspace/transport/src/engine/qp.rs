//! Per-QP engine state shared by requester, completer and responder: the
//! QP context, its requester/responder state, completions and pacing.
//! Posting is `post.rs`, modify/flush `modify.rs`, the per-QP dispatch of
//! packets, transmit turns and timers `dispatch.rs`, WQEs `wqe.rs`.

use std::collections::VecDeque;
use std::sync::Arc;

use super::codec;
use super::completion::{Completion, CqId, Wc, WcFlags, WcOpcode, WcStatus};
use super::memory::MrInner;
use super::qp_attr::{QpAttr, QpCap, QpState, QpType};
use super::srq::Srq;
use super::timers::{self, TimerTable};
use super::wqe::{RecvWqe, SendWqe};
use super::{Env, QpCreate};
use crate::cc::{CongestionControl, Pacer};
use xroce_wire::{FrameRepr, Syndrome};

/// The size a QP's pacer gates on at path MTU `mtu`: the largest data frame
/// it sends (a full payload under the most headers). Every data packet waits
/// for this much credit whatever its size, so `poll_timeout` can say when the
/// next one may go without building it, and back-to-back bursts stay within
/// `pacing_burst_bytes` (see [`Pacer`]).
pub fn pacing_frame_bytes(mtu: u32) -> usize {
    mtu as usize + xroce_wire::MAX_OVERHEAD
}

/// Requester + completer state.
#[derive(Default)]
pub(crate) struct ReqState {
    /// Next PSN to send.
    pub psn: u32,
    /// Index into the SQ of the WQE being sent.
    pub idx: usize,
    /// Bytes of WQE `idx` already sent (for READ: response bytes requested).
    pub offset: usize,
    /// One past the highest PSN ever sent.
    pub max_psn: u32,
    /// Oldest PSN not yet acknowledged / responded to.
    pub comp_psn: u32,
    pub noack: u32,
    pub rd_atomic_outstanding: u32,
    /// The RNR back-off and retransmission deadlines.
    pub timers: TimerTable,
    pub retry_left: u8,
    pub rnr_left: u8,
    pub started_retry: bool,
    pub retry_psn: u32,
    pub rtt_sample: Option<(u32, u64)>,
    /// Retransmission timer (requester.rs): consecutive expiries without
    /// progress (the timeout doubles with each, capped), the RTO deadline
    /// that follows a tail-loss probe armed in `timers`, and the
    /// smoothed round-trip time the probe waits a few of.
    pub rto_backoff: u8,
    pub rto_after_probe: Option<u64>,
    /// Tail-loss probes since the retransmission timer was last armed
    /// (`arm_rto`); on go-back-N each waits four times the one before.
    pub probes: u8,
    /// Probes that sent a window again since the last round-trip sample:
    /// each makes every later probe wait four times as long (Karn's
    /// back-off). What is sent again is never a sample, so behind a queue
    /// deeper than the estimate the estimate would never catch up, and
    /// every probe would add a window to that queue.
    pub probe_backoff: u8,
    pub srtt_ns: Option<u64>,
    /// How much the samples stray from `srtt_ns` (RFC 6298's RTTVAR): a
    /// queue that grows and drains makes the round trip swing, and a probe
    /// that waits only a few smoothed round trips would fire on the swing.
    pub rttvar_ns: u64,
    /// The latest round-trip sample (shown by `xroce status --qps`).
    pub last_rtt_ns: Option<u64>,
    /// The latest fabric round trip (`delay_echo`), the congestion
    /// controller's sample where the peer echoes its delay.
    pub last_fabric_rtt_ns: Option<u64>,
    /// Send times of recent PSNs, once the peer runs selective repeat.
    pub sent_times: Option<Box<super::delay_echo::SentTimes>>,
    /// The echo of the response being handled.
    pub echo: Option<super::delay_echo::Echo>,
    /// When the oldest packet sent since the last that asked for an ACK
    /// went out (see `EngineConfig::ack_req_interval_ns`).
    pub unrequested_since: Option<u64>,
}

/// Responder output, sent in order.
pub(crate) enum RespItem {
    Ack {
        psn: u32,
        syndrome: Syndrome,
        msn: u32,
        /// Move the QP to ERR once sent (class C errors), for this reason.
        fatal: Option<ErrCause>,
    },
    Read {
        /// None for a zero-length READ (see [`RemoteMr`]).
        mr: RemoteMr,
        off: usize,
        len: u32,
        psn: u32,
        sent: u32,
        npkts: u32,
        msn: u32,
        /// Re-execution of a duplicate request (does not use a resource).
        dup: bool,
        /// When the request reached the host (its responses echo the time
        /// since).
        arrived_ns: u64,
    },
    Atomic {
        psn: u32,
        orig: u64,
        msn: u32,
        dup: bool,
        arrived_ns: u64,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum InMsg {
    None,
    Send,
    Write,
}

/// The MR an RDMA WRITE or READ places into or reads from: `None` when its
/// DMA length is 0, which names no memory, so its R_Key and VA are not
/// checked (IBTA C9-88; rxe's check_rkey). UCX's flush is such a WRITE
/// with VA 0 and R_Key 0.
pub(crate) type RemoteMr = Option<Arc<MrInner>>;

/// Why a QP moves to ERR by itself: it decides the affiliated asynchronous
/// event (IBTA 10.10.2.3, C9-222.1.1), raised once the QP has moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrCause {
    /// An error completion reports it (requester errors, responder errors
    /// tied to a receive WQE): no event, as rxe.
    Completion,
    /// Responder R_Key, bounds or permission violation not tied to a
    /// receive WQE: `IBV_EVENT_QP_ACCESS_ERR`.
    AccessViolation,
    /// Responder invalid request not tied to a receive WQE:
    /// `IBV_EVENT_QP_REQ_ERR`.
    InvalidRequest,
    /// Anything else (a lost completion, a responder operational error):
    /// `IBV_EVENT_QP_FATAL`.
    Fatal,
}

pub(crate) struct WriteCtx {
    pub mr: RemoteMr,
    pub off: usize,
    pub remaining: u64,
    pub total: u32,
}

pub(crate) struct RespState {
    pub epsn: u32,
    pub msn: u32,
    pub nak_sent: bool,
    pub in_msg: InMsg,
    pub recv: Option<RecvWqe>,
    pub recv_off: usize,
    pub write: Option<WriteCtx>,
    pub out: VecDeque<RespItem>,
    /// Atomic replay cache: (psn, original value).
    pub replay: VecDeque<(u32, u64)>,
    /// The READs executed last, oldest first: only a duplicate of one of
    /// them is executed again (rxe's responder resources).
    pub reads: VecDeque<ReadRecord>,
    /// The PSN of the latest request packet accepted in order and when it
    /// reached the host: an ACK of that PSN echoes the time since.
    pub arrival: Option<(u32, u64)>,
}

/// A READ request the responder executed, as checked then: a duplicate
/// READ (the requester retrying a lost response) re-executes from this,
/// never from what the duplicate packet names, so a spoofed one cannot
/// read anything the peer did not (rxe's find_resource / duplicate_request).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadRecord {
    /// First PSN of the response; it spans `npkts` PSNs.
    pub psn: u32,
    pub npkts: u32,
    pub rkey: u32,
    pub va: u64,
    pub len: u32,
}

/// Send and receive WQEs that left a QP's queues since the engine's owner
/// last asked ([`super::Engine::take_retired`]), and whether the QP is on
/// the engine's list for it (it is also listed when it was modified or
/// entered ERR).
#[derive(Default, Clone, Copy)]
pub(crate) struct Retired {
    pub sq: u32,
    pub rq: u32,
    pub listed: bool,
}

pub(crate) struct QpCtx {
    pub qpn: u32,
    /// WQEs given back since the owner last asked.
    pub retired: Retired,
    pub qstats: super::QpStats,
    pub qp_type: QpType,
    pub pd: u32,
    pub state: QpState,
    pub attr: QpAttr,
    pub cap: QpCap,
    pub sq_sig_all: bool,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub srq: Option<Arc<Srq>>,
    pub rq: VecDeque<RecvWqe>,
    pub sq: VecDeque<SendWqe>,
    pub req: ReqState,
    pub resp: RespState,
    pub cc: Box<dyn CongestionControl>,
    /// Paces request data and READ response data at `cc`'s rate.
    pub pacer: Pacer,
    pub tmpl: FrameRepr,
    pub mtu: u32,
    pub cnp_due: bool,
    /// Next data packet: the requester's turn (vs READ responses).
    pub prefer_req: bool,
    pub last_cnp_ns: Option<u64>,
    /// Set when an error takes the QP to ERR (applied after the event, see
    /// `after_event`), with the reason that picks its async event.
    pub go_error: Option<ErrCause>,
    pub cq_overflowed: bool,
    pub sqd_notified: bool,
    pub comm_est: bool,
    /// What this QP adds to the engine's device-wide in-flight count
    /// (its `unacked_pkts` when the engine last looked).
    pub counted_inflight: u32,
    /// Set by `poll_transmit` when new request data waited for room in
    /// the device's in-flight budget.
    pub budget_blocked: bool,
    /// One past the last PSN of the message being sent, while it is only
    /// partly sent: a message takes its room in the device budget whole
    /// when it starts, so it can always finish (its last packet asks for
    /// the ACK that frees the room; QPs holding room for half-sent
    /// messages without one would wait for each other until their RTOs).
    pub reserved_end: Option<u32>,
    /// Whether and how this QP agrees on selective repeat (`selective.rs`).
    pub sr_mode: super::selective::SrMode,
    /// The requester's selective repeat state once it runs it (None:
    /// go-back-N): WRITEs with a RETH in every packet, SACKs read.
    pub sr_req: Option<Box<super::selective::SrReq>>,
    /// The responder's selective repeat state once it runs it (None:
    /// go-back-N): WRITE packets placed ahead, ACKs with SACKs.
    pub sr_resp: Option<Box<super::selective::SrResp>>,
}

impl QpCtx {
    /// Takes the front send WQE off the queue (done with it), counted for
    /// [`super::Engine::take_retired`].
    pub(crate) fn pop_send_wqe(&mut self, env: &mut Env<'_>) -> Option<SendWqe> {
        let w = self.sq.pop_front()?;
        self.note_retired(env, 1, 0);
        Some(w)
    }

    /// Takes the front receive WQE off the QP's own queue, counted as
    /// [`Self::pop_send_wqe`].
    pub(crate) fn pop_recv_wqe(&mut self, env: &mut Env<'_>) -> Option<RecvWqe> {
        let r = self.rq.pop_front()?;
        self.note_retired(env, 0, 1);
        Some(r)
    }

    pub(crate) fn note_retired(&mut self, env: &mut Env<'_>, sq: u32, rq: u32) {
        if sq + rq > 0 {
            self.note_changed(env);
        }
        self.retired.sq += sq;
        self.retired.rq += rq;
    }

    /// Puts the QP on the engine's list for [`super::Engine::take_retired`].
    pub(crate) fn note_changed(&mut self, env: &mut Env<'_>) {
        if !self.retired.listed {
            self.retired.listed = true;
            env.retired.push(self.qpn);
        }
    }

    pub(crate) fn new(
        qpn: u32,
        c: QpCreate,
        cc: Box<dyn CongestionControl>,
        pacing_burst_bytes: u64,
    ) -> Self {
        Self {
            qpn,
            retired: Retired::default(),
            qstats: super::QpStats::default(),
            qp_type: c.qp_type,
            pd: c.pd,
            state: QpState::Reset,
            attr: QpAttr::default(),
            cap: c.cap,
            sq_sig_all: c.sq_sig_all,
            send_cq: c.send_cq,
            recv_cq: c.recv_cq,
            srq: c.srq,
            rq: VecDeque::with_capacity(c.cap.max_recv_wr as usize),
            sq: VecDeque::with_capacity(c.cap.max_send_wr as usize),
            req: ReqState::default(),
            resp: RespState {
                epsn: 0,
                msn: 0,
                nak_sent: false,
                in_msg: InMsg::None,
                recv: None,
                recv_off: 0,
                write: None,
                out: VecDeque::with_capacity(64),
                replay: VecDeque::with_capacity(16),
                reads: VecDeque::with_capacity(16),
                arrival: None,
            },
            cc,
            pacer: Pacer::new(pacing_burst_bytes),
            tmpl: codec::unconnected(),
            mtu: 1024,
            cnp_due: false,
            prefer_req: false,
            last_cnp_ns: None,
            go_error: None,
            cq_overflowed: false,
            sqd_notified: false,
            comm_est: false,
            counted_inflight: 0,
            budget_blocked: false,
            reserved_end: None,
            sr_mode: super::selective::SrMode::Off,
            sr_req: None,
            sr_resp: None,
        }
    }

    /// Queue a completion for the send or the receive CQ (drained by the
    /// engine's owner; a full CQ comes back as [`super::Engine::cq_overflowed`]).
    pub(crate) fn complete(&mut self, env: &mut Env<'_>, send: bool, wc: Wc) {
        let cq = if send { self.send_cq } else { self.recv_cq };
        env.completions.push(Completion { cq, wc });
    }

    pub(crate) fn send_wc(&self, w: &SendWqe, status: WcStatus) -> Wc {
        Wc {
            wr_id: w.wr_id,
            status,
            opcode: w.op.wc_opcode(),
            byte_len: w.len,
            qp_num: self.qpn,
            src_qp: self.attr.dest_qp_num,
            ..Default::default()
        }
    }

    pub(crate) fn recv_wc(&self, wr_id: u64, status: WcStatus) -> Wc {
        Wc {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            qp_num: self.qpn,
            src_qp: self.attr.dest_qp_num,
            flags: WcFlags::empty(),
            ..Default::default()
        }
    }

    /// Retransmission timeout (local ACK timeout), if any.
    pub(crate) fn rto_ns(&self) -> Option<u64> {
        timers::ack_timeout_ns(self.attr.timeout)
    }

    /// PSNs sent and not yet acknowledged or answered, plus the rest of a
    /// partly sent message ([`reserved_end`](Self::reserved_end)); RC only
    /// (UC and UD acknowledge nothing), none once the QP no longer sends.
    /// Every state change passes through here (the engine counts after
    /// each event), so a reservation never outlives its QP's state.
    pub(crate) fn unacked_pkts(&mut self) -> u32 {
        if self.qp_type != QpType::Rc
            || !matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe)
        {
            self.reserved_end = None;
            return 0;
        }
        let mut end = self.req.max_psn;
        match self.reserved_end {
            Some(r) if xroce_wire::psn_lt(end, r) => end = r,
            Some(_) => self.reserved_end = None,
            None => {}
        }
        xroce_wire::psn_diff(end, self.req.comp_psn).max(0) as u32
    }

    /// Send WQEs not fully sent yet (the requester has more to send
    /// unless a window, the budget or the pacer holds it).
    pub(crate) fn has_new_requests(&self) -> bool {
        self.req.idx < self.sq.len()
    }

    pub(crate) fn psn_outstanding(&self) -> bool {
        self.req.comp_psn != self.req.max_psn
    }

    /// [`pacing_frame_bytes`] at this QP's path MTU.
    pub(crate) fn pacing_frame_bytes(&self) -> usize {
        pacing_frame_bytes(self.mtu)
    }

    /// `true` if the pacer lets a data packet (request or READ response)
    /// go at `now`.
    pub(crate) fn pacer_open(&self, now: u64) -> bool {
        self.pacer
            .may_send(now, self.cc.rate_bps(), self.pacing_frame_bytes())
    }

    /// A data packet of `bytes` went at `now`: take its credit and tell the
    /// congestion controller.
    pub(crate) fn paced_send(&mut self, now: u64, bytes: usize) {
        self.pacer.on_send(now, self.cc.rate_bps(), bytes);
        self.cc.on_send(now, bytes);
    }
}
