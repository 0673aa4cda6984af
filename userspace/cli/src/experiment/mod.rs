//! `xroce experiment incast`: a reproducible congestion experiment on one
//! machine. N senders and one receiver, each in a network namespace of its
//! own, meet at a Linux bridge in another; the receiver's interface runs the
//! XDP congestion point (a virtual bottleneck at `--link-rate` with ECN
//! marking, see `xroce ecn`) and optionally loss injection. Every flow is an
//! RDMA WRITE stream from `xroce bench write` with the chosen congestion
//! control; the receiver is one `xroce bench write --listen` process
//! serving all of them.
//!
//! While it runs, the virtual queue and XDP counters are sampled every bin
//! into DIR/queue.csv; at the end the senders' per-bin traces become
//! DIR/flows.csv, and DIR/summary.json and SVG plots are written.
//! Namespaces, XDP pins and processes are removed on every exit path
//! (errors, panics, Ctrl-C).
//!
//! Files in `--out`:
//! - queue.csv: `t_ms,queue_bytes,peak_bytes,arrived_bytes,marks,cnps_seen,
//!   drop_tail,drop_congestion,drop_fault,roce_frames`, one row per bin;
//!   counts are cumulative from the start; `cnps_seen` is the CNP frames the
//!   senders' own XDP programs counted.
//! - flows.csv: `t_ms,flow,gbps,cc_rate_gbps`, one row per flow and bin
//!   (the end of the bin on the experiment's clock).
//! - summary.json: settings, aggregate goodput, Jain's index (whole run and
//!   100 ms windows), queue figures (whole run and after a 500 ms warm-up),
//!   marks, CNPs, drops by reason, retransmits, each flow's bench JSON.
//!   A flow whose QP ran out of retries (tail drops can starve a go-back-N
//!   flow without congestion control) has its `qp_error`: its run ended
//!   there, a result of the experiment rather than a failure of it.
//! - flows.svg, rates.svg, queue.svg; trace<i>.csv (each sender's
//!   `--trace`), receiver.log and sender<i>.log (their stderr).
//!
//! The virtual queue marks and drops but delays nothing (XDP cannot hold a
//! frame), so RTT-driven TIMELY sees only host delays, not the bottleneck.
//! `--bottleneck delay` puts a queue that really holds packets on the
//! bridge's port toward the receiver instead (xroce::bottleneck: tbf at
//! the link rate, a TC program marking on its clock), so RTT
//! grows with the queue; queue.csv's `queue_delay_us` and `sojourn_us` then
//! are waits packets really had.

mod cc_params;
mod collective;
mod plot;
mod procs;
mod report;
mod rng;
mod sampler;
mod summary;
mod topology;
mod traffic;
mod workload;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use xroce::bottleneck::Bottleneck;
use xroce::cc::CcKind;
use xroce_common::{congestion::EcnConfig, fault::FaultConfig};

use crate::units::{Fraction, Rate, Seconds, Size};
use cc_params::CcParams;

use self::{
    procs::Proc,
    report::{FlowResult, Report},
    sampler::{Sample, Sampler},
    topology::Topology,
};

#[derive(clap::Args, Debug)]
pub struct ExperimentArgs {
    #[command(subcommand)]
    pub kind: ExperimentKind,
}

