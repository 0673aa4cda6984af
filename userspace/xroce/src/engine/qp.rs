//! Per-QP engine state shared by requester, completer and responder, plus
//! posting, modify/flush and the per-QP dispatch.

use std::collections::VecDeque;
use std::sync::Arc;

use super::codec;
use super::completion::{Completion, CqId, Wc, WcFlags, WcOpcode, WcStatus};
use super::error::{Result, VerbsError};
use super::memory::{AccessFlags, MrInner, MrTable};
use super::qp_attr::{Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType};
use super::srq::Srq;
use super::timers;
use super::work::{RecvWr, SendFlags, SendWr, Sge, UdAddress, WrOpcode};
use super::{Env, QpCreate};
use crate::cc::{CongestionControl, Pacer};
use xroce_wire::{FrameRepr, Opcode, Service, Syndrome};

/// A local SGE resolved to its MR at post time (the Arc keeps the memory
/// alive if the MR is deregistered while the WR is in flight).
#[derive(Clone)]
pub(crate) struct LSge {
    pub mr: Arc<MrInner>,
    pub off: usize,
    pub len: usize,
}

/// The size a QP's pacer gates on at path MTU `mtu`: the largest data frame
/// it sends (a full payload under the most headers). Every data packet waits
/// for this much credit whatever its size, so `poll_timeout` can say when the
/// next one may go without building it, and back-to-back bursts stay within
/// `pacing_burst_bytes` (see [`Pacer`]).
pub(crate) fn pacing_frame_bytes(mtu: u32) -> usize {
    mtu as usize + xroce_wire::MAX_OVERHEAD
}

/// Resolve and check a local SGL. Returns `Err(status)` for a WC error.
pub(crate) fn resolve_sgl(
    mrs: &MrTable,
    pd: u32,
    sgl: &[Sge],
    need: AccessFlags,
) -> core::result::Result<(Vec<LSge>, usize), WcStatus> {
    let mut out = Vec::with_capacity(sgl.len());
    let mut total = 0usize;
    for s in sgl {
        if s.length == 0 {
            continue;
        }
        let mr = mrs.by_lkey(s.lkey).ok_or(WcStatus::LocProtErr)?;
        let off = mr
            .check(pd, s.addr, s.length as u64, need)
            .map_err(|_| WcStatus::LocProtErr)?;
        total += s.length as usize;
        out.push(LSge {
            mr,
            off,
            len: s.length as usize,
        });
    }
    if total > (1 << 31) {
        return Err(WcStatus::LocLenErr);
    }
    Ok((out, total))
}

/// Copy `dst.len()` bytes starting at byte `offset` of the SGL into `dst`.
pub(crate) fn sgl_read(sges: &[LSge], mut offset: usize, dst: &mut [u8]) -> bool {
    let mut done = 0;
    for s in sges {
        if done == dst.len() {
            break;
        }
        if offset >= s.len {
            offset -= s.len;
            continue;
        }
        let n = (s.len - offset).min(dst.len() - done);
        s.mr.read_at(s.off + offset, &mut dst[done..done + n]);
        done += n;
        offset = 0;
    }
    done == dst.len()
}

/// Copy `src` into the SGL starting at byte `offset`; false if it does not fit
/// or an MR was deregistered.
pub(crate) fn sgl_write(sges: &[LSge], mut offset: usize, src: &[u8]) -> bool {
    let mut done = 0;
    for s in sges {
        if done == src.len() {
            break;
        }
        if offset >= s.len {
            offset -= s.len;
            continue;
        }
        if !s.mr.is_valid() {
            return false;
        }
        let n = (s.len - offset).min(src.len() - done);
        s.mr.write_at(s.off + offset, &src[done..done + n]);
        done += n;
        offset = 0;
    }
    done == src.len()
}

pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub op: WrOpcode,
    pub flags: SendFlags,
    pub signaled: bool,
    pub sges: Vec<LSge>,
    /// Inline payload (copied at post time).
    pub inline: Option<Vec<u8>>,
    pub len: u32,
    pub local_err: Option<WcStatus>,
    pub started: bool,
    pub first_psn: u32,
    pub last_psn: u32,
    pub npkts: u32,
    /// UD destination.
    pub ud: Option<UdAddress>,
}

