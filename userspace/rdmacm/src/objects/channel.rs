//! Event channels and CM events: the queue behind each channel's fd, the
//! events in it (each counted against its id until acked), and the table
//! of live channels. The calls on them are in `entry/channel.rs`.
//!
//! A channel's `fd` is an eventfd that is readable exactly while events are
//! queued (its count is 1 then, 0 otherwise), so programs can poll(2) or
//! epoll it as they poll rdma-core's /dev/infiniband/rdma_cm file; it is
//! never read by the program. `rdma_get_cm_event` blocks unless the program
//! set O_NONBLOCK on the fd (then EAGAIN), as a read of the kernel's file
//! would.
//!
//! Lock order: an id's state, then a channel's queue, then an id's unacked
//! count.

use std::{
    collections::{HashMap, VecDeque},
    ffi::c_int,
    sync::{Arc, Condvar, Mutex, OnceLock},
    time::{Duration, Instant},
};

use crate::{abi::*, objects::id::IdShared};

/// `struct rdma_event_channel` and the queue behind its fd.
#[repr(C)]
pub(crate) struct Channel {
    pub(crate) c: rdma_event_channel,
    pub(crate) shared: Arc<ChannelShared>,
}

pub(crate) struct ChannelShared {
    queue: Mutex<VecDeque<EventPtr>>,
    ready: Condvar,
    fd: c_int,
}

/// The live channels by their C address. rdma_get_cm_event finds the
/// channel here rather than through the program's pointer: programs such
/// as rping destroy the channel while their CM thread still waits in (or
/// is about to call) rdma_get_cm_event, which rdma-core answers with the
/// kernel's EBADF instead of touching freed memory. A call already
/// waiting keeps waiting, as a thread blocked in the kernel's read does
/// when another thread closes the file (rping's CM thread then ends with
/// the process).
fn live() -> &'static Mutex<HashMap<usize, Arc<ChannelShared>>> {
    static LIVE: OnceLock<Mutex<HashMap<usize, Arc<ChannelShared>>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// When each channel was destroyed (by address; the latest few).
fn destroyed() -> &'static Mutex<HashMap<usize, Instant>> {
    static DESTROYED: OnceLock<Mutex<HashMap<usize, Instant>>> = OnceLock::new();
    DESTROYED.get_or_init(|| Mutex::new(HashMap::new()))
}

/// How long a call on a just-destroyed channel waits before its EBADF.
/// rping's CM thread loops back into rdma_get_cm_event while its main
/// thread destroys the channel and exits; in the kernel that thread is
/// still inside its read, here it would see EBADF first and exit(-1)
/// before the main thread's exit(0). Waiting lets the exit win, and a
/// program that really calls on a destroyed channel still gets EBADF.
const DESTROYED_GRACE: Duration = Duration::from_secs(1);

/// The EBADF of a call on a channel that is not live.
fn not_live(channel: usize) -> i32 {
    let since = destroyed()
        .lock()
        .unwrap()
        .get(&channel)
        .map(|t| t.elapsed());
    if let Some(since) = since.filter(|s| *s < DESTROYED_GRACE) {
        std::thread::sleep(DESTROYED_GRACE - since);
    }
    libc::EBADF
}

/// A queued event (owned by the queue until handed to the program).
struct EventPtr(*mut CmEvent);
// SAFETY: the event is owned by exactly one queue or program at a time.
unsafe impl Send for EventPtr {}

/// `struct rdma_cm_event` and the id it counts against until acked.
#[repr(C)]
pub(crate) struct CmEvent {
    pub(crate) c: rdma_cm_event,
    id: Arc<IdShared>,
    /// The private data `c.param` points into (owned by the event, freed
    /// with it, as rdma-core's events own theirs).
    private_data: Box<[u8]>,
}