#[derive(clap::Subcommand, Debug)]
pub enum ExperimentKind {
    /// N senders WRITE to one receiver through a virtual bottleneck
    // Boxed: the flags make the variants large (clippy's large_enum_variant
    // on the CLI's command enum).
    Incast(Box<IncastArgs>),
    /// Flows sized from a measured distribution at a Poisson load; FCT slowdown
    Workload(Box<workload::WorkloadArgs>),
    /// The same workload (same seed) under each of several controllers
    Compare(Box<workload::CompareArgs>),
    /// Collectives (Open MPI or Gloo) in a training-step model: job
    /// completion time over xroce and TCP, under loss; `--compare` variants
    Collective(Box<collective::CollectiveArgs>),
    #[command(hide = true)]
    WorkloadSender(workload::NodeArgs),
    #[command(hide = true)]
    WorkloadReceiver(workload::NodeArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct IncastArgs {
    /// Number of sender hosts (one flow each)
    #[arg(long, default_value_t = 4)]
    pub senders: usize,
    /// Congestion control of every sender (timely and swift react to RTT,
    /// which only `--bottleneck delay` lengthens: behind the XDP congestion
    /// point they see host delays only)
    #[arg(long, default_value = "dcqcn", value_parser = crate::units::cc())]
    pub cc: CcKind,
    #[command(flatten)]
    pub cc_params: CcParams,
    /// The bottleneck: `xdp` (the receiver's XDP congestion point: marks
    /// and drops, packets never wait) or `delay` (the bridge's port toward
    /// the receiver holds packets at the link rate: RTT grows with the
    /// queue; an unlimited --buffer means 64 MiB there)
    #[arg(long, default_value = "xdp", value_parser = ["xdp", "delay"])]
    pub bottleneck: String,
    /// Drain rate of the virtual bottleneck at the receiver, e.g. 1gbit
    #[arg(long, default_value = "1gbit", value_parser = crate::units::rate)]
    pub link_rate: Rate,
    /// Line rate each sender's pacer and congestion control start from
    /// (default: the link rate, so every sender alone could fill the link)
    #[arg(long, value_parser = crate::units::rate)]
    pub line_rate: Option<Rate>,
    /// How long each sender sends: seconds ("5") or with a unit ("500ms")
    #[arg(long, default_value = "5", value_parser = crate::units::seconds)]
    pub duration: Seconds,
    /// Folder for flows.csv, queue.csv, summary.json, the plots and logs
    #[arg(long)]
    pub out: PathBuf,
    /// RED: no marking up to this queue length (step: the threshold K)
    #[arg(long, default_value = "5KB", value_parser = crate::units::size)]
    pub kmin: Size,
    /// RED: marking probability reaches --pmax here
    #[arg(long, default_value = "200KB", value_parser = crate::units::size)]
    pub kmax: Size,
    /// RED: marking probability at kmax
    #[arg(long, default_value = "0.01", value_parser = crate::units::fraction)]
    pub pmax: Fraction,
    /// red (DCQCN switch) or step (DCTCP)
    #[arg(long, default_value = "red", value_parser = ["red", "step"])]
    pub policy: String,
    /// Virtual buffer: frames beyond it are tail-dropped (default: unlimited)
    #[arg(long, value_parser = crate::units::size)]
    pub buffer: Option<Size>,
    /// Loss injection: fraction of RoCEv2 frames to drop at the receiver
    #[arg(long, value_parser = crate::units::fraction)]
    pub drop: Option<Fraction>,
    /// Loss injection: only this opcode class (send, write, ack, ...)
    #[arg(long, requires = "drop")]
    pub opcode: Option<String>,
    /// Loss injection: seed of the drop pattern (0: kernel randomness)
    #[arg(long, default_value_t = 0, requires = "drop")]
    pub seed: u64,
    /// Message size of the WRITEs
    #[arg(long, default_value = "64KiB", value_parser = crate::units::size)]
    pub size: Size,
    /// Bin width of flows.csv and queue.csv, in ms (1 or 10 are typical)
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub bin_ms: u32,
    /// MTU of every interface in the topology
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// TCP port the receiver listens on for the senders' connections
    #[arg(long, default_value_t = 18515)]
    pub port: u16,
}

pub fn run(args: &ExperimentArgs) -> anyhow::Result<()> {
    match &args.kind {
        ExperimentKind::Incast(a) => incast(a),
        ExperimentKind::Workload(a) => workload::workload(a),
        ExperimentKind::Compare(a) => workload::compare(a),
        ExperimentKind::Collective(a) => collective::collective(a),
        ExperimentKind::WorkloadSender(a) => workload::sender(a),
        ExperimentKind::WorkloadReceiver(a) => workload::receiver(a),
    }
}

/// Parsed and checked settings.
struct Plan {
    link_rate_bps: u64,
    line_rate: String,
    dcqcn: xroce::cc::DcqcnConfig,
    duration_s: f64,
    buffer_bytes: Option<u64>,
}

fn check(a: &IncastArgs) -> anyhow::Result<Plan> {
    if a.senders == 0 || a.senders > topology::MAX_SENDERS {
        bail!("--senders must be 1..={}", topology::MAX_SENDERS);
    }
    let line_rate = a.line_rate.clone().unwrap_or_else(|| a.link_rate.clone());
    let dcqcn = a.cc_params.check(line_rate.value)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("an experiment makes network namespaces and attaches XDP: run it as root (sudo)");
    }
    for tool in ["ip", "nsenter"] {
        if std::process::Command::new(tool).arg("-V").output().is_err() {
            bail!("`{tool}` is missing; install iproute2 and util-linux (`cargo xtask setup`)");
        }
    }
    Ok(Plan {
        link_rate_bps: a.link_rate.value,
        line_rate: line_rate.text().to_string(),
        dcqcn,
        duration_s: a.duration.value,
        buffer_bytes: a.buffer.as_ref().map(|b| b.value),
    })
}

/// The `xroce` binary the processes run: this one, or `$XROCE_BIN` (e.g. a
/// release build driven by a debug one).
fn xroce_bin() -> anyhow::Result<PathBuf> {
    match std::env::var_os("XROCE_BIN") {
        Some(bin) => Ok(PathBuf::from(bin)),
        None => std::env::current_exe().context("find the xroce binary (current_exe)"),
    }
}

fn incast(a: &IncastArgs) -> anyhow::Result<()> {
    let plan = check(a)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("create {}", a.out.display()))?;
    procs::install_signal_handlers();
    topology::sweep_stale();
    let exe = xroce_bin()?;
    eprintln!(
        "xroce: incast of {} senders ({}) into a {} bottleneck for {} s; output in {}",
        a.senders,
        a.cc,
        a.link_rate,
        plan.duration_s,
        a.out.display()
    );
    let topo = Topology::build(a.senders, a.mtu).context("build the namespaces")?;
    let result = run_in(a, &plan, &topo, &exe);
    drop(topo);
    result
}

