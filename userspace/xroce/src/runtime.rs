//! Drives a verbs [`Device`]'s sans-I/O engine from a packet-I/O backend on
//! a thread of its own: datagrams in -> `handle_datagram`, due timers ->
//! `handle_timeout`, `poll_transmit` -> datagrams out. Applications post
//! work and poll CQs from their own threads meanwhile.
//!
//! The engine lock is taken only while there is work: the thread waits for
//! frames without it, so posting a WR never waits behind an idle receive.
//!
//! Datagrams addressed to the device's own MAC never reach the backend:
//! they go straight back into the engine (loopback between two QPs of one
//! device, as rxe does).
//!
//! When idle, the thread sleeps in ppoll(2) on the backend's descriptors
//! ([`PacketIo::poll_fds`]) and a [`Doorbell`] (an eventfd), with nanosecond
//! precision up to the engine's next timer. The runtime installs a hook
//! that rings it on the device ([`Device::set_doorbell`]), called after
//! every post_send and QP modify, so a WR posted while the thread sleeps
//! goes out at once instead of after the wait. For a while after its last
//! frame it keeps polling instead ([`RuntimeConfig::spin_after_activity`]),
//! yielding between empty rounds, or, while data streams in, napping on
//! the doorbell alone so that frames arrive in batches
//! ([`RuntimeConfig::stream_nap`]).

pub mod shards;

use std::{
    os::fd::{AsFd, BorrowedFd},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, OnceLock,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    poll::{ppoll, PollFd, PollFlags},
    sys::{
        eventfd::{EfdFlags, EventFd},
        time::TimeSpec,
    },
};

use xroce_common::qpn_block;
use xroce_wire::bth::BthHeader;

use crate::{
    io::{IoError, IoStats, PacketIo},
    verbs::{Device, Progress},
};

/// Where the engine's clock starts.
struct Epoch {
    at: Instant,
    /// CLOCK_MONOTONIC at `at` (read right after it): `Instant` is
    /// CLOCK_MONOTONIC on Linux, so this turns the kernel's timestamps
    /// (bpf_ktime_get_ns) into [`now_ns`]'s.
    monotonic_ns: u64,
}

fn epoch() -> &'static Epoch {
    static EPOCH: OnceLock<Epoch> = OnceLock::new();
    EPOCH.get_or_init(|| {
        let at = Instant::now();
        Epoch {
            at,
            monotonic_ns: monotonic_ns(),
        }
    })
}

/// CLOCK_MONOTONIC in ns (a vDSO call, no syscall).
fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `clock` in ns (a vDSO call for the clocks used here).
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives
    // across the call; CLOCK_MONOTONIC and CLOCK_REALTIME always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The kernel's socket receive timestamps (SO_TIMESTAMPNS: CLOCK_REALTIME)
/// on [`now_ns`]'s clock, for a batch: the two clocks read once when made,
/// then a subtraction per timestamp. A step of the wall clock between a
/// datagram's arrival and the batch shows as a wrong arrival time for that
/// batch only (`None` if it lands outside [`MonotonicToEngine`]'s bounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RealtimeToEngine {
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC.
    offset: u64,
    mono: MonotonicToEngine,
}

impl RealtimeToEngine {
    /// For timestamps taken up to now.
    pub fn now() -> Self {
        let mono = MonotonicToEngine::now();
        let offset = clock_ns(libc::CLOCK_REALTIME).saturating_sub(monotonic_ns());
        Self { offset, mono }
    }

    /// `realtime_ns` on the engine's clock, if it is a plausible timestamp.
    #[inline]
    pub fn engine_ns(&self, realtime_ns: u64) -> Option<u64> {
        self.mono.engine_ns(realtime_ns.checked_sub(self.offset)?)
    }
}

/// Nanoseconds on the process-wide monotonic clock the engine runs on.
pub fn now_ns() -> u64 {
    epoch().at.elapsed().as_nanos() as u64
}

/// A CLOCK_MONOTONIC time (the XDP program's bpf_ktime_get_ns) on
/// [`now_ns`]'s clock; `None` for one before the clock's start or more
/// than [`MonotonicToEngine::FUTURE_SLACK_NS`] after now (not a timestamp).
pub fn engine_ns_of_monotonic(mono_ns: u64) -> Option<u64> {
    MonotonicToEngine::now().engine_ns(mono_ns)
}

/// [`engine_ns_of_monotonic`] for a batch of timestamps: one clock read
/// when made, then a compare and a subtraction per timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MonotonicToEngine {
    /// CLOCK_MONOTONIC at the engine clock's start.
    start: u64,
    /// The latest CLOCK_MONOTONIC time taken for a timestamp.
    latest: u64,
}

impl MonotonicToEngine {
    /// How far past now a timestamp may be (a guard against garbage: a
    /// real one is never later than now).
    pub const FUTURE_SLACK_NS: u64 = 1_000_000_000;

    /// For timestamps taken up to now.
    pub fn now() -> Self {
        Self::new(epoch().monotonic_ns, now_ns())
    }

    /// For timestamps up to `now` on an engine clock that started at
    /// CLOCK_MONOTONIC `start`.
    fn new(start: u64, now: u64) -> Self {
        Self {
            start,
            latest: start
                .saturating_add(now)
                .saturating_add(Self::FUTURE_SLACK_NS),
        }
    }

    /// `mono_ns` on the engine's clock, or `None` if it is before the
    /// clock's start or too far in the future.
    #[inline]
    pub fn engine_ns(&self, mono_ns: u64) -> Option<u64> {
        if mono_ns > self.latest {
            return None;
        }
        mono_ns.checked_sub(self.start)
    }
}

/// [`RuntimeConfig::spin_after_activity`]'s default, in microseconds
/// (`XROCE_SPIN_US` and `--spin-us` start from it).
pub const SPIN_AFTER_ACTIVITY_US: u64 = 300;

