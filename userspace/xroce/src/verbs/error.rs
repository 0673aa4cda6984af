//! Errors returned by verbs calls: the engine's refusals and the verbs
//! layer's own (work-completion errors are [`super::WcStatus`]).

pub use crate::engine::error::TransportError;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum VerbsError {
    /// The engine refused the call (bad state, attribute, queue full...).
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("completion queue overflowed: completions were lost; the attached QPs were moved to ERR (recreate the CQ with a larger depth)")]
    CqOverflow,
    #[error("system call failed: {0}")]
    Os(String),
}

pub type Result<T, E = VerbsError> = core::result::Result<T, E>;
