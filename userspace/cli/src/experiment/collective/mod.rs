//! `xroce experiment collective`: the job completion time (JCT) of
//! collectives in a training-step model, over xroce and over TCP, through
//! real libraries: Debian's unmodified Open MPI (over UCX) or Gloo
//! (`--library`). N ranks, one namespace each, on the lab's bridge
//! (topology.rs). MPI: mpirun on the bridge as the head node (job.rs), every
//! rank running collective_step.c. Gloo: every rank started here in its
//! namespace, meeting the others through Gloo's FileStore (gloo.rs),
//! running collective_step_gloo.cc. Per iteration a compute gap from the
//! seeded schedule (schedule.rs), then the collective, every element
//! checked. With `--loss`, a lossless run of each variant comes first as
//! the baseline, then the lossy one (network.rs). With `--background
//! incast|load`, the workload generator's xroce flows run into the ranks'
//! links while each job runs (background.rs).
//!
//! Variants: without `--compare`, each transport of `--transport` with
//! `--recovery` and `--cc`. `--compare tcp,recovery,cc` runs, on the same
//! seed (same compute gaps, same drop pattern), xroce and TCP; xroce with
//! go-back-N and with selective repeat; xroce under each congestion
//! controller (what one axis does not vary comes from `--recovery` and
//! `--cc`), each variant once.
//!
//! Files in `--out`:
//! - iterations.csv: `library,variant,transport,loss,op,bytes,iter,rank,
//!   gap_s,coll_s,wait_fraction,jct_s`, one row per rank and iteration of
//!   every run; jct_s is the iteration's slowest rank's time in the
//!   collective.
//! - summary.json: the settings, each job, then per variant, loss, op and
//!   size the JCT per iteration, p50, p99, max and mean; nccl-tests'
//!   algorithm and bus bandwidth at the p50; the fraction of time ranks
//!   wait; the slowdown against the lossless run.
//! - jct.svg: JCT per iteration, one line per run, op and size;
//!   compare.svg (with --compare): JCT p50 and p99 per variant.
//! - schedule.csv: every rank's compute gap per iteration (`iter,rank,
//!   gap_us`); runs/<variant>-loss<p>/: each job's files (MPI: launch
//!   agent, hostfile, mpirun.log; Gloo: the store, rank<i>.log) and the
//!   program's own CSV; work/: the program.

mod background;
mod gloo;
mod job;
mod network;
mod plot;
mod program;
mod results;
mod schedule;
mod variant;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use xroce::cc::CcKind;

use self::{
    gloo::GlooJob,
    job::{Job, Transport},
    network::LossOn,
    results::{Figure, JobFigure, Run},
    variant::{variants, Recovery, Variant, AXES},
};
use super::{cc_params::CcParams, procs, topology, topology::Topology};
use crate::units::{Fraction, Seconds, Size};

const OPS: [&str; 4] = ["allreduce", "alltoall", "allgather", "reduce_scatter"];
const MIN_SIZE: u64 = 1 << 10;
const MAX_SIZE: u64 = 256 << 20;

