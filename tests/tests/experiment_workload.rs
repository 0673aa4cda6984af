//! `xroce experiment workload` and `xroce experiment compare` end to end:
//! 2 senders, 40 flows from a CDF file in the HPCC simulator's format, a
//! 100 Mbit/s bottleneck at half load. Every flow completes exactly once
//! with its data verified at the receiver (flows.csv has each flow id once,
//! arrived once, verified); the same seed gives the same flows (schedule.csv
//! of the workload run and of each compare run are identical); compare
//! writes one run per controller (here through the delay bottleneck) and
//! draws one series per controller.
//! The experiments make and remove their own namespaces; run under
//! `flock /tmp/xroce-netns.lock` beside other namespace tests.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::Value;
use xroce_tests::{
    experiment::{csv_rows, leftovers},
    require_root, workspace_bin,
};

const FLOWS: usize = 40;

/// Sizes 64 B..200 KB (HPCC's format: `size_bytes cdf_percent`).
const CDF: &str = "64 0\n1000 30\n10000 60\n50000 90\n200000 100\n";

fn common(cdf: &Path) -> Vec<String> {
    [
        "--senders",
        "2",
        "--flows",
        "40",
        "--link-rate",
        "100mbit",
        "--load",
        "0.5",
        "--seed",
        "11",
        "--qps",
        "4",
        "--arena",
        "4MiB",
        "--port",
        "18620",
        "--cdf",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(std::iter::once(cdf.display().to_string()))
    .collect()
}

/// Runs `xroce experiment SUB ARGS --out DIR`; fails with its stderr if it
/// fails or leaves namespaces or XDP pins behind.
fn run(sub: &str, args: &[String], dir: &Path) -> String {
    let _ = std::fs::remove_dir_all(dir);
    let child = Command::new(workspace_bin("xroce"))
        .args(["experiment", sub])
        .args(args)
        .arg("--out")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start xroce experiment");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for xroce experiment");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let (netns, pins) = leftovers(pid);
    assert!(netns.is_empty(), "namespaces left behind: {netns:?}");
    assert!(pins.is_empty(), "XDP pins left behind: {pins:?}");
    assert!(
        out.status.success(),
        "xroce experiment {sub} {args:?} failed ({}); outputs in {}:\n{stderr}",
        out.status,
        dir.display()
    );
    stderr
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// flows.csv as one map per row, by column name.
fn flows_csv(dir: &Path) -> Vec<BTreeMap<String, String>> {
    csv_rows(&dir.join("flows.csv")).1
}

/// Every flow of the schedule once, arrived once, verified, with an FCT.
fn check_run(dir: &Path) {
    let rows = flows_csv(dir);
    let mut ids: Vec<usize> = rows.iter().map(|r| r["flow"].parse().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..FLOWS).collect::<Vec<_>>(),
        "flows.csv in {} does not hold each flow once",
        dir.display()
    );
    for r in &rows {
        assert_eq!(r["deliveries"], "1", "flow arrived other than once: {r:?}");
        assert_eq!(r["verified"], "1", "flow not verified: {r:?}");
        let fct: f64 = r["fct_us"].parse().expect("an FCT");
        let ideal: f64 = r["ideal_us"].parse().unwrap();
        assert!(fct > 0.0 && ideal > 0.0, "{r:?}");
        let slowdown: f64 = r["slowdown"].parse().unwrap();
        assert!(
            (slowdown - fct / ideal).abs() < 1e-3 * slowdown.max(1.0),
            "{r:?}"
        );
    }
    let summary: Value = serde_json::from_str(&read(&dir.join("summary.json"))).unwrap();
    assert_eq!(summary["flows"], FLOWS, "{summary}");
    assert_eq!(summary["completed"], FLOWS, "{summary}");
    assert_eq!(summary["verified"], FLOWS, "{summary}");
    assert_eq!(
        summary["errors"].as_array().map(Vec::len),
        Some(0),
        "{summary}"
    );
    let buckets = summary["slowdown"].as_array().expect("slowdown buckets");
    let all = buckets.last().unwrap();
    assert_eq!(all["bucket"], "all");
    assert_eq!(all["flows"], FLOWS);
    assert!(all["p99"].as_f64().unwrap() >= all["p50"].as_f64().unwrap());
    assert!(
        summary["queue"]["samples"].as_u64().unwrap() > 0,
        "{summary}"
    );
    for file in ["slowdown.svg", "queue_cdf.svg", "queue.csv", "schedule.csv"] {
        let len = std::fs::metadata(dir.join(file))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 0, "{} is missing or empty", dir.join(file).display());
    }
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xroce-{name}-{}", std::process::id()))
}

