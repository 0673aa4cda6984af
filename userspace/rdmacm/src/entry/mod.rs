//! Layer 3: the exported calls (`#[no_mangle] extern "C"`), each with
//! what it alone needs, and the library's unload hook ([`exit`]). They
//! use the objects and `base`; nothing below imports them.

pub(crate) mod address;
pub(crate) mod addrinfo;
pub(crate) mod channel;
pub(crate) mod connect;
pub(crate) mod devices;
pub(crate) mod ep;
pub(crate) mod exit;
pub(crate) mod id;
pub(crate) mod listen;
pub(crate) mod qp;
pub(crate) mod teardown;
pub(crate) mod unsupported;
