//! Results of an incast: the senders' traces turned into flows.csv, the
//! summary (goodput, Jain's fairness index, queue, marks, CNPs, drops,
//! retransmits, settings) into summary.json.

use std::{io::Write, net::Ipv4Addr, path::Path, process::ExitStatus};

use anyhow::Context;
use serde_json::Value;
use xroce_common::{
    congestion::{EcnConfig, EcnPolicy},
    fault::{FaultConfig, ANY_QPN},
    fixed::fixed_to_fraction,
};
use xroce_report::BenchReport;

use super::{
    sampler::Sample,
    summary::{self, Summary},
    IncastArgs,
};

/// One row of a sender's `--trace` CSV.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TraceRow {
    pub t_ms: f64,
    /// Bytes completed in this bin.
    pub bytes: u64,
    /// The congestion control's rate at the end of the bin.
    pub rate_bps: f64,
    /// Cumulative CNPs received.
    pub cnps: u64,
    /// Cumulative retransmissions.
    pub retransmits: u64,
}

/// Parses `t_ms,bytes,rate_bps,cnps,retransmits` (columns found by name in
/// the header; extra columns are ignored).
pub fn parse_trace(text: &str) -> anyhow::Result<Vec<TraceRow>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .context("empty trace")?
        .split(',')
        .map(str::trim)
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let t = col("t_ms").context("trace has no t_ms column")?;
    let bytes = col("bytes").context("trace has no bytes column")?;
    let (rate, cnps, retx) = (col("rate_bps"), col("cnps"), col("retransmits"));
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let num = |i: Option<usize>| -> anyhow::Result<f64> {
            match i {
                Some(i) => f
                    .get(i)
                    .context("short row")?
                    .parse::<f64>()
                    .with_context(|| format!("trace row {}: {line:?}", n + 2)),
                None => Ok(0.0),
            }
        };
        rows.push(TraceRow {
            t_ms: num(Some(t))?,
            bytes: num(Some(bytes))? as u64,
            rate_bps: num(rate)?,
            cnps: num(cnps)? as u64,
            retransmits: num(retx)? as u64,
        });
    }
    Ok(rows)
}

/// What one sender reported.
#[derive(Debug, Default)]
pub struct FlowResult {
    pub index: usize,
    pub addr: Option<Ipv4Addr>,
    /// When the sender was started, ms after the experiment's t0.
    pub offset_ms: f64,
    pub trace: Vec<TraceRow>,
    /// Its `xroce bench --json` report.
    pub bench: Option<BenchReport>,
    /// Why it did not run or report (an error of the experiment).
    pub error: Option<String>,
}

impl FlowResult {
    pub fn collect(
        index: usize,
        addr: Ipv4Addr,
        status: Option<ExitStatus>,
        stdout: &str,
        trace_path: &Path,
        spawned_ms: f64,
        exited_ms: Option<f64>,
    ) -> Self {
        let mut errors = Vec::new();
        let bench = match serde_json::from_str::<BenchReport>(stdout.trim()) {
            Ok(r) => Some(r),
            Err(_) if stdout.trim().is_empty() => {
                errors.push("no JSON result on stdout".to_string());
                None
            }
            Err(e) => {
                errors.push(format!("bad JSON result on stdout: {e}"));
                None
            }
        };
        // A sender whose QP ran out of retries exits with an error after a
        // full report: a result of the run (what tail drops do to a
        // go-back-N flow without congestion control), not a failure of it.
        let retries_ran_out = bench.as_ref().is_some_and(|b| b.qp_error.is_some());
        match status {
            Some(s) if s.success() || retries_ran_out => {}
            Some(s) => errors.insert(0, format!("exited {s}")),
            None => errors.insert(0, "killed".to_string()),
        }
        let trace = match std::fs::read_to_string(trace_path) {
            Ok(text) => parse_trace(&text).unwrap_or_else(|e| {
                errors.push(format!("bad trace {}: {e:#}", trace_path.display()));
                Vec::new()
            }),
            Err(e) => {
                errors.push(format!("no trace {}: {e}", trace_path.display()));
                Vec::new()
            }
        };
        // The sender's clock starts after its setup (AF_XDP socket, the
        // connection exchange), not at spawn: it ran `seconds` up to about
        // when it exited, which places its trace on the experiment clock.
        let seconds = bench.as_ref().map(|b| b.seconds);
        let offset_ms = match (exited_ms, seconds) {
            (Some(end), Some(s)) if end - s * 1e3 >= spawned_ms => end - s * 1e3,
            _ => spawned_ms,
        };
        Self {
            index,
            addr: Some(addr),
            offset_ms,
            trace,
            bench,
            error: (!errors.is_empty()).then(|| errors.join(", ")),
        }
    }

