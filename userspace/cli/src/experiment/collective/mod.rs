//! `xroce experiment collective`: the job completion time (JCT) of MPI
//! collectives in a training-step model, over xroce and over TCP, with
//! Debian's unmodified Open MPI (and UCX). N ranks, one namespace each, on
//! the lab's bridge (topology.rs); mpirun on the bridge as the head node
//! (job.rs). Every rank runs collective_step.c: per iteration a compute
//! gap from the seeded schedule (schedule.rs), then the collective, every
//! element checked. With `--loss`, a lossless run of each transport comes
//! first as the baseline, then the lossy one (network.rs).
//!
//! Files in `--out`:
//! - iterations.csv: `transport,loss,op,bytes,iter,rank,gap_s,coll_s,
//!   wait_fraction,jct_s`, one row per rank and iteration of every run;
//!   jct_s is the iteration's slowest rank's time in the collective.
//! - summary.json: the settings, then per transport, loss, op and size the
//!   JCT per iteration, p50, p99, max and mean; nccl-tests' algorithm and
//!   bus bandwidth at the p50; the fraction of time ranks wait; the
//!   slowdown against the lossless run.
//! - jct.svg: JCT per iteration, one line per run, op and size.
//! - schedule.csv: every rank's compute gap per iteration (`iter,rank,
//!   gap_us`); runs/<transport>-loss<p>/: each job's launch agent,
//!   hostfile, the program's own CSV and mpirun.log; work/: the program.

mod job;
mod network;
mod plot;
mod results;
mod schedule;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use xroce::cc::CcKind;

use self::{
    job::{Job, Transport},
    network::LossOn,
    results::{Figure, JobFigure, Run},
};
use super::{procs, topology, topology::Topology};
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
    /// xroce (Open MPI's pml ucx over xroce), tcp (pml ob1, btl tcp) or both
    #[arg(long, default_value = "both", value_parser = ["xroce", "tcp", "both"])]
    pub transport: String,
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
    /// --loss (null: lossless runs only).
    pub loss: Option<f64>,
    /// "all" or "rank:I".
    pub loss_on: String,
    pub cc: String,
    pub mtu: u32,
}

pub fn collective(a: &CollectiveArgs) -> anyhow::Result<()> {
    let transports = check(a)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("create {}", a.out.display()))?;
    procs::install_signal_handlers();
    topology::sweep_stale();
    let exe = super::xroce_bin()?;
    let work = a.out.join("work");
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    let program = job::build_program(&work)?;
    let gaps = schedule::gaps(a.seed, a.ranks, a.iters, a.compute_gap.value, a.jitter);
    let schedule_path = a.out.join("schedule.csv");
    schedule::write(&schedule_path, &gaps)?;
    eprintln!(
        "xroce: {} of {} over {} ranks, {} iterations after a {} gap (±{}%), over {}{}; output in {}",
        a.op.join(", "),
        a.sizes.iter().map(Size::text).collect::<Vec<_>>().join(", "),
        a.ranks,
        a.iters,
        a.compute_gap,
        a.jitter * 100.0,
        transports.iter().map(|t| t.name()).collect::<Vec<_>>().join(" and "),
        a.loss
            .as_ref()
            .map(|l| format!(" without loss and at {l} loss on {}", loss_on_text(&a.loss_on)))
            .unwrap_or_default(),
        a.out.display()
    );
    let topo = Topology::ranks(a.ranks, a.mtu).context("build the namespaces")?;
    let setup = Setup {
        a,
        topo: &topo,
        exe: &exe,
        program: &program,
        schedule: &schedule_path,
    };
    let result = setup.run_all(&transports);
    drop(topo);
    result
}

/// Checked flags; the transports to run, in order.
fn check(a: &CollectiveArgs) -> anyhow::Result<Vec<Transport>> {
    if !(2..=topology::MAX_RANKS).contains(&a.ranks) {
        bail!("--ranks must be 2..={}", topology::MAX_RANKS);
    }
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
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("an experiment makes network namespaces and attaches XDP: run it as root (sudo)");
    }
    for tool in ["ip", "nsenter", "unshare"] {
        if std::process::Command::new(tool).arg("-V").output().is_err() {
            bail!("`{tool}` is missing; install iproute2 and util-linux (`cargo xtask setup`)");
        }
    }
    job::check_tools()?;
    let transports = match a.transport.as_str() {
        "xroce" => vec![Transport::Xroce],
        "tcp" => vec![Transport::Tcp],
        _ => vec![Transport::Xroce, Transport::Tcp],
    };
    if a.loss.is_some() && transports.contains(&Transport::Tcp) {
        network::check_iptables()?;
    }
    Ok(transports)
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
    topo: &'a Topology,
    exe: &'a Path,
    program: &'a Path,
    schedule: &'a Path,
}

