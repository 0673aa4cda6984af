//! `rdma_get_devices`, `rdma_free_devices`: the devices the process opened
//! ([`crate::objects::devices`]).

use std::ffi::c_int;

use crate::{abi::*, base::errno::ffi_ptr, objects::devices::all};

/// `rdma_get_devices`: a NULL-terminated array of the opened devices'
/// contexts (NULL with ENODEV when there are none).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    ffi_ptr(|| {
        let devices = all()?;
        let mut list: Vec<*mut ibv_context> = devices.iter().map(|d| d.context).collect();
        list.push(std::ptr::null_mut());
        if !num_devices.is_null() {
            // SAFETY: the program's out-pointer.
            unsafe { *num_devices = devices.len() as c_int };
        }
        // A boxed slice, so rdma_free_devices can rebuild it from its length.
        Ok(Box::into_raw(list.into_boxed_slice()) as *mut *mut ibv_context)
    })
}

/// `rdma_free_devices`: frees the array (the devices stay open).
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    crate::base::errno::ffi((), || {
        if list.is_null() {
            return;
        }
        let mut len = 1;
        // SAFETY: a NULL-terminated array from rdma_get_devices.
        while !unsafe { *list.add(len - 1) }.is_null() {
            len += 1;
        }
        // SAFETY: the boxed slice of `len` entries rdma_get_devices leaked.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, len)) });
    })
}
