//! Queue pairs (`ibv_qp`): creation attributes and the application's
//! handle. The attribute types and the state-transition rule are the
//! engine's ([`crate::engine::qp_attr`]), re-exported here.

use std::sync::Arc;

use super::cq::CompletionQueue;
use super::device::Device;
use super::error::{Result, VerbsError};
use super::post_ring::PostRing;
use super::srq::SharedReceiveQueue;
pub use crate::engine::qp_attr::{
    check_modify, check_modify_for, AddressVector, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType,
    RemoteQp, MAX_RD_ATOMIC,
};
use crate::engine::work::{RecvWr, SendFlags, SendWr};

/// `ibv_qp_init_attr`.
#[derive(Clone)]
pub struct QpInitAttr {
    pub qp_type: QpType,
    pub send_cq: CompletionQueue,
    pub recv_cq: CompletionQueue,
    pub srq: Option<SharedReceiveQueue>,
    pub cap: QpCap,
    /// Every send WR generates a completion (ignore SIGNALED).
    pub sq_sig_all: bool,
}

impl QpInitAttr {
    /// An RC QP with default capacities using `cq` for both queues.
    pub fn rc(cq: &CompletionQueue) -> Self {
        Self {
            qp_type: QpType::Rc,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}

/// A queue pair (`ibv_qp`). Dropping it destroys the QP.
pub struct QueuePair {
    pub(super) dev: Device,
    pub(super) qpn: u32,
    /// Where posts go without the engine lock.
    pub(super) ring: Arc<PostRing>,
    /// Keep the CQs alive (and their ids theirs) while the QP may complete
    /// into them.
    pub(super) _cqs: [CompletionQueue; 2],
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("qpn", &self.qpn).finish()
    }
}

impl QueuePair {
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }
    /// The device (engine) the QP lives in: for a QP made through a
    /// spreading handle, the member it was placed on.
    pub fn device(&self) -> &Device {
        &self.dev
    }
    /// `ibv_modify_qp`.
    ///
    /// Moving to RESET also removes the QP's completions still in its CQs
    /// (as rdma-core's mlx4/mlx5 providers do in modify_qp): a QP restarted
    /// after an error does not meet the flush completions of its previous
    /// life. They were delivered when the guard dropped; a QP in RESET
    /// makes no new ones.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        // ACKs a poll left for later go before a state that may not send
        // them.
        self.dev.flush_deferred();
        let r = self.dev.lock().modify_qp(self.qpn, attr, mask);
        if r.is_ok() {
            if mask.contains(QpAttrMask::STATE) && attr.qp_state == QpState::Reset {
                let [send, recv] = &self._cqs;
                send.inner.discard_qp(self.qpn);
                if !Arc::ptr_eq(&send.inner, &recv.inner) {
                    recv.inner.discard_qp(self.qpn);
                }
            }
            self.dev.ring();
        }
        Ok(r?)
    }
    /// How this RC QP uses selective repeat
    /// ([`crate::engine::Engine::set_selective_repeat`]; the device's
    /// default is its engine's, Auto unless configured): before anything
    /// is posted.
    pub fn set_selective_repeat(&self, mode: crate::engine::SrMode) -> Result<()> {
        Ok(self.dev.lock().set_selective_repeat(self.qpn, mode)?)
    }
    /// Whether this QP runs selective repeat, per half.
    pub fn selective_repeat(&self) -> Result<crate::engine::SrStatus> {
        Ok(self.dev.lock().selective_repeat(self.qpn)?)
    }
    /// This QP's counters.
    pub fn stats(&self) -> Option<crate::engine::QpStats> {
        self.dev.lock().qp_stats(self.qpn)
    }
    /// The pacing rate its congestion controller currently allows.
    pub fn rate_bps(&self) -> Option<u64> {
        self.dev.lock().qp_rate_bps(self.qpn)
    }
    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.dev.lock().query_qp(self.qpn)?)
    }
    pub fn state(&self) -> QpState {
        self.query().map(|a| a.qp_state).unwrap_or(QpState::Err)
    }
    /// `ibv_post_send` for one WR: into the QP's post ring, without the
    /// engine lock (see `post_ring.rs`). A WR with IBV_SEND_INLINE whose
    /// payload is named by lkeys is copied out of its MRs under the lock,
    /// now, as inline promises.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        self.enqueue_send(wr)?;
        self.dev.posted(&self.ring);
        Ok(())
    }
    /// Queues one send WR without waking anyone: into the ring, or, for
    /// inline data named by lkeys, into the engine under its lock.
    fn enqueue_send(&self, wr: &SendWr) -> Result<()> {
        let inline_from_mrs =
            wr.flags.contains(SendFlags::INLINE) && !wr.opcode.is_read_or_atomic();
        if !inline_from_mrs {
            return Ok(self.ring.post_send(wr, None)?);
        }
        self.ring.reserve_send(wr, None)?;
        let r = self.dev.lock().post_send(self.qpn, wr);
        if r.is_err() {
            self.ring.unreserve_send();
        }
        Ok(r?)
    }
    /// `ibv_post_send` of one WR with IBV_SEND_INLINE: `data` is the
    /// payload, copied now (`wr.sg_list` is not read), so the program's
    /// buffer needs no registration, as rdma-core promises for inline.
    pub fn post_send_inline(&self, wr: &SendWr, data: &[u8]) -> Result<()> {
        self.ring.post_send(wr, Some(data))?;
        self.dev.posted(&self.ring);
        Ok(())
    }
    /// `ibv_post_send` for a list: stops at the first failure and returns
    /// its index with the error (like `bad_wr`). One doorbell.
    pub fn post_send_list(&self, wrs: &[SendWr]) -> Result<(), (usize, VerbsError)> {
        let r = wrs
            .iter()
            .enumerate()
            .try_for_each(|(i, wr)| self.enqueue_send(wr).map_err(|e| (i, e)));
        self.dev.posted(&self.ring);
        r
    }
    /// `ibv_post_recv` for one WR, into the post ring.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        self.ring.post_recv(wr)?;
        self.dev.posted(&self.ring);
        Ok(())
    }
    /// Move the QP to RESET -> INIT -> RTR -> RTS in one call for a peer
    /// described by `remote` (qpn, psn, address); `local` holds the rest
    /// (access flags, MTU, timers, rd_atomic limits, this side's sq_psn).
    pub fn connect(&self, local: &QpAttr, remote: &RemoteQp) -> Result<()> {
        let r = self.dev.lock().connect_qp(self.qpn, local, remote);
        self.dev.ring();
        Ok(r?)
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // A program that destroys its QP right after its last completion
        // (ibv_rc_pingpong) still owes the peer that message's ACK.
        self.dev.flush_deferred();
        {
            let mut g = self.dev.lock();
            let _ = g.destroy_qp(self.qpn);
            g.forget_ring(self.qpn);
        }
        // The load a spreading handle places new QPs by (QP1 not counted).
        if self.qpn != crate::engine::GSI_QPN {
            self.dev
                .shared
                .live_qps
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