/// What a connection event carries besides its kind and status.
#[derive(Default)]
pub(crate) struct EventDetail {
    /// CONNECT_REQUEST: the listening id (`event->listen_id`).
    pub(crate) listen_id: Option<*mut rdma_cm_id>,
    /// `event->param` (its private_data pointer is set here).
    pub(crate) param: rdma_cm_event__bindgen_ty_1,
    /// UD events fill `param.ud`, the others `param.conn`.
    pub(crate) ud: bool,
    pub(crate) private_data: Vec<u8>,
}

impl ChannelShared {
    pub(crate) fn new() -> Result<Arc<Self>, i32> {
        // SAFETY: eventfd has no memory preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(crate::base::errno::errno());
        }
        Ok(Arc::new(ChannelShared {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            fd,
        }))
    }

    /// Queues an event for `id` (called with the id's state locked).
    pub(crate) fn post(
        &self,
        id: &Arc<IdShared>,
        c_id: *mut rdma_cm_id,
        kind: rdma_cm_event_type,
        status: c_int,
    ) {
        self.post_detailed(id, c_id, kind, status, EventDetail::default());
    }

    /// Queues an event with its listening id, parameters and private data
    /// (called with the id's state locked).
    pub(crate) fn post_detailed(
        &self,
        id: &Arc<IdShared>,
        c_id: *mut rdma_cm_id,
        kind: rdma_cm_event_type,
        status: c_int,
        detail: EventDetail,
    ) {
        let mut event = Box::new(CmEvent {
            c: rdma_cm_event {
                id: c_id,
                listen_id: detail.listen_id.unwrap_or(std::ptr::null_mut()),
                event: kind,
                status,
                param: detail.param,
            },
            id: id.clone(),
            private_data: detail.private_data.into_boxed_slice(),
        });
        // rdma_conn_param and rdma_ud_param both start with the pointer
        // and the length; the length is at most 255 in both.
        let (ptr, len) = if event.private_data.is_empty() {
            (std::ptr::null(), 0)
        } else {
            (
                event.private_data.as_ptr() as *const std::ffi::c_void,
                event.private_data.len().min(255) as u8,
            )
        };
        if detail.ud {
            // SAFETY: writing fields of the union's `ud` member, which
            // UD events use.
            unsafe {
                (*event.c.param.ud).private_data = ptr;
                (*event.c.param.ud).private_data_len = len;
            }
        } else {
            // SAFETY: as above, for the `conn` member.
            unsafe {
                (*event.c.param.conn).private_data = ptr;
                (*event.c.param.conn).private_data_len = len;
            }
        }
        let mut queue = self.queue.lock().unwrap();
        if queue.is_empty() {
            self.set_readable(true);
        }
        queue.push_back(EventPtr(Box::into_raw(event)));
        self.ready.notify_all();
    }

    /// Keeps the eventfd's count at 1 while events are queued, 0 otherwise
    /// (called with the queue locked, so the count is known).
    fn set_readable(&self, readable: bool) {
        let mut one = 1u64;
        // SAFETY: 8 bytes to or from a live eventfd; a read only happens
        // when the count is 1, so it never blocks.
        unsafe {
            if readable {
                libc::write(self.fd, &one as *const u64 as *const _, 8);
            } else {
                libc::read(self.fd, &mut one as *mut u64 as *mut _, 8);
            }
        }
    }

    fn nonblocking(&self) -> bool {
        // SAFETY: F_GETFL on our own fd.
        let flags = unsafe { libc::fcntl(self.fd, libc::F_GETFL) };
        flags >= 0 && flags & libc::O_NONBLOCK != 0
    }

    /// The next event, counted as unacked against its id; waits for one
    /// unless the fd is non-blocking (EAGAIN).
    pub(crate) fn next(&self) -> Result<*mut CmEvent, i32> {
        let mut queue = self.queue.lock().unwrap();
        loop {
            if let Some(EventPtr(event)) = queue.pop_front() {
                if queue.is_empty() {
                    self.set_readable(false);
                }
                // SAFETY: queued events are live boxes owned by the queue.
                unsafe { (*event).id.delivered() };
                return Ok(event);
            }
            if self.nonblocking() {
                return Err(libc::EAGAIN);
            }
            queue = self.ready.wait(queue).unwrap();
        }
    }

    /// Drops the queued (not yet delivered) events of `id`.
    pub(crate) fn purge(&self, id: &Arc<IdShared>) {
        self.take(id);
    }

    /// Removes and returns the queued events of `id` (to move them).
    fn take(&self, id: &Arc<IdShared>) -> Vec<EventPtr> {
        let mut queue = self.queue.lock().unwrap();
        let before = queue.len();
        let mut taken = Vec::new();
        queue.retain(|e| {
            // SAFETY: queued events are live boxes owned by the queue.
            let mine = Arc::ptr_eq(unsafe { &(*e.0).id }, id);
            if mine {
                taken.push(EventPtr(e.0));
            }
            !mine
        });
        if before > 0 && queue.is_empty() {
            self.set_readable(false);
        }
        taken
    }

    /// Moves the queued events of `id` from here to `to` (rdma_migrate_id).
    pub(crate) fn move_events(&self, id: &Arc<IdShared>, to: &ChannelShared) {
        let events = self.take(id);
        if events.is_empty() {
            return;
        }
        let mut queue = to.queue.lock().unwrap();
        if queue.is_empty() {
            to.set_readable(true);
        }
        queue.extend(events);
        to.ready.notify_all();
    }

    /// Waits for the next event of a synchronous id's private channel.
    pub(crate) fn wait_event(&self) -> Result<*mut CmEvent, i32> {
        self.next()
    }
}

