//! Holds only root can take: an exclusive flock on a file in
//! [`HOLDS_DIR`], a folder only root may enter. The abstract Unix names of
//! [`super::block`] carry no permissions, so any local user could bind
//! them first; these cannot be taken, or even seen, by another user.
//!
//! A file is named after the network namespace (the inode of
//! /proc/thread-self/ns/net), the device's ifindex and the hold, and holds
//! its holder's pid. The lock dies with its process however it ends; the
//! holder unlinks the file when it lets go, and what a SIGKILLed holder
//! leaves (unlocked) the next taker removes. A program that exits
//! without letting go (a C program calling exit() with its device open,
//! as rping does) has its files removed by an exit handler.
//!
//! Sweeping a dead holder's file and listing the holds take the lock for a
//! moment, so a taker that finds a file locked looks at the pid in it: a
//! live holder's means held; none, or a dead one's, means a sweep or a
//! listing has it, and the taker tries again. (Listing by /proc/locks
//! instead would be racy: that table is read a page at a time, and locks
//! taken or released meanwhile anywhere on the host shift the rest, so a
//! held lock can be missed.)

use std::{
    fs::{self, File},
    io,
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
    sync::{Mutex, Once},
};

/// Where root's holds live (0700, root's).
pub(crate) const HOLDS_DIR: &str = "/run/xroce-holds";

/// The calling thread's network namespace, as its inode number.
fn netns_id() -> io::Result<u64> {
    Ok(fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// File name of hold `what` of device `ifindex` in namespace `netns`.
fn file_name(netns: u64, ifindex: u32, what: &str) -> String {
    format!("{netns}.{ifindex}.{what}")
}

/// (ifindex, hold) of a file of namespace `netns`; None for another's.
fn parse_file_name(netns: u64, name: &str) -> Option<(u32, &str)> {
    let (ns, rest) = name.split_once('.')?;
    let (ifindex, what) = rest.split_once('.')?;
    (ns.parse::<u64>().ok()? == netns).then_some((ifindex.parse().ok()?, what))
}

/// Makes [`HOLDS_DIR`] (0700) and refuses one that is not root's alone:
/// whoever could write into it could take or fake root's holds.
fn make_dir() -> io::Result<()> {
    let dir = Path::new(HOLDS_DIR);
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{HOLDS_DIR} is not a folder of root's; remove it"),
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// How long a taker or a lister waits for a sweep or a listing that
/// holds a file's lock for a moment, in tries a millisecond apart.
const TRANSIENT_TRIES: u32 = 2000;

/// Whether `pid` is a running process.
fn alive(pid: u32) -> bool {
    pid != 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid a holder wrote into its file; 0 before it has.
fn holder_pid(file: &File) -> u32 {
    let mut buf = [0u8; 16];
    let n = file.read_at(&mut buf, 0).unwrap_or(0);
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// What a try of a file's lock found.
enum Try {
    /// The lock is ours.
    Locked,
    /// A live process holds it, this one.
    HeldBy(u32),
}

/// Tries `file`'s lock (`LOCK_EX` or `LOCK_SH`) until it is ours or a
/// live holder's, waiting out a sweep or a listing that has it for a
/// moment ([`TRANSIENT_TRIES`]).
fn try_lock(file: &File, how: libc::c_int) -> io::Result<Try> {
    let mut pid = 0;
    for _ in 0..TRANSIENT_TRIES {
        // SAFETY: flock on a descriptor `file` owns; no memory involved.
        if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } == 0 {
            return Ok(Try::Locked);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
        pid = holder_pid(file);
        if alive(pid) {
            return Ok(Try::HeldBy(pid));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Locked all along with no live pid in it: a holder too slow to write
    // one, so held all the same.
    Ok(Try::HeldBy(pid))
}

/// Locks `path` if no one holds it and it is still the file at `path`
/// (whoever let go last may have unlinked it after we opened it).
/// Ok(None) when another process holds it; NotFound when the file (or the
/// folder) went meanwhile.
fn lock_existing(file: File, path: &Path) -> io::Result<Option<RootLock>> {
    if let Try::HeldBy(_) = try_lock(&file, libc::LOCK_EX)? {
        return Ok(None);
    }
    let same =
        fs::symlink_metadata(path).is_ok_and(|m| m.ino() == file.metadata().map_or(0, |f| f.ino()));
    if !same {
        return Err(io::ErrorKind::NotFound.into());
    }
    Ok(Some(RootLock {
        file,
        path: path.to_path_buf(),
    }))
}

/// Removes the files of holders that died without letting go: each is
/// taken as a hold and released, so one a process holds is left alone.
/// (Root only: no one else may look into [`HOLDS_DIR`]; the folder goes
/// too once empty.)
pub fn sweep_stale() {
    let Ok(entries) = fs::read_dir(HOLDS_DIR) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let opened = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path);
        if let Ok(file) = opened {
            // Dropping the lock unlinks the file.
            drop(lock_existing(file, &path));
        }
    }
    let _ = fs::remove_dir(HOLDS_DIR);
}

/// A root-only hold, released (and its file removed) on drop.
#[derive(Debug)]
pub(crate) struct RootLock {
    file: File,
    path: PathBuf,
}

/// Takes hold `what` of device `ifindex`: Ok(None) if another process has
/// it. Only root may (PermissionDenied otherwise, saying so).
pub(crate) fn try_take(ifindex: u32, what: &str) -> io::Result<Option<RootLock>> {
    if !crate::xdp::is_root() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("only root may hold {what} of a device ({HOLDS_DIR})"),
        ));
    }
    let path = Path::new(HOLDS_DIR).join(file_name(netns_id()?, ifindex, what));
    sweep_stale();
    // A holder that lets go unlinks the file: one we opened just before
    // that is no longer the hold, so look again. Bounded: each retry
    // means another process took and released the hold meanwhile.
    for _ in 0..1000 {
        match make_dir() {
            // Another holder's release removed the folder as it emptied,
            // between our mkdir and our look at it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            r => r?,
        }
        let file = match fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            // The folder went with the last hold's release.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            r => r?,
        };
        match lock_existing(file, &path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Ok(Some(lock)) => {
                // Ours from here: a taker that finds it locked sees a live
                // pid, not a sweep (which never writes one).
                lock.file.set_len(0)?;
                lock.file
                    .write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0)?;
                remove_at_exit(&lock.path);
                return Ok(Some(lock));
            }
            r => return r,
        }
    }
    Err(io::Error::other(format!(
        "{}: taken and released too often to lock",
        path.display()
    )))
}