#[derive(Clone, Copy, Debug)]
pub struct RuntimeConfig {
    /// Spin on the backend instead of sleeping in it: lowest latency, one
    /// core fully busy.
    pub busy_poll: bool,
    /// Longest wait for frames when idle on a backend the thread cannot
    /// sleep on (no descriptors: the in-memory channel, a shard's inbox):
    /// it bounds how late a freshly posted WR is noticed there.
    pub max_wait: Duration,
    /// Longest sleep when idle on a backend with descriptors: the
    /// doorbell, the sockets and the engine's next timer wake it before
    /// that, so this only bounds how stale the published I/O counters get.
    /// Short sleeps cost an idle device CPU (1 ms: 2.5 % of a core).
    pub max_sleep: Duration,
    /// Keep polling without sleeping for this long after the last frame in
    /// or out: waking from a sleep costs microseconds. Not longer: a thread
    /// that spins (with sched_yield) loses the kernel's wake-up preference,
    /// so next to an application spinning on its own memory (ib_write_lat)
    /// it waits for a whole time slice. Measured on 2 busy cores:
    /// ib_write_lat typical 1,980 us with 2 ms, 22 us with 300 us;
    /// ib_send_lat 32 -> 20 us; ib_write_bw 64 KiB 1.9 -> 3.3 Gb/s.
    pub spin_after_activity: Duration,
    /// Let an application thread whose CQ poll finds nothing run a round
    /// of this thread's work itself ([`Device::set_progress`]), when frames
    /// or posted work wait and this thread is not in a round. Only on a
    /// backend that tells without a syscall whether frames wait
    /// ([`PacketIo::rx_waiting`]: AF_XDP). Two programs spinning on their
    /// CQs and two I/O threads on 2 cores (drop-in, AF_XDP veth, medians
    /// of 5 runs, off -> on): ib_send_lat 8 B typical 14.5 -> 10.3 us, 99th
    /// percentile 30.4 -> 26.1 us; ib_write_lat 8 B average 32.8 -> 18.0
    /// us; UCX tag_lat 8 B 16.8 -> 14.7 us (3 runs); bandwidth unchanged.
    ///
    /// While a program polls this way (its last empty poll within
    /// [`APP_DRIVES_NS`]), the I/O thread naps ([`NAP`]) instead of
    /// spinning beside it. UCX tag_lat 8 B, 2 cores (`cargo xtask bench`,
    /// medians of 3, the same hour): 13.8 -> 10.1 us; tag_bw 1 MiB, a
    /// WRITE stream and the lab's 8-rank allreduce unchanged within noise.
    /// (A drop-in poll that kept its core for 50 us before yielding gave
    /// 8.8 us, but cost the 8-rank allreduce on 2 cores about 10 %.)
    pub app_progress: bool,
    /// While data streams in (the last round that received took at least
    /// [`STREAM_BYTES`]), an empty round in the spin window sleeps this
    /// long instead of yielding, woken early only by the doorbell (a post):
    /// the frames gather in the ring meanwhile and the next round takes
    /// them in one batch, and no wake-up is asked of the sender's CPU
    /// (which runs the receive path of a veth). A yield loop keeps the
    /// core busy and reads the clock per turn. Zero: yield as before. Not on a backend whose kernel
    /// already coalesces what arrives ([`PacketIo::coalesces_rx`]), nor
    /// with `busy_poll`. A ping-pong of small messages never naps, so its
    /// latency is untouched. The timer keeps the thread's default slack
    /// (a nap may last 50 us longer): with a slack of 1 us the thread's
    /// other sleeps woke on time too, and ib_send_lat 2 B's typical rose
    /// from 13 to 18 us. See [`STREAM_NAP_US`].
    pub stream_nap: Duration,
}

/// [`RuntimeConfig::stream_nap`]'s default, in microseconds. `xroce bench`
/// 64 KiB on a 2-core veth pair (AF_XDP, MTU 3500), CPU of both ends, 3
/// alternating rounds (yield -> 20 us): WRITE 3.0-3.4 -> 2.0-2.2 CPU s/GB
/// at 4.8-5.3 -> 5.3-5.9 Gb/s, READ 2.4 -> 1.75-1.9 at the same 6.4 Gb/s,
/// SEND 2.2-2.8 -> 2.0-2.4; the UDP backend without GRO 6.0 -> 4.6-4.9
/// CPU seconds in 3 s at the same 3 Gb/s. With UDP GRO it cost a fifth of
/// the rate for no CPU per byte (hence [`PacketIo::coalesces_rx`]).
pub const STREAM_NAP_US: u64 = 20;

/// Bytes a round must receive for the I/O thread to count the traffic as
/// a stream ([`RuntimeConfig::stream_nap`]): a full frame at path MTU
/// 1024 or more. A ping-pong of small messages stays below it (its
/// rounds take a request and an ACK).
pub const STREAM_BYTES: usize = 1024;

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            busy_poll: false,
            max_wait: Duration::from_millis(1),
            max_sleep: Duration::from_millis(100),
            spin_after_activity: Duration::from_micros(SPIN_AFTER_ACTIVITY_US),
            app_progress: true,
            stream_nap: Duration::from_micros(STREAM_NAP_US),
        }
    }
}

/// Wakes the I/O thread from its idle wait: ring it after posting work
/// the engine must send (cheap to clone; one eventfd).
#[derive(Clone, Debug)]
pub struct Doorbell {
    fd: Option<Arc<EventFd>>,
    /// Set while the thread sleeps (or is about to): only then does
    /// [`ring`](Self::ring) make a syscall. The thread looks at the post
    /// rings after setting it, so a WR posted just before is not missed.
    asleep: Arc<AtomicBool>,
}

impl Doorbell {
    fn new() -> Self {
        let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC);
        Self {
            // Without an eventfd the thread still wakes every `max_wait`.
            fd: fd.ok().map(Arc::new),
            asleep: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Wakes the I/O thread if it sleeps (then one write(2); never blocks).
    /// Cheap when it is awake: one atomic load.
    pub fn ring(&self) {
        if !self.asleep.load(Ordering::SeqCst) {
            return;
        }
        self.ring_always();
    }

    fn ring_always(&self) {
        if let Some(fd) = &self.fd {
            // A full counter (EAGAIN) means it is rung already.
            let _ = fd.write(1);
        }
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Resets the eventfd (after a wait it woke).
    fn drain(&self) {
        if let Some(fd) = &self.fd {
            // EAGAIN if unrung.
            let _ = fd.read();
        }
    }

    /// Sleeps in [`sleep`] on `pollfds` (this doorbell last) for at most
    /// `wait`, marked asleep so that a post rings it. Returns whether it
    /// was rung (then drained), or found work posted before.
    fn doze(
        &self,
        device: &Device,
        pollfds: &mut [PollFd],
        wait: Duration,
    ) -> Result<bool, IoError> {
        self.asleep.store(true, Ordering::SeqCst);
        // A WR posted while this thread was still awake rang no bell:
        // look at the post rings after saying we sleep (SeqCst on both
        // sides), so it is never left until `wait` ends.
        let rung = device.has_posted_work() || sleep(pollfds, wait)?;
        self.asleep.store(false, Ordering::SeqCst);
        if rung {
            self.drain();
        }
        Ok(rung)
    }
}

/// The I/O thread of one device. Stop it with [`Runtime::stop`] (also on drop).
pub struct Runtime {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<IoStats, IoError>>>,
    backend: &'static str,
    bell: Doorbell,
    /// To take the doorbell off the device again.
    device: Device,
}

impl Runtime {
    pub fn start(device: Device, mut io: Box<dyn PacketIo>, config: RuntimeConfig) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let backend = io.name();
        let flag = stop.clone();
        let bell = Doorbell::new();
        let app_progress = config.app_progress && io.rx_waiting().is_some();
        let cell = Arc::new(IoCell::new(io, bell.clone()));
        let hook = bell.clone();
        device.set_doorbell(Some(Arc::new(move || hook.ring())));
        if app_progress {
            device.set_progress(Some(IoCell::progress_hook(cell.clone())));
        }
        let handle = device.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xroce-io-{backend}"))
            .spawn(move || {
                let result = run(&device, &cell, &flag, config);
                let stats = cell.io.lock().unwrap_or_else(|e| e.into_inner()).stats();
                result.map(|()| stats)
            })
            .expect("spawn the I/O thread");
        Self {
            stop,
            thread: Some(thread),
            backend,
            bell,
            device: handle,
        }
    }

    /// The doorbell of this runtime's thread (the device rings it after
    /// every post_send; ring it for work it does not see).
    pub fn doorbell(&self) -> Doorbell {
        self.bell.clone()
    }

    /// Name of the backend the runtime drives ("afxdp", "udp", ...).
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Stops the thread; returns the backend's final counters, or the I/O
    /// error that stopped it earlier.
    pub fn stop(mut self) -> Result<IoStats, IoError> {
        self.shutdown()
    }

    /// Stops the thread and closes the backend now (before the owner
    /// releases what the backend used).
    pub fn halt(&mut self) {
        let _ = self.shutdown();
    }

    /// True while the I/O thread runs (false after an I/O error).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    fn shutdown(&mut self) -> Result<IoStats, IoError> {
        self.stop.store(true, Ordering::Release);
        if self.thread.is_some() {
            self.device.set_doorbell(None);
            self.device.set_progress(None);
        }
        self.bell.ring_always();
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| Err(IoError::ThreadPanicked)),
            None => Ok(IoStats::default()),
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// What the I/O thread shares with the application threads that drive
/// the device from an empty poll ([`Device::set_progress`]): the backend,
/// one round at a time.
struct IoCell {
    io: Mutex<Box<dyn PacketIo>>,
    bell: Doorbell,
    /// When the I/O thread's sleep ends (ns on [`now_ns`]); 0 while it is
    /// awake. Written with `io` held, so a round is either seen by the
    /// thread's planning or sees its plan.
    wakes_at: AtomicU64,
    /// When an application thread last polled an empty CQ of this device
    /// (ns on [`now_ns`]; 0: never): while it keeps polling, it runs the
    /// rounds and the I/O thread naps (see [`APP_DRIVES_NS`]).
    app_polled_at: AtomicU64,
    /// An application's round left frames to send (the TX ring was full):
    /// the next empty poll runs a round for them even with nothing arrived
    /// or posted.
    sends_left: AtomicBool,
}

/// An application thread that polled an empty CQ this recently drives the
/// device itself: the I/O thread naps instead of spinning beside it. Two
/// programs spinning on their CQs and two spinning I/O threads on 2 cores
/// hand each frame over a context switch; with the I/O threads napping,
/// each program has a core and moves its frames in its own polls.
const APP_DRIVES_NS: u64 = 20_000;
/// Whether a program's last empty poll, at `polled_at` (0: none yet), is
/// within [`APP_DRIVES_NS`] of `now`.
fn polls_recent(polled_at: u64, now: u64) -> bool {
    polled_at != 0 && now.saturating_sub(polled_at) < APP_DRIVES_NS
}

/// The I/O thread's nap while an application drives: the longest a frame
/// waits when that application stops polling (it then takes over again).
const NAP: Duration = Duration::from_micros(50);

impl IoCell {
    fn new(io: Box<dyn PacketIo>, bell: Doorbell) -> Self {
        Self {
            io: Mutex::new(io),
            bell,
            wakes_at: AtomicU64::new(0),
            app_polled_at: AtomicU64::new(0),
            sends_left: AtomicBool::new(false),
        }
    }