impl Drop for ChannelShared {
    fn drop(&mut self) {
        for EventPtr(event) in self.queue.get_mut().unwrap().drain(..) {
            // SAFETY: events still queued are owned by the queue.
            drop(unsafe { Box::from_raw(event) });
        }
        // SAFETY: our eventfd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// Frees an event handed to the program and counts its ack.
///
/// # Safety
/// `event` came from `rdma_get_cm_event` and is acked once.
pub(crate) unsafe fn ack(event: *mut rdma_cm_event) {
    // SAFETY: CmEvent starts with the rdma_cm_event handed out.
    let event = unsafe { Box::from_raw(event as *mut CmEvent) };
    event.id.acked();
}

/// A new channel, live until [`destroy`] (rdma_create_event_channel).
pub(crate) fn create() -> Result<*mut rdma_event_channel, i32> {
    let shared = ChannelShared::new()?;
    let channel = Box::new(Channel {
        c: rdma_event_channel { fd: shared.fd },
        shared: shared.clone(),
    });
    let raw = Box::into_raw(channel) as *mut rdma_event_channel;
    live().lock().unwrap().insert(raw as usize, shared);
    Ok(raw)
}

/// Destroys a channel (rdma_destroy_event_channel): the program destroys
/// its ids first (as rdma-core requires); their queued events go with
/// the channel.
///
/// # Safety
/// `channel` is NULL or a pointer the program had from [`create`].
pub(crate) unsafe fn destroy(channel: *mut rdma_event_channel) {
    if channel.is_null() {
        return;
    }
    // A channel destroyed twice, or never made, is left alone.
    let Some(shared) = live().lock().unwrap().remove(&(channel as usize)) else {
        return;
    };
    {
        let mut gone = destroyed().lock().unwrap();
        gone.retain(|_, t| t.elapsed() < DESTROYED_GRACE);
        gone.insert(channel as usize, Instant::now());
    }
    // A waiting rdma_get_cm_event holds its own reference and waits on.
    drop(shared);
    // SAFETY: a live channel from create (it was in the live table),
    // destroyed once.
    drop(unsafe { Box::from_raw(channel as *mut Channel) });
}

/// The queue of a live channel; EBADF for one that is not (after
/// [`DESTROYED_GRACE`] for one just destroyed).
pub(crate) fn shared_of(channel: *mut rdma_event_channel) -> Result<Arc<ChannelShared>, i32> {
    live()
        .lock()
        .unwrap()
        .get(&(channel as usize))
        .cloned()
        .ok_or_else(|| not_live(channel as usize))
}
