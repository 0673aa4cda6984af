//! What the engine tells its consumer (rdma_cm's events, one level down).

use xroce_wire::cm::{RejReason, SidrStatus};

use crate::config::PeerAddr;
use crate::conn::ConnId;
use crate::params::{RepInfo, ReqInfo};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service we listen on: answer with `accept`, `reject`
    /// (or `mra` first when slow).
    ConnectRequest {
        conn: ConnId,
        listener: u64,
        peer: PeerAddr,
        req: ReqInfo,
        private_data: Vec<u8>,
    },
    /// Our REQ was answered with a REP: move the QP to RTR/RTS, then
    /// `establish` (sends the RTU) or `reject`.
    ConnectResponse {
        conn: ConnId,
        rep: RepInfo,
        private_data: Vec<u8>,
    },
    /// Both sides may use the QP (RTU received, or RTU sent).
    Established { conn: ConnId },
    /// The peer refused (REJ). Terminal.
    Rejected {
        conn: ConnId,
        reason: RejReason,
        private_data: Vec<u8>,
    },
    /// Our REQ, REP or SIDR_REQ went unanswered through every retry. Terminal.
    Unreachable { conn: ConnId },
    /// The peer's REP was unusable; we rejected it. Terminal.
    ConnectError { conn: ConnId, reason: RejReason },
    /// The peer sent DREQ: call `disconnect` to answer with DREP.
    DisconnectRequest { conn: ConnId, private_data: Vec<u8> },
    /// Our DREQ was answered (or crossed the peer's); the connection waits
    /// in TIMEWAIT.
    Disconnected { conn: ConnId },
    /// Our DREQ went unanswered through every retry (ib_cm's DREQ_ERROR;
    /// rdma_cm reports DISCONNECTED with -ETIMEDOUT); the connection waits
    /// in TIMEWAIT.
    DisconnectTimeout { conn: ConnId },
    /// TIMEWAIT is over, the comm ID is free again. Terminal.
    TimewaitExit { conn: ConnId },
    /// A SIDR_REQ for a service we listen on: answer with `sidr_reply`.
    SidrRequest {
        conn: ConnId,
        listener: u64,
        peer: PeerAddr,
        pkey: u16,
        private_data: Vec<u8>,
    },
    /// The answer to our SIDR_REQ. Terminal.
    SidrResponse {
        conn: ConnId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: Vec<u8>,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn conn(&self) -> ConnId {
        match self {
            CmEvent::ConnectRequest { conn, .. }
            | CmEvent::ConnectResponse { conn, .. }
            | CmEvent::Established { conn }
            | CmEvent::Rejected { conn, .. }
            | CmEvent::Unreachable { conn }
            | CmEvent::ConnectError { conn, .. }
            | CmEvent::DisconnectRequest { conn, .. }
            | CmEvent::Disconnected { conn }
            | CmEvent::DisconnectTimeout { conn }
            | CmEvent::TimewaitExit { conn }
            | CmEvent::SidrRequest { conn, .. }
            | CmEvent::SidrResponse { conn, .. } => *conn,
        }
    }

    /// After this event the engine has forgotten the connection.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            CmEvent::Rejected { .. }
                | CmEvent::Unreachable { .. }
                | CmEvent::ConnectError { .. }
                | CmEvent::TimewaitExit { .. }
                | CmEvent::SidrResponse { .. }
        )
    }
}
