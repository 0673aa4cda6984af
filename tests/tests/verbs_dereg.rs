//! `ibv_dereg_mr` through the drop-in while a peer's RDMA WRITE streams
//! into the region, and munmap right after, as a program may once the call
//! has returned (tests/c/dereg_inflight_probe.c: two RC QPs of one device
//! over the UDP backend; each round deregisters after another delay, so at
//! another point of the 1 MiB WRITE or after it). The process survives every round, and each
//! WRITE completes with IBV_WC_SUCCESS or IBV_WC_REM_ACCESS_ERR, nothing
//! else. The engine-level guarantee behind it (deregistration waits until
//! the engine is past any copy) is tested in userspace/xroce/tests/verbs_dereg.rs.

use xroce_tests::{require_root, verbs::run_verbs_probe};

const ROUNDS: u32 = 40;

#[test]
fn dereg_and_munmap_during_a_write_lose_nothing_and_crash_nothing() {
    require_root();
    let out = run_verbs_probe("dereg_inflight_probe", false, &[&ROUNDS.to_string()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.lines().any(|l| l == "alive"),
        "the probe died ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("rounds "))
        .unwrap_or_else(|| panic!("no summary:\n{stdout}\n{stderr}"));
    let v: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .step_by(2)
        .map(|n| n.parse().unwrap())
        .collect();
    let [rounds, success, access_err, other, timeout] = v[..] else {
        panic!("bad summary {line:?}");
    };
    assert_eq!(rounds, ROUNDS);
    assert_eq!((other, timeout), (0, 0), "{line}\n{stdout}");
    assert_eq!(success + access_err, ROUNDS, "{line}");
    eprintln!("{line}");
}
