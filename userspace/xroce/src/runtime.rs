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
//! goes out at once instead of after the wait.

pub mod shards;

use std::{
    os::fd::{AsFd, BorrowedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
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
    verbs::Device,
};

/// Nanoseconds on the process-wide monotonic clock the engine runs on.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

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
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            busy_poll: false,
            max_wait: Duration::from_millis(1),
            max_sleep: Duration::from_millis(100),
            spin_after_activity: Duration::from_micros(300),
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
        let thread_bell = bell.clone();
        let hook = bell.clone();
        device.set_doorbell(Some(Arc::new(move || hook.ring())));
        let handle = device.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xroce-io-{backend}"))
            .spawn(move || {
                run(&device, io.as_mut(), &flag, &thread_bell, config).map(|()| io.stats())
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

fn run(
    device: &Device,
    io: &mut dyn PacketIo,
    stop: &AtomicBool,
    bell: &Doorbell,
    config: RuntimeConfig,
) -> Result<(), IoError> {
    // The backend's descriptors and the doorbell, for the idle wait.
    let mut pollfds: Vec<PollFd> = match bell.fd() {
        Some(b) if !io.poll_fds().is_empty() => io
            .poll_fds()
            .into_iter()
            // SAFETY: the backend keeps its descriptors open while it
            // lives, and it outlives this loop.
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
    while !stop.load(Ordering::Acquire) {
        let mut wait = if config.busy_poll || last_activity.elapsed() < config.spin_after_activity {
            // Spinning: let the application threads have the core too, but
            // only after a round that found nothing: a sched_yield(2)
            // after every busy round costs a syscall and often a context
            // switch per batch while frames stream.
            if idle_round {
                std::thread::yield_now();
            }
            Duration::ZERO
        } else {
            let longest = if pollfds.is_empty() {
                config.max_wait
            } else {
                config.max_sleep
            };
            idle_wait(device, longest)
        };
        if !wait.is_zero() && !pollfds.is_empty() {
            io.before_sleep();
            bell.asleep.store(true, Ordering::SeqCst);
            // A WR posted while this thread was still awake rang no bell:
            // look at the post rings after saying we sleep (SeqCst on both
            // sides), so it is never left until `wait` ends.
            let rung = if device.has_posted_work() {
                Ok(true)
            } else {
                sleep(&mut pollfds, wait)
            };
            bell.asleep.store(false, Ordering::SeqCst);
            if rung? {
                // Rung: the application posted work; stay awake a while.
                bell.drain();
                last_activity = Instant::now();
            }
            wait = Duration::ZERO;
        }
        // Receive without the lock; take it once the first frame is here.
        let mut guard = None;
        // One clock read per batch, not per frame: the frames of a batch
        // waited on the ring together.
        let mut arrived = None;
        let received = io.recv_datagrams(wait, &mut |r| {
            let t = *arrived.get_or_insert_with(now_ns);
            let engine = guard.get_or_insert_with(|| device.lock());
            match r {
                Ok(d) => engine.handle_datagram(&d, t),
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
        engine.deliver_completions();
        // Send all the engine has now. When the backend's TX ring is full,
        // give it a moment, then go back to receiving (ACKs free the ring).
        let mut sent = 0;
        let own_mac = engine.config().mac;
        let own_block = engine.config().qpn_block;
        let mut looped = 0;
        let mut engine = Some(engine);
        for _ in 0..4 {
            let mut engine_empty = false;
            sent += io.transmit_datagrams(&mut |buf| loop {
                let e = engine.as_mut()?;
                let t = e.poll_transmit(now, buf);
                if t.is_none() {
                    engine_empty = true;
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
                        if t.dst_mac == own_mac
                            && dest_block(t.payload(buf)) == Some(own_block) =>
                    {
                        e.handle_datagram(&t.looped_back(buf), now);
                        looped += 1;
                    }
                    t => return t,
                }
            })?;
            if engine_empty {
                break;
            }
            io.wait_writable(Duration::from_micros(50))?;
        }
        drop(engine);
        if now.saturating_sub(io_stats_at) >= IO_STATS_EVERY_NS {
            device.set_io_stats(io.stats());
            io_stats_at = now;
        }
        idle_round = received + sent + looped == 0;
        if !idle_round {
            last_activity = Instant::now();
        }
    }
    device.set_io_stats(io.stats());
    Ok(())
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
    use std::sync::Mutex;

    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use super::*;
    use crate::{
        engine::EngineConfig,
        verbs::{AccessFlags, QpAttr, QpInitAttr, RemoteQp, SendWr, WrOpcode},
    };

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

    /// A backend that never receives (its poll descriptor is a pipe nobody
    /// writes) and records when the engine first hands it a frame.
    struct Silent {
        pipe: [OwnedFd; 2],
        first_tx: Arc<Mutex<Option<Instant>>>,
    }

    impl PacketIo for Silent {
        fn name(&self) -> &'static str {
            "silent"
        }
        fn max_frame_len(&self) -> usize {
            9216
        }
        fn recv_batch(
            &mut self,
            timeout: Duration,
            _: &mut dyn FnMut(&[u8]),
        ) -> crate::io::Result<usize> {
            std::thread::sleep(timeout);
            Ok(0)
        }
        fn transmit(
            &mut self,
            fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        ) -> crate::io::Result<usize> {
            let mut buf = vec![0u8; 9216];
            let mut n = 0;
            while let Some(len) = fill(&mut buf) {
                if len == 0 {
                    break;
                }
                n += 1;
                self.first_tx
                    .lock()
                    .unwrap()
                    .get_or_insert_with(Instant::now);
            }
            Ok(n)
        }
        fn wait_writable(&mut self, _: Duration) -> crate::io::Result<bool> {
            Ok(true)
        }
        fn stats(&mut self) -> IoStats {
            IoStats::default()
        }
        fn poll_fd(&self) -> Option<i32> {
            Some(self.pipe[0].as_raw_fd())
        }
    }

    #[test]
    fn a_wr_posted_while_the_thread_sleeps_goes_out_on_the_doorbell() {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two fresh descriptors we then own.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: as above.
        let pipe = fds.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
        let first_tx = Arc::new(Mutex::new(None));
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
            Box::new(Silent {
                pipe,
                first_tx: first_tx.clone(),
            }),
            RuntimeConfig {
                busy_poll: false,
                // Without the doorbell the WR would wait most of this.
                max_wait: Duration::from_secs(5),
                max_sleep: Duration::from_secs(5),
                spin_after_activity: Duration::from_millis(1),
            },
        );
        // Let the thread go to sleep.
        std::thread::sleep(Duration::from_millis(100));
        let posted = Instant::now();
        // post_send rings the doorbell the runtime put on the device.
        qp.post_send(&SendWr::new(1, WrOpcode::Send, vec![mr.sge(0, 8)]))
            .unwrap();
        while first_tx.lock().unwrap().is_none() && posted.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let sent = first_tx.lock().unwrap().expect("the SEND never went out");
        let after = sent.duration_since(posted);
        assert!(
            after < Duration::from_secs(1),
            "sent {after:?} after posting"
        );
        rt.stop().unwrap();
    }
}
