//! What xroce does not offer, answered as rdma-core answers for a provider
//! without it: multicast, memory windows, dma-buf MRs, device memory
//! import, and the whole private `IBVERBS_PRIVATE_34` node.
//!
//! The private node is the interface between rdma-core's core library and
//! its kernel-backed providers (libmlx5, libefa, ...). Debian's perftest
//! links libmlx5 and libefa, so their imports must resolve, and their
//! constructors call `verbs_register_driver_34` at load time; nothing else
//! of it is ever reached here, because providers only act on devices the
//! core library found in the kernel and handed to them, and xroce hands
//! them none. So registration is a no-op and every kernel command
//! (`ibv_cmd_*`) fails with EOPNOTSUPP. Driver-private C structs of those
//! signatures (`struct verbs_mr`, `struct ibv_command_buffer`, the
//! kern-abi command structs, ...) are not in the installed headers: they
//! appear as `*mut c_void`, each named in a comment.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::AtomicBool;

use crate::abi::*;
use crate::base::errno::{ffi, set_errno};

const EOPNOTSUPP: c_int = libc::EOPNOTSUPP;

/// A failing verb that returns an errno-style int (and sets errno too, as
/// a failed kernel command does).
fn unsupported() -> c_int {
    ffi(EOPNOTSUPP, || {
        set_errno(EOPNOTSUPP);
        EOPNOTSUPP
    })
}

/// A failing verb that returns a pointer: NULL with errno EOPNOTSUPP.
fn unsupported_ptr<T>() -> *mut T {
    ffi(std::ptr::null_mut(), || {
        set_errno(EOPNOTSUPP);
        std::ptr::null_mut()
    })
}

// ------------------------------------------------ context ops (context.rs)

/// `ibv_context_ops.alloc_mw`: no memory windows.
pub(crate) unsafe extern "C" fn alloc_mw_op(_pd: *mut ibv_pd, _type: ibv_mw_type) -> *mut ibv_mw {
    unsupported_ptr()
}

/// `ibv_context_ops.bind_mw`.
pub(crate) unsafe extern "C" fn bind_mw_op(
    _qp: *mut ibv_qp,
    _mw: *mut ibv_mw,
    _mw_bind: *mut ibv_mw_bind,
) -> c_int {
    EOPNOTSUPP
}

/// `ibv_context_ops.dealloc_mw`.
pub(crate) unsafe extern "C" fn dealloc_mw_op(_mw: *mut ibv_mw) -> c_int {
    EOPNOTSUPP
}

// ------------------------------------------------ public verbs

/// `ibv_attach_mcast`: no multicast (rxe has it; xroce does not).
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    unsupported()
}

/// `ibv_detach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    unsupported()
}

/// `ibv_reg_dmabuf_mr`: no dma-buf registration.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    unsupported_ptr()
}

/// `ibv_import_dm`: no device memory.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(_ctx: *mut ibv_context, _dm_handle: u32) -> *mut ibv_dm {
    unsupported_ptr()
}

/// `ibv_unimport_dm`: a no-op.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut ibv_dm) {}

// ------------------------------------------------ IBVERBS_PRIVATE_34

/// `verbs_allow_disassociate_destroy` (a `bool` providers read): false, as
/// rdma-core's default. An atomic so that the symbol lives in writable
/// data like C's global (same size and layout as `bool`).
#[no_mangle]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);

/// `verbs_register_driver_34(const struct verbs_device_ops *)`: called by
/// every provider's constructor when it is loaded; xroce uses no provider,
/// so it is a no-op.
#[no_mangle]
pub unsafe extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// `verbs_open_device`: the core's open, which providers reach through;
/// the device is one of ours, so it is ours to open (the provider's
/// private data has no meaning here).
#[no_mangle]
pub unsafe extern "C" fn verbs_open_device(
    device: *mut ibv_device,
    _private_data: *mut c_void,
) -> *mut ibv_context {
    // SAFETY: forwarding the caller's device pointer to our own open.
    unsafe { crate::entry::context::ibv_open_device(device) }
}

