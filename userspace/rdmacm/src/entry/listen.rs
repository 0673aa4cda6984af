//! The passive side: `rdma_listen`, `rdma_get_request`, `rdma_accept`,
//! `rdma_reject`. The listen table and the requests the agents report are
//! [`crate::objects::listen`]'s.

use std::ffi::{c_int, c_void};

use xroce_cm::{RepParams, SidrReplyParams, SidrStatus};

use crate::{
    abi::*,
    base::errno::{errno, fail, ffi_int},
    entry::qp::rdma_create_qp,
    objects::{
        channel,
        conn::{
            self, Role, DEVICE_MAX_RD_ATOMIC, RDMA_MAX_INIT_DEPTH, RDMA_MAX_RESP_RES, UDP_QKEY,
        },
        id::{CmId, Phase},
        listen::listen,
    },
};

/// Private data a REP can carry (IBTA: 196 bytes).
const REP_PRIVATE_DATA: usize = 196;
/// Private data a SIDR_REP can carry (136 bytes).
const SIDR_REP_PRIVATE_DATA: usize = 136;

/// rdma-core's check of the depths a connection may ask for.
pub(crate) fn valid_param(id: *mut rdma_cm_id, param: Option<&rdma_conn_param>) -> Result<(), i32> {
    // SAFETY: the program's live id.
    let (ps, qp) = unsafe { ((*id).ps, (*id).qp) };
    if ps != RDMA_PS_TCP {
        return Ok(());
    }
    let Some(p) = param else {
        return if qp.is_null() {
            Err(libc::EINVAL)
        } else {
            Ok(())
        };
    };
    let too_deep = |v: u8, max: u8| v != max && v > DEVICE_MAX_RD_ATOMIC;
    if too_deep(p.responder_resources, RDMA_MAX_RESP_RES)
        || too_deep(p.initiator_depth, RDMA_MAX_INIT_DEPTH)
    {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// The QP number and SRQ flag a connection announces: the id's QP, else
/// what the program gives.
pub(crate) fn qp_of(id: *mut rdma_cm_id, param: Option<&rdma_conn_param>) -> (u32, bool) {
    // SAFETY: the program's live id and its QP.
    unsafe {
        let qp = (*id).qp;
        if !qp.is_null() {
            return ((*qp).qp_num, !(*qp).srq.is_null());
        }
    }
    param.map_or((0, false), |p| (p.qp_num, p.srq != 0))
}

/// The program's private data (`len` bytes at `data`), at most `max`.
pub(crate) fn private_data(data: *const c_void, len: u8, max: usize) -> Result<Vec<u8>, i32> {
    if data.is_null() || len == 0 {
        return Ok(Vec::new());
    }
    if usize::from(len) > max {
        return Err(libc::EINVAL);
    }
    // SAFETY: the program gives `len` readable bytes at `data`.
    Ok(unsafe { std::slice::from_raw_parts(data as *const u8, usize::from(len)) }.to_vec())
}

fn accept(cm: &CmId, id: *mut rdma_cm_id, param: Option<&rdma_conn_param>) -> Result<(), i32> {
    valid_param(id, param)?;
    let mut st = cm.lock();
    if st.phase != Phase::Connecting {
        return Err(libc::EINVAL);
    }
    let c = st
        .conn
        .as_mut()
        .filter(|c| c.role == Role::Passive)
        .ok_or(libc::EINVAL)?;
    let (qpn, srq) = qp_of(id, param);
    let agent = c.agent;
    let conn = c.conn;
    // SAFETY: the program's live id.
    let ud = unsafe { (*id).qp_type } == IBV_QPT_UD;
    if ud {
        let data = match param {
            Some(p) => private_data(p.private_data, p.private_data_len, SIDR_REP_PRIVATE_DATA)?,
            None => Vec::new(),
        };
        // Userspace's rdma_conn_param has no Q_Key: rdma_cm's UD one.
        let reply = SidrReplyParams {
            status: SidrStatus::Success,
            qpn,
            qkey: UDP_QKEY,
            private_data: data,
        };
        agent
            .with_engine(|e, _| e.sidr_reply(conn, &reply))
            .map_err(|e| fail(libc::EINVAL, format_args!("rdma_accept: {e}")))?;
        conn::unregister(agent, conn);
        st.conn = None;
        st.phase = Phase::Connected;
        drop(st);
        // A synchronous UD id's request event is done with.
        if cm.lock().is_sync() {
            // SAFETY: a synchronous id's event is its own to ack.
            unsafe {
                if !(*id).event.is_null() {
                    channel::ack((*id).event);
                    (*id).event = std::ptr::null_mut();
                }
            }
        }
        return Ok(());
    }
    match param.map(|p| p.initiator_depth) {
        Some(d) if d != RDMA_MAX_INIT_DEPTH => c.initiator_depth = d,
        _ => c.initiator_depth = c.initiator_depth.min(DEVICE_MAX_RD_ATOMIC),
    }
    match param.map(|p| p.responder_resources) {
        Some(r) if r != RDMA_MAX_RESP_RES => c.responder_resources = r,
        _ => c.responder_resources = c.responder_resources.min(DEVICE_MAX_RD_ATOMIC),
    }
    let data = match param {
        Some(p) => private_data(p.private_data, p.private_data_len, REP_PRIVATE_DATA)?,
        None => Vec::new(),
    };
    let c = c.clone();
    // SAFETY: the live id, under its state lock.
    if let Err(e) = unsafe { conn::qp_to_rts(id, &c) } {
        // SAFETY: as above.
        unsafe { conn::qp_to_error(id) };
        agent.with_engine(|en, _| {
            let _ = en.reject(conn, &[]);
        });
        conn::unregister(agent, conn);
        st.conn = None;
        st.phase = Phase::Closed;
        return Err(fail(e, "rdma_accept: cannot bring the QP to RTS"));
    }
    let rep = RepParams {
        qpn,
        starting_psn: c.rq_psn,
        responder_resources: c.responder_resources,
        initiator_depth: c.initiator_depth,
        rnr_retry_count: param.map_or(7, |p| p.rnr_retry_count.min(7)),
        srq,
        private_data: data,
        ..RepParams::new(qpn, c.rq_psn)
    };
    agent
        .with_engine(|e, now| e.accept(conn, &rep, now))
        .map_err(|e| fail(libc::EINVAL, format_args!("rdma_accept: {e}")))?;
    st.phase = Phase::Accepting;
    drop(st);
    cm.complete()
}

fn reject(cm: &CmId, data: Vec<u8>) -> Result<(), i32> {
    let mut st = cm.lock();
    if st.phase != Phase::Connecting {
        return Err(libc::EINVAL);
    }
    let Some(c) = st.conn.take().filter(|c| c.role == Role::Passive) else {
        return Err(libc::EINVAL);
    };
    let (agent, conn) = (c.agent, c.conn);
    let r = agent.with_engine(|e, _| e.reject(conn, &data));
    conn::unregister(agent, conn);
    st.phase = Phase::Closed;
    r.map_err(|e| fail(libc::EINVAL, format_args!("rdma_reject: {e}")))
}

/// `rdma_listen`.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's live id.
        let cm = unsafe { CmId::from_c(id) }?;
        listen(cm, id, backlog)
    })
}