#[test]
fn workload_completes_every_flow_once_and_compare_repeats_it_per_controller() {
    require_root();
    let cdf = temp("wl-cdf.txt");
    std::fs::write(&cdf, CDF).unwrap();
    let args = common(&cdf);

    let one = temp("wl-one");
    let mut a = args.clone();
    a.extend(["--cc".to_string(), "dcqcn".to_string()]);
    run("workload", &a, &one);
    check_run(&one);
    let schedule = read(&one.join("schedule.csv"));
    assert_eq!(schedule.lines().count(), FLOWS + 1);

    let cmp = temp("wl-compare");
    let mut c = args.clone();
    // Through the bottleneck that holds packets at the link rate.
    c.extend(["--cc", "dcqcn,none", "--bottleneck", "delay"].map(String::from));
    run("compare", &c, &cmp);
    for cc in ["dcqcn", "none"] {
        let dir = cmp.join(cc);
        check_run(&dir);
        // Same seed, same flows: sizes, sources, destinations, start times.
        assert_eq!(
            read(&dir.join("schedule.csv")),
            schedule,
            "{cc}'s flows differ from the first run's"
        );
    }
    let json: Value = serde_json::from_str(&read(&cmp.join("compare.json"))).unwrap();
    assert_eq!(json["controllers"], serde_json::json!(["dcqcn", "none"]));
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (r, cc) in runs.iter().zip(["dcqcn", "none"]) {
        assert_eq!(r["settings"]["cc"], cc);
        assert_eq!(r["settings"]["bottleneck"], "delay");
        assert_eq!(r["verified"], FLOWS);
    }
    let csv = read(&cmp.join("compare.csv"));
    for cc in ["dcqcn", "none"] {
        assert_eq!(
            csv.lines()
                .filter(|l| l.starts_with(&format!("{cc},")))
                .count(),
            6,
            "compare.csv needs 5 buckets and `all` for {cc}:\n{csv}"
        );
    }
    // One series per controller on each plot.
    let slowdown = read(&cmp.join("slowdown.svg"));
    let queue = read(&cmp.join("queue_cdf.svg"));
    for cc in ["dcqcn", "none"] {
        assert!(
            slowdown.contains(&format!("{cc} p99")),
            "no {cc} series in slowdown.svg"
        );
        assert!(queue.contains(cc), "no {cc} series in queue_cdf.svg");
    }

    for dir in [&one, &cmp] {
        let _ = std::fs::remove_dir_all(dir);
    }
    let _ = std::fs::remove_file(&cdf);
}

/// `--op read`: each sender SENDs a flow's descriptor and its receiver READs
/// the data from the sender's memory (through the delay bottleneck, as READ
/// responses go the same way as WRITEs), then checks it: every flow still
/// arrives exactly once, verified, and the same seed gives the same flows.
#[test]
fn workload_by_read_completes_every_flow_once_with_data_verified() {
    require_root();
    let cdf = temp("wl-read-cdf.txt");
    std::fs::write(&cdf, CDF).unwrap();
    let mut a = common(&cdf);
    // Its own port: the other test's runs may still be closing theirs.
    let port = a.iter().position(|s| s == "--port").unwrap() + 1;
    a[port] = "18640".into();
    a.extend(["--cc", "dcqcn", "--op", "read", "--bottleneck", "delay"].map(String::from));
    let dir = temp("wl-read");
    run("workload", &a, &dir);
    check_run(&dir);
    let summary: Value = serde_json::from_str(&read(&dir.join("summary.json"))).unwrap();
    assert_eq!(summary["settings"]["op"], "read", "{summary}");
    assert_eq!(read(&dir.join("schedule.csv")).lines().count(), FLOWS + 1);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&cdf);
}