    /// Average goodput in Gbit/s: the sender's own figure, else its trace.
    pub fn gbps(&self) -> f64 {
        if let Some(b) = &self.bench {
            return b.gbps;
        }
        let bytes: u64 = self.trace.iter().map(|r| r.bytes).sum();
        let span_ms = self.trace.last().map_or(0.0, |r| r.t_ms);
        if span_ms > 0.0 {
            bytes as f64 * 8.0 / (span_ms * 1e6)
        } else {
            0.0
        }
    }

    pub fn cnps(&self) -> u64 {
        self.bench
            .as_ref()
            .map(|b| b.cnps)
            .or_else(|| self.trace.last().map(|r| r.cnps))
            .unwrap_or(0)
    }

    /// Why its QP ended early, if its retries ran out.
    pub fn qp_error(&self) -> Option<&str> {
        self.bench.as_ref()?.qp_error.as_deref()
    }

    pub fn retransmits(&self) -> u64 {
        self.bench
            .as_ref()
            .map(|b| b.retransmits)
            .or_else(|| self.trace.last().map(|r| r.retransmits))
            .unwrap_or(0)
    }

    /// (end of the bin in ms on the experiment clock, goodput Gbit/s, CC
    /// rate Gbit/s) per bin of the trace. A row's `t_ms` is the end of its
    /// bin; bins may run a little over `bin_ms`, so each is divided by its
    /// own width.
    pub fn series(&self, bin_ms: u32) -> Vec<(f64, f64, f64)> {
        let mut prev = 0.0;
        self.trace
            .iter()
            .map(|r| {
                let width = if r.t_ms > prev {
                    r.t_ms - prev
                } else {
                    bin_ms as f64
                };
                prev = r.t_ms;
                (
                    self.offset_ms + r.t_ms,
                    r.bytes as f64 * 8.0 / (width * 1e6),
                    r.rate_bps / 1e9,
                )
            })
            .collect()
    }
}

/// Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal,
/// 1/n when one has everything. 1 for no flows or all zero.
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 {
        1.0
    } else {
        sum * sum / (xs.len() as f64 * sq)
    }
}

/// Start of a run left out of the `after_warmup` queue figures: DCQCN
/// starts every flow at line rate, and the first cuts take a few loop delays.
pub const WARMUP_MS: f64 = 500.0;

/// Window of the short-term fairness index.
pub const SHORT_TERM_WINDOW_MS: f64 = 100.0;

