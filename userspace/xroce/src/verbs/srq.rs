//! Shared receive queue (`ibv_srq`): the application's handle on the
//! engine's [`Srq`].

use std::sync::Arc;

use crate::engine::error::Result;
use crate::engine::memory::MrTable;
use crate::engine::srq::Srq;
pub use crate::engine::srq::SrqId;
use crate::engine::work::RecvWr;

/// A shared receive queue; QPs created with it take their receive WQEs
/// from it. Cheap to clone.
#[derive(Clone)]
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<Srq>,
    mrs: Arc<MrTable>,
}

impl SharedReceiveQueue {
    pub(crate) fn new(mrs: Arc<MrTable>, pd: u32, max_wr: usize, max_sge: usize) -> Self {
        Self {
            inner: Arc::new(Srq::new(pd, max_wr, max_sge)),
            mrs,
        }
    }

    /// `ibv_post_srq_recv` (one WR).
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        self.inner.post_recv(&self.mrs, wr)
    }

    /// `ibv_modify_srq(IBV_SRQ_LIMIT)`: arm the limit event: the device's
    /// async handler gets [`crate::engine::AsyncEvent::SrqLimitReached`]
    /// once when taking a WQE leaves fewer than `limit` posted (0 disarms).
    pub fn set_limit(&self, limit: usize) -> Result<()> {
        self.inner.set_limit(limit)
    }

    /// The name its limit event carries.
    pub fn id(&self) -> SrqId {
        self.inner.id()
    }

    /// The armed limit (0: none), as `ibv_query_srq` reports it.
    pub fn limit(&self) -> usize {
        self.inner.limit()
    }

    /// Most receive WQEs it holds (`max_wr`).
    pub fn max_wr(&self) -> usize {
        self.inner.max_wr()
    }

    /// Most SGEs per receive WQE.
    pub fn max_sge(&self) -> usize {
        self.inner.max_sge()
    }

    /// `ibv_modify_srq(IBV_SRQ_MAX_WR)`: grow (never below what is posted).
    pub fn resize(&self, max_wr: usize) -> Result<()> {
        self.inner.resize(max_wr)
    }

    /// Receive WQEs currently posted.
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}
