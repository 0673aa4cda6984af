//! Many QPs (issue 13, goal 3): 4 KiB RDMA WRITEs over 1,024 RC QPs against
//! the same over 1 QP, on each backend, in the same run and on the same veth
//! pair. Goal: aggregate >= 0.8 x the 1-QP rate, retransmits under 1 % of
//! the messages, every QP completing with its data verified (a failed QP
//! fails the client, and so the figure).

use std::process::Stdio;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use xroce_report::BenchReport;

use crate::{
    netns::{in_ns, xroce_bin, NsPair, Started},
    util::{output, step},
};

/// QPs of the many-QP run.
pub const QPS: usize = 1024;
/// Seconds each run lasts.
const SECONDS: &str = "4";

/// One backend's pair of runs.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct ManyQpsBackend {
    pub backend: String,
    pub one_qp: BenchReport,
    pub many_qps: BenchReport,
    /// many_qps.gbps / one_qp.gbps (goal: >= 0.8).
    pub aggregate_vs_1qp: f64,
    /// many_qps.retransmits / many_qps.iters (goal: < 0.01).
    pub retransmits_per_message: f64,
}

/// The figure: both backends.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct ManyQps {
    pub qps: usize,
    pub size: u64,
    pub afxdp: ManyQpsBackend,
    pub udp: ManyQpsBackend,
}

/// Runs the figure on `ns` (both ends on the same backend each time).
pub fn many_qps(ns: &NsPair) -> Result<ManyQps> {
    let run = |backend: &str| -> Result<ManyQpsBackend> {
        step(&format!("xroce WRITE 4 KiB, 1 QP vs {QPS} QPs, {backend}"));
        let one = pair(ns, backend, 1)?;
        let many = pair(ns, backend, QPS)?;
        for r in [&one, &many] {
            if r.verified != Some(true) {
                bail!("{backend}: {} QP(s): data not verified", r.qps);
            }
        }
        Ok(ManyQpsBackend {
            backend: backend.into(),
            aggregate_vs_1qp: many.gbps / one.gbps,
            retransmits_per_message: many.retransmits as f64 / many.iters.max(1) as f64,
            one_qp: one,
            many_qps: many,
        })
    };
    let afxdp = run("afxdp")?;
    let udp = run("udp")?;
    for b in [&afxdp, &udp] {
        eprintln!(
            "{QPS} QPs {:<6} {:>7.3} Gb/s vs 1 QP {:>7.3} Gb/s: {:.2}x, {} retransmits in {} messages",
            b.backend,
            b.many_qps.gbps,
            b.one_qp.gbps,
            b.aggregate_vs_1qp,
            b.many_qps.retransmits,
            b.many_qps.iters
        );
    }
    Ok(ManyQps {
        qps: QPS,
        size: 4096,
        afxdp,
        udp,
    })
}

/// `xroce bench write --size 4096 --qps N` on `backend` at both ends.
fn pair(ns: &NsPair, backend: &str, qps: usize) -> Result<BenchReport> {
    let listen = format!("{}:18610", ns.addr_b);
    let xroce = xroce_bin();
    let server = Started::spawn(
        in_ns(&ns.b, &xroce)
            .args(["bench", "write", "--backend", backend])
            .args(["-d", &ns.if_b, "--listen", &listen])
            .stdout(Stdio::null()),
    )?;
    let qps = qps.to_string();
    let out = output(in_ns(&ns.a, &xroce).args([
        "bench",
        "write",
        "--backend",
        backend,
        "--size",
        "4096",
        "--qps",
        &qps,
        "--duration",
        SECONDS,
        "-d",
        &ns.if_a,
        "--connect",
        &listen,
        "--json",
    ]))?;
    if !server.wait()?.success() {
        bail!("the xroce bench server ({backend}, {qps} QPs) failed");
    }
    eprintln!("{}", out.trim());
    serde_json::from_str(out.trim()).context("xroce bench's JSON report")
}