#[derive(clap::Args, Debug, Clone)]
pub struct CollectiveArgs {
    /// Ranks, one host (namespace) each
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// Collectives, each run at every size: allreduce, alltoall, allgather,
    /// reduce_scatter (a comma list)
    #[arg(long, value_delimiter = ',', default_value = "allreduce", value_parser = OPS)]
    pub op: Vec<String>,
    /// Sizes as nccl-tests counts them (the allreduce buffer, the whole
    /// alltoall/reduce_scatter send or allgather receive buffer), 1KiB to
    /// 256MiB, a comma list
    #[arg(long, value_delimiter = ',', default_value = "64KiB", value_parser = crate::units::size)]
    pub sizes: Vec<Size>,
    /// Timed iterations per op and size
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed iterations before them (the first connects the ranks)
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// The compute gap before each collective (a sleep: the model's compute
    /// runs on an accelerator)
    #[arg(long, default_value = "5ms", value_parser = crate::units::seconds)]
    pub compute_gap: Seconds,
    /// Each rank's gap is off by up to this fraction of it either way,
    /// drawn from --seed
    #[arg(long, default_value_t = 0.1)]
    pub jitter: f64,
    /// The library the ranks run: mpi (Open MPI: allreduce, alltoall,
    /// allgather, reduce_scatter) or gloo (Gloo's ring allreduce)
    #[arg(long, default_value = "mpi", value_parser = ["mpi", "gloo"])]
    pub library: String,
    /// xroce (MPI: pml ucx over xroce; Gloo: its ibverbs transport over
    /// xroce), tcp (MPI: pml ob1, btl tcp; Gloo: its TCP transport) or both
    #[arg(long, default_value = "both", value_parser = ["xroce", "tcp", "both"])]
    pub transport: String,
    /// How xroce's ranks recover loss: gbn (go-back-N), sr (selective
    /// repeat, forced) or auto (the two xroce peers agree on selective
    /// repeat in band); the ranks' XROCE_SELECTIVE_REPEAT=off|on|auto
    #[arg(long, default_value = "auto", value_parser = ["gbn", "sr", "auto"])]
    pub recovery: String,
    /// Run the same seed for each variant along these axes (a comma list):
    /// tcp (xroce vs TCP), recovery (go-back-N vs selective repeat), cc
    /// (none, dcqcn, timely, swift); writes compare.svg. It picks the
    /// transports itself: instead of --transport, `--compare tcp` runs both
    #[arg(long, value_delimiter = ',', value_parser = AXES, conflicts_with = "transport")]
    pub compare: Vec<String>,
    /// Fraction of frames arriving at the ranks to drop (a lossless run of
    /// each transport comes first as the baseline)
    #[arg(long, value_parser = crate::units::fraction)]
    pub loss: Option<Fraction>,
    /// Where the loss is: `all` ranks' ingress or one rank's (`rank:I`)
    #[arg(long, default_value = "all", requires = "loss")]
    pub loss_on: LossOn,
    /// Congestion control of the ranks over xroce
    #[arg(long, default_value = "none", value_parser = crate::units::cc())]
    pub cc: CcKind,
    /// The controllers' parameters, for the ranks and the background
    #[command(flatten)]
    pub cc_params: CcParams,
    /// Seed of the compute gaps' jitter and of the XDP drop pattern
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Folder for iterations.csv, summary.json, jct.svg and the jobs' files
    #[arg(long)]
    pub out: PathBuf,
    /// MTU of every interface
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// A job with no finished iteration for this long is killed
    #[arg(long, default_value = "300", value_parser = crate::units::seconds)]
    pub stall_timeout: Seconds,
    /// Traffic of the workload generator while each job runs, over xroce
    /// with the variant's congestion control: none, incast (bursts from
    /// every background sender at once to rank 0) or load (Poisson flows
    /// from the background senders to every rank)
    #[arg(long, default_value = "none", value_parser = background::KINDS)]
    pub background: String,
    /// The background's offered load: a fraction of each receiving rank's
    /// link at --background-rate [default: 0.3]
    #[arg(long)]
    pub background_load: Option<f64>,
    /// The background's flow sizes: websearch, hadoop or a file of
    /// `size_bytes cdf_percent` lines (HPCC's traffic_gen format)
    /// [default: websearch]
    #[arg(long)]
    pub background_cdf: Option<String>,
    /// Hosts beside the ranks that send the background (1 to 8) [default: 2]
    #[arg(long)]
    pub background_senders: Option<usize>,
    /// The link rate the background's load is a fraction of (and its
    /// senders' line rate) [default: 1gbit]
    #[arg(long, value_parser = crate::units::rate)]
    pub background_rate: Option<crate::units::Rate>,
}

