//! What `xroce exporter` serves, in the OpenMetrics text format (which
//! Prometheus scrapes): a [`Snapshot`] of the XDP counters, the engines'
//! counters and their QPs' state, encoded by prometheus-client as a
//! collector. Names follow Prometheus' conventions: the `xroce_` prefix,
//! `_total` on counters, units in names (`_bytes`, `_seconds`, `_packets`,
//! `_frames`), base units (bytes, seconds); labels `iface`, `queue`, `pid`,
//! `command`, `qpn`, and the QP's description on `xroce_qp_info`.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::{Registry, Unit},
};
use xroce_common::{Counter, RxQueueCounters};
use xroce_report::QpStatus;

/// The XDP program's counters on one interface.
#[derive(Debug, Clone)]
pub struct XdpSample {
    pub iface: String,
    pub counters: Vec<(Counter, u64)>,
    /// Queues that have seen frames, by index.
    pub rx_queues: Vec<(u32, RxQueueCounters)>,
}

/// One engine's published counters and QPs.
#[derive(Debug, Clone)]
pub struct EngineSample {
    pub iface: String,
    pub pid: u32,
    pub command: String,
    pub counters: Vec<(String, u64)>,
    pub qps: Vec<QpStatus>,
}

/// Everything one scrape shows.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub xdp: Vec<XdpSample>,
    pub engines: Vec<EngineSample>,
}

type Labels = Vec<(&'static str, String)>;

/// A unit prometheus-client writes into the name (and a `# UNIT` line).
#[derive(Clone, Copy)]
enum U {
    None,
    Bytes,
    Seconds,
}

impl U {
    fn unit(self) -> Option<Unit> {
        match self {
            U::None => None,
            U::Bytes => Some(Unit::Bytes),
            U::Seconds => Some(Unit::Seconds),
        }
    }
}

/// A sample's value: counts as integers, the rest as floats.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    Int(u64),
    Float(f64),
}

/// A per-QP metric: name (after `xroce_`, before the unit), help, unit,
/// counter or gauge, and its value (None: not known yet).
struct QpMetric {
    name: &'static str,
    help: &'static str,
    unit: U,
    counter: bool,
    value: fn(&QpStatus) -> Option<Num>,
}

macro_rules! qp_metric {
    ($name:literal, $help:literal, $unit:ident, $counter:literal, |$q:ident| $v:expr) => {
        QpMetric {
            name: $name,
            help: $help,
            unit: U::$unit,
            counter: $counter,
            value: |$q: &QpStatus| $v,
        }
    };
}

