//! Addresses and routes: `rdma_bind_addr`, `rdma_resolve_addr` (its
//! query runs on a thread of its own), `rdma_resolve_route`,
//! `rdma_get_src_port` / `rdma_get_dst_port`. What binding does and an
//! id's addresses are [`crate::objects::address`]'s.
//!
//! As the kernel's rdma_cm over RoCE: the source address and egress
//! interface come from the routing table; the interface must have an RDMA
//! device (here an xroce device, `xroce_IF`) whose GID table holds the
//! source's RoCEv2 GID, else ADDR_ERROR with -ENODEV; the next hop must
//! answer ARP / NDP within the timeout, else ADDR_ERROR with -ETIMEDOUT;
//! no route at all fails the call itself (ENETUNREACH). The route's GIDs
//! are the IPv4-mapped (or IPv6) addresses of both ends.
//!
//! Wildcard and loopback addresses are alike, as the kernel's
//! `cma_any_addr` has them: binding one attaches no device (libfabric's
//! verbs provider binds "localhost" to list its devices), and resolving
//! one as a destination is a loopback connection on the first active
//! device, from and to that device's own GID.

use std::{
    ffi::c_int,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    abi,
    abi::*,
    base::{
        errno::{fail, ffi, ffi_int},
        sockaddr,
    },
    objects::{
        address::{bind_locked, bound_src, dst_storage, install_path, interface_of, src_storage},
        devices,
        id::{CmId, IdShared, IdState, Phase},
        route,
    },
};

fn wildcard_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// What the resolution thread needs to finish an address query.
struct AddrQuery {
    shared: Arc<IdShared>,
    query: u64,
    iface: String,
    src: IpAddr,
    dst: IpAddr,
    /// The neighbour to wait for (gateway or destination), None when the
    /// destination is this host.
    next_hop: Option<(u32, IpAddr)>,
    deadline: Instant,
}

impl AddrQuery {
    /// The ADDR_RESOLVED / ADDR_ERROR status: 0, -ENODEV or -ETIMEDOUT.
    fn run(&self) -> (c_int, Option<&'static devices::Device>) {
        let Some(device) =
            devices::of_interface(&self.iface).filter(|d| d.gid_index(self.src).is_some())
        else {
            fail(
                libc::ENODEV,
                format_args!(
                    "rdma_resolve_addr: {} leaves through {}, which has no xroce device with \
                     {}'s GID",
                    self.dst, self.iface, self.src
                ),
            );
            return (-libc::ENODEV, None);
        };
        if let Some((ifindex, hop)) = self.next_hop {
            let mut solicited = false;
            loop {
                if matches!(xroce_netlink::neighbour(ifindex, hop), Ok(Some(_))) {
                    break;
                }
                if Instant::now() >= self.deadline {
                    fail(
                        libc::ETIMEDOUT,
                        format_args!("rdma_resolve_addr: {hop} did not answer ARP/NDP in time"),
                    );
                    return (-libc::ETIMEDOUT, None);
                }
                if !solicited {
                    xroce_netlink::solicit(hop, ifindex);
                    solicited = true;
                }
                std::thread::sleep(
                    Duration::from_millis(10)
                        .min(self.deadline.saturating_duration_since(Instant::now())),
                );
            }
        }
        (0, Some(device))
    }

    /// Reports the result, unless the id is gone or asked again since.
    fn finish(self) {
        let (status, device) = self.run();
        let mut st = self.shared.state.lock().unwrap();
        if !st.alive || st.query != self.query {
            return;
        }
        let id = st.c_id();
        let kind = match device {
            Some(d) => {
                // SAFETY: the live id's fields, written under its lock.
                unsafe {
                    d.attach(id);
                    let ib = &mut (*id).route.addr.addr.ibaddr;
                    ib.sgid.raw = sockaddr::gid_of(self.src);
                    ib.dgid.raw = sockaddr::gid_of(self.dst);
                    ib.pkey = 0xffffu16.to_be();
                }
                st.phase = Phase::AddrResolved;
                RDMA_CM_EVENT_ADDR_RESOLVED
            }
            None => {
                st.phase = Phase::Bound;
                RDMA_CM_EVENT_ADDR_ERROR
            }
        };
        CmId::post(&self.shared, &st, kind, status);
    }
}