/// Mean over [`SHORT_TERM_WINDOW_MS`] windows of the index across flows,
/// over the time every flow was running (short-term unfairness, which
/// averages over a whole run hide). None if the flows never overlapped.
pub fn jain_short_term(flows: &[FlowResult]) -> Option<f64> {
    let span = |f: &FlowResult| {
        let first = f.trace.first()?;
        let last = f.trace.last()?;
        Some((f.offset_ms, f.offset_ms + last.t_ms.max(first.t_ms)))
    };
    let spans: Vec<(f64, f64)> = flows.iter().map(span).collect::<Option<_>>()?;
    let start = spans.iter().map(|s| s.0).fold(f64::MIN, f64::max);
    let end = spans.iter().map(|s| s.1).fold(f64::MAX, f64::min);
    let windows = ((end - start) / SHORT_TERM_WINDOW_MS).floor();
    if flows.is_empty() || windows < 1.0 {
        return None;
    }
    let windows = windows as usize;
    let mut bytes = vec![vec![0.0f64; flows.len()]; windows];
    for (i, f) in flows.iter().enumerate() {
        for r in &f.trace {
            let k = ((f.offset_ms + r.t_ms - start) / SHORT_TERM_WINDOW_MS).floor();
            if k >= 0.0 && (k as usize) < windows {
                bytes[k as usize][i] += r.bytes as f64;
            }
        }
    }
    Some(bytes.iter().map(|w| jain(w)).sum::<f64>() / windows as f64)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub struct Report<'a> {
    pub args: &'a IncastArgs,
    pub link_rate_bps: u64,
    pub line_rate: &'a str,
    pub dcqcn: &'a xroce::cc::DcqcnConfig,
    pub duration_s: f64,
    pub buffer_bytes: Option<u64>,
    pub ecn: EcnConfig,
    pub fault: FaultConfig,
    pub samples: &'a [Sample],
    /// Taken after every process ended.
    pub final_sample: Sample,
    /// When the last sender ended (ms on the experiment clock).
    pub active_until_ms: f64,
    pub flows: &'a [FlowResult],
    pub receiver: Option<Value>,
    pub errors: &'a [String],
}