const QP_METRICS: &[QpMetric] = &[
    qp_metric!("qp_path_mtu", "Path MTU of the QP", Bytes, false, |q| Some(
        Num::Int(q.mtu as u64)
    )),
    qp_metric!(
        "qp_initial_send_psn",
        "Initial send PSN (sq_psn)",
        None,
        false,
        |q| Some(Num::Int(q.sq_psn as u64))
    ),
    qp_metric!(
        "qp_next_send_psn",
        "Next PSN the QP sends",
        None,
        false,
        |q| Some(Num::Int(q.next_send_psn as u64))
    ),
    qp_metric!(
        "qp_oldest_unacked_psn",
        "Oldest PSN not yet acknowledged",
        None,
        false,
        |q| Some(Num::Int(q.oldest_unacked_psn as u64))
    ),
    qp_metric!(
        "qp_initial_recv_psn",
        "Initial receive PSN (rq_psn)",
        None,
        false,
        |q| Some(Num::Int(q.rq_psn as u64))
    ),
    qp_metric!(
        "qp_expected_recv_psn",
        "PSN the responder expects next",
        None,
        false,
        |q| Some(Num::Int(q.expected_recv_psn as u64))
    ),
    qp_metric!(
        "qp_inflight_packets",
        "PSNs sent and not yet acknowledged",
        None,
        false,
        |q| Some(Num::Int(q.inflight_pkts as u64))
    ),
    qp_metric!(
        "qp_send_window_packets",
        "Most PSNs that may be unacknowledged",
        None,
        false,
        |q| Some(Num::Int(q.send_window_pkts as u64))
    ),
    qp_metric!(
        "qp_send_queue_requests",
        "Send work requests not yet completed",
        None,
        false,
        |q| Some(Num::Int(q.send_queue as u64))
    ),
    qp_metric!(
        "qp_recv_queue_requests",
        "Receive work requests posted",
        None,
        false,
        |q| Some(Num::Int(q.recv_queue as u64))
    ),
    qp_metric!(
        "qp_pacing_rate_bytes_per_second",
        "Rate the congestion control paces the QP at",
        None,
        false,
        |q| Some(Num::Float(q.rate_bps as f64 / 8.0))
    ),
    qp_metric!(
        "qp_last_rtt",
        "Last round-trip time sample",
        Seconds,
        false,
        |q| q.last_rtt_ns.map(|n| Num::Float(n as f64 / 1e9))
    ),
    qp_metric!(
        "qp_last_fabric_rtt",
        "Last fabric round-trip time: the congestion control's sample when the peer echoes its host delay",
        Seconds,
        false,
        |q| q.last_fabric_rtt_ns.map(|n| Num::Float(n as f64 / 1e9))
    ),
    qp_metric!(
        "qp_smoothed_rtt",
        "Smoothed round-trip time (RFC 6298)",
        Seconds,
        false,
        |q| q.srtt_ns.map(|n| Num::Float(n as f64 / 1e9))
    ),
    qp_metric!(
        "qp_tx_packets",
        "Data packets sent, retransmissions included",
        None,
        true,
        |q| Some(Num::Int(q.tx_packets))
    ),
    qp_metric!(
        "qp_tx",
        "Bytes of the data packets sent",
        Bytes,
        true,
        |q| Some(Num::Int(q.tx_bytes))
    ),
    qp_metric!(
        "qp_retransmitted_packets",
        "Data packets sent again",
        None,
        true,
        |q| Some(Num::Int(q.retransmitted))
    ),
    qp_metric!(
        "qp_retransmit_timeouts",
        "Retransmission timer expiries",
        None,
        true,
        |q| Some(Num::Int(q.timeouts))
    ),
    qp_metric!(
        "qp_rnr_naks_received",
        "RNR NAKs received",
        None,
        true,
        |q| Some(Num::Int(q.rnr_naks_received))
    ),
    qp_metric!(
        "qp_seq_naks_received",
        "PSN sequence error NAKs received",
        None,
        true,
        |q| Some(Num::Int(q.seq_naks_received))
    ),
    qp_metric!(
        "qp_rx_packets",
        "Packets received for the QP",
        None,
        true,
        |q| Some(Num::Int(q.rx_packets))
    ),
    qp_metric!(
        "qp_rx_ce_marked_packets",
        "Packets received marked CE",
        None,
        true,
        |q| Some(Num::Int(q.ce_marked_received))
    ),
    qp_metric!(
        "qp_cnps_sent",
        "Congestion notification packets sent",
        None,
        true,
        |q| Some(Num::Int(q.cnps_sent))
    ),
    qp_metric!(
        "qp_cnps_received",
        "Congestion notification packets received",
        None,
        true,
        |q| Some(Num::Int(q.cnps_received))
    ),
];

/// One family: a descriptor, then a sample per label set.
fn family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: U,
    metric_type: MetricType,
    samples: impl IntoIterator<Item = (Labels, Num)>,
) -> Result<(), std::fmt::Error> {
    let unit = unit.unit();
    let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), metric_type)?;
    for (labels, v) in samples {
        let e = family.encode_family(&labels)?;
        match (metric_type, v) {
            (MetricType::Counter, Num::Int(v)) => ConstCounter::new(v).encode(e)?,
            (MetricType::Counter, Num::Float(v)) => ConstCounter::new(v).encode(e)?,
            (_, Num::Int(v)) => ConstGauge::new(v).encode(e)?,
            (_, Num::Float(v)) => ConstGauge::new(v).encode(e)?,
        }
    }
    Ok(())
}

impl Snapshot {
    fn encode_xdp(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for counter in Counter::ALL {
            let samples = self.xdp.iter().map(|x| {
                let v = x
                    .counters
                    .iter()
                    .find(|(c, _)| *c == counter)
                    .map_or(0, |c| c.1);
                (vec![("iface", x.iface.clone())], Num::Int(v))
            });
            let name = format!("xdp_{}_frames", counter.name());
            let help = format!("Frames the XDP program counted as {}", counter.name());
            family(encoder, &name, &help, U::None, MetricType::Counter, samples)?;
        }
        type Field = fn(&RxQueueCounters) -> u64;
        let per_queue: [(&str, &str, U, Field); 4] = [
            (
                "xdp_rx_queue_frames",
                "Frames the XDP program saw on the RX queue",
                U::None,
                |q| q.frames,
            ),
            ("xdp_rx_queue", "Bytes of those frames", U::Bytes, |q| {
                q.bytes
            }),
            (
                "xdp_rx_queue_redirected_frames",
                "Frames handed to the queue's AF_XDP socket",
                U::None,
                |q| q.redirected,
            ),
            (
                "xdp_rx_queue_passed_frames",
                "Frames left to the kernel stack",
                U::None,
                |q| q.passed,
            ),
        ];
        for (name, help, unit, field) in per_queue {
            let samples = self.xdp.iter().flat_map(|x| {
                x.rx_queues.iter().map(move |(q, c)| {
                    let labels = vec![("iface", x.iface.clone()), ("queue", q.to_string())];
                    (labels, Num::Int(field(c)))
                })
            });
            family(encoder, name, help, unit, MetricType::Counter, samples)?;
        }
        Ok(())
    }

