//! The JSON reports `xroce bench --json`, `xroce lat --json`,
//! `xroce decode --json`, `xroce stats --json` (and its `--interval`
//! lines), `xroce status --json` and `xroce capture --json` print, one
//! definition for the CLI that writes them and the tools that read them
//! (`cargo xtask bench`, `xroce experiment`). Reading a report into these
//! types fails on a missing or misspelt field instead of reading it as zero.
//!
//! A crate of its own, with serde as its only dependency, so that xtask can
//! read reports without building the CLI (and with it the XDP program).
//!
//! Fields that only some modes have are `Option`s left out of the JSON when
//! `None`; `verified` is always written (null: not checked).

use serde::{Deserialize, Deserializer, Serialize};

mod decode;
pub use decode::{CmLine, DecodeReport, Problem, QpTraffic};
mod capture;
pub use capture::CaptureReport;
pub mod lat_lines;
mod qp;
pub use qp::QpStatus;
mod status;
pub use status::{InterfaceStatus, ProcessStatus, StatusReport, XdpStatus};
mod stats;
pub use stats::{
    EcnSettings, EngineCounters, FaultSettings, RxQueueRates, StatsInterval, StatsReport,
};

/// `xroce bench --json`: the bandwidth of one run, as the client saw it
/// (with `--perftest` also the server's view).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BenchReport {
    /// write, read, send or atomic.
    pub op: String,
    /// Message size in bytes.
    pub size: u64,
    /// Messages completed (all QPs).
    pub iters: u64,
    pub qps: u64,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Packet I/O backend: afxdp or udp.
    pub backend: String,
    /// Congestion control (--cc).
    pub cc: String,
    pub seconds: f64,
    pub bytes: u64,
    pub gbps: f64,
    pub msgs_per_sec: f64,
    /// Whether the data arrived as sent; null with --perftest (perftest
    /// checks no data).
    #[serde(deserialize_with = "required")]
    pub verified: Option<bool>,
    pub retransmits: u64,
    /// CNPs this side received.
    pub cnps: u64,
    /// CNPs the xroce server sent (not with --perftest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cnps_sent: Option<u64>,
    /// CE-marked packets the xroce server received (not with --perftest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_ce_marked: Option<u64>,
    /// With --perftest: perftest's view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perftest: Option<PerftestBw>,
    /// The retries of a QP ran out during the run (the completion that
    /// ended it: RetryExcErr or RnrRetryExcErr): what the network did, not
    /// a fault of the tool. The figures and the check of the data cover the
    /// messages completed before; the tool exits with an error after the
    /// report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qp_error: Option<String>,
}

/// `xroce lat --json`: one-message-in-flight latency.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LatReport {
    /// write, read or send.
    pub op: String,
    pub size: u64,
    pub iters: u64,
    pub qps: u64,
    pub mtu: u32,
    pub backend: String,
    /// Length of the run (not with --perftest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msgs_per_sec: Option<f64>,
    /// Whether READ data matched (true for write and send); null with
    /// --perftest.
    #[serde(deserialize_with = "required")]
    pub verified: Option<bool>,
    pub retransmits: u64,
    pub cnps: u64,
    pub lat_us: Latency,
    /// With --perftest: perftest's view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perftest: Option<PerftestLat>,
}

/// Latency percentiles in microseconds: half the round trip for write and
/// send (ping-pong), the whole round trip for read.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub avg: f64,
}

impl Latency {
    /// The percentiles of samples in nanoseconds (nearest rank; all zero
    /// for no samples).
    pub fn from_ns(mut ns: Vec<u64>) -> Latency {
        ns.sort_unstable();
        let at = |q: f64| {
            if ns.is_empty() {
                0.0
            } else {
                let i = ((ns.len() as f64 - 1.0) * q).round() as usize;
                ns[i] as f64 / 1000.0
            }
        };
        let avg = if ns.is_empty() {
            0.0
        } else {
            ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0
        };
        Latency {
            min: at(0.0),
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
            max: at(1.0),
            avg,
        }
    }
}

/// Which side of perftest's exchange wrote a report.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PerftestRole {
    Client,
    Server,
}

/// `perftest` of a [`BenchReport`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PerftestBw {
    pub role: PerftestRole,
    /// The peer's perftest version string, e.g. "6.06".
    pub peer_version: String,
    /// This side's figures, as perftest prints them (not on a passive
    /// server, which measures nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bw_peak_mb_per_sec: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bw_avg_mb_per_sec: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msg_rate_mpps: Option<f64>,
    /// The report the peer sent in perftest's exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_report: Option<PerftestBwFigures>,
}