impl Report<'_> {
    pub fn aggregate_gbps(&self) -> f64 {
        self.flows.iter().map(FlowResult::gbps).sum()
    }

    pub fn jain(&self) -> f64 {
        jain(&self.flows.iter().map(FlowResult::gbps).collect::<Vec<_>>())
    }

    /// Queue samples while traffic ran (from the first admitted byte),
    /// skipping the first `warmup_ms` of it.
    fn active_queue(&self, warmup_ms: f64) -> Vec<u64> {
        let first = self
            .samples
            .iter()
            .find(|s| s.arrived_bytes > 0)
            .map_or(f64::MAX, |s| s.t_ms);
        self.samples
            .iter()
            .filter(|s| s.t_ms >= first + warmup_ms && s.t_ms <= self.active_until_ms)
            .map(|s| s.queue_bytes)
            .collect()
    }

    /// The sampled queue delay after the warm-up, and the largest sojourn.
    fn queue_delay(&self) -> summary::QueueDelay {
        let first = self
            .samples
            .iter()
            .find(|s| s.arrived_bytes > 0)
            .map_or(f64::MAX, |s| s.t_ms);
        let mut us: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.t_ms >= first + WARMUP_MS && s.t_ms <= self.active_until_ms)
            .map(|s| s.queue_delay_us)
            .collect();
        us.sort_by(f64::total_cmp);
        let at = |p: f64| {
            us.get(((us.len().max(1) - 1) as f64 * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let f = &self.final_sample;
        let peak_us = if self.args.bottleneck == "delay" {
            f.peak_delay_us
        } else {
            f.peak_bytes as f64 * 8e6 / self.link_rate_bps.max(1) as f64
        };
        summary::QueueDelay {
            peak_us,
            mean_us: if us.is_empty() {
                0.0
            } else {
                us.iter().sum::<f64>() / us.len() as f64
            },
            p50_us: at(0.5),
            p99_us: at(0.99),
            samples: us.len(),
        }
    }

    /// Peak, mean, median and 99th percentile of the sampled queue.
    fn queue_stats(&self, warmup_ms: f64) -> summary::QueueStats {
        let mut queue = self.active_queue(warmup_ms);
        let mean = if queue.is_empty() {
            0.0
        } else {
            queue.iter().sum::<u64>() as f64 / queue.len() as f64
        };
        queue.sort_unstable();
        summary::QueueStats {
            peak_bytes: queue.last().copied().unwrap_or(0),
            mean_bytes: mean,
            p50_bytes: percentile(&queue, 0.5),
            p99_bytes: percentile(&queue, 0.99),
            samples: queue.len(),
        }
    }

    pub fn summary(&self) -> Summary {
        let a = self.args;
        let f = &self.final_sample;
        let all = self.queue_stats(0.0);
        let aggregate = self.aggregate_gbps();
        let flows = self
            .flows
            .iter()
            .map(|fl| summary::Flow {
                flow: fl.index,
                addr: fl.addr.map(|a| a.to_string()),
                gbps: fl.gbps(),
                bytes: fl.bench.as_ref().map(|b| b.bytes),
                seconds: fl.bench.as_ref().map(|b| b.seconds),
                cnps: fl.cnps(),
                retransmits: fl.retransmits(),
                min_rate_gbps: fl.trace.iter().map(|r| r.rate_bps / 1e9).reduce(f64::min),
                verified: fl.bench.as_ref().and_then(|b| b.verified),
                error: fl.error.clone(),
                qp_error: fl.qp_error().map(str::to_string),
                bench: fl.bench.clone(),
            })
            .collect();
        let d = self.dcqcn;
        Summary {
            experiment: "incast".into(),
            settings: summary::Settings {
                senders: a.senders,
                cc: a.cc.name().into(),
                link_rate: a.link_rate.text().into(),
                link_rate_bps: self.link_rate_bps,
                line_rate: self.line_rate.into(),
                dcqcn: (a.cc == xroce::cc::CcKind::Dcqcn).then(|| summary::Dcqcn {
                    spec: a.cc_params.dcqcn.clone(),
                    g: d.g,
                    initial_alpha: d.initial_alpha,
                    alpha_timer_ns: d.alpha_timer_ns,
                    rate_increase_timer_ns: d.rate_increase_timer_ns,
                    byte_counter_bytes: d.byte_counter_bytes,
                    fast_recovery_stages: d.fast_recovery_stages,
                    rai_bps: d.rai_bps,
                    rhai_bps: d.rhai_bps,
                    min_rate_bps: d.min_rate_bps,
                    rate_reduce_period_ns: d.rate_reduce_period_ns,
                }),
                timely: (a.cc == xroce::cc::CcKind::Timely).then(|| a.cc_params.timely.clone()),
                swift: (a.cc == xroce::cc::CcKind::Swift).then(|| a.cc_params.swift.clone()),
                delay_target_us: a.cc_params.delay_target_us(a.cc),
                duration_s: self.duration_s,
                size: a.size.text().into(),
                bin_ms: a.bin_ms,
                mtu: a.mtu,
                ecn: summary::Ecn {
                    enabled: self.ecn.enabled != 0,
                    policy: EcnPolicy::from_u32(self.ecn.policy).name().into(),
                    kmin_bytes: self.ecn.kmin,
                    kmax_bytes: self.ecn.kmax,
                    pmax: fixed_to_fraction(self.ecn.pmax_fixed),
                    buffer_bytes: self.buffer_bytes,
                },
                fault: summary::Fault {
                    enabled: self.fault.enabled != 0,
                    drop: fixed_to_fraction(self.fault.drop_fixed),
                    opcode_mask: self.fault.opcode_mask,
                    qpn: (self.fault.qpn != ANY_QPN).then_some(self.fault.qpn),
                    seed: self.fault.seed,
                },
            },
            aggregate_gbps: aggregate,
            link_utilisation: aggregate * 1e9 / self.link_rate_bps as f64,
            jain_index: self.jain(),
            jain_short_term: jain_short_term(self.flows),
            jain_short_term_window_ms: SHORT_TERM_WINDOW_MS,
            queue: summary::Queue {
                peak_bytes: f.peak_bytes,
                sampled_peak_bytes: all.peak_bytes,
                mean_bytes: all.mean_bytes,
                p50_bytes: all.p50_bytes,
                p99_bytes: all.p99_bytes,
                buffer_bytes: self.buffer_bytes,
                arrived_bytes: f.arrived_bytes,
                samples: self.samples.len(),
                after_warmup: self.queue_stats(WARMUP_MS),
                warmup_ms: WARMUP_MS,
                bottleneck: self.args.bottleneck.clone(),
                delay: self.queue_delay(),
            },
            marks: f.marks,
            cnps: self.flows.iter().map(FlowResult::cnps).sum(),
            cnps_seen_at_senders: f.cnps_seen,
            drops: summary::Drops {
                tail: f.drop_tail,
                congestion: f.drop_congestion,
                fault: f.drop_fault,
                total: f.drop_tail + f.drop_congestion + f.drop_fault,
            },
            retransmits: self.flows.iter().map(FlowResult::retransmits).sum(),
            roce_frames_at_receiver: f.roce_frames,
            flows,
            receiver: self.receiver.clone(),
            errors: self.errors.to_vec(),
        }
    }

    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join("flows.csv");
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(&path).with_context(|| format!("create {}", path.display()))?,
        );
        writeln!(out, "t_ms,flow,gbps,cc_rate_gbps")?;
        let mut rows: Vec<(f64, usize, f64, f64)> = self
            .flows
            .iter()
            .flat_map(|f| {
                f.series(self.args.bin_ms)
                    .into_iter()
                    .map(move |(t, g, r)| (t, f.index, g, r))
            })
            .collect();
        rows.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        for (t, flow, g, r) in rows {
            writeln!(out, "{t:.3},{flow},{g:.6},{r:.6}")?;
        }
        out.flush()?;
        let path = dir.join("summary.json");
        let text = serde_json::to_string_pretty(&self.summary())?;
        std::fs::write(&path, text + "\n").with_context(|| format!("write {}", path.display()))
    }

    /// A few lines on stderr.
    pub fn print_brief(&self) {
        let s = self.summary();
        eprintln!(
            "xroce: {} senders, cc {}: aggregate {:.3} Gbit/s ({:.0}% of the link), Jain {:.3}",
            self.args.senders,
            self.args.cc,
            self.aggregate_gbps(),
            s.link_utilisation * 100.0,
            self.jain()
        );
        eprintln!(
            "xroce: queue peak {} B, mean {:.0} B; marks {}, CNPs {}, drops {}, retransmits {}",
            s.queue.peak_bytes, s.queue.mean_bytes, s.marks, s.cnps, s.drops.total, s.retransmits
        );
        for fl in self.flows {
            if let Some(e) = fl.qp_error() {
                eprintln!(
                    "xroce: sender {}'s QP ran out of retries after {:.2} s, its run ended there: {e}",
                    fl.index,
                    fl.bench.as_ref().map_or(0.0, |b| b.seconds)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_by_hand() {
        assert_eq!(jain(&[1.0, 1.0, 1.0, 1.0]), 1.0);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        // (1+2+3)^2 / (3 * (1+4+9)) = 36/42
        assert!((jain(&[1.0, 2.0, 3.0]) - 36.0 / 42.0).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }

    #[test]
    fn short_term_fairness_sees_alternation() {
        // Two flows taking turns every 100 ms: fair on average, not per window.
        let trace = |odd: bool| -> Vec<TraceRow> {
            (1..=10)
                .map(|k| TraceRow {
                    t_ms: k as f64 * 100.0 - 50.0,
                    bytes: if (k % 2 == 1) == odd { 1000 } else { 0 },
                    ..Default::default()
                })
                .collect()
        };
        let flows: Vec<FlowResult> = [true, false]
            .iter()
            .map(|&odd| FlowResult {
                trace: trace(odd),
                ..Default::default()
            })
            .collect();
        assert!((jain_short_term(&flows).unwrap() - 0.5).abs() < 1e-12);
        let even: Vec<f64> = flows.iter().map(FlowResult::gbps).collect();
        assert!((jain(&even) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn trace_columns_by_name() {
        let rows =
            parse_trace("t_ms,bytes,rate_bps,cnps,retransmits\n10,1250,1e9,0,0\n25,2500,5e8,3,1\n")
                .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].bytes, 2500);
        assert_eq!(rows[1].rate_bps, 5e8);
        assert_eq!(rows[1].cnps, 3);
        let flow = FlowResult {
            trace: rows,
            ..Default::default()
        };
        // 1250 B in 10 ms = 1 Mbit/s; 2500 B in the next 15 ms.
        let series = flow.series(10);
        assert!((series[0].1 - 0.001).abs() < 1e-12);
        assert!((series[1].1 - 2500.0 * 8.0 / 15e6).abs() < 1e-12);
        assert_eq!(flow.cnps(), 3);
        assert!(parse_trace("bytes\n1\n").is_err());
    }
}
