//! The device/context (`ibv_context`): owns the engine, the MR table and
//! the map from the engine's [`CqId`]s to completion queues.
//!
//! Threading model: the [`Engine`] sits behind one `Mutex` in the device.
//! The I/O backend takes it to feed received frames and pull frames to
//! send (use [`Device::lock`] to do a whole batch under one acquisition);
//! application threads take it to modify or query QPs, not to post: a
//! post goes into its QP's ring (post_ring.rs), which every
//! [`Device::lock`] empties into the engine first. CQs and
//! SRQs have their own small locks, so polling completions does not touch
//! the engine lock. Before the engine lock is released the device moves
//! the engine's completions into their CQs (in order), then delivers
//! asynchronous events and writes the eventfds of CQs that got completions
//! (the engine itself makes no syscalls).
//!
//! # Shards: one device over several engines
//!
//! [`Device::group`] makes the devices of one interface spread over
//! several I/O threads ([`crate::runtime::shards`]): one engine each (its
//! own QPN block), sharing what an application sees as device-wide:
//! - **MRs**: one [`MrTable`] for the whole group, not a registration per
//!   engine: an lkey/rkey names the same region on every shard, a
//!   registration or deregistration is seen by all engines at once, and
//!   there is no copy to keep consistent. The table is already read by the
//!   engine and written by application threads concurrently (an RwLock
//!   over a slab), so a second reader thread changes nothing in kind.
//! - **PDs**: one counter, so a PD id means one PD on every shard.
//! - **CQs**: a CQ made on any member is registered in every member's
//!   engine under the same [`CqId`] (the group hands out the slots), so
//!   QPs of different shards complete into it; each engine pushes into the
//!   CQ under the CQ's own lock.
//! - **SRQs** are objects of their own ([`crate::engine::srq::Srq`], own
//!   lock) that any engine takes WQEs from.
//!
//! A QP lives in one engine (its shard's). [`Device::spreading`] gives a
//! handle whose `create_qp` puts each new QP on the member with the fewest
//! live QPs (ties: the lowest shard; QPs created one after another thus go
//! round-robin, and two peers that create theirs in the same order are
//! paired shard by shard); its other calls act on the first member, except
//! [`Device::stats`] and [`Device::poll_async_event`] (all members) and
//! [`Device::set_async_handler`] (every member).

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::cq::{CompletionQueue, CqInner};
use super::error::{Result, TransportError};
use super::pd::ProtectionDomain;
use super::post_ring::{PostRing, PostedRings};
use super::qp::{QpInitAttr, QueuePair};
use crate::engine::completion::{Completion, CqId};
use crate::engine::memory::MrTable;
use crate::engine::sim::EngineHost;
use crate::engine::{AsyncEvent, Engine, EngineConfig, EngineStats, QpCreate};

/// What the device calls when an application gives the engine new work to
/// send: the hook that rings an I/O thread's doorbell (the runtime's
/// [`crate::runtime::Doorbell`]).
pub type DoorbellHook = Arc<dyn Fn() + Send + Sync>;

/// What a poller calls when its CQ is empty ([`Progress::Poll`]): one
/// round of the I/O thread's work (receive, timers, transmit) in the
/// poller's own thread, if frames or posted work wait and the backend is
/// free. Returns whether the round moved a frame. Installed by the runtime
/// ([`crate::runtime::Runtime`]); takes the device it drives.
pub type ProgressHook = Arc<dyn Fn(&Device, Progress) -> bool + Send + Sync>;

/// Why a [`ProgressHook`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// A poll found its CQ empty.
    Poll,
    /// A QP is about to change state or go: what an earlier poll's round
    /// left to send (its ACKs) goes now, before the QP can no longer send
    /// it. Waits for the backend if another thread has it.
    Flush,
}

/// Receives the engine's asynchronous events as they happen (called with
/// the engine locked: it must not call back into the device).
pub type AsyncHandler = Arc<dyn Fn(AsyncEvent) + Send + Sync>;

/// A callback the device runs, set and cleared from other threads: callers
/// take a clone and run it without holding the slot.
struct HookSlot<F>(std::sync::RwLock<Option<F>>);

impl<F: Clone> HookSlot<F> {
    fn new() -> Self {
        Self(std::sync::RwLock::new(None))
    }

    fn set(&self, f: Option<F>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = f;
    }