/// summary.json.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// "collective".
    pub experiment: String,
    pub settings: Settings,
    /// Each mpirun: what the ranks received and what the loss dropped.
    pub jobs: Vec<JobFigure>,
    pub figures: Vec<Figure>,
    pub errors: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub ranks: usize,
    pub ops: Vec<String>,
    /// --sizes in bytes, as asked (the figures' are rounded to whole
    /// elements per rank).
    pub sizes: Vec<u64>,
    pub iters: usize,
    pub warmup: usize,
    pub compute_gap_s: f64,
    pub jitter: f64,
    pub seed: u64,
    pub transports: Vec<String>,
    /// "mpi" or "gloo".
    pub library: String,
    /// --recovery: "gbn", "sr" or "auto".
    pub recovery: String,
    /// --compare's axes (empty without it).
    pub compare: Vec<String>,
    /// The variants run, in order.
    pub variants: Vec<String>,
    /// --loss (null: lossless runs only).
    pub loss: Option<f64>,
    /// "all" or "rank:I".
    pub loss_on: String,
    pub cc: String,
    /// --dcqcn, --swift and --timely (absent in older summaries, whose
    /// ranks ran each controller's defaults: the papers' sets).
    #[serde(default)]
    pub cc_params: Option<CcParams>,
    pub mtu: u32,
    /// --background (null: none).
    pub background: Option<background::Settings>,
}

pub fn collective(a: &CollectiveArgs) -> anyhow::Result<()> {
    // Its flags first: refused before anything is made.
    let background = plan_background(a)?;
    let variants = check(a)?;
    // DCQCN's rates scale with the link, not its syntax: checked against 1 Gbit/s.
    a.cc_params.check(1_000_000_000)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("create {}", a.out.display()))?;
    procs::install_signal_handlers();
    topology::sweep_stale();
    let exe = super::xroce_bin()?;
    let work = a.out.join("work");
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    let program = match a.library.as_str() {
        "gloo" => gloo::build_program(&work)?,
        _ => job::build_program(&work)?,
    };
    let gaps = schedule::gaps(a.seed, a.ranks, a.iters, a.compute_gap.value, a.jitter);
    let schedule_path = a.out.join("schedule.csv");
    schedule::write(&schedule_path, &gaps)?;
    eprintln!(
        "xroce: {} {} of {} over {} ranks, {} iterations after a {} gap (±{}%), as {}{}{}; output in {}",
        a.library,
        a.op.join(", "),
        a.sizes.iter().map(Size::text).collect::<Vec<_>>().join(", "),
        a.ranks,
        a.iters,
        a.compute_gap,
        a.jitter * 100.0,
        variants.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(", "),
        a.loss
            .as_ref()
            .map(|l| format!(" without loss and at {l} loss on {}", loss_on_text(&a.loss_on)))
            .unwrap_or_default(),
        background
            .as_ref()
            .map(|b| format!(", under {}", b.text()))
            .unwrap_or_default(),
        a.out.display()
    );
    let others = background.as_ref().map_or(0, |b| b.settings.senders);
    let topo = Topology::ranks(a.ranks, others, a.mtu).context("build the namespaces")?;
    let setup = Setup {
        a,
        cc_params: &a.cc_params,
        background: background.as_ref(),
        topo: &topo,
        exe: &exe,
        program: &program,
        schedule: &schedule_path,
    };
    let result = setup.run_all(&variants);
    drop(topo);
    result
}

