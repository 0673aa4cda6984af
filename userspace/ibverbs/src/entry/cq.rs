//! Completion queues and completion channels: `ibv_create_comp_channel`,
//! `ibv_destroy_comp_channel`, `ibv_create_cq`, `ibv_create_cq_ex` (through
//! `verbs_context.create_cq_ex`), `ibv_resize_cq`, `ibv_destroy_cq`,
//! `ibv_poll_cq` and `ibv_req_notify_cq` (through `context->ops`), the
//! extended poller of `struct ibv_cq_ex`, `ibv_get_cq_event` and
//! `ibv_ack_cq_events`.
//!
//! A completion channel is a pipe ([`Channel`]). A CQ created with one
//! installs an event handler on its xroce CQ: when the program armed it
//! (`ibv_req_notify_cq`) and a matching completion arrives, the handler
//! writes one [`EventRecord`] to the pipe, which `ibv_get_cq_event` reads.
//! No CQ has an eventfd: polling makes no system call.
//!
//! As with rdma-core over the kernel, an event counts for its CQ when the
//! program reads it, and `ibv_destroy_cq` waits until the program acked
//! every event it read (`ibv_ack_cq_events`, and `ibv_ack_async_event` for
//! IBV_EVENT_CQ_ERR).

use std::ffi::{c_int, c_uint, c_void};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use xroce::verbs::{Device, NetworkHdr, Wc, WcFlags, WcOpcode, WcStatus};

use crate::abi::*;
use crate::base::errno::{errno_of, fail, ffi, ffi_int, ffi_ptr, set_errno, verbs_fail};
use crate::base::limits;
use crate::objects::context::{context, Context};
use crate::objects::events::{self, Kind};
use crate::objects::{Channel, ChannelShared, ChannelState, Cq};

/// One completion event queued on a channel.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct EventRecord {
    /// The `struct ibv_cq *` the program knows.
    pub cq: u64,
    /// [`Cq::id`]: tells a live CQ from a destroyed one at the same address.
    pub id: u64,
}

/// Work completions taken from the xroce CQ per lock acquisition.
const CHUNK: usize = 16;

/// The `wc_flags` of `ibv_create_cq_ex` this library can fill.
const SUPPORTED_WC_FLAGS: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

/// `comp_mask` bits of `ibv_cq_init_attr_ex` rdma-core 44 knows.
const KNOWN_CQ_INIT_MASK: u32 = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;

/// `ibv_create_cq_attr_flags` accepted (SINGLE_THREADED is a hint).
const KNOWN_CQ_CREATE_FLAGS: u32 =
    IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;

static NEXT_CQ_ID: AtomicU64 = AtomicU64::new(1);

// ---------------------------------------------------------------------------
// Work completion conversion.

pub(crate) fn status_of(s: WcStatus) -> ibv_wc_status {
    match s {
        WcStatus::Success => IBV_WC_SUCCESS,
        WcStatus::LocLenErr => IBV_WC_LOC_LEN_ERR,
        WcStatus::LocQpOpErr => IBV_WC_LOC_QP_OP_ERR,
        WcStatus::LocProtErr => IBV_WC_LOC_PROT_ERR,
        WcStatus::WrFlushErr => IBV_WC_WR_FLUSH_ERR,
        WcStatus::BadRespErr => IBV_WC_BAD_RESP_ERR,
        WcStatus::LocAccessErr => IBV_WC_LOC_ACCESS_ERR,
        WcStatus::RemInvReqErr => IBV_WC_REM_INV_REQ_ERR,
        WcStatus::RemAccessErr => IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemOpErr => IBV_WC_REM_OP_ERR,
        WcStatus::RetryExcErr => IBV_WC_RETRY_EXC_ERR,
        WcStatus::RnrRetryExcErr => IBV_WC_RNR_RETRY_EXC_ERR,
        WcStatus::FatalErr => IBV_WC_FATAL_ERR,
        WcStatus::GeneralErr => IBV_WC_GENERAL_ERR,
    }
}

pub(crate) fn opcode_of(o: WcOpcode) -> ibv_wc_opcode {
    match o {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

/// `ibv_wc_flags` (xroce's SOLICITED marker is internal).
pub(crate) fn flags_of(f: WcFlags) -> c_uint {
    let mut out = 0;
    if f.contains(WcFlags::GRH) {
        out |= IBV_WC_GRH;
    }
    if f.contains(WcFlags::WITH_IMM) {
        out |= IBV_WC_WITH_IMM;
    }
    if f.contains(WcFlags::WITH_INV) {
        out |= IBV_WC_WITH_INV;
    }
    out
}

/// `ibv_wc.sl` of a completion. A UD receive's tells the family of the
/// header in its GRH area as mlx5 reports RoCE UD receives (the CQE's
/// packet-type nibble: bits 2..0 L3 header type, 1 IPv6 / 2 IPv4, bit 3
/// the UDP header of RoCEv2): UCX 1.13's UD transport (Debian 12) reads
/// the destination GID from the GRH's last 4 bytes only when
/// `sl & 7 == 2`, else from its last 16, so with sl 0 (rxe) it drops
/// every RoCEv2/IPv4 datagram while its DGID check is on (the default).
/// Everything else has SL 0, as on rxe.
pub(crate) fn sl_of(w: &Wc) -> u8 {
    const ROCE_V2_UDP: u8 = 0x8;
    match w.network_hdr {
        NetworkHdr::Ipv4 => ROCE_V2_UDP | 0x2,
        NetworkHdr::Ipv6 => ROCE_V2_UDP | 0x1,
        NetworkHdr::None => 0,
    }
}

/// The `imm_data`/`invalidated_rkey` union word: the immediate in network
/// byte order (xroce keeps it in host order), or the invalidated rkey.
fn imm_word(w: &Wc) -> u32 {
    if w.flags.contains(WcFlags::WITH_INV) {
        w.invalidated_rkey
    } else if w.flags.contains(WcFlags::WITH_IMM) {
        w.imm_data.to_be()
    } else {
        0
    }
}

pub(crate) fn to_ibv_wc(w: &Wc) -> ibv_wc {
    ibv_wc {
        wr_id: w.wr_id,
        status: status_of(w.status),
        opcode: opcode_of(w.opcode),
        vendor_err: 0,
        byte_len: w.byte_len,
        __bindgen_anon_1: ibv_wc__bindgen_ty_1 {
            imm_data: imm_word(w),
        },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: flags_of(w.flags),
        pkey_index: 0,
        slid: 0,
        sl: sl_of(w),
        dlid_path_bits: 0,
    }
}

// ---------------------------------------------------------------------------
// Completion channels.

/// The channel behind a program's pointer.
///
/// # Safety
/// `p` is NULL or a channel this library created and has not destroyed.
unsafe fn channel_ref<'a>(p: *mut ibv_comp_channel) -> Option<&'a Channel> {
    if !crate::base::handles::check(p as *const Channel) {
        return None;
    }
    // SAFETY: the ibv_comp_channel is the first field of the repr(C) Channel.
    unsafe { (p as *const Channel).as_ref() }
}

fn new_channel(ctx: *mut ibv_context) -> Result<*mut Channel, i32> {
    // SAFETY: eventfd has no memory arguments; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // SAFETY: a descriptor eventfd just returned, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let ch = Box::leak(Box::new(Channel {
        ch: ibv_comp_channel {
            context: ctx,
            fd: fd.as_raw_fd(),
            refcnt: 0,
        },
        shared: Arc::new(ChannelShared {
            fd,
            state: Mutex::new(ChannelState::default()),
        }),
    }));
    crate::base::handles::born(&*ch as *const crate::objects::Channel);
    Ok(ch)
}

