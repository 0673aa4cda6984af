//! What rdma-core's kernel keeps per uverbs file (a "ucontext"): the
//! command fd and the handles of PDs and MRs. A context opened with
//! `ibv_open_device` makes one; `ibv_import_device` on a dup of its
//! `cmd_fd` joins it, so `ibv_import_pd` / `ibv_import_mr` find the same
//! objects by handle, as with rdma-core.
//!
//! The command fd is a memfd: a real descriptor (dup, fstat and poll work
//! on it; poll reports it always ready, as the uverbs character device,
//! which has no poll method) whose inode is unique while any copy of it is
//! open. That inode (`st_dev`, `st_ino`) is how an imported fd is matched
//! to its ucontext.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use xroce::verbs::{MemoryRegion, ProtectionDomain};

use crate::objects::device::{DeviceEntry, OpenDevice};

/// An object a handle names.
pub(crate) enum Shared {
    Pd(ProtectionDomain),
    /// The registration itself: dropping it deregisters the region.
    Mr(MemoryRegion),
}

/// Identity of a command fd: its inode.
type FdIdentity = (u64, u64);

/// One ucontext: shared by the context that made it, every context
/// imported from its command fd, and every PD and MR in it (a kernel
/// ucontext lives while anything refers to it).
pub(crate) struct Ucontext {
    pub dev: Arc<OpenDevice>,
    pub entry: &'static DeviceEntry,
    identity: FdIdentity,
    /// Handle -> object; handles are the lowest free numbers, one space
    /// for all object types (as the kernel's per-file xarray).
    objects: Mutex<BTreeMap<u32, Shared>>,
}

/// Ucontexts by the identity of their command fd. An entry is replaced
/// when a new ucontext gets an inode number a dead one had.
fn by_identity() -> &'static Mutex<HashMap<FdIdentity, Weak<Ucontext>>> {
    static R: OnceLock<Mutex<HashMap<FdIdentity, Weak<Ucontext>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// `fstat` of a descriptor: its identity and whether it is a character
/// device; the errno if it is not an open descriptor.
pub(crate) fn fd_identity(fd: i32) -> Result<(FdIdentity, bool), i32> {
    // SAFETY: fstat fills a plain struct; a bad fd is an error return.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EBADF));
    }
    Ok((
        (st.st_dev, st.st_ino),
        st.st_mode & libc::S_IFMT == libc::S_IFCHR,
    ))
}

impl Ucontext {
    /// A new ucontext and its command fd.
    pub fn create(
        dev: Arc<OpenDevice>,
        entry: &'static DeviceEntry,
    ) -> Result<(Arc<Ucontext>, OwnedFd), i32> {
        // SAFETY: memfd_create with a NUL-terminated name returns a fresh
        // descriptor we then own.
        let fd = unsafe { libc::memfd_create(c"xroce-uverbs".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE));
        }
        // SAFETY: as above.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let (identity, _) = fd_identity(fd.as_raw_fd())?;
        let u = Arc::new(Ucontext {
            dev,
            entry,
            identity,
            objects: Mutex::default(),
        });
        let mut all = by_identity().lock().unwrap();
        all.retain(|_, w| w.strong_count() > 0);
        all.insert(identity, Arc::downgrade(&u));
        Ok((u, fd))
    }

    /// The live ucontext whose command fd `fd` is a copy of.
    pub fn of_fd(fd: i32) -> Option<Arc<Ucontext>> {
        let (identity, _) = fd_identity(fd).ok()?;
        let u = by_identity().lock().unwrap().get(&identity)?.upgrade()?;
        (u.identity == identity).then_some(u)
    }

    /// Stores `obj` under the lowest free handle.
    pub fn insert(&self, obj: Shared) -> u32 {
        let mut objects = self.objects.lock().unwrap();
        let handle = lowest_free(objects.keys());
        objects.insert(handle, obj);
        handle
    }

    /// Runs `f` on the object `handle` names: ENOENT if none (the
    /// kernel's answer for an unknown handle).
    pub fn with<T>(&self, handle: u32, f: impl FnOnce(&mut Shared) -> T) -> Result<T, i32> {
        let mut objects = self.objects.lock().unwrap();
        objects.get_mut(&handle).map(f).ok_or(libc::ENOENT)
    }

    /// Takes the object `handle` names out of the table if `is` says it
    /// is of the right type (dropping it destroys it: an MR is
    /// deregistered); ENOENT if none, EINVAL if of another type (the
    /// kernel's answers).
    pub fn remove(&self, handle: u32, is: fn(&Shared) -> bool) -> Result<Shared, i32> {
        let mut objects = self.objects.lock().unwrap();
        match objects.get(&handle) {
            None => Err(libc::ENOENT),
            Some(o) if !is(o) => Err(libc::EINVAL),
            Some(_) => Ok(objects.remove(&handle).expect("present")),
        }
    }
}

/// The lowest number not among `taken` (ascending), as the kernel's
/// xarray allocates handles.
fn lowest_free<'a>(taken: impl Iterator<Item = &'a u32>) -> u32 {
    let mut next = 0;
    for &t in taken {
        if t != next {
            break;
        }
        next += 1;
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_the_lowest_free_numbers() {
        assert_eq!(lowest_free([].iter()), 0);
        assert_eq!(lowest_free([0, 1, 2].iter()), 3);
        assert_eq!(lowest_free([0, 2, 3].iter()), 1);
        assert_eq!(lowest_free([1, 2].iter()), 0);
    }

    #[test]
    fn fd_identity_tells_files_from_devices() {
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(
            fd_identity(null.as_raw_fd()).unwrap().1,
            "/dev/null is a character device"
        );
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert!(!fd_identity(file.as_raw_fd()).unwrap().1);
        assert_eq!(fd_identity(-1), Err(libc::EBADF));
    }
}
