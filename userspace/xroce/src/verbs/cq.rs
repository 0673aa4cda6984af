//! Completion queues: batch polling, blocking wait on an eventfd, overflow
//! reported as an error.
//!
//! The engine hands out completions as values tagged with a [`CqId`]; the
//! [`super::Device`] pushes them here with `CqInner::push` (no syscall)
//! before it releases the engine lock, and writes the eventfd of every CQ
//! that had a waiter-visible transition.
//!
//! The ring is lock-free (the way back of the post ring, `post_ring.rs`):
//! the I/O thread pushes while the application polls, and neither waits
//! for the other, so an application polling hard never holds up the
//! engine lock the push runs under. Only `ibv_resize_cq` and a destroyed
//! QP's discard, which rebuild the ring, take it exclusively.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crossbeam_queue::ArrayQueue;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::device::{Device, DeviceShared};
use super::error::{Result, TransportError, VerbsError};
use crate::engine::completion::{CqId, Wc, WcFlags, WcStatus};

pub struct CqInner {
    /// Its capacity is the CQ's depth. Shared by pushes and polls; taken
    /// exclusively to rebuild it (resize, discard).
    ring: RwLock<ArrayQueue<Wc>>,
    overflowed: AtomicBool,
    /// Set when a completion arrived and the eventfd has not
    /// been written for it yet.
    pub(crate) signal_pending: AtomicBool,
    pub(crate) event_fd: Option<EventFd>,
    /// Threads in [`CompletionQueue::wait`]: the eventfd is written only
    /// while one may sleep on it, or once it was handed out
    /// ([`CompletionQueue::event_fd`]), not for every completion a
    /// polling program takes anyway (a write(2) each, in the round that
    /// delivers it, before the program's poll returns).
    waiters: AtomicUsize,
    fd_handed_out: AtomicBool,
    pushed: AtomicU64,
    /// Completions taken out by `poll`; `pushed == polled` means empty,
    /// which `poll` checks without the lock: an application spinning on an
    /// empty CQ must not starve the engine of the lock it pushes under.
    polled: AtomicU64,
    /// `ibv_req_notify_cq` state: one of the ARMED_* values.
    armed: AtomicU8,
    /// A completion fired the arm; `signal` calls the handler.
    event_due: AtomicBool,
    on_event: Mutex<Option<CqEventHandler>>,
}

