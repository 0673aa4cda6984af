//! Protection domains and memory regions: `ibv_alloc_pd`,
//! `ibv_dealloc_pd`, `ibv_reg_mr`, `ibv_reg_mr_iova(2)`, `ibv_rereg_mr`,
//! `ibv_dereg_mr`, and sharing them between contexts of one ucontext
//! (`ibv_import_pd`, `ibv_import_mr`, `ibv_unimport_*`). Registered memory
//! is the program's own, used in place.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use xroce::verbs::{AccessFlags, MemoryRegion};

use crate::abi::*;
use crate::base::errno::{fail, ffi, ffi_int, ffi_ptr, set_errno, verbs_fail};
use crate::objects::context::context;
use crate::objects::ucontext::Shared;
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

fn is_pd(s: &Shared) -> bool {
    matches!(s, Shared::Pd(_))
}

fn is_mr(s: &Shared) -> bool {
    matches!(s, Shared::Mr(_))
}

/// `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    ffi_ptr(|| {
        // SAFETY: the program passes an open context.
        let c = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
        let inner = c.dev.device.alloc_pd();
        let handle = c.ucontext.insert(Shared::Pd(inner.clone()));
        let pd = Box::leak(Box::new(Pd {
            pd: ibv_pd {
                context: ctx,
                handle,
            },
            inner,
            ucontext: c.ucontext.clone(),
        }));
        crate::base::handles::born(&*pd as *const crate::objects::Pd);
        Ok(&mut pd.pd as *mut ibv_pd)
    })
}

/// `ibv_dealloc_pd`: the PD dies for every context sharing it (copies
/// made by ibv_import_pd are then stale, as with rdma-core).
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi_int(|| {
        // SAFETY: a PD this library allocated, freed once.
        let p = unsafe { outer::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
        p.ucontext.remove(p.pd.handle, is_pd)?;
        // SAFETY: as above; the Box was leaked by ibv_alloc_pd or
        // ibv_import_pd.
        crate::base::handles::free(unsafe { Box::from_raw(p as *mut Pd) });
        Ok(())
    })
}

/// `ibv_import_pd`: the PD `pd_handle` names in `ctx`'s ucontext (ENOENT
/// if none, EINVAL if the handle names another type of object).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(ctx: *mut ibv_context, pd_handle: u32) -> *mut ibv_pd {
    ffi_ptr(|| {
        // SAFETY: the program passes an open context.
        let c = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
        let inner = c
            .ucontext
            .with(pd_handle, |s| match s {
                Shared::Pd(p) => Ok(p.clone()),
                Shared::Mr(_) => Err(libc::EINVAL),
            })
            .and_then(|r| r)
            .map_err(|e| {
                fail(
                    e,
                    format_args!("ibv_import_pd: no PD has handle {pd_handle}"),
                )
            })?;
        let pd = Box::leak(Box::new(Pd {
            pd: ibv_pd {
                context: ctx,
                handle: pd_handle,
            },
            inner,
            ucontext: c.ucontext.clone(),
        }));
        crate::base::handles::born(&*pd as *const crate::objects::Pd);
        Ok(&mut pd.pd as *mut ibv_pd)
    })
}

/// `ibv_unimport_pd`: frees this copy only; the PD lives on.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    ffi((), || {
        // SAFETY: a PD this library made, not used after this call.
        if let Some(p) = unsafe { outer::<_, Pd>(pd) } {
            // SAFETY: as above.
            crate::base::handles::free(unsafe { Box::from_raw(p as *mut Pd) });
        }
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

/// Access bits with which the MR may be written (the kernel pins its
/// pages for writing then).
const WRITABLE_ACCESS: u32 =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

