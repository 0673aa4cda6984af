//! MAD reception: each CM message against the state of the connection it
//! names, as ib_cm answers it (duplicates resent, strays dropped and
//! counted).

use xroce_wire::cm::{
    CmMadRepr, CmMessage, CommIdsRepr, DreqRepr, MessageRef, MraRepr, RejReason, RejRepr, RepRepr,
    ReqRepr, SidrRepRepr, SidrReqRepr, SidrStatus,
};
use xroce_wire::mad::METHOD_SEND;
use xroce_wire::Gid;

use crate::config::{timeout_ns, PeerAddr};
use crate::conn::{Conn, ConnId, State};
use crate::engine::{build, CmEngine};
use crate::event::CmEvent;
use crate::params::{PathParams, RepInfo, ReqInfo};

impl CmEngine {
    /// A MAD the GSI QP received from `from` on our `local_gid` (the
    /// frame's destination GID) at `now_ns`.
    pub fn handle_mad(&mut self, from: PeerAddr, local_gid: Gid, mad: &[u8], now_ns: u64) {
        self.stats.received += 1;
        let m = match CmMadRepr::parse(mad) {
            // Every CM message is a Send; anything else is not ours.
            Ok(m) if m.header.method == METHOD_SEND => m,
            _ => {
                self.stats.malformed += 1;
                return;
            }
        };
        let tid = m.header.transaction_id;
        match m.message {
            CmMessage::Req(r) => self.on_req(from, local_gid, tid, &r, now_ns),
            CmMessage::Mra(r) => self.on_mra(&r, now_ns),
            CmMessage::Rej(r) => self.on_rej(&r),
            CmMessage::Rep(r) => self.on_rep(&r),
            CmMessage::Rtu(r) => self.on_rtu(&r),
            CmMessage::Dreq(r) => self.on_dreq(from, local_gid, tid, &r, now_ns),
            CmMessage::Drep(r) => self.on_drep(&r, now_ns),
            CmMessage::SidrReq(r) => self.on_sidr_req(from, local_gid, tid, &r),
            CmMessage::SidrRep(r) => self.on_sidr_rep(&r),
            CmMessage::Lap(_) | CmMessage::Apr(_) => self.stats.unsupported += 1,
        }
    }

    /// The connection a message names by our comm ID (`ours`) and, once
    /// known, the peer's (`theirs`).
    fn named(&mut self, ours: u32, theirs: u32) -> Option<&mut Conn> {
        match self.conns.get_mut(ours) {
            Some(c) if c.remote_comm_id == 0 || c.remote_comm_id == theirs => Some(c),
            _ => {
                self.stats.unknown_comm_id += 1;
                None
            }
        }
    }

    fn resend(&mut self, id: u32) {
        if let Some(c) = self.conns.get(id) {
            if let Some(mad) = c.sent {
                let (gid, peer) = (c.local_gid, c.peer);
                self.push(gid, peer, mad);
            }
        }
    }

