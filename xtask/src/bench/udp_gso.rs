//! The UDP backend against kernel TCP (issue 13, goal 2): RDMA WRITE 64 KiB,
//! 1 QP, with xroce's UDP backend on both ends (UDP GSO out, turned on with
//! XROCE_UDP_GSO=1; UDP_GRO in)
//! and iperf3's TCP stream right after it on the same veth pair, with no
//! XDP program on either end (veth then carries the 64 KB GSO packets of
//! both whole). Also the syscalls the sender makes per 64 KiB (a shorter
//! run under `strace -c`), the same backend without GSO and GRO, and the
//! best backend's WRITE (this one or the
//! AF_XDP run of the same bench) against the same TCP figure.

use std::{process::Stdio, thread, time::Duration};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use xroce_report::BenchReport;

use crate::{
    dropin,
    netns::{in_ns, xroce_bin, NsPair, Started},
    util::output,
};

use super::SECONDS;

/// What the figure reports.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct UdpGso {
    /// xroce WRITE 64 KiB, 1 QP, UDP backend on both ends (best of two).
    pub udp_write_1qp: BenchReport,
    /// iperf3, one TCP stream, measured right after.
    pub tcp_gbps: f64,
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
    /// The faster of the UDP backend and the AF_XDP backend (the bench's
    /// WRITE 64 KiB 1 QP) and its ratio to `tcp_gbps`.
    pub best_backend: String,
    pub best_write_gbps: f64,
    /// Goal (issue 13): >= 1.0.
    pub best_vs_tcp: f64,
}

const SYSCALL_ITERS: &str = "2000";
/// GSO is off by default (captures on a veth would see 64 KB packets).
const GSO_ON: &[(&str, &str)] = &[("XROCE_UDP_GSO", "1"), ("XROCE_UDP_GRO", "1")];

/// `xroce bench write` 64 KiB with `--backend udp` on both ends; extra
/// client arguments `more`, the client run under `wrap` (e.g. strace).
fn udp_pair(
    ns: &NsPair,
    more: &[&str],
    wrap: &[&str],
    env: &[(&str, &str)],
) -> Result<BenchReport> {
    let listen = format!("{}:18610", ns.addr_b);
    let xroce = xroce_bin();
    let server = Started::spawn(
        in_ns(&ns.b, &xroce)
            .args(["bench", "write", "--backend", "udp"])
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
        .args(["bench", "write", "--backend", "udp", "--size", "65536"])
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
        bail!("UDP backend WRITE did not verify its data on the UDP backend: {r:?}");
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

/// The figure; `afxdp_write_1qp` is the bench's AF_XDP WRITE 64 KiB 1 QP.
pub fn measure(ns: &NsPair, afxdp_write_1qp: &BenchReport) -> Result<UdpGso> {
    // No XDP program: one on b would make veth a segment in software.
    dropin::detach(ns);
    let mut best: Option<BenchReport> = None;
    for _ in 0..2 {
        let r = udp_pair(ns, &["--duration", SECONDS], &[], GSO_ON)?;
        if best.as_ref().is_none_or(|b| r.gbps > b.gbps) {
            best = Some(r);
        }
    }
    let udp = best.expect("two runs");
    let (tcp_gbps, _) = super::iperf3(ns)?;
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
    use super::calls;

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
