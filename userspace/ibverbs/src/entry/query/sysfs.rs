//! sysfs: `ibv_get_sysfs_path`, `ibv_read_sysfs_file` (our devices'
//! files answered from the device), `ibv_read_ibdev_sysfs_file`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io::Read;
use std::sync::OnceLock;

use xroce::device::sysfs::DeviceFacts;

use crate::base::errno::{ffi, set_errno};
use crate::objects::device::entry_of;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
