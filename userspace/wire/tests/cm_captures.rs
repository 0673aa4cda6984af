//! The CM codec against Linux's ib_cm / rdma_cm over rxe (captures in
//! tests/data/cm, made as its README says): every MAD parses, re-emits to
//! the captured bytes, and says what each scenario implies.

mod common;

use std::net::IpAddr;
use std::path::PathBuf;

use xroce_wire::cm::{
    Attribute, CmMadRepr, CmMessage, MessageRef, RejReason, RepRepr, ReqRepr, SidrStatus,
    TransportType,
};
use xroce_wire::mad::{self, MAD_LEN};
use xroce_wire::rdma_cm::{service_id, CmaHeader, PortSpace};
use xroce_wire::{parse_frame, FrameRepr, Gid, Opcode};

const SERVER_V4: &str = "10.77.0.10";
const CLIENT_V4: &str = "10.77.0.11";
const SERVER_V6: &str = "fd77::10";
const CLIENT_V6: &str = "fd77::11";

/// One captured frame: its headers and UDP payload past the transport
/// headers (the MAD for a GSI frame).
struct Frame {
    repr: FrameRepr,
    payload: Vec<u8>,
}

fn capture(name: &str) -> Vec<Frame> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/cm")
        .join(format!("{name}.pcap"));
    common::read_pcap(&path)
        .iter()
        .map(|f| {
            let (repr, payload) = parse_frame(f).expect("every captured frame is RoCEv2");
            Frame {
                repr,
                payload: payload.to_vec(),
            }
        })
        .collect()
}

