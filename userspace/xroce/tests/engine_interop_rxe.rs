//! Wire interoperability with Linux rdma_rxe, from reference captures
//! (`userspace/wire/tests/data/rxe`, two rxe peers running `ibv_rc_pingpong`
//! and `ib_write_bw`).
//!
//! Our engine plays the server (10.99.0.11, QPN 0x11): the client's frames
//! from the capture are fed to it, and every frame the rxe server sent must
//! be matched, header field by header field and byte for byte in the
//! payload, by the frame our engine emits at that point (SEND segmentation,
//! PSNs, AckReq, coalesced ACK PSN/syndrome/MSN, UDP source port).

use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;
use std::path::PathBuf;

use xroce::capture;
use xroce::engine::EngineConfig;
use xroce::verbs::*;
use xroce_wire::{emit_frame, parse_frame_checked, psn_le, FrameRepr, Gid, Opcode, TransportRepr};

/// The rxe server of every capture.
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 11);

/// The reference captures, committed beside the codec's tests.
fn pcap_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/data/rxe");
    assert!(d.is_dir(), "reference captures missing at {}", d.display());
    d
}

/// (timestamp ns, frame) of every packet of a capture: whole Ethernet frames.
fn read_pcap(path: &std::path::Path) -> Vec<(u64, Vec<u8>)> {
    capture::read_packets(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .map(|p| {
            assert_eq!(p.link_type, capture::LINKTYPE_ETHERNET);
            assert!(!p.is_truncated(), "snap length cut a frame");
            (p.timestamp.as_nanos() as u64, p.data.into_owned())
        })
        .collect()
}

/// A frame's headers (ICRC checked) and where its payload is.
fn parse(f: &[u8]) -> Option<(FrameRepr, Range<usize>)> {
    let (h, payload) = parse_frame_checked(f).ok()?;
    let start = payload.as_ptr() as usize - f.as_ptr() as usize;
    Some((h, start..start + payload.len()))
}

fn from_server(h: &FrameRepr) -> bool {
    h.ip.src_gid() == Gid::from(SERVER_IP)
}

fn is_ack(h: &FrameRepr) -> bool {
    h.transport.bth.opcode == Opcode::RC_ACKNOWLEDGE
}

/// What must match rxe's frame: every transport header, the UDP source
/// port, addresses.
fn fields(h: &FrameRepr) -> impl std::fmt::Debug + PartialEq {
    (
        h.transport,
        h.udp.src_port,
        (h.ip.src_gid(), h.ip.dst_gid(), h.eth.src, h.eth.dst),
    )
}

/// Our transport headers as rxe's would be. xroce's QPs (in their default
/// Auto mode) set the selective-repeat capable bit on every request they
/// send; rxe ignores that reserved bit and never sets it, so neither half
/// of our QP switches and nothing else differs. Checks that the bit is on
/// our requests and never on our responses, then clears it.
fn as_rxe_would(mut t: TransportRepr) -> TransportRepr {
    assert_eq!(
        t.bth.sr_capable,
        !t.bth.opcode.is_response(),
        "the SR capable bit belongs on our requests only: {t:?}"
    );
    t.bth.sr_capable = false;
    t
}

fn replay(file: &str, mtu: Mtu) {
    let dir = pcap_dir();
    let frames: Vec<(u64, Vec<u8>, FrameRepr, Range<usize>)> = read_pcap(&dir.join(file))
        .into_iter()
        .filter_map(|(t, f)| parse(&f).map(|(h, r)| (t, f, h, r)))
        .collect();
    let client = frames.iter().find(|f| !from_server(&f.2)).unwrap();
    let server_req = frames
        .iter()
        .find(|f| from_server(&f.2) && !is_ack(&f.2))
        .unwrap();
    let cfg = EngineConfig {
        mac: server_req.2.eth.src,
        ip: SERVER_IP,
        ecn_capable: false, // rxe does not mark ECT
        // rxe asks for ACKs by packet count only, and its capture's clock
        // (a slow VM) spaces packets further than xroce's time bound.
        ack_req_interval_ns: 0,
        ..Default::default()
    };
    let dev = Device::new(cfg);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(1024).unwrap();
    let qp = dev.create_qp(&pd, &QpInitAttr::rc(&cq)).unwrap();
    assert_eq!(
        qp.qp_num(),
        client.2.transport.bth.dest_qp,
        "rxe's first QPN is 0x11, like ours"
    );
    let rx = pd.reg_mr(512 * 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let tx = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let local = QpAttr {
        qp_access_flags: AccessFlags::LOCAL_WRITE,
        path_mtu: mtu,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        sq_psn: server_req.2.transport.bth.psn,
        ..Default::default()
    };
    let remote = RemoteQp {
        qpn: client.2.transport.bth.dest_qp,
        psn: client.2.transport.bth.psn,
        av: AddressVector {
            dest_mac: client.2.eth.src,
            dest_ip: client.2.ip.src_gid().to_ip(),
            ..Default::default()
        },
    };
    qp.connect(&local, &remote).unwrap();
    for i in 0..256 {
        qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![rx.sge(i as usize * 4096, 4096)],
        })
        .unwrap();
    }

    let mut buf = vec![0u8; 9000];
    let mut matched = 0;
    let mut skipped = 0;
    let mut max_req_psn: Option<u32> = None;
    let mut client_msgs: Vec<Vec<u8>> = Vec::new();
    let mut cur = Vec::new();
    let mut i = 0;
    while i < frames.len() {
        let (t, f, h, r) = &frames[i];
        let opcode = h.transport.bth.opcode;
        if !from_server(h) {
            if !is_ack(h) {
                cur.extend_from_slice(&f[r.clone()]);
                if matches!(opcode, Opcode::RC_SEND_LAST | Opcode::RC_SEND_ONLY) {
                    client_msgs.push(std::mem::take(&mut cur));
                }
            }
            dev.handle_frame(f, *t);
            i += 1;
            continue;
        }
        if !is_ack(h) {
            let psn = h.transport.bth.psn;
            if let Some(m) = max_req_psn {
                if psn_le(psn, m) {
                    // rxe's retransmission timer fired here (TCG stalls);
                    // timing-driven, so our engine does not repeat it.
                    skipped += 1;
                    i += 1;
                    continue;
                }
            }
            max_req_psn = Some(psn);
        }
        if matches!(opcode, Opcode::RC_SEND_FIRST | Opcode::RC_SEND_ONLY) {
            // The server application posts a SEND: gather its payload from
            // the capture and post the same message.
            let mut msg = Vec::new();
            for (_, f2, h2, r2) in &frames[i..] {
                if from_server(h2) && !is_ack(h2) {
                    msg.extend_from_slice(&f2[r2.clone()]);
                    let op2 = h2.transport.bth.opcode;
                    if matches!(op2, Opcode::RC_SEND_LAST | Opcode::RC_SEND_ONLY) {
                        break;
                    }
                }
            }
            // SAFETY: rc_pingpong sends again only once its last SEND completed, so the ACK for
            // ours was among the frames handled above; the engine runs only in our calls.
            unsafe { tx.write(0, &msg) }.unwrap();
            qp.post_send(&SendWr::new(
                i as u64,
                WrOpcode::Send,
                vec![tx.sge(0, msg.len())],
            ))
            .unwrap();
        }
        let n = dev
            .poll_transmit_frame(*t, &mut buf)
            .unwrap_or_else(|| panic!("frame {i}: rxe sent {h:?}, we sent nothing"));
        let (mut ours, or) = parse(&buf[..n]).expect("our frame parses");
        ours.transport = as_rxe_would(ours.transport);
        assert_eq!(fields(&ours), fields(h), "frame {i}: ours vs rxe");
        assert_eq!(&buf[or], &f[r.clone()], "frame {i}: payload");
        assert_eq!(n, f.len(), "frame {i}: length");
        matched += 1;
        i += 1;
    }
    assert!(
        dev.poll_transmit_frame(u64::MAX / 2, &mut buf).is_none(),
        "nothing extra to send"
    );
    // Completions: every client message received intact, every send done.
    let mut wcs = vec![Wc::default(); 1024];
    let n = cq.poll(&mut wcs).unwrap();
    let recvs: Vec<&Wc> = wcs[..n]
        .iter()
        .filter(|w| w.opcode == WcOpcode::Recv)
        .collect();
    assert_eq!(recvs.len(), client_msgs.len());
    for (w, m) in recvs.iter().zip(&client_msgs) {
        assert_eq!(w.status, WcStatus::Success);
        // SAFETY: receive w.wr_id, the only WR on its 4 KiB slot, has completed.
        assert_eq!(
            unsafe { rx.to_vec(w.wr_id as usize * 4096, m.len()) }.unwrap(),
            *m
        );
    }
    let st = dev.stats();
    assert_eq!(st.rx_bad_icrc + st.rx_malformed + st.rx_out_of_sequence, 0);
    eprintln!(
        "{file}: matched {matched} rxe frames (skipped {skipped} rxe timer retransmissions); {} messages received",
        client_msgs.len()
    );
    assert!(matched >= 200);
}

