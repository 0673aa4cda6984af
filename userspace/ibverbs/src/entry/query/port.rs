//! The port: `ibv_query_port` and `verbs_context.query_port`.

use std::ffi::c_int;

use xroce::device::sysfs::{PortState, GID_TBL_LEN, PORT, PORT_CAP_FLAGS};
use xroce::verbs::Mtu;

use super::write_sized;
use crate::abi::*;
use crate::base::errno::ffi_int;
use crate::base::limits::MAX_MSG_SZ;
use crate::objects::context::context;

pub(crate) fn mtu_enum(m: Mtu) -> ibv_mtu {
    match m {
        Mtu::Mtu256 => IBV_MTU_256,
        Mtu::Mtu512 => IBV_MTU_512,
        Mtu::Mtu1024 => IBV_MTU_1024,
        Mtu::Mtu2048 => IBV_MTU_2048,
        Mtu::Mtu4096 => IBV_MTU_4096,
    }
}

fn port_attrs(v: PortState) -> ibv_port_attr {
    let (width, speed) = v.width_speed();
    ibv_port_attr {
        state: if v.up { IBV_PORT_ACTIVE } else { IBV_PORT_DOWN },
        max_mtu: IBV_MTU_4096,
        active_mtu: Mtu::from_bytes(v.active_mtu).map_or(IBV_MTU_256, mtu_enum),
        gid_tbl_len: GID_TBL_LEN as c_int,
        port_cap_flags: PORT_CAP_FLAGS,
        max_msg_sz: MAX_MSG_SZ,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: width,
        active_speed: speed,
        phys_state: v.phys_state(),
        link_layer: IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    }
}

/// `verbs_context.query_port`, behind the inline `ibv_query_port`: writes
/// at most `port_attr_size` bytes (the caller's sizeof).
pub(crate) unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
    port_attr_size: usize,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes an open context.
        let c = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
        if port_attr.is_null() || u32::from(port_num) != PORT {
            return Err(libc::EINVAL);
        }
        let attr = port_attrs(PortState::read(&c.dev.iface, c.dev.active_mtu.bytes()));
        // SAFETY: the caller's struct is port_attr_size bytes.
        unsafe { write_sized(&attr, port_attr.cast(), port_attr_size) };
        Ok(())
    })
}

/// `ibv_query_port`, the exported function: its struct is rdma-core's
/// `_compat_ibv_port_attr`, `struct ibv_port_attr` without
/// `port_cap_flags2` (48 bytes).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port_num: u8,
    port_attr: *mut _compat_ibv_port_attr,
) -> c_int {
    let compat_size = std::mem::offset_of!(ibv_port_attr, port_cap_flags2);
    // SAFETY: forwarding the program's arguments with the compat size.
    unsafe { query_port_ex(ctx, port_num, port_attr.cast(), compat_size) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    fn view(up: bool) -> PortState {
        PortState {
            up,
            active_mtu: 1024,
            speed_mbps: None,
        }
    }

    #[test]
    fn port_attributes() {
        let a = port_attrs(view(true));
        assert_eq!(
            (a.state, a.max_mtu, a.active_mtu),
            (IBV_PORT_ACTIVE, IBV_MTU_4096, IBV_MTU_1024)
        );
        assert_eq!(
            (a.gid_tbl_len, a.pkey_tbl_len, a.lid, a.sm_lid),
            (1024, 1, 0, 0)
        );
        assert_eq!(a.link_layer as u32, IBV_LINK_LAYER_ETHERNET);
        assert_eq!((a.phys_state, a.max_msg_sz), (5, 1 << 31));
        assert_eq!((a.active_width, a.active_speed), (1, 1)); // 1X SDR
        assert_eq!(a.port_cap_flags, IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS);
        let d = port_attrs(view(false));
        assert_eq!((d.state, d.phys_state), (IBV_PORT_DOWN, 3));
        assert_eq!(mtu_enum(Mtu::Mtu4096), IBV_MTU_4096);
    }

    #[test]
    fn sized_writes_stay_within_the_callers_size() {
        let a = port_attrs(view(true));
        // The compat struct of the exported ibv_query_port: 48 bytes.
        let compat = std::mem::offset_of!(ibv_port_attr, port_cap_flags2);
        assert_eq!(compat, 48);
        for size in [0, 4, compat, size_of::<ibv_port_attr>()] {
            let mut buf = [0xa5u8; 80];
            // SAFETY: buf holds 80 >= size bytes.
            unsafe { write_sized(&a, buf.as_mut_ptr().cast(), size) };
            assert!(buf[size..].iter().all(|&b| b == 0xa5), "size {size}");
            if size >= 4 {
                assert_eq!(
                    u32::from_ne_bytes(buf[..4].try_into().unwrap()),
                    IBV_PORT_ACTIVE
                );
            }
        }
        // A larger caller struct: the tail is zeroed, nothing past it.
        let mut buf = [0xa5u8; 80];
        // SAFETY: buf holds 80 >= 60 bytes.
        unsafe { write_sized(&a, buf.as_mut_ptr().cast(), 60) };
        assert!(buf[52..60].iter().all(|&b| b == 0));
        assert!(buf[60..].iter().all(|&b| b == 0xa5));
    }
}
