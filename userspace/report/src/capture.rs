//! `xroce capture --iface IF --json`: what the capture's AF_XDP sockets
//! received and what went into the pcap file.

use serde::{Deserialize, Serialize};

/// `xroce capture --json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CaptureReport {
    pub iface: String,
    /// RoCEv2 frames written (at most `-c`), both directions.
    pub frames: u64,
    /// Their length on the wire.
    pub bytes: u64,
    /// Copies taken of received frames (by the XDP program) and of sent
    /// ones (by the sending processes) that passed the filters.
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Copies lost to the file, the traffic kept them: perf buffers full
    /// (received) or the capture's socket full (sent).
    pub rx_lost: u64,
    pub tx_lost: u64,
    /// Copies the filters (`--qpn`, `--opcode`, `--peer`) left out.
    pub filtered_out: u64,
    /// The file written (`-` for stdout); none without `-w`.
    pub file: Option<String>,
    /// "pcapng" or "pcap".
    pub format: String,
    /// Records in that file (0 without `-w`).
    pub frames_written: u64,
    /// Records the snap length cut short.
    pub frames_truncated: u64,
    pub snaplen: u32,
    /// Nanosecond timestamps in the file (else microseconds).
    pub nanosecond: bool,
    /// How long the capture ran.
    pub seconds: f64,
    /// What ended it: "count" (`-c`), "seconds" (`--seconds`), "signal"
    /// (SIGINT, SIGTERM, SIGHUP) or "pipe" (the reader of `-w -` left).
    pub stopped_by: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_report_reads_and_writes_the_same_fields() {
        let json = r#"{"bytes":6400,"file":"f.pcap","filtered_out":0,"format":"pcapng","frames":100,"frames_truncated":0,"frames_written":100,"iface":"veth1","nanosecond":false,"rx_frames":60,"rx_lost":1,"seconds":1.5,"snaplen":262144,"stopped_by":"count","tx_frames":40,"tx_lost":2}"#;
        let r: CaptureReport = serde_json::from_str(json).unwrap();
        assert_eq!((r.frames, r.rx_lost, r.tx_lost), (100, 1, 2));
        assert_eq!(r.file.as_deref(), Some("f.pcap"));
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::from_str::<serde_json::Value>(json).unwrap()
        );
        let missing = json.replace(r#""rx_lost":1,"#, "");
        let e = serde_json::from_str::<CaptureReport>(&missing).unwrap_err();
        assert!(e.to_string().contains("missing field `rx_lost`"), "{e}");
        let no_file = json.replace(r#""file":"f.pcap","#, r#""file":null,"#);
        let r: CaptureReport = serde_json::from_str(&no_file).unwrap();
        assert_eq!(r.file, None);
    }
}