/// `ibv_create_comp_channel`: `channel->fd` is pollable and may be made
/// non-blocking by the program.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    ffi_ptr(|| {
        // SAFETY: the program passes an open context.
        unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
        Ok(new_channel(ctx)?.cast())
    })
}

/// `ibv_destroy_comp_channel`: EBUSY while a CQ uses it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    ffi_int(|| {
        // SAFETY: a channel this library created, destroyed once.
        let ch = unsafe { channel_ref(channel) }.ok_or(libc::EINVAL)?;
        let n = ch.shared.state.lock().unwrap().cqs.len();
        if n != 0 {
            return Err(fail(
                libc::EBUSY,
                format_args!("ibv_destroy_comp_channel: {n} CQ(s) still use the channel"),
            ));
        }
        // SAFETY: leaked by new_channel; no CQ refers to it any more (the
        // handlers of destroyed CQs hold their own Arc of the write end).
        crate::base::handles::free(unsafe { Box::from_raw(channel as *mut Channel) });
        Ok(())
    })
}

/// `ibv_get_cq_event`: the CQ of the next completion event on `channel`
/// and its `cq_context`. Blocks unless the program set O_NONBLOCK on
/// `channel->fd` (then -1 with errno EAGAIN when none is queued).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ffi(-1, || {
        // SAFETY: the program passes a live channel.
        let Some(ch) = (unsafe { channel_ref(channel) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let shared = &ch.shared;
        loop {
            {
                let mut st = shared.state.lock().unwrap();
                if let Some(r) = st.queue.pop_front() {
                    // Its count: at least one is there while the queue is
                    // not empty (see ChannelShared), so this never blocks.
                    take_count(&shared.fd);
                    let p = r.cq as *mut Cq;
                    // SAFETY: only live CQs' events are queued (a destroy
                    // takes its own away under this lock), and the CQ stays
                    // live: its destroy waits for the program to ack the
                    // event counted here.
                    unsafe {
                        (*p).events_read.fetch_add(1, Ordering::Relaxed);
                        *cq = p.cast();
                        *cq_context = (*p).cq.cq_context;
                    }
                    return 0;
                }
            }
            // SAFETY: F_GETFL on a descriptor the channel owns.
            let flags = unsafe { libc::fcntl(shared.fd.as_raw_fd(), libc::F_GETFL) };
            if flags < 0 {
                return -1;
            }
            if flags & libc::O_NONBLOCK != 0 {
                set_errno(libc::EAGAIN);
                return -1;
            }
            // Blocking: wait for a count, then take the event under the
            // lock (another thread may take it first: wait again).
            let mut pfd = libc::pollfd {
                fd: shared.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polls one pollfd that lives for the call.
            if unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {
                // EINTR, as a blocking read(2) of the kernel's channel.
                return -1;
            }
        }
    })
}

/// Takes one count of a channel's eventfd (EFD_SEMAPHORE: one per read).
/// Called under the channel's lock with the count known to be positive.
fn take_count(fd: &OwnedFd) {
    let mut one = 0u64;
    // SAFETY: reads 8 bytes into a live u64.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&raw mut one).cast(), 8) };
    debug_assert_eq!((n, one), (8, 1), "a channel's count fell behind its queue");
}

/// Adds one count to a channel's eventfd, under the channel's lock.
fn give_count(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64; the count cannot overflow
    // (one per queued event).
    let n = unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
    debug_assert_eq!(n, 8, "a channel's eventfd refused a count");
}

/// `ibv_ack_cq_events`: the program is done with `nevents` events of
/// `cq` (what its destroy waits for).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    ffi((), || {
        if cq.is_null() {
            return;
        }
        // SAFETY: a live CQ (its mutex/cond initialised at create); the
        // counter is written under that mutex.
        unsafe {
            events::ack(
                &raw mut (*cq).mutex,
                &raw mut (*cq).cond,
                &raw mut (*cq).comp_events_completed,
                nevents,
            )
        }
    })
}

// ---------------------------------------------------------------------------
// Creation and destruction.

struct CreateArgs {
    cqe: i64,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: i64,
    wc_flags: u64,
    ignore_overrun: bool,
}

/// Make a CQ on `device`. `ctx` (NULL only in unit tests) receives its
/// async events; `ibv_ctx` is what `cq->context` says.
fn new_cq(
    device: &Device,
    ctx: *mut Context,
    ibv_ctx: *mut ibv_context,
    num_comp_vectors: c_int,
    a: &CreateArgs,
) -> Result<*mut Cq, i32> {
    if a.cqe < 1 || a.cqe > limits::MAX_CQE as i64 {
        return Err(fail(
            libc::EINVAL,
            format_args!("create CQ: cqe {} is not in 1..={}", a.cqe, limits::MAX_CQE),
        ));
    }
    if a.comp_vector < 0 || a.comp_vector >= num_comp_vectors as i64 {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "create CQ: comp_vector {} is not below num_comp_vectors {num_comp_vectors}",
                a.comp_vector
            ),
        ));
    }
    // SAFETY: the program passes NULL or a live channel.
    let channel = unsafe { channel_ref(a.channel) };
    if let Some(ch) = channel {
        if ch.ch.context != ibv_ctx {
            return Err(fail(
                libc::EINVAL,
                "create CQ: the completion channel belongs to another context",
            ));
        }
    }
    let inner = device
        .create_cq_polled(a.cqe as usize)
        .map_err(verbs_fail)?;
    let id = NEXT_CQ_ID.fetch_add(1, Ordering::Relaxed);
    let mut cq_ex = ibv_cq_ex {
        context: ibv_ctx,
        channel: a.channel,
        cq_context: a.cq_context,
        handle: id as u32,
        cqe: a.cqe as c_int,
        ..Default::default()
    };
    fill_ex_ops(&mut cq_ex);
    let p: *mut Cq = Box::leak(Box::new(Cq {
        cq: cq_ex,
        inner,
        ctx,
        id,
        events_read: AtomicU32::new(0),
        users: AtomicU32::new(0),
        overflow_reported: AtomicBool::new(false),
        ignore_overrun: a.ignore_overrun,
        ex_busy: AtomicBool::new(false),
        cur: Wc::default(),
        wc_flags: a.wc_flags,
    }));
    crate::base::handles::born(p as *const crate::objects::Cq);
    // SAFETY: initialising the CQ's own mutex and condition variable in
    // place (they never move: the object is leaked) before anyone sees it.
    unsafe {
        libc::pthread_mutex_init(
            &raw mut (*p).cq.mutex as *mut libc::pthread_mutex_t,
            std::ptr::null(),
        );
        libc::pthread_cond_init(
            &raw mut (*p).cq.cond as *mut libc::pthread_cond_t,
            std::ptr::null(),
        );
    }
    events::track(p.cast(), Kind::Cq);
    if let Some(ch) = channel {
        let shared = ch.shared.clone();
        let rec = EventRecord { cq: p as u64, id };
        let handler = move || {
            let mut st = shared.state.lock().unwrap();
            // A handler still running after its CQ's destroy queues
            // nothing: the kernel drops those events too.
            if st.cqs.contains(&rec.id) {
                st.queue.push_back(rec);
                give_count(&shared.fd);
            }
        };
        // SAFETY: p was just created.
        unsafe { (*p).inner.set_event_handler(Some(Arc::new(handler))) };
        let mut st = ch.shared.state.lock().unwrap();
        st.cqs.insert(id);
        // SAFETY: refcnt is the program-visible use count (as rdma-core
        // keeps it), written under the channel's lock.
        unsafe { (*a.channel).refcnt = st.cqs.len() as c_int };
    }
    Ok(p)
}