/// EFAULT, as the kernel's registration, unless `addr..addr+len` is mapped
/// readable (and writable for a writable MR).
fn check_mapped(what: &str, addr: *mut c_void, len: usize, access_bits: u32) -> Result<(), i32> {
    let writable = access_bits & WRITABLE_ACCESS != 0;
    crate::base::mapping::check_user_range(addr as usize, len, writable).map_err(|e| {
        fail(
            e,
            format_args!(
                "{what}: {addr:p}+{len} is not mapped {} in this process",
                if writable { "writable" } else { "readable" }
            ),
        )
    })
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
    check_mapped("ibv_reg_mr", addr, len, flags.bits())?;
    // SAFETY: rdma-core's contract: the program keeps addr..addr+len
    // mapped until ibv_dereg_mr and does not touch bytes a posted work
    // request uses.
    let inner =
        unsafe { p.inner.reg_user_mr(addr as *mut u8, len, iova, flags) }.map_err(verbs_fail)?;
    let (lkey, rkey) = (inner.lkey(), inner.rkey());
    let handle = p.ucontext.insert(Shared::Mr(inner));
    let mr = Box::leak(Box::new(Mr {
        mr: ibv_mr {
            context: p.pd.context,
            pd,
            addr,
            length: len,
            handle,
            lkey,
            rkey,
        },
        ucontext: p.ucontext.clone(),
        imported: false,
    }));
    crate::base::handles::born(&*mr as *const crate::objects::Mr);
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

/// `ibv_dereg_mr`: the keys die at once (for every copy of the MR);
/// work requests still using the region fail their access checks.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi_int(|| {
        // SAFETY: an MR this library registered, deregistered once.
        let m = unsafe { outer::<_, Mr>(mr) }.ok_or(libc::EINVAL)?;
        let region = m.ucontext.remove(m.mr.handle, is_mr)?;
        drop(region);
        // SAFETY: as above; the Box was leaked by reg or ibv_import_mr.
        crate::base::handles::free(unsafe { Box::from_raw(m as *mut Mr) });
        Ok(())
    })
}

/// `ibv_import_mr`: the MR `mr_handle` names in `pd`'s ucontext, as
/// rdma-core's query gives it: keys, length and handle, `addr` NULL.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    ffi_ptr(|| {
        // SAFETY: the program passes a live PD.
        let p = unsafe { outer::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
        let (lkey, rkey, length) = p
            .ucontext
            .with(mr_handle, |s| match s {
                Shared::Mr(m) => Ok((m.lkey(), m.rkey(), m.len())),
                Shared::Pd(_) => Err(libc::EINVAL),
            })
            .and_then(|r| r)
            .map_err(|e| {
                fail(
                    e,
                    format_args!("ibv_import_mr: no MR has handle {mr_handle}"),
                )
            })?;
        let mr = Box::leak(Box::new(Mr {
            mr: ibv_mr {
                context: p.pd.context,
                pd,
                addr: std::ptr::null_mut(),
                length,
                handle: mr_handle,
                lkey,
                rkey,
            },
            ucontext: p.ucontext.clone(),
            imported: true,
        }));
        crate::base::handles::born(&*mr as *const crate::objects::Mr);
        Ok(&mut mr.mr as *mut ibv_mr)
    })
}

/// `ibv_unimport_mr`: frees this copy only; the registration lives on.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    ffi((), || {
        // SAFETY: an MR this library made, not used after this call.
        if let Some(m) = unsafe { outer::<_, Mr>(mr) } {
            // SAFETY: as above.
            crate::base::handles::free(unsafe { Box::from_raw(m as *mut Mr) });
        }
    })
}

/// rdma-core's own checks in `ibv_rereg_mr`, before the provider is
/// asked: a failure is IBV_REREG_MR_ERR_INPUT with errno EINVAL and
/// leaves the MR as it was.
fn rereg_input_ok(m: &Mr, flags: u32, addr: *mut c_void, length: usize, access: c_int) -> bool {
    !m.imported
        && flags & !IBV_REREG_MR_FLAGS_SUPPORTED == 0
        && (flags & IBV_REREG_MR_CHANGE_TRANSLATION == 0 || (length != 0 && !addr.is_null()))
        && (access == 0 || flags & IBV_REREG_MR_CHANGE_ACCESS != 0)
}

