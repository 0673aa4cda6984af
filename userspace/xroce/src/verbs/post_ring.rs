//! Each QP's post ring: `ibv_post_send` and `ibv_post_recv` without the
//! engine lock, as rdma-core's rxe provider writes work requests into a
//! queue it shares with the kernel.
//!
//! The application thread checks a WR as the engine would
//! ([`check_send`], [`check_recv`]: the QP's type, capacities, state and
//! path MTU), takes one unit of the queue's room, pushes the WR into the
//! QP's ring (a bounded lock-free queue, as deep as the QP's queue), puts
//! the ring on its device's list of rings with work once, and rings the
//! I/O thread's doorbell. Whoever next locks the engine (the I/O thread at
//! the top of its round, or any verbs call) first moves every posted WR
//! into the engine in post order ([`PostedRings::drain_into`]), so a
//! modify, query or destroy sees what was posted before it.
//!
//! The room: `sq_used` and `rq_used` count WRs in the ring or in the
//! engine's queue. A post takes one unit (never beyond the capacity, so the ring cannot
//! overflow); the engine reports the WQEs that left its queues
//! ([`Engine::take_retired`]) and the device gives their units back before
//! it delivers their completions, so a program that polled a completion
//! finds room for the next post, as it would with the engine's own check.
//!
//! The state the checks see is the one the engine last reported with
//! [`Engine::take_retired`], which lists every QP modified or moved to ERR
//! (the engine moves a QP on its own only to states that accept posts).
//! The engine checks again when the WR arrives; a WR it refuses then (a
//! modify to RESET racing a post on another thread) is dropped, as RESET
//! drops every queued WR, and counted in `late_refusals`. A post to a QP
//! in ERR takes the engine lock at once, so its flush completion is in the
//! CQ when the post returns, as before.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crossbeam_queue::{ArrayQueue, SegQueue};

use crate::engine::error::TransportError;
use crate::engine::qp_attr::QpState;
use crate::engine::work::{RecvWr, SendWr};
use crate::engine::{check_recv, check_send, Engine, PostLimits, RetiredWqes};

/// A send WR as posted: with its inline payload copied at post time
/// (the program may reuse its buffer once the post returns).
enum PostedSend {
    Wr(SendWr),
    Inline(SendWr, Box<[u8]>),
}

/// One QP's ring (see the module documentation).
pub(crate) struct PostRing {
    qpn: u32,
    limits: PostLimits,
    /// The QP's state and path MTU (bytes) as the engine last reported.
    state: AtomicU8,
    mtu: AtomicU32,
    sends: ArrayQueue<PostedSend>,
    recvs: ArrayQueue<RecvWr>,
    /// WRs in the ring or in the engine's send / receive queue.
    sq_used: AtomicU32,
    rq_used: AtomicU32,
    /// On its device's list of rings with work (at most once).
    listed: AtomicBool,
}

impl PostRing {
    pub(crate) fn new(qpn: u32, limits: PostLimits) -> Self {
        Self {
            qpn,
            limits,
            state: AtomicU8::new(QpState::Reset as u8),
            mtu: AtomicU32::new(limits.mtu),
            sends: ArrayQueue::new(limits.cap.max_send_wr.max(1) as usize),
            recvs: ArrayQueue::new(limits.cap.max_recv_wr.max(1) as usize),
            sq_used: AtomicU32::new(0),
            rq_used: AtomicU32::new(0),
            listed: AtomicBool::new(false),
        }
    }

    fn set_state(&self, state: QpState, mtu: u32) {
        self.state.store(state as u8, Ordering::Release);
        self.mtu.store(mtu, Ordering::Release);
    }

    /// Whether the QP is in ERR (as the engine last reported): a post
    /// there flushes, and the poster delivers that flush at once.
    pub(crate) fn in_error(&self) -> bool {
        self.state() == QpState::Err
    }

    fn state(&self) -> QpState {
        QpState::ALL[usize::from(self.state.load(Ordering::Acquire)).min(QpState::ALL.len() - 1)]
    }

    fn limits(&self) -> PostLimits {
        PostLimits {
            mtu: self.mtu.load(Ordering::Acquire),
            ..self.limits
        }
    }