/// The files of the holds this process has now, which [`exit_handler`]
/// removes if the process exits still holding them.
static HELD_HERE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Puts `path` on [`HELD_HERE`], installing the exit handler the first time.
fn remove_at_exit(path: &Path) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: registers a function that takes no arguments, never
        // unwinds and touches only statics. In a shared library glibc
        // runs it at exit() or, earlier, when the library is unloaded.
        unsafe { libc::atexit(exit_handler) };
    });
    HELD_HERE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(path.to_path_buf());
}

/// Removes the files of the holds the process still has as it exits. The
/// locks go only when the kernel closes the files a moment later; a taker
/// that comes in between and creates the file anew is safe all the same:
/// an AF_XDP socket waits out the queue the dying one still binds
/// (`io::afxdp::socket`), and a QPN block whose UDP port is still bound
/// is skipped.
extern "C" fn exit_handler() {
    // try_lock: a thread that called exit() while another held the list
    // must not hang; its holds are left to the next taker's sweep.
    if let Ok(held) = HELD_HERE.try_lock() {
        for path in held.iter() {
            let _ = fs::remove_file(path);
        }
        if !held.is_empty() {
            let _ = fs::remove_dir(HOLDS_DIR);
        }
    }
}

impl Drop for RootLock {
    fn drop(&mut self) {
        HELD_HERE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| p != &self.path);
        // Unlinked while still locked, so no one locks a file that is
        // about to go; then the folder, if that was the last hold.
        let _ = fs::remove_file(&self.path);
        let _ = fs::remove_dir(HOLDS_DIR);
        let _ = &self.file;
    }
}

