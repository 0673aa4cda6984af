//! The device/context (`ibv_context`): owns the engine and the MR table.
//!
//! Threading model: the [`Engine`] sits behind one `Mutex` in the device.
//! Application threads take it briefly to post WRs or modify QPs; the I/O
//! backend takes it to feed received frames and pull frames to send (use
//! [`Device::lock`] to do a whole batch under one acquisition). CQs and
//! SRQs have their own small locks, so polling completions does not touch
//! the engine lock. After every engine call the device writes the eventfds
//! of CQs that got completions (the engine itself makes no syscalls).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::cq::{CompletionQueue, CqInner};
use super::error::{Result, VerbsError};
use super::mr::MrTable;
use super::pd::ProtectionDomain;
use super::qp::{QpAttr, QpAttrMask, QpCap, QpState, QpType};
use super::srq::SharedReceiveQueue;
use super::wr::{RecvWr, SendWr};
use crate::engine::{AsyncEvent, Engine, EngineConfig, EngineStats, QpCreate};

/// Called when an application gives the engine new work to send.
pub type Doorbell = Arc<dyn Fn() + Send + Sync>;

/// Receives the engine's asynchronous events as they happen (called with
/// the engine locked: it must not call back into the device).
pub type AsyncHandler = Arc<dyn Fn(AsyncEvent) + Send + Sync>;

pub(crate) struct DeviceShared {
    engine: Mutex<Engine>,
    pub(crate) mrs: Arc<MrTable>,
    next_pd: AtomicU32,
    doorbell: std::sync::RwLock<Option<Doorbell>>,
    on_async: std::sync::RwLock<Option<AsyncHandler>>,
}

/// A software RDMA device. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Device {
    pub(crate) shared: Arc<DeviceShared>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").finish_non_exhaustive()
    }
}

/// The engine, locked; drives I/O in batches. Dropping it signals CQ
/// eventfds for completions produced meanwhile.
pub struct DeviceGuard<'a> {
    g: MutexGuard<'a, Engine>,
    pending: Vec<Arc<CqInner>>,
    on_async: &'a std::sync::RwLock<Option<AsyncHandler>>,
}

impl Deref for DeviceGuard<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.g
    }
}
impl DerefMut for DeviceGuard<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.g
    }
}
impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        if self.g.has_async_events() {
            let handler = self
                .on_async
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(h) = handler {
                while let Some(e) = self.g.poll_async_event() {
                    h(e);
                }
            }
        }
        self.g.take_notify(&mut self.pending);
        for cq in self.pending.drain(..) {
            cq.signal();
        }
    }
}

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

impl Device {
    pub fn new(cfg: EngineConfig) -> Self {
        Self::with_mrs(cfg, MrTable::default())
    }

    /// A device whose MR keys come from `seed` (ChaCha8) instead of the
    /// OS: with the engine's own determinism, a simulation driven by one
    /// seed then replays exactly (see [`crate::engine::sim::Sim::pair`]).
    /// Not for production: a peer knowing the seed can predict rkeys.
    pub fn with_seed(cfg: EngineConfig, seed: u64) -> Self {
        Self::with_mrs(cfg, MrTable::seeded(seed))
    }

    fn with_mrs(cfg: EngineConfig, mrs: MrTable) -> Self {
        let mrs = Arc::new(mrs);
        Self {
            shared: Arc::new(DeviceShared {
                engine: Mutex::new(Engine::new(cfg, mrs.clone())),
                mrs,
                next_pd: AtomicU32::new(1),
                doorbell: std::sync::RwLock::new(None),
                on_async: std::sync::RwLock::new(None),
            }),
        }
    }

    /// Install the doorbell: called (outside the engine lock) after every
    /// successful post_send and every QP modify, so an I/O thread sleeping
    /// until the engine's next timer can wake up and transmit (e.g. write an
    /// eventfd it polls, or unpark the thread).
    pub fn set_doorbell(&self, f: Option<Doorbell>) {
        *self
            .shared
            .doorbell
            .write()
            .unwrap_or_else(|e| e.into_inner()) = f;
    }

    /// Deliver asynchronous events to `f` as they happen instead of
    /// queueing them for [`Device::poll_async_event`].
    pub fn set_async_handler(&self, f: Option<AsyncHandler>) {
        *self
            .shared
            .on_async
            .write()
            .unwrap_or_else(|e| e.into_inner()) = f;
    }

    pub(crate) fn ring(&self) {
        let d = self
            .shared
            .doorbell
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(d) = d {
            d();
        }
    }

    /// Lock the engine (batch I/O; see the module docs).
    pub fn lock(&self) -> DeviceGuard<'_> {
        DeviceGuard {
            g: self.shared.engine.lock().unwrap_or_else(|e| e.into_inner()),
            pending: Vec::new(),
            on_async: &self.shared.on_async,
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
        CompletionQueue::new(depth, true)
    }