    fn get(&self) -> Option<F> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn is_set(&self) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

/// What the engine lock guards: the engine and where its completions go.
struct Locked {
    engine: Engine,
    /// `CqId(i)` is `cqs[i]`. Weak: a CQ lives as long as its handles and
    /// the QPs that use it (each [`QueuePair`] keeps its CQs); a dead slot
    /// is reused by the next CQ.
    cqs: Vec<Weak<CqInner>>,
    /// Completions being moved into CQs (kept to reuse its allocation).
    draining: Vec<Completion>,
    /// The post ring of each live QP, by QPN: the engine's retired WQEs
    /// give their ring room back.
    rings: HashMap<u32, Arc<PostRing>>,
}

pub(crate) struct DeviceShared {
    engine: Mutex<Locked>,
    /// QPs' rings with WRs posted and not yet in the engine.
    posted: PostedRings,
    pub(crate) mrs: Arc<MrTable>,
    /// Shared by the members of a group (one PD id space).
    next_pd: Arc<AtomicU32>,
    doorbell: HookSlot<DoorbellHook>,
    progress: HookSlot<ProgressHook>,
    on_async: HookSlot<AsyncHandler>,
    /// QPs created on this engine and not yet destroyed.
    pub(crate) live_qps: AtomicUsize,
    /// The packet backend's counters, as its I/O thread last published them.
    io_stats: Mutex<crate::io::IoStats>,
    group: Option<Arc<Group>>,
    /// Held while a backend sends datagrams whose payload it gathers from
    /// MRs ([`Device::sending`]): deregistration waits for it.
    sending: Mutex<()>,
}

/// What the members of a [`Device::group`] share besides the MR table and
/// the PD counter.
#[derive(Default)]
struct Group {
    /// The members, in shard order (weak: each member holds the group).
    members: std::sync::RwLock<Vec<Weak<DeviceShared>>>,
    /// Which CQ holds each [`CqId`] in every member's engine. Taken before
    /// any member's engine lock, never under one.
    cq_slots: Mutex<Vec<Weak<CqInner>>>,
}

impl Group {
    fn members(&self) -> Vec<Device> {
        self.members
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .map(|shared| Device {
                shared,
                spread: false,
            })
            .collect()
    }
}

/// A software RDMA device. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Device {
    pub(crate) shared: Arc<DeviceShared>,
    /// A [`Device::spreading`] handle: new QPs go to the least-loaded member.
    spread: bool,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").finish_non_exhaustive()
    }
}

/// The engine, locked; drives I/O in batches. Dropping it moves the
/// completions produced meanwhile into their CQs and signals them.
pub struct DeviceGuard<'a> {
    g: MutexGuard<'a, Locked>,
    on_async: &'a HookSlot<AsyncHandler>,
    /// CQs that got completions: their eventfds are written on drop.
    signal: Vec<Arc<CqInner>>,
}

impl DeviceGuard<'_> {
    /// Forgets the post ring of a destroyed QP.
    pub(crate) fn forget_ring(&mut self, qpn: u32) {
        self.g.rings.remove(&qpn);
    }

    /// Move the completions produced so far into their CQs now, where
    /// pollers see them, instead of when the guard is dropped (eventfds
    /// are still written then). For long batches. Returns whether there
    /// were any.
    pub fn deliver_completions(&mut self) -> bool {
        self.g.release_room();
        let any = self.g.engine.has_completions();
        if any {
            self.g.deliver_completions(&mut self.signal);
        }
        any
    }
}

impl Deref for DeviceGuard<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.g.engine
    }
}
impl DerefMut for DeviceGuard<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.g.engine
    }
}
impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        self.deliver_completions();
        if self.g.engine.has_async_events() {
            if let Some(h) = self.on_async.get() {
                while let Some(e) = self.g.engine.poll_async_event() {
                    h(e);
                }
            }
        }
        for cq in self.signal.drain(..) {
            cq.signal();
        }
    }
}

impl Locked {
    /// Gives the post rings the room of the WQEs the engine retired, before
    /// their completions become visible.
    fn release_room(&mut self) {
        let rings = &self.rings;
        self.engine.take_retired(|r| {
            if let Some(ring) = rings.get(&r.qpn) {
                ring.retire(&r);
            }
        });
    }

