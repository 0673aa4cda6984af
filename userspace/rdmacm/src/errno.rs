//! errno, return codes and the panic barrier of every C entry point.
//!
//! librdmacm's calls answer as rdma-core's do: `0`, or `-1` with errno set
//! (pointer-returning calls: NULL with errno set).

use std::panic::{catch_unwind, AssertUnwindSafe};

pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
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

/// A call returning `int`: 0, or -1 with errno the `Err`.
pub(crate) fn ffi_int(body: impl FnOnce() -> Result<(), i32>) -> i32 {
    ffi(-1, || match body() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

/// A call returning a pointer: NULL with errno set on failure.
pub(crate) fn ffi_ptr<T>(body: impl FnOnce() -> Result<*mut T, i32>) -> *mut T {
    ffi(std::ptr::null_mut(), || match body() {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

/// A failure that also says why on stderr under XROCE_RDMACM_DEBUG or
/// XROCE_VERBS_DEBUG (programs only see the errno).
pub(crate) fn fail(errno: i32, why: impl std::fmt::Display) -> i32 {
    if crate::config::debug() {
        eprintln!("xroce librdmacm: {why} (errno {errno})");
    }
    errno
}
