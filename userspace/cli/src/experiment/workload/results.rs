//! What a workload run measured: one record per flow (merged from the
//! senders' and receivers' CSVs), the slowdown by flow-size bucket, the
//! queue-length CDF, and the files they go to (flows.csv, summary.json).
//!
//! Slowdown = FCT / ideal FCT, the ideal being the flow alone at the
//! bottleneck's rate: size * 8 / rate + the pair's base RTT (the smallest
//! round trip of a 64-byte WRITE before the run). Headers are not in the
//! ideal (as in the HPCC and DCQCN papers' figures), so a flow alone shows
//! a little above 1 for large sizes.

use std::{collections::HashMap, io::Write, path::Path};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::experiment::traffic::{
    flows::Flow,
    node::{self, SenderReport},
};

/// Flow-size buckets of the slowdown report: [lo, hi) bytes.
pub const BUCKETS: [(u64, u64, &str); 5] = [
    (0, 10_000, "<10KB"),
    (10_000, 100_000, "10KB-100KB"),
    (100_000, 1_000_000, "100KB-1MB"),
    (1_000_000, 10_000_000, "1MB-10MB"),
    (10_000_000, u64::MAX, ">=10MB"),
];

/// Ideal completion time in seconds: alone at `rate_bps` after one base RTT.
pub fn ideal_fct_s(size: u64, rate_bps: u64, base_rtt_s: f64) -> f64 {
    size as f64 * 8.0 / rate_bps as f64 + base_rtt_s
}

pub fn slowdown(fct_s: f64, ideal_s: f64) -> f64 {
    fct_s / ideal_s
}

/// The `p` quantile (0..=1) of `sorted` by nearest rank; None if empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// One flow as measured.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Record {
    pub flow: u32,
    pub src: usize,
    pub dst: usize,
    pub size_bytes: u64,
    /// Scheduled start, ms after the run's start.
    pub start_ms: f64,
    /// From the scheduled start until the WRITE completed at the sender.
    pub fct_us: Option<f64>,
    pub ideal_us: f64,
    pub slowdown: Option<f64>,
    /// size * 8 / FCT.
    pub gbps: Option<f64>,
    /// How long it waited for a QP or arena room before being posted.
    pub post_delay_us: Option<f64>,
    /// Times the receiver saw it (1 when all is well).
    pub deliveries: u32,
    /// The receiver checked every byte and the sender got its ack.
    pub verified: bool,
}

pub const FLOWS_CSV_HEADER: &str = "flow,src,dst,size_bytes,start_ms,fct_us,ideal_us,slowdown,gbps,post_delay_us,deliveries,verified";

impl Record {
    fn csv_row(&self) -> String {
        let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
        format!(
            "{},{},{},{},{:.6},{},{:.3},{},{},{},{},{}",
            self.flow,
            self.src,
            self.dst,
            self.size_bytes,
            self.start_ms,
            opt(self.fct_us),
            self.ideal_us,
            self.slowdown.map_or(String::new(), |v| format!("{v:.4}")),
            self.gbps.map_or(String::new(), |v| format!("{v:.6}")),
            opt(self.post_delay_us),
            self.deliveries,
            self.verified as u8
        )
    }
}

/// One sender row of flows-s<i>.csv.
#[derive(Clone, Copy, Debug)]
struct SenderRow {
    post_ns: u64,
    done_ns: u64,
    verified: bool,
}

fn parse_rows(path: &Path, header: &str, cols: usize) -> anyhow::Result<Vec<Vec<u64>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    let mut lines = text.lines();
    if lines.next().is_some_and(|h| h != header) {
        anyhow::bail!("{} does not start with {header}", path.display());
    }
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<u64> = l
                .split(',')
                .map(|x| x.parse::<u64>())
                .collect::<Result<_, _>>()
                .with_context(|| format!("{}: bad row {l:?}", path.display()))?;
            anyhow::ensure!(f.len() == cols, "{}: bad row {l:?}", path.display());
            Ok(f)
        })
        .collect()
}

/// Rows written so far to the senders' CSVs (the progress bar's count).
pub fn count_done(dir: &Path, senders: usize) -> usize {
    (0..senders)
        .map(|i| {
            std::fs::read_to_string(node::sender_csv(dir, i))
                .map(|t| t.lines().skip(1).filter(|l| !l.is_empty()).count())
                .unwrap_or(0)
        })
        .sum()
}

