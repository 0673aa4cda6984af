//! The Rust objects behind the C structs handed to programs.
//!
//! Each is `#[repr(C)]` with the C struct first, so the pointer the
//! program holds is also a pointer to the whole object: `from_*` casts it
//! back. Objects are boxed and leaked at creation and freed by the verb
//! that destroys them; rdma-core's contract (no use after destroy) is the
//! program's.
//!
//! Layer 2: imports `base` and `abi` only; the verbs (layer 3, `entry`)
//! create, use and destroy these objects.

pub(crate) mod context;
pub(crate) mod device;
pub(crate) mod events;
pub(crate) mod ucontext;

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex, MutexGuard};

use xroce::verbs::{
    AddressVector, CompletionQueue, ProtectionDomain, QueuePair, SendWr, SharedReceiveQueue, Wc,
};

use crate::abi::*;
use crate::base::handles::{self, Handle};
use context::Context;
use ucontext::Ucontext;

/// Recover the Rust object from the C pointer a program passed in.
///
/// # Safety
/// `p` came from this library as a `*mut C` of an `Outer` created here and
/// not yet destroyed (rdma-core's contract for every object).
pub(crate) unsafe fn outer<'a, C, Outer: Handle>(p: *mut C) -> Option<&'a mut Outer> {
    // Under XROCE_VERBS_DEBUG a dead object is reported, not touched.
    if !handles::check(p as *const Outer) {
        return None;
    }
    // SAFETY: the C struct is the first field of the repr(C) Outer.
    unsafe { (p as *mut Outer).as_mut() }
}

/// `struct ibv_pd`: `pd.handle` names it in its ucontext, where
/// `ibv_import_pd` finds it.
#[repr(C)]
pub(crate) struct Pd {
    pub pd: ibv_pd,
    pub inner: ProtectionDomain,
    pub ucontext: Arc<Ucontext>,
}

/// `struct ibv_mr`: the registration itself lives in its ucontext under
/// `mr.handle`, shared with the copies `ibv_import_mr` makes.
#[repr(C)]
pub(crate) struct Mr {
    pub mr: ibv_mr,
    pub ucontext: Arc<Ucontext>,
    /// Made by `ibv_import_mr` (rdma-core's IBV_MR_TYPE_IMPORTED_MR).
    pub imported: bool,
}

/// `struct ibv_comp_channel`: completion events queue here, and `fd` is an
/// eventfd (EFD_SEMAPHORE) whose count is the queue's length, so poll,
/// epoll and O_NONBLOCK work on it as programs expect. Not a pipe of
/// records: a CQ's destroy must take its queued events away, as the
/// kernel's does, or a program that polls before it reads (Gloo) finds the
/// fd readable and ibv_get_cq_event with nothing to return.
#[repr(C)]
pub(crate) struct Channel {
    pub ch: ibv_comp_channel,
    /// Shared with the event handlers of its CQs (a handler may still run
    /// after its CQ was destroyed).
    pub shared: Arc<ChannelShared>,
}

/// What a channel and its CQs' event handlers share.
pub(crate) struct ChannelShared {
    /// The eventfd: one count per queued event.
    pub fd: OwnedFd,
    /// Every change to the queue and the count happens under this lock,
    /// so the count always equals the queue's length outside it, and a
    /// read of one count under it never blocks.
    pub state: Mutex<ChannelState>,
}

/// A channel's CQs and queued events.
#[derive(Default)]
pub(crate) struct ChannelState {
    /// Ids of the live CQs using it: destroying a channel in use is EBUSY,
    /// and a handler whose CQ is gone queues nothing. The lock also orders
    /// `Cq::events_read` against destroy.
    pub cqs: std::collections::HashSet<u64>,
    /// Events not yet returned by ibv_get_cq_event, oldest first.
    pub queue: std::collections::VecDeque<crate::entry::cq::EventRecord>,
}

/// `struct ibv_cq` / `struct ibv_cq_ex` (the former is a prefix of the
/// latter, so one object serves both).
#[repr(C)]
pub(crate) struct Cq {
    pub cq: ibv_cq_ex,
    pub inner: CompletionQueue,
    /// NULL only in unit tests.
    pub ctx: *mut Context,
    /// Unique for the process (completion-event records carry it).
    pub id: u64,
    /// Completion events ibv_get_cq_event returned for this CQ (counted
    /// under the channel's `state` lock); destroy waits until the program
    /// acked as many (`cq.comp_events_completed`).
    pub events_read: AtomicU32,
    /// Queues (QP send/receive queues) completing into this CQ: the QP
    /// code adds one per queue at create and subtracts at destroy;
    /// ibv_destroy_cq is EBUSY while it is not zero.
    pub users: AtomicU32,
    /// IBV_EVENT_CQ_ERR was posted for the overflow (it is posted once).
    pub overflow_reported: AtomicBool,
    /// IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: an overflow is not an error.
    pub ignore_overrun: bool,
    /// Held from ibv_start_poll to ibv_end_poll (as providers hold their
    /// CQ lock), guarding `cur` and `cq.wr_id`/`cq.status`.
    pub ex_busy: AtomicBool,
    /// The extended poller's (`ibv_start_poll`) current completion.
    pub cur: Wc,
    /// `wc_flags` asked for at create_cq_ex (what ibv_wc_read_* may read).
    pub wc_flags: u64,
}

