//! The CM agent of a device: its GSI QP (QP1) driving an
//! [`xroce_cm::CmEngine`], as the kernel's ib_cm MAD agent does for
//! rdma_cm.
//!
//! One agent per device, made on first use and kept for the life of the
//! process, with one thread. The thread waits (poll(2)) on the CQ's
//! completion channel, a wake-up eventfd and the engine's next timer;
//! then it feeds every received MAD to the engine (the sender's GID from
//! the GRH, our GID it was sent to, the sender's QPN from the
//! completion), fires the engine's due timers, posts what the engine
//! queued ([`sender`]: a UD SEND per MAD, Q_Key 0x80010000, an AH per
//! local GID and peer), and hands the engine's events, in order and with
//! the engine unlocked, to the connection layer's [`EventHandler`].
//! [`Agent::with_engine`] is how the connection layer drives the engine
//! from the program's threads: it wakes the agent's thread, which sends
//! what was queued and re-arms its timer.
//!
//! Nothing here blocks on the network: a MAD to a peer whose MAC the
//! kernel does not know yet waits (the neighbour is solicited) up to
//! 3 s and is then dropped; lost MADs are the engine's retries' business.
//! Under XROCE_RDMACM_DEBUG every MAD sent and received is one line on
//! stderr.
//!
//! Only the process holding QPN block 0 gets QP1. Its agent starts as soon
//! as librdmacm opens the device and also serves the device's other
//! processes ([`relay`]); their agents run their own engine over that
//! relay instead of a GSI QP.

mod grh;
mod gsi;
mod relay;
mod sender;
mod trace;

use std::collections::BTreeSet;
use std::ffi::c_int;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use xroce_cm::{CmConfig, CmEngine, CmEvent, PeerAddr, Transmit};
use xroce_wire::mad::GSI_QPN;
use xroce_wire::Gid;

use crate::abi::*;
use crate::objects::devices::Device;
use gsi::{Gsi, WrId};
use sender::{Link, SendCounters, Sender};