/// Starts an address query (see the module doc).
fn resolve_addr(
    cm: &CmId,
    id: *mut rdma_cm_id,
    src: Option<SocketAddr>,
    dst: SocketAddr,
    timeout_ms: c_int,
) -> Result<(), i32> {
    let mut st = cm.lock();
    if st.phase == Phase::Idle {
        let from = src.unwrap_or_else(|| SocketAddr::new(wildcard_like(dst.ip()), 0));
        bind_locked(id, &mut st, from)?;
    }
    let bound = bound_src(id).ok_or(libc::EINVAL)?;
    if st.phase != Phase::Bound || bound.is_ipv4() != dst.is_ipv4() {
        return Err(libc::EINVAL);
    }
    if sockaddr::is_any_addr(dst.ip()) {
        return resolve_loopback(cm, st, id, bound, dst);
    }
    let from = (!bound.ip().is_unspecified()).then_some(bound.ip());
    let found = route::lookup(dst.ip(), from).map_err(|e| {
        let errno = e.raw_os_error().unwrap_or(libc::ENETUNREACH);
        fail(
            errno,
            format_args!("rdma_resolve_addr: no route to {}: {e}", dst.ip()),
        )
    })?;
    // A local destination is reached through the interface holding it.
    let iface = if found.local {
        interface_of(dst.ip())
    } else {
        route::if_name(found.oif)
    }
    .ok_or(libc::ENODEV)?;
    let src_ip = from
        .or(found.src)
        .or_else(|| {
            route::local_addresses()
                .into_iter()
                .find(|(n, a)| *n == iface && a.is_ipv4() == dst.is_ipv4())
                .map(|(_, a)| a)
        })
        .ok_or(libc::EADDRNOTAVAIL)?;
    let next_hop = (!found.local).then(|| {
        let hop = found.gateway.unwrap_or(dst.ip());
        (route::if_index(&iface), hop)
    });
    // SAFETY: the id's fields, written under its state lock.
    unsafe {
        sockaddr::write(src_storage(id), SocketAddr::new(src_ip, bound.port()));
        sockaddr::write(dst_storage(id), dst);
    }
    st.phase = Phase::AddrQuery;
    st.query += 1;
    let query = AddrQuery {
        shared: cm.shared.clone(),
        query: st.query,
        iface,
        src: src_ip,
        dst: dst.ip(),
        next_hop,
        deadline: Instant::now() + Duration::from_millis(timeout_ms.max(0) as u64),
    };
    drop(st);
    std::thread::Builder::new()
        .name("rdmacm-addr".into())
        .spawn(move || query.finish())
        .map_err(|_| libc::ENOMEM)?;
    cm.complete()
}

