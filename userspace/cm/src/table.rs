//! The engine's connections, indexed the ways received MADs and timers look
//! them up, so that no MAD and no timer costs a scan of every connection (a
//! REQ flood must not cost O(n) per REQ).
//!
//! Fields that a key is made of change only through this table's setters:
//! `deadline` ([`ConnTable::set_deadline`]), `remote_qpn`
//! ([`ConnTable::set_remote_qpn`]) and the TIMEWAIT state
//! ([`ConnTable::enter_timewait`]); a connection's `active`, `peer`, and
//! (passive) `remote_comm_id`/`remote_ca_guid` never change after insertion.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use xroce_wire::Gid;

use crate::config::PeerAddr;
use crate::conn::{Conn, State};

#[derive(Debug, Default)]
pub(crate) struct ConnTable {
    conns: BTreeMap<u32, Conn>,
    /// Passive RC connections by the REQ that made them: (the peer's comm
    /// ID, its CA GUID). Unique: a REQ that matches is a duplicate.
    by_req: BTreeMap<(u32, u64), u32>,
    /// Connections that hold a peer's QP (all but TIMEWAIT and SIDR): (peer
    /// GID, remote QPN, local comm ID).
    by_peer_qp: BTreeSet<(Gid, u32, u32)>,
    /// Received SIDR requests by (request ID, peer).
    by_sidr_req: HashMap<(u32, PeerAddr), u32>,
    /// Armed timers: (deadline, local comm ID).
    timers: BTreeSet<(u64, u32)>,
}

fn holds_peer_qp(c: &Conn) -> bool {
    !matches!(
        c.state,
        State::Timewait | State::SidrReqRcvd | State::SidrReqSent
    )
}

fn req_key(c: &Conn) -> Option<(u32, u64)> {
    (!c.active && !matches!(c.state, State::SidrReqRcvd))
        .then_some((c.remote_comm_id, c.remote_ca_guid))
}

fn sidr_key(c: &Conn) -> Option<(u32, PeerAddr)> {
    (c.state == State::SidrReqRcvd).then_some((c.remote_comm_id, c.peer))
}

impl ConnTable {
    pub(crate) fn len(&self) -> usize {
        self.conns.len()
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        self.conns.contains_key(&id)
    }

    pub(crate) fn get(&self, id: u32) -> Option<&Conn> {
        self.conns.get(&id)
    }

    /// For every field but the keys (see the module doc).
    pub(crate) fn get_mut(&mut self, id: u32) -> Option<&mut Conn> {
        self.conns.get_mut(&id)
    }

    pub(crate) fn insert(&mut self, id: u32, c: Conn) {
        if let Some(old) = self.remove(id) {
            debug_assert!(false, "comm ID {id:#x} reused while live: {old:?}");
        }
        if let Some(k) = req_key(&c) {
            self.by_req.insert(k, id);
        }
        if let Some(k) = sidr_key(&c) {
            self.by_sidr_req.insert(k, id);
        }
        if holds_peer_qp(&c) {
            self.by_peer_qp.insert((c.peer.gid, c.remote_qpn, id));
        }
        if let Some(d) = c.deadline {
            self.timers.insert((d, id));
        }
        self.conns.insert(id, c);
    }

    pub(crate) fn remove(&mut self, id: u32) -> Option<Conn> {
        let c = self.conns.remove(&id)?;
        if let Some(k) = req_key(&c) {
            self.by_req.remove(&k);
        }
        if let Some(k) = sidr_key(&c) {
            self.by_sidr_req.remove(&k);
        }
        self.by_peer_qp.remove(&(c.peer.gid, c.remote_qpn, id));
        if let Some(d) = c.deadline {
            self.timers.remove(&(d, id));
        }
        Some(c)
    }

    pub(crate) fn set_deadline(&mut self, id: u32, deadline: Option<u64>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(d) = c.deadline {
            self.timers.remove(&(d, id));
        }
        if let Some(d) = deadline {
            self.timers.insert((d, id));
        }
        c.deadline = deadline;
    }

