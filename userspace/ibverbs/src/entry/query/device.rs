//! Device attributes: `ibv_query_device` and
//! `verbs_context.query_device_ex`; the limits are the engine's
//! ([`crate::base::limits`]).

use std::ffi::{c_char, c_int};
use std::mem::size_of;

use xroce::device::guid_from_mac;
use xroce::device::sysfs::FW_VER;

use super::write_sized;
use crate::abi::*;
use crate::base::errno::ffi_int;
use crate::base::limits::*;
use crate::objects::context::context;

/// rxe's local CA ACK delay.
const LOCAL_CA_ACK_DELAY: u8 = 15;
/// Page sizes (rxe's: every power of two from 4 KiB up).
const PAGE_SIZE_CAP: u64 = 0xffff_f000;
/// RNR NAKs, a system image GUID and SRQ resize are what the engine has.
const DEVICE_CAP_FLAGS: u32 =
    IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_SRQ_RESIZE;

fn device_attr(mac: [u8; 6]) -> ibv_device_attr {
    let guid = guid_from_mac(mac).to_be();
    let mut a = ibv_device_attr {
        fw_ver: [0; 64],
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: MAX_MR_SIZE,
        page_size_cap: PAGE_SIZE_CAP,
        vendor_id: VENDOR_ID,
        vendor_part_id: VENDOR_PART_ID,
        hw_ver: 0,
        max_qp: MAX_QP as c_int,
        max_qp_wr: MAX_QP_WR as c_int,
        device_cap_flags: DEVICE_CAP_FLAGS,
        max_sge: MAX_SGE as c_int,
        max_sge_rd: MAX_SGE as c_int,
        max_cq: MAX_CQ as c_int,
        max_cqe: MAX_CQE as c_int,
        max_mr: MAX_MR as c_int,
        max_pd: MAX_PD as c_int,
        max_qp_rd_atom: MAX_QP_RD_ATOM as c_int,
        max_ee_rd_atom: 0,
        max_res_rd_atom: (u64::from(MAX_QP_RD_ATOM) * u64::from(MAX_QP)).min(c_int::MAX as u64)
            as c_int,
        max_qp_init_rd_atom: MAX_QP_RD_ATOM as c_int,
        max_ee_init_rd_atom: 0,
        atomic_cap: IBV_ATOMIC_HCA,
        max_ee: 0,
        max_rdd: 0,
        max_mw: 0,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 0,
        max_mcast_qp_attach: 0,
        max_total_mcast_qp_attach: 0,
        max_ah: MAX_AH as c_int,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: MAX_SRQ as c_int,
        max_srq_wr: MAX_SRQ_WR as c_int,
        max_srq_sge: MAX_SGE as c_int,
        max_pkeys: 1,
        local_ca_ack_delay: LOCAL_CA_ACK_DELAY,
        phys_port_cnt: 1,
    };
    for (d, s) in a.fw_ver.iter_mut().zip(FW_VER.bytes().take(63)) {
        *d = s as c_char;
    }
    a
}

/// No ODP, TSO, RSS, WQs, tag matching, CQ moderation, device memory or
/// timestamps: all zero; the extended capability flags are the basic ones.
fn device_attr_ex(mac: [u8; 6]) -> ibv_device_attr_ex {
    ibv_device_attr_ex {
        orig_attr: device_attr(mac),
        comp_mask: 0,
        device_cap_flags_ex: u64::from(DEVICE_CAP_FLAGS),
        phys_port_cnt_ex: 1,
        ..Default::default()
    }
}

/// `verbs_context.query_device_ex`, behind the inline
/// `ibv_query_device_ex` (and `ibv_query_device`): writes at most
/// `attr_size` bytes.
pub(crate) unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi_int(|| {
        // SAFETY: NULL or the caller's input struct.
        if unsafe { input.as_ref() }.is_some_and(|i| i.comp_mask != 0) {
            return Err(libc::EINVAL);
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes an open context.
        let c = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
        // SAFETY: the caller's struct is attr_size bytes.
        unsafe { write_sized(&device_attr_ex(c.dev.mac), attr.cast(), attr_size) };
        Ok(())
    })
}

/// `ibv_query_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    device_attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: ibv_device_attr is the first member of ibv_device_attr_ex and
    // the size passed covers it alone.
    unsafe {
        query_device_ex(
            ctx,
            std::ptr::null(),
            device_attr.cast(),
            size_of::<ibv_device_attr>(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    const MAC: [u8; 6] = [0x02, 0x42, 0xac, 0x11, 0x00, 0x02];

    #[test]
    fn device_attributes() {
        let a = device_attr_ex(MAC);
        let o = &a.orig_attr;
        // SAFETY: fw_ver is NUL-terminated.
        let fw = unsafe { CStr::from_ptr(o.fw_ver.as_ptr()) };
        assert_eq!(fw.to_str().unwrap(), FW_VER);
        assert_eq!(u64::from_be(o.node_guid), 0x0042_acff_fe11_0002);
        assert_eq!(o.sys_image_guid, o.node_guid);
        assert_eq!((o.vendor_id, o.vendor_part_id), (VENDOR_ID, VENDOR_PART_ID));
        assert_eq!(
            (o.phys_port_cnt, o.max_pkeys, o.local_ca_ack_delay),
            (1, 1, 15)
        );
        assert_eq!(o.atomic_cap, IBV_ATOMIC_HCA);
        assert_eq!(o.max_qp_wr as u32, MAX_QP_WR);
        assert_eq!(a.device_cap_flags_ex, u64::from(o.device_cap_flags));
        assert_eq!(a.comp_mask, 0);
    }
}
