//! Shared receive queue (`ibv_srq`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::error::{Result, VerbsError};
use super::mr::MrTable;
use super::wr::RecvWr;
use crate::engine::qp::RecvWqe as SrqEntry;

/// Called once when an armed SRQ limit is crossed
/// (`IBV_EVENT_SRQ_LIMIT_REACHED`), with the engine locked.
pub type SrqLimitHandler = Arc<dyn Fn() + Send + Sync>;

pub struct SrqInner {
    q: Mutex<VecDeque<SrqEntry>>,
    pub(crate) pd: u32,
    max_wr: AtomicUsize,
    max_sge: usize,
    /// `srq_limit` of `ibv_modify_srq`: 0 = disarmed.
    limit: AtomicUsize,
    on_limit: Mutex<Option<SrqLimitHandler>>,
}

impl SrqInner {
    pub(crate) fn pop(&self) -> Option<SrqEntry> {
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
            drop(q);
            let h = self.on_limit.lock().unwrap().clone();
            if let Some(h) = h {
                h();
            }
        }
        e
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.q.lock().unwrap().is_empty()
    }
}

/// A shared receive queue; QPs created with it take their receive WQEs
/// from it. Cheap to clone.
#[derive(Clone)]
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqInner>,
    mrs: Arc<MrTable>,
}

impl SharedReceiveQueue {
    pub(crate) fn new(mrs: Arc<MrTable>, pd: u32, max_wr: usize, max_sge: usize) -> Self {
        Self {
            inner: Arc::new(SrqInner {
                q: Mutex::new(VecDeque::with_capacity(max_wr)),
                pd,
                max_wr: AtomicUsize::new(max_wr),
                max_sge,
                limit: AtomicUsize::new(0),
                on_limit: Mutex::new(None),
            }),
            mrs,
        }
    }

    /// `ibv_post_srq_recv` (one WR).
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        if wr.sg_list.len() > self.inner.max_sge {
            return Err(VerbsError::TooManySge {
                got: wr.sg_list.len(),
                max: self.inner.max_sge,
            });
        }
        let e = SrqEntry::new(&self.mrs, self.inner.pd, wr);
        let mut q = self.inner.q.lock().unwrap();
        if q.len() >= self.inner.max_wr.load(Ordering::Relaxed) {
            return Err(VerbsError::QueueFull("shared receive queue"));
        }
        q.push_back(e);
        Ok(())
    }

    /// `ibv_modify_srq(IBV_SRQ_LIMIT)`: arm the limit event: it fires once
    /// when taking a WQE leaves fewer than `limit` posted (0 disarms).
    pub fn set_limit(&self, limit: usize, handler: Option<SrqLimitHandler>) -> Result<()> {
        if limit > self.inner.max_wr.load(Ordering::Relaxed) {
            return Err(VerbsError::InvalidArgument(
                "SRQ limit above the SRQ's max_wr",
            ));
        }
        *self.inner.on_limit.lock().unwrap() = handler;
        self.inner.limit.store(limit, Ordering::Release);
        Ok(())
    }

    /// The armed limit (0: none), as `ibv_query_srq` reports it.
    pub fn limit(&self) -> usize {
        self.inner.limit.load(Ordering::Acquire)
    }

    /// Most receive WQEs it holds (`max_wr`).
    pub fn max_wr(&self) -> usize {
        self.inner.max_wr.load(Ordering::Relaxed)
    }

    /// Most SGEs per receive WQE.
    pub fn max_sge(&self) -> usize {
        self.inner.max_sge
    }

    /// `ibv_modify_srq(IBV_SRQ_MAX_WR)`: grow (never below what is posted).
    pub fn resize(&self, max_wr: usize) -> Result<()> {
        let q = self.inner.q.lock().unwrap();
        if max_wr < q.len() || max_wr == 0 {
            return Err(VerbsError::InvalidArgument(
                "SRQ max_wr below the WQEs posted",
            ));
        }
        self.inner.max_wr.store(max_wr, Ordering::Relaxed);
        Ok(())
    }

    /// Receive WQEs currently posted.
    pub fn len(&self) -> usize {
        self.inner.q.lock().unwrap().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
