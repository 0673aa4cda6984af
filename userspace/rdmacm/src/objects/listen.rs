//! The passive side's objects: which ids listen where (one table for the
//! process, each (agent, service ID) with its listeners), `rdma_listen`'s
//! registration with the agents, and the connection requests (REQ,
//! SIDR_REQ) the agents report. The calls are in `entry/listen.rs`.
//!
//! A listening id asks the agent of its device (every device for a
//! wildcard address) to listen on rdma_cm's service ID of its port. Ids
//! bound to different addresses may listen on one port: a request goes to
//! the one whose address is the request's destination (from the cma_hdr
//! in its private data), else to a wildcard one of the family; with none,
//! the REQ is rejected as the kernel rejects a REQ nobody listens for.
//! Each request gets a new id, on the listener's channel (a synchronous
//! listener's requests get synchronous ids), announced by CONNECT_REQUEST
//! with the peer's private data after the cma_hdr.

use std::{
    collections::HashMap,
    ffi::c_int,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, OnceLock},
};

use xroce_cm::{ConnId, PeerAddr, ReqInfo};
use xroce_wire::rdma_cm::{service_id, CmaHeader, PortSpace, CMA_HEADER_LEN};
use xroce_wire::Gid;

use crate::{
    abi::*,
    base::errno::fail,
    objects::{
        address,
        agent::Agent,
        channel::EventDetail,
        conn::{self, Connection, Role, DEVICE_MAX_RD_ATOMIC},
        devices,
        id::{self, CmId, IdShared, Phase},
    },
};

/// One (agent, service ID) an id listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ListenKey {
    agent: usize,
    service_id: u64,
}

struct Listener {
    id: Arc<IdShared>,
    addr: SocketAddr,
    afonly: bool,
}

struct ListenTable {
    agents: HashMap<usize, &'static Agent>,
    listeners: HashMap<ListenKey, Vec<Listener>>,
}

fn table() -> &'static Mutex<ListenTable> {
    static TABLE: OnceLock<Mutex<ListenTable>> = OnceLock::new();
    TABLE.get_or_init(|| {
        Mutex::new(ListenTable {
            agents: HashMap::new(),
            listeners: HashMap::new(),
        })
    })
}

/// The id's port space as rdma_cm's wire value.
pub(crate) fn port_space(ps: rdma_port_space) -> Option<PortSpace> {
    PortSpace::from_u16(u16::try_from(ps).ok()?)
}

/// Whether a listener bound to `bound` takes a request to `dst`: its
/// address, or any of its family when bound to a wildcard or loopback
/// address (the kernel's `cma_match_private_data`).
fn takes(l: &Listener, dst: IpAddr) -> bool {
    let b = l.addr.ip();
    if !crate::base::sockaddr::is_any_addr(b) {
        return b == dst;
    }
    match (b, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => true,
        // An IPv6 wildcard takes IPv4 too unless AFONLY.
        (IpAddr::V6(_), IpAddr::V4(_)) => !l.afonly,
        (IpAddr::V4(_), IpAddr::V6(_)) => false,
    }
}

/// Stops `key`'s listening for `id` (the engine's listen ends with the
/// last id).
pub(crate) fn unlisten(key: ListenKey, id: &Arc<IdShared>) {
    let mut t = table().lock().unwrap();
    let Some(list) = t.listeners.get_mut(&key) else {
        return;
    };
    list.retain(|l| !Arc::ptr_eq(&l.id, id));
    if list.is_empty() {
        t.listeners.remove(&key);
        if let Some(agent) = t.agents.get(&key.agent).copied() {
            drop(t);
            agent.with_engine(|e, _| {
                let _ = e.unlisten(key.service_id);
            });
        }
    }
}

