//! What a collective experiment measured: the program's rows (one per rank
//! and iteration; collective_step.c and collective_step_gloo.cc write the
//! same CSV), iterations.csv, and summary.json's figures (JCT
//! quantiles, nccl-tests' algorithm and bus bandwidth, the fraction of
//! time ranks wait, the slowdown against the lossless run).

use std::{io::Write, path::Path};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::experiment::workload::percentile;

/// One rank's iteration, as the programs write it.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub op: String,
    /// The size as nccl-tests counts it, rounded to whole elements per rank.
    pub bytes: u64,
    pub iter: usize,
    pub rank: usize,
    /// Time between the rank's previous collective and this one.
    pub gap_s: f64,
    /// Time inside the collective call.
    pub coll_s: f64,
}

impl Step {
    /// The share of the step the rank spent waiting in the collective.
    pub fn wait_fraction(&self) -> f64 {
        let total = self.gap_s + self.coll_s;
        if total > 0.0 {
            self.coll_s / total
        } else {
            0.0
        }
    }
}

/// Parses the program's CSV (`op,bytes,iter,rank,gap_s,coll_s`).
pub fn parse_steps(text: &str) -> anyhow::Result<Vec<Step>> {
    let mut lines = text.lines();
    if lines.next() != Some("op,bytes,iter,rank,gap_s,coll_s") {
        bail!("the program's output has no header");
    }
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            if f.len() != 6 {
                bail!("bad row {l:?}");
            }
            Ok(Step {
                op: f[0].to_string(),
                bytes: f[1].parse().with_context(|| format!("bytes in {l:?}"))?,
                iter: f[2].parse().with_context(|| format!("iter in {l:?}"))?,
                rank: f[3].parse().with_context(|| format!("rank in {l:?}"))?,
                gap_s: f[4].parse().with_context(|| format!("gap_s in {l:?}"))?,
                coll_s: f[5].parse().with_context(|| format!("coll_s in {l:?}"))?,
            })
        })
        .collect()
}

/// One job's rows: its variant, library, transport and loss, every
/// rank's iterations, and what the ranks' ingress counted.
pub struct Run {
    /// The variant's name ("xroce", "tcp", "xroce-sr", "xroce-dcqcn", ...).
    pub variant: String,
    /// "mpi" or "gloo".
    pub library: String,
    pub transport: String,
    /// Over xroce: --recovery ("gbn", "sr", "auto"); null over TCP.
    pub recovery: Option<String>,
    /// Over xroce: the congestion controller; null over TCP.
    pub cc: Option<String>,
    pub loss: f64,
    pub steps: Vec<Step>,
    /// RoCEv2 frames (xroce) or TCP packets from other ranks (TCP, counted
    /// only while loss is on) the ranks received, the dropped ones included.
    pub frames: u64,
    /// Of those, dropped by the loss.
    pub dropped: u64,
    /// What the background did while the job ran (--background).
    pub background: Option<super::background::Figure>,
}

/// One job in summary.json.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobFigure {
    pub variant: String,
    pub library: String,
    pub transport: String,
    /// See [`Run::recovery`].
    pub recovery: Option<String>,
    /// See [`Run::cc`].
    pub cc: Option<String>,
    pub loss: f64,
    /// See [`Run::frames`].
    pub frames: u64,
    pub dropped: u64,
    /// dropped / frames (null when nothing was counted).
    pub dropped_fraction: Option<f64>,
    /// See [`Run::background`].
    pub background: Option<super::background::Figure>,
}

impl From<&Run> for JobFigure {
    fn from(r: &Run) -> Self {
        JobFigure {
            variant: r.variant.clone(),
            library: r.library.clone(),
            transport: r.transport.clone(),
            recovery: r.recovery.clone(),
            cc: r.cc.clone(),
            loss: r.loss,
            frames: r.frames,
            dropped: r.dropped,
            dropped_fraction: (r.frames > 0).then(|| r.dropped as f64 / r.frames as f64),
            background: r.background.clone(),
        }
    }
}

