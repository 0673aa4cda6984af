//! Layer 1, under the objects and the calls: what every C entry point
//! needs and nothing of the CM's objects (the C types themselves are
//! `crate::abi`).

pub(crate) mod config;
pub(crate) mod errno;
pub(crate) mod sockaddr;
pub(crate) mod verbs;
