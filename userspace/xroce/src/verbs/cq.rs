//! Completion queues: batch polling, blocking wait on an eventfd, overflow
//! reported as an error.
//!
//! The engine pushes completions with `CqInner::push` (no syscall); when a
//! CQ had a waiter-visible transition it is queued for notification and the
//! [`super::Device`] wrapper writes the eventfd after the engine call.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::error::{Result, VerbsError};
use super::wc::Wc;

pub struct CqInner {
    ring: Mutex<VecDeque<Wc>>,
    depth: usize,
    overflowed: AtomicBool,
    /// Set by the engine when a completion arrived and the eventfd has not
    /// been written for it yet.
    pub(crate) signal_pending: AtomicBool,
    pub(crate) event_fd: Option<OwnedFd>,
    pushed: AtomicU64,
    /// Completions taken out by `poll`; `pushed == polled` means empty,
    /// which `poll` checks without the lock: an application spinning on an
    /// empty CQ must not starve the engine of the lock it pushes under.
    polled: AtomicU64,
}

impl CqInner {
    pub(crate) fn new(depth: usize, with_eventfd: bool) -> Result<Self> {
        let event_fd = if with_eventfd {
            // SAFETY: plain syscall; the fd is owned below.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            if fd < 0 {
                return Err(VerbsError::Os(format!(
                    "eventfd: {}",
                    std::io::Error::last_os_error()
                )));
            }
            // SAFETY: fd is a fresh descriptor we own.
            Some(unsafe { OwnedFd::from_raw_fd(fd) })
        } else {
            None
        };
        Ok(Self {
            ring: Mutex::new(VecDeque::with_capacity(depth)),
            depth,
            overflowed: AtomicBool::new(false),
            signal_pending: AtomicBool::new(false),
            event_fd,
            pushed: AtomicU64::new(0),
            polled: AtomicU64::new(0),
        })
    }

    /// Append a completion. Returns `false` (and latches the overflow
    /// error) when the CQ is full. Returns `Some(true)` via `notify` when the
    /// caller should queue this CQ for an eventfd write.
    pub(crate) fn push(&self, wc: Wc, notify: &mut bool) -> bool {
        let mut r = self.ring.lock().unwrap();
        if r.len() >= self.depth {
            self.overflowed.store(true, Ordering::Release);
            *notify = !self.signal_pending.swap(true, Ordering::AcqRel);
            return false;
        }
        r.push_back(wc);
        self.pushed.fetch_add(1, Ordering::Release);
        *notify = self.event_fd.is_some() && !self.signal_pending.swap(true, Ordering::AcqRel);
        true
    }

    /// Write the eventfd (verbs side; called by the device after engine calls).
    pub(crate) fn signal(&self) {
        self.signal_pending.store(false, Ordering::Release);
        if let Some(fd) = &self.event_fd {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to an eventfd we own.
            unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const _, 8) };
        }
    }

    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        if self.pushed.load(Ordering::Acquire) == self.polled.load(Ordering::Relaxed)
            && !self.overflowed.load(Ordering::Acquire)
        {
            return Ok(0);
        }
        let mut r = self.ring.lock().unwrap();
        let n = out.len().min(r.len());
        for (o, wc) in out.iter_mut().zip(r.drain(..n)) {
            *o = wc;
        }
        self.polled.fetch_add(n as u64, Ordering::Relaxed);
        if n == 0 && self.overflowed.load(Ordering::Acquire) {
            return Err(VerbsError::CqOverflow);
        }
        Ok(n)
    }

    fn len(&self) -> usize {
        self.ring.lock().unwrap().len()
    }
}

/// A completion queue (`ibv_cq`). Cheap to clone (shared handle).
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("depth", &self.inner.depth)
            .field("len", &self.inner.len())
            .finish()
    }
}

impl CompletionQueue {
    pub(crate) fn new(depth: usize, with_eventfd: bool) -> Result<Self> {
        if depth == 0 {
            return Err(VerbsError::InvalidArgument("CQ depth must be at least 1"));
        }
        Ok(Self {
            inner: Arc::new(CqInner::new(depth, with_eventfd)?),
        })
    }

    /// `ibv_poll_cq`: move up to `wc.len()` completions into `wc`; returns
    /// how many. Once the CQ has overflowed and is drained, returns
    /// [`VerbsError::CqOverflow`].
    pub fn poll(&self, wc: &mut [Wc]) -> Result<usize> {
        self.inner.poll(wc)
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
        self.inner.depth
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
        self.inner.event_fd.as_ref().map(|f| f.as_raw_fd())
    }

    /// Block until the CQ is non-empty (or overflowed) or `timeout` passes.
    /// Returns whether completions are available.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
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
            let ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc > 0 {
                let mut v: u64 = 0;
                // SAFETY: reading 8 bytes from our eventfd.
                unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
            }
        }
    }
}