impl SendWqe {
    pub fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            WrOpcode::Send | WrOpcode::SendWithImm { .. } | WrOpcode::SendWithInv { .. } => {
                WcOpcode::Send
            }
            WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
        }
    }
    pub fn read_payload(&self, offset: usize, dst: &mut [u8]) -> bool {
        match &self.inline {
            Some(v) => match v.get(offset..offset + dst.len()) {
                Some(s) => {
                    dst.copy_from_slice(s);
                    true
                }
                None => false,
            },
            None => sgl_read(&self.sges, offset, dst),
        }
    }
}

pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: Vec<LSge>,
    pub len: usize,
    pub local_err: Option<WcStatus>,
}

impl RecvWqe {
    pub(crate) fn new(mrs: &MrTable, pd: u32, wr: &RecvWr) -> Self {
        match resolve_sgl(mrs, pd, &wr.sg_list, AccessFlags::LOCAL_WRITE) {
            Ok((sges, len)) => Self {
                wr_id: wr.wr_id,
                sges,
                len,
                local_err: None,
            },
            Err(st) => Self {
                wr_id: wr.wr_id,
                sges: Vec::new(),
                len: 0,
                local_err: Some(st),
            },
        }
    }
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
    pub rnr_until: Option<u64>,
    pub rto_deadline: Option<u64>,
    pub retry_left: u8,
    pub rnr_left: u8,
    pub started_retry: bool,
    pub retry_psn: u32,
    pub rtt_sample: Option<(u32, u64)>,
}

