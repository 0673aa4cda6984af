//! `xroce decode FILE.pcap [--json]`: decode every RoCEv2 frame of a capture
//! with the wire codec, verify its ICRC, and report totals, an opcode
//! histogram, per-QP PSN gaps and malformed frames with the reason.
//!
//! Reads classic pcap (microsecond or nanosecond timestamps, either byte
//! order) with link types Ethernet, Linux cooked SLL / SLL2 and raw IP.
//! The report logic ([`decode_pcap_bytes`], [`Report`]) is I/O free so tests
//! can run it on the reference captures.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use xroce_wire::{icrc, parse_frame, Error as WireError, Gid, Opcode, Syndrome};

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// pcap file to decode
    pub file: PathBuf,
    /// print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &DecodeArgs) -> anyhow::Result<()> {
    let data = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let report = decode_pcap_bytes(&data)
        .with_context(|| format!("{} is not a readable pcap file", args.file.display()))?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        eprint!("{}", report.to_text(&args.file.display().to_string()));
    }
    Ok(())
}

/// At most this many malformed frames are listed individually.
pub const MAX_LISTED_MALFORMED: usize = 100;

/// One malformed RoCEv2 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// 1-based frame number in the capture (as Wireshark counts).
    pub frame: u64,
    pub reason: String,
}

/// PSN bookkeeping of the requests sent to one QP (destination GID + QPN).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpStats {
    pub packets: u64,
    pub requests: u64,
    pub responses: u64,
    pub first_psn: Option<u32>,
    pub last_psn: Option<u32>,
    /// Requests whose PSN jumped ahead of the expected next PSN.
    pub psn_gaps: u64,
    /// PSNs skipped over by those jumps.
    pub psns_missing: u64,
    /// Requests with a PSN at or before one already seen (retransmissions).
    pub psn_repeats: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    expected: Option<u32>,
}

/// Everything `xroce decode` reports.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub link_type: u32,
    pub nanosecond: bool,
    pub frames: u64,
    pub roce: u64,
    pub not_roce: u64,
    pub icrc_ok: u64,
    pub icrc_bad: u64,
    pub malformed: u64,
    pub bytes: u64,
    /// Opcode byte -> frames.
    pub opcodes: BTreeMap<u8, u64>,
    /// (destination GID, destination QPN) -> stats.
    pub qps: BTreeMap<(Gid, u32), QpStats>,
    pub malformed_list: Vec<Malformed>,
}

const LINKTYPE_ETHERNET: u32 = 1;
const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_IPV4: u32 = 228;
const LINKTYPE_IPV6: u32 = 229;
const LINKTYPE_LINUX_SLL: u32 = 113;
const LINKTYPE_LINUX_SLL2: u32 = 276;

/// A minimal classic-pcap reader over a byte slice.
struct PcapReader<'a> {
    data: &'a [u8],
    pos: usize,
    big_endian: bool,
}

impl<'a> PcapReader<'a> {
    /// Parse the global header; returns (reader, link type, nanosecond).
    fn new(data: &'a [u8]) -> anyhow::Result<(Self, u32, bool)> {
        anyhow::ensure!(data.len() >= 24, "file shorter than a pcap header");
        let m = [data[0], data[1], data[2], data[3]];
        let (big_endian, ns) = match u32::from_le_bytes(m) {
            0xa1b2_c3d4 => (false, false),
            0xa1b2_3c4d => (false, true),
            0xd4c3_b2a1 => (true, false),
            0x4d3c_b2a1 => (true, true),
            0x0a0d_0d0a => anyhow::bail!(
                "this is pcapng; convert it with `editcap -F pcap IN OUT` or capture with `tcpdump -w`"
            ),
            x => anyhow::bail!("bad pcap magic {x:#010x}"),
        };
        let r = PcapReader {
            data,
            pos: 24,
            big_endian,
        };
        let link = r.u32_at(20) & 0x0fff_ffff;
        Ok((r, link, ns))
    }
    fn u32_at(&self, o: usize) -> u32 {
        let b = [
            self.data[o],
            self.data[o + 1],
            self.data[o + 2],
            self.data[o + 3],
        ];
        if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }
    /// Next record: Ok(Some((captured bytes, original length))).
    fn next_record(&mut self) -> anyhow::Result<Option<(&'a [u8], u32)>> {
        if self.pos == self.data.len() {
            return Ok(None);
        }
        anyhow::ensure!(
            self.pos + 16 <= self.data.len(),
            "pcap ends inside a record header"
        );
        let incl = self.u32_at(self.pos + 8) as usize;
        let orig = self.u32_at(self.pos + 12);
        let start = self.pos + 16;
        anyhow::ensure!(start + incl <= self.data.len(), "pcap ends inside a packet");
        self.pos = start + incl;
        Ok(Some((&self.data[start..start + incl], orig)))
    }
}

