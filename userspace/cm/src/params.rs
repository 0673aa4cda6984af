//! What the consumer gives to connect, accept and resolve, and what the
//! engine reports of a peer's REQ/REP.

use xroce_wire::cm::SidrStatus;
use xroce_wire::Gid;

use crate::config::{DEFAULT_CM_RESPONSE_TIMEOUT, DEFAULT_MAX_CM_RETRIES};

/// The path between the two ports (RoCE: GIDs, no LIDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParams {
    pub local_gid: Gid,
    pub remote_gid: Gid,
    /// IB MTU code (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// 20 bits (rdma_cm: a hash of the two ports).
    pub flow_label: u32,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub sl: u8,
    /// The path's local ACK timeout exponent (also sets TIMEWAIT's length).
    pub local_ack_timeout: u8,
}

impl PathParams {
    /// A RoCE path as rdma_cm builds one: hop limit 64, traffic class and
    /// SL 0, ACK timeout 19 (what the rxe captures show).
    pub fn roce(local_gid: Gid, remote_gid: Gid, mtu: u8, flow_label: u32) -> PathParams {
        PathParams {
            local_gid,
            remote_gid,
            mtu,
            flow_label,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            local_ack_timeout: 19,
        }
    }
}

/// An RC connection request (REQ).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    pub service_id: u64,
    pub qpn: u32,
    /// The PSN this side expects to receive first (Linux's convention: the
    /// peer sends from it).
    pub starting_psn: u32,
    pub path: PathParams,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// Exponent of how long either CM may take to answer.
    pub cm_response_timeout: u8,
    /// How often the REQ is retransmitted before giving up (4 bits).
    pub max_cm_retries: u8,
    pub private_data: Vec<u8>,
}

impl ConnectParams {
    /// rdma_cm's defaults for everything but the addresses and QP.
    pub fn new(service_id: u64, qpn: u32, starting_psn: u32, path: PathParams) -> ConnectParams {
        ConnectParams {
            service_id,
            qpn,
            starting_psn,
            path,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            cm_response_timeout: DEFAULT_CM_RESPONSE_TIMEOUT,
            max_cm_retries: DEFAULT_MAX_CM_RETRIES,
            private_data: Vec::new(),
        }
    }
}

/// A peer's REQ as the passive side sees it (path from our side: the
/// local GID is ours).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqInfo {
    pub service_id: u64,
    pub remote_comm_id: u32,
    pub remote_ca_guid: u64,
    pub remote_qpn: u32,
    /// The PSN the peer expects first: our QP sends from it.
    pub starting_psn: u32,
    pub path: PathParams,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub pkey: u16,
}

/// The passive side's answer (REP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepParams {
    pub qpn: u32,
    /// The PSN this side expects first.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub private_data: Vec<u8>,
}

impl RepParams {
    /// Linux's values for the rest (target ACK delay 15, as captured).
    pub fn new(qpn: u32, starting_psn: u32) -> RepParams {
        RepParams {
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 15,
            rnr_retry_count: 7,
            srq: false,
            private_data: Vec::new(),
        }
    }
}

/// A peer's REP as the active side sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepInfo {
    pub remote_comm_id: u32,
    pub remote_ca_guid: u64,
    pub remote_qpn: u32,
    /// The PSN the peer expects first: our QP sends from it.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
}

/// A SIDR request: which QP serves `service_id` at `remote_gid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRequestParams {
    pub service_id: u64,
    pub local_gid: Gid,
    pub remote_gid: Gid,
    pub pkey: u16,
    /// Exponent of how long to wait for the SIDR_REP.
    pub timeout: u8,
    pub max_retries: u8,
    pub private_data: Vec<u8>,
}

/// The answer to a SIDR request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReplyParams {
    pub status: SidrStatus,
    pub qpn: u32,
    pub qkey: u32,
    pub private_data: Vec<u8>,
}
