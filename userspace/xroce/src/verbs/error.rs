//! Errors returned by verbs calls: the engine's (work-completion errors
//! are [`super::WcStatus`]).

pub use crate::engine::error::{Result, VerbsError};