/// `_verbs_init_and_alloc_context`: a provider context for a kernel
/// device; there is none.
#[no_mangle]
pub unsafe extern "C" fn _verbs_init_and_alloc_context(
    _device: *mut ibv_device,
    _cmd_fd: c_int,
    _alloc_size: usize,
    _context_offset: *mut verbs_context,
    _driver_id: u32,
) -> *mut c_void {
    unsupported_ptr()
}

/// `verbs_uninit_context`: nothing was initialised.
#[no_mangle]
pub unsafe extern "C" fn verbs_uninit_context(_context: *mut verbs_context) {}

/// `verbs_set_ops(struct verbs_context *, const struct verbs_context_ops *)`:
/// provider ops have nowhere to go; a no-op.
#[no_mangle]
pub unsafe extern "C" fn verbs_set_ops(_vctx: *mut verbs_context, _ops: *const c_void) {}

/// `verbs_init_cq`: the core's initialisation of a provider's CQ, done as
/// rdma-core does it, except that the channel's use count (which xroce's
/// own channels keep elsewhere) is left alone. Only provider code calls it.
#[no_mangle]
pub unsafe extern "C" fn verbs_init_cq(
    cq: *mut ibv_cq,
    context: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
) {
    ffi((), || {
        // SAFETY: NULL or the provider's CQ, not yet shared.
        let Some(c) = (unsafe { cq.as_mut() }) else {
            return;
        };
        c.context = context;
        c.channel = channel;
        c.cq_context = cq_context;
        c.comp_events_completed = 0;
        c.async_events_completed = 0;
        // SAFETY: initialising the CQ's own mutex and condition variable in
        // place, before anyone else can use them.
        unsafe {
            libc::pthread_mutex_init(
                (&mut c.mutex as *mut pthread_mutex_t).cast(),
                std::ptr::null(),
            );
            libc::pthread_cond_init(
                (&mut c.cond as *mut pthread_cond_t).cast(),
                std::ptr::null(),
            );
        }
    })
}

/// `execute_ioctl(struct ibv_context *, struct ibv_command_buffer *)`:
/// there is no uverbs device to send a command to.
#[no_mangle]
pub unsafe extern "C" fn execute_ioctl(_context: *mut ibv_context, _cmd: *mut c_void) -> c_int {
    unsupported()
}

/// `__ioctl_final_num_attrs(unsigned, struct ibv_command_buffer *link)`:
/// sizes a provider's on-stack command buffer. rdma-core adds the
/// attributes of linked buffers, which only `execute_ioctl` would copy
/// in; since that never runs here, the provider's own count suffices.
#[no_mangle]
pub unsafe extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    num_attrs
}

/// `__verbs_log(struct verbs_context *, uint32_t level, const char *fmt,
/// ...)`: variadic in C. This non-variadic definition reads only the fixed
/// arguments, which the x86-64 SysV calling convention makes sound: the
/// caller passes the variadic ones in the following registers / stack
/// slots (and %al) and the callee may ignore them. With XROCE_VERBS_DEBUG
/// the unformatted format string is printed.
#[no_mangle]
pub unsafe extern "C" fn __verbs_log(_ctx: *mut verbs_context, level: u32, fmt: *const c_char) {
    ffi((), || {
        if crate::base::config::debug() && !fmt.is_null() {
            // SAFETY: the format string is NUL-terminated.
            let f = unsafe { CStr::from_ptr(fmt) };
            eprintln!(
                "xroce libibverbs: provider log (level {level}): {}",
                f.to_string_lossy().trim_end()
            );
        }
    })
}

