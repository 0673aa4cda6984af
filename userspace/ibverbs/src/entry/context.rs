//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`,
//! `ibv_import_device`, `ibv_close_device`, and the per-interface xroce
//! stack behind them. A context's `cmd_fd` and handles belong to its
//! ucontext ([`crate::ucontext`]), shared with imported contexts.
//!
//! One device per interface (`xroce_IF`). Opening one starts xroce's
//! stack on the interface (the engine, a packet-I/O backend and its I/O
//! thread); every context of the process on that interface shares it, and
//! the last close stops it.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use xroce::device;
use xroce::engine::AsyncEvent;
use xroce::stack::{Stack, StackConfig};
use xroce::verbs::srq::SrqId;
use xroce::verbs::{Device, Mtu};

use crate::abi::*;
use crate::config;
use crate::errno::{fail, ffi, ffi_int, ffi_ptr, set_errno};
use crate::ucontext::Ucontext;

/// One `struct ibv_device` and the interface it stands for. Entries live
/// for the whole process (programs keep device pointers past
/// ibv_free_device_list).
#[repr(C)]
pub(crate) struct DeviceEntry {
    pub dev: ibv_device,
    pub iface: String,
}

/// Line rate the default (no congestion control) pacer allows.
const LINE_RATE_BPS: u64 = 100_000_000_000;

fn registry() -> &'static Mutex<Vec<&'static DeviceEntry>> {
    static R: OnceLock<Mutex<Vec<&'static DeviceEntry>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

/// The interfaces to offer: `XROCE_IFACES`, or every Ethernet interface
/// with an IPv4 address except loopback (the list `xroce run` shows in its
/// sysfs view, from the same function).
fn wanted_interfaces() -> Vec<String> {
    config::ifaces().unwrap_or_else(device::sysfs::default_interfaces)
}

fn copy_cstr(dst: &mut [c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().chain([0])) {
        *d = b as c_char;
    }
    if let Some(last) = dst.last_mut() {
        *last = 0;
    }
}

/// The registry entry for `iface`, made on first sight.
fn entry_for(iface: &str) -> &'static DeviceEntry {
    let mut reg = registry().lock().unwrap();
    if let Some(e) = reg.iter().find(|e| e.iface == iface) {
        return e;
    }
    let index = reg.len();
    let mut dev = ibv_device {
        node_type: IBV_NODE_CA,
        transport_type: IBV_TRANSPORT_IB,
        ..Default::default()
    };
    copy_cstr(&mut dev.name, &device_name(iface));
    let uverbs = device::sysfs::uverbs_name(index);
    copy_cstr(&mut dev.dev_name, &uverbs);
    copy_cstr(
        &mut dev.dev_path,
        &format!("/sys/class/infiniband_verbs/{uverbs}"),
    );
    copy_cstr(
        &mut dev.ibdev_path,
        &format!("/sys/class/infiniband/{}", device_name(iface)),
    );
    let e: &'static DeviceEntry = Box::leak(Box::new(DeviceEntry {
        dev,
        iface: iface.to_string(),
    }));
    reg.push(e);
    e
}

/// `xroce_IF`.
pub(crate) fn device_name(iface: &str) -> String {
    device::sysfs::device_name(iface)
}

/// The entry behind a device pointer, if it is one of ours.
pub(crate) fn entry_of(dev: *mut ibv_device) -> Option<&'static DeviceEntry> {
    registry()
        .lock()
        .unwrap()
        .iter()
        .copied()
        .find(|e| std::ptr::eq(&e.dev, dev))
}

/// Index of a device in the registry (`ibv_get_device_index`).
pub(crate) fn index_of(dev: *mut ibv_device) -> Option<usize> {
    registry()
        .lock()
        .unwrap()
        .iter()
        .position(|e| std::ptr::eq(&e.dev, dev))
}

/// The object an async event is about.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum EventSource {
    Qp(u32),
    Srq(SrqId),
}

