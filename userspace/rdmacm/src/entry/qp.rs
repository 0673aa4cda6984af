//! QPs and SRQs on an id: `rdma_create_qp` / `_ex`, `rdma_destroy_qp`,
//! `rdma_init_qp_attr`, `rdma_create_srq` / `_ex`, `rdma_destroy_srq`.
//!
//! As rdma-core: the PD is the program's or the device's default one; CQs
//! the program does not give are made here (with completion channels, in
//! `id->send_cq` / `id->recv_cq`) and destroyed with the QP; the QP leaves
//! in INIT, ready for receives (a UD QP goes on to RTS, ready to send).

use std::ffi::c_int;

use crate::{
    abi::*,
    base::{
        errno::{errno, ffi, ffi_int},
        verbs::*,
    },
    objects::{
        conn::{connected_attr, UDP_QKEY},
        devices,
        id::CmId,
    },
};

/// The attributes moving a QP of this id to `state` before a connection
/// exists: INIT (port, P_Key index, no remote access or the UD Q_Key), and
/// for UD RTR and RTS. EINVAL otherwise (a connected QP's RTR/RTS needs
/// the peer, which the connection supplies).
fn init_attr(id: *mut rdma_cm_id, state: ibv_qp_state) -> Result<(ibv_qp_attr, c_int), i32> {
    // SAFETY: the program's live id.
    let (verbs, port, qp_type) = unsafe { ((*id).verbs, (*id).port_num, (*id).qp_type) };
    if verbs.is_null() {
        return Err(libc::EINVAL);
    }
    let ud = qp_type == IBV_QPT_UD;
    let mut attr = ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    let mask = match state {
        IBV_QPS_INIT => {
            attr.pkey_index = 0;
            attr.port_num = port;
            if ud {
                attr.qkey = UDP_QKEY;
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
            } else {
                attr.qp_access_flags = 0;
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
            }
        }
        IBV_QPS_RTR if ud => IBV_QP_STATE,
        IBV_QPS_RTS if ud => {
            attr.sq_psn = 0;
            IBV_QP_STATE | IBV_QP_SQ_PSN
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((attr, mask as c_int))
}

fn modify(qp: *mut ibv_qp, id: *mut rdma_cm_id, state: ibv_qp_state) -> Result<(), i32> {
    let (mut attr, mask) = init_attr(id, state)?;
    // SAFETY: a live QP and attributes for it.
    match unsafe { ibv_modify_qp(qp, &mut attr, mask) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Makes the CQs (and completion channels) the program did not give.
fn create_cqs(id: *mut rdma_cm_id, send: u32, recv: u32) -> Result<(), i32> {
    // SAFETY: the program's live id; the fields are the id's own.
    unsafe {
        let verbs = (*id).verbs;
        for (size, channel, cq) in [
            (recv, &raw mut (*id).recv_cq_channel, &raw mut (*id).recv_cq),
            (send, &raw mut (*id).send_cq_channel, &raw mut (*id).send_cq),
        ] {
            if size == 0 || !(*cq).is_null() {
                continue;
            }
            *channel = ibv_create_comp_channel(verbs);
            if (*channel).is_null() {
                return Err(errno());
            }
            *cq = ibv_create_cq(verbs, size as c_int, id as *mut _, *channel, 0);
            if (*cq).is_null() {
                return Err(errno());
            }
        }
    }
    Ok(())
}

/// Destroys the CQs and channels create_cqs made.
fn destroy_cqs(id: *mut rdma_cm_id) {
    // SAFETY: the program's live id; these objects are the id's own.
    unsafe {
        for cq in [&raw mut (*id).recv_cq, &raw mut (*id).send_cq] {
            if !(*cq).is_null() {
                ibv_destroy_cq(*cq);
                *cq = std::ptr::null_mut();
            }
        }
        for ch in [
            &raw mut (*id).recv_cq_channel,
            &raw mut (*id).send_cq_channel,
        ] {
            if !(*ch).is_null() {
                ibv_destroy_comp_channel(*ch);
                *ch = std::ptr::null_mut();
            }
        }
    }
}

/// The PD to use: the program's (same device as the id) or the default.
fn pd_for(id: *mut rdma_cm_id, pd: *mut ibv_pd) -> Result<*mut ibv_pd, i32> {
    // SAFETY: the program's live id and PD.
    let verbs = unsafe { (*id).verbs };
    if verbs.is_null() {
        return Err(libc::EINVAL);
    }
    if !pd.is_null() {
        // SAFETY: the program's PD.
        if unsafe { (*pd).context } != verbs {
            return Err(libc::EINVAL);
        }
        return Ok(pd);
    }
    devices::of_context(verbs).ok_or(libc::ENODEV)?.default_pd()
}

/// `ibv_create_qp_ex` as `<infiniband/verbs.h>` inlines it: the
/// extended-context op of the device.
///
/// # Safety
/// `context` is an open device context; `attr` valid.
unsafe fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> Result<*mut ibv_qp, i32> {
    // SAFETY: an open context; an extended one sits at the end of its
    // verbs_context (abi_compat says so).
    unsafe {
        if (*context).abi_compat != usize::MAX as *mut _ {
            return Err(libc::EOPNOTSUPP);
        }
        let vctx = (context as *mut u8).sub(std::mem::offset_of!(verbs_context, context))
            as *mut verbs_context;
        let Some(op) = (*vctx).create_qp_ex else {
            return Err(libc::EOPNOTSUPP);
        };
        let qp = op(context, attr);
        if qp.is_null() {
            Err(errno())
        } else {
            Ok(qp)
        }
    }
}

fn create_qp(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> Result<(), i32> {
    // SAFETY: the program's live id and attributes.
    let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
    if !unsafe { (*id).qp }.is_null() {
        return Err(libc::EINVAL);
    }
    let given = if attr.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
        attr.pd
    } else {
        std::ptr::null_mut()
    };
    let pd = pd_for(id, given)?;
    attr.pd = pd;
    attr.comp_mask |= IBV_QP_INIT_ATTR_PD;
    let srq_recv = !attr.srq.is_null();
    create_cqs(
        id,
        if attr.send_cq.is_null() {
            attr.cap.max_send_wr
        } else {
            0
        },
        if attr.recv_cq.is_null() && !srq_recv {
            attr.cap.max_recv_wr
        } else {
            0
        },
    )
    .inspect_err(|_| destroy_cqs(id))?;
    // SAFETY: the id's CQs (made above or the program's).
    unsafe {
        if attr.send_cq.is_null() {
            attr.send_cq = (*id).send_cq;
        }
        if attr.recv_cq.is_null() {
            attr.recv_cq = if (*id).recv_cq.is_null() {
                attr.send_cq
            } else {
                (*id).recv_cq
            };
        }
    }
    let made = if attr.comp_mask & !IBV_QP_INIT_ATTR_PD == 0 {
        let mut basic = ibv_qp_init_attr {
            qp_context: attr.qp_context,
            send_cq: attr.send_cq,
            recv_cq: attr.recv_cq,
            srq: attr.srq,
            cap: attr.cap,
            qp_type: attr.qp_type,
            sq_sig_all: attr.sq_sig_all,
        };
        // SAFETY: a PD of the id's device and complete attributes.
        let qp = unsafe { ibv_create_qp(pd, &mut basic) };
        attr.cap = basic.cap;
        if qp.is_null() {
            Err(errno())
        } else {
            Ok(qp)
        }
    } else {
        // SAFETY: the id's open context and the program's attributes.
        unsafe { create_qp_ex((*pd).context, attr) }
    };
    let qp = made.inspect_err(|_| destroy_cqs(id))?;
    let ud = attr.qp_type == IBV_QPT_UD;
    let moved = modify(qp, id, IBV_QPS_INIT).and_then(|()| {
        if ud {
            modify(qp, id, IBV_QPS_RTR)?;
            modify(qp, id, IBV_QPS_RTS)?;
        }
        Ok(())
    });
    if let Err(e) = moved {
        // SAFETY: the QP just made.
        unsafe { ibv_destroy_qp(qp) };
        destroy_cqs(id);
        return Err(e);
    }
    // SAFETY: the program's live id.
    unsafe { (*id).qp = qp };
    Ok(())
}

// ------------------------------------------------ C entry points

/// `rdma_create_qp`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id and attributes.
        unsafe { CmId::from_c(id) }?;
        let init = unsafe { qp_init_attr.as_mut() }.ok_or(libc::EINVAL)?;
        let mut ex = ibv_qp_init_attr_ex {
            qp_context: init.qp_context,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            cap: init.cap,
            qp_type: init.qp_type,
            sq_sig_all: init.sq_sig_all,
            comp_mask: IBV_QP_INIT_ATTR_PD,
            pd,
            ..Default::default()
        };
        create_qp(id, &mut ex)?;
        // The QP's actual capabilities and CQs go back to the program.
        init.cap = ex.cap;
        init.send_cq = ex.send_cq;
        init.recv_cq = ex.recv_cq;
        Ok(())
    })
}

/// `rdma_create_qp_ex`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    qp_init_attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id.
        unsafe { CmId::from_c(id) }?;
        create_qp(id, qp_init_attr)
    })
}

