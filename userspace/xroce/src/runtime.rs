//! Drives a verbs [`Device`]'s sans-I/O engine from a packet-I/O backend on
//! a thread of its own: frames in -> `handle_frame`, due timers ->
//! `handle_timeout`, `poll_transmit` -> frames out. Applications post work
//! and poll CQs from their own threads meanwhile.
//!
//! The engine lock is taken only while there is work: the thread waits for
//! frames without it, so posting a WR never waits behind an idle receive.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

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
    /// Longest wait for frames when idle (bounds how late a freshly posted
    /// WR is noticed when not busy-polling).
    pub max_wait: Duration,
    /// Keep polling without sleeping for this long after the last frame in
    /// or out: a sleeping wait costs a millisecond (poll(2) granularity),
    /// far more than a round trip.
    pub spin_after_activity: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            busy_poll: false,
            max_wait: Duration::from_millis(1),
            spin_after_activity: Duration::from_millis(2),
        }
    }
}

/// The I/O thread of one device. Stop it with [`Runtime::stop`] (also on drop).
pub struct Runtime {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<IoStats, IoError>>>,
    backend: &'static str,
}

impl Runtime {
    pub fn start(device: Device, mut io: Box<dyn PacketIo>, config: RuntimeConfig) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let backend = io.name();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xroce-io-{backend}"))
            .spawn(move || run(&device, io.as_mut(), &flag, config).map(|()| io.stats()))
            .expect("spawn the I/O thread");
        Self {
            stop,
            thread: Some(thread),
            backend,
        }
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

    /// True while the I/O thread runs (false after an I/O error).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    fn shutdown(&mut self) -> Result<IoStats, IoError> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(IoError::Setup("the I/O thread panicked".into()))),
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
    config: RuntimeConfig,
) -> Result<(), IoError> {
    let mut last_activity = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let wait = if config.busy_poll || last_activity.elapsed() < config.spin_after_activity {
            // Spinning: let the application threads have the core too.
            std::thread::yield_now();
            Duration::ZERO
        } else {
            idle_wait(device, config.max_wait)
        };
        // Receive without the lock; take it once the first frame is here.
        let mut guard = None;
        let received = io.recv_batch(wait, &mut |frame| {
            guard
                .get_or_insert_with(|| device.lock())
                .handle_frame(frame, now_ns())
        })?;
        let mut engine = guard.unwrap_or_else(|| device.lock());
        let now = now_ns();
        if engine.poll_timeout().is_some_and(|t| t <= now) {
            engine.handle_timeout(now);
        }
        // Send all the engine has now. When the backend's TX ring is full,
        // give it a moment, then go back to receiving (ACKs free the ring).
        let mut sent = 0;
        for _ in 0..4 {
            let mut engine_empty = false;
            sent += io.transmit(&mut |buf| {
                let n = engine.poll_transmit(now, buf);
                engine_empty |= n.is_none();
                n
            })?;
            if engine_empty {
                break;
            }
            io.wait_writable(Duration::from_micros(50))?;
        }
        if received + sent > 0 {
            last_activity = Instant::now();
        }
    }
    Ok(())
}

/// How long to wait in the backend when there is nothing to do: until the
/// engine's next timer, at most `max_wait`.
fn idle_wait(device: &Device, max_wait: Duration) -> Duration {
    match device.poll_timeout() {
        Some(t) => Duration::from_nanos(t.saturating_sub(now_ns())).min(max_wait),
        None => max_wait,
    }
}
