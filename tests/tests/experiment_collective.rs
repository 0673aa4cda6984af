//! `xroce experiment collective` end to end with Debian's unmodified Open
//! MPI: 4 ranks, allreduce and alltoall of 64 KiB, a few iterations, over
//! xroce (pml ucx) and over TCP (pml ob1), lossless and at 1 % loss on one
//! rank's ingress. The run succeeds; every rank checked every element of
//! every result (the program's own count, in each job's mpirun.log); the
//! outputs exist and parse; iterations.csv has one row per rank and
//! iteration of every job, each iteration's JCT its slowest rank's time;
//! the XDP fault injector really dropped frames; and nothing is left: no
//! namespace, XDP pin or process. A second run is interrupted (SIGINT)
//! once its ranks are iterating, and leaves nothing either.
//!
//!
//! Gloo (Debian's libgloo-dev, `--library gloo`): 2 ranks, ring allreduce
//! of floats over xroce (Gloo's ibverbs transport on the drop-in) and over
//! Gloo's TCP transport, every element checked, the CSV and JSON fields
//! asserted; `--compare tcp,recovery,cc` runs one job per variant on the
//! same seed and gives one figure per variant and compare.svg; a wrong
//! flag combination fails with the error naming the fix.
//!
//! With `--background incast` (Gloo, 2 ranks, over xroce and TCP): the
//! workload generator's xroce flows from two hosts beside the ranks burst
//! into rank 0's link while each job runs; the collectives are still
//! checked, summary.json records the background and, per job, its flows
//! completed with every byte verified; an interrupted run with a
//! background leaves nothing behind; a wrong background flag names the fix.
//!
//! That the same seed gives the same schedule is a unit test of the
//! schedule (userspace/cli/src/experiment/collective/schedule.rs).
//! The experiments make and remove their own namespaces.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use xroce_tests::{
    experiment::{csv_rows, leftovers, processes_mentioning},
    require_root, verbs, workspace_bin,
};

const RANKS: usize = 4;
const ITERS: usize = 4;
const WARMUP: usize = 1;
const OPS: [&str; 2] = ["allreduce", "alltoall"];
/// (transport, loss) of every job, in the order they run.
const JOBS: [(&str, f64); 4] = [("xroce", 0.0), ("xroce", 0.01), ("tcp", 0.0), ("tcp", 0.01)];

/// Root, g++ and Gloo's headers, and xroce's drop-in libibverbs built.
fn gloo_prerequisites() {
    require_root();
    assert!(
        Command::new("g++").arg("--version").output().is_ok(),
        "`g++` is missing: install g++ (`cargo xtask setup`)"
    );
    assert!(
        Path::new("/usr/include/gloo/transport/ibverbs/device.h").exists(),
        "Gloo's headers are missing: install libgloo-dev (`cargo xtask setup`)"
    );
    assert!(
        Command::new("iptables").arg("-V").output().is_ok(),
        "`iptables` is missing (loss over TCP): install iptables"
    );
    if std::env::var_os("XROCE_LIB_DIR").is_none() {
        verbs::ibverbs_cdylib();
    }
}

