//! xroce's private libibverbs entry point `xroce_create_gsi_qp` (node
//! `XROCE_PRIVATE_1`) through the C ABI, as xroce's librdmacm uses it: a C
//! program built against rdma-core's header finds it with
//! `dlsym(RTLD_DEFAULT, ...)` under `xroce run`, creates the GSI QP (QP1),
//! sees the errno conventions, brings it up as ib_mad does and sends a
//! 256-byte MAD QP1 -> QP1 to its own device; then two such programs in
//! two namespaces exchange MADs QP1 <-> QP1 over a veth pair.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;

use xroce_tests::{
    require_root,
    verbs::{compile_c, ibverbs_cdylib, require_verbs_header, workspace_root, xroce_run, Scratch},
    VethPair,
};

/// The probe, compiled against rdma-core's header into a scratch directory
/// of the test `test` (tests run in parallel).
fn build_probe(test: &str) -> (Scratch, PathBuf) {
    require_root();
    require_verbs_header();
    let _ = ibverbs_cdylib();
    let dir = Scratch::new(&format!("gsi-{test}"));
    let exe = dir.0.join("gsi_qp_probe");
    let src = workspace_root().join("tests/c/gsi_qp_probe.c");
    compile_c(&src, &exe, &["-libverbs", "-ldl"]);
    (dir, exe)
}

/// The probe's `key value` lines against `expected`: one line per key
/// that differs or is missing.
fn wrong_facts(stdout: &str, expected: &[(&str, String)]) -> Vec<String> {
    let got: BTreeMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once(' ')).collect();
    expected
        .iter()
        .filter(|(k, v)| got.get(k) != Some(&v.as_str()))
        .map(|(k, v)| format!("{k}: want `{v}`, got {:?}", got.get(k)))
        .collect()
}

#[test]
fn a_c_program_creates_and_uses_the_gsi_qp() {
    let (_dir, exe) = build_probe("self");
    let pair = VethPair::new(1500);
    let out = xroce_run(
        Some(&pair.a),
        &["--backend", "udp", "--iface", &pair.if_a, "--"],
    )
    .arg(&exe)
    .output()
    .expect("run the probe under xroce run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (einval, eexist) = (libc::EINVAL, libc::EEXIST);
    // IBV_QPS_RESET 0, IBV_QPS_RTS 3, IBV_QPT_UD 4, IBV_WC_SUCCESS 0.
    let expected: Vec<(&str, String)> = vec![
        ("dlsym", "1".into()),
        ("create_rc", format!("-1 {einval}")),
        ("qp", "1 0 4".into()),
        ("create_second", format!("-1 {eexist}")),
        ("init", "0".into()),
        ("rtr", "0".into()),
        ("rts", "0".into()),
        ("query", "0".into()),
        ("state_qkey", "3 0x80010000".into()),
        ("post_recv", "0".into()),
        ("query_gid", "0".into()),
        ("ah", "1".into()),
        ("post_send", "0".into()),
        ("completions", "2".into()),
        ("send_wc", "9 0 1".into()),
        // wr_id, status, qp_num, src_qp, byte_len (GRH + MAD), GRH flag.
        ("recv_wc", "7 0 1 1 296 1".into()),
        ("mad_intact", "1".into()),
        ("destroy_ah", "0".into()),
        ("destroy", "0".into()),
        ("again", "1".into()),
        ("destroy_again", "0".into()),
        ("destroy_ud", "0".into()),
        ("done", "1".into()),
    ];
    let mut wrong = wrong_facts(&stdout, &expected);
    // A normal UD QP gets a number of block 0 past QP0/QP1 (where in the
    // block, the process draws at random).
    let normal = stdout
        .lines()
        .find_map(|l| l.strip_prefix("normal_ud 0x"))
        .and_then(|h| u32::from_str_radix(h.trim(), 16).ok());
    if !normal.is_some_and(|q| (0x11..=0xffff).contains(&q)) {
        wrong.push(format!(
            "normal_ud: want a QPN of block 0 from 0x11, got {normal:?}"
        ));
    }
    assert!(
        wrong.is_empty() && out.status.success(),
        "the GSI QP probe ({}):\n{}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status,
        wrong.join("\n")
    );
}

#[test]
fn two_programs_exchange_mads_qp1_to_qp1() {
    let (_dir, exe) = build_probe("pair");
    let pair = VethPair::new(1500);
    let start = |ns, iface: &str, me: std::net::Ipv4Addr, peer: std::net::Ipv4Addr| {
        xroce_run(Some(ns), &["--backend", "udp", "--iface", iface, "--"])
            .arg(&exe)
            .args([me.to_string(), peer.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the probe under xroce run")
    };
    let a = start(&pair.a, &pair.if_a, pair.addr_a, pair.addr_b);
    let b = start(&pair.b, &pair.if_b, pair.addr_b, pair.addr_a);
    let expected: Vec<(&str, String)> = [
        ("init", "0"),
        ("rtr", "0"),
        ("rts", "0"),
        ("sent_some", "1"),
        ("send_errors", "0"),
        ("heard", "1"),
        ("all_intact", "1"),
        ("all_from_qp1", "1"),
        ("all_grh", "1"),
        ("destroy_ah", "0"),
        ("destroy", "0"),
        ("done", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_string()))
    .collect();
    let mut problems = Vec::new();
    for (side, child) in [("A", a), ("B", b)] {
        let out = child.wait_with_output().expect("wait for the probe");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let wrong = wrong_facts(&stdout, &expected);
        if !wrong.is_empty() || !out.status.success() {
            problems.push(format!(
                "side {side} ({}):\n{}\n--- stdout\n{stdout}--- stderr\n{}",
                out.status,
                wrong.join("\n"),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}
