//! xroce: RDMA semantics in userspace over AF_XDP or a kernel UDP socket.
//!
//! - [`verbs`]: the ibv_*-like API: PDs, MRs, CQs, QPs, work requests.
//! - [`engine`] and [`cc`]: the sans-I/O transport and its congestion
//!   control, from the `xroce-transport` crate (re-exported here).
//! - [`io`]: packet I/O backends (AF_XDP, kernel UDP, in-memory channel).
//! - [`runtime`]: the thread that drives an engine from a backend.
//! - [`stack`]: one interface opened for RDMA (device, engine, backend, thread).
//! - [`stats_export`]: a running engine's counters for `xroce stats`.
//! - [`device`]: an Ethernet interface opened for RoCEv2.
//! - [`capture`]: pcap and pcapng files read packet by packet.
//! - [`connect`]: out-of-band connection setup (xroce, rdma-core formats).
//! - [`xdp`]: loads, attaches (rtnetlink, or libxdp's dispatcher beside other
//!   programs) and finds the XDP program and its maps through the interface.
//! - [`bottleneck`]: a port that really queues (tbf at the link rate, a TC
//!   program marking and dropping on its departure clock).
pub use xroce_transport::{cc, engine};

pub mod bottleneck;
pub mod capture;
pub mod capture_tap;
pub mod connect;
pub mod device;
pub mod io;
pub mod runtime;
pub mod stack;
pub mod stats_export;
pub mod verbs;
pub mod xdp;