/// Checked flags; the variants to run, in order.
fn check(a: &CollectiveArgs) -> anyhow::Result<Vec<Variant>> {
    if !(2..=topology::MAX_RANKS).contains(&a.ranks) {
        bail!("--ranks must be 2..={}", topology::MAX_RANKS);
    }
    check_library(&a.library, &a.op)?;
    if let Some(s) = a
        .sizes
        .iter()
        .find(|s| !(MIN_SIZE..=MAX_SIZE).contains(&s.value))
    {
        bail!("--sizes: {s} is outside 1KiB..=256MiB");
    }
    if a.iters == 0 {
        bail!("--iters must be at least 1");
    }
    if !(0.0..=1.0).contains(&a.jitter) {
        bail!("--jitter must be a fraction in 0..=1");
    }
    if let LossOn::Rank(i) = a.loss_on {
        if i >= a.ranks {
            bail!("--loss-on rank:{i}: there are ranks 0..{}", a.ranks);
        }
    }
    let transports = match a.transport.as_str() {
        "xroce" => vec![Transport::Xroce],
        "tcp" => vec![Transport::Tcp],
        _ => vec![Transport::Xroce, Transport::Tcp],
    };
    let variants = variants(&transports, Recovery::parse(&a.recovery)?, a.cc, &a.compare)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("an experiment makes network namespaces and attaches XDP: run it as root (sudo)");
    }
    for tool in ["ip", "nsenter", "unshare"] {
        if std::process::Command::new(tool).arg("-V").output().is_err() {
            bail!("`{tool}` is missing; install iproute2 and util-linux (`cargo xtask setup`)");
        }
    }
    match a.library.as_str() {
        "gloo" => gloo::check_tools()?,
        _ => job::check_tools()?,
    }
    if a.loss.is_some() && variants.iter().any(|v| v.transport == Transport::Tcp) {
        network::check_iptables()?;
    }
    Ok(variants)
}

/// The background's flows (None without --background), drawn over the
/// longest a job may run between two iterations, or ten minutes if longer.
fn plan_background(a: &CollectiveArgs) -> anyhow::Result<Option<background::Plan>> {
    if a.background == "none" {
        let given = [
            ("--background-load", a.background_load.is_some()),
            ("--background-cdf", a.background_cdf.is_some()),
            ("--background-senders", a.background_senders.is_some()),
            ("--background-rate", a.background_rate.is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
            bail!("{flag} shapes a background: add --background incast or --background load");
        }
    }
    background::plan(
        &a.background,
        a.background_cdf
            .as_deref()
            .unwrap_or(background::DEFAULT_CDF),
        a.background_senders.unwrap_or(background::DEFAULT_SENDERS),
        a.background_load.unwrap_or(background::DEFAULT_LOAD),
        a.background_rate
            .as_ref()
            .map_or(background::DEFAULT_RATE_BPS, |r| r.value),
        a.ranks,
        a.stall_timeout.value.max(600.0),
        a.seed,
    )
}

/// The library can run the ops asked for.
fn check_library(library: &str, ops: &[String]) -> anyhow::Result<()> {
    if library == "gloo" {
        let others: Vec<&str> = ops
            .iter()
            .map(String::as_str)
            .filter(|op| *op != "allreduce")
            .collect();
        if !others.is_empty() {
            bail!(
                "--library gloo runs allreduce only (Gloo's ring allreduce), not {}: use \
                 `--op allreduce`, or `--library mpi` for alltoall, allgather and reduce_scatter",
                others.join(", ")
            );
        }
    }
    Ok(())
}

/// A fraction as the user gave it (0.01, not the fixed point's
/// 0.010000000009).
fn as_given(f: &Fraction) -> f64 {
    crate::units::parse_fraction(f.text())
        .unwrap_or_else(|_| xroce_common::fixed::fixed_to_fraction(f.value))
}

fn loss_on_text(on: &LossOn) -> String {
    match on {
        LossOn::All => "all".into(),
        LossOn::Rank(i) => format!("rank:{i}"),
    }
}

/// What every job of the experiment shares.
struct Setup<'a> {
    a: &'a CollectiveArgs,
    cc_params: &'a CcParams,
    background: Option<&'a background::Plan>,
    topo: &'a Topology,
    exe: &'a Path,
    program: &'a Path,
    schedule: &'a Path,
}