/// Where engine events go: called on the agent's thread with the engine
/// NOT locked (so the handler may call [`Agent::with_engine`]), in engine
/// order.
pub(crate) type EventHandler = fn(&'static Agent, CmEvent);

static HANDLER: OnceLock<EventHandler> = OnceLock::new();

/// Set once by the connection layer before it creates an agent (a second
/// call changes nothing).
pub(crate) fn set_event_handler(h: EventHandler) {
    let _ = HANDLER.set(h);
}

/// The P_Key every MAD is received with (xroce has the default only).
const DEFAULT_PKEY: u16 = 0xffff;
/// How long a process that does not hold QP1 waits for the holder's relay
/// (the holder may be starting its agent at the same time).
const RELAY_PATIENCE: Duration = Duration::from_secs(2);
/// The most the QP1 holder's exit waits for the device's other processes
/// to leave: their MADs (and the ones it sends itself to the device's own
/// address) reach them only while it runs.
const RELAY_LINGER: Duration = Duration::from_secs(3);
/// The most a call waits for the agent's thread to take its MADs.
const TAKE_WAIT: Duration = Duration::from_millis(200);

thread_local! {
    /// Set on the agents' threads.
    static ON_AGENT_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Rounds of MADs between processes of the device handled in one go
/// (each answer may bring another).
const LOCAL_ROUNDS: usize = 8;
/// How long a frame whose send completed may still take to leave.
const FRAME_OUT: Duration = Duration::from_millis(5);
/// Completions taken per poll.
const POLL_BATCH: usize = 32;

pub(crate) struct Agent {
    device: &'static Device,
    local_gids: Vec<Gid>,
    engine: Mutex<CmEngine>,
    /// Written to wake the agent's thread (eventfd).
    wake: OwnedFd,
    /// MADs left the engine and are not all sent yet (set under the
    /// engine lock when the thread takes them, cleared when its sender is
    /// idle), for [`Agent::flush`].
    sending: AtomicBool,
    counters: Counters,
    /// In a process that does not hold QP1: the holder's relay
    /// ([`relay`]), and the service IDs registered with it.
    relay: Option<relay::ClientEnd>,
    registered: Mutex<BTreeSet<u64>>,
    /// In the QP1 holder: how many other processes use its relay now.
    relayed_processes: AtomicUsize,
    /// Rounds the thread began (each waits, then takes what arrived), for
    /// [`catch_up_all`].
    rounds: AtomicU64,
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    /// Receive completions with an error status.
    recv_errors: AtomicU64,
    /// Receives whose GRH area held no IP header (dropped).
    bad_grh: AtomicU64,
    /// Receive buffers that could not be posted again.
    repost_failures: AtomicU64,
    handler_panics: AtomicU64,
    send: SendCounters,
}

/// The agent's own counters (the engine has its own: [`CmEngine::stats`]).
// Nothing reads them yet (for a stats export or a debug dump later).
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AgentStats {
    pub(crate) received: u64,
    pub(crate) recv_errors: u64,
    pub(crate) bad_grh: u64,
    pub(crate) repost_failures: u64,
    pub(crate) handler_panics: u64,
    pub(crate) sent: u64,
    pub(crate) send_errors: u64,
    pub(crate) unknown_local_gid: u64,
    pub(crate) neighbour_timeouts: u64,
    pub(crate) ah_failures: u64,
    pub(crate) post_failures: u64,
}

fn debug(what: std::fmt::Arguments<'_>) {
    if crate::base::config::debug() {
        eprintln!("librdmacm: {what}");
    }
}

impl Agent {
    /// The agent of `dev`: GSI QP made and brought to RTS, receives
    /// posted, thread running; made on first call.
    pub(crate) fn of(dev: &'static Device) -> Result<&'static Agent, i32> {
        let mut agents = AGENTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = agents.iter().find(|a| std::ptr::eq(a.device, dev)) {
            return Ok(a);
        }
        let agent = start(dev, None)?;
        agents.push(agent);
        Ok(agent)
    }

    /// Starts `dev`'s agent now if this process can hold the device's QP1
    /// (QPN block 0), so that the device's other processes find its relay
    /// ([`relay`]) as soon as they use RDMA-CM; otherwise does nothing.
    pub(crate) fn serve_if_qp1_holder(dev: &'static Device) {
        let mut agents = AGENTS.lock().unwrap_or_else(|e| e.into_inner());
        if agents.iter().any(|a| std::ptr::eq(a.device, dev)) {
            return;
        }
        if let Ok(gsi) = Gsi::open(dev) {
            match start(dev, Some(gsi)) {
                Ok(agent) => agents.push(agent),
                Err(e) => debug(format_args!("CM agent of {}: error {e}", dev.name)),
            }
        }
    }

    pub(crate) fn device(&self) -> &'static Device {
        self.device
    }

    /// The GIDs of the port (index order), as given to the CmEngine.
    #[allow(dead_code)] // The connection layer's, which asks devices so far.
    pub(crate) fn local_gids(&self) -> &[Gid] {
        &self.local_gids
    }

    /// Runs `f` with the engine locked and the current CLOCK_MONOTONIC
    /// time in ns; afterwards the agent's thread sends what `f` queued
    /// and re-arms its timer. `f` must not call `with_engine` itself.
    pub(crate) fn with_engine<R>(&self, f: impl FnOnce(&mut CmEngine, u64) -> R) -> R {
        let r = {
            let mut engine = self.lock();
            let r = f(&mut engine, now_ns());
            self.register_listeners(&engine);
            r
        };
        self.wake();
        self.wait_taken();
        r
    }

    /// When processes of the device share RDMA-CM, waits (briefly) until
    /// the agent's thread took what the caller queued: a MAD for another
    /// process of the device is then in the relay, so it survives the
    /// caller's `_exit` right after (rdma_reject, rdma_disconnect), as the
    /// kernel's rdma_cm sends within the call. Not on the agent's thread
    /// (an event handler's call), which takes them itself after.
    fn wait_taken(&self) {
        let shared = self.relay.is_some() || self.relayed_processes.load(Ordering::Acquire) > 0;
        if !shared || ON_AGENT_THREAD.get() {
            return;
        }
        let deadline = Instant::now() + TAKE_WAIT;
        loop {
            let busy = {
                let engine = self.lock();
                engine.has_transmit()
                    || (self.relay.is_some() && self.sending.load(Ordering::Acquire))
            };
            if !busy || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Tells the QP1 holder's relay which service IDs this process's
    /// engine listens on now, before the caller (rdma_listen) returns.
    fn register_listeners(&self, engine: &CmEngine) {
        let Some(relay) = &self.relay else {
            return;
        };
        let now: BTreeSet<u64> = engine.listening().collect();
        let mut registered = self.registered.lock().unwrap_or_else(|e| e.into_inner());
        let changes = now
            .difference(&registered)
            .map(|&s| relay::Msg::Listen(s))
            .chain(
                registered
                    .difference(&now)
                    .map(|&s| relay::Msg::Unlisten(s)),
            )
            .collect::<Vec<_>>();
        for m in changes {
            if let Err(e) = relay.send(&m) {
                debug(format_args!("CM agent: relay: {m:?}: {e}"));
            }
        }
        *registered = now;
    }

    #[allow(dead_code)] // See AgentStats.
    pub(crate) fn stats(&self) -> AgentStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AgentStats {
            received: get(&c.received),
            recv_errors: get(&c.recv_errors),
            bad_grh: get(&c.bad_grh),
            repost_failures: get(&c.repost_failures),
            handler_panics: get(&c.handler_panics),
            sent: get(&c.send.sent),
            send_errors: get(&c.send.send_errors),
            unknown_local_gid: get(&c.send.unknown_local_gid),
            neighbour_timeouts: get(&c.send.neighbour_timeouts),
            ah_failures: get(&c.send.ah_failures),
            post_failures: get(&c.send.post_failures),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CmEngine> {
        // A panicking event handler never holds the lock; the engine is
        // consistent between calls.
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the MADs queued so far are posted and their sends
    /// completed (the frames are then the device's to put on the wire,
    /// which it does at once), or until `deadline`.
    fn flush(&self, deadline: Instant) {
        loop {
            let busy = {
                let engine = self.lock();
                engine.has_transmit() || self.sending.load(Ordering::Acquire)
            };
            if !busy || Instant::now() >= deadline {
                break;
            }
            self.wake();
            std::thread::sleep(Duration::from_millis(1));
        }
        // The completion comes as the device takes the frame; its I/O
        // thread sends it right after.
        std::thread::sleep(FRAME_OUT);
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: our eventfd and 8 bytes. A full counter (EAGAIN) means
        // the thread is woken already.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// CLOCK_MONOTONIC in nanoseconds.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a timespec to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: 8 writable bytes. Short reads cannot happen for 8 bytes
    // from the urandom source; on failure the clock seeds it.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return now_ns() ^ u64::from(std::process::id()).rotate_left(32);
    }
    u64::from_ne_bytes(b)
}

/// poll(2)'s timeout until `deadline` (rounded up to whole ms, so the
/// timer is due when poll returns); -1: none.
fn poll_timeout_ms(now: u64, deadline: Option<u64>) -> c_int {
    match deadline {
        None => -1,
        Some(d) if d <= now => 0,
        Some(d) => (d - now).div_ceil(1_000_000).min(c_int::MAX as u64) as c_int,
    }
}

/// Makes the GSI QP, the engine and the thread of `dev`'s agent.
/// `gsi`: the device's QP1 if opened already.
fn start(dev: &'static Device, gsi: Option<Gsi>) -> Result<&'static Agent, i32> {
    let ifindex = dev
        .name
        .strip_prefix("xroce_")
        .and_then(|iface| std::ffi::CString::new(iface).ok())
        // SAFETY: a NUL-terminated interface name.
        .map(|iface| unsafe { libc::if_nametoindex(iface.as_ptr()) })
        .unwrap_or(0);
    // QP1 of our own, or the relay of the process that holds it.
    let (own, relay) = match gsi.map_or_else(|| Gsi::open(dev), Ok) {
        Ok(gsi) => {
            let server = relay::Server::bind(ifindex)
                .inspect_err(|e| debug(format_args!("CM agent: no relay for others: {e}")))
                .ok();
            (Some((gsi, server)), None)
        }
        Err(libc::EBUSY) => match relay::ClientEnd::connect(ifindex, RELAY_PATIENCE) {
            Ok(c) => (None, Some(c)),
            Err(e) => {
                // Said always: without it the program only sees EBUSY.
                eprintln!(
                    "librdmacm: {}: another process of this host holds this xroce device's \
                     QP1 and serves no RDMA-CM relay ({e}): RDMA-CM works in other processes \
                     once the QP1 holder uses RDMA-CM itself",
                    dev.name
                );
                return Err(libc::EBUSY);
            }
        },
        Err(e) => return Err(e),
    };
    let local_gids = gsi::local_gids(dev);
    let ca_guid = gsi::node_guid(dev)?;
    let mut config = CmConfig::new(local_gids.clone(), ca_guid, random_u64());
    config.tid_high = random_u64() as u32;
    // SAFETY: eventfd makes a new fd or fails.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(crate::base::errno::errno());
    }
    // SAFETY: the fd just made, owned from here on.
    let wake = unsafe { OwnedFd::from_raw_fd(fd) };
    let agent: &'static Agent = Box::leak(Box::new(Agent {
        device: dev,
        local_gids,
        engine: Mutex::new(CmEngine::new(config)),
        wake,
        sending: AtomicBool::new(false),
        counters: Counters::default(),
        relay,
        registered: Mutex::new(BTreeSet::new()),
        relayed_processes: AtomicUsize::new(0),
        rounds: AtomicU64::new(0),
    }));
    std::thread::Builder::new()
        .name("xroce-cm".into())
        .spawn(move || {
            ON_AGENT_THREAD.set(true);
            match own {
                Some((gsi, server)) => run(agent, gsi, server, ifindex),
                None => run_relayed(agent),
            }
        })
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))?;
    // SAFETY: getpid has no preconditions.
    AGENTS_PID.store(unsafe { libc::getpid() } as u32, Ordering::Release);
    debug(format_args!(
        "CM agent of {} up: GIDs {:?}, CA GUID {ca_guid:#018x}",
        dev.name,
        agent
            .local_gids
            .iter()
            .map(|g| g.to_ip())
            .collect::<Vec<_>>()
    ));
    Ok(agent)
}

/// The sender's view of the GSI QP.
struct GsiLink<'a> {
    gsi: &'a Gsi,
    /// The device's interface (0: unknown, then ibv_create_ah resolves).
    ifindex: u32,
}

