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
//! The transport itself is [`crate::engine`]; an I/O backend drives it via
//! [`Device::lock`] (or the one-shot [`Device::handle_frame`],
//! [`Device::poll_transmit`], [`Device::poll_timeout`], [`Device::handle_timeout`]).

pub mod cq;
pub mod device;
pub mod error;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod srq;
pub mod wc;
pub mod wr;

pub use cq::CompletionQueue;
pub use device::{Device, DeviceGuard, QpInitAttr, QueuePair, RemoteQp};
pub use error::VerbsError;
pub use mr::{AccessFlags, MemoryRegion};
pub use pd::ProtectionDomain;
pub use qp::{AddressVector, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType};
pub use srq::SharedReceiveQueue;
pub use wc::{Wc, WcFlags, WcOpcode, WcStatus};
pub use wr::{RecvWr, SendFlags, SendWr, Sge, WrOpcode};