    /// Move the engine's completions into their CQs, in order. A full CQ
    /// loses the completion and its QP goes to ERR, whose flush completions
    /// are delivered (or lost) in turn. CQs to signal go to `signal`.
    fn deliver_completions(&mut self, signal: &mut Vec<Arc<CqInner>>) {
        let mut batch = std::mem::take(&mut self.draining);
        let mut overflowed = Vec::new();
        while self.engine.has_completions() {
            self.engine.take_completions(&mut batch);
            let mut cur: Option<(CqId, Arc<CqInner>)> = None;
            for c in batch.drain(..) {
                if cur.as_ref().is_none_or(|(id, _)| *id != c.cq) {
                    cur = self.cqs[c.cq.0 as usize].upgrade().map(|cq| (c.cq, cq));
                }
                // A CQ dropped with its last QP: nobody can poll it.
                let Some((_, cq)) = &cur else { continue };
                let mut notify = false;
                if !cq.push(c.wc, &mut notify) {
                    overflowed.push(c.wc.qp_num);
                }
                if notify {
                    signal.push(cq.clone());
                }
            }
            for qpn in overflowed.drain(..) {
                self.engine.cq_overflowed(qpn);
            }
        }
        self.draining = batch;
    }

    /// Registers `cq` as `CqId(i)` (a group's slot, the same in every member).
    fn set_cq(&mut self, i: usize, cq: &Arc<CqInner>) {
        if self.cqs.len() <= i {
            self.cqs.resize_with(i + 1, Weak::new);
        }
        self.cqs[i] = Arc::downgrade(cq);
    }

    fn add_cq(&mut self, cq: &Arc<CqInner>) -> CqId {
        let weak = Arc::downgrade(cq);
        let i = match self.cqs.iter().position(|w| w.strong_count() == 0) {
            Some(i) => {
                self.cqs[i] = weak;
                i
            }
            None => {
                self.cqs.push(weak);
                self.cqs.len() - 1
            }
        };
        CqId(i as u32)
    }

    /// Is `cq` the CQ this device knows as `cq.id`?
    fn owns_cq(&self, cq: &CompletionQueue) -> bool {
        self.cqs
            .get(cq.id.0 as usize)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&cq.inner)))
    }
}

impl EngineHost for Device {
    type Locked<'a> = DeviceGuard<'a>;
    fn lock(&self) -> DeviceGuard<'_> {
        Device::lock(self)
    }
}

impl Device {
    /// A plain (not spreading) handle on `shared`.
    pub(crate) fn of(shared: Arc<DeviceShared>) -> Self {
        Self {
            shared,
            spread: false,
        }
    }

    pub fn new(cfg: EngineConfig) -> Self {
        Self::with_mrs(cfg, MrTable::default())
    }

    /// A device whose MR keys come from `seed` (ChaCha8) instead of the
    /// OS: with the engine's own determinism, a simulation driven by one
    /// seed then replays exactly (see `xroce::verbs::sim::sim_pair`).
    /// Not for production: a peer knowing the seed can predict rkeys.
    pub fn with_seed(cfg: EngineConfig, seed: u64) -> Self {
        Self::with_mrs(cfg, MrTable::seeded(seed))
    }

    fn with_mrs(cfg: EngineConfig, mrs: MrTable) -> Self {
        Self::build(cfg, Arc::new(mrs), Arc::new(AtomicU32::new(1)), None)
    }

    fn build(
        cfg: EngineConfig,
        mrs: Arc<MrTable>,
        next_pd: Arc<AtomicU32>,
        group: Option<Arc<Group>>,
    ) -> Self {
        let shared = Arc::new(DeviceShared {
            engine: Mutex::new(Locked {
                engine: Engine::new(cfg, mrs.clone()),
                cqs: Vec::new(),
                draining: Vec::new(),
                rings: HashMap::new(),
            }),
            posted: PostedRings::default(),
            mrs: mrs.clone(),
            next_pd,
            doorbell: HookSlot::new(),
            progress: HookSlot::new(),
            on_async: HookSlot::new(),
            live_qps: AtomicUsize::new(0),
            io_stats: Mutex::new(crate::io::IoStats::default()),
            group,
            sending: Mutex::new(()),
        });
        // Deregistration waits until this engine is past any copy it
        // started (each happens under its lock, after a validity check),
        // then until a send that gathers from MRs what the engine named
        // under that lock is done.
        let weak = Arc::downgrade(&shared);
        mrs.on_quiesce(Box::new(move || match weak.upgrade() {
            Some(d) => {
                drop(d.engine.lock());
                drop(d.sending.lock());
                true
            }
            None => false,
        }));
        Self {
            shared,
            spread: false,
        }
    }

