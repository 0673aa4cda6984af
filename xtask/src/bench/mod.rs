//! `cargo xtask bench`: xroce against its peers on the same veth pair in one
//! run, reported as ratios: RDMA WRITE bandwidth (64 KiB, 1 and 4 QPs) vs
//! kernel TCP (iperf3), SEND latency (8 B) vs kernel UDP ping-pong
//! (sockperf), Debian's unmodified ib_write_bw / ib_send_lat over xroce's
//! drop-in libibverbs vs xroce's own bench / lat (the cost of the ABI
//! layer), the codec's ICRC vs plain CRC-32 implementations, and one
//! process alone on a device now that devices are shared vs the xroce of
//! the commit before sharing ([`baseline`]), xroce's WRITE against the raw
//! AF_XDP ceiling of the same pair ([`ceiling`]), and the CPU seconds per GB
//! of xroce and of kernel TCP ([`cpu`]), and WRITE goodput under 0.1 % and
//! 1 % loss, go-back-N against selective repeat ([`loss`]), UCX and Open
//! MPI over xroce against their TCP transports ([`clients`]), and TIMELY's
//! and Swift's queue delay at a real bottleneck against their targets
//! ([`cc_delay`]), and what a running `xroce capture` costs the traffic it
//! records ([`capture`]), and WRITE over each backend against TCP on pairs
//! of MTU 1500, 3500 and 9000 ([`mtu_sweep`]).
//! Writes target/bench/report.json.

use std::{
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;
use xroce_report::{BenchReport, LatReport};

mod capture;
mod cc_delay;
mod ceiling;
mod clients;
mod cpu;
mod cpu_per_byte;
mod io_threads;
mod latency_tail;
mod loss;
mod many_qps;
mod mtu_sweep;
mod multicore;
mod post_path;
mod udp_gso;

use crate::{
    baseline, dropin,
    netns::{in_ns, xroce_bin, NsPair, Started},
    util::{output, require_root_for, step, workspace_root},
};

const MTU: u32 = 3500;
const SECONDS: &str = "5";

/// target/bench/report.json.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Report {
    /// The veth pair's MTU.
    mtu: u32,
    xroce_write_1qp: BenchReport,
    xroce_write_4qp: BenchReport,
    xroce_send_lat: LatReport,
    iperf3_tcp_gbps: f64,
    sockperf_udp_half_rtt_p50_us: f64,
    /// xroce-wire's icrc_bench output as it printed it (copied, not read).
    icrc: Value,
    dropin_ib_write_bw_gbps: f64,
    dropin_ib_send_lat_typical_us: f64,
    /// WRITE 64 KiB, 1 QP, by the xroce of commit
    /// [`baseline::BEFORE_SHARED_DEVICE`] (best of two runs).
    before_shared_device_write_1qp: BenchReport,
    /// The same by this xroce, one process alone on the device (best of
    /// two runs, alternating with the other).
    shared_device_alone_write_1qp: BenchReport,
    /// The raw AF_XDP ceiling on the same pair (issue 13, goal 1).
    afxdp_ceiling: ceiling::Blast,
    /// CPU cost of xroce's WRITE 64 KiB 1 QP and of iperf3's TCP stream
    /// (issue 13, goal 7).
    cpu_xroce_write_1qp: cpu::CpuCost,
    cpu_tcp: cpu::CpuCost,
    /// 100,000 SENDs of 8 B per backend: max, p99, stalls over 10 ms, and
    /// p99 vs sockperf's (issue 13, goal 5).
    latency_tail: latency_tail::LatencyTail,
    /// The UDP backend (GSO/GRO) and the best backend vs kernel TCP (issue
    /// 13, goal 2).
    udp_gso: udp_gso::UdpGso,
    /// 1,024 QPs of 4 KiB WRITEs vs 1 QP, each backend (issue 13, goal 3).
    many_qps: many_qps::ManyQps,
    /// 4 QPs on 2 engine shards/threads vs 1, engine only (issue 13, goal 6).
    multicore: multicore::Multicore,
    /// WRITE 64 KiB, 4 QPs over AF_XDP, 2 I/O threads a side vs 1 (goal 6,
    /// end to end).
    io_threads: io_threads::IoThreads,
    /// WRITE 64 KiB at 0 / 0.1 / 1 % loss, go-back-N vs selective repeat
    /// (issue 13, goal 4).
    loss: loss::Loss,
    /// UCX (ucx_perftest) over xroce vs UCX over TCP (issue 23, item 4).
    clients: clients::Clients,
    /// TIMELY and Swift: the bottleneck's queue delay against their targets.
    cc_delay: cc_delay::CcDelay,
    /// WRITE and SEND latency with a capture on both ends vs without
    /// (issue 28).
    capture: capture::CaptureCost,
    /// 8-byte WRITE rate and latency, posts through the engine lock
    /// (before) vs through each QP's ring (issue 26, item 2).
    post_path: post_path::PostPath,
    /// CPU s/GB of WRITE, READ, SEND and 4-QP WRITE vs TCP, against the
    /// xroce before, and an idle device's cost (issue 27).
    cpu_per_byte: cpu_per_byte::CpuPerByte,
    /// WRITE 64 KiB over each backend vs TCP on pairs of MTU 1500, 3500
    /// and 9000, with their CPU s/GB (issue 27, goal 2).
    mtu_sweep: mtu_sweep::MtuSweep,
    ratios: Ratios,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Ratios {
    dropin_write_vs_xroce_bench: f64,
    dropin_send_lat_vs_xroce_lat: f64,
    write_1qp_vs_tcp: f64,
    write_4qp_vs_tcp: f64,
    send_lat_p50_vs_udp: f64,
    /// Goal (issue 12): >= 0.9.
    shared_device_alone_vs_before: f64,
    /// Goal (issue 13): >= 0.85.
    write_1qp_vs_afxdp_ceiling: f64,
    /// CPU seconds per GB, xroce over kernel TCP (lower is cheaper).
    cpu_per_gb_write_1qp_vs_tcp: f64,
}

/// The median of rounds (the upper one of an even count), as every figure
/// of alternating rounds reports it.
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// Prints one figure measured alone (`XROCE_BENCH_ONLY`).
fn alone<T: Serialize>(figure: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(figure)?);
    Ok(())
}

