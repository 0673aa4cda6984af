//! The shared receive queue the engine consumes (`ibv_srq`'s queue): QPs
//! created with one take their receive WQEs from it. Posting takes only
//! its own lock, never the engine's.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::error::{Result, TransportError};
use super::memory::MrTable;
use super::work::RecvWr;
use super::wqe::RecvWqe;
use super::{AsyncEvent, Env};

/// Names a shared receive queue in [`AsyncEvent::SrqLimitReached`]
/// (unique in the process, never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrqId(pub u32);

impl SrqId {
    fn next() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        SrqId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Receive WQEs shared by the QPs of one protection domain.
pub struct Srq {
    id: SrqId,
    q: Mutex<VecDeque<RecvWqe>>,
    pd: u32,
    max_wr: AtomicUsize,
    max_sge: usize,
    /// `srq_limit` of `ibv_modify_srq`: 0 = disarmed.
    limit: AtomicUsize,
}

impl Srq {
    /// An empty queue for protection domain `pd`.
    pub fn new(pd: u32, max_wr: usize, max_sge: usize) -> Self {
        Self {
            id: SrqId::next(),
            q: Mutex::new(VecDeque::with_capacity(max_wr)),
            pd,
            max_wr: AtomicUsize::new(max_wr),
            max_sge,
            limit: AtomicUsize::new(0),
        }
    }

    /// The name its limit event carries.
    pub fn id(&self) -> SrqId {
        self.id
    }

    /// The protection domain whose MRs its WQEs use.
    pub fn pd(&self) -> u32 {
        self.pd
    }

    /// Takes the oldest WQE; crossing the armed limit disarms it and
    /// queues [`AsyncEvent::SrqLimitReached`] (once per arming).
    pub(crate) fn pop(&self, env: &mut Env<'_>) -> Option<RecvWqe> {
        let mut q = self.q.lock().unwrap();
        let e = q.pop_front();
        let limit = self.limit.load(Ordering::Acquire);
        if e.is_some()
            && limit > 0
            && q.len() < limit
            && self
                .limit
                .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            env.event(AsyncEvent::SrqLimitReached { srq: self.id });
        }
        e
    }

    /// `ibv_post_srq_recv` (one WR); its SGEs are resolved in `mrs` now.
    pub fn post_recv(&self, mrs: &MrTable, wr: &RecvWr) -> Result<()> {
        if wr.sg_list.len() > self.max_sge {
            return Err(TransportError::TooManySge {
                got: wr.sg_list.len(),
                max: self.max_sge,
            });
        }
        let e = RecvWqe::new(mrs, self.pd, wr);
        let mut q = self.q.lock().unwrap();
        if q.len() >= self.max_wr.load(Ordering::Relaxed) {
            return Err(TransportError::QueueFull("shared receive queue"));
        }
        q.push_back(e);
        Ok(())
    }

    /// `ibv_modify_srq(IBV_SRQ_LIMIT)`: arm the limit event: it fires once
    /// when taking a WQE leaves fewer than `limit` posted (0 disarms).
    pub fn set_limit(&self, limit: usize) -> Result<()> {
        if limit > self.max_wr.load(Ordering::Relaxed) {
            return Err(TransportError::InvalidArgument(
                "SRQ limit above the SRQ's max_wr",
            ));
        }
        self.limit.store(limit, Ordering::Release);
        Ok(())
    }

    /// The armed limit (0: none), as `ibv_query_srq` reports it.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Acquire)
    }

    /// Most receive WQEs it holds (`max_wr`).
    pub fn max_wr(&self) -> usize {
        self.max_wr.load(Ordering::Relaxed)
    }

    /// Most SGEs per receive WQE.
    pub fn max_sge(&self) -> usize {
        self.max_sge
    }

    /// `ibv_modify_srq(IBV_SRQ_MAX_WR)`: grow (never below what is posted).
    pub fn resize(&self, max_wr: usize) -> Result<()> {
        let q = self.q.lock().unwrap();
        if max_wr < q.len() || max_wr == 0 {
            return Err(TransportError::InvalidArgument(
                "SRQ max_wr below the WQEs posted",
            ));
        }
        self.max_wr.store(max_wr, Ordering::Relaxed);
        Ok(())
    }

    /// Receive WQEs currently posted.
    pub fn len(&self) -> usize {
        self.q.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.q.lock().unwrap().is_empty()
    }
}