/// What the processes left in `dir`, merged with the schedule.
pub struct Collected {
    pub records: Vec<Record>,
    pub senders: Vec<Option<SenderReport>>,
    /// Problems found while merging (missing, duplicated, unverified flows).
    pub errors: Vec<String>,
}

pub fn collect(
    dir: &Path,
    schedule: &[Flow],
    senders: usize,
    receivers: usize,
    link_rate_bps: u64,
) -> anyhow::Result<Collected> {
    let mut errors = Vec::new();
    let mut sent: HashMap<u32, SenderRow> = HashMap::new();
    for i in 0..senders {
        for r in parse_rows(&node::sender_csv(dir, i), node::SENDER_CSV_HEADER, 8)? {
            let row = SenderRow {
                post_ns: r[4],
                done_ns: r[5],
                verified: r[7] == 1,
            };
            if sent.insert(r[0] as u32, row).is_some() {
                errors.push(format!("flow {} completed twice at the sender", r[0]));
            }
        }
    }
    let mut delivered: HashMap<u32, (u32, bool)> = HashMap::new();
    for j in 0..receivers {
        for r in parse_rows(&node::receiver_csv(dir, j), node::RECEIVER_CSV_HEADER, 5)? {
            let e = delivered.entry(r[0] as u32).or_insert((0, true));
            e.0 += 1;
            e.1 &= r[3] == 1;
        }
    }
    let reports: Vec<Option<SenderReport>> = (0..senders)
        .map(|i| {
            std::fs::read_to_string(node::sender_json(dir, i))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
        })
        .collect();
    let mut records = Vec::with_capacity(schedule.len());
    for f in schedule {
        let rtt_s = reports
            .get(f.src)
            .and_then(Option::as_ref)
            .and_then(|r| r.base_rtt_ns.get(f.dst))
            .map_or(0.0, |&ns| ns as f64 / 1e9);
        let ideal = ideal_fct_s(f.size, link_rate_bps, rtt_s);
        let (deliveries, rx_ok) = delivered.get(&f.id).copied().unwrap_or((0, false));
        let s = sent.get(&f.id);
        let fct = s.map(|s| s.done_ns.saturating_sub(f.start_ns) as f64 / 1e9);
        let verified = s.is_some_and(|s| s.verified) && rx_ok && deliveries == 1;
        if s.is_none() {
            errors.push(format!("flow {} did not complete", f.id));
        } else if deliveries != 1 {
            errors.push(format!("flow {} arrived {deliveries} times", f.id));
        } else if !verified {
            errors.push(format!("flow {}'s data was not verified", f.id));
        }
        records.push(Record {
            flow: f.id,
            src: f.src,
            dst: f.dst,
            size_bytes: f.size,
            start_ms: f.start_ns as f64 / 1e6,
            fct_us: fct.map(|t| t * 1e6),
            ideal_us: ideal * 1e6,
            slowdown: fct.map(|t| slowdown(t, ideal)),
            gbps: fct
                .filter(|&t| t > 0.0)
                .map(|t| f.size as f64 * 8.0 / t / 1e9),
            post_delay_us: s.map(|s| s.post_ns.saturating_sub(f.start_ns) as f64 / 1e3),
            deliveries,
            verified,
        });
    }
    // Anything the receivers saw that the schedule does not have.
    for id in delivered.keys() {
        if schedule.binary_search_by_key(id, |f| f.id).is_err() {
            errors.push(format!(
                "a receiver got flow {id}, which is not in the schedule"
            ));
        }
    }
    errors.truncate(50);
    Ok(Collected {
        records,
        senders: reports,
        errors,
    })
}

pub fn write_flows_csv(path: &Path, records: &[Record]) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
    );
    writeln!(out, "{FLOWS_CSV_HEADER}")?;
    for r in records {
        writeln!(out, "{}", r.csv_row())?;
    }
    out.flush()
        .with_context(|| format!("write {}", path.display()))
}

