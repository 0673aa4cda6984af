//! How connections end, the objects' side: what destroying an id (or
//! exiting) does to its connection and listens, and the events of an
//! ending connection (REJECTED, UNREACHABLE, CONNECT_ERROR, DISCONNECTED,
//! TIMEWAIT_EXIT), with the status codes the kernel's rdma_cm gives them.
//! `rdma_disconnect` and `rdma_notify` are in `entry/teardown.rs`.

use std::{
    ffi::c_int,
    mem::ManuallyDrop,
    sync::{Arc, TryLockError},
    time::{Duration, Instant},
};

use xroce_cm::RejReason;

use crate::{
    abi::*,
    objects::{
        channel::EventDetail,
        conn::{self, Role},
        id::{CmId, IdShared, IdState, Phase},
        listen,
    },
};

/// The id is being destroyed (state lock held): the CM forgets its
/// connection as ib_cm's destroy does, and its listens end.
pub(crate) fn forget(st: &mut IdState) {
    if let Some(c) = st.conn.take() {
        conn::unregister(c.agent, c.conn);
        c.agent.with_engine(|e, now| {
            let _ = e.destroy(c.conn, now);
        });
    }
    let listens = std::mem::take(&mut st.listens);
    if !listens.is_empty() {
        // SAFETY: the live id's CmId (being destroyed, not yet freed).
        let cm = unsafe { CmId::from_c(st.c_id()) }.expect("a live id");
        for key in listens {
            listen::unlisten(key, &cm.shared);
        }
    }
}

/// At exit, what the kernel does when the process's rdma_cm file closes
/// (ucma_close destroys every id): each connection still open ends as
/// rdma_destroy_id ends it, so that no peer waits through its DREQ retries
/// for a process that is gone. An established one sends DREQ; one whose
/// peer's DREQ is unanswered sends the DREP; a pending request or answer
/// is rejected. The ids stay (another thread may still hold one); an id
/// locked past `deadline` is left alone rather than hang the exit.
pub(crate) fn end_connections_at_exit(deadline: Instant) {
    for shared in conn::live_owners() {
        let mut st = loop {
            match shared.state.try_lock() {
                Ok(st) => break Some(st),
                Err(TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TryLockError::WouldBlock) => break None,
            }
        };
        if let Some(c) = st.as_mut().and_then(|st| st.conn.take()) {
            conn::unregister(c.agent, c.conn);
            c.agent.with_engine(|e, now| {
                let _ = e.destroy(c.conn, now);
            });
        }
    }
}

/// Queues the connection's one DISCONNECTED with `status` (state lock
/// held).
fn report_disconnect(shared: &Arc<IdShared>, st: &mut IdState, status: c_int) {
    let Some(c) = st.conn.as_mut() else {
        return;
    };
    if c.disconnect_reported {
        return;
    }
    c.disconnect_reported = true;
    st.phase = Phase::Disconnecting;
    st.channel
        .post(shared, st.c_id(), RDMA_CM_EVENT_DISCONNECTED, status);
}

/// The peer sent DREQ. DISCONNECTED now; the DREP goes out when the
/// program calls rdma_disconnect (at once if it already did).
pub(crate) fn on_disconnect_request(shared: &Arc<IdShared>) {
    let mut st = shared.state.lock().unwrap();
    let Some(c) = st.conn.clone() else {
        return;
    };
    if c.local_disconnect {
        c.agent.with_engine(|e, now| {
            let _ = e.disconnect(c.conn, &[], now);
        });
    }
    report_disconnect(shared, &mut st, 0);
}

/// Our DREQ was answered (status 0) or went unanswered through every
/// retry (-ETIMEDOUT, as the kernel's rdma_cm reports ib_cm's DREQ_ERROR).
pub(crate) fn on_disconnected(shared: &Arc<IdShared>, status: c_int) {
    let mut st = shared.state.lock().unwrap();
    report_disconnect(shared, &mut st, status);
}

/// TIMEWAIT is over: the connection is gone.
pub(crate) fn on_timewait_exit(shared: &Arc<IdShared>) {
    let mut st = shared.state.lock().unwrap();
    let Some(c) = st.conn.take() else {
        return;
    };
    conn::unregister(c.agent, c.conn);
    st.phase = Phase::Closed;
    st.channel
        .post(shared, st.c_id(), RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
}

/// The passive side's RTU arrived (or rdma_notify said the QP works).
pub(crate) fn on_established(shared: &Arc<IdShared>) {
    let mut st = shared.state.lock().unwrap();
    // The active side reported ESTABLISHED when it sent the RTU.
    if st.conn.as_ref().is_none_or(|c| c.role != Role::Passive) {
        return;
    }
    st.phase = Phase::Connected;
    st.channel
        .post(shared, st.c_id(), RDMA_CM_EVENT_ESTABLISHED, 0);
}

/// How a connection attempt failed.
pub(crate) enum Failure {
    /// REJ received: REJECTED, status the reason code.
    Rejected(RejReason, Vec<u8>),
    /// REQ/REP/SIDR_REQ unanswered: UNREACHABLE, -ETIMEDOUT.
    Unreachable,
    /// The peer's REP was unusable: CONNECT_ERROR.
    ConnectError,
}

/// The connection failed: the QP to ERR (for REJECTED, as rdma-core), the
/// event, the connection forgotten.
pub(crate) fn on_failure(shared: &Arc<IdShared>, failure: Failure) {
    let mut st = shared.state.lock().unwrap();
    let id = st.c_id();
    let Some(c) = st.conn.take() else {
        return;
    };
    conn::unregister(c.agent, c.conn);
    st.phase = Phase::Closed;
    // SAFETY: the live id (registered ids are live), under its lock.
    let ud = unsafe { (*id).qp_type } == IBV_QPT_UD;
    let mut detail = EventDetail {
        ud,
        ..Default::default()
    };
    let (kind, status) = match failure {
        Failure::Rejected(reason, data) => {
            // SAFETY: as above.
            unsafe { conn::qp_to_error(id) };
            detail.private_data = data;
            if !ud {
                detail.param.conn = ManuallyDrop::new(rdma_conn_param::default());
            }
            (RDMA_CM_EVENT_REJECTED, c_int::from(reason.code()))
        }
        Failure::Unreachable => (RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT),
        Failure::ConnectError => (RDMA_CM_EVENT_CONNECT_ERROR, -libc::ECONNREFUSED),
    };
    st.channel.post_detailed(shared, id, kind, status, detail);
}