/// Defines kernel commands that fail with EOPNOTSUPP (errno set too).
macro_rules! no_kernel_commands {
    ($( $(#[$m:meta])* fn $name:ident($($arg:ident : $ty:ty),* $(,)?); )*) => {
        $(
            $(#[$m])*
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
                unsupported()
            }
        )*
    };
}

// `cmd` / `link` / `driver`: the kern-abi command struct or `struct
// ibv_command_buffer`; `vmr`: `struct verbs_mr`; `vqp`: `struct
// verbs_qp`; `vcq`: `struct verbs_cq`; `vsrq`: `struct verbs_srq`;
// `vxrcd`: `struct verbs_xrcd`; `vdm`: `struct verbs_dm`; `vcounters`:
// `struct verbs_counters`; `vaction`: `struct verbs_flow_action`.
no_kernel_commands! {
    fn ibv_cmd_advise_mr(_pd: *mut ibv_pd, _advice: u32, _flags: u32, _sg_list: *mut ibv_sge, _num_sge: u32);
    fn ibv_cmd_alloc_dm(_ctx: *mut ibv_context, _dm_attr: *const ibv_alloc_dm_attr, _vdm: *mut c_void, _link: *mut c_void);
    fn ibv_cmd_alloc_mw(_pd: *mut ibv_pd, _type: ibv_mw_type, _mw: *mut ibv_mw, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_alloc_mw_resp, _resp_size: usize);
    fn ibv_cmd_alloc_pd(_ctx: *mut ibv_context, _pd: *mut ibv_pd, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_alloc_pd_resp, _resp_size: usize);
    fn ibv_cmd_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16);
    fn ibv_cmd_close_xrcd(_vxrcd: *mut c_void);
    fn ibv_cmd_create_ah(_pd: *mut ibv_pd, _ah: *mut ibv_ah, _attr: *mut ibv_ah_attr, _resp: *mut ib_uverbs_create_ah_resp, _resp_size: usize);
    fn ibv_cmd_create_counters(_ctx: *mut ibv_context, _init_attr: *mut ibv_counters_init_attr, _vcounters: *mut c_void, _link: *mut c_void);
    fn ibv_cmd_create_cq(_ctx: *mut ibv_context, _cqe: c_int, _channel: *mut ibv_comp_channel, _comp_vector: c_int, _cq: *mut ibv_cq, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_create_cq_resp, _resp_size: usize);
    fn ibv_cmd_create_cq_ex(_ctx: *mut ibv_context, _cq_attr: *const ibv_cq_init_attr_ex, _vcq: *mut c_void, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_ex_create_cq_resp, _resp_size: usize, _cmd_flags: u32);
    fn ibv_cmd_create_flow(_qp: *mut ibv_qp, _flow_id: *mut ibv_flow, _flow_attr: *mut ibv_flow_attr, _ucmd: *mut c_void, _ucmd_size: usize);
    fn ibv_cmd_create_flow_action_esp(_ctx: *mut ibv_context, _attr: *mut ibv_flow_action_esp_attr, _vaction: *mut c_void, _driver: *mut c_void);
    fn ibv_cmd_create_qp(_pd: *mut ibv_pd, _qp: *mut ibv_qp, _attr: *mut ibv_qp_init_attr, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_create_qp_resp, _resp_size: usize);
    fn ibv_cmd_create_qp_ex(_ctx: *mut ibv_context, _vqp: *mut c_void, _attr_ex: *mut ibv_qp_init_attr_ex, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_create_qp_resp, _resp_size: usize);
    fn ibv_cmd_create_qp_ex2(_ctx: *mut ibv_context, _vqp: *mut c_void, _qp_attr: *mut ibv_qp_init_attr_ex, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_ex_create_qp_resp, _resp_size: usize);
    fn ibv_cmd_create_rwq_ind_table(_ctx: *mut ibv_context, _init_attr: *mut ibv_rwq_ind_table_init_attr, _rwq_ind_table: *mut ibv_rwq_ind_table, _resp: *mut ib_uverbs_ex_create_rwq_ind_table_resp, _resp_size: usize);
    fn ibv_cmd_create_srq(_pd: *mut ibv_pd, _srq: *mut ibv_srq, _attr: *mut ibv_srq_init_attr, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_create_srq_resp, _resp_size: usize);
    fn ibv_cmd_create_srq_ex(_ctx: *mut ibv_context, _vsrq: *mut c_void, _attr_ex: *mut ibv_srq_init_attr_ex, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_create_srq_resp, _resp_size: usize);
    fn ibv_cmd_create_wq(_ctx: *mut ibv_context, _wq_init_attr: *mut ibv_wq_init_attr, _wq: *mut ibv_wq, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_ex_create_wq_resp, _resp_size: usize);
    fn ibv_cmd_dealloc_mw(_mw: *mut ibv_mw);
    fn ibv_cmd_dealloc_pd(_pd: *mut ibv_pd);
    fn ibv_cmd_dereg_mr(_vmr: *mut c_void);
    fn ibv_cmd_destroy_ah(_ah: *mut ibv_ah);
    fn ibv_cmd_destroy_counters(_vcounters: *mut c_void);
    fn ibv_cmd_destroy_cq(_cq: *mut ibv_cq);
    fn ibv_cmd_destroy_flow(_flow_id: *mut ibv_flow);
    fn ibv_cmd_destroy_flow_action(_vaction: *mut c_void);
    fn ibv_cmd_destroy_qp(_qp: *mut ibv_qp);
    fn ibv_cmd_destroy_rwq_ind_table(_rwq_ind_table: *mut ibv_rwq_ind_table);
    fn ibv_cmd_destroy_srq(_srq: *mut ibv_srq);
    fn ibv_cmd_destroy_wq(_wq: *mut ibv_wq);
    fn ibv_cmd_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16);
    fn ibv_cmd_free_dm(_vdm: *mut c_void);
    fn ibv_cmd_get_context(_vctx: *mut verbs_context, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_get_context_resp, _resp_size: usize);
    fn ibv_cmd_modify_cq(_cq: *mut ibv_cq, _attr: *mut ibv_modify_cq_attr, _cmd: *mut c_void, _cmd_size: usize);
    fn ibv_cmd_modify_flow_action_esp(_vaction: *mut c_void, _attr: *mut ibv_flow_action_esp_attr, _driver: *mut c_void);
    fn ibv_cmd_modify_qp(_qp: *mut ibv_qp, _attr: *mut ibv_qp_attr, _attr_mask: c_int, _cmd: *mut c_void, _cmd_size: usize);
    fn ibv_cmd_modify_qp_ex(_qp: *mut ibv_qp, _attr: *mut ibv_qp_attr, _attr_mask: c_int, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_ex_modify_qp_resp, _resp_size: usize);
    fn ibv_cmd_modify_srq(_srq: *mut ibv_srq, _srq_attr: *mut ibv_srq_attr, _srq_attr_mask: c_int, _cmd: *mut c_void, _cmd_size: usize);
    fn ibv_cmd_modify_wq(_wq: *mut ibv_wq, _attr: *mut ibv_wq_attr, _cmd: *mut c_void, _cmd_size: usize);
    fn ibv_cmd_open_qp(_ctx: *mut ibv_context, _vqp: *mut c_void, _vqp_sz: c_int, _attr: *mut ibv_qp_open_attr, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_create_qp_resp, _resp_size: usize);
    fn ibv_cmd_open_xrcd(_ctx: *mut ibv_context, _vxrcd: *mut c_void, _vxrcd_size: c_int, _attr: *mut ibv_xrcd_init_attr, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_open_xrcd_resp, _resp_size: usize);
    fn ibv_cmd_query_context(_ctx: *mut ibv_context, _driver: *mut c_void);
    fn ibv_cmd_query_device_any(_ctx: *mut ibv_context, _input: *const ibv_query_device_ex_input, _attr: *mut ibv_device_attr_ex, _attr_size: usize, _resp: *mut ib_uverbs_ex_query_device_resp, _resp_size: *mut usize);
    fn ibv_cmd_query_mr(_pd: *mut ibv_pd, _vmr: *mut c_void, _mr_handle: u32);
    fn ibv_cmd_query_port(_ctx: *mut ibv_context, _port_num: u8, _port_attr: *mut ibv_port_attr, _cmd: *mut c_void, _cmd_size: usize);
    fn ibv_cmd_query_qp(_qp: *mut ibv_qp, _qp_attr: *mut ibv_qp_attr, _attr_mask: c_int, _qp_init_attr: *mut ibv_qp_init_attr, _cmd: *mut c_void, _cmd_size: usize);
    fn ibv_cmd_query_srq(_srq: *mut ibv_srq, _srq_attr: *mut ibv_srq_attr, _cmd: *mut c_void, _cmd_size: usize);
    fn ibv_cmd_read_counters(_vcounters: *mut c_void, _counters_value: *mut u64, _ncounters: u32, _flags: u32, _link: *mut c_void);
    fn ibv_cmd_reg_dm_mr(_pd: *mut ibv_pd, _vdm: *mut c_void, _offset: u64, _length: usize, _access: c_uint, _vmr: *mut c_void, _link: *mut c_void);
    fn ibv_cmd_reg_dmabuf_mr(_pd: *mut ibv_pd, _offset: u64, _length: usize, _iova: u64, _fd: c_int, _access: c_int, _vmr: *mut c_void);
    fn ibv_cmd_reg_mr(_pd: *mut ibv_pd, _addr: *mut c_void, _length: usize, _hca_va: u64, _access: c_int, _vmr: *mut c_void, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_reg_mr_resp, _resp_size: usize);
    fn ibv_cmd_req_notify_cq(_cq: *mut ibv_cq, _solicited_only: c_int);
    fn ibv_cmd_rereg_mr(_vmr: *mut c_void, _flags: u32, _addr: *mut c_void, _length: usize, _hca_va: u64, _access: c_int, _pd: *mut ibv_pd, _cmd: *mut c_void, _cmd_sz: usize, _resp: *mut ib_uverbs_rereg_mr_resp, _resp_sz: usize);
    fn ibv_cmd_resize_cq(_cq: *mut ibv_cq, _cqe: c_int, _cmd: *mut c_void, _cmd_size: usize, _resp: *mut ib_uverbs_resize_cq_resp, _resp_size: usize);
}