/// [`new_cq`] on the device of the context `ibv_ctx`.
fn new_cq_in(ibv_ctx: *mut ibv_context, a: &CreateArgs) -> Result<*mut Cq, i32> {
    // SAFETY: the program passes an open context.
    let c: &Context = unsafe { context(ibv_ctx) }.ok_or(libc::EINVAL)?;
    let ncv = c.vctx.context.num_comp_vectors;
    new_cq(
        &c.dev.device,
        c as *const Context as *mut Context,
        ibv_ctx,
        ncv,
        a,
    )
}

/// Destroy a CQ made by [`new_cq`].
///
/// # Safety
/// `p` is NULL or a live CQ of this library, not used after this returns
/// Ok.
unsafe fn destroy(p: *mut Cq) -> Result<(), i32> {
    if p.is_null() || !crate::base::handles::check(p as *const Cq) {
        return Err(libc::EINVAL);
    }
    // SAFETY (whole block): p is live until it is freed at the end; fields
    // are reached by place, without a reference to the whole object, as
    // other threads may be acking events on it.
    unsafe {
        let users = (*p).users.load(Ordering::Acquire);
        if users != 0 {
            return Err(fail(
                libc::EBUSY,
                format_args!("ibv_destroy_cq: {users} queue(s) of QPs still complete into it"),
            ));
        }
        (*p).inner.set_event_handler(None);
        let mut comp_expected = 0;
        let channel = (*p).cq.channel;
        if let Some(ch) = channel_ref(channel) {
            let mut st = ch.shared.state.lock().unwrap();
            let id = (*p).id;
            st.cqs.remove(&id);
            (*channel).refcnt = st.cqs.len() as c_int;
            // Its events not read yet go, with their counts: the fd is not
            // left readable for events that no longer exist.
            let queued = st.queue.len();
            st.queue.retain(|r| r.id != id);
            for _ in st.queue.len()..queued {
                take_count(&ch.shared.fd);
            }
            comp_expected = (*p).events_read.load(Ordering::Relaxed);
        }
        let async_expected = events::untrack(p.cast());
        let comp = &raw const (*p).cq.comp_events_completed;
        let asy = &raw const (*p).cq.async_events_completed;
        events::wait_until(&raw mut (*p).cq.mutex, &raw mut (*p).cq.cond, || {
            comp.read_volatile() == comp_expected && asy.read_volatile() == async_expected
        });
        libc::pthread_cond_destroy(&raw mut (*p).cq.cond as *mut libc::pthread_cond_t);
        libc::pthread_mutex_destroy(&raw mut (*p).cq.mutex as *mut libc::pthread_mutex_t);
        crate::base::handles::free(Box::from_raw(p));
    }
    Ok(())
}

/// `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ffi_ptr(|| {
        let p = new_cq_in(
            ctx,
            &CreateArgs {
                cqe: cqe as i64,
                cq_context,
                channel,
                comp_vector: comp_vector as i64,
                wc_flags: (IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM) as u64,
                ignore_overrun: false,
            },
        )?;
        Ok(p.cast())
    })
}

/// `verbs_context.create_cq_ex`, behind the inline `ibv_create_cq_ex`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    ffi_ptr(|| {
        // SAFETY: the program passes its attributes (or NULL).
        let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        let args = check_cq_init_attr(a)?;
        Ok(new_cq_in(ctx, &args)?.cast())
    })
}

/// What rdma-core and a provider without completion timestamps or parent
/// domains accept in `ibv_cq_init_attr_ex`.
fn check_cq_init_attr(a: &ibv_cq_init_attr_ex) -> Result<CreateArgs, i32> {
    if a.comp_mask & !KNOWN_CQ_INIT_MASK != 0 {
        return Err(fail(
            libc::EOPNOTSUPP,
            format_args!(
                "ibv_create_cq_ex: unknown comp_mask bits {:#x}",
                a.comp_mask
            ),
        ));
    }
    if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        return Err(fail(
            libc::EOPNOTSUPP,
            format_args!(
                "ibv_create_cq_ex: wc_flags {:#x} not supported (timestamps, cvlan, flow tag and tag matching are not)",
                a.wc_flags & !SUPPORTED_WC_FLAGS
            ),
        ));
    }
    let flags = if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
        a.flags
    } else {
        0
    };
    if flags & !KNOWN_CQ_CREATE_FLAGS != 0 {
        return Err(fail(
            libc::EINVAL,
            format_args!("ibv_create_cq_ex: unknown flags {flags:#x}"),
        ));
    }
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
        return Err(if a.parent_domain.is_null() {
            fail(
                libc::EINVAL,
                "ibv_create_cq_ex: MASK_PD without a parent domain",
            )
        } else {
            fail(
                libc::EOPNOTSUPP,
                "ibv_create_cq_ex: parent domains are not supported",
            )
        });
    }
    Ok(CreateArgs {
        cqe: a.cqe as i64,
        cq_context: a.cq_context,
        channel: a.channel,
        comp_vector: a.comp_vector as i64,
        wc_flags: a.wc_flags,
        ignore_overrun: flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN != 0,
    })
}

/// `ibv_resize_cq`: the new size is reported in `cq->cqe`.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi_int(|| {
        let p = cq as *mut Cq;
        if p.is_null() {
            return Err(libc::EINVAL);
        }
        if cqe < 1 || cqe as u32 > limits::MAX_CQE {
            return Err(fail(
                libc::EINVAL,
                format_args!("ibv_resize_cq: cqe {cqe} is not in 1..={}", limits::MAX_CQE),
            ));
        }
        // SAFETY: a live CQ of this library; its context outlives it.
        unsafe {
            // Sends that complete without a peer count as in the CQ.
            if let Some(ctx) = (*p).ctx.as_ref() {
                ctx.dev
                    .device
                    .settle_local_sends(&(*p).inner, std::time::Duration::from_millis(200));
            }
            (*p).inner.resize(cqe as usize).map_err(verbs_fail)?;
            (*p).cq.cqe = cqe;
        }
        Ok(())
    })
}

/// `ibv_destroy_cq`: EBUSY while QPs complete into it; otherwise waits
/// until the program acked every event of it that it read.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: a CQ this library created, destroyed once.
    ffi_int(|| unsafe { destroy(cq.cast()) })
}

// ---------------------------------------------------------------------------
// Polling and notification (the hot path).

/// Post IBV_EVENT_CQ_ERR for an overflowed CQ, once.
///
/// # Safety
/// `p` is a live CQ.
unsafe fn report_overflow(p: *mut Cq) {
    // SAFETY: the caller's contract; ctx, when set, is the open context
    // the CQ was created in (programs destroy CQs before closing it).
    unsafe {
        if (*p).overflow_reported.swap(true, Ordering::AcqRel) {
            return;
        }
        fail(
            libc::EOVERFLOW,
            format_args!(
                "CQ {p:p} overflowed (more than its {} entries outstanding): completions were lost",
                (*p).cq.cqe
            ),
        );
        let ctx = (*p).ctx;
        if !ctx.is_null() {
            (*ctx).post_async(p.cast(), IBV_EVENT_CQ_ERR);
        }
    }
}

