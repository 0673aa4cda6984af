//! xroce-transport: RDMA's transport without I/O.
//!
//! - [`engine`]: every QP of one device: RC (requester, responder,
//!   completer, selective repeat), UC and UD over IPv4 and IPv6. Frames go
//!   in and out as bytes; time comes in as nanoseconds; completions and
//!   events leave as values.
//! - [`cc`]: congestion control (the reaction point: DCQCN, TIMELY, Swift)
//!   behind one trait, and the pacer that holds each QP to its rate.
//!
//! The crate performs no syscalls and reads no clock, so loss,
//! reordering, duplication and timeouts are tested in simulation
//! ([`engine::sim`]) with the same seed giving the same run. The `xroce`
//! crate drives it from AF_XDP or a UDP socket.
pub mod cc;
pub mod engine;