    /// Checks a send WR as `ibv_post_send` would and takes one unit of the
    /// send queue's room for it.
    pub(crate) fn reserve_send(
        &self,
        wr: &SendWr,
        inline_len: Option<usize>,
    ) -> Result<(), TransportError> {
        check_send(&self.limits(), self.state(), wr, inline_len)?;
        take_unit(&self.sq_used, self.limits.cap.max_send_wr, "send queue")
    }

    /// Gives back a unit [`Self::reserve_send`] took for a WR that did not
    /// reach the engine's queue.
    pub(crate) fn unreserve_send(&self) {
        self.sq_used.fetch_sub(1, Ordering::AcqRel);
    }

    /// As [`Self::unreserve_send`], for a receive WR.
    fn unreserve_recv(&self) {
        self.rq_used.fetch_sub(1, Ordering::AcqRel);
    }

    /// Posts a send WR (copying `inline` now) into the ring.
    pub(crate) fn post_send(
        &self,
        wr: &SendWr,
        inline: Option<&[u8]>,
    ) -> Result<(), TransportError> {
        self.reserve_send(wr, inline.map(<[u8]>::len))?;
        let item = match inline {
            Some(d) => PostedSend::Inline(wr.clone(), d.into()),
            None => PostedSend::Wr(wr.clone()),
        };
        if self.sends.push(item).is_err() {
            // Unreachable while `sq_used` bounds the ring; refuse, not lose.
            self.unreserve_send();
            return Err(TransportError::QueueFull("send queue"));
        }
        Ok(())
    }

    /// Posts a receive WR into the ring.
    pub(crate) fn post_recv(&self, wr: &RecvWr) -> Result<(), TransportError> {
        check_recv(&self.limits(), self.state(), wr)?;
        take_unit(&self.rq_used, self.limits.cap.max_recv_wr, "receive queue")?;
        if self.recvs.push(wr.clone()).is_err() {
            self.unreserve_recv();
            return Err(TransportError::QueueFull("receive queue"));
        }
        Ok(())
    }

    /// The engine gave back WQEs of this QP (and says its state).
    pub(crate) fn retire(&self, r: &RetiredWqes) {
        if r.send > 0 {
            self.sq_used.fetch_sub(r.send, Ordering::AcqRel);
        }
        if r.recv > 0 {
            self.rq_used.fetch_sub(r.recv, Ordering::AcqRel);
        }
        self.set_state(r.state, r.mtu);
    }
}

/// Takes one unit of a queue's room, or says the queue is full.
fn take_unit(used: &AtomicU32, cap: u32, what: &'static str) -> Result<(), TransportError> {
    used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        (u < cap).then_some(u + 1)
    })
    .map(drop)
    .map_err(|_| TransportError::QueueFull(what))
}

/// A device's rings with posted WRs not yet in the engine.
#[derive(Default)]
pub(crate) struct PostedRings {
    list: SegQueue<Arc<PostRing>>,
    /// WRs the engine refused when they arrived (see the module docs).
    late_refusals: AtomicU64,
}

impl PostedRings {
    /// Puts `ring` on the list (once) after a post into it.
    pub(crate) fn mark(&self, ring: &Arc<PostRing>) {
        // SeqCst pairs with drain_into's store: a post that lands after
        // the drainer took the ring off the list lists it again.
        if !ring.listed.swap(true, Ordering::SeqCst) {
            self.list.push(ring.clone());
        }
    }

    /// Whether any ring has WRs waiting (the I/O thread asks before it
    /// sleeps).
    pub(crate) fn has_work(&self) -> bool {
        !self.list.is_empty()
    }

    pub(crate) fn late_refusals(&self) -> u64 {
        self.late_refusals.load(Ordering::Relaxed)
    }

    /// Moves every posted WR into `engine`, each ring's in post order.
    pub(crate) fn drain_into(&self, engine: &mut Engine) {
        while let Some(ring) = self.list.pop() {
            ring.listed.store(false, Ordering::SeqCst);
            let qpn = ring.qpn;
            while let Some(p) = ring.sends.pop() {
                let r = match &p {
                    PostedSend::Wr(wr) => engine.post_send(qpn, wr),
                    PostedSend::Inline(wr, data) => engine.post_send_inline(qpn, wr, data),
                };
                if r.is_err() {
                    ring.unreserve_send();
                    self.late_refusals.fetch_add(1, Ordering::Relaxed);
                }
            }
            while let Some(wr) = ring.recvs.pop() {
                if engine.post_recv(qpn, &wr).is_err() {
                    ring.unreserve_recv();
                    self.late_refusals.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
