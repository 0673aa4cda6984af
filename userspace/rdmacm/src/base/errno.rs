//! errno and the panic barrier of every C entry point
//! ([`xroce_cabi::errno`], shared with libibverbs).
//!
//! librdmacm's calls answer as rdma-core's do: `0`, or `-1` with errno set
//! (pointer-returning calls: NULL with errno set).

pub(crate) use xroce_cabi::errno::{errno, ffi, ffi_minus_one as ffi_int, ffi_ptr, set_errno};

/// A failure that also says why on stderr under XROCE_RDMACM_DEBUG or
/// XROCE_VERBS_DEBUG (programs only see the errno).
pub(crate) fn fail(errno: i32, why: impl std::fmt::Display) -> i32 {
    xroce_cabi::errno::fail("librdmacm", crate::base::config::debug(), errno, why)
}
