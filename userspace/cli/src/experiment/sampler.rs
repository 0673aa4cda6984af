//! Samples the receiver's congestion point (the pinned virtual queue and
//! XDP counters) once per bin, and the CNPs arriving at the senders (the
//! `op_cnp` counter of each sender interface's own XDP program: CNPs travel
//! receiver -> sender, so the receiver's program never sees them).
//!
//! The maps are opened once; a sample is a handful of map lookups.

use std::io::Write;

use anyhow::Context;
use aya::maps::{Array, Map, MapData, PerCpuArray};
use xroce_common::{congestion::VirtualQueue, names, Counter};

/// CLOCK_MONOTONIC in ns: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Map `map` of the program on `iface` in namespace `netns`: found through
/// the interface from a thread inside that namespace; the map's descriptor
/// then serves from anywhere.
fn open_map((netns, iface): &(String, String), map: &'static str) -> anyhow::Result<MapData> {
    let i = iface.clone();
    super::in_netns(netns, move || xroce::xdp::open_map(&i, map))?
        .with_context(|| format!("open {map} of {iface} in {netns}"))
}

/// One row of queue.csv. Counts are cumulative since the start.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub t_ms: f64,
    /// Virtual queue backlog now.
    pub queue_bytes: u64,
    /// Largest backlog since the experiment started.
    pub peak_bytes: u64,
    /// Bytes admitted into the queue.
    pub arrived_bytes: u64,
    pub marks: u64,
    pub cnps_seen: u64,
    pub drop_tail: u64,
    pub drop_congestion: u64,
    pub drop_fault: u64,
    /// RoCEv2 frames the receiver's program saw.
    pub roce_frames: u64,
}

pub const QUEUE_CSV_HEADER: &str = "t_ms,queue_bytes,peak_bytes,arrived_bytes,marks,cnps_seen,drop_tail,drop_congestion,drop_fault,roce_frames";

impl Sample {
    pub fn csv_row(&self) -> String {
        format!(
            "{:.3},{},{},{},{},{},{},{},{},{}",
            self.t_ms,
            self.queue_bytes,
            self.peak_bytes,
            self.arrived_bytes,
            self.marks,
            self.cnps_seen,
            self.drop_tail,
            self.drop_congestion,
            self.drop_fault,
            self.roce_frames
        )
    }
}

pub struct Sampler {
    link_rate_bps: u64,
    queue: Array<MapData, VirtualQueue>,
    counters: PerCpuArray<MapData, u64>,
    /// Each sender interface's counters, once its program is pinned.
    /// (namespace, interface) of each sender.
    sender_ifaces: Vec<(String, String)>,
    sender_counters: Vec<Option<PerCpuArray<MapData, u64>>>,
    /// Counter values at the start, subtracted from every sample.
    base: Sample,
    out: std::io::BufWriter<std::fs::File>,
    pub last: Sample,
}

fn counters_of(iface: &(String, String)) -> anyhow::Result<PerCpuArray<MapData, u64>> {
    let map = open_map(iface, names::COUNTERS)?;
    PerCpuArray::try_from(Map::PerCpuArray(map)).context("counter map")
}

fn sum(array: &PerCpuArray<MapData, u64>, counter: Counter) -> u64 {
    array
        .get(&(counter as u32), 0)
        .map(|v| v.iter().sum())
        .unwrap_or(0)
}

impl Sampler {
    pub fn new(
        receiver_iface: &(String, String),
        sender_ifaces: &[(String, String)],
        link_rate_bps: u64,
        csv: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let queue = Array::try_from(Map::Array(open_map(receiver_iface, names::ECN_QUEUE)?))
            .context("virtual queue map")?;
        let counters = counters_of(receiver_iface)?;
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(csv).with_context(|| format!("create {}", csv.display()))?,
        );
        writeln!(out, "{QUEUE_CSV_HEADER}")?;
        let mut sampler = Self {
            link_rate_bps,
            queue,
            counters,
            sender_ifaces: sender_ifaces.to_vec(),
            sender_counters: sender_ifaces.iter().map(|_| None).collect(),
            base: Sample::default(),
            out,
            last: Sample::default(),
        };
        sampler.base = sampler.read(0.0);
        Ok(sampler)
    }

    fn read(&mut self, t_ms: f64) -> Sample {
        let q = self.queue.get(&0, 0).unwrap_or_default();
        let c = &self.counters;
        for (slot, iface) in self.sender_counters.iter_mut().zip(&self.sender_ifaces) {
            if slot.is_none() {
                *slot = counters_of(iface).ok();
            }
        }
        let cnps_seen = self
            .sender_counters
            .iter()
            .flatten()
            .map(|a| sum(a, Counter::OpCnp))
            .sum();
        Sample {
            t_ms,
            queue_bytes: q.backlog_at(monotonic_ns(), self.link_rate_bps),
            peak_bytes: q.peak_bytes,
            arrived_bytes: q.enqueued_bytes,
            marks: sum(c, Counter::EcnMarked),
            cnps_seen,
            drop_tail: sum(c, Counter::DropTail),
            drop_congestion: sum(c, Counter::DropCongestion),
            drop_fault: sum(c, Counter::DropFault),
            roce_frames: sum(c, Counter::Roce),
        }
    }

    /// Takes one sample at `t_ms` and appends it to queue.csv.
    pub fn sample(&mut self, t_ms: f64) -> anyhow::Result<Sample> {
        let now = self.read(t_ms);
        let b = &self.base;
        let s = Sample {
            t_ms,
            queue_bytes: now.queue_bytes,
            // The queue was reset when the congestion point was programmed.
            peak_bytes: now.peak_bytes,
            arrived_bytes: now.arrived_bytes.saturating_sub(b.arrived_bytes),
            marks: now.marks.saturating_sub(b.marks),
            cnps_seen: now.cnps_seen.saturating_sub(b.cnps_seen),
            drop_tail: now.drop_tail.saturating_sub(b.drop_tail),
            drop_congestion: now.drop_congestion.saturating_sub(b.drop_congestion),
            drop_fault: now.drop_fault.saturating_sub(b.drop_fault),
            roce_frames: now.roce_frames.saturating_sub(b.roce_frames),
        };
        writeln!(self.out, "{}", s.csv_row())?;
        self.last = s;
        Ok(s)
    }

    pub fn finish(&mut self) -> anyhow::Result<()> {
        self.out.flush().context("write queue.csv")
    }
}
