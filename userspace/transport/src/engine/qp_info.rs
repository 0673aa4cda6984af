//! A read-only snapshot of each live QP's transport state, for
//! `xroce status --qps` and the Prometheus exporter (like `ss -i` or
//! rdma-core's `rdma res show qp`): taken under the engine's lock, it
//! changes nothing.

use std::net::{IpAddr, Ipv6Addr};

use super::qp_attr::{QpState, QpType};
use super::{Engine, QpCtx, QpStats};

/// One QP as [`Engine::qp_infos`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: u32,
    pub qp_type: QpType,
    pub state: QpState,
    /// The peer's GID (an IPv4 peer as its IPv4-mapped GID) and QPN; None
    /// for UD (a peer per work request) and before RTR.
    pub peer_gid: Option<Ipv6Addr>,
    pub peer_qpn: Option<u32>,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Initial send PSN (`sq_psn`), next PSN to send, oldest PSN not yet
    /// acknowledged.
    pub sq_psn: u32,
    pub next_send_psn: u32,
    pub oldest_unacked_psn: u32,
    /// Initial receive PSN (`rq_psn`) and the PSN the responder expects.
    pub rq_psn: u32,
    pub expected_recv_psn: u32,
    /// PSNs sent and not yet acknowledged (RC in RTS/SQD/SQE).
    pub inflight_pkts: u32,
    /// Most PSNs that may be unacknowledged (the send window).
    pub send_window_pkts: u32,
    /// Send WRs not yet completed; receive WRs posted.
    pub send_queue: u32,
    pub recv_queue: u32,
    /// The congestion controller and its pacing rate.
    pub cc: &'static str,
    pub rate_bps: u64,
    /// The last round-trip sample and the smoothed RTT (RFC 6298).
    pub last_rtt_ns: Option<u64>,
    pub srtt_ns: Option<u64>,
    /// The last fabric round trip, the congestion controller's sample,
    /// when the peer echoes its host delay (another xroce; see
    /// `engine::delay_echo`).
    pub last_fabric_rtt_ns: Option<u64>,
    /// How the QP agrees on selective repeat.
    pub sr_mode: super::selective::SrMode,
    /// The requester runs selective repeat (else go-back-N): its WRITEs
    /// carry a RETH per packet and it reads SACKs.
    pub sr_requester: bool,
    /// The responder runs selective repeat (else go-back-N): it places
    /// WRITE packets ahead and sends SACKs.
    pub sr_responder: bool,
    /// Retransmits, timeouts, NAKs received, packets and bytes.
    pub counters: QpStats,
}

/// The peer's address as a GID: IPv4 becomes `::ffff:a.b.c.d`.
fn gid_of(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

impl QpCtx {
    fn info(&self, max_inflight_pkts: u32) -> QpInfo {
        let connected = self.qp_type != QpType::Ud
            && matches!(
                self.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            );
        let sending = self.qp_type == QpType::Rc
            && matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe);
        let inflight = if sending {
            xroce_wire::psn_diff(self.req.max_psn, self.req.comp_psn).max(0) as u32
        } else {
            0
        };
        QpInfo {
            qpn: self.qpn,
            qp_type: self.qp_type,
            state: self.state,
            peer_gid: connected.then(|| gid_of(self.attr.ah_attr.dest_ip)),
            peer_qpn: connected.then_some(self.attr.dest_qp_num),
            mtu: self.mtu,
            sq_psn: self.attr.sq_psn,
            next_send_psn: self.req.psn,
            oldest_unacked_psn: self.req.comp_psn,
            rq_psn: self.attr.rq_psn,
            expected_recv_psn: self.resp.epsn,
            inflight_pkts: inflight,
            send_window_pkts: self.send_window_pkts(max_inflight_pkts),
            send_queue: self.sq.len() as u32,
            recv_queue: self.rq.len() as u32,
            cc: self.cc.name(),
            rate_bps: self.cc.rate_bps(),
            last_rtt_ns: self.req.last_rtt_ns,
            srtt_ns: self.req.srtt_ns,
            last_fabric_rtt_ns: self.req.last_fabric_rtt_ns,
            sr_mode: self.sr_mode,
            sr_requester: self.sr_req.is_some(),
            sr_responder: self.sr_resp.is_some(),
            counters: self.qstats,
        }
    }
}

