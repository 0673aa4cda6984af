//! `--perftest`: `xroce bench` / `xroce lat` speaking perftest v4.5-0.17's
//! out-of-band protocol, xroce on both sides between two namespaces: the
//! server as `ib_write_bw` (no host), the client as `ib_write_bw HOST`
//! (positional host, `-p` port), every bw and lat operation, perftest's
//! defaults, several QPs, path MTU 4096 on a jumbo link.

use std::{
    process::{Command, Output, Stdio},
    time::Duration,
};

use serde::de::DeserializeOwned;
use xroce_report::{BenchReport, LatReport, PerftestRole};
use xroce_tests::{
    perf::{next_port, Server},
    require_root, workspace_bin, VethPair,
};

fn xroce_in(ns: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{ns}"))
        .arg("--")
        .arg(workspace_bin("xroce"));
    cmd
}

/// `xroce <tool> <op> --perftest -d if_b -p port --json <extra>` in b.
fn start_server(pair: &VethPair, tool: &str, op: &str, port: u16, extra: &[&str]) -> Server {
    let child = xroce_in(&pair.b.name)
        .args([
            tool,
            op,
            "--perftest",
            "-d",
            &pair.if_b,
            "-p",
            &port.to_string(),
        ])
        .arg("--json")
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start xroce perftest server");
    Server::new(child)
}

/// `xroce <tool> <op> --perftest -d if_a ADDR_B -p port --json <extra>` in a.
fn run_client(pair: &VethPair, tool: &str, op: &str, port: u16, extra: &[&str]) -> Output {
    xroce_in(&pair.a.name)
        .args([tool, op, "--perftest", "-d", &pair.if_a])
        .arg(pair.addr_b.to_string())
        .args(["-p", &port.to_string(), "--json"])
        .args(extra)
        .output()
        .expect("run xroce perftest client")
}

fn json<R: DeserializeOwned>(out: &[u8], who: &str) -> R {
    let text = String::from_utf8_lossy(out);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{who} JSON {text:?}: {e}"))
}

/// One run that must succeed on both sides; the client's and the server's
/// report (`None` when the server prints none, as read_lat's).
fn run<R: DeserializeOwned>(
    pair: &VethPair,
    tool: &str,
    op: &str,
    extra: &[&str],
) -> (R, Option<R>) {
    let port = next_port();
    let srv = start_server(pair, tool, op, port, extra);
    let out = run_client(pair, tool, op, port, extra);
    let srv = srv.finish(Duration::from_secs(20));
    assert!(
        out.status.success() && srv.status.success(),
        "{tool} {op} {extra:?}: client {}: {}\nserver {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        srv.status,
        String::from_utf8_lossy(&srv.stderr)
    );
    let server = if srv.stdout.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        Some(json(&srv.stdout, "server"))
    };
    (json(&out.stdout, "client"), server)
}

/// What every perftest-mode report says: its `op`, perftest's
/// `peer_version` and `verified` (null: perftest checks no data).
fn check_common(op: &str, (got_op, peer_version, verified): (&str, &str, Option<bool>)) {
    assert_eq!((got_op, peer_version, verified), (op, "6.06", None));
}

#[test]
fn every_bw_operation_both_roles() {
    require_root();
    let pair = VethPair::new(1500);
    for op in ["write", "read", "send", "atomic"] {
        let (c, s): (BenchReport, _) = run(&pair, "bench", op, &["-n", "300"]);
        let cp = c.perftest.as_ref().expect("client perftest");
        check_common(op, (&c.op, &cp.peer_version, c.verified));
        assert_eq!(cp.role, PerftestRole::Client);
        assert_eq!(c.iters, 300, "{c:?}");
        assert_eq!(c.size, if op == "atomic" { 8 } else { 65536 }, "{c:?}");
        assert_eq!(c.mtu, 1024, "{c:?}");
        assert!(c.gbps > 0.0, "{c:?}");
        let s = s.expect("server report");
        let sp = s.perftest.as_ref().expect("server perftest");
        assert_eq!(sp.role, PerftestRole::Server, "{s:?}");
        if op == "send" {
            // The send server counts what it received.
            assert_eq!(s.iters, 300, "{s:?}");
            assert!(s.gbps > 0.0, "{s:?}");
        } else {
            // The passive server got the client's report.
            let peer = sp.peer_report.expect("peer_report");
            assert_eq!(peer.iters, 300, "{s:?}");
            assert!(peer.bw_avg_mb_per_sec > 0.0, "{s:?}");
        }
    }
}

