//! A connection of an id: what the CM exchanged (the peer's QP and PSN,
//! the path, the read/atomic depths), the id it belongs to, and the QP
//! transitions it drives, as the kernel's rdma_cm and ib_cm compute them
//! (`rdma_init_qp_attr`).
//!
//! Each connection is named by its agent (one per device) and the local
//! comm ID xroce-cm gave it; [`register`] maps that name to the id so the
//! agent's events find it.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, OnceLock},
};

use xroce_cm::{ConnId, PathParams};

use crate::{
    abi::*,
    base::verbs::ibv_modify_qp,
    objects::{
        agent::{self, Agent},
        cm_events, devices,
        id::IdShared,
        ports,
    },
};

/// rdma_cm's "as much as the device allows" for the read/atomic depths.
pub(crate) const RDMA_MAX_RESP_RES: u8 = 0xff;
pub(crate) const RDMA_MAX_INIT_DEPTH: u8 = 0xff;
/// The read/atomic depth xroce's devices allow (`max_qp_rd_atom` and
/// `max_qp_init_rd_atom` of ibv_query_device, as rxe's).
pub(crate) const DEVICE_MAX_RD_ATOMIC: u8 = 128;

/// Which side started the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Active,
    Passive,
}

/// One id's connection.
#[derive(Clone)]
pub(crate) struct Connection {
    pub(crate) agent: &'static Agent,
    pub(crate) conn: ConnId,
    pub(crate) role: Role,
    pub(crate) path: PathParams,
    /// The PSN our QP expects first (the starting PSN we sent).
    pub(crate) rq_psn: u32,
    /// The PSN our QP sends from (the peer's starting PSN), once known.
    pub(crate) sq_psn: u32,
    pub(crate) remote_qpn: u32,
    /// Reads/atomics the peer may have outstanding at our QP.
    pub(crate) responder_resources: u8,
    /// Reads/atomics our QP may have outstanding at the peer.
    pub(crate) initiator_depth: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    /// The program called rdma_disconnect.
    pub(crate) local_disconnect: bool,
    /// DISCONNECTED was queued (once per connection).
    pub(crate) disconnect_reported: bool,
}

/// The ids of live connections, by (agent, local comm ID).
type Registry = HashMap<(usize, u32), Arc<IdShared>>;

fn registry() -> &'static Mutex<Registry> {
    static IDS: OnceLock<Mutex<Registry>> = OnceLock::new();
    IDS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The agent of `device`, with this library's event handler installed
