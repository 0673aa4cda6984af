//! Samples the bottleneck once per bin: the receiver's XDP congestion point
//! (its virtual queue and counters) or, with `--bottleneck delay`, the
//! delay bottleneck on the bridge's port (xroce::bottleneck: its departure
//! clock and counters; the receiver's XDP program still counts RoCEv2
//! frames and fault drops). And the CNPs arriving at the senders (the
//! `op_cnp` counter of each sender interface's own XDP program: CNPs travel
//! receiver -> sender, so the receiver's program never sees them).
//!
//! The maps are opened once; a sample is a handful of map lookups.

use std::io::Write;

use anyhow::Context;
use aya::maps::{Array, Map, MapData, PerCpuArray};
use xroce::bottleneck::QueueReader;
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
    /// How long a packet arriving now waits before it starts to leave: the
    /// backlog over the link rate (with `--bottleneck xdp` only what the
    /// virtual queue stands for: packets there never wait).
    pub queue_delay_us: f64,
    /// Mean time in the queue (own transmission included) of the packets
    /// admitted since the previous sample (0: none; delay bottleneck only).
    pub sojourn_us: f64,
    /// Largest sojourn of any packet since the start (delay bottleneck).
    pub peak_delay_us: f64,
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

pub const QUEUE_CSV_HEADER: &str = "t_ms,queue_bytes,peak_bytes,arrived_bytes,marks,cnps_seen,drop_tail,drop_congestion,drop_fault,roce_frames,queue_delay_us,sojourn_us";

impl Sample {
    pub fn csv_row(&self) -> String {
        format!(
            "{:.3},{},{},{},{},{},{},{},{},{},{:.3},{:.3}",
            self.t_ms,
            self.queue_bytes,
            self.peak_bytes,
            self.arrived_bytes,
            self.marks,
            self.cnps_seen,
            self.drop_tail,
            self.drop_congestion,
            self.drop_fault,
            self.roce_frames,
            self.queue_delay_us,
            self.sojourn_us
        )
    }
}

pub struct Sampler {
    link_rate_bps: u64,
    queue: Array<MapData, VirtualQueue>,
    /// The delay bottleneck, when it is the one.
    delay: Option<QueueReader>,
    /// Its (delay_sum_ns, packets) at the previous sample.
    last_sojourn: (u64, u64),
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
    /// A sampler of the receiver's XDP congestion point.
    pub fn new(
        receiver_iface: &(String, String),
        sender_ifaces: &[(String, String)],
        link_rate_bps: u64,
        csv: &std::path::Path,
    ) -> anyhow::Result<Self> {
        Self::with_bottleneck(receiver_iface, sender_ifaces, link_rate_bps, None, csv)
    }

    /// A sampler of the delay bottleneck `delay` reads, if given, else of
    /// the receiver's XDP congestion point.
    pub fn with_bottleneck(
        receiver_iface: &(String, String),
        sender_ifaces: &[(String, String)],
        link_rate_bps: u64,
        delay: Option<QueueReader>,
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
            delay,
            last_sojourn: (0, 0),
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
        let queue_bytes = q.backlog_at(monotonic_ns(), self.link_rate_bps);
        let mut s = Sample {
            t_ms,
            queue_bytes,
            queue_delay_us: queue_bytes as f64 * 8e6 / self.link_rate_bps.max(1) as f64,
            sojourn_us: 0.0,
            peak_delay_us: 0.0,
            peak_bytes: q.peak_bytes,
            arrived_bytes: q.enqueued_bytes,
            marks: sum(c, Counter::EcnMarked),
            cnps_seen,
            drop_tail: sum(c, Counter::DropTail),
            drop_congestion: sum(c, Counter::DropCongestion),
            drop_fault: sum(c, Counter::DropFault),
            roce_frames: sum(c, Counter::Roce),
        };
        // A reading that fails leaves the XDP figures (all zero there).
        if let Some(d) = self.delay.as_ref().and_then(|r| r.read().ok()) {
            let st = d.state;
            let (sum_before, packets_before) = self.last_sojourn;
            let packets = st.enqueued_packets.saturating_sub(packets_before);
            s.sojourn_us = if packets == 0 {
                0.0
            } else {
                st.delay_sum_ns.saturating_sub(sum_before) as f64 / packets as f64 / 1e3
            };
            self.last_sojourn = (st.delay_sum_ns, st.enqueued_packets);
            s.queue_bytes = d.backlog_bytes;
            s.queue_delay_us = d.delay_ns as f64 / 1e3;
            s.peak_delay_us = st.peak_delay_ns as f64 / 1e3;
            s.peak_bytes = st.peak_bytes;
            s.arrived_bytes = st.enqueued_bytes;
            s.marks = st.marked;
            s.drop_tail = st.dropped_tail;
            s.drop_congestion = st.dropped_congestion;
        }
        s
    }

    /// Takes one sample at `t_ms` and appends it to queue.csv.
    pub fn sample(&mut self, t_ms: f64) -> anyhow::Result<Sample> {
        let now = self.read(t_ms);
        let b = &self.base;
        let s = Sample {
            t_ms,
            queue_bytes: now.queue_bytes,
            queue_delay_us: now.queue_delay_us,
            sojourn_us: now.sojourn_us,
            peak_delay_us: now.peak_delay_us,
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
