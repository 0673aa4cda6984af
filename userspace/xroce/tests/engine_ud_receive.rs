//! The UD receive side.
//!
//! The 40 bytes in front of a UD receive's payload, for frames built here
//! with header fields the engine never sends itself (TTL 1 as
//! ibv_ud_pingpong's AH asks, an identification, DSCP/ECN, a flow label):
//! for IPv4 20 zero bytes and the IPv4 header exactly as it was on the
//! wire, for IPv6 the IPv6 header exactly as on the wire (rxe_resp.c
//! copies the received header; RoCEv2 annex A17.4.5.2), with the GRH flag
//! and the header's family in the completion.
//!
//! A datagram that arrives late for a destroyed UD QP reaches no QP: the
//! next QP does not get the freed number.

use std::net::{IpAddr, Ipv6Addr};

use xroce::verbs::sim::sim_configs;
use xroce::verbs::*;
use xroce_wire::{emit_frame, BthRepr, DethRepr, FrameRepr, Gid, IpRepr, Opcode, TransportRepr};

const GRH_LEN: usize = 40;
const QKEY: u32 = 0x1111_1111;
const PAYLOAD: &[u8] = b"ping";

/// A UD QP on a fresh device, up to RTS, with one receive of 64 bytes
/// posted at offset 0 of the returned MR.
fn receiver() -> (Device, QueuePair, CompletionQueue, MemoryRegion) {
    let (_, cfg) = sim_configs();
    let dev = Device::new(cfg);
    let (qp, cq, mr) = ud_qp(&dev, 7);
    (dev, qp, cq, mr)
}

/// A UD QP of `dev` up to RTR with [`QKEY`], and a receive `wr_id` of 64
/// bytes posted at offset 0 of the returned MR (filled with 0xee).
fn ud_qp(dev: &Device, wr_id: u64) -> (QueuePair, CompletionQueue, MemoryRegion) {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(8).unwrap();
    let mut init = QpInitAttr::rc(&cq);
    init.qp_type = QpType::Ud;
    let qp = dev.create_qp(&pd, &init).unwrap();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qkey: QKEY,
        port_num: 1,
        ..Default::default()
    };
    qp.modify(
        &a,
        QpAttrMask::STATE | QpAttrMask::QKEY | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT,
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    qp.modify(&a, QpAttrMask::STATE).unwrap();
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: no work request uses the MR yet.
    unsafe { mr.write(0, &[0xee; 64]) }.unwrap();
    qp.post_recv(&RecvWr {
        wr_id,
        sg_list: vec![mr.sge(0, 64)],
    })
    .unwrap();
    (qp, cq, mr)
}

