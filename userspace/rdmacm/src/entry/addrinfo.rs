//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`: getaddrinfo(3) for RDMA, as
//! rdma-core does it: the node and service (a port) resolved by the
//! system resolver, the first answer kept; with RAI_PASSIVE it is the
//! source (listening) address, else the destination; QP type and port
//! space default to RC over RDMA_PS_TCP. Resolver failures return the
//! EAI_* code itself, as the man page says.

use std::{
    ffi::{c_char, c_int, CStr, CString},
    ptr::null_mut,
};

use crate::{abi::*, base::errno::ffi};

/// A sockaddr copied into a box of its own (freed by rdma_freeaddrinfo).
fn boxed_sockaddr(sa: *const libc::sockaddr, len: libc::socklen_t) -> *mut sockaddr {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: Box<libc::sockaddr_storage> = Box::new(unsafe { std::mem::zeroed() });
    let len = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: `sa` holds `len` bytes (its length from the resolver or the
    // program), copied into a storage at least as large.
    unsafe { std::ptr::copy_nonoverlapping(sa as *const u8, &mut *ss as *mut _ as *mut u8, len) };
    Box::into_raw(ss) as *mut sockaddr
}

fn free_sockaddr(sa: *mut sockaddr) {
    if !sa.is_null() {
        // SAFETY: made by boxed_sockaddr.
        drop(unsafe { Box::from_raw(sa as *mut libc::sockaddr_storage) });
    }
}

fn free_string(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: made by CString::into_raw here.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// The QP type and port space of the hints (RC over RDMA_PS_TCP by
/// default; either one given implies the other).
fn transport(hints: Option<&rdma_addrinfo>) -> (c_int, c_int) {
    let (mut qp_type, mut ps) = hints.map_or((0, 0), |h| (h.ai_qp_type, h.ai_port_space));
    if ps == 0 {
        ps = if qp_type == IBV_QPT_UD as c_int {
            RDMA_PS_UDP as c_int
        } else {
            RDMA_PS_TCP as c_int
        };
    }
    if qp_type == 0 {
        qp_type = if ps == RDMA_PS_UDP as c_int || ps == RDMA_PS_IPOIB as c_int {
            IBV_QPT_UD as c_int
        } else {
            IBV_QPT_RC as c_int
        };
    }
    (qp_type, ps)
}

/// # Safety
/// C strings and hints from the program; `res` an out-pointer.
unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    // SAFETY: the program's hints, if any.
    let hints = unsafe { hints.as_ref() };
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_none()) {
        crate::base::errno::set_errno(libc::EINVAL);
        return -1;
    }
    let flags = hints.map_or(0, |h| h.ai_flags);
    let passive = flags & RAI_PASSIVE as c_int != 0;
    let (qp_type, ps) = transport(hints);
    let mut rai = Box::new(rdma_addrinfo {
        ai_flags: flags,
        ai_qp_type: qp_type,
        ai_port_space: ps,
        ..Default::default()
    });
    if !node.is_null() || !service.is_null() {
        // SAFETY: all-zero is a valid addrinfo.
        let mut ai_hints: libc::addrinfo = unsafe { std::mem::zeroed() };
        if passive {
            ai_hints.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST as c_int != 0 {
            ai_hints.ai_flags |= libc::AI_NUMERICHOST;
        }
        if flags & RAI_FAMILY as c_int != 0 {
            ai_hints.ai_family = hints.map_or(0, |h| h.ai_family);
        }
        ai_hints.ai_socktype = if qp_type == IBV_QPT_UD as c_int {
            libc::SOCK_DGRAM
        } else {
            libc::SOCK_STREAM
        };
        let mut ai: *mut libc::addrinfo = null_mut();
        // SAFETY: C strings from the program (or NULL), valid hints.
        let rc = unsafe { libc::getaddrinfo(node, service, &ai_hints, &mut ai) };
        if rc != 0 {
            return rc;
        }
        // SAFETY: getaddrinfo succeeded, so `ai` is a non-empty list.
        let first = unsafe { &*ai };
        rai.ai_family = first.ai_family;
        let addr = boxed_sockaddr(first.ai_addr, first.ai_addrlen);
        let canon = (!first.ai_canonname.is_null()).then(|| {
            // SAFETY: a NUL-terminated name from the resolver.
            CString::from(unsafe { CStr::from_ptr(first.ai_canonname) }).into_raw()
        });
        if passive {
            rai.ai_src_addr = addr;
            rai.ai_src_len = first.ai_addrlen;
            rai.ai_src_canonname = canon.unwrap_or(null_mut());
        } else {
            rai.ai_dst_addr = addr;
            rai.ai_dst_len = first.ai_addrlen;
            rai.ai_dst_canonname = canon.unwrap_or(null_mut());
        }
        // SAFETY: the list from getaddrinfo, freed once.
        unsafe { libc::freeaddrinfo(ai) };
    }
    // Addresses the hints carry fill what the node did not.
    if let Some(h) = hints {
        if rai.ai_src_addr.is_null() && !h.ai_src_addr.is_null() {
            rai.ai_src_addr = boxed_sockaddr(h.ai_src_addr as *const _, h.ai_src_len);
            rai.ai_src_len = h.ai_src_len;
        }
        if rai.ai_dst_addr.is_null() && !h.ai_dst_addr.is_null() {
            rai.ai_dst_addr = boxed_sockaddr(h.ai_dst_addr as *const _, h.ai_dst_len);
            rai.ai_dst_len = h.ai_dst_len;
        }
        if rai.ai_family == 0 {
            let sa = if rai.ai_src_addr.is_null() {
                rai.ai_dst_addr
            } else {
                rai.ai_src_addr
            };
            // SAFETY: a sockaddr boxed above, or none.
            rai.ai_family =
                unsafe { sa.as_ref() }.map_or(h.ai_family, |s| c_int::from(s.sa_family));
        }
    }
    // SAFETY: the program's out-pointer.
    unsafe { *res = Box::into_raw(rai) };
    0
}

/// `rdma_getaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    // SAFETY: forwarded from the program.
    ffi(-1, || unsafe { getaddrinfo(node, service, hints, res) })
}

/// `rdma_freeaddrinfo`: the whole list.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    ffi((), || {
        let mut cur = res;
        while !cur.is_null() {
            // SAFETY: an entry made by rdma_getaddrinfo, freed once.
            let rai = unsafe { Box::from_raw(cur) };
            free_sockaddr(rai.ai_src_addr);
            free_sockaddr(rai.ai_dst_addr);
            free_string(rai.ai_src_canonname);
            free_string(rai.ai_dst_canonname);
            cur = rai.ai_next;
        }
    })
}
