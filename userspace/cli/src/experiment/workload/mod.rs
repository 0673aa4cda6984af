//! `xroce experiment workload`: flows with sizes drawn from a measured
//! distribution (web search, Hadoop, or an HPCC-format CDF file) arrive as
//! a Poisson process at a target load of the bottleneck, from N senders to
//! one or more receivers, on the incast's topology (namespaces, a bridge,
//! the XDP congestion point at each receiver). Each flow is one RDMA WRITE
//! on an RC QP, its data checked at the receiver; its completion time runs
//! from its scheduled start to its completion at the sender.
//!
//! `xroce experiment compare --cc a,b,c`: the same workload (same seed, so
//! the same flows) under each controller, drawn on the same plots.
//!
//! Files in `--out` (compare: one folder per controller, plus
//! compare.json, compare.csv and the plots with one series per controller):
//! - schedule.csv: the flows as drawn (`flow,src,dst,size_bytes,start_ns`);
//! - flows.csv: one row per flow ([`results::FLOWS_CSV_HEADER`]): FCT,
//!   ideal FCT, slowdown, rate, how many times it arrived, verified;
//! - summary.json: settings, slowdown p50/p95/p99 per size bucket, the
//!   queue-length CDF, marks, CNPs, drops, retransmits, errors;
//! - queue.csv (receiver 0; queue-r<j>.csv for others): the sampler's rows;
//! - slowdown.svg, queue_cdf.svg; the processes' logs and raw CSVs.

mod plots;
mod results;

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use xroce::cc::CcKind;

use self::{cdf::Cdf, flows::Flow, results::Bucket};
use super::traffic::{cdf, flows, node};
use super::{
    cc_params::CcParams,
    procs::{self, Proc},
    sampler::{Sample, Sampler},
    topology::{self, Host, Topology},
};
use crate::units::{Fraction, Rate, Seconds, Size};

pub use node::{receiver, sender, NodeArgs};
pub use results::{ideal_fct_s, percentile, slowdown};

/// Flags of a workload, shared by `workload` and `compare`.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Sender hosts
    #[arg(long, default_value_t = 4)]
    pub senders: usize,
    /// Receiver hosts (each behind its own congestion point)
    #[arg(long, default_value_t = 1)]
    pub receivers: usize,
    /// Flow sizes: websearch (DCTCP paper), hadoop (Facebook, SIGCOMM'15)
    /// or a file of `size_bytes cdf_percent` lines (HPCC's traffic_gen format)
    #[arg(long, default_value = "websearch")]
    pub cdf: String,
    /// Offered load as a fraction of the receivers' link rate
    #[arg(long, default_value_t = 0.5)]
    pub load: f64,
    /// Seed of the flows (sizes, sources, destinations, start times) and their data
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of flows (default 200 unless --duration)
    #[arg(long, conflicts_with = "duration")]
    pub flows: Option<usize>,
    /// Instead of --flows: every arrival within this time, e.g. 2 or 500ms
    #[arg(long, value_parser = crate::units::seconds)]
    pub duration: Option<Seconds>,
    #[command(flatten)]
    pub cc_params: CcParams,
    /// The bottleneck: `xdp` (each receiver's XDP congestion point: marks
    /// and drops, packets never wait, so flows are not held to the link
    /// rate) or `delay` (the bridge's port toward each receiver holds
    /// packets at the link rate: FCTs and RTTs include the queue)
    #[arg(long, default_value = "xdp", value_parser = ["xdp", "delay"])]
    pub bottleneck: String,
    /// Drain rate of the bottleneck at each receiver
    #[arg(long, default_value = "1gbit", value_parser = crate::units::rate)]
    pub link_rate: Rate,
    /// Line rate the senders start from (default: the link rate)
    #[arg(long, value_parser = crate::units::rate)]
    pub line_rate: Option<Rate>,
    /// RED: no marking up to this queue length
    #[arg(long, default_value = "5KB", value_parser = crate::units::size)]
    pub kmin: Size,
    /// RED: marking probability reaches --pmax here
    #[arg(long, default_value = "200KB", value_parser = crate::units::size)]
    pub kmax: Size,
    #[arg(long, default_value = "0.01", value_parser = crate::units::fraction)]
    pub pmax: Fraction,
    /// red or step
    #[arg(long, default_value = "red", value_parser = ["red", "step"])]
    pub policy: String,
    /// Bottleneck buffer: frames beyond it are tail-dropped (default: unlimited)
    #[arg(long, value_parser = crate::units::size)]
    pub buffer: Option<Size>,
    /// QPs per sender-receiver pair (one flow per QP at a time)
    #[arg(long, default_value_t = 16)]
    pub qps: usize,
    /// How a flow's data moves: `write` (the sender WRITEs it, then SENDs
    /// its descriptor) or `read` (the sender SENDs the descriptor and the
    /// receiver READs the data; READ responses are paced by the sender's
    /// congestion control, but are not ACKed, so RTT-driven TIMELY and
    /// Swift get no samples from them: DCQCN and none only)
    #[arg(long, default_value = "write", value_parser = ["write", "read"])]
    pub op: String,
    /// Bytes of flows in flight per sender-receiver pair (raised to the largest flow)
    #[arg(long, default_value = "64MiB", value_parser = crate::units::size)]
    pub arena: Size,
    /// Queue sampling interval in ms
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub bin_ms: u32,
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// TCP port of the receivers' exchange
    #[arg(long, default_value_t = 18515)]
    pub port: u16,
    /// Output folder
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(clap::Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// Congestion control of every sender
    #[arg(long, default_value = "dcqcn", value_parser = crate::units::cc())]
    pub cc: CcKind,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug, Clone)]
