//! Queue pair lifecycle: `ibv_create_qp`, the `create_qp_ex` op,
//! `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`, `ibv_qp_to_qp_ex`,
//! `ibv_query_qp_data_in_order`, xroce's own `xroce_create_gsi_qp`, and
//! the conversions of their attributes.
//! Posting is in [`crate::entry::post`], the `ibv_wr_*` builders in
//! [`crate::entry::wr_builder`].
//!
//! RC, UC and UD QPs are xroce [`QueuePair`](xroce::verbs::QueuePair)s.

use std::ffi::{c_int, c_void};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use xroce::verbs::qp::check_modify_for;
use xroce::verbs::{AccessFlags, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType};

use crate::abi::*;
use crate::base::errno::{fail, ffi, ffi_int, ffi_ptr, verbs_fail};
use crate::base::limits::{MAX_INLINE_DATA, MAX_QP_RD_ATOM, MAX_QP_WR, MAX_SGE};
use crate::entry::ah::av_from_ah_attr;
use crate::entry::wr_builder::set_wr_ops;
use crate::objects::context::{context, Context};
use crate::objects::events;
use crate::objects::{outer, qp_ref, Cq, Pd, PendingWrs, Qp, Srq};

/// The comp_mask bits create_qp_ex honours.
const SUPPORTED_COMP_MASK: u32 =
    IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// send_ops_flags per QP type (what the engine carries on it).
const RC_SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_SEND_WITH_INV) as u64;
const UC_SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM) as u64;
const UD_SEND_OPS: u64 = (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM) as u64;

/// Every `ibv_qp_attr_mask` bit rdma-core 44 defines.
const KNOWN_ATTR_MASK: u32 = ((IBV_QP_DEST_QPN << 1) - 1) | IBV_QP_RATE_LIMIT;

// ---------------------------------------------------------------------
// Pure conversions.

pub(crate) fn qp_type_of(t: u32) -> Option<QpType> {
    match t {
        IBV_QPT_RC => Some(QpType::Rc),
        IBV_QPT_UC => Some(QpType::Uc),
        IBV_QPT_UD => Some(QpType::Ud),
        _ => None,
    }
}

pub(crate) fn state_from_ibv(s: u32) -> Option<QpState> {
    Some(match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

pub(crate) fn state_to_ibv(s: QpState) -> u32 {
    match s {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Sqd => IBV_QPS_SQD,
        QpState::Sqe => IBV_QPS_SQE,
        QpState::Err => IBV_QPS_ERR,
    }
}

pub(crate) fn mtu_from_ibv(m: u32) -> Option<Mtu> {
    Some(match m {
        IBV_MTU_256 => Mtu::Mtu256,
        IBV_MTU_512 => Mtu::Mtu512,
        IBV_MTU_1024 => Mtu::Mtu1024,
        IBV_MTU_2048 => Mtu::Mtu2048,
        IBV_MTU_4096 => Mtu::Mtu4096,
        _ => return None,
    })
}

/// The capabilities granted for a create request: the limits of
/// `limits.rs` are enforced (EINVAL above them) and granted exactly; a QP
/// on an SRQ has no receive queue of its own (0, as rdma-core reports).
pub(crate) fn grant_caps(cap: &ibv_qp_cap, has_srq: bool) -> Result<ibv_qp_cap, i32> {
    let checks = [
        ("max_send_wr", cap.max_send_wr, MAX_QP_WR, true),
        ("max_recv_wr", cap.max_recv_wr, MAX_QP_WR, !has_srq),
        ("max_send_sge", cap.max_send_sge, MAX_SGE, true),
        ("max_recv_sge", cap.max_recv_sge, MAX_SGE, !has_srq),
        (
            "max_inline_data",
            cap.max_inline_data,
            MAX_INLINE_DATA,
            true,
        ),
    ];
    for (name, v, max, applies) in checks {
        if applies && v > max {
            return Err(fail(
                libc::EINVAL,
                format_args!("create QP: cap.{name} {v} exceeds the device's {max}"),
            ));
        }
    }
    let mut g = *cap;
    if has_srq {
        g.max_recv_wr = 0;
        g.max_recv_sge = 0;
    }
    Ok(g)
}

/// The engine's view of an `ibv_modify_qp` request, except the address
/// vector (resolved separately: it needs the neighbour table). `cur` is
/// the QP's state (checked against IBV_QP_CUR_STATE), `active` the largest
/// path MTU the interface carries (larger requests are lowered to it).
pub(crate) fn convert_modify(
    a: &ibv_qp_attr,
    mask: u32,
    cur: QpState,
    active: Mtu,
) -> Result<(QpAttr, QpAttrMask), i32> {
    if mask & !KNOWN_ATTR_MASK != 0 {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "modify QP: unknown attr_mask bits {:#x}",
                mask & !KNOWN_ATTR_MASK
            ),
        ));
    }
    let unsupported = [
        (IBV_QP_ALT_PATH, "IBV_QP_ALT_PATH (alternate paths)"),
        (IBV_QP_CAP, "IBV_QP_CAP (resizing a QP)"),
        (IBV_QP_RATE_LIMIT, "IBV_QP_RATE_LIMIT (raw packet QPs only)"),
    ];
    for (bit, name) in unsupported {
        if mask & bit != 0 {
            return Err(fail(
                libc::EOPNOTSUPP,
                format_args!("modify QP: {name} is not supported by xroce"),
            ));
        }
    }
    if mask & IBV_QP_PATH_MIG_STATE != 0 && a.path_mig_state != IBV_MIG_MIGRATED {
        return Err(fail(
            libc::EOPNOTSUPP,
            "modify QP: path migration is not supported by xroce (only IBV_MIG_MIGRATED)",
        ));
    }
    let mut x = QpAttr::default();
    if mask & IBV_QP_STATE != 0 {
        x.qp_state = state_from_ibv(a.qp_state).ok_or_else(|| {
            fail(
                libc::EINVAL,
                format_args!("modify QP: qp_state {} is not a state", a.qp_state),
            )
        })?;
    }
    if mask & IBV_QP_CUR_STATE != 0 && state_from_ibv(a.cur_qp_state) != Some(cur) {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "modify QP: cur_qp_state {} but the QP is in {cur:?}",
                a.cur_qp_state
            ),
        ));
    }
    if mask & IBV_QP_ACCESS_FLAGS != 0 {
        x.qp_access_flags = AccessFlags::from_bits_truncate(a.qp_access_flags);
    }
    if mask & IBV_QP_PKEY_INDEX != 0 && a.pkey_index != 0 {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "modify QP: pkey_index {} (the P_Key table has 1 entry)",
                a.pkey_index
            ),
        ));
    }
    if mask & IBV_QP_PORT != 0 && a.port_num != 1 {
        return Err(fail(
            libc::EINVAL,
            format_args!("modify QP: port_num {} (the device has port 1)", a.port_num),
        ));
    }
    x.port_num = 1;
    if mask & IBV_QP_PATH_MTU != 0 {
        let m = mtu_from_ibv(a.path_mtu).ok_or_else(|| {
            fail(
                libc::EINVAL,
                format_args!("modify QP: path_mtu {} is not an ibv_mtu", a.path_mtu),
            )
        })?;
        x.path_mtu = if m.bytes() > active.bytes() {
            if crate::base::config::debug() {
                eprintln!(
                    "xroce libibverbs: modify QP: path MTU {} lowered to the interface's {}",
                    m.bytes(),
                    active.bytes()
                );
            }
            active
        } else {
            m
        };
    }
    for (bit, v, name) in [
        (IBV_QP_MAX_QP_RD_ATOMIC, a.max_rd_atomic, "max_rd_atomic"),
        (
            IBV_QP_MAX_DEST_RD_ATOMIC,
            a.max_dest_rd_atomic,
            "max_dest_rd_atomic",
        ),
    ] {
        if mask & bit != 0 && u32::from(v) > MAX_QP_RD_ATOM {
            return Err(fail(
                libc::EINVAL,
                format_args!("modify QP: {name} {v} exceeds the device's {MAX_QP_RD_ATOM}"),
            ));
        }
    }
    x.max_rd_atomic = a.max_rd_atomic;
    x.max_dest_rd_atomic = a.max_dest_rd_atomic;
    x.pkey_index = 0;
    x.qkey = a.qkey;
    x.rq_psn = a.rq_psn;
    x.sq_psn = a.sq_psn;
    x.dest_qp_num = a.dest_qp_num;
    x.timeout = a.timeout;
    x.retry_cnt = a.retry_cnt;
    x.rnr_retry = a.rnr_retry;
    x.min_rnr_timer = a.min_rnr_timer;
    let m = QpAttrMask::from_bits_truncate(mask)
        - (QpAttrMask::CUR_STATE | QpAttrMask::PATH_MIG_STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY);
    Ok((x, m))
}