    /// The device's progress hook: rounds in the application's threads.
    fn progress_hook(cell: Arc<Self>) -> crate::verbs::ProgressHook {
        Arc::new(move |d: &Device, why| match why {
            Progress::Poll => cell.app_round(d),
            Progress::Flush => cell.flush_deferred(d),
        })
    }

    /// Whether an application thread polled an empty CQ within
    /// [`APP_DRIVES_NS`].
    fn app_drives(&self) -> bool {
        polls_recent(self.app_polled_at.load(Ordering::Relaxed), now_ns())
    }

    /// The backend for the I/O thread, or `None` (after a yield) while a
    /// program's thread is in a round: that round does this thread's work,
    /// and waiting on the mutex would cost a futex sleep and wake-up per
    /// round.
    fn io_unless_busy(&self) -> Option<std::sync::MutexGuard<'_, Box<dyn PacketIo>>> {
        match self.io.try_lock() {
            Ok(io) => Some(io),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::yield_now();
                None
            }
        }
    }

    /// Runs a round for what an application's round deferred, if any,
    /// waiting for the backend while the I/O thread has it (its round may
    /// have sent them already).
    fn flush_deferred(&self, device: &Device) -> bool {
        if !self.sends_left.load(Ordering::Relaxed) {
            return false;
        }
        let io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        if !(self.sends_left.swap(false, Ordering::Relaxed) && device.lock().wants_to_transmit()) {
            return false;
        }
        self.program_round(device, io, false)
    }

    /// One round in an application thread whose poll found its CQ empty,
    /// if frames or posted work wait and the I/O thread is not in a round
    /// (then it is doing this work already). Returns whether the round
    /// moved a frame. Rings the I/O thread when the round armed a timer
    /// that falls before the end of its sleep: the engine's timers are
    /// that thread's, and a program may stop polling at any time.
    fn app_round(&self, device: &Device) -> bool {
        self.app_polled_at.store(now_ns(), Ordering::Relaxed);
        let Ok(mut io) = self.io.try_lock() else {
            // The I/O thread is in a round: let it have the core, should
            // it share this one (a program that keeps polling would hold
            // it off, lock held, for a whole time slice).
            std::thread::yield_now();
            return false;
        };
        let sends_left = self.sends_left.swap(false, Ordering::Relaxed);
        // An empty round would only cost the program the engine's lock.
        // Frames left by an earlier round may have gone from the I/O
        // thread meanwhile: the engine is asked only when nothing else
        // calls for a round.
        if io.rx_waiting() != Some(true)
            && !device.has_posted_work()
            && !(sends_left && device.lock().wants_to_transmit())
        {
            return false;
        }
        // A round that follows a deferred one sends whatever it brings
        // in: a program draining a stream would otherwise hold its ACKs
        // back for as long as frames keep arriving.
        self.program_round(device, io, !sends_left)
    }

    /// A round in a program's thread, on the backend it holds; leaves
    /// what it could not send, or deferred, to the next one and rings the
    /// I/O thread when that must not wait for the end of its sleep.
    fn program_round(
        &self,
        device: &Device,
        mut io: std::sync::MutexGuard<'_, Box<dyn PacketIo>>,
        may_defer: bool,
    ) -> bool {
        let caller = Caller::Application { may_defer };
        match round(device, io.as_mut(), Duration::ZERO, caller) {
            Ok(r) => {
                if r.sends_left() || r.deferred {
                    self.sends_left.store(true, Ordering::Relaxed);
                }
                let wakes_at = self.wakes_at.load(Ordering::SeqCst);
                if wakes_at != 0 && r.moved {
                    // The sleeping thread does not flush what this round
                    // batched (copies for a capture) before it wakes.
                    io.before_sleep();
                }
                drop(io);
                // Deferred sends wait for the program's next poll, or a
                // napping I/O thread's next round; a thread in a longer
                // sleep is woken for them.
                let due = if r.deferred {
                    Some(now_ns().saturating_add(NAP.as_nanos() as u64))
                } else {
                    r.next_timer
                };
                if due.is_some_and(|t| t < wakes_at) {
                    // A napping thread is not `asleep` for posts.
                    self.bell.ring_always();
                }
                r.moved
            }
            // The I/O thread meets the error on its next round and stops.
            Err(_) => {
                drop(io);
                self.bell.ring();
                false
            }
        }
    }
}