    fn on_req(&mut self, from: PeerAddr, local_gid: Gid, tid: u64, r: &ReqRepr, now_ns: u64) {
        // A retransmitted REQ: answer again what we answered, never report
        // it twice.
        let dup = self
            .conns
            .by_req(r.local_comm_id, r.local_ca_guid)
            .and_then(|id| Some((id, self.conns.get(id)?.state)));
        if let Some((id, state)) = dup {
            self.stats.duplicates += 1;
            match state {
                State::MraReqSent | State::RepSent | State::MraRepRcvd => self.resend(id),
                State::Timewait => {
                    self.reject_req(from, local_gid, tid, id, r, RejReason::StaleConn)
                }
                _ => {}
            }
            return;
        }
        // The peer's QP already belongs to a connection of ours: the REQ
        // is from after a restart, or the old connection is stale. As
        // Linux's ib_cm: reject it, and take an old connection that is
        // still up down (DREQ), so that the peer's next try finds none.
        if let Some(old) = self.conns.by_peer_qp(from.gid, r.local_qpn) {
            self.stats.req_stale += 1;
            self.reject_req(from, local_gid, tid, 0, r, RejReason::StaleConn);
            if self
                .conns
                .get(old)
                .is_some_and(|c| c.state == State::Established)
            {
                let _ = self.disconnect(ConnId(old), &[], now_ns);
            }
            return;
        }
        if !self.listeners.contains_key(&r.service_id) {
            // A peer with a connection to this service up asks again (a
            // second connection, as perftest -R's data QP after its
            // control QP): its consumer may be listening anew right now.
            // Unanswered, the REQ comes again after its timeout and finds
            // the listener; a REJ would end the peer's attempt for a race
            // of microseconds.
            if self.conns.peer_established_on(from.gid, r.service_id) {
                self.stats.req_no_listener_held += 1;
                return;
            }
            self.stats.req_no_listener += 1;
            // As Linux: no comm ID was ever allocated for it.
            self.reject_req(from, local_gid, tid, 0, r, RejReason::InvalidServiceId);
            return;
        }
        let our_gid = r.primary_path.remote_gid;
        if !self.config.local_gids.contains(&our_gid) {
            self.stats.req_invalid_gid += 1;
            self.reject_req(from, local_gid, tid, 0, r, RejReason::InvalidGid);
            return;
        }
        if !self.take_backlog(r.service_id) {
            // Linux (ucma's backlog): dropped without a REJ, so that the
            // peer's retransmission may find room.
            self.stats.req_backlog_full += 1;
            return;
        }
        let id = self.allocate_id();
        let p = &r.primary_path;
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                active: false,
                remote_comm_id: r.local_comm_id,
                remote_ca_guid: r.local_ca_guid,
                service_id: r.service_id,
                peer: from,
                local_gid: our_gid,
                tid,
                local_qpn: 0,
                remote_qpn: r.local_qpn,
                backlog_of: Some(r.service_id),
                sent: None,
                // How long the peer takes to answer our REP or DREQ.
                response_timeout_ns: timeout_ns(r.local_cm_response_timeout),
                max_retries: r.max_cm_retries,
                retries_left: r.max_cm_retries,
                deadline: None,
                timewait_ns: timeout_ns(p.local_ack_timeout),
                destroyed: false,
            },
        );
        let req = ReqInfo {
            service_id: r.service_id,
            remote_comm_id: r.local_comm_id,
            remote_ca_guid: r.local_ca_guid,
            remote_qpn: r.local_qpn,
            starting_psn: r.starting_psn,
            path: PathParams {
                local_gid: p.remote_gid,
                remote_gid: p.local_gid,
                mtu: r.path_mtu,
                flow_label: p.flow_label,
                traffic_class: p.traffic_class,
                hop_limit: p.hop_limit,
                sl: p.sl,
                local_ack_timeout: p.local_ack_timeout,
            },
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            pkey: r.pkey,
        };
        self.event(CmEvent::ConnectRequest {
            conn: ConnId(id),
            listener: r.service_id,
            peer: from,
            req,
            private_data: r.private_data.to_vec(),
        });
    }

    /// REJ of a REQ we keep no connection for (`local_comm_id` 0 then).
    fn reject_req(
        &mut self,
        from: PeerAddr,
        local_gid: Gid,
        tid: u64,
        local_comm_id: u32,
        r: &ReqRepr,
        reason: RejReason,
    ) {
        let rej = RejRepr {
            local_comm_id,
            remote_comm_id: r.local_comm_id,
            message_rejected: MessageRef::Req,
            reason,
            ari: &[],
            private_data: &[],
        };
        if let Ok(mad) = build(tid, CmMessage::Rej(rej)) {
            self.push(local_gid, from, mad);
        }
    }

    fn on_mra(&mut self, r: &MraRepr, now_ns: u64) {
        let Some(c) = self.named(r.remote_comm_id, r.local_comm_id) else {
            return;
        };
        let next = match (c.state, r.message_mraed) {
            (State::ReqSent, MessageRef::Req) => State::MraReqRcvd,
            (State::RepSent, MessageRef::Rep) => State::MraRepRcvd,
            (State::MraReqRcvd | State::MraRepRcvd, _) => {
                self.stats.duplicates += 1;
                return;
            }
            _ => {
                self.stats.unexpected += 1;
                return;
            }
        };
        c.state = next;
        if c.active {
            // A passive connection's peer comm ID is its index key, known
            // since the REQ.
            c.remote_comm_id = r.local_comm_id;
        }
        // The peer promised an answer within its service timeout.
        let deadline = now_ns
            .saturating_add(timeout_ns(r.service_timeout))
            .saturating_add(c.response_timeout_ns);
        let id = r.remote_comm_id;
        self.conns.set_deadline(id, Some(deadline));
    }

    fn on_rej(&mut self, r: &RejRepr) {
        // A REQ withdrawn before we answered names only the peer's comm ID
        // (and its CA GUID in the ARI).
        let id = if r.remote_comm_id == 0 {
            let guid = (r.ari.len() == 8).then(|| u64::from_be_bytes(r.ari.try_into().unwrap()));
            self.conns.by_req_any_ca(r.local_comm_id, guid).unwrap_or(0)
        } else {
            r.remote_comm_id
        };
        let Some(c) = self.named(id, r.local_comm_id) else {
            return;
        };
        if !matches!(
            c.state,
            State::ReqSent
                | State::MraReqRcvd
                | State::ReqRcvd
                | State::MraReqSent
                | State::RepSent
                | State::MraRepRcvd
                | State::RepRcvd
                | State::Established
        ) {
            self.stats.unexpected += 1;
            return;
        }
        let c = self.conns.remove(id).expect("named");
        self.release_backlog(c.backlog_of);
        if c.destroyed {
            return;
        }
        self.event(CmEvent::Rejected {
            conn: ConnId(id),
            reason: r.reason,
            private_data: r.private_data.to_vec(),
        });
    }

    fn on_rep(&mut self, r: &RepRepr) {
        let id = r.remote_comm_id;
        let Some(c) = self.named(id, r.local_comm_id) else {
            return;
        };
        match c.state {
            State::ReqSent | State::MraReqRcvd => {}
            State::Established if c.active => {
                // Our RTU was lost: send it again.
                self.stats.duplicates += 1;
                self.resend(id);
                return;
            }
            State::RepRcvd => {
                self.stats.duplicates += 1;
                return;
            }
            _ => {
                self.stats.unexpected += 1;
                return;
            }
        }
        if r.local_qpn <= 1 || r.local_comm_id == 0 {
            // QP0/QP1 cannot be connected; nor can a peer without comm ID.
            let rej = RejRepr {
                local_comm_id: id,
                remote_comm_id: r.local_comm_id,
                message_rejected: MessageRef::Rep,
                reason: RejReason::InvalidCommId,
                ari: &[],
                private_data: &[],
            };
            let c = self.conns.remove(id).expect("named");
            if let Ok(mad) = build(c.tid, CmMessage::Rej(rej)) {
                self.push(c.local_gid, c.peer, mad);
            }
            self.event(CmEvent::ConnectError {
                conn: ConnId(id),
                reason: RejReason::InvalidCommId,
            });
            return;
        }
        c.state = State::RepRcvd;
        c.remote_comm_id = r.local_comm_id;
        c.remote_ca_guid = r.local_ca_guid;
        self.conns.set_deadline(id, None);
        self.conns.set_remote_qpn(id, r.local_qpn);
        let rep = RepInfo {
            remote_comm_id: r.local_comm_id,
            remote_ca_guid: r.local_ca_guid,
            remote_qpn: r.local_qpn,
            starting_psn: r.starting_psn,
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            target_ack_delay: r.target_ack_delay,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
        };
        self.event(CmEvent::ConnectResponse {
            conn: ConnId(id),
            rep,
            private_data: r.private_data.to_vec(),
        });
    }

    fn on_rtu(&mut self, r: &CommIdsRepr) {
        let id = r.remote_comm_id;
        let Some(c) = self.named(id, r.local_comm_id) else {
            return;
        };
        match c.state {
            State::RepSent | State::MraRepRcvd => {
                c.state = State::Established;
                self.conns.set_deadline(id, None);
                self.event(CmEvent::Established { conn: ConnId(id) });
            }
            State::Established => self.stats.duplicates += 1,
            _ => self.stats.unexpected += 1,
        }
    }

    fn on_dreq(&mut self, from: PeerAddr, local_gid: Gid, tid: u64, r: &DreqRepr, now_ns: u64) {
        let id = r.remote_comm_id;
        let known = self
            .conns
            .get(id)
            .is_some_and(|c| c.remote_comm_id == r.local_comm_id);
        if !known {
            // The spec's answer to a DREQ for a connection we do not have
            // (any more): a DREP, so the peer can leave.
            self.stats.unknown_comm_id += 1;
            let drep = CommIdsRepr {
                local_comm_id: r.remote_comm_id,
                remote_comm_id: r.local_comm_id,
                private_data: &[],
            };
            if let Ok(mad) = build(tid, CmMessage::Drep(drep)) {
                self.push(local_gid, from, mad);
            }
            return;
        }
        let c = self.conns.get_mut(id).expect("known");
        if r.remote_qpn != c.local_qpn && c.local_qpn != 0 {
            // Not about our QP (as ib_cm, dropped).
            self.stats.unexpected += 1;
            return;
        }
        match c.state {
            State::Established | State::RepSent | State::MraRepRcvd | State::RepRcvd => {
                c.state = State::DreqRcvd;
                // The DREP answers this transaction.
                c.tid = tid;
                self.conns.set_deadline(id, None);
                self.event(CmEvent::DisconnectRequest {
                    conn: ConnId(id),
                    private_data: r.private_data.to_vec(),
                });
            }
            State::DreqSent => {
                // Both sides disconnect at once: answer, and our own
                // disconnect is complete too.
                c.tid = tid;
                self.answer_dreq(id);
                self.enter_timewait(id, now_ns);
                self.event(CmEvent::Disconnected { conn: ConnId(id) });
            }
            State::Timewait => {
                self.stats.duplicates += 1;
                c.tid = tid;
                self.answer_dreq(id);
            }
            State::DreqRcvd => self.stats.duplicates += 1,
            _ => self.stats.unexpected += 1,
        }
    }

    /// Sends the DREP for the DREQ whose transaction is in `tid`.
    fn answer_dreq(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let drep = CommIdsRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            private_data: &[],
        };
        if let Ok(mad) = build(c.tid, CmMessage::Drep(drep)) {
            c.sent = Some(mad);
            let (gid, peer) = (c.local_gid, c.peer);
            self.push(gid, peer, mad);
        }
    }

    fn on_drep(&mut self, r: &CommIdsRepr, now_ns: u64) {
        let id = r.remote_comm_id;
        let Some(c) = self.named(id, r.local_comm_id) else {
            return;
        };
        match c.state {
            State::DreqSent => {
                self.enter_timewait(id, now_ns);
                self.event(CmEvent::Disconnected { conn: ConnId(id) });
            }
            State::Timewait => self.stats.duplicates += 1,
            _ => self.stats.unexpected += 1,
        }
    }

    fn on_sidr_req(&mut self, from: PeerAddr, local_gid: Gid, tid: u64, r: &SidrReqRepr) {
        if self.conns.has_sidr_req(r.request_id, from) {
            self.stats.duplicates += 1;
            return;
        }
        if !self.listeners.contains_key(&r.service_id) {
            self.stats.sidr_no_listener += 1;
            let rep = SidrRepRepr {
                request_id: r.request_id,
                status: SidrStatus::ServiceIdNotSupported,
                vendor_id: 0,
                qpn: 0,
                service_id: r.service_id,
                qkey: 0,
                additional_info: &[],
                private_data: &[],
            };
            if let Ok(mad) = build(tid, CmMessage::SidrRep(rep)) {
                self.push(local_gid, from, mad);
            }
            return;
        }
        if !self.take_backlog(r.service_id) {
            self.stats.req_backlog_full += 1;
            return;
        }
        let id = self.allocate_id();
        self.conns.insert(
            id,
            Conn {
                state: State::SidrReqRcvd,
                active: false,
                remote_comm_id: r.request_id,
                remote_ca_guid: 0,
                service_id: r.service_id,
                peer: from,
                local_gid,
                tid,
                local_qpn: 0,
                remote_qpn: 0,
                backlog_of: Some(r.service_id),
                sent: None,
                response_timeout_ns: 0,
                max_retries: 0,
                retries_left: 0,
                deadline: None,
                timewait_ns: 0,
                destroyed: false,
            },
        );
        self.event(CmEvent::SidrRequest {
            conn: ConnId(id),
            listener: r.service_id,
            peer: from,
            pkey: r.pkey,
            private_data: r.private_data.to_vec(),
        });
    }

    fn on_sidr_rep(&mut self, r: &SidrRepRepr) {
        let id = r.request_id;
        match self.conns.get(id) {
            Some(c) if c.state == State::SidrReqSent && c.service_id == r.service_id => {}
            Some(_) => {
                self.stats.unexpected += 1;
                return;
            }
            None => {
                self.stats.unknown_comm_id += 1;
                return;
            }
        }
        self.conns.remove(id);
        self.event(CmEvent::SidrResponse {
            conn: ConnId(id),
            status: r.status,
            qpn: r.qpn,
            qkey: r.qkey,
            private_data: r.private_data.to_vec(),
        });
    }
}