/// `rdma_get_request`: a synchronous listener's next connection request
/// (its QP made from rdma_create_ep's attributes).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's live listening id.
        let cm = unsafe { CmId::from_c(listen) }?;
        let (channel, attr) = {
            let st = cm.lock();
            if !st.is_sync() || id.is_null() {
                return Err(libc::EINVAL);
            }
            (st.channel.clone(), st.qp_init_attr)
        };
        // SAFETY: a synchronous id's event field is its caller's.
        unsafe {
            if !(*listen).event.is_null() {
                channel::ack((*listen).event);
                (*listen).event = std::ptr::null_mut();
            }
        }
        let event = channel.wait_event()? as *mut rdma_cm_event;
        // SAFETY: the live event just taken.
        let (kind, status, new_id) = unsafe { ((*event).event, (*event).status, (*event).id) };
        let fail_with = |e: i32| {
            // SAFETY: as above; the listener keeps the event.
            unsafe { (*listen).event = event };
            Err(e)
        };
        if kind == RDMA_CM_EVENT_REJECTED {
            return fail_with(libc::ECONNREFUSED);
        }
        if status != 0 {
            return fail_with(-status);
        }
        if kind != RDMA_CM_EVENT_CONNECT_REQUEST {
            return fail_with(libc::EINVAL);
        }
        if let Some(mut attr) = attr {
            // SAFETY: the new id and the listener's PD.
            let rc = unsafe { rdma_create_qp(new_id, (*listen).pd, &mut attr) };
            if rc != 0 {
                return fail_with(errno());
            }
        }
        // SAFETY: the program's out-pointer and the new id.
        unsafe {
            *id = new_id;
            (*new_id).event = event;
        }
        Ok(())
    })
}

/// `rdma_accept`.
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's live id and parameters.
        let cm = unsafe { CmId::from_c(id) }?;
        accept(cm, id, unsafe { conn_param.as_ref() })
    })
}

/// `rdma_reject`: REJ with reason 28 (consumer) and the private data.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program's live id.
        let cm = unsafe { CmId::from_c(id) }?;
        reject(cm, private_data_of(private_data, len)?)
    })
}

/// `rdma_reject_ece`: as rdma_reject (xroce does not negotiate ECE, so
/// there is no vendor option to refuse).
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { rdma_reject(id, private_data, len) }
}

/// REJ carries at most 148 bytes of private data.
fn private_data_of(data: *const c_void, len: u8) -> Result<Vec<u8>, i32> {
    private_data(data, len, 148)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_longer_than_the_message_allows_is_einval() {
        let data = [7u8; 60];
        assert_eq!(
            private_data(data.as_ptr().cast(), 60, 56),
            Err(libc::EINVAL)
        );
        assert_eq!(private_data(data.as_ptr().cast(), 56, 56), Ok(vec![7; 56]));
        assert_eq!(private_data(std::ptr::null(), 10, 56), Ok(vec![]));
    }
}