/// The CM MADs of a capture, in order, with the frame that carried each.
fn mads(frames: &[Frame]) -> Vec<(&Frame, CmMadRepr<'_>)> {
    frames
        .iter()
        .filter(|f| mad::is_gsi(&f.repr.transport))
        .map(|f| (f, CmMadRepr::parse(&f.payload).expect("CM MAD parses")))
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn names(m: &[(&Frame, CmMadRepr<'_>)]) -> Vec<&'static str> {
    m.iter()
        .map(|(_, m)| m.message.attribute().name())
        .collect()
}

const ALL: [&str; 8] = [
    "rping",
    "ucmatose",
    "udaddy",
    "rdma_server",
    "ib_write_bw_R",
    "ib_write_bw_R_rejected",
    "rej",
    "rping_ipv6",
];

#[test]
fn every_mad_parses_and_re_emits_byte_for_byte() {
    let mut total = 0;
    for name in ALL {
        let frames = capture(name);
        let gsi: Vec<&Frame> = frames
            .iter()
            .filter(|f| mad::is_gsi(&f.repr.transport))
            .collect();
        assert!(!gsi.is_empty(), "{name}: no GSI MADs");
        for f in gsi {
            // ib_cm's MADs: a UD SEND from QP1, no padding, 256 bytes.
            assert_eq!(f.payload.len(), MAD_LEN, "{name}");
            assert_eq!(f.repr.transport.deth.unwrap().src_qp, mad::GSI_QPN);
            assert_eq!(f.repr.transport.bth.pkey, 0xffff);
            let m = CmMadRepr::parse(&f.payload).unwrap();
            assert_eq!(m.header.method, mad::METHOD_SEND, "{name}");
            assert_eq!(m.header.status, 0);
            assert_eq!(m.header.attribute_modifier, 0);
            let mut out = [0xa5u8; MAD_LEN];
            assert_eq!(m.emit(&mut out), Ok(MAD_LEN));
            assert_eq!(&out[..], &f.payload[..], "{name}: re-emitted MAD differs");
            assert_eq!(CmMadRepr::parse(&out).unwrap(), m);
            total += 1;
        }
    }
    assert_eq!(total, 5 + 5 + 2 + 6 + 10 + 6 + 2 + 6);
}

/// The request PSNs a capture shows for the QP at `dst` / `qpn`.
fn request_psns(frames: &[Frame], dst: IpAddr, qpn: u32) -> Vec<u32> {
    frames
        .iter()
        .filter(|f| {
            let t = &f.repr.transport;
            !mad::is_gsi(t)
                && t.bth.dest_qp == qpn
                && f.repr.ip.dst_gid() == Gid::from(dst)
                && !t.bth.opcode.is_response()
        })
        .map(|f| f.repr.transport.bth.psn)
        .collect()
}

/// REQ -> REP -> RTU -> data -> DREQ -> DREP of an RC connection from the
/// client to the server's `port` (RDMA_PS_TCP), checked against the data
/// frames: QPNs, starting PSNs, comm IDs, TIDs, rdma_cm's header and flow
/// label.
fn check_rc_connection(name: &str, server: IpAddr, client: IpAddr, port: u16) {
    let frames = capture(name);
    let m = mads(&frames);
    let at = |a: Attribute| {
        m.iter()
            .filter(|(_, x)| x.message.attribute() == a)
            .collect::<Vec<_>>()
    };
    let (req_f, req) = at(Attribute::Req)[0];
    let CmMessage::Req(req_m) = req.message else {
        unreachable!()
    };
    let (rep_f, rep) = at(Attribute::Rep)[0];
    let CmMessage::Rep(rep_m) = rep.message else {
        unreachable!()
    };
    let (_, rtu) = at(Attribute::Rtu)[0];
    let CmMessage::Rtu(rtu_m) = rtu.message else {
        unreachable!()
    };
    // Directions on the wire: REQ client -> server, REP back.
    assert_eq!(req_f.repr.ip.dst_gid(), Gid::from(server), "{name}");
    assert_eq!(req_f.repr.ip.src_gid(), Gid::from(client), "{name}");
    assert_eq!(rep_f.repr.ip.dst_gid(), Gid::from(client), "{name}");

    assert_eq!(req_m.service_id, service_id(PortSpace::Tcp, port), "{name}");
    assert_eq!(req_m.transport_type, TransportType::Rc);
    assert_eq!(req_m.path_mtu, 5, "{name}: path MTU 4096");
    assert_eq!(req_m.pkey, 0xffff);
    assert_eq!(req_m.local_qkey, 0);
    let path = req_m.primary_path;
    assert_eq!(path.local_gid, Gid::from(client), "{name}");
    assert_eq!(path.remote_gid, Gid::from(server), "{name}");
    // RoCE: permissive LIDs, SL 0, hop limit 64, traffic class 0.
    assert_eq!((path.local_lid, path.remote_lid), (0xffff, 0xffff));
    assert_eq!((path.sl, path.hop_limit, path.traffic_class), (0, 64, 0));
    assert!(req_m.alternate_path.is_none());

    let cma = CmaHeader::parse(req_m.private_data).unwrap();
    assert_eq!(cma.cma_version, 0);
    assert_eq!((cma.src_ip, cma.dst_ip), (client, server), "{name}");
    // rdma_cm's RoCEv2 flow label: a hash of the two ports.
    let fl = (u32::from(cma.src_port) * 31 + u32::from(port)) & 0xf_ffff;
    assert_eq!(path.flow_label, fl, "{name}: flow label");

    // The QPNs and starting PSNs are those of the RC data that follows.
    // Linux: a side's starting PSN is what it expects to receive, the PSN
    // its peer sends with first (the server sends from the REQ's).
    let to_server = request_psns(&frames, server, rep_m.local_qpn);
    let to_client = request_psns(&frames, client, req_m.local_qpn);
    assert_eq!(to_server.first(), Some(&rep_m.starting_psn), "{name}");
    assert_eq!(to_client.first(), Some(&req_m.starting_psn), "{name}");
    // rxe turns the path's flow label into the UDP source port of the
    // connection's frames, both ways.
    let sport = (((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) | 0xc000) as u16;
    let data = frames.iter().filter(|f| {
        let t = &f.repr.transport;
        !mad::is_gsi(t) && (t.bth.dest_qp == req_m.local_qpn || t.bth.dest_qp == rep_m.local_qpn)
    });
    let mut n = 0;
    for f in data {
        assert_eq!(f.repr.udp.src_port, sport, "{name}: UDP source port");
        n += 1;
    }
    assert!(n >= 2, "{name}: no RC data");

    // One transaction: REP and RTU answer the REQ's TID, comm IDs pair up.
    assert_eq!(rep.header.transaction_id, req.header.transaction_id);
    assert_eq!(rtu.header.transaction_id, req.header.transaction_id);
    assert_eq!(rep_m.remote_comm_id, req_m.local_comm_id);
    assert_eq!(
        (rtu_m.local_comm_id, rtu_m.remote_comm_id),
        (req_m.local_comm_id, rep_m.local_comm_id)
    );

    // Each DREQ names the receiver's QP and the pair of comm IDs; a DREP
    // answers a DREQ's TID with the IDs swapped.
    let dreqs = at(Attribute::Dreq);
    assert!(!dreqs.is_empty(), "{name}: no DREQ");
    for (f, d) in &dreqs {
        let CmMessage::Dreq(d) = d.message else {
            unreachable!()
        };
        let receiver_qpn = if f.repr.ip.dst_gid() == Gid::from(server) {
            rep_m.local_qpn
        } else {
            req_m.local_qpn
        };
        assert_eq!(d.remote_qpn, receiver_qpn, "{name}");
        let ids = [req_m.local_comm_id, rep_m.local_comm_id];
        assert!(ids.contains(&d.local_comm_id) && ids.contains(&d.remote_comm_id));
    }
    let dreps = at(Attribute::Drep);
    // (A DREP of an earlier run, between other addresses, is not ours.)
    let ours = |f: &Frame| {
        [f.repr.ip.src_gid(), f.repr.ip.dst_gid()]
            .iter()
            .all(|g| *g == Gid::from(server) || *g == Gid::from(client))
    };
    for (_, p) in dreps.iter().filter(|(f, _)| ours(f)) {
        let CmMessage::Drep(p) = p.message else {
            unreachable!()
        };
        let answered = dreqs.iter().any(|(_, d)| {
            let CmMessage::Dreq(d) = d.message else {
                unreachable!()
            };
            d.local_comm_id == p.remote_comm_id && d.remote_comm_id == p.local_comm_id
        });
        assert!(answered, "{name}: DREP answers no DREQ");
    }
}

#[test]
fn rping_rc_connect_data_disconnect() {
    let frames = capture("rping");
    let m = mads(&frames);
    assert_eq!(names(&m), ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    check_rc_connection("rping", ip(SERVER_V4), ip(CLIENT_V4), 7174);
    let CmMessage::Req(req) = m[0].1.message else {
        unreachable!()
    };
    // rping: one outstanding READ each way, rdma_cm's defaults otherwise.
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(req.max_cm_retries, 15);
    assert_eq!(
        (
            req.local_cm_response_timeout,
            req.remote_cm_response_timeout
        ),
        (20, 20)
    );
    assert_eq!(req.primary_path.local_ack_timeout, 19);
}

#[test]
fn rping_over_ipv6() {
    let frames = capture("rping_ipv6");
    let m = mads(&frames);
    // A late DREP of the run before (IPv4), then this run's IPv6 exchange.
    assert_eq!(names(&m), ["DREP", "REQ", "REP", "RTU", "DREQ", "DREP"]);
    check_rc_connection("rping_ipv6", ip(SERVER_V6), ip(CLIENT_V6), 7174);
    let CmMessage::Req(req) = m[1].1.message else {
        unreachable!()
    };
    assert_eq!(
        CmaHeader::parse(req.private_data).unwrap().src_ip,
        ip(CLIENT_V6)
    );
    assert!(m[1].0.repr.ip.dst_gid().to_ipv4().is_none());
}

#[test]
fn ucmatose_server_disconnects() {
    let frames = capture("ucmatose");
    let m = mads(&frames);
    assert_eq!(names(&m), ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    check_rc_connection("ucmatose", ip(SERVER_V4), ip(CLIENT_V4), 7471);
    let CmMessage::Req(req) = m[0].1.message else {
        unreachable!()
    };
    // ucmatose asks for 5 retries and no RNR retry; the server's DREQ.
    assert_eq!((req.retry_count, req.rnr_retry_count), (5, 0));
    assert_eq!(m[3].0.repr.ip.src_gid(), Gid::from(ip(SERVER_V4)));
}

#[test]
fn rdma_server_both_sides_disconnect() {
    let frames = capture("rdma_server");
    let m = mads(&frames);
    assert_eq!(names(&m), ["REQ", "REP", "RTU", "DREQ", "DREQ", "DREP"]);
    check_rc_connection("rdma_server", ip(SERVER_V4), ip(CLIENT_V4), 7471);
    let CmMessage::Req(req) = m[0].1.message else {
        unreachable!()
    };
    // rdma_client asks for rxe's maximum read depth.
    assert_eq!((req.responder_resources, req.initiator_depth), (128, 128));
}

/// The REQ, REP of each connection in a capture, in order.
fn connections<'a>(m: &[(&Frame, CmMadRepr<'a>)]) -> Vec<(ReqRepr<'a>, RepRepr<'a>)> {
    let reqs = m.iter().filter_map(|(_, x)| match x.message {
        CmMessage::Req(r) => Some(r),
        _ => None,
    });
    reqs.filter_map(|r| {
        m.iter().find_map(|(_, x)| match x.message {
            CmMessage::Rep(p) if p.remote_comm_id == r.local_comm_id => Some((r, p)),
            _ => None,
        })
    })
    .collect()
}

#[test]
fn perftest_rdma_cm_control_and_data_connections() {
    let frames = capture("ib_write_bw_R");
    let m = mads(&frames);
    assert_eq!(
        names(&m),
        ["REQ", "REP", "RTU", "REQ", "REP", "RTU", "DREQ", "DREP", "DREQ", "DREP"]
    );
    // perftest -R: one connection for its parameter exchange (SENDs), one
    // for the test (RDMA WRITEs), both to RDMA_PS_TCP:18515.
    let conns = connections(&m);
    assert_eq!(conns.len(), 2);
    for (req, _) in &conns {
        assert_eq!(req.service_id, service_id(PortSpace::Tcp, 18515));
        assert_eq!((req.responder_resources, req.initiator_depth), (0, 0));
    }
    let (_, data_rep) = conns[1];
    let writes: Vec<u32> = frames
        .iter()
        .filter(|f| {
            let t = &f.repr.transport;
            t.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY && t.bth.dest_qp == data_rep.local_qpn
        })
        .map(|f| f.repr.transport.bth.psn)
        .collect();
    assert!(!writes.is_empty());
    assert_eq!(writes[0], data_rep.starting_psn);
    // The client disconnects the test QP first, the server the control QP.
    let CmMessage::Dreq(d) = m[6].1.message else {
        unreachable!()
    };
    assert_eq!(d.remote_qpn, data_rep.local_qpn);
    assert_eq!(m[8].0.repr.ip.src_gid(), Gid::from(ip(SERVER_V4)));
}

#[test]
fn perftest_second_req_rejected_when_server_no_longer_listens() {
    let frames = capture("ib_write_bw_R_rejected");
    let m = mads(&frames);
    assert_eq!(names(&m), ["REQ", "REP", "RTU", "REQ", "REJ", "DREQ"]);
    let CmMessage::Req(req) = m[0].1.message else {
        unreachable!()
    };
    assert_eq!(req.service_id, service_id(PortSpace::Tcp, 18515));
    let CmMessage::Rej(rej) = m[4].1.message else {
        unreachable!()
    };
    let CmMessage::Req(req2) = m[3].1.message else {
        unreachable!()
    };
    assert_eq!(rej.reason, RejReason::InvalidServiceId);
    assert_eq!(rej.remote_comm_id, req2.local_comm_id);
}

#[test]
fn connect_to_closed_port_is_rejected_invalid_service_id() {
    let frames = capture("rej");
    let m = mads(&frames);
    assert_eq!(names(&m), ["REQ", "REJ"]);
    let (req_f, req) = &m[0];
    let CmMessage::Req(req_m) = req.message else {
        unreachable!()
    };
    assert_eq!(req_m.service_id, service_id(PortSpace::Tcp, 7777));
    let cma = CmaHeader::parse(req_m.private_data).unwrap();
    assert_eq!((cma.src_ip, cma.dst_ip), (ip(CLIENT_V4), ip(SERVER_V4)));
    assert_eq!(req_f.repr.ip.dst_gid(), Gid::from(ip(SERVER_V4)));
    let (rej_f, rej) = &m[1];
    let CmMessage::Rej(r) = rej.message else {
        unreachable!()
    };
    assert_eq!(rej_f.repr.ip.dst_gid(), Gid::from(ip(CLIENT_V4)));
    assert_eq!(r.reason, RejReason::InvalidServiceId);
    assert_eq!(r.reason.code(), 8);
    assert_eq!(r.message_rejected, MessageRef::Req);
    // Nobody had a comm ID for it: local 0, remote the REQ's.
    assert_eq!(
        (r.local_comm_id, r.remote_comm_id),
        (0, req_m.local_comm_id)
    );
    assert!(r.ari.is_empty());
    assert_eq!(rej.header.transaction_id, req.header.transaction_id);
    assert!(r.private_data.iter().all(|&b| b == 0));
}

#[test]
fn udaddy_sidr_resolves_the_ud_qp() {
    let frames = capture("udaddy");
    let m = mads(&frames);
    assert_eq!(names(&m), ["SIDR_REQ", "SIDR_REP"]);
    let CmMessage::SidrReq(q) = m[0].1.message else {
        unreachable!()
    };
    let CmMessage::SidrRep(p) = m[1].1.message else {
        unreachable!()
    };
    assert_eq!(q.service_id, service_id(PortSpace::Udp, 7174));
    assert_eq!(q.pkey, 0xffff);
    let cma = CmaHeader::parse(q.private_data).unwrap();
    assert_eq!((cma.src_ip, cma.dst_ip), (ip(CLIENT_V4), ip(SERVER_V4)));
    assert_eq!(p.request_id, q.request_id);
    assert_eq!(p.status, SidrStatus::Success);
    assert_eq!(p.service_id, q.service_id);
    // rdma_cm's UDP port space Q_Key (RDMA_UDP_QKEY).
    assert_eq!(p.qkey, 0x0123_4567);
    assert_eq!(m[1].1.header.transaction_id, m[0].1.header.transaction_id);
    // The client's datagrams go to the QP the SIDR_REP named, with its Q_Key.
    let to_server: Vec<&Frame> = frames
        .iter()
        .filter(|f| {
            f.repr.ip.dst_gid() == Gid::from(ip(SERVER_V4)) && !mad::is_gsi(&f.repr.transport)
        })
        .collect();
    assert_eq!(to_server.len(), 10);
    for f in to_server {
        let t = &f.repr.transport;
        assert_eq!(t.bth.opcode, Opcode::UD_SEND_ONLY_WITH_IMMEDIATE);
        assert_eq!(t.bth.dest_qp, p.qpn);
        assert_eq!(t.deth.unwrap().qkey, p.qkey);
    }
}
