//! errno and return codes of the verbs (the panic barrier is
//! [`xroce_cabi::errno`], shared with librdmacm).

use xroce::verbs::VerbsError;
// A verb returns its errno as an `int` (0 on success).
pub(crate) use xroce_cabi::errno::{ffi, ffi_errno as ffi_int, ffi_ptr, set_errno};

/// The errno rdma-core's providers return for a failed verb.
pub(crate) fn errno_of(e: &VerbsError) -> i32 {
    match e {
        VerbsError::QueueFull(_) | VerbsError::NoResources(_) => libc::ENOMEM,
        VerbsError::Busy(_) => libc::EBUSY,
        VerbsError::AlreadyExists(_) => libc::EEXIST,
        VerbsError::Unsupported(_) => libc::EOPNOTSUPP,
        VerbsError::Os(_) => libc::EIO,
        VerbsError::IllegalTransition { .. }
        | VerbsError::MissingAttributes { .. }
        | VerbsError::AttributeNotAllowed { .. }
        | VerbsError::InvalidAttribute(..)
        | VerbsError::BadQpState(_)
        | VerbsError::TooManySge { .. }
        | VerbsError::InlineTooLarge { .. }
        | VerbsError::NoSuchQp(_)
        | VerbsError::CqOverflow
        | VerbsError::InvalidArgument(_) => libc::EINVAL,
    }
}

/// A failed verb that should also say why on stderr when
/// XROCE_VERBS_DEBUG is set (programs only see the errno).
pub(crate) fn fail(errno: i32, why: impl std::fmt::Display) -> i32 {
    xroce_cabi::errno::fail("libibverbs", crate::config::debug(), errno, why)
}

/// [`fail`] for a [`VerbsError`].
pub(crate) fn verbs_fail(e: VerbsError) -> i32 {
    fail(errno_of(&e), &e)
}
