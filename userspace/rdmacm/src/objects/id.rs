//! Communication identifiers: the state behind each `struct rdma_cm_id`
//! (its phase, channel, binding, options, connection and listens), the
//! table of live ids, and making and destroying them. The calls are in
//! `entry/id.rs`.
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
    objects::{
        channel::{self, Channel, ChannelShared},
        conn::Connection,
        listen::ListenKey,
        ports::{self, BindingKey},
        teardown,
    },
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
    pub(crate) sync_channel: usize,
    pub(crate) binding: Option<BindingKey>,
    pub(crate) options: Options,
    /// Bumped by each resolution and by destroy, so that only the latest
    /// resolution of a live id reports.
    pub(crate) query: u64,
    pub(crate) path: Option<Box<ibv_sa_path_rec>>,
    pub(crate) local_ece: ibv_ece,
    /// The connection the CM made or is making for this id.
    pub(crate) conn: Option<Connection>,
    /// Where this id listens: (agent, service ID) pairs.
    pub(crate) listens: Vec<ListenKey>,
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
    pub(crate) fn wait_acked(&self) {
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
pub(crate) fn qp_type_of(ps: rdma_port_space) -> Result<ibv_qp_type, i32> {
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
        let own = channel::create()?;
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
        teardown::forget(&mut st);
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
        unsafe { channel::destroy(sync_channel as *mut rdma_event_channel) };
    }
    Ok(())
}