/// Root, Open MPI's mpicc, and xroce's drop-in libibverbs built.
fn prerequisites() {
    require_root();
    for (tool, package) in [("mpicc", "libopenmpi-dev"), ("mpirun", "openmpi-bin")] {
        assert!(
            Command::new(tool).arg("--version").output().is_ok(),
            "`{tool}` is missing: install {package} (`cargo xtask setup`)"
        );
    }
    assert!(
        Command::new("iptables").arg("-V").output().is_ok(),
        "`iptables` is missing (loss over TCP): install iptables"
    );
    if std::env::var_os("XROCE_LIB_DIR").is_none() {
        verbs::ibverbs_cdylib();
    }
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xroce-{name}-{}", std::process::id()))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn experiment(dir: &Path, iters: usize, extra: &[&str]) -> Command {
    let _ = std::fs::remove_dir_all(dir);
    let mut cmd = Command::new(workspace_bin("xroce"));
    cmd.args(["experiment", "collective", "--ranks", &RANKS.to_string()])
        .args(["--op", &OPS.join(","), "--sizes", "64KiB"])
        .args([
            "--iters",
            &iters.to_string(),
            "--warmup",
            &WARMUP.to_string(),
        ])
        .args(["--seed", "5", "--out"])
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Nothing of experiment `pid` with outputs in `dir` is left.
fn nothing_left(pid: u32, dir: &Path) {
    let (netns, pins) = leftovers(pid);
    assert!(netns.is_empty(), "namespaces left behind: {netns:?}");
    assert!(pins.is_empty(), "XDP pins left behind: {pins:?}");
    // The program, the launch agent and the job's files are all in `dir`:
    // any process of the job names it.
    let procs = processes_mentioning(&dir.to_string_lossy());
    assert!(procs.is_empty(), "processes left behind: {procs:?}");
}

/// A row of iterations.csv by column name.
type Row = BTreeMap<String, String>;
/// An iteration: transport, loss, op, iteration.
type Iteration = (String, String, String, String);

/// iterations.csv as one map per row, by column name.
fn iterations_csv(dir: &Path) -> Vec<Row> {
    let (header, rows) = csv_rows(&dir.join("iterations.csv"));
    assert_eq!(
        header.join(","),
        "library,variant,transport,loss,op,bytes,iter,rank,gap_s,coll_s,wait_fraction,jct_s"
    );
    rows
}

fn num(row: &Row, col: &str) -> f64 {
    row[col]
        .parse()
        .unwrap_or_else(|e| panic!("{col} in {row:?}: {e}"))
}

#[test]
fn collectives_over_xroce_and_tcp_are_checked_and_leave_nothing_behind() {
    prerequisites();
    let dir = temp("collective");
    let child = experiment(&dir, ITERS, &["--loss", "0.01", "--loss-on", "rank:1"])
        .spawn()
        .expect("start xroce experiment collective");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for the experiment");
    let stderr = String::from_utf8_lossy(&out.stderr);
    nothing_left(pid, &dir);
    assert!(
        out.status.success(),
        "the experiment failed ({}); outputs in {}:\n{stderr}",
        out.status,
        dir.display()
    );

    // Every rank checked every result of each job: ops × (warm-up + timed
    // iterations) per rank.
    let checked = RANKS * OPS.len() * (WARMUP + ITERS);
    for (transport, loss) in JOBS {
        let log = read(&dir.join(format!("runs/{transport}-loss{loss}/mpirun.log")));
        let want = format!("collective_step: ok: {RANKS} ranks, {checked} results checked");
        assert!(
            log.contains(&want),
            "{transport} at {loss}: no {want:?}:\n{log}"
        );
        if transport == "xroce" {
            // --recovery's default reached every rank through mpirun.
            for rank in 0..RANKS {
                let want = format!("rank {rank}: XROCE_SELECTIVE_REPEAT=auto");
                assert!(
                    log.contains(&want),
                    "{transport} at {loss}: no {want:?}:\n{log}"
                );
            }
        }
    }

    // One row per job, op, iteration and rank; each iteration has every
    // rank once, and its JCT is its slowest rank's time.
    let rows = iterations_csv(&dir);
    assert_eq!(rows.len(), JOBS.len() * OPS.len() * ITERS * RANKS);
    let mut iterations: BTreeMap<Iteration, Vec<&Row>> = BTreeMap::new();
    for r in &rows {
        assert_eq!(r["bytes"], "65536", "{r:?}");
        assert_eq!(r["library"], "mpi", "{r:?}");
        assert_eq!(r["variant"], r["transport"], "{r:?}");
        let wait = num(r, "wait_fraction");
        assert!((0.0..=1.0).contains(&wait), "{r:?}");
        assert!(num(r, "coll_s") > 0.0 && num(r, "gap_s") > 0.0, "{r:?}");
        let key = (
            r["transport"].clone(),
            r["loss"].clone(),
            r["op"].clone(),
            r["iter"].clone(),
        );
        iterations.entry(key).or_default().push(r);
    }
    assert_eq!(iterations.len(), JOBS.len() * OPS.len() * ITERS);
    for (key, ranks) in &iterations {
        let mut seen: Vec<String> = ranks.iter().map(|r| r["rank"].clone()).collect();
        seen.sort();
        assert_eq!(seen, ["0", "1", "2", "3"], "{key:?}");
        let slowest = ranks.iter().map(|r| num(r, "coll_s")).fold(0.0, f64::max);
        for r in ranks {
            assert!((num(r, "jct_s") - slowest).abs() < 1e-6, "{key:?}: {r:?}");
        }
    }

    let summary: Value = serde_json::from_str(&read(&dir.join("summary.json"))).unwrap();
    assert_eq!(summary["experiment"], "collective");
    assert_eq!(
        summary["errors"].as_array().map(Vec::len),
        Some(0),
        "{summary}"
    );
    assert_eq!(summary["settings"]["ranks"], RANKS);
    assert_eq!(summary["settings"]["library"], "mpi");
    assert_eq!(summary["settings"]["recovery"], "auto");
    assert_eq!(
        summary["settings"]["variants"],
        serde_json::json!(["xroce", "tcp"])
    );
    let jobs = summary["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), JOBS.len(), "{summary}");
    for (job, (transport, loss)) in jobs.iter().zip(JOBS) {
        assert_eq!(job["transport"], transport);
        assert_eq!(job["variant"], transport);
        assert_eq!(job["library"], "mpi");
        assert_eq!(job["loss"], loss);
    }
    // xroce's RoCEv2 crossed the XDP programs, and the fault injector
    // dropped some on rank 1's ingress only in the lossy job.
    assert!(jobs[0]["frames"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(jobs[0]["dropped"], 0, "{summary}");
    assert!(jobs[1]["dropped"].as_u64().unwrap() > 0, "{summary}");
    let figures = summary["figures"].as_array().expect("figures");
    assert_eq!(figures.len(), JOBS.len() * OPS.len(), "{summary}");
    for f in figures {
        assert_eq!(f["iters"], ITERS, "{f}");
        assert_eq!(f["jct_s"].as_array().map(Vec::len), Some(ITERS), "{f}");
        let (p50, p99, max) = (
            f["jct_p50_s"].as_f64().unwrap(),
            f["jct_p99_s"].as_f64().unwrap(),
            f["jct_max_s"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{f}");
        let algbw = f["algbw_gbyte_s"].as_f64().unwrap();
        assert!((algbw - 65536.0 / p50 / 1e9).abs() < 1e-9, "{f}");
        // nccl-tests: allreduce 2(n-1)/n, alltoall (n-1)/n.
        let factor = if f["op"] == "allreduce" { 1.5 } else { 0.75 };
        let busbw = f["busbw_gbyte_s"].as_f64().unwrap();
        assert!((busbw - algbw * factor).abs() < 1e-9, "{f}");
        let lossy = f["loss"].as_f64().unwrap() > 0.0;
        assert_eq!(f["slowdown_p50"].is_f64(), lossy, "{f}");
    }
    for file in ["jct.svg", "schedule.csv", "summary.json"] {
        let len = std::fs::metadata(dir.join(file))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 0, "{} is missing or empty", dir.join(file).display());
    }
    assert_eq!(
        read(&dir.join("schedule.csv")).lines().count(),
        1 + ITERS * RANKS
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_interrupted_experiment_leaves_nothing_behind() {
    prerequisites();
    let dir = temp("collective-int");
    // Enough iterations that it is still running when interrupted.
    let mut child = experiment(&dir, 100_000, &["--transport", "xroce"])
        .spawn()
        .expect("start xroce experiment collective");
    let pid = child.id();
    // Interrupt once rank 0 has finished an iteration: the ranks, their
    // daemons and mpirun are all up.
    let progress = dir.join("runs/xroce-loss0/steps.csv.progress");
    let deadline = Instant::now() + Duration::from_secs(300);
    while std::fs::metadata(&progress).map(|m| m.len()).unwrap_or(0) == 0 {
        if let Some(status) = child.try_wait().expect("poll the experiment") {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr);
            panic!("the experiment ended ({status}) before its first iteration:\n{stderr}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no iteration within 300 s; outputs in {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signalling the child we started and have not waited for.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().expect("wait for the experiment");
    let stderr = String::from_utf8_lossy(&out.stderr);
    nothing_left(pid, &dir);
    assert!(
        !out.status.success(),
        "an interrupted run succeeded:\n{stderr}"
    );
    assert!(stderr.contains("interrupted"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `xroce experiment collective --library gloo` with `extra` flags, 2
/// ranks, allreduce of `size`, `iters` iterations.
fn gloo_experiment(dir: &Path, size: &str, iters: usize, extra: &[&str]) -> Command {
    let _ = std::fs::remove_dir_all(dir);
    let mut cmd = Command::new(workspace_bin("xroce"));
    cmd.args(["experiment", "collective", "--library", "gloo"])
        .args(["--ranks", &GLOO_RANKS.to_string(), "--sizes", size])
        .args(["--iters", &iters.to_string(), "--warmup", "1"])
        .args([
            "--compute-gap",
            "2ms",
            "--seed",
            "3",
            "--stall-timeout",
            "120",
        ])
        .arg("--out")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

const GLOO_RANKS: usize = 2;

/// Runs `cmd` to its end; asserts it succeeded and left nothing behind.
fn run_to_success(cmd: &mut Command, dir: &Path) -> String {
    let child = cmd.spawn().expect("start xroce experiment collective");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for the experiment");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    nothing_left(pid, dir);
    assert!(
        out.status.success(),
        "the experiment failed ({}); outputs in {}:\n{stderr}",
        out.status,
        dir.display()
    );
    stderr
}

/// Rank 0 of the job in runs/`job`/ reported every rank's results checked:
/// `iters` timed and one warm-up allreduce per rank; over xroce every rank
/// had XROCE_SELECTIVE_REPEAT=`recovery`.
fn gloo_checked(dir: &Path, job: &str, iters: usize, recovery: Option<&str>) {
    let log = read(&dir.join(format!("runs/{job}/rank0.log")));
    let want = format!(
        "collective_step: ok: {GLOO_RANKS} ranks, {} results checked",
        GLOO_RANKS * (1 + iters)
    );
    assert!(log.contains(&want), "{job}: no {want:?}:\n{log}");
    if let Some(recovery) = recovery {
        for rank in 0..GLOO_RANKS {
            let log = read(&dir.join(format!("runs/{job}/rank{rank}.log")));
            let want = format!("rank {rank}: XROCE_SELECTIVE_REPEAT={recovery}");
            assert!(log.contains(&want), "{job}: no {want:?}:\n{log}");
        }
    }
}

#[test]
fn gloo_allreduce_over_xroce_and_tcp_is_checked() {
    gloo_prerequisites();
    let dir = temp("collective-gloo");
    const ITERS: usize = 4;
    run_to_success(
        &mut gloo_experiment(
            &dir,
            "64KiB",
            ITERS,
            &["--recovery", "sr", "--loss", "0.05"],
        ),
        &dir,
    );
    // (variant, loss) of every job, in order.
    let jobs = [("xroce", 0.0), ("xroce", 0.05), ("tcp", 0.0), ("tcp", 0.05)];
    for (variant, loss) in jobs {
        let recovery = (variant == "xroce").then_some("on");
        gloo_checked(&dir, &format!("{variant}-loss{loss}"), ITERS, recovery);
    }

    let rows = iterations_csv(&dir);
    assert_eq!(rows.len(), jobs.len() * ITERS * GLOO_RANKS);
    let mut iterations: BTreeMap<Iteration, Vec<&Row>> = BTreeMap::new();
    for r in &rows {
        assert_eq!(r["library"], "gloo", "{r:?}");
        assert_eq!(r["op"], "allreduce", "{r:?}");
        // 64 KiB of floats, whole.
        assert_eq!(r["bytes"], "65536", "{r:?}");
        assert_eq!(r["variant"], r["transport"], "{r:?}");
        assert!(num(r, "coll_s") > 0.0 && num(r, "gap_s") > 0.0, "{r:?}");
        let key = (
            r["transport"].clone(),
            r["loss"].clone(),
            r["op"].clone(),
            r["iter"].clone(),
        );
        iterations.entry(key).or_default().push(r);
    }
    assert_eq!(iterations.len(), jobs.len() * ITERS);
    for (key, ranks) in &iterations {
        let mut seen: Vec<String> = ranks.iter().map(|r| r["rank"].clone()).collect();
        seen.sort();
        assert_eq!(seen, ["0", "1"], "{key:?}");
        let slowest = ranks.iter().map(|r| num(r, "coll_s")).fold(0.0, f64::max);
        for r in ranks {
            assert!((num(r, "jct_s") - slowest).abs() < 1e-6, "{key:?}: {r:?}");
        }
    }

    let summary: Value = serde_json::from_str(&read(&dir.join("summary.json"))).unwrap();
    assert_eq!(
        summary["errors"].as_array().map(Vec::len),
        Some(0),
        "{summary}"
    );
    let settings = &summary["settings"];
    assert_eq!(settings["library"], "gloo", "{settings}");
    assert_eq!(settings["recovery"], "sr", "{settings}");
    assert_eq!(
        settings["ops"],
        serde_json::json!(["allreduce"]),
        "{settings}"
    );
    assert_eq!(settings["compare"], serde_json::json!([]), "{settings}");
    let job_list = summary["jobs"].as_array().expect("jobs");
    assert_eq!(job_list.len(), jobs.len(), "{summary}");
    for (job, (variant, loss)) in job_list.iter().zip(jobs) {
        assert_eq!(job["variant"], variant, "{job}");
        assert_eq!(job["library"], "gloo", "{job}");
        assert_eq!(job["loss"], loss, "{job}");
        if variant == "xroce" {
            assert_eq!(job["recovery"], "sr", "{job}");
            assert_eq!(job["cc"], "none", "{job}");
        } else {
            assert!(job["recovery"].is_null() && job["cc"].is_null(), "{job}");
        }
    }
    // Gloo's ibverbs traffic crossed xroce's XDP program, and the fault
    // injector dropped some of it in the lossy job only.
    assert!(job_list[0]["frames"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(job_list[0]["dropped"], 0, "{summary}");
    assert!(job_list[1]["dropped"].as_u64().unwrap() > 0, "{summary}");
    let figures = summary["figures"].as_array().expect("figures");
    assert_eq!(figures.len(), jobs.len(), "{summary}");
    for f in figures {
        assert_eq!(f["library"], "gloo", "{f}");
        assert_eq!(f["jct_s"].as_array().map(Vec::len), Some(ITERS), "{f}");
        let p50 = f["jct_p50_s"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 <= f["jct_p99_s"].as_f64().unwrap(), "{f}");
        // allreduce over 2 ranks: busbw = algbw.
        let algbw = f["algbw_gbyte_s"].as_f64().unwrap();
        assert!((algbw - 65536.0 / p50 / 1e9).abs() < 1e-9, "{f}");
        assert!(
            (f["busbw_gbyte_s"].as_f64().unwrap() - algbw).abs() < 1e-9,
            "{f}"
        );
    }
    assert!(std::fs::metadata(dir.join("jct.svg")).is_ok_and(|m| m.len() > 0));
    assert!(
        !dir.join("compare.svg").exists(),
        "compare.svg without --compare"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_gives_one_figure_per_variant_on_the_same_seed() {
    gloo_prerequisites();
    let dir = temp("collective-compare");
    const ITERS: usize = 2;
    run_to_success(
        &mut gloo_experiment(&dir, "16KiB", ITERS, &["--compare", "tcp,recovery,cc"]),
        &dir,
    );
    // (variant, transport, recovery, cc): "xroce" is --recovery auto and
    // --cc none, so the cc axis's "none" is not run again.
    let variants = [
        ("xroce", "xroce", "auto", "none"),
        ("tcp", "tcp", "", ""),
        ("xroce-gbn", "xroce", "gbn", "none"),
        ("xroce-sr", "xroce", "sr", "none"),
        ("xroce-dcqcn", "xroce", "auto", "dcqcn"),
        ("xroce-timely", "xroce", "auto", "timely"),
        ("xroce-swift", "xroce", "auto", "swift"),
    ];
    for (variant, transport, recovery, _) in variants {
        let env = match recovery {
            "gbn" => "off",
            "sr" => "on",
            _ => "auto",
        };
        let env = (transport == "xroce").then_some(env);
        gloo_checked(&dir, &format!("{variant}-loss0"), ITERS, env);
    }
    let summary: Value = serde_json::from_str(&read(&dir.join("summary.json"))).unwrap();
    assert_eq!(
        summary["errors"].as_array().map(Vec::len),
        Some(0),
        "{summary}"
    );
    let names: Vec<&str> = variants.iter().map(|v| v.0).collect();
    assert_eq!(summary["settings"]["variants"], serde_json::json!(names));
    assert_eq!(
        summary["settings"]["compare"],
        serde_json::json!(["tcp", "recovery", "cc"])
    );
    let jobs = summary["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), variants.len(), "{summary}");
    for (job, (variant, transport, recovery, cc)) in jobs.iter().zip(variants) {
        assert_eq!(job["variant"], variant, "{job}");
        assert_eq!(job["transport"], transport, "{job}");
        if transport == "xroce" {
            assert_eq!(job["recovery"], recovery, "{job}");
            assert_eq!(job["cc"], cc, "{job}");
        }
    }
    // One figure per variant (one op, one size, no loss), in order.
    let figures = summary["figures"].as_array().expect("figures");
    let fig_names: Vec<&str> = figures
        .iter()
        .map(|f| f["variant"].as_str().unwrap())
        .collect();
    assert_eq!(fig_names, names, "{summary}");
    // The same seed: every variant's ranks slept the same gaps, so the
    // gaps they measured differ only by the time around the sleep.
    let rows = iterations_csv(&dir);
    assert_eq!(rows.len(), variants.len() * ITERS * GLOO_RANKS);
    let sched = read(&dir.join("schedule.csv"));
    for r in &rows {
        let line = format!("{},{},", r["iter"], r["rank"]);
        let gap_us: f64 = sched
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no gap for {line} in schedule.csv"))
            .parse()
            .unwrap();
        assert!(
            num(r, "gap_s") >= gap_us * 1e-6,
            "{r:?} slept less than {gap_us} us"
        );
    }
    let svg = read(&dir.join("compare.svg"));
    for name in names {
        assert!(
            svg.contains(&format!(">\n{name}\n<")) || svg.contains(&format!(">{name}<")),
            "compare.svg lacks {name}"
        );
    }
    assert!(svg.contains("p50 0% allreduce 16 KiB") && svg.contains("p99 0% allreduce 16 KiB"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_interrupted_gloo_experiment_leaves_nothing_behind() {
    gloo_prerequisites();
    let dir = temp("collective-gloo-int");
    // Enough iterations that it is still running when interrupted.
    let mut child = gloo_experiment(&dir, "16KiB", 1_000_000, &["--transport", "xroce"])
        .spawn()
        .expect("start xroce experiment collective");
    let pid = child.id();
    // Interrupt once rank 0 has finished an iteration: every rank is up.
    let progress = dir.join("runs/xroce-loss0/steps.csv.progress");
    let deadline = Instant::now() + Duration::from_secs(300);
    while std::fs::metadata(&progress).map(|m| m.len()).unwrap_or(0) == 0 {
        if let Some(status) = child.try_wait().expect("poll the experiment") {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr);
            panic!("the experiment ended ({status}) before its first iteration:\n{stderr}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no iteration within 300 s; outputs in {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signalling the child we started and have not waited for.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().expect("wait for the experiment");
    let stderr = String::from_utf8_lossy(&out.stderr);
    nothing_left(pid, &dir);
    assert!(
        !out.status.success(),
        "an interrupted run succeeded:\n{stderr}"
    );
    assert!(stderr.contains("interrupted"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wrong_flag_combination_names_the_fix() {
    let dir = temp("collective-flags");
    let out = Command::new(workspace_bin("xroce"))
        .args(["experiment", "collective", "--library", "gloo"])
        .args(["--op", "allreduce,alltoall", "--out"])
        .arg(&dir)
        .output()
        .expect("run xroce");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--library gloo runs allreduce only")
            && stderr.contains("not alltoall")
            && stderr.contains("use `--op allreduce`, or `--library mpi`"),
        "{stderr}"
    );
    assert!(!dir.exists(), "a refused run made {}", dir.display());

    // --compare picks the transports itself.
    let out = Command::new(workspace_bin("xroce"))
        .args(["experiment", "collective", "--compare", "tcp"])
        .args(["--transport", "xroce", "--out"])
        .arg(&dir)
        .output()
        .expect("run xroce");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("'--compare <COMPARE>' cannot be used with '--transport <TRANSPORT>'"),
        "{stderr}"
    );
}

/// A small flow-size CDF (4 KiB to 64 KiB) for a light background.
fn small_cdf(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("small-cdf.txt");
    std::fs::write(&path, "4096 0\n16384 50\n65536 100\n").unwrap();
    path
}

/// The background flags of the tests: incast from 2 senders into rank 0,
/// small flows at 30 % of 100 Mbit/s.
fn background_flags(cdf: &Path) -> Vec<String> {
    [
        "--background",
        "incast",
        "--background-senders",
        "2",
        "--background-load",
        "0.3",
        "--background-rate",
        "100mbit",
        "--background-cdf",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([cdf.to_string_lossy().into_owned()])
    .collect()
}

#[test]
fn collectives_under_an_incast_background_are_checked_and_the_flows_verified() {
    gloo_prerequisites();
    let dir = temp("collective-bg");
    let _ = std::fs::remove_dir_all(&dir);
    let cdf = small_cdf(&temp("collective-bg-cdf"));
    const ITERS: usize = 40;
    let flags = background_flags(&cdf);
    let extra: Vec<&str> = flags.iter().map(String::as_str).collect();
    let stderr = run_to_success(&mut gloo_experiment(&dir, "64KiB", ITERS, &extra), &dir);
    assert!(
        stderr.contains("under incast background"),
        "the header names the background:\n{stderr}"
    );
    for job in ["xroce-loss0", "tcp-loss0"] {
        let recovery = job.starts_with("xroce").then_some("auto");
        gloo_checked(&dir, job, ITERS, recovery);
    }
    let summary: Value = serde_json::from_str(&read(&dir.join("summary.json"))).unwrap();
    assert_eq!(
        summary["errors"].as_array().map(Vec::len),
        Some(0),
        "{summary}"
    );
    let bg = &summary["settings"]["background"];
    assert_eq!(bg["kind"], "incast", "{bg}");
    assert_eq!(bg["senders"], 2, "{bg}");
    assert_eq!(bg["receivers"], serde_json::json!([0]), "{bg}");
    assert_eq!(bg["rate_bps"], 100_000_000, "{bg}");
    assert!(bg["flows"].as_u64().unwrap() > 0, "{bg}");
    let jobs = summary["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 2, "{summary}");
    for job in jobs {
        let b = &job["background"];
        let flows = b["flows"].as_u64().unwrap_or(0);
        assert!(flows > 0, "no background flow completed during {job}");
        assert_eq!(b["verified"], flows, "{job}");
        let bytes = b["bytes"].as_u64().unwrap();
        assert!(bytes >= flows * 4096 && bytes <= flows * 65536, "{job}");
        let (p50, p99) = (
            b["slowdown_p50"].as_f64().unwrap(),
            b["slowdown_p99"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99, "{job}");
        assert!(b["seconds"].as_f64().unwrap() > 0.0, "{job}");
        assert_eq!(b["errors"], serde_json::json!([]), "{job}");
    }
    // Every flow a sender completed arrived once at rank 0's receiver,
    // checked (received-r0.csv: flow,src,size_bytes,verified,t_ns).
    for (job, summary_job) in ["xroce-loss0", "tcp-loss0"].iter().zip(jobs) {
        let (_, rows) = csv_rows(&dir.join(format!("runs/{job}/background/received-r0.csv")));
        assert_eq!(
            rows.len() as u64,
            summary_job["background"]["flows"].as_u64().unwrap(),
            "{job}"
        );
        assert!(rows.iter().all(|r| r["verified"] == "1"), "{job}: {rows:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(temp("collective-bg-cdf"));
}

#[test]
fn an_interrupted_experiment_with_a_background_leaves_nothing_behind() {
    gloo_prerequisites();
    let dir = temp("collective-bg-int");
    let cdf = small_cdf(&temp("collective-bg-int-cdf"));
    let flags = background_flags(&cdf);
    let mut extra: Vec<&str> = flags.iter().map(String::as_str).collect();
    extra.extend(["--transport", "xroce"]);
    let mut child = gloo_experiment(&dir, "16KiB", 1_000_000, &extra)
        .spawn()
        .expect("start xroce experiment collective");
    let pid = child.id();
    // Interrupt once rank 0 has finished an iteration and the background
    // has completed a flow: every process is up.
    let progress = dir.join("runs/xroce-loss0/steps.csv.progress");
    let flows = dir.join("runs/xroce-loss0/background/flows-s0.csv");
    let deadline = Instant::now() + Duration::from_secs(300);
    let started = |p: &Path| std::fs::read_to_string(p).is_ok_and(|t| t.lines().count() > 1);
    while std::fs::metadata(&progress).map(|m| m.len()).unwrap_or(0) == 0 || !started(&flows) {
        if let Some(status) = child.try_wait().expect("poll the experiment") {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr);
            panic!("the experiment ended ({status}) before its first iteration:\n{stderr}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no iteration within 300 s; outputs in {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !processes_mentioning(&dir.join("runs/xroce-loss0/background").to_string_lossy())
            .is_empty(),
        "the background's processes run"
    );
    // SAFETY: signalling the child we started and have not waited for.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().expect("wait for the experiment");
    let stderr = String::from_utf8_lossy(&out.stderr);
    nothing_left(pid, &dir);
    assert!(
        !out.status.success(),
        "an interrupted run succeeded:\n{stderr}"
    );
    assert!(stderr.contains("interrupted"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(temp("collective-bg-int-cdf"));
}

#[test]
fn a_wrong_background_flag_names_the_fix() {
    let dir = temp("collective-bg-flags");
    let run = |extra: &[&str]| {
        let out = Command::new(workspace_bin("xroce"))
            .args(["experiment", "collective", "--out"])
            .arg(&dir)
            .args(extra)
            .output()
            .expect("run xroce");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["--background", "storm"]);
    assert!(
        e.contains("storm") && e.contains("none, incast, load"),
        "{e}"
    );
    let e = run(&["--background", "incast", "--background-load", "1.5"]);
    assert!(e.contains("--background-load must be in (0, 1]"), "{e}");
    let e = run(&["--background", "load", "--background-senders", "9"]);
    assert!(e.contains("--background-senders must be 1..=8"), "{e}");
    let e = run(&["--background", "incast", "--background-cdf", "/no/such/cdf"]);
    assert!(
        e.contains("--background-cdf") && e.contains("websearch, hadoop"),
        "{e}"
    );
    assert!(!dir.exists(), "a refused run made {}", dir.display());
}
