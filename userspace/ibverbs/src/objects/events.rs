//! Asynchronous events, the objects' side: the records producers write to
//! a context's async pipe ([`write_async`]: QP events from the engine, SRQ
//! limit events, IBV_EVENT_CQ_ERR of an overflowed CQ), which programs read
//! from `context->async_fd` through `ibv_get_async_event`, and the pipes
//! themselves ([`event_pipe`], also a completion channel's).
//!
//! As with the kernel's uverbs, an event counts as *reported* for its
//! object when the program reads it, and destroying the object waits until
//! the program acked every reported event. Objects that take part register
//! with [`track`] at creation and learn at destroy, from [`untrack`], how
//! many acks to wait for ([`wait_acked`]). Once objects of a kind are
//! tracked, a record for an untracked object of that kind is a stale event
//! of a destroyed object (the kernel drops those at destroy; a pipe cannot)
//! and is skipped.

use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use xroce::engine::AsyncEvent;

use crate::abi::*;

/// One record on a context's async fd: what `ibv_get_async_event` returns.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AsyncRecord {
    pub element: u64,
    pub event_type: u32,
    pub _pad: u32,
}

/// Queue an async event on the pipe whose write end is `fd` (never
/// blocks: a full pipe drops the event, as a full kernel queue would).
pub(crate) fn write_async(fd: i32, element: *mut c_void, event_type: u32) {
    let r = AsyncRecord {
        element: element as u64,
        event_type,
        _pad: 0,
    };
    // SAFETY: writes the bytes of a live Copy struct to a pipe we own.
    let _ = unsafe {
        libc::write(
            fd,
            &r as *const AsyncRecord as *const c_void,
            std::mem::size_of::<AsyncRecord>(),
        )
    };
}

fn pipe() -> Result<(OwnedFd, OwnedFd), i32> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fresh descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // SAFETY: as above.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A pipe whose write end never blocks (event producers must not stall
/// the I/O thread) and whose read end blocks unless the program sets
/// O_NONBLOCK itself.
pub(crate) fn event_pipe() -> Result<(OwnedFd, OwnedFd), i32> {
    let (r, w) = pipe()?;
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    Ok((r, w))
}

/// The object an event is about.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Cq,
    Qp,
    Srq,
    Wq,
}

impl Kind {
    fn index(self) -> usize {
        self as usize
    }
}

/// The kind of object `event_type`'s element is (None: a port or device
/// event, whose element is a port number).
pub(crate) fn kind_of(event_type: u32) -> Option<Kind> {
    match event_type {
        IBV_EVENT_CQ_ERR => Some(Kind::Cq),
        IBV_EVENT_QP_FATAL
        | IBV_EVENT_QP_REQ_ERR
        | IBV_EVENT_QP_ACCESS_ERR
        | IBV_EVENT_COMM_EST
        | IBV_EVENT_SQ_DRAINED
        | IBV_EVENT_PATH_MIG
        | IBV_EVENT_PATH_MIG_ERR
        | IBV_EVENT_QP_LAST_WQE_REACHED => Some(Kind::Qp),
        IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => Some(Kind::Srq),
        IBV_EVENT_WQ_FATAL => Some(Kind::Wq),
        _ => None,
    }
}

/// The `ibv_event_type` of an event of the engine.
pub(crate) fn event_type(e: &AsyncEvent) -> u32 {
    match e {
        AsyncEvent::CommEstablished { .. } => IBV_EVENT_COMM_EST,
        AsyncEvent::SqDrained { .. } => IBV_EVENT_SQ_DRAINED,
        AsyncEvent::QpFatal { .. } => IBV_EVENT_QP_FATAL,
        AsyncEvent::QpAccessError { .. } => IBV_EVENT_QP_ACCESS_ERR,
        AsyncEvent::QpRequestError { .. } => IBV_EVENT_QP_REQ_ERR,
        AsyncEvent::SrqLimitReached { .. } => IBV_EVENT_SRQ_LIMIT_REACHED,
    }
}

struct Tracked {
    kind: Kind,
    /// Events for it the program has read.
    reported: u32,
}

fn tracked() -> &'static Mutex<HashMap<usize, Tracked>> {
    static T: OnceLock<Mutex<HashMap<usize, Tracked>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Kinds whose objects register with [`track`]: their untracked records
/// are stale.
static STRICT: [AtomicBool; 4] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];

/// Register a live object that async events may name (at creation, before
/// its pointer can appear in an event).
pub(crate) fn track(element: *mut c_void, kind: Kind) {
    STRICT[kind.index()].store(true, Ordering::Relaxed);
    tracked()
        .lock()
        .unwrap()
        .insert(element as usize, Tracked { kind, reported: 0 });
}

/// Unregister an object being destroyed: returns how many of its events
/// the program read (the acks destroy must wait for). Events still unread
/// are skipped from now on.
pub(crate) fn untrack(element: *mut c_void) -> u32 {
    tracked()
        .lock()
        .unwrap()
        .remove(&(element as usize))
        .map(|t| t.reported)
        .unwrap_or(0)
}

