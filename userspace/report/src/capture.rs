//! `xroce capture --iface IF --json`: what the capture's AF_XDP sockets
//! received and what went into the pcap file.

use serde::{Deserialize, Serialize};

/// `xroce capture --json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CaptureReport {
    pub iface: String,
    /// RX queues whose sockets were opened (every queue unless `--queue`).
    pub queues: Vec<u32>,
    /// Frames each of those queues' sockets received (frames of the last
    /// batch beyond `-c` included).
    pub queue_frames: Vec<u64>,
    /// RoCEv2 frames captured (at most `-c`).
    pub frames: u64,
    /// Their length on the wire.
    pub bytes: u64,
    /// The pcap file written (`-` for stdout); none without `-w`.
    pub file: Option<String>,
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
    /// The sockets' drop counters summed (XDP_STATISTICS).
    pub rx_dropped: u64,
    pub rx_ring_full: u64,
    pub rx_invalid_descs: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_report_reads_and_writes_the_same_fields() {
        let json = r#"{"bytes":6400,"file":"f.pcap","frames":100,"frames_truncated":0,"frames_written":100,"iface":"veth1","nanosecond":false,"queue_frames":[60,41],"queues":[0,1],"rx_dropped":1,"rx_invalid_descs":0,"rx_ring_full":2,"seconds":1.5,"snaplen":262144,"stopped_by":"count"}"#;
        let r: CaptureReport = serde_json::from_str(json).unwrap();
        assert_eq!((r.frames, r.rx_ring_full), (100, 2));
        assert_eq!(r.file.as_deref(), Some("f.pcap"));
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::from_str::<serde_json::Value>(json).unwrap()
        );
        let missing = json.replace(r#""rx_dropped":1,"#, "");
        let e = serde_json::from_str::<CaptureReport>(&missing).unwrap_err();
        assert!(e.to_string().contains("missing field `rx_dropped`"), "{e}");
        let no_file = json.replace(r#""file":"f.pcap","#, r#""file":null,"#);
        let r: CaptureReport = serde_json::from_str(&no_file).unwrap();
        assert_eq!(r.file, None);
    }
}
