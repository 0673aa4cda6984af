//! Frames emitted by the codec, one or more per opcode (IPv4, IPv6, VLAN,
//! every pad count), are written to a pcap and dissected by tshark: no
//! frame may be malformed or carry an expert-info error/warning, and tshark
//! must see the opcode, QPN and PSN we wrote, and the ICRC it shows must be
//! the one in the frame.
//!
//! tshark is required: if it is missing this test fails (install it with
//! `apt-get install tshark`).

use std::io::Write;
use std::process::Command;

use xroce_wire::aeth::{AethRepr, Syndrome};
use xroce_wire::eth::VlanTag;
use xroce_wire::ext::*;
use xroce_wire::*;

/// A transport repr for `op` with plausible values in every header it carries.
pub fn sample_transport(op: Opcode, qpn: u32, psn: u32) -> TransportRepr {
    let h = op.headers();
    let mut bth = BthRepr::new(op, qpn, psn);
    bth.ack_req = op.is_last() || op.is_only();
    if op == Opcode::CNP {
        bth.mig_req = false;
        bth.psn = 0;
        bth.becn = true;
    }
    let mut t = TransportRepr::new(bth);
    let reth = RethRepr {
        va: 0x7f00_1234_5000,
        rkey: 0x1234,
        dma_len: 4096,
    };
    t.deth = h.contains(HeaderSet::DETH).then_some(DethRepr {
        qkey: 0x1111_1111,
        src_qp: 0x17,
    });
    t.feth = h.contains(HeaderSet::FETH).then_some(FethRepr {
        selectivity: 1,
        placement_type: 1,
    });
    t.reth = h.contains(HeaderSet::RETH).then_some(reth);
    t.atomic_eth = h.contains(HeaderSet::ATOMIC_ETH).then_some(AtomicEthRepr {
        va: 0x7f00_1234_5000,
        rkey: 0x1234,
        swap_add: 5,
        compare: 3,
    });
    t.aeth = h.contains(HeaderSet::AETH).then_some(AethRepr {
        syndrome: Syndrome::ACK,
        msn: 9,
    });
    t.atomic_ack_eth = h
        .contains(HeaderSet::ATOMIC_ACK_ETH)
        .then_some(AtomicAckEthRepr { orig_data: 42 });
    t.imm_data = h.contains(HeaderSet::IMM_DT).then_some(0xdead_beef);
    t.invalidate_rkey = h.contains(HeaderSet::IETH).then_some(0x4321);
    t
}

/// (frame bytes, opcode, qpn, psn) for every opcode in several encodings.
fn frames() -> Vec<(Vec<u8>, Opcode, u32, u32)> {
    let v4a = Gid::from_ipv4([10, 99, 0, 11]);
    let v4b = Gid::from_ipv4([10, 99, 0, 12]);
    let v6a = Gid::from_hex("fd000000000000000000000000000011").unwrap();
    let v6b = Gid::from_hex("fd000000000000000000000000000012").unwrap();
    let mut out = Vec::new();
    let mut psn = 0xff_fff0u32;
    for &op in Opcode::ALL {
        let payloads: &[usize] = if op == Opcode::RC_ATOMIC_WRITE {
            &[8]
        } else if op.has_payload() {
            &[0, 1, 2, 3, 64, 1024]
        } else {
            &[0]
        };
        for &len in payloads {
            for variant in 0..3 {
                let (s, d) = if variant == 1 { (v6a, v6b) } else { (v4a, v4b) };
                let qpn = 0x11 + variant as u32;
                let t = sample_transport(op, qpn, psn);
                let mut r = FrameRepr::new(
                    [2, 0, 0, 0, 0, 1],
                    [2, 0, 0, 0, 0, 2],
                    s,
                    d,
                    rocev2_src_port(0, 0x10, qpn),
                    t,
                );
                if variant == 2 {
                    r.eth.vlan = Some(VlanTag::dot1q(3, 100));
                }
                let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let mut b = vec![0u8; r.frame_len(len)];
                emit_frame(&r, &payload, &mut b).unwrap();
                out.push((b, op, qpn, t.bth.psn));
                psn = psn::psn_add(psn, 1);
            }
        }
    }
    out
}

