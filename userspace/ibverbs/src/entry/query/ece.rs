//! Enhanced connection establishment: `ibv_set_ece`, `ibv_query_ece`
//! (none, as rxe).

use std::ffi::c_int;

use crate::abi::*;
use crate::base::errno::{ffi, set_errno};

/// `ibv_set_ece`: no enhanced connection establishment, as rxe (EOPNOTSUPP;
/// rdma-core also sets errno when vendor_id is 0).
#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    ffi(libc::EOPNOTSUPP, || {
        // SAFETY: NULL or the caller's struct.
        if unsafe { ece.as_ref() }.is_none_or(|e| e.vendor_id == 0) {
            set_errno(libc::EOPNOTSUPP);
        }
        libc::EOPNOTSUPP
    })
}

/// `ibv_query_ece`: EOPNOTSUPP, as rxe (librdmacm accepts that).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    libc::EOPNOTSUPP
}