/// What one round did.
struct Round {
    /// A frame came in, went out or looped back to this device.
    moved: bool,
    /// Bytes of UDP payload that came in (BTH to ICRC).
    bytes_in: usize,
    /// The engine's next timer after the round (0: it still has frames to
    /// send that the backend had no room for).
    next_timer: Option<u64>,
    /// The round delivered completions and left the engine's frames for
    /// the program's next poll (see [`Caller::Application`]).
    deferred: bool,
}

impl Round {
    /// The backend had no room for all the engine had to send.
    fn sends_left(&self) -> bool {
        self.next_timer == Some(0)
    }
}

fn run(
    device: &Device,
    cell: &IoCell,
    stop: &AtomicBool,
    config: RuntimeConfig,
) -> Result<(), IoError> {
    let bell = &cell.bell;
    let backend_fds = cell.io.lock().unwrap_or_else(|e| e.into_inner()).poll_fds();
    // The backend's descriptors and the doorbell, for the idle wait.
    let mut pollfds: Vec<PollFd> = match bell.fd() {
        Some(b) if !backend_fds.is_empty() => backend_fds
            .into_iter()
            // SAFETY: the backend keeps its descriptors open while it
            // lives, and it outlives this loop (the cell owns it).
            .map(|fd| unsafe { BorrowedFd::borrow_raw(fd) })
            .chain([b])
            .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
            .collect(),
        _ => Vec::new(),
    };
    let mut last_activity = Instant::now();
    // The backend's counters go to the device (for `xroce stats`) this often.
    const IO_STATS_EVERY_NS: u64 = 500_000_000;
    let mut io_stats_at = 0u64;
    // The last round moved no frame.
    let mut idle_round = true;
    // The last round that received took a stream's worth (see
    // `stream_nap`), and this backend's rounds gain by napping.
    let mut streaming = false;
    let stream_naps = !config.busy_poll
        && !config.stream_nap.is_zero()
        && !cell
            .io
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .coalesces_rx();
    while !stop.load(Ordering::Acquire) {
        let mut wait = Duration::ZERO;
        let napping = !config.busy_poll && cell.app_drives();
        // The doorbell is the last descriptor (none without descriptors).
        if let Some(bell_fd) = pollfds.last_mut().filter(|_| napping) {
            let Some(io) = cell.io_unless_busy() else {
                continue;
            };
            let nap = idle_wait(device, NAP);
            if !nap.is_zero() {
                // Posts do not ring a napping thread (the program's next
                // poll sends them); its rounds do when they leave work
                // before the nap's end.
                cell.wakes_at.store(
                    now_ns().saturating_add(nap.as_nanos() as u64),
                    Ordering::SeqCst,
                );
                drop(io);
                let rung = sleep(std::slice::from_mut(bell_fd), nap);
                cell.wakes_at.store(0, Ordering::SeqCst);
                if rung? {
                    bell.drain();
                }
                continue;
            }
        } else if config.busy_poll || last_activity.elapsed() < config.spin_after_activity {
            // Spinning: let the application threads have the core too, but
            // only after a round that found nothing: a sched_yield(2)
            // after every busy round costs a syscall and often a context
            // switch per batch while frames stream.
            if idle_round {
                if streaming && stream_naps {
                    // On the doorbell alone, the backend's descriptors
                    // left out: an arriving frame asks no wake-up of the
                    // sender's CPU, a post still wakes the thread.
                    match pollfds.last_mut() {
                        Some(bell_fd) => {
                            bell.doze(device, std::slice::from_mut(bell_fd), config.stream_nap)?;
                        }
                        None => std::thread::sleep(config.stream_nap),
                    }
                } else {
                    std::thread::yield_now();
                }
            }
        } else {
            let longest = if pollfds.is_empty() {
                config.max_wait
            } else {
                config.max_sleep
            };
            // Planned with the backend held: an application's round is
            // wholly before (its timers are in the plan) or after (it
            // sees `wakes_at`).
            let Some(mut io) = cell.io_unless_busy() else {
                continue;
            };
            wait = idle_wait(device, longest);
            if !wait.is_zero() && !pollfds.is_empty() {
                io.before_sleep();
                cell.wakes_at.store(
                    now_ns().saturating_add(wait.as_nanos() as u64),
                    Ordering::SeqCst,
                );
                drop(io);
                let rung = bell.doze(device, &mut pollfds, wait);
                cell.wakes_at.store(0, Ordering::SeqCst);
                if rung? {
                    // Rung: the application posted work; stay awake a while.
                    last_activity = Instant::now();
                }
                wait = Duration::ZERO;
            }
        }
        let Some(mut io) = cell.io_unless_busy() else {
            continue;
        };
        let r = round(device, io.as_mut(), wait, Caller::IoThread)?;
        let now = now_ns();
        if now.saturating_sub(io_stats_at) >= IO_STATS_EVERY_NS {
            device.set_io_stats(io.stats());
            io_stats_at = now;
        }
        drop(io);
        idle_round = !r.moved;
        if r.bytes_in > 0 {
            streaming = r.bytes_in >= STREAM_BYTES;
        }
        if !idle_round {
            last_activity = Instant::now();
        }
    }
    let mut io = cell.io.lock().unwrap_or_else(|e| e.into_inner());
    if cell.sends_left.swap(false, Ordering::Relaxed) {
        // What a program's poll left to send goes before the thread ends.
        round(device, io.as_mut(), Duration::ZERO, Caller::IoThread)?;
    }
    device.set_io_stats(io.stats());
    Ok(())
}

/// Who runs a [`round`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// The I/O thread: when the backend's TX ring is full, it waits a
    /// little for room (ACKs free it) before going back to receiving.
    IoThread,
    /// A program's thread from an empty CQ poll: never waits for TX room
    /// (that would hold the program in its poll); what is left goes in its
    /// next empty poll, or to the I/O thread, which the round's
    /// `next_timer` of 0 brings.
    ///
    /// `may_defer`: when the round delivered completions, it returns
    /// before sending, so the program polls them without first paying for
    /// a kick (on AF_XDP over a veth, the kernel's TX path and the peer's
    /// XDP receive). What the engine had to send (ACKs, mostly) goes with
    /// what the program posts in answer, in one kick, from its next poll.
    /// A ping-pong's critical path loses one system call per message.
    Application { may_defer: bool },
}