impl CqInner {
    pub(crate) fn new(depth: usize, with_eventfd: bool) -> Result<Self> {
        let event_fd = if with_eventfd {
            let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| VerbsError::Os(format!("eventfd: {e}")))?;
            Some(fd)
        } else {
            None
        };
        Ok(Self {
            ring: RwLock::new(ArrayQueue::new(depth.max(1))),
            overflowed: AtomicBool::new(false),
            signal_pending: AtomicBool::new(false),
            event_fd,
            waiters: AtomicUsize::new(0),
            fd_handed_out: AtomicBool::new(false),
            pushed: AtomicU64::new(0),
            polled: AtomicU64::new(0),
            armed: AtomicU8::new(ARMED_NONE),
            event_due: AtomicBool::new(false),
            on_event: Mutex::new(None),
        })
    }

    /// Append a completion. Returns `false` (and latches the overflow
    /// error) when the CQ is full. Returns `Some(true)` via `notify` when the
    /// caller should queue this CQ for an eventfd write.
    pub(crate) fn push(&self, wc: Wc, notify: &mut bool) -> bool {
        let solicited = wc.flags.contains(WcFlags::SOLICITED) || wc.status != WcStatus::Success;
        let r = self.ring.read().unwrap();
        if r.push(wc).is_err() {
            self.overflowed.store(true, Ordering::Release);
            // An overflow is an error: it fires any arm (as a CQ error).
            self.fire_arm(true);
            *notify = !self.signal_pending.swap(true, Ordering::AcqRel);
            return false;
        }
        self.pushed.fetch_add(1, Ordering::SeqCst);
        let fired = self.fire_arm(solicited);
        *notify = (self.fd_wanted() || fired) && !self.signal_pending.swap(true, Ordering::AcqRel);
        true
    }

    /// Whether the eventfd has anyone to wake. SeqCst against `wait`'s
    /// count and its look at the ring: a waiter either sees the
    /// completion just pushed or is seen here.
    fn fd_wanted(&self) -> bool {
        self.event_fd.is_some()
            && (self.waiters.load(Ordering::SeqCst) > 0
                || self.fd_handed_out.load(Ordering::Relaxed))
    }

    /// Disarm and mark an event due if the arm matches a completion that
    /// is (`solicited`) or is not solicited. IBTA 11.4.2.2: "solicited
    /// only" fires on solicited receives and on error completions.
    fn fire_arm(&self, solicited: bool) -> bool {
        let armed = self.armed.load(Ordering::Acquire);
        let fires = armed == ARMED_NEXT || (armed == ARMED_SOLICITED && solicited);
        if fires
            && self
                .armed
                .compare_exchange(armed, ARMED_NONE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.event_due.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// Write the eventfd (verbs side; called by the device after engine calls).
    pub(crate) fn signal(&self) {
        self.signal_pending.store(false, Ordering::Release);
        if self.event_due.swap(false, Ordering::AcqRel) {
            let handler = self.on_event.lock().unwrap().clone();
            if let Some(h) = handler {
                h();
            }
        }
        if let Some(fd) = &self.event_fd {
            // A full counter (EAGAIN) already wakes every waiter.
            let _ = fd.write(1);
        }
    }

    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        if self.pushed.load(Ordering::Acquire) == self.polled.load(Ordering::Relaxed)
            && !self.overflowed.load(Ordering::Acquire)
        {
            return Ok(0);
        }
        let r = self.ring.read().unwrap();
        let mut n = 0;
        while n < out.len() {
            let Some(wc) = r.pop() else { break };
            out[n] = wc;
            n += 1;
        }
        self.polled.fetch_add(n as u64, Ordering::Relaxed);
        if n == 0 && self.overflowed.load(Ordering::Acquire) {
            return Err(VerbsError::CqOverflow);
        }
        Ok(n)
    }

    fn len(&self) -> usize {
        self.ring.read().unwrap().len()
    }

    fn depth(&self) -> usize {
        self.ring.read().unwrap().capacity()
    }

    /// Replaces `ring` (held exclusively) with one of `depth`, at least its
    /// length, holding in order the completions `keep` accepts; returns
    /// how many it dropped.
    fn rebuild(ring: &mut ArrayQueue<Wc>, depth: usize, keep: impl Fn(&Wc) -> bool) -> usize {
        let next = ArrayQueue::new(depth);
        let mut dropped = 0;
        while let Some(wc) = ring.pop() {
            if keep(&wc) {
                let _ = next.push(wc);
            } else {
                dropped += 1;
            }
        }
        *ring = next;
        dropped
    }

    /// Removes the completions of QP `qpn` (counted as polled, so that
    /// `pushed - polled` stays the ring's length).
    pub(crate) fn discard_qp(&self, qpn: u32) {
        let mut r = self.ring.write().unwrap();
        let depth = r.capacity();
        let dropped = Self::rebuild(&mut r, depth, |wc| wc.qp_num != qpn);
        self.polled.fetch_add(dropped as u64, Ordering::Relaxed);
    }
}

/// Called once per completion event (`ibv_req_notify_cq` armed and a
/// completion that matches it arrived), outside the engine lock.
pub type CqEventHandler = Arc<dyn Fn() + Send + Sync>;

/// What `ibv_req_notify_cq` armed.
const ARMED_NONE: u8 = 0;
const ARMED_NEXT: u8 = 1;
const ARMED_SOLICITED: u8 = 2;

/// A completion queue (`ibv_cq`). Cheap to clone (shared handle).
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
    /// What the device's engine calls this CQ.
    pub(crate) id: CqId,
    /// The engines whose QPs complete here (a group's members: all of
    /// them), whose I/O an empty poll drives (`Device::progress`). Weak:
    /// a device does not live on for its CQs.
    pub(crate) devices: Arc<[Weak<DeviceShared>]>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("depth", &self.depth())
            .field("len", &self.inner.len())
            .finish()
    }
}

impl CompletionQueue {
    /// `ibv_poll_cq`: move up to `wc.len()` completions into `wc`; returns
    /// how many. Once the CQ has overflowed and is drained, returns
    /// [`VerbsError::CqOverflow`].
    ///
    /// An empty poll runs a round of its devices' transport in this thread
    /// when frames or posted work wait (the progress hook the runtime
    /// installs on AF_XDP): a program spinning on its CQ then moves its own
    /// frames instead of waiting for the I/O thread to get a core, which on
    /// a host with fewer cores than spinning threads can take a time slice.
    pub fn poll(&self, wc: &mut [Wc]) -> Result<usize> {
        let n = self.inner.poll(wc)?;
        if n > 0 || wc.is_empty() {
            return Ok(n);
        }
        let mut moved = false;
        for d in self.devices.iter().filter_map(Weak::upgrade) {
            moved |= Device::of(d).progress();
        }
        if moved {
            self.inner.poll(wc)
        } else {
            Ok(0)
        }
    }