#[test]
fn perftest_defaults_and_several_qps() {
    require_root();
    let pair = VethPair::new(1500);
    // No -n: perftest's 5000 iterations (small messages keep it short).
    let (c, _): (BenchReport, _) = run(&pair, "bench", "write", &["-s", "4096"]);
    assert_eq!(c.iters, 5000, "{c:?}");
    assert_eq!(c.size, 4096, "{c:?}");
    // -q 4: four QPs, -n per QP, addresses per QP.
    for op in ["write", "read", "send"] {
        let (c, _): (BenchReport, _) =
            run(&pair, "bench", op, &["-q", "4", "-n", "100", "-s", "16384"]);
        assert_eq!(c.qps, 4, "{c:?}");
        assert_eq!(c.iters, 400, "{c:?}");
    }
}

#[test]
fn every_lat_operation_with_defaults() {
    require_root();
    let pair = VethPair::new(1500);
    for op in ["write", "read", "send"] {
        let (c, s): (LatReport, _) = run(&pair, "lat", op, &[]);
        let cp = c.perftest.as_ref().expect("client perftest");
        check_common(op, (&c.op, &cp.peer_version, c.verified));
        assert_eq!(c.size, 2, "{c:?}");
        assert_eq!(c.iters, 1000, "{c:?}");
        let lat = c.lat_us;
        for v in [lat.min, lat.p50, lat.p99, lat.p999, lat.max, lat.avg] {
            assert!(v > 0.0, "{c:?}");
        }
        assert!(lat.p50 <= lat.p99, "{c:?}");
        match (op, s) {
            ("read", s) => assert!(s.is_none(), "read_lat's server only waits: {s:?}"),
            (_, s) => {
                let s = s.expect("server report");
                let sp = s.perftest.as_ref().expect("server perftest");
                assert_eq!(sp.role, PerftestRole::Server, "{s:?}");
            }
        }
    }
}

#[test]
fn path_mtu_4096_on_a_jumbo_link() {
    require_root();
    let pair = VethPair::new(9000);
    for op in ["write", "read", "send"] {
        let (c, _): (BenchReport, _) = run(&pair, "bench", op, &["-n", "100"]);
        assert_eq!(c.mtu, 4096, "{c:?}");
        assert_eq!(c.iters, 100, "{c:?}");
    }
    // Both sides agree on the smaller MTU (perftest's check_mtu).
    let port = next_port();
    let srv = start_server(&pair, "bench", "write", port, &["-n", "50", "-m", "2048"]);
    let out = run_client(&pair, "bench", "write", port, &["-n", "50"]);
    let srv = srv.finish(Duration::from_secs(20));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        srv.status.success(),
        "{}",
        String::from_utf8_lossy(&srv.stderr)
    );
    assert_eq!(json::<BenchReport>(&out.stdout, "client").mtu, 2048);
}

#[test]
fn client_without_a_server_fails_clearly() {
    require_root();
    let pair = VethPair::new(1500);
    let out = run_client(&pair, "bench", "write", next_port(), &["-n", "10"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("perftest server"), "{err}");
}

#[test]
fn mixing_modes_fails_clearly_on_both_sides() {
    require_root();
    let pair = VethPair::new(1500);
    let port = next_port();
    let srv = start_server(&pair, "bench", "write", port, &["-n", "10"]);
    let out = xroce_tests::perf::run_client(&pair, "bench", port, &["write", "--iters", "10"]);
    let srv = srv.finish(Duration::from_secs(20));
    assert!(!out.status.success() && !srv.status.success());
    let client_err = String::from_utf8_lossy(&out.stderr);
    assert!(client_err.contains("need --perftest"), "{client_err}");
    let server_err = String::from_utf8_lossy(&srv.stderr);
    assert!(
        server_err.contains("is the peer a perftest tool"),
        "{server_err}"
    );
}
