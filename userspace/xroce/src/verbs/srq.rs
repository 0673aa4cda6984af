//! Shared receive queue (`ibv_srq`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::error::{Result, VerbsError};
use super::mr::MrTable;
use super::wr::RecvWr;
use crate::engine::qp::RecvWqe as SrqEntry;

pub struct SrqInner {
    q: Mutex<VecDeque<SrqEntry>>,
    pub(crate) pd: u32,
    max_wr: usize,
    max_sge: usize,
}

impl SrqInner {
    pub(crate) fn pop(&self) -> Option<SrqEntry> {
        self.q.lock().unwrap().pop_front()
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
                max_wr,
                max_sge,
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
        if q.len() >= self.inner.max_wr {
            return Err(VerbsError::QueueFull("shared receive queue"));
        }
        q.push_back(e);
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