#[test]
fn rc_pingpong_mtu1024_matches_rxe() {
    replay("ref_01_rc_pingpong_4096B_x100.pcap", Mtu::Mtu1024);
}

#[test]
fn rc_pingpong_mtu4096_matches_rxe() {
    replay("ref_13_mtu4096_rc_pingpong_4096B_x100.pcap", Mtu::Mtu4096);
}

/// `ib_write_bw` (4 KiB WRITEs, MTU 1024, several messages in flight):
/// our responder, fed the client's WRITE stream, must emit the same ACK
/// sequence (PSN, syndrome, MSN) as the rxe server did. The RETH rkey and
/// address are rewritten to our MR (keys are random by design).
fn replay_write_bw(file: &str) {
    let dir = pcap_dir();
    let frames: Vec<(u64, FrameRepr, Vec<u8>)> = read_pcap(&dir.join(file))
        .into_iter()
        .filter_map(|(t, f)| parse(&f).map(|(h, r)| (t, h, f[r].to_vec())))
        .collect();
    let first = frames.iter().find(|f| !from_server(&f.1)).unwrap();
    let server_mac = first.1.eth.dst;
    let min_va = frames
        .iter()
        .filter_map(|f| f.1.transport.reth.map(|r| r.va))
        .min()
        .unwrap();
    let max_end = frames
        .iter()
        .filter_map(|f| f.1.transport.reth.map(|r| r.va + r.dma_len as u64))
        .max()
        .unwrap();
    let dev = Device::new(EngineConfig {
        mac: server_mac,
        ip: SERVER_IP,
        ecn_capable: false,
        ..Default::default()
    });
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    // perftest's QP is not the first one: create QPs up to its number.
    let mut qps = Vec::new();
    let qp = loop {
        let qp = dev.create_qp(&pd, &QpInitAttr::rc(&cq)).unwrap();
        if qp.qp_num() == first.1.transport.bth.dest_qp {
            break qp;
        }
        qps.push(qp);
    };
    let mr = pd
        .reg_mr(
            (max_end - min_va) as usize,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let client_qpn = frames
        .iter()
        .find(|f| from_server(&f.1))
        .map(|f| f.1.transport.bth.dest_qp)
        .unwrap();
    let local = QpAttr {
        qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        path_mtu: Mtu::Mtu1024,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        ..Default::default()
    };
    let remote = RemoteQp {
        qpn: client_qpn,
        psn: first.1.transport.bth.psn,
        av: AddressVector {
            dest_mac: first.1.eth.src,
            dest_ip: first.1.ip.src_gid().to_ip(),
            ..Default::default()
        },
    };
    qp.connect(&local, &remote).unwrap();
    let mut buf = vec![0u8; 9000];
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut last_payload = Vec::new();
    for (t, h, payload) in &frames {
        if from_server(h) {
            theirs.push(h.transport);
            continue;
        }
        let mut h2 = *h;
        if let Some(r) = &mut h2.transport.reth {
            r.rkey = mr.rkey();
            r.va = mr.addr() + (r.va - min_va);
            last_payload.clear();
        }
        last_payload.extend_from_slice(payload);
        let n = emit_frame(&h2, payload, &mut buf).unwrap();
        let f = buf[..n].to_vec();
        dev.handle_frame(&f, *t);
        while let Some(n) = dev.poll_transmit_frame(*t, &mut buf) {
            let (o, _) = parse(&buf[..n]).unwrap();
            assert_eq!(
                o.udp.src_port, h.udp.src_port,
                "rxe's UDP source port for the QP pair"
            );
            ours.push(o.transport);
        }
    }
    assert_eq!(ours.len(), theirs.len(), "number of ACKs");
    assert_eq!(ours, theirs, "ACK sequence (every BTH and AETH field)");
    let st = dev.stats();
    assert_eq!(
        st.rx_bad_icrc + st.rx_malformed + st.rx_out_of_sequence + st.rx_duplicate,
        0
    );
    eprintln!("{file}: {} ACKs identical to rxe's", ours.len());
}

#[test]
fn ib_write_bw_4k_acks_match_rxe() {
    replay_write_bw("ref_05_ib_write_bw_4KiB_x1000.pcap");
}

#[test]
fn ib_write_bw_8b_acks_match_rxe() {
    replay_write_bw("ref_06_ib_write_bw_8B_x1000.pcap");
}

/// The other side of `ib_write_bw`: our requester posts the same WRITEs
/// (same remote address, rkey and data) and is fed rxe's ACKs; every
/// request frame must match the rxe client's (opcode, PSN, AckReq, RETH,
/// payload, UDP source port).
fn replay_write_bw_requester(file: &str) {
    let dir = pcap_dir();
    let frames: Vec<(u64, FrameRepr, Vec<u8>, Vec<u8>)> = read_pcap(&dir.join(file))
        .into_iter()
        .filter_map(|(t, f)| parse(&f).map(|(h, r)| (t, h, f[r].to_vec(), f)))
        .collect();
    let first = frames.iter().find(|f| !from_server(&f.1)).unwrap();
    let ack = frames.iter().find(|f| from_server(&f.1)).unwrap();
    let IpAddr::V4(client_ip) = first.1.ip.src_gid().to_ip() else {
        panic!("the captures are IPv4")
    };
    let dev = Device::new(EngineConfig {
        mac: first.1.eth.src,
        ip: client_ip,
        ecn_capable: false,
        // Never the limit here: rxe decided when to send, we follow.
        max_inflight_pkts: 1 << 20,
        max_device_inflight_pkts: 0,
        // rxe asks for ACKs by packet count only (see rc_pingpong's replay).
        ack_req_interval_ns: 0,
        ..Default::default()
    });
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(2048).unwrap();
    let mut init = QpInitAttr::rc(&cq);
    init.cap.max_send_wr = 2048;
    let mut qps = Vec::new();
    let qp = loop {
        let qp = dev.create_qp(&pd, &init).unwrap();
        if qp.qp_num() == ack.1.transport.bth.dest_qp {
            break qp;
        }
        qps.push(qp);
    };
    let msgs = frames
        .iter()
        .filter(|f| f.1.transport.reth.is_some())
        .count();
    let mr = pd
        .reg_mr(msgs * 4096 + 4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let local = QpAttr {
        qp_access_flags: AccessFlags::LOCAL_WRITE,
        path_mtu: Mtu::Mtu1024,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        sq_psn: first.1.transport.bth.psn,
        ..Default::default()
    };
    let remote = RemoteQp {
        qpn: first.1.transport.bth.dest_qp,
        psn: ack.1.transport.bth.psn, // unused: the server sends no requests
        av: AddressVector {
            dest_mac: first.1.eth.dst,
            dest_ip: first.1.ip.dst_gid().to_ip(),
            ..Default::default()
        },
    };
    qp.connect(&local, &remote).unwrap();
    let mut buf = vec![0u8; 9000];
    let mut msg = 0usize;
    let mut compared = 0;
    for (i, (t, h, payload, raw)) in frames.iter().enumerate() {
        if from_server(h) {
            dev.handle_frame(raw, *t);
            continue;
        }
        if let Some(r) = h.transport.reth {
            // The application posts the WRITE this FIRST/ONLY packet starts.
            let mut data = Vec::new();
            for (_, h2, p2, _) in &frames[i..] {
                if !from_server(h2) {
                    data.extend_from_slice(p2);
                    if data.len() >= r.dma_len as usize {
                        break;
                    }
                }
            }
            let off = msg * 4096;
            // SAFETY: no WR uses slot `msg` yet (each WRITE has its own); the engine runs only in our calls.
            unsafe { mr.write(off, &data) }.unwrap();
            let wr = SendWr::new(
                msg as u64,
                WrOpcode::RdmaWrite {
                    remote_addr: r.va,
                    rkey: r.rkey,
                },
                vec![mr.sge(off, r.dma_len as usize)],
            )
            .flags(SendFlags::empty());
            qp.post_send(&wr).unwrap();
            msg += 1;
        }
        let n = dev
            .poll_transmit_frame(*t, &mut buf)
            .unwrap_or_else(|| panic!("frame {i}: rxe sent {h:?}, we sent nothing"));
        let (o, or) = parse(&buf[..n]).unwrap();
        assert_eq!(
            (as_rxe_would(o.transport), o.udp.src_port),
            (h.transport, h.udp.src_port),
            "frame {i}"
        );
        assert_eq!(&buf[or], &payload[..], "frame {i} payload");
        compared += 1;
    }
    let st = dev.stats();
    assert_eq!(st.tx_retransmitted, 0);
    assert_eq!(qp.state(), QpState::Rts);
    eprintln!("{file}: {compared} request frames identical to rxe's client");
}

#[test]
fn ib_write_bw_requests_match_rxe() {
    replay_write_bw_requester("ref_05_ib_write_bw_4KiB_x1000.pcap");
    replay_write_bw_requester("ref_06_ib_write_bw_8B_x1000.pcap");
}
