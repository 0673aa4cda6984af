//! `--background incast|load`: the workload generator's xroce flows
//! (experiment/traffic) running while each job runs, from its start to its
//! end, every job the same flows (drawn once from `--seed`).
//!
//! Senders: `--background-senders` hosts `b0`, `b1`, ... beside the ranks
//! on the bridge, each a `workload-sender` (AF_XDP, the variant's
//! congestion control, paced from `--background-rate`). Receivers: in the
//! ranks' namespaces, on the ranks' interfaces, so the flows share the
//! ranks' links: `incast` sends bursts (one flow from every sender at the
//! same instant) to rank 0; `load` sends Poisson flows from random senders
//! to random ranks. Each rank's `workload-receiver` runs on the kernel's
//! UDP sockets (`--backend udp`): beside the rank's own xroce process,
//! which then owns the AF_XDP sockets as it does without a background,
//! and over the TCP variant (no XDP program on the ranks) alike.
//!
//! At the job's end the stop file tells the senders to start no more
//! flows; they wait for the acknowledgements of those started (for as long
//! as flows keep completing, up to --stall-timeout without one), and the
//! receivers check every one. The processes are killed when a [`Running`]
//! drops (a failed rank, a stall, a signal).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use xroce::cc::CcKind;

use crate::experiment::{
    procs::{self, Proc},
    sampler::monotonic_ns,
    topology::{Host, Topology},
    traffic::{
        cdf::Cdf,
        flows::{self, Flow},
        node,
    },
    workload,
};

pub const KINDS: [&str; 3] = ["none", "incast", "load"];
/// Where the receivers take the senders' connections.
const PORT: u16 = 18611;
/// QPs per sender-receiver pair.
const QPS: usize = 4;
/// Arena per pair (raised by the sender to its largest flow).
const ARENA: u64 = 4 << 20;
/// Most senders beside the ranks.
pub const MAX_SENDERS: usize = 8;
/// The defaults of --background-cdf, -senders, -load and -rate.
pub const DEFAULT_CDF: &str = "websearch";
pub const DEFAULT_SENDERS: usize = 2;
pub const DEFAULT_LOAD: f64 = 0.3;
pub const DEFAULT_RATE_BPS: u64 = 1_000_000_000;

/// The background's settings in summary.json.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// "incast" or "load".
    pub kind: String,
    pub cdf: String,
    pub cdf_mean_bytes: f64,
    pub senders: usize,
    /// The ranks whose namespaces receive.
    pub receivers: Vec<usize>,
    /// Offered load as a fraction of the receivers' links at `rate_bps`.
    pub load: f64,
    pub rate_bps: u64,
    /// The flows drawn, over this span from a job's start (a job that runs
    /// longer has no background after it).
    pub flows: usize,
    pub span_s: f64,
}

/// What the background did during one job (summary.json's jobs).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Figure {
    /// Flows started and acknowledged while the job ran.
    pub flows: usize,
    pub bytes: u64,
    /// Of those, the flows whose every byte the receiver checked.
    pub verified: usize,
    /// FCT over the ideal (the flow alone at --background-rate after the
    /// base RTT), p50 and p99.
    pub slowdown_p50: Option<f64>,
    pub slowdown_p99: Option<f64>,
    /// From the background's start to its stop.
    pub seconds: f64,
    /// Background processes that failed, flows whose data check failed
    /// (also in summary.json's errors; the job's own results stand).
    pub errors: Vec<String>,
}

/// The background drawn for every job.
pub struct Plan {
    pub settings: Settings,
    schedule: Vec<Flow>,
    /// Of the flows' data pattern.
    seed: u64,
}

/// Checks the flags and draws the flows; None for `none`.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    kind: &str,
    cdf: &str,
    senders: usize,
    load: f64,
    rate_bps: u64,
    ranks: usize,
    span_s: f64,
    seed: u64,
) -> anyhow::Result<Option<Plan>> {
    if kind == "none" {
        return Ok(None);
    }
    if !KINDS.contains(&kind) {
        bail!("--background {kind:?}: use none, incast or load");
    }
    if !(1..=MAX_SENDERS).contains(&senders) {
        bail!("--background-senders must be 1..={MAX_SENDERS}, not {senders}");
    }
    if !(load > 0.0 && load <= 1.0) {
        bail!("--background-load must be in (0, 1], not {load}");
    }
    let cdf = Cdf::load(cdf).context("--background-cdf (websearch, hadoop or a CDF file)")?;
    let receivers: Vec<usize> = match kind {
        "incast" => vec![0],
        _ => (0..ranks).collect(),
    };
    let spec = flows::Spec {
        cdf: &cdf,
        senders,
        receivers: receivers.len(),
        load,
        link_rate_bps: rate_bps,
        seed,
        length: flows::Length::Seconds(span_s),
    };
    let schedule = match kind {
        "incast" => spec.bursts(),
        _ => spec.generate(),
    }
    .context("draw the background's flows (lower --background-load or --stall-timeout)")?;
    Ok(Some(Plan {
        settings: Settings {
            kind: kind.into(),
            cdf: cdf.name.clone(),
            cdf_mean_bytes: cdf.mean(),
            senders,
            receivers,
            load,
            rate_bps,
            flows: schedule.len(),
            span_s,
        },
        schedule,
        seed,
    }))
}

