//! The engine against Linux's ib_cm over rxe (xroce-wire's captures in
//! userspace/wire/tests/data/cm): fed a captured message it answers what
//! Linux answered, byte for byte where the inputs are the same.

use std::net::IpAddr;
use std::path::PathBuf;

use xroce_cm::{
    CmConfig, CmEngine, CmEvent, ConnId, ConnectParams, PathParams, PeerAddr, RepParams,
    SidrReplyParams, SidrRequestParams, SidrStatus, State, Transmit,
};
use xroce_wire::cm::{CmMadRepr, CmMessage};
use xroce_wire::mad::{self, MAD_LEN};
use xroce_wire::rdma_cm::{service_id, PortSpace};
use xroce_wire::{parse_frame, Gid};

const SERVER_GUID: u64 = 0x5054_00ff_fe77_0010;
const CLIENT_GUID: u64 = 0x5054_00ff_fe77_0011;

fn gid(s: &str) -> Gid {
    Gid::from(s.parse::<IpAddr>().unwrap())
}

/// One captured GSI MAD and who sent it.
struct Mad {
    from: PeerAddr,
    to: Gid,
    bytes: Vec<u8>,
}

impl Mad {
    fn repr(&self) -> CmMadRepr<'_> {
        CmMadRepr::parse(&self.bytes).unwrap()
    }
}

fn mads(name: &str) -> Vec<Mad> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../wire/tests/data/cm")
        .join(format!("{name}.pcap"));
    let f = std::fs::File::open(&path).unwrap();
    let mut r = pcap_file::pcap::PcapReader::new(f).unwrap();
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        let (repr, payload) = parse_frame(&p.data).unwrap();
        if !mad::is_gsi(&repr.transport) {
            continue;
        }
        out.push(Mad {
            from: PeerAddr {
                gid: repr.ip.src_gid(),
                qpn: repr.transport.deth.unwrap().src_qp,
                pkey: repr.transport.bth.pkey,
            },
            to: repr.ip.dst_gid(),
            bytes: payload.to_vec(),
        });
    }
    out
}

fn engine(gids: &[&str], guid: u64, first_comm_id: u32) -> CmEngine {
    let mut config = CmConfig::new(gids.iter().map(|g| gid(g)).collect(), guid, 1);
    // The captures' MAD agent puts 2 in the TIDs' high half.
    config.tid_high = 2;
    config.first_comm_id = Some(first_comm_id);
    CmEngine::new(config)
}

fn sent(e: &mut CmEngine) -> Transmit {
    let t = e.poll_transmit().expect("a MAD to send");
    assert!(e.poll_transmit().is_none(), "one MAD only");
    t
}

