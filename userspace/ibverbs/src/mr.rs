//! Protection domains and memory regions: `ibv_alloc_pd`,
//! `ibv_dealloc_pd`, `ibv_reg_mr`, `ibv_reg_mr_iova(2)`, `ibv_dereg_mr`.
//! Registered memory is the program's own, used in place.

use std::ffi::{c_int, c_void};

use xroce::verbs::AccessFlags;

use crate::abi::*;
use crate::context::context;
use crate::errno::{ffi_int, ffi_ptr, verbs_fail};
use crate::objects::{outer, Mr, Pd};

/// `IBV_ACCESS_OPTIONAL_RANGE` of verbs_api.h (a macro bindgen skips):
/// bits 20..29, optional bits a provider may ignore.
const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// Access bits rdma-core defines; the optional ones (IBV_ACCESS_OPTIONAL_RANGE:
/// relaxed ordering and later) may be ignored by a provider, as here.
const KNOWN_ACCESS: u32 = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
    | IBV_ACCESS_MW_BIND
    | IBV_ACCESS_ZERO_BASED
    | IBV_ACCESS_ON_DEMAND
    | IBV_ACCESS_HUGETLB
    | IBV_ACCESS_OPTIONAL_RANGE;

/// `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    ffi_ptr(|| {
        // SAFETY: the program passes an open context.
        let c = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
        let inner = c.dev.device.alloc_pd();
        let pd = Box::leak(Box::new(Pd {
            pd: ibv_pd {
                context: ctx,
                handle: inner.id(),
            },
            inner,
        }));
        Ok(&mut pd.pd as *mut ibv_pd)
    })
}

/// `ibv_dealloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi_int(|| {
        // SAFETY: a PD this library allocated, freed once.
        let p = unsafe { outer::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
        // SAFETY: as above; the Box was leaked by ibv_alloc_pd.
        drop(unsafe { Box::from_raw(p as *mut Pd) });
        Ok(())
    })
}

fn access_flags(access: c_int) -> Result<AccessFlags, i32> {
    let a = access as u32;
    if a & !KNOWN_ACCESS != 0 {
        return Err(libc::EINVAL);
    }
    if a & (IBV_ACCESS_ON_DEMAND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_MW_BIND) != 0 {
        // No ODP, zero-based MRs or memory windows here.
        return Err(libc::EOPNOTSUPP);
    }
    Ok(AccessFlags::from_bits_truncate(a & 0xf))
}

fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> Result<*mut ibv_mr, i32> {
    // SAFETY: the program passes a live PD.
    let p = unsafe { outer::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
    let flags = access_flags(access)?;
    if addr.is_null() && len > 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: rdma-core's contract: the program keeps addr..addr+len
    // mapped until ibv_dereg_mr and does not touch bytes a posted work
    // request uses.
    let inner =
        unsafe { p.inner.reg_user_mr(addr as *mut u8, len, iova, flags) }.map_err(verbs_fail)?;
    let mr = Box::leak(Box::new(Mr {
        mr: ibv_mr {
            context: p.pd.context,
            pd,
            addr,
            length: len,
            handle: inner.lkey(),
            lkey: inner.lkey(),
            rkey: inner.rkey(),
        },
        inner,
    }));
    Ok(&mut mr.mr as *mut ibv_mr)
}

/// `ibv_reg_mr` (the exported function; the header's macro calls
/// `ibv_reg_mr_iova2` when optional access bits are set).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    ffi_ptr(|| reg(pd, addr, length, addr as u64, access))
}

/// `ibv_reg_mr_iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ffi_ptr(|| reg(pd, addr, length, iova, access))
}

/// `ibv_reg_mr_iova2`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    ffi_ptr(|| reg(pd, addr, length, iova, access as c_int))
}

/// `ibv_dereg_mr`: the keys die at once; work requests still using the
/// region fail their access checks.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi_int(|| {
        // SAFETY: an MR this library registered, deregistered once.
        let m = unsafe { outer::<_, Mr>(mr) }.ok_or(libc::EINVAL)?;
        // SAFETY: as above; the Box was leaked by reg.
        drop(unsafe { Box::from_raw(m as *mut Mr) });
        Ok(())
    })
}
