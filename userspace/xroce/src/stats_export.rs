//! Publishes a running engine's counters where `xroce stats` (another
//! process) can read them: `/run/xroce/<iface>/engine.<pid>`, one
//! `name value` line per counter, rewritten atomically every half second
//! and removed when the exporter stops.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use crate::{engine::EngineStats, verbs::Device};

/// Where engines running on `iface` publish their counters.
pub fn export_dir(iface: &str) -> PathBuf {
    Path::new("/run/xroce").join(iface)
}

/// The counters as (name, value) pairs, in a stable order.
pub fn engine_fields(s: &EngineStats) -> Vec<(&'static str, u64)> {
    vec![
        ("rx_frames", s.rx_frames),
        ("rx_bytes", s.rx_bytes),
        ("rx_malformed", s.rx_malformed),
        ("rx_bad_icrc", s.rx_bad_icrc),
        ("rx_not_roce", s.rx_not_roce),
        ("rx_unknown_qp", s.rx_unknown_qp),
        ("rx_bad_state", s.rx_bad_state),
        ("rx_unsupported", s.rx_unsupported),
        ("rx_duplicate", s.rx_duplicate),
        ("rx_out_of_sequence", s.rx_out_of_sequence),
        ("rx_ghost_response", s.rx_ghost_response),
        ("rx_bad_response", s.rx_bad_response),
        ("rx_dropped_other", s.rx_dropped_other),
        ("tx_frames", s.tx_frames),
        ("tx_bytes", s.tx_bytes),
        ("tx_data_packets", s.tx_data_packets),
        ("tx_retransmitted", s.tx_retransmitted),
        ("tx_acks", s.tx_acks),
        ("tx_read_responses", s.tx_read_responses),
        ("tx_atomic_acks", s.tx_atomic_acks),
        ("tx_naks_seq", s.tx_naks_seq),
        ("tx_naks_rnr", s.tx_naks_rnr),
        ("tx_naks_other", s.tx_naks_other),
        ("tx_cnps", s.tx_cnps),
        ("rx_cnps", s.rx_cnps),
        ("rx_ce_marked", s.rx_ce_marked),
        ("retry_timeouts", s.retry_timeouts),
        ("retries_started", s.retries_started),
        ("rx_rnr_naks", s.rx_rnr_naks),
        ("rx_seq_naks", s.rx_seq_naks),
        ("atomic_replays", s.atomic_replays),
        ("read_reexecuted", s.read_reexecuted),
        ("cq_overflows", s.cq_overflows),
    ]
}

/// Counters published by one live engine.
#[derive(Debug, Clone)]
pub struct Published {
    pub pid: u32,
    pub fields: Vec<(String, u64)>,
}

/// Reads what live engines on `iface` published; files of processes that
/// are gone are skipped (and removed when we may).
pub fn read_published(iface: &str) -> Vec<Published> {
    let Ok(dir) = fs::read_dir(export_dir(iface)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("engine."))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_file(entry.path());
            continue;
        }
        let Ok(text) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let fields = text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect();
        out.push(Published { pid, fields });
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
    /// Starts publishing; if /run/xroce cannot be written (not root), the
    /// exporter does nothing: counters are a convenience, not a must.
    pub fn start(device: Device, iface: &str) -> Self {
        let dir = export_dir(iface);
        let path = dir.join(format!("engine.{}", std::process::id()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = fs::create_dir_all(&dir).ok().map(|()| {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                let tmp = path.with_extension("tmp");
                while !stop.load(Ordering::Acquire) {
                    let text: String = engine_fields(&device.stats())
                        .iter()
                        .map(|(k, v)| format!("{k} {v}\n"))
                        .collect();
                    if fs::write(&tmp, text).is_ok() {
                        let _ = fs::rename(&tmp, &path);
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        });
        Self { stop, thread, path }
    }
}

impl Drop for StatsExporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = fs::remove_file(&self.path);
    }
}