// ---------------------------------------------------------------------
// Object access.

/// The context a QP was created on.
fn qp_context(q: &Qp) -> &Context {
    // SAFETY: set at creation to the open context, which rdma-core's
    // contract keeps open until the QP is destroyed.
    unsafe { &*q.ctx }
}

// ---------------------------------------------------------------------
// Creation and destruction.

struct CreateReq {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    qp_context: *mut c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: ibv_qp_cap,
    qp_type: u32,
    sq_sig_all: bool,
    /// Some for create_qp_ex (its send_ops_flags, if given).
    ex: Option<Option<u64>>,
    /// The device's GSI QP (QP1) instead of a new QP number.
    gsi: bool,
}

fn create(r: CreateReq) -> Result<(*mut ibv_qp, ibv_qp_cap), i32> {
    // SAFETY: the program passes an open context (or the PD's).
    let c = unsafe { context(r.ctx) }.ok_or(libc::EINVAL)?;
    // SAFETY: the program passes a live PD of ours.
    let pd = unsafe { outer::<_, Pd>(r.pd) }.ok_or(libc::EINVAL)?;
    let Some(qp_type) = qp_type_of(r.qp_type) else {
        return Err(fail(
            libc::EOPNOTSUPP,
            format_args!(
                "create QP: QP type {} is not supported (RC, UC and UD are)",
                r.qp_type
            ),
        ));
    };
    // SAFETY: CQ pointers come from this library's create_cq.
    let send_cq = unsafe { outer::<_, Cq>(r.send_cq) }
        .ok_or_else(|| fail(libc::EINVAL, "create QP: send_cq is NULL"))?;
    // SAFETY: as above.
    let recv_cq = unsafe { outer::<_, Cq>(r.recv_cq) }
        .ok_or_else(|| fail(libc::EINVAL, "create QP: recv_cq is NULL"))?;
    // SAFETY: an SRQ pointer comes from this library's create_srq.
    let srq = unsafe { outer::<_, Srq>(r.srq) };
    let cap = grant_caps(&r.cap, srq.is_some())?;
    let init = QpInitAttr {
        qp_type,
        send_cq: send_cq.inner.clone(),
        recv_cq: recv_cq.inner.clone(),
        srq: srq.as_ref().map(|s| s.inner.clone()),
        cap: QpCap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        },
        sq_sig_all: r.sq_sig_all,
    };
    let device = &c.dev.device;
    let inner = if r.gsi {
        device.create_gsi_qp(&pd.inner, &init)
    } else {
        device.create_qp(&pd.inner, &init)
    }
    .map_err(verbs_fail)?;
    let qpn = inner.qp_num();
    let mut qpx = ibv_qp_ex::default();
    let b = &mut qpx.qp_base;
    b.context = r.ctx;
    b.qp_context = r.qp_context;
    b.pd = r.pd;
    b.send_cq = r.send_cq;
    b.recv_cq = r.recv_cq;
    b.srq = r.srq;
    b.handle = qpn;
    b.qp_num = qpn;
    b.state = IBV_QPS_RESET;
    b.qp_type = r.qp_type;
    if let Some(Some(_)) = r.ex {
        set_wr_ops(&mut qpx);
    }
    let q = Box::leak(Box::new(Qp {
        qp: qpx,
        inner,
        ctx: c as *mut Context,
        has_qp_ex: r.ex.is_some(),
        pending: Mutex::new(PendingWrs::default()),
        cap,
        sq_sig_all: r.sq_sig_all,
        qp_type: r.qp_type,
        srq: r.srq,
        ah_attr: Mutex::new(ibv_ah_attr::default()),
    }));
    crate::base::handles::born(&*q as *const crate::objects::Qp);
    // SAFETY: initialising the QP's own mutex and condition variable (the
    // program's ibv_ack_async_event uses them) before anyone sees them.
    unsafe {
        libc::pthread_mutex_init(
            &mut q.qp.qp_base.mutex as *mut _ as *mut libc::pthread_mutex_t,
            std::ptr::null(),
        );
        libc::pthread_cond_init(
            &mut q.qp.qp_base.cond as *mut _ as *mut libc::pthread_cond_t,
            std::ptr::null(),
        );
    }
    send_cq.users.fetch_add(1, Ordering::AcqRel);
    recv_cq.users.fetch_add(1, Ordering::AcqRel);
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    let ptr = &mut q.qp.qp_base as *mut ibv_qp;
    events::track(ptr as *mut c_void, events::Kind::Qp);
    c.own_qp(qpn, ptr);
    Ok((ptr, cap))
}

