//! `xroce capture --iface IF --json`: what an AF_XDP socket received.

use serde::{Deserialize, Serialize};

/// `xroce capture --json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CaptureReport {
    pub iface: String,
    /// RX queue whose socket was opened.
    pub queue: u32,
    /// RoCEv2 frames received.
    pub frames: u64,
    pub bytes: u64,
    /// The socket's drop counters (XDP_STATISTICS).
    pub rx_dropped: u64,
    pub rx_ring_full: u64,
    pub rx_invalid_descs: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_report_reads_and_writes_the_same_fields() {
        let json = r#"{"bytes":6400,"frames":100,"iface":"veth1","queue":0,"rx_dropped":1,"rx_invalid_descs":0,"rx_ring_full":2}"#;
        let r: CaptureReport = serde_json::from_str(json).unwrap();
        assert_eq!((r.frames, r.rx_ring_full), (100, 2));
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::from_str::<serde_json::Value>(json).unwrap()
        );
        let missing = json.replace(r#""rx_dropped":1,"#, "");
        let e = serde_json::from_str::<CaptureReport>(&missing).unwrap_err();
        assert!(e.to_string().contains("missing field `rx_dropped`"), "{e}");
    }
}
