//! `xroce stats --iface IF --json`: an interface's XDP counters, live
//! engines' counters, congestion point and loss injection.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::required;

/// `xroce stats --json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StatsReport {
    pub iface: String,
    /// XDP counter name (as the XDP program's counter list names it) ->
    /// value.
    pub xdp: BTreeMap<String, u64>,
    /// The counters each live engine on the interface published.
    pub engines: Vec<EngineCounters>,
    pub ecn: EcnSettings,
    pub fault: FaultSettings,
}

/// What one engine process published.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EngineCounters {
    pub pid: u32,
    /// Engine counter name -> value.
    pub counters: BTreeMap<String, u64>,
}

/// The XDP congestion point's settings and virtual queue.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EcnSettings {
    pub enabled: bool,
    /// Marking policy name, e.g. "step" or "red".
    pub policy: String,
    pub link_rate_bps: u64,
    pub kmin: u64,
    pub kmax: u64,
    /// Marking probability at kmax, 0..=1.
    pub pmax: f64,
    pub buffer_bytes: u64,
    /// Virtual queue backlog now (0 when disabled).
    pub queue_bytes: u64,
    pub queue_peak_bytes: u64,
    pub queue_enqueued_bytes: u64,
}

/// The XDP loss injection's settings.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultSettings {
    pub enabled: bool,
    /// Share of the chosen frames dropped, 0..=1.
    pub drop: f64,
    /// Opcode classes chosen (bit mask).
    pub opcode_mask: u32,
    /// The one destination QP chosen; null: any.
    #[serde(deserialize_with = "required")]
    pub qpn: Option<u32>,
    pub seed: u64,
}

/// `xroce stats --interval S --json`: one of these per line, every S
/// seconds. Rates are per second over the interval just ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StatsInterval {
    pub iface: String,
    /// Seconds from the first sample to the end of this interval.
    pub t: f64,
    /// Length of this interval as measured, in seconds.
    pub seconds: f64,
    /// Frames per second the XDP program saw, over every RX queue.
    pub rx_pps: f64,
    /// Bits per second of those frames (whole frames, Ethernet header
    /// included, no FCS).
    pub rx_bps: f64,
    /// XDP counter name -> events per second in this interval.
    pub xdp_rates: BTreeMap<String, f64>,
    /// XDP counter name -> total at the end of the interval.
    pub xdp: BTreeMap<String, u64>,
    /// Every RX queue that has seen a frame since the program was attached.
    pub rx_queues: Vec<RxQueueRates>,
}

/// One RX queue in [`StatsInterval`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RxQueueRates {
    pub queue: u32,
    pub rx_pps: f64,
    pub rx_bps: f64,
    pub redirected_pps: f64,
    pub passed_pps: f64,
    pub dropped_pps: f64,
    /// Totals since the program was attached.
    pub frames: u64,
    pub bytes: u64,
    pub redirected: u64,
    pub passed: u64,
    pub dropped: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `xroce stats --json` printed it before these types existed.
    const STATS_JSON: &str = r#"{"ecn":{"buffer_bytes":1000000,"enabled":true,"kmax":200000,"kmin":50000,"link_rate_bps":1000000000,"pmax":0.25,"policy":"step","queue_bytes":0,"queue_enqueued_bytes":9000,"queue_peak_bytes":3000},"engines":[{"counters":{"retransmits":2,"tx_packets":10},"pid":42}],"fault":{"drop":0.0,"enabled":false,"opcode_mask":0,"qpn":null,"seed":1},"iface":"veth1","xdp":{"passed":1,"redirected":64}}"#;

    #[test]
    fn stats_report_reads_and_writes_the_same_fields() {
        let r: StatsReport = serde_json::from_str(STATS_JSON).unwrap();
        assert_eq!(r.xdp["redirected"], 64);
        assert_eq!(r.ecn.policy, "step");
        assert_eq!(r.engines[0].counters["retransmits"], 2);
        assert_eq!(r.fault.qpn, None);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::from_str::<serde_json::Value>(STATS_JSON).unwrap()
        );
        let no_qpn = STATS_JSON.replace(r#""qpn":null,"#, "");
        let e = serde_json::from_str::<StatsReport>(&no_qpn).unwrap_err();
        assert!(e.to_string().contains("missing field `qpn`"), "{e}");
        let misspelt = STATS_JSON.replace("\"queue_peak_bytes\"", "\"queue_peak\"");
        assert!(serde_json::from_str::<StatsReport>(&misspelt).is_err());
    }
}
