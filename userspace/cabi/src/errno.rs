//! errno and the panic barrier of every C entry point of the drop-in
//! libraries.
//!
//! rdma-core's two libraries report failure differently: most verbs
//! return the errno itself ([`ffi_errno`]); librdmacm's calls return `-1`
//! with errno set ([`ffi_minus_one`]). Pointer-returning calls of both
//! return NULL with errno set ([`ffi_ptr`]).

use std::panic::{catch_unwind, AssertUnwindSafe};

pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Runs the body of a C entry point: a panic must never unwind into C nor
/// abort the program, so it becomes `on_panic` with errno EIO.
pub fn ffi<R>(on_panic: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// A call returning its errno as an `int` (0 on success), as most verbs do.
pub fn ffi_errno(body: impl FnOnce() -> Result<(), i32>) -> i32 {
    ffi(libc::EIO, || match body() {
        Ok(()) => 0,
        Err(e) => e,
    })
}

/// A call returning `int` the librdmacm way: 0, or -1 with errno the `Err`.
pub fn ffi_minus_one(body: impl FnOnce() -> Result<(), i32>) -> i32 {
    ffi(-1, || match body() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

/// A call returning a pointer: NULL with errno set on failure.
pub fn ffi_ptr<T>(body: impl FnOnce() -> Result<*mut T, i32>) -> *mut T {
    ffi(std::ptr::null_mut(), || match body() {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

/// A failure that also says why on stderr when the library's debug switch
/// is on (programs only see the errno). `library` names it in the message,
/// e.g. "libibverbs".
pub fn fail(library: &str, debug: bool, errno: i32, why: impl std::fmt::Display) -> i32 {
    if debug {
        eprintln!("xroce {library}: {why} (errno {errno})");
    }
    errno
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_fallback_with_eio() {
        set_errno(0);
        assert_eq!(ffi(7, || -> i32 { panic!("boom") }), 7);
        assert_eq!(errno(), libc::EIO);
        set_errno(0);
        assert_eq!(ffi_errno(|| panic!("boom")), libc::EIO);
        assert_eq!(errno(), libc::EIO);
        set_errno(0);
        assert_eq!(ffi_minus_one(|| panic!("boom")), -1);
        assert_eq!(errno(), libc::EIO);
        set_errno(0);
        assert!(ffi_ptr::<u8>(|| panic!("boom")).is_null());
        assert_eq!(errno(), libc::EIO);
    }

    #[test]
    fn int_calls_answer_in_their_library_convention() {
        set_errno(0);
        assert_eq!(ffi_errno(|| Ok(())), 0);
        assert_eq!(ffi_errno(|| Err(libc::EINVAL)), libc::EINVAL);
        // The verbs convention leaves errno alone.
        assert_eq!(errno(), 0);
        assert_eq!(ffi_minus_one(|| Ok(())), 0);
        assert_eq!(ffi_minus_one(|| Err(libc::ENODEV)), -1);
        assert_eq!(errno(), libc::ENODEV);
    }

    #[test]
    fn pointer_calls_return_null_with_errno() {
        let mut x = 5u8;
        let p: *mut u8 = &mut x;
        assert_eq!(ffi_ptr(|| Ok(p)), p);
        set_errno(0);
        assert!(ffi_ptr::<u8>(|| Err(libc::ENOMEM)).is_null());
        assert_eq!(errno(), libc::ENOMEM);
        assert_eq!(fail("libtest", false, libc::EAGAIN, "why"), libc::EAGAIN);
    }
}