/// Count a record read for `element`; false if it is stale (skip it).
pub(crate) fn note_reported(element: usize, kind: Kind) -> bool {
    let mut t = tracked().lock().unwrap();
    match t.get_mut(&element) {
        Some(e) if e.kind == kind => {
            e.reported = e.reported.wrapping_add(1);
            true
        }
        _ => !STRICT[kind.index()].load(Ordering::Relaxed),
    }
}

/// Block on `mutex`/`cond` until `done()` holds (read under the mutex).
///
/// # Safety
/// `mutex` and `cond` are initialised (or zeroed: glibc's static
/// initialisers) and live for the call; `done` reads only what the mutex
/// guards.
pub(crate) unsafe fn wait_until(
    mutex: *mut pthread_mutex_t,
    cond: *mut pthread_cond_t,
    mut done: impl FnMut() -> bool,
) {
    let m = mutex as *mut libc::pthread_mutex_t;
    let c = cond as *mut libc::pthread_cond_t;
    // SAFETY: the caller's contract; abi's pthread types are glibc's.
    unsafe {
        libc::pthread_mutex_lock(m);
        while !done() {
            libc::pthread_cond_wait(c, m);
        }
        libc::pthread_mutex_unlock(m);
    }
}

/// Wait until `*completed` (an `events_completed` counter the program's
/// acks raise under `mutex`) reaches `expected`, as rdma-core's destroy
/// verbs do. For the QP and SRQ destroy verbs:
/// `wait_acked(mutex, cond, events_completed, untrack(obj))`.
///
/// # Safety
/// As [`wait_until`]; `completed` points into the same live object.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) unsafe fn wait_acked(
    mutex: *mut pthread_mutex_t,
    cond: *mut pthread_cond_t,
    completed: *const u32,
    expected: u32,
) {
    // SAFETY: the caller's contract; the counter is read under its mutex.
    unsafe {
        wait_until(mutex, cond, || {
            std::ptr::read_volatile(completed) == expected
        })
    }
}

/// Add one to `*counter` under `mutex` and wake its waiters.
///
/// # Safety
/// As [`wait_acked`].
pub(crate) unsafe fn ack(
    mutex: *mut pthread_mutex_t,
    cond: *mut pthread_cond_t,
    counter: *mut u32,
    n: u32,
) {
    let m = mutex as *mut libc::pthread_mutex_t;
    // SAFETY: the caller's contract; the counter is written under its
    // mutex, which the destroy verb waits on.
    unsafe {
        libc::pthread_mutex_lock(m);
        counter.write_volatile(counter.read_volatile().wrapping_add(n));
        libc::pthread_cond_broadcast(cond as *mut libc::pthread_cond_t);
        libc::pthread_mutex_unlock(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_events_map_to_their_ibv_event_type() {
        use xroce::engine::AsyncEvent as E;
        let qpn = 0x11;
        let cases = [
            (E::CommEstablished { qpn }, IBV_EVENT_COMM_EST),
            (E::SqDrained { qpn }, IBV_EVENT_SQ_DRAINED),
            (
                E::QpFatal {
                    qpn,
                    cq_overflow: false,
                },
                IBV_EVENT_QP_FATAL,
            ),
            (E::QpAccessError { qpn }, IBV_EVENT_QP_ACCESS_ERR),
            (E::QpRequestError { qpn }, IBV_EVENT_QP_REQ_ERR),
        ];
        for (e, t) in cases {
            assert_eq!(event_type(&e), t, "{e:?}");
            assert_eq!(kind_of(t), Some(Kind::Qp), "{e:?}");
            assert_eq!(e.qpn(), Some(qpn), "{e:?}");
        }
    }

    #[test]
    fn kinds_follow_rdma_core() {
        assert_eq!(kind_of(IBV_EVENT_CQ_ERR), Some(Kind::Cq));
        assert_eq!(kind_of(IBV_EVENT_COMM_EST), Some(Kind::Qp));
        assert_eq!(kind_of(IBV_EVENT_QP_LAST_WQE_REACHED), Some(Kind::Qp));
        assert_eq!(kind_of(IBV_EVENT_SRQ_LIMIT_REACHED), Some(Kind::Srq));
        assert_eq!(kind_of(IBV_EVENT_WQ_FATAL), Some(Kind::Wq));
        assert_eq!(kind_of(IBV_EVENT_PORT_ACTIVE), None);
        assert_eq!(kind_of(IBV_EVENT_DEVICE_FATAL), None);
    }

    #[test]
    fn tracked_elements_count_reported_events_and_stale_ones_are_skipped() {
        // Wq: no other test tracks that kind.
        let a = 0x1000usize as *mut c_void;
        assert!(
            note_reported(a as usize, Kind::Wq),
            "untracked, kind not strict yet"
        );
        track(a, Kind::Wq);
        assert!(note_reported(a as usize, Kind::Wq));
        assert!(note_reported(a as usize, Kind::Wq));
        assert_eq!(untrack(a), 2);
        assert!(!note_reported(a as usize, Kind::Wq), "stale after destroy");
    }
}