pub fn bench() -> Result<()> {
    require_root_for("the benchmarks (network namespaces and XDP)")?;
    step("build (release)");
    dropin::build_release()?;
    let ns = NsPair::new("bench", 1, MTU)?;
    step(&format!("veth pair {} <-> {}, MTU {MTU}", ns.if_a, ns.if_b));
    // One figure alone, printed (the report file is not written).
    match std::env::var("XROCE_BENCH_ONLY").ok().as_deref() {
        None => {}
        Some("many_qps") => return alone(&many_qps::many_qps(&ns)?),
        Some("loss") => return alone(&loss::measure(&ns)?),
        Some("io_threads") => return alone(&io_threads::measure()?),
        Some("multicore") => return alone(&multicore::measure()?),
        Some("latency_tail") => return alone(&latency_tail::measure(&ns)?),
        Some("clients") => return alone(&clients::measure(MTU)?),
        Some("cc_delay") => return alone(&cc_delay::measure()?),
        Some("capture") => return alone(&capture::measure(&ns)?),
        Some("post_path") => return alone(&post_path::measure(&ns)?),
        Some("cpu_per_byte") => return alone(&cpu_per_byte::measure(&ns)?),
        Some("mtu_sweep") => return alone(&mtu_sweep::measure()?),
        Some("udp_gso") => {
            // Its best-backend line needs the AF_XDP WRITE of the full run.
            step("xroce RDMA WRITE 64 KiB, 1 QP");
            let w1: BenchReport = xroce_pair(
                &ns,
                "bench",
                &["write", "--size", "65536", "--duration", SECONDS],
            )?;
            return alone(&udp_gso::measure(&ns, &w1)?);
        }
        Some(other) => bail!(
            "XROCE_BENCH_ONLY={other} is not a figure: use many_qps, loss, io_threads, \
             multicore, latency_tail, udp_gso, clients, cc_delay, capture, post_path, \
             cpu_per_byte or mtu_sweep \
             (unset: every figure)"
        ),
    }

    step("xroce RDMA WRITE 64 KiB, 1 QP");
    let (w1, cpu_w1) = cpu::measure(|| {
        let r: BenchReport = xroce_pair(
            &ns,
            "bench",
            &["write", "--size", "65536", "--duration", SECONDS],
        )?;
        let bytes = r.bytes;
        Ok((r, bytes))
    })?;
    step("raw AF_XDP ceiling: WRITE-sized frames, no RDMA");
    ceiling::build()?;
    let blast = ceiling::blast(&ns, 5)?;
    eprintln!("{}", serde_json::to_string(&blast)?);
    step("xroce RDMA WRITE 64 KiB, 4 QPs");
    let w4: BenchReport = xroce_pair(
        &ns,
        "bench",
        &[
            "write",
            "--size",
            "65536",
            "--qps",
            "4",
            "--duration",
            SECONDS,
        ],
    )?;
    step(&format!(
        "WRITE 64 KiB, 1 QP: alone on a shared device vs xroce {} (before sharing)",
        baseline::BEFORE_SHARED_DEVICE
    ));
    let before_exe = baseline::xroce_at(baseline::BEFORE_SHARED_DEVICE)?;
    let write_args = ["write", "--size", "65536", "--duration", SECONDS];
    let mut before: Option<BenchReport> = None;
    let mut alone: Option<BenchReport> = None;
    for _ in 0..2 {
        let b: BenchReport = xroce_pair_with(&before_exe, &ns, "bench", &write_args)?;
        let a: BenchReport = xroce_pair(&ns, "bench", &write_args)?;
        if before.as_ref().is_none_or(|x| b.gbps > x.gbps) {
            before = Some(b);
        }
        if alone.as_ref().is_none_or(|x| a.gbps > x.gbps) {
            alone = Some(a);
        }
    }
    let (before, alone) = (before.expect("two runs"), alone.expect("two runs"));
    step("xroce SEND latency, 8 B");
    let lat: LatReport = xroce_pair(&ns, "lat", &["send", "--size", "8", "--iters", "20000"])?;
    step("Debian ib_write_bw 64 KiB over xroce's libibverbs, 1 QP");
    let dropin_write = dropin::perftest(
        &ns,
        "ib_write_bw",
        &["-s", "65536", "-D", SECONDS, "--report_gbits"],
    );
    dropin::detach(&ns);
    let dropin_write = dropin_write?;
    eprintln!("{}", dropin_write.table);
    // #bytes #iterations BW-peak BW-average MsgRate
    let dropin_write_gbps = column(&dropin_write, 3, "ib_write_bw's BW average")?;
    step("Debian ib_send_lat 8 B over xroce's libibverbs");
    let dropin_lat = dropin::perftest(&ns, "ib_send_lat", &["-s", "8", "-n", "20000"]);
    dropin::detach(&ns);
    let dropin_lat = dropin_lat?;
    eprintln!("{}", dropin_lat.table);
    // #bytes #iterations t_min t_max t_typical t_avg ...: t_typical is the
    // median half round trip, as `xroce lat` reports p50.
    let dropin_lat_us = column(&dropin_lat, 4, "ib_send_lat's t_typical")?;
    step("iperf3 TCP, one stream");
    let (tcp_gbps, cpu_tcp) = cpu::measure(|| iperf3(&ns))?;
    step("xroce RDMA WRITE 64 KiB, 1 QP, UDP backend (GSO/GRO) vs iperf3 TCP");
    let udp_gso = udp_gso::measure(&ns, &w1)?;
    eprintln!("{}", serde_json::to_string(&udp_gso)?);
    step("latency tail: 100,000 SENDs of 8 B per backend, sockperf p99");
    let latency_tail = latency_tail::measure(&ns)?;
    step("sockperf UDP ping-pong, 64 B");
    let udp_p50 = sockperf(&ns)?;
    step("ICRC throughput vs CRC-32 peers");
    let icrc: Value = serde_json::from_str(&output(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "run",
                "--quiet",
                "--release",
                "-p",
                "xroce-wire",
                "--example",
                "icrc_bench",
            ])
            .current_dir(workspace_root()),
    )?)
    .context("icrc_bench output")?;

    let many_qps = many_qps::many_qps(&ns)?;
    step("engine only: 4 QPs on 2 shards/threads vs 1");
    let multicore = multicore::measure()?;
    step("WRITE 64 KiB, 4 QPs over AF_XDP: 2 I/O threads a side vs 1");
    let io_threads = io_threads::measure()?;
    step("WRITE 64 KiB under 0 / 0.1 / 1 % loss: go-back-N vs selective repeat");
    let loss = loss::measure(&ns)?;
    step("UCX over xroce (UCX_TLS=rc) vs UCX over TCP: tag_bw 1 MiB, tag_lat 8 B");
    let clients = clients::measure(MTU)?;
    step("TIMELY and Swift: queue delay at a real bottleneck against their targets");
    let cc_delay = cc_delay::measure()?;
    step("WRITE 64 KiB and SEND 8 B latency with a capture on both ends vs without");
    let capture = capture::measure(&ns)?;
    step("8-byte WRITE rate and latency: posts through the engine lock vs the post ring");
    let post_path = post_path::measure(&ns)?;
    step("CPU per byte: WRITE, READ, SEND, 4 QPs vs TCP; idle device");
    let cpu_per_byte = cpu_per_byte::measure(&ns)?;
    step("WRITE 64 KiB over AF_XDP and UDP GSO vs TCP at MTU 1500, 3500 and 9000");
    let mtu_sweep = mtu_sweep::measure()?;
    let send_p50 = lat.lat_us.p50;
    let report = Report {
        mtu: MTU,
        iperf3_tcp_gbps: tcp_gbps,
        sockperf_udp_half_rtt_p50_us: udp_p50,
        icrc,
        dropin_ib_write_bw_gbps: dropin_write_gbps,
        dropin_ib_send_lat_typical_us: dropin_lat_us,
        ratios: Ratios {
            dropin_write_vs_xroce_bench: dropin_write_gbps / w1.gbps,
            dropin_send_lat_vs_xroce_lat: dropin_lat_us / send_p50,
            write_1qp_vs_tcp: w1.gbps / tcp_gbps,
            write_4qp_vs_tcp: w4.gbps / tcp_gbps,
            send_lat_p50_vs_udp: send_p50 / udp_p50,
            shared_device_alone_vs_before: alone.gbps / before.gbps,
            write_1qp_vs_afxdp_ceiling: w1.gbps / blast.payload_gbps,
            cpu_per_gb_write_1qp_vs_tcp: cpu_w1.cpu_seconds_per_gb / cpu_tcp.cpu_seconds_per_gb,
        },
        afxdp_ceiling: blast,
        cpu_xroce_write_1qp: cpu_w1,
        cpu_tcp,
        latency_tail,
        many_qps,
        multicore,
        io_threads,
        loss,
        clients,
        cc_delay,
        capture,
        post_path,
        cpu_per_byte,
        mtu_sweep,
        udp_gso,
        before_shared_device_write_1qp: before,
        shared_device_alone_write_1qp: alone,
        xroce_write_1qp: w1,
        xroce_write_4qp: w4,
        xroce_send_lat: lat,
    };
    let (w1, w4) = (&report.xroce_write_1qp, &report.xroce_write_4qp);
    println!();
    println!("{:<40} {:>12}", "measure", "value");
    println!("{:<40} {:>10.3} Gb/s", "xroce WRITE 64KiB 1 QP", w1.gbps);
    println!("{:<40} {:>10.3} Gb/s", "xroce WRITE 64KiB 4 QPs", w4.gbps);
    println!("{:<40} {:>10.3} Gb/s", "iperf3 TCP (kernel, GSO)", tcp_gbps);
    println!(
        "{:<40} {:>10.3} Gb/s",
        "raw AF_XDP ceiling (payload)", report.afxdp_ceiling.payload_gbps
    );
    println!(
        "{:<40} {:>10.2} s/GB",
        "CPU, xroce WRITE 64KiB 1 QP", report.cpu_xroce_write_1qp.cpu_seconds_per_gb
    );
    println!(
        "{:<40} {:>10.2} s/GB",
        "CPU, iperf3 TCP", report.cpu_tcp.cpu_seconds_per_gb
    );
    println!(
        "{:<40} {:>10.3} Gb/s",
        "WRITE 64KiB alone, shared device", report.shared_device_alone_write_1qp.gbps
    );
    println!(
        "{:<40} {:>10.3} Gb/s",
        format!("WRITE 64KiB, xroce {}", baseline::BEFORE_SHARED_DEVICE),
        report.before_shared_device_write_1qp.gbps
    );
    println!(
        "{:<40} {:>10.3} Gb/s",
        "ib_write_bw 64KiB (drop-in libibverbs)", dropin_write_gbps
    );
    println!(
        "{:<40} {:>10.2} us",
        "ib_send_lat 8B typical (drop-in)", dropin_lat_us
    );
    println!("{:<40} {:>10.2} us", "xroce SEND 8B half-RTT p50", send_p50);
    println!(
        "{:<40} {:>10.2} us",
        "sockperf UDP 64B half-RTT p50", udp_p50
    );
    for m in &report.mtu_sweep.pairs {
        println!(
            "{:<40} {:>10.2} x TCP ({}; CPU/GB {:.2} x)",
            format!("best WRITE 64KiB, MTU {}", m.veth_mtu),
            m.best_gbps_vs_tcp,
            m.best_backend,
            m.best_cpu_per_gb_vs_tcp
        );
    }
    println!("ratios: {}", serde_json::to_string(&report.ratios)?);
    let dir = workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("report.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}

/// Runs an xroce server in namespace b and a client in a; the client's
/// report (`BenchReport` or `LatReport`).
fn xroce_pair<R: DeserializeOwned>(ns: &NsPair, tool: &str, args: &[&str]) -> Result<R> {
    xroce_pair_with(&xroce_bin(), ns, tool, args)
}

/// [`xroce_pair`] with the `xroce` executable `xroce`.
fn xroce_pair_with<R: DeserializeOwned>(
    xroce: &std::path::Path,
    ns: &NsPair,
    tool: &str,
    args: &[&str],
) -> Result<R> {
    let listen = format!("{}:18600", ns.addr_b);
    let server = Started::spawn(
        in_ns(&ns.b, xroce)
            .arg(tool)
            .arg(args[0])
            .args(["-d", &ns.if_b, "--listen", &listen])
            .stdout(Stdio::null()),
    )?;
    let out = output(in_ns(&ns.a, xroce).arg(tool).args(args).args([
        "-d",
        &ns.if_a,
        "--connect",
        &listen,
        "--json",
    ]))?;
    if !server.wait()?.success() {
        bail!("the xroce {tool} server failed");
    }
    eprintln!("{}", out.trim());
    serde_json::from_str(out.trim()).with_context(|| format!("xroce {tool}'s JSON report"))
}

/// Column `i` of a perftest result row.
fn column(row: &dropin::PerftestRow, i: usize, what: &str) -> Result<f64> {
    row.columns
        .get(i)
        .copied()
        .with_context(|| format!("{what} (column {i}) is missing from:\n{}", row.table))
}

/// What we read of `iperf3 -J`.
#[derive(Deserialize)]
struct Iperf3 {
    end: Iperf3End,
}
#[derive(Deserialize)]
struct Iperf3End {
    sum_received: Iperf3Sum,
}
#[derive(Deserialize)]
struct Iperf3Sum {
    bits_per_second: f64,
    bytes: u64,
}

/// iperf3's received rate (Gb/s) and bytes.
fn iperf3(ns: &NsPair) -> Result<(f64, u64)> {
    let addr = ns.addr_b.to_string();
    let _server = Started::spawn(
        in_ns(&ns.b, "iperf3")
            .args(["-s", "-1", "-B", &addr])
            .stdout(Stdio::null()),
    )?;
    thread::sleep(Duration::from_millis(500));
    let out = output(in_ns(&ns.a, "iperf3").args(["-c", &addr, "-t", SECONDS, "-J"]))?;
    let v: Iperf3 = serde_json::from_str(&out).context("iperf3 -J output")?;
    let sum = v.end.sum_received;
    Ok((sum.bits_per_second / 1e9, sum.bytes))
}

/// sockperf's p50 one-way latency (half the round trip), microseconds.
fn sockperf(ns: &NsPair) -> Result<f64> {
    let addr = ns.addr_b.to_string();
    let _server = Started::spawn(
        in_ns(&ns.b, "sockperf")
            .args(["server", "-i", &addr, "-p", "11111"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    thread::sleep(Duration::from_millis(500));
    let out = output(in_ns(&ns.a, "sockperf").args([
        "ping-pong",
        "-i",
        &addr,
        "-p",
        "11111",
        "-m",
        "64",
        "-t",
        SECONDS,
    ]))?;
    // "sockperf: ---> percentile 50.000 =    7.180"
    out.lines()
        .find(|l| l.contains("percentile 50.000"))
        .and_then(|l| l.rsplit('=').next())
        .and_then(|v| v.trim().parse().ok())
        .context("sockperf printed no 50th percentile")
}