    /// A CQ without an eventfd: for consumers that poll, or that take
    /// completion events through [`CompletionQueue::set_event_handler`]
    /// (saves a write(2) per batch of completions).
    pub fn create_cq_polled(&self, depth: usize) -> Result<CompletionQueue> {
        CompletionQueue::new(depth, false)
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&self, pd: &ProtectionDomain, init: &QpInitAttr) -> Result<QueuePair> {
        if !Arc::ptr_eq(&pd.dev.shared, &self.shared) {
            return Err(VerbsError::InvalidArgument("PD belongs to another device"));
        }
        if let Some(s) = &init.srq {
            if s.inner.pd != pd.id {
                return Err(VerbsError::InvalidArgument("SRQ belongs to another PD"));
            }
        }
        let qpn = self.lock().create_qp(QpCreate {
            qp_type: init.qp_type,
            pd: pd.id,
            send_cq: init.send_cq.inner.clone(),
            recv_cq: init.recv_cq.inner.clone(),
            srq: init.srq.as_ref().map(|s| s.inner.clone()),
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
        })?;
        Ok(QueuePair {
            dev: self.clone(),
            qpn,
        })
    }

    /// Feed one received frame (locks the engine once).
    pub fn handle_frame(&self, frame: &[u8], now_ns: u64) {
        self.lock().handle_frame(frame, now_ns)
    }
    /// Next frame to send, if any.
    pub fn poll_transmit(&self, now_ns: u64, buf: &mut [u8]) -> Option<usize> {
        self.lock().poll_transmit(now_ns, buf)
    }
    /// When [`Device::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.lock().poll_timeout()
    }
    /// Run due timers.
    pub fn handle_timeout(&self, now_ns: u64) {
        self.lock().handle_timeout(now_ns)
    }
    pub fn stats(&self) -> EngineStats {
        self.lock().stats()
    }
    /// `ibv_get_async_event` without blocking.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.lock().poll_async_event()
    }
}

/// A queue pair (`ibv_qp`). Dropping it destroys the QP.
pub struct QueuePair {
    dev: Device,
    qpn: u32,
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
    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let r = self.dev.lock().modify_qp(self.qpn, attr, mask);
        if r.is_ok() {
            self.dev.ring();
        }
        r
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
        self.dev.lock().query_qp(self.qpn)
    }
    pub fn state(&self) -> QpState {
        self.query().map(|a| a.qp_state).unwrap_or(QpState::Err)
    }
    /// `ibv_post_send` for one WR.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        let r = self.dev.lock().post_send(self.qpn, wr);
        if r.is_ok() {
            self.dev.ring();
        }
        r
    }
    /// `ibv_post_send` of one WR with IBV_SEND_INLINE: `data` is the
    /// payload, copied now (`wr.sg_list` is not read), so the program's
    /// buffer needs no registration, as rdma-core promises for inline.
    pub fn post_send_inline(&self, wr: &SendWr, data: &[u8]) -> Result<()> {
        let r = self.dev.lock().post_send_inline(self.qpn, wr, data);
        if r.is_ok() {
            self.dev.ring();
        }
        r
    }
    /// `ibv_post_send` for a list: stops at the first failure and returns
    /// its index with the error (like `bad_wr`).
    pub fn post_send_list(&self, wrs: &[SendWr]) -> Result<(), (usize, VerbsError)> {
        let r = {
            let mut g = self.dev.lock();
            wrs.iter()
                .enumerate()
                .try_for_each(|(i, wr)| g.post_send(self.qpn, wr).map_err(|e| (i, e)))
        };
        self.dev.ring();
        r
    }
    /// `ibv_post_recv` for one WR.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        self.dev.lock().post_recv(self.qpn, wr)
    }
    /// Move the QP to RESET -> INIT -> RTR -> RTS in one call for a peer
    /// described by `remote` (qpn, psn, address); `local` holds the rest
    /// (access flags, MTU, timers, rd_atomic limits, this side's sq_psn).
    pub fn connect(&self, local: &QpAttr, remote: &RemoteQp) -> Result<()> {
        let mut a = *local;
        a.qp_state = QpState::Init;
        self.modify(
            &a,
            QpAttrMask::STATE
                | QpAttrMask::ACCESS_FLAGS
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT,
        )?;
        a.qp_state = QpState::Rtr;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.ah_attr = remote.av;
        self.modify(
            &a,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        a.qp_state = QpState::Rts;
        self.modify(
            &a,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
    }
}

/// What one side learns about the other out of band (like the
/// `LID:QPN:PSN:GID` string of ibv_rc_pingpong).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    pub qpn: u32,
    /// The peer's initial send PSN (our rq_psn).
    pub psn: u32,
    pub av: super::qp::AddressVector,
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let _ = self.dev.lock().destroy_qp(self.qpn);
    }
}
