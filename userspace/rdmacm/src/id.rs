//! Communication identifiers: `rdma_create_id` (with a channel, or NULL
//! for a synchronous id whose calls wait for their own event),
//! `rdma_destroy_id`, `rdma_migrate_id`, `rdma_set_option`, the ECE calls.
//!
//! Every `struct rdma_cm_id` handed to the program is the first field of a
//! [`CmId`], so the pointer leads back to the id's state. Address and route
//! resolution finish on other threads: they write the id's C fields only
//! under its state lock and only while it is alive, and the program reads
//! them after taking the event, which the channel's lock orders after.

use std::{
    cell::UnsafeCell,
    collections::BTreeSet,
    ffi::{c_int, c_void},
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use crate::{
    abi::*,
    channel::{self, Channel, ChannelShared},
    errno::{fail, ffi_int},
    ports::{self, BindingKey},
};

/// Where an id stands (the kernel's `enum rdma_cm_state`, as far as this
/// library goes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Idle,
    Bound,
    AddrQuery,
    AddrResolved,
    RouteResolved,
    /// rdma_listen'ed.
    Listening,
    /// REQ or SIDR_REQ sent (active), or received and not answered yet
    /// (passive).
    Connecting,
    /// REP sent, waiting for the RTU (passive).
    Accepting,
    Connected,
    /// DREQ sent or received.
    Disconnecting,
    /// Rejected, unreachable or disconnected for good.
    Closed,
}

/// Options set with `rdma_set_option`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Options {
    pub(crate) tos: Option<u8>,
    pub(crate) reuseaddr: bool,
    pub(crate) afonly: bool,
    pub(crate) ack_timeout: Option<u8>,
}

/// `struct rdma_cm_id` and its state.
///
/// The C struct sits in an `UnsafeCell`: the program and this library
/// write its fields (`event`, `qp`, `route`, ...) while a `&CmId` is held;
/// without the cell those are writes through a shared reference, UB that
/// release builds acted on (a synchronous id's `id->event` kept an event
/// already acked: rdma_disconnect freed it twice, or destroy waited for an
/// ack that never came).
#[repr(C)]
pub(crate) struct CmId {
    pub(crate) c: UnsafeCell<rdma_cm_id>,
    pub(crate) shared: Arc<IdShared>,
}

pub(crate) struct IdShared {
    pub(crate) state: Mutex<IdState>,
    /// Events handed to the program and not acked yet.
    unacked: Mutex<u32>,
    acked: Condvar,
}

pub(crate) struct IdState {
    /// Cleared by rdma_destroy_id: late resolutions then drop their result.
    pub(crate) alive: bool,
    /// The C struct (a `*mut CmId`), for the resolution threads.
    c_id: usize,
    pub(crate) phase: Phase,
    pub(crate) channel: Arc<ChannelShared>,
    /// A synchronous id's own channel (`*mut Channel`), 0 otherwise.
    sync_channel: usize,
    pub(crate) binding: Option<BindingKey>,
    pub(crate) options: Options,
    /// Bumped by each resolution and by destroy, so that only the latest
    /// resolution of a live id reports.
    pub(crate) query: u64,
    pub(crate) path: Option<Box<ibv_sa_path_rec>>,
    local_ece: ibv_ece,
    /// The connection the CM made or is making for this id.
    pub(crate) conn: Option<crate::conn::Connection>,
    /// Where this id listens: (agent, service ID) pairs.
    pub(crate) listens: Vec<crate::listen::ListenKey>,
    /// rdma_create_ep's QP attributes of a passive endpoint, for the QPs
    /// rdma_get_request makes.
    pub(crate) qp_init_attr: Option<ibv_qp_init_attr>,
}

// SAFETY: the raw pointers inside (the path record owned here, the C id
// and channel addresses kept as integers) are only used under the lock.
unsafe impl Send for IdState {}

impl IdShared {
    /// An event of this id went to the program.
    pub(crate) fn delivered(&self) {
        *self.unacked.lock().unwrap() += 1;
    }

    /// The program acked one.
    pub(crate) fn acked(&self) {
        let mut n = self.unacked.lock().unwrap();
        *n = n.saturating_sub(1);
        self.acked.notify_all();
    }