pub(crate) fn listen(cm: &CmId, id: *mut rdma_cm_id, backlog: c_int) -> Result<(), i32> {
    let mut st = cm.lock();
    if st.phase == Phase::Idle {
        // The kernel binds an unbound listener to the IPv4 wildcard.
        address::bind_locked(id, &mut st, "0.0.0.0:0".parse().unwrap())?;
    }
    if st.phase != Phase::Bound {
        return Err(libc::EINVAL);
    }
    let bound = address::bound_src(id).ok_or(libc::EINVAL)?;
    // SAFETY: the program's live id, under its state lock.
    let (ps, verbs) = unsafe { ((*id).ps, (*id).verbs) };
    let space = port_space(ps).ok_or(libc::EINVAL)?;
    let sid = service_id(space, bound.port());
    let devices: Vec<&'static devices::Device> = if verbs.is_null() {
        devices::all()?.iter().collect()
    } else {
        vec![devices::of_context(verbs).ok_or(libc::ENODEV)?]
    };
    // As ucma: 0 or a negative backlog means the maximum (the engine caps
    // every backlog at xroce_cm::MAX_BACKLOG).
    let backlog = usize::try_from(backlog).unwrap_or(0);
    let mut keys = Vec::new();
    for device in devices {
        let agent = conn::agent_of(device)?;
        let key = ListenKey {
            agent: conn::agent_key(agent),
            service_id: sid,
        };
        let first = {
            let mut t = table().lock().unwrap();
            t.agents.insert(key.agent, agent);
            let list = t.listeners.entry(key).or_default();
            list.push(Listener {
                id: cm.shared.clone(),
                addr: bound,
                afonly: st.options.afonly,
            });
            list.len() == 1
        };
        if first {
            let r = agent.with_engine(|e, _| e.listen(sid, backlog));
            if let Err(e) = r {
                unlisten(key, &cm.shared);
                for k in keys {
                    unlisten(k, &cm.shared);
                }
                return Err(fail(libc::EADDRINUSE, format_args!("rdma_listen: {e}")));
            }
        }
        keys.push(key);
    }
    st.listens = keys;
    st.phase = Phase::Listening;
    Ok(())
}

/// What a request carries that the new id's event needs.
enum Request {
    Rc { req: ReqInfo },
    Ud,
}

/// A REQ or SIDR_REQ the agent's engine reported for a service we listen
/// on: a new id and CONNECT_REQUEST, or a reject.
pub(crate) fn on_request(
    agent: &'static Agent,
    conn: ConnId,
    service_id: u64,
    peer: PeerAddr,
    rc: Option<ReqInfo>,
    private_data: &[u8],
) {
    let reject = |why: &str| {
        if crate::base::config::debug() {
            eprintln!(
                "xroce librdmacm: rejecting a request from {}: {why}",
                peer.gid.hex()
            );
        }
        agent.with_engine(|e, _| {
            let _ = e.reject(conn, &[]);
        });
    };
    let Ok(hdr) = CmaHeader::parse(private_data) else {
        return reject("no valid cma_hdr in its private data");
    };
    let key = ListenKey {
        agent: conn::agent_key(agent),
        service_id,
    };
    let listener = {
        let t = table().lock().unwrap();
        let list = t.listeners.get(&key);
        let pick = |exact: bool| {
            list?
                .iter()
                .find(|l| {
                    takes(l, hdr.dst_ip) && exact != crate::base::sockaddr::is_any_addr(l.addr.ip())
                })
                .map(|l| (l.id.clone(), l.addr.port()))
        };
        pick(true).or_else(|| pick(false))
    };
    let Some((listener, port)) = listener else {
        return reject("nobody listens on that address");
    };
    let src = SocketAddr::new(hdr.dst_ip, port);
    let dst = SocketAddr::new(hdr.src_ip, hdr.src_port);
    let gids = match &rc {
        // The REQ's path names both GIDs (turned to our side by xroce-cm).
        Some(req) => (req.path.local_gid, req.path.remote_gid),
        // A loopback's SIDR_REQ comes from this device, to its own GID;
        // others name our address and the peer's.
        None if crate::base::sockaddr::is_any_addr(hdr.dst_ip) => (peer.gid, peer.gid),
        None => (
            Gid(crate::base::sockaddr::gid_of(src.ip())),
            Gid(crate::base::sockaddr::gid_of(dst.ip())),
        ),
    };
    let request = match rc {
        Some(req) => Request::Rc { req },
        None => Request::Ud,
    };
    let ends = RequestEnds { src, dst, gids };
    if let Err(why) = new_request_id(agent, conn, &listener, &ends, &request, private_data) {
        reject(&why);
    }
}

/// The two ends of a request from our side: addresses (from the
/// cma_hdr) and GIDs (local, remote).
struct RequestEnds {
    src: SocketAddr,
    dst: SocketAddr,
    gids: (Gid, Gid),
}