/// Where an async event goes: the context whose async fd gets it and the
/// `struct ibv_qp` or `struct ibv_srq` the program knows.
#[derive(Clone, Copy)]
struct EventOwner {
    async_write: i32,
    element: usize,
}

/// xroce's stack on one interface, shared by every context of the process
/// on it.
pub(crate) struct OpenDevice {
    pub iface: String,
    pub device: Device,
    pub mac: [u8; 6],
    /// The GID table ([`crate::query::gid_table`]), fixed at open.
    pub gids: Vec<[u8; 16]>,
    /// The largest path MTU the interface allows (rxe's active_mtu).
    pub active_mtu: Mtu,
    pub backend: &'static str,
    event_owners: Arc<Mutex<HashMap<EventSource, EventOwner>>>,
    pub stack: Stack,
}

fn open_devices() -> &'static Mutex<HashMap<String, Weak<OpenDevice>>> {
    static D: OnceLock<Mutex<HashMap<String, Weak<OpenDevice>>>> = OnceLock::new();
    D.get_or_init(|| Mutex::new(HashMap::new()))
}

impl OpenDevice {
    /// The process's stack on `iface`, started if it is not running.
    fn get(iface: &str) -> Result<Arc<OpenDevice>, String> {
        let mut all = open_devices().lock().unwrap();
        if let Some(d) = all.get(iface).and_then(Weak::upgrade) {
            return Ok(d);
        }
        let d = Arc::new(Self::start(iface)?);
        if config::debug() {
            eprintln!(
                "xroce libibverbs: {} runs over the {} backend, active MTU {}, {} I/O thread(s)",
                device_name(iface),
                d.backend,
                d.active_mtu.bytes(),
                d.stack.io_threads()
            );
        }
        all.insert(iface.to_string(), Arc::downgrade(&d));
        Ok(d)
    }

    fn start(iface: &str) -> Result<OpenDevice, String> {
        let backend = config::backend()?;
        let stack = Stack::open(&StackConfig {
            backend,
            cc: config::cc()?,
            line_rate_bps: LINE_RATE_BPS,
            io_threads: config::io_threads()?,
            ..StackConfig::new(iface)
        })
        .map_err(|e| error_chain(&e))?;
        if config::debug()
            && backend == Some(xroce::device::BackendKind::AfXdp)
            && stack.backend == "udp"
        {
            eprintln!(
                "xroce: {iface}: another process owns the AF_XDP sockets; QPN block {} runs \
                 over the UDP backend",
                stack.qpn_block()
            );
        }
        // With XROCE_IO_THREADS > 1 a spreading handle: QPs go to the
        // least-loaded engine, PDs/MRs/CQs/SRQs serve all of them, and the
        // async handler below is every engine's.
        let device = stack.device.clone();
        let event_owners: Arc<Mutex<HashMap<EventSource, EventOwner>>> = Arc::default();
        let owners = event_owners.clone();
        device.set_async_handler(Some(Arc::new(move |e: AsyncEvent| {
            let source = match (e.qpn(), e.srq()) {
                (Some(qpn), _) => EventSource::Qp(qpn),
                (_, Some(srq)) => EventSource::Srq(srq),
                _ => return,
            };
            let kind = crate::async_event::event_type(&e);
            if let Some(o) = owners.lock().unwrap().get(&source) {
                write_async(o.async_write, o.element as *mut c_void, kind);
            }
        })));
        Ok(OpenDevice {
            iface: iface.to_string(),
            device,
            mac: stack.mac(),
            gids: crate::query::gid_table(stack.mac(), Some(stack.ip), stack.net().ipv6()),
            active_mtu: stack.path_mtu,
            backend: stack.backend,
            event_owners,
            stack,
        })
    }
}

/// An error and its causes on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// One record on a context's async fd: what `ibv_get_async_event` returns.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AsyncRecord {
    pub element: u64,
    pub event_type: u32,
    pub _pad: u32,
}

