//! Whether the program's memory can be registered: the kernel pins an MR's
//! pages at `ibv_reg_mr` (ib_umem_get), for writing when the MR may be
//! written (local or remote write, atomics), and fails the registration
//! with EFAULT when a page is not mapped so. Without the check a remote
//! WRITE into a read-only range would crash the program (SIGSEGV in the
//! engine's copy) instead of failing the registration.
//!
//! Read from /proc/self/maps: registration is the slow path, and the
//! mappings are the kernel's own account of what is mapped how.

use std::fs;

/// Ok if every byte of `addr..addr+len` lies in mappings that are
/// readable and, if `writable`, writable too; EFAULT otherwise (as the
/// kernel's registration gives it). An empty range needs no mapping.
pub fn check_user_range(addr: usize, len: usize, writable: bool) -> Result<(), i32> {
    if len == 0 {
        return Ok(());
    }
    let end = addr.checked_add(len).ok_or(libc::EFAULT)?;
    let maps = fs::read_to_string("/proc/self/maps").map_err(|_| libc::EFAULT)?;
    covered(&maps, addr, end, writable)
}

/// The check on a maps table: walks the mappings (in address order, as
/// the kernel lists them) from `start` until `end` is covered.
fn covered(maps: &str, start: usize, end: usize, writable: bool) -> Result<(), i32> {
    let mut at = start;
    for line in maps.lines() {
        let Some((lo, hi, perms)) = parse_line(line) else {
            continue;
        };
        if hi <= at {
            continue;
        }
        if lo > at {
            // A hole before the next mapping.
            return Err(libc::EFAULT);
        }
        let p = perms.as_bytes();
        if p.first() != Some(&b'r') || (writable && p.get(1) != Some(&b'w')) {
            return Err(libc::EFAULT);
        }
        at = hi;
        if at >= end {
            return Ok(());
        }
    }
    Err(libc::EFAULT)
}

/// `lo-hi perms ...` of one maps line.
fn parse_line(line: &str) -> Option<(usize, usize, &str)> {
    let mut fields = line.split_whitespace();
    let (lo, hi) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    Some((
        usize::from_str_radix(lo, 16).ok()?,
        usize::from_str_radix(hi, 16).ok()?,
        perms,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
1000-3000 rw-p 00000000 00:00 0 
3000-4000 r--p 00000000 00:00 0 
4000-5000 rw-p 00000000 00:00 0 
6000-7000 ---p 00000000 00:00 0 
";

    #[test]
    fn ranges_are_checked_against_the_mappings() {
        assert_eq!(covered(MAPS, 0x1000, 0x3000, true), Ok(()));
        assert_eq!(covered(MAPS, 0x2000, 0x5000, false), Ok(()), "across three");
        assert_eq!(
            covered(MAPS, 0x2000, 0x5000, true),
            Err(libc::EFAULT),
            "read-only page"
        );
        assert_eq!(
            covered(MAPS, 0x4800, 0x5800, false),
            Err(libc::EFAULT),
            "hole"
        );
        assert_eq!(
            covered(MAPS, 0x6000, 0x6001, false),
            Err(libc::EFAULT),
            "PROT_NONE"
        );
        assert_eq!(
            covered(MAPS, 0x8000, 0x8001, false),
            Err(libc::EFAULT),
            "unmapped"
        );
    }

    #[test]
    fn this_process_memory_is_seen_as_the_kernel_maps_it() {
        let buf = vec![0u8; 3 * 4096];
        assert_eq!(
            check_user_range(buf.as_ptr() as usize, buf.len(), true),
            Ok(())
        );
        assert_eq!(check_user_range(0, 0, true), Ok(()), "empty range");
        assert_eq!(
            check_user_range(usize::MAX - 1, 8, false),
            Err(libc::EFAULT)
        );
        // SAFETY: a fresh anonymous read-only mapping, unmapped below.
        let ro = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ro, libc::MAP_FAILED);
        let ro = ro as usize;
        assert_eq!(check_user_range(ro, 8192, false), Ok(()));
        assert_eq!(check_user_range(ro, 8192, true), Err(libc::EFAULT));
        // (Not checked after munmap: another test thread may map there.)
        // SAFETY: the mapping made above, not used after.
        assert_eq!(unsafe { libc::munmap(ro as *mut libc::c_void, 8192) }, 0);
    }
}