pub struct CompareArgs {
    /// Controllers to compare, e.g. dcqcn,timely,none
    #[arg(long, value_delimiter = ',', required = true, value_parser = crate::units::cc())]
    pub cc: Vec<CcKind>,
    #[command(flatten)]
    pub common: Common,
}

/// summary.json of one run.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Summary {
    /// "workload".
    pub experiment: String,
    pub settings: Settings,
    pub flows: usize,
    pub completed: usize,
    pub verified: usize,
    /// Bytes offered over the schedule's span, over the receivers' capacity.
    pub offered_load: f64,
    /// All flows' bytes over the time from the first start to the last
    /// completion, Gbit/s.
    pub goodput_gbps: f64,
    /// Per sender, per receiver: the smallest round trip of a 64-byte WRITE.
    pub base_rtt_us: Vec<Vec<f64>>,
    /// Slowdown percentiles per flow-size bucket, then "all".
    pub slowdown: Vec<Bucket>,
    pub queue: Queue,
    pub marks: u64,
    pub cnps: u64,
    pub drops: Drops,
    pub retransmits: u64,
    /// Times a sender's QP waited for room in its engine's device-wide
    /// in-flight budget before starting a message.
    pub budget_waits: u64,
    pub errors: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Settings {
    pub senders: usize,
    pub receivers: usize,
    pub cdf: String,
    pub cdf_mean_bytes: f64,
    pub cdf_max_bytes: u64,
    pub load: f64,
    pub seed: u64,
    pub cc: String,
    /// --dcqcn, --swift and --timely as given (each used by its --cc only).
    #[serde(flatten)]
    pub cc_params: CcParams,
    /// "write" or "read".
    pub op: String,
    pub link_rate: String,
    pub link_rate_bps: u64,
    pub line_rate: String,
    pub kmin_bytes: u64,
    pub kmax_bytes: u64,
    pub pmax: f64,
    pub policy: String,
    pub buffer_bytes: Option<u64>,
    /// "xdp" or "delay".
    pub bottleneck: String,
    pub qps_per_pair: usize,
    pub arena_bytes: u64,
    pub mtu: u32,
    pub bin_ms: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Queue {
    /// Samples (all receivers) from the start until the last flow ended.
    pub samples: usize,
    pub p50_bytes: u64,
    pub p99_bytes: u64,
    /// The XDP program's own peak over the run (largest of the receivers).
    pub peak_bytes: u64,
    /// (queue bytes, fraction of samples at or below), at every percent.
    pub cdf: Vec<(u64, f64)>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct Drops {
    pub tail: u64,
    pub congestion: u64,
    pub fault: u64,
}

pub fn workload(a: &WorkloadArgs) -> anyhow::Result<()> {
    let c = &a.common;
    let (cdf, schedule) = prepare(c)?;
    std::fs::create_dir_all(&c.out).with_context(|| format!("create {}", c.out.display()))?;
    procs::install_signal_handlers();
    let s = run_one(c, a.cc, &cdf, &schedule, &c.out)?;
    let series = [plots::Series {
        name: a.cc.name().to_string(),
        buckets: &s.slowdown,
        queue_cdf: &s.queue.cdf,
    }];
    draw(c, &c.out, &cdf, &series);
    print_brief(&s);
    if !s.errors.is_empty() {
        bail!(
            "the workload had errors (outputs in {}): {}",
            c.out.display(),
            s.errors.join("; ")
        );
    }
    Ok(())
}

pub fn compare(a: &CompareArgs) -> anyhow::Result<()> {
    let c = &a.common;
    let mut ccs = a.cc.clone();
    ccs.dedup();
    let (cdf, schedule) = prepare(c)?;
    std::fs::create_dir_all(&c.out).with_context(|| format!("create {}", c.out.display()))?;
    procs::install_signal_handlers();
    let mut runs = Vec::new();
    for &cc in &ccs {
        let dir = c.out.join(cc.name());
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let s = run_one(c, cc, &cdf, &schedule, &dir)?;
        draw(
            c,
            &dir,
            &cdf,
            &[plots::Series {
                name: cc.name().to_string(),
                buckets: &s.slowdown,
                queue_cdf: &s.queue.cdf,
            }],
        );
        print_brief(&s);
        runs.push(s);
        if procs::stop_requested() {
            break;
        }
    }
    let series: Vec<plots::Series<'_>> = runs
        .iter()
        .map(|s| plots::Series {
            name: s.settings.cc.clone(),
            buckets: &s.slowdown,
            queue_cdf: &s.queue.cdf,
        })
        .collect();
    draw(c, &c.out, &cdf, &series);
    write_compare(&c.out, &runs)?;
    let errors: Vec<String> = runs
        .iter()
        .flat_map(|s| {
            s.errors
                .iter()
                .map(move |e| format!("{}: {e}", s.settings.cc))
        })
        .collect();
    if !errors.is_empty() {
        bail!(
            "the comparison had errors (outputs in {}): {}",
            c.out.display(),
            errors.join("; ")
        );
    }
    Ok(())
}

/// compare.json (every run's summary) and compare.csv (one row per
/// controller and bucket).
#[derive(Serialize, Deserialize, Debug)]
pub struct Comparison {
    pub experiment: String,
    pub controllers: Vec<String>,
    pub runs: Vec<Summary>,
}

fn write_compare(dir: &Path, runs: &[Summary]) -> anyhow::Result<()> {
    let cmp = Comparison {
        experiment: "compare".into(),
        controllers: runs.iter().map(|s| s.settings.cc.clone()).collect(),
        runs: runs.to_vec(),
    };
    std::fs::write(
        dir.join("compare.json"),
        serde_json::to_string_pretty(&cmp)? + "\n",
    )
    .context("write compare.json")?;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(dir.join("compare.csv")).context("create compare.csv")?,
    );
    writeln!(
        out,
        "cc,bucket,flows,p50,p95,p99,mean_fct_us,queue_p50_bytes,queue_p99_bytes"
    )?;
    let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.4}"));
    for s in runs {
        for b in &s.slowdown {
            writeln!(
                out,
                "{},{},{},{},{},{},{},{},{}",
                s.settings.cc,
                b.bucket,
                b.flows,
                o(b.p50),
                o(b.p95),
                o(b.p99),
                o(b.mean_fct_us),
                s.queue.p50_bytes,
                s.queue.p99_bytes
            )?;
        }
    }
    out.flush().context("write compare.csv")
}

