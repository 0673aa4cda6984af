//! `rdma_create_ep` / `rdma_destroy_ep`: a synchronous id from an
//! rdma_getaddrinfo answer, as rdma-core makes it. Passive: bound to the
//! source address, ready for rdma_listen. Active: address and route
//! resolved (with rdma-core's 2 s timeouts), and the QP made when the
//! program gives its attributes.

use std::ffi::c_int;

use crate::{
    abi::*,
    base::errno::{errno, ffi, ffi_int},
    entry::{
        address::{rdma_bind_addr, rdma_resolve_addr, rdma_resolve_route},
        id::rdma_destroy_id,
        qp::{rdma_create_qp, rdma_destroy_qp, rdma_destroy_srq},
    },
    objects::id,
};

/// rdma-core's resolution timeout for endpoints.
const RESOLVE_TIMEOUT_MS: c_int = 2000;

/// A -1/errno return as a Result.
fn check(rc: c_int) -> Result<(), i32> {
    if rc == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// # Safety
/// The program's id (made here) and its rdma_getaddrinfo answer.
unsafe fn setup(
    id: *mut rdma_cm_id,
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> Result<(), i32> {
    // SAFETY (all calls): a live synchronous id and the answer's addresses.
    unsafe {
        // The QP type is the answer's, whatever the program left there.
        if let Some(attr) = qp_init_attr.as_mut() {
            attr.qp_type = res.ai_qp_type as ibv_qp_type;
        }
        if res.ai_flags & RAI_PASSIVE as c_int != 0 {
            check(rdma_bind_addr(id, res.ai_src_addr))?;
            if !pd.is_null() {
                (*id).pd = pd;
            }
            // rdma_get_request makes each request's QP with these.
            if let Some(attr) = qp_init_attr.as_ref() {
                id::CmId::from_c(id)?.lock().qp_init_attr = Some(*attr);
            }
            return Ok(());
        }
        check(rdma_resolve_addr(
            id,
            res.ai_src_addr,
            res.ai_dst_addr,
            RESOLVE_TIMEOUT_MS,
        ))?;
        check(rdma_resolve_route(id, RESOLVE_TIMEOUT_MS))?;
        if !pd.is_null() {
            (*id).pd = pd;
        }
        if !qp_init_attr.is_null() {
            check(rdma_create_qp(id, pd, qp_init_attr))?;
        }
    }
    Ok(())
}

/// `rdma_create_ep`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's answer from rdma_getaddrinfo.
        let res = unsafe { res.as_ref() }.ok_or(libc::EINVAL)?;
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let made = id::create(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            res.ai_port_space as _,
        )?;
        // SAFETY: the id just made and the program's arguments.
        if let Err(e) = unsafe { setup(made, res, pd, qp_init_attr) } {
            // SAFETY: the id just made, not handed out.
            unsafe { rdma_destroy_id(made) };
            return Err(e);
        }
        // SAFETY: the program's out-pointer.
        unsafe { *id = made };
        Ok(())
    })
}

/// `rdma_destroy_ep`: its QP, SRQ and the id.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    ffi((), || {
        if id.is_null() {
            return;
        }
        // SAFETY: the program's endpoint, destroyed once.
        unsafe {
            if !(*id).qp.is_null() {
                rdma_destroy_qp(id);
            }
            if !(*id).srq.is_null() {
                rdma_destroy_srq(id);
            }
            rdma_destroy_id(id);
        }
    })
}