    /// The devices of one interface spread over several engines, one per
    /// configuration (each with a QPN block of its own): they share MRs,
    /// PDs and CQs (see the module docs). Drive each with an I/O thread
    /// of its own ([`crate::runtime::shards::ShardedRuntime`]).
    pub fn group(cfgs: Vec<EngineConfig>) -> Vec<Device> {
        let mrs = Arc::new(MrTable::default());
        let next_pd = Arc::new(AtomicU32::new(1));
        let group = Arc::new(Group::default());
        let devs: Vec<Device> = cfgs
            .into_iter()
            .map(|cfg| Self::build(cfg, mrs.clone(), next_pd.clone(), Some(group.clone())))
            .collect();
        *group.members.write().unwrap_or_else(|e| e.into_inner()) =
            devs.iter().map(|d| Arc::downgrade(&d.shared)).collect();
        devs
    }

    /// A handle on this device whose [`create_qp`](Self::create_qp) puts
    /// each QP on the member of its group with the fewest live QPs (on
    /// this device itself outside a group). See the module docs.
    pub fn spreading(&self) -> Device {
        Device {
            shared: self.shared.clone(),
            spread: true,
        }
    }

    /// The members of this device's group in shard order (just this
    /// device outside a group).
    pub fn members(&self) -> Vec<Device> {
        match &self.shared.group {
            Some(g) => g.members(),
            None => vec![Device {
                shared: self.shared.clone(),
                spread: false,
            }],
        }
    }

