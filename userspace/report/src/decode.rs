//! `xroce decode FILE --json`: what one capture held.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::required;

/// `xroce decode --json`: frame totals, opcode histogram, per-QP PSN
/// bookkeeping, malformed frames and connection-management MADs.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct DecodeReport {
    /// Frames in the capture.
    pub frames: u64,
    /// Frames the capture marks as received, and as sent (pcapng
    /// `epb_flags`); absent when it marks none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames_in: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames_out: Option<u64>,
    /// RoCEv2 frames (UDP port 4791), decodable or not.
    pub roce: u64,
    pub not_roce: u64,
    pub icrc_ok: u64,
    pub icrc_bad: u64,
    /// RoCEv2 frames the codec could not decode (all of them, not only the
    /// ones listed in `problems`).
    pub malformed: u64,
    /// Captured bytes.
    pub bytes: u64,
    /// pcap link type of the capture.
    pub link_type: u32,
    /// Whether the capture has nanosecond timestamps.
    pub nanosecond: bool,
    /// Opcode byte (a decimal JSON key) -> frames.
    pub opcodes: BTreeMap<u8, u64>,
    /// Opcode name -> frames.
    pub opcodes_named: BTreeMap<String, u64>,
    /// Sum of the QPs' `psn_gaps`.
    pub psn_gaps: u64,
    /// One row per destination QP.
    pub qps: Vec<QpTraffic>,
    /// Malformed frames and ICRC failures, the first 100.
    pub problems: Vec<Problem>,
    /// One line per connection-management MAD.
    pub cm: Vec<CmLine>,
}

/// The traffic seen to one QP (destination GID + QPN).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct QpTraffic {
    /// Destination GID as text.
    pub dst: String,
    pub dest_qp: u32,
    pub packets: u64,
    pub requests: u64,
    pub responses: u64,
    /// PSN of the first and last request (null: no request seen).
    #[serde(deserialize_with = "required")]
    pub first_psn: Option<u32>,
    #[serde(deserialize_with = "required")]
    pub last_psn: Option<u32>,
    /// Requests whose PSN jumped ahead of the expected next PSN.
    pub psn_gaps: u64,
    /// PSNs skipped over by those jumps.
    pub psns_missing: u64,
    /// Requests with a PSN at or before one already seen (retransmissions).
    pub psn_repeats: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    /// Frames carrying xroce's selective-repeat capable bit (BTH byte 4,
    /// 0x01): requests of an xroce QP, responses of an xroce responder
    /// running selective repeat. Absent in older reports.
    #[serde(default)]
    pub sr_capable: u64,
    /// Of those, responses: the responder runs selective repeat.
    #[serde(default)]
    pub sr_responses: u64,
    /// ACKs carrying an xroce SACK block.
    #[serde(default)]
    pub sacks: u64,
}

/// A malformed frame or ICRC failure.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Problem {
    /// 1-based frame number in the capture (as Wireshark counts).
    pub frame: u64,
    pub reason: String,
    /// "in" (received) or "out" (sent), when the capture says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
}

/// One connection-management MAD.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CmLine {
    /// 1-based frame number.
    pub frame: u64,
    /// What it says, e.g. "CM REQ tid=... ".
    pub message: String,
    /// "in" (received) or "out" (sent), when the capture says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `xroce decode --json` prints it (before these types existed, less
    /// the selective-repeat counts).
    const DECODE_JSON: &str = r#"{"bytes":1234,"cm":[{"frame":1,"message":"CM REQ tid=0x1"}],"frames":3,"icrc_bad":0,"icrc_ok":3,"link_type":1,"malformed":0,"nanosecond":false,"not_roce":0,"opcodes":{"10":2,"17":1},"opcodes_named":{"RC_ACKNOWLEDGE":1,"RC_RDMA_WRITE_ONLY":2},"problems":[{"frame":2,"reason":"bad ICRC"}],"psn_gaps":0,"qps":[{"dest_qp":17,"dst":"::ffff:10.0.0.1","first_psn":5,"last_psn":6,"naks":0,"packets":3,"psn_gaps":0,"psn_repeats":0,"psns_missing":0,"requests":2,"responses":1,"rnr_naks":0,"sacks":0,"sr_capable":0,"sr_responses":0},{"dest_qp":18,"dst":"::ffff:10.0.0.2","first_psn":null,"last_psn":null,"naks":0,"packets":1,"psn_gaps":0,"psn_repeats":0,"psns_missing":0,"requests":0,"responses":1,"rnr_naks":0,"sacks":0,"sr_capable":0,"sr_responses":0}],"roce":3}"#;

    #[test]
    fn decode_report_reads_and_writes_the_same_fields() {
        let r: DecodeReport = serde_json::from_str(DECODE_JSON).unwrap();
        assert_eq!(r.opcodes[&10], 2);
        assert_eq!(r.opcodes_named["RC_ACKNOWLEDGE"], 1);
        assert_eq!(r.qps[0].first_psn, Some(5));
        assert_eq!(r.qps[1].last_psn, None);
        assert_eq!(r.cm[0].frame, 1);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::from_str::<serde_json::Value>(DECODE_JSON).unwrap()
        );
    }

    #[test]
    fn a_report_without_the_selective_repeat_counts_reads_them_as_0() {
        let old = DECODE_JSON.replace(r#","sacks":0,"sr_capable":0,"sr_responses":0"#, "");
        assert!(!old.contains("sacks"));
        let r: DecodeReport = serde_json::from_str(&old).unwrap();
        assert_eq!(
            (r.qps[0].sr_capable, r.qps[0].sr_responses, r.qps[0].sacks),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_missing_field_or_psn_is_an_error() {
        let missing = DECODE_JSON.replace(r#""icrc_bad":0,"#, "");
        let e = serde_json::from_str::<DecodeReport>(&missing).unwrap_err();
        assert!(e.to_string().contains("missing field `icrc_bad`"), "{e}");
        let no_psn = DECODE_JSON.replace(r#""first_psn":null,"#, "");
        let e = serde_json::from_str::<DecodeReport>(&no_psn).unwrap_err();
        assert!(e.to_string().contains("missing field `first_psn`"), "{e}");
        let misspelt = DECODE_JSON.replace("\"roce\"", "\"rcoe\"");
        assert!(serde_json::from_str::<DecodeReport>(&misspelt).is_err());
    }
}
