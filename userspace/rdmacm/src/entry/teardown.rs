//! How connections end: `rdma_disconnect`, `rdma_notify`. What an ending
//! connection reports is [`crate::objects::teardown`]'s.

use std::ffi::c_int;

use crate::{
    abi::*,
    base::errno::{fail, ffi_int},
    objects::{
        conn,
        id::{CmId, Phase},
    },
};

fn disconnect(cm: &CmId, id: *mut rdma_cm_id) -> Result<(), i32> {
    let mut st = cm.lock();
    let Some(c) = st.conn.as_mut() else {
        return Err(libc::EINVAL);
    };
    // rdma-core's ucma_shutdown: the QP to ERR first.
    // SAFETY: the program's live id, under its state lock.
    unsafe { conn::qp_to_error(id) };
    c.local_disconnect = true;
    let (agent, conn) = (c.agent, c.conn);
    let sent = agent.with_engine(|e, now| e.disconnect(conn, &[], now));
    drop(st);
    match sent {
        // A DREQ (DISCONNECTED follows its DREP) or the DREP of the
        // peer's DREQ (DISCONNECTED already queued).
        Ok(()) => cm.complete(),
        // The peer ended the connection first (a REJ after the RTU: a
        // server that exits before the RTU reaches it sends one): nothing
        // is left to send and no event will come. Linux's rdma_disconnect
        // returns 0 then too, once the QP is in ERR (cma.c ignores what
        // ib_send_cm_dreq and ib_send_cm_drep return).
        Err(xroce_cm::CmError::UnknownConn(_)) => Ok(()),
        Err(e) => Err(fail(libc::EINVAL, format_args!("rdma_disconnect: {e}"))),
    }
}

/// `rdma_disconnect`.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's live id.
        let cm = unsafe { CmId::from_c(id) }?;
        disconnect(cm, id)
    })
}

/// `rdma_notify`: IBV_EVENT_COMM_EST on a passive id still waiting for the
/// RTU establishes the connection (the peer's traffic proves it); other
/// events change nothing, as in the kernel.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: ibv_event_type) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's live id.
        let cm = unsafe { CmId::from_c(id) }?;
        if event != IBV_EVENT_COMM_EST {
            return Ok(());
        }
        let st = cm.lock();
        if st.phase != Phase::Accepting {
            return Ok(());
        }
        let Some(c) = st.conn.as_ref() else {
            return Ok(());
        };
        let (agent, conn) = (c.agent, c.conn);
        drop(st);
        // Established follows from the engine, reported by the agent.
        let _ = agent.with_engine(|e, _| e.establish(conn, &[]));
        Ok(())
    })
}