/// Turn a captured packet of `link` type into an Ethernet frame the codec
/// parses (the Ethernet header is not covered by the ICRC, so a synthetic
/// one is fine). `None` when the link type or packet is not IP-capable.
fn to_ethernet(link: u32, pkt: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
    let synth = |ethertype: u16, rest: &[u8]| {
        let mut v = Vec::with_capacity(14 + rest.len());
        v.extend_from_slice(&[0u8; 12]);
        v.extend_from_slice(&ethertype.to_be_bytes());
        v.extend_from_slice(rest);
        std::borrow::Cow::Owned(v)
    };
    let by_version = |rest: &[u8]| match rest.first().map(|b| b >> 4) {
        Some(4) => Some(0x0800u16),
        Some(6) => Some(0x86dd),
        _ => None,
    };
    match link {
        LINKTYPE_ETHERNET => Some(std::borrow::Cow::Borrowed(pkt)),
        LINKTYPE_LINUX_SLL if pkt.len() >= 16 => {
            Some(synth(u16::from_be_bytes([pkt[14], pkt[15]]), &pkt[16..]))
        }
        LINKTYPE_LINUX_SLL2 if pkt.len() >= 20 => {
            Some(synth(u16::from_be_bytes([pkt[0], pkt[1]]), &pkt[20..]))
        }
        LINKTYPE_RAW | LINKTYPE_IPV4 | LINKTYPE_IPV6 => Some(synth(by_version(pkt)?, pkt)),
        _ => None,
    }
}

impl Report {
    fn malformed(&mut self, frame: u64, reason: String) {
        self.malformed += 1;
        if self.malformed_list.len() < MAX_LISTED_MALFORMED {
            self.malformed_list.push(Malformed { frame, reason });
        }
    }

    /// Account one Ethernet frame (number `n`, 1-based).
    pub fn add_frame(&mut self, n: u64, frame: &[u8]) {
        let (repr, _payload) = match parse_frame(frame) {
            Ok(x) => x,
            Err(e) if e.is_not_roce() => {
                self.not_roce += 1;
                return;
            }
            Err(e) => {
                // A UDP/4791 frame we cannot decode is RoCE traffic gone wrong.
                self.roce += 1;
                self.malformed(n, e.to_string());
                return;
            }
        };
        self.roce += 1;
        match icrc::verify_frame(frame) {
            Ok(()) => self.icrc_ok += 1,
            Err(e @ WireError::BadIcrc { .. }) => {
                self.icrc_bad += 1;
                if self.malformed_list.len() < MAX_LISTED_MALFORMED {
                    self.malformed_list.push(Malformed {
                        frame: n,
                        reason: e.to_string(),
                    });
                }
            }
            Err(e) => self.malformed(n, e.to_string()),
        }
        let t = &repr.transport;
        let op = t.bth.opcode;
        *self.opcodes.entry(op as u8).or_default() += 1;
        if op == Opcode::CNP {
            return;
        }
        let q = self
            .qps
            .entry((repr.ip.dst_gid(), t.bth.dest_qp))
            .or_default();
        q.packets += 1;
        let psn = t.bth.psn;
        if op.is_response() {
            q.responses += 1;
            match t.aeth.map(|a| a.syndrome) {
                Some(Syndrome::Nak(_)) => q.naks += 1,
                Some(Syndrome::RnrNak { .. }) => q.rnr_naks += 1,
                _ => {}
            }
            return;
        }
        q.requests += 1;
        q.first_psn.get_or_insert(psn);
        q.last_psn = Some(psn);
        if let Some(exp) = q.expected {
            let d = xroce_wire::psn_diff(psn, exp);
            if d > 0 {
                q.psn_gaps += 1;
                q.psns_missing += d as u64;
            } else if d < 0 {
                q.psn_repeats += 1;
            }
        }
        // An RDMA READ request reserves one PSN per response packet, which
        // the capture does not tell us (path MTU): do not judge the next one.
        q.expected = if op == Opcode::RC_RDMA_READ_REQUEST {
            None
        } else {
            Some(xroce_wire::psn_add(psn, 1))
        };
    }

    pub fn psn_gaps(&self) -> u64 {
        self.qps.values().map(|q| q.psn_gaps).sum()
    }

