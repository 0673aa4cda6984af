//! Fork support: `ibv_fork_init` and its companions, all no-ops.

use std::ffi::{c_int, c_void};

use crate::abi::*;

/// `ibv_fork_init`: nothing to do. xroce's engine reaches registered
/// memory only through this process's own mappings (no device DMA into
/// pinned pages), so fork() cannot corrupt it; the kernel copies the
/// AF_XDP packet buffers it has pinned for the child at fork (5.12+). This
/// is rdma-core's IBV_FORK_UNNEEDED case, where ibv_fork_init returns 0.
#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: fork support is not needed.
#[no_mangle]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: a no-op (see ibv_fork_init).
#[no_mangle]
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`: a no-op (see ibv_fork_init).
#[no_mangle]
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_is_unneeded() {
        // SAFETY: plain calls without pointers.
        unsafe {
            assert_eq!(ibv_fork_init(), 0);
            assert_eq!(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
            assert_eq!(ibv_dontfork_range(std::ptr::null_mut(), 0), 0);
        }
    }
}
