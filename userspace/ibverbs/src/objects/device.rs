//! The devices and the stack behind them: one device per interface
//! (`xroce_IF`), registered on first sight, and xroce's stack on the
//! interface (the engine, a packet-I/O backend and its I/O thread), started
//! by the first context opened on it and shared by every context of the
//! process there; the last close stops it.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use xroce::device;
use xroce::engine::AsyncEvent;
use xroce::stack::{Stack, StackConfig};
use xroce::verbs::srq::SrqId;
use xroce::verbs::{Device, Mtu};

use crate::abi::*;
use crate::base::config;
use crate::objects::events::{event_type, write_async};

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
pub(crate) fn wanted_interfaces() -> Vec<String> {
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
pub(crate) fn entry_for(iface: &str) -> &'static DeviceEntry {
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
pub(crate) enum EventSource {
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
    /// The GID table ([`gid_table`]), fixed at open.
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
    pub(crate) fn get(iface: &str) -> Result<Arc<OpenDevice>, String> {
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
            selective_repeat: config::selective_repeat()?,
            app_progress: config::app_progress()?,
            spin_after_activity: config::spin_after_activity()?,
            stream_nap: config::stream_nap()?,
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
            let kind = event_type(&e);
            if let Some(o) = owners.lock().unwrap().get(&source) {
                write_async(o.async_write, o.element as *mut c_void, kind);
            }
        })));
        Ok(OpenDevice {
            iface: iface.to_string(),
            device,
            mac: stack.mac(),
            gids: gid_table(stack.mac(), Some(stack.ip), stack.net().ipv6()),
            active_mtu: stack.path_mtu,
            backend: stack.backend,
            event_owners,
            stack,
        })
    }

    /// Routes the async events of `source` to the pipe whose write end is
    /// `async_write`, as `element` (the C object the program knows).
    pub(crate) fn own(&self, source: EventSource, async_write: i32, element: usize) {
        let owner = EventOwner {
            async_write,
            element,
        };
        self.event_owners.lock().unwrap().insert(source, owner);
    }

    pub(crate) fn disown(&self, source: EventSource) {
        self.event_owners.lock().unwrap().remove(&source);
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

/// The populated GID table ([`xroce::device::gid_table`], rxe's) as GID
/// bytes; every entry is RoCE v2, the rest of the table is empty.
pub(crate) fn gid_table(mac: [u8; 6], v4: Option<Ipv4Addr>, v6: &[Ipv6Addr]) -> Vec<[u8; 16]> {
    xroce::device::gid_table(mac, v4, v6)
        .iter()
        .map(Ipv6Addr::octets)
        .collect()
}
