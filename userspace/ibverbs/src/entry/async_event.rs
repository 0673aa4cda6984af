//! Asynchronous events: `ibv_get_async_event`, `ibv_ack_async_event`.
//!
//! Producers write a [`AsyncRecord`] to the context's async pipe
//! ([`crate::objects::events`], which also counts the events reported for
//! each object); programs read `context->async_fd` through
//! `ibv_get_async_event` and ack with `ibv_ack_async_event`.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::base::errno::{ffi, set_errno};
use crate::objects::context::context;
use crate::objects::events::{ack, kind_of, note_reported, AsyncRecord, Kind};

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
    use crate::objects::events::wait_acked;

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