/// Slowdown percentiles of one bucket.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Bucket {
    pub bucket: String,
    pub min_bytes: u64,
    /// null: no upper bound.
    pub max_bytes: Option<u64>,
    pub flows: usize,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub mean_fct_us: Option<f64>,
}

/// The slowdown by size bucket, plus "all" over every completed flow.
pub fn buckets(records: &[Record]) -> Vec<Bucket> {
    let make = |label: &str, lo: u64, hi: u64| {
        let mut s: Vec<f64> = records
            .iter()
            .filter(|r| r.size_bytes >= lo && r.size_bytes < hi)
            .filter_map(|r| r.slowdown)
            .collect();
        s.sort_by(f64::total_cmp);
        let fcts: Vec<f64> = records
            .iter()
            .filter(|r| r.size_bytes >= lo && r.size_bytes < hi)
            .filter_map(|r| r.fct_us)
            .collect();
        Bucket {
            bucket: label.to_string(),
            min_bytes: lo,
            max_bytes: (hi != u64::MAX).then_some(hi),
            flows: s.len(),
            p50: percentile(&s, 0.5),
            p95: percentile(&s, 0.95),
            p99: percentile(&s, 0.99),
            mean_fct_us: (!fcts.is_empty()).then(|| fcts.iter().sum::<f64>() / fcts.len() as f64),
        }
    };
    BUCKETS
        .iter()
        .map(|&(lo, hi, label)| make(label, lo, hi))
        .chain(std::iter::once(make("all", 0, u64::MAX)))
        .collect()
}

/// The CDF of `samples` (queue lengths in bytes) at every percent:
/// (bytes, fraction of samples at or below).
pub fn queue_cdf(samples: &[u64]) -> Vec<(u64, f64)> {
    if samples.is_empty() {
        return Vec::new();
    }
    let mut s = samples.to_vec();
    s.sort_unstable();
    let mut out: Vec<(u64, f64)> = (0..=100)
        .map(|p| {
            let i = ((p as f64 / 100.0 * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
            (s[i], p as f64 / 100.0)
        })
        .collect();
    // One point per distinct length: the highest fraction it reaches.
    out.dedup_by(|later, earlier| {
        if later.0 == earlier.0 {
            earlier.1 = later.1;
            true
        } else {
            false
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slowdown_math() {
        // 1 MB at 1 Gbit/s is 8 ms, plus a 20 us base RTT.
        let ideal = ideal_fct_s(1_000_000, 1_000_000_000, 20e-6);
        assert!((ideal - 0.008_020).abs() < 1e-12);
        assert!((slowdown(0.016_040, ideal) - 2.0).abs() < 1e-9);
        // A flow alone at line rate has slowdown 1.
        assert!((slowdown(ideal, ideal) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.95), Some(95.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v, 1.0), Some(100.0));
        assert_eq!(percentile(&[3.0], 0.99), Some(3.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn buckets_split_by_size() {
        let rec = |size: u64, sd: f64| Record {
            size_bytes: size,
            slowdown: Some(sd),
            fct_us: Some(sd * 10.0),
            ..Default::default()
        };
        let records: Vec<Record> = (1..=10)
            .map(|k| rec(5_000, k as f64))
            .chain([rec(50_000, 2.0), rec(20_000_000, 1.5)])
            .collect();
        let b = buckets(&records);
        assert_eq!(b.len(), 6);
        assert_eq!(b[0].bucket, "<10KB");
        assert_eq!(b[0].flows, 10);
        assert_eq!(b[0].p50, Some(5.0));
        assert_eq!(b[0].p99, Some(10.0));
        assert_eq!(b[1].flows, 1);
        assert_eq!(b[2].flows, 0);
        assert_eq!(b[2].p50, None);
        assert_eq!(b[4].flows, 1);
        assert_eq!(b[4].max_bytes, None);
        assert_eq!(b[5].bucket, "all");
        assert_eq!(b[5].flows, 12);
    }

    #[test]
    fn queue_cdf_points() {
        let cdf = queue_cdf(&[0, 0, 0, 0, 100, 100, 200, 300, 400, 1000]);
        assert_eq!(cdf.first(), Some(&(0, 0.4)));
        assert_eq!(cdf.last(), Some(&(1000, 1.0)));
        assert!(cdf.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert!(queue_cdf(&[]).is_empty());
    }
}
