//! The UDP backend against kernel TCP (issue 13, goal 2): RDMA WRITE 64 KiB,
//! 1 QP, with xroce's UDP backend on both ends (UDP GSO out, turned on with
//! XROCE_UDP_GSO=1; UDP_GRO in)
//! and iperf3's TCP stream alternating with it, 3 rounds each, medians, on
//! the same veth pair, with no XDP program on either end (veth then carries
//! the 64 KB GSO packets of both whole). Also the syscalls the sender makes
//! per 64 KiB (a shorter run under `strace -c`), the same backend without
//! GSO and GRO, and the best backend's WRITE (this one or the AF_XDP run of
//! the same bench) against the same TCP figure.
//!
//! The pair is one of its own with MTU [`JUMBO_MTU`] (RoCE path MTU 4096,
//! the largest; TCP's MSS 4160), not the bench's 3500 (path MTU 2048, TCP
//! MSS 3460): both peers get the same pair. Both cross veth as 64 KB
//! packets, but xroce's per-packet work (ICRC, headers, engine) is per
//! RoCE MTU, so at 3500 it handles 1.7x more packets per byte than at
//! 4200, and a RoCE deployment with jumbo frames runs 4096. The same two
//! runs on the bench's pair are reported too ([`AtBenchMtu`]).

use std::{process::Stdio, thread, time::Duration};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use xroce_report::BenchReport;

use crate::{
    dropin,
    netns::{in_ns, xroce_bin, NsPair, Started},
    util::output,
};

use super::{median, SECONDS};

/// The veth MTU of the figure's own pair.
pub const JUMBO_MTU: u32 = 4200;
const ROUNDS: usize = 3;

/// The UDP backend (GSO/GRO) and TCP on the bench's pair, one run each.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct AtBenchMtu {
    pub veth_mtu: u32,
    pub udp_gbps: f64,
    pub tcp_gbps: f64,
    pub udp_vs_tcp: f64,
}

/// What the figure reports.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct UdpGso {
    /// The veth MTU of the pair (both peers), [`JUMBO_MTU`].
    pub veth_mtu: u32,
    /// xroce WRITE 64 KiB, 1 QP, UDP backend on both ends (the median of
    /// `ROUNDS` runs).
    pub udp_write_1qp: BenchReport,
    /// Every round's Gb/s.
    pub udp_rounds_gbps: Vec<f64>,
    /// iperf3, one TCP stream, the median of `ROUNDS` runs, each right
    /// after a WRITE run.
    pub tcp_gbps: f64,
    pub tcp_rounds_gbps: Vec<f64>,
    /// The UDP backend without GSO and GRO (XROCE_UDP_GSO=0,
    /// XROCE_UDP_GRO=0 on both ends: one datagram per sendmmsg entry and
    /// per recvmmsg entry), one run.
    pub udp_plain_write_1qp: BenchReport,
    pub gso_gro_vs_plain: f64,
    /// sendmmsg + sendmsg + sendto calls of the sending xroce per 64 KiB
    /// WRITE (a run of `SYSCALL_ITERS` WRITEs under strace -c).
    pub udp_send_syscalls_per_64k: f64,
    /// recvmmsg + recvmsg + recvfrom calls of the same process per 64 KiB
    /// (it receives the ACKs).
    pub udp_recv_syscalls_per_64k: f64,
    pub udp_write_vs_tcp: f64,
    /// The faster of the UDP backend (on this pair) and the AF_XDP backend
    /// (the bench's WRITE 64 KiB 1 QP, on the bench's pair) and its ratio
    /// to `tcp_gbps`.
    pub best_backend: String,
    pub best_write_gbps: f64,
    /// Goal (issue 13): >= 1.0.
    pub best_vs_tcp: f64,
    pub at_bench_mtu: AtBenchMtu,
}

const SYSCALL_ITERS: &str = "2000";
/// GSO is off by default (captures on a veth would see 64 KB packets).
pub(super) const GSO_ON: &[(&str, &str)] = &[("XROCE_UDP_GSO", "1"), ("XROCE_UDP_GRO", "1")];

