//! The engine: the consumer's calls, the timers, and the queues of MADs to
//! send and events to report. MAD reception is in receive.rs.

use std::collections::{BTreeMap, VecDeque};

use std::fmt;

use xroce_wire::cm::{
    CmMadRepr, CmMessage, CommIdsRepr, DreqRepr, MessageRef, MraRepr, PathRepr, RejReason, RejRepr,
    RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr, TransportType,
};
use xroce_wire::mad::{MadError, MAD_LEN};
use xroce_wire::Gid;

use crate::config::{timeout_ns, CmConfig, PeerAddr, Transmit};
use crate::conn::{Conn, ConnId, State};
use crate::event::CmEvent;
use crate::ids::CommIds;
use crate::params::{ConnectParams, RepParams, SidrReplyParams, SidrRequestParams};
use crate::stats::CmStats;
use crate::table::ConnTable;

/// Why a consumer call was refused (nothing was sent, nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// No live connection has that ID.
    UnknownConn(ConnId),
    /// The call does not apply in the connection's state.
    WrongState(State),
    /// Someone already listens on the service ID.
    AlreadyListening(u64),
    /// Nobody listens on the service ID.
    NotListening(u64),
    /// The local GID is not one of ours.
    NotLocalGid(Gid),
    /// The message cannot be built (private data too long, a field too wide).
    Mad(MadError),
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::UnknownConn(c) => write!(f, "no connection with comm ID {:#x}", c.0),
            CmError::WrongState(s) => write!(f, "not allowed in state {s:?}"),
            CmError::AlreadyListening(s) => write!(f, "service ID {s:#x} already has a listener"),
            CmError::NotListening(s) => write!(f, "nobody listens on service ID {s:#x}"),
            CmError::NotLocalGid(g) => write!(f, "GID {} is not local", g.hex()),
            CmError::Mad(e) => write!(f, "cannot build the MAD: {e}"),
        }
    }
}

impl std::error::Error for CmError {}

impl From<MadError> for CmError {
    fn from(e: MadError) -> Self {
        CmError::Mad(e)
    }
}

/// The most requests a listener keeps waiting for the consumer: Linux's
/// `net.rdma_ucm.max_backlog` default, which ucma's `rdma_listen` uses for
/// a backlog of 0, a negative one, or a larger one.
pub const MAX_BACKLOG: usize = 1024;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Listener {
    pub(crate) backlog: usize,
    pub(crate) pending: usize,
}

/// IB connection management for one port's GSI QP.
#[derive(Debug)]
pub struct CmEngine {
    pub(crate) config: CmConfig,
    ids: CommIds,
    pub(crate) conns: ConnTable,
    pub(crate) listeners: BTreeMap<u64, Listener>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<CmEvent>,
    pub(crate) stats: CmStats,
}

