//! A second, unprivileged local user who squats what xroce's processes
//! hold (issue 25, item 1): every abstract name xroce ever used for a hold
//! (`@xroce/<ifindex>/block/0..255`, `.../afxdp`, `.../attaching`) and
//! every UDP port of the blocks open to users (4791, 24791..), on IPv4 and
//! IPv6, in the server's namespace. Root's `xroce bench` server still
//! starts there on both backends, on one of root's own blocks (a
//! privileged port, 960..=1023, which the squatter was refused), and
//! moves verified data; a process of the squatter's kind (an unprivileged
//! `xroce bench`) is refused with a message that says why. With only UDP
//! 4791 taken, root's server skips block 0 for the next block instead of
//! failing with EADDRINUSE.
//!
//! Run under `flock /tmp/xroce-netns.lock` beside other namespace tests.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use xroce_common::qpn_block;
use xroce_report::BenchReport;
use xroce_tests::{perf, require_root, shared, workspace_bin, VethPair};

/// Binds what argv[3] names ("all" or "port4791") in the namespace it runs
/// in, reports on one line, then holds until its stdin closes.
const SQUATTER: &str = r#"
import errno, os, socket, sys
iface, what = sys.argv[1], sys.argv[2]
idx = socket.if_nametoindex(iface)
held, names, ports, refused = [], 0, 0, 0
if what == "all":
    for n in [f"xroce/{idx}/block/{b}" for b in range(256)] + [f"xroce/{idx}/afxdp", f"xroce/{idx}/attaching"]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind("\0" + n)
        held.append(s)
        names += 1
    user_ports = [4791] + list(range(24791, 25046))
else:
    user_ports = [4791]
for p in user_ports:
    for fam, any_addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        s = socket.socket(fam, socket.SOCK_DGRAM)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((any_addr, p))
        held.append(s)
        ports += 1
if what == "all":
    for p in range(960, 1024):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.bind(("0.0.0.0", p))
            held.append(s)
        except PermissionError:
            refused += 1
try:
    os.makedirs("/run/xroce-holds/x", exist_ok=True)
    holds = "writable"
except PermissionError:
    holds = "refused"
print(f"names {names} ports {ports} privileged_refused {refused} holds_dir {holds}", flush=True)
sys.stdin.read()
"#;

/// The squatter, as nobody in the server's namespace, once it holds all.
struct Squatter {
    child: Child,
    report: String,
}

impl Squatter {
    fn start(pair: &VethPair, what: &str) -> Self {
        let mut cmd = pair.b.command("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["/usr/bin/python3", "-c", SQUATTER, &pair.if_b, what])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Debian's, which nobody may run (a PATH of root's may name others).
        let mut child = cmd.spawn().expect("setpriv python3");
        let mut report = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut report)
            .unwrap();
        if report.is_empty() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the squatter ended before holding anything: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self { child, report }
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        // Closing its stdin ends it.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Runs a verified 64 KiB WRITE bench with the server (root, `backend`) in
/// b, where the squatter is, and returns the server's block ports seen
/// while it listened.
fn bench_beside_squatter(pair: &VethPair, backend: &str) -> Vec<u16> {
    let before = shared::block_udp_ports(&pair.b);
    let port = perf::next_port();
    let srv = perf::start_server(pair, "bench", port, &["write", "--backend", backend]);
    // The server binds its block's port before it listens.
    let deadline = Instant::now() + Duration::from_secs(30);
    let ours = loop {
        let mut now: Vec<u16> = shared::block_udp_ports(&pair.b)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        // IPv4 and IPv6 sockets on one port.
        now.dedup();
        if !now.is_empty() {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "{backend}: the server bound no block port within 30 s: {:?}",
            srv.finish(Duration::from_secs(1)).stderr
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = perf::run_client(
        pair,
        "bench",
        port,
        &[
            "write",
            "--backend",
            "udp",
            "--size",
            "64KiB",
            "--iters",
            "300",
        ],
    );
    let srv = srv.finish(Duration::from_secs(10));
    assert!(
        out.status.success(),
        "{backend}: client failed: {}\nserver: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&srv.stderr)
    );
    let report: BenchReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report.verified, report.iters),
        (Some(true), 300),
        "{backend}: {report:?}"
    );
    ours
}

#[test]
fn a_local_user_squatting_every_name_and_port_cannot_stop_root() {
    require_root();
    let pair = VethPair::new(1500);
    let squatter = Squatter::start(&pair, "all");
    assert_eq!(
        squatter.report.trim(),
        // 258 names; 4791 and 24791..=25045 on IPv4 and IPv6; every
        // privileged port refused; root's holds out of reach.
        "names 258 ports 512 privileged_refused 64 holds_dir refused",
    );
    let roots: Vec<u16> = (qpn_block::ROOT_FIRST..qpn_block::COUNT)
        .map(qpn_block::udp_port)
        .collect();
    for backend in ["udp", "afxdp"] {
        let ports = bench_beside_squatter(&pair, backend);
        assert!(
            ports.iter().all(|p| roots.contains(p)),
            "{backend}: root's server is on a block of root's: ports {ports:?}"
        );
    }

    // An unprivileged xroce meets the squatter: refused, saying why.
    let out = pair
        .b
        .command("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(workspace_bin("xroce"))
        .args(["bench", "write", "--backend", "udp", "-d", &pair.if_b])
        .args([
            "--listen",
            &format!("{}:{}", pair.addr_b, perf::next_port()),
        ])
        .stdin(Stdio::null())
        .output();
    let out = out.expect("setpriv xroce");
    let _ = std::io::stderr().write_all(&out.stderr);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("that a user may hold are held"),
        "nobody's bench beside the squatter: {err}"
    );
    drop(squatter);
}

#[test]
fn root_skips_a_block_whose_port_another_user_bound() {
    require_root();
    let pair = VethPair::new(1500);
    let squatter = Squatter::start(&pair, "port4791");
    assert_eq!(
        squatter.report.trim(),
        "names 0 ports 2 privileged_refused 0 holds_dir refused"
    );
    let ports = bench_beside_squatter(&pair, "udp");
    assert_eq!(ports, [qpn_block::udp_port(1)], "block 1, not 0");
    drop(squatter);
}