/// `ibv_create_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: the program's arguments, passed on.
    unsafe { create_from_init_attr(pd, attr, false) }
}

/// `xroce_create_gsi_qp` (xroce's own, node `XROCE_PRIVATE_1`): the
/// device's GSI QP, QP1, for a connection manager's MADs (xroce's
/// librdmacm finds it with `dlsym`). As `ibv_create_qp` with `attr` (which
/// must ask for a UD QP: EINVAL otherwise), except that the QP's number is
/// 1, its Q_Key starts as 0x80010000 and only that Q_Key is accepted, and
/// a device has one at a time (EEXIST while it lives).
#[no_mangle]
pub unsafe extern "C" fn xroce_create_gsi_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: the program's arguments, passed on.
    unsafe { create_from_init_attr(pd, attr, true) }
}

/// `ibv_create_qp`, or the GSI QP if `gsi`.
///
/// # Safety
/// `pd` and `attr` are what the program passed to the verb.
unsafe fn create_from_init_attr(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
    gsi: bool,
) -> *mut ibv_qp {
    ffi_ptr(|| {
        // SAFETY: the program passes a live PD of ours.
        let p = unsafe { outer::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
        // SAFETY: the program passes a valid ibv_qp_init_attr.
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        if gsi && a.qp_type != IBV_QPT_UD {
            return Err(fail(
                libc::EINVAL,
                format_args!(
                    "create GSI QP: QP type {} (QP1 is a UD QP, IBV_QPT_UD)",
                    a.qp_type
                ),
            ));
        }
        let (qp, cap) = create(CreateReq {
            ctx: p.pd.context,
            pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all != 0,
            ex: None,
            gsi,
        })?;
        a.cap = cap;
        Ok(qp)
    })
}

/// `verbs_context.create_qp_ex` (what the inline `ibv_create_qp_ex`
/// calls when comp_mask asks for more than a PD).
pub(crate) unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    ffi_ptr(|| {
        // SAFETY: the program passes a valid ibv_qp_init_attr_ex.
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        if a.comp_mask & !SUPPORTED_COMP_MASK != 0 {
            return Err(fail(
                libc::EOPNOTSUPP,
                format_args!(
                    "create_qp_ex: comp_mask bits {:#x} (XRC, RSS, TSO...) are not supported",
                    a.comp_mask & !SUPPORTED_COMP_MASK
                ),
            ));
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return Err(fail(
                libc::EOPNOTSUPP,
                format_args!(
                    "create_qp_ex: create_flags {:#x} are not supported",
                    a.create_flags
                ),
            ));
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            return Err(fail(libc::EINVAL, "create_qp_ex: a PD is required"));
        }
        let send_ops = if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            let allowed = match a.qp_type {
                IBV_QPT_RC => RC_SEND_OPS,
                IBV_QPT_UC => UC_SEND_OPS,
                IBV_QPT_UD => UD_SEND_OPS,
                _ => 0,
            };
            if a.send_ops_flags & !allowed != 0 {
                return Err(fail(
                    libc::EOPNOTSUPP,
                    format_args!(
                        "create_qp_ex: send_ops_flags {:#x} are not supported on QP type {}",
                        a.send_ops_flags & !allowed,
                        a.qp_type
                    ),
                ));
            }
            Some(a.send_ops_flags)
        } else {
            None
        };
        let (qp, cap) = create(CreateReq {
            ctx,
            pd: a.pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all != 0,
            ex: Some(send_ops),
            gsi: false,
        })?;
        a.cap = cap;
        Ok(qp)
    })
}

