//! Runs `xroce bench` / `xroce lat` pairs across a [`VethPair`]: the server
//! in namespace b, the client in namespace a, and returns the client's JSON.

use std::{
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicU16, Ordering},
    time::{Duration, Instant},
};

use xroce_report::BenchReport;

use crate::{workspace_bin, VethPair};

/// A server process we started; killed by PID if the test ends early.
/// Its output is read while it runs: a lat server on a busy host prints a
/// line per slow iteration, and a pipe nobody read filled at 64 KiB and
/// stopped it in write(2) mid-run (its client then reported "message N did
/// not arrive").
pub struct Server {
    pub child: Child,
    stdout: Option<std::thread::JoinHandle<Vec<u8>>>,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
}

/// Reads `pipe` to its end in a thread of its own.
fn drain(
    pipe: Option<impl std::io::Read + Send + 'static>,
) -> Option<std::thread::JoinHandle<Vec<u8>>> {
    let mut pipe = pipe?;
    Some(std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    }))
}

impl Server {
    /// Takes over `child`, reading its piped stdout and stderr from now on.
    pub fn new(mut child: Child) -> Self {
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits for the server to exit (it does after its clients), kills it
    /// after `timeout`, and returns its output.
    pub fn finish(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let status = self.child.wait().expect("server status");
        let read = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
        };
        Output {
            status,
            stdout: read(self.stdout.take()),
            stderr: read(self.stderr.take()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A TCP port of its own for each run in this test process.
pub fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    20000 + (std::process::id() % 2000) as u16 * 10 + NEXT.fetch_add(1, Ordering::Relaxed) % 10
}

fn nsenter(ns: &str) -> Command {
    xroce_netns::command(ns, workspace_bin("xroce"))
}

/// Starts `xroce <tool> <server_args> --listen addr_b:port -d if_b`.
pub fn start_server(pair: &VethPair, tool: &str, port: u16, args: &[&str]) -> Server {
    let child = nsenter(&pair.b.name)
        .arg(tool)
        .args(args)
        .args([
            "-d",
            &pair.if_b,
            "--listen",
            &format!("{}:{port}", pair.addr_b),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start xroce server");
    Server::new(child)
}

/// Runs `xroce <tool> <args> --connect addr_b:port -d if_a --json`.
pub fn run_client(pair: &VethPair, tool: &str, port: u16, args: &[&str]) -> Output {
    nsenter(&pair.a.name)
        .arg(tool)
        .args(args)
        .args(["-d", &pair.if_a, "--json"])
        .args(["--connect", &format!("{}:{port}", pair.addr_b)])
        .output()
        .expect("run xroce client")
}

/// One bench/lat run that must succeed; returns the client's JSON report
/// (`BenchReport` or `LatReport`: a missing field fails the test).
pub fn run_ok<R: serde::de::DeserializeOwned>(
    pair: &VethPair,
    tool: &str,
    server: &[&str],
    client: &[&str],
) -> R {
    let port = next_port();
    let srv = start_server(pair, tool, port, server);
    let out = run_client(pair, tool, port, client);
    let srv = srv.finish(Duration::from_secs(10));
    assert!(
        out.status.success(),
        "client {client:?} failed: {}\nserver: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&srv.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("client JSON {line:?}: {e}"))
}

/// 300 WRITEs of 64 KiB over AF_XDP on both sides, data verified: the
/// check that an XDP attachment really carries RDMA.
pub fn afxdp_write_verified(pair: &VethPair) -> BenchReport {
    let r: BenchReport = run_ok(
        pair,
        "bench",
        &["write", "--backend", "afxdp"],
        &[
            "write",
            "--backend",
            "afxdp",
            "--size",
            "64KiB",
            "--iters",
            "300",
        ],
    );
    assert_eq!(r.verified, Some(true), "{r:?}");
    assert_eq!(r.backend, "afxdp", "{r:?}");
    r
}

/// `bench` WRITE, READ and SEND of `size` bytes `iters` times with the UDP
/// backend on one side and AF_XDP on the other, both ways round. Asserts that
/// every run verified its data and reports the client's backend; returns the
/// reports.
pub fn bench_udp_against_afxdp(pair: &VethPair, size: &str, iters: &str) -> Vec<BenchReport> {
    let mut reports = Vec::new();
    for (server, client) in [("udp", "afxdp"), ("afxdp", "udp")] {
        for op in ["write", "read", "send"] {
            let r: BenchReport = run_ok(
                pair,
                "bench",
                &[op, "--backend", server],
                &[op, "--backend", client, "--size", size, "--iters", iters],
            );
            assert_eq!(r.verified, Some(true), "{r:?}");
            assert_eq!(r.backend, client, "{r:?}");
            reports.push(r);
        }
    }
    reports
}
