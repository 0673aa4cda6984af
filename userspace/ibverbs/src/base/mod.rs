//! Layer 1, under the objects and the verbs: what every C entry point
//! needs and nothing of xroce's objects (the C types themselves are
//! `crate::abi`).

pub(crate) mod config;
pub(crate) mod errno;
pub(crate) mod handles;
pub(crate) mod limits;
pub(crate) mod mapping;