/// `ibv_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi_int(|| {
        // SAFETY: a QP this library created, destroyed once.
        let q = unsafe { outer::<_, Qp>(qp) }.ok_or(libc::EINVAL)?;
        // No new events; then wait until the program acked those it read.
        qp_context(q).disown_qp(q.qp.qp_base.qp_num);
        let reported = events::untrack(qp as *mut c_void);
        let b = &mut q.qp.qp_base;
        // SAFETY: the QP's own mutex, condition variable and counter,
        // initialised at creation; the program's acks raise the counter.
        unsafe { events::wait_acked(&mut b.mutex, &mut b.cond, &b.events_completed, reported) };
        for cq in [q.qp.qp_base.send_cq, q.qp.qp_base.recv_cq] {
            // SAFETY: the CQs outlive their QPs (ibv_destroy_cq is EBUSY
            // while `users` counts this QP).
            if let Some(c) = unsafe { outer::<_, Cq>(cq) } {
                c.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // SAFETY: as for the CQs.
        if let Some(s) = unsafe { outer::<_, Srq>(q.srq) } {
            s.users.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: nothing uses them any more (rdma-core's contract).
        unsafe {
            libc::pthread_mutex_destroy(
                &mut q.qp.qp_base.mutex as *mut _ as *mut libc::pthread_mutex_t,
            );
            libc::pthread_cond_destroy(
                &mut q.qp.qp_base.cond as *mut _ as *mut libc::pthread_cond_t,
            );
        }
        // SAFETY: the Box was leaked by create; dropping the QueuePair
        // destroys the engine's QP.
        crate::base::handles::free(unsafe { Box::from_raw(q as *mut Qp) });
        Ok(())
    })
}

/// `ibv_qp_to_qp_ex`: the extended QP of one made by `ibv_create_qp_ex`
/// with more than a PD in comp_mask; NULL otherwise.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: the program passes a live QP of ours.
    ffi(std::ptr::null_mut(), || match unsafe { qp_ref(qp) } {
        Some(q) if q.has_qp_ex => qp as *mut ibv_qp_ex,
        _ => std::ptr::null_mut(),
    })
}

/// `IBV_QUERY_QP_DATA_IN_ORDER_*` (newer headers than rdma-core 44's).
const IN_ORDER_RETURN_CAPS: u32 = 1;
const IN_ORDER_DEVICE_ONLY: u32 = 2;
const IN_ORDER_WHOLE_MSG: c_int = 1;
const IN_ORDER_ALIGNED_128_BYTES: c_int = 2;

/// What `ibv_query_qp_data_in_order` answers: xroce places every
/// message's payload in PSN order, so data of READ responses, WRITEs and
/// SENDs becomes visible in order.
pub(crate) fn data_in_order(op: u32, flags: u32) -> c_int {
    if flags & !(IN_ORDER_RETURN_CAPS | IN_ORDER_DEVICE_ONLY) != 0 {
        return 0;
    }
    let moves_data = matches!(
        op,
        IBV_WR_RDMA_WRITE
            | IBV_WR_RDMA_WRITE_WITH_IMM
            | IBV_WR_SEND
            | IBV_WR_SEND_WITH_IMM
            | IBV_WR_SEND_WITH_INV
            | IBV_WR_RDMA_READ
    );
    if !moves_data {
        return 0;
    }
    if flags & IN_ORDER_RETURN_CAPS != 0 {
        IN_ORDER_WHOLE_MSG | IN_ORDER_ALIGNED_128_BYTES
    } else {
        1
    }
}

/// `ibv_query_qp_data_in_order`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    qp: *mut ibv_qp,
    op: ibv_wr_opcode,
    flags: u32,
) -> c_int {
    // SAFETY: the program passes a live QP of ours.
    ffi(0, || match unsafe { qp_ref(qp) } {
        Some(_) => data_in_order(op, flags),
        None => 0,
    })
}

// ---------------------------------------------------------------------
// Modify and query.

fn modify(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> Result<(), i32> {
    // SAFETY: the program passes a live QP of ours.
    let q = unsafe { qp_ref(qp) }.ok_or(libc::EINVAL)?;
    // SAFETY: the program passes a valid ibv_qp_attr.
    let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
    let mask = attr_mask as u32;
    let c = qp_context(q);
    let qp_type = qp_type_of(q.qp_type).ok_or(libc::EINVAL)?;
    let cur = q.inner.query().map_err(verbs_fail)?.qp_state;
    let (mut x, mut m) = convert_modify(a, mask, cur, c.dev.active_mtu)?;
    if qp_type == QpType::Ud && m.contains(QpAttrMask::STATE) && x.qp_state == QpState::Rtr {
        // A UD QP's messages may fill the port's MTU (rxe's rule); its
        // modify carries no path MTU.
        m |= QpAttrMask::PATH_MTU;
        x.path_mtu = c.dev.active_mtu;
    }
    // Refuse a bad transition before spending time on ARP.
    check_modify_for(qp_type, cur, &x, m).map_err(verbs_fail)?;
    let mut av_attr = None;
    if m.contains(QpAttrMask::AV) {
        if qp_type == QpType::Ud {
            // UD QPs address each send through its AH.
            m.remove(QpAttrMask::AV);
        } else {
            x.ah_attr = av_from_ah_attr(&c.dev, &a.ah_attr, "modify QP")?;
            let mut stored = a.ah_attr;
            stored.port_num = 1;
            av_attr = Some(stored);
        }
    }
    q.inner.modify(&x, m).map_err(verbs_fail)?;
    if let Some(s) = av_attr {
        *q.ah_attr.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }
    if mask & IBV_QP_STATE != 0 {
        // SAFETY: `qp` is live; the program reads `state` (rdma-core's
        // ibv_modify_qp keeps it current the same way).
        unsafe { (*qp).state = a.qp_state };
    }
    Ok(())
}

/// `ibv_modify_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    ffi_int(|| modify(qp, attr, attr_mask))
}

