//! errno and return codes of the verbs (the panic barrier is
//! [`xroce_cabi::errno`], shared with librdmacm).

use xroce::verbs::{TransportError, VerbsError};
// A verb returns its errno as an `int` (0 on success).
pub(crate) use xroce_cabi::errno::{ffi, ffi_errno as ffi_int, ffi_ptr, set_errno};

/// The errno rdma-core's providers return for a failed verb.
pub(crate) fn errno_of(e: &VerbsError) -> i32 {
    match e {
        VerbsError::Transport(t) => match t {
            TransportError::QueueFull(_) | TransportError::NoResources(_) => libc::ENOMEM,
            TransportError::Busy(_) => libc::EBUSY,
            TransportError::AlreadyExists(_) => libc::EEXIST,
            TransportError::IllegalTransition { .. }
            | TransportError::MissingAttributes { .. }
            | TransportError::InvalidAttribute(..)
            | TransportError::BadQpState(_)
            | TransportError::TooManySge { .. }
            | TransportError::InlineTooLarge { .. }
            | TransportError::NoSuchQp(_)
            | TransportError::InvalidArgument(_) => libc::EINVAL,
        },
        VerbsError::Os(_) => libc::EIO,
        VerbsError::CqOverflow => libc::EINVAL,
    }
}

/// A failed verb that should also say why on stderr when
/// XROCE_VERBS_DEBUG is set (programs only see the errno).
pub(crate) fn fail(errno: i32, why: impl std::fmt::Display) -> i32 {
    xroce_cabi::errno::fail("libibverbs", crate::base::config::debug(), errno, why)
}

/// [`fail`] for a [`VerbsError`].
pub(crate) fn verbs_fail(e: impl Into<VerbsError>) -> i32 {
    let e = e.into();
    fail(errno_of(&e), &e)
}