/// before the first agent starts.
pub(crate) fn agent_of(device: &'static devices::Device) -> Result<&'static Agent, i32> {
    static HANDLER: std::sync::Once = std::sync::Once::new();
    HANDLER.call_once(|| agent::set_event_handler(cm_events::handle));
    Agent::of(device)
}

/// Makes `device`'s agent at once if this process holds its QP1 (see
/// [`Agent::serve_if_qp1_holder`]).
pub(crate) fn serve_if_qp1_holder(device: &'static devices::Device) {
    static HANDLER: std::sync::Once = std::sync::Once::new();
    HANDLER.call_once(|| agent::set_event_handler(cm_events::handle));
    Agent::serve_if_qp1_holder(device)
}

pub(crate) fn agent_key(agent: &'static Agent) -> usize {
    agent as *const Agent as usize
}

/// Names `id` as the owner of `conn` on `agent`.
pub(crate) fn register(agent: &'static Agent, conn: ConnId, id: &Arc<IdShared>) {
    registry()
        .lock()
        .unwrap()
        .insert((agent_key(agent), conn.0), id.clone());
}

/// Forgets `conn` (its id is gone or the connection ended).
pub(crate) fn unregister(agent: &'static Agent, conn: ConnId) {
    registry()
        .lock()
        .unwrap()
        .remove(&(agent_key(agent), conn.0));
}

/// The id owning `conn`, if it still exists.
pub(crate) fn owner(agent: &'static Agent, conn: ConnId) -> Option<Arc<IdShared>> {
    registry()
        .lock()
        .unwrap()
        .get(&(agent_key(agent), conn.0))
        .cloned()
}

/// The ids that own a live connection (a snapshot: the registry is not
/// locked afterwards, so the caller may lock the ids).
pub(crate) fn live_owners() -> Vec<Arc<IdShared>> {
    registry().lock().unwrap().values().cloned().collect()
}

/// rdma_cm's Q_Key for UD QPs (RDMA_UDP_QKEY).
pub(crate) const UDP_QKEY: u32 = 0x0123_4567;

/// A fresh 24-bit starting PSN, random as the kernel's.
pub(crate) fn random_psn() -> u32 {
    ports::random_u32() & 0x00ff_ffff
}

/// rdma_cm's flow label of a RoCEv2 connection: a hash of the two ports
/// (the kernel's `cma_get_roce_udp_flow_label`; rxe turns it into the UDP
/// source port).
pub(crate) fn flow_label(src_port: u16, dst_port: u16) -> u32 {
    (u32::from(src_port) * 31 + u32::from(dst_port)) & 0x000f_ffff
}

/// The IP address behind a RoCEv2 GID.
pub(crate) fn ip_of_gid(gid: &xroce_wire::Gid) -> IpAddr {
    gid.to_ip()
}

/// The address vector of the connection's path (global: RoCE always is).
pub(crate) fn ah_attr(path: &PathParams) -> Result<ibv_ah_attr, i32> {
    let device = devices::of_local_ip(ip_of_gid(&path.local_gid)).ok_or(libc::ENODEV)?;
    let sgid_index = device
        .gid_index(ip_of_gid(&path.local_gid))
        .ok_or(libc::EADDRNOTAVAIL)?;
    let mut ah = ibv_ah_attr {
        is_global: 1,
        port_num: devices::PORT,
        sl: path.sl,
        ..Default::default()
    };
    ah.grh.dgid.raw = path.remote_gid.0;
    ah.grh.sgid_index = sgid_index as u8;
    ah.grh.flow_label = path.flow_label;
    ah.grh.hop_limit = path.hop_limit;
    ah.grh.traffic_class = path.traffic_class;
    Ok(ah)
}

fn modify(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32) -> Result<(), i32> {
    // SAFETY: the id's live QP and attributes for it.
    match unsafe { ibv_modify_qp(qp, attr, mask as i32) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Moves the id's QP (if it has one) to RTS for `c`: INIT again with the
/// remote access the depths allow, RTR towards the peer, RTS — what
/// rdma-core does with the kernel's `rdma_init_qp_attr` answers.
///
/// # Safety
/// `id` is a live id (its `qp` field read under the id's state lock).
pub(crate) unsafe fn qp_to_rts(id: *mut rdma_cm_id, c: &Connection) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let qp = unsafe { (*id).qp };
    if qp.is_null() {
        return Ok(());
    }
    for state in [IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS] {
        let (mut attr, mask) = connected_attr(c, state)?;
        modify(qp, &mut attr, mask)?;
    }
    Ok(())
}

/// The attributes moving a connected QP of `c` to `state` (INIT, RTR or
/// RTS; EINVAL otherwise): what `rdma_init_qp_attr` answers for a
/// connection, as the kernel's ib_cm_init_qp_attr.
pub(crate) fn connected_attr(
    c: &Connection,
    state: ibv_qp_state,
) -> Result<(ibv_qp_attr, u32), i32> {
    Ok(match state {
        IBV_QPS_INIT => {
            let mut access = IBV_ACCESS_REMOTE_WRITE;
            if c.responder_resources > 0 {
                access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
            }
            (
                ibv_qp_attr {
                    qp_state: IBV_QPS_INIT,
                    qp_access_flags: access,
                    pkey_index: 0,
                    port_num: devices::PORT,
                    ..Default::default()
                },
                IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT,
            )
        }
        IBV_QPS_RTR => (
            ibv_qp_attr {
                qp_state: IBV_QPS_RTR,
                ah_attr: ah_attr(&c.path)?,
                path_mtu: u32::from(c.path.mtu),
                dest_qp_num: c.remote_qpn,
                rq_psn: c.rq_psn,
                max_dest_rd_atomic: c.responder_resources,
                // ib_cm's: 0, i.e. 655 ms.
                min_rnr_timer: 0,
                ..Default::default()
            },
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
        ),
        IBV_QPS_RTS => (
            ibv_qp_attr {
                qp_state: IBV_QPS_RTS,
                sq_psn: c.sq_psn,
                timeout: c.path.local_ack_timeout,
                retry_cnt: c.retry_count.min(7),
                rnr_retry: c.rnr_retry_count.min(7),
                max_rd_atomic: c.initiator_depth,
                ..Default::default()
            },
            IBV_QP_STATE
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC,
        ),
        _ => return Err(libc::EINVAL),
    })
}

/// Moves the id's QP (if any) to ERR, flushing its work requests, as
/// rdma-core does on disconnect and reject.
///
/// # Safety
/// As [`qp_to_rts`].
pub(crate) unsafe fn qp_to_error(id: *mut rdma_cm_id) {
    // SAFETY: the caller's promise.
    let qp = unsafe { (*id).qp };
    if qp.is_null() {
        return;
    }
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    // A QP already in ERR or RESET may refuse: nothing more to flush then.
    let _ = modify(qp, &mut attr, IBV_QP_STATE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_label_is_the_kernels_port_hash() {
        // rping's client port 40000 to server port 7174.
        assert_eq!(flow_label(40000, 7174), (40000 * 31 + 7174) & 0xfffff);
        assert!(flow_label(u16::MAX, u16::MAX) <= 0xfffff);
    }

    #[test]
    fn psns_are_24_bits() {
        for _ in 0..100 {
            assert!(random_psn() <= 0xff_ffff);
        }
    }
}
