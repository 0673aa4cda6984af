//! The table `xroce status --qps` prints under each process: a row per QP
//! with its state, peer, PSNs, window, error counts, rate and RTT.

use xroce_report::QpStatus;

/// A rate in bits per second, short (`100Gbit/s`, `2.5Mbit/s`).
fn rate(bps: u64) -> String {
    let (v, unit) = match bps {
        b if b >= 1_000_000_000 => (b as f64 / 1e9, "Gbit/s"),
        b if b >= 1_000_000 => (b as f64 / 1e6, "Mbit/s"),
        b if b >= 1_000 => (b as f64 / 1e3, "kbit/s"),
        b => (b as f64, "bit/s"),
    };
    let v = format!("{v:.1}");
    format!("{}{unit}", v.trim_end_matches(".0"))
}

/// A duration in nanoseconds, short (`-` for none).
fn duration(ns: Option<u64>) -> String {
    match ns {
        None => "-".into(),
        Some(n) if n >= 1_000_000 => format!("{:.1}ms", n as f64 / 1e6),
        Some(n) if n >= 1_000 => format!("{:.1}us", n as f64 / 1e3),
        Some(n) => format!("{n}ns"),
    }
}

fn psn(p: u32) -> String {
    format!("{p:#08x}")
}

/// The rows of `qps`, a header first, each line indented by `indent`.
/// The SR column: which halves run selective repeat ("on": both, "req"
/// or "resp": one, "off": go-back-N both ways).
fn sr_cell(q: &QpStatus) -> &'static str {
    match (q.sr_requester, q.sr_responder) {
        (true, true) => "on",
        (true, false) => "req",
        (false, true) => "resp",
        // A file from before the halves were reported.
        (false, false) if q.selective_repeat => "on",
        (false, false) => "off",
    }
}

pub fn render(qps: &[QpStatus], indent: &str) -> String {
    let header = [
        "QPN", "TYPE", "STATE", "PEER GID", "PEER QPN", "NEXT PSN", "UNACKED", "EXPECTED",
        "INFL/WIN", "SQ", "RQ", "RETX", "TMO", "RNR", "NAK", "CC", "RATE", "RTT", "SRTT", "FABRIC",
        "SR",
    ]
    .map(String::from);
    let rows: Vec<[String; 21]> = qps
        .iter()
        .map(|q| {
            [
                psn(q.qpn),
                q.qp_type.clone(),
                q.state.clone(),
                q.peer_gid.clone().unwrap_or_else(|| "-".into()),
                q.peer_qpn.map_or_else(|| "-".into(), psn),
                psn(q.next_send_psn),
                psn(q.oldest_unacked_psn),
                psn(q.expected_recv_psn),
                format!("{}/{}", q.inflight_pkts, q.send_window_pkts),
                q.send_queue.to_string(),
                q.recv_queue.to_string(),
                q.retransmitted.to_string(),
                q.timeouts.to_string(),
                q.rnr_naks_received.to_string(),
                q.seq_naks_received.to_string(),
                q.cc.clone(),
                rate(q.rate_bps),
                duration(q.last_rtt_ns),
                duration(q.srtt_ns),
                duration(q.last_fabric_rtt_ns),
                sr_cell(q).into(),
            ]
        })
        .collect();
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(indent);
        out.push_str(cells.join(" ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qp() -> QpStatus {
        QpStatus {
            qpn: 0x10011,
            qp_type: "RC".into(),
            state: "RTS".into(),
            peer_gid: Some("::ffff:10.0.0.2".into()),
            peer_qpn: Some(0x12),
            mtu: 1024,
            sq_psn: 0x10,
            next_send_psn: 0x123456,
            oldest_unacked_psn: 0x123450,
            rq_psn: 0,
            expected_recv_psn: 0xabcdef,
            inflight_pkts: 6,
            send_window_pkts: 128,
            send_queue: 3,
            recv_queue: 0,
            cc: "dcqcn".into(),
            rate_bps: 2_500_000_000,
            last_rtt_ns: Some(12_345),
            srtt_ns: None,
            last_fabric_rtt_ns: Some(4_200),
            selective_repeat: true,
            sr_requester: true,
            sr_responder: true,
            tx_packets: 100,
            tx_bytes: 100_000,
            retransmitted: 7,
            timeouts: 1,
            rnr_naks_received: 2,
            seq_naks_received: 3,
            rx_packets: 50,
            ce_marked_received: 0,
            cnps_sent: 0,
            cnps_received: 0,
        }
    }

    #[test]
    fn the_sr_column_names_the_halves_running_selective_repeat() {
        let mut q = qp();
        for (req, resp, cell) in [
            (true, true, "on"),
            (true, false, "req"),
            (false, true, "resp"),
            (false, false, "off"),
        ] {
            (q.sr_requester, q.sr_responder, q.selective_repeat) = (req, resp, req || resp);
            assert_eq!(sr_cell(&q), cell);
        }
    }

    #[test]
    fn a_row_per_qp_under_a_header_in_aligned_columns() {
        let text = render(&[qp()], "  ");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "0x010011",
                "RC",
                "RTS",
                "::ffff:10.0.0.2",
                "0x000012",
                "0x123456",
                "0x123450",
                "0xabcdef",
                "6/128",
                "3",
                "0",
                "7",
                "1",
                "2",
                "3",
                "dcqcn",
                "2.5Gbit/s",
                "12.3us",
                "-",
                "4.2us",
                "on"
            ]
        );
        // Every column starts where its header does.
        for (h, c) in ["PEER GID", "RETX", "RATE", "SR"]
            .into_iter()
            .zip(["::ffff", "7 ", "2.5G", "on"])
        {
            assert_eq!(lines[0].rfind(h), lines[1].find(c), "{h}:\n{text}");
        }
        assert!(lines.iter().all(|l| l.starts_with("  ")));
    }

    #[test]
    fn rates_and_durations_read_short() {
        assert_eq!(rate(100_000_000_000), "100Gbit/s");
        assert_eq!(rate(1_500), "1.5kbit/s");
        assert_eq!(rate(0), "0bit/s");
        assert_eq!(duration(Some(2_000_000)), "2.0ms");
        assert_eq!(duration(Some(999)), "999ns");
    }
}
