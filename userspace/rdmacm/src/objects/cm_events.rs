//! Where the agents' CM events go: requests to the listeners, everything
//! else to the id that owns the connection.

use xroce_cm::CmEvent;

use crate::objects::{
    agent::Agent,
    conn, connect, listen,
    teardown::{self, Failure},
};

/// The agents' event handler (called on an agent's thread, its engine
/// unlocked).
pub(crate) fn handle(agent: &'static Agent, event: CmEvent) {
    if crate::base::config::debug() {
        eprintln!("xroce librdmacm: CM event {event:?}");
    }
    match event {
        CmEvent::ConnectRequest {
            conn,
            listener,
            peer,
            req,
            private_data,
        } => listen::on_request(agent, conn, listener, peer, Some(req), &private_data),
        CmEvent::SidrRequest {
            conn,
            listener,
            peer,
            private_data,
            ..
        } => listen::on_request(agent, conn, listener, peer, None, &private_data),
        other => {
            let conn = other.conn();
            let Some(id) = conn::owner(agent, conn) else {
                // Its id is gone (destroy told the engine); nothing to report.
                return;
            };
            match other {
                CmEvent::ConnectResponse {
                    rep, private_data, ..
                } => connect::on_connect_response(&id, &rep, private_data),
                CmEvent::SidrResponse {
                    status,
                    qpn,
                    qkey,
                    private_data,
                    ..
                } => connect::on_sidr_response(&id, status, qpn, qkey, private_data),
                CmEvent::Established { .. } => teardown::on_established(&id),
                CmEvent::Rejected {
                    reason,
                    private_data,
                    ..
                } => teardown::on_failure(&id, Failure::Rejected(reason, private_data)),
                CmEvent::Unreachable { .. } => teardown::on_failure(&id, Failure::Unreachable),
                CmEvent::ConnectError { .. } => teardown::on_failure(&id, Failure::ConnectError),
                CmEvent::DisconnectRequest { .. } => teardown::on_disconnect_request(&id),
                CmEvent::Disconnected { .. } => teardown::on_disconnected(&id, 0),
                CmEvent::DisconnectTimeout { .. } => {
                    teardown::on_disconnected(&id, -libc::ETIMEDOUT)
                }
                CmEvent::TimewaitExit { .. } => teardown::on_timewait_exit(&id),
                CmEvent::ConnectRequest { .. } | CmEvent::SidrRequest { .. } => {
                    unreachable!("handled above")
                }
            }
        }
    }
}
