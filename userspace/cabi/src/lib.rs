//! The C ABI xroce's two drop-in libraries share: `libibverbs.so.1`
//! (userspace/ibverbs) and `librdmacm.so.1` (userspace/rdmacm) are built
//! from the same rdma-core headers and answer C callers the same way.
//!
//! - [`verbs`]: the types of `<infiniband/verbs.h>`;
//! - [`rdma_cm`]: the types of `<rdma/rdma_cma.h>` and
//!   `<rdma/rdma_verbs.h>`, over [`verbs`]' (rdma_cma.h includes verbs.h);
//! - [`errno`]: errno and the panic barrier of every C entry point.
//!
//! Both type modules are bindgen output committed so that building xroce
//! needs no libclang; each module's docs give the exact command that made
//! it. This crate exports no symbols of its own (no `#[no_mangle]`): each
//! library's export set is exactly its entry points.

pub mod errno;
pub mod rdma_cm;
pub mod verbs;
