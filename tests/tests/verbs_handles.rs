//! XROCE_VERBS_DEBUG's handle check through a C program
//! (tests/c/handle_misuse_probe.c): double destroys of a QP, CQ, MR and
//! PD, and a post_send, query_qp, poll_cq and req_notify_cq on destroyed
//! objects each fail with EINVAL and are named on stderr (the call and the
//! kind of object), instead of touching freed memory; live objects keep
//! working.

use xroce_tests::{require_root, verbs::run_verbs_probe_with_env};

const EINVAL: i32 = 22;

#[test]
fn double_destroy_and_use_after_destroy_fail_with_einval_and_are_named() {
    require_root();
    let out = run_verbs_probe_with_env(
        "handle_misuse_probe",
        false,
        &[],
        &[("XROCE_VERBS_DEBUG", "1")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let e = EINVAL.to_string();
    let expected: Vec<(&str, String)> = vec![
        ("destroy_qp", "0".into()),
        ("destroy_qp_again", e.clone()),
        ("post_send_dead", e.clone()),
        ("query_qp_dead", e.clone()),
        ("destroy_cq", "0".into()),
        ("poll_cq_dead", format!("-1 {EINVAL}")),
        ("req_notify_dead", e.clone()),
        ("destroy_cq_again", e.clone()),
        ("dereg_mr", "0".into()),
        ("dereg_mr_again", e.clone()),
        ("dealloc_pd", "0".into()),
        ("dealloc_pd_again", e.clone()),
        ("alloc_pd_after", "0".into()),
        ("dealloc_pd_after", "0".into()),
        ("close_device", "0".into()),
    ];
    let mut bad = Vec::new();
    for (key, want) in &expected {
        let got = stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")))
            .unwrap_or("(missing)");
        if got != want {
            bad.push(format!("{key}: got {got:?}, want {want:?}"));
        }
    }
    assert!(
        bad.is_empty() && stdout.lines().any(|l| l == "done"),
        "{bad:#?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // Each misuse is named: the verb, the kind of object, why. The verbs
    // that verbs.h inlines (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq)
    // are named as the program's frame shows them, or by the entry point
    // they call through context->ops when the compiler inlined them.
    for (call, kind) in [
        ("ibv_destroy_qp", "QP"),
        ("ibv_post_send", "QP"),
        ("ibv_query_qp", "QP"),
        ("ibv_poll_cq", "CQ"),
        ("ibv_req_notify_cq", "CQ"),
        ("ibv_destroy_cq", "CQ"),
        ("ibv_dereg_mr", "MR"),
        ("ibv_dealloc_pd", "PD"),
    ] {
        let names = [call, call.trim_start_matches("ibv_")];
        let named = stderr.lines().any(|l| {
            names
                .iter()
                .any(|n| l.starts_with(&format!("xroce libibverbs: {n}: {kind} 0x")))
                && l.contains(&format!("is not a live {kind}"))
        });
        assert!(
            named,
            "no line naming {call} and a dead {kind}\nstderr:\n{stderr}"
        );
    }
}
