//! The flows of a workload: sizes from a [`Cdf`], Poisson arrivals at a
//! target load, uniform sources and destinations, all drawn from one seeded
//! generator of our own ([`Rng`]), so the same seed gives the same flows
//! on every machine and every version of the `rand` crate. The list is
//! written to schedule.csv, which every sender and receiver process reads.
//!
//! Also the flows' data: a pattern keyed by the flow, so the receiver can
//! check every byte of a flow without having been told its contents.

use std::{io::Write, path::Path};

use anyhow::{bail, Context};

use super::cdf::Cdf;
use crate::experiment::rng::{mix, Rng, GOLDEN};

/// One flow: `size` bytes from sender `src` to receiver `dst`, starting
/// `start_ns` after the experiment's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub id: u32,
    pub src: usize,
    pub dst: usize,
    pub size: u64,
    pub start_ns: u64,
}

/// How many flows: a count, or every arrival within a time span.
#[derive(Clone, Copy, Debug)]
pub enum Length {
    Flows(usize),
    Seconds(f64),
}

/// What the flows are drawn from.
pub struct Spec<'a> {
    pub cdf: &'a Cdf,
    pub senders: usize,
    pub receivers: usize,
    /// Offered load as a fraction of the receivers' links.
    pub load: f64,
    pub link_rate_bps: u64,
    pub seed: u64,
    pub length: Length,
}

/// Most flows a run may have (flow ids travel in 32 bits).
pub const MAX_FLOWS: usize = 1_000_000;

impl Spec<'_> {
    /// Mean gap between arrivals (all senders together), in seconds: the
    /// bytes offered per second are `load` times the receivers' capacity.
    pub fn mean_gap_s(&self) -> f64 {
        let bytes_per_s = self.load * self.receivers as f64 * self.link_rate_bps as f64 / 8.0;
        self.cdf.mean() / bytes_per_s
    }

    /// The flows, ordered by start time (and id).
    pub fn generate(&self) -> anyhow::Result<Vec<Flow>> {
        if self.senders == 0 || self.receivers == 0 {
            bail!("a workload needs senders and receivers");
        }
        if !(self.load > 0.0 && self.load.is_finite()) {
            bail!("--load must be above 0, not {}", self.load);
        }
        let mut rng = Rng::new(self.seed);
        let gap = self.mean_gap_s();
        let mut flows = Vec::new();
        let mut t = 0.0f64;
        loop {
            match self.length {
                Length::Flows(n) if flows.len() >= n => break,
                _ => {}
            }
            if flows.len() >= MAX_FLOWS {
                bail!("over {MAX_FLOWS} flows: shorten --duration or lower --load");
            }
            // Fixed draw order: gap, source, destination, size.
            t += rng.exponential(gap);
            let src = rng.below(self.senders);
            let dst = rng.below(self.receivers);
            let size = self.cdf.quantile(rng.unit());
            if let Length::Seconds(s) = self.length {
                if t > s {
                    break;
                }
            }
            flows.push(Flow {
                id: flows.len() as u32,
                src,
                dst,
                size,
                start_ns: (t * 1e9) as u64,
            });
        }
        if flows.is_empty() {
            bail!("no flow arrives within --duration at this load; lengthen it");
        }
        Ok(flows)
    }
}

impl Spec<'_> {
    /// Incast: bursts arriving as a Poisson process, each one flow from
    /// every sender to one receiver (drawn uniformly) at the same instant,
    /// the sizes from the CDF; the bursts' bytes are `load` of the
    /// receivers' capacity. `Length::Flows` counts bursts.
    pub fn bursts(&self) -> anyhow::Result<Vec<Flow>> {
        if self.senders == 0 || self.receivers == 0 {
            bail!("an incast needs senders and receivers");
        }
        if !(self.load > 0.0 && self.load.is_finite()) {
            bail!("the load must be above 0, not {}", self.load);
        }
        let mut rng = Rng::new(self.seed);
        let gap = self.mean_gap_s() * self.senders as f64;
        let mut flows: Vec<Flow> = Vec::new();
        let mut t = 0.0f64;
        for burst in 0.. {
            match self.length {
                Length::Flows(n) if burst >= n => break,
                _ => {}
            }
            if flows.len() + self.senders > MAX_FLOWS {
                bail!("over {MAX_FLOWS} flows: shorten the time or lower the load");
            }
            // Fixed draw order: gap, destination, each sender's size.
            t += rng.exponential(gap);
            let dst = rng.below(self.receivers);
            if let Length::Seconds(s) = self.length {
                if t > s {
                    break;
                }
            }
            for src in 0..self.senders {
                flows.push(Flow {
                    id: flows.len() as u32,
                    src,
                    dst,
                    size: self.cdf.quantile(rng.unit()),
                    start_ns: (t * 1e9) as u64,
                });
            }
        }
        if flows.is_empty() {
            bail!("no burst arrives within the time at this load; lengthen it");
        }
        Ok(flows)
    }
}

