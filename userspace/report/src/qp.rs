//! One QP's live state as its engine published it: a line of the engine's
//! file under /run/xroce, an entry of `xroce status --qps --json`, and the
//! source of the exporter's per-QP metrics.

use serde::{Deserialize, Serialize};

use crate::required;

/// A QP of a running engine (like a row of `rdma res show qp`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct QpStatus {
    pub qpn: u32,
    /// RC, UC or UD.
    #[serde(rename = "type")]
    pub qp_type: String,
    /// RESET, INIT, RTR, RTS, SQD, SQE or ERR.
    pub state: String,
    /// The peer's GID (an IPv4 peer as `::ffff:a.b.c.d`) and QPN; null for
    /// UD and before RTR.
    #[serde(deserialize_with = "required")]
    pub peer_gid: Option<String>,
    #[serde(deserialize_with = "required")]
    pub peer_qpn: Option<u32>,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Initial send PSN, next PSN to send, oldest PSN not yet acknowledged.
    pub sq_psn: u32,
    pub next_send_psn: u32,
    pub oldest_unacked_psn: u32,
    /// Initial receive PSN and the PSN the responder expects next.
    pub rq_psn: u32,
    pub expected_recv_psn: u32,
    /// PSNs sent and not yet acknowledged, and the most there may be.
    pub inflight_pkts: u32,
    pub send_window_pkts: u32,
    /// Send work requests not yet completed; receive work requests posted.
    pub send_queue: u32,
    pub recv_queue: u32,
    /// Congestion control and its pacing rate (bits per second).
    pub cc: String,
    pub rate_bps: u64,
    /// Last round-trip sample and the smoothed RTT, in nanoseconds; null
    /// before the first.
    #[serde(deserialize_with = "required")]
    pub last_rtt_ns: Option<u64>,
    #[serde(deserialize_with = "required")]
    pub srtt_ns: Option<u64>,
    /// Last fabric round trip, ns: the congestion controller's sample when
    /// the peer (another xroce) echoes its host delay, the time frames
    /// waited for the processes at both ends left out; null otherwise and
    /// in older files.
    #[serde(default)]
    pub last_fabric_rtt_ns: Option<u64>,
    /// Selective repeat in use: either half below runs it (else
    /// go-back-N both ways). xroce peers agree on it in band; a QP facing
    /// any other RoCE device stays go-back-N.
    pub selective_repeat: bool,
    /// The requester runs selective repeat (its WRITEs carry a RETH per
    /// packet, it reads SACKs); absent in older files.
    #[serde(default)]
    pub sr_requester: bool,
    /// The responder runs selective repeat (places WRITE packets ahead of
    /// the expected PSN, sends SACKs); absent in older files.
    #[serde(default)]
    pub sr_responder: bool,
    /// Data packets sent (requests and READ responses, retransmissions
    /// included) and their bytes.
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub retransmitted: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    pub rnr_naks_received: u64,
    pub seq_naks_received: u64,
    /// Packets received for this QP (after header checks).
    pub rx_packets: u64,
    pub ce_marked_received: u64,
    pub cnps_sent: u64,
    pub cnps_received: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_status_round_trips_and_nulls_are_required() {
        let json = r#"{"qpn":65553,"type":"RC","state":"RTS","peer_gid":"::ffff:10.0.0.2","peer_qpn":17,"mtu":1024,"sq_psn":5,"next_send_psn":9,"oldest_unacked_psn":9,"rq_psn":3,"expected_recv_psn":3,"inflight_pkts":0,"send_window_pkts":128,"send_queue":0,"recv_queue":0,"cc":"none","rate_bps":100000000000,"last_rtt_ns":null,"srtt_ns":null,"last_fabric_rtt_ns":null,"selective_repeat":false,"sr_requester":false,"sr_responder":false,"tx_packets":4,"tx_bytes":4300,"retransmitted":0,"timeouts":0,"rnr_naks_received":0,"seq_naks_received":0,"rx_packets":1,"ce_marked_received":0,"cnps_sent":0,"cnps_received":0}"#;
        let q: QpStatus = serde_json::from_str(json).unwrap();
        assert_eq!((q.qp_type.as_str(), q.peer_qpn), ("RC", Some(17)));
        assert_eq!(
            serde_json::to_value(&q).unwrap(),
            serde_json::from_str::<serde_json::Value>(json).unwrap()
        );
        let e =
            serde_json::from_str::<QpStatus>(&json.replace(r#""srtt_ns":null,"#, "")).unwrap_err();
        assert!(e.to_string().contains("missing field `srtt_ns`"), "{e}");
        // A file from before the halves and the fabric round trip were
        // reported.
        let old = json
            .replace(r#""sr_requester":false,"sr_responder":false,"#, "")
            .replace(r#""last_fabric_rtt_ns":null,"#, "");
        assert!(!old.contains("sr_requester") && !old.contains("fabric"));
        assert_eq!(serde_json::from_str::<QpStatus>(&old).unwrap(), q);
    }
}