/// The iteration's JCT: the slowest rank's time in the collective.
fn jct(steps: &[Step], op: &str, bytes: u64, iter: usize) -> f64 {
    steps
        .iter()
        .filter(|s| s.op == op && s.bytes == bytes && s.iter == iter)
        .map(|s| s.coll_s)
        .fold(0.0, f64::max)
}

/// iterations.csv: one row per rank and iteration of every run, with the
/// iteration's JCT on each.
pub fn write_iterations(path: &Path, runs: &[Run]) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
    );
    writeln!(
        f,
        "library,variant,transport,loss,op,bytes,iter,rank,gap_s,coll_s,wait_fraction,jct_s"
    )?;
    for run in runs {
        for s in &run.steps {
            writeln!(
                f,
                "{},{},{},{},{},{},{},{},{:.9},{:.9},{:.6},{:.9}",
                run.library,
                run.variant,
                run.transport,
                run.loss,
                s.op,
                s.bytes,
                s.iter,
                s.rank,
                s.gap_s,
                s.coll_s,
                s.wait_fraction(),
                jct(&run.steps, &s.op, s.bytes, s.iter)
            )?;
        }
    }
    f.flush()
        .with_context(|| format!("write {}", path.display()))
}

/// One variant, loss rate, op and size over its iterations.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Figure {
    pub variant: String,
    pub library: String,
    pub transport: String,
    pub loss: f64,
    pub op: String,
    pub bytes: u64,
    pub iters: usize,
    /// JCT per iteration, in order (seconds).
    pub jct_s: Vec<f64>,
    pub jct_p50_s: f64,
    pub jct_p99_s: f64,
    pub jct_max_s: f64,
    pub jct_mean_s: f64,
    /// bytes / p50 JCT, GB/s (1e9 bytes/s), as nccl-tests' algbw.
    pub algbw_gbyte_s: f64,
    /// algbw × nccl-tests' factor for the op and rank count.
    pub busbw_gbyte_s: f64,
    /// Mean over ranks and iterations of the share of a step spent in the
    /// collective.
    pub wait_fraction: f64,
    /// p50 and p99 JCT over those of the lossless run of the same
    /// variant, op and size (null for the lossless run, or without one).
    pub slowdown_p50: Option<f64>,
    pub slowdown_p99: Option<f64>,
}

/// nccl-tests' bus bandwidth factor: what each rank's link must carry
/// relative to the algorithm bandwidth.
pub fn busbw_factor(op: &str, ranks: usize) -> f64 {
    let n = ranks as f64;
    match op {
        "allreduce" => 2.0 * (n - 1.0) / n,
        _ => (n - 1.0) / n,
    }
}

