//! Publishes a running engine's counters where `xroce stats` (another
//! process) can read them: `/run/xroce/<iface>/engine.<pid>`, one
//! `name value` line per counter, a `qpns` line listing its live QPs
//! (for `xroce status`) and a `qp v1 {JSON}` line per QP with its state
//! (`qp_line`, for `xroce status --qps` and `xroce exporter`), rewritten
//! atomically every half second
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

use xroce_report::QpStatus;

use crate::{engine::EngineStats, io::IoStats, verbs::Device};

pub mod qp_line;

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

/// What the backend's counters ([`IoStats`]) are published under: the
/// packet I/O's own view (kernel ring drops and the like), beside the
/// engine's.
pub const IO_PREFIX: &str = "io_";

/// Key of the line that lists the live QPs (hexadecimal QPNs).
const QPNS: &str = "qpns";

/// The exported file's text: one `name value` line per counter, every
/// field of [`EngineStats`] in declaration order (the list its declaration
/// generates, so none can be left out), then `qpns` and the live QPs, then
/// a line per QP with its state.
fn render(s: &EngineStats, io: &IoStats, qps: &[QpStatus]) -> String {
    let mut text: String = s.fields().map(|(k, v)| format!("{k} {v}\n")).collect();
    for (k, v) in io.fields() {
        text.push_str(&format!("{IO_PREFIX}{k} {v}\n"));
    }
    text.push_str(QPNS);
    for q in qps {
        text.push_str(&format!(" {:#x}", q.qpn));
    }
    text.push('\n');
    for q in qps {
        text.push_str(&qp_line::render(q));
    }
    text
}

/// What [`parse`] reads from a published file.
struct Parsed {
    fields: Vec<(String, u64)>,
    qpns: Option<Vec<u32>>,
    qps: Option<Vec<QpStatus>>,
}

/// Parses what [`render`] wrote: the counters, the QPs if listed, and
/// their state if published (lines of another format are skipped).
fn parse(text: &str) -> Parsed {
    let (mut qpns, mut qps) = (None, None::<Vec<QpStatus>>);
    let fields = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ').unwrap_or((l, ""));
            if k == QPNS {
                let hex = |q: &str| u32::from_str_radix(q.trim_start_matches("0x"), 16).ok();
                qpns = Some(v.split_whitespace().filter_map(hex).collect());
                // Writers that list QPs write a line per QP after it.
                qps.get_or_insert_with(Vec::new);
                return None;
            }
            if k == qp_line::KEY {
                if let (Some(q), Some(list)) = (qp_line::parse(v), qps.as_mut()) {
                    list.push(q);
                }
                return None;
            }
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect();
    Parsed { fields, qpns, qps }
}

/// Counters published by one live engine.
#[derive(Debug, Clone)]
pub struct Published {
    pub pid: u32,
    pub fields: Vec<(String, u64)>,
    /// Its live QPs (None: a writer that does not list them).
    pub qpns: Option<Vec<u32>>,
    /// Their state, by QPN (None: a writer that does not publish it).
    pub qps: Option<Vec<QpStatus>>,
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
        let Parsed { fields, qpns, qps } = parse(&text);
        // A writer of QP lines writes one per listed QP: none written
        // means it is one that does not publish them.
        let qps = qps.filter(|q| !q.is_empty() || qpns.as_ref().is_some_and(|n| n.is_empty()));
        out.push(Published {
            pid,
            fields,
            qpns,
            qps,
        });
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
                    let io = device.io_stats();
                    let mut qps: Vec<QpStatus> = device
                        .members()
                        .iter()
                        .flat_map(|d| d.lock().qp_infos())
                        .map(|q| qp_line::status_of(&q))
                        .collect();
                    qps.sort_by_key(|q| q.qpn);
                    publish(&dir, &tmp, &path, &render(&stats, &io, &qps));
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

    /// A QP in RTS with every number distinct.
    fn qp(qpn: u32) -> QpStatus {
        QpStatus {
            qpn,
            qp_type: "RC".into(),
            state: "RTS".into(),
            peer_gid: Some("::ffff:10.1.2.3".into()),
            peer_qpn: Some(qpn + 1),
            mtu: 4096,
            sq_psn: 1,
            next_send_psn: 2,
            oldest_unacked_psn: 3,
            rq_psn: 4,
            expected_recv_psn: 5,
            inflight_pkts: 6,
            send_window_pkts: 7,
            send_queue: 8,
            recv_queue: 9,
            cc: "dcqcn".into(),
            rate_bps: 10,
            last_rtt_ns: Some(11),
            srtt_ns: None,
            last_fabric_rtt_ns: None,
            selective_repeat: true,
            sr_requester: true,
            sr_responder: false,
            tx_packets: 12,
            tx_bytes: 13,
            retransmitted: 14,
            timeouts: 15,
            rnr_naks_received: 16,
            seq_naks_received: 17,
            rx_packets: 18,
            ce_marked_received: 19,
            cnps_sent: 20,
            cnps_received: 21,
        }
    }

    #[test]
    fn qp_lines_are_read_back_and_skipped_by_counter_readers() {
        let text = render(&EngineStats::default(), &IoStats::default(), &[qp(0x10011)]);
        let line = text.lines().last().unwrap();
        assert!(line.starts_with("qp v1 {\"qpn\":65553,"), "{line}");
        // The reader before QP lines: `name value`, a value that is no
        // number skipped.
        let old: Vec<_> = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, v)| v.trim().parse::<u64>().is_ok())
            .collect();
        let io_fields = IoStats::NAMES.len();
        assert_eq!(old.len(), EngineStats::NAMES.len() + io_fields);
        // A later version's line, a line cut short: skipped.
        let more = format!("{text}qp v2 {{\"qpn\":1}}\nqp v1 {{\"qpn\":2,\n");
        let p = parse(&more);
        assert_eq!(p.qps, Some(vec![qp(0x10011)]));
        assert_eq!(p.fields.len(), EngineStats::NAMES.len() + io_fields);
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
        let qps = [qp(0x11), qp(0x1_0012)];
        let io = IoStats {
            rx_frames: 5,
            rx_ring_full: 2,
            ..IoStats::default()
        };
        let Parsed {
            fields: mut read,
            qpns,
            qps: read_qps,
        } = parse(&render(&stats, &io, &qps));
        // The backend's counters follow the engine's, prefixed.
        let read_io = read.split_off(EngineStats::NAMES.len());
        assert_eq!(
            read_io,
            io.fields()
                .map(|(k, v)| (format!("{IO_PREFIX}{k}"), v))
                .collect::<Vec<_>>()
        );
        assert_eq!(qpns, Some(vec![0x11, 0x1_0012]));
        assert_eq!(read_qps.as_deref(), Some(&qps[..]));
        assert_eq!(
            parse(&render(&stats, &IoStats::default(), &[])).qpns,
            Some(vec![])
        );
        assert_eq!(parse("tx_frames 3\n").qpns, None, "written before qpns");
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
