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

/// The exported file's text: one `name value` line per counter, every
/// field of [`EngineStats`] in declaration order (the list its declaration
/// generates, so none can be left out).
fn render(s: &EngineStats) -> String {
    s.fields().map(|(k, v)| format!("{k} {v}\n")).collect()
}

/// Parses what [`render`] wrote.
fn parse(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
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
        let fields = parse(&text);
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
                    let text = render(&device.stats());
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
        // The interface's folder goes with its last exporter (remove_dir
        // leaves a folder another process still publishes in).
        if let Some(dir) = self.path.parent() {
            let _ = fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let read = parse(&render(&stats));
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
