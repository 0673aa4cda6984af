//! xroce: RDMA semantics in userspace over AF_XDP.
//!
//! - [`cc`]: congestion control (reaction point) behind one trait.
//! - [`xdp`]: loads, attaches, pins and reads the XDP program.
pub mod cc;
pub mod io;
pub mod xdp;
pub mod verbs;
pub mod engine;
pub mod device;
pub mod connect;
