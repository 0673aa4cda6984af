//! `xroce decode FILE [--json]`: decode every RoCEv2 frame of a capture
//! with the wire codec, verify its ICRC, and report totals, an opcode
//! histogram, per-QP PSN gaps and malformed frames with the reason, and
//! one line per connection-management MAD (UD SENDs to QP1: REQ, REP, REJ
//! with its reason, ..., rdma_cm's service ID and addresses).
//!
//! Reads pcap (microsecond or nanosecond timestamps, either byte order) and
//! pcapng through [`xroce::capture`], with link types Ethernet, Linux cooked
//! SLL / SLL2 and raw IP. When a pcapng marks frames as received or sent
//! (`epb_flags`), the report counts each direction and its per-frame lines
//! say which one ([`DIRECTION_HELP`]). The report logic
//! ([`decode_capture_bytes`], [`Report`]) is I/O free so tests can run it on
//! the reference captures.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use xroce::capture::{Capture, CaptureError, Direction, LINKTYPE_ETHERNET};
use xroce_report::{CmLine, DecodeReport, Problem, QpTraffic};
use xroce_wire::cm::{ib_mtu_bytes, CmMadRepr, CmMessage};
use xroce_wire::rdma_cm::{split_service_id, CmaHeader};
use xroce_wire::{icrc, mad, parse_frame, Error as WireError, Gid, Opcode, Syndrome};

/// How the output shows the direction of a frame; `xroce decode --help`
/// prints it.
pub const DIRECTION_HELP: &str = "\
Direction: a pcapng capture may mark each frame as received or sent (its
epb_flags, as dumpcap and `xroce capture -w` write them). The text
report then counts both on its first line (\"N frames (I in, O out)\") and
each per-frame line says \"frame N (in)\" for a received frame or
\"frame N (out)\" for a sent one; --json gives frames_in and frames_out,
and a \"direction\": \"in\" or \"out\" on each cm and problems entry.
Frames without a mark (classic pcap, or pcapng without flags) show neither.";

#[derive(clap::Args, Debug)]
#[command(after_help = DIRECTION_HELP)]
pub struct DecodeArgs {
    /// pcap or pcapng file to decode
    pub file: PathBuf,
    /// print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &DecodeArgs) -> anyhow::Result<()> {
    let report = decode_file(&args.file)?;
    if args.json {
        println!("{}", serde_json::to_string(&report.to_report())?);
    } else {
        eprint!("{}", report.to_text(&args.file.display().to_string()));
    }
    Ok(())
}

/// At most this many malformed frames are listed individually.
pub const MAX_LISTED_MALFORMED: usize = 100;

/// One QP's row of the report as it is being counted, and the PSN its
/// next request should carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpState {
    pub traffic: QpTraffic,
    expected: Option<u32>,
}

/// Everything `xroce decode` reports.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Counted straight into the `--json` report; its `opcodes_named`,
    /// `psn_gaps` and `qps` stay empty until [`Report::to_report`] derives
    /// them.
    pub counts: DecodeReport,
    /// (destination GID, destination QPN) -> traffic.
    pub qps: BTreeMap<(Gid, u32), QpState>,
}

const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_IPV4: u32 = 228;
const LINKTYPE_IPV6: u32 = 229;
const LINKTYPE_LINUX_SLL: u32 = 113;
const LINKTYPE_LINUX_SLL2: u32 = 276;

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

/// "in" or "out" as the JSON report carries it.
fn direction_text(direction: Option<Direction>) -> Option<String> {
    direction.map(|d| d.as_str().to_owned())
}

/// " (in)", " (out)" or nothing, after "frame N" in the text report.
fn direction_mark(direction: Option<&str>) -> String {
    direction.map(|d| format!(" ({d})")).unwrap_or_default()
}

impl Report {
    fn problem(&mut self, frame: u64, direction: Option<Direction>, reason: String) {
        if self.counts.problems.len() < MAX_LISTED_MALFORMED {
            self.counts.problems.push(Problem {
                frame,
                reason,
                direction: direction_text(direction),
            });
        }
    }

    fn malformed(&mut self, frame: u64, direction: Option<Direction>, reason: String) {
        self.counts.malformed += 1;
        self.problem(frame, direction, reason);
    }