/// `rdma_destroy_qp`: the QP and the CQs made for it.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    ffi((), || {
        if id.is_null() {
            return;
        }
        // SAFETY: the program's live id and its QP.
        unsafe {
            if !(*id).qp.is_null() {
                ibv_destroy_qp((*id).qp);
                (*id).qp = std::ptr::null_mut();
            }
        }
        destroy_cqs(id);
    })
}

/// `rdma_init_qp_attr`: the attributes for `qp_attr->qp_state`.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's live id and out-pointers.
        let cm_id = unsafe { CmId::from_c(id) }?;
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's attributes (checked above).
        let state = unsafe { (*qp_attr).qp_state };
        // SAFETY: the program's live id.
        let connected = unsafe { (*id).qp_type } != IBV_QPT_UD;
        // A connection under way gives its QP the peer's path, QPN and
        // PSNs (a program that made its own QP moves it with these).
        let conn = if connected {
            cm_id.lock().conn.clone()
        } else {
            None
        };
        let (attr, mask) = match conn {
            Some(c) => {
                let (a, m) = connected_attr(&c, state)?;
                (a, m as c_int)
            }
            None => init_attr(id, state)?,
        };
        unsafe {
            *qp_attr = attr;
            *qp_attr_mask = mask;
        }
        Ok(())
    })
}