/// Queue an async event on the pipe whose write end is `fd` (never
/// blocks: a full pipe drops the event, as a full kernel queue would).
pub(crate) fn write_async(fd: i32, element: *mut c_void, event_type: u32) {
    let r = AsyncRecord {
        element: element as u64,
        event_type,
        _pad: 0,
    };
    // SAFETY: writes the bytes of a live Copy struct to a pipe we own.
    let _ = unsafe {
        libc::write(
            fd,
            &r as *const AsyncRecord as *const c_void,
            std::mem::size_of::<AsyncRecord>(),
        )
    };
}

/// An open device (`struct ibv_context`, inside rdma-core's extended
/// `struct verbs_context`).
#[repr(C)]
pub(crate) struct Context {
    pub vctx: verbs_context,
    pub dev: Arc<OpenDevice>,
    pub entry: &'static DeviceEntry,
    /// The async event pipe: programs read `context->async_fd`.
    async_read: OwnedFd,
    pub async_write: OwnedFd,
    /// `context->cmd_fd` (closed with the context, as rdma-core closes it).
    cmd_fd: OwnedFd,
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
        self.dev
            .event_owners
            .lock()
            .unwrap()
            .remove(&EventSource::Qp(qpn));
    }

    /// Route the limit event of SRQ `id` to this context as `srq`.
    pub fn own_srq(&self, id: SrqId, srq: *mut ibv_srq) {
        self.own(EventSource::Srq(id), srq as usize);
    }

    pub fn disown_srq(&self, id: SrqId) {
        self.dev
            .event_owners
            .lock()
            .unwrap()
            .remove(&EventSource::Srq(id));
    }

    fn own(&self, source: EventSource, element: usize) {
        let owner = EventOwner {
            async_write: self.async_write.as_raw_fd(),
            element,
        };
        self.dev.event_owners.lock().unwrap().insert(source, owner);
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
    if !crate::handles::check(c as *const Context) {
        return None;
    }
    // SAFETY: as above.
    unsafe { c.as_mut() }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), i32> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fresh descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // SAFETY: as above.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A pipe whose write end never blocks (event producers must not stall
/// the I/O thread) and whose read end blocks unless the program sets
/// O_NONBLOCK itself.
pub(crate) fn event_pipe() -> Result<(OwnedFd, OwnedFd), i32> {
    let (r, w) = pipe()?;
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    Ok((r, w))
}

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
    vctx.query_port = Some(crate::query::query_port_ex);
    vctx.query_device_ex = Some(crate::query::query_device_ex);
    vctx.create_cq_ex = Some(crate::cq::create_cq_ex);
    vctx.create_qp_ex = Some(crate::qp::create_qp_ex);
    let c = &mut vctx.context;
    c.device = &entry.dev as *const ibv_device as *mut ibv_device;
    c.cmd_fd = cmd_fd.as_raw_fd();
    c.async_fd = async_read.as_raw_fd();
    c.num_comp_vectors = 1;
    c.abi_compat = usize::MAX as *mut c_void;
    c.ops.poll_cq = Some(crate::cq::poll_cq);
    c.ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    c.ops.post_send = Some(crate::qp::post_send);
    c.ops.post_recv = Some(crate::qp::post_recv);
    c.ops.post_srq_recv = Some(crate::srq::post_srq_recv);
    c.ops.alloc_mw = Some(crate::unsupported::alloc_mw_op);
    c.ops.bind_mw = Some(crate::unsupported::bind_mw_op);
    c.ops.dealloc_mw = Some(crate::unsupported::dealloc_mw_op);
    let ctx = Box::leak(Box::new(Context {
        vctx,
        dev: ucontext.dev.clone(),
        entry,
        async_read,
        async_write,
        cmd_fd,
        ucontext,
    }));
    crate::handles::born(&*ctx as *const crate::context::Context);
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
        let errno = match crate::ucontext::fd_identity(cmd_fd) {
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
        crate::handles::free(c);
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
