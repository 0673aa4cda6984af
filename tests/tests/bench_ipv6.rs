//! xroce's own tools speak RoCEv2 over IPv6: `xroce bench write` between
//! two namespaces addressed by IPv6 only on the command line (`--listen
//! [fd..::2]:P`, `--connect [fd..::2]:P`), on both backends, data
//! verified; a capture filtered on the client's IPv6 address (`xroce
//! capture --peer`) records the WRITE's frames both ways, so they are
//! RoCEv2 over IPv6, not over the interfaces' IPv4 addresses.
//!
//! Run under `flock /tmp/xroce-netns.lock` beside other namespace tests.

use std::{
    io::{BufRead, BufReader, Read},
    net::Ipv6Addr,
    process::Stdio,
    sync::mpsc,
    time::Duration,
};

use xroce_report::{BenchReport, CaptureReport};
use xroce_tests::{perf::next_port, require_root, workspace_bin, VethPair};

const ITERS: u64 = 200;

fn bench_over_ipv6(backend: &str) {
    require_root();
    let pair = VethPair::new(1500);
    let tag = std::process::id() % 0xffff;
    let (a6, b6): (Ipv6Addr, Ipv6Addr) = (
        format!("fd77:{tag:x}::1").parse().unwrap(),
        format!("fd77:{tag:x}::2").parse().unwrap(),
    );
    for (ns, iface, addr) in [(&pair.a, &pair.if_a, a6), (&pair.b, &pair.if_b, b6)] {
        ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{addr}/64"),
            "dev",
            iface,
            "nodad",
        ]);
    }
    // A capture on b of what goes to and from a's IPv6 address, up first.
    let mut cap = pair
        .b
        .command(workspace_bin("xroce"))
        .args([
            "capture",
            "-i",
            &pair.if_b,
            "--peer",
            &a6.to_string(),
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xroce capture");
    let err = cap.stderr.take().unwrap();
    let (ready_tx, ready) = mpsc::channel();
    let lines = std::thread::spawn(move || {
        let mut all = String::new();
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if l.contains("listening on") {
                let _ = ready_tx.send(());
            }
            all.push_str(&l);
            all.push('\n');
        }
        all
    });
    if ready.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = cap.kill();
        let _ = cap.wait();
        panic!("capture did not start: {}", lines.join().unwrap());
    }

    let at = format!("[{b6}]:{}", next_port());
    let mut server = pair
        .b
        .command(workspace_bin("xroce"))
        .args(["bench", "write", "--backend", backend, "-d", &pair.if_b])
        .args(["--listen", &at])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bench server");
    let client = pair
        .a
        .command(workspace_bin("xroce"))
        .args(["bench", "write", "--backend", backend, "-d", &pair.if_a])
        .args([
            "--connect",
            &at,
            "--size",
            "65536",
            "--iters",
            &ITERS.to_string(),
        ])
        .arg("--json")
        .output()
        .expect("bench client");
    let mut server_err = String::new();
    server
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut server_err)
        .unwrap();
    let server_ok = server.wait().unwrap().success();
    // SAFETY: kill(2) on the child we started, by its PID.
    unsafe { libc::kill(cap.id() as i32, libc::SIGINT) };
    let mut out = String::new();
    cap.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let cap_ok = cap.wait().unwrap().success();
    let cap_err = lines.join().unwrap();

    assert!(
        client.status.success() && server_ok,
        "{backend}: client: {}\nserver: {server_err}",
        String::from_utf8_lossy(&client.stderr)
    );
    let r: BenchReport = serde_json::from_slice(&client.stdout).expect("client JSON");
    assert_eq!(
        (r.verified, r.iters),
        (Some(true), ITERS),
        "{backend}: {r:?}"
    );
    assert!(
        server_err.contains(&format!("from {a6}")),
        "{backend}: {server_err}"
    );
    assert!(cap_ok, "{backend}: capture: {cap_err}");
    let c: CaptureReport = serde_json::from_str(out.trim()).expect("capture JSON");
    // 200 WRITEs of 64 KiB at path MTU 1024: 12,800 data packets to b.
    assert!(
        c.rx_frames >= ITERS * 64 && c.tx_frames > 0,
        "{backend}: RoCEv2 frames to and from {a6}: {c:?}"
    );
}

#[test]
fn bench_over_ipv6_udp() {
    bench_over_ipv6("udp");
}

#[test]
fn bench_over_ipv6_afxdp() {
    bench_over_ipv6("afxdp");
}