/// A node process and its log.
type Node = (Proc, PathBuf);

/// The background of one job, running; its processes are killed on drop.
pub struct Running {
    dir: PathBuf,
    rate_bps: u64,
    schedule: Vec<Flow>,
    senders: Vec<Node>,
    receivers: Vec<Node>,
    started: Instant,
}

impl Plan {
    /// A short description for the header line.
    pub fn text(&self) -> String {
        let s = &self.settings;
        format!(
            "{} background ({}, load {} of {} Mbit/s, {} senders to rank{} {})",
            s.kind,
            s.cdf,
            s.load,
            s.rate_bps as f64 / 1e6,
            s.senders,
            if s.receivers.len() > 1 { "s" } else { "" },
            s.receivers
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )
    }

    /// Starts the receivers in the ranks' namespaces, then the senders on
    /// the hosts beside them, and their flows once all are connected.
    pub fn start(
        &self,
        exe: &Path,
        topo: &Topology,
        cc: CcKind,
        cc_params: &crate::experiment::cc_params::CcParams,
        dir: &Path,
    ) -> anyhow::Result<Running> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let schedule_path = dir.join("schedule.csv");
        flows::write_schedule(&schedule_path, &self.schedule)?;
        let s = &self.settings;
        let mut running = Running {
            dir: dir.to_path_buf(),
            rate_bps: s.rate_bps,
            schedule: self.schedule.clone(),
            senders: Vec::new(),
            receivers: Vec::new(),
            started: Instant::now(),
        };
        let node_args = |cmd: &mut std::process::Command, host: &Host, index: usize| {
            cmd.args(["--iface", &host.iface, "--index", &index.to_string()])
                .arg("--schedule")
                .arg(&schedule_path)
                .arg("--out")
                .arg(dir)
                .args(["--seed", &self.seed.to_string()])
                .args(["--cc", cc.name()])
                .args(["--rate-bps", &s.rate_bps.to_string()])
                .envs(cc_params.envs());
        };
        let mut listen = Vec::new();
        for (j, &rank) in s.receivers.iter().enumerate() {
            let host = &topo.hosts[rank];
            let addr = format!("{}:{PORT}", host.addr);
            let mut cmd = host.command(exe);
            cmd.args(["experiment", "workload-receiver", "--listen", &addr])
                .args(["--peers", &s.senders.to_string(), "--backend", "udp"]);
            node_args(&mut cmd, host, j);
            let log = dir.join(format!("receiver{j}.log"));
            let name = format!("background receiver {j}");
            running
                .receivers
                .push((Proc::spawn(&name, cmd, &log)?, log));
            listen.push(addr);
        }
        running.wait_listening()?;
        for (i, host) in topo.others.iter().take(s.senders).enumerate() {
            let iface = host.iface.clone();
            if !crate::experiment::in_netns(&host.netns, move || xroce::xdp::is_attached(&iface))? {
                crate::experiment::attach(exe, host)?;
            }
            let mut cmd = host.command(exe);
            cmd.args(["experiment", "workload-sender", "--receivers"])
                .arg(listen.join(","))
                .args(["--qps", &QPS.to_string(), "--arena", &ARENA.to_string()]);
            node_args(&mut cmd, host, i);
            let log = dir.join(format!("sender{i}.log"));
            let name = format!("background sender {i}");
            running.senders.push((Proc::spawn(&name, cmd, &log)?, log));
        }
        running.wait_ready()?;
        let t0_ns = monotonic_ns() + 20_000_000;
        let tmp = dir.join("start.tmp");
        std::fs::write(&tmp, t0_ns.to_string())?;
        std::fs::rename(&tmp, node::start_file(dir))?;
        running.started = Instant::now() + Duration::from_millis(20);
        Ok(running)
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

impl Running {
    /// Every process still running, or the first one that exited.
    fn check_alive(&mut self, what: &str) -> anyhow::Result<()> {
        for (p, log) in self.senders.iter_mut().chain(self.receivers.iter_mut()) {
            if let Some(status) = p.poll() {
                bail!(
                    "a background process exited ({status}) {what}: {}",
                    tail(log)
                );
            }
        }
        if procs::stop_requested() {
            bail!("interrupted");
        }
        Ok(())
    }