    /// The one JSON object `--json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        let opcodes: serde_json::Map<String, serde_json::Value> = self
            .opcodes
            .iter()
            .map(|(k, v)| (k.to_string(), (*v).into()))
            .collect();
        let named: serde_json::Map<String, serde_json::Value> = self
            .opcodes
            .iter()
            .map(|(k, v)| (opcode_name(*k).to_string(), (*v).into()))
            .collect();
        let qps: Vec<serde_json::Value> = self
            .qps
            .iter()
            .map(|((gid, qpn), q)| {
                serde_json::json!({
                    "dst": gid.to_string(), "dest_qp": qpn, "packets": q.packets,
                    "requests": q.requests, "responses": q.responses,
                    "first_psn": q.first_psn, "last_psn": q.last_psn,
                    "psn_gaps": q.psn_gaps, "psns_missing": q.psns_missing,
                    "psn_repeats": q.psn_repeats, "naks": q.naks, "rnr_naks": q.rnr_naks,
                })
            })
            .collect();
        let malformed: Vec<serde_json::Value> = self
            .malformed_list
            .iter()
            .map(|m| serde_json::json!({"frame": m.frame, "reason": m.reason}))
            .collect();
        serde_json::json!({
            "frames": self.frames,
            "roce": self.roce,
            "not_roce": self.not_roce,
            "icrc_ok": self.icrc_ok,
            "icrc_bad": self.icrc_bad,
            "malformed": self.malformed,
            "bytes": self.bytes,
            "link_type": self.link_type,
            "nanosecond": self.nanosecond,
            "opcodes": opcodes,
            "opcodes_named": named,
            "psn_gaps": self.psn_gaps(),
            "qps": qps,
            "problems": malformed,
        })
    }

    /// Human-readable report.
    pub fn to_text(&self, name: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{name}: {} frames, {} RoCEv2, {} other",
            self.frames, self.roce, self.not_roce
        );
        let _ = writeln!(
            s,
            "ICRC ok {}  bad {}  malformed {}",
            self.icrc_ok, self.icrc_bad, self.malformed
        );
        let _ = writeln!(s, "\n{:<6} {:<36} {:>10}", "opcode", "name", "frames");
        for (op, n) in &self.opcodes {
            let _ = writeln!(s, "{op:#06x} {:<36} {n:>10}", opcode_name(*op));
        }
        let _ = writeln!(
            s,
            "\n{:<28} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7}",
            "dst QP", "packets", "requests", "first_psn", "last_psn", "psn_gaps", "repeats", "naks"
        );
        for ((gid, qpn), q) in &self.qps {
            let psn = |p: Option<u32>| p.map(|p| format!("{p:#08x}")).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                s,
                "{:<28} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7}",
                format!("{gid}/{qpn:#08x}"),
                q.packets,
                q.requests,
                psn(q.first_psn),
                psn(q.last_psn),
                q.psn_gaps,
                q.psn_repeats,
                q.naks + q.rnr_naks
            );
        }
        if !self.malformed_list.is_empty() {
            let _ = writeln!(s, "\nproblems (first {MAX_LISTED_MALFORMED}):");
            for m in &self.malformed_list {
                let _ = writeln!(s, "  frame {}: {}", m.frame, m.reason);
            }
        }
        s
    }
}

fn opcode_name(op: u8) -> &'static str {
    Opcode::from_u8(op).map(|o| o.name()).unwrap_or("UNKNOWN")
}

