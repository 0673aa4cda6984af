//! Int-sized socket options nix has no typed wrapper for (busy polling,
//! SO_NO_CHECK, IP_MTU_DISCOVER, IPV6_DONTFRAG, XDP_OPTIONS), shared by the
//! AF_XDP and UDP backends. Setup only: never called per packet.

use std::{io, mem};

/// setsockopt(2) of one `int` value.
pub(crate) fn set_int(
    fd: i32,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value is a valid c_int that outlives the call, and
    // the length says so.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// getsockopt(2) of one `u32` value.
pub(crate) fn get_u32(fd: i32, level: libc::c_int, name: libc::c_int) -> io::Result<u32> {
    let mut value: u32 = 0;
    let mut len = mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: `value` is a valid u32 buffer of `len` bytes that outlives the
    // call; the kernel writes at most `len` bytes.
    let rc =
        unsafe { libc::getsockopt(fd, level, name, (&mut value as *mut u32).cast(), &mut len) };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}