impl CmEngine {
    pub fn new(config: CmConfig) -> CmEngine {
        CmEngine {
            ids: CommIds::new(config.seed, config.first_comm_id),
            config,
            conns: ConnTable::default(),
            listeners: BTreeMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// The state of a live connection.
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.conns.get(conn.0).map(|c| c.state)
    }

    /// How many connections the engine still tracks (TIMEWAIT included).
    pub fn live_connections(&self) -> usize {
        self.conns.len()
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// A MAD waits in [`CmEngine::poll_transmit`].
    pub fn has_transmit(&self) -> bool {
        !self.transmits.is_empty()
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// Accept REQs and SIDR_REQs for `service_id`; at most `backlog` may
    /// wait for the consumer's answer at once, more are dropped (counted in
    /// `req_backlog_full`). 0 or more than [`MAX_BACKLOG`] means
    /// [`MAX_BACKLOG`], as ucma's `rdma_listen` caps it.
    ///
    /// Linux frees a backlog slot when the program fetches the event; here
    /// the slot is held until the consumer answers (accept, reject or
    /// destroy; an MRA keeps it) or the peer withdraws, so that requests
    /// nobody answers cannot pile up either.
    pub fn listen(&mut self, service_id: u64, backlog: usize) -> Result<(), CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        let backlog = if backlog == 0 || backlog > MAX_BACKLOG {
            MAX_BACKLOG
        } else {
            backlog
        };
        self.listeners.insert(
            service_id,
            Listener {
                backlog,
                pending: 0,
            },
        );
        Ok(())
    }

    /// The service IDs listened on now (ascending): what a process that
    /// shares its device's QP1 registers with the QP1 holder.
    pub fn listening(&self) -> impl Iterator<Item = u64> + '_ {
        self.listeners.keys().copied()
    }

    /// Stop listening; connections already reported stay.
    pub fn unlisten(&mut self, service_id: u64) -> Result<(), CmError> {
        self.listeners
            .remove(&service_id)
            .map(|_| ())
            .ok_or(CmError::NotListening(service_id))
    }

    /// Sends a REQ; the answer comes as `ConnectResponse`, `Rejected` or
    /// `Unreachable`.
    pub fn connect(&mut self, p: &ConnectParams, now_ns: u64) -> Result<ConnId, CmError> {
        self.check_local_gid(p.path.local_gid)?;
        let id = self.allocate_id();
        let tid = self.tid(id);
        let path = &p.path;
        let req = ReqRepr {
            local_comm_id: id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.config.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.cm_response_timeout,
            transport_type: TransportType::Rc,
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.cm_response_timeout,
            retry_count: p.retry_count,
            pkey: 0xffff,
            path_mtu: path.mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: PathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: path.local_gid,
                remote_gid: path.remote_gid,
                flow_label: path.flow_label,
                packet_rate: 0,
                traffic_class: path.traffic_class,
                hop_limit: path.hop_limit,
                sl: path.sl,
                subnet_local: false,
                local_ack_timeout: path.local_ack_timeout,
            },
            alternate_path: None,
            sap_supported: false,
            private_data: &p.private_data,
        };
        let mad = build(tid, CmMessage::Req(req))?;
        let peer = PeerAddr::gsi(path.remote_gid);
        let response_timeout_ns = timeout_ns(p.cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                active: true,
                remote_comm_id: 0,
                remote_ca_guid: 0,
                service_id: p.service_id,
                peer,
                local_gid: path.local_gid,
                tid,
                local_qpn: p.qpn,
                remote_qpn: 0,
                backlog_of: None,
                sent: Some(mad),
                response_timeout_ns,
                max_retries: p.max_cm_retries,
                retries_left: p.max_cm_retries,
                deadline: Some(now_ns.saturating_add(response_timeout_ns)),
                timewait_ns: timeout_ns(path.local_ack_timeout),
                destroyed: false,
            },
        );
        self.push(path.local_gid, peer, mad);
        Ok(ConnId(id))
    }

    /// Answers a `ConnectRequest` with REP; `Established` follows the RTU.
    pub fn accept(&mut self, conn: ConnId, p: &RepParams, now_ns: u64) -> Result<(), CmError> {
        let ca_guid = self.config.ca_guid;
        let c = self.conn_in(conn, &[State::ReqRcvd, State::MraReqSent])?;
        let rep = RepRepr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: ca_guid,
            private_data: &p.private_data,
        };
        let mad = build(c.tid, CmMessage::Rep(rep))?;
        c.state = State::RepSent;
        c.local_qpn = p.qpn;
        c.sent = Some(mad);
        c.retries_left = c.max_retries;
        let deadline = now_ns.saturating_add(c.response_timeout_ns);
        let (gid, peer, listener) = (c.local_gid, c.peer, c.backlog_of.take());
        self.conns.set_deadline(conn.0, Some(deadline));
        self.release_backlog(listener);
        self.push(gid, peer, mad);
        Ok(())
    }

    /// Consumer reject (REJ reason 28) of a REQ we were asked about or a
    /// REP we received; the connection is gone afterwards. A SIDR request
    /// is answered with status "rejected".
    pub fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conn_in(
            conn,
            &[
                State::ReqRcvd,
                State::MraReqSent,
                State::RepRcvd,
                State::SidrReqRcvd,
            ],
        )?;
        if c.state == State::SidrReqRcvd {
            let reply = SidrReplyParams {
                status: xroce_wire::cm::SidrStatus::Rejected,
                qpn: 0,
                qkey: 0,
                private_data: private_data.to_vec(),
            };
            return self.sidr_reply(conn, &reply);
        }
        let message_rejected = if c.state == State::RepRcvd {
            MessageRef::Rep
        } else {
            MessageRef::Req
        };
        let rej = RejRepr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            message_rejected,
            reason: RejReason::ConsumerDefined,
            ari: &[],
            private_data,
        };
        let mad = build(c.tid, CmMessage::Rej(rej))?;
        let c = self.conns.remove(conn.0).expect("checked above");
        self.release_backlog(c.backlog_of);
        self.push(c.local_gid, c.peer, mad);
        Ok(())
    }

    /// Tells the peer of a REQ that the answer will take a while (MRA):
    /// its REQ timer becomes 4.096 µs × 2^`service_timeout` longer, and
    /// duplicates of the REQ are answered with this MRA.
    pub fn mra(&mut self, conn: ConnId, service_timeout: u8) -> Result<(), CmError> {
        let c = self.conn_in(conn, &[State::ReqRcvd])?;
        let mra = MraRepr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            message_mraed: MessageRef::Req,
            service_timeout,
            private_data: &[],
        };
        let mad = build(c.tid, CmMessage::Mra(mra))?;
        c.state = State::MraReqSent;
        c.sent = Some(mad);
        let (gid, peer) = (c.local_gid, c.peer);
        self.push(gid, peer, mad);
        Ok(())
    }

    /// Active side, after `ConnectResponse`: sends RTU, the connection is
    /// established. Passive side, while waiting for the RTU: the QP saw the
    /// peer's traffic (communication established), so the RTU is not needed.
    pub fn establish(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conn_in(conn, &[State::RepRcvd, State::RepSent, State::MraRepRcvd])?;
        if c.state == State::RepRcvd {
            let rtu = CommIdsRepr {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                private_data,
            };
            let mad = build(c.tid, CmMessage::Rtu(rtu))?;
            c.sent = Some(mad);
            let (gid, peer) = (c.local_gid, c.peer);
            self.push(gid, peer, mad);
        }
        let c = self.conns.get_mut(conn.0).expect("checked above");
        c.state = State::Established;
        self.conns.set_deadline(conn.0, None);
        self.events.push_back(CmEvent::Established { conn });
        Ok(())
    }

    /// Established: sends DREQ (`Disconnected` follows the DREP). After a
    /// `DisconnectRequest`: answers with DREP. Either way TIMEWAIT follows,
    /// then `TimewaitExit`.
    pub fn disconnect(
        &mut self,
        conn: ConnId,
        private_data: &[u8],
        now_ns: u64,
    ) -> Result<(), CmError> {
        let c = self.conn_in(
            conn,
            &[
                State::Established,
                State::RepSent,
                State::MraRepRcvd,
                State::DreqRcvd,
            ],
        )?;
        if c.state == State::DreqRcvd {
            let drep = CommIdsRepr {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                private_data,
            };
            // The DREP answers the DREQ's transaction, kept in `tid`.
            let mad = build(c.tid, CmMessage::Drep(drep))?;
            c.sent = Some(mad);
            let (gid, peer) = (c.local_gid, c.peer);
            self.push(gid, peer, mad);
            self.enter_timewait(conn.0, now_ns);
            return Ok(());
        }
        let dreq = DreqRepr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            private_data,
        };
        let tid = self.tid(conn.0);
        let mad = build(tid, CmMessage::Dreq(dreq))?;
        let c = self.conns.get_mut(conn.0).expect("checked above");
        c.state = State::DreqSent;
        c.tid = tid;
        c.sent = Some(mad);
        c.retries_left = c.max_retries;
        let deadline = now_ns.saturating_add(c.response_timeout_ns);
        let (gid, peer) = (c.local_gid, c.peer);
        self.conns.set_deadline(conn.0, Some(deadline));
        self.push(gid, peer, mad);
        Ok(())
    }

    /// Asks which UD QP serves a service (SIDR_REQ); `SidrResponse` or
    /// `Unreachable` follows.
    pub fn sidr_request(&mut self, p: &SidrRequestParams, now_ns: u64) -> Result<ConnId, CmError> {
        self.check_local_gid(p.local_gid)?;
        let id = self.allocate_id();
        let tid = self.tid(id);
        let req = SidrReqRepr {
            request_id: id,
            pkey: p.pkey,
            service_id: p.service_id,
            private_data: &p.private_data,
        };
        let mad = build(tid, CmMessage::SidrReq(req))?;
        let peer = PeerAddr::gsi(p.remote_gid);
        let response_timeout_ns = timeout_ns(p.timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::SidrReqSent,
                active: true,
                remote_comm_id: 0,
                remote_ca_guid: 0,
                service_id: p.service_id,
                peer,
                local_gid: p.local_gid,
                tid,
                local_qpn: 0,
                remote_qpn: 0,
                backlog_of: None,
                sent: Some(mad),
                response_timeout_ns,
                max_retries: p.max_retries,
                retries_left: p.max_retries,
                deadline: Some(now_ns.saturating_add(response_timeout_ns)),
                timewait_ns: 0,
                destroyed: false,
            },
        );
        self.push(p.local_gid, peer, mad);
        Ok(ConnId(id))
    }

    /// Answers a `SidrRequest` (SIDR_REP); the request is gone afterwards.
    pub fn sidr_reply(&mut self, conn: ConnId, p: &SidrReplyParams) -> Result<(), CmError> {
        let c = self.conn_in(conn, &[State::SidrReqRcvd])?;
        let service_id = c.service_id;
        let rep = SidrRepRepr {
            request_id: c.remote_comm_id,
            status: p.status,
            vendor_id: 0,
            qpn: p.qpn,
            service_id,
            qkey: p.qkey,
            additional_info: &[],
            private_data: &p.private_data,
        };
        let mad = build(c.tid, CmMessage::SidrRep(rep))?;
        let c = self.conns.remove(conn.0).expect("checked above");
        self.release_backlog(c.backlog_of);
        self.push(c.local_gid, c.peer, mad);
        Ok(())
    }

    /// The earliest time `handle_timeout` has something to do.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.conns.next_deadline()
    }

    /// Retransmits, gives up, and leaves TIMEWAIT for every timer that
    /// expired by `now_ns`.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        for id in self.conns.due(now_ns) {
            self.expire(id, now_ns);
        }
    }

    fn expire(&mut self, id: u32, now_ns: u64) {
        let conn = ConnId(id);
        self.conns.set_deadline(id, None);
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if c.state == State::Timewait {
            let c = self.conns.remove(id).expect("present");
            if !c.destroyed {
                self.events.push_back(CmEvent::TimewaitExit { conn });
            }
            return;
        }
        if !c.state.retransmits() {
            return;
        }
        if c.retries_left > 0 {
            c.retries_left -= 1;
            let deadline = now_ns.saturating_add(c.response_timeout_ns);
            let resend = c.sent.map(|mad| (c.local_gid, c.peer, mad));
            self.conns.set_deadline(id, Some(deadline));
            if let Some((gid, peer, mad)) = resend {
                self.stats.retransmits += 1;
                self.push(gid, peer, mad);
            }
            return;
        }
        // Every retry went unanswered.
        if c.state == State::DreqSent {
            self.enter_timewait(id, now_ns);
            self.events.push_back(CmEvent::DisconnectTimeout { conn });
        } else {
            let c = self.conns.remove(id).expect("present");
            // The IBTA's answer to a REQ or REP that timed out: REJ
            // "timeout", so the peer forgets it too.
            let message_rejected = match c.state {
                State::ReqSent | State::MraReqRcvd => Some(MessageRef::Req),
                State::RepSent | State::MraRepRcvd => Some(MessageRef::Rep),
                _ => None,
            };
            if let Some(message_rejected) = message_rejected {
                if let Ok(mad) = self.rej(id, &c, message_rejected, RejReason::Timeout) {
                    self.push(c.local_gid, c.peer, mad);
                }
            }
            self.release_backlog(c.backlog_of);
            self.events.push_back(CmEvent::Unreachable { conn });
        }
    }

    /// Forgets a connection the way ib_cm's destroy does: a pending REQ
    /// is withdrawn with REJ "timeout", a pending answer with REJ 28, an
    /// established connection gets a DREQ and a DREQ our DREP; what was
    /// connected lingers in TIMEWAIT (without events) so its comm ID is not
    /// reused too early. No event follows for it.
    pub fn destroy(&mut self, conn: ConnId, now_ns: u64) -> Result<(), CmError> {
        let c = self.conns.get(conn.0).ok_or(CmError::UnknownConn(conn))?;
        let state = c.state;
        let (mad, linger) = match state {
            State::ReqSent | State::MraReqRcvd => (
                Some(self.rej(conn.0, c, MessageRef::Req, RejReason::Timeout)?),
                false,
            ),
            State::ReqRcvd | State::MraReqSent => (
                Some(self.rej(conn.0, c, MessageRef::Req, RejReason::ConsumerDefined)?),
                false,
            ),
            State::RepSent | State::MraRepRcvd | State::RepRcvd => (
                Some(self.rej(conn.0, c, MessageRef::Rep, RejReason::ConsumerDefined)?),
                false,
            ),
            State::Established => {
                let dreq = DreqRepr {
                    local_comm_id: conn.0,
                    remote_comm_id: c.remote_comm_id,
                    remote_qpn: c.remote_qpn,
                    private_data: &[],
                };
                (Some(build(self.tid(conn.0), CmMessage::Dreq(dreq))?), true)
            }
            State::DreqRcvd => {
                let drep = CommIdsRepr {
                    local_comm_id: conn.0,
                    remote_comm_id: c.remote_comm_id,
                    private_data: &[],
                };
                (Some(build(c.tid, CmMessage::Drep(drep))?), true)
            }
            State::DreqSent | State::Timewait => (None, true),
            State::SidrReqSent => (None, false),
            State::SidrReqRcvd => {
                let reply = SidrReplyParams {
                    status: xroce_wire::cm::SidrStatus::Rejected,
                    qpn: 0,
                    qkey: 0,
                    private_data: Vec::new(),
                };
                return self.sidr_reply(conn, &reply);
            }
        };
        let c = self.conns.get_mut(conn.0).expect("present");
        c.destroyed = true;
        if let Some(mad) = mad {
            c.sent = Some(mad);
            let (gid, peer) = (c.local_gid, c.peer);
            self.push(gid, peer, mad);
        }
        if !linger {
            let c = self.conns.remove(conn.0).expect("present");
            self.release_backlog(c.backlog_of);
        } else if state != State::Timewait {
            self.enter_timewait(conn.0, now_ns);
        }
        Ok(())
    }

    /// Our REJ of connection `id`'s REQ or REP; a timeout's carries our CA
    /// GUID (how the peer finds a request it has not answered yet).
    fn rej(
        &self,
        id: u32,
        c: &Conn,
        message_rejected: MessageRef,
        reason: RejReason,
    ) -> Result<[u8; MAD_LEN], MadError> {
        let guid = self.config.ca_guid.to_be_bytes();
        let ari: &[u8] = if reason == RejReason::Timeout {
            &guid
        } else {
            &[]
        };
        let rej = RejRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            message_rejected,
            reason,
            ari,
            private_data: &[],
        };
        build(c.tid, CmMessage::Rej(rej))
    }

    pub(crate) fn enter_timewait(&mut self, id: u32, now_ns: u64) {
        if let Some(c) = self.conns.get(id) {
            let deadline = now_ns.saturating_add(c.timewait_ns);
            self.conns.enter_timewait(id, deadline);
        }
    }

    /// Counts one more pending request against the listener of
    /// `service_id`; false (nothing counted) when its backlog is full.
    pub(crate) fn take_backlog(&mut self, service_id: u64) -> bool {
        match self.listeners.get_mut(&service_id) {
            Some(l) if l.pending < l.backlog => {
                l.pending += 1;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn release_backlog(&mut self, listener: Option<u64>) {
        if let Some(l) = listener.and_then(|s| self.listeners.get_mut(&s)) {
            l.pending = l.pending.saturating_sub(1);
        }
    }

    pub(crate) fn allocate_id(&mut self) -> u32 {
        let conns = &self.conns;
        self.ids.allocate(|id| conns.contains(id))
    }

    /// The transaction ID of a transaction we start: Linux's layout.
    pub(crate) fn tid(&self, local_comm_id: u32) -> u64 {
        (u64::from(self.config.tid_high) << 32) | u64::from(local_comm_id.swap_bytes())
    }

    fn check_local_gid(&self, gid: Gid) -> Result<(), CmError> {
        if self.config.local_gids.contains(&gid) {
            Ok(())
        } else {
            Err(CmError::NotLocalGid(gid))
        }
    }

    fn conn_in(&mut self, conn: ConnId, states: &[State]) -> Result<&mut Conn, CmError> {
        let c = self
            .conns
            .get_mut(conn.0)
            .ok_or(CmError::UnknownConn(conn))?;
        if !states.contains(&c.state) {
            return Err(CmError::WrongState(c.state));
        }
        Ok(c)
    }

    pub(crate) fn push(&mut self, local_gid: Gid, peer: PeerAddr, mad: [u8; MAD_LEN]) {
        self.stats.sent += 1;
        self.transmits.push_back(Transmit {
            local_gid,
            peer,
            mad,
        });
    }

    pub(crate) fn event(&mut self, e: CmEvent) {
        self.events.push_back(e);
    }
}

/// One CM MAD with `tid`, as bytes.
pub(crate) fn build(tid: u64, message: CmMessage<'_>) -> Result<[u8; MAD_LEN], MadError> {
    let mut mad = [0u8; MAD_LEN];
    CmMadRepr::new(tid, message).emit(&mut mad)?;
    Ok(mad)
}