fn comm_ids(m: &CmMadRepr<'_>) -> (u32, u32) {
    match m.message {
        CmMessage::Rep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Rtu(r) | CmMessage::Drep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Dreq(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Rej(r) => (r.local_comm_id, r.remote_comm_id),
        _ => panic!("no comm IDs"),
    }
}

#[test]
fn listener_answers_rpings_req_with_linuxs_rep_then_drep() {
    // rping: REQ, REP, RTU, DREQ (client), DREP.
    let m = mads("rping");
    let CmMessage::Rep(captured_rep) = m[1].repr().message else {
        panic!()
    };
    let mut server = engine(&["10.77.0.10"], SERVER_GUID, captured_rep.local_comm_id);
    server.listen(service_id(PortSpace::Tcp, 7174), 1).unwrap();
    server.handle_mad(m[0].from, m[0].to, &m[0].bytes, 0);
    let Some(CmEvent::ConnectRequest {
        conn,
        listener,
        peer,
        req,
        private_data,
    }) = server.poll_event()
    else {
        panic!("no ConnectRequest")
    };
    assert_eq!(conn, ConnId(0x3b9b_d8cd));
    assert_eq!(listener, 0x0106_1c06);
    assert_eq!(peer, PeerAddr::gsi(gid("10.77.0.11")));
    assert_eq!(req.remote_comm_id, 0x7b30_3a2b);
    assert_eq!(req.remote_ca_guid, CLIENT_GUID);
    assert_eq!((req.remote_qpn, req.starting_psn), (0x11, 0x1_c04e));
    assert_eq!(
        req.path,
        PathParams::roce(gid("10.77.0.10"), gid("10.77.0.11"), 5, 0x4_7c23)
    );
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(&private_data[..], &m[0].bytes[24 + 140..24 + 232]);
    assert!(server.poll_event().is_none());
    assert!(server.poll_transmit().is_none(), "nothing before accept");

    // rping's server accepts with its QP 0x11 expecting PSN 0x5cb7ea.
    server
        .accept(conn, &RepParams::new(0x11, 0x5c_b7ea), 1_000)
        .unwrap();
    let rep = sent(&mut server);
    assert_eq!(rep.peer, m[0].from);
    assert_eq!(rep.local_gid, gid("10.77.0.10"));
    let r = CmMadRepr::parse(&rep.mad).unwrap();
    assert_eq!(r.header.transaction_id, 0x2_2b3a_307b);
    assert_eq!(comm_ids(&r), (0x3b9b_d8cd, 0x7b30_3a2b));
    assert_eq!(&rep.mad[..], &m[1].bytes[..], "REP differs from Linux's");

    // A retransmitted REQ gets the REP again, not a second event.
    server.handle_mad(m[0].from, m[0].to, &m[0].bytes, 2_000);
    assert_eq!(&sent(&mut server).mad[..], &m[1].bytes[..]);
    assert!(server.poll_event().is_none());
    assert_eq!(server.stats().duplicates, 1);

    server.handle_mad(m[2].from, m[2].to, &m[2].bytes, 3_000);
    assert_eq!(server.poll_event(), Some(CmEvent::Established { conn }));
    server.handle_mad(m[3].from, m[3].to, &m[3].bytes, 4_000);
    assert!(matches!(
        server.poll_event(),
        Some(CmEvent::DisconnectRequest { conn: c, .. }) if c == conn
    ));
    server.disconnect(conn, &[], 5_000).unwrap();
    assert_eq!(&sent(&mut server).mad[..], &m[4].bytes[..], "DREP");
    assert_eq!(server.state(conn), Some(State::Timewait));
    // TIMEWAIT: the path's ACK timeout (19: 2.15 s).
    assert_eq!(server.poll_timeout(), Some(5_000 + 2_147_483_648));
    server.handle_timeout(5_000 + 2_147_483_648);
    assert_eq!(server.poll_event(), Some(CmEvent::TimewaitExit { conn }));
    assert_eq!(server.live_connections(), 0);
}

#[test]
fn client_sends_rpings_req_and_answers_the_captured_rep_with_linuxs_rtu() {
    let m = mads("rping");
    let CmMessage::Req(captured_req) = m[0].repr().message else {
        panic!()
    };
    let mut client = engine(&["10.77.0.11"], CLIENT_GUID, captured_req.local_comm_id);
    let mut p = ConnectParams::new(
        service_id(PortSpace::Tcp, 7174),
        0x11,
        0x1_c04e,
        PathParams::roce(gid("10.77.0.11"), gid("10.77.0.10"), 5, 0x4_7c23),
    );
    // rdma_cm's header (36 bytes) and rping's zeros.
    p.private_data = captured_req.private_data.to_vec();
    let conn = client.connect(&p, 0).unwrap();
    assert_eq!(conn, ConnId(0x7b30_3a2b));
    let req = sent(&mut client);
    assert_eq!(req.peer, PeerAddr::gsi(gid("10.77.0.10")));
    assert_eq!(&req.mad[..], &m[0].bytes[..], "REQ differs from Linux's");

    client.handle_mad(m[1].from, m[1].to, &m[1].bytes, 1_000);
    let Some(CmEvent::ConnectResponse {
        conn: c,
        rep,
        private_data,
    }) = client.poll_event()
    else {
        panic!("no ConnectResponse")
    };
    assert_eq!(c, conn);
    assert_eq!((rep.remote_comm_id, rep.remote_qpn), (0x3b9b_d8cd, 0x11));
    assert_eq!(rep.starting_psn, 0x5c_b7ea);
    assert_eq!(rep.remote_ca_guid, SERVER_GUID);
    assert_eq!(private_data, vec![0; 196]);
    assert!(client.poll_transmit().is_none(), "RTU only after establish");

    client.establish(conn, &[]).unwrap();
    assert_eq!(client.poll_event(), Some(CmEvent::Established { conn }));
    let rtu = sent(&mut client);
    let r = CmMadRepr::parse(&rtu.mad).unwrap();
    assert_eq!(r.header.transaction_id, 0x2_2b3a_307b);
    assert_eq!(comm_ids(&r), (0x7b30_3a2b, 0x3b9b_d8cd));
    assert_eq!(&rtu.mad[..], &m[2].bytes[..], "RTU differs from Linux's");

    // The REP again: the RTU again.
    client.handle_mad(m[1].from, m[1].to, &m[1].bytes, 2_000);
    assert_eq!(&sent(&mut client).mad[..], &m[2].bytes[..]);
    assert!(client.poll_event().is_none());

    client.disconnect(conn, &[], 3_000).unwrap();
    assert_eq!(&sent(&mut client).mad[..], &m[3].bytes[..], "DREQ");
    client.handle_mad(m[4].from, m[4].to, &m[4].bytes, 4_000);
    assert_eq!(client.poll_event(), Some(CmEvent::Disconnected { conn }));
    assert_eq!(client.state(conn), Some(State::Timewait));
}

#[test]
fn req_to_a_closed_port_gets_linuxs_rej_8() {
    let m = mads("rej");
    let mut server = engine(&["10.77.0.10"], SERVER_GUID, 0x1234);
    server.listen(service_id(PortSpace::Tcp, 7174), 0).unwrap();
    server.handle_mad(m[0].from, m[0].to, &m[0].bytes, 0);
    let rej = sent(&mut server);
    assert_eq!(rej.peer, m[0].from);
    assert_eq!(rej.local_gid, m[0].to);
    assert_eq!(&rej.mad[..], &m[1].bytes[..], "REJ differs from Linux's");
    assert!(server.poll_event().is_none());
    assert_eq!(server.live_connections(), 0);
    assert_eq!(server.stats().req_no_listener, 1);
}

#[test]
fn udaddys_sidr_exchange_both_roles() {
    let m = mads("udaddy");
    let (CmMessage::SidrReq(q), CmMessage::SidrRep(p)) = (m[0].repr().message, m[1].repr().message)
    else {
        panic!()
    };
    // Server: the captured SIDR_REQ, answered as udaddy's server did.
    let mut server = engine(&["10.77.0.10"], SERVER_GUID, 0x55);
    server.listen(service_id(PortSpace::Udp, 7174), 0).unwrap();
    server.handle_mad(m[0].from, m[0].to, &m[0].bytes, 0);
    let Some(CmEvent::SidrRequest {
        conn,
        listener,
        pkey,
        private_data,
        ..
    }) = server.poll_event()
    else {
        panic!("no SidrRequest")
    };
    assert_eq!(listener, service_id(PortSpace::Udp, 7174));
    assert_eq!(pkey, 0xffff);
    assert_eq!(&private_data[..], q.private_data);
    let reply = SidrReplyParams {
        status: SidrStatus::Success,
        qpn: p.qpn,
        qkey: p.qkey,
        private_data: p.private_data.to_vec(),
    };
    server.sidr_reply(conn, &reply).unwrap();
    assert_eq!(&sent(&mut server).mad[..], &m[1].bytes[..], "SIDR_REP");
    assert_eq!(server.live_connections(), 0);

    // Client: the same SIDR_REQ as Linux's, and the captured answer.
    let mut client = engine(&["10.77.0.11"], CLIENT_GUID, q.request_id);
    let req = SidrRequestParams {
        service_id: q.service_id,
        local_gid: gid("10.77.0.11"),
        remote_gid: gid("10.77.0.10"),
        pkey: 0xffff,
        timeout: 20,
        max_retries: 15,
        private_data: q.private_data.to_vec(),
    };
    let conn = client.sidr_request(&req, 0).unwrap();
    assert_eq!(&sent(&mut client).mad[..], &m[0].bytes[..], "SIDR_REQ");
    client.handle_mad(m[1].from, m[1].to, &m[1].bytes, 1_000);
    let Some(CmEvent::SidrResponse {
        conn: c,
        status,
        qpn,
        qkey,
        ..
    }) = client.poll_event()
    else {
        panic!("no SidrResponse")
    };
    assert_eq!(c, conn);
    assert_eq!(
        (status, qpn, qkey),
        (SidrStatus::Success, p.qpn, 0x0123_4567)
    );
    assert_eq!(client.live_connections(), 0);
}

#[test]
fn every_captured_mad_is_handled_without_surprise() {
    // Fed to an engine that knows none of them: REQs to nobody get REJ 8,
    // DREQs get DREPs, the rest is counted as naming unknown comm IDs.
    for name in [
        "rping",
        "ucmatose",
        "rdma_server",
        "ib_write_bw_R",
        "rping_ipv6",
    ] {
        let mut e = engine(&["10.77.0.10", "fd77::10"], SERVER_GUID, 9);
        let m = mads(name);
        for x in &m {
            e.handle_mad(x.from, x.to, &x.bytes, 0);
        }
        let s = e.stats();
        assert_eq!(s.received as usize, m.len(), "{name}");
        assert_eq!(s.malformed, 0, "{name}");
        assert_eq!(e.live_connections(), 0, "{name}");
        assert!(e.poll_event().is_none(), "{name}");
        let mut answers = 0;
        while let Some(t) = e.poll_transmit() {
            assert_eq!(t.mad.len(), MAD_LEN);
            answers += 1;
        }
        assert_eq!(answers, s.sent, "{name}");
        assert_eq!(
            s.sent,
            s.req_no_listener
                + m.iter()
                    .filter(|x| matches!(x.repr().message, CmMessage::Dreq(_)))
                    .count() as u64,
            "{name}"
        );
    }
}

#[test]
fn ucmatose_server_disconnects_with_linuxs_dreq() {
    // ucmatose: REQ, REP, RTU, then the server's DREQ and the client's DREP.
    let m = mads("ucmatose");
    let CmMessage::Rep(cap) = m[1].repr().message else {
        panic!()
    };
    let mut server = engine(&["10.77.0.10"], SERVER_GUID, cap.local_comm_id);
    server.listen(service_id(PortSpace::Tcp, 7471), 0).unwrap();
    server.handle_mad(m[0].from, m[0].to, &m[0].bytes, 0);
    let Some(CmEvent::ConnectRequest { conn, .. }) = server.poll_event() else {
        panic!()
    };
    let rep = RepParams {
        qpn: cap.local_qpn,
        starting_psn: cap.starting_psn,
        responder_resources: cap.responder_resources,
        initiator_depth: cap.initiator_depth,
        target_ack_delay: cap.target_ack_delay,
        rnr_retry_count: cap.rnr_retry_count,
        srq: cap.srq,
        private_data: Vec::new(),
    };
    server.accept(conn, &rep, 0).unwrap();
    assert_eq!(&sent(&mut server).mad[..], &m[1].bytes[..], "REP");
    server.handle_mad(m[2].from, m[2].to, &m[2].bytes, 1);
    assert_eq!(server.poll_event(), Some(CmEvent::Established { conn }));
    server.disconnect(conn, &[], 2).unwrap();
    let dreq = sent(&mut server);
    // The passive side's DREQ starts its own transaction: its comm ID.
    let r = CmMadRepr::parse(&dreq.mad).unwrap();
    assert_eq!(
        r.header.transaction_id,
        (2 << 32) | u64::from(cap.local_comm_id.swap_bytes())
    );
    assert_eq!(&dreq.mad[..], &m[3].bytes[..], "DREQ differs from Linux's");
    server.handle_mad(m[4].from, m[4].to, &m[4].bytes, 3);
    assert_eq!(server.poll_event(), Some(CmEvent::Disconnected { conn }));
}
