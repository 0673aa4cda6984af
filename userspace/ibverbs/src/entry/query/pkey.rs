//! P_Keys: `ibv_query_pkey`, `ibv_get_pkey_index` (one entry, the
//! default P_Key).

use std::ffi::c_int;

use xroce::device::sysfs::{DEFAULT_PKEY, PORT};

use crate::abi::*;
use crate::base::errno::{ffi, set_errno};
use crate::objects::context::context;

/// `ibv_query_pkey`: index 0 is the default P_Key; anything else is -1
/// with errno EINVAL (the table has one entry).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut __be16,
) -> c_int {
    ffi(-1, || {
        // SAFETY: the program passes an open context.
        let ok = unsafe { context(ctx) }.is_some()
            && !pkey.is_null()
            && u32::from(port_num) == PORT
            && index == 0;
        if !ok {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: checked non-NULL.
        unsafe { *pkey = DEFAULT_PKEY.to_be() };
        0
    })
}

/// `ibv_get_pkey_index`: 0 for the default P_Key, -1 for any other.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    ctx: *mut ibv_context,
    port_num: u8,
    pkey: __be16,
) -> c_int {
    ffi(-1, || {
        let mut p: __be16 = 0;
        // SAFETY: forwarding the program's context; p is a local.
        if unsafe { ibv_query_pkey(ctx, port_num, 0, &mut p) } != 0 {
            return -1;
        }
        if p == pkey {
            0
        } else {
            set_errno(libc::EINVAL);
            -1
        }
    })
}