impl Engine {
    /// A snapshot of every live QP, by QPN.
    pub fn qp_infos(&self) -> Vec<QpInfo> {
        let w = self.cfg.max_inflight_pkts;
        let mut out: Vec<QpInfo> = self.qps.iter().flatten().map(|q| q.info(w)).collect();
        out.sort_by_key(|q| q.qpn);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sim::{connect_engines, EngineHost, LinkConfig, PairParams, Sim};
    use crate::engine::work::{SendWr, WrOpcode};

    #[test]
    fn snapshot_follows_a_write_between_two_engines() {
        let mut sim = Sim::engine_pair(LinkConfig::default(), 5);
        let p = PairParams {
            psn_a: 0xff_fffe,
            psn_b: 77,
            ..Default::default()
        };
        let (a, b) = connect_engines(&sim, &p);
        let qa = EngineHost::lock(&sim.a).qp_infos();
        assert_eq!(qa.len(), 1, "{qa:?}");
        let qa = &qa[0];
        assert_eq!(
            (qa.qpn, qa.qp_type, qa.state),
            (a.qpn, QpType::Rc, QpState::Rts)
        );
        assert_eq!(qa.peer_qpn, Some(b.qpn));
        assert_eq!(qa.peer_gid, Some("::ffff:10.0.0.2".parse().unwrap()));
        assert_eq!(
            (qa.sq_psn, qa.next_send_psn, qa.rq_psn),
            (0xff_fffe, 0xff_fffe, 77)
        );
        assert_eq!((qa.mtu, qa.send_window_pkts, qa.cc), (1024, 128, "none"));
        assert_eq!(
            (qa.last_rtt_ns, qa.sr_requester, qa.sr_responder),
            (None, false, false)
        );

        // One WRITE of 3 packets at a 1024-byte MTU (the PSNs wrap).
        let wr = SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(0, 3000)],
        );
        EngineHost::lock(&sim.a).post_send(a.qpn, &wr).unwrap();
        let inflight = EngineHost::lock(&sim.a).qp_infos()[0].send_queue;
        assert_eq!(inflight, 1, "the WR waits in the send queue");
        let mut done = Vec::new();
        let deadline = sim.now + 1_000_000_000;
        assert!(sim.run_until(deadline, |s| {
            EngineHost::lock(&s.a).take_completions(&mut done);
            !done.is_empty()
        }));
        let qa = EngineHost::lock(&sim.a).qp_infos().remove(0);
        let qb = EngineHost::lock(&sim.b).qp_infos().remove(0);
        assert_eq!(qa.next_send_psn, 1, "0xfffffe + 3 wrapped");
        assert_eq!(qa.oldest_unacked_psn, 1, "all acknowledged");
        assert_eq!((qa.inflight_pkts, qa.send_queue), (0, 0));
        assert_eq!(qb.expected_recv_psn, 1);
        assert_eq!((qb.rq_psn, qb.peer_qpn), (0xff_fffe, Some(a.qpn)));
        assert_eq!(qb.peer_gid, Some("::ffff:10.0.0.1".parse().unwrap()));
        assert_eq!((qa.counters.tx_packets, qa.counters.retransmitted), (3, 0));
        assert_eq!(qb.counters.rx_packets, 3);
        let rtt = qa.last_rtt_ns.expect("the ACK gave an RTT sample");
        assert_eq!(
            qa.srtt_ns,
            Some(rtt),
            "the first sample is the smoothed RTT"
        );
    }
}
