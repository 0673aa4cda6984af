//! The per-QP lines of an engine's published file: `qp v1 {JSON}`, one
//! per live QP, the JSON an [`xroce_report::QpStatus`]. Readers that know
//! only `name value` counter lines skip them (their value is no number);
//! a later format gets a new version word, which this reader skips.

use xroce_report::QpStatus;

use crate::engine::qp_attr::{QpState, QpType};
use crate::engine::qp_info::QpInfo;

/// Key of a QP line.
pub(super) const KEY: &str = "qp";
/// The format of this reader and writer.
const VERSION: &str = "v1";

/// `ibv_qp_state` as rdma-core's tools spell it.
pub fn state_name(s: QpState) -> &'static str {
    match s {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Sqe => "SQE",
        QpState::Err => "ERR",
    }
}

fn type_name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "RC",
        QpType::Uc => "UC",
        QpType::Ud => "UD",
    }
}

/// What `xroce status --qps` and the exporter show of `q`.
pub fn status_of(q: &QpInfo) -> QpStatus {
    let c = &q.counters;
    QpStatus {
        qpn: q.qpn,
        qp_type: type_name(q.qp_type).into(),
        state: state_name(q.state).into(),
        peer_gid: q.peer_gid.map(|g| g.to_string()),
        peer_qpn: q.peer_qpn,
        mtu: q.mtu,
        sq_psn: q.sq_psn,
        next_send_psn: q.next_send_psn,
        oldest_unacked_psn: q.oldest_unacked_psn,
        rq_psn: q.rq_psn,
        expected_recv_psn: q.expected_recv_psn,
        inflight_pkts: q.inflight_pkts,
        send_window_pkts: q.send_window_pkts,
        send_queue: q.send_queue,
        recv_queue: q.recv_queue,
        cc: q.cc.into(),
        rate_bps: q.rate_bps,
        last_rtt_ns: q.last_rtt_ns,
        srtt_ns: q.srtt_ns,
        last_fabric_rtt_ns: q.last_fabric_rtt_ns,
        selective_repeat: q.sr_requester || q.sr_responder,
        sr_requester: q.sr_requester,
        sr_responder: q.sr_responder,
        tx_packets: c.tx_packets,
        tx_bytes: c.tx_bytes,
        retransmitted: c.retransmitted,
        timeouts: c.timeouts,
        rnr_naks_received: c.rnr_naks_received,
        seq_naks_received: c.seq_naks_received,
        rx_packets: c.rx_packets,
        ce_marked_received: c.ce_marked_received,
        cnps_sent: c.cnps_sent,
        cnps_received: c.cnps_received,
    }
}

/// The line of one QP (with its newline).
pub(super) fn render(q: &QpStatus) -> String {
    let json = serde_json::to_string(q).expect("a QpStatus always serializes");
    format!("{KEY} {VERSION} {json}\n")
}

/// The QP of a line's value (what follows `qp `); None for another
/// version or a line cut short.
pub(super) fn parse(value: &str) -> Option<QpStatus> {
    let json = value.strip_prefix(VERSION)?.strip_prefix(' ')?;
    serde_json::from_str(json).ok()
}
