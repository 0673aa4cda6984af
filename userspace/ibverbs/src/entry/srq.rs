//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`,
//! `ibv_query_srq`, `ibv_destroy_srq` and `context->ops.post_srq_recv`.
//! The limit event (`IBV_EVENT_SRQ_LIMIT_REACHED`) goes to the async fd
//! of the context the SRQ was created on.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::abi::*;
use crate::base::errno::{fail, ffi_int, ffi_ptr, verbs_fail};
use crate::base::limits::{MAX_SGE, MAX_SRQ_WR};
use crate::entry::post::post_recv_list;
use crate::objects::context::{context, Context};
use crate::objects::events;
use crate::objects::{outer, Pd, Srq};

fn next_handle() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The SRQ behind a program's pointer, shared (its queue locks itself).
///
/// # Safety
/// `srq` is NULL or an SRQ this library created and has not destroyed.
unsafe fn srq_ref<'a>(srq: *mut ibv_srq) -> Option<&'a Srq> {
    if !crate::base::handles::check(srq as *const Srq) {
        return None;
    }
    // SAFETY: ibv_srq is the first field of the repr(C) Srq.
    unsafe { (srq as *const Srq).as_ref() }
}

/// Checks the requested size of an SRQ (`max_wr`, `max_sge`).
pub(crate) fn check_srq_size(max_wr: u32, max_sge: u32) -> Result<(), i32> {
    if max_wr == 0 || max_wr > MAX_SRQ_WR {
        return Err(fail(
            libc::EINVAL,
            format_args!("SRQ: max_wr {max_wr} (1..={MAX_SRQ_WR})"),
        ));
    }
    if max_sge > MAX_SGE {
        return Err(fail(
            libc::EINVAL,
            format_args!("SRQ: max_sge {max_sge} exceeds the device's {MAX_SGE}"),
        ));
    }
    Ok(())
}

fn create(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> Result<*mut ibv_srq, i32> {
    // SAFETY: the program passes a live PD of ours.
    let p = unsafe { outer::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
    // SAFETY: the program passes a valid ibv_srq_init_attr.
    let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
    // SAFETY: a PD's context is the open context it was allocated on.
    let c = unsafe { context(p.pd.context) }.ok_or(libc::EINVAL)?;
    check_srq_size(a.attr.max_wr, a.attr.max_sge)?;
    let inner = p
        .inner
        .create_srq(a.attr.max_wr as usize, a.attr.max_sge as usize);
    let s = Box::leak(Box::new(Srq {
        srq: ibv_srq {
            context: p.pd.context,
            srq_context: a.srq_context,
            pd,
            handle: next_handle(),
            ..Default::default()
        },
        inner,
        ctx: c as *mut Context,
        users: AtomicU32::new(0),
    }));
    crate::base::handles::born(&*s as *const crate::objects::Srq);
    // SAFETY: initialising the SRQ's own mutex and condition variable
    // (ibv_ack_async_event uses them) before anyone sees them.
    unsafe {
        libc::pthread_mutex_init(
            &mut s.srq.mutex as *mut _ as *mut libc::pthread_mutex_t,
            std::ptr::null(),
        );
        libc::pthread_cond_init(
            &mut s.srq.cond as *mut _ as *mut libc::pthread_cond_t,
            std::ptr::null(),
        );
    }
    events::track(&mut s.srq as *mut ibv_srq as *mut c_void, events::Kind::Srq);
    c.own_srq(s.inner.id(), &mut s.srq);
    // Granted exactly as asked (srq_limit is ignored at creation, IBTA).
    a.attr.max_wr = s.inner.max_wr() as u32;
    a.attr.max_sge = s.inner.max_sge() as u32;
    Ok(&mut s.srq as *mut ibv_srq)
}

/// `ibv_create_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    srq_init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    ffi_ptr(|| create(pd, srq_init_attr))
}

fn modify(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> Result<(), i32> {
    // SAFETY: the program passes a live SRQ of ours.
    let s = unsafe { srq_ref(srq) }.ok_or(libc::EINVAL)?;
    // SAFETY: the program passes a valid ibv_srq_attr.
    let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
    let mask = mask as u32;
    if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return Err(fail(
            libc::EINVAL,
            format_args!("ibv_modify_srq: unknown attr_mask bits {mask:#x}"),
        ));
    }
    if mask & IBV_SRQ_MAX_WR != 0 {
        check_srq_size(a.max_wr, 0)?;
        if a.max_wr < s.inner.limit() as u32 {
            return Err(fail(
                libc::EINVAL,
                "ibv_modify_srq: max_wr below the armed srq_limit",
            ));
        }
        s.inner.resize(a.max_wr as usize).map_err(verbs_fail)?;
    }
    if mask & IBV_SRQ_LIMIT != 0 {
        // The event reaches the creating context's async fd (own_srq).
        s.inner
            .set_limit(a.srq_limit as usize)
            .map_err(verbs_fail)?;
    }
    Ok(())
}

/// `ibv_modify_srq`: IBV_SRQ_MAX_WR resizes, IBV_SRQ_LIMIT arms the limit
/// event (0 disarms).
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    srq_attr: *mut ibv_srq_attr,
    srq_attr_mask: c_int,
) -> c_int {
    ffi_int(|| modify(srq, srq_attr, srq_attr_mask))
}

