//! CPU per byte (issue 27): CPU seconds per GB moved, both ends together
//! (machine-wide, see cpu.rs), for xroce's WRITE, READ and SEND of 64 KiB
//! on 1 QP and WRITE on 4 QPs, over AF_XDP and over UDP with GSO/GRO (the
//! XDP program detached), against iperf3's TCP stream measured the same
//! way, in alternating rounds on the same veth pair; medians, and per case
//! the cheaper backend's ratio (goal 1 is for the best backend). Beside
//! them, what the xroce of [`baseline::BEFORE_POST_RING`] (before this
//! work: posts under the engine lock, a scratch copy of every payload,
//! 1 ms idle wakeups) costs for the WRITE, and what an idle device with
//! an open QP costs: one process's CPU over 10 s, from /proc.

use std::{process::Stdio, thread, time::Duration};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::{cpu, iperf3, median, udp_gso, xroce_pair_with, SECONDS};
use crate::{
    baseline, dropin,
    netns::{in_ns, xroce_bin, NsPair, Started},
    util::step,
};

const ROUNDS: usize = 3;

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct CpuPerByte {
    pub rounds: usize,
    /// CPU s/GB, medians.
    pub tcp: f64,
    pub write_1qp: f64,
    pub read_1qp: f64,
    pub send_1qp: f64,
    pub write_4qp: f64,
    /// The WRITE by the xroce of `before_commit`.
    pub write_1qp_before: f64,
    pub before_commit: String,
    /// Goal (issue 27, 1): <= 1.0.
    pub write_1qp_vs_tcp: f64,
    pub read_1qp_vs_tcp: f64,
    pub send_1qp_vs_tcp: f64,
    pub write_4qp_vs_tcp: f64,
    pub write_1qp_vs_before: f64,
    /// Throughput, Gb/s medians (goal 2: WRITE >= TCP on this pair).
    pub tcp_gbps: f64,
    pub write_1qp_gbps: f64,
    /// An idle `xroce bench` server's share of one core over 10 s (goal
    /// 3: < 1 %), this xroce and the one before.
    pub idle_core_percent: f64,
    pub idle_core_percent_before: f64,
    /// The four cases over the UDP backend with GSO/GRO: CPU s/GB medians
    /// (write, read, send, write 4 QPs), and the 1-QP WRITE's Gb/s.
    pub udp_gso: [f64; 4],
    pub udp_gso_write_1qp_gbps: f64,
    /// Per case (same order), the cheaper backend and its ratio to TCP.
    pub best_backend: [String; 4],
    pub best_vs_tcp: [f64; 4],
}

/// One xroce transfer's CPU s/GB and Gb/s.
fn xroce_cost(exe: &std::path::Path, ns: &NsPair, args: &[&str]) -> Result<(f64, f64)> {
    let (r, cost) = cpu::measure_bench(|| xroce_pair_with(exe, ns, "bench", args))?;
    Ok((cost.cpu_seconds_per_gb, r.gbps))
}