/// A loopback or wildcard destination, as the kernel's
/// `cma_resolve_loopback`: an id bound to a device stays on it and keeps
/// its address; an unattached id goes to the first active device
/// ([`devices::first_active`], ENODEV from the call itself when there is
/// none) and its source address becomes the loopback of its family.
/// Source and destination GID are the device's loopback GID (the kernel
/// takes the bound address's; xroce loops back only frames to the
/// device's IPv4 address, so an IPv6 or secondary address would not
/// connect). ADDR_RESOLVED follows at once.
fn resolve_loopback(
    cm: &CmId,
    mut st: std::sync::MutexGuard<'_, IdState>,
    id: *mut rdma_cm_id,
    bound: SocketAddr,
    dst: SocketAddr,
) -> Result<(), i32> {
    // SAFETY: the program's live id, under its state lock.
    let verbs = unsafe { (*id).verbs };
    let (device, src) = match devices::of_context(verbs) {
        Some(d) if !verbs.is_null() => (d, bound),
        _ => {
            let d = devices::first_active().map_err(|e| {
                fail(
                    e,
                    "rdma_resolve_addr: no xroce device for a loopback destination",
                )
            })?;
            let loopback = SocketAddr::new(sockaddr::loopback_like(dst.ip()), bound.port());
            (d, loopback)
        }
    };
    let gid = device.loopback_gid()?;
    // SAFETY: the live id's fields, written under its lock.
    unsafe {
        sockaddr::write(src_storage(id), src);
        sockaddr::write(dst_storage(id), dst);
        device.attach(id);
        let ib = &mut (*id).route.addr.addr.ibaddr;
        ib.sgid.raw = gid;
        ib.dgid.raw = gid;
        ib.pkey = 0xffffu16.to_be();
    }
    // A query still running for an earlier call must not report.
    st.query += 1;
    st.phase = Phase::AddrResolved;
    CmId::post(&cm.shared, &st, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
    drop(st);
    cm.complete()
}

/// The RoCE path of a resolved address: its GIDs, the port's MTU, the
/// default P_Key; reported with ROUTE_RESOLVED.
pub(crate) fn resolve_route(cm: &CmId, id: *mut rdma_cm_id) -> Result<(), i32> {
    let mut st = cm.lock();
    if st.phase != Phase::AddrResolved {
        return Err(libc::EINVAL);
    }
    install_path(&mut st, id)?;
    st.phase = Phase::RouteResolved;
    CmId::post(&cm.shared, &st, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
    drop(st);
    cm.complete()
}

/// `rdma_bind_addr`.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut abi::sockaddr) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id.
        let cm = unsafe { CmId::from_c(id) }?;
        if addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a sockaddr of the size its family says.
        let addr =
            unsafe { sockaddr::read(addr as *const libc::sockaddr) }.ok_or(libc::EAFNOSUPPORT)?;
        bind_locked(id, &mut cm.lock(), addr)
    })
}

/// `rdma_resolve_addr`.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut abi::sockaddr,
    dst_addr: *mut abi::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id.
        let cm = unsafe { CmId::from_c(id) }?;
        if dst_addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: sockaddrs of the size their family says.
        let dst = unsafe { sockaddr::read(dst_addr as *const libc::sockaddr) }
            .ok_or(libc::EAFNOSUPPORT)?;
        // SAFETY: as above (NULL reads as None).
        let src = unsafe { sockaddr::read(src_addr as *const libc::sockaddr) };
        resolve_addr(cm, id, src, dst, timeout_ms)
    })
}

/// `rdma_resolve_route`: RoCE needs no path query, so the timeout is not
/// needed; the event follows at once.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live id.
        let cm = unsafe { CmId::from_c(id) }?;
        resolve_route(cm, id)
    })
}

/// The port of a sockaddr_storage as stored (network order), 0 for
/// another family.
fn port_of(ss: *const libc::sockaddr_storage) -> u16 {
    // SAFETY: the id's own storage, read as the family it holds.
    unsafe {
        match i32::from((*ss).ss_family) {
            libc::AF_INET => (*(ss as *const libc::sockaddr_in)).sin_port,
            libc::AF_INET6 => (*(ss as *const libc::sockaddr_in6)).sin6_port,
            _ => 0,
        }
    }
}

/// `rdma_get_src_port`: the bound port in network byte order (0 unbound).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    ffi(0, || {
        if id.is_null() {
            0
        } else {
            port_of(src_storage(id))
        }
    })
}

/// `rdma_get_dst_port`: the peer's port in network byte order.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    ffi(0, || {
        if id.is_null() {
            0
        } else {
            port_of(dst_storage(id))
        }
    })
}