impl Setup<'_> {
    /// Every job (each transport, lossless then lossy), then the outputs;
    /// after a failed job the outputs hold the jobs before it.
    fn run_all(&self, transports: &[Transport]) -> anyhow::Result<()> {
        let a = self.a;
        let losses: Vec<Option<&Fraction>> = std::iter::once(None)
            .chain(a.loss.as_ref().map(Some))
            .collect();
        let per_job = (a.op.len() * a.sizes.len() * a.iters) as u64;
        let bar = progress_bar(per_job * (transports.len() * losses.len()) as u64);
        let mut runs = Vec::new();
        let mut errors = Vec::new();
        'jobs: for &transport in transports {
            for &loss in &losses {
                bar.set_message(format!(
                    "{} at {} loss",
                    transport.name(),
                    loss.map_or("no".to_string(), |l| l.to_string())
                ));
                match self.job(transport, loss, &bar) {
                    Ok(run) => runs.push(run),
                    Err(e) => {
                        errors.push(format!("{:#}", e));
                        break 'jobs;
                    }
                }
            }
        }
        bar.finish_and_clear();
        let figures = results::figures(&runs, a.ranks);
        self.write(&runs, &figures, &errors)?;
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

    /// One job: the interfaces set up for it, mpirun, its rows checked.
    fn job(
        &self,
        transport: Transport,
        loss: Option<&Fraction>,
        bar: &ProgressBar,
    ) -> anyhow::Result<Run> {
        let a = self.a;
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
            .join(format!("{}-loss{loss_value}", transport.name()));
        let sizes: Vec<u64> = a.sizes.iter().map(|s| s.value).collect();
        let job = Job {
            topo: self.topo,
            xroce: self.exe,
            program: self.program,
            schedule: self.schedule,
            transport,
            cc: a.cc,
            ops: &a.op,
            sizes: &sizes,
            iters: a.iters,
            warmup: a.warmup,
            dir: &dir,
            stall: Duration::from_secs_f64(a.stall_timeout.value),
        };
        let before = network::counts(&self.topo.hosts, transport)?;
        let finished = job.run(&mut |n| bar.inc(n))?;
        let after = network::counts(&self.topo.hosts, transport)?;
        let steps = results::parse_steps(&finished.steps)
            .with_context(|| format!("read {}", job.steps_path().display()))?;
        let want = a.op.len() * a.sizes.len() * a.iters * a.ranks;
        if steps.len() != want {
            bail!(
                "{} has {} rows, not {want} (ops × sizes × iterations × ranks)",
                job.steps_path().display(),
                steps.len()
            );
        }
        Ok(Run {
            transport: transport.name().to_string(),
            loss: loss_value,
            steps,
            frames: after.frames.saturating_sub(before.frames),
            dropped: after.dropped.saturating_sub(before.dropped),
        })
    }

    fn write(&self, runs: &[Run], figures: &[Figure], errors: &[String]) -> anyhow::Result<()> {
        let a = self.a;
        results::write_iterations(&a.out.join("iterations.csv"), runs)?;
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
                transports: match a.transport.as_str() {
                    "both" => vec!["xroce".into(), "tcp".into()],
                    t => vec![t.to_string()],
                },
                loss: a.loss.as_ref().map(as_given),
                loss_on: loss_on_text(&a.loss_on),
                cc: a.cc.name().to_string(),
                mtu: a.mtu,
            },
            jobs: runs.iter().map(JobFigure::from).collect(),
            figures: figures.to_vec(),
            errors: errors.to_vec(),
        };
        let path = a.out.join("summary.json");
        std::fs::write(&path, serde_json::to_string_pretty(&summary)? + "\n")
            .with_context(|| format!("write {}", path.display()))?;
        if !figures.is_empty() {
            let title = format!("{} ranks: JCT per iteration", a.ranks);
            if let Err(e) = plot::jct(&a.out.join("jct.svg"), &title, figures) {
                eprintln!("xroce: jct.svg not drawn: {e:#}");
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
            r.transport, r.loss, r.frames, r.dropped
        );
    }
    eprintln!(
        "{:<6} {:>6} {:<14} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6} {:>9}",
        "trans",
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
            "{:<6} {:>6} {:<14} {:>10} {:>10.3} {:>10.3} {:>10.3} {:>8.1} {:>8.1} {:>6.2} {:>9}",
            f.transport,
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