impl Setup<'_> {
    /// Every job (each variant, lossless then lossy), then the outputs;
    /// after a failed job the outputs hold the jobs before it.
    fn run_all(&self, variants: &[Variant]) -> anyhow::Result<()> {
        let a = self.a;
        let losses: Vec<Option<&Fraction>> = std::iter::once(None)
            .chain(a.loss.as_ref().map(Some))
            .collect();
        let per_job = (a.op.len() * a.sizes.len() * a.iters) as u64;
        let bar = progress_bar(per_job * (variants.len() * losses.len()) as u64);
        let mut runs = Vec::new();
        let mut errors = Vec::new();
        'jobs: for variant in variants {
            for &loss in &losses {
                bar.set_message(format!(
                    "{} at {} loss",
                    variant.name,
                    loss.map_or("no".to_string(), |l| l.to_string())
                ));
                match self.job(variant, loss, &bar) {
                    Ok(run) => {
                        // A failed background flow is an error of the
                        // experiment; the job's own results stand.
                        let bg = run.background.iter().flat_map(|b| &b.errors);
                        errors.extend(bg.map(|e| format!("{}: the background: {e}", variant.name)));
                        runs.push(run);
                    }
                    Err(e) => {
                        errors.push(format!("{}: {:#}", variant.name, e));
                        break 'jobs;
                    }
                }
            }
        }
        bar.finish_and_clear();
        let figures = results::figures(&runs, a.ranks);
        self.write(variants, &runs, &figures, &errors)?;
        print_brief(&runs, &figures);
        if !errors.is_empty() {
            bail!(
                "the experiment had errors (outputs in {} are partial): {}",
                a.out.display(),
                errors.join("; ")
            );
        }
        Ok(())
    }

    /// One job: the interfaces set up for it, the ranks run, their rows
    /// checked.
    fn job(
        &self,
        variant: &Variant,
        loss: Option<&Fraction>,
        bar: &ProgressBar,
    ) -> anyhow::Result<Run> {
        let a = self.a;
        let transport = variant.transport;
        let head = self.topo.bridge_addr.context("no head node address")?;
        network::prepare(
            self.exe,
            &self.topo.hosts,
            head,
            transport,
            loss,
            &a.loss_on,
            a.seed,
        )?;
        let loss_value = loss.map_or(0.0, as_given);
        let dir = a
            .out
            .join("runs")
            .join(format!("{}-loss{loss_value}", variant.name));
        let sizes: Vec<u64> = a.sizes.iter().map(|s| s.value).collect();
        let stall = Duration::from_secs_f64(a.stall_timeout.value);
        // Killed on every way out of this function (dropped) unless
        // finished below.
        let running = match self.background {
            Some(b) => Some(b.start(
                self.exe,
                self.topo,
                variant.cc,
                self.cc_params,
                &dir.join("background"),
            )?),
            None => None,
        };
        let before = network::counts(&self.topo.hosts, transport)?;
        let (finished, steps_path) = match a.library.as_str() {
            "gloo" => {
                let job = GlooJob {
                    topo: self.topo,
                    xroce: self.exe,
                    program: self.program,
                    schedule: self.schedule,
                    transport,
                    cc: variant.cc,
                    cc_params: self.cc_params,
                    selective_repeat: variant.recovery.env_value(),
                    sizes: &sizes,
                    iters: a.iters,
                    warmup: a.warmup,
                    dir: &dir,
                    stall,
                };
                (job.run(&mut |n| bar.inc(n))?, job.steps_path())
            }
            _ => {
                let job = Job {
                    topo: self.topo,
                    xroce: self.exe,
                    program: self.program,
                    schedule: self.schedule,
                    transport,
                    cc: variant.cc,
                    cc_params: self.cc_params,
                    selective_repeat: variant.recovery.env_value(),
                    ops: &a.op,
                    sizes: &sizes,
                    iters: a.iters,
                    warmup: a.warmup,
                    dir: &dir,
                    stall,
                };
                (job.run(&mut |n| bar.inc(n))?, job.steps_path())
            }
        };
        let after = network::counts(&self.topo.hosts, transport)?;
        let background = running.map(|r| r.finish(stall)).transpose()?;
        let steps = results::parse_steps(&finished.steps)
            .with_context(|| format!("read {}", steps_path.display()))?;
        let want = a.op.len() * a.sizes.len() * a.iters * a.ranks;
        if steps.len() != want {
            bail!(
                "{} has {} rows, not {want} (ops × sizes × iterations × ranks)",
                steps_path.display(),
                steps.len()
            );
        }
        let xroce = transport == Transport::Xroce;
        Ok(Run {
            variant: variant.name.clone(),
            library: a.library.clone(),
            transport: transport.name().to_string(),
            recovery: xroce.then(|| variant.recovery.name().to_string()),
            cc: xroce.then(|| variant.cc.name().to_string()),
            loss: loss_value,
            steps,
            frames: after.frames.saturating_sub(before.frames),
            dropped: after.dropped.saturating_sub(before.dropped),
            background,
        })
    }

    fn write(
        &self,
        variants: &[Variant],
        runs: &[Run],
        figures: &[Figure],
        errors: &[String],
    ) -> anyhow::Result<()> {
        let a = self.a;
        results::write_iterations(&a.out.join("iterations.csv"), runs)?;
        let mut transports: Vec<String> = Vec::new();
        for v in variants {
            if !transports.iter().any(|t| t == v.transport.name()) {
                transports.push(v.transport.name().to_string());
            }
        }
        let summary = Summary {
            experiment: "collective".into(),
            settings: Settings {
                ranks: a.ranks,
                ops: a.op.clone(),
                sizes: a.sizes.iter().map(|s| s.value).collect(),
                iters: a.iters,
                warmup: a.warmup,
                compute_gap_s: a.compute_gap.value,
                jitter: a.jitter,
                seed: a.seed,
                transports,
                library: a.library.clone(),
                recovery: a.recovery.clone(),
                compare: a.compare.clone(),
                variants: variants.iter().map(|v| v.name.clone()).collect(),
                loss: a.loss.as_ref().map(as_given),
                loss_on: loss_on_text(&a.loss_on),
                cc: a.cc.name().to_string(),
                cc_params: Some(self.cc_params.clone()),
                mtu: a.mtu,
                background: self.background.map(|b| b.settings.clone()),
            },
            jobs: runs.iter().map(JobFigure::from).collect(),
            figures: figures.to_vec(),
            errors: errors.to_vec(),
        };
        let path = a.out.join("summary.json");
        std::fs::write(&path, serde_json::to_string_pretty(&summary)? + "\n")
            .with_context(|| format!("write {}", path.display()))?;
        if !figures.is_empty() {
            let title = format!("{} ranks, {}: JCT per iteration", a.ranks, a.library);
            if let Err(e) = plot::jct(&a.out.join("jct.svg"), &title, figures) {
                eprintln!("xroce: jct.svg not drawn: {e:#}");
            }
            if !a.compare.is_empty() {
                let title = format!(
                    "{} ranks, {}: JCT p50 and p99 per variant (seed {})",
                    a.ranks, a.library, a.seed
                );
                if let Err(e) = plot::compare(&a.out.join("compare.svg"), &title, figures) {
                    eprintln!("xroce: compare.svg not drawn: {e:#}");
                }
            }
        }
        Ok(())
    }
}

