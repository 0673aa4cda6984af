//! The active side's answers: the REP and SIDR_REP the agents report for
//! a connection an id started (`rdma_connect`, in `entry/connect.rs`).

use std::{ffi::c_int, mem::ManuallyDrop, sync::Arc};

use xroce_cm::{RepInfo, SidrStatus};

use crate::{
    abi::*,
    objects::{
        channel::EventDetail,
        conn::{self, Role, UDP_QKEY},
        id::{IdShared, Phase},
    },
};

/// The REP of our REQ: the QP to RTS and the RTU out, then ESTABLISHED;
/// without a QP, CONNECT_RESPONSE for the program's rdma_establish.
pub(crate) fn on_connect_response(shared: &Arc<IdShared>, rep: &RepInfo, data: Vec<u8>) {
    let mut st = shared.state.lock().unwrap();
    let id = st.c_id();
    let Some(c) = st.conn.as_mut().filter(|c| c.role == Role::Active) else {
        return;
    };
    c.sq_psn = rep.starting_psn;
    c.remote_qpn = rep.remote_qpn;
    // ib_cm's view from our side: the peer's initiator depth is what we
    // respond to, its responder resources what we may use.
    c.responder_resources = c.responder_resources.min(rep.initiator_depth);
    c.initiator_depth = c.initiator_depth.min(rep.responder_resources);
    c.rnr_retry_count = rep.rnr_retry_count;
    let c = c.clone();
    let param = rdma_conn_param {
        responder_resources: rep.initiator_depth,
        initiator_depth: rep.responder_resources,
        flow_control: 1,
        rnr_retry_count: rep.rnr_retry_count,
        srq: u8::from(rep.srq),
        qp_num: rep.remote_qpn,
        ..Default::default()
    };
    let mut detail = EventDetail {
        private_data: data,
        ..Default::default()
    };
    detail.param.conn = ManuallyDrop::new(param);
    // SAFETY: the live id (the registry holds only live ids' states).
    let has_qp = unsafe { !(*id).qp.is_null() };
    if !has_qp {
        st.channel
            .post_detailed(shared, id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, detail);
        return;
    }
    // SAFETY: the live id, under its state lock.
    let moved = unsafe { conn::qp_to_rts(id, &c) };
    let (kind, status) = match moved {
        Ok(()) => {
            let r = c.agent.with_engine(|e, _| e.establish(c.conn, &[]));
            match r {
                Ok(()) => (RDMA_CM_EVENT_ESTABLISHED, 0),
                Err(_) => (RDMA_CM_EVENT_CONNECT_ERROR, -libc::EINVAL),
            }
        }
        Err(e) => {
            // SAFETY: as above.
            unsafe { conn::qp_to_error(id) };
            c.agent.with_engine(|en, _| {
                let _ = en.reject(c.conn, &[]);
            });
            conn::unregister(c.agent, c.conn);
            st.conn = None;
            (RDMA_CM_EVENT_CONNECT_ERROR, -e)
        }
    };
    st.phase = if kind == RDMA_CM_EVENT_ESTABLISHED {
        Phase::Connected
    } else {
        Phase::Closed
    };
    st.channel.post_detailed(shared, id, kind, status, detail);
}

/// The SIDR_REP of our SIDR_REQ: ESTABLISHED with the peer's QP, Q_Key and
/// address vector, or UNREACHABLE with its status.
pub(crate) fn on_sidr_response(
    shared: &Arc<IdShared>,
    status: SidrStatus,
    qpn: u32,
    qkey: u32,
    data: Vec<u8>,
) {
    let mut st = shared.state.lock().unwrap();
    let id = st.c_id();
    let Some(c) = st.conn.take() else {
        return;
    };
    conn::unregister(c.agent, c.conn);
    let mut detail = EventDetail {
        ud: true,
        private_data: data,
        ..Default::default()
    };
    let (kind, code) = if status == SidrStatus::Success {
        let ah_attr = conn::ah_attr(&c.path).unwrap_or_default();
        detail.param.ud = ManuallyDrop::new(rdma_ud_param {
            ah_attr,
            qp_num: qpn,
            qkey: if qkey == 0 { UDP_QKEY } else { qkey },
            ..Default::default()
        });
        st.phase = Phase::Connected;
        (RDMA_CM_EVENT_ESTABLISHED, 0)
    } else {
        st.phase = Phase::Closed;
        (RDMA_CM_EVENT_UNREACHABLE, c_int::from(status.code()))
    };
    st.channel.post_detailed(shared, id, kind, code, detail);
}