    /// Waits until the program acked every event it took, as rdma-core's
    /// destroy and migrate do.
    fn wait_acked(&self) {
        let mut n = self.unacked.lock().unwrap();
        while *n > 0 {
            n = self.acked.wait(n).unwrap();
        }
    }
}

impl IdState {
    /// The C id, for writing results into it (state lock held).
    pub(crate) fn c_id(&self) -> *mut rdma_cm_id {
        self.c_id as *mut rdma_cm_id
    }

    pub(crate) fn is_sync(&self) -> bool {
        self.sync_channel != 0
    }
}

/// The addresses of the ids handed out and not destroyed. A program may
/// pass an id it already destroyed or never made (perftest does on its
/// REJECTED path): such a pointer is refused with EINVAL instead of being
/// read, where rdma-core would read freed memory.
static LIVE_IDS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

impl CmId {
    /// The id behind a pointer from the program; EINVAL for NULL or for a
    /// pointer that is not a live id of this library.
    ///
    /// # Safety
    /// A live id stays live while the returned reference is used (the
    /// program does not destroy an id while another call on it runs, as
    /// rdma-core requires).
    pub(crate) unsafe fn from_c<'a>(id: *mut rdma_cm_id) -> Result<&'a CmId, i32> {
        if id.is_null() || !LIVE_IDS.lock().unwrap().contains(&(id as usize)) {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live id: CmId starts with the rdma_cm_id handed out.
        Ok(unsafe { &*(id as *const CmId) })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, IdState> {
        self.shared.state.lock().unwrap()
    }

    /// Queues an event for this id (state lock held).
    pub(crate) fn post(
        shared: &Arc<IdShared>,
        st: &IdState,
        kind: rdma_cm_event_type,
        status: c_int,
    ) {
        st.channel.post(shared, st.c_id(), kind, status);
    }

    /// For a synchronous id: waits for the event the call just started and
    /// leaves it in `id->event` (acking the previous one), as rdma-core
    /// does; its status becomes the call's errno.
    pub(crate) fn complete(&self) -> Result<(), i32> {
        let channel = {
            let st = self.lock();
            if !st.is_sync() {
                return Ok(());
            }
            st.channel.clone()
        };
        let c = self.c_ptr();
        // SAFETY: a synchronous id's `event` field is written only by the
        // thread calling into it (the program does not share sync ids).
        unsafe {
            if !(*c).event.is_null() {
                channel::ack((*c).event);
                (*c).event = std::ptr::null_mut();
            }
        }
        let event = channel.wait_event()?;
        // SAFETY: as above; `event` is a live event of this id.
        let status = unsafe {
            (*c).event = event as *mut rdma_cm_event;
            (*c).event.as_ref().map_or(0, |e| e.status)
        };
        match status {
            0 => Ok(()),
            s if s < 0 => Err(-s),
            s => Err(s),
        }
    }

    pub(crate) fn c_ptr(&self) -> *mut rdma_cm_id {
        self.c.get()
    }
}

/// The QP type rdma_cm uses for a port space (EINVAL for an unknown one,
/// as the kernel answers).
fn qp_type_of(ps: rdma_port_space) -> Result<ibv_qp_type, i32> {
    match ps {
        RDMA_PS_TCP | RDMA_PS_IB => Ok(IBV_QPT_RC),
        RDMA_PS_UDP | RDMA_PS_IPOIB => Ok(IBV_QPT_UD),
        _ => Err(libc::EINVAL),
    }
}

/// Makes an id; `channel` NULL makes a synchronous one.
pub(crate) fn create(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: rdma_port_space,
) -> Result<*mut rdma_cm_id, i32> {
    let qp_type = qp_type_of(ps)?;
    let (channel_ptr, shared_channel, sync_channel) = if channel.is_null() {
        let own = channel::rdma_create_event_channel();
        if own.is_null() {
            return Err(crate::errno::errno());
        }
        // SAFETY: a channel just made; Channel starts with it.
        let shared = unsafe { (*(own as *mut Channel)).shared.clone() };
        (own, shared, own as usize)
    } else {
        // SAFETY: a live channel from rdma_create_event_channel.
        let shared = unsafe { (*(channel as *mut Channel)).shared.clone() };
        (channel, shared, 0)
    };
    let id = Box::new(CmId {
        c: UnsafeCell::new(rdma_cm_id {
            channel: channel_ptr,
            context,
            ps,
            qp_type,
            ..Default::default()
        }),
        shared: Arc::new(IdShared {
            state: Mutex::new(IdState {
                alive: true,
                c_id: 0,
                phase: Phase::Idle,
                channel: shared_channel,
                sync_channel,
                binding: None,
                options: Options::default(),
                query: 0,
                path: None,
                local_ece: ibv_ece::default(),
                conn: None,
                listens: Vec::new(),
                qp_init_attr: None,
            }),
            unacked: Mutex::new(0),
            acked: Condvar::new(),
        }),
    });
    let shared = id.shared.clone();
    let raw = Box::into_raw(id);
    shared.state.lock().unwrap().c_id = raw as usize;
    LIVE_IDS.lock().unwrap().insert(raw as usize);
    Ok(raw as *mut rdma_cm_id)
}

/// Destroys an id: no more events for it, its queued ones dropped, then
/// waits until the program acked those it took (rdma-core's contract).
///
/// # Safety
/// `id` is a live id; the program does not use it afterwards.
pub(crate) unsafe fn destroy(id: *mut rdma_cm_id) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let cm = unsafe { CmId::from_c(id) }?;
    let (channel, sync_channel, binding) = {
        let mut st = cm.lock();
        st.alive = false;
        st.query += 1;
        // The CM forgets the id's connection and listens as ib_cm's
        // destroy does (REJ, DREQ or DREP on the wire as the state asks).
        crate::teardown::forget(&mut st);
        (st.channel.clone(), st.sync_channel, st.binding.take())
    };
    channel.purge(&cm.shared);
    if sync_channel != 0 {
        // SAFETY: a synchronous id's event is its own to ack.
        unsafe {
            if !(*id).event.is_null() {
                channel::ack((*id).event);
                (*id).event = std::ptr::null_mut();
            }
        }
    }
    cm.shared.wait_acked();
    if let Some(key) = binding {
        ports::release(key);
    }
    drop(channel);
    // A second destroy of the same pointer now gets EINVAL.
    if !LIVE_IDS.lock().unwrap().remove(&(id as usize)) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the id was boxed by create() and was still live (removed
    // from LIVE_IDS just now, so this runs once); no resolution can touch
    // it now (alive is false).
    drop(unsafe { Box::from_raw(id as *mut CmId) });
    if sync_channel != 0 {
        // SAFETY: the id's own channel, made by create().
        unsafe { channel::rdma_destroy_event_channel(sync_channel as *mut rdma_event_channel) };
    }
    Ok(())
}

// ------------------------------------------------ C entry points

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
            let own = channel::rdma_create_event_channel();
            if own.is_null() {
                return Err(crate::errno::errno());
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
            unsafe { channel::rdma_destroy_event_channel(old_sync as *mut rdma_event_channel) };
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
                return crate::address::resolve_route(cm, id);
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
        (rc, if rc == 0 { 0 } else { crate::errno::errno() })
    }

    #[test]
    fn options_are_checked_as_the_kernel_checks_them() {
        let ch = channel::rdma_create_event_channel();
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
        assert_eq!((rc, crate::errno::errno()), (-1, libc::EFAULT));
        // SAFETY: the ids and channel made above.
        unsafe {
            let st = CmId::from_c(rc_id).unwrap().lock();
            assert_eq!(st.options.tos, Some(32));
            assert!(st.options.reuseaddr && st.options.afonly);
            assert_eq!(st.options.ack_timeout, Some(14));
            drop(st);
            assert_eq!(rdma_destroy_id(rc_id), 0);
            assert_eq!(rdma_destroy_id(ud_id), 0);
            channel::rdma_destroy_event_channel(ch);
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
        assert_eq!((rc, crate::errno::errno()), (-1, libc::EINVAL));
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
                (rdma_destroy_id(id), crate::errno::errno()),
                (-1, libc::EINVAL)
            );
            let bogus = 0x5555_5555_5555_5553usize as *mut rdma_cm_id;
            assert_eq!(
                (rdma_destroy_id(bogus), crate::errno::errno()),
                (-1, libc::EINVAL)
            );
            assert!(CmId::from_c(bogus).is_err());
        }
    }
}
