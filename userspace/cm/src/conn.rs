//! One connection's (or SIDR exchange's) state, as ib_cm keeps it.

use xroce_wire::mad::MAD_LEN;
use xroce_wire::Gid;

use crate::config::PeerAddr;

/// A connection, named by its local comm ID (the SIDR request ID for SIDR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u32);

/// The IBTA ch.12 / ib_cm states a live connection can be in (IDLE and
/// LISTEN are not connection states here: an idle connection is gone, a
/// listener is a service ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Active: REQ sent, waiting for REP (or MRA, REJ).
    ReqSent,
    /// Active: the peer sent MRA for our REQ; waiting longer.
    MraReqRcvd,
    /// Passive: REQ reported, the consumer has not answered.
    ReqRcvd,
    /// Passive: we sent MRA for the REQ; the consumer still has not answered.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Passive: the peer sent MRA for our REP.
    MraRepRcvd,
    /// Active: REP reported, the consumer has not sent the RTU yet.
    RepRcvd,
    Established,
    /// We sent DREQ, waiting for DREP.
    DreqSent,
    /// The peer sent DREQ, the consumer has not answered.
    DreqRcvd,
    /// Disconnected; the comm ID waits before it may be reused.
    Timewait,
    /// SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ reported, the consumer has not answered.
    SidrReqRcvd,
}

impl State {
    /// States in which we wait for the peer and retransmit `Conn::sent`.
    pub(crate) fn retransmits(self) -> bool {
        matches!(
            self,
            State::ReqSent
                | State::MraReqRcvd
                | State::RepSent
                | State::MraRepRcvd
                | State::DreqSent
                | State::SidrReqSent
        )
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Conn {
    pub(crate) state: State,
    /// We sent the REQ (or SIDR_REQ).
    pub(crate) active: bool,
    /// The peer's comm ID (SIDR: the request ID of a received SIDR_REQ).
    pub(crate) remote_comm_id: u32,
    pub(crate) remote_ca_guid: u64,
    pub(crate) service_id: u64,
    pub(crate) peer: PeerAddr,
    pub(crate) local_gid: Gid,
    /// The transaction of the REQ (or SIDR_REQ) that started it.
    pub(crate) tid: u64,
    pub(crate) local_qpn: u32,
    pub(crate) remote_qpn: u32,
    /// The listener a passive connection came through (service ID), while
    /// it counts against that listener's backlog.
    pub(crate) backlog_of: Option<u64>,
    /// The last MAD we sent: what a retransmission or a duplicate resends.
    pub(crate) sent: Option<[u8; MAD_LEN]>,
    /// Wait for the peer's answer (ns) and how many resends remain.
    pub(crate) response_timeout_ns: u64,
    pub(crate) max_retries: u8,
    pub(crate) retries_left: u8,
    /// When the timer of the current state fires.
    pub(crate) deadline: Option<u64>,
    pub(crate) timewait_ns: u64,
    /// The consumer destroyed it: it lingers (TIMEWAIT) without events.
    pub(crate) destroyed: bool,
}
