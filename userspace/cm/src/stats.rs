//! Counters of what the engine received, sent and dropped.

/// Every MAD the engine drops is counted under one reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs handed to `handle_mad`.
    pub received: u64,
    /// MADs queued for sending (retransmissions included).
    pub sent: u64,
    /// Retransmissions after a timeout.
    pub retransmits: u64,
    /// Did not parse as a CM MAD (wrong class, version, length, ...).
    pub malformed: u64,
    /// LAP/APR (path migration): not supported, dropped.
    pub unsupported: u64,
    /// Named a comm ID (or SIDR request ID) we do not have.
    pub unknown_comm_id: u64,
    /// A message the connection's state does not expect.
    pub unexpected: u64,
    /// A REQ/REP/DREQ/SIDR_REQ seen again (answered again or dropped).
    pub duplicates: u64,
    /// REQ for a service nobody listens on (answered with REJ 8).
    pub req_no_listener: u64,
    /// REQ for a service nobody listens on from a peer with a connection
    /// to it up: left unanswered, its retransmission may find a listener.
    pub req_no_listener_held: u64,
    /// REQ from a peer QP that already has a live connection with us
    /// (answered with REJ 10, stale connection).
    pub req_stale: u64,
    /// REQ naming a GID that is not ours (answered with REJ 12).
    pub req_invalid_gid: u64,
    /// REQ or SIDR_REQ dropped because the listener's backlog was full
    /// (no REJ, so the peer's retransmission can get in later).
    pub req_backlog_full: u64,
    /// SIDR_REQ for a service nobody listens on (SIDR_REP status 1).
    pub sidr_no_listener: u64,
}
