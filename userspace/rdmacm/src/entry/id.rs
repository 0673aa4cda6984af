//! Communication identifiers: `rdma_create_id` (with a channel, or NULL
//! for a synchronous id whose calls wait for their own event),
//! `rdma_destroy_id`, `rdma_migrate_id`, `rdma_set_option`, the ECE calls.
//! The ids themselves are [`crate::objects::id`]'s.

use std::ffi::{c_int, c_void};

use crate::{
    abi::*,
    base::errno::{fail, ffi_int},
    entry::channel as channel_calls,
    objects::{
        channel::{self, Channel},
        id::{create, destroy, CmId, Phase},
    },
};

/// `rdma_create_id`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    ffi_int(|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let made = create(channel, context, ps)?;
        // SAFETY: the program's out-pointer.
        unsafe { *id = made };
        Ok(())
    })
}

/// `rdma_destroy_id`.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: the program passes a live id, as rdma-core requires.
    ffi_int(|| unsafe { destroy(id) })
}

/// `rdma_migrate_id`: moves the id and its queued events to `channel`
/// (NULL: a synchronous id with a channel of its own), after the program
/// acked the events it took from the old one.
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id.
        let cm = unsafe { CmId::from_c(id) }?;
        let (new_ptr, new_shared, new_sync) = if channel.is_null() {
            let own = channel_calls::rdma_create_event_channel();
            if own.is_null() {
                return Err(crate::base::errno::errno());
            }
            // SAFETY: a channel just made.
            (
                own,
                unsafe { (*(own as *mut Channel)).shared.clone() },
                own as usize,
            )
        } else {
            // SAFETY: a live channel from the program.
            (
                channel,
                unsafe { (*(channel as *mut Channel)).shared.clone() },
                0,
            )
        };
        // A synchronous id holds its last event itself.
        // SAFETY: the id's own event field (see CmId::complete).
        unsafe {
            if cm.lock().is_sync() && !(*id).event.is_null() {
                channel::ack((*id).event);
                (*id).event = std::ptr::null_mut();
            }
        }
        cm.shared.wait_acked();
        let old_sync = {
            let mut st = cm.lock();
            st.channel.move_events(&cm.shared, &new_shared);
            st.channel = new_shared;
            // SAFETY: under the state lock, as resolutions write the id.
            unsafe { (*id).channel = new_ptr };
            std::mem::replace(&mut st.sync_channel, new_sync)
        };
        if old_sync != 0 {
            // SAFETY: the id's previous own channel, no longer referenced.
            unsafe {
                channel_calls::rdma_destroy_event_channel(old_sync as *mut rdma_event_channel)
            };
        }
        Ok(())
    })
}

/// Reads an option value of exactly `T`'s size (EINVAL otherwise).
///
/// # Safety
/// `optval` points at `optlen` readable bytes.
unsafe fn option_value<T: Copy>(optval: *const c_void, optlen: usize) -> Result<T, i32> {
    if optlen != std::mem::size_of::<T>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise; read unaligned as C may pass any buffer.
    Ok(unsafe { std::ptr::read_unaligned(optval as *const T) })
}

/// `rdma_set_option`: the options the kernel's rdma_cm accepts, with its
/// checks; an unknown level or option is ENOSYS, as the kernel answers.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id.
        let cm = unsafe { CmId::from_c(id) }?;
        if optval.is_null() && optlen > 0 {
            return Err(libc::EFAULT);
        }
        let mut st = cm.lock();
        // SAFETY (all option_value calls): optval holds optlen bytes.
        match (level as u32, optname as u32) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => {
                st.options.tos = Some(unsafe { option_value::<u8>(optval, optlen) }?);
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => {
                let reuse = unsafe { option_value::<c_int>(optval, optlen) }? != 0;
                // The kernel allows it before binding only.
                if st.phase != Phase::Idle {
                    return Err(libc::EINVAL);
                }
                st.options.reuseaddr = reuse;
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => {
                let afonly = unsafe { option_value::<c_int>(optval, optlen) }? != 0;
                if !matches!(st.phase, Phase::Idle | Phase::Bound) {
                    return Err(libc::EINVAL);
                }
                st.options.afonly = afonly;
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => {
                let timeout = unsafe { option_value::<u8>(optval, optlen) }?;
                // SAFETY: the program's live id.
                if unsafe { (*id).qp_type } != IBV_QPT_RC {
                    return Err(libc::EINVAL);
                }
                st.options.ack_timeout = Some(timeout);
            }
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
                let one = std::mem::size_of::<ibv_path_data>();
                if optlen == 0 || !optlen.is_multiple_of(one) {
                    return Err(libc::EINVAL);
                }
                // A path given by the program stands for route resolution;
                // xroce computes the RoCE path itself.
                drop(st);
                return crate::entry::address::resolve_route(cm, id);
            }
            _ => {
                return Err(fail(
                    libc::ENOSYS,
                    format_args!("rdma_set_option: level {level} option {optname} is unknown"),
                ))
            }
        }
        Ok(())
    })
}

/// `rdma_set_local_ece`: kept for the connection (EINVAL with a QP, as
/// rdma-core).
#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id.
        let cm = unsafe { CmId::from_c(id) }?;
        // SAFETY: the program's id and ECE.
        if ece.is_null() || !unsafe { (*id).qp }.is_null() {
            return Err(libc::EINVAL);
        }
        cm.lock().local_ece = unsafe { *ece };
        Ok(())
    })
}