fn print_brief(runs: &[Run], figures: &[Figure]) {
    for r in runs {
        let what = match r.transport.as_str() {
            "xroce" => "RoCEv2 frames",
            _ => "TCP packets (counted with loss on)",
        };
        eprintln!(
            "xroce: {} at loss {}: the ranks received {} {what}, {} dropped",
            r.variant, r.loss, r.frames, r.dropped
        );
        if let Some(b) = &r.background {
            eprintln!(
                "xroce: {} at loss {}: the background completed {} flows ({} bytes, {} verified), \
                 FCT slowdown p50 {} p99 {}",
                r.variant,
                r.loss,
                b.flows,
                b.bytes,
                b.verified,
                b.slowdown_p50.map_or("-".into(), |s| format!("{s:.1}")),
                b.slowdown_p99.map_or("-".into(), |s| format!("{s:.1}"))
            );
        }
    }
    eprintln!(
        "{:<13} {:>6} {:<14} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6} {:>9}",
        "variant",
        "loss",
        "op",
        "bytes",
        "p50 ms",
        "p99 ms",
        "max ms",
        "algbw",
        "busbw",
        "wait",
        "slowdown"
    );
    for f in figures {
        eprintln!(
            "{:<13} {:>6} {:<14} {:>10} {:>10.3} {:>10.3} {:>10.3} {:>8.1} {:>8.1} {:>6.2} {:>9}",
            f.variant,
            f.loss,
            f.op,
            f.bytes,
            f.jct_p50_s * 1e3,
            f.jct_p99_s * 1e3,
            f.jct_max_s * 1e3,
            f.algbw_gbyte_s * 1e3,
            f.busbw_gbyte_s * 1e3,
            f.wait_fraction,
            f.slowdown_p50.map_or("-".into(), |s| format!("{s:.2}x"))
        );
    }
    eprintln!(
        "(algbw, busbw: MB/s as nccl-tests defines them, at the p50; wait: share of a step in \
         the collective)"
    );
}