pub const SCHEDULE_HEADER: &str = "flow,src,dst,size_bytes,start_ns";

pub fn write_schedule(path: &Path, flows: &[Flow]) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
    );
    writeln!(out, "{SCHEDULE_HEADER}")?;
    for f in flows {
        writeln!(
            out,
            "{},{},{},{},{}",
            f.id, f.src, f.dst, f.size, f.start_ns
        )?;
    }
    out.flush()
        .with_context(|| format!("write {}", path.display()))
}

pub fn read_schedule(path: &Path) -> anyhow::Result<Vec<Flow>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut lines = text.lines();
    if lines.next() != Some(SCHEDULE_HEADER) {
        bail!("{} does not start with {SCHEDULE_HEADER}", path.display());
    }
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<u64> = l
                .split(',')
                .map(|x| x.trim().parse::<u64>())
                .collect::<Result<_, _>>()
                .with_context(|| format!("{}: bad row {l:?}", path.display()))?;
            if f.len() != 5 {
                bail!("{}: bad row {l:?}", path.display());
            }
            Ok(Flow {
                id: f[0] as u32,
                src: f[1] as usize,
                dst: f[2] as usize,
                size: f[3],
                start_ns: f[4],
            })
        })
        .collect()
}

/// Key of flow `id`'s data in a run with `seed`.
pub fn data_key(seed: u64, id: u32) -> u64 {
    mix(seed ^ (id as u64).wrapping_mul(GOLDEN) ^ 0x5752_4954_4521)
}

/// Word `i` of the data keyed `key`: counter-based, so any part can be
/// made (and checked) without the rest.
fn word(key: u64, i: u64) -> u64 {
    mix(key.wrapping_add(i.wrapping_mul(GOLDEN)))
}