/// `xroce bench write` 64 KiB with `--backend udp` on both ends; extra
/// client arguments `more`, the client run under `wrap` (e.g. strace).
pub(super) fn udp_pair(
    ns: &NsPair,
    more: &[&str],
    wrap: &[&str],
    env: &[(&str, &str)],
) -> Result<BenchReport> {
    udp_op_pair(ns, "write", more, wrap, env)
}

/// [`udp_pair`] of `xroce bench OP` (write, read, send).
pub(super) fn udp_op_pair(
    ns: &NsPair,
    op: &str,
    more: &[&str],
    wrap: &[&str],
    env: &[(&str, &str)],
) -> Result<BenchReport> {
    let listen = format!("{}:18610", ns.addr_b);
    let xroce = xroce_bin();
    let server = Started::spawn(
        in_ns(&ns.b, &xroce)
            .args(["bench", op, "--backend", "udp"])
            .args(["-d", &ns.if_b, "--listen", &listen])
            .envs(env.iter().copied())
            .stdout(Stdio::null()),
    )?;
    // The server binds before the client connects over TCP (it retries).
    thread::sleep(Duration::from_millis(300));
    let mut client = match wrap.split_first() {
        Some((tool, args)) => {
            let mut c = in_ns(&ns.a, tool);
            c.args(args).arg(&xroce);
            c
        }
        None => in_ns(&ns.a, &xroce),
    };
    client
        .args(["bench", op, "--backend", "udp", "--size", "65536"])
        .args(more)
        .args(["-d", &ns.if_a, "--connect", &listen, "--json"])
        .envs(env.iter().copied());
    let out = output(&mut client)?;
    if !server.wait()?.success() {
        bail!("the xroce bench server (UDP backend) failed");
    }
    eprintln!("{}", out.trim());
    let r: BenchReport =
        serde_json::from_str(out.trim()).context("xroce bench's JSON report (UDP backend)")?;
    if r.verified != Some(true) || r.backend != "udp" {
        bail!("UDP backend {op} did not verify its data on the UDP backend: {r:?}");
    }
    Ok(r)
}