fn progress_bar(iterations: u64) -> ProgressBar {
    let bar = ProgressBar::new(iterations);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos:>5}/{len} iterations  {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        a: CollectiveArgs,
    }

    fn parse(extra: &[&str]) -> Result<CollectiveArgs, clap::Error> {
        let args = ["x", "--out", "o"].iter().chain(extra);
        Flags::try_parse_from(args).map(|f| f.a)
    }

    #[test]
    fn flags_parse() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.library.as_str(), a.recovery.as_str()), ("mpi", "auto"));
        assert!(a.compare.is_empty());
        let a = parse(&[
            "--library",
            "gloo",
            "--recovery",
            "sr",
            "--compare",
            "tcp,cc",
        ])
        .unwrap();
        assert_eq!(a.library, "gloo");
        assert_eq!(a.recovery, "sr");
        assert_eq!(a.compare, ["tcp", "cc"]);
        assert!(parse(&["--library", "nccl"]).is_err());
        assert!(parse(&["--recovery", "irn"]).is_err());
        assert!(parse(&["--compare", "mtu"]).is_err());
        assert_eq!(a.background, "none");
        let a = parse(&[
            "--background",
            "incast",
            "--background-load",
            "0.2",
            "--background-cdf",
            "hadoop",
            "--background-senders",
            "3",
            "--background-rate",
            "100mbit",
        ])
        .unwrap();
        assert_eq!(
            (
                a.background.as_str(),
                a.background_load,
                a.background_cdf.as_deref()
            ),
            ("incast", Some(0.2), Some("hadoop"))
        );
        assert_eq!(
            (
                a.background_senders,
                a.background_rate.as_ref().map(|r| r.value)
            ),
            (Some(3), Some(100_000_000))
        );
        let e = parse(&["--background", "storm"]).unwrap_err().to_string();
        assert!(
            e.contains("none") && e.contains("incast") && e.contains("load"),
            "{e}"
        );
        // --compare chooses the transports itself.
        let e = parse(&["--compare", "tcp", "--transport", "xroce"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn background_flags_without_a_background_name_the_fix() {
        let a = parse(&["--background-load", "0.5"]).unwrap();
        let e = plan_background(&a).err().unwrap().to_string();
        assert!(
            e.contains("--background-load") && e.contains("--background incast"),
            "{e}"
        );
        let a = parse(&["--background", "none", "--background-senders", "3"]).unwrap();
        let e = plan_background(&a).err().unwrap().to_string();
        assert!(e.contains("--background-senders"), "{e}");
        // Without any, nothing is planned and nothing fails.
        assert!(plan_background(&parse(&[]).unwrap()).unwrap().is_none());
    }

    #[test]
    fn controller_parameters_default_to_the_software_presets() {
        // The drop-in library's own default is each paper's set.
        let a = parse(&[]).unwrap();
        assert_eq!(
            a.cc_params.envs(),
            [
                ("XROCE_DCQCN", "software"),
                ("XROCE_SWIFT", "software"),
                ("XROCE_TIMELY", "software"),
            ]
        );
        let a = parse(&["--timely", "paper,t_low=80us"]).unwrap();
        assert_eq!(a.cc_params.timely, "paper,t_low=80us");
    }

    #[test]
    fn gloo_runs_allreduce_only_and_says_so() {
        assert!(check_library("gloo", &["allreduce".into()]).is_ok());
        assert!(check_library("mpi", &["alltoall".into()]).is_ok());
        let e = check_library("gloo", &["allreduce".into(), "alltoall".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not alltoall"), "{e}");
        assert!(
            e.contains("--op allreduce") && e.contains("--library mpi"),
            "{e}"
        );
    }

    #[test]
    fn summary_round_trips_and_refuses_unknown_fields() {
        let run = Run {
            variant: "xroce-sr".into(),
            library: "gloo".into(),
            transport: "xroce".into(),
            recovery: Some("sr".into()),
            cc: Some("none".into()),
            loss: 0.01,
            steps: vec![results::Step {
                op: "allreduce".into(),
                bytes: 65536,
                iter: 0,
                rank: 0,
                gap_s: 0.005,
                coll_s: 0.001,
            }],
            frames: 100,
            dropped: 1,
            background: Some(background::Figure {
                flows: 3,
                bytes: 3000,
                verified: 3,
                slowdown_p50: Some(1.5),
                slowdown_p99: Some(4.0),
                seconds: 0.5,
                errors: vec![],
            }),
        };
        let summary = Summary {
            experiment: "collective".into(),
            settings: Settings {
                ranks: 2,
                ops: vec!["allreduce".into()],
                sizes: vec![65536],
                iters: 1,
                warmup: 1,
                compute_gap_s: 0.005,
                jitter: 0.1,
                seed: 1,
                transports: vec!["xroce".into()],
                library: "gloo".into(),
                recovery: "auto".into(),
                compare: vec!["recovery".into()],
                variants: vec!["xroce-gbn".into(), "xroce-sr".into()],
                loss: Some(0.01),
                loss_on: "all".into(),
                cc: "none".into(),
                cc_params: Some(CcParams {
                    dcqcn: "software".into(),
                    swift: "software".into(),
                    timely: "software,t_low=300us".into(),
                }),
                mtu: 1500,
                background: background::plan(
                    "incast",
                    "websearch",
                    2,
                    0.3,
                    1_000_000_000,
                    2,
                    1.0,
                    1,
                )
                .unwrap()
                .map(|b| b.settings),
            },
            jobs: vec![JobFigure::from(&run)],
            figures: results::figures(std::slice::from_ref(&run), 2),
            errors: vec![],
        };
        let text = serde_json::to_string(&summary).unwrap();
        assert_eq!(serde_json::from_str::<Summary>(&text).unwrap(), summary);
        assert!(text.contains(r#""library":"gloo""#) && text.contains(r#""variant":"xroce-sr""#));
        let extra = text.replacen(r#""library":"gloo""#, r#""library":"gloo","nccl":1"#, 1);
        assert!(serde_json::from_str::<Summary>(&extra).is_err());
        assert!(text.contains(r#""kind":"incast""#) && text.contains(r#""verified":3"#));
        for (field, with) in [
            (r#""kind":"incast""#, r#""kind":"incast","x":1"#),
            (r#""verified":3"#, r#""verified":3,"x":1"#),
        ] {
            let extra = text.replacen(field, with, 1);
            assert!(serde_json::from_str::<Summary>(&extra).is_err(), "{with}");
        }

        let dir = std::env::temp_dir().join(format!("xroce-coll-iter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("iterations.csv");
        results::write_iterations(&path, &[run]).unwrap();
        let csv = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some("library,variant,transport,loss,op,bytes,iter,rank,gap_s,coll_s,wait_fraction,jct_s")
        );
        assert!(lines
            .next()
            .unwrap()
            .starts_with("gloo,xroce-sr,xroce,0.01,allreduce,65536,0,0,"));
    }
}
