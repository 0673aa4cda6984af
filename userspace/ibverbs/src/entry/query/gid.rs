//! GIDs: `ibv_query_gid`, `_ibv_query_gid_ex`, `_ibv_query_gid_table`,
//! `ibv_query_gid_type`, over the table the device fixed at open
//! ([`crate::objects::device::gid_table`]).

use std::ffi::{c_int, c_uint};

use xroce::device::sysfs::{GID_TBL_LEN, PORT};

use super::write_sized;
use crate::abi::*;
use crate::base::errno::{ffi, ffi_int, set_errno};
use crate::objects::context::{context, Context};

/// `enum ibv_gid_type_sysfs` (rdma-core's driver.h, not installed).
const GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

/// An open device's GID table: index 1 is the IPv4 address its engine uses.
fn context_gids(c: &Context) -> Vec<[u8; 16]> {
    c.dev.gids.clone()
}

/// Entry `index` of `port`: Ok(Some) populated, Ok(None) empty (the
/// kernel's ENODATA), Err(EINVAL) no such port or index.
fn gid_at(gids: &[[u8; 16]], port: u32, index: u32) -> Result<Option<[u8; 16]>, i32> {
    if port != PORT || index >= GID_TBL_LEN {
        return Err(libc::EINVAL);
    }
    Ok(gids.get(index as usize).copied())
}

fn gid_entry(gid: [u8; 16], index: u32, ifindex: u32) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw: gid },
        gid_index: index,
        port_num: PORT,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ifindex,
    }
}

/// `ibv_query_gid`: an empty entry is the zero GID (return 0); a bad port
/// or index returns -1 with errno EINVAL.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    ffi(-1, || {
        let r = (|| {
            // SAFETY: the program passes an open context.
            let c = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
            if gid.is_null() || index < 0 {
                return Err(libc::EINVAL);
            }
            gid_at(&context_gids(c), port_num.into(), index as u32)
        })();
        match r {
            Ok(g) => {
                // SAFETY: checked non-NULL; the program's union.
                unsafe {
                    *gid = ibv_gid {
                        raw: g.unwrap_or([0; 16]),
                    }
                };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): ENODATA
/// for an empty entry, EINVAL for a bad port, index or flags; writes at
/// most `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes an open context.
        let c = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
        if entry.is_null() || flags != 0 {
            return Err(libc::EINVAL);
        }
        let g = gid_at(&context_gids(c), port_num, gid_index)?.ok_or(libc::ENODATA)?;
        let e = gid_entry(g, gid_index, c.dev.stack.net().ifindex());
        // SAFETY: the caller's entry is entry_size bytes.
        unsafe { write_sized(&e, entry.cast(), entry_size) };
        Ok(())
    })
}

/// `_ibv_query_gid_table` (behind `ibv_query_gid_table`): the populated
/// entries, or -EINVAL if they do not fit `max_entries`.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    ffi(-(libc::EIO as isize), || {
        // SAFETY: the program passes an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return -(libc::EINVAL as isize);
        };
        if entries.is_null() || flags != 0 || entry_size == 0 || max_entries == 0 {
            return -(libc::EINVAL as isize);
        }
        let gids = context_gids(c);
        if gids.len() > max_entries {
            return -(libc::EINVAL as isize);
        }
        let ifindex = c.dev.stack.net().ifindex();
        for (i, g) in gids.iter().enumerate() {
            let e = gid_entry(*g, i as u32, ifindex);
            // SAFETY: the caller's array holds max_entries >= gids.len()
            // entries of entry_size bytes.
            unsafe {
                write_sized(
                    &e,
                    entries.cast::<u8>().add(i * entry_size).cast(),
                    entry_size,
                )
            };
        }
        gids.len() as isize
    })
}

/// `ibv_query_gid_type` (private node; ibv_devinfo): every populated
/// entry is RoCE v2; an empty one answers IB/RoCE v1, as rdma-core does.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut u32,
) -> c_int {
    ffi(-1, || {
        let r = (|| {
            // SAFETY: the program passes an open context.
            let c = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
            if gid_type.is_null() {
                return Err(libc::EINVAL);
            }
            gid_at(&context_gids(c), port_num.into(), index)
        })();
        match r {
            Ok(g) => {
                let t = if g.is_some() {
                    GID_TYPE_SYSFS_ROCE_V2
                } else {
                    GID_TYPE_SYSFS_IB_ROCE_V1
                };
                // SAFETY: checked non-NULL; the caller's enum.
                unsafe { *gid_type = t };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::device::gid_table;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const MAC: [u8; 6] = [0x02, 0x42, 0xac, 0x11, 0x00, 0x02];

    #[test]
    fn link_local_gid_is_eui64_of_the_mac() {
        // 02:42:ac:11:00:02 -> fe80::42:acff:fe11:2 (U/L bit flipped).
        assert_eq!(
            xroce::device::link_local_gid(MAC).octets(),
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x42, 0xac, 0xff, 0xfe, 0x11, 0x00, 0x02]
        );
        assert_eq!(
            xroce::device::link_local_gid([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
            "fe80::5054:ff:fe12:3456".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn gid_table_is_rxes() {
        let v4 = Ipv4Addr::new(192, 168, 1, 7);
        let t = gid_table(MAC, Some(v4), &[]);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0], xroce::device::link_local_gid(MAC).octets());
        assert_eq!(
            t[1],
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 7]
        );
        // The same entries the address checks of ah.rs accept.
        for (i, g) in t.iter().enumerate() {
            assert_eq!(crate::entry::ah::gid_index_of(&t, g), Some(i as u32));
        }
        assert_eq!(
            gid_table(MAC, None, &[]),
            vec![xroce::device::link_local_gid(MAC).octets()]
        );
        // IPv6 addresses follow; the link-local one is GID 0 already.
        let ll = xroce::device::link_local_gid(MAC);
        let global: Ipv6Addr = "2001:db8::7".parse().unwrap();
        let t6 = gid_table(MAC, Some(v4), &[ll, global]);
        assert_eq!(t6, [t[0], t[1], global.octets()]);
    }

    #[test]
    fn gid_lookup_semantics() {
        let t = gid_table(MAC, Some(Ipv4Addr::new(10, 0, 0, 1)), &[]);
        assert_eq!(gid_at(&t, 1, 1), Ok(Some(t[1])));
        assert_eq!(gid_at(&t, 1, 2), Ok(None));
        assert_eq!(gid_at(&t, 1, GID_TBL_LEN - 1), Ok(None));
        assert_eq!(gid_at(&t, 1, GID_TBL_LEN), Err(libc::EINVAL));
        assert_eq!(gid_at(&t, 2, 0), Err(libc::EINVAL));
        let e = gid_entry(t[1], 1, 7);
        assert_eq!((e.gid_index, e.port_num, e.ndev_ifindex), (1, 1, 7));
        assert_eq!(e.gid_type, IBV_GID_TYPE_ROCE_V2);
    }
}
