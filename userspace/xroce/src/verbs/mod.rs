//! RDMA verbs with names an `ibv_*` programmer recognises:
//!
//! | ibverbs | xroce |
//! |---|---|
//! | `ibv_open_device` / `ibv_context` | [`Device::new`] / [`Device`] |
//! | `ibv_alloc_pd` | [`Device::alloc_pd`] |
//! | `ibv_reg_mr` / `ibv_dereg_mr` | [`ProtectionDomain::reg_mr`] / drop or [`MemoryRegion::dereg`] |
//! | `ibv_create_cq` / `ibv_poll_cq` | [`Device::create_cq`] / [`CompletionQueue::poll`] |
//! | `ibv_get_cq_event` | [`CompletionQueue::wait`], [`CompletionQueue::event_fd`] |
//! | `ibv_create_srq` / `ibv_post_srq_recv` | [`ProtectionDomain::create_srq`] / [`SharedReceiveQueue::post_recv`] |
//! | `ibv_create_qp` / `ibv_modify_qp` / `ibv_query_qp` | [`Device::create_qp`] / [`QueuePair::modify`] / [`QueuePair::query`] |
//! | `ibv_post_send` / `ibv_post_recv` | [`QueuePair::post_send`] / [`QueuePair::post_recv`] |
//!
//! The transport itself is [`crate::engine`], which knows nothing of this
//! layer: the types of work requests, completions, QP attributes and
//! memory regions are its own, re-exported here. An I/O backend drives it via
//! [`Device::lock`] (or the one-shot [`Device::handle_frame`],
//! [`Device::poll_transmit_frame`], [`Device::poll_timeout`], [`Device::handle_timeout`]).
//!
//! # Example: two devices, one RC connection, an RDMA WRITE
//!
//! ```
//! use xroce::verbs::sim::{sim_configs, LinkConfig, Sim, SimLink};
//! use xroce::verbs::*;
//!
//! let (cfg_a, cfg_b) = sim_configs(); // MAC + IPv4 of each host
//! let (dev_a, dev_b) = (Device::new(cfg_a.clone()), Device::new(cfg_b.clone()));
//! let (pd_a, pd_b) = (dev_a.alloc_pd(), dev_b.alloc_pd());
//! let (cq_a, cq_b) = (dev_a.create_cq(64).unwrap(), dev_b.create_cq(64).unwrap());
//! let qp_a = dev_a.create_qp(&pd_a, &QpInitAttr::rc(&cq_a)).unwrap();
//! let qp_b = dev_b.create_qp(&pd_b, &QpInitAttr::rc(&cq_b)).unwrap();
//! let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
//! let src = pd_a.reg_mr_with(b"hello, rdma", AccessFlags::LOCAL_WRITE).unwrap();
//! let dst = pd_b.reg_mr(4096, all).unwrap();
//!
//! // What each side learns out of band (QPN, initial PSN, address).
//! let attr = QpAttr {
//!     qp_access_flags: all,
//!     path_mtu: Mtu::Mtu1024,
//!     timeout: 14,      // 4.096 us * 2^14 = 67 ms
//!     retry_cnt: 7,
//!     rnr_retry: 7,
//!     min_rnr_timer: 12,
//!     max_rd_atomic: 4,
//!     max_dest_rd_atomic: 4,
//!     ..Default::default()
//! };
//! let av = |c: &xroce::engine::EngineConfig| AddressVector {
//!     dest_mac: c.mac,
//!     dest_ip: c.ip.into(),
//!     ..Default::default()
//! };
//! // RESET -> INIT -> RTR -> RTS (or QueuePair::modify step by step).
//! qp_a.connect(&attr, &RemoteQp { qpn: qp_b.qp_num(), psn: 0, av: av(&cfg_b) }).unwrap();
//! qp_b.connect(&attr, &RemoteQp { qpn: qp_a.qp_num(), psn: 0, av: av(&cfg_a) }).unwrap();
//!
//! qp_a.post_send(&SendWr::new(
//!     1,
//!     WrOpcode::RdmaWrite { remote_addr: dst.addr(), rkey: dst.rkey() },
//!     vec![src.sge(0, 11)],
//! )).unwrap();
//!
//! // Move frames: here a simulated link; in production an AF_XDP or UDP
//! // backend calling dev.lock().handle_datagram / poll_transmit / poll_timeout.
//! let mut sim = Sim::new(dev_a, dev_b, SimLink::new(LinkConfig::default(), 1));
//! assert!(sim.run_until(sim.now + 1_000_000_000, |_| !cq_a.is_empty()));
//! let wc = cq_a.poll_one().unwrap().unwrap();
//! assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
//! // SAFETY: the WRITE that targeted `dst` has completed.
//! assert_eq!(unsafe { dst.to_vec(0, 11) }.unwrap(), b"hello, rdma");
//! ```

pub mod cq;
pub mod device;
pub mod error;
pub mod pd;
mod post_ring;
pub mod qp;
pub mod sim;
pub mod srq;

pub use crate::engine::completion::{NetworkHdr, Wc, WcFlags, WcOpcode, WcStatus};
pub use crate::engine::memory::{AccessFlags, MemoryRegion, Rereg};
pub use crate::engine::work::{RecvWr, SendFlags, SendWr, Sge, UdAddress, WrOpcode};
pub use cq::CompletionQueue;
pub use device::{Device, DeviceGuard, DoorbellHook, Progress, ProgressHook};
pub use error::{TransportError, VerbsError};
pub use pd::ProtectionDomain;
pub use qp::{
    AddressVector, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair, RemoteQp,
};
pub use srq::SharedReceiveQueue;