/// Every root hold of the calling thread's network namespace that a
/// process holds now, with that process: (ifindex, hold, pid). Empty for
/// anyone but root, who alone may look into [`HOLDS_DIR`].
pub(crate) fn held() -> Vec<(u32, String, u32)> {
    let (Ok(netns), Ok(entries)) = (netns_id(), fs::read_dir(HOLDS_DIR)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((ifindex, what)) = name.to_str().and_then(|n| parse_file_name(netns, n)) else {
            continue;
        };
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(e.path());
        // A shared lock is ours exactly when no holder has the exclusive
        // one; ours goes when the file closes.
        if let Ok(Try::HeldBy(pid)) = opened.and_then(|f| try_lock(&f, libc::LOCK_SH)) {
            out.push((ifindex, what.to_string(), pid));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip_within_their_namespace() {
        let name = file_name(4026531840, 7, "block.200");
        assert_eq!(parse_file_name(4026531840, &name), Some((7, "block.200")));
        assert_eq!(parse_file_name(4026531841, &name), None);
        assert_eq!(parse_file_name(4026531840, "junk"), None);
    }

    /// What a SIGKILLed holder leaves (an unlocked file) goes with the next
    /// take; a held one stays.
    #[test]
    fn a_dead_holders_file_is_swept_a_live_ones_kept() {
        let ifindex = 0x7fc0_0000 + std::process::id() % 0x1000;
        let live = try_take(ifindex, "block.200").unwrap().unwrap();
        let stale = Path::new(HOLDS_DIR).join(file_name(netns_id().unwrap(), ifindex, "afxdp"));
        fs::write(&stale, "").unwrap();
        let other = try_take(ifindex, "block.201").unwrap().unwrap();
        assert!(!stale.exists(), "swept");
        assert!(live.path.exists() && other.path.exists());
    }

    /// Set in the child [`a_program_that_exits_holding_leaves_no_file`]
    /// starts: the ifindex whose hold the child takes before it exits.
    const EXIT_CHILD: &str = "XROCE_TEST_ROOT_LOCK_EXIT_CHILD";

    /// The child's part: take a hold and exit() with it, as a C program
    /// that never closes its device does. Does nothing in a normal run.
    #[test]
    fn exit_child_takes_a_hold_and_exits() {
        if let Ok(ifindex) = std::env::var(EXIT_CHILD) {
            let lock = try_take(ifindex.parse().unwrap(), "afxdp")
                .unwrap()
                .unwrap();
            std::mem::forget(lock);
            std::process::exit(0);
        }
    }

    /// A process that exits still holding (no destructor runs) leaves no
    /// file: the next taker's sweep is no help when none comes.
    #[test]
    fn a_program_that_exits_holding_leaves_no_file() {
        let ifindex = 0x7fa0_0000 + std::process::id() % 0x1000;
        let path = Path::new(HOLDS_DIR).join(file_name(netns_id().unwrap(), ifindex, "afxdp"));
        let st = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "device::root_lock::tests::exit_child_takes_a_hold_and_exits",
            ])
            .env(EXIT_CHILD, ifindex.to_string())
            .status()
            .unwrap();
        assert!(st.success());
        assert!(
            !path.exists(),
            "{} left after its holder exited",
            path.display()
        );
    }

    /// Root's holds are exclusive, seen with their pid, and leave no file.
    #[test]
    fn a_hold_is_exclusive_listed_and_removed_on_release() {
        let ifindex = 0x7fd0_0000 + std::process::id() % 0x1000;
        let a = try_take(ifindex, "afxdp").unwrap().expect("free");
        assert!(try_take(ifindex, "afxdp").unwrap().is_none(), "exclusive");
        assert!(held().contains(&(ifindex, "afxdp".into(), std::process::id())));
        let path = a.path.clone();
        drop(a);
        assert!(!path.exists(), "the file goes with the hold");
        assert!(!held().iter().any(|h| h.0 == ifindex));
        assert!(try_take(ifindex, "afxdp").unwrap().is_some(), "free again");
    }

    /// Sweeps and listings, which lock files for a moment, never make a
    /// free hold look taken or a held one look free.
    #[test]
    fn takes_and_listings_are_right_beside_sweeps_and_listings() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
        let ifindex = 0x7fb0_0000 + std::process::id() % 0x1000;
        let me = std::process::id();
        let _held = try_take(ifindex, "block.300").unwrap().expect("free");
        let stop = AtomicBool::new(false);
        let wrong = AtomicUsize::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Relaxed) {
                    sweep_stale();
                }
            });
            s.spawn(|| {
                while !stop.load(Relaxed) {
                    if !held().contains(&(ifindex, "block.300".into(), me)) {
                        wrong.fetch_add(1, Relaxed);
                    }
                }
            });
            for i in 0..300 {
                // What a SIGKILLed holder (a pid no process has) leaves.
                let stale =
                    Path::new(HOLDS_DIR).join(file_name(netns_id().unwrap(), ifindex, "block.301"));
                let _ = fs::write(&stale, "4194305\n");
                let what = if i % 2 == 0 { "block.301" } else { "block.302" };
                if try_take(ifindex, what).unwrap().is_none() {
                    wrong.fetch_add(1, Relaxed);
                }
            }
            stop.store(true, Relaxed);
        });
        assert_eq!(
            wrong.load(Relaxed),
            0,
            "free holds refused or a held one unlisted"
        );
    }
}