    pub(crate) fn set_remote_qpn(&mut self, id: u32, qpn: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if self.by_peer_qp.remove(&(c.peer.gid, c.remote_qpn, id)) {
            self.by_peer_qp.insert((c.peer.gid, qpn, id));
        }
        c.remote_qpn = qpn;
    }

    /// TIMEWAIT until `deadline`: the connection no longer holds the peer's QP.
    pub(crate) fn enter_timewait(&mut self, id: u32, deadline: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = State::Timewait;
        self.by_peer_qp.remove(&(c.peer.gid, c.remote_qpn, id));
        self.set_deadline(id, Some(deadline));
    }

    /// The passive connection a REQ with this comm ID and CA GUID made.
    pub(crate) fn by_req(&self, remote_comm_id: u32, remote_ca_guid: u64) -> Option<u32> {
        self.by_req.get(&(remote_comm_id, remote_ca_guid)).copied()
    }

    /// The passive connection a REQ with this comm ID made, from any CA
    /// when the GUID is not known.
    pub(crate) fn by_req_any_ca(&self, remote_comm_id: u32, guid: Option<u64>) -> Option<u32> {
        match guid {
            Some(g) => self.by_req(remote_comm_id, g),
            None => self
                .by_req
                .range((remote_comm_id, 0)..=(remote_comm_id, u64::MAX))
                .next()
                .map(|(_, id)| *id),
        }
    }

    /// Some connection other than TIMEWAIT or SIDR holds the peer's QP.
    /// A connection of ours to QP `qpn` of `gid`, if one exists.
    pub(crate) fn by_peer_qp(&self, gid: Gid, qpn: u32) -> Option<u32> {
        self.by_peer_qp
            .range((gid, qpn, 0)..=(gid, qpn, u32::MAX))
            .next()
            .map(|&(_, _, id)| id)
    }

    /// Whether a connection of ours with peer `gid` to service
    /// `service_id` is established (looked up through the peer's QPs).
    pub(crate) fn peer_established_on(&self, gid: Gid, service_id: u64) -> bool {
        self.by_peer_qp
            .range((gid, 0, 0)..=(gid, u32::MAX, u32::MAX))
            .filter_map(|&(_, _, id)| self.get(id))
            .any(|c| c.service_id == service_id && c.state == State::Established)
    }

    /// A SIDR request `request_id` from `peer` waits for the consumer.
    pub(crate) fn has_sidr_req(&self, request_id: u32, peer: PeerAddr) -> bool {
        self.by_sidr_req.contains_key(&(request_id, peer))
    }

    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.timers.first().map(|(d, _)| *d)
    }

    /// The connections whose timer expired by `now_ns`, earliest first.
    pub(crate) fn due(&self, now_ns: u64) -> Vec<u32> {
        self.timers
            .range(..=(now_ns, u32::MAX))
            .map(|(_, id)| *id)
            .collect()
    }

    /// Every index agrees with a scan of the connections (for tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let req: BTreeMap<(u32, u64), u32> = self
            .conns
            .iter()
            .filter_map(|(id, c)| req_key(c).map(|k| (k, *id)))
            .collect();
        assert_eq!(req, self.by_req);
        let peer_qp: BTreeSet<(Gid, u32, u32)> = self
            .conns
            .iter()
            .filter(|(_, c)| holds_peer_qp(c))
            .map(|(id, c)| (c.peer.gid, c.remote_qpn, *id))
            .collect();
        assert_eq!(peer_qp, self.by_peer_qp);
        let sidr: HashMap<(u32, PeerAddr), u32> = self
            .conns
            .iter()
            .filter_map(|(id, c)| sidr_key(c).map(|k| (k, *id)))
            .collect();
        assert_eq!(sidr, self.by_sidr_req);
        let timers: BTreeSet<(u64, u32)> = self
            .conns
            .iter()
            .filter_map(|(id, c)| c.deadline.map(|d| (d, *id)))
            .collect();
        assert_eq!(timers, self.timers);
    }
}