    /// Poll one completion.
    pub fn poll_one(&self) -> Result<Option<Wc>> {
        let mut w = [Wc::default()];
        Ok((self.poll(&mut w)? == 1).then_some(w[0]))
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn depth(&self) -> usize {
        self.inner.depth()
    }

    /// `ibv_resize_cq`: hold at least `depth` completions from now on.
    /// Fails if fewer than the completions already queued.
    pub fn resize(&self, depth: usize) -> Result<()> {
        let mut r = self.inner.ring.write().unwrap();
        if depth == 0 || depth < r.len() {
            return Err(TransportError::InvalidArgument(
                "a CQ cannot shrink below the completions it holds",
            )
            .into());
        }
        CqInner::rebuild(&mut r, depth, |_| true);
        Ok(())
    }
    /// Has this CQ lost completions because it was full?
    pub fn overflowed(&self) -> bool {
        self.inner.overflowed.load(Ordering::Acquire)
    }
    /// Total completions ever queued.
    pub fn total_completions(&self) -> u64 {
        self.inner.pushed.load(Ordering::Relaxed)
    }

    /// The eventfd that becomes readable when completions arrive (for
    /// epoll); `None` for CQs created without one.
    pub fn event_fd(&self) -> Option<RawFd> {
        let fd = self.inner.event_fd.as_ref().map(|f| f.as_raw_fd());
        if fd.is_some() {
            self.inner.fd_handed_out.store(true, Ordering::Relaxed);
        }
        fd
    }

    /// Set (or clear) what runs when an armed CQ gets a matching
    /// completion: the completion channel of `ibv_create_cq`.
    pub fn set_event_handler(&self, handler: Option<CqEventHandler>) {
        *self.inner.on_event.lock().unwrap() = handler;
    }

    /// `ibv_req_notify_cq`: request one event for the next completion
    /// (`solicited_only`: the next solicited receive or error completion).
    /// The event fires once; arm again after handling it. Completions
    /// already queued do not fire it (poll after arming, as with rdma-core).
    pub fn req_notify(&self, solicited_only: bool) {
        let want = if solicited_only {
            ARMED_SOLICITED
        } else {
            ARMED_NEXT
        };
        // A "next" arm is never weakened to "solicited" by a later call.
        let _ = self
            .inner
            .armed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur != ARMED_NEXT).then_some(want)
            });
    }

    /// Block until the CQ is non-empty (or overflowed) or `timeout` passes.
    /// Returns whether completions are available.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        // Counted before the ring is looked at (see `CqInner::fd_wanted`).
        self.inner.waiters.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let _waiting = Waiting(&self.inner.waiters);
        loop {
            if self.inner.len() > 0 || self.overflowed() {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let Some(fd) = &self.inner.event_fd else {
                std::thread::sleep((deadline - now).min(Duration::from_micros(50)));
                continue;
            };
            let timeout = PollTimeout::try_from((deadline - now).as_millis().max(1))
                .unwrap_or(PollTimeout::MAX);
            let mut pfd = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
            if poll(&mut pfd, timeout).is_ok_and(|n| n > 0) {
                // EAGAIN if another waiter drained it first.
                let _ = fd.read();
            }
        }
    }
}

