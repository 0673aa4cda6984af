//! Device, port, GID and P_Key queries, the sysfs helpers, fork support
//! and ECE.
//!
//! An xroce device looks like Linux's rxe on the same interface: a channel
//! adapter with one Ethernet port, RoCE v2 only, a 1024-entry GID table
//! whose index 0 is the link-local GID made from the MAC and index 1 the
//! IPv4-mapped address (`-g 1` / `-x 1` works as on rxe), then the
//! interface's IPv6 addresses (every GID shown works as a source GID), one
//! P_Key (0xffff), the port ACTIVE while the interface has carrier. The
//! device limits are the engine's ([`crate::base::limits`]), reported here and
//! enforced by the verbs that create and post.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::io::Read;
use std::mem::size_of;
use std::sync::OnceLock;

use xroce::verbs::Mtu;

use crate::abi::*;
use crate::base::errno::{ffi, ffi_int, set_errno};
use crate::base::limits::*;
use crate::objects::context::{context, Context};
use crate::objects::device::entry_of;
use xroce::device::guid_from_mac;

use xroce::device::sysfs::{
    DeviceFacts, PortState, DEFAULT_PKEY, FW_VER, GID_TBL_LEN, PORT, PORT_CAP_FLAGS,
};

/// rxe's local CA ACK delay.
const LOCAL_CA_ACK_DELAY: u8 = 15;
/// Page sizes (rxe's: every power of two from 4 KiB up).
const PAGE_SIZE_CAP: u64 = 0xffff_f000;
/// RNR NAKs, a system image GUID and SRQ resize are what the engine has.
const DEVICE_CAP_FLAGS: u32 =
    IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_SRQ_RESIZE;
/// `enum ibv_gid_type_sysfs` (rdma-core's driver.h, not installed).
const GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

// ---------------------------------------------------------------- GIDs

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

// ---------------------------------------------------------------- port

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

// ---------------------------------------------------------------- device

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

// ---------------------------------------------------------------- GID verbs

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

// ---------------------------------------------------------------- P_Keys

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

// ---------------------------------------------------------------- sysfs

/// `ibv_get_sysfs_path`: `SYSFS_PATH` without trailing slashes (only when
/// not running set-uid), else "/sys".
#[no_mangle]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: OnceLock<CString> = OnceLock::new();
    ffi(c"/sys".as_ptr(), || {
        PATH.get_or_init(|| {
            // SAFETY: getuid/geteuid cannot fail.
            let setuid = unsafe { libc::getuid() != libc::geteuid() };
            let env = (!setuid)
                .then(|| std::env::var_os("SYSFS_PATH"))
                .flatten()
                .map(|v| {
                    use std::os::unix::ffi::OsStrExt;
                    let b = v.as_bytes();
                    let end = b.iter().rposition(|&c| c != b'/').map_or(0, |i| i + 1);
                    b[..end.min(256)].to_vec()
                });
            env.and_then(|b| CString::new(b).ok())
                .unwrap_or_else(|| c"/sys".to_owned())
        })
        .as_ptr()
    })
}

fn sysfs_root() -> String {
    // SAFETY: returns a static C string.
    unsafe { CStr::from_ptr(ibv_get_sysfs_path()) }
        .to_string_lossy()
        .into_owned()
}

/// What `read(2)` of a file holding `content` into `buf` leaves, then
/// rdma-core's post-processing: a trailing newline becomes the NUL, short
/// content is NUL-terminated, content filling `buf` without a newline is
/// an error (-1). Returns the length.
fn finish_read(buf: &mut [u8], mut len: usize) -> c_int {
    if len > 0 {
        if buf[len - 1] == b'\n' {
            len -= 1;
            buf[len] = 0;
        } else if len < buf.len() {
            buf[len] = 0;
        } else {
            return -1;
        }
    }
    len as c_int
}

fn fill_like_read(content: &[u8], buf: &mut [u8]) -> c_int {
    let n = content.len().min(buf.len());
    buf[..n].copy_from_slice(&content[..n]);
    finish_read(buf, n)
}

/// Our devices: (ibdev name, uverbs name, interface).
fn our_devices() -> Vec<(String, String, String)> {
    let mut n: c_int = 0;
    // SAFETY: our own exported list functions; the list is freed below.
    let list = unsafe { crate::entry::context::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds n device pointers.
        let dev = unsafe { *list.add(i) };
        if let Some(e) = entry_of(dev) {
            // SAFETY: the names are NUL-terminated arrays of the entry.
            let (name, uverbs) = unsafe {
                (
                    CStr::from_ptr(e.dev.name.as_ptr())
                        .to_string_lossy()
                        .into_owned(),
                    CStr::from_ptr(e.dev.dev_name.as_ptr())
                        .to_string_lossy()
                        .into_owned(),
                )
            };
            out.push((name, uverbs, e.iface.clone()));
        }
    }
    // SAFETY: the list came from ibv_get_device_list.
    unsafe { crate::entry::context::ibv_free_device_list(list) };
    out
}