fn query(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, init: *mut ibv_qp_init_attr) -> Result<(), i32> {
    // SAFETY: the program passes a live QP of ours.
    let q = unsafe { qp_ref(qp) }.ok_or(libc::EINVAL)?;
    if attr.is_null() || init.is_null() {
        return Err(libc::EINVAL);
    }
    let x = q.inner.query().map_err(verbs_fail)?;
    let mut ah = *q.ah_attr.lock().unwrap_or_else(|e| e.into_inner());
    if ah.is_global != 0 {
        // What the engine really uses.
        ah.grh.dgid.raw = match x.ah_attr.dest_ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        ah.grh.traffic_class = (x.ah_attr.dscp << 2) | (ah.grh.traffic_class & 3);
    }
    let state = state_to_ibv(x.qp_state);
    let out = ibv_qp_attr {
        qp_state: state,
        cur_qp_state: state,
        path_mtu: crate::entry::query::port::mtu_enum(x.path_mtu),
        path_mig_state: IBV_MIG_MIGRATED,
        qkey: x.qkey,
        rq_psn: x.rq_psn,
        sq_psn: x.sq_psn,
        dest_qp_num: x.dest_qp_num,
        qp_access_flags: x.qp_access_flags.bits(),
        cap: q.cap,
        ah_attr: ah,
        alt_ah_attr: ibv_ah_attr::default(),
        pkey_index: x.pkey_index,
        alt_pkey_index: 0,
        en_sqd_async_notify: 0,
        sq_draining: 0,
        max_rd_atomic: x.max_rd_atomic,
        max_dest_rd_atomic: x.max_dest_rd_atomic,
        min_rnr_timer: x.min_rnr_timer,
        port_num: 1,
        timeout: x.timeout,
        retry_cnt: x.retry_cnt,
        rnr_retry: x.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        rate_limit: 0,
    };
    let b = &q.qp.qp_base;
    let init_out = ibv_qp_init_attr {
        qp_context: b.qp_context,
        send_cq: b.send_cq,
        recv_cq: b.recv_cq,
        srq: b.srq,
        cap: q.cap,
        qp_type: q.qp_type,
        sq_sig_all: q.sq_sig_all as c_int,
    };
    // SAFETY: the program's attr and init_attr, checked non-NULL above;
    // `qp` is live (rdma-core's ibv_query_qp refreshes `state` too).
    unsafe {
        *attr = out;
        *init = init_out;
        (*qp).state = state;
    }
    Ok(())
}

