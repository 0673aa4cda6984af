//! Zero-length RDMA operations and access errors through the drop-in, as a
//! C program sees them (tests/c/rc_access_probe.c: two RC QPs of one device
//! connected to each other, over the UDP backend, which loops datagrams to
//! the device's own address back through the kernel):
//!
//! - UCX's flush, a zero-length RDMA WRITE without SGEs to remote_addr 0
//!   with rkey 0, and a zero-length READ and WRITE with immediate likewise,
//!   complete successfully (IBTA C9-88, as rxe);
//! - a WRITE with a bad rkey completes with IBV_WC_REM_ACCESS_ERR, the next
//!   WR with IBV_WC_WR_FLUSH_ERR, both QPs go to ERR, and the only async
//!   event is IBV_EVENT_QP_ACCESS_ERR on the responder QP (C9-222.1.1, as
//!   rxe); the requester's error completion is its report.

use xroce_tests::{require_root, verbs::run_verbs_probe};

// ibverbs.h values.
const IBV_WC_SUCCESS: u32 = 0;
const IBV_WC_WR_FLUSH_ERR: u32 = 5;
const IBV_WC_REM_ACCESS_ERR: u32 = 10;
const IBV_WC_RECV_RDMA_WITH_IMM: u32 = 129;
const IBV_EVENT_QP_ACCESS_ERR: u32 = 3;
const IBV_QPS_RTS: u32 = 3;
const IBV_QPS_ERR: u32 = 6;

#[test]
fn zero_length_ops_succeed_and_a_bad_rkey_is_reported_as_rxe_does() {
    require_root();
    let out = run_verbs_probe("rc_access_probe", false, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ok = IBV_WC_SUCCESS;
    let expected: Vec<(&str, String)> = vec![
        ("connect", "0 0".into()),
        ("post_zero", "0 0 0".into()),
        ("zero_wcs", format!("3 1:{ok} 2:{ok} 3:{ok}")),
        (
            "zero_recv",
            format!("50 {ok} {IBV_WC_RECV_RDMA_WITH_IMM} 0 0x1020304"),
        ),
        ("states_after_zero", format!("{IBV_QPS_RTS} {IBV_QPS_RTS}")),
        ("post_bad", "0 0".into()),
        (
            "bad_wcs",
            format!("2 4:{IBV_WC_REM_ACCESS_ERR} 5:{IBV_WC_WR_FLUSH_ERR}"),
        ),
        ("b_flushed", "1 yes".into()),
        ("event", format!("{IBV_EVENT_QP_ACCESS_ERR} b")),
        ("events", "1".into()),
        ("states_after_bad", format!("{IBV_QPS_ERR} {IBV_QPS_ERR}")),
        ("destroy", "0 0".into()),
        ("done", "1".into()),
    ];
    let wrong: Vec<String> = expected
        .iter()
        .filter_map(|(k, v)| {
            let got = stdout
                .lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(' '));
            (got != Some(v.as_str())).then(|| format!("{k}: want `{v}`, got {got:?}"))
        })
        .collect();
    assert!(
        wrong.is_empty() && out.status.success(),
        "the probe ({}):\n{}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status,
        wrong.join("\n")
    );
}
