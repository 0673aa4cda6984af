//! An id's addresses: binding (the port space's table, and the device of
//! a specific address; a wildcard or loopback one, the kernel's
//! `cma_any_addr`, attaches none), the source and destination sockaddrs
//! in the C id, the GIDs and the RoCE path record. Resolution and the
//! calls are in `entry/address.rs`.

use std::net::{IpAddr, SocketAddr};

use crate::{
    abi::*,
    base::{errno::fail, sockaddr},
    objects::{
        devices,
        id::{IdState, Phase},
        ports, route,
    },
};

/// The interface holding local address `ip`.
pub(crate) fn interface_of(ip: IpAddr) -> Option<String> {
    route::local_addresses()
        .into_iter()
        .find(|(_, a)| *a == ip)
        .map(|(name, _)| name)
}

/// Binds the id to `addr` (state lock held): a specific address must be
/// this host's (EADDRNOTAVAIL) on an interface with an xroce device
/// holding its GID (ENODEV), which the id is then bound to. A wildcard or
/// loopback address binds only the port, as in the kernel.
pub(crate) fn bind_locked(
    id: *mut rdma_cm_id,
    st: &mut IdState,
    addr: SocketAddr,
) -> Result<(), i32> {
    if st.phase != Phase::Idle {
        return Err(libc::EINVAL);
    }
    // A wildcard or loopback address (cma_any_addr) attaches no device:
    // a listener on it listens on every device, address resolution picks
    // one later.
    let device = if sockaddr::is_any_addr(addr.ip()) {
        None
    } else {
        let iface = interface_of(addr.ip()).ok_or_else(|| {
            fail(
                libc::EADDRNOTAVAIL,
                format_args!(
                    "rdma_bind_addr: {} is not an address of this host",
                    addr.ip()
                ),
            )
        })?;
        let device = devices::of_interface(&iface)
            .filter(|d| d.gid_index(addr.ip()).is_some())
            .ok_or_else(|| {
                fail(
                    libc::ENODEV,
                    format_args!(
                        "rdma_bind_addr: {iface} has no xroce device with {}'s GID \
                         (is it in XROCE_IFACES / xroce run --iface?)",
                        addr.ip()
                    ),
                )
            })?;
        Some(device)
    };
    // SAFETY: the program's live id (see CmId).
    let ps = unsafe { (*id).ps };
    let (key, port) = ports::bind(ps, addr, st.options.reuseaddr, st.options.afonly)?;
    st.binding = Some(key);
    let mut bound = addr;
    bound.set_port(port);
    // SAFETY: the id's fields are written under its state lock.
    unsafe {
        sockaddr::write(src_storage(id), bound);
        if let Some(d) = device {
            d.attach(id);
        }
    }
    st.phase = Phase::Bound;
    Ok(())
}

pub(crate) fn src_storage(id: *mut rdma_cm_id) -> *mut libc::sockaddr_storage {
    // SAFETY: a field address inside the live id.
    unsafe { &raw mut (*id).route.addr.__bindgen_anon_1.src_storage as *mut libc::sockaddr_storage }
}

pub(crate) fn dst_storage(id: *mut rdma_cm_id) -> *mut libc::sockaddr_storage {
    // SAFETY: a field address inside the live id.
    unsafe { &raw mut (*id).route.addr.__bindgen_anon_2.dst_storage as *mut libc::sockaddr_storage }
}

/// The id's bound source (address and port).
pub(crate) fn bound_src(id: *mut rdma_cm_id) -> Option<SocketAddr> {
    // SAFETY: the id's own sockaddr_storage.
    unsafe { sockaddr::read(src_storage(id) as *const libc::sockaddr) }
}

/// Gives an id the addresses of a connection request it was made for: its
/// source (our address, the listener's port) and destination, the device
/// and the GIDs (local, remote), as address resolution would have (state
/// lock held).
pub(crate) fn set_request_addresses(
    id: *mut rdma_cm_id,
    device: &'static devices::Device,
    src: SocketAddr,
    dst: SocketAddr,
    (sgid, dgid): (xroce_wire::Gid, xroce_wire::Gid),
) {
    // SAFETY: a live id whose fields are written under its state lock.
    unsafe {
        sockaddr::write(src_storage(id), src);
        sockaddr::write(dst_storage(id), dst);
        device.attach(id);
        let ib = &mut (*id).route.addr.addr.ibaddr;
        ib.sgid.raw = sgid.0;
        ib.dgid.raw = dgid.0;
        ib.pkey = 0xffffu16.to_be();
    }
}

/// The id's source and destination addresses.
pub(crate) fn endpoints(id: *mut rdma_cm_id) -> Option<(SocketAddr, SocketAddr)> {
    // SAFETY: the id's own sockaddr_storages.
    let dst = unsafe { sockaddr::read(dst_storage(id) as *const libc::sockaddr) }?;
    Some((bound_src(id)?, dst))
}

/// Builds the id's RoCE path record from its GIDs and device (state lock
/// held).
pub(crate) fn install_path(st: &mut IdState, id: *mut rdma_cm_id) -> Result<(), i32> {
    // SAFETY: the live id's fields, under its lock.
    let (verbs, ib) = unsafe { ((*id).verbs, (*id).route.addr.addr.ibaddr) };
    let device = devices::of_context(verbs).ok_or(libc::ENODEV)?;
    let mtu = device.active_mtu()?;
    let path = Box::new(ibv_sa_path_rec {
        dgid: ib.dgid,
        sgid: ib.sgid,
        // RoCE: hop limit as IPv4's default TTL, one reversible path.
        hop_limit: 64,
        traffic_class: st.options.tos.unwrap_or(0),
        reversible: 1,
        numb_path: 1,
        pkey: 0xffffu16.to_be(),
        // IB_SA_EQ (2): exactly this MTU; the packet life time is the
        // kernel's for RoCE (CMA_IBOE_PACKET_LIFETIME).
        mtu_selector: 2,
        mtu: mtu as u8,
        rate_selector: 2,
        packet_life_time_selector: 2,
        packet_life_time: 16,
        ..Default::default()
    });
    let raw = &*path as *const ibv_sa_path_rec as *mut ibv_sa_path_rec;
    st.path = Some(path);
    // SAFETY: as above; the record lives as long as the id (or the next
    // resolution replaces it).
    unsafe {
        (*id).route.path_rec = raw;
        (*id).route.num_paths = 1;
    }
    Ok(())
}