/// Runs `f` on a thread inside network namespace `netns` (xroce finds an
/// interface's XDP program through the interface, so from its namespace).
pub(crate) fn in_netns<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    xroce_netns::spawn_in(netns, f)
        .with_context(|| format!("enter namespace {netns}"))?
        .join()
        .map_err(|_| anyhow::anyhow!("a thread in namespace {netns} panicked"))
}

/// `xroce attach --iface IF --mode native` inside the host's namespace.
pub(crate) fn attach(exe: &Path, host: &topology::Host) -> anyhow::Result<()> {
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

/// Programs the congestion point and loss injection of the receiver.
fn program_receiver(a: &IncastArgs, iface: &str) -> anyhow::Result<()> {
    crate::congestion::ecn(&crate::congestion::EcnArgs {
        iface: iface.to_string(),
        off: false,
        link_rate: Some(a.link_rate.clone()),
        kmin: Some(a.kmin.clone()),
        kmax: Some(a.kmax.clone()),
        pmax: a.pmax.clone(),
        policy: a.policy.clone(),
        buffer: a.buffer.clone(),
    })?;
    match &a.drop {
        Some(drop) => crate::congestion::fault(&crate::congestion::FaultArgs {
            iface: iface.to_string(),
            off: false,
            drop: Some(drop.clone()),
            opcode: a.opcode.clone(),
            qpn: None,
            seed: a.seed,
        }),
        None => xroce::xdp::set_fault(iface, xroce_common::fault::FaultConfig::default())
            .map_err(Into::into),
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// The experiment on a topology that is up: XDP and the bottleneck, the
/// receiver, the sampler, the senders; then the run, and the report.
fn run_in(a: &IncastArgs, plan: &Plan, topo: &Topology, exe: &Path) -> anyhow::Result<()> {
    let out = &a.out;
    for host in &topo.hosts {
        attach(exe, host)?;
    }
    // Dropped (tbf and the TC program removed) before the namespaces go.
    let (ecn, fault, bottleneck) = program_bottleneck(a, plan, topo)?;

    // The receiver: one process, one AF_XDP socket, all the connections.
    let listen = format!("{}:{}", topo.receiver().addr, a.port);
    let receiver_log = out.join("receiver.log");
    let mut receiver = start_receiver(a, topo, exe, &listen, &receiver_log)?;

    let sender_ifaces: Vec<(String, String)> = topo
        .senders()
        .iter()
        .map(|h| (h.netns.clone(), h.iface.clone()))
        .collect();
    let mut sampler = Sampler::with_bottleneck(
        &(topo.receiver().netns.clone(), topo.receiver().iface.clone()),
        &sender_ifaces,
        plan.link_rate_bps,
        bottleneck.as_ref().map(|b| b.reader()).transpose()?,
        &out.join("queue.csv"),
    )?;
    let t0 = Instant::now();
    let mut senders = start_senders(a, plan, topo, exe, &listen)?;

    let mut errors = Vec::new();
    let run = sample_until_done(a, plan, t0, &mut sampler, &mut senders, &mut errors)?;
    let final_sample = stop(
        &mut senders,
        &mut receiver,
        &mut sampler,
        t0,
        run.interrupted,
        &mut errors,
    )?;

    let flows = collect_flows(out, topo, t0, &mut senders, &mut errors);
    let receiver_json = receiver_result(&mut receiver, &receiver_log, &mut errors);

    let report = Report {
        args: a,
        link_rate_bps: plan.link_rate_bps,
        line_rate: &plan.line_rate,
        dcqcn: &plan.dcqcn,
        duration_s: plan.duration_s,
        buffer_bytes: plan.buffer_bytes,
        ecn,
        fault,
        samples: &run.samples,
        final_sample,
        active_until_ms: run.active_until_ms,
        flows: &flows,
        receiver: receiver_json,
        errors: &errors,
    };
    report.write(out)?;
    if let Err(e) = plot::all(&report, out) {
        eprintln!("xroce: plots not drawn: {e:#}");
    }
    report.print_brief();
    if !errors.is_empty() {
        bail!(
            "the experiment had errors (outputs in {} are partial): {}",
            out.display(),
            errors.join("; ")
        );
    }
    Ok(())
}

/// Programs the receiver's congestion point and loss injection; with
/// `--bottleneck delay`, moves the marking to a delay bottleneck on the
/// bridge's port toward it (returned). Returns the receiver's ECN and
/// fault settings as programmed.
fn program_bottleneck(
    a: &IncastArgs,
    plan: &Plan,
    topo: &Topology,
) -> anyhow::Result<(EcnConfig, FaultConfig, Option<Bottleneck>)> {
    let rx = topo.receiver();
    // The program is found through its interface: ask from its namespace.
    let delay = a.bottleneck == "delay";
    let (ecn, fault) = {
        let (a, iface) = (a.clone(), rx.iface.clone());
        in_netns(&rx.netns, move || -> anyhow::Result<_> {
            program_receiver(&a, &iface)?;
            let ecn = xroce::xdp::ecn_config(&iface)?;
            if delay {
                // The same settings move to the bridge's port.
                xroce::xdp::set_ecn(&iface, Default::default())?;
            }
            Ok((ecn, xroce::xdp::fault_config(&iface)?))
        })??
    };
    let bottleneck = if delay {
        let port = rx.peer.clone();
        Some(
            in_netns(&topo.bridge_netns, move || Bottleneck::attach(&port, ecn))?
                .context("put the delay bottleneck on the bridge's port")?,
        )
        .inspect(|b| {
            eprintln!(
                "xroce: the bottleneck moves to the bridge's port {}: tbf at {} bit/s holds \
                 the queue, marking as above there; the receiver's XDP congestion point is off",
                b.iface(),
                plan.link_rate_bps
            )
        })
    } else {
        None
    };
    Ok((ecn, fault, bottleneck))
}

/// Starts the receiver (`xroce bench write --listen` for every sender)
/// and waits up to 15 s until it listens on `listen`.
fn start_receiver(
    a: &IncastArgs,
    topo: &Topology,
    exe: &Path,
    listen: &str,
    log: &Path,
) -> anyhow::Result<Proc> {
    let rx = topo.receiver();
    let mut cmd = rx.command(exe);
    cmd.args(["bench", "write", "--iface", &rx.iface, "--listen", listen])
        .args([
            "--peers",
            &a.senders.to_string(),
            "--backend",
            "afxdp",
            "--json",
        ]);
    let mut receiver = Proc::spawn("receiver", cmd, log)?;
    let ready_by = Instant::now() + Duration::from_secs(15);
    while !procs::listening(receiver.pid(), a.port) {
        if let Some(status) = receiver.poll() {
            bail!(
                "the receiver exited ({status}) before listening on {listen}: {}",
                tail(log)
            );
        }
        if procs::stop_requested() {
            bail!("interrupted");
        }
        if Instant::now() > ready_by {
            bail!(
                "the receiver did not listen on {listen} within 15 s: {}",
                tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(receiver)
}

/// Starts one `xroce bench write` per sender host toward `listen`, each
/// tracing into trace<i>.csv.
fn start_senders(
    a: &IncastArgs,
    plan: &Plan,
    topo: &Topology,
    exe: &Path,
    listen: &str,
) -> anyhow::Result<Vec<Proc>> {
    let out = &a.out;
    let duration_arg = format_seconds(plan.duration_s);
    let mut senders = Vec::with_capacity(topo.senders().len());
    for (i, host) in topo.senders().iter().enumerate() {
        let trace = out.join(format!("trace{i}.csv"));
        let _ = std::fs::remove_file(&trace);
        let mut cmd = host.command(exe);
        cmd.args([
            "bench",
            "write",
            "--iface",
            &host.iface,
            "--connect",
            listen,
        ])
        .args([
            "--size",
            a.size.text(),
            "--duration",
            &duration_arg,
            "--qps",
            "1",
        ])
        .args(["--cc", a.cc.name(), "--rate", &plan.line_rate])
        .args(["--bin-ms", &a.bin_ms.to_string(), "--json"])
        .arg("--trace")
        .arg(&trace);
        a.cc_params.apply(&mut cmd);
        senders.push(Proc::spawn(
            &format!("sender {i}"),
            cmd,
            &out.join(format!("sender{i}.log")),
        )?);
    }
    Ok(senders)
}

/// What the sampling loop saw.
struct Sampled {
    samples: Vec<Sample>,
    /// When it ended (ms on `t0`'s clock).
    active_until_ms: f64,
    /// It ended on a signal.
    interrupted: bool,
}

/// Samples every bin on `t0`'s grid, with a progress bar, until the
/// senders exit, a signal, or 30 s past the duration (the senders still
/// running count as an error).
fn sample_until_done(
    a: &IncastArgs,
    plan: &Plan,
    t0: Instant,
    sampler: &mut Sampler,
    senders: &mut [Proc],
    errors: &mut Vec<String>,
) -> anyhow::Result<Sampled> {
    let bar = progress_bar(plan.duration_s);
    let bin = Duration::from_millis(a.bin_ms as u64);
    // Senders that hang past this are killed.
    let deadline = t0 + Duration::from_secs_f64(plan.duration_s + 30.0);
    let mut samples = Vec::new();
    let mut next = t0;
    let mut interrupted = false;
    loop {
        next += bin;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else if now - next > bin {
            // Fell behind (a busy machine): sample now, keep the grid.
            next += (now - next).div_duration_f64(bin).floor() as u32 * bin;
        }
        let t_ms = t0.elapsed().as_secs_f64() * 1e3;
        let s = sampler.sample(t_ms)?;
        samples.push(s);
        bar.set_position((t_ms as u64).min(bar.length().unwrap_or(0)));
        bar.set_message(format!(
            "queue {:>7.1} KB (peak {:.1} KB) marks {} CNPs {} drops {}",
            s.queue_bytes as f64 / 1e3,
            s.peak_bytes as f64 / 1e3,
            s.marks,
            s.cnps_seen,
            s.drop_tail + s.drop_congestion + s.drop_fault
        ));
        let running = senders
            .iter_mut()
            .map(|p| p.poll())
            .filter(Option::is_none)
            .count();
        if running == 0 {
            break;
        }
        if procs::stop_requested() {
            interrupted = true;
            errors.push("interrupted (signal)".to_string());
            break;
        }
        if Instant::now() > deadline {
            errors.push(format!(
                "{running} sender(s) still running {:.0} s after the end: killed",
                plan.duration_s + 30.0
            ));
            break;
        }
    }
    let active_until_ms = t0.elapsed().as_secs_f64() * 1e3;
    bar.finish_and_clear();
    Ok(Sampled {
        samples,
        active_until_ms,
        interrupted,
    })
}

/// Ends the run: kills the senders, gives the receiver 15 s to exit
/// (unless interrupted), and takes the sampler's last sample, after the
/// queue had time to drain.
fn stop(
    senders: &mut [Proc],
    receiver: &mut Proc,
    sampler: &mut Sampler,
    t0: Instant,
    interrupted: bool,
    errors: &mut Vec<String>,
) -> anyhow::Result<Sample> {
    for p in senders.iter_mut() {
        p.kill();
    }
    // The receiver exits once every connection is done.
    if !interrupted && receiver.wait_for(Duration::from_secs(15)).is_none() {
        errors.push("the receiver did not exit within 15 s of the senders: killed".into());
    }
    receiver.kill();
    // A last sample after the queue had time to drain.
    let final_sample = sampler.sample(t0.elapsed().as_secs_f64() * 1e3)?;
    sampler.finish()?;
    Ok(final_sample)
}

/// Each sender's result (its exit, bench JSON and trace); a failed one
/// also goes to `errors` with the end of its log.
fn collect_flows(
    out: &Path,
    topo: &Topology,
    t0: Instant,
    senders: &mut [Proc],
    errors: &mut Vec<String>,
) -> Vec<FlowResult> {
    let mut flows = Vec::new();
    for (i, (p, host)) in senders.iter_mut().zip(topo.senders()).enumerate() {
        let status = p.poll();
        let stdout = p.stdout();
        let flow = FlowResult::collect(
            i,
            host.addr,
            status,
            &stdout,
            &out.join(format!("trace{i}.csv")),
            p.started.duration_since(t0).as_secs_f64() * 1e3,
            p.exited.map(|e| e.duration_since(t0).as_secs_f64() * 1e3),
        );
        if let Some(e) = &flow.error {
            errors.push(format!(
                "sender {i}: {e}: {}",
                tail(&out.join(format!("sender{i}.log")))
            ));
        }
        flows.push(flow);
    }
    flows
}

/// The receiver's bench JSON; an unclean exit goes to `errors`.
fn receiver_result(receiver: &mut Proc, log: &Path, errors: &mut Vec<String>) -> Option<Value> {
    let status = receiver.poll();
    let json = serde_json::from_str::<Value>(receiver.stdout().trim()).ok();
    if !status.is_some_and(|s| s.success()) {
        errors.push(format!(
            "receiver: exited {}: {}",
            status.map_or("(killed)".to_string(), |s| s.to_string()),
            tail(log)
        ));
    }
    json
}

/// Seconds as bench takes them: "5" or "0.5".
fn format_seconds(s: f64) -> String {
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s}")
    }
}

fn progress_bar(duration_s: f64) -> ProgressBar {
    let bar = ProgressBar::new((duration_s * 1e3) as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos:>6}/{len} ms  {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        use crate::units::seconds;
        assert_eq!(seconds("5").unwrap().value, 5.0);
        assert_eq!(seconds("500ms").unwrap().value, 0.5);
        assert!(seconds("0").is_err());
        assert_eq!(format_seconds(5.0), "5");
        assert_eq!(format_seconds(0.5), "0.5");
    }
}