/// The provider's (kernel command's) part of `ibv_rereg_mr`: the errno
/// of a failure, which leaves the MR as it was.
fn rereg_command(
    m: &mut Mr,
    flags: u32,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Result<(), i32> {
    if flags == 0 {
        return Err(fail(libc::EINVAL, "ibv_rereg_mr: no change asked for"));
    }
    let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        // SAFETY: the program passes a live PD (or NULL).
        let p = unsafe { outer::<_, Pd>(pd) }.ok_or(libc::EINVAL)?;
        if !Arc::ptr_eq(&p.ucontext, &m.ucontext) {
            return Err(fail(
                libc::EINVAL,
                "ibv_rereg_mr: the PD is of another device context",
            ));
        }
        Some(p.inner.id())
    } else {
        None
    };
    let new_access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        Some(access_flags(access)?)
    } else {
        None
    };
    let (lkey, rkey) = m
        .ucontext
        .with(m.mr.handle, |s| {
            let Shared::Mr(region) = s else {
                return Err(libc::EINVAL);
            };
            rereg_region(region, flags, new_pd, addr, length, new_access)
        })
        .and_then(|r| r)?;
    m.mr.lkey = lkey;
    m.mr.rkey = rkey;
    if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        m.mr.pd = pd;
    }
    if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
        m.mr.addr = addr;
        m.mr.length = length;
    }
    Ok(())
}

/// Re-registers `region` in the engine; its keys afterwards.
fn rereg_region(
    region: &mut MemoryRegion,
    flags: u32,
    pd: Option<u32>,
    addr: *mut c_void,
    length: usize,
    access: Option<AccessFlags>,
) -> Result<(u32, u32), i32> {
    let mut next = region.current();
    if let Some(pd) = pd {
        next.pd = pd;
    }
    if let Some(access) = access {
        next.access = access;
    }
    if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
        next.ptr = addr as *mut u8;
        next.len = length;
        next.iova = addr as u64;
    }
    check_mapped(
        "ibv_rereg_mr",
        next.ptr as *mut c_void,
        next.len,
        next.access.bits(),
    )?;
    // SAFETY: rdma-core's contract, as for ibv_reg_mr: the new range stays
    // mapped until the MR is deregistered or re-registered again.
    unsafe { region.rereg(next) }.map_err(verbs_fail)?;
    Ok((region.lkey(), region.rkey()))
}

/// `ibv_rereg_mr`: a new translation (address and length), PD or access
/// for a registered MR, taking effect at once for the engine. New PD or
/// access keep the keys (as rxe); a new translation gets new keys, which
/// the MR then holds (the old keys are refused from then on). Returns 0
/// or rdma-core's `enum ibv_rereg_mr_err_code` with errno set: ERR_INPUT
/// (EINVAL) for what rdma-core itself refuses, ERR_CMD for what the
/// provider refuses (EINVAL, or EOPNOTSUPP for ODP / zero-based / MW
/// access). On failure the MR is unchanged.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    ffi(IBV_REREG_MR_ERR_CMD, || {
        // SAFETY: the program passes a live MR (or NULL).
        let Some(m) = (unsafe { outer::<_, Mr>(mr) }) else {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        };
        let flags = flags as u32;
        if !rereg_input_ok(m, flags, addr, length, access) {
            set_errno(fail(libc::EINVAL, "ibv_rereg_mr: invalid input"));
            return IBV_REREG_MR_ERR_INPUT;
        }
        match rereg_command(m, flags, pd, addr, length, access) {
            Ok(()) => 0,
            Err(errno) => {
                set_errno(errno);
                IBV_REREG_MR_ERR_CMD
            }
        }
    })
}