/// A UD SEND of [`PAYLOAD`] from QP 0x99 to `dest_qp` at `dst`, whose IP
/// header `adjust` sets; the frame's bytes.
fn ud_frame(
    dev: &Device,
    src: IpAddr,
    dst: IpAddr,
    dest_qp: u32,
    adjust: impl Fn(&mut IpRepr),
) -> Vec<u8> {
    let mac = dev.lock().config().mac;
    let mut t = TransportRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, dest_qp, 0));
    t.deth = Some(DethRepr {
        qkey: QKEY,
        src_qp: 0x99,
    });
    let mut f = FrameRepr::new(
        [2, 0, 0, 0, 0, 9],
        mac,
        Gid::from(src),
        Gid::from(dst),
        0xc000,
        t,
    );
    adjust(&mut f.ip);
    let mut buf = vec![0u8; 256];
    let n = emit_frame(&f, PAYLOAD, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Deliver `frame` and return the receive's completion and its 64 bytes.
fn deliver(dev: &Device, cq: &CompletionQueue, mr: &MemoryRegion, frame: &[u8]) -> (Wc, Vec<u8>) {
    dev.handle_frame(frame, 1_000_000);
    let wc = cq.poll_one().unwrap().expect("the datagram was received");
    // SAFETY: the receive has completed; nothing else writes the MR.
    let bytes = unsafe { mr.to_vec(0, 64) }.unwrap();
    (wc, bytes)
}

#[test]
fn ipv4_grh_is_20_zero_bytes_and_the_received_ipv4_header() {
    let (dev, qp, cq, mr) = receiver();
    let ip = dev.lock().config().ip;
    let frame = ud_frame(
        &dev,
        "10.0.0.9".parse().unwrap(),
        ip.into(),
        qp.qp_num(),
        |h| {
            let IpRepr::V4(h) = h else { unreachable!() };
            (h.ttl, h.ident, h.dscp, h.ecn) = (1, 0x1c46, 26, 1);
        },
    );
    let (wc, got) = deliver(&dev, &cq, &mr, &frame);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!((wc.wr_id, wc.src_qp), (7, 0x99));
    assert!(wc.flags.contains(WcFlags::GRH));
    assert_eq!(wc.network_hdr, NetworkHdr::Ipv4);
    assert_eq!(wc.byte_len as usize, GRH_LEN + PAYLOAD.len());
    let d = ip.octets();
    // 36 bytes after the IP header: UDP 8, BTH 12, DETH 8, "ping", ICRC 4.
    let mut want = vec![0u8; 20];
    want.extend_from_slice(&[
        0x45, 0x69, 0x00, 0x38, // version/IHL, TOS (DSCP 26, ECT(1)), total length 56
        0x1c, 0x46, 0x40, 0x00, // identification, DF (as rxe sends)
        0x01, 0x11, 0x00, 0x00, // TTL 1, UDP, checksum (below)
        10, 0, 0, 9, // source
        d[0], d[1], d[2], d[3], // destination: what UCX's DGID check compares
    ]);
    let sum = internet_checksum(&want[20..]);
    want[30..32].copy_from_slice(&sum.to_be_bytes());
    assert_eq!(&got[..GRH_LEN], &want[..]);
    // ... which is the frame's IPv4 header byte for byte (after Ethernet).
    assert_eq!(&got[20..GRH_LEN], &frame[14..34]);
    assert_eq!(&got[GRH_LEN..GRH_LEN + 4], PAYLOAD);
    assert_eq!(got[GRH_LEN + 4], 0xee, "nothing past the datagram");
}

#[test]
fn ipv6_grh_is_the_received_ipv6_header() {
    let (dev, qp, cq, mr) = receiver();
    let dst: Ipv6Addr = dev.lock().config().ipv6[0];
    let src: Ipv6Addr = "fe80::9".parse().unwrap();
    let frame = ud_frame(&dev, src.into(), dst.into(), qp.qp_num(), |h| {
        let IpRepr::V6(h) = h else { unreachable!() };
        (h.hop_limit, h.traffic_class, h.flow_label) = (1, 0x6a, 0xabcde);
    });
    let (wc, got) = deliver(&dev, &cq, &mr, &frame);
    assert_eq!(wc.status, WcStatus::Success);
    assert!(wc.flags.contains(WcFlags::GRH));
    assert_eq!(wc.network_hdr, NetworkHdr::Ipv6);
    let mut want = vec![
        0x66, 0xaa, 0xbc, 0xde, // version 6, traffic class 0x6a, flow label 0xabcde
        0x00, 0x24, 0x11, 0x01, // payload length 36, next header UDP, hop limit 1
    ];
    want.extend_from_slice(&src.octets());
    want.extend_from_slice(&dst.octets());
    assert_eq!(&got[..GRH_LEN], &want[..]);
    assert_eq!(&got[..GRH_LEN], &frame[14..54]);
    assert_eq!(&got[GRH_LEN..GRH_LEN + 4], PAYLOAD);
}

/// RFC 1071 over a header whose checksum field is zero.
fn internet_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

#[test]
fn a_late_datagram_for_a_destroyed_qp_reaches_no_other_qp() {
    let (dev, old_qp, _old_cq, _old_mr) = receiver();
    let old_qpn = old_qp.qp_num();
    drop(old_qp);
    // The next UD QP of the device, receive posted, same Q_Key (UCX gives
    // every UD QP the same one).
    let (qp, cq, mr) = ud_qp(&dev, 8);
    assert_ne!(qp.qp_num(), old_qpn, "a freed QPN was handed out at once");
    let ip = dev.lock().config().ip;
    let late = ud_frame(
        &dev,
        "10.0.0.9".parse().unwrap(),
        ip.into(),
        old_qpn,
        |_| {},
    );
    let unknown = dev.lock().stats().rx_unknown_qp;
    dev.handle_frame(&late, 1_000_000);
    assert!(
        cq.poll_one().unwrap().is_none(),
        "the new QP got the old QP's datagram"
    );
    assert_eq!(
        dev.lock().stats().rx_unknown_qp,
        unknown + 1,
        "counted as for no QP"
    );
    // The new QP's own datagrams arrive.
    let own = ud_frame(
        &dev,
        "10.0.0.9".parse().unwrap(),
        ip.into(),
        qp.qp_num(),
        |_| {},
    );
    let (wc, got) = deliver(&dev, &cq, &mr, &own);
    assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, 8));
    assert_eq!(&got[GRH_LEN..GRH_LEN + 4], PAYLOAD);
}