/// Makes the request's id and queues CONNECT_REQUEST on the listener's
/// channel (counted against the listener until acked, as rdma-core does).
fn new_request_id(
    agent: &'static Agent,
    conn: ConnId,
    listener: &Arc<IdShared>,
    ends: &RequestEnds,
    request: &Request,
    private_data: &[u8],
) -> Result<(), String> {
    let lst = listener.state.lock().unwrap();
    if !lst.alive || lst.phase != Phase::Listening {
        return Err("the listener is gone".into());
    }
    let l_id = lst.c_id();
    // SAFETY: the live listener's fields, under its state lock.
    let (channel, context, ps) = unsafe { ((*l_id).channel, (*l_id).context, (*l_id).ps) };
    let child = id::create(
        if lst.is_sync() {
            std::ptr::null_mut()
        } else {
            channel
        },
        context,
        ps,
    )
    .map_err(|e| format!("no id for it (errno {e})"))?;
    // SAFETY: the id just made.
    let cm = unsafe { CmId::from_c(child) }.expect("made above");
    let device = agent.device();
    let mut st = cm.lock();
    address::set_request_addresses(child, device, ends.src, ends.dst, ends.gids);
    let _ = address::install_path(&mut st, child);
    let mtu = device.active_mtu().unwrap_or(IBV_MTU_1024) as u8;
    let mut detail = EventDetail {
        listen_id: Some(l_id),
        ..Default::default()
    };
    let user_data = private_data.get(CMA_HEADER_LEN..).unwrap_or(&[]).to_vec();
    let connection = match request {
        Request::Rc { req } => {
            let mut path = req.path;
            path.mtu = path.mtu.min(mtu);
            // The event speaks from our side: the peer's initiator depth is
            // what we must be able to respond to.
            let param = rdma_conn_param {
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                flow_control: 1,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                srq: u8::from(req.srq),
                qp_num: req.remote_qpn,
                ..Default::default()
            };
            detail.param.conn = std::mem::ManuallyDrop::new(param);
            Connection {
                agent,
                conn,
                role: Role::Passive,
                path,
                // Chosen now: rdma_init_qp_attr(RTR) may ask before accept.
                rq_psn: conn::random_psn(),
                sq_psn: req.starting_psn,
                remote_qpn: req.remote_qpn,
                responder_resources: req.initiator_depth.min(DEVICE_MAX_RD_ATOMIC),
                initiator_depth: req.responder_resources.min(DEVICE_MAX_RD_ATOMIC),
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                local_disconnect: false,
                disconnect_reported: false,
            }
        }
        Request::Ud => {
            detail.ud = true;
            let (local, remote) = ends.gids;
            Connection {
                agent,
                conn,
                role: Role::Passive,
                path: xroce_cm::PathParams::roce(local, remote, mtu, 0),
                rq_psn: 0,
                sq_psn: 0,
                remote_qpn: 0,
                responder_resources: 0,
                initiator_depth: 0,
                retry_count: 0,
                rnr_retry_count: 0,
                local_disconnect: false,
                disconnect_reported: false,
            }
        }
    };
    detail.private_data = user_data;
    st.conn = Some(connection);
    st.phase = Phase::Connecting;
    conn::register(agent, conn, &cm.shared);
    drop(st);
    lst.channel
        .post_detailed(listener, child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, detail);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(addr: &str, afonly: bool) -> Listener {
        let id = id::create(std::ptr::null_mut(), std::ptr::null_mut(), RDMA_PS_TCP).unwrap();
        // SAFETY: the id just made.
        let shared = unsafe { CmId::from_c(id) }.unwrap().shared.clone();
        Listener {
            id: shared,
            addr: addr.parse().unwrap(),
            afonly,
        }
    }

    #[test]
    fn listeners_take_their_address_or_their_family_as_the_kernel_does() {
        let v4: IpAddr = "10.0.0.2".parse().unwrap();
        let other: IpAddr = "10.0.0.3".parse().unwrap();
        let v6: IpAddr = "fd00::2".parse().unwrap();
        let exact = listener("10.0.0.2:7174", false);
        assert!(takes(&exact, v4));
        assert!(!takes(&exact, other));
        assert!(!takes(&exact, v6));
        let any4 = listener("0.0.0.0:7174", false);
        assert!(takes(&any4, v4) && takes(&any4, other));
        assert!(!takes(&any4, v6), "an IPv4 wildcard takes no IPv6");
        let any6 = listener("[::]:7174", false);
        assert!(
            takes(&any6, v6) && takes(&any6, v4),
            "IPv6 wildcard takes IPv4 too"
        );
        let any6_only = listener("[::]:7174", true);
        assert!(
            takes(&any6_only, v6) && !takes(&any6_only, v4),
            "unless AFONLY"
        );
        // Loopback-bound listeners are wildcards too (cma_any_addr).
        let lo4 = listener("127.0.0.1:7174", false);
        assert!(takes(&lo4, v4) && takes(&lo4, "127.0.0.1".parse().unwrap()));
        assert!(!takes(&lo4, v6));
        let lo6 = listener("[::1]:7174", true);
        assert!(takes(&lo6, v6) && !takes(&lo6, v4));
    }
}