fn draw(c: &Common, dir: &Path, cdf: &Cdf, series: &[plots::Series<'_>]) {
    let what = format!(
        "{} at load {}, {} -> {}, {}",
        cdf.name, c.load, c.senders, c.receivers, c.link_rate
    );
    if let Err(e) = plots::slowdown(
        &dir.join("slowdown.svg"),
        &format!("FCT slowdown by flow size ({what})"),
        series,
    ) {
        eprintln!("xroce: slowdown.svg not drawn: {e:#}");
    }
    if let Err(e) = plots::queue_cdf(
        &dir.join("queue_cdf.svg"),
        &format!("Bottleneck queue ({what})"),
        series,
    ) {
        eprintln!("xroce: queue_cdf.svg not drawn: {e:#}");
    }
}

fn print_brief(s: &Summary) {
    let all = s.slowdown.last();
    eprintln!(
        "xroce: {}: {}/{} flows completed, {} verified; slowdown p50 {} p99 {}; queue p99 {} B; goodput {:.3} Gbit/s",
        s.settings.cc,
        s.completed,
        s.flows,
        s.verified,
        all.and_then(|b| b.p50).map_or("-".into(), |v| format!("{v:.2}")),
        all.and_then(|b| b.p99).map_or("-".into(), |v| format!("{v:.2}")),
        s.queue.p99_bytes,
        s.goodput_gbps
    );
}

/// Checks the flags and draws the flows.
fn prepare(c: &Common) -> anyhow::Result<(Cdf, Vec<Flow>)> {
    if c.senders == 0 || c.receivers == 0 || c.senders + c.receivers > topology::MAX_SENDERS + 1 {
        bail!(
            "--senders and --receivers must be at least 1 and together at most {}",
            topology::MAX_SENDERS + 1
        );
    }
    if !(c.load > 0.0 && c.load <= 1.0) {
        bail!("--load must be in (0, 1], not {}", c.load);
    }
    if c.qps == 0 || c.qps > 1024 {
        bail!("--qps must be 1..=1024");
    }
    let cdf = Cdf::load(&c.cdf)?;
    let length = match (&c.flows, &c.duration) {
        (Some(n), _) => flows::Length::Flows(*n),
        (None, Some(d)) => flows::Length::Seconds(d.value),
        (None, None) => flows::Length::Flows(200),
    };
    let schedule = flows::Spec {
        cdf: &cdf,
        senders: c.senders,
        receivers: c.receivers,
        load: c.load,
        link_rate_bps: c.link_rate.value,
        seed: c.seed,
        length,
    }
    .generate()?;
    let line_rate = c.line_rate.as_ref().unwrap_or(&c.link_rate);
    c.cc_params.check(line_rate.value)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("an experiment makes network namespaces and attaches XDP: run it as root (sudo)");
    }
    for tool in ["ip", "nsenter"] {
        if std::process::Command::new(tool).arg("-V").output().is_err() {
            bail!("`{tool}` is missing; install iproute2 and util-linux (`cargo xtask setup`)");
        }
    }
    Ok((cdf, schedule))
}

