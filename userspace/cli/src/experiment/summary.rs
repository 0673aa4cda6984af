//! summary.json of an incast: the settings and what came out of them.
//! Written by [`super::report::Report::summary`]; the types read it back
//! (tests, figures) with every field required.

use serde::{Deserialize, Serialize};
use xroce_report::BenchReport;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// "incast".
    pub experiment: String,
    pub settings: Settings,
    /// Sum of the senders' goodput, Gbit/s.
    pub aggregate_gbps: f64,
    /// aggregate_gbps over the bottleneck's rate.
    pub link_utilisation: f64,
    /// Jain's index of the senders' goodput over the whole run.
    pub jain_index: f64,
    /// Mean Jain's index over windows of jain_short_term_window_ms (null
    /// if the flows never overlapped).
    pub jain_short_term: Option<f64>,
    pub jain_short_term_window_ms: f64,
    pub queue: Queue,
    /// Packets the bottleneck ECN-marked.
    pub marks: u64,
    /// CNPs the senders received (their reports, else their traces).
    pub cnps: u64,
    /// CNPs the senders' XDP programs saw.
    pub cnps_seen_at_senders: u64,
    pub drops: Drops,
    pub retransmits: u64,
    pub roce_frames_at_receiver: u64,
    pub flows: Vec<Flow>,
    /// The receiver's JSON on stdout, if it printed one.
    pub receiver: Option<serde_json::Value>,
    pub errors: Vec<String>,
}

/// The experiment's flags and what they resolved to.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub senders: usize,
    pub cc: String,
    /// --link-rate as given, e.g. "1gbit".
    pub link_rate: String,
    pub link_rate_bps: u64,
    pub line_rate: String,
    /// The senders' DCQCN parameters (null unless --cc dcqcn).
    pub dcqcn: Option<Dcqcn>,
    /// --timely as given (null unless --cc timely).
    pub timely: Option<String>,
    /// --swift as given (null unless --cc swift).
    pub swift: Option<String>,
    /// The queueing delay TIMELY or Swift aims for over the base RTT, us
    /// (null for the others, or where the spec makes it no single number).
    pub delay_target_us: Option<f64>,
    pub duration_s: f64,
    /// --size as given, e.g. "64KiB".
    pub size: String,
    pub bin_ms: u32,
    pub mtu: u32,
    pub ecn: Ecn,
    pub fault: Fault,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Dcqcn {
    /// --dcqcn as given.
    pub spec: String,
    pub g: f64,
    pub initial_alpha: f64,
    pub alpha_timer_ns: u64,
    pub rate_increase_timer_ns: u64,
    pub byte_counter_bytes: u64,
    pub fast_recovery_stages: u32,
    pub rai_bps: u64,
    pub rhai_bps: u64,
    pub min_rate_bps: u64,
    pub rate_reduce_period_ns: u64,
}

/// The bottleneck's marking.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Ecn {
    pub enabled: bool,
    pub policy: String,
    pub kmin_bytes: u64,
    pub kmax_bytes: u64,
    pub pmax: f64,
    pub buffer_bytes: Option<u64>,
}

/// Loss injection at the receiver.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub enabled: bool,
    pub drop: f64,
    pub opcode_mask: u32,
    /// null: every QP.
    pub qpn: Option<u32>,
    pub seed: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Queue {
    /// The XDP program's own peak (every packet, not only samples).
    pub peak_bytes: u64,
    pub sampled_peak_bytes: u64,
    pub mean_bytes: f64,
    pub p50_bytes: u64,
    pub p99_bytes: u64,
    pub buffer_bytes: Option<u64>,
    pub arrived_bytes: u64,
    pub samples: usize,
    /// Without the start, where every flow begins at line rate.
    pub after_warmup: QueueStats,
    pub warmup_ms: f64,
    /// "xdp": the receiver's virtual queue (marks and drops; packets never
    /// wait); "delay": the bridge port's queue, where packets wait.
    pub bottleneck: String,
    /// The queue's delay after the warm-up.
    pub delay: QueueDelay,
}

/// How long packets wait in the queue, in microseconds: sampled waits
/// (backlog over the rate) after the warm-up, and the largest sojourn of
/// any packet (delay bottleneck; with xdp, the peak backlog over the rate).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueueDelay {
    pub peak_us: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub samples: usize,
}

/// Sampled queue lengths while traffic ran.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueueStats {
    pub peak_bytes: u64,
    pub mean_bytes: f64,
    pub p50_bytes: u64,
    pub p99_bytes: u64,
    pub samples: usize,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Drops {
    pub tail: u64,
    pub congestion: u64,
    pub fault: u64,
    pub total: u64,
}

/// One sender.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Flow {
    pub flow: usize,
    pub addr: Option<String>,
    pub gbps: f64,
    pub bytes: Option<u64>,
    pub seconds: Option<f64>,
    pub cnps: u64,
    pub retransmits: u64,
    /// The lowest congestion-control rate of its trace.
    pub min_rate_gbps: Option<f64>,
    /// Whether its data arrived as sent (null: no report).
    pub verified: Option<bool>,
    /// Why it could not run or report (the experiment then fails).
    pub error: Option<String>,
    /// Its QP ran out of retries: the run of this flow ended there (a
    /// result, e.g. tail drops starving a flow without congestion control).
    #[serde(default)]
    pub qp_error: Option<String>,
    /// Its `xroce bench --json` report.
    pub bench: Option<BenchReport>,
}