/// Decode a whole pcap held in memory.
pub fn decode_pcap_bytes(data: &[u8]) -> anyhow::Result<Report> {
    let (mut r, link, ns) = PcapReader::new(data)?;
    let mut rep = Report {
        link_type: link,
        nanosecond: ns,
        ..Report::default()
    };
    let mut n = 0u64;
    while let Some((pkt, orig_len)) = r.next_record()? {
        n += 1;
        rep.frames += 1;
        rep.bytes += pkt.len() as u64;
        let Some(frame) = to_ethernet(link, pkt) else {
            rep.not_roce += 1;
            continue;
        };
        if (pkt.len() as u32) < orig_len {
            // Snap length cut the frame: decodable headers, unverifiable ICRC.
            if parse_frame(&frame).is_err_and(|e| e.is_not_roce()) {
                rep.not_roce += 1;
            } else {
                rep.roce += 1;
                rep.malformed(
                    n,
                    format!("captured {} of {orig_len} bytes (snaplen)", pkt.len()),
                );
            }
            continue;
        }
        rep.add_frame(n, &frame);
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcaps() -> Vec<PathBuf> {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/pcaps");
        assert!(
            d.is_dir(),
            "reference captures not found at {}",
            d.display()
        );
        let mut v: Vec<PathBuf> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
            .collect();
        v.sort();
        assert!(!v.is_empty(), "no pcaps in {}", d.display());
        v
    }

    #[test]
    fn reference_captures_decode_clean() {
        for p in pcaps() {
            let rep = decode_pcap_bytes(&std::fs::read(&p).unwrap()).unwrap();
            assert!(rep.roce > 0, "{}: no RoCEv2 frames", p.display());
            assert_eq!(rep.icrc_bad, 0, "{}: {:?}", p.display(), rep.malformed_list);
            assert_eq!(
                rep.malformed,
                0,
                "{}: {:?}",
                p.display(),
                rep.malformed_list
            );
            assert_eq!(rep.icrc_ok, rep.roce);
            assert_eq!(rep.roce + rep.not_roce, rep.frames);
            let j = rep.to_json();
            for k in [
                "frames",
                "roce",
                "icrc_ok",
                "icrc_bad",
                "malformed",
                "opcodes",
            ] {
                assert!(j.get(k).is_some(), "json lacks {k}");
            }
            let hist: u64 = j["opcodes"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap())
                .sum();
            assert_eq!(hist, rep.roce);
        }
    }

    #[test]
    fn corrupt_frame_is_reported_not_panicking() {
        let p = &pcaps()[0];
        let mut data = std::fs::read(p).unwrap();
        let clean = decode_pcap_bytes(&data).unwrap();
        // Flip one payload byte of every record near its end: ICRCs break.
        let mut pos = 24;
        while pos + 16 <= data.len() {
            let incl = u32::from_le_bytes(data[pos + 8..pos + 12].try_into().unwrap()) as usize;
            if incl > 80 {
                data[pos + 16 + incl - 6] ^= 0x55;
            }
            pos += 16 + incl;
        }
        let rep = decode_pcap_bytes(&data).unwrap();
        assert_eq!(rep.frames, clean.frames);
        assert!(rep.icrc_bad > 0);
        assert!(!rep.malformed_list.is_empty());
    }

    #[test]
    fn dropped_request_shows_as_psn_gap() {
        let p = pcaps()
            .into_iter()
            .find(|p| p.to_string_lossy().contains("ref_06"))
            .unwrap();
        let data = std::fs::read(&p).unwrap();
        let (mut r, link, _) = PcapReader::new(&data).unwrap();
        assert_eq!(link, LINKTYPE_ETHERNET);
        let mut rep = Report::default();
        let (mut n, mut dropped) = (0, 0);
        while let Some((pkt, _)) = r.next_record().unwrap() {
            n += 1;
            let is_write = parse_frame(pkt)
                .map(|(f, _)| f.transport.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY)
                .unwrap_or(false);
            // Drop the 10th and 11th RDMA WRITE: one gap of two PSNs.
            if is_write {
                dropped += 1;
                if dropped == 10 || dropped == 11 {
                    continue;
                }
            }
            rep.frames += 1;
            rep.add_frame(n, pkt);
        }
        assert_eq!(rep.psn_gaps(), 1);
        let q = rep.qps.values().find(|q| q.requests > 0).unwrap();
        assert_eq!(q.psns_missing, 2);
        assert_eq!(q.psn_repeats, 0);
        assert_eq!(rep.icrc_bad + rep.malformed, 0);
    }

    #[test]
    fn sll_and_nanosecond_pcaps_decode() {
        let p = &pcaps()[0];
        let data = std::fs::read(p).unwrap();
        let clean = decode_pcap_bytes(&data).unwrap();
        // Rewrite as nanosecond, Linux cooked (SLL) capture.
        let mut out = Vec::new();
        out.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes());
        out.extend_from_slice(&data[4..20]);
        out.extend_from_slice(&LINKTYPE_LINUX_SLL.to_le_bytes());
        let (mut r, _, _) = PcapReader::new(&data).unwrap();
        while let Some((pkt, _)) = r.next_record().unwrap() {
            let mut sll = vec![0u8; 14];
            sll.extend_from_slice(&pkt[12..14]);
            sll.extend_from_slice(&pkt[14..]);
            out.extend_from_slice(&[0u8; 8]);
            out.extend_from_slice(&(sll.len() as u32).to_le_bytes());
            out.extend_from_slice(&(sll.len() as u32).to_le_bytes());
            out.extend_from_slice(&sll);
        }
        let rep = decode_pcap_bytes(&out).unwrap();
        assert!(rep.nanosecond);
        assert_eq!(rep.roce, clean.roce);
        assert_eq!(rep.icrc_ok, clean.icrc_ok);
        assert_eq!(rep.malformed, 0);
    }
}