/// Responder output, sent in order.
pub(crate) enum RespItem {
    Ack {
        psn: u32,
        syndrome: Syndrome,
        msn: u32,
        /// Move the QP to ERR once sent (class C errors).
        fatal: bool,
    },
    Read {
        mr: Arc<MrInner>,
        off: usize,
        len: u32,
        psn: u32,
        sent: u32,
        npkts: u32,
        msn: u32,
        /// Re-execution of a duplicate request (does not use a resource).
        dup: bool,
    },
    Atomic {
        psn: u32,
        orig: u64,
        msn: u32,
        dup: bool,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum InMsg {
    None,
    Send,
    Write,
}

pub(crate) struct WriteCtx {
    pub mr: Arc<MrInner>,
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
}

pub(crate) struct QpCtx {
    pub qpn: u32,
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
    /// Set when a CQ overflowed or a fatal error happened: move to ERR.
    pub go_error: bool,
    pub cq_overflowed: bool,
    pub sqd_notified: bool,
    pub comm_est: bool,
}

impl QpCtx {
    pub(crate) fn new(
        qpn: u32,
        c: QpCreate,
        cc: Box<dyn CongestionControl>,
        pacing_burst_bytes: u64,
    ) -> Self {
        Self {
            qpn,
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
            },
            cc,
            pacer: Pacer::new(pacing_burst_bytes),
            tmpl: codec::unconnected(),
            mtu: 1024,
            cnp_due: false,
            prefer_req: false,
            last_cnp_ns: None,
            go_error: false,
            cq_overflowed: false,
            sqd_notified: false,
            comm_est: false,
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
            opcode: w.wc_opcode(),
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

    /// Called after every event: applies deferred transitions to ERR.
    pub(crate) fn after_event(&mut self, env: &mut Env<'_>) {
        if matches!(self.state, QpState::Rts | QpState::Sqd) {
            self.complete_local_errors(env);
        }
        if self.go_error {
            self.go_error = false;
            if self.state != QpState::Err {
                env.event(super::AsyncEvent::QpFatal {
                    qpn: self.qpn,
                    cq_overflow: self.cq_overflowed,
                });
                self.enter_error(env);
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
        while let Some(w) = self.sq.pop_front() {
            let wc = self.send_wc(&w, WcStatus::WrFlushErr);
            self.complete(env, true, wc);
        }
        if let Some(r) = self.resp.recv.take() {
            let wc = self.recv_wc(r.wr_id, WcStatus::WrFlushErr);
            self.complete(env, false, wc);
        }
        while let Some(r) = self.rq.pop_front() {
            let wc = self.recv_wc(r.wr_id, WcStatus::WrFlushErr);
            self.complete(env, false, wc);
        }
        self.go_error = false;
        self.resp.out.clear();
        self.resp.write = None;
        self.resp.in_msg = InMsg::None;
        self.req.idx = 0;
        self.req.offset = 0;
        self.req.rd_atomic_outstanding = 0;
        self.req.rto_deadline = None;
        self.req.rnr_until = None;
        self.cnp_due = false;
    }

    fn reset(&mut self) {
        self.state = QpState::Reset;
        self.comm_est = false;
        self.cq_overflowed = false;
        self.sq.clear();
        self.rq.clear();
        self.req = ReqState::default();
        self.resp.recv = None;
        self.resp.out.clear();
        self.resp.replay.clear();
        self.resp.write = None;
        self.resp.in_msg = InMsg::None;
        self.resp.nak_sent = false;
        self.resp.msn = 0;
        self.cnp_due = false;
    }

    pub(crate) fn apply_modify(
        &mut self,
        env: &mut Env<'_>,
        to: QpState,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) {
        let from = self.state;
        let a = &mut self.attr;
        if mask.contains(QpAttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(QpAttrMask::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(QpAttrMask::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(QpAttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
        }
        if mask.contains(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            self.req.retry_left = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            self.req.rnr_left = attr.rnr_retry;
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        match (from, to) {
            (_, QpState::Reset) => self.reset(),
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

    /// Post a send WR. With `inline`, those bytes are the payload (copied
    /// now) and `wr.sg_list` is not read: the C ABI's IBV_SEND_INLINE,
    /// whose SGEs need no lkey.
    pub(crate) fn post_send(
        &mut self,
        env: &mut Env<'_>,
        wr: &SendWr,
        inline_data: Option<&[u8]>,
    ) -> Result<()> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
            s => return Err(VerbsError::BadQpState(s)),
        }
        if self.sq.len() >= self.cap.max_send_wr as usize {
            return Err(VerbsError::QueueFull("send queue"));
        }
        if wr.sg_list.len() > self.cap.max_send_sge as usize {
            return Err(VerbsError::TooManySge {
                got: wr.sg_list.len(),
                max: self.cap.max_send_sge as usize,
            });
        }
        if self.qp_type == QpType::Uc
            && (wr.opcode.is_read_or_atomic() || matches!(wr.opcode, WrOpcode::SendWithInv { .. }))
        {
            return Err(VerbsError::InvalidArgument(
                "UC QPs carry only SEND, SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM",
            ));
        }
        if self.qp_type == QpType::Ud {
            if !matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm { .. }) {
                return Err(VerbsError::InvalidArgument(
                    "UD QPs carry only SEND and SEND_WITH_IMM",
                ));
            }
            if wr.ud.is_none() {
                return Err(VerbsError::InvalidArgument(
                    "a UD send needs a destination (SendWr::ud)",
                ));
            }
            let total: u64 = match inline_data {
                Some(d) => d.len() as u64,
                None => wr.sg_list.iter().map(|s| s.length as u64).sum(),
            };
            if total > self.mtu as u64 {
                return Err(VerbsError::InvalidArgument(
                    "UD messages are limited to one path MTU",
                ));
            }
        }
        let signaled = self.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let mut w = SendWqe {
            wr_id: wr.wr_id,
            op: wr.opcode,
            flags: wr.flags,
            signaled,
            sges: Vec::new(),
            inline: None,
            len: 0,
            local_err: None,
            started: false,
            first_psn: 0,
            last_psn: 0,
            npkts: 0,
            ud: wr.ud,
        };
        let writes_local = wr.opcode.is_read_or_atomic();
        let inline = wr.flags.contains(SendFlags::INLINE) && !writes_local;
        let need = if writes_local {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::empty()
        };
        if let Some(data) = inline_data {
            if writes_local {
                return Err(VerbsError::InvalidArgument(
                    "inline data is for SEND and RDMA WRITE, not READ or atomics",
                ));
            }
            if data.len() > self.cap.max_inline_data as usize {
                return Err(VerbsError::InlineTooLarge {
                    got: data.len(),
                    max: self.cap.max_inline_data as usize,
                });
            }
            w.len = data.len() as u32;
            w.inline = Some(data.to_vec());
            self.sq.push_back(w);
            if self.state == QpState::Err {
                self.enter_error(env);
            }
            return Ok(());
        }
        match resolve_sgl(env.mrs, self.pd, &wr.sg_list, need) {
            Ok((sges, total)) => {
                w.len = total as u32;
                if inline {
                    if total > self.cap.max_inline_data as usize {
                        return Err(VerbsError::InlineTooLarge {
                            got: total,
                            max: self.cap.max_inline_data as usize,
                        });
                    }
                    let mut v = vec![0; total];
                    sgl_read(&sges, 0, &mut v);
                    w.inline = Some(v);
                } else {
                    w.sges = sges;
                }
                if wr.opcode.is_atomic() && total < 8 {
                    w.local_err = Some(WcStatus::LocLenErr);
                }
                if wr.opcode.is_atomic() {
                    w.len = 8;
                }
            }
            Err(st) => w.local_err = Some(st),
        }
        self.sq.push_back(w);
        if self.state == QpState::Err {
            self.enter_error(env);
        }
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, env: &mut Env<'_>, wr: &RecvWr) -> Result<()> {
        if self.srq.is_some() {
            return Err(VerbsError::InvalidArgument(
                "this QP uses a shared receive queue: post to the SRQ",
            ));
        }
        if self.state == QpState::Reset {
            return Err(VerbsError::BadQpState(self.state));
        }
        if self.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(VerbsError::QueueFull("receive queue"));
        }
        if wr.sg_list.len() > self.cap.max_recv_sge as usize {
            return Err(VerbsError::TooManySge {
                got: wr.sg_list.len(),
                max: self.cap.max_recv_sge as usize,
            });
        }
        self.rq.push_back(RecvWqe::new(env.mrs, self.pd, wr));
        if self.state == QpState::Err {
            self.enter_error(env);
        }
        Ok(())
    }

    /// Dispatch one parsed packet addressed to this QP.
    pub(crate) fn handle_packet(
        &mut self,
        env: &mut Env<'_>,
        f: &FrameRepr,
        payload: &[u8],
        now: u64,
    ) {
        let opcode = f.transport.bth.opcode;
        // As rxe: default P_Key only, and for connected QPs only packets
        // from the peer this QP was connected to.
        if f.transport.bth.pkey & 0x7fff != 0x7fff {
            env.stats.rx_bad_header += 1;
            return;
        }
        if self.qp_type != QpType::Ud
            && self.state != QpState::Init
            && f.ip.src_gid() != self.tmpl.ip.dst_gid()
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
                self.ud_recv(env, f, payload);
            } else {
                env.stats.rx_bad_state += 1;
            }
            return;
        }
        if self.qp_type == QpType::Uc {
            if matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                self.uc_recv(env, &f.transport, payload);
            } else {
                env.stats.rx_bad_state += 1;
            }
            return;
        }
        if f.ip.ecn() == 3 {
            env.stats.rx_ce_marked += 1;
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
                    self.comp_handle(env, &f.transport, payload, now)
                }
                _ => env.stats.rx_bad_state += 1,
            }
        } else {
            match self.state {
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe => {
                    self.resp_handle(env, &f.transport, payload, now)
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
    ) -> Option<usize> {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Err) {
            return None;
        }
        if self.cnp_due {
            self.cnp_due = false;
            let mut f = codec::packet(&self.tmpl, Opcode::CNP, 0);
            f.transport.bth.becn = true;
            f.ip.set_ecn(0);
            if let Ok(n) = xroce_wire::emit_frame(&f, &[], buf) {
                env.stats.tx_cnps += 1;
                self.qstats.cnps_sent += 1;
                return Some(n);
            }
        }
        // ACK/NAK/atomic responses go first; READ response data and request
        // data alternate so neither direction starves the other.
        let read_first = matches!(self.resp.out.front(), Some(RespItem::Read { .. }));
        let req_turn = read_first && self.prefer_req;
        if !req_turn {
            if let Some(n) = self.resp_poll(env, now, buf) {
                self.prefer_req = read_first;
                return Some(n);
            }
        }
        if matches!(self.state, QpState::Rts | QpState::Sqd) {
            if let Some(n) = self.req_poll(env, now, buf) {
                self.prefer_req = false;
                return Some(n);
            }
        }
        if req_turn {
            return self.resp_poll(env, now, buf);
        }
        None
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
        m(self.req.rto_deadline);
        m(self.req.rnr_until);
        let req_ready = self.req.idx < self.sq.len() && self.req.rnr_until.is_none();
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
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
            self.start_retry(env);
        }
        if self.req.rto_deadline.is_some_and(|t| t <= now) {
            self.on_retransmit_timeout(env, now);
        }
    }

    /// Retransmission timeout (local ACK timeout), if any.
    pub(crate) fn rto_ns(&self) -> Option<u64> {
        timers::ack_timeout_ns(self.attr.timeout)
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
