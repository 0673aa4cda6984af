//! Runs `xroce experiment incast` (which builds and removes its own
//! namespaces) and reads what it wrote: summary.json, the senders' traces
//! and queue.csv.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use serde_json::Value;

use crate::workspace_bin;

/// One finished experiment.
pub struct Incast {
    pub dir: PathBuf,
    pub summary: Value,
    pub stderr: String,
}

/// One row of a sender's trace.
#[derive(Clone, Copy, Debug)]
pub struct TraceRow {
    pub t_ms: f64,
    pub bytes: u64,
    pub rate_bps: f64,
    pub cnps: u64,
    pub retransmits: u64,
}

fn base36(mut n: u32) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap()
}

/// Namespaces and XDP pin directories of the experiment run by process
/// `pid` that still exist (its names carry the PID in base 36).
pub fn leftovers(pid: u32) -> (Vec<String>, Vec<String>) {
    let tag = base36(pid);
    let list = |dir: &str, prefix: String| -> Vec<String> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect()
    };
    (
        list("/run/netns", format!("xroce-exp-{tag}-")),
        list(xroce_common::names::PIN_ROOT, format!("xe{tag}")),
    )
}

/// Processes whose command line mentions `needle` (e.g. an output folder).
pub fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then_some((pid, cmdline))
        })
        .collect()
}

/// Runs `xroce experiment incast ARGS --out <temp dir>`, fails the test with
/// its stderr if it fails or a sender's QP ran out of retries, and checks
/// that it left no namespace or XDP pin behind and wrote every output file.
pub fn run_incast(name: &str, args: &[&str]) -> Incast {
    let incast = run_incast_where_qps_may_give_up(name, args);
    let given_up = incast.qp_errors();
    assert!(
        given_up.is_empty(),
        "QPs ran out of retries: {given_up:?}: {}",
        incast.brief()
    );
    incast
}

/// [`run_incast`] for a run where a sender's QP may run out of retries
/// (no congestion control into a tail-drop buffer, loss injected): that
/// flow's run ends there, and the experiment reports it
/// ([`Incast::qp_errors`]).
pub fn run_incast_where_qps_may_give_up(name: &str, args: &[&str]) -> Incast {
    let dir = std::env::temp_dir().join(format!("xroce-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let child = Command::new(workspace_bin("xroce"))
        .args(["experiment", "incast"])
        .args(args)
        .arg("--out")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start xroce experiment");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for xroce experiment");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let (netns_left, pins_left) = leftovers(pid);
    assert!(
        netns_left.is_empty(),
        "namespaces left behind: {netns_left:?}"
    );
    assert!(pins_left.is_empty(), "XDP pins left behind: {pins_left:?}");
    assert!(
        out.status.success(),
        "xroce experiment incast {args:?} failed ({}); outputs in {}:\n{stderr}",
        out.status,
        dir.display()
    );
    for file in [
        "summary.json",
        "flows.csv",
        "queue.csv",
        "flows.svg",
        "rates.svg",
        "queue.svg",
    ] {
        let path = dir.join(file);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "{} is missing or empty", path.display());
    }
    let summary = serde_json::from_str(
        &std::fs::read_to_string(dir.join("summary.json")).expect("read summary.json"),
    )
    .expect("summary.json is JSON");
    Incast {
        dir,
        summary,
        stderr,
    }
}

impl Incast {
    /// A number from summary.json by JSON pointer, e.g. "/queue/peak_bytes".
    pub fn num(&self, pointer: &str) -> f64 {
        self.summary
            .pointer(pointer)
            .and_then(Value::as_f64)
            .unwrap_or_else(|| panic!("summary.json has no number at {pointer}: {}", self.brief()))
    }

    /// "sender N: why" for each sender whose QP ran out of retries.
    pub fn qp_errors(&self) -> Vec<String> {
        self.summary["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| Some(format!("sender {}: {}", f["flow"], f["qp_error"].as_str()?)))
            .collect()
    }

    /// Sender `flow`'s `--trace` CSV.
    pub fn trace(&self, flow: usize) -> Vec<TraceRow> {
        let path = self.dir.join(format!("trace{flow}.csv"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        text.lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let f: Vec<f64> = l.split(',').map(|x| x.trim().parse().unwrap()).collect();
                TraceRow {
                    t_ms: f[0],
                    bytes: f[1] as u64,
                    rate_bps: f[2],
                    cnps: f[3] as u64,
                    retransmits: f[4] as u64,
                }
            })
            .collect()
    }

    /// The figures a failing assertion should show.
    pub fn brief(&self) -> String {
        let s = &self.summary;
        format!(
            "[{}: aggregate {} Gbit/s, Jain {} (short-term {}), queue {}, marks {}, CNPs {} (seen {}), drops {}, retransmits {}; outputs in {}]",
            s["settings"]["cc"],
            s["aggregate_gbps"],
            s["jain_index"],
            s["jain_short_term"],
            s["queue"],
            s["marks"],
            s["cnps"],
            s["cnps_seen_at_senders"],
            s["drops"],
            s["retransmits"],
            self.dir.display()
        )
    }

    /// Removes the output folder (call once the test passed).
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CSV file an experiment wrote, as its header and one map per row by
/// column name (the outputs have no quoting).
pub fn csv_rows(
    path: &std::path::Path,
) -> (Vec<String>, Vec<std::collections::BTreeMap<String, String>>) {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap_or_else(|| panic!("{} has no header", path.display()))
        .split(',')
        .map(str::to_string)
        .collect();
    let rows = lines
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(str::to_string))
                .collect()
        })
        .collect();
    (header, rows)
}