fn create_srq(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> Result<(), i32> {
    // SAFETY: the program's attributes.
    let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && attr.srq_type != IBV_SRQT_BASIC {
        // XRC and tag-matching SRQs: xroce has neither.
        return Err(libc::ENOSYS);
    }
    let given = if attr.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 {
        attr.pd
    } else {
        std::ptr::null_mut()
    };
    let pd = pd_for(id, given)?;
    let mut basic = ibv_srq_init_attr {
        srq_context: attr.srq_context,
        attr: attr.attr,
    };
    // SAFETY: a PD of the id's device and complete attributes.
    let srq = unsafe { ibv_create_srq(pd, &mut basic) };
    if srq.is_null() {
        return Err(errno());
    }
    attr.attr = basic.attr;
    attr.pd = pd;
    // SAFETY: the program's live id.
    unsafe { (*id).srq = srq };
    Ok(())
}

/// `rdma_create_srq`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id and attributes.
        unsafe { CmId::from_c(id) }?;
        let init = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        let mut ex = ibv_srq_init_attr_ex {
            srq_context: init.srq_context,
            attr: init.attr,
            comp_mask: IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
            srq_type: IBV_SRQT_BASIC,
            pd,
            ..Default::default()
        };
        create_srq(id, &mut ex)?;
        init.attr = ex.attr;
        Ok(())
    })
}

/// `rdma_create_srq_ex` (basic SRQs; XRC is ENOSYS).
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id.
        unsafe { CmId::from_c(id) }?;
        create_srq(id, attr)
    })
}

/// `rdma_destroy_srq`.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    ffi((), || {
        if id.is_null() {
            return;
        }
        // SAFETY: the program's live id and its SRQ.
        unsafe {
            if !(*id).srq.is_null() {
                ibv_destroy_srq((*id).srq);
                (*id).srq = std::ptr::null_mut();
            }
        }
    })
}