/// Counts a thread in [`CompletionQueue::wait`] until it leaves.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cq_with_eventfd() -> CompletionQueue {
        CompletionQueue {
            inner: Arc::new(CqInner::new(4, true).unwrap()),
            id: CqId(1),
            devices: Arc::new([]),
        }
    }

    #[test]
    fn a_qps_completions_can_be_discarded() {
        let cq = cq_with_eventfd();
        let mut notify = false;
        for (wr_id, qp_num) in [(1, 5), (2, 6), (3, 5)] {
            let wc = Wc {
                wr_id,
                qp_num,
                ..Wc::default()
            };
            assert!(cq.inner.push(wc, &mut notify));
        }
        cq.inner.discard_qp(5);
        assert_eq!(cq.len(), 1);
        let mut out = [Wc::default(); 4];
        assert_eq!(cq.poll(&mut out).unwrap(), 1);
        assert_eq!((out[0].wr_id, out[0].qp_num), (2, 6));
        assert_eq!(
            cq.poll(&mut out).unwrap(),
            0,
            "pushed and polled agree: empty"
        );
    }

    /// A completion no thread waits for costs no eventfd write; one that
    /// a thread in `wait` sleeps for does, and wakes it.
    #[test]
    fn the_eventfd_is_written_only_for_a_waiter() {
        let cq = cq_with_eventfd();
        let mut notify = true;
        assert!(cq.inner.push(Wc::default(), &mut notify));
        assert!(!notify, "nobody waits: no write");
        let mut out = [Wc::default(); 4];
        assert_eq!(cq.poll(&mut out).unwrap(), 1);
        let waiter = {
            let cq = cq.clone();
            std::thread::spawn(move || cq.wait(Duration::from_secs(30)).unwrap())
        };
        while cq.inner.waiters.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        assert!(cq.inner.push(
            Wc {
                wr_id: 3,
                ..Wc::default()
            },
            &mut notify
        ));
        assert!(notify, "a thread waits: write");
        cq.inner.signal();
        assert!(waiter.join().unwrap(), "woken with the completion there");
        assert_eq!(cq.inner.waiters.load(Ordering::SeqCst), 0);
        assert_eq!(cq.poll(&mut out).unwrap(), 1);
        assert_eq!(out[0].wr_id, 3);
    }

    #[test]
    fn wait_sleeps_on_the_eventfd_until_a_completion_is_signalled() {
        let cq = cq_with_eventfd();
        let fd = cq.event_fd().expect("created with an eventfd");
        assert!(fd >= 0);
        let pusher = {
            let inner = cq.inner.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let mut notify = false;
                assert!(inner.push(
                    Wc {
                        wr_id: 7,
                        ..Wc::default()
                    },
                    &mut notify
                ));
                assert!(notify, "the first completion asks for an eventfd write");
                inner.signal();
            })
        };
        let start = Instant::now();
        assert!(cq.wait(Duration::from_secs(10)).unwrap());
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        pusher.join().unwrap();
        let mut out = [Wc::default(); 4];
        assert_eq!(cq.poll(&mut out).unwrap(), 1);
        assert_eq!(out[0].wr_id, 7);
    }

    #[test]
    fn wait_on_an_empty_cq_times_out() {
        let cq = cq_with_eventfd();
        let start = Instant::now();
        assert!(!cq.wait(Duration::from_millis(30)).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    fn wc(wr_id: u64) -> Wc {
        Wc {
            wr_id,
            ..Wc::default()
        }
    }

    /// One thread pushes while another polls, neither waiting for the
    /// other: every completion comes out once, in order.
    #[test]
    fn pushes_and_polls_at_once_keep_every_completion_once_in_order() {
        const N: u64 = 50_000;
        let cq = cq_with_eventfd();
        let pusher = {
            let inner = cq.inner.clone();
            std::thread::spawn(move || {
                let mut notify = false;
                for i in 0..N {
                    // Never past the depth: an overflow is the CQ's error.
                    while inner.len() == 4 {
                        std::thread::yield_now();
                    }
                    assert!(inner.push(wc(i), &mut notify));
                }
            })
        };
        let mut next = 0;
        let mut out = [Wc::default(); 3];
        while next < N {
            let n = cq.poll(&mut out).unwrap();
            for w in &out[..n] {
                assert_eq!(w.wr_id, next);
                next += 1;
            }
        }
        pusher.join().unwrap();
        assert!(!cq.overflowed());
        assert_eq!(cq.poll(&mut out).unwrap(), 0);
    }

    #[test]
    fn a_full_cq_overflows_and_says_so_once_drained() {
        let cq = cq_with_eventfd();
        let mut notify = false;
        for i in 0..4 {
            assert!(cq.inner.push(wc(i), &mut notify));
        }
        assert!(!cq.inner.push(wc(4), &mut notify), "depth 4");
        assert!(cq.overflowed());
        let mut out = [Wc::default(); 8];
        assert_eq!(cq.poll(&mut out).unwrap(), 4);
        assert!(matches!(cq.poll(&mut out), Err(VerbsError::CqOverflow)));
    }

    #[test]
    fn resize_keeps_what_is_queued_in_order_and_never_shrinks_below_it() {
        let cq = cq_with_eventfd();
        let mut notify = false;
        for i in 0..3 {
            assert!(cq.inner.push(wc(i), &mut notify));
        }
        assert!(cq.resize(2).is_err(), "3 are queued");
        assert!(cq.resize(0).is_err());
        assert_eq!(cq.depth(), 4);
        cq.resize(8).unwrap();
        assert_eq!(cq.depth(), 8);
        for i in 3..8 {
            assert!(cq.inner.push(wc(i), &mut notify));
        }
        let mut out = [Wc::default(); 16];
        assert_eq!(cq.poll(&mut out).unwrap(), 8);
        let ids: Vec<u64> = out[..8].iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, (0..8).collect::<Vec<_>>());
    }
}