/// `ibv_query_qp`: every attribute is filled whatever `attr_mask` says
/// (providers do the same).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi_int(|| query(qp, attr, init_attr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip() {
        for s in QpState::ALL {
            assert_eq!(state_from_ibv(state_to_ibv(s)), Some(s));
        }
        assert_eq!(state_to_ibv(QpState::Rts), 3);
        assert_eq!(state_from_ibv(IBV_QPS_UNKNOWN), None);
    }

    #[test]
    fn mtus_round_trip() {
        for (e, b) in [(1, 256), (2, 512), (3, 1024), (4, 2048), (5, 4096)] {
            let m = mtu_from_ibv(e).unwrap();
            assert_eq!(m.bytes(), b);
            assert_eq!(crate::entry::query::port::mtu_enum(m), e);
        }
        assert_eq!(mtu_from_ibv(0), None);
        assert_eq!(mtu_from_ibv(6), None);
    }

    #[test]
    fn attr_mask_bits_match_xroce() {
        for (ibv, x) in [
            (IBV_QP_STATE, QpAttrMask::STATE),
            (IBV_QP_ACCESS_FLAGS, QpAttrMask::ACCESS_FLAGS),
            (IBV_QP_AV, QpAttrMask::AV),
            (IBV_QP_PATH_MTU, QpAttrMask::PATH_MTU),
            (IBV_QP_TIMEOUT, QpAttrMask::TIMEOUT),
            (IBV_QP_RQ_PSN, QpAttrMask::RQ_PSN),
            (IBV_QP_MAX_QP_RD_ATOMIC, QpAttrMask::MAX_QP_RD_ATOMIC),
            (IBV_QP_MIN_RNR_TIMER, QpAttrMask::MIN_RNR_TIMER),
            (IBV_QP_SQ_PSN, QpAttrMask::SQ_PSN),
            (IBV_QP_MAX_DEST_RD_ATOMIC, QpAttrMask::MAX_DEST_RD_ATOMIC),
            (IBV_QP_CAP, QpAttrMask::CAP),
            (IBV_QP_DEST_QPN, QpAttrMask::DEST_QPN),
        ] {
            assert_eq!(ibv, x.bits());
        }
    }

    fn rtr_attr() -> ibv_qp_attr {
        ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: IBV_MTU_4096,
            dest_qp_num: 0x12,
            rq_psn: 0x1234,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            ..Default::default()
        }
    }

    #[test]
    fn modify_conversion() {
        // ib_write_bw's RTR (mask 0x129181), AV aside.
        let (x, m) = convert_modify(&rtr_attr(), 0x129181, QpState::Init, Mtu::Mtu1024).unwrap();
        assert_eq!(m.bits(), 0x129181);
        assert_eq!(x.qp_state, QpState::Rtr);
        // Lowered to what the interface carries.
        assert_eq!(x.path_mtu, Mtu::Mtu1024);
        assert_eq!(x.max_dest_rd_atomic, 16);
        assert_eq!(
            (x.dest_qp_num, x.rq_psn, x.min_rnr_timer),
            (0x12, 0x1234, 12)
        );
        let (x, _) = convert_modify(&rtr_attr(), 0x129181, QpState::Init, Mtu::Mtu4096).unwrap();
        assert_eq!(x.path_mtu, Mtu::Mtu4096);

        // INIT (mask 0x39): access flags, pkey 0, port 1.
        let init = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            qp_access_flags: IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE,
            port_num: 1,
            ..Default::default()
        };
        let (x, m) = convert_modify(&init, 0x39, QpState::Reset, Mtu::Mtu1024).unwrap();
        assert_eq!(m.bits(), 0x39);
        assert_eq!(
            x.qp_access_flags,
            AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE
        );
        let bad_port = ibv_qp_attr {
            port_num: 2,
            ..init
        };
        assert_eq!(
            convert_modify(&bad_port, 0x39, QpState::Reset, Mtu::Mtu1024).err(),
            Some(libc::EINVAL)
        );
        let bad_pkey = ibv_qp_attr {
            pkey_index: 1,
            ..init
        };
        assert_eq!(
            convert_modify(&bad_pkey, 0x39, QpState::Reset, Mtu::Mtu1024).err(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn modify_rejections() {
        let a = rtr_attr();
        let mtu = Mtu::Mtu4096;
        assert_eq!(
            convert_modify(&a, IBV_QP_ALT_PATH, QpState::Init, mtu).err(),
            Some(libc::EOPNOTSUPP)
        );
        assert_eq!(
            convert_modify(&a, IBV_QP_RATE_LIMIT, QpState::Init, mtu).err(),
            Some(libc::EOPNOTSUPP)
        );
        assert_eq!(
            convert_modify(&a, 1 << 22, QpState::Init, mtu).err(),
            Some(libc::EINVAL)
        );
        let bad_state = ibv_qp_attr { qp_state: 7, ..a };
        assert_eq!(
            convert_modify(&bad_state, IBV_QP_STATE, QpState::Init, mtu).err(),
            Some(libc::EINVAL)
        );
        let bad_mtu = ibv_qp_attr { path_mtu: 9, ..a };
        assert_eq!(
            convert_modify(&bad_mtu, IBV_QP_PATH_MTU, QpState::Init, mtu).err(),
            Some(libc::EINVAL)
        );
        // The read/atomic depth: up to the engine's, which the device
        // reports; above it EINVAL (as rxe), not lowered.
        assert_eq!(MAX_QP_RD_ATOM, u32::from(xroce::verbs::qp::MAX_RD_ATOMIC));
        let depth = MAX_QP_RD_ATOM as u8;
        for (bit, v) in [
            (IBV_QP_MAX_QP_RD_ATOMIC, depth),
            (IBV_QP_MAX_DEST_RD_ATOMIC, depth),
        ] {
            let at_max = ibv_qp_attr {
                max_rd_atomic: v,
                max_dest_rd_atomic: v,
                ..a
            };
            let (x, m) = convert_modify(&at_max, bit, QpState::Rtr, mtu).unwrap();
            assert_eq!(
                (x.max_rd_atomic, x.max_dest_rd_atomic, m.bits()),
                (v, v, bit)
            );
            for too_many in [v + 1, 200] {
                let over = ibv_qp_attr {
                    max_rd_atomic: too_many,
                    max_dest_rd_atomic: too_many,
                    ..a
                };
                assert_eq!(
                    convert_modify(&over, bit, QpState::Rtr, mtu).err(),
                    Some(libc::EINVAL)
                );
            }
        }
        // Not checked when the mask does not name them.
        let unused = ibv_qp_attr {
            max_rd_atomic: 200,
            max_dest_rd_atomic: 200,
            ..a
        };
        assert!(convert_modify(&unused, IBV_QP_STATE, QpState::Init, mtu).is_ok());
        let cur = ibv_qp_attr {
            cur_qp_state: IBV_QPS_RTS,
            ..a
        };
        assert_eq!(
            convert_modify(&cur, IBV_QP_CUR_STATE | IBV_QP_STATE, QpState::Init, mtu).err(),
            Some(libc::EINVAL)
        );
        let (_, m) =
            convert_modify(&cur, IBV_QP_CUR_STATE | IBV_QP_STATE, QpState::Rts, mtu).unwrap();
        assert_eq!(m, QpAttrMask::STATE);
        let migrated = ibv_qp_attr {
            path_mig_state: IBV_MIG_MIGRATED,
            ..a
        };
        let (_, m) = convert_modify(&migrated, IBV_QP_PATH_MIG_STATE, QpState::Rts, mtu).unwrap();
        assert!(m.is_empty());
        let armed = ibv_qp_attr {
            path_mig_state: IBV_MIG_ARMED,
            ..a
        };
        assert_eq!(
            convert_modify(&armed, IBV_QP_PATH_MIG_STATE, QpState::Rts, mtu).err(),
            Some(libc::EOPNOTSUPP)
        );
    }

    #[test]
    fn caps() {
        let want = ibv_qp_cap {
            max_send_wr: 128,
            max_recv_wr: 512,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        assert_eq!(grant_caps(&want, false).unwrap().max_recv_wr, 512);
        let g = grant_caps(&want, true).unwrap();
        assert_eq!((g.max_recv_wr, g.max_recv_sge, g.max_send_wr), (0, 0, 128));
        for bad in [
            ibv_qp_cap {
                max_send_wr: MAX_QP_WR + 1,
                ..want
            },
            ibv_qp_cap {
                max_recv_sge: MAX_SGE + 1,
                ..want
            },
            ibv_qp_cap {
                max_inline_data: MAX_INLINE_DATA + 1,
                ..want
            },
        ] {
            assert_eq!(grant_caps(&bad, false).err(), Some(libc::EINVAL));
        }
        // Receive limits do not apply on an SRQ.
        let on_srq = ibv_qp_cap {
            max_recv_wr: MAX_QP_WR + 1,
            ..want
        };
        assert!(grant_caps(&on_srq, true).is_ok());
    }

    #[test]
    fn in_order() {
        assert_eq!(data_in_order(IBV_WR_RDMA_WRITE, 0), 1);
        assert_eq!(data_in_order(IBV_WR_RDMA_READ, 0), 1);
        assert_eq!(data_in_order(IBV_WR_SEND, IN_ORDER_DEVICE_ONLY), 1);
        assert_eq!(
            data_in_order(IBV_WR_SEND, IN_ORDER_RETURN_CAPS),
            IN_ORDER_WHOLE_MSG | IN_ORDER_ALIGNED_128_BYTES
        );
        assert_eq!(data_in_order(IBV_WR_ATOMIC_FETCH_AND_ADD, 0), 0);
        assert_eq!(data_in_order(IBV_WR_RDMA_WRITE, 1 << 5), 0);
    }
}

/// Every verb of this module on a real device (an interface with an IPv4
/// address, over the UDP backend; QPs talk to each other through the
/// runtime's loopback). Run with
/// `XROCE_IFACES=eth0 XROCE_BACKEND=udp cargo test -p xroce-ibverbs -- --ignored`.
#[cfg(test)]
mod device_tests {
    use super::*;
    use crate::entry::ah::{ibv_create_ah, ibv_destroy_ah, ibv_init_ah_from_wc};
    use crate::entry::context::{ibv_close_device, ibv_get_device_list, ibv_open_device};
    use crate::entry::cq::{ibv_create_cq, ibv_destroy_cq, poll_cq};
    use crate::entry::mr::{ibv_alloc_pd, ibv_dealloc_pd, ibv_dereg_mr, ibv_reg_mr};
    use crate::entry::post::{post_recv, post_send};
    use crate::entry::query::device::ibv_query_device;
    use crate::entry::query::gid::ibv_query_gid;
    use crate::entry::srq::{ibv_create_srq, ibv_destroy_srq, post_srq_recv};
    use std::time::{Duration, Instant};

    struct Dev {
        ctx: *mut ibv_context,
        pd: *mut ibv_pd,
        cq: *mut ibv_cq,
        buf: Vec<u8>,
        mr: *mut ibv_mr,
        gid: ibv_gid,
    }

    unsafe fn open() -> Dev {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        assert!(n > 0, "no device: set XROCE_IFACES");
        let ctx = ibv_open_device(*list);
        assert!(!ctx.is_null());
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 256, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        assert!(!pd.is_null() && !cq.is_null());
        let mut buf = vec![0u8; 1 << 16];
        let access =
            (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) as c_int;
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr() as *mut c_void, buf.len(), access);
        assert!(!mr.is_null());
        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 1, &mut gid), 0);
        Dev {
            ctx,
            pd,
            cq,
            buf,
            mr,
            gid,
        }
    }

    unsafe fn qp(d: &Dev, t: u32, srq: *mut ibv_srq) -> *mut ibv_qp {
        let mut a = ibv_qp_init_attr {
            send_cq: d.cq,
            recv_cq: d.cq,
            srq,
            cap: ibv_qp_cap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            qp_type: t,
            ..Default::default()
        };
        let q = ibv_create_qp(d.pd, &mut a);
        assert!(!q.is_null());
        q
    }

    unsafe fn connect(d: &Dev, q: *mut ibv_qp, peer: u32) {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            port_num: 1,
            qp_access_flags: IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
            qkey: 0x1111_1111,
            ..Default::default()
        };
        let ud = (*q).qp_type == IBV_QPT_UD;
        let extra = if ud { IBV_QP_QKEY } else { IBV_QP_ACCESS_FLAGS };
        assert_eq!(ibv_modify_qp(q, &mut a, (0x31 | extra) as c_int), 0);
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = peer;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = d.gid;
        a.ah_attr.grh.sgid_index = 1;
        a.ah_attr.grh.hop_limit = 1;
        a.ah_attr.port_num = 1;
        let mask = if ud { IBV_QP_STATE } else { 0x129181 };
        assert_eq!(ibv_modify_qp(q, &mut a, mask as c_int), 0);
        assert_eq!((*q).state, IBV_QPS_RTR);
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 16;
        let mask = if ud {
            IBV_QP_STATE | IBV_QP_SQ_PSN
        } else {
            0x12e01
        };
        assert_eq!(ibv_modify_qp(q, &mut a, mask as c_int), 0);
    }

    unsafe fn poll(d: &Dev, n: usize) -> Vec<ibv_wc> {
        let mut out = Vec::new();
        let t0 = Instant::now();
        while out.len() < n && t0.elapsed() < Duration::from_secs(5) {
            let mut wc = [ibv_wc::default(); 4];
            let got = poll_cq(d.cq, 4, wc.as_mut_ptr());
            assert!(got >= 0);
            out.extend_from_slice(&wc[..got as usize]);
        }
        out
    }

    unsafe fn recv_into(q: *mut ibv_qp, d: &Dev, off: usize, len: u32) {
        let mut sge = ibv_sge {
            addr: d.buf.as_ptr() as u64 + off as u64,
            length: len,
            lkey: (*d.mr).lkey,
        };
        let mut w = ibv_recv_wr {
            wr_id: 100,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        let mut bad = std::ptr::null_mut();
        assert_eq!(post_recv(q, &mut w, &mut bad), 0);
    }

    unsafe fn send(q: *mut ibv_qp, data: &[u8], ah: *mut ibv_ah, peer: u32) -> c_int {
        let mut sge = ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        let mut w = ibv_send_wr {
            wr_id: 200,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_SEND,
            send_flags: IBV_SEND_SIGNALED | IBV_SEND_INLINE,
            ..Default::default()
        };
        w.wr.ud.ah = ah;
        w.wr.ud.remote_qpn = peer;
        w.wr.ud.remote_qkey = 0x1111_1111;
        let mut bad = std::ptr::null_mut();
        post_send(q, &mut w, &mut bad)
    }

    #[test]
    #[ignore = "needs an interface with IPv4: XROCE_IFACES=IF XROCE_BACKEND=udp"]
    fn rc_ud_srq_on_a_device() {
        // SAFETY: the verbs used as a C program uses them.
        unsafe {
            let d = open();
            // RC through modify_qp, inline send, query.
            let (q1, q2) = (
                qp(&d, IBV_QPT_RC, std::ptr::null_mut()),
                qp(&d, IBV_QPT_RC, std::ptr::null_mut()),
            );
            // Posting to a QP in RESET is EINVAL.
            assert_eq!(send(q1, b"x", std::ptr::null_mut(), 0), libc::EINVAL);
            connect(&d, q1, (*q2).qp_num);
            connect(&d, q2, (*q1).qp_num);
            recv_into(q2, &d, 0, 64);
            assert_eq!(send(q1, b"over RC", std::ptr::null_mut(), 0), 0);
            let wc = poll(&d, 2);
            assert_eq!(wc.len(), 2, "completions");
            assert!(wc.iter().all(|w| w.status == IBV_WC_SUCCESS));
            assert_eq!(&d.buf[..7], b"over RC");
            let mut attr = ibv_qp_attr::default();
            let mut init = ibv_qp_init_attr::default();
            assert_eq!(
                ibv_query_qp(q1, &mut attr, IBV_QP_CAP as c_int, &mut init),
                0
            );
            assert_eq!(attr.qp_state, IBV_QPS_RTS);
            assert_eq!(attr.dest_qp_num, (*q2).qp_num);
            assert_eq!(attr.ah_attr.grh.dgid.raw, d.gid.raw);
            assert_eq!(
                (attr.timeout, attr.retry_cnt, attr.path_mtu),
                (14, 7, IBV_MTU_1024)
            );
            assert_eq!((init.cap.max_inline_data, init.qp_type), (64, IBV_QPT_RC));
            // The CQ is in use.
            assert_eq!(ibv_destroy_cq(d.cq), libc::EBUSY);
            // An IPv6 destination GID is refused.
            let mut a = ibv_qp_attr::default();
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
            assert_eq!(ibv_modify_qp(q1, &mut a, IBV_QP_AV as c_int), libc::EINVAL);
            // The read/atomic depth the device reports is what modify
            // accepts; one more is EINVAL.
            let mut da = ibv_device_attr::default();
            assert_eq!(ibv_query_device(d.ctx, &mut da), 0);
            assert_eq!(
                da.max_qp_rd_atom,
                c_int::from(xroce::verbs::qp::MAX_RD_ATOMIC)
            );
            // (connect asked for 16 each way.)
            assert_eq!((attr.max_rd_atomic, attr.max_dest_rd_atomic), (16, 16));
            let mut a = ibv_qp_attr {
                max_rd_atomic: da.max_qp_rd_atom as u8 + 1,
                ..Default::default()
            };
            let m = IBV_QP_MAX_QP_RD_ATOMIC as c_int;
            assert_eq!(ibv_modify_qp(q1, &mut a, m), libc::EINVAL);

            // UD with an AH, GRH back to an AH.
            let (u1, u2) = (
                qp(&d, IBV_QPT_UD, std::ptr::null_mut()),
                qp(&d, IBV_QPT_UD, std::ptr::null_mut()),
            );
            connect(&d, u1, 0);
            connect(&d, u2, 0);
            let mut aa = ibv_ah_attr {
                is_global: 1,
                port_num: 1,
                ..Default::default()
            };
            aa.grh.dgid = d.gid;
            aa.grh.sgid_index = 1;
            aa.grh.hop_limit = 64;
            let ah = ibv_create_ah(d.pd, &mut aa);
            assert!(!ah.is_null());
            recv_into(u2, &d, 4096, 40 + 64);
            assert_eq!(send(u1, b"over UD", ah, (*u2).qp_num), 0);
            let wc = poll(&d, 2);
            assert_eq!(wc.len(), 2);
            let r = wc.iter().find(|w| w.opcode == IBV_WC_RECV).unwrap();
            assert_eq!(r.src_qp, (*u1).qp_num);
            assert_ne!(r.wc_flags & IBV_WC_GRH, 0);
            assert_eq!(&d.buf[4096 + 40..4096 + 47], b"over UD");
            let mut back = ibv_ah_attr::default();
            let grh = d.buf.as_ptr().add(4096) as *mut ibv_grh;
            assert_eq!(
                ibv_init_ah_from_wc(d.ctx, 1, r as *const _ as *mut _, grh, &mut back),
                0
            );
            assert_eq!(back.grh.dgid.raw, d.gid.raw);
            assert_eq!(back.grh.sgid_index, 1);
            assert_eq!(ibv_destroy_ah(ah), 0);

            // An SRQ shared by an RC QP.
            let mut sa = ibv_srq_init_attr::default();
            sa.attr.max_wr = 4;
            sa.attr.max_sge = 1;
            let srq = ibv_create_srq(d.pd, &mut sa);
            assert!(!srq.is_null());
            let (s1, s2) = (
                qp(&d, IBV_QPT_RC, std::ptr::null_mut()),
                qp(&d, IBV_QPT_RC, srq),
            );
            connect(&d, s1, (*s2).qp_num);
            connect(&d, s2, (*s1).qp_num);
            let mut sge = ibv_sge {
                addr: d.buf.as_ptr() as u64 + 8192,
                length: 64,
                lkey: (*d.mr).lkey,
            };
            let mut rw = ibv_recv_wr {
                sg_list: &mut sge,
                num_sge: 1,
                ..Default::default()
            };
            let mut bad = std::ptr::null_mut();
            assert_eq!(post_srq_recv(srq, &mut rw, &mut bad), 0);
            assert_eq!(send(s1, b"via SRQ", std::ptr::null_mut(), 0), 0);
            assert_eq!(poll(&d, 2).len(), 2);
            assert_eq!(&d.buf[8192..8199], b"via SRQ");
            assert_eq!(ibv_destroy_srq(srq), libc::EBUSY);

            for q in [q1, q2, u1, u2, s1, s2] {
                assert_eq!(ibv_destroy_qp(q), 0);
            }
            assert_eq!(ibv_destroy_srq(srq), 0);
            assert_eq!(ibv_destroy_cq(d.cq), 0);
            assert_eq!(ibv_dereg_mr(d.mr), 0);
            assert_eq!(ibv_dealloc_pd(d.pd), 0);
            assert_eq!(ibv_close_device(d.ctx), 0);
        }
    }
}