/// Calls of the syscalls `names` in an `strace -c` summary.
fn calls(summary: &str, names: &[&str]) -> u64 {
    // % time  seconds  usecs/call  calls  [errors]  syscall
    summary
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let name = *cols.last()?;
            names
                .contains(&name)
                .then(|| cols.get(3)?.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

/// The figure; `bench_ns` is the bench's pair and `afxdp_write_1qp` its
/// AF_XDP WRITE 64 KiB 1 QP.
pub fn measure(bench_ns: &NsPair, afxdp_write_1qp: &BenchReport) -> Result<UdpGso> {
    // No XDP program: one on b would make veth a segment in software.
    dropin::detach(bench_ns);
    let at_bench_mtu = {
        let udp = udp_pair(bench_ns, &["--duration", SECONDS], &[], GSO_ON)?;
        let (tcp_gbps, _) = super::iperf3(bench_ns)?;
        AtBenchMtu {
            veth_mtu: super::MTU,
            udp_gbps: udp.gbps,
            tcp_gbps,
            udp_vs_tcp: udp.gbps / tcp_gbps,
        }
    };
    let ns = &NsPair::new("ugso", 4, JUMBO_MTU)?;
    let mut runs = Vec::new();
    let mut tcp_rounds_gbps = Vec::new();
    for _ in 0..ROUNDS {
        runs.push(udp_pair(ns, &["--duration", SECONDS], &[], GSO_ON)?);
        tcp_rounds_gbps.push(super::iperf3(ns)?.0);
    }
    let udp_rounds_gbps: Vec<f64> = runs.iter().map(|r| r.gbps).collect();
    let udp_median = median(&udp_rounds_gbps);
    let udp = runs
        .into_iter()
        .find(|r| r.gbps == udp_median)
        .expect("the median is a run's");
    let tcp_gbps = median(&tcp_rounds_gbps);
    // The same backend as it was: a datagram per sendmmsg entry, no GRO.
    let plain = udp_pair(
        ns,
        &["--duration", SECONDS],
        &[],
        &[("XROCE_UDP_GSO", "0"), ("XROCE_UDP_GRO", "0")],
    )?;
    let log = std::env::temp_dir().join(format!("xroce-bench-strace-{}", std::process::id()));
    let log_arg = log.to_string_lossy().into_owned();
    let traced = udp_pair(
        ns,
        &["--iters", SYSCALL_ITERS],
        &[
            "strace",
            "-f",
            "-c",
            "-o",
            &log_arg,
            "-e",
            "trace=sendmmsg,sendmsg,sendto,recvmmsg,recvmsg,recvfrom",
        ],
        GSO_ON,
    );
    let summary = std::fs::read_to_string(&log);
    let _ = std::fs::remove_file(&log);
    let traced = traced?;
    let summary = summary.context("strace -c summary")?;
    let per_64k = traced.bytes as f64 / 65536.0;
    if per_64k < 1.0 {
        bail!("the strace run moved no data: {traced:?}");
    }
    let send = calls(&summary, &["sendmmsg", "sendmsg", "sendto"]) as f64 / per_64k;
    let recv = calls(&summary, &["recvmmsg", "recvmsg", "recvfrom"]) as f64 / per_64k;
    let (best_backend, best_write_gbps) = if udp.gbps >= afxdp_write_1qp.gbps {
        ("udp".to_string(), udp.gbps)
    } else {
        (afxdp_write_1qp.backend.clone(), afxdp_write_1qp.gbps)
    };
    Ok(UdpGso {
        veth_mtu: JUMBO_MTU,
        udp_rounds_gbps,
        tcp_rounds_gbps,
        at_bench_mtu,
        udp_write_vs_tcp: udp.gbps / tcp_gbps,
        gso_gro_vs_plain: udp.gbps / plain.gbps,
        udp_plain_write_1qp: plain,
        best_vs_tcp: best_write_gbps / tcp_gbps,
        udp_write_1qp: udp,
        tcp_gbps,
        udp_send_syscalls_per_64k: send,
        udp_recv_syscalls_per_64k: recv,
        best_backend,
        best_write_gbps,
    })
}

#[cfg(test)]
mod tests {
    use super::{calls, measure, NsPair, UdpGso};
    use xroce_report::BenchReport;

    /// The figure alone (`cargo xtask bench` runs it among all the others):
    /// `cargo test -p xtask figure_runs -- --ignored --nocapture` as root,
    /// under `flock /tmp/xroce-netns.lock`, after a release build; the
    /// AF_XDP figure it is compared with is left at 0 here.
    #[test]
    #[ignore = "needs root, iperf3, strace and target/release/xroce (about 90 s)"]
    fn figure_runs() {
        let ns = NsPair::new("ugsot", 6, super::super::MTU).expect("veth pair");
        let afxdp: BenchReport = serde_json::from_str(
            r#"{"op":"write","size":65536,"iters":0,"qps":1,"mtu":2048,"backend":"afxdp",
               "cc":"none","seconds":0,"bytes":0,"gbps":0,"msgs_per_sec":0,
               "verified":null,"retransmits":0,"cnps":0}"#,
        )
        .expect("report");
        let r: UdpGso = measure(&ns, &afxdp).expect("the udp_gso figure");
        println!("{}", serde_json::to_string_pretty(&r).unwrap());
        assert_eq!(r.udp_write_1qp.verified, Some(true));
        assert_eq!(r.best_backend, "udp");
    }

    #[test]
    fn strace_summaries_parse() {
        let s = "% time     seconds  usecs/call     calls    errors syscall\n\
                 ------ ----------- ----------- --------- --------- ----------------\n \
                 61.10    0.012000          10      1200           sendmmsg\n \
                 38.90    0.007640           2      3500      3000 recvmmsg\n \
                  0.00    0.000000           0         4           sendto\n\
                 ------ ----------- ----------- --------- --------- ----------------\n\
                 100.00    0.019640           4      4704      3000 total\n";
        assert_eq!(calls(s, &["sendmmsg", "sendmsg", "sendto"]), 1204);
        assert_eq!(calls(s, &["recvmmsg"]), 3500);
        assert_eq!(calls(s, &["total"]), 4704);
    }
}