/// `ibv_cmd_poll_cq`: -1 (a poll returns a count, so the error must be
/// negative).
#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_poll_cq(_cq: *mut ibv_cq, _ne: c_int, _wc: *mut ibv_wc) -> c_int {
    ffi(-1, || {
        set_errno(EOPNOTSUPP);
        -1
    })
}

/// Points `*bad_wr` at the first work request, as a failed post does.
///
/// # Safety
/// `bad_wr` is NULL or valid for a write.
unsafe fn fail_post<W>(wr: *mut W, bad_wr: *mut *mut W) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: the caller vouches for bad_wr.
        unsafe { *bad_wr = wr };
    }
    unsupported()
}

/// `ibv_cmd_post_send`.
#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_post_send(
    _qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller's bad_wr slot.
    unsafe { fail_post(wr, bad_wr) }
}

/// `ibv_cmd_post_recv`.
#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_post_recv(
    _qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's bad_wr slot.
    unsafe { fail_post(wr, bad_wr) }
}

/// `ibv_cmd_post_srq_recv`.
#[no_mangle]
pub unsafe extern "C" fn ibv_cmd_post_srq_recv(
    _srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's bad_wr slot.
    unsafe { fail_post(wr, bad_wr) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_answers() {
        // SAFETY: none of these dereference their (NULL) arguments.
        unsafe {
            assert!(ibv_reg_dmabuf_mr(std::ptr::null_mut(), 0, 0, 0, -1, 0).is_null());
            assert_eq!(*libc::__errno_location(), EOPNOTSUPP);
            assert_eq!(
                ibv_attach_mcast(std::ptr::null_mut(), std::ptr::null(), 0),
                EOPNOTSUPP
            );
            assert_eq!(
                ibv_cmd_poll_cq(std::ptr::null_mut(), 1, std::ptr::null_mut()),
                -1
            );
            assert_eq!(ibv_cmd_destroy_qp(std::ptr::null_mut()), EOPNOTSUPP);
            assert_eq!(__ioctl_final_num_attrs(5, std::ptr::null_mut()), 5);
            let mut wr = ibv_send_wr::default();
            let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
            assert_eq!(
                ibv_cmd_post_send(std::ptr::null_mut(), &mut wr, &mut bad),
                EOPNOTSUPP
            );
            assert_eq!(bad, &mut wr as *mut _);
            assert!(alloc_mw_op(std::ptr::null_mut(), 1).is_null());
        }
        assert_eq!(std::mem::size_of_val(&verbs_allow_disassociate_destroy), 1);
    }
}