/// One round of the transport's I/O: what arrived within `wait` into the
/// engine, due timers, completions to their CQs, then everything the
/// engine has to send.
fn round(
    device: &Device,
    io: &mut dyn PacketIo,
    wait: Duration,
    caller: Caller,
) -> Result<Round, IoError> {
    // Receive without the lock; take it once the first frame is here.
    let mut guard = None;
    // One clock read per batch, not per frame: the frames of a batch
    // waited on the ring together.
    let mut arrived = None;
    let mut bytes_in = 0;
    let received = io.recv_datagrams(wait, &mut |r| {
        let t = *arrived.get_or_insert_with(now_ns);
        let engine = guard.get_or_insert_with(|| device.lock());
        match r {
            Ok(d) => {
                bytes_in += d.udp_payload.len();
                engine.handle_datagram(&d, t)
            }
            Err(rejected) => engine.count_rejected(&rejected),
        }
    })?;
    let mut engine = guard.unwrap_or_else(|| device.lock());
    // A receive ring filling up reaches the senders as CE marks (CNPs).
    engine.set_rx_pressure(io.rx_pressure());
    let now = now_ns();
    if engine.poll_timeout().is_some_and(|t| t <= now) {
        engine.handle_timeout(now);
    }
    // Completions of what arrived are for the application now, not
    // after the sends below.
    let delivered = engine.deliver_completions();
    if delivered
        && caller == (Caller::Application { may_defer: true })
        && engine.wants_to_transmit()
    {
        return Ok(Round {
            moved: true,
            bytes_in,
            next_timer: engine.poll_timeout(),
            deferred: true,
        });
    }
    // Send all the engine has now. When the backend's TX ring is full,
    // give it a moment, then go back to receiving (ACKs free the ring).
    let mut sent = 0;
    let own_mac = engine.config().mac;
    let own_block = engine.config().qpn_block;
    let mut looped = 0;
    let mut next_timer = None;
    let mut engine = Some(engine);
    // Payloads the backend gathers from MRs are read until it returns.
    let _sending = device.sending();
    for _ in 0..4 {
        let mut engine_empty = false;
        sent += io.transmit_gathered(&mut |buf, gather| loop {
            let e = engine.as_mut()?;
            let t = e.poll_transmit_gather(now, buf, gather);
            if t.is_none() {
                engine_empty = true;
                next_timer = e.poll_timeout();
                // Unlock before the backend hands the frames to the
                // kernel: on AF_XDP that kick runs the whole kernel TX
                // path (on a veth the peer's receive too), and an
                // application posting work should not wait for it.
                // Completions reach their CQs now, not after it.
                engine = None;
                return None;
            }
            // Loopback (as rxe): a datagram to our own MAC is for a QP
            // of this device; the link would never bring it back. One
            // for another process's QPN block goes to the backend,
            // which hands it to that process.
            match t {
                Some(t)
                    if t.dst_mac == own_mac && dest_block(t.payload(buf)) == Some(own_block) =>
                {
                    gather.copy_into(buf);
                    e.handle_datagram(&t.looped_back(buf), now);
                    looped += 1;
                }
                t => return t,
            }
        })?;
        if engine_empty || caller != Caller::IoThread {
            break;
        }
        io.wait_writable(Duration::from_micros(50))?;
    }
    if engine.is_some() {
        // The backend took not all the engine had: work is due now.
        next_timer = Some(0);
    }
    drop(engine);
    Ok(Round {
        moved: received + sent + looped > 0,
        bytes_in,
        next_timer,
        deferred: false,
    })
}

/// The QPN block of the destination QP of a datagram (from its BTH).
fn dest_block(udp_payload: &[u8]) -> Option<u32> {
    let bth = BthHeader::new_checked(udp_payload).ok()?;
    Some(qpn_block::of_qpn(bth.dest_qp()))
}

/// ppoll(2) on the backend's descriptors and the doorbell (last) for at
/// most `wait`, with nanosecond precision. Returns whether the doorbell rang.
fn sleep(pollfds: &mut [PollFd], wait: Duration) -> Result<bool, IoError> {
    // The kernel rewrites every revents, so no reset is needed.
    match ppoll(pollfds, Some(TimeSpec::from_duration(wait)), None) {
        Ok(_) => {}
        Err(Errno::EINTR) => return Ok(false),
        Err(e) => return Err(std::io::Error::from(e).into()),
    }
    Ok(pollfds
        .last()
        .and_then(PollFd::revents)
        .is_some_and(|r| r.contains(PollFlags::POLLIN)))
}