    fn engine_labels(e: &EngineSample) -> Labels {
        vec![
            ("iface", e.iface.clone()),
            ("pid", e.pid.to_string()),
            ("command", e.command.clone()),
        ]
    }

    fn encode_engines(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Every engine's counters, in the order they were published.
        let mut names: Vec<&str> = Vec::new();
        for (n, _) in self.engines.iter().flat_map(|e| &e.counters) {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        for name in names {
            let samples = self.engines.iter().filter_map(|e| {
                let v = e.counters.iter().find(|(n, _)| n == name)?.1;
                Some((Self::engine_labels(e), Num::Int(v)))
            });
            let help = format!("Engine counter {name} of the process (xroce stats)");
            family(
                encoder,
                &format!("engine_{name}"),
                &help,
                U::None,
                MetricType::Counter,
                samples,
            )?;
        }
        let qps = || {
            self.engines.iter().flat_map(|e| {
                e.qps.iter().map(move |q| {
                    let mut labels = vec![("iface", e.iface.clone()), ("pid", e.pid.to_string())];
                    labels.push(("qpn", q.qpn.to_string()));
                    (labels, q)
                })
            })
        };
        let mut info = encoder.encode_descriptor(
            "qp",
            "A QP of a process: type, state, peer, congestion control, selective repeat",
            None,
            MetricType::Info,
        )?;
        for (mut labels, q) in qps() {
            labels.extend([
                ("type", q.qp_type.clone()),
                ("state", q.state.clone()),
                ("peer_gid", q.peer_gid.clone().unwrap_or_default()),
                (
                    "peer_qpn",
                    q.peer_qpn.map(|n| n.to_string()).unwrap_or_default(),
                ),
                ("cc", q.cc.clone()),
                ("selective_repeat", q.selective_repeat.to_string()),
            ]);
            info.encode_info(&labels)?;
        }
        for m in QP_METRICS {
            let samples = qps().filter_map(|(labels, q)| Some((labels, (m.value)(q)?)));
            let kind = if m.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            family(encoder, m.name, m.help, m.unit, kind, samples)?;
        }
        Ok(())
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.encode_xdp(&mut encoder)?;
        self.encode_engines(&mut encoder)
    }
}

/// The Content-Type of what [`encode`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `snapshot` in the OpenMetrics text format.
pub fn encode(snapshot: Snapshot) -> String {
    let mut registry = Registry::with_prefix("xroce");
    registry.register_collector(Box::new(snapshot));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .expect("writing to a String cannot fail");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qp() -> QpStatus {
        QpStatus {
            qpn: 65553,
            qp_type: "RC".into(),
            state: "RTS".into(),
            peer_gid: Some("::ffff:10.0.0.2".into()),
            peer_qpn: Some(17),
            mtu: 1024,
            sq_psn: 5,
            next_send_psn: 105,
            oldest_unacked_psn: 100,
            rq_psn: 7,
            expected_recv_psn: 7,
            inflight_pkts: 5,
            send_window_pkts: 128,
            send_queue: 2,
            recv_queue: 0,
            cc: "dcqcn".into(),
            rate_bps: 8_000_000_000,
            last_rtt_ns: Some(25_000),
            srtt_ns: None,
            last_fabric_rtt_ns: None,
            selective_repeat: false,
            sr_requester: false,
            sr_responder: false,
            tx_packets: 101,
            tx_bytes: 104_000,
            retransmitted: 1,
            timeouts: 0,
            rnr_naks_received: 0,
            seq_naks_received: 1,
            rx_packets: 40,
            ce_marked_received: 0,
            cnps_sent: 0,
            cnps_received: 3,
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            xdp: vec![XdpSample {
                iface: "veth1".into(),
                counters: vec![(Counter::Seen, 120), (Counter::OpWrite, 100)],
                rx_queues: vec![(
                    1,
                    RxQueueCounters {
                        frames: 120,
                        bytes: 130_000,
                        redirected: 110,
                        passed: 10,
                    },
                )],
            }],
            engines: vec![EngineSample {
                iface: "veth1".into(),
                pid: 4242,
                command: "xroce".into(),
                counters: vec![("rx_frames".into(), 40), ("tx_bytes".into(), 104_500)],
                qps: vec![qp()],
            }],
        }
    }

    /// The samples of `text` by name and labels, parsed by a Prometheus
    /// text-format parser.
    fn scrape(text: &str) -> prometheus_parse::Scrape {
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
    }

    fn value(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let sample = s.samples.iter().find(|x| {
            x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v))
        })?;
        match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => Some(v),
            _ => None,
        }
    }

    #[test]
    fn names_labels_and_values_as_prometheus_reads_them() {
        let text = encode(snapshot());
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            text.contains("# TYPE xroce_xdp_op_write_frames counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# UNIT xroce_qp_last_rtt_seconds seconds\n"),
            "{text}"
        );
        // Counts are written as integers (exact beyond 2^53 too).
        let rx =
            "xroce_engine_rx_frames_total{iface=\"veth1\",pid=\"4242\",command=\"xroce\"} 40\n";
        assert!(text.contains(rx), "{text}");
        let s = scrape(&text);
        let veth = [("iface", "veth1")];
        assert_eq!(
            value(&s, "xroce_xdp_op_write_frames_total", &veth),
            Some(100.0)
        );
        assert_eq!(value(&s, "xroce_xdp_seen_frames_total", &veth), Some(120.0));
        // A counter the sample lacks reads 0, so every interface has them all.
        assert_eq!(
            value(&s, "xroce_xdp_drop_fault_frames_total", &veth),
            Some(0.0)
        );
        let q1 = [("iface", "veth1"), ("queue", "1")];
        assert_eq!(
            value(&s, "xroce_xdp_rx_queue_bytes_total", &q1),
            Some(130_000.0)
        );
        assert_eq!(
            value(&s, "xroce_xdp_rx_queue_passed_frames_total", &q1),
            Some(10.0)
        );
        let engine = [("iface", "veth1"), ("pid", "4242"), ("command", "xroce")];
        assert_eq!(
            value(&s, "xroce_engine_rx_frames_total", &engine),
            Some(40.0)
        );
        assert_eq!(
            value(&s, "xroce_engine_tx_bytes_total", &engine),
            Some(104_500.0)
        );
        let qp = [("iface", "veth1"), ("pid", "4242"), ("qpn", "65553")];
        let info: Vec<(&str, &str)> = qp
            .into_iter()
            .chain([
                ("type", "RC"),
                ("state", "RTS"),
                ("peer_gid", "::ffff:10.0.0.2"),
                ("peer_qpn", "17"),
                ("cc", "dcqcn"),
                ("selective_repeat", "false"),
            ])
            .collect();
        assert_eq!(value(&s, "xroce_qp_info", &info), Some(1.0));
        for (name, want) in [
            ("xroce_qp_next_send_psn", 105.0),
            ("xroce_qp_oldest_unacked_psn", 100.0),
            ("xroce_qp_expected_recv_psn", 7.0),
            ("xroce_qp_inflight_packets", 5.0),
            ("xroce_qp_send_window_packets", 128.0),
            ("xroce_qp_path_mtu_bytes", 1024.0),
            ("xroce_qp_pacing_rate_bytes_per_second", 1e9),
            ("xroce_qp_last_rtt_seconds", 25e-6),
            ("xroce_qp_tx_bytes_total", 104_000.0),
            ("xroce_qp_retransmitted_packets_total", 1.0),
            ("xroce_qp_seq_naks_received_total", 1.0),
            ("xroce_qp_cnps_received_total", 3.0),
        ] {
            assert_eq!(value(&s, name, &qp), Some(want), "{name}:\n{text}");
        }
        // No RTT sample yet: no series rather than a made-up 0.
        assert_eq!(value(&s, "xroce_qp_smoothed_rtt_seconds", &qp), None);
    }

    #[test]
    fn nothing_running_still_makes_a_valid_exposition() {
        let text = encode(Snapshot::default());
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(scrape(&text).samples.is_empty(), "{text}");
    }
}
