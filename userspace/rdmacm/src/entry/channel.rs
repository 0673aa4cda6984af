//! Event channels and CM events: `rdma_create_event_channel`,
//! `rdma_destroy_event_channel`, `rdma_get_cm_event`, `rdma_ack_cm_event`,
//! `rdma_event_str`. The channels and their queues are
//! [`crate::objects::channel`]'s.

use std::ffi::{c_char, c_int};

use crate::{
    abi::*,
    base::errno::{ffi, ffi_int, ffi_ptr},
    objects::channel,
};

/// `rdma_create_event_channel`.
#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ffi_ptr(channel::create)
}

/// `rdma_destroy_event_channel`: the program destroys its ids first (as
/// rdma-core requires); their queued events go with the channel.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    // SAFETY: the program's channel, destroyed once.
    ffi((), || unsafe { channel::destroy(channel) })
}

/// `rdma_get_cm_event`: the next event, blocking unless the fd is
/// O_NONBLOCK (then -1/EAGAIN when none is queued).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    ffi_int(|| {
        if channel.is_null() || event.is_null() {
            return Err(libc::EINVAL);
        }
        let shared = channel::shared_of(channel)?;
        let next = shared.next()?;
        // SAFETY: the program's out-pointer.
        unsafe { *event = next as *mut rdma_cm_event };
        Ok(())
    })
}

/// `rdma_ack_cm_event`.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    ffi_int(|| {
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: an event from rdma_get_cm_event, acked once.
        unsafe { channel::ack(event) };
        Ok(())
    })
}

/// `rdma_event_str`: rdma-core's names.
#[no_mangle]
pub extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    event_name(event).as_ptr()
}

pub(crate) fn event_name(event: rdma_cm_event_type) -> &'static std::ffi::CStr {
    match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::id::{rdma_destroy_id, rdma_migrate_id};
    use crate::objects::id::{self, CmId};

    fn readable(fd: c_int) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
    }

    fn set_nonblocking(fd: c_int) {
        // SAFETY: fcntl on the channel's own fd.
        unsafe {
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            )
        };
    }

    /// Posts one event for `c_id` as a resolution would.
    fn post(c_id: *mut rdma_cm_id, kind: rdma_cm_event_type, status: c_int) {
        // SAFETY: a live id made by the test.
        let cm = unsafe { CmId::from_c(c_id) }.unwrap();
        let st = cm.lock();
        CmId::post(&cm.shared, &st, kind, status);
    }

    #[test]
    fn the_fd_is_readable_exactly_while_events_are_queued() {
        let ch = rdma_create_event_channel();
        // SAFETY: the channel just made.
        let fd = unsafe { (*ch).fd };
        let c_id = id::create(ch, std::ptr::null_mut(), RDMA_PS_TCP).unwrap();
        set_nonblocking(fd);
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY (all FFI calls below): live channel, id and events.
        unsafe {
            assert!(!readable(fd));
            assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
            assert_eq!(crate::base::errno::errno(), libc::EAGAIN);
            post(c_id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
            post(c_id, RDMA_CM_EVENT_ROUTE_ERROR, -libc::ETIMEDOUT);
            assert!(readable(fd));
            assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
            assert_eq!(
                ((*ev).event, (*ev).status, (*ev).id),
                (RDMA_CM_EVENT_ADDR_RESOLVED, 0, c_id)
            );
            assert!(readable(fd), "one event is still queued");
            assert_eq!(rdma_ack_cm_event(ev), 0);
            assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
            assert_eq!(
                ((*ev).event, (*ev).status),
                (RDMA_CM_EVENT_ROUTE_ERROR, -libc::ETIMEDOUT)
            );
            assert!(!readable(fd));
            assert_eq!(rdma_ack_cm_event(ev), 0);
            // Destroy drops what was never taken, and the fd goes quiet.
            post(c_id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
            assert!(readable(fd));
            assert_eq!(rdma_destroy_id(c_id), 0);
            assert!(!readable(fd));
            assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
            rdma_destroy_event_channel(ch);
        }
    }

    #[test]
    fn a_blocking_get_waits_for_the_event() {
        let ch = rdma_create_event_channel();
        let c_id = id::create(ch, std::ptr::null_mut(), RDMA_PS_UDP).unwrap() as usize;
        let poster = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            post(
                c_id as *mut rdma_cm_id,
                RDMA_CM_EVENT_ADDR_ERROR,
                -libc::ENODEV,
            );
        });
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        let t0 = std::time::Instant::now();
        // SAFETY: live channel, id and event.
        unsafe {
            assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
            assert!(t0.elapsed() >= std::time::Duration::from_millis(90));
            assert_eq!((*ev).event, RDMA_CM_EVENT_ADDR_ERROR);
            rdma_ack_cm_event(ev);
            poster.join().unwrap();
            assert_eq!(rdma_destroy_id(c_id as *mut rdma_cm_id), 0);
            rdma_destroy_event_channel(ch);
        }
    }

    #[test]
    fn migrate_moves_queued_events_to_the_new_channel() {
        let (from, to) = (rdma_create_event_channel(), rdma_create_event_channel());
        let c_id = id::create(from, std::ptr::null_mut(), RDMA_PS_TCP).unwrap();
        post(c_id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
        // SAFETY: live channels, id and event.
        unsafe {
            assert_eq!(rdma_migrate_id(c_id, to), 0);
            assert_eq!((*c_id).channel, to);
            assert!(!readable((*from).fd));
            assert!(readable((*to).fd));
            let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
            assert_eq!(rdma_get_cm_event(to, &mut ev), 0);
            assert_eq!((*ev).event, RDMA_CM_EVENT_ROUTE_RESOLVED);
            rdma_ack_cm_event(ev);
            assert_eq!(rdma_destroy_id(c_id), 0);
            rdma_destroy_event_channel(from);
            rdma_destroy_event_channel(to);
        }
    }

    #[test]
    fn a_destroyed_channel_leaves_a_waiter_waiting_and_answers_later_gets_ebadf() {
        let ch = rdma_create_event_channel() as usize;
        let waiter = std::thread::spawn(move || {
            let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
            // SAFETY: a channel that is live when the wait starts.
            unsafe { rdma_get_cm_event(ch as *mut _, &mut ev) }
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        // SAFETY: the channel made above, destroyed once.
        unsafe { rdma_destroy_event_channel(ch as *mut _) };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waiter.is_finished(), "a waiter waits on, as in the kernel");
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the program's (dangling) channel pointer is only looked
        // up, never dereferenced; a second destroy is ignored.
        unsafe {
            assert_eq!(rdma_get_cm_event(ch as *mut _, &mut ev), -1);
            assert_eq!(crate::base::errno::errno(), libc::EBADF);
            rdma_destroy_event_channel(ch as *mut _);
        }
    }

    #[test]
    fn event_names_are_rdma_cores() {
        assert_eq!(
            event_name(RDMA_CM_EVENT_ROUTE_RESOLVED),
            c"RDMA_CM_EVENT_ROUTE_RESOLVED"
        );
        assert_eq!(
            event_name(RDMA_CM_EVENT_TIMEWAIT_EXIT),
            c"RDMA_CM_EVENT_TIMEWAIT_EXIT"
        );
        assert_eq!(event_name(99), c"UNKNOWN EVENT");
    }
}