/// `context->ops.poll_cq`: up to `n` completions into `wc`; a negative
/// value (errno EOVERFLOW) once an overflowed CQ is drained.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the program passes a live CQ and room for n completions.
    ffi(-1, || unsafe { poll_into(cq.cast(), n, wc) })
}

/// # Safety
/// `p` is NULL or a live CQ; `out` has room for `n` `ibv_wc`.
unsafe fn poll_into(p: *mut Cq, n: c_int, out: *mut ibv_wc) -> c_int {
    if p.is_null() || (n > 0 && out.is_null()) || !crate::base::handles::check(p as *const Cq) {
        set_errno(libc::EINVAL);
        return -1;
    }
    if n <= 0 {
        return 0;
    }
    let want = n as usize;
    let k0 = want.min(CHUNK);
    let mut buf = [const { MaybeUninit::<Wc>::uninit() }; CHUNK];
    for b in &mut buf[..k0] {
        b.write(Wc::default());
    }
    // SAFETY: the first k0 entries were just initialised.
    let chunk = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut Wc, k0) };
    // SAFETY: the caller's contract; only the field is borrowed.
    let inner = unsafe { &(*p).inner };
    let mut total = 0;
    while total < want {
        let k = (want - total).min(k0);
        match inner.poll(&mut chunk[..k]) {
            Ok(got) => {
                for (i, w) in chunk[..got].iter().enumerate() {
                    // SAFETY: total + i < want = n, the caller's room.
                    unsafe { out.add(total + i).write(to_ibv_wc(w)) };
                }
                total += got;
                if got < k {
                    break;
                }
            }
            Err(e) => {
                if total > 0 {
                    break;
                }
                // SAFETY: the caller's contract.
                if unsafe { (*p).ignore_overrun } {
                    return 0;
                }
                // SAFETY: as above.
                unsafe { report_overflow(p) };
                set_errno(match e {
                    xroce::verbs::VerbsError::CqOverflow => libc::EOVERFLOW,
                    e => errno_of(&e),
                });
                return -1;
            }
        }
    }
    if total == 0 {
        // Programs spin on an empty CQ (perftest, rc_pingpong): give the
        // core to xroce's I/O thread, which has to run for the completion
        // to come (on a NIC it is hardware; here it may share the core).
        std::thread::yield_now();
    }
    total as c_int
}

/// `context->ops.req_notify_cq`: one completion event on the channel for
/// the next completion (solicited_only: the next solicited receive or
/// error completion).
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    ffi(libc::EIO, || {
        let p = cq as *mut Cq;
        if p.is_null() || !crate::base::handles::check(p as *const Cq) {
            return libc::EINVAL;
        }
        // SAFETY: a live CQ of this library.
        unsafe { (*p).inner.req_notify(solicited_only != 0) };
        0
    })
}

// ---------------------------------------------------------------------------
// The extended poller of `struct ibv_cq_ex`.

fn fill_ex_ops(c: &mut ibv_cq_ex) {
    c.start_poll = Some(start_poll);
    c.next_poll = Some(next_poll);
    c.end_poll = Some(end_poll);
    c.read_opcode = Some(read_opcode);
    c.read_vendor_err = Some(read_vendor_err);
    c.read_byte_len = Some(read_byte_len);
    c.read_imm_data = Some(read_imm_data);
    c.read_qp_num = Some(read_qp_num);
    c.read_src_qp = Some(read_src_qp);
    c.read_wc_flags = Some(read_wc_flags);
    c.read_slid = Some(read_zero_u32);
    c.read_sl = Some(read_sl);
    c.read_dlid_path_bits = Some(read_zero_u8);
    // Never asked for (create_cq_ex refuses their wc_flags); filled so a
    // program reading them anyway gets zeros, not a NULL call.
    c.read_completion_ts = Some(read_zero_u64);
    c.read_cvlan = Some(read_zero_u16);
    c.read_flow_tag = Some(read_zero_u32);
    c.read_tm_info = Some(read_tm_info);
    c.read_completion_wallclock_ns = Some(read_zero_u64);
}

/// # Safety
/// `p` is a live CQ.
unsafe fn lock_ex(p: *mut Cq) {
    let mut spins = 0u32;
    // SAFETY: the caller's contract.
    let busy = unsafe { &(*p).ex_busy };
    while busy
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < 128 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// # Safety
/// `p` is a live CQ whose ex lock this thread holds.
unsafe fn unlock_ex(p: *mut Cq) {
    // SAFETY: the caller's contract.
    unsafe { (*p).ex_busy.store(false, Ordering::Release) };
}

/// Take the next completion into `cur` (and `wr_id`/`status`): 0, ENOENT
/// when empty, EOVERFLOW once an overflowed CQ is drained.
///
/// # Safety
/// `p` is a live CQ whose ex lock this thread holds.
unsafe fn advance(p: *mut Cq) -> c_int {
    let mut one = [Wc::default()];
    // SAFETY (whole block): the caller's contract; cur, wr_id and status
    // are guarded by the ex lock.
    unsafe {
        match (*p).inner.poll(&mut one) {
            Ok(1) => {
                let w = one[0];
                (*p).cur = w;
                (*p).cq.wr_id = w.wr_id;
                (*p).cq.status = status_of(w.status);
                0
            }
            Ok(_) => libc::ENOENT,
            Err(_) if (*p).ignore_overrun => libc::ENOENT,
            Err(_) => {
                report_overflow(p);
                libc::EOVERFLOW
            }
        }
    }
}

/// `ibv_start_poll`: 0 with the first completion current, or ENOENT when
/// the CQ is empty (then the program does not call end_poll).
unsafe extern "C" fn start_poll(current: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    ffi(libc::EIO, || {
        let p = current as *mut Cq;
        if p.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the program passes its attributes (or NULL).
        if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
            return libc::EINVAL;
        }
        // SAFETY: a live CQ; the lock is released here on failure, else by
        // end_poll.
        unsafe {
            lock_ex(p);
            let r = advance(p);
            if r != 0 {
                unlock_ex(p);
            }
            r
        }
    })
}

/// `ibv_next_poll`: 0 with the next completion current, or ENOENT.
unsafe extern "C" fn next_poll(current: *mut ibv_cq_ex) -> c_int {
    // SAFETY: between start_poll and end_poll: this thread holds the lock.
    ffi(libc::EIO, || unsafe { advance(current.cast()) })
}

/// `ibv_end_poll`.
unsafe extern "C" fn end_poll(current: *mut ibv_cq_ex) {
    // SAFETY: after a successful start_poll: this thread holds the lock.
    ffi((), || unsafe { unlock_ex(current.cast()) })
}

/// The current completion of the extended poller.
///
/// # Safety
/// `c` is a live CQ between start_poll and end_poll.
unsafe fn cur<'a>(c: *mut ibv_cq_ex) -> &'a Wc {
    // SAFETY: the caller's contract; cur is only written under the ex
    // lock, which the reading thread holds.
    unsafe { &(*(c as *mut Cq)).cur }
}

