//! Why the engine refuses a call (post, modify, create); failures of the
//! work itself are a completion's [`super::completion::WcStatus`]. The
//! verbs layer above wraps it with its own errors (a CQ overflow, a failed
//! syscall).

use super::qp_attr::QpState;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TransportError {
    #[error("illegal QP state transition {from:?} -> {to:?} (IBTA 10.3.1); move the QP through RESET -> INIT -> RTR -> RTS")]
    IllegalTransition { from: QpState, to: QpState },
    #[error("modify QP {from:?} -> {to:?} is missing required attributes {missing}; set them in the attribute mask")]
    MissingAttributes {
        from: QpState,
        to: QpState,
        missing: &'static str,
    },
    #[error("invalid value for {0}: {1}")]
    InvalidAttribute(&'static str, String),
    #[error("cannot post to a QP in state {0:?}")]
    BadQpState(QpState),
    #[error("queue full: {0} (raise max_send_wr / max_recv_wr / max_wr)")]
    QueueFull(&'static str),
    #[error("too many scatter/gather entries: {got} > {max}")]
    TooManySge { got: usize, max: usize },
    #[error("inline data of {got} bytes exceeds max_inline_data {max}")]
    InlineTooLarge { got: usize, max: usize },
    #[error("unknown QP number {0:#x}")]
    NoSuchQp(u32),
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    #[error("out of resources: {0}")]
    NoResources(&'static str),
    #[error("already exists: {0}")]
    AlreadyExists(&'static str),
    #[error("the object is still in use: {0}")]
    Busy(&'static str),
}

pub type Result<T, E = TransportError> = core::result::Result<T, E>;