/// The figures of every run, op and size, in run order; slowdowns against
/// the lossless run of the same variant, op and size.
pub fn figures(runs: &[Run], ranks: usize) -> Vec<Figure> {
    let mut out: Vec<Figure> = Vec::new();
    for run in runs {
        let mut cases: Vec<(String, u64)> = Vec::new();
        for s in &run.steps {
            if !cases.iter().any(|(op, b)| *op == s.op && *b == s.bytes) {
                cases.push((s.op.clone(), s.bytes));
            }
        }
        for (op, bytes) in cases {
            let iters = run
                .steps
                .iter()
                .filter(|s| s.op == op && s.bytes == bytes)
                .map(|s| s.iter + 1)
                .max()
                .unwrap_or(0);
            let jcts: Vec<f64> = (0..iters).map(|i| jct(&run.steps, &op, bytes, i)).collect();
            let mut sorted = jcts.clone();
            sorted.sort_by(f64::total_cmp);
            let p50 = percentile(&sorted, 0.5).unwrap_or(0.0);
            let waits: Vec<f64> = run
                .steps
                .iter()
                .filter(|s| s.op == op && s.bytes == bytes)
                .map(Step::wait_fraction)
                .collect();
            let algbw = if p50 > 0.0 {
                bytes as f64 / p50 / 1e9
            } else {
                0.0
            };
            out.push(Figure {
                variant: run.variant.clone(),
                library: run.library.clone(),
                transport: run.transport.clone(),
                loss: run.loss,
                busbw_gbyte_s: algbw * busbw_factor(&op, ranks),
                op,
                bytes,
                iters,
                jct_p50_s: p50,
                jct_p99_s: percentile(&sorted, 0.99).unwrap_or(0.0),
                jct_max_s: sorted.last().copied().unwrap_or(0.0),
                jct_mean_s: jcts.iter().sum::<f64>() / jcts.len().max(1) as f64,
                jct_s: jcts,
                algbw_gbyte_s: algbw,
                wait_fraction: waits.iter().sum::<f64>() / waits.len().max(1) as f64,
                slowdown_p50: None,
                slowdown_p99: None,
            });
        }
    }
    let lossless: Vec<Figure> = out.iter().filter(|f| f.loss == 0.0).cloned().collect();
    for f in out.iter_mut().filter(|f| f.loss > 0.0) {
        if let Some(base) = lossless
            .iter()
            .find(|b| b.variant == f.variant && b.op == f.op && b.bytes == f.bytes)
        {
            f.slowdown_p50 = Some(f.jct_p50_s / base.jct_p50_s);
            f.slowdown_p99 = Some(f.jct_p99_s / base.jct_p99_s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(op: &str, iter: usize, rank: usize, gap_s: f64, coll_s: f64) -> Step {
        Step {
            op: op.into(),
            bytes: 1000,
            iter,
            rank,
            gap_s,
            coll_s,
        }
    }

    #[test]
    fn program_rows_parse() {
        let text = "op,bytes,iter,rank,gap_s,coll_s\nallreduce,65536,0,1,0.005,0.002\n";
        assert_eq!(
            parse_steps(text).unwrap(),
            [Step {
                op: "allreduce".into(),
                bytes: 65536,
                iter: 0,
                rank: 1,
                gap_s: 0.005,
                coll_s: 0.002
            }]
        );
        assert!(parse_steps("allreduce,1,0,0,1,1\n").is_err());
        assert!(parse_steps("op,bytes,iter,rank,gap_s,coll_s\nallreduce,1\n").is_err());
    }

    #[test]
    fn jct_is_the_slowest_rank_and_bandwidths_follow_nccl_tests() {
        let run = |loss: f64, scale: f64| Run {
            variant: "xroce".into(),
            library: "mpi".into(),
            transport: "xroce".into(),
            recovery: Some("auto".into()),
            cc: Some("none".into()),
            loss,
            frames: 0,
            dropped: 0,
            background: None,
            steps: vec![
                step("allreduce", 0, 0, 0.003, 0.001 * scale),
                step("allreduce", 0, 1, 0.001, 0.003 * scale),
                step("allreduce", 1, 0, 0.002, 0.002 * scale),
                step("allreduce", 1, 1, 0.002, 0.002 * scale),
            ],
        };
        let f = figures(&[run(0.0, 1.0), run(0.01, 2.0)], 2);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].jct_s, [0.003, 0.002]);
        assert_eq!((f[0].jct_p50_s, f[0].jct_max_s), (0.002, 0.003));
        assert!((f[0].algbw_gbyte_s - 1000.0 / 0.002 / 1e9).abs() < 1e-12);
        // allreduce: 2(n-1)/n, 1 for two ranks.
        assert!((f[0].busbw_gbyte_s - f[0].algbw_gbyte_s).abs() < 1e-12);
        assert!((f[0].wait_fraction - (0.25 + 0.75 + 0.5 + 0.5) / 4.0).abs() < 1e-12);
        assert_eq!(f[0].slowdown_p50, None);
        assert!((f[1].slowdown_p50.unwrap() - 2.0).abs() < 1e-12);
        assert!((busbw_factor("alltoall", 4) - 0.75).abs() < 1e-12);
        assert!((busbw_factor("allreduce", 4) - 1.5).abs() < 1e-12);
    }
}
