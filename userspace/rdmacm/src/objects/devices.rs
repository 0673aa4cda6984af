//! The RDMA devices of the process, opened once through libibverbs and
//! kept open while the library is loaded (as rdma-core's librdmacm keeps
//! them), and the device behind an IP address (`rdma_get_devices` is in
//! `entry/devices.rs`).
//!
//! xroce names the device of interface IF `xroce_IF`; an address belongs
//! to a device when its interface has one and the device's GID table
//! holds the address's RoCEv2 GID.

use std::{
    ffi::{c_int, CStr},
    net::IpAddr,
    sync::{Mutex, OnceLock},
};

use crate::{
    abi::*,
    base::{sockaddr::gid_of, verbs::*},
    objects::conn,
};

/// One opened device.
pub(crate) struct Device {
    pub(crate) context: *mut ibv_context,
    /// `xroce_eth1`.
    pub(crate) name: String,
    /// The default PD of rdma_create_qp without one, made on first use.
    default_pd: Mutex<*mut ibv_pd>,
}

// SAFETY: ibv_context and ibv_pd are thread-safe libibverbs objects; the
// pointers are only handed to libibverbs and the program.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

/// The port every xroce device has.
pub(crate) const PORT: u8 = 1;
/// The GID table size xroce offers (rxe's is larger; xroce fills index 0
/// with the link-local GID and 1 with the IPv4-mapped one).
const MAX_GIDS: c_int = 16;

/// The devices libibverbs lists, opened on first use; ENODEV when it
/// lists none.
pub(crate) fn all() -> Result<&'static [Device], i32> {
    static DEVICES: OnceLock<Result<Vec<Device>, i32>> = OnceLock::new();
    static SERVED: std::sync::Once = std::sync::Once::new();
    let devices = opened(&DEVICES);
    if let Ok(devices) = devices {
        // The QP1 holder serves other processes' RDMA-CM from the start.
        SERVED.call_once(|| devices.iter().for_each(conn::serve_if_qp1_holder));
    }
    devices
}

fn opened(cell: &'static OnceLock<Result<Vec<Device>, i32>>) -> Result<&'static [Device], i32> {
    cell.get_or_init(|| {
        let mut n: c_int = 0;
        // SAFETY: libibverbs fills n and returns a NULL-terminated list.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(libc::ENODEV);
        }
        let mut devices = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: i < n entries of the list.
            let device = unsafe { *list.add(i) };
            // SAFETY: a device of the list, opened as libibverbs allows.
            let context = unsafe { ibv_open_device(device) };
            if context.is_null() {
                continue;
            }
            // SAFETY: libibverbs returns the device's NUL-terminated name.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(device)) };
            devices.push(Device {
                context,
                name: name.to_string_lossy().into_owned(),
                default_pd: Mutex::new(std::ptr::null_mut()),
            });
        }
        // SAFETY: the list from ibv_get_device_list; opened contexts
        // stay valid after it is freed.
        unsafe { ibv_free_device_list(list) };
        if devices.is_empty() {
            Err(libc::ENODEV)
        } else {
            Ok(devices)
        }
    })
    .as_ref()
    .map(Vec::as_slice)
    .map_err(|e| *e)
}

/// The device of interface `iface`.
pub(crate) fn of_interface(iface: &str) -> Option<&'static Device> {
    let name = format!("xroce_{iface}");
    all().ok()?.iter().find(|d| d.name == name)
}

/// The device behind a context the program holds (id->verbs, pd->context).
pub(crate) fn of_context(context: *mut ibv_context) -> Option<&'static Device> {
    all().ok()?.iter().find(|d| d.context == context)
}

/// The device whose GID table holds `ip`'s GID (the device of a local
/// address).
pub(crate) fn of_local_ip(ip: IpAddr) -> Option<&'static Device> {
    all().ok()?.iter().find(|d| d.gid_index(ip).is_some())
}

/// The device a loopback (or wildcard) destination resolves to, as the
/// kernel's `cma_bind_loopback` picks it: the first device whose port is
/// active, else the first device; ENODEV without any.
pub(crate) fn first_active() -> Result<&'static Device, i32> {
    let devices = all()?;
    Ok(devices
        .iter()
        .find(|d| d.port_state() == Ok(IBV_PORT_ACTIVE))
        .unwrap_or(&devices[0]))
}

impl Device {
    /// The port's state (`enum ibv_port_state`).
    fn port_state(&self) -> Result<ibv_port_state, i32> {
        let mut attr = ibv_port_attr::default();
        // SAFETY: an open context and an attribute struct to fill.
        let rc = unsafe { ibv_query_port(self.context, PORT, &mut attr) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(attr.state)
    }

    /// The GID a loopback connection uses at both ends: the device's
    /// IPv4-mapped GID (its interface's IPv4 address, whose frames xroce
    /// loops back inside the device), else GID 0. The kernel takes GID 0,
    /// which on RoCE is the link-local IPv6 one; its RoCE route resolution
    /// then fails for a loopback id (no bound netdev), so nothing can
    /// depend on that choice.
    pub(crate) fn loopback_gid(&self) -> Result<[u8; 16], i32> {
        let mut first = None;
        for i in 0..MAX_GIDS {
            let mut gid = ibv_gid::default();
            // SAFETY: an open context and a GID to fill.
            if unsafe { ibv_query_gid(self.context, PORT, i, &mut gid) } != 0 {
                break;
            }
            // SAFETY: `raw` is the 16 bytes of the union.
            let raw = unsafe { gid.raw };
            if raw == [0; 16] {
                continue;
            }
            if raw[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
                return Ok(raw);
            }
            first.get_or_insert(raw);
        }
        first.ok_or(libc::ENODEV)
    }

    /// The GID table index holding `ip`'s RoCEv2 GID.
    pub(crate) fn gid_index(&self, ip: IpAddr) -> Option<c_int> {
        let want = gid_of(ip);
        (0..MAX_GIDS).find(|&i| {
            let mut gid = ibv_gid::default();
            // SAFETY: an open context and a GID to fill.
            let rc = unsafe { ibv_query_gid(self.context, PORT, i, &mut gid) };
            // SAFETY: `raw` is the 16 bytes of the union.
            rc == 0 && unsafe { gid.raw } == want
        })
    }

    /// The port's active MTU (`enum ibv_mtu`).
    pub(crate) fn active_mtu(&self) -> Result<ibv_mtu, i32> {
        let mut attr = ibv_port_attr::default();
        // SAFETY: an open context and an attribute struct to fill.
        let rc = unsafe { ibv_query_port(self.context, PORT, &mut attr) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(attr.active_mtu)
    }

    /// Gives an id this device, its port and (unless it has one) the
    /// device's default PD, as rdma-core does when an id finds its device
    /// (the id's state lock held).
    ///
    /// # Safety
    /// `id` is a live id.
    pub(crate) unsafe fn attach(&self, id: *mut rdma_cm_id) {
        // SAFETY: the caller's promise.
        unsafe {
            (*id).verbs = self.context;
            (*id).port_num = PORT;
            if (*id).pd.is_null() {
                (*id).pd = self.default_pd().unwrap_or(std::ptr::null_mut());
            }
        }
    }

    /// The device's default PD, allocated on first use.
    pub(crate) fn default_pd(&self) -> Result<*mut ibv_pd, i32> {
        let mut pd = self.default_pd.lock().unwrap();
        if pd.is_null() {
            // SAFETY: an open context.
            let made = unsafe { ibv_alloc_pd(self.context) };
            if made.is_null() {
                return Err(crate::base::errno::errno());
            }
            *pd = made;
        }
        Ok(*pd)
    }
}