fn settings(c: &Common, cc: CcKind, cdf: &Cdf) -> Settings {
    Settings {
        senders: c.senders,
        receivers: c.receivers,
        cdf: cdf.name.clone(),
        cdf_mean_bytes: cdf.mean(),
        cdf_max_bytes: cdf.max(),
        load: c.load,
        seed: c.seed,
        cc: cc.name().into(),
        cc_params: c.cc_params.clone(),
        op: c.op.clone(),
        link_rate: c.link_rate.text().into(),
        link_rate_bps: c.link_rate.value,
        line_rate: c.line_rate.as_ref().unwrap_or(&c.link_rate).text().into(),
        kmin_bytes: c.kmin.value,
        kmax_bytes: c.kmax.value,
        pmax: xroce_common::fixed::fixed_to_fraction(c.pmax.value),
        policy: c.policy.clone(),
        buffer_bytes: c.buffer.as_ref().map(|b| b.value),
        bottleneck: c.bottleneck.clone(),
        qps_per_pair: c.qps,
        arena_bytes: c.arena.value,
        mtu: c.mtu,
        bin_ms: c.bin_ms,
    }
}

/// `xroce attach --iface IF --mode native` inside the host's namespace.
fn attach(exe: &Path, host: &Host) -> anyhow::Result<()> {
    let out = host
        .command(exe)
        .args(["attach", "--iface", &host.iface, "--mode", "native"])
        .output()
        .context("run xroce attach")?;
    if !out.status.success() {
        bail!(
            "attach XDP natively to {}: {}",
            host.iface,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// One run of the schedule under `cc` into `dir`: topology, processes,
/// sampling, then the results.
fn run_one(
    c: &Common,
    cc: CcKind,
    cdf: &Cdf,
    schedule: &[Flow],
    dir: &Path,
) -> anyhow::Result<Summary> {
    topology::sweep_stale();
    let exe = match std::env::var_os("XROCE_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => std::env::current_exe().context("find the xroce binary (current_exe)")?,
    };
    // Files of an earlier run in the same folder would be read as ours.
    for i in 0..c.senders.max(c.receivers) {
        for p in [
            node::sender_csv(dir, i),
            node::sender_json(dir, i),
            node::receiver_csv(dir, i),
            node::ready_file(dir, i),
        ] {
            let _ = std::fs::remove_file(p);
        }
    }
    let _ = std::fs::remove_file(node::start_file(dir));
    let schedule_path = dir.join("schedule.csv");
    flows::write_schedule(&schedule_path, schedule)?;
    eprintln!(
        "xroce: workload of {} flows ({}, load {}) from {} senders to {} receivers, cc {}; output in {}",
        schedule.len(),
        cdf.name,
        c.load,
        c.senders,
        c.receivers,
        cc,
        dir.display()
    );
    let topo =
        Topology::build(c.senders + c.receivers - 1, c.mtu).context("build the namespaces")?;
    let senders: Vec<Host> = topo.senders()[..c.senders].to_vec();
    let receivers: Vec<Host> = std::iter::once(topo.receiver().clone())
        .chain(topo.senders()[c.senders..].iter().cloned())
        .collect();
    let result = Run {
        bridge_netns: &topo.bridge_netns,
        c,
        cc,
        cdf,
        schedule,
        dir,
        exe: &exe,
        schedule_path: &schedule_path,
        senders: &senders,
        receivers: &receivers,
    }
    .run();
    drop(topo);
    result
}

/// One run on a topology that is up: what its steps share.
struct Run<'a> {
    bridge_netns: &'a str,
    c: &'a Common,
    cc: CcKind,
    cdf: &'a Cdf,
    schedule: &'a [Flow],
    dir: &'a Path,
    exe: &'a Path,
    schedule_path: &'a Path,
    senders: &'a [Host],
    receivers: &'a [Host],
}

/// A node process and its log.
type Node = (Proc, PathBuf);

impl Run<'_> {
    /// XDP and the bottlenecks, the receivers, the samplers, the senders;
    /// then the flows run to the end, and the results are written.
    fn run(&self) -> anyhow::Result<Summary> {
        for host in self.receivers.iter().chain(self.senders) {
            attach(self.exe, host)?;
        }
        // Dropped (tbf and the TC program removed) when this returns, before
        // the namespaces go.
        let bottlenecks = self.program_bottlenecks()?;
        let (mut rx_procs, listen) = self.start_receivers()?;
        self.wait_listening(&mut rx_procs)?;
        let mut samplers = self.start_samplers(&bottlenecks)?;
        let mut tx_procs = self.start_senders(&listen)?;
        self.wait_ready(&mut tx_procs, &mut rx_procs)?;
        let t0 = self.start_flows()?;
        let mut errors = Vec::new();
        let (samples, active_ms) =
            self.sample_until_done(t0, &mut samplers, &mut tx_procs, &mut errors)?;
        let finals = stop_nodes(
            &mut tx_procs,
            &mut rx_procs,
            &mut samplers,
            active_ms,
            &mut errors,
        )?;

        let got = results::collect(
            self.dir,
            self.schedule,
            self.senders.len(),
            self.receivers.len(),
            self.c.link_rate.value,
        )?;
        errors.extend(got.errors.iter().cloned());
        results::write_flows_csv(&self.dir.join("flows.csv"), &got.records)?;
        let summary = self.summary(&got, &samples, &finals, active_ms, errors);
        std::fs::write(
            self.dir.join("summary.json"),
            serde_json::to_string_pretty(&summary)? + "\n",
        )
        .context("write summary.json")?;
        Ok(summary)
    }

    /// Each receiver's congestion point; with `--bottleneck delay`, a
    /// delay bottleneck on the bridge's port toward it (returned).
    fn program_bottlenecks(&self) -> anyhow::Result<Vec<xroce::bottleneck::Bottleneck>> {
        let c = self.c;
        let delay = c.bottleneck == "delay";
        let mut bottlenecks = Vec::new();
        for rx in self.receivers {
            let (args, iface) = (ecn_args(c, &rx.iface), rx.iface.clone());
            let ecn = super::in_netns(&rx.netns, move || -> anyhow::Result<_> {
                crate::congestion::ecn(&args)?;
                xroce::xdp::set_fault(&iface, xroce_common::fault::FaultConfig::default())?;
                let ecn = xroce::xdp::ecn_config(&iface)?;
                if delay {
                    // The same settings move to the bridge's port.
                    xroce::xdp::set_ecn(&iface, Default::default())?;
                }
                Ok(ecn)
            })??;
            if delay {
                let port = rx.peer.clone();
                bottlenecks.push(
                    super::in_netns(self.bridge_netns, move || {
                        xroce::bottleneck::Bottleneck::attach(&port, ecn)
                    })?
                    .context("put the delay bottleneck on the bridge's port")?,
                );
            }
        }
        Ok(bottlenecks)
    }

    /// The flags every node process takes.
    fn node_args(&self, cmd: &mut std::process::Command, host: &Host, index: usize) {
        let c = self.c;
        let line_rate = c.line_rate.as_ref().unwrap_or(&c.link_rate);
        cmd.args(["--iface", &host.iface, "--index", &index.to_string()])
            .arg("--schedule")
            .arg(self.schedule_path)
            .arg("--out")
            .arg(self.dir)
            .args(["--seed", &c.seed.to_string(), "--cc", self.cc.name()])
            .args(["--op", &c.op])
            .args(["--rate-bps", &line_rate.value.to_string()]);
    }

    /// Starts the receivers; also returns the address each listens on.
    fn start_receivers(&self) -> anyhow::Result<(Vec<Node>, Vec<String>)> {
        let mut rx_procs = Vec::new();
        let mut listen = Vec::new();
        for (j, rx) in self.receivers.iter().enumerate() {
            let addr = format!("{}:{}", rx.addr, self.c.port);
            let mut cmd = rx.command(self.exe);
            cmd.args(["experiment", "workload-receiver", "--listen", &addr])
                .args(["--peers", &self.senders.len().to_string()]);
            self.node_args(&mut cmd, rx, j);
            let log = self.dir.join(format!("receiver{j}.log"));
            rx_procs.push((Proc::spawn(&format!("receiver {j}"), cmd, &log)?, log));
            listen.push(addr);
        }
        Ok((rx_procs, listen))
    }

    /// Waits up to 20 s until every receiver listens.
    fn wait_listening(&self, rx_procs: &mut [Node]) -> anyhow::Result<()> {
        let ready_by = Instant::now() + Duration::from_secs(20);
        for (p, log) in rx_procs {
            while !procs::listening(p.pid(), self.c.port) {
                if let Some(status) = p.poll() {
                    bail!(
                        "a receiver exited ({status}) before listening: {}",
                        tail(log)
                    );
                }
                if procs::stop_requested() {
                    bail!("interrupted");
                }
                if Instant::now() > ready_by {
                    bail!("a receiver did not listen within 20 s: {}", tail(log));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// A queue sampler per receiver (queue.csv, queue-r<j>.csv).
    fn start_samplers(
        &self,
        bottlenecks: &[xroce::bottleneck::Bottleneck],
    ) -> anyhow::Result<Vec<Sampler>> {
        let dir = self.dir;
        let sender_ifaces: Vec<(String, String)> = self
            .senders
            .iter()
            .map(|h| (h.netns.clone(), h.iface.clone()))
            .collect();
        self.receivers
            .iter()
            .enumerate()
            .map(|(j, rx)| {
                let csv = if j == 0 {
                    dir.join("queue.csv")
                } else {
                    dir.join(format!("queue-r{j}.csv"))
                };
                // CNPs at the senders are counted once, with receiver 0.
                let theirs: &[(String, String)] = if j == 0 { &sender_ifaces } else { &[] };
                let rx_iface = (rx.netns.clone(), rx.iface.clone());
                match bottlenecks.get(j) {
                    Some(b) => Sampler::with_bottleneck(
                        &rx_iface,
                        theirs,
                        self.c.link_rate.value,
                        Some(b.reader()?),
                        &csv,
                    ),
                    None => Sampler::new(&rx_iface, theirs, self.c.link_rate.value, &csv),
                }
            })
            .collect::<anyhow::Result<Vec<_>>>()
    }

    /// Starts the senders, each connecting to every receiver in `listen`.
    fn start_senders(&self, listen: &[String]) -> anyhow::Result<Vec<Node>> {
        let c = self.c;
        let mut tx_procs = Vec::new();
        for (i, host) in self.senders.iter().enumerate() {
            let mut cmd = host.command(self.exe);
            cmd.args([
                "experiment",
                "workload-sender",
                "--receivers",
                &listen.join(","),
            ])
            .args([
                "--qps",
                &c.qps.to_string(),
                "--arena",
                &c.arena.value.to_string(),
            ]);
            c.cc_params.apply(&mut cmd);
            self.node_args(&mut cmd, host, i);
            let log = self.dir.join(format!("sender{i}.log"));
            tx_procs.push((Proc::spawn(&format!("sender {i}"), cmd, &log)?, log));
        }
        Ok(tx_procs)
    }

    /// Waits up to 60 s until every sender connected and measured its base
    /// RTTs (its ready file), so that all start together.
    fn wait_ready(&self, tx_procs: &mut [Node], rx_procs: &mut [Node]) -> anyhow::Result<()> {
        let senders = self.senders.len();
        let ready_by = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = (0..senders)
                .filter(|&i| node::ready_file(self.dir, i).exists())
                .count();
            if ready == senders {
                return Ok(());
            }
            for (p, log) in tx_procs.iter_mut().chain(rx_procs.iter_mut()) {
                if let Some(status) = p.poll() {
                    bail!(
                        "a process exited ({status}) while setting up: {}",
                        tail(log)
                    );
                }
            }
            if procs::stop_requested() {
                bail!("interrupted");
            }
            if Instant::now() > ready_by {
                bail!("only {ready} of {senders} senders were ready within 60 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Tells the nodes when the schedule starts (the start file, 20 ms
    /// ahead on the monotonic clock); returns that instant.
    fn start_flows(&self) -> anyhow::Result<Instant> {
        let t0_ns = super::sampler::monotonic_ns() + 20_000_000;
        let tmp = self.dir.join("start.tmp");
        std::fs::write(&tmp, t0_ns.to_string())?;
        std::fs::rename(&tmp, node::start_file(self.dir))?;
        Ok(Instant::now() + Duration::from_millis(20))
    }

    /// Samples every bin, with a progress bar, until the senders exit, a
    /// signal, or the time budget (then the senders still running count as
    /// an error); returns the samples and the active time in ms.
    fn sample_until_done(
        &self,
        t0: Instant,
        samplers: &mut [Sampler],
        tx_procs: &mut [Node],
        errors: &mut Vec<String>,
    ) -> anyhow::Result<(Vec<Sample>, f64)> {
        let (c, schedule) = (self.c, self.schedule);
        let total = schedule.len();
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {pos}/{len} flows  {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(self.cc.name());
        // Generous: the schedule, four times its bytes at the link rate, 30 s.
        let bytes = schedule_bytes(schedule);
        let span_s = schedule_span_s(schedule);
        let budget_s = span_s
            + 4.0 * bytes as f64 * 8.0 / (c.link_rate.value as f64 * c.receivers as f64)
            + 30.0;
        let deadline = t0 + Duration::from_secs_f64(budget_s);
        let bin = Duration::from_millis(c.bin_ms as u64);
        let mut samples: Vec<Sample> = Vec::new();
        let mut next = Instant::now();
        loop {
            next += bin;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
            let t_ms = Instant::now().saturating_duration_since(t0).as_secs_f64() * 1e3;
            let mut queue = 0;
            for s in samplers.iter_mut() {
                let x = s.sample(t_ms)?;
                queue += x.queue_bytes;
                samples.push(x);
            }
            let done = results::count_done(self.dir, self.senders.len());
            bar.set_position(done as u64);
            bar.set_message(format!("queue {:>7.1} KB", queue as f64 / 1e3));
            let running = tx_procs
                .iter_mut()
                .map(|(p, _)| p.poll())
                .filter(Option::is_none)
                .count();
            if running == 0 {
                break;
            }
            if procs::stop_requested() {
                errors.push("interrupted (signal)".to_string());
                break;
            }
            if Instant::now() > deadline {
                errors.push(format!(
                    "{running} sender(s) still running after {budget_s:.0} s: killed"
                ));
                break;
            }
        }
        let active_ms = Instant::now().saturating_duration_since(t0).as_secs_f64() * 1e3;
        bar.finish_and_clear();
        Ok((samples, active_ms))
    }

    /// summary.json's contents.
    fn summary(
        &self,
        got: &results::Collected,
        samples: &[Sample],
        finals: &[Sample],
        active_ms: f64,
        errors: Vec<String>,
    ) -> Summary {
        let c = self.c;
        let bytes = schedule_bytes(self.schedule);
        let span_s = schedule_span_s(self.schedule);
        let completed = got.records.iter().filter(|r| r.fct_us.is_some()).count();
        let last_done_s = got
            .records
            .iter()
            .filter_map(|r| r.fct_us.map(|f| r.start_ms / 1e3 + f / 1e6))
            .fold(0.0f64, f64::max);
        let done_bytes: u64 = got
            .records
            .iter()
            .filter(|r| r.fct_us.is_some())
            .map(|r| r.size_bytes)
            .sum();
        Summary {
            experiment: "workload".into(),
            settings: settings(c, self.cc, self.cdf),
            flows: self.schedule.len(),
            completed,
            verified: got.records.iter().filter(|r| r.verified).count(),
            offered_load: if span_s > 0.0 {
                bytes as f64 * 8.0 / span_s / (c.link_rate.value as f64 * c.receivers as f64)
            } else {
                0.0
            },
            goodput_gbps: if last_done_s > 0.0 {
                done_bytes as f64 * 8.0 / last_done_s / 1e9
            } else {
                0.0
            },
            base_rtt_us: got
                .senders
                .iter()
                .map(|r| {
                    r.as_ref()
                        .map(|r| r.base_rtt_ns.iter().map(|&n| n as f64 / 1e3).collect())
                        .unwrap_or_default()
                })
                .collect(),
            slowdown: results::buckets(&got.records),
            queue: queue_summary(samples, finals, active_ms),
            marks: finals.iter().map(|s| s.marks).sum(),
            cnps: got.senders.iter().flatten().map(|r| r.cnps).sum(),
            drops: Drops {
                tail: finals.iter().map(|s| s.drop_tail).sum(),
                congestion: finals.iter().map(|s| s.drop_congestion).sum(),
                fault: finals.iter().map(|s| s.drop_fault).sum(),
            },
            retransmits: got.senders.iter().flatten().map(|r| r.retransmits).sum(),
            budget_waits: got.senders.iter().flatten().map(|r| r.budget_waits).sum(),
            errors,
        }
    }
}

/// Ends the run: kills the senders, gives each receiver 15 s to exit,
/// takes each sampler's last sample and closes it, and adds to `errors`
/// every node that did not exit cleanly. Returns the last samples.
fn stop_nodes(
    tx_procs: &mut [Node],
    rx_procs: &mut [Node],
    samplers: &mut [Sampler],
    active_ms: f64,
    errors: &mut Vec<String>,
) -> anyhow::Result<Vec<Sample>> {
    for (p, _) in tx_procs.iter_mut() {
        p.kill();
    }
    for (p, log) in rx_procs.iter_mut() {
        if p.wait_for(Duration::from_secs(15)).is_none() {
            errors.push(format!("a receiver did not exit: killed ({})", tail(log)));
        }
        p.kill();
    }
    let mut finals = Vec::new();
    for s in samplers.iter_mut() {
        finals.push(s.sample(active_ms)?);
        s.finish()?;
    }
    for (i, (p, log)) in tx_procs.iter_mut().enumerate() {
        if !p.poll().is_some_and(|s| s.success()) {
            errors.push(format!("sender {i}: {}", tail(log)));
        }
    }
    for (j, (p, log)) in rx_procs.iter_mut().enumerate() {
        if !p.poll().is_some_and(|s| s.success()) {
            errors.push(format!("receiver {j}: {}", tail(log)));
        }
    }
    Ok(finals)
}

/// The queue over the active time (every receiver's samples) and the
/// largest peak the XDP programs saw.
fn queue_summary(samples: &[Sample], finals: &[Sample], active_ms: f64) -> Queue {
    let queue_samples: Vec<u64> = samples
        .iter()
        .filter(|s| s.t_ms >= 0.0 && s.t_ms <= active_ms)
        .map(|s| s.queue_bytes)
        .collect();
    let mut sorted = queue_samples.clone();
    sorted.sort_unstable();
    let pick = |p: f64| {
        results::percentile(&sorted.iter().map(|&b| b as f64).collect::<Vec<_>>(), p).unwrap_or(0.0)
            as u64
    };
    Queue {
        samples: queue_samples.len(),
        p50_bytes: pick(0.5),
        p99_bytes: pick(0.99),
        peak_bytes: finals.iter().map(|s| s.peak_bytes).max().unwrap_or(0),
        cdf: results::queue_cdf(&queue_samples),
    }
}

/// The bytes of every flow of the schedule.
fn schedule_bytes(schedule: &[Flow]) -> u64 {
    schedule.iter().map(|f| f.size).sum()
}

/// The schedule's span: the last flow's start, in seconds.
fn schedule_span_s(schedule: &[Flow]) -> f64 {
    schedule.last().map_or(0.0, |f| f.start_ns as f64 / 1e9)
}

fn ecn_args(c: &Common, iface: &str) -> crate::congestion::EcnArgs {
    crate::congestion::EcnArgs {
        iface: iface.to_string(),
        off: false,
        link_rate: Some(c.link_rate.clone()),
        kmin: Some(c.kmin.clone()),
        kmax: Some(c.kmax.clone()),
        pmax: c.pmax.clone(),
        policy: c.policy.clone(),
        buffer: c.buffer.clone(),
    }
}
