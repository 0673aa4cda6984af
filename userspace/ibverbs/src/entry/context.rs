//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`,
//! `ibv_import_device`, `ibv_close_device`, the device's names, and the
//! ops a context carries (`context->ops`, `struct verbs_context`). The
//! devices, the stack behind them and the context object are
//! [`crate::objects::device`] and [`crate::objects::context`].

use std::ffi::{c_char, c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use xroce::device;

use crate::abi::*;
use crate::base::errno::{fail, ffi, ffi_int, ffi_ptr, set_errno};
use crate::objects::context::{context, Context};
use crate::objects::device::{
    device_name, entry_for, entry_of, index_of, wanted_interfaces, DeviceEntry, OpenDevice,
};
use crate::objects::events::event_pipe;
use crate::objects::ucontext::{self, Ucontext};

fn open(dev: *mut ibv_device) -> Result<*mut ibv_context, i32> {
    let entry = entry_of(dev).ok_or(libc::ENODEV)?;
    let open = OpenDevice::get(&entry.iface).map_err(|why| {
        // Programs only print "Couldn't get context": say why once.
        eprintln!("xroce: cannot open {}: {why}", device_name(&entry.iface));
        libc::ENODEV
    })?;
    let (ucontext, cmd_fd) = Ucontext::create(open, entry)?;
    new_context(ucontext, cmd_fd)
}

/// A context of `ucontext` whose command fd is `cmd_fd`.
fn new_context(ucontext: Arc<Ucontext>, cmd_fd: OwnedFd) -> Result<*mut ibv_context, i32> {
    let (async_read, async_write) = event_pipe()?;
    let entry = ucontext.entry;
    let mut vctx = verbs_context {
        sz: std::mem::size_of::<verbs_context>(),
        ..Default::default()
    };
    vctx.query_port = Some(crate::entry::query::port::query_port_ex);
    vctx.query_device_ex = Some(crate::entry::query::device::query_device_ex);
    vctx.create_cq_ex = Some(crate::entry::cq::create_cq_ex);
    vctx.create_qp_ex = Some(crate::entry::qp::create_qp_ex);
    let c = &mut vctx.context;
    c.device = &entry.dev as *const ibv_device as *mut ibv_device;
    c.cmd_fd = cmd_fd.as_raw_fd();
    c.async_fd = async_read.as_raw_fd();
    c.num_comp_vectors = 1;
    c.abi_compat = usize::MAX as *mut c_void;
    c.ops.poll_cq = Some(crate::entry::cq::poll_cq);
    c.ops.req_notify_cq = Some(crate::entry::cq::req_notify_cq);
    c.ops.post_send = Some(crate::entry::post::post_send);
    c.ops.post_recv = Some(crate::entry::post::post_recv);
    c.ops.post_srq_recv = Some(crate::entry::srq::post_srq_recv);
    c.ops.alloc_mw = Some(crate::entry::unsupported::alloc_mw_op);
    c.ops.bind_mw = Some(crate::entry::unsupported::bind_mw_op);
    c.ops.dealloc_mw = Some(crate::entry::unsupported::dealloc_mw_op);
    let ctx = Box::leak(Box::new(Context {
        vctx,
        dev: ucontext.dev.clone(),
        entry,
        async_read,
        async_write,
        cmd_fd,
        ucontext,
    }));
    crate::base::handles::born(&*ctx as *const Context);
    // SAFETY: initialising the mutex in place before anyone can see it.
    unsafe {
        libc::pthread_mutex_init(
            &mut ctx.vctx.context.mutex as *mut _ as *mut _,
            std::ptr::null(),
        )
    };
    Ok(ctx.ibv())
}

/// What `ibv_import_device` does with `cmd_fd`: a new context on the
/// ucontext the fd belongs to (taking the fd over: closing the context
/// closes it), or rdma-core's errno for a foreign fd: EINVAL when it is
/// not open or not a character device, ENODEV for a character device no
/// device of ours has.
fn import(cmd_fd: c_int) -> Result<*mut ibv_context, i32> {
    let Some(ucontext) = Ucontext::of_fd(cmd_fd) else {
        let errno = match ucontext::fd_identity(cmd_fd) {
            Ok((_, true)) => libc::ENODEV,
            _ => libc::EINVAL,
        };
        return Err(fail(
            errno,
            format_args!("ibv_import_device: fd {cmd_fd} is not the cmd_fd of an xroce context"),
        ));
    };
    // SAFETY: the program hands the descriptor over, as to rdma-core.
    let fd = unsafe { OwnedFd::from_raw_fd(cmd_fd) };
    new_context(ucontext, fd)
}

/// `ibv_import_device`: a context sharing the PDs and MRs (by handle) of
/// the context whose `cmd_fd` this is a copy of.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    ffi_ptr(|| import(cmd_fd))
}

/// `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    ffi_ptr(|| {
        let names = wanted_interfaces();
        let entries: Vec<&'static DeviceEntry> = names.iter().map(|n| entry_for(n)).collect();
        // SAFETY: calloc'd so that ibv_free_device_list can free() it.
        let list = unsafe {
            libc::calloc(entries.len() + 1, std::mem::size_of::<*mut ibv_device>())
                as *mut *mut ibv_device
        };
        if list.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, e) in entries.iter().enumerate() {
            // SAFETY: i < entries.len() < the allocated length.
            unsafe { *list.add(i) = &e.dev as *const ibv_device as *mut ibv_device };
        }
        if !num_devices.is_null() {
            // SAFETY: the program passed a valid int pointer.
            unsafe { *num_devices = entries.len() as c_int };
        }
        Ok(list)
    })
}

/// `ibv_free_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the list came from ibv_get_device_list's calloc.
    ffi((), || unsafe { libc::free(list as *mut c_void) })
}

/// `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    ffi_ptr(|| open(dev))
}

/// `ibv_close_device`: frees the context; the interface's stack stops
/// with its last context.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    ffi_int(|| {
        if ctx.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a context we leaked in ibv_open_device, closed once.
        let c = unsafe { Box::from_raw(context(ctx).ok_or(libc::EINVAL)? as *mut Context) };
        crate::base::handles::free(c);
        Ok(())
    })
}

/// `ibv_get_device_name`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    ffi(std::ptr::null(), || match entry_of(dev) {
        Some(e) => e.dev.name.as_ptr(),
        None => {
            set_errno(libc::ENODEV);
            std::ptr::null()
        }
    })
}

/// `ibv_get_device_guid`: the node GUID (network byte order).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> __be64 {
    ffi(0, || {
        entry_of(dev)
            .and_then(|e| device::interface_mac(&e.iface).ok())
            .map(|mac| xroce::device::guid_from_mac(mac).to_be())
            .unwrap_or(0)
    })
}

/// `ibv_get_device_index`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    ffi(-1, || index_of(dev).map(|i| i as c_int).unwrap_or(-1))
}