impl Link for GsiLink<'_> {
    type Ah = *mut ibv_ah;
    fn neighbour_known(&mut self, peer: Gid) -> bool {
        if self.ifindex == 0 {
            return true;
        }
        // A failed lookup cannot tell: let ibv_create_ah resolve it.
        !matches!(
            xroce_netlink::neighbour(self.ifindex, peer.to_ip()),
            Ok(None)
        )
    }
    fn solicit(&mut self, peer: Gid) {
        xroce_netlink::solicit(peer.to_ip(), self.ifindex);
    }
    fn create_ah(&mut self, sgid_index: u8, peer: Gid) -> Result<*mut ibv_ah, i32> {
        self.gsi.create_ah(sgid_index, peer).inspect_err(|e| {
            debug(format_args!(
                "CM agent: no AH to {}: {}",
                peer.to_ip(),
                std::io::Error::from_raw_os_error(*e)
            ))
        })
    }
    fn post(&mut self, slot: u32, ah: *mut ibv_ah, t: &Transmit) -> Result<(), i32> {
        self.gsi.post_send(slot, ah, t)
    }
}

/// A receive completion to hand to the engine.
struct Received {
    buffer: u32,
    byte_len: u32,
    peer: PeerAddr,
    local_gid: Gid,
}

/// The agent's thread: never returns.
fn run(agent: &'static Agent, gsi: Gsi, mut server: Option<relay::Server>, ifindex: u32) {
    let mut sender = Sender::new(agent.local_gids.clone(), gsi::SEND_BUFFERS);
    let mut wcs = vec![ibv_wc::default(); POLL_BATCH];
    let mut received = Vec::new();
    let mut repost = Vec::new();
    let mut events = Vec::new();
    loop {
        agent.rounds.fetch_add(1, Ordering::AcqRel);
        let now = now_ns();
        let engine_due = agent.lock().poll_timeout();
        let deadline = engine_due.into_iter().chain(sender.next_retry(now)).min();
        let mut fds = vec![gsi.channel_fd()];
        fds.extend(server.iter().flat_map(|s| s.fds()));
        wait(&fds, agent, poll_timeout_ms(now, deadline));
        gsi.take_cq_events();
        let now = now_ns();

        loop {
            let n = gsi.poll(&mut wcs);
            for wc in &wcs[..n] {
                on_completion(agent, &gsi, wc, &mut sender, &mut received, &mut repost);
            }
            if n < wcs.len() {
                break;
            }
        }

        {
            let mut engine = agent.lock();
            for r in received.drain(..) {
                let (_, mad) = gsi.received(r.buffer, r.byte_len);
                let theirs = server.as_mut().is_some_and(|s| {
                    s.forward(r.peer, r.local_gid, mad, |sid| {
                        engine.listening().any(|l| l == sid)
                    })
                });
                if !theirs {
                    engine.handle_mad(r.peer, r.local_gid, mad, now);
                }
                repost.push(r.buffer);
            }
            let mut out = Vec::new();
            if let Some(s) = server.as_mut() {
                // Other processes' MADs leave as the device's QP1 traffic.
                s.service(|t| out.push(t));
                agent
                    .relayed_processes
                    .store(s.clients(), Ordering::Release);
            }
            if engine.poll_timeout().is_some_and(|d| d <= now) {
                engine.handle_timeout(now);
            }
            // While other processes use the relay, a MAD from one process
            // of the device to another (to one of its own GIDs) is handed
            // over here at once rather than looped through the device:
            // written to the relay before its sender may exit.
            let relaying = server.as_ref().is_some_and(|s| s.clients() > 0);
            for _round in 0..LOCAL_ROUNDS {
                out.extend(std::iter::from_fn(|| engine.poll_transmit()));
                let (local, remote): (Vec<_>, Vec<_>) = out.drain(..).partition(|t| {
                    relaying && t.peer.qpn == GSI_QPN && agent.local_gids.contains(&t.peer.gid)
                });
                for t in remote {
                    agent.sending.store(true, Ordering::Release);
                    sender.push(t);
                }
                if local.is_empty() {
                    break;
                }
                for t in local {
                    trace_local(agent, &t);
                    let peer = PeerAddr {
                        gid: t.local_gid,
                        qpn: GSI_QPN,
                        pkey: t.peer.pkey,
                    };
                    let theirs = server.as_mut().is_some_and(|s| {
                        s.forward(peer, t.peer.gid, &t.mad, |sid| {
                            engine.listening().any(|l| l == sid)
                        })
                    });
                    if !theirs {
                        engine.handle_mad(peer, t.peer.gid, &t.mad, now);
                    }
                }
            }
            for t in out.drain(..) {
                agent.sending.store(true, Ordering::Release);
                sender.push(t);
            }
            events.extend(std::iter::from_fn(|| engine.poll_event()));
        }

        for n in repost.drain(..) {
            if let Err(e) = gsi.post_recv(n) {
                bump(&agent.counters.repost_failures);
                debug(format_args!("CM agent: reposting receive {n}: error {e}"));
            }
        }
        let mut link = GsiLink { gsi: &gsi, ifindex };
        sender.flush(&mut link, now, &agent.counters.send, |t| {
            if crate::base::config::debug() {
                eprintln!(
                    "librdmacm: CM agent {}: sent {} to {} qpn {}",
                    agent.device.name,
                    trace::describe(&t.mad),
                    t.peer.gid.to_ip(),
                    t.peer.qpn
                );
            }
        });

        if sender.is_idle(gsi::SEND_BUFFERS) {
            agent.sending.store(false, Ordering::Release);
        }
        for ev in events.drain(..) {
            deliver(agent, ev);
        }
    }
}