fn write_pcap(path: &std::path::Path, frames: &[(Vec<u8>, Opcode, u32, u32)]) {
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    let header = PcapHeader {
        endianness: pcap_file::Endianness::Little,
        ..PcapHeader::default()
    };
    let f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = PcapWriter::with_header(f, header).unwrap();
    for (i, (b, ..)) in frames.iter().enumerate() {
        let ts = std::time::Duration::from_secs(i as u64);
        w.write_packet(&PcapPacket::new(ts, b.len() as u32, b))
            .unwrap();
    }
    w.into_writer().flush().unwrap();
}

/// Protocols with heuristic dissectors on `infiniband.payload` (`tshark -G heuristic-decodes`).
const PAYLOAD_HEURISTICS: &[&str] = &[
    "smc",
    "smb_direct",
    "rpcordma",
    "nvme-rdma",
    "lnet",
    "iser",
    "infiniband.eoib",
    "infiniband_sdp",
    "fcoib",
];

fn tshark() -> &'static str {
    let ok = Command::new("tshark")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "tshark is not installed: run `apt-get install tshark` (this test must not be skipped)"
    );
    "tshark"
}

#[test]
fn tshark_dissects_every_opcode_cleanly() {
    let bin = tshark();
    let frames = frames();
    let dir = std::env::temp_dir().join(format!("xroce-wire-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("codec_frames.pcap");
    write_pcap(&path, &frames);

    let out = Command::new(bin)
        .args(["-n", "-r"])
        .arg(&path)
        .args([
            "-d",
            "udp.port==4791,infiniband",
            "-T",
            "fields",
            "-E",
            "separator=|",
        ])
        // The payload is opaque test bytes: keep tshark's upper-layer guessers
        // (RPC-over-RDMA, EoIB, ...) from parsing it as their protocol.
        .args(
            PAYLOAD_HEURISTICS
                .iter()
                .flat_map(|h| ["--disable-protocol", h]),
        )
        .args([
            "-e",
            "frame.number",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.destqp",
        ])
        .args([
            "-e",
            "infiniband.bth.psn",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
        ])
        .args([
            "-e",
            "_ws.expert.message",
            "-e",
            "infiniband.invariant.crc",
            "-e",
            "infiniband.reth.r_key",
        ])
        .args(["-e", "infiniband.deth.q_key", "-e", "infiniband.aeth.msn"])
        .output()
        .expect("run tshark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), frames.len(), "tshark output:\n{stdout}");
    let mut problems = Vec::new();
    for (line, (bytes, op, qpn, psn)) in lines.iter().zip(&frames) {
        let f: Vec<&str> = line.split('|').collect();
        let num = |s: &str| {
            let s = s.trim();
            s.strip_prefix("0x")
                .map(|h| u32::from_str_radix(h, 16))
                .unwrap_or_else(|| s.parse())
                .ok()
        };
        if num(f[1]) != Some(*op as u32) || num(f[2]) != Some(*qpn) || num(f[3]) != Some(*psn) {
            problems.push(format!("{op}: tshark saw {line}"));
        }
        if TSHARK_BTH_ONLY.contains(op) {
            // Checked above: BTH fields; and below: no malformed/expert marks.
            continue_checks(&f, op, line, &mut problems);
            continue;
        }
        let n = bytes.len();
        let icrc = u32::from_be_bytes([bytes[n - 4], bytes[n - 3], bytes[n - 2], bytes[n - 1]]);
        if num(f[7]) != Some(icrc) {
            problems.push(format!(
                "{op}: tshark's ICRC field is not the frame's last 4 bytes: {line}"
            ));
        }
        let h = op.headers();
        if h.contains(HeaderSet::RETH) && num(f[8]) != Some(0x1234) {
            problems.push(format!("{op}: RETH R_Key not seen: {line}"));
        }
        if h.contains(HeaderSet::DETH) && num(f[9]) != Some(0x1111_1111) {
            problems.push(format!("{op}: DETH Q_Key not seen: {line}"));
        }
        if h.contains(HeaderSet::AETH) && num(f[10]) != Some(9) {
            problems.push(format!("{op}: AETH MSN not seen: {line}"));
        }
        continue_checks(&f, op, line, &mut problems);
    }
    if std::env::var_os("XROCE_KEEP_PCAP").is_none() {
        std::fs::remove_dir_all(&dir).ok();
    } else {
        eprintln!("kept {}", path.display());
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Opcodes Debian 12's tshark (4.0) dissects only up to the BTH (it shows
/// "Unknown opcode" + "Unknown/Vendor Specific Data"): the IBTA 1.5 FLUSH and
/// ATOMIC WRITE, and the RoCEv2 CNP. For these only the BTH is compared.
const TSHARK_BTH_ONLY: &[Opcode] = &[Opcode::RC_FLUSH, Opcode::RC_ATOMIC_WRITE, Opcode::CNP];

/// No malformed mark and no expert info of severity warning or error.
fn continue_checks(f: &[&str], op: &Opcode, line: &str, problems: &mut Vec<String>) {
    if !f[4].trim().is_empty()
        || f[5].contains("error")
        || f[5].contains("warn")
        || has_bad_severity(f[5])
    {
        problems.push(format!("{op}: malformed/expert: {line}"));
    }
}

/// Expert severities come as numbers (wireshark: chat 0x200000, note 0x400000,
/// warn 0x600000, error 0x800000) or names depending on the version.
fn has_bad_severity(s: &str) -> bool {
    s.split(',').any(|v| {
        let v = v.trim();
        let n = v
            .strip_prefix("0x")
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .or_else(|| v.parse().ok());
        matches!(n, Some(n) if n >= 0x0060_0000)
    })
}

/// The checks above can fail: a frame cut in the middle of its RETH (with
/// consistent IP/UDP lengths) is reported as malformed.
#[test]
fn tshark_check_flags_a_broken_frame() {
    let bin = tshark();
    let t = sample_transport(Opcode::RC_RDMA_WRITE_FIRST, 0x11, 5);
    let r = FrameRepr::new(
        [2, 0, 0, 0, 0, 1],
        [2, 0, 0, 0, 0, 2],
        Gid::from_ipv4([10, 0, 0, 1]),
        Gid::from_ipv4([10, 0, 0, 2]),
        0xc001,
        t,
    );
    let mut b = vec![0u8; r.frame_len(0)];
    emit_frame(&r, &[], &mut b).unwrap();
    b.truncate(14 + 20 + 8 + 12 + 6);
    let n = b.len();
    b[16..18].copy_from_slice(&((n - 14) as u16).to_be_bytes());
    b[38..40].copy_from_slice(&((n - 34) as u16).to_be_bytes());
    xroce_wire::ipv4::Ipv4Packet::new_unchecked(&mut b[14..]).fill_checksum();
    let dir = std::env::temp_dir().join(format!("xroce-wire-tshark-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.pcap");
    write_pcap(&path, &[(b, Opcode::RC_RDMA_WRITE_FIRST, 0x11, 5)]);
    let out = Command::new(bin)
        .args(["-n", "-r"])
        .arg(&path)
        .args([
            "-d",
            "udp.port==4791,infiniband",
            "-T",
            "fields",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
        ])
        .output()
        .expect("run tshark");
    std::fs::remove_dir_all(&dir).ok();
    let s = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = s.trim_end().split('\t').collect();
    assert!(
        !f[0].is_empty() || has_bad_severity(f.get(1).unwrap_or(&"")),
        "tshark did not flag a cut RETH: {s:?}"
    );
    assert!(xroce_wire::parse_frame(&[]).is_err());
}
