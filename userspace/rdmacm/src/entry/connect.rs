//! The active side: `rdma_connect`, `rdma_establish`; the answers the
//! agents report (REP, SIDR_REP) are [`crate::objects::connect`]'s.
//!
//! rdma_connect sends a REQ (a SIDR_REQ for UD ids) to rdma_cm's service
//! ID of the destination port, its private data led by the cma_hdr that
//! names both addresses. When the REP comes and the id has a QP, the QP
//! goes to RTR and RTS and the RTU goes out before ESTABLISHED is
//! reported, as rdma-core does on CONNECT_RESPONSE; without a QP the
//! program gets CONNECT_RESPONSE and calls rdma_establish.

use std::ffi::c_int;

use xroce_cm::{ConnId, ConnectParams, PathParams, SidrRequestParams};
use xroce_wire::rdma_cm::{service_id, CmaHeader, CMA_HEADER_LEN, CMA_VERSION};
use xroce_wire::Gid;

use crate::{
    abi::*,
    base::errno::{fail, ffi_int},
    entry::listen::{private_data, qp_of, valid_param},
    objects::{
        address,
        conn::{
            self, Connection, Role, DEVICE_MAX_RD_ATOMIC, RDMA_MAX_INIT_DEPTH, RDMA_MAX_RESP_RES,
        },
        devices,
        id::{CmId, Phase},
        listen::port_space,
    },
};

/// Private data a REQ can carry (92 bytes), the cma_hdr's 36 included.
const REQ_PRIVATE_DATA: usize = 92;
/// A SIDR_REQ's (216 bytes).
const SIDR_REQ_PRIVATE_DATA: usize = 216;
/// rdma_cm's CM response timeout and retries (CMA_CM_RESPONSE_TIMEOUT,
/// CMA_MAX_CM_RETRIES).
const CM_RESPONSE_TIMEOUT: u8 = 20;
const MAX_CM_RETRIES: u8 = 15;

fn connect(cm: &CmId, id: *mut rdma_cm_id, param: Option<&rdma_conn_param>) -> Result<(), i32> {
    valid_param(id, param)?;
    let mut st = cm.lock();
    if st.phase != Phase::RouteResolved {
        return Err(libc::EINVAL);
    }
    // SAFETY: the program's live id, under its state lock.
    let (ps, verbs, qp_type) = unsafe { ((*id).ps, (*id).verbs, (*id).qp_type) };
    let device = devices::of_context(verbs).ok_or(libc::ENODEV)?;
    let agent = conn::agent_of(device)?;
    let (src, dst) = address::endpoints(id).ok_or(libc::EINVAL)?;
    let space = port_space(ps).ok_or(libc::EINVAL)?;
    // The GIDs address resolution chose (a loopback's are the device's
    // own, not those of 127.0.0.1).
    // SAFETY: as above; `raw` is the 16 bytes of each GID union.
    let (local_gid, remote_gid) = unsafe {
        let ib = (*id).route.addr.addr.ibaddr;
        (Gid(ib.sgid.raw), Gid(ib.dgid.raw))
    };
    let mtu = device.active_mtu()? as u8;
    let mut path = PathParams::roce(
        local_gid,
        remote_gid,
        mtu,
        conn::flow_label(src.port(), dst.port()),
    );
    path.traffic_class = st.options.tos.unwrap_or(0);
    if let Some(t) = st.options.ack_timeout {
        path.local_ack_timeout = t;
    }
    let hdr = CmaHeader {
        cma_version: CMA_VERSION,
        src_port: src.port(),
        src_ip: src.ip(),
        dst_ip: dst.ip(),
    };
    let ud = qp_type == IBV_QPT_UD;
    let max = if ud {
        SIDR_REQ_PRIVATE_DATA
    } else {
        REQ_PRIVATE_DATA
    } - CMA_HEADER_LEN;
    let user = match param {
        Some(p) => private_data(p.private_data, p.private_data_len, max)?,
        None => Vec::new(),
    };
    let mut data = vec![0u8; CMA_HEADER_LEN];
    hdr.emit(&mut data).map_err(|_| libc::EINVAL)?;
    data.extend_from_slice(&user);
    let sid = service_id(space, dst.port());
    let mut c = Connection {
        agent,
        conn: ConnId(0),
        role: Role::Active,
        path,
        rq_psn: conn::random_psn(),
        sq_psn: 0,
        remote_qpn: 0,
        responder_resources: match param.map(|p| p.responder_resources) {
            Some(r) if r != RDMA_MAX_RESP_RES => r,
            _ => DEVICE_MAX_RD_ATOMIC,
        },
        initiator_depth: match param.map(|p| p.initiator_depth) {
            Some(d) if d != RDMA_MAX_INIT_DEPTH => d,
            _ => DEVICE_MAX_RD_ATOMIC,
        },
        retry_count: param.map_or(7, |p| p.retry_count.min(7)),
        rnr_retry_count: param.map_or(7, |p| p.rnr_retry_count.min(7)),
        local_disconnect: false,
        disconnect_reported: false,
    };
    let started = if ud {
        let req = SidrRequestParams {
            service_id: sid,
            local_gid,
            remote_gid,
            pkey: 0xffff,
            timeout: CM_RESPONSE_TIMEOUT,
            max_retries: MAX_CM_RETRIES,
            private_data: data,
        };
        agent.with_engine(|e, now| {
            let conn = e.sidr_request(&req, now)?;
            conn::register(agent, conn, &cm.shared);
            Ok(conn)
        })
    } else {
        let (qpn, srq) = qp_of(id, param);
        let req = ConnectParams {
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            srq,
            cm_response_timeout: CM_RESPONSE_TIMEOUT,
            max_cm_retries: MAX_CM_RETRIES,
            private_data: data,
            ..ConnectParams::new(sid, qpn, c.rq_psn, path)
        };
        agent.with_engine(|e, now| {
            let conn = e.connect(&req, now)?;
            conn::register(agent, conn, &cm.shared);
            Ok(conn)
        })
    };
    // Registered before the engine is unlocked: the agent's thread sends
    // the REQ at once, and the answer's event must find this id (its
    // handler then waits for the id's lock, held until `conn` is set).
    c.conn = started
        .map_err(|e: xroce_cm::CmError| fail(libc::EINVAL, format_args!("rdma_connect: {e}")))?;
    st.conn = Some(c);
    st.phase = Phase::Connecting;
    drop(st);
    cm.complete()
}

/// `rdma_connect`.
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's live id and parameters.
        let cm = unsafe { CmId::from_c(id) }?;
        connect(cm, id, unsafe { conn_param.as_ref() })
    })
}

/// `rdma_establish`: after CONNECT_RESPONSE on an id without a QP (the
/// program moved its own QP), the RTU.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's live id.
        let cm = unsafe { CmId::from_c(id) }?;
        // SAFETY: as above.
        if unsafe { !(*id).qp.is_null() } {
            return Err(libc::EINVAL);
        }
        let mut st = cm.lock();
        let c = st
            .conn
            .as_ref()
            .filter(|c| c.role == Role::Active)
            .ok_or(libc::EINVAL)?;
        let (agent, conn) = (c.agent, c.conn);
        agent
            .with_engine(|e, _| e.establish(conn, &[]))
            .map_err(|e| fail(libc::EINVAL, format_args!("rdma_establish: {e}")))?;
        st.phase = Phase::Connected;
        Ok(())
    })
}