fn trace_local(agent: &Agent, t: &Transmit) {
    if crate::base::config::debug() {
        eprintln!(
            "librdmacm: CM agent {}: {} from {} to {} stays on the device",
            agent.device.name,
            trace::describe(&t.mad),
            t.local_gid.to_ip(),
            t.peer.gid.to_ip()
        );
    }
}

/// The agent's thread in a process that does not hold QP1: MADs come
/// from and go to the holder's relay; never returns.
fn run_relayed(agent: &'static Agent) {
    let relay = agent.relay.as_ref().expect("a relayed agent");
    let mut events = Vec::new();
    let mut open = true;
    loop {
        agent.rounds.fetch_add(1, Ordering::AcqRel);
        let now = now_ns();
        let due = agent.lock().poll_timeout();
        let fds = if open { vec![relay.fd()] } else { Vec::new() };
        wait(&fds, agent, poll_timeout_ms(now, due));
        let now = now_ns();
        let mut received = Vec::new();
        while open {
            match relay.recv() {
                Ok(Some(relay::Msg::Mad(t))) => received.push(*t),
                Ok(Some(other)) => debug(format_args!("CM agent: relay sent {other:?}")),
                Ok(None) => break,
                Err(e) => {
                    // The QP1 holder exited: MADs go nowhere from now on.
                    eprintln!(
                        "librdmacm: {}: the process holding QP1 left ({e}); RDMA-CM of this \
                         process no longer reaches the network",
                        agent.device.name
                    );
                    open = false;
                }
            }
        }
        let mut out = Vec::new();
        {
            let mut engine = agent.lock();
            for t in &received {
                bump(&agent.counters.received);
                if crate::base::config::debug() {
                    eprintln!(
                        "librdmacm: CM agent {}: received {} from {} qpn {} to {} (relayed)",
                        agent.device.name,
                        trace::describe(&t.mad),
                        t.peer.gid.to_ip(),
                        t.peer.qpn,
                        t.local_gid.to_ip()
                    );
                }
                engine.handle_mad(t.peer, t.local_gid, &t.mad, now);
            }
            if engine.poll_timeout().is_some_and(|d| d <= now) {
                engine.handle_timeout(now);
            }
            while let Some(t) = engine.poll_transmit() {
                agent.sending.store(true, Ordering::Release);
                out.push(t);
            }
            events.extend(std::iter::from_fn(|| engine.poll_event()));
        }
        for t in out {
            if crate::base::config::debug() {
                eprintln!(
                    "librdmacm: CM agent {}: sent {} to {} qpn {} (relayed)",
                    agent.device.name,
                    trace::describe(&t.mad),
                    t.peer.gid.to_ip(),
                    t.peer.qpn
                );
            }
            if open {
                if let Err(e) = relay.send(&relay::Msg::Mad(Box::new(t))) {
                    bump(&agent.counters.send.send_errors);
                    debug(format_args!("CM agent: relay send: {e}"));
                }
            }
        }
        agent.sending.store(false, Ordering::Release);
        for ev in events.drain(..) {
            deliver(agent, ev);
        }
    }
}