/// A perftest bandwidth report (perftest's `bw_report_data`); MB are 2^20
/// bytes, as perftest counts them.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PerftestBwFigures {
    pub size: u64,
    pub iters: u64,
    pub bw_peak_mb_per_sec: f64,
    pub bw_avg_mb_per_sec: f64,
    pub msg_rate_mpps: f64,
}

/// `perftest` of a [`LatReport`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PerftestLat {
    pub role: PerftestRole,
    pub peer_version: String,
    /// Standard deviation of the samples, microseconds.
    pub stdev_us: f64,
}

/// A field that must be present even though it may be null (serde reads a
/// missing `Option` as `None` unless told otherwise).
fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::deserialize(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report as `xroce bench write --json` printed it before these types
    /// existed (json!, keys sorted).
    const BENCH_JSON: &str = r#"{"backend":"afxdp","bytes":6553600,"cc":"none","cnps":0,"gbps":10.5,"iters":100,"msgs_per_sec":20000.0,"mtu":1024,"op":"write","qps":1,"retransmits":0,"seconds":0.005,"server_ce_marked":0,"server_cnps_sent":0,"size":65536,"verified":true}"#;

    #[test]
    fn bench_report_reads_and_writes_the_same_fields() {
        let r: BenchReport = serde_json::from_str(BENCH_JSON).unwrap();
        assert_eq!(r.gbps, 10.5);
        assert_eq!(r.verified, Some(true));
        assert_eq!(r.server_cnps_sent, Some(0));
        assert_eq!(r.perftest, None);
        let back: serde_json::Value = serde_json::to_value(&r).unwrap();
        let before: serde_json::Value = serde_json::from_str(BENCH_JSON).unwrap();
        assert_eq!(back, before);
    }

    #[test]
    fn a_missing_or_misspelt_field_is_an_error() {
        let missing = BENCH_JSON.replace(r#""gbps":10.5,"#, "");
        let e = serde_json::from_str::<BenchReport>(&missing).unwrap_err();
        assert!(e.to_string().contains("missing field `gbps`"), "{e}");
        let misspelt = BENCH_JSON.replace("\"gbps\"", "\"gpbs\"");
        let e = serde_json::from_str::<BenchReport>(&misspelt).unwrap_err();
        assert!(e.to_string().contains("gpbs"), "{e}");
        // `verified` may be null, but not absent.
        let no_verified = BENCH_JSON.replace(r#","verified":true"#, "");
        let e = serde_json::from_str::<BenchReport>(&no_verified).unwrap_err();
        assert!(e.to_string().contains("missing field `verified`"), "{e}");
    }

    #[test]
    fn perftest_reports_keep_their_shape() {
        let lat = r#"{"backend":"udp","cnps":0,"iters":1000,"lat_us":{"avg":5.5,"max":9.0,"min":4.0,"p50":5.0,"p99":8.0,"p999":9.0},"mtu":1024,"op":"send","perftest":{"peer_version":"6.06","role":"client","stdev_us":0.5},"qps":1,"retransmits":0,"size":2,"verified":null}"#;
        let r: LatReport = serde_json::from_str(lat).unwrap();
        assert_eq!(r.verified, None);
        assert_eq!(r.seconds, None);
        assert_eq!(r.perftest.as_ref().unwrap().role, PerftestRole::Client);
        assert_eq!(r.lat_us.p50, 5.0);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::from_str::<serde_json::Value>(lat).unwrap()
        );
        let server = r#"{"backend":"afxdp","bytes":19660800,"cc":"none","cnps":0,"gbps":1.0,"iters":300,"msgs_per_sec":1.0,"mtu":1024,"op":"write","perftest":{"peer_report":{"bw_avg_mb_per_sec":100.0,"bw_peak_mb_per_sec":100.0,"iters":300,"msg_rate_mpps":0.0016,"size":65536},"peer_version":"6.06","role":"server"},"qps":1,"retransmits":0,"seconds":0.1875,"size":65536,"verified":null}"#;
        let r: BenchReport = serde_json::from_str(server).unwrap();
        let p = r.perftest.as_ref().unwrap();
        assert_eq!((p.role, p.bw_avg_mb_per_sec), (PerftestRole::Server, None));
        assert_eq!(p.peer_report.unwrap().iters, 300);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::from_str::<serde_json::Value>(server).unwrap()
        );
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let l = Latency::from_ns((1..=100).map(|i| i * 1000).collect());
        assert_eq!((l.min, l.p50, l.p99, l.max), (1.0, 51.0, 99.0, 100.0));
        assert_eq!(l.avg, 50.5);
        assert_eq!(Latency::from_ns(Vec::new()), Latency::default());
    }
}
