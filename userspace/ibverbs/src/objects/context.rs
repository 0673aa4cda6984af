//! An open device, `struct ibv_context` inside rdma-core's extended
//! `struct verbs_context`: the device's stack, its async event pipe, and
//! its ucontext ([`crate::objects::ucontext`]: the `cmd_fd` and the
//! handles, shared with imported contexts).

use std::ffi::c_void;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use xroce::verbs::srq::SrqId;

use crate::abi::*;
use crate::base::handles::Handle;
use crate::objects::device::{DeviceEntry, EventSource, OpenDevice};
use crate::objects::events::write_async;
use crate::objects::ucontext::Ucontext;

/// An open device (`struct ibv_context`, inside rdma-core's extended
/// `struct verbs_context`).
#[repr(C)]
pub(crate) struct Context {
    pub vctx: verbs_context,
    pub dev: Arc<OpenDevice>,
    pub entry: &'static DeviceEntry,
    /// The async event pipe: programs read `context->async_fd`.
    pub async_read: OwnedFd,
    pub async_write: OwnedFd,
    /// `context->cmd_fd` (closed with the context, as rdma-core closes it).
    pub cmd_fd: OwnedFd,
    /// The PD and MR handles, shared with contexts imported from `cmd_fd`.
    pub ucontext: Arc<Ucontext>,
}

impl Context {
    pub fn ibv(&mut self) -> *mut ibv_context {
        &mut self.vctx.context
    }

    /// Route async events of QP `qpn` to this context as `qp`.
    pub fn own_qp(&self, qpn: u32, qp: *mut ibv_qp) {
        self.own(EventSource::Qp(qpn), qp as usize);
    }

    pub fn disown_qp(&self, qpn: u32) {
        self.dev.disown(EventSource::Qp(qpn));
    }

    /// Route the limit event of SRQ `id` to this context as `srq`.
    pub fn own_srq(&self, id: SrqId, srq: *mut ibv_srq) {
        self.own(EventSource::Srq(id), srq as usize);
    }

    pub fn disown_srq(&self, id: SrqId) {
        self.dev.disown(EventSource::Srq(id));
    }

    fn own(&self, source: EventSource, element: usize) {
        self.dev.own(source, self.async_write.as_raw_fd(), element);
    }

    /// Queue an async event for this context.
    pub fn post_async(&self, element: *mut c_void, event_type: u32) {
        write_async(self.async_write.as_raw_fd(), element, event_type);
    }
}

/// The context behind `ctx`.
///
/// # Safety
/// `ctx` is NULL or a context this library opened and has not closed.
pub(crate) unsafe fn context<'a>(ctx: *mut ibv_context) -> Option<&'a mut Context> {
    if ctx.is_null() {
        return None;
    }
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: our ibv_context is the `context` field of the verbs_context
    // that starts our repr(C) Context (the address only; read below).
    let c = unsafe { ctx.cast::<u8>().sub(off) } as *mut Context;
    if !crate::base::handles::check(c as *const Context) {
        return None;
    }
    // SAFETY: as above.
    unsafe { c.as_mut() }
}

impl Handle for Context {
    const KIND: &'static str = "device context";
}
