//! rdma-core's own test suite, as Debian's python3-pyverbs ships it
//! (/usr/share/doc/rdma-core/tests: `*.py` and `*.py.gz`), run unmodified
//! over xroce on both backends: the files are decompressed as they are
//! into a directory of the test, and each module runs under
//! `xroce run --iface IF` in a namespace of a veth pair with rdma-core's
//! runner and its documented arguments (`run_tests.py --dev xroce_IF
//! --gid 1 -v tests.MODULE`; port 1 is the default). GID 1 is the
//! interface's IPv4-mapped RoCE v2 GID, the one rdma-core's tests pick on
//! rxe.
//!
//! The twelve generic modules and test_shared_pd must end with 0 failures
//! and 0 errors (skips are what the suite does for what a device lacks:
//! device memory, dma-buf, memory windows, XRC, raw packet QPs, ...);
//! test_shared_pd must skip nothing, test_rdmacm nothing but its 3
//! multicast cases (the suite skips them while the device reports
//! max_mcast_grp 0: xroce has no multicast), i.e. only skips whose reason
//! names multicast. test_rdmacm needs `xroce run`'s sysfs view
//! (/sys/class/infiniband/DEV/device/net/, which the suite reads to find
//! the device's interface and address: without it all 10 cases skip) and
//! RDMA-CM between two processes on one device (each case forks a passive
//! and an active side that connect over the interface's own address:
//! the QP1 relay of userspace/rdmacm/src/objects/agent/relay.rs).
//!
//! The unittest summary of each module is parsed; a failure names the
//! failing, erroring and skipping cases.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use xroce_tests::programs::{serial, Backend, Proc, Topology};
use xroce_tests::require_root;
use xroce_tests::verbs::{ibverbs_cdylib, rdmacm_cdylib};

/// Where Debian's python3-pyverbs puts rdma-core's tests.
const SUITE: &str = "/usr/share/doc/rdma-core/tests";
/// Debian's interpreter (the one python3-pyverbs is built for), not
/// whatever `python3` is first on PATH.
const PYTHON: &str = "/usr/bin/python3";

/// The modules that must pass: rdma-core's generic (provider-independent)
/// ones and the shared-PD one; test_rdmacm apart ([`RDMACM`]).
const MODULES: &[&str] = &[
    "test_device",
    "test_pd",
    "test_mr",
    "test_cq",
    "test_cq_events",
    "test_cqex",
    "test_qp",
    "test_qpex",
    "test_atomic",
    "test_addr",
    "test_fork",
    "test_shared_pd",
];

/// RDMA-CM between two processes of one device, run apart.
const RDMACM: &[&str] = &["test_rdmacm"];

/// Modules none of whose cases may skip.
const NO_SKIPS: &[&str] = &["test_shared_pd"];

/// Modules whose only skips may be for multicast (the reason names it).
const MULTICAST_SKIPS_ONLY: &[&str] = &["test_rdmacm"];

/// What one module's run reported.
#[derive(Debug, Default)]
struct Summary {
    ran: usize,
    /// Failures, errors and unexpected successes, by test id.
    failed: Vec<String>,
    skipped: usize,
    /// Skipped cases with their reasons (from the verbose lines).
    skip_reasons: Vec<String>,
}

