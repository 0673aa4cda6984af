//! InfiniBand connection management (IBTA vol.1 ch.12, as Linux's ib_cm
//! speaks it over RoCEv2) as a sans-I/O, deterministic state machine.
//!
//! [`CmEngine`] does no I/O, reads no clock and starts no threads: the
//! caller feeds it the MADs the GSI QP (QP1) receives ([`CmEngine::handle_mad`]),
//! the consumer's calls (`listen`, `connect`, `accept`, ...) and the time
//! ([`CmEngine::handle_timeout`]), and drains what it wants sent
//! ([`CmEngine::poll_transmit`]) and what happened ([`CmEngine::poll_event`]).
//! The MADs are built and parsed by xroce-wire's CM codec.
//!
//! Every connection ends in exactly one terminal event
//! ([`CmEvent::is_terminal`]) unless the consumer ends it itself
//! ([`CmEngine::reject`], [`CmEngine::sidr_reply`]).

mod config;
mod conn;
mod engine;
mod event;
mod ids;
mod params;
mod receive;
mod stats;

pub use config::{timeout_ns, CmConfig, PeerAddr, Transmit};
pub use conn::{ConnId, State};
pub use engine::{CmEngine, CmError};
pub use event::CmEvent;
pub use params::{
    ConnectParams, PathParams, RepInfo, RepParams, ReqInfo, SidrReplyParams, SidrRequestParams,
};
pub use stats::CmStats;
pub use xroce_wire::cm::{RejReason, SidrStatus};