/// Every agent made so far.
static AGENTS: Mutex<Vec<&'static Agent>> = Mutex::new(Vec::new());
/// The process whose threads run the agents (0: none started yet).
static AGENTS_PID: AtomicU32 = AtomicU32::new(0);

/// Whether this process runs agents: false before the first one and in a
/// fork(2)ed child, which has the agents' memory but not their threads
/// (its exit must neither wait for them nor end the parent's
/// connections).
pub(crate) fn running_here() -> bool {
    let pid = AGENTS_PID.load(Ordering::Acquire);
    // SAFETY: getpid has no preconditions.
    pid != 0 && pid == unsafe { libc::getpid() } as u32
}

/// Waits (up to `limit` for all) until every agent has taken in what
/// arrived before this call: woken, its thread begins a round, takes what
/// came, and begins the next. At exit, an RTU can wait in the agent's
/// queue behind the program's own thread, which got the data sent after
/// it and exited: ended unread, the connection was still waiting for it
/// and ended with a REJ, where the kernel (which takes MADs in as they
/// come) sends a DREQ, and the peer saw REJECTED instead of DISCONNECTED.
pub(crate) fn catch_up_all(limit: Duration) {
    let agents = AGENTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let deadline = Instant::now() + limit;
    for agent in &agents {
        let began = agent.rounds.load(Ordering::Acquire);
        agent.wake();
        while agent.rounds.load(Ordering::Acquire) < began + 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Waits (up to `limit` for all) until every agent sent what its engine
/// queued, e.g. the DREP or DREQ of a program's last calls before exit.
pub(crate) fn flush_all(limit: Duration) {
    let agents = AGENTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let deadline = Instant::now() + limit;
    for agent in &agents {
        agent.flush(deadline);
    }
    let linger = Instant::now() + RELAY_LINGER;
    for agent in &agents {
        while agent.relayed_processes.load(Ordering::Acquire) > 0 && Instant::now() < linger {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Sleeps until one of `fds` is readable, a wake-up or `timeout_ms`;
/// clears the wake-up.
fn wait(fds: &[RawFd], agent: &Agent, timeout_ms: c_int) {
    let mut fds: Vec<libc::pollfd> = std::iter::once(agent.wake.as_raw_fd())
        .chain(fds.iter().copied())
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `fds.len()` pollfds; EINTR just ends the wait early.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if fds[0].revents & libc::POLLIN != 0 {
        let mut count = [0u8; 8];
        // SAFETY: our non-blocking eventfd and 8 bytes.
        unsafe { libc::read(agent.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
    }
}

/// Sorts one completion: a send returns its buffer; a good receive is
/// queued for the engine; a failed one is counted (and its buffer
/// reposted unless the QP is flushing).
fn on_completion(
    agent: &Agent,
    gsi: &Gsi,
    wc: &ibv_wc,
    sender: &mut Sender<*mut ibv_ah>,
    received: &mut Vec<Received>,
    repost: &mut Vec<u32>,
) {
    match WrId::decode(wc.wr_id) {
        WrId::Send(slot) => {
            if wc.status != IBV_WC_SUCCESS {
                bump(&agent.counters.send.send_errors);
                debug(format_args!("CM agent: send failed, status {}", wc.status));
            }
            sender.completed(slot);
        }
        WrId::Recv(n) if wc.status != IBV_WC_SUCCESS => {
            bump(&agent.counters.recv_errors);
            debug(format_args!(
                "CM agent: receive failed, status {}",
                wc.status
            ));
            if wc.status != IBV_WC_WR_FLUSH_ERR {
                repost.push(n);
            }
        }
        WrId::Recv(n) => {
            bump(&agent.counters.received);
            let (grh, mad) = gsi.received(n, wc.byte_len);
            let addresses = (wc.wc_flags & IBV_WC_GRH != 0)
                .then(|| grh::addresses(grh))
                .flatten();
            let Some((source, destination)) = addresses else {
                bump(&agent.counters.bad_grh);
                debug(format_args!(
                    "CM agent: receive without an IP header, dropped"
                ));
                repost.push(n);
                return;
            };
            if crate::base::config::debug() {
                eprintln!(
                    "librdmacm: CM agent {}: received {} from {} qpn {} to {}",
                    agent.device.name,
                    trace::describe(mad),
                    source.to_ip(),
                    wc.src_qp,
                    destination.to_ip()
                );
            }
            received.push(Received {
                buffer: n,
                byte_len: wc.byte_len,
                peer: PeerAddr {
                    gid: source,
                    qpn: wc.src_qp,
                    pkey: DEFAULT_PKEY,
                },
                local_gid: destination,
            });
        }
    }
}

/// Hands one event to the connection layer; a panic there is counted,
/// not fatal to the agent.
fn deliver(agent: &'static Agent, ev: CmEvent) {
    let Some(handler) = HANDLER.get() else {
        debug(format_args!("CM agent: no event handler, dropped {ev:?}"));
        return;
    };
    if catch_unwind(AssertUnwindSafe(|| handler(agent, ev))).is_err() {
        bump(&agent.counters.handler_panics);
        debug(format_args!("CM agent: the event handler panicked"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_timeout_rounds_up_to_the_deadline() {
        assert_eq!(poll_timeout_ms(1_000, None), -1);
        assert_eq!(poll_timeout_ms(1_000, Some(1_000)), 0);
        assert_eq!(poll_timeout_ms(1_000, Some(500)), 0);
        assert_eq!(poll_timeout_ms(0, Some(1)), 1);
        assert_eq!(poll_timeout_ms(0, Some(1_000_000)), 1);
        assert_eq!(poll_timeout_ms(0, Some(1_000_001)), 2);
        assert_eq!(poll_timeout_ms(0, Some(u64::MAX)), c_int::MAX);
    }

    #[test]
    fn clock_is_monotonic_nanoseconds() {
        let a = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = now_ns();
        assert!(b - a >= 2_000_000, "{a} -> {b}");
    }
}