/// Parses unittest's verbose output (stderr): the `Ran N tests` line and
/// the verdict after it, `FAIL:` / `ERROR:` headers, `... skipped` lines.
fn parse_unittest(stderr: &str) -> Result<Summary, String> {
    let mut s = Summary::default();
    let mut last_id = String::new();
    let mut verdict = None;
    for line in stderr.lines() {
        // `test_x (tests.test_y.Class.test_x)` starts every case's line.
        if let Some(id) = line
            .strip_prefix("test")
            .and_then(|_| line.split_once(" (tests."))
            .and_then(|(_, rest)| rest.split_once(')'))
        {
            last_id = format!("tests.{}", id.0);
        }
        if let Some((_, reason)) = line.split_once(" ... skipped ") {
            s.skip_reasons.push(format!("{last_id}: {reason}"));
        }
        for (head, kind) in [
            ("FAIL: ", "FAIL"),
            ("ERROR: ", "ERROR"),
            ("UNEXPECTED SUCCESS: ", "UNEXPECTED SUCCESS"),
        ] {
            if let Some(rest) = line.strip_prefix(head) {
                s.failed.push(format!("{kind} {rest}"));
            }
        }
        if let Some(n) = line
            .strip_prefix("Ran ")
            .and_then(|r| r.split_whitespace().next())
        {
            s.ran = n.parse().map_err(|_| format!("bad line {line:?}"))?;
            verdict = None;
        }
        if line == "OK" || line.starts_with("OK (") || line.starts_with("FAILED (") {
            verdict = Some(line.to_string());
        }
    }
    let verdict = verdict.ok_or("no unittest verdict (OK / FAILED) after `Ran N tests`")?;
    let mut counted_failures = 0;
    if let Some(inner) = verdict
        .split_once('(')
        .and_then(|(_, r)| r.strip_suffix(')'))
    {
        for kv in inner.split(", ") {
            let (k, v) = kv
                .split_once('=')
                .ok_or(format!("bad verdict {verdict:?}"))?;
            let v: usize = v.parse().map_err(|_| format!("bad verdict {verdict:?}"))?;
            match k {
                "skipped" => s.skipped = v,
                "failures" | "errors" | "unexpected successes" => counted_failures += v,
                _ => {}
            }
        }
    }
    if counted_failures != s.failed.len() {
        return Err(format!(
            "verdict {verdict:?} counts {counted_failures} failures, the report names {}",
            s.failed.len()
        ));
    }
    Ok(s)
}

/// rdma-core's tests as Debian ships them, decompressed unmodified into
/// `dir/tests` (a package: the modules import `tests.base`, `tests.utils`).
fn unpack_suite(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("tests");
    std::fs::create_dir_all(&out).expect("mkdir tests");
    let entries = std::fs::read_dir(SUITE).unwrap_or_else(|e| {
        panic!("{SUITE}: {e} (install python3-pyverbs: cargo xtask setup does)")
    });
    for e in entries {
        let path = e.expect("read the suite's directory").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".py.gz") {
            let py = std::fs::File::create(out.join(format!("{stem}.py"))).unwrap();
            let st = Command::new("gzip")
                .arg("-dc")
                .arg(&path)
                .stdout(py)
                .status()
                .expect("run gzip");
            assert!(st.success(), "gzip -dc {} failed", path.display());
        } else if name.ends_with(".py") {
            std::fs::copy(&path, out.join(&name)).unwrap();
        }
    }
    for m in MODULES.iter().chain(RDMACM) {
        assert!(
            out.join(format!("{m}.py")).exists(),
            "{SUITE} has no {m}.py(.gz)"
        );
    }
    out
}

