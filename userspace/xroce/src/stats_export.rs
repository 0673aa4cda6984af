//! Publishes a running engine's counters where `xroce stats` (another
//! process) can read them: `/run/xroce/<iface>/engine.<pid>`, one
//! `name value` line per counter and a `qpns` line listing its live QPs
//! (for `xroce status`), rewritten atomically every half second
//! and removed when the exporter stops. What a killed process left (its
//! file, a folder left empty) is swept by the next exporter that starts or
//! stops and by readers.
//!
//! The folders are 0700 and the files 0600: an engine's counters and QPNs
//! are its owner's (root's) business, not every local user's.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Once,
    },
    thread::JoinHandle,
    time::Duration,
};

use crate::{engine::EngineStats, verbs::Device};

const EXPORT_ROOT: &str = "/run/xroce";

/// Makes `dir` and the folders above it up to /run/xroce, private to their
/// owner (a folder an older xroce made 0755 is narrowed).
fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    for d in dir.ancestors().take_while(|d| d.starts_with(EXPORT_ROOT)) {
        let meta = fs::metadata(d)?;
        if meta.permissions().mode() & 0o077 != 0 {
            fs::set_permissions(d, fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

/// Writes `text` to a new file readable by its owner alone.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?
        .write_all(text.as_bytes())
}

/// Where engines running on `iface` publish their counters.
pub fn export_dir(iface: &str) -> PathBuf {
    Path::new(EXPORT_ROOT).join(iface)
}

/// The process that wrote `engine.<pid>` (or its `engine.<pid>.tmp`).
fn writer_pid(file_name: &std::ffi::OsStr) -> Option<u32> {
    let rest = file_name.to_str()?.strip_prefix("engine.")?;
    rest.split('.').next()?.parse().ok()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the files of exited processes in one interface's folder, then
/// the folder if that left it empty (`remove_dir` refuses a non-empty one).
fn sweep_dir(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if writer_pid(&e.file_name()).is_some_and(|pid| !alive(pid)) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// [`sweep_dir`] over every interface's folder: what SIGKILLed processes
/// and interfaces that are gone left under /run/xroce.
pub fn sweep_stale() {
    if let Ok(dirs) = fs::read_dir(EXPORT_ROOT) {
        for d in dirs.flatten() {
            sweep_dir(&d.path());
        }
    }
    let _ = fs::remove_dir(EXPORT_ROOT);
}

/// Key of the line that lists the live QPs (hexadecimal QPNs).
const QPNS: &str = "qpns";

/// The exported file's text: one `name value` line per counter, every
/// field of [`EngineStats`] in declaration order (the list its declaration
/// generates, so none can be left out), then `qpns` and the live QPs.
fn render(s: &EngineStats, qpns: &[u32]) -> String {
    let mut text: String = s.fields().map(|(k, v)| format!("{k} {v}\n")).collect();
    text.push_str(QPNS);
    for q in qpns {
        text.push_str(&format!(" {q:#x}"));
    }
    text.push('\n');
    text
}

/// Parses what [`render`] wrote: the counters, and the QPs if listed.
fn parse(text: &str) -> (Vec<(String, u64)>, Option<Vec<u32>>) {
    let mut qpns = None;
    let fields = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ').unwrap_or((l, ""));
            if k == QPNS {
                let hex = |q: &str| u32::from_str_radix(q.trim_start_matches("0x"), 16).ok();
                qpns = Some(v.split_whitespace().filter_map(hex).collect());
                return None;
            }
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect();
    (fields, qpns)
}

/// Counters published by one live engine.
#[derive(Debug, Clone)]
pub struct Published {
    pub pid: u32,
    pub fields: Vec<(String, u64)>,
    /// Its live QPs (None: a writer that does not list them).
    pub qpns: Option<Vec<u32>>,
}

/// Reads what live engines on `iface` published; files of processes that
/// are gone are skipped (and removed when we may).
pub fn read_published(iface: &str) -> Vec<Published> {
    sweep_dir(&export_dir(iface));
    let Ok(dir) = fs::read_dir(export_dir(iface)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| n.ends_with(".tmp")) {
            continue;
        }
        // A writer that exits after the sweep leaves a file the next
        // sweep takes; until then it is not a live engine.
        let Some(pid) = writer_pid(&name).filter(|&pid| alive(pid)) else {
            continue;
        };
        let Ok(text) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let (fields, qpns) = parse(&text);
        out.push(Published { pid, fields, qpns });
    }
    out.sort_by_key(|p| p.pid);
    out
}

/// Writes `device`'s counters for `iface` until dropped.
pub struct StatsExporter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl StatsExporter {
    /// Starts publishing `device`'s counters (every shard's, for a
    /// [`Device::spreading`] handle); if /run/xroce cannot be written (not
    /// root), the exporter does nothing: counters are a convenience, not a
    /// must.
    pub fn start(device: Device, iface: &str) -> Self {
        let dir = export_dir(iface);
        let path = dir.join(format!("engine.{}", std::process::id()));
        let stop = Arc::new(AtomicBool::new(false));
        sweep_stale();
        remove_at_exit();
        // Only a folder we may not make stops the exporter. Another
        // process's sweep can remove an empty /run/xroce while
        // create_dir_all makes it (NotFound): the loop makes it again.
        let may_write = match make_private_dir(&dir) {
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            Ok(()) => true,
        };
        let thread = may_write.then(|| {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                // Per process: with_extension would make every process's
                // temporary file the same `engine.tmp`.
                let tmp = PathBuf::from(format!("{}.tmp", path.display()));
                while !stop.load(Ordering::Acquire) {
                    // Summed over a spreading handle's shards; their QPs
                    // listed together.
                    let stats = device.stats();
                    let qpns: Vec<_> = device
                        .members()
                        .iter()
                        .flat_map(|d| d.lock().qp_numbers().collect::<Vec<_>>())
                        .collect();
                    publish(&dir, &tmp, &path, &render(&stats, &qpns));
                    // Woken early by drop (unpark), which then joins: closing
                    // a device must not wait out the period.
                    std::thread::park_timeout(Duration::from_millis(500));
                }
            })
        });
        Self { stop, thread, path }
    }
}

/// Writes `text` to `path` atomically (through `tmp`). Another process's
/// sweep may take the folder while it is empty, between our making it and
/// our write: then make it again, a few times.
fn publish(dir: &Path, tmp: &Path, path: &Path, text: &str) {
    for _ in 0..3 {
        if EXITING.load(Ordering::Acquire) {
            return;
        }
        let _ = make_private_dir(dir);
        match write_private(tmp, text) {
            Ok(()) => {
                let _ = fs::rename(tmp, path);
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return,
        }
    }
}

/// Set by the exit handler: exporters still running write no more.
static EXITING: AtomicBool = AtomicBool::new(false);

/// A C program under the drop-in libibverbs often exits without closing
/// its device, so no exporter is dropped: remove this process's files
/// when it exits (exit(3) or a return from main), once per process.
fn remove_at_exit() {
    static REGISTER: Once = Once::new();
    extern "C" fn remove_own_files() {
        EXITING.store(true, Ordering::Release);
        let me = std::process::id();
        if let Ok(dirs) = fs::read_dir(EXPORT_ROOT) {
            for d in dirs.flatten() {
                for name in [format!("engine.{me}"), format!("engine.{me}.tmp")] {
                    let _ = fs::remove_file(d.path().join(name));
                }
                let _ = fs::remove_dir(d.path());
            }
        }
        let _ = fs::remove_dir(EXPORT_ROOT);
    }
    REGISTER.call_once(|| {
        // SAFETY: registers a plain function with no arguments; it touches
        // only the file system and an atomic, which stay usable during
        // exit handlers.
        unsafe { libc::atexit(remove_own_files) };
    });
}

impl Drop for StatsExporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        let _ = fs::remove_file(&self.path);
        // The interface's folder goes with its last exporter (remove_dir
        // leaves a folder another process still publishes in), and so does
        // what killed processes left.
        sweep_stale();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sweep_removes_what_exited_processes_left_and_then_the_empty_folder() {
        let dir = std::env::temp_dir().join(format!("xroce-sweep-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // No process has a pid this high (pid_max is at most 2^22).
        let dead = 0x7fff_fff0u32;
        let me = std::process::id();
        for name in [format!("engine.{dead}"), format!("engine.{dead}.tmp")] {
            fs::write(dir.join(name), "x 1\n").unwrap();
        }
        fs::write(dir.join(format!("engine.{me}")), "x 1\n").unwrap();
        sweep_dir(&dir);
        let left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            left,
            vec![format!("engine.{me}")],
            "a live writer's file stays"
        );
        fs::remove_file(dir.join(format!("engine.{me}"))).unwrap();
        sweep_dir(&dir);
        assert!(!dir.exists(), "an emptied folder is removed");
    }

    use super::*;

    #[test]
    fn published_files_and_folders_are_private_to_their_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir()
            .join(format!("xroce-private-{}", std::process::id()))
            .join("veth0");
        let path = dir.join("engine.1");
        let tmp = dir.join("engine.1.tmp");
        publish(&dir, &tmp, &path, "x 1\n");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "the interface's folder");
        assert_eq!(mode(&path), 0o600, "the published file");
        assert_eq!(fs::read_to_string(&path).unwrap(), "x 1\n");
        fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn every_engine_counter_is_exported() {
        // Every field is a u64 counter, so the name table covers the
        // struct exactly when their sizes agree.
        assert_eq!(
            EngineStats::NAMES.len() * size_of::<u64>(),
            size_of::<EngineStats>()
        );
        let mut names = EngineStats::NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EngineStats::NAMES.len());
        // The two the hand-written list once missed.
        for n in ["rx_bad_header", "async_events_dropped"] {
            assert!(EngineStats::NAMES.contains(&n), "{n} not exported");
        }

        let stats = EngineStats {
            rx_bad_header: 7,
            async_events_dropped: 9,
            cq_overflows: 3,
            ..EngineStats::default()
        };
        let (read, qpns) = parse(&render(&stats, &[0x11, 0x1_0012]));
        assert_eq!(qpns, Some(vec![0x11, 0x1_0012]));
        assert_eq!(parse(&render(&stats, &[])).1, Some(vec![]));
        assert_eq!(parse("tx_frames 3\n").1, None, "written before qpns");
        let names: Vec<_> = read.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, EngineStats::NAMES);
        assert_eq!(
            read,
            stats
                .fields()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<Vec<_>>()
        );
        assert!(read.contains(&("rx_bad_header".into(), 7)));
        assert!(read.contains(&("async_events_dropped".into(), 9)));
    }
}
