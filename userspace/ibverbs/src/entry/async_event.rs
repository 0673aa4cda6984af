//! Asynchronous events: `ibv_get_async_event`, `ibv_ack_async_event`.
//!
//! Producers write a [`AsyncRecord`] to the context's async pipe
//! (`context::write_async`: QP events from the engine, SRQ limit events,
//! IBV_EVENT_CQ_ERR from [`crate::cq`]); programs read `context->async_fd`
//! through `ibv_get_async_event`.
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
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use xroce::engine::AsyncEvent;

use crate::abi::*;
use crate::context::{context, AsyncRecord};
use crate::errno::{ffi, set_errno};

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
fn note_reported(element: usize, kind: Kind) -> bool {
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

/// Read one record from `fd`: Err(()) with errno set by read(2) (EAGAIN
/// when the program made the fd non-blocking).
fn read_record(fd: c_int) -> Result<AsyncRecord, ()> {
    let mut r = AsyncRecord {
        element: 0,
        event_type: 0,
        _pad: 0,
    };
    let want = std::mem::size_of::<AsyncRecord>();
    // SAFETY: reads at most `want` bytes into a live plain-data struct.
    let n = unsafe { libc::read(fd, &mut r as *mut AsyncRecord as *mut c_void, want) };
    if n == want as isize {
        Ok(r)
    } else {
        if n >= 0 {
            // End of file or a torn record: neither happens with our
            // writers (records are smaller than PIPE_BUF).
            set_errno(libc::EIO);
        }
        Err(())
    }
}

/// Fill the program's event from a record (rdma-core's element union).
fn fill(event: &mut ibv_async_event, r: &AsyncRecord) {
    event.event_type = r.event_type;
    event.element = match kind_of(r.event_type) {
        Some(Kind::Cq) => ibv_async_event__bindgen_ty_1 {
            cq: r.element as *mut ibv_cq,
        },
        Some(Kind::Qp) => ibv_async_event__bindgen_ty_1 {
            qp: r.element as *mut ibv_qp,
        },
        Some(Kind::Srq) => ibv_async_event__bindgen_ty_1 {
            srq: r.element as *mut ibv_srq,
        },
        Some(Kind::Wq) => ibv_async_event__bindgen_ty_1 {
            wq: r.element as *mut ibv_wq,
        },
        None => ibv_async_event__bindgen_ty_1 {
            port_num: r.element as c_int,
        },
    };
}

/// `ibv_get_async_event`: the next event of the context; blocks unless
/// the program set O_NONBLOCK on `context->async_fd` (then -1 with errno
/// EAGAIN when none is queued).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    ffi(-1, || {
        // SAFETY: the program passes an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        // SAFETY: the program passes a writable event (or NULL).
        let Some(ev) = (unsafe { event.as_mut() }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let fd = c.vctx.context.async_fd;
        loop {
            let Ok(r) = read_record(fd) else {
                return -1;
            };
            if let Some(kind) = kind_of(r.event_type) {
                if !note_reported(r.element as usize, kind) {
                    continue;
                }
            }
            fill(ev, &r);
            return 0;
        }
    })
}

/// `ibv_ack_async_event`: one more acked event for its object (what its
/// destroy waits for).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    ffi((), || {
        // SAFETY: the program passes an event ibv_get_async_event filled.
        let Some(ev) = (unsafe { event.as_ref() }) else {
            return;
        };
        // SAFETY: the element is the live object the event named (the
        // program acks before destroying it: destroy waits for the ack);
        // each branch reads the union member fill() wrote for this type.
        unsafe {
            match kind_of(ev.event_type) {
                Some(Kind::Cq) => {
                    let cq = ev.element.cq;
                    if !cq.is_null() {
                        ack(
                            &raw mut (*cq).mutex,
                            &raw mut (*cq).cond,
                            &raw mut (*cq).async_events_completed,
                            1,
                        );
                    }
                }
                Some(Kind::Qp) => {
                    let qp = ev.element.qp;
                    if !qp.is_null() {
                        ack(
                            &raw mut (*qp).mutex,
                            &raw mut (*qp).cond,
                            &raw mut (*qp).events_completed,
                            1,
                        );
                    }
                }
                Some(Kind::Srq) => {
                    let srq = ev.element.srq;
                    if !srq.is_null() {
                        ack(
                            &raw mut (*srq).mutex,
                            &raw mut (*srq).cond,
                            &raw mut (*srq).events_completed,
                            1,
                        );
                    }
                }
                Some(Kind::Wq) => {
                    let wq = ev.element.wq;
                    if !wq.is_null() {
                        ack(
                            &raw mut (*wq).mutex,
                            &raw mut (*wq).cond,
                            &raw mut (*wq).events_completed,
                            1,
                        );
                    }
                }
                None => {}
            }
        }
    })
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
    fn fill_sets_the_union_member_of_the_type() {
        let mut ev = ibv_async_event::default();
        fill(
            &mut ev,
            &AsyncRecord {
                element: 0x1234_5678,
                event_type: IBV_EVENT_SQ_DRAINED,
                _pad: 0,
            },
        );
        assert_eq!(ev.event_type, IBV_EVENT_SQ_DRAINED);
        // SAFETY: fill wrote the qp member.
        assert_eq!(unsafe { ev.element.qp } as usize, 0x1234_5678);
        fill(
            &mut ev,
            &AsyncRecord {
                element: 1,
                event_type: IBV_EVENT_PORT_ERR,
                _pad: 0,
            },
        );
        // SAFETY: fill wrote the port_num member.
        assert_eq!(unsafe { ev.element.port_num }, 1);
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

    #[test]
    fn ack_wakes_a_waiter() {
        let mut q = Box::new(ibv_qp::default());
        let p: *mut ibv_qp = &mut *q;
        let addr = p as usize;
        let t = std::thread::spawn(move || {
            let p = addr as *mut ibv_qp;
            std::thread::sleep(std::time::Duration::from_millis(20));
            let mut ev = ibv_async_event {
                element: ibv_async_event__bindgen_ty_1 { qp: p },
                event_type: IBV_EVENT_COMM_EST,
            };
            // SAFETY: p stays alive until the main thread's wait returns.
            unsafe {
                ibv_ack_async_event(&mut ev);
                ibv_ack_async_event(&mut ev);
            }
        });
        // SAFETY: zeroed mutex/cond are glibc's static initialisers; the
        // QP outlives the wait.
        unsafe {
            wait_acked(
                &raw mut (*p).mutex,
                &raw mut (*p).cond,
                &raw const (*p).events_completed,
                2,
            )
        };
        t.join().unwrap();
        assert_eq!(q.events_completed, 2);
    }
}
