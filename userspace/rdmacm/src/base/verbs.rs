//! The public libibverbs API this library calls. At run time that is
//! xroce's libibverbs.so.1 (first on the library path under `xroce run`),
//! so devices, PDs and QPs made here live in the program's one xroce
//! device state.

use std::ffi::{c_char, c_int};

use crate::abi::*;

#[link(name = "ibverbs")]
extern "C" {
    pub(crate) fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    pub(crate) fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub(crate) fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
    pub(crate) fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    pub(crate) fn ibv_query_gid(
        context: *mut ibv_context,
        port_num: u8,
        index: c_int,
        gid: *mut ibv_gid,
    ) -> c_int;
    /// The exported (compat) entry point behind `ibv_query_port`, which
    /// fills the fields before `port_cap_flags2` of a `struct ibv_port_attr`.
    pub(crate) fn ibv_query_port(
        context: *mut ibv_context,
        port_num: u8,
        port_attr: *mut ibv_port_attr,
    ) -> c_int;
    pub(crate) fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    pub(crate) fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
    pub(crate) fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;
    pub(crate) fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut std::ffi::c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    pub(crate) fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub(crate) fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    pub(crate) fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    pub(crate) fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    pub(crate) fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
    pub(crate) fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;
}
