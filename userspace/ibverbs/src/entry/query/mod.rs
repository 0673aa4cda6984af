//! What the device says about itself, one job a file: device
//! attributes, the port, GIDs, P_Keys, the sysfs files, fork support and
//! ECE.
//!
//! An xroce device looks like Linux's rxe on the same interface: a channel
//! adapter with one Ethernet port, RoCE v2 only, a 1024-entry GID table
//! whose index 0 is the link-local GID made from the MAC and index 1 the
//! IPv4-mapped address (`-g 1` / `-x 1` works as on rxe), then the
//! interface's IPv6 addresses (every GID shown works as a source GID), one
//! P_Key (0xffff), the port ACTIVE while the interface has carrier. The
//! device limits are the engine's ([`crate::base::limits`]), reported
//! here and enforced by the verbs that create and post.

pub(crate) mod device;
pub(crate) mod ece;
pub(crate) mod fork;
pub(crate) mod gid;
pub(crate) mod pkey;
pub(crate) mod port;
pub(crate) mod sysfs;

use std::ffi::c_void;
use std::mem::size_of;

/// Writes the first `size` bytes of `src` to `dst` and zeroes whatever of
/// `size` lies past `src` (a caller built against a newer header).
///
/// # Safety
/// `dst` is valid for `size` bytes of writes.
unsafe fn write_sized<T>(src: &T, dst: *mut c_void, size: usize) {
    let n = size.min(size_of::<T>());
    // SAFETY: src is a live T (n <= its size); the caller vouches for dst.
    unsafe {
        std::ptr::copy_nonoverlapping(src as *const T as *const u8, dst as *mut u8, n);
        std::ptr::write_bytes((dst as *mut u8).add(n), 0, size - n);
    }
}