/// How long to wait in the backend when there is nothing to do: until the
/// engine's next timer, at most `longest`; none while the engine has
/// something to send (locking it moved in what was posted meanwhile: a
/// post that came after this round's transmit, when this thread was still
/// awake and so rang no bell, must not wait out the sleep).
fn idle_wait(device: &Device, longest: Duration) -> Duration {
    let engine = device.lock();
    if engine.wants_to_transmit() {
        return Duration::ZERO;
    }
    match engine.poll_timeout() {
        Some(t) => Duration::from_nanos(t.saturating_sub(now_ns())).min(longest),
        None => longest,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{atomic::AtomicUsize, Mutex};

    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use super::*;
    use crate::{
        engine::EngineConfig,
        verbs::{AccessFlags, QpAttr, QpInitAttr, RemoteQp, SendWr, WrOpcode},
    };

    /// The conversion subtracts the clock's start and keeps what lies
    /// between it and a second past now.
    #[test]
    fn monotonic_times_convert_with_a_guard() {
        const S: u64 = 1_000_000_000;
        let c = MonotonicToEngine::new(50 * S, 7 * S);
        assert_eq!(c.engine_ns(50 * S), Some(0));
        assert_eq!(c.engine_ns(53 * S + 5), Some(3 * S + 5));
        assert_eq!(c.engine_ns(57 * S), Some(7 * S), "now");
        assert_eq!(c.engine_ns(58 * S), Some(8 * S), "just within the slack");
        assert_eq!(c.engine_ns(58 * S + 1), None, "more than 1 s ahead");
        assert_eq!(c.engine_ns(50 * S - 1), None, "before the start");
        assert_eq!(c.engine_ns(0), None);
        assert_eq!(c.engine_ns(u64::MAX), None);
        // No overflow near the top of the range.
        let top = MonotonicToEngine::new(u64::MAX - S, 2 * S);
        assert_eq!(top.engine_ns(u64::MAX), Some(S));
    }

    /// Against the real clocks: a CLOCK_MONOTONIC reading taken now is
    /// now on the engine's clock (within the two readings).
    #[test]
    fn monotonic_now_is_engine_now() {
        let before = now_ns();
        let mono = monotonic_ns();
        let after = now_ns();
        let t = engine_ns_of_monotonic(mono).expect("now converts");
        // Instant and clock_gettime read the same clock: the epoch's two
        // readings differ by far less than a millisecond.
        assert!(
            t + 1_000_000 >= before && t <= after + 1_000_000,
            "{before} {t} {after}"
        );
        assert_eq!(engine_ns_of_monotonic(epoch().monotonic_ns - 1), None);
        assert_eq!(engine_ns_of_monotonic(mono + 3_000_000_000), None);
        assert_eq!(engine_ns_of_monotonic(0), None);
    }

    /// The idle thread does not sleep over a WR posted while it was still
    /// awake (so no bell rang): the lock idle_wait takes moves it into the
    /// engine, which then wants to transmit. Without work it sleeps until
    /// the engine's next timer.
    #[test]
    fn no_sleep_while_a_post_waits() {
        use crate::verbs::sim::{connect_pair, sim_pair, LinkConfig, PairParams};
        let sim = sim_pair(LinkConfig::default(), 9);
        let (a, b) = connect_pair(&sim, &PairParams::default());
        // A doorbell that does nothing: the post stays in the QP's ring.
        sim.a.set_doorbell(Some(Arc::new(|| {})));
        let long = Duration::from_secs(5);
        let mut buf = vec![0u8; 9216];
        // Connecting woke the QP: once asked, it has nothing to send.
        while sim.a.poll_transmit_frame(now_ns(), &mut buf).is_some() {}
        assert_eq!(idle_wait(&sim.a, long), long, "nothing to do");
        let wr = SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(0, 8)],
        );
        a.qp.post_send(&wr).unwrap();
        assert!(sim.a.has_posted_work());
        assert_eq!(idle_wait(&sim.a, long), Duration::ZERO, "a post waits");
        let now = now_ns();
        assert!(sim.a.poll_transmit_frame(now, &mut buf).is_some());
        while sim.a.poll_transmit_frame(now, &mut buf).is_some() {}
        // Sent: the retransmission timer is all that is left.
        let wait = idle_wait(&sim.a, long);
        assert!(wait > Duration::ZERO && wait < long, "{wait:?}");
    }

    /// A runtime that, idle, sleeps for a minute unless woken.
    fn sleepy(app_progress: bool) -> RuntimeConfig {
        RuntimeConfig {
            busy_poll: false,
            max_wait: Duration::from_secs(60),
            max_sleep: Duration::from_secs(60),
            spin_after_activity: Duration::from_millis(1),
            app_progress,
            stream_nap: Duration::from_micros(STREAM_NAP_US),
        }
    }

    fn wait_asleep(rt: &Runtime) {
        while !rt.bell.asleep.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
    }

    /// A pipe nobody writes: a test backend's poll descriptor that never
    /// wakes the I/O thread.
    fn quiet_pipe() -> [OwnedFd; 2] {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two fresh descriptors we then own.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: as above.
        fds.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
    }

    #[test]
    fn a_wr_posted_while_the_thread_sleeps_goes_out_on_the_doorbell() {
        let io = Handed::new(false);
        let threads = io.threads.clone();
        let device = Device::new(EngineConfig::default());
        let pd = device.alloc_pd();
        let cq = device.create_cq(16).unwrap();
        let qp = device.create_qp(&pd, &QpInitAttr::rc(&cq)).unwrap();
        qp.connect(
            &QpAttr {
                qp_access_flags: AccessFlags::LOCAL_WRITE,
                timeout: 14,
                retry_cnt: 7,
                ..Default::default()
            },
            &RemoteQp {
                qpn: 0x12,
                psn: 0,
                av: Default::default(),
            },
        )
        .unwrap();
        let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let rt = Runtime::start(
            device.clone(),
            Box::new(io),
            // Without the doorbell the WR would wait out the minute.
            sleepy(false),
        );
        wait_asleep(&rt);
        let posted = Instant::now();
        // post_send rings the doorbell the runtime put on the device.
        qp.post_send(&SendWr::new(1, WrOpcode::Send, vec![mr.sge(0, 8)]))
            .unwrap();
        wait_logged(&threads, posted, "the SEND did not go out", |(w, _)| {
            *w == "tx"
        });
        rt.stop().unwrap();
    }

    /// A backend whose frames come only when it is asked for them (its
    /// descriptor is a pipe nobody writes, so a sleeping I/O thread never
    /// wakes for them); it records which threads asked for frames
    /// ("recv"), received ("rx") and sent ("tx").
    struct Handed {
        pipe: [OwnedFd; 2],
        /// Whether it answers `rx_waiting` (as AF_XDP does) or not (UDP).
        knows_rx: bool,
        frames: Frames,
        threads: Arc<Log>,
        /// Frames its TX ring has room for (it logs "wait" when asked to
        /// wait for more).
        tx_room: Arc<AtomicUsize>,
    }

    /// What a [`Handed`] backend did, and in which thread.
    type Log = Mutex<Vec<(&'static str, std::thread::ThreadId)>>;

    /// Frames a [`Handed`] backend hands over when asked.
    type Frames = Arc<Mutex<std::collections::VecDeque<Vec<u8>>>>;

    /// A simulated pair (links and keys from `seed`) with an RC QP
    /// connected at each end and `recvs` receives of `len` bytes posted
    /// at B (wr_ids from 0).
    fn pair_with_recvs(
        seed: u64,
        recvs: u64,
        len: usize,
    ) -> (
        crate::verbs::sim::Sim,
        crate::verbs::sim::Endpoint,
        crate::verbs::sim::Endpoint,
    ) {
        use crate::verbs::sim::{connect_pair, sim_pair, LinkConfig, PairParams};
        use crate::verbs::RecvWr;
        let sim = sim_pair(LinkConfig::default(), seed);
        let (a, b) = connect_pair(&sim, &PairParams::default());
        for wr_id in 0..recvs {
            b.qp.post_recv(&RecvWr {
                wr_id,
                sg_list: vec![b.mr.sge(0, len)],
            })
            .unwrap();
        }
        (sim, a, b)
    }

    /// Posts an 8-byte SEND on `a` (host A of `sim`) and queues its frames
    /// in `frames`, for B's [`Handed`] backend.
    fn send_from_a(sim: &crate::verbs::sim::Sim, a: &crate::verbs::sim::Endpoint, frames: &Frames) {
        send_len_from_a(sim, a, frames, 8);
    }

    /// [`send_from_a`] of `len` bytes.
    fn send_len_from_a(
        sim: &crate::verbs::sim::Sim,
        a: &crate::verbs::sim::Endpoint,
        frames: &Frames,
        len: usize,
    ) {
        a.qp.post_send(&SendWr::new(1, WrOpcode::Send, vec![a.mr.sge(0, len)]))
            .unwrap();
        let mut buf = vec![0u8; 9216];
        while let Some(n) = sim.a.poll_transmit_frame(now_ns(), &mut buf) {
            frames.lock().unwrap().push_back(buf[..n].to_vec());
        }
    }

    /// Waits until `done`; panics saying `what` if that takes more than
    /// 30 s from `since`.
    fn wait_until(since: Instant, what: &str, mut done: impl FnMut() -> bool) {
        while !done() {
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "{what} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until `log` has an entry `wanted` accepts; panics saying
    /// `what` if none comes within 30 s of `since`.
    fn wait_logged(
        log: &Log,
        since: Instant,
        what: &str,
        wanted: impl Fn(&(&'static str, std::thread::ThreadId)) -> bool,
    ) {
        wait_until(since, what, || log.lock().unwrap().iter().any(&wanted));
    }

    impl Handed {
        /// One with nothing to hand over yet and room to send; callers
        /// keep clones of the queues they drive.
        fn new(knows_rx: bool) -> Self {
            Self {
                pipe: quiet_pipe(),
                knows_rx,
                frames: Arc::default(),
                threads: Arc::default(),
                tx_room: Arc::new(AtomicUsize::new(usize::MAX)),
            }
        }

        fn log(&self, what: &'static str) {
            let me = std::thread::current().id();
            self.threads.lock().unwrap().push((what, me));
        }
    }

    impl PacketIo for Handed {
        fn name(&self) -> &'static str {
            "handed"
        }
        fn rx_waiting(&mut self) -> Option<bool> {
            self.knows_rx
                .then(|| !self.frames.lock().unwrap().is_empty())
        }
        fn max_frame_len(&self) -> usize {
            9216
        }
        fn recv_batch(
            &mut self,
            _: Duration,
            on_frame: &mut dyn FnMut(&[u8]),
        ) -> crate::io::Result<usize> {
            self.log("recv");
            let mut n = 0;
            while let Some(f) = self.frames.lock().unwrap().pop_front() {
                self.log("rx");
                on_frame(&f);
                n += 1;
            }
            Ok(n)
        }
        fn transmit(
            &mut self,
            fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        ) -> crate::io::Result<usize> {
            let mut buf = vec![0u8; 9216];
            let mut n = 0;
            while self.tx_room.load(Ordering::SeqCst) > 0
                && fill(&mut buf).is_some_and(|len| len > 0)
            {
                self.log("tx");
                self.tx_room.fetch_sub(1, Ordering::SeqCst);
                n += 1;
            }
            Ok(n)
        }
        fn wait_writable(&mut self, _: Duration) -> crate::io::Result<bool> {
            self.log("wait");
            Ok(self.tx_room.load(Ordering::SeqCst) > 0)
        }
        fn stats(&mut self) -> IoStats {
            IoStats::default()
        }
        fn poll_fd(&self) -> Option<i32> {
            Some(self.pipe[0].as_raw_fd())
        }
    }

    /// Host B of a simulated pair behind a runtime on a [`Handed`] backend
    /// that sleeps for a minute when idle (nothing wakes it: frames are
    /// only handed over when asked for), with a receive posted (wr_id 9);
    /// returns once its I/O thread sleeps, with A's SEND of 8 bytes
    /// waiting in the backend.
    struct HandedHost {
        rt: Runtime,
        b: crate::verbs::sim::Endpoint,
        threads: Arc<Log>,
        tx_room: Arc<AtomicUsize>,
        _sim: crate::verbs::sim::Sim,
        _a: crate::verbs::sim::Endpoint,
    }

    fn handed_host(knows_rx: bool) -> HandedHost {
        use crate::verbs::sim::{connect_pair, sim_pair, LinkConfig, PairParams};
        use crate::verbs::RecvWr;
        let sim = sim_pair(LinkConfig::default(), 5);
        let (a, b) = connect_pair(&sim, &PairParams::default());
        let io = Handed::new(knows_rx);
        let (frames, threads, tx_room) =
            (io.frames.clone(), io.threads.clone(), io.tx_room.clone());
        b.qp.post_recv(&RecvWr {
            wr_id: 9,
            sg_list: vec![b.mr.sge(0, 64)],
        })
        .unwrap();
        let rt = Runtime::start(sim.b.clone(), Box::new(io), sleepy(true));
        wait_asleep(&rt);
        send_from_a(&sim, &a, &frames);
        assert_eq!(frames.lock().unwrap().len(), 1, "one SEND frame");
        HandedHost {
            rt,
            b,
            threads,
            tx_room,
            _sim: sim,
            _a: a,
        }
    }

    impl HandedHost {
        /// Polls B's CQ until A's SEND completes there.
        fn poll_until_received(&self) -> crate::engine::completion::Wc {
            let mut wc = [crate::engine::completion::Wc::default()];
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.b.cq.poll(&mut wc).unwrap() == 0 {
                assert!(Instant::now() < deadline, "the SEND never completed");
                std::thread::yield_now();
            }
            wc[0]
        }

        /// The ACK the round that received the SEND left goes out: in the
        /// next poll, or from the I/O thread, woken from its long sleep
        /// for it, first.
        fn ack_goes_out(&self) {
            self.poll_empty(1);
            wait_logged(
                &self.threads,
                Instant::now(),
                "the ACK did not go out",
                |(w, _)| *w == "tx",
            );
        }

        /// Polls B's empty CQ `n` times.
        fn poll_empty(&self, n: usize) {
            let mut wc = [crate::engine::completion::Wc::default()];
            for _ in 0..n {
                assert_eq!(self.b.cq.poll(&mut wc).unwrap(), 0);
            }
        }

        /// What this thread did with the backend, from the `from`th entry
        /// of the log on; the whole log, for messages.
        fn done_here(&self, from: usize) -> (Vec<&'static str>, String) {
            let me = std::thread::current().id();
            let seen = self.threads.lock().unwrap();
            let here = seen[from..]
                .iter()
                .filter(|(_, t)| *t == me)
                .map(|(w, _)| *w)
                .collect();
            (here, format!("{:?}", &seen[from..]))
        }
    }

    /// A program spinning on an empty CQ runs the transport in its own
    /// thread: the SEND that arrives while the I/O thread sleeps completes
    /// into the polled CQ, received by the polling thread, which gets the
    /// completion before the ACK's kick. The ACK goes out after it.
    #[test]
    fn an_empty_poll_runs_the_transport_in_the_polling_thread() {
        use crate::engine::completion::{WcOpcode, WcStatus};
        let host = handed_host(true);
        let wc = host.poll_until_received();
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (9, WcStatus::Success, WcOpcode::Recv, 8)
        );
        let (here, seen) = host.done_here(0);
        assert_eq!(here.first(), Some(&"recv"), "{seen}");
        assert!(here.contains(&"rx"), "the SEND was received here: {seen}");
        assert!(
            !here.contains(&"tx"),
            "the completion waited for the ACK's kick: {seen}"
        );
        host.ack_goes_out();
        host.rt.stop().unwrap();
    }

    /// A program's round that delivers completions leaves the engine's
    /// frames (the ACK) for its next one; that round sends whatever it
    /// brings in, so a program draining a stream sends its ACKs one poll
    /// late, never later. The I/O thread's rounds never defer.
    #[test]
    fn a_program_round_defers_its_sends_once_in_a_row() {
        let (sim, a, b) = pair_with_recvs(5, 3, 64);
        let mut io = Handed::new(true);
        let (frames, threads) = (io.frames.clone(), io.threads.clone());
        // A SEND from A waits in B's backend; returns what a round on B
        // as `caller` then did.
        let mut round_after_a_send = |caller| {
            send_from_a(&sim, &a, &frames);
            threads.lock().unwrap().clear();
            let r = round(&sim.b, &mut io, Duration::ZERO, caller).unwrap();
            let did: Vec<_> = threads.lock().unwrap().iter().map(|(w, _)| *w).collect();
            (r.deferred, did)
        };
        let mut wc = [crate::engine::completion::Wc::default(); 4];
        let (deferred, did) = round_after_a_send(Caller::Application { may_defer: true });
        assert!(deferred, "{did:?}");
        assert_eq!(did, ["recv", "rx"], "received, the ACK not sent");
        assert_eq!(b.cq.poll(&mut wc).unwrap(), 1, "the completion is there");
        let (deferred, did) = round_after_a_send(Caller::Application { may_defer: false });
        assert!(!deferred);
        assert_eq!(did, ["recv", "rx", "tx"], "both SENDs acknowledged");
        assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
        let (deferred, did) = round_after_a_send(Caller::IoThread);
        assert!(!deferred);
        assert_eq!(did, ["recv", "rx", "tx"]);
        assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
    }

    /// A program that destroys its QP right after the poll that brought
    /// its last completion (the round left the ACK for the next poll)
    /// still sends that ACK: the QP's drop flushes what the round left.
    #[test]
    fn a_qp_destroyed_after_its_last_poll_sends_the_ack_first() {
        use crate::verbs::sim::{connect_pair, sim_pair, LinkConfig, PairParams};
        use crate::verbs::RecvWr;
        let sim = sim_pair(LinkConfig::default(), 5);
        let (a, b) = connect_pair(&sim, &PairParams::default());
        b.qp.post_recv(&RecvWr {
            wr_id: 9,
            sg_list: vec![b.mr.sge(0, 64)],
        })
        .unwrap();
        let io = Handed::new(true);
        let (frames, threads) = (io.frames.clone(), io.threads.clone());
        // No I/O thread: only the program's polls and the QP's drop run
        // rounds.
        let cell = Arc::new(IoCell::new(Box::new(io), Doorbell::new()));
        sim.b.set_progress(Some(IoCell::progress_hook(cell)));
        send_from_a(&sim, &a, &frames);
        let mut wc = [crate::engine::completion::Wc::default()];
        assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
        let did = || -> Vec<_> { threads.lock().unwrap().iter().map(|(w, _)| *w).collect() };
        assert_eq!(did(), ["recv", "rx"], "the ACK left for the next poll");
        drop(b.qp);
        assert_eq!(did(), ["recv", "rx", "recv", "tx"], "the drop sent it");
    }

    /// The I/O thread naps only while a program's polls are recent.
    #[test]
    fn a_program_drives_while_its_polls_are_recent() {
        assert!(!polls_recent(0, 5), "never polled");
        assert!(polls_recent(1_000, 1_000 + APP_DRIVES_NS - 1));
        assert!(!polls_recent(1_000, 1_000 + APP_DRIVES_NS));
        // A poll stamped after the thread read the clock is recent too.
        assert!(polls_recent(2_000, 1_000));
    }

    /// On a backend that cannot tell cheaply whether frames wait (UDP), an
    /// empty poll never runs a round: the polling thread does not touch
    /// the backend, and what waits is the sleeping I/O thread's.
    #[test]
    fn an_empty_poll_leaves_a_backend_that_cannot_tell_to_the_io_thread() {
        let host = handed_host(false);
        host.poll_empty(10_000);
        let (here, seen) = host.done_here(0);
        assert!(here.is_empty(), "{seen}");
        assert!(host.rt.bell.asleep.load(Ordering::SeqCst));
        host.rt.stop().unwrap();
    }

    /// With nothing arrived and nothing posted, an empty poll costs no
    /// round: the polling thread never asks the backend for frames.
    #[test]
    fn an_empty_poll_with_nothing_waiting_runs_no_round() {
        let host = handed_host(true);
        host.poll_until_received();
        host.ack_goes_out();
        let before = host.threads.lock().unwrap().len();
        host.poll_empty(10_000);
        let (here, seen) = host.done_here(before);
        assert!(here.is_empty(), "{seen}");
        host.rt.stop().unwrap();
    }

    /// A polling thread whose round finds the TX ring full does not wait
    /// for room (it would be held in its poll): it leaves the ACK to the
    /// I/O thread, which it wakes, and which sends it once there is room.
    #[test]
    fn an_empty_poll_never_waits_for_tx_room() {
        use crate::engine::completion::WcStatus;
        let host = handed_host(true);
        host.tx_room.store(0, Ordering::SeqCst);
        let wc = host.poll_until_received();
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
        let (here, seen) = host.done_here(0);
        assert!(here.contains(&"rx"), "received here: {seen}");
        assert!(!here.contains(&"wait"), "waited for TX room: {seen}");
        assert!(!here.contains(&"tx"), "{seen}");
        // The I/O thread was woken for the ACK; it sends it once it can.
        host.tx_room.store(usize::MAX, Ordering::SeqCst);
        let me = std::thread::current().id();
        wait_logged(
            &host.threads,
            Instant::now(),
            "the ACK did not go out",
            |(w, t)| *w == "tx" && *t != me,
        );
        host.rt.stop().unwrap();
    }

    /// B of a simulated pair behind a runtime on a [`Handed`] backend
    /// that never sleeps (its spin window is a minute: every empty round
    /// yields or naps) and naps `stream_nap` while data streams in, with
    /// receives posted; A's endpoint and B's backend queues.
    struct Streamed {
        _rt: Runtime,
        sim: crate::verbs::sim::Sim,
        a: crate::verbs::sim::Endpoint,
        b: crate::verbs::sim::Endpoint,
        frames: Frames,
        threads: Arc<Log>,
    }

    fn streamed(stream_nap: Duration) -> Streamed {
        let (sim, a, b) = pair_with_recvs(7, 4, 4096);
        let io = Handed::new(false);
        let (frames, threads) = (io.frames.clone(), io.threads.clone());
        let config = RuntimeConfig {
            spin_after_activity: Duration::from_secs(60),
            stream_nap,
            ..sleepy(false)
        };
        let rt = Runtime::start(sim.b.clone(), Box::new(io), config);
        Streamed {
            _rt: rt,
            sim,
            a,
            b,
            frames,
            threads,
        }
    }

    impl Streamed {
        /// A SEND of `len` bytes from A, polled for at B (30 s at most).
        fn send_and_receive(&self, len: usize) {
            send_len_from_a(&self.sim, &self.a, &self.frames, len);
            let mut wc = [crate::engine::completion::Wc::default()];
            wait_until(Instant::now(), &format!("a {len}-byte SEND"), || {
                self.b.cq.poll(&mut wc).unwrap() > 0
            });
            assert_eq!(wc[0].byte_len as usize, len);
        }

        /// How often the backend logged `what` so far.
        fn logged(&self, what: &str) -> usize {
            self.threads
                .lock()
                .unwrap()
                .iter()
                .filter(|(w, _)| *w == what)
                .count()
        }

        fn receive_calls(&self) -> usize {
            self.logged("recv")
        }
    }

    /// A ping-pong of small messages keeps the thread polling: with a
    /// minute's nap, the second SEND would wait out the nap.
    #[test]
    fn small_frames_never_make_the_thread_nap() {
        let host = streamed(Duration::from_secs(60));
        host.send_and_receive(8);
        host.send_and_receive(8);
    }

    /// After a round that took a full frame the thread naps between
    /// rounds instead of polling the backend (a yield loop would ask it
    /// thousands of times in a tenth of a second), and comes back.
    #[test]
    fn a_stream_makes_the_thread_nap_between_rounds() {
        let host = streamed(Duration::from_millis(300));
        host.send_and_receive(2048);
        let before = host.receive_calls();
        std::thread::sleep(Duration::from_millis(100));
        let during = host.receive_calls() - before;
        assert!(during <= 2, "{during} receive calls while napping");
        host.send_and_receive(8);
    }

    /// A WR posted while the thread naps in a stream rings it: the SEND
    /// goes out at once, not after the nap.
    #[test]
    fn a_post_during_a_stream_nap_rings_the_thread() {
        let host = streamed(Duration::from_secs(60));
        host.send_and_receive(2048);
        let naps_from = host.receive_calls();
        // Napping now: no more receive calls (a yield loop makes them at once).
        std::thread::sleep(Duration::from_millis(50));
        assert!(host.receive_calls() <= naps_from + 1, "napping");
        let sent = host.logged("tx");
        host.b
            .qp
            .post_send(&SendWr::new(5, WrOpcode::Send, vec![host.b.mr.sge(0, 8)]))
            .unwrap();
        wait_until(Instant::now(), "B's SEND sent", || host.logged("tx") > sent);
    }

    /// With a zero nap (and likewise on a backend that coalesces what
    /// arrives) the thread yields between rounds as before.
    #[test]
    fn a_zero_nap_keeps_the_thread_polling() {
        let host = streamed(Duration::ZERO);
        host.send_and_receive(2048);
        let before = host.receive_calls();
        wait_until(Instant::now(), "100 more receive calls", || {
            host.receive_calls() >= before + 100
        });
    }
}
