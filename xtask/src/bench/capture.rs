//! What a running `xroce capture` costs the traffic it records (issue 28:
//! data, rates and latency within noise of an uncaptured run): WRITE 64 KiB
//! and SEND 8 B latency over AF_XDP, alternating rounds without and with a
//! capture on both ends (no file: the copies are taken and counted, so the
//! figure is the copying's, not the disk's), medians of each. Also what the
//! captures kept up with: copies lost (perf buffers or the capture's socket
//! full) per copy taken; and the cores the two capture processes used while
//! the WRITEs ran. On a host whose cores the traffic fills (this one has
//! two), those cores are taken from the traffic: a rate within noise needs
//! a core to spare.

use std::{
    io::{BufRead, BufReader, Read},
    process::Stdio,
    sync::mpsc,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use xroce_report::{BenchReport, CaptureReport, LatReport};

use super::{median, xroce_pair, SECONDS};
use crate::netns::{in_ns, xroce_bin, NsPair, Started};

const ROUNDS: usize = 3;

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct CaptureCost {
    pub write_gbps_plain: f64,
    pub write_gbps_captured: f64,
    /// Goal: within noise of 1.0.
    pub write_captured_vs_plain: f64,
    /// With `-s 128`: headers only, what most debugging needs.
    pub write_gbps_captured_headers: f64,
    pub write_headers_vs_plain: f64,
    pub send_lat_p50_us_plain: f64,
    pub send_lat_p50_us_captured: f64,
    pub send_lat_p99_us_plain: f64,
    pub send_lat_p99_us_captured: f64,
    pub lat_p50_captured_vs_plain: f64,
    /// Copies the two captures took and lost over the captured WRITE rounds.
    pub write_copies: u64,
    pub write_copies_lost: u64,
    /// CPU seconds of the two capture processes per second of a captured
    /// WRITE round (median), and the machine's cores.
    pub write_capture_cores: f64,
    pub cores: usize,
    /// Every round's data arrived as sent.
    pub verified: bool,
}

/// `xroce capture -i IF --json EXTRA` in namespace `ns`, once it listens.
fn start_capture(ns: &str, iface: &str, extra: &[&str]) -> Result<Started> {
    let mut child = Started::spawn(
        in_ns(ns, xroce_bin())
            .args(["capture", "-i", iface, "--json"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )?;
    let err = child.0.stderr.take().context("capture stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("listening on") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        bail!("xroce capture on {iface} did not start listening");
    }
    Ok(child)
}

/// Ends a capture (SIGINT) and reads its report, with the CPU seconds it
/// used.
fn stop_capture(mut c: Started) -> Result<(CaptureReport, f64)> {
    let cpu = super::cpu::process_seconds(c.0.id())?;
    // SAFETY: kill(2) on the child we started, by its PID.
    unsafe { libc::kill(c.0.id() as i32, libc::SIGINT) };
    let mut out = String::new();
    c.0.stdout
        .take()
        .context("capture stdout")?
        .read_to_string(&mut out)?;
    if !c.wait()?.success() {
        bail!("xroce capture failed");
    }
    let report = serde_json::from_str(out.trim()).context("xroce capture's JSON report")?;
    Ok((report, cpu))
}

/// Runs `f` with a capture (`extra` arguments) on both ends; the two
/// captures' reports and the CPU seconds they used together.
fn captured<T>(
    ns: &NsPair,
    extra: &[&str],
    f: impl FnOnce() -> Result<T>,
) -> Result<(T, [CaptureReport; 2], f64)> {
    let a = start_capture(&ns.a, &ns.if_a, extra)?;
    let b = start_capture(&ns.b, &ns.if_b, extra)?;
    let r = f()?;
    let ((ra, ca), (rb, cb)) = (stop_capture(a)?, stop_capture(b)?);
    Ok((r, [ra, rb], ca + cb))
}

pub fn measure(ns: &NsPair) -> Result<CaptureCost> {
    let write = [
        "write",
        "--backend",
        "afxdp",
        "--size",
        "65536",
        "--duration",
        SECONDS,
    ];
    let lat = [
        "send",
        "--backend",
        "afxdp",
        "--size",
        "8",
        "--iters",
        "20000",
    ];
    let (mut plain_w, mut cap_w, mut head_w) = (Vec::new(), Vec::new(), Vec::new());
    let (mut plain_l, mut cap_l) = (Vec::new(), Vec::new());
    let (mut copies, mut lost, mut verified) = (0, 0, true);
    let mut capture_cores = Vec::new();
    for round in 0..ROUNDS {
        eprintln!("capture cost: round {} of {ROUNDS}", round + 1);
        let p: BenchReport = xroce_pair(ns, "bench", &write)?;
        let (c, reports, cpu): (BenchReport, _, _) =
            captured(ns, &[], || xroce_pair(ns, "bench", &write))?;
        capture_cores.push(cpu / c.seconds.max(1e-9));
        let (h, _, _): (BenchReport, _, _) =
            captured(ns, &["-s", "128"], || xroce_pair(ns, "bench", &write))?;
        verified &= [&p, &c, &h].iter().all(|r| r.verified == Some(true));
        head_w.push(h.gbps);
        for r in &reports {
            copies += r.rx_frames + r.tx_frames + r.rx_lost + r.tx_lost;
            lost += r.rx_lost + r.tx_lost;
        }
        plain_w.push(p.gbps);
        cap_w.push(c.gbps);
        let pl: LatReport = xroce_pair(ns, "lat", &lat)?;
        let (cl, _, _): (LatReport, _, _) = captured(ns, &[], || xroce_pair(ns, "lat", &lat))?;
        plain_l.push(pl);
        cap_l.push(cl);
    }
    let p50 = |v: &[LatReport]| median(&v.iter().map(|l| l.lat_us.p50).collect::<Vec<_>>());
    let p99 = |v: &[LatReport]| median(&v.iter().map(|l| l.lat_us.p99).collect::<Vec<_>>());
    let (wp, wc, wh) = (median(&plain_w), median(&cap_w), median(&head_w));
    let out = CaptureCost {
        write_gbps_plain: wp,
        write_gbps_captured: wc,
        write_captured_vs_plain: wc / wp,
        write_gbps_captured_headers: wh,
        write_headers_vs_plain: wh / wp,
        send_lat_p50_us_plain: p50(&plain_l),
        send_lat_p50_us_captured: p50(&cap_l),
        send_lat_p99_us_plain: p99(&plain_l),
        send_lat_p99_us_captured: p99(&cap_l),
        lat_p50_captured_vs_plain: p50(&cap_l) / p50(&plain_l),
        write_copies: copies,
        write_copies_lost: lost,
        write_capture_cores: median(&capture_cores),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        verified,
    };
    eprintln!("{}", serde_json::to_string(&out)?);
    Ok(out)
}