/// CPU share of one core an idle `xroce bench` server (device open, I/O
/// thread running, waiting for a client) uses over 10 s.
fn idle_percent(exe: &std::path::Path, ns: &NsPair) -> Result<f64> {
    let listen = format!("{}:18610", ns.addr_b);
    let server = Started::spawn(
        in_ns(&ns.b, exe)
            .args(["bench", "write", "-d", &ns.if_b, "--listen", &listen])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    // Past its start-up.
    thread::sleep(Duration::from_secs(2));
    // nsenter execs the program: the child is the server itself.
    let pid = server.0.id();
    let a = cpu::process_seconds(pid)?;
    thread::sleep(Duration::from_secs(10));
    let b = cpu::process_seconds(pid)?;
    drop(server);
    Ok((b - a) / 10.0 * 100.0)
}

pub fn measure(ns: &NsPair) -> Result<CpuPerByte> {
    let before_exe = baseline::xroce_at(baseline::BEFORE_POST_RING)?;
    let exe = xroce_bin();
    let size = ["--size", "65536", "--duration", SECONDS];
    let cases: [(&str, Vec<&str>); 4] = [
        ("write", [&["write"][..], &size].concat()),
        ("read", [&["read"][..], &size].concat()),
        ("send", [&["send"][..], &size].concat()),
        (
            "write 4 QPs",
            [&["write", "--qps", "4"][..], &size].concat(),
        ),
    ];
    let mut cost: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut udp_cost: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut udp_write_gbps = Vec::new();
    let (mut tcp, mut tcp_gbps, mut before, mut write_gbps) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        step(&format!("CPU per byte, round {}/{ROUNDS}", round + 1));
        // TCP without xroce's XDP program on the veth (an AF_XDP run
        // leaves it attached): with it, the kernel segments in software.
        dropin::detach(ns);
        let (gbps, tcp_cost) = cpu::measure(|| iperf3(ns))?;
        tcp.push(tcp_cost.cpu_seconds_per_gb);
        tcp_gbps.push(gbps);
        for (i, (name, args)) in cases.iter().enumerate() {
            let (c, g) = xroce_cost(&exe, ns, args)?;
            eprintln!(
                "  {name}: {c:.2} CPU s/GB at {g:.2} Gb/s (TCP {:.2})",
                tcp_cost.cpu_seconds_per_gb
            );
            cost[i].push(c);
            if i == 0 {
                write_gbps.push(g);
            }
        }
        // No XDP program for the UDP backend: on a veth whose peer runs
        // one, the kernel cuts GSO packets into frames in software.
        dropin::detach(ns);
        for (i, (name, args)) in cases.iter().enumerate() {
            // udp_op_pair gives the size itself.
            let more: Vec<&str> = args[1..]
                .iter()
                .filter(|a| **a != "--size" && **a != "65536")
                .copied()
                .collect();
            let (r, c) = cpu::measure_bench(|| {
                udp_gso::udp_op_pair(ns, args[0], &more, &[], udp_gso::GSO_ON)
            })?;
            eprintln!(
                "  {name} over UDP GSO/GRO: {:.2} CPU s/GB at {:.2} Gb/s",
                c.cpu_seconds_per_gb, r.gbps
            );
            udp_cost[i].push(c.cpu_seconds_per_gb);
            if i == 0 {
                udp_write_gbps.push(r.gbps);
            }
        }
        let (c, g) = xroce_cost(&before_exe, ns, &cases[0].1)?;
        eprintln!(
            "  write by xroce {}: {c:.2} CPU s/GB at {g:.2} Gb/s",
            baseline::BEFORE_POST_RING
        );
        before.push(c);
    }
    step("idle device: one process's CPU over 10 s, this xroce and the one before");
    let idle = idle_percent(&exe, ns)?;
    let idle_before = idle_percent(&before_exe, ns)?;
    let tcp = median(&tcp);
    let m: Vec<f64> = cost.iter().map(|c| median(c)).collect();
    let u: [f64; 4] = std::array::from_fn(|i| median(&udp_cost[i]));
    let best_backend =
        std::array::from_fn(|i| if u[i] < m[i] { "udp" } else { "afxdp" }.to_string());
    let best_vs_tcp = std::array::from_fn(|i| m[i].min(u[i]) / tcp);
    let before = median(&before);
    Ok(CpuPerByte {
        rounds: ROUNDS,
        tcp,
        write_1qp: m[0],
        read_1qp: m[1],
        send_1qp: m[2],
        write_4qp: m[3],
        write_1qp_before: before,
        before_commit: baseline::BEFORE_POST_RING.into(),
        write_1qp_vs_tcp: m[0] / tcp,
        read_1qp_vs_tcp: m[1] / tcp,
        send_1qp_vs_tcp: m[2] / tcp,
        write_4qp_vs_tcp: m[3] / tcp,
        write_1qp_vs_before: m[0] / before,
        tcp_gbps: median(&tcp_gbps),
        write_1qp_gbps: median(&write_gbps),
        idle_core_percent: idle,
        idle_core_percent_before: idle_before,
        udp_gso: u,
        udp_gso_write_1qp_gbps: median(&udp_write_gbps),
        best_backend,
        best_vs_tcp,
    })
}
