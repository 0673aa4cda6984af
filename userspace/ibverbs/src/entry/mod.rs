//! Layer 3: the exported entry points (`#[no_mangle] extern "C"`) and the
//! functions they install in `context->ops`, `struct verbs_context`,
//! `struct ibv_cq_ex` and `struct ibv_qp_ex`. They use the objects and
//! `base`; nothing below imports them.

pub(crate) mod ah;
pub(crate) mod async_event;
pub(crate) mod context;
pub(crate) mod cq;
pub(crate) mod mr;
pub(crate) mod post;
pub(crate) mod qp;
pub(crate) mod query;
pub(crate) mod srq;
pub(crate) mod strings;
pub(crate) mod unsupported;
pub(crate) mod wr_builder;
