//! Real RDMA between two namespaces over XDP/AF_XDP (native mode on both
//! veth ends): every operation with data verified, sizes up to 1 MiB, 16
//! QPs, the UDP backend against AF_XDP, loss recovered, a killed peer
//! reported as RETRY_EXC_ERR, and latency.

use std::time::{Duration, Instant};

use xroce_report::{BenchReport, LatReport};
use xroce_tests::{
    perf::{bench_udp_against_afxdp, next_port, run_client, run_ok, start_server},
    require_root, AttachedXdp, VethPair,
};

#[test]
fn every_operation_and_size_verified() {
    require_root();
    let pair = VethPair::new(1500);
    for op in ["write", "read", "send"] {
        for (size, iters) in [
            ("1", "200"),
            ("1000", "200"),
            ("65536", "200"),
            ("1MiB", "20"),
        ] {
            let r: BenchReport = run_ok(
                &pair,
                "bench",
                &[op],
                &[op, "--size", size, "--iters", iters],
            );
            assert_eq!(r.verified, Some(true), "{r:?}");
            assert_eq!(r.op, op);
            assert_eq!(r.backend, "afxdp");
            assert_eq!(r.iters, iters.parse::<u64>().unwrap());
            assert!(r.gbps > 0.0, "{r:?}");
        }
    }
    let r: BenchReport = run_ok(&pair, "bench", &["atomic"], &["atomic", "--iters", "2000"]);
    assert_eq!(r.verified, Some(true), "{r:?}");
    assert_eq!(r.iters, 2000);
}

#[test]
fn sixteen_queue_pairs_at_once() {
    require_root();
    let pair = VethPair::new(1500);
    let r: BenchReport = run_ok(
        &pair,
        "bench",
        &["write"],
        &["write", "--qps", "16", "--size", "16384", "--iters", "200"],
    );
    assert_eq!(r.verified, Some(true), "{r:?}");
    assert_eq!(r.qps, 16);
    assert_eq!(r.iters, 16 * 200);
}

#[test]
fn udp_backend_interoperates_with_afxdp() {
    require_root();
    let pair = VethPair::new(1500);
    bench_udp_against_afxdp(&pair, "8192", "300");
}

#[test]
fn injected_loss_is_recovered() {
    require_root();
    let pair = VethPair::new(1500);
    // Both sides keep the program attached for the whole test; 3% of every
    // RoCEv2 frame arriving at the server (requests) is dropped in XDP.
    let _xdp_a = AttachedXdp::new(&pair.a, &pair.if_a, "native");
    let xdp_b = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    xdp_b.xroce(&[
        "fault", "--iface", &pair.if_b, "--drop", "0.03", "--seed", "11",
    ]);
    for op in ["write", "read", "send"] {
        let r: BenchReport = run_ok(
            &pair,
            "bench",
            &[op],
            &[op, "--size", "65536", "--iters", "300"],
        );
        assert_eq!(r.verified, Some(true), "{r:?}");
        assert!(r.retransmits > 0, "{r:?}");
    }
    let c = pair.in_b(xroce::xdp::read_counters).unwrap();
    assert!(c.get(xroce_common::Counter::DropFault) > 0, "{c:?}");
}

#[test]
fn killed_peer_is_retry_exceeded_not_a_hang() {
    require_root();
    let pair = VethPair::new(1500);
    let port = next_port();
    let mut server = start_server(&pair, "bench", port, &["write"]);
    let pid = server.child.id() as i32;
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        // The server we started, by its PID (nsenter execs xroce in place).
        // SAFETY: kill(2) on a child of this process.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let start = Instant::now();
    let out = run_client(&pair, "bench", port, &["write", "--duration", "30"]);
    killer.join().unwrap();
    let _ = server.child.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "client survived a dead peer");
    assert!(err.contains("RetryExcErr"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?} to notice",
        start.elapsed()
    );
}

#[test]
fn latency_of_each_operation() {
    require_root();
    let pair = VethPair::new(1500);
    for op in ["send", "write", "read"] {
        let r: LatReport = run_ok(&pair, "lat", &[op], &[op, "--size", "8", "--iters", "300"]);
        assert_eq!(r.verified, Some(true), "{r:?}");
        let lat = r.lat_us;
        for v in [lat.p50, lat.p99, lat.p999, lat.max] {
            assert!(v > 0.0, "{r:?}");
        }
        assert!(lat.p50 <= lat.p99, "{r:?}");
    }
}

#[test]
fn kernel_traffic_unaffected_during_rdma() {
    require_root();
    let pair = VethPair::new(1500);
    let port = next_port();
    let server = start_server(&pair, "bench", port, &["write"]);
    let addr = pair.addr_b.to_string();
    let (ns_a, if_a) = (pair.a.name.clone(), pair.if_a.clone());
    let client = std::thread::spawn(move || {
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{ns_a}"))
            .arg("--")
            .arg(xroce_tests::workspace_bin("xroce"))
            .args(["bench", "write", "-d", &if_a, "--duration", "2", "--json"])
            .args(["--connect", &format!("{addr}:{port}")]);
        cmd.output().unwrap()
    });
    std::thread::sleep(Duration::from_millis(700));
    pair.a.exec(&[
        "ping",
        "-c",
        "5",
        "-i",
        "0.2",
        "-W",
        "2",
        &pair.addr_b.to_string(),
    ]);
    let out = client.join().unwrap();
    server.finish(Duration::from_secs(10));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
