//! xroce: RDMA semantics in userspace over AF_XDP.
//!
//! - [`verbs`]: the ibv_*-like API: PDs, MRs, CQs, QPs, work requests.
//! - [`engine`]: the sans-I/O RC transport (requester, responder, completer).
//! - [`cc`]: congestion control (reaction point) behind one trait.
//! - [`io`]: packet I/O backends (AF_XDP, kernel UDP, in-memory channel).
//! - [`runtime`]: the thread that drives an engine from a backend.
//! - [`stack`]: one interface opened for RDMA (device, engine, backend, thread).
//! - [`stats_export`]: a running engine's counters for `xroce stats`.
//! - [`device`]: an Ethernet interface opened for RoCEv2.
//! - [`capture`]: pcap and pcapng files read packet by packet.
//! - [`connect`]: out-of-band connection setup (xroce, rdma-core formats).
//! - [`xdp`]: loads, attaches, pins and reads the XDP program.
//! - [`bottleneck`]: a port that really queues (tbf at the link rate, a TC
//!   program marking and dropping on its departure clock).
pub mod bottleneck;
pub mod capture;
pub mod cc;
pub mod connect;
pub mod device;
pub mod engine;
pub mod io;
pub mod runtime;
pub mod stack;
pub mod stats_export;
pub mod verbs;
pub mod xdp;