unsafe extern "C" fn read_opcode(c: *mut ibv_cq_ex) -> ibv_wc_opcode {
    // SAFETY: called while polling (cur's contract).
    opcode_of(unsafe { cur(c) }.opcode)
}
unsafe extern "C" fn read_vendor_err(_c: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_byte_len(c: *mut ibv_cq_ex) -> u32 {
    // SAFETY: called while polling.
    unsafe { cur(c) }.byte_len
}
/// Also `ibv_wc_read_invalidated_rkey` (the header reads it through this).
unsafe extern "C" fn read_imm_data(c: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: called while polling.
    imm_word(unsafe { cur(c) })
}
unsafe extern "C" fn read_qp_num(c: *mut ibv_cq_ex) -> u32 {
    // SAFETY: called while polling.
    unsafe { cur(c) }.qp_num
}
unsafe extern "C" fn read_src_qp(c: *mut ibv_cq_ex) -> u32 {
    // SAFETY: called while polling.
    unsafe { cur(c) }.src_qp
}
unsafe extern "C" fn read_wc_flags(c: *mut ibv_cq_ex) -> c_uint {
    // SAFETY: called while polling.
    flags_of(unsafe { cur(c) }.flags)
}
unsafe extern "C" fn read_sl(c: *mut ibv_cq_ex) -> u8 {
    // SAFETY: called while polling.
    sl_of(unsafe { cur(c) })
}
unsafe extern "C" fn read_zero_u8(_c: *mut ibv_cq_ex) -> u8 {
    0
}
unsafe extern "C" fn read_zero_u16(_c: *mut ibv_cq_ex) -> u16 {
    0
}
unsafe extern "C" fn read_zero_u32(_c: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_zero_u64(_c: *mut ibv_cq_ex) -> u64 {
    0
}
unsafe extern "C" fn read_tm_info(_c: *mut ibv_cq_ex, tm: *mut ibv_wc_tm_info) {
    // SAFETY: the program passes a writable tm_info (or NULL).
    if let Some(t) = unsafe { tm.as_mut() } {
        *t = ibv_wc_tm_info::default();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use xroce::engine::EngineConfig;
    use xroce::verbs::{AccessFlags, QpAttr, QpAttrMask, QpInitAttr, QpState, QueuePair, RecvWr};

    use super::*;

    #[test]
    fn layouts_match_rdma_core_44() {
        // struct-sizes-x86_64.txt, measured against the real header.
        assert_eq!(std::mem::size_of::<ibv_wc>(), 48);
        assert_eq!(std::mem::size_of::<ibv_cq>(), 128);
        assert_eq!(std::mem::size_of::<ibv_cq_ex>(), 288);
        assert_eq!(std::mem::size_of::<ibv_comp_channel>(), 16);
        assert_eq!(std::mem::size_of::<EventRecord>(), 16);
    }

    #[test]
    fn every_status_and_opcode_has_its_rdma_core_value() {
        let statuses = [
            (WcStatus::Success, 0),
            (WcStatus::LocLenErr, 1),
            (WcStatus::LocQpOpErr, 2),
            (WcStatus::LocProtErr, 4),
            (WcStatus::WrFlushErr, 5),
            (WcStatus::BadRespErr, 7),
            (WcStatus::LocAccessErr, 8),
            (WcStatus::RemInvReqErr, 9),
            (WcStatus::RemAccessErr, 10),
            (WcStatus::RemOpErr, 11),
            (WcStatus::RetryExcErr, 12),
            (WcStatus::RnrRetryExcErr, 13),
            (WcStatus::FatalErr, 19),
            (WcStatus::GeneralErr, 21),
        ];
        for (s, v) in statuses {
            assert_eq!(status_of(s), v, "{s:?}");
        }
        let opcodes = [
            (WcOpcode::Send, 0),
            (WcOpcode::RdmaWrite, 1),
            (WcOpcode::RdmaRead, 2),
            (WcOpcode::CompSwap, 3),
            (WcOpcode::FetchAdd, 4),
            (WcOpcode::Recv, 128),
            (WcOpcode::RecvRdmaWithImm, 129),
        ];
        for (o, v) in opcodes {
            assert_eq!(opcode_of(o), v, "{o:?}");
        }
    }

    #[test]
    fn ud_receives_carry_the_grh_flag_and_mlx5s_packet_type_in_sl() {
        for (hdr, sl) in [(NetworkHdr::Ipv4, 0xa), (NetworkHdr::Ipv6, 0x9)] {
            let w = Wc {
                opcode: WcOpcode::Recv,
                byte_len: 40 + 4,
                flags: WcFlags::GRH,
                network_hdr: hdr,
                ..Wc::default()
            };
            let c = to_ibv_wc(&w);
            assert_eq!(c.wc_flags, IBV_WC_GRH, "{hdr:?}");
            assert_eq!(c.sl, sl, "{hdr:?}");
            // What UCX 1.13's check_grh takes from it: 4-byte (IPv4) or
            // 16-byte destination address.
            assert_eq!(c.sl & 7 == 2, hdr == NetworkHdr::Ipv4);
        }
        assert_eq!(to_ibv_wc(&Wc::default()).sl, 0);
    }

    #[test]
    fn wc_conversion_fills_every_field() {
        let w = Wc {
            wr_id: 0xdead_beef_0000_0001,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 4096,
            imm_data: 0x0102_0304,
            invalidated_rkey: 0,
            qp_num: 17,
            src_qp: 18,
            flags: WcFlags::WITH_IMM | WcFlags::SOLICITED,
            network_hdr: NetworkHdr::None,
        };
        let c = to_ibv_wc(&w);
        assert_eq!(c.wr_id, w.wr_id);
        assert_eq!(c.status, IBV_WC_SUCCESS);
        assert_eq!(c.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(c.byte_len, 4096);
        // __be32: the bytes in memory are the immediate's network order.
        // SAFETY: imm_data is the member written for WITH_IMM.
        let imm = unsafe { c.__bindgen_anon_1.imm_data };
        assert_eq!(imm.to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!(c.qp_num, 17);
        assert_eq!(c.src_qp, 18);
        assert_eq!(c.wc_flags, IBV_WC_WITH_IMM, "SOLICITED is internal");
        assert_eq!(
            (c.vendor_err, c.pkey_index, c.slid, c.sl, c.dlid_path_bits),
            (0, 0, 0, 0, 0)
        );

        let inv = Wc {
            opcode: WcOpcode::Recv,
            invalidated_rkey: 0x1234_5678,
            flags: WcFlags::WITH_INV,
            ..Wc::default()
        };
        let c = to_ibv_wc(&inv);
        assert_eq!(c.wc_flags, IBV_WC_WITH_INV);
        // SAFETY: invalidated_rkey is the member written for WITH_INV.
        assert_eq!(unsafe { c.__bindgen_anon_1.invalidated_rkey }, 0x1234_5678);
        let plain = to_ibv_wc(&Wc::default());
        // SAFETY: the union is a plain u32 either way.
        assert_eq!(unsafe { plain.__bindgen_anon_1.imm_data }, 0);
        assert_eq!(plain.wc_flags, 0);
    }

    fn args(cqe: i64, channel: *mut ibv_comp_channel) -> CreateArgs {
        CreateArgs {
            cqe,
            cq_context: 0x5555 as *mut c_void,
            channel,
            comp_vector: 0,
            wc_flags: SUPPORTED_WC_FLAGS,
            ignore_overrun: false,
        }
    }

    fn mk(dev: &Device, a: &CreateArgs) -> Result<*mut Cq, i32> {
        new_cq(dev, std::ptr::null_mut(), std::ptr::null_mut(), 1, a)
    }

    fn nch() -> *mut ibv_comp_channel {
        std::ptr::null_mut()
    }

    /// A device without network (no runtime): flushed receives are the
    /// completions.
    fn device() -> Device {
        Device::new(EngineConfig::default())
    }

    /// An RC QP in ERR completing into `cq`: each post_recv yields one
    /// WR_FLUSH_ERR receive completion at once.
    fn flushing_qp(dev: &Device, cq: *mut Cq) -> QueuePair {
        let pd = dev.alloc_pd();
        // SAFETY: a live CQ of the test.
        let init = QpInitAttr::rc(unsafe { &(*cq).inner });
        let qp = dev.create_qp(&pd, &init).unwrap();
        let a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE,
            ..QpAttr::default()
        };
        qp.modify(
            &a,
            QpAttrMask::STATE
                | QpAttrMask::ACCESS_FLAGS
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT,
        )
        .unwrap();
        let e = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        qp.modify(&e, QpAttrMask::STATE).unwrap();
        qp
    }

    fn flush(qp: &QueuePair, wr_id: u64) {
        qp.post_recv(&RecvWr {
            wr_id,
            sg_list: vec![],
        })
        .unwrap();
    }

    fn poll(cq: *mut Cq, n: usize) -> (c_int, Vec<ibv_wc>) {
        let mut out = vec![ibv_wc::default(); n];
        // SAFETY: room for n completions.
        let r = unsafe { poll_cq(cq.cast(), n as c_int, out.as_mut_ptr()) };
        out.truncate(r.max(0) as usize);
        (r, out)
    }

    fn set_nonblocking(fd: c_int) {
        // SAFETY: fcntl on the test's descriptor.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }

    #[test]
    fn create_checks_cqe_and_comp_vector() {
        let dev = device();
        for cqe in [0, -1, limits::MAX_CQE as i64 + 1] {
            assert_eq!(mk(&dev, &args(cqe, nch())).err(), Some(libc::EINVAL));
        }
        let mut a = args(4, nch());
        a.comp_vector = 1;
        assert_eq!(mk(&dev, &a).err(), Some(libc::EINVAL));
        let p = mk(&dev, &args(4, nch())).unwrap();
        // SAFETY: p is live.
        unsafe {
            assert_eq!((*p).cq.cqe, 4);
            assert_eq!((*p).cq.cq_context, 0x5555 as *mut c_void);
            assert!((*p).cq.channel.is_null());
            assert_eq!(ibv_resize_cq(p.cast(), 0), libc::EINVAL);
            assert_eq!(ibv_resize_cq(p.cast(), 64), 0);
            assert_eq!((*p).cq.cqe, 64);
            assert_eq!(ibv_destroy_cq(p.cast()), 0);
        }
    }

    #[test]
    fn cq_init_attr_ex_checks() {
        let ok = ibv_cq_init_attr_ex {
            cqe: 8,
            wc_flags: SUPPORTED_WC_FLAGS,
            ..Default::default()
        };
        assert!(check_cq_init_attr(&ok).is_ok());
        let ts = ibv_cq_init_attr_ex {
            wc_flags: IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64,
            ..ok
        };
        assert_eq!(check_cq_init_attr(&ts).err(), Some(libc::EOPNOTSUPP));
        let mask = ibv_cq_init_attr_ex {
            comp_mask: 1 << 5,
            ..ok
        };
        assert_eq!(check_cq_init_attr(&mask).err(), Some(libc::EOPNOTSUPP));
        let flags = ibv_cq_init_attr_ex {
            comp_mask: IBV_CQ_INIT_ATTR_MASK_FLAGS,
            flags: 1 << 7,
            ..ok
        };
        assert_eq!(check_cq_init_attr(&flags).err(), Some(libc::EINVAL));
        let overrun = ibv_cq_init_attr_ex {
            comp_mask: IBV_CQ_INIT_ATTR_MASK_FLAGS,
            flags: IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
            ..ok
        };
        assert!(check_cq_init_attr(&overrun).unwrap().ignore_overrun);
        let pd = ibv_cq_init_attr_ex {
            comp_mask: IBV_CQ_INIT_ATTR_MASK_PD,
            ..ok
        };
        assert_eq!(check_cq_init_attr(&pd).err(), Some(libc::EINVAL));
    }

    #[test]
    fn poll_cq_returns_flushed_completions_in_order() {
        let dev = device();
        let cq = mk(&dev, &args(64, nch())).unwrap();
        let qp = flushing_qp(&dev, cq);
        assert_eq!(poll(cq, 4).0, 0, "empty");
        for i in 0..40 {
            flush(&qp, 100 + i);
        }
        // More than a chunk in one call, then the rest.
        let (n, wcs) = poll(cq, 33);
        assert_eq!(n, 33);
        let (n2, rest) = poll(cq, 16);
        assert_eq!(n2, 7);
        for (i, w) in wcs.iter().chain(rest.iter()).enumerate() {
            assert_eq!(w.wr_id, 100 + i as u64);
            assert_eq!(w.status, IBV_WC_WR_FLUSH_ERR);
            assert_eq!(w.qp_num, qp.qp_num());
        }
        assert_eq!(poll(cq, 16).0, 0);
        drop(qp);
        // SAFETY: live CQ.
        assert_eq!(unsafe { ibv_destroy_cq(cq.cast()) }, 0);
    }

    #[test]
    fn an_overflowed_cq_reports_an_error_once_drained() {
        let dev = device();
        let cq = mk(&dev, &args(2, nch())).unwrap();
        let qp = flushing_qp(&dev, cq);
        for i in 0..3 {
            flush(&qp, i);
        }
        assert_eq!(poll(cq, 8).0, 2);
        assert_eq!(poll(cq, 8).0, -1);
        assert_eq!(errno(), libc::EOVERFLOW);
        // SAFETY: live CQ.
        unsafe {
            assert!((*cq).overflow_reported.load(Ordering::Relaxed));
            let mut ex = ibv_poll_cq_attr::default();
            assert_eq!(start_poll(cq.cast(), &mut ex), libc::EOVERFLOW);
            assert_eq!(ibv_destroy_cq(cq.cast()), 0);
        }

        // IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: no error.
        let mut a = args(2, nch());
        a.ignore_overrun = true;
        let cq = mk(&dev, &a).unwrap();
        let qp = flushing_qp(&dev, cq);
        for i in 0..3 {
            flush(&qp, i);
        }
        assert_eq!(poll(cq, 8).0, 2);
        assert_eq!(poll(cq, 8).0, 0);
        // SAFETY: live CQ.
        unsafe {
            assert!(!(*cq).overflow_reported.load(Ordering::Relaxed));
            assert_eq!(ibv_destroy_cq(cq.cast()), 0);
        }
    }

    #[test]
    fn extended_poller_walks_completions() {
        let dev = device();
        let cq = mk(&dev, &args(16, nch())).unwrap();
        let c: *mut ibv_cq_ex = cq.cast();
        let mut attr = ibv_poll_cq_attr::default();
        // SAFETY (whole block): the ops of a live CQ, called as the inline
        // ibv_start_poll & co call them.
        unsafe {
            let start = (*c).start_poll.unwrap();
            let next = (*c).next_poll.unwrap();
            let end = (*c).end_poll.unwrap();
            assert_eq!(start(c, &mut attr), libc::ENOENT);
            attr.comp_mask = 1;
            assert_eq!(start(c, &mut attr), libc::EINVAL);
            attr.comp_mask = 0;

            let qp = flushing_qp(&dev, cq);
            for i in 0..3 {
                flush(&qp, 7 + i);
            }
            let mut seen = vec![];
            let mut r = start(c, &mut attr);
            while r == 0 {
                assert_eq!((*c).status, IBV_WC_WR_FLUSH_ERR);
                assert_eq!((*c).read_opcode.unwrap()(c), IBV_WC_RECV);
                assert_eq!((*c).read_qp_num.unwrap()(c), qp.qp_num());
                seen.push((*c).wr_id);
                r = next(c);
            }
            assert_eq!(r, libc::ENOENT);
            end(c);
            assert_eq!(seen, vec![7, 8, 9]);
            // The lock was released: polling again works.
            assert_eq!(start(c, &mut attr), libc::ENOENT);
            drop(qp);
            assert_eq!(ibv_destroy_cq(cq.cast()), 0);
        }
    }

    #[test]
    fn extended_readers_report_the_current_completion() {
        let dev = device();
        let cq = mk(&dev, &args(4, nch())).unwrap();
        let c: *mut ibv_cq_ex = cq.cast();
        // SAFETY (whole block): a live CQ; `cur` is set as advance() would
        // under the ex lock, which no other thread uses here.
        unsafe {
            (*cq).cur = Wc {
                wr_id: 1,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: 99,
                imm_data: 0xaabb_ccdd,
                invalidated_rkey: 0,
                qp_num: 5,
                src_qp: 6,
                flags: WcFlags::WITH_IMM,
                network_hdr: NetworkHdr::None,
            };
            assert_eq!((*c).read_opcode.unwrap()(c), IBV_WC_RECV_RDMA_WITH_IMM);
            assert_eq!((*c).read_vendor_err.unwrap()(c), 0);
            assert_eq!((*c).read_byte_len.unwrap()(c), 99);
            assert_eq!((*c).read_imm_data.unwrap()(c), 0xaabb_ccddu32.to_be());
            assert_eq!((*c).read_qp_num.unwrap()(c), 5);
            assert_eq!((*c).read_src_qp.unwrap()(c), 6);
            assert_eq!((*c).read_wc_flags.unwrap()(c), IBV_WC_WITH_IMM);
            assert_eq!((*c).read_slid.unwrap()(c), 0);
            assert_eq!((*c).read_sl.unwrap()(c), 0);
            assert_eq!((*c).read_dlid_path_bits.unwrap()(c), 0);
            assert_eq!((*c).read_completion_ts.unwrap()(c), 0);
            assert_eq!((*c).read_cvlan.unwrap()(c), 0);
            assert_eq!((*c).read_flow_tag.unwrap()(c), 0);
            assert_eq!((*c).read_completion_wallclock_ns.unwrap()(c), 0);
            let mut tm = ibv_wc_tm_info { tag: 3, priv_: 4 };
            (*c).read_tm_info.unwrap()(c, &mut tm);
            assert_eq!((tm.tag, tm.priv_), (0, 0));
            // ibv_wc_read_invalidated_rkey goes through read_imm_data.
            (*cq).cur.flags = WcFlags::WITH_INV;
            (*cq).cur.invalidated_rkey = 0x77;
            assert_eq!((*c).read_imm_data.unwrap()(c), 0x77);
            assert_eq!((*c).read_wc_flags.unwrap()(c), IBV_WC_WITH_INV);
            // A UD receive over IPv4: GRH, and mlx5's packet type in sl.
            (*cq).cur.flags = WcFlags::GRH;
            (*cq).cur.network_hdr = NetworkHdr::Ipv4;
            assert_eq!((*c).read_wc_flags.unwrap()(c), IBV_WC_GRH);
            assert_eq!((*c).read_sl.unwrap()(c), 0xa);
            assert_eq!(ibv_destroy_cq(cq.cast()), 0);
        }
    }

    #[test]
    fn channel_events_arm_once_and_destroy_waits_for_acks() {
        let dev = device();
        let ch = new_channel(std::ptr::null_mut()).unwrap();
        let chp: *mut ibv_comp_channel = ch.cast();
        let cq = mk(&dev, &args(16, chp)).unwrap();
        // SAFETY (whole block): live channel and CQ of the test.
        unsafe {
            assert_eq!((*chp).refcnt, 1);
            assert_eq!(ibv_destroy_comp_channel(chp), libc::EBUSY);
            let fd = (*chp).fd;
            set_nonblocking(fd);
            let mut got_cq: *mut ibv_cq = std::ptr::null_mut();
            let mut got_ctx: *mut c_void = std::ptr::null_mut();

            let qp = flushing_qp(&dev, cq);
            // Not armed: a completion makes no event.
            flush(&qp, 1);
            assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), -1);
            assert_eq!(errno(), libc::EAGAIN);

            // Armed: one event for the next completions, however many.
            assert_eq!(req_notify_cq(cq.cast(), 0), 0);
            flush(&qp, 2);
            flush(&qp, 3);
            assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), 0);
            assert_eq!(got_cq, cq.cast());
            assert_eq!(got_ctx, 0x5555 as *mut c_void);
            assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), -1);
            assert_eq!(errno(), libc::EAGAIN);
            assert_eq!(poll(cq, 8).0, 3);

            // Solicited-only arm: an error completion fires it too.
            assert_eq!(req_notify_cq(cq.cast(), 1), 0);
            flush(&qp, 4);
            assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), 0);
            assert_eq!((*cq).events_read.load(Ordering::Relaxed), 2);

            // Destroy blocks until both events are acked.
            drop(qp);
            let addr = cq as usize;
            let t = std::thread::spawn(move || ibv_destroy_cq(addr as *mut ibv_cq));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!t.is_finished(), "destroy must wait for the acks");
            ibv_ack_cq_events(cq.cast(), 1);
            std::thread::sleep(Duration::from_millis(20));
            assert!(!t.is_finished(), "one ack of two");
            ibv_ack_cq_events(cq.cast(), 1);
            assert_eq!(t.join().unwrap(), 0);

            assert_eq!((*chp).refcnt, 0);
            assert_eq!(ibv_destroy_comp_channel(chp), 0);
        }
    }

    #[test]
    fn unread_events_of_a_destroyed_cq_go_with_it() {
        let dev = device();
        let ch = new_channel(std::ptr::null_mut()).unwrap();
        let chp: *mut ibv_comp_channel = ch.cast();
        let cq = mk(&dev, &args(16, chp)).unwrap();
        // SAFETY (whole block): live channel and CQs of the test.
        unsafe {
            let qp = flushing_qp(&dev, cq);
            assert_eq!(req_notify_cq(cq.cast(), 0), 0);
            flush(&qp, 1);
            drop(qp);
            let readable = |fd| {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                libc::poll(&mut pfd, 1, 0) == 1
            };
            assert!(readable((*chp).fd), "the event is queued");
            // The event is queued, unread: destroy need not wait, and it
            // takes the event away. A program that polls before it reads
            // (Gloo) must not find the fd readable with nothing to read:
            // with O_NONBLOCK it would get -1 and abort.
            assert_eq!(ibv_destroy_cq(cq.cast()), 0);
            assert!(!readable((*chp).fd), "a destroyed CQ's event is gone");

            let cq2 = mk(&dev, &args(16, chp)).unwrap();
            let qp2 = flushing_qp(&dev, cq2);
            assert_eq!(req_notify_cq(cq2.cast(), 0), 0);
            flush(&qp2, 2);
            let mut got_cq: *mut ibv_cq = std::ptr::null_mut();
            let mut got_ctx: *mut c_void = std::ptr::null_mut();
            // The live one comes through, alone.
            assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), 0);
            assert_eq!(got_cq, cq2.cast());
            set_nonblocking((*chp).fd);
            assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), -1);
            assert_eq!(errno(), libc::EAGAIN);
            ibv_ack_cq_events(cq2.cast(), 1);
            drop(qp2);
            assert_eq!(ibv_destroy_cq(cq2.cast()), 0);
            assert_eq!(ibv_destroy_comp_channel(chp), 0);
        }
    }

    #[test]
    fn destroy_is_ebusy_while_queues_use_the_cq() {
        let dev = device();
        let cq = mk(&dev, &args(4, nch())).unwrap();
        // SAFETY: live CQ.
        unsafe {
            (*cq).users.fetch_add(2, Ordering::AcqRel);
            assert_eq!(ibv_destroy_cq(cq.cast()), libc::EBUSY);
            (*cq).users.fetch_sub(2, Ordering::AcqRel);
            assert_eq!(ibv_destroy_cq(cq.cast()), 0);
        }
    }

    // The completion-channel pattern of Gloo's ibverbs transport (its
    // device thread: poll(2) on the channel fd, ibv_get_cq_event, re-arm,
    // then ibv_poll_cq until empty) must never leave a completion without
    // an event to announce it.

    /// Waits up to `ms` for `fd` to be readable.
    fn readable(fd: c_int, ms: c_int) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    #[test]
    fn arm_then_poll_returns_earlier_completions_and_announces_later_ones() {
        let dev = device();
        let ch = new_channel(std::ptr::null_mut()).unwrap();
        let chp: *mut ibv_comp_channel = ch.cast();
        let cq = mk(&dev, &args(16, chp)).unwrap();
        // SAFETY (whole block): live channel and CQ of the test.
        unsafe {
            let fd = (*chp).fd;
            let qp = flushing_qp(&dev, cq);
            let (mut got_cq, mut got_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
            // Queued before the arm: no event, but the poll after the arm
            // returns it (rdma-core's contract, Gloo's order).
            flush(&qp, 1);
            assert!(!readable(fd, 0), "an unarmed CQ made an event");
            assert_eq!(req_notify_cq(cq.cast(), 0), 0);
            let (n, wcs) = poll(cq, 8);
            assert_eq!((n, wcs[0].wr_id), (1, 1));
            assert!(
                !readable(fd, 0),
                "a completion queued before the arm fired it"
            );
            // After the arm: one event, then the poll returns it.
            flush(&qp, 2);
            assert!(readable(fd, 0), "the armed CQ made no event");
            assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), 0);
            assert_eq!(got_cq, cq.cast());
            ibv_ack_cq_events(cq.cast(), 1);
            assert_eq!(req_notify_cq(cq.cast(), 0), 0);
            let (n, wcs) = poll(cq, 8);
            assert_eq!((n, wcs[0].wr_id), (1, 2));
            // Re-armed, nothing new: no event.
            assert!(!readable(fd, 0));
            drop(qp);
            assert_eq!(ibv_destroy_cq(cq.cast()), 0);
            assert_eq!(ibv_destroy_comp_channel(chp), 0);
        }
    }

    #[test]
    fn edge_triggered_epoll_wakes_for_every_event() {
        let dev = device();
        let ch = new_channel(std::ptr::null_mut()).unwrap();
        let chp: *mut ibv_comp_channel = ch.cast();
        let cq = mk(&dev, &args(16, chp)).unwrap();
        // SAFETY (whole block): live channel, CQ and epoll instance of the
        // test; epoll_event is plain data.
        unsafe {
            let fd = (*chp).fd;
            set_nonblocking(fd);
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(ep >= 0);
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: 7,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
            let qp = flushing_qp(&dev, cq);
            let (mut got_cq, mut got_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
            for round in 0..3u64 {
                assert_eq!(req_notify_cq(cq.cast(), 0), 0);
                flush(&qp, round);
                let mut out = [libc::epoll_event { events: 0, u64: 0 }];
                assert_eq!(
                    libc::epoll_wait(ep, out.as_mut_ptr(), 1, 5000),
                    1,
                    "round {round}: no edge for the event"
                );
                assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), 0);
                // Drained: the next event must make a new edge.
                assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), -1);
                assert_eq!(errno(), libc::EAGAIN);
                assert_eq!(poll(cq, 8).0, 1);
            }
            ibv_ack_cq_events(cq.cast(), 3);
            libc::close(ep);
            drop(qp);
            assert_eq!(ibv_destroy_cq(cq.cast()), 0);
            assert_eq!(ibv_destroy_comp_channel(chp), 0);
        }
    }

    #[test]
    fn completions_racing_the_rearm_never_go_unannounced() {
        // Two threads complete work into one CQ while a third runs Gloo's
        // loop on it; every completion must be polled, each wait for an
        // event must end in one (5 s bound: a lost event fails).
        const PER_THREAD: u64 = 3000;
        let dev = device();
        let ch = new_channel(std::ptr::null_mut()).unwrap();
        let chp: *mut ibv_comp_channel = ch.cast();
        let cq = mk(&dev, &args(2 * PER_THREAD as i64, chp)).unwrap();
        let qps = [flushing_qp(&dev, cq), flushing_qp(&dev, cq)];
        // SAFETY: live CQ; armed before any completion, as Gloo does.
        assert_eq!(unsafe { req_notify_cq(cq.cast(), 0) }, 0);
        let start = std::sync::Barrier::new(3);
        let (mut polled, mut events) = (0u64, 0u32);
        std::thread::scope(|s| {
            for (t, qp) in qps.iter().enumerate() {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    for i in 0..PER_THREAD {
                        flush(qp, t as u64 * PER_THREAD + i);
                    }
                });
            }
            start.wait();
            // SAFETY (whole loop): live channel and CQ of the test.
            unsafe {
                let fd = (*chp).fd;
                let (mut got_cq, mut got_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
                while polled < 2 * PER_THREAD {
                    assert!(
                        readable(fd, 5000),
                        "no event for 5 s with {polled} of {} completions polled",
                        2 * PER_THREAD
                    );
                    assert_eq!(ibv_get_cq_event(chp, &mut got_cq, &mut got_ctx), 0);
                    events += 1;
                    assert_eq!(req_notify_cq(cq.cast(), 0), 0);
                    loop {
                        let (n, _) = poll(cq, 16);
                        assert!(n >= 0, "poll_cq failed (errno {})", errno());
                        polled += n as u64;
                        if n < 16 {
                            break;
                        }
                    }
                }
            }
        });
        assert_eq!(polled, 2 * PER_THREAD);
        // SAFETY: live CQ and channel; every event read is acked.
        unsafe {
            ibv_ack_cq_events(cq.cast(), events);
            drop(qps);
            assert_eq!(ibv_destroy_cq(cq.cast()), 0);
            assert_eq!(ibv_destroy_comp_channel(chp), 0);
        }
    }
}