fn require_pyverbs() {
    let ok = Command::new(PYTHON)
        .args(["-c", "import pyverbs.device"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{PYTHON} cannot import pyverbs: install python3-pyverbs (cargo xtask setup does)"
    );
}

fn run_suite(backend: Backend, modules: &[&str]) {
    require_root();
    require_pyverbs();
    let _ = (ibverbs_cdylib(), rdmacm_cdylib());
    let _turn = serial();
    let topo = Topology::direct(backend, 1500);
    let suite = unpack_suite(&topo.dir.0);
    let node = topo.client();
    let mut problems = Vec::new();
    let mut report = Vec::new();
    for module in modules {
        let args: Vec<String> = [
            suite.join("run_tests.py").to_string_lossy().into_owned(),
            "--dev".into(),
            node.device(),
            "--gid".into(),
            "1".into(),
            "-v".into(),
            format!("tests.{module}"),
        ]
        .into();
        let mut cmd = topo.command(node, PYTHON, &args);
        // The suite's own messages only: the library's debug lines would
        // interleave with unittest's verbose ones.
        cmd.env_remove("XROCE_VERBS_DEBUG").current_dir(&suite);
        let what = format!("[{}] {module}", backend.as_str());
        let done = Proc::spawn(cmd, what.clone(), &topo.dir.0).finish(Duration::from_secs(300));
        let summary = match (done.status, parse_unittest(&done.stderr)) {
            (Some(_), Ok(s)) => s,
            (_, Err(why)) => {
                problems.push(format!("{what}: {why}\n{}", done.describe()));
                continue;
            }
            (None, Ok(_)) => {
                problems.push(format!("{what}: timed out\n{}", done.describe()));
                continue;
            }
        };
        report.push(format!(
            "{module}: ran {} skipped {} failed {} ({:.1}s)",
            summary.ran,
            summary.skipped,
            summary.failed.len(),
            done.secs
        ));
        if summary.ran == 0 {
            problems.push(format!("{what}: no test ran\n{}", done.describe()));
        }
        if !summary.failed.is_empty() {
            problems.push(format!(
                "{what}: {} failed:\n  {}\n--- unittest output (tail)\n{}",
                summary.failed.len(),
                summary.failed.join("\n  "),
                tail(&done.stderr, 60)
            ));
        }
        let unexpected: Vec<&String> = summary
            .skip_reasons
            .iter()
            .filter(|r| !r.to_lowercase().contains("multicast"))
            .collect();
        if MULTICAST_SKIPS_ONLY.contains(module)
            && (!unexpected.is_empty() || summary.skip_reasons.len() != summary.skipped)
        {
            problems.push(format!(
                "{what}: {} skipped, only multicast cases may:\n  {}",
                summary.skipped,
                summary.skip_reasons.join("\n  ")
            ));
        }
        if NO_SKIPS.contains(module) && summary.skipped > 0 {
            problems.push(format!(
                "{what}: {} skipped (none may):\n  {}",
                summary.skipped,
                summary.skip_reasons.join("\n  ")
            ));
        }
    }
    eprintln!(
        "pyverbs over {}:\n  {}",
        backend.as_str(),
        report.join("\n  ")
    );
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[test]
fn rdma_core_tests_pass_over_udp() {
    run_suite(Backend::Udp, MODULES);
}

#[test]
fn rdma_core_tests_pass_over_afxdp() {
    run_suite(Backend::AfXdp, MODULES);
}

// Each case of test_rdmacm forks a passive and an active process on one
// device; its 3 multicast cases skip while the device has no multicast.
#[test]
fn rdmacm_tests_pass_over_udp() {
    run_suite(Backend::Udp, RDMACM);
}

#[test]
fn rdmacm_tests_pass_over_afxdp() {
    run_suite(Backend::AfXdp, RDMACM);
}

#[test]
fn unittest_summaries_are_parsed() {
    let out = "test_a (tests.test_x.C.test_a) ... ok\n\
               test_b (tests.test_x.C.test_b)\nDoc line ... skipped 'no DM'\n\
               test_c (tests.test_x.C.test_c) ... FAIL\n\
               ======\nFAIL: test_c (tests.test_x.C.test_c)\n------\n\
               Ran 3 tests in 0.1s\n\nFAILED (failures=1, skipped=1)\n";
    let s = parse_unittest(out).unwrap();
    assert_eq!((s.ran, s.skipped), (3, 1));
    assert_eq!(s.failed, ["FAIL test_c (tests.test_x.C.test_c)"]);
    assert_eq!(s.skip_reasons, ["tests.test_x.C.test_b: 'no DM'"]);
    let ok = parse_unittest("Ran 2 tests in 0.0s\n\nOK\n").unwrap();
    assert_eq!((ok.ran, ok.skipped, ok.failed.len()), (2, 0, 0));
    assert!(parse_unittest("Traceback ...\n").is_err());
    assert!(parse_unittest("Ran 1 test in 0s\n\nFAILED (errors=1)\n").is_err());
}