/// The path's components below the sysfs root, if it is under it.
fn below_sysfs<'a>(path: &'a str, root: &str) -> Option<Vec<&'a str>> {
    let rest = [root, "/sys"].iter().find_map(|r| {
        let r = r.trim_end_matches('/');
        path.strip_prefix(r).filter(|s| s.starts_with('/'))
    })?;
    Some(
        rest.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect(),
    )
}

/// The synthesized content of `path` if it is a file of one of our
/// devices (Some(Err) for one of ours that has no such file).
fn virtual_file(path: &str) -> Option<Result<String, i32>> {
    let comps = below_sysfs(path, &sysfs_root())?;
    let (class, name, rel) = match comps.as_slice() {
        ["class", class, name, rel @ ..] => (*class, *name, rel),
        _ => return None,
    };
    if !name.starts_with("xroce_") && !name.starts_with("uverbs") {
        return None;
    }
    let devs = our_devices();
    match class {
        "infiniband" => {
            let (_, _, iface) = devs.iter().find(|d| d.0 == name)?;
            Some(DeviceFacts::read(iface).and_then(|f| f.file(rel)))
        }
        "infiniband_verbs" => {
            let (ibdev, _, _) = devs.iter().find(|d| d.1 == name)?;
            let index = name.strip_prefix("uverbs")?.parse().ok()?;
            Some(xroce::device::sysfs::uverbs_file(ibdev, index, rel))
        }
        _ => None,
    }
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` as rdma-core does
/// (one read, trailing newline stripped, NUL-terminated; the length, or
/// -1 with errno). Files of our own devices (`class/infiniband/xroce_*`,
/// `class/infiniband_verbs/uverbsN`) are answered from the device;
/// everything else is read from the real file.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    ffi(-1, || {
        if dir.is_null() || file.is_null() || (buf.is_null() && size > 0) {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's strings are NUL-terminated.
        let path = unsafe {
            format!(
                "{}/{}",
                CStr::from_ptr(dir).to_string_lossy(),
                CStr::from_ptr(file).to_string_lossy()
            )
        };
        let out: &mut [u8] = if size == 0 {
            &mut []
        } else {
            // SAFETY: the caller's buffer is size bytes.
            unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, size) }
        };
        match virtual_file(&path) {
            Some(Ok(content)) => fill_like_read(content.as_bytes(), out),
            Some(Err(e)) => {
                set_errno(e);
                -1
            }
            None => {
                let read = std::fs::File::open(&path).and_then(|mut f| f.read(out));
                match read {
                    Ok(n) => finish_read(out, n),
                    Err(e) => {
                        set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                        -1
                    }
                }
            }
        }
    })
}

/// `ibv_read_ibdev_sysfs_file` (private node; printf-style in C, the
/// format arguments are ignored here, which the x86-64 SysV ABI allows for
/// a callee reading only its fixed arguments). It takes a provider's
/// `struct verbs_sysfs_dev`, which only devices a provider created have:
/// none here, so it fails as rdma-core does for a NULL one.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_ibdev_sysfs_file(
    _buf: *mut c_char,
    _size: usize,
    _sysfs_dev: *mut c_void,
    _fnfmt: *const c_char,
) -> c_int {
    ffi(-1, || {
        set_errno(libc::EINVAL);
        -1
    })
}

// ---------------------------------------------------------------- fork

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

// ---------------------------------------------------------------- ECE

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

    #[test]
    fn sysfs_paths() {
        assert_eq!(
            below_sysfs("/sys/class/infiniband/xroce_eth0//ports/1/./state", "/sys"),
            Some(vec![
                "class",
                "infiniband",
                "xroce_eth0",
                "ports",
                "1",
                "state"
            ])
        );
        assert_eq!(
            below_sysfs("/tmp/fake/class/x", "/tmp/fake"),
            Some(vec!["class", "x"])
        );
        assert_eq!(below_sysfs("/system/x", "/sys"), None);
    }

    #[test]
    fn read_postprocessing() {
        let mut b = [0xffu8; 8];
        assert_eq!(fill_like_read(b"1: CA\n", &mut b), 5);
        assert_eq!(&b[..6], b"1: CA\0");
        let mut b = [0xffu8; 8];
        assert_eq!(fill_like_read(b"abc", &mut b), 3);
        assert_eq!(&b[..4], b"abc\0");
        let mut b = [0xffu8; 4];
        assert_eq!(fill_like_read(b"abcd", &mut b), -1);
        let mut b = [0xffu8; 4];
        assert_eq!(fill_like_read(b"abc\n", &mut b), 3);
        assert_eq!(&b, b"abc\0");
        assert_eq!(fill_like_read(b"", &mut b), 0);
    }

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