/// `ibv_query_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, srq_attr: *mut ibv_srq_attr) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live SRQ of ours.
        let s = unsafe { srq_ref(srq) }.ok_or(libc::EINVAL)?;
        // SAFETY: the program passes a writable ibv_srq_attr.
        let out = unsafe { srq_attr.as_mut() }.ok_or(libc::EINVAL)?;
        *out = ibv_srq_attr {
            max_wr: s.inner.max_wr() as u32,
            max_sge: s.inner.max_sge() as u32,
            srq_limit: s.inner.limit() as u32,
        };
        Ok(())
    })
}

/// `ibv_destroy_srq`: EBUSY while a QP uses it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    ffi_int(|| {
        // SAFETY: an SRQ this library created, destroyed once.
        let s = unsafe { outer::<_, Srq>(srq) }.ok_or(libc::EINVAL)?;
        if s.users.load(Ordering::Acquire) != 0 {
            return Err(fail(
                libc::EBUSY,
                "ibv_destroy_srq: QPs still use it (destroy them first)",
            ));
        }
        // No more events may name it; then wait until the program acked
        // the events it read.
        let _ = s.inner.set_limit(0);
        // SAFETY: set at creation to the open context, which outlives the
        // SRQ (rdma-core's contract).
        unsafe { &*s.ctx }.disown_srq(s.inner.id());
        let reported = events::untrack(srq as *mut c_void);
        // SAFETY: the SRQ's own mutex, condition variable and counter,
        // initialised at creation; the program's acks raise the counter.
        unsafe {
            events::wait_acked(
                &mut s.srq.mutex,
                &mut s.srq.cond,
                &s.srq.events_completed,
                reported,
            )
        };
        // SAFETY: nothing uses them any more (rdma-core's contract).
        unsafe {
            libc::pthread_mutex_destroy(&mut s.srq.mutex as *mut _ as *mut libc::pthread_mutex_t);
            libc::pthread_cond_destroy(&mut s.srq.cond as *mut _ as *mut libc::pthread_cond_t);
        }
        // SAFETY: the Box was leaked by create.
        crate::base::handles::free(unsafe { Box::from_raw(s as *mut Srq) });
        Ok(())
    })
}

/// `context->ops.post_srq_recv` (the inline `ibv_post_srq_recv`): EINVAL
/// for more SGEs than the SRQ's max_sge, ENOMEM when it is full; `*bad_wr`
/// names the request that failed.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live SRQ of ours.
        let s = unsafe { srq_ref(srq) }.ok_or(libc::EINVAL)?;
        let max_sge = s.inner.max_sge() as u32;
        // SAFETY: the program's request list and bad_wr slot.
        unsafe {
            post_recv_list(wr, bad_wr, max_sge, "post_srq_recv", |rw| {
                Ok(s.inner.post_recv(rw)?)
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert!(check_srq_size(1, 0).is_ok());
        assert!(check_srq_size(MAX_SRQ_WR, MAX_SGE).is_ok());
        assert_eq!(check_srq_size(0, 1), Err(libc::EINVAL));
        assert_eq!(check_srq_size(MAX_SRQ_WR + 1, 1), Err(libc::EINVAL));
        assert_eq!(check_srq_size(16, MAX_SGE + 1), Err(libc::EINVAL));
    }
}