/// `rdma_get_remote_ece`: the peer's ECE, none (zero) before a connection.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id.
        unsafe { CmId::from_c(id) }?;
        // SAFETY: the program's id and ECE.
        if ece.is_null() || !unsafe { (*id).qp }.is_null() {
            return Err(libc::EINVAL);
        }
        unsafe { *ece = ibv_ece::default() };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::id::qp_type_of;

    fn set(id: *mut rdma_cm_id, level: u32, name: u32, value: &[u8]) -> (c_int, i32) {
        // SAFETY: a live id and a buffer of value.len() bytes.
        let rc = unsafe {
            rdma_set_option(
                id,
                level as c_int,
                name as c_int,
                value.as_ptr() as *mut _,
                value.len(),
            )
        };
        (
            rc,
            if rc == 0 {
                0
            } else {
                crate::base::errno::errno()
            },
        )
    }

    #[test]
    fn options_are_checked_as_the_kernel_checks_them() {
        let ch = channel_calls::rdma_create_event_channel();
        let rc_id = create(ch, std::ptr::null_mut(), RDMA_PS_TCP).unwrap();
        let ud_id = create(ch, std::ptr::null_mut(), RDMA_PS_UDP).unwrap();
        let one = 1i32.to_ne_bytes();
        assert_eq!(
            set(rc_id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &[32]),
            (0, 0)
        );
        assert_eq!(
            set(rc_id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one),
            (-1, libc::EINVAL)
        );
        assert_eq!(
            set(rc_id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one),
            (0, 0)
        );
        assert_eq!(
            set(rc_id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one),
            (0, 0)
        );
        assert_eq!(
            set(rc_id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &[14]),
            (0, 0)
        );
        // ACK timeout is for connected (RC) ids only.
        assert_eq!(
            set(ud_id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &[14]),
            (-1, libc::EINVAL)
        );
        // A path before the address is resolved.
        let path = [0u8; std::mem::size_of::<ibv_path_data>()];
        assert_eq!(
            set(rc_id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &path),
            (-1, libc::EINVAL)
        );
        assert_eq!(
            set(rc_id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &[0; 3]),
            (-1, libc::EINVAL)
        );
        assert_eq!(set(rc_id, RDMA_OPTION_ID, 99, &one), (-1, libc::ENOSYS));
        assert_eq!(set(rc_id, 7, 0, &one), (-1, libc::ENOSYS));
        // SAFETY: a NULL value of non-zero length.
        let rc = unsafe { rdma_set_option(rc_id, 0, 0, std::ptr::null_mut(), 1) };
        assert_eq!((rc, crate::base::errno::errno()), (-1, libc::EFAULT));
        // SAFETY: the ids and channel made above.
        unsafe {
            let st = CmId::from_c(rc_id).unwrap().lock();
            assert_eq!(st.options.tos, Some(32));
            assert!(st.options.reuseaddr && st.options.afonly);
            assert_eq!(st.options.ack_timeout, Some(14));
            drop(st);
            assert_eq!(rdma_destroy_id(rc_id), 0);
            assert_eq!(rdma_destroy_id(ud_id), 0);
            channel_calls::rdma_destroy_event_channel(ch);
        }
    }

    #[test]
    fn port_spaces_give_qp_types_and_unknown_ones_are_refused() {
        assert_eq!(qp_type_of(RDMA_PS_TCP), Ok(IBV_QPT_RC));
        assert_eq!(qp_type_of(RDMA_PS_IB), Ok(IBV_QPT_RC));
        assert_eq!(qp_type_of(RDMA_PS_UDP), Ok(IBV_QPT_UD));
        assert_eq!(qp_type_of(RDMA_PS_IPOIB), Ok(IBV_QPT_UD));
        assert_eq!(qp_type_of(0x42), Err(libc::EINVAL));
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: a NULL channel (synchronous id) and an out-pointer.
        let rc =
            unsafe { rdma_create_id(std::ptr::null_mut(), &mut id, std::ptr::null_mut(), 0x42) };
        assert_eq!((rc, crate::base::errno::errno()), (-1, libc::EINVAL));
        // SAFETY: as above, a valid port space.
        let rc = unsafe {
            rdma_create_id(
                std::ptr::null_mut(),
                &mut id,
                std::ptr::null_mut(),
                RDMA_PS_IB,
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: the synchronous id just made.
        unsafe {
            assert!(
                !(*id).channel.is_null(),
                "a synchronous id has a channel of its own"
            );
            assert_eq!(rdma_destroy_id(id), 0);
        }
    }

    #[test]
    fn a_destroyed_or_unknown_id_is_einval_and_never_read() {
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: a NULL channel (synchronous id) and an out-pointer.
        let rc = unsafe {
            rdma_create_id(
                std::ptr::null_mut(),
                &mut id,
                std::ptr::null_mut(),
                RDMA_PS_TCP,
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: the id just made, destroyed once; then the same pointer
        // again and a pointer that was never an id (misaligned, as
        // perftest's uninitialised one was): neither may be dereferenced.
        unsafe {
            assert_eq!(rdma_destroy_id(id), 0);
            assert_eq!(
                (rdma_destroy_id(id), crate::base::errno::errno()),
                (-1, libc::EINVAL)
            );
            let bogus = 0x5555_5555_5555_5553usize as *mut rdma_cm_id;
            assert_eq!(
                (rdma_destroy_id(bogus), crate::base::errno::errno()),
                (-1, libc::EINVAL)
            );
            assert!(CmId::from_c(bogus).is_err());
        }
    }
}