    fn wait_listening(&mut self) -> anyhow::Result<()> {
        let by = Instant::now() + Duration::from_secs(20);
        for k in 0..self.receivers.len() {
            while !procs::listening(self.receivers[k].0.pid(), PORT) {
                self.check_alive("before listening")?;
                if Instant::now() > by {
                    bail!("a background receiver did not listen within 20 s");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let by = Instant::now() + Duration::from_secs(60);
        let n = self.senders.len();
        while (0..n).any(|i| !node::ready_file(&self.dir, i).exists()) {
            self.check_alive("while connecting")?;
            if Instant::now() > by {
                bail!("the background senders were not ready within 60 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Stops the flows (the stop file) and waits for the processes to end
    /// while the flows started still complete (killed once nothing
    /// completed for `stall`); reads what they did. Errors: every process
    /// that failed and every flow whose data check failed.
    pub fn finish(mut self, stall: Duration) -> anyhow::Result<Figure> {
        let seconds = self.started.elapsed().as_secs_f64();
        let mut errors = Vec::new();
        std::fs::write(node::stop_file(&self.dir), b"")?;
        let mut last = (self.progress(), Instant::now());
        loop {
            let running: usize = self
                .senders
                .iter_mut()
                .chain(self.receivers.iter_mut())
                .map(|(p, _)| usize::from(p.poll().is_none()))
                .sum();
            if running == 0 {
                break;
            }
            if procs::stop_requested() {
                errors.push("interrupted while the background's last flows ran".into());
                break;
            }
            let now = self.progress();
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > stall {
                errors.push(format!(
                    "no background flow completed for {} s after the job: killed",
                    stall.as_secs_f64()
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for (what, nodes) in [
            ("sender", &mut self.senders),
            ("receiver", &mut self.receivers),
        ] {
            for (i, (p, log)) in nodes.iter_mut().enumerate() {
                match p.poll() {
                    Some(s) if s.success() => {}
                    Some(s) => errors.push(format!("background {what} {i} ({s}): {}", tail(log))),
                    None => {
                        p.kill();
                        errors.push(format!("background {what} {i} killed ({})", tail(log)));
                    }
                }
            }
        }
        self.figure(seconds, errors)
    }

    /// Bytes the nodes' CSVs hold: they grow with every flow completed.
    fn progress(&self) -> u64 {
        let len = |p: PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
        (0..self.senders.len())
            .map(|i| len(node::sender_csv(&self.dir, i)))
            .chain((0..self.receivers.len()).map(|j| len(node::receiver_csv(&self.dir, j))))
            .sum()
    }

    fn figure(&self, seconds: f64, errors: Vec<String>) -> anyhow::Result<Figure> {
        let nodes = (self.senders.len(), self.receivers.len());
        let figure = figure(&self.dir, nodes, self.rate_bps, seconds, errors)?;
        if figure.flows > 0
            && self
                .schedule
                .iter()
                .all(|f| f.start_ns as f64 / 1e9 < seconds)
        {
            eprintln!(
                "xroce: the job outlasted the background's schedule ({} flows)",
                self.schedule.len()
            );
        }
        Ok(figure)
    }
}

/// What the `senders` and `receivers` left in `dir`: the senders'
/// acknowledged flows and the receivers' checks, added to `errors`.
fn figure(
    dir: &Path,
    (senders, receivers): (usize, usize),
    rate_bps: u64,
    seconds: f64,
    mut errors: Vec<String>,
) -> anyhow::Result<Figure> {
    let mut slowdowns = Vec::new();
    let (mut flows, mut bytes, mut verified) = (0, 0, 0);
    for i in 0..senders {
        let report: Option<node::SenderReport> = std::fs::read_to_string(node::sender_json(dir, i))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        for r in rows(&node::sender_csv(dir, i), node::SENDER_CSV_HEADER, 8)? {
            let (size, dst) = (r[2], r[1] as usize);
            flows += 1;
            bytes += size;
            if r[7] == 1 {
                verified += 1;
            } else {
                errors.push(format!("background flow {} failed its data check", r[0]));
            }
            let rtt_s = report
                .as_ref()
                .and_then(|rep| rep.base_rtt_ns.get(dst))
                .map_or(0.0, |&ns| ns as f64 / 1e9);
            let fct_s = r[5].saturating_sub(r[3]) as f64 / 1e9;
            let ideal = workload::ideal_fct_s(size, rate_bps, rtt_s);
            slowdowns.push(workload::slowdown(fct_s, ideal));
        }
    }
    for j in 0..receivers {
        for r in rows(&node::receiver_csv(dir, j), node::RECEIVER_CSV_HEADER, 5)? {
            if r[3] != 1 {
                errors.push(format!(
                    "background flow {} failed its data check at the receiver",
                    r[0]
                ));
            }
        }
    }
    errors.truncate(20);
    slowdowns.sort_by(f64::total_cmp);
    Ok(Figure {
        flows,
        bytes,
        verified,
        slowdown_p50: workload::percentile(&slowdowns, 0.5),
        slowdown_p99: workload::percentile(&slowdowns, 0.99),
        seconds,
        errors,
    })
}

/// The rows of a node's CSV (none if it is missing).
fn rows(path: &Path, header: &str, cols: usize) -> anyhow::Result<Vec<Vec<u64>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    let mut lines = text.lines();
    if lines.next().is_some_and(|h| h != header) {
        bail!("{} does not start with {header}", path.display());
    }
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let r: Vec<u64> = l
                .split(',')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .with_context(|| format!("{}: bad row {l:?}", path.display()))?;
            anyhow::ensure!(r.len() == cols, "{}: bad row {l:?}", path.display());
            Ok(r)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figure_counts_acknowledged_flows_and_names_failed_checks() {
        let dir = std::env::temp_dir().join(format!("xroce-bg-figure-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // flow,dst,size_bytes,start_ns,post_ns,done_ns,ack_ns,verified
        let sender = format!(
            "{}\n1,0,1000,0,10,1000000,1000100,1\n2,0,3000,0,10,2000000,2000100,0\n",
            node::SENDER_CSV_HEADER
        );
        std::fs::write(node::sender_csv(&dir, 0), sender).unwrap();
        // flow,src,size_bytes,verified,t_ns
        let receiver = format!(
            "{}\n1,0,1000,1,5\n2,0,3000,0,6\n",
            node::RECEIVER_CSV_HEADER
        );
        std::fs::write(node::receiver_csv(&dir, 0), receiver).unwrap();
        let f = figure(&dir, (1, 1), 1_000_000_000, 0.5, vec![]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((f.flows, f.bytes, f.verified), (2, 4000, 1));
        assert!(f.slowdown_p50.unwrap() >= 1.0 && f.slowdown_p50 <= f.slowdown_p99);
        assert_eq!(
            f.errors,
            [
                "background flow 2 failed its data check",
                "background flow 2 failed its data check at the receiver"
            ]
        );
    }

    #[test]
    fn plans_incast_to_rank_0_and_load_to_every_rank() {
        assert!(plan("none", "websearch", 2, 0.3, 1_000_000_000, 3, 10.0, 1)
            .unwrap()
            .is_none());
        let p = plan("incast", "websearch", 3, 0.3, 1_000_000_000, 3, 10.0, 1)
            .unwrap()
            .unwrap();
        assert_eq!(p.settings.receivers, [0]);
        assert!(p.schedule.iter().all(|f| f.dst == 0));
        assert_eq!(p.settings.flows, p.schedule.len());
        assert!(p.text().starts_with("incast background (websearch"));
        let p = plan("load", "hadoop", 2, 0.5, 1_000_000_000, 3, 10.0, 1)
            .unwrap()
            .unwrap();
        assert_eq!(p.settings.receivers, [0, 1, 2]);
        assert!(p.schedule.iter().any(|f| f.dst == 2));
        let e = |r: anyhow::Result<Option<Plan>>| format!("{:#}", r.err().unwrap());
        let ws = "websearch";
        assert!(e(plan("incast", ws, 0, 0.3, 1, 3, 1.0, 1)).contains("--background-senders"));
        assert!(e(plan("load", ws, 2, 1.5, 1, 3, 1.0, 1)).contains("--background-load"));
        assert!(e(plan("load", "/nonexistent", 2, 0.5, 1, 3, 1.0, 1)).contains("--background-cdf"));
    }
}