/// Fills `buf`, the part of a flow's data that starts at byte `offset`
/// (a multiple of 8), with the flow's pattern.
pub fn fill(key: u64, offset: u64, buf: &mut [u8]) {
    debug_assert_eq!(offset % 8, 0);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let w = word(key, offset / 8 + i as u64).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// Whether `buf` holds the flow's pattern from byte `offset` (a multiple of 8).
pub fn matches(key: u64, offset: u64, buf: &[u8]) -> bool {
    buf.chunks(8).enumerate().all(|(i, chunk)| {
        let w = word(key, offset / 8 + i as u64).to_le_bytes();
        chunk == &w[..chunk.len()]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_send_from_every_sender_at_once_at_the_load() {
        let cdf = Cdf::load("websearch").unwrap();
        let spec = Spec {
            cdf: &cdf,
            senders: 3,
            receivers: 1,
            load: 0.5,
            link_rate_bps: 1_000_000_000,
            seed: 7,
            length: Length::Seconds(20.0),
        };
        let flows = spec.bursts().unwrap();
        assert_eq!(flows, spec.bursts().unwrap(), "same seed, same bursts");
        assert_eq!(flows.len() % 3, 0);
        for (k, burst) in flows.chunks(3).enumerate() {
            assert!(burst
                .iter()
                .all(|f| f.start_ns == burst[0].start_ns && f.dst == 0));
            let srcs: Vec<usize> = burst.iter().map(|f| f.src).collect();
            assert_eq!(srcs, [0, 1, 2]);
            assert!(burst.iter().all(|f| f.id as usize / 3 == k));
        }
        let bytes: u64 = flows.iter().map(|f| f.size).sum();
        let span = flows.last().unwrap().start_ns as f64 / 1e9;
        let load = bytes as f64 * 8.0 / span / 1e9;
        assert!((0.3..0.8).contains(&load), "offered load {load}");
    }

    fn spec(cdf: &Cdf, seed: u64, length: Length) -> Spec<'_> {
        Spec {
            cdf,
            senders: 4,
            receivers: 2,
            load: 0.5,
            link_rate_bps: 1_000_000_000,
            seed,
            length,
        }
    }

    #[test]
    fn same_seed_same_flows() {
        let cdf = Cdf::load("websearch").unwrap();
        let a = spec(&cdf, 7, Length::Flows(500)).generate().unwrap();
        let b = spec(&cdf, 7, Length::Flows(500)).generate().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 500);
        let c = spec(&cdf, 8, Length::Flows(500)).generate().unwrap();
        assert_ne!(a, c);
        // Sources and destinations cover every host; starts rise.
        for h in 0..4 {
            assert!(a.iter().any(|f| f.src == h));
        }
        assert!(a.iter().any(|f| f.dst == 1) && a.iter().any(|f| f.dst == 0));
        assert!(a.windows(2).all(|w| w[0].start_ns <= w[1].start_ns));
        // A duration keeps the same prefix of the same sequence.
        let span = (a[99].start_ns as f64 + 0.5) / 1e9;
        let d = spec(&cdf, 7, Length::Seconds(span)).generate().unwrap();
        assert_eq!(&d[..], &a[..100]);
        // And the schedule file round-trips.
        let path = std::env::temp_dir().join(format!("xroce-sched-{}.csv", std::process::id()));
        write_schedule(&path, &a).unwrap();
        assert_eq!(read_schedule(&path).unwrap(), a);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn poisson_gaps_match_the_load() {
        let cdf = Cdf::load("hadoop").unwrap();
        let s = spec(&cdf, 1, Length::Flows(20_000));
        let flows = s.generate().unwrap();
        let span_s = flows.last().unwrap().start_ns as f64 / 1e9;
        let mean_gap = span_s / flows.len() as f64;
        let want = s.mean_gap_s();
        // 20,000 exponential gaps: the mean is within 1/sqrt(n) ~ 0.7 % (1 sigma).
        assert!(
            (mean_gap / want - 1.0).abs() < 0.04,
            "mean gap {mean_gap} s, want {want} s"
        );
        // The offered load: bytes over span over the receivers' capacity.
        let bytes: u64 = flows.iter().map(|f| f.size).sum();
        let load = bytes as f64 * 8.0 / span_s / (2.0 * 1e9);
        assert!((load - 0.5).abs() < 0.1, "offered load {load}");
        // Exponential gaps: the standard deviation equals the mean.
        let gaps: Vec<f64> = flows
            .windows(2)
            .map(|w| (w[1].start_ns - w[0].start_ns) as f64 / 1e9)
            .collect();
        let m = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - m) * (g - m)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd / m - 1.0).abs() < 0.05, "sd/mean {}", sd / m);
    }

    #[test]
    fn sizes_follow_the_cdf() {
        let cdf = Cdf::parse("t", "0 0\n1000 50\n2000 100\n").unwrap();
        let flows = spec(&cdf, 3, Length::Flows(10_000)).generate().unwrap();
        let small = flows.iter().filter(|f| f.size <= 1000).count() as f64 / 1e4;
        assert!((small - 0.5).abs() < 0.03, "{small}");
        assert!(flows.iter().all(|f| (1..=2000).contains(&f.size)));
    }

    #[test]
    fn data_pattern_checks_every_part() {
        let key = data_key(1, 5);
        let mut buf = vec![0u8; 1003];
        fill(key, 0, &mut buf);
        assert!(matches(key, 0, &buf));
        assert!(matches(key, 512, &buf[512..]));
        assert!(!matches(data_key(1, 6), 0, &buf));
        assert!(!matches(data_key(2, 5), 0, &buf));
        buf[999] ^= 1;
        assert!(!matches(key, 0, &buf));
    }
}
