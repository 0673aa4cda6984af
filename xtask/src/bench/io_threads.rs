//! Several I/O threads per device over real AF_XDP (issue 13, goal 6):
//! `xroce bench write` of 64 KiB on 4 QPs, both ends with `--io-threads 1`
//! and then `--io-threads 2`, on a veth pair with 2 queues (each thread
//! its own queue), rounds alternating in the same minute. Every run
//! verifies its data. Both ends share the host's cores, so on 2 cores two
//! threads a side (4 I/O threads, plus the applications) expect no gain:
//! the figure reports what it measures, with the load average.

use std::process::Stdio;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use xroce_report::BenchReport;

use super::median;
use crate::netns::{in_ns, xroce_bin, NsPair, Started};
use crate::util::output;

const ROUNDS: usize = 3;
const SECONDS: &str = "3";
const QPS: &str = "4";

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct IoThreads {
    pub qps: u32,
    pub message_bytes: u32,
    pub seconds_per_run: f64,
    /// Gb/s of each round, 1 and 2 I/O threads a side.
    pub one_thread_gbps: Vec<f64>,
    pub two_threads_gbps: Vec<f64>,
    /// Medians over the rounds.
    pub one_thread_median_gbps: f64,
    pub two_threads_median_gbps: f64,
    /// two_threads_median_gbps / one_thread_median_gbps.
    pub two_vs_one: f64,
    /// Machine-wide CPU seconds per GB moved ([`super::cpu`]; includes
    /// whatever else runs on the host), medians over the rounds.
    pub one_thread_cpu_s_per_gb: f64,
    pub two_threads_cpu_s_per_gb: f64,
    /// CPUs of the host, and its 1-minute load average after the runs.
    pub cores: u32,
    pub load_average_1m: f64,
}

/// Runs the rounds on a 2-queue pair of its own.
pub fn measure() -> Result<IoThreads> {
    let ns = NsPair::with_queues("iot", 3, super::MTU, 2)?;
    let (mut one, mut two) = (Vec::new(), Vec::new());
    let (mut cpu_one, mut cpu_two) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for (threads, runs, cpu) in [("1", &mut one, &mut cpu_one), ("2", &mut two, &mut cpu_two)] {
            let (r, cost) = super::cpu::measure(|| {
                let r = run(&ns, threads)?;
                let bytes = r.bytes;
                Ok((r, bytes))
            })?;
            if r.verified != Some(true) {
                bail!("--io-threads {threads}: the data was not verified: {r:?}");
            }
            eprintln!(
                "--io-threads {threads}: {:.3} Gb/s, {:.2} CPU s/GB",
                r.gbps, cost.cpu_seconds_per_gb
            );
            runs.push(r.gbps);
            cpu.push(cost.cpu_seconds_per_gb);
        }
    }
    let (m1, m2) = (median(&one), median(&two));
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let t = IoThreads {
        qps: 4,
        message_bytes: 65536,
        seconds_per_run: SECONDS.parse()?,
        one_thread_gbps: one,
        two_threads_gbps: two,
        one_thread_median_gbps: m1,
        two_threads_median_gbps: m2,
        two_vs_one: m2 / m1,
        one_thread_cpu_s_per_gb: median(&cpu_one),
        two_threads_cpu_s_per_gb: median(&cpu_two),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        load_average_1m: load,
    };
    eprintln!(
        "WRITE 64 KiB, 4 QPs, AF_XDP: 2 I/O threads a side {m2:.3} Gb/s vs 1 {m1:.3} Gb/s: \
         {:.2}x ({} cores, load {load:.1}); CPU s/GB {:.2} vs {:.2}",
        t.two_vs_one, t.cores, t.two_threads_cpu_s_per_gb, t.one_thread_cpu_s_per_gb
    );
    Ok(t)
}

/// One bench pair, both ends over `threads` I/O threads.
fn run(ns: &NsPair, threads: &str) -> Result<BenchReport> {
    let listen = format!("{}:18610", ns.addr_b);
    let common = ["--backend", "afxdp", "--io-threads", threads];
    let server = Started::spawn(
        in_ns(&ns.b, xroce_bin())
            .args(["bench", "write", "-d", &ns.if_b, "--listen", &listen])
            .args(common)
            .stdout(Stdio::null()),
    )?;
    let out = output(
        in_ns(&ns.a, xroce_bin())
            .args(["bench", "write", "-d", &ns.if_a, "--connect", &listen])
            .args(common)
            .args(["--size", "65536", "--qps", QPS, "--duration", SECONDS])
            .arg("--json"),
    )?;
    if !server.wait()?.success() {
        bail!("the xroce bench server (--io-threads {threads}) failed");
    }
    serde_json::from_str(out.trim()).context("xroce bench's JSON report")
}