    /// Waits (at most `limit`) until the UD/UC sends already posted to
    /// QPs completing into `cq` are transmitted and completed, as a NIC
    /// has long done by the time a program's next verb reaches it; here
    /// they wait for the I/O thread. `ibv_resize_cq` counts them.
    pub fn settle_local_sends(&self, cq: &CompletionQueue, limit: std::time::Duration) {
        let start = std::time::Instant::now();
        for m in self.members() {
            while m.lock().local_sends_pending(cq.id) && start.elapsed() < limit {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    /// QPs created on this engine and not destroyed yet.
    pub fn live_qps(&self) -> usize {
        self.shared.live_qps.load(Ordering::Relaxed)
    }

    /// Are `self` and `other` the same device or members of one group?
    fn same_group(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
            || matches!(
                (&self.shared.group, &other.shared.group),
                (Some(a), Some(b)) if Arc::ptr_eq(a, b)
            )
    }

    /// Where a new QP goes: this device, or for a spreading handle the
    /// member with the fewest live QPs (the lowest of equals).
    fn qp_home(&self) -> Device {
        let me = Device {
            shared: self.shared.clone(),
            spread: false,
        };
        if !self.spread || self.shared.group.is_none() {
            return me;
        }
        self.members()
            .into_iter()
            .min_by_key(Device::live_qps)
            .unwrap_or(me)
    }

    /// Install the doorbell hook: called (outside the engine lock) after every
    /// successful post_send and every QP modify, so an I/O thread sleeping
    /// until the engine's next timer can wake up and transmit (e.g. write an
    /// eventfd it polls, or unpark the thread).
    pub fn set_doorbell(&self, f: Option<DoorbellHook>) {
        self.shared.doorbell.set(f);
    }

    /// Install the progress hook: what [`CompletionQueue::poll`] runs when
    /// it finds the CQ empty (see [`ProgressHook`]).
    pub fn set_progress(&self, f: Option<ProgressHook>) {
        self.shared.progress.set(f);
    }

    /// Whether a poll of an empty CQ runs this device's transport (a
    /// progress hook is installed): a program waiting for a completion
    /// then does better to keep polling than to yield its core.
    pub fn polls_drive_transport(&self) -> bool {
        self.shared.progress.is_set()
    }

    /// Runs the progress hook once, if one is installed; returns whether
    /// it moved a frame.
    pub(crate) fn progress(&self) -> bool {
        self.shared
            .progress
            .get()
            .is_some_and(|h| h(self, Progress::Poll))
    }

    /// Sends what a poll's round left for the program's next poll (see
    /// [`Progress::Flush`]).
    pub(crate) fn flush_deferred(&self) {
        if let Some(h) = self.shared.progress.get() {
            h(self, Progress::Flush);
        }
    }

    /// Deliver asynchronous events to `f` as they happen instead of
    /// queueing them for [`Device::poll_async_event`].
    /// On a [`spreading`](Self::spreading) handle: every member's.
    pub fn set_async_handler(&self, f: Option<AsyncHandler>) {
        let members = if self.spread {
            self.members()
        } else {
            vec![self.clone()]
        };
        for d in members {
            d.shared.on_async.set(f.clone());
        }
    }

    /// Locks the engine (batch I/O; see the module docs), first moving every WR posted into the QPs' rings
    /// into it (so whatever the caller does comes after those posts).
    /// The send gate: held from the engine's [`poll_transmit_gather`]
    /// until the backend has handed the datagrams to the kernel, so that
    /// deregistration (which takes it after the engine lock) returns only
    /// once no send reads the region. Taken under the engine lock or
    /// without it; the quiesce hook waits for it only after letting that
    /// lock go, so neither waits for the other.
    ///
    /// [`poll_transmit_gather`]: crate::engine::Engine::poll_transmit_gather
    pub fn sending(&self) -> std::sync::MutexGuard<'_, ()> {
        self.shared
            .sending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub fn lock(&self) -> DeviceGuard<'_> {
        let mut g = self.shared.engine.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.posted.drain_into(&mut g.engine);
        DeviceGuard {
            g,
            on_async: &self.shared.on_async,
            signal: Vec::new(),
        }
    }

    /// Whether WRs wait in a post ring for the engine (the I/O thread looks
    /// before it sleeps: a post that rang no doorbell because it ran awake
    /// is not left behind).
    pub fn has_posted_work(&self) -> bool {
        self.shared.posted.has_work()
    }

    /// WRs the engine refused when they arrived from a post ring (a modify
    /// to RESET racing a post).
    pub fn late_post_refusals(&self) -> u64 {
        self.shared.posted.late_refusals()
    }

    /// After a post into `ring`: list it for the engine and wake the I/O
    /// thread. The poster moves the WRs into the engine itself where
    /// nothing else would soon: on a device no I/O thread drives (the
    /// simulator, tests: no doorbell), and for a QP in ERR, so that the
    /// flush completions are in the CQ when the post returns.
    pub(crate) fn posted(&self, ring: &Arc<PostRing>) {
        self.shared.posted.mark(ring);
        let rung = self.ring();
        if !rung || ring.in_error() {
            drop(self.lock());
        }
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            id: self.shared.next_pd.fetch_add(1, Ordering::Relaxed),
            dev: self.clone(),
        }
    }

    /// `ibv_create_cq` with an eventfd for [`CompletionQueue::wait`].
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue> {
        self.add_cq(depth, true)
    }

    /// A CQ without an eventfd: for consumers that poll, or that take
    /// completion events through [`CompletionQueue::set_event_handler`]
    /// (saves a write(2) per batch of completions).
    pub fn create_cq_polled(&self, depth: usize) -> Result<CompletionQueue> {
        self.add_cq(depth, false)
    }

    fn add_cq(&self, depth: usize, with_eventfd: bool) -> Result<CompletionQueue> {
        if depth == 0 {
            return Err(TransportError::InvalidArgument("CQ depth must be at least 1").into());
        }
        let inner = Arc::new(CqInner::new(depth, with_eventfd)?);
        let Some(group) = &self.shared.group else {
            let id = self.lock().g.add_cq(&inner);
            return Ok(CompletionQueue {
                inner,
                id,
                devices: Arc::new([Arc::downgrade(&self.shared)]),
            });
        };
        // One slot for the whole group, registered in every member's
        // engine: QPs of any shard complete into it.
        let mut slots = group.cq_slots.lock().unwrap_or_else(|e| e.into_inner());
        let i = match slots.iter().position(|w| w.strong_count() == 0) {
            Some(i) => i,
            None => {
                slots.push(Weak::new());
                slots.len() - 1
            }
        };
        slots[i] = Arc::downgrade(&inner);
        let members = group.members();
        for d in &members {
            d.lock().g.set_cq(i, &inner);
        }
        Ok(CompletionQueue {
            inner,
            id: CqId(i as u32),
            devices: members.iter().map(|d| Arc::downgrade(&d.shared)).collect(),
        })
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&self, pd: &ProtectionDomain, init: &QpInitAttr) -> Result<QueuePair> {
        self.add_qp(pd, init, Engine::create_qp)
    }

    /// The device's GSI QP (QP1, UD; see [`Engine::create_gsi_qp`]): what
    /// a connection manager sends and receives its MADs on. One per device
    /// ([`TransportError::AlreadyExists`] while it lives), UD only
    /// ([`TransportError::InvalidArgument`]).
    ///
    /// QP1 belongs to QPN block 0: on a spreading handle it is made on
    /// this device (the first member), never spread.
    pub fn create_gsi_qp(&self, pd: &ProtectionDomain, init: &QpInitAttr) -> Result<QueuePair> {
        let me = Device {
            shared: self.shared.clone(),
            spread: false,
        };
        me.add_qp(pd, init, Engine::create_gsi_qp)
    }

    fn add_qp(
        &self,
        pd: &ProtectionDomain,
        init: &QpInitAttr,
        create: fn(&mut Engine, QpCreate) -> Result<u32, TransportError>,
    ) -> Result<QueuePair> {
        if !self.same_group(&pd.dev) {
            return Err(TransportError::InvalidArgument("PD belongs to another device").into());
        }
        if let Some(s) = &init.srq {
            if s.inner.pd() != pd.id {
                return Err(TransportError::InvalidArgument("SRQ belongs to another PD").into());
            }
        }
        let home = self.qp_home();
        let (qpn, ring) = {
            let mut g = home.lock();
            if !g.g.owns_cq(&init.send_cq) || !g.g.owns_cq(&init.recv_cq) {
                return Err(TransportError::InvalidArgument("CQ belongs to another device").into());
            }
            let qpn = create(
                &mut g,
                QpCreate {
                    qp_type: init.qp_type,
                    pd: pd.id,
                    send_cq: init.send_cq.id,
                    recv_cq: init.recv_cq.id,
                    srq: init.srq.as_ref().map(|s| s.inner.clone()),
                    cap: init.cap,
                    sq_sig_all: init.sq_sig_all,
                },
            )?;
            let ring = Arc::new(PostRing::new(qpn, g.post_limits(qpn)?));
            g.g.rings.insert(qpn, ring.clone());
            (qpn, ring)
        };
        if qpn != crate::engine::GSI_QPN {
            // The load QPs are spread by: QP1 stays on the first member
            // and would make the first QP of every CM user go elsewhere.
            home.shared.live_qps.fetch_add(1, Ordering::Relaxed);
        }
        Ok(QueuePair {
            dev: home,
            qpn,
            ring,
            _cqs: [init.send_cq.clone(), init.recv_cq.clone()],
        })
    }

    /// Feed one received frame (locks the engine once).
    pub fn handle_frame(&self, frame: &[u8], now_ns: u64) {
        self.lock().handle_frame(frame, now_ns)
    }
    /// Next frame to send, if any (a whole Ethernet frame, see
    /// [`Engine::poll_transmit_frame`](crate::engine::Engine::poll_transmit_frame)).
    pub fn poll_transmit_frame(&self, now_ns: u64, buf: &mut [u8]) -> Option<usize> {
        self.lock().poll_transmit_frame(now_ns, buf)
    }
    /// When [`Device::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.lock().poll_timeout()
    }
    /// Run due timers.
    pub fn handle_timeout(&self, now_ns: u64) {
        self.lock().handle_timeout(now_ns)
    }
    /// The engine's counters; on a [`spreading`](Self::spreading) handle
    /// the sum over every member.
    pub fn stats(&self) -> EngineStats {
        self.summed(|d| d.lock().stats())
    }
    /// `counters(self)`, or on a [`spreading`](Self::spreading) handle the
    /// sum over every member.
    fn summed<T: Default + std::ops::Add<Output = T>>(&self, counters: impl Fn(&Device) -> T) -> T {
        if !self.spread {
            return counters(self);
        }
        self.members()
            .iter()
            .map(counters)
            .fold(T::default(), |a, b| a + b)
    }
    /// Publishes the counters of the backend that drives this device (its
    /// I/O thread does, every half second).
    pub fn set_io_stats(&self, s: crate::io::IoStats) {
        *self
            .shared
            .io_stats
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = s;
    }
    /// The backend's counters as last published; on a
    /// [`spreading`](Self::spreading) handle the sum over every member.
    pub fn io_stats(&self) -> crate::io::IoStats {
        self.summed(|d| *d.shared.io_stats.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// `ibv_get_async_event` without blocking (a spreading handle: from
    /// any member).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        if !self.spread {
            return self.lock().poll_async_event();
        }
        self.members()
            .iter()
            .find_map(|d| d.lock().poll_async_event())
    }

    /// Rings the I/O thread's doorbell; false if the device has none.
    pub(crate) fn ring(&self) -> bool {
        match self.shared.doorbell.get() {
            Some(d) => {
                d();
                true
            }
            None => false,
        }
    }
}
