//! errno, return codes and the panic barrier of every C entry point.

use std::panic::{catch_unwind, AssertUnwindSafe};

use xroce::verbs::VerbsError;

pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The errno rdma-core's providers return for a failed verb.
pub(crate) fn errno_of(e: &VerbsError) -> i32 {
    match e {
        VerbsError::QueueFull(_) | VerbsError::NoResources(_) => libc::ENOMEM,
        VerbsError::Busy(_) => libc::EBUSY,
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

/// Runs the body of a C entry point: a panic must never unwind into C nor
/// abort the program, so it becomes `on_panic` with errno EIO.
pub(crate) fn ffi<R>(on_panic: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// A verb returning an `int` errno (0 on success), as most do.
pub(crate) fn ffi_int(body: impl FnOnce() -> Result<(), i32>) -> i32 {
    ffi(libc::EIO, || match body() {
        Ok(()) => 0,
        Err(e) => e,
    })
}

/// A verb returning a pointer: NULL with errno set on failure.
pub(crate) fn ffi_ptr<T>(body: impl FnOnce() -> Result<*mut T, i32>) -> *mut T {
    ffi(std::ptr::null_mut(), || match body() {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

/// A failed verb that should also say why on stderr when
/// XROCE_VERBS_DEBUG is set (programs only see the errno).
pub(crate) fn fail(errno: i32, why: impl std::fmt::Display) -> i32 {
    if crate::config::debug() {
        eprintln!("xroce libibverbs: {why} (errno {errno})");
    }
    errno
}

/// [`fail`] for a [`VerbsError`].
pub(crate) fn verbs_fail(e: VerbsError) -> i32 {
    fail(errno_of(&e), &e)
}