    /// Account one Ethernet frame (number `n`, 1-based), received or sent
    /// if the capture says.
    pub fn add_frame(&mut self, n: u64, frame: &[u8], direction: Option<Direction>) {
        let (repr, payload) = match parse_frame(frame) {
            Ok(x) => x,
            Err(e) if e.is_not_roce() => {
                self.counts.not_roce += 1;
                return;
            }
            Err(e) => {
                // A UDP/4791 frame we cannot decode is RoCE traffic gone wrong.
                self.counts.roce += 1;
                self.malformed(n, direction, e.to_string());
                return;
            }
        };
        self.counts.roce += 1;
        match icrc::verify_frame(frame) {
            Ok(()) => self.counts.icrc_ok += 1,
            Err(e @ WireError::BadIcrc { .. }) => {
                self.counts.icrc_bad += 1;
                self.problem(n, direction, e.to_string());
            }
            Err(e) => self.malformed(n, direction, e.to_string()),
        }
        let t = &repr.transport;
        let op = t.bth.opcode;
        *self.counts.opcodes.entry(op as u8).or_default() += 1;
        if mad::is_gsi(t) {
            match CmMadRepr::parse(payload) {
                Ok(m) => self.counts.cm.push(CmLine {
                    frame: n,
                    message: cm_line(&m),
                    direction: direction_text(direction),
                }),
                Err(e) => self.malformed(n, direction, format!("GSI MAD: {e}")),
            }
        }
        if op == Opcode::CNP {
            return;
        }
        let (dst, dest_qp) = (repr.ip.dst_gid(), t.bth.dest_qp);
        let state = self.qps.entry((dst, dest_qp)).or_insert_with(|| QpState {
            traffic: QpTraffic {
                dst: dst.to_string(),
                dest_qp,
                ..QpTraffic::default()
            },
            expected: None,
        });
        let q = &mut state.traffic;
        q.packets += 1;
        q.sr_capable += u64::from(t.bth.sr_capable);
        let psn = t.bth.psn;
        if op.is_response() {
            q.responses += 1;
            q.sr_responses += u64::from(t.bth.sr_capable);
            let ack = matches!(t.aeth.map(|a| a.syndrome), Some(Syndrome::Ack { .. }));
            if ack && op == Opcode::RC_ACKNOWLEDGE && xroce_wire::sack::Sack::parse(payload).is_ok()
            {
                q.sacks += 1;
            }
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
        if let Some(exp) = state.expected {
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
        state.expected = if op == Opcode::RC_RDMA_READ_REQUEST {
            None
        } else {
            Some(xroce_wire::psn_add(psn, 1))
        };
    }

    pub fn psn_gaps(&self) -> u64 {
        self.qps.values().map(|q| q.traffic.psn_gaps).sum()
    }

    /// The report `--json` prints.
    pub fn to_report(&self) -> DecodeReport {
        let mut opcodes_named = BTreeMap::new();
        for (op, n) in &self.counts.opcodes {
            // Every unknown opcode byte shares one name.
            *opcodes_named
                .entry(opcode_name(*op).to_string())
                .or_default() += n;
        }
        DecodeReport {
            opcodes_named,
            psn_gaps: self.psn_gaps(),
            qps: self.qps.values().map(|q| q.traffic.clone()).collect(),
            ..self.counts.clone()
        }
    }

    /// Human-readable report.
    pub fn to_text(&self, name: &str) -> String {
        let mut s = String::new();
        let directions = match (self.counts.frames_in, self.counts.frames_out) {
            (None, None) => String::new(),
            (i, o) => {
                let (i, o) = (i.unwrap_or(0), o.unwrap_or(0));
                let unmarked = self.counts.frames.saturating_sub(i + o);
                if unmarked > 0 {
                    format!(" ({i} in, {o} out, {unmarked} unmarked)")
                } else {
                    format!(" ({i} in, {o} out)")
                }
            }
        };
        let _ = writeln!(
            s,
            "{name}: {} frames{directions}, {} RoCEv2, {} other",
            self.counts.frames, self.counts.roce, self.counts.not_roce
        );
        let _ = writeln!(
            s,
            "ICRC ok {}  bad {}  malformed {}",
            self.counts.icrc_ok, self.counts.icrc_bad, self.counts.malformed
        );
        let _ = writeln!(s, "\n{:<6} {:<36} {:>10}", "opcode", "name", "frames");
        for (op, n) in &self.counts.opcodes {
            let _ = writeln!(s, "{op:#06x} {:<36} {n:>10}", opcode_name(*op));
        }
        let _ = writeln!(
            s,
            "\n{:<28} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7}",
            "dst QP", "packets", "requests", "first_psn", "last_psn", "psn_gaps", "repeats", "naks"
        );
        for ((gid, qpn), QpState { traffic: q, .. }) in &self.qps {
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
        if !self.counts.cm.is_empty() {
            let _ = writeln!(
                s,
                "\nconnection management ({} MADs):",
                self.counts.cm.len()
            );
            for CmLine {
                frame: n,
                message: l,
                direction: d,
            } in &self.counts.cm
            {
                let _ = writeln!(s, "  frame {n}{}: {l}", direction_mark(d.as_deref()));
            }
        }
        if !self.counts.problems.is_empty() {
            let _ = writeln!(s, "\nproblems (first {MAX_LISTED_MALFORMED}):");
            for m in &self.counts.problems {
                let mark = direction_mark(m.direction.as_deref());
                let _ = writeln!(s, "  frame {}{mark}: {}", m.frame, m.reason);
            }
        }
        s
    }
}

/// "RDMA_PS_TCP:7174" for rdma_cm's service IDs, else the hex ID.
fn service_name(sid: u64) -> String {
    match split_service_id(sid) {
        Some((ps, port)) => format!("{}:{port}", ps.name()),
        None => format!("{sid:#018x}"),
    }
}

/// rdma_cm's header at the start of REQ / SIDR_REQ private data, as
/// "cma v4 10.0.0.1:40000 -> 10.0.0.2:7174" (the destination port is the
/// service ID's).
fn cma_summary(private_data: &[u8], sid: u64) -> String {
    match (CmaHeader::parse(private_data), split_service_id(sid)) {
        (Ok(h), Some((_, dport))) => {
            let v = if h.src_ip.is_ipv4() { 4 } else { 6 };
            let sock = |ip: std::net::IpAddr, port: u16| match ip {
                std::net::IpAddr::V4(a) => format!("{a}:{port}"),
                std::net::IpAddr::V6(a) => format!("[{a}]:{port}"),
            };
            format!(
                "cma v{v} {} -> {}",
                sock(h.src_ip, h.src_port),
                sock(h.dst_ip, dport)
            )
        }
        _ => "opaque".into(),
    }
}

/// One CM MAD as one line: the message, its IDs and what it negotiates.
fn cm_line(m: &CmMadRepr) -> String {
    let tid = m.header.transaction_id;
    let name = m.message.attribute().name();
    let rest = match &m.message {
        CmMessage::Req(r) => format!(
            "comm={:#010x} svc={} lqpn={:#x} psn={:#x} mtu={} rr={} id={} retry={} rnr={} \
             gid {} -> {} tc={} hop={} fl={:#x} private={}",
            r.local_comm_id,
            service_name(r.service_id),
            r.local_qpn,
            r.starting_psn,
            ib_mtu_bytes(r.path_mtu).unwrap_or(0),
            r.responder_resources,
            r.initiator_depth,
            r.retry_count,
            r.rnr_retry_count,
            r.primary_path.local_gid,
            r.primary_path.remote_gid,
            r.primary_path.traffic_class,
            r.primary_path.hop_limit,
            r.primary_path.flow_label,
            cma_summary(r.private_data, r.service_id),
        ),
        CmMessage::Rep(r) => format!(
            "comm={:#010x} remote={:#010x} lqpn={:#x} psn={:#x} rr={} id={} rnr={}",
            r.local_comm_id,
            r.remote_comm_id,
            r.local_qpn,
            r.starting_psn,
            r.responder_resources,
            r.initiator_depth,
            r.rnr_retry_count
        ),
        CmMessage::Rtu(r) | CmMessage::Drep(r) => {
            format!(
                "comm={:#010x} remote={:#010x}",
                r.local_comm_id, r.remote_comm_id
            )
        }
        CmMessage::Dreq(r) => format!(
            "comm={:#010x} remote={:#010x} rqpn={:#x}",
            r.local_comm_id, r.remote_comm_id, r.remote_qpn
        ),
        CmMessage::Rej(r) => format!(
            "comm={:#010x} remote={:#010x} of={:?} reason={}",
            r.local_comm_id, r.remote_comm_id, r.message_rejected, r.reason
        ),
        CmMessage::Mra(r) => format!(
            "comm={:#010x} remote={:#010x} of={:?} timeout={}",
            r.local_comm_id, r.remote_comm_id, r.message_mraed, r.service_timeout
        ),
        CmMessage::SidrReq(r) => format!(
            "req={:#010x} svc={} private={}",
            r.request_id,
            service_name(r.service_id),
            cma_summary(r.private_data, r.service_id)
        ),
        CmMessage::SidrRep(r) => format!(
            "req={:#010x} status={:?} svc={} qpn={:#x} qkey={:#x}",
            r.request_id,
            r.status,
            service_name(r.service_id),
            r.qpn,
            r.qkey
        ),
        CmMessage::Lap(_) | CmMessage::Apr(_) => "(not decoded)".into(),
    };
    format!("CM {name} tid={tid:#x} {rest}")
}

fn opcode_name(op: u8) -> &'static str {
    Opcode::from_u8(op).map(|o| o.name()).unwrap_or("UNKNOWN")
}

/// Read and decode the capture at `path`.
pub fn decode_file(path: &Path) -> anyhow::Result<Report> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    decode_capture_bytes(&data).map_err(|e| match e {
        CaptureError::NotACapture => {
            anyhow::anyhow!("{} is not a pcap or pcapng capture", path.display())
        }
        e => anyhow::Error::new(e).context(format!("cannot decode {}", path.display())),
    })
}

/// Decode a whole pcap or pcapng capture held in memory.
pub fn decode_capture_bytes(data: &[u8]) -> Result<Report, CaptureError> {
    let capture = Capture::parse(data)?;
    let mut rep = Report {
        counts: DecodeReport {
            link_type: capture.link_type().unwrap_or_default(),
            nanosecond: capture.nanosecond(),
            ..DecodeReport::default()
        },
        ..Report::default()
    };
    for (n, p) in (1u64..).zip(capture) {
        let p = p?;
        rep.counts.frames += 1;
        rep.counts.bytes += p.data.len() as u64;
        if let Some(d) = p.direction {
            // Once a frame is marked, both directions are counted, zero or not.
            let c = &mut rep.counts;
            let (frames_in, frames_out) =
                (c.frames_in.get_or_insert(0), c.frames_out.get_or_insert(0));
            match d {
                Direction::Inbound => *frames_in += 1,
                Direction::Outbound => *frames_out += 1,
            }
        }
        let Some(frame) = to_ethernet(p.link_type, &p.data) else {
            rep.counts.not_roce += 1;
            continue;
        };
        if p.is_truncated() {
            // Snap length cut the frame: decodable headers, unverifiable ICRC.
            if parse_frame(&frame).is_err_and(|e| e.is_not_roce()) {
                rep.counts.not_roce += 1;
            } else {
                rep.counts.roce += 1;
                rep.malformed(
                    n,
                    p.direction,
                    format!(
                        "captured {} of {} bytes (snaplen)",
                        p.data.len(),
                        p.orig_len
                    ),
                );
            }
            continue;
        }
        rep.add_frame(n, &frame, p.direction);
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcaps() -> Vec<PathBuf> {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/data/rxe");
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

    /// The packets of a capture as (timestamp, frame).
    fn packets(data: &[u8]) -> Vec<(std::time::Duration, Vec<u8>)> {
        Capture::parse(data)
            .unwrap()
            .map(|p| p.map(|p| (p.timestamp, p.data.into_owned())).unwrap())
            .collect()
    }

    /// A classic pcap with `header` holding `frames`.
    fn write_pcap(
        header: pcap_file::pcap::PcapHeader,
        frames: &[(std::time::Duration, Vec<u8>)],
    ) -> Vec<u8> {
        use pcap_file::pcap::{PcapPacket, PcapWriter};
        let mut w = PcapWriter::with_header(Vec::new(), header).unwrap();
        for (ts, f) in frames {
            w.write_packet(&PcapPacket::new(*ts, f.len() as u32, f))
                .unwrap();
        }
        w.into_writer()
    }

    /// xroce-wire's RDMA-CM captures (Linux rdma_cm over rxe).
    fn cm_capture(name: &str) -> Report {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../wire/tests/data/cm")
            .join(format!("{name}.pcap"));
        decode_capture_bytes(&std::fs::read(&p).unwrap()).unwrap()
    }

    #[test]
    fn cm_mads_one_line_each() {
        let rep = cm_capture("rping");
        assert_eq!(rep.counts.malformed, 0, "{:?}", rep.counts.problems);
        let lines: Vec<&str> = rep.counts.cm.iter().map(|c| c.message.as_str()).collect();
        assert_eq!(
            rep.counts.cm.iter().map(|c| c.frame).collect::<Vec<_>>(),
            [1, 2, 3, 124, 125]
        );
        assert_eq!(
            lines[0],
            "CM REQ tid=0x22b3a307b comm=0x7b303a2b svc=RDMA_PS_TCP:7174 lqpn=0x11 psn=0x1c04e \
             mtu=4096 rr=1 id=1 retry=7 rnr=7 gid 10.77.0.11 -> 10.77.0.10 tc=0 hop=64 \
             fl=0x47c23 private=cma v4 10.77.0.11:43075 -> 10.77.0.10:7174"
        );
        assert_eq!(
            lines[1],
            "CM REP tid=0x22b3a307b comm=0x3b9bd8cd remote=0x7b303a2b lqpn=0x11 psn=0x5cb7ea \
             rr=1 id=1 rnr=7"
        );
        assert_eq!(
            lines[2],
            "CM RTU tid=0x22b3a307b comm=0x7b303a2b remote=0x3b9bd8cd"
        );
        assert_eq!(
            lines[3],
            "CM DREQ tid=0x22b3a307b comm=0x7b303a2b remote=0x3b9bd8cd rqpn=0x11"
        );
        assert!(lines[4].starts_with("CM DREP "));
        let text = rep.to_text("rping.pcap");
        assert!(text.contains("connection management (5 MADs):"));
        assert!(text.contains("  frame 1: CM REQ "));
        assert_eq!(rep.to_report().cm[2].frame, 3);

        let rej = cm_capture("rej");
        assert_eq!(
            rej.counts.cm[1].message,
            "CM REJ tid=0x22b3a307d comm=0x00000000 remote=0x7d303a2b of=Req \
             reason=invalid service ID (8)"
        );
        let sidr = cm_capture("udaddy");
        assert_eq!(
            sidr.counts.cm[1].message,
            "CM SIDR_REP tid=0x22b3a3079 req=0x79303a2b status=Success svc=RDMA_PS_UDP:7174 \
             qpn=0x13 qkey=0x1234567"
        );
        let v6 = cm_capture("rping_ipv6");
        assert!(v6.counts.cm[1]
            .message
            .ends_with("private=cma v6 [fd77::11]:41736 -> [fd77::10]:7174"));
    }

    #[test]
    fn malformed_gsi_mad_is_reported() {
        let data = std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/data/cm/rej.pcap"),
        )
        .unwrap();
        let mut frames = packets(&data);
        // The REQ's MAD starts after Ethernet, IPv4, UDP, BTH and DETH.
        let mad_at = 14 + 20 + 8 + 12 + 8;
        frames[0].1[mad_at] = 9; // base version
        xroce_wire::icrc::fill_frame(&mut frames[0].1).unwrap();
        let rep = decode_capture_bytes(&write_pcap(Default::default(), &frames)).unwrap();
        assert_eq!(rep.counts.malformed, 1);
        assert_eq!(
            rep.counts.problems[0].reason,
            "GSI MAD: MAD base version 9 (must be 1)"
        );
        assert_eq!(rep.counts.cm.len(), 1);
    }

    #[test]
    fn reference_captures_decode_clean() {
        for p in pcaps() {
            let rep = decode_capture_bytes(&std::fs::read(&p).unwrap()).unwrap();
            assert!(rep.counts.roce > 0, "{}: no RoCEv2 frames", p.display());
            assert_eq!(
                rep.counts.icrc_bad,
                0,
                "{}: {:?}",
                p.display(),
                rep.counts.problems
            );
            assert_eq!(
                rep.counts.malformed,
                0,
                "{}: {:?}",
                p.display(),
                rep.counts.problems
            );
            assert_eq!(rep.counts.icrc_ok, rep.counts.roce);
            assert_eq!(rep.counts.roce + rep.counts.not_roce, rep.counts.frames);
            let j = rep.to_report();
            assert_eq!(j.opcodes.values().sum::<u64>(), rep.counts.roce);
            assert_eq!(j.opcodes_named.values().sum::<u64>(), rep.counts.roce);
            // What `--json` prints reads back as the same report.
            let text = serde_json::to_string(&j).unwrap();
            assert_eq!(serde_json::from_str::<DecodeReport>(&text).unwrap(), j);
        }
    }

    /// Each reference capture rewritten as pcapng (one Ethernet interface,
    /// microsecond timestamps, as `editcap -F pcapng` writes it) and as a
    /// big-endian pcap decodes to the same report.
    #[test]
    fn pcapng_and_big_endian_decode_as_the_pcap() {
        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
        use pcap_file::pcapng::blocks::interface_description::{
            InterfaceDescriptionBlock, InterfaceDescriptionOption,
        };
        use pcap_file::pcapng::PcapNgWriter;
        for p in pcaps() {
            let data = std::fs::read(&p).unwrap();
            let want = decode_capture_bytes(&data).unwrap().to_report();
            let frames = packets(&data);

            let mut w = PcapNgWriter::new(Vec::new()).unwrap();
            let mut idb = InterfaceDescriptionBlock::new(pcap_file::DataLink::ETHERNET, 262144);
            idb.options.push(InterfaceDescriptionOption::IfTsResol(6));
            w.write_pcapng_block(idb).unwrap();
            for (ts, f) in &frames {
                w.write_pcapng_block(EnhancedPacketBlock {
                    interface_id: 0,
                    // Microsecond units, which pcap-file carries as nanoseconds.
                    timestamp: std::time::Duration::from_nanos(ts.as_micros() as u64),
                    original_len: f.len() as u32,
                    data: f.into(),
                    options: vec![],
                })
                .unwrap();
            }
            let ng = w.into_inner();
            assert_eq!(&ng[..4], &[0x0a, 0x0d, 0x0d, 0x0a]);
            assert_eq!(packets(&ng), frames, "{}", p.display());
            let got = decode_capture_bytes(&ng).unwrap().to_report();
            assert_eq!(got, want, "{} as pcapng", p.display());

            let be = write_pcap(
                pcap_file::pcap::PcapHeader {
                    endianness: pcap_file::Endianness::Big,
                    ..Default::default()
                },
                &frames,
            );
            assert_eq!(&be[..4], &[0xa1, 0xb2, 0xc3, 0xd4]);
            assert_eq!(decode_capture_bytes(&be).unwrap().to_report(), want);
        }
    }

    #[test]
    fn neither_pcap_nor_pcapng_is_named_as_such() {
        let dir = std::env::temp_dir().join(format!("xroce-decode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, content) in [("text.pcap", &b"hello, world\n"[..]), ("empty.pcap", b"")] {
            let f = dir.join(name);
            std::fs::write(&f, content).unwrap();
            let e = decode_file(&f).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{} is not a pcap or pcapng capture", f.display())
            );
        }
        // A real capture cut short is damaged, not foreign.
        let data = std::fs::read(&pcaps()[0]).unwrap();
        let f = dir.join("cut.pcap");
        std::fs::write(&f, &data[..1000]).unwrap();
        let e = format!("{:#}", decode_file(&f).unwrap_err());
        assert!(
            e.starts_with(&format!("cannot decode {}: pcap capture ends", f.display())),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn corrupt_frame_is_reported_not_panicking() {
        let p = &pcaps()[0];
        let data = std::fs::read(p).unwrap();
        let clean = decode_capture_bytes(&data).unwrap();
        // Flip one payload byte of every frame near its end: ICRCs break.
        let mut frames = packets(&data);
        for (_, f) in &mut frames {
            if f.len() > 80 {
                let n = f.len();
                f[n - 6] ^= 0x55;
            }
        }
        let rep = decode_capture_bytes(&write_pcap(Default::default(), &frames)).unwrap();
        assert_eq!(rep.counts.frames, clean.counts.frames);
        assert!(rep.counts.icrc_bad > 0);
        assert!(!rep.counts.problems.is_empty());
    }

    #[test]
    fn dropped_request_shows_as_psn_gap() {
        let p = pcaps()
            .into_iter()
            .find(|p| p.to_string_lossy().contains("ref_06"))
            .unwrap();
        let data = std::fs::read(&p).unwrap();
        assert_eq!(
            Capture::parse(&data).unwrap().link_type(),
            Some(LINKTYPE_ETHERNET)
        );
        let mut rep = Report::default();
        let (mut n, mut dropped) = (0, 0);
        for (_, pkt) in packets(&data) {
            n += 1;
            let is_write = parse_frame(&pkt)
                .map(|(f, _)| f.transport.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY)
                .unwrap_or(false);
            // Drop the 10th and 11th RDMA WRITE: one gap of two PSNs.
            if is_write {
                dropped += 1;
                if dropped == 10 || dropped == 11 {
                    continue;
                }
            }
            rep.counts.frames += 1;
            rep.add_frame(n, &pkt, None);
        }
        assert_eq!(rep.psn_gaps(), 1);
        let q = &rep
            .qps
            .values()
            .find(|q| q.traffic.requests > 0)
            .unwrap()
            .traffic;
        assert_eq!(q.psns_missing, 2);
        assert_eq!(q.psn_repeats, 0);
        assert_eq!(rep.counts.icrc_bad + rep.counts.malformed, 0);
    }

    #[test]
    fn sll_and_nanosecond_pcaps_decode() {
        let p = &pcaps()[0];
        let data = std::fs::read(p).unwrap();
        let clean = decode_capture_bytes(&data).unwrap();
        // Rewrite as nanosecond, Linux cooked (SLL) capture.
        let sll: Vec<_> = packets(&data)
            .into_iter()
            .map(|(ts, pkt)| {
                let mut sll = vec![0u8; 14];
                sll.extend_from_slice(&pkt[12..14]);
                sll.extend_from_slice(&pkt[14..]);
                (ts, sll)
            })
            .collect();
        let out = write_pcap(
            pcap_file::pcap::PcapHeader {
                datalink: pcap_file::DataLink::LINUX_SLL,
                ts_resolution: pcap_file::TsResolution::NanoSecond,
                ..Default::default()
            },
            &sll,
        );
        let rep = decode_capture_bytes(&out).unwrap();
        assert!(rep.counts.nanosecond);
        assert_eq!(rep.counts.link_type, LINKTYPE_LINUX_SLL);
        assert_eq!(rep.counts.roce, clean.counts.roce);
        assert_eq!(rep.counts.icrc_ok, clean.counts.icrc_ok);
        assert_eq!(rep.counts.malformed, 0);
    }

    #[test]
    fn snap_length_cuts_are_reported() {
        let p = &pcaps()[0];
        let frames: Vec<_> = packets(&std::fs::read(p).unwrap());
        let mut w = pcap_file::pcap::PcapWriter::with_header(
            Vec::new(),
            pcap_file::pcap::PcapHeader {
                snaplen: 100,
                ..Default::default()
            },
        )
        .unwrap();
        for (ts, f) in &frames {
            let cut = &f[..f.len().min(100)];
            w.write_raw_packet(&pcap_file::pcap::RawPcapPacket {
                ts_sec: ts.as_secs() as u32,
                ts_frac: ts.subsec_micros(),
                incl_len: cut.len() as u32,
                orig_len: f.len() as u32,
                data: cut.into(),
            })
            .unwrap();
        }
        let rep = decode_capture_bytes(&w.into_writer()).unwrap();
        assert_eq!(rep.counts.frames as usize, frames.len());
        let cut = frames.iter().filter(|(_, f)| f.len() > 100).count() as u64;
        assert!(cut > 0);
        assert!(rep.counts.malformed <= cut && rep.counts.malformed > 0);
        assert!(rep.counts.problems[0].reason.ends_with("bytes (snaplen)"));
    }

    /// `frames` as a pcapng written by xroce's own writer, each with its
    /// direction (or none).
    fn write_pcapng(frames: &[(std::time::Duration, Vec<u8>, Option<Direction>)]) -> Vec<u8> {
        let options = xroce::capture::WriteOptions {
            nanosecond: true,
            format: xroce::capture::FileFormat::PcapNg,
            if_name: Some("eth1".into()),
            ..Default::default()
        };
        let mut w = xroce::capture::PcapWriter::new(Vec::new(), options).unwrap();
        for (ts, f, d) in frames {
            w.write_with(*ts, f, f.len() as u32, *d).unwrap();
        }
        w.into_inner()
    }

    /// rping's capture as the client (10.77.0.11) would record it: what it
    /// sent is out, the rest in.
    fn rping_as_client() -> Vec<(std::time::Duration, Vec<u8>, Option<Direction>)> {
        let data = std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/data/cm/rping.pcap"),
        )
        .unwrap();
        let client = Gid::from_ipv4([10, 77, 0, 11]);
        packets(&data)
            .into_iter()
            .map(|(ts, f)| {
                let from_client = parse_frame(&f).is_ok_and(|(r, _)| r.ip.src_gid() == client);
                let d = if from_client {
                    Direction::Outbound
                } else {
                    Direction::Inbound
                };
                (ts, f, Some(d))
            })
            .collect()
    }

    #[test]
    fn pcapng_directions_are_counted_and_marked() {
        let frames = rping_as_client();
        let sent = frames
            .iter()
            .filter(|f| f.2 == Some(Direction::Outbound))
            .count() as u64;
        let rep = decode_capture_bytes(&write_pcapng(&frames)).unwrap();
        let n = frames.len() as u64;
        assert!(sent > 0 && sent < n);
        assert_eq!(rep.counts.frames, n);
        assert_eq!(
            (rep.counts.frames_in, rep.counts.frames_out),
            (Some(n - sent), Some(sent))
        );
        assert_eq!(rep.counts.malformed, 0, "{:?}", rep.counts.problems);
        let cm: Vec<(u64, Option<&str>)> = rep
            .counts
            .cm
            .iter()
            .map(|c| (c.frame, c.direction.as_deref()))
            .collect();
        // REQ and RTU from the client, REP from the server, then the
        // client's DREQ and the server's DREP.
        assert_eq!(
            cm,
            [
                (1, Some("out")),
                (2, Some("in")),
                (3, Some("out")),
                (124, Some("out")),
                (125, Some("in"))
            ]
        );

        let text = rep.to_text("rping.pcapng");
        assert!(
            text.starts_with(&format!(
                "rping.pcapng: {n} frames ({} in, {sent} out), ",
                n - sent
            )),
            "{text}"
        );
        assert!(text.contains("  frame 1 (out): CM REQ "), "{text}");
        assert!(text.contains("  frame 2 (in): CM REP "), "{text}");

        let json = serde_json::to_value(rep.to_report()).unwrap();
        assert_eq!(json["frames_in"], n - sent);
        assert_eq!(json["frames_out"], sent);
        assert_eq!(json["cm"][0]["direction"], "out");
        assert_eq!(json["cm"][1]["direction"], "in");
        // What --json prints reads back as the same report.
        let back: DecodeReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, rep.to_report());

        // Without directions the report is the classic pcap's.
        let unmarked: Vec<_> = frames
            .iter()
            .map(|(t, f, _)| (*t, f.clone(), None))
            .collect();
        let plain = decode_capture_bytes(&write_pcapng(&unmarked))
            .unwrap()
            .to_report();
        let pcap_frames: Vec<_> = frames.iter().map(|(t, f, _)| (*t, f.clone())).collect();
        let mut classic = decode_capture_bytes(&write_pcap(
            pcap_file::pcap::PcapHeader {
                ts_resolution: pcap_file::TsResolution::NanoSecond,
                ..Default::default()
            },
            &pcap_frames,
        ))
        .unwrap()
        .to_report();
        assert_eq!(plain, classic);
        let text = serde_json::to_string(&classic).unwrap();
        assert!(
            !text.contains("direction") && !text.contains("frames_in"),
            "{text}"
        );
        classic.frames_in = Some(0);
        assert_ne!(plain, classic);
    }

    /// A problem frame says its direction; frames without one are counted
    /// as unmarked beside those with one.
    #[test]
    fn problems_say_their_direction() {
        let mut frames = rping_as_client();
        // Break the REQ's ICRC (sent) and leave the REP (received) unmarked.
        let n = frames[0].1.len();
        frames[0].1[n - 6] ^= 0x55;
        frames[1].2 = None;
        let rep = decode_capture_bytes(&write_pcapng(&frames)).unwrap();
        assert_eq!(rep.counts.icrc_bad, 1);
        assert_eq!(rep.counts.problems[0].frame, 1);
        assert_eq!(rep.counts.problems[0].direction.as_deref(), Some("out"));
        assert_eq!(rep.counts.cm[1].direction, None);
        let text = rep.to_text("x");
        assert!(text.contains(", 1 unmarked), "), "{text}");
        assert!(text.contains("  frame 1 (out): ICRC mismatch"), "{text}");
        assert!(text.contains("  frame 2: CM REP "), "{text}");
    }
}