/// `struct ibv_qp` / `struct ibv_qp_ex`.
#[repr(C)]
pub(crate) struct Qp {
    pub qp: ibv_qp_ex,
    pub inner: QueuePair,
    pub ctx: *mut Context,
    /// Created through create_qp_ex (ibv_qp_to_qp_ex returns it; the
    /// ibv_wr_* pointers are set when send_ops_flags were given).
    pub has_qp_ex: bool,
    /// Send-side scratch state: post_send's batch and inline payload, the
    /// work requests built by ibv_wr_* between wr_start and wr_complete.
    pub pending: Mutex<PendingWrs>,
    /// The QP's creation capabilities, as query_qp reports them.
    pub cap: ibv_qp_cap,
    pub sq_sig_all: bool,
    pub qp_type: u32,
    pub srq: *mut ibv_srq,
    /// The `ah_attr` of the last modify_qp with IBV_QP_AV (query_qp).
    pub ah_attr: Mutex<ibv_ah_attr>,
}

/// Where the inline payload of a work request built with
/// ibv_wr_set_inline_data* lies in [`PendingWrs::wr_inline`].
pub(crate) type InlineBytes = Option<std::ops::Range<usize>>;

/// A QP's send-side scratch state; its buffers are reused from post to
/// post.
#[derive(Default)]
pub(crate) struct PendingWrs {
    /// ibv_wr_*: the requests built since wr_start, with where their
    /// inline bytes lie in `wr_inline`.
    pub wrs: Vec<(SendWr, InlineBytes)>,
    /// ibv_wr_*: the inline bytes of `wrs`, copied by the setters.
    pub wr_inline: Vec<u8>,
    /// ibv_wr_*: the first error among them (reported by wr_complete).
    pub error: i32,
    /// Requests converted and not yet handed to the engine.
    pub batch: Vec<SendWr>,
    /// The payload of the inline request being posted, gathered from the
    /// program's memory during the post call.
    pub inline: Vec<u8>,
}

/// `struct ibv_srq`.
#[repr(C)]
pub(crate) struct Srq {
    pub srq: ibv_srq,
    pub inner: SharedReceiveQueue,
    pub ctx: *mut Context,
    /// QPs using it (destroying an SRQ in use is EBUSY).
    pub users: AtomicU32,
}

/// `struct ibv_ah`.
#[repr(C)]
pub(crate) struct Ah {
    pub ah: ibv_ah,
    pub av: AddressVector,
    /// The attributes it was created from (for ibv_query_ah-like needs).
    pub attr: ibv_ah_attr,
}

impl Handle for Pd {
    const KIND: &'static str = "PD";
}
impl Handle for Mr {
    const KIND: &'static str = "MR";
}
impl Handle for Cq {
    const KIND: &'static str = "CQ";
}
impl Handle for Qp {
    const KIND: &'static str = "QP";
}
impl Handle for Srq {
    const KIND: &'static str = "SRQ";
}
impl Handle for Ah {
    const KIND: &'static str = "AH";
}
impl Handle for Channel {
    const KIND: &'static str = "completion channel";
}

/// The QP behind a program's pointer, shared: everything that changes
/// after creation sits behind a lock or in the engine.
///
/// # Safety
/// `qp` is NULL or a QP this library created and has not destroyed.
pub(crate) unsafe fn qp_ref<'a>(qp: *mut ibv_qp) -> Option<&'a Qp> {
    if !handles::check(qp as *const Qp) {
        return None;
    }
    // SAFETY: ibv_qp is the first field of ibv_qp_ex, the first field of
    // the repr(C) Qp (the caller's contract gives a live one).
    unsafe { (qp as *const Qp).as_ref() }
}

/// # Safety
/// As [`qp_ref`].
pub(crate) unsafe fn qpx_ref<'a>(qp: *mut ibv_qp_ex) -> Option<&'a Qp> {
    // SAFETY: as qp_ref.
    unsafe { (qp as *const Qp).as_ref() }
}

/// The QP's send-side scratch state (a panic while it was held leaves
/// nothing half-done that matters: every user starts by clearing it).
pub(crate) fn lock(q: &Qp) -> MutexGuard<'_, PendingWrs> {
    q.pending.lock().unwrap_or_else(|e| e.into_inner())
}
