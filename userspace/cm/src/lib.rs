//! InfiniBand connection management (IBTA vol.1 ch.12, as Linux's ib_cm
//! speaks it over RoCEv2) as a sans-I/O, deterministic state machine.
//!
//! [`CmEngine`] does no I/O, reads no clock and starts no threads: the
//! caller feeds it the MADs the GSI QP (QP1, Q_Key 0x80010000) receives
//! ([`CmEngine::handle_mad`]), the consumer's calls and the time
//! ([`CmEngine::handle_timeout`] when [`CmEngine::poll_timeout`] is due), and
//! drains what to send ([`CmEngine::poll_transmit`]: a 256-byte MAD, the
//! local GID to send it from and the peer's GSI QP) and what happened
//! ([`CmEngine::poll_event`]). The MADs are xroce-wire's CM codec.
//!
//! Connections (named by their local comm ID, [`ConnId`]) move through
//! ib_cm's states ([`State`]):
//!
//! ```text
//! active:  connect -> ReqSent -(MRA)-> MraReqRcvd -(REP)-> RepRcvd
//!          -establish (RTU)-> Established
//! passive: REQ -> ReqRcvd -(mra)-> MraReqSent -accept (REP)-> RepSent
//!          -(MRA)-> MraRepRcvd -(RTU | establish)-> Established
//! either:  Established -disconnect (DREQ)-> DreqSent -(DREP)-> Timewait
//!          DreqSent -(every retry unanswered)-> Timewait (DisconnectTimeout)
//!          Established -(DREQ)-> DreqRcvd -disconnect (DREP)-> Timewait
//!          Timewait -(timer)-> gone (TimewaitExit)
//! SIDR:    sidr_request -> SidrReqSent -(SIDR_REP)-> gone (SidrResponse)
//!          SIDR_REQ -> SidrReqRcvd -sidr_reply-> gone
//! ```
//!
//! Linux's conventions, as the rxe captures show them: the TID of a
//! transaction we start is `tid_high << 32 | local comm ID byte-swapped`,
//! REP/RTU/REJ/MRA answer the REQ's TID and DREP its DREQ's; a REQ for a
//! service nobody listens on gets REJ 8 with local comm ID 0; retransmission
//! every 4.096 µs × 2^(CM response timeout), `max_cm_retries` times.
//!
//! Every connection ends in exactly one terminal event
//! ([`CmEvent::is_terminal`]) unless the consumer ends it itself
//! ([`CmEngine::reject`], [`CmEngine::sidr_reply`], [`CmEngine::destroy`]).
//! States that wait for the consumer have no timer of their own: ReqRcvd,
//! MraReqSent and RepRcvd end when the peer gives up (its REJ "timeout"
//! arrives as `Rejected`); DreqRcvd and SidrReqRcvd wait for `disconnect`,
//! `sidr_reply` or `destroy`.

mod config;
mod conn;
mod engine;
mod event;
#[cfg(test)]
mod flood_tests;
mod ids;
mod params;
mod receive;
mod stats;
mod table;

pub use config::{timeout_ns, CmConfig, PeerAddr, Transmit};
pub use conn::{ConnId, State};
pub use engine::{CmEngine, CmError, MAX_BACKLOG};
pub use event::CmEvent;
pub use params::{
    ConnectParams, PathParams, RepInfo, RepParams, ReqInfo, SidrReplyParams, SidrRequestParams,
};
pub use stats::CmStats;
pub use xroce_wire::cm::{RejReason, SidrStatus};
