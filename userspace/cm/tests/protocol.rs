//! The protocol's corners, each with exact values: retries and their
//! timing, rejects, MRA, backlog, simultaneous disconnect, strays and
//! malformed MADs, the consumer's misuse.

mod common;

use common::{engine, kinds, Sim, A_GID, A_GUID, B_GID, B_GUID, CLEAN, LINK_DELAY_NS};
use xroce_cm::{
    timeout_ns, CmError, CmEvent, ConnId, ConnectParams, PathParams, PeerAddr, RejReason,
    RepParams, SidrReplyParams, SidrRequestParams, SidrStatus, State,
};
use xroce_wire::cm::{CmMadRepr, CmMessage, CommIdsRepr, DreqRepr, MessageRef};
use xroce_wire::mad::{MadError, MAD_LEN};

const SID: u64 = 0x0106_4e20;

fn params() -> ConnectParams {
    ConnectParams::new(SID, 0x40, 0x100, PathParams::roce(A_GID, B_GID, 3, 7))
}

fn parse(mad: &[u8; MAD_LEN]) -> CmMadRepr<'_> {
    CmMadRepr::parse(mad).unwrap()
}

#[test]
fn req_to_a_vanished_peer_is_retried_then_unreachable() {
    let mut a = engine(A_GID, A_GUID, 1);
    let conn = a.connect(&params(), 0).unwrap();
    let first = a.poll_transmit().unwrap();
    let t = timeout_ns(20);
    let mut sends = vec![0];
    let mut rej = None;
    while let Some(at) = a.poll_timeout() {
        a.handle_timeout(at);
        while let Some(x) = a.poll_transmit() {
            if x.mad == first.mad {
                sends.push(at);
            } else {
                rej = Some((at, x));
            }
        }
    }
    // The REQ and 15 retries, 4.29 s apart; UNREACHABLE after the last wait.
    let expected: Vec<u64> = (0..16).map(|k| k * t).collect();
    assert_eq!(sends, expected);
    assert_eq!(a.poll_event(), Some(CmEvent::Unreachable { conn }));
    assert_eq!(a.poll_event(), None);
    assert_eq!(a.stats().retransmits, 15);
    assert_eq!(a.live_connections(), 0);
    // ...and the REQ is withdrawn with REJ "timeout" carrying our CA GUID.
    let (at, rej) = rej.expect("a REJ");
    assert_eq!(at, 16 * t);
    let r = parse(&rej.mad);
    assert_eq!(
        r.header.transaction_id,
        parse(&first.mad).header.transaction_id
    );
    let CmMessage::Rej(r) = r.message else {
        panic!()
    };
    assert_eq!((r.local_comm_id, r.remote_comm_id), (conn.0, 0));
    assert_eq!(
        (r.reason, r.message_rejected),
        (RejReason::Timeout, MessageRef::Req)
    );
    assert_eq!(r.ari, A_GUID.to_be_bytes());
}

#[test]
fn withdrawn_req_ends_the_passive_sides_pending_request() {
    let mut sim = Sim::new(4, CLEAN);
    sim.b.listen(SID, 1).unwrap();
    let mut p = params();
    p.max_cm_retries = 2;
    let a_conn = sim.a.connect(&p, 0).unwrap();
    // B's consumer never answers.
    sim.run(|_, _, _| {}, 1000);
    assert_eq!(kinds(&sim.a_events), ["Unreachable"]);
    assert_eq!(kinds(&sim.b_events), ["ConnectRequest", "Rejected"]);
    let (at, CmEvent::Rejected { reason, .. }) = &sim.b_events[1] else {
        panic!()
    };
    assert_eq!(
        (*at, *reason),
        (3 * timeout_ns(20) + LINK_DELAY_NS, RejReason::Timeout)
    );
    // Two duplicates of the REQ reached B and were not reported again.
    assert_eq!(sim.b.stats().duplicates, 2);
    assert_eq!(sim.a.live_connections() + sim.b.live_connections(), 0);
    assert_eq!(sim.a.state(a_conn), None);
}

#[test]
fn destroy_withdraws_or_disconnects_without_events() {
    // Established, then destroyed: one DREQ, TIMEWAIT, no event; the peer
    // sees an ordinary disconnect.
    let (mut sim, a_conn, b_conn) = established();
    let now = sim.now;
    sim.a.destroy(a_conn, now).unwrap();
    assert_eq!(sim.a.state(a_conn), Some(State::Timewait));
    sim.run(
        |sim, at_a, e| {
            if let (false, CmEvent::DisconnectRequest { conn, .. }) = (at_a, e) {
                let now = sim.now;
                sim.b.disconnect(*conn, &[], now).unwrap();
            }
        },
        1000,
    );
    assert!(sim.a_events.is_empty(), "{:?}", sim.a_events);
    assert_eq!(kinds(&sim.b_events), ["DisconnectRequest", "TimewaitExit"]);
    assert_eq!(sim.b_events[0].1.conn(), b_conn);
    assert_eq!(sim.a.live_connections() + sim.b.live_connections(), 0);

    // A pending REQ destroyed: REJ "timeout" ends it at the peer too.
    let mut sim = Sim::new(6, CLEAN);
    sim.b.listen(SID, 0).unwrap();
    let conn = sim.a.connect(&params(), 0).unwrap();
    sim.step();
    let now = sim.now;
    sim.a.destroy(conn, now).unwrap();
    assert_eq!(sim.a.live_connections(), 0);
    sim.run(|_, _, _| {}, 100);
    assert!(sim.a_events.is_empty());
    assert_eq!(kinds(&sim.b_events), ["ConnectRequest", "Rejected"]);
    assert_eq!(sim.b.live_connections(), 0);
    assert_eq!(sim.a.destroy(conn, now), Err(CmError::UnknownConn(conn)));
}

#[test]
fn fewer_retries_shorter_timeout() {
    let mut a = engine(A_GID, A_GUID, 1);
    let mut p = params();
    p.cm_response_timeout = 10;
    p.max_cm_retries = 3;
    let conn = a.connect(&p, 1_000).unwrap();
    let mut last = 0;
    while let Some(at) = a.poll_timeout() {
        a.handle_timeout(at);
        last = at;
    }
    assert_eq!(last, 1_000 + 4 * timeout_ns(10));
    // 4 REQs and the REJ withdrawing it.
    assert_eq!(a.stats().sent, 5);
    assert_eq!(a.poll_event(), Some(CmEvent::Unreachable { conn }));
}

#[test]
fn active_side_vanishing_after_req_leaves_the_passive_side_unreachable() {
    let mut sim = Sim::new(3, CLEAN);
    sim.b.listen(SID, 1).unwrap();
    let mut p = params();
    // How long A said it takes to answer, and how often B may retry.
    p.cm_response_timeout = 12;
    p.max_cm_retries = 5;
    sim.a.connect(&p, 0).unwrap();
    sim.step(); // the REQ reaches B
    let Some(CmEvent::ConnectRequest { conn, .. }) = sim.b.poll_event() else {
        panic!()
    };
    let now = sim.now;
    sim.b
        .accept(conn, &RepParams::new(0x50, 0x200), now)
        .unwrap();
    // A is gone: B's REPs go nowhere.
    let mut reps = 0;
    while sim.b.poll_transmit().is_some() {
        reps += 1;
    }
    let mut end = now;
    while let Some(at) = sim.b.poll_timeout() {
        sim.b.handle_timeout(at);
        while sim.b.poll_transmit().is_some() {
            reps += 1;
        }
        end = at;
    }
    // The REP, 5 retries, then REJ "timeout" for the REP.
    assert_eq!(reps, 7);
    assert_eq!(end, now + 6 * timeout_ns(12));
    assert_eq!(sim.b.poll_event(), Some(CmEvent::Unreachable { conn }));
}

/// A and B established over a clean link; B answers DREQs only if `b_answers`.
fn established() -> (Sim, ConnId, ConnId) {
    let mut sim = Sim::new(5, CLEAN);
    sim.b.listen(SID, 0).unwrap();
    let a_conn = sim.a.connect(&params(), 0).unwrap();
    let mut b_conn = None;
    sim.run(
        |sim, at_a, e| match (at_a, e) {
            (false, CmEvent::ConnectRequest { conn, .. }) => {
                b_conn = Some(*conn);
                let now = sim.now;
                sim.b
                    .accept(*conn, &RepParams::new(0x50, 0x200), now)
                    .unwrap();
            }
            (true, CmEvent::ConnectResponse { conn, .. }) => sim.a.establish(*conn, &[]).unwrap(),
            _ => {}
        },
        1000,
    );
    assert_eq!(sim.a.state(a_conn), Some(State::Established));
    let b_conn = b_conn.unwrap();
    assert_eq!(sim.b.state(b_conn), Some(State::Established));
    sim.a_events.clear();
    sim.b_events.clear();
    sim.wire.clear();
    (sim, a_conn, b_conn)
}

#[test]
fn unanswered_dreq_ends_in_disconnected_then_timewait_exit() {
    let (mut sim, a_conn, _) = established();
    let start = sim.now;
    sim.a.disconnect(a_conn, &[], start).unwrap();
    let mut dreqs = 0;
    let mut disconnected_at = None;
    while let Some(at) = sim.a.poll_timeout() {
        while let Some(t) = sim.a.poll_transmit() {
            assert!(matches!(parse(&t.mad).message, CmMessage::Dreq(_)));
            dreqs += 1;
        }
        sim.a.handle_timeout(at);
        if let Some(e) = sim.a.poll_event() {
            match e {
                CmEvent::DisconnectTimeout { conn } => {
                    assert_eq!(conn, a_conn);
                    disconnected_at = Some(at);
                }
                CmEvent::TimewaitExit { conn } => {
                    assert_eq!(conn, a_conn);
                    let d = disconnected_at.expect("DisconnectTimeout first");
                    assert_eq!(at, d + timeout_ns(19));
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(dreqs, 16);
    assert_eq!(disconnected_at, Some(start + 16 * timeout_ns(20)));
    assert_eq!(sim.a.live_connections(), 0);
}

#[test]
fn both_sides_disconnect_at_once() {
    // rdma_server's capture: DREQs cross; each side answers the other's.
    let (mut sim, a_conn, b_conn) = established();
    let now = sim.now;
    sim.a.disconnect(a_conn, &[], now).unwrap();
    sim.b.disconnect(b_conn, &[], now).unwrap();
    sim.run(|_, _, _| {}, 1000);
    assert_eq!(kinds(&sim.a_events), ["Disconnected", "TimewaitExit"]);
    assert_eq!(kinds(&sim.b_events), ["Disconnected", "TimewaitExit"]);
    let mut names: Vec<&str> = sim
        .wire
        .iter()
        .map(|(_, _, t)| parse(&t.mad).message.attribute().name())
        .collect();
    names.sort_unstable();
    // One DREQ and one DREP each way, nothing retransmitted.
    assert_eq!(names, ["DREP", "DREP", "DREQ", "DREQ"]);
    assert_eq!(sim.a.stats().retransmits + sim.b.stats().retransmits, 0);
}

#[test]
fn consumer_reject_carries_private_data_and_frees_the_backlog() {
    let mut sim = Sim::new(7, CLEAN);
    sim.b.listen(SID, 1).unwrap();
    let first = sim.a.connect(&params(), 0).unwrap();
    let mut other_qp = params();
    other_qp.qpn += 1;
    let second = sim.a.connect(&other_qp, 0).unwrap();
    let mut rejected_once = false;
    sim.run(
        |sim, at_a, e| match (at_a, e) {
            (false, CmEvent::ConnectRequest { conn, req, .. }) => {
                let now = sim.now;
                if !rejected_once {
                    assert_eq!(req.remote_comm_id, first.0);
                    rejected_once = true;
                    sim.b.reject(*conn, b"go away").unwrap();
                } else {
                    assert_eq!(req.remote_comm_id, second.0);
                    sim.b.accept(*conn, &RepParams::new(0x51, 1), now).unwrap();
                }
            }
            (true, CmEvent::ConnectResponse { conn, .. }) => sim.a.establish(*conn, &[]).unwrap(),
            _ => {}
        },
        1000,
    );
    let t = timeout_ns(20);
    let d = LINK_DELAY_NS;
    // The second REQ found the backlog (1) full, was dropped without a
    // REJ, and got in with its first retransmission.
    assert_eq!(sim.b.stats().req_backlog_full, 1);
    let Some((
        at,
        CmEvent::Rejected {
            conn,
            reason,
            private_data,
        },
    )) = sim.a_events.first()
    else {
        panic!("{:?}", sim.a_events)
    };
    assert_eq!(
        (*at, *conn, *reason),
        (2 * d, first, RejReason::ConsumerDefined)
    );
    assert_eq!(&private_data[..7], b"go away");
    assert!(private_data[7..].iter().all(|&b| b == 0));
    assert_eq!(private_data.len(), 148);
    assert_eq!(
        kinds(&sim.a_events),
        ["Rejected", "ConnectResponse", "Established"]
    );
    assert_eq!(sim.a_events[1].0, t + 2 * d);
    assert_eq!(sim.b_events[1].0, t + d);
    // The REJ on the wire: reason 28, it rejects the REQ, names both IDs.
    let rej = sim
        .wire
        .iter()
        .find_map(|(_, _, t)| match parse(&t.mad).message {
            CmMessage::Rej(r) => Some((
                r.local_comm_id,
                r.remote_comm_id,
                r.message_rejected,
                r.reason.code(),
            )),
            _ => None,
        })
        .unwrap();
    assert_eq!(rej.1, first.0);
    assert_ne!(rej.0, 0);
    assert_eq!((rej.2, rej.3), (MessageRef::Req, 28));
}

#[test]
fn req_for_an_unknown_service_is_rejected_with_reason_8() {
    let mut sim = Sim::new(8, CLEAN);
    sim.b.listen(SID + 1, 0).unwrap();
    let conn = sim.a.connect(&params(), 0).unwrap();
    sim.run(|_, _, _| {}, 100);
    let [(
        at,
        CmEvent::Rejected {
            conn: c, reason, ..
        },
    )] = &sim.a_events[..]
    else {
        panic!("{:?}", sim.a_events)
    };
    assert_eq!(
        (*at, *c, *reason),
        (2 * LINK_DELAY_NS, conn, RejReason::InvalidServiceId)
    );
    assert!(sim.b_events.is_empty());
    assert_eq!(sim.b.stats().req_no_listener, 1);
    assert_eq!(sim.a.live_connections() + sim.b.live_connections(), 0);
}

/// perftest -R: a second connection to the same service right after the
/// first is up, while the server listens anew. A REQ that finds no
/// listener from a peer with a connection to that service established is
/// left unanswered (counted), and its retransmission finds the listener.
#[test]
fn a_second_req_waits_for_a_listener_coming_back() {
    let (mut sim, _a_conn, _b_conn) = established();
    sim.b.unlisten(SID).unwrap();
    let now = sim.now;
    let second = sim
        .a
        .connect(
            &ConnectParams {
                qpn: 0x41,
                ..params()
            },
            now,
        )
        .unwrap();
    sim.step();
    sim.step();
    assert_eq!(
        (
            sim.b.stats().req_no_listener_held,
            sim.b.stats().req_no_listener
        ),
        (1, 0)
    );
    assert!(sim.a.poll_event().is_none(), "no REJ");
    sim.b.listen(SID, 0).unwrap();
    let mut requested = false;
    sim.run(
        |sim, at_a, e| match (at_a, e) {
            (false, CmEvent::ConnectRequest { conn, .. }) => {
                requested = true;
                let now = sim.now;
                sim.b
                    .accept(*conn, &RepParams::new(0x51, 0x300), now)
                    .unwrap();
            }
            (true, CmEvent::ConnectResponse { conn, .. }) => sim.a.establish(*conn, &[]).unwrap(),
            _ => {}
        },
        100_000,
    );
    assert!(requested, "the retransmitted REQ reached the new listener");
    assert_eq!(sim.a.state(second), Some(State::Established));
    // (A peer without such a connection still gets REJ 8 at once:
    // req_for_an_unknown_service_is_rejected_with_reason_8.)
}

#[test]
fn req_naming_a_foreign_gid_is_rejected_with_reason_12() {
    let mut b = engine(B_GID, B_GUID, 1);
    b.listen(SID, 0).unwrap();
    let mut a = engine(A_GID, A_GUID, 1);
    let mut p = params();
    p.path.remote_gid = xroce_wire::Gid::from_ipv4([10, 9, 9, 9]);
    a.connect(&p, 0).unwrap();
    let req = a.poll_transmit().unwrap();
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &req.mad, 0);
    let rej = b.poll_transmit().unwrap();
    let CmMessage::Rej(r) = parse(&rej.mad).message else {
        panic!()
    };
    assert_eq!(r.reason, RejReason::InvalidGid);
    assert_eq!(b.stats().req_invalid_gid, 1);
    assert!(b.poll_event().is_none());
}

#[test]
fn mra_stretches_the_req_timer_and_answers_duplicates() {
    let mut a = engine(A_GID, A_GUID, 1);
    let mut b = engine(B_GID, B_GUID, 2);
    b.listen(SID, 0).unwrap();
    let conn = a.connect(&params(), 0).unwrap();
    let req = a.poll_transmit().unwrap();
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &req.mad, 10);
    let Some(CmEvent::ConnectRequest { conn: bc, .. }) = b.poll_event() else {
        panic!()
    };
    b.mra(bc, 22).unwrap();
    let mra = b.poll_transmit().unwrap();
    let CmMessage::Mra(m) = parse(&mra.mad).message else {
        panic!()
    };
    assert_eq!(
        (m.local_comm_id, m.remote_comm_id, m.service_timeout),
        (bc.0, conn.0, 22)
    );
    assert_eq!(m.message_mraed, MessageRef::Req);
    a.handle_mad(PeerAddr::gsi(B_GID), A_GID, &mra.mad, 20);
    assert_eq!(a.state(conn), Some(State::MraReqRcvd));
    assert_eq!(a.poll_timeout(), Some(20 + timeout_ns(22) + timeout_ns(20)));
    // A duplicate REQ is answered with the MRA again.
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &req.mad, 30);
    assert_eq!(b.poll_transmit().unwrap().mad, mra.mad);
    assert!(b.poll_event().is_none());
    // The consumer answers after all.
    b.accept(bc, &RepParams::new(9, 9), 40).unwrap();
    let rep = b.poll_transmit().unwrap();
    a.handle_mad(PeerAddr::gsi(B_GID), A_GID, &rep.mad, 50);
    assert!(matches!(
        a.poll_event(),
        Some(CmEvent::ConnectResponse { .. })
    ));
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn dreq_for_an_unknown_connection_gets_a_drep() {
    let mut b = engine(B_GID, B_GUID, 1);
    let dreq = CmMadRepr::new(
        0x1234_5678_9abc,
        CmMessage::Dreq(DreqRepr {
            local_comm_id: 0x1111,
            remote_comm_id: 0x2222,
            remote_qpn: 0x33,
            private_data: &[],
        }),
    );
    let mut mad = [0u8; MAD_LEN];
    dreq.emit(&mut mad).unwrap();
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &mad, 0);
    let drep = b.poll_transmit().unwrap();
    assert_eq!(drep.peer, PeerAddr::gsi(A_GID));
    assert_eq!(drep.local_gid, B_GID);
    let r = parse(&drep.mad);
    assert_eq!(r.header.transaction_id, 0x1234_5678_9abc);
    let CmMessage::Drep(d) = r.message else {
        panic!()
    };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (0x2222, 0x1111));
    assert_eq!(b.stats().unknown_comm_id, 1);
    assert!(b.poll_event().is_none());
}

#[test]
fn strays_and_malformed_mads_are_counted_and_dropped() {
    let mut b = engine(B_GID, B_GUID, 1);
    b.listen(SID, 0).unwrap();
    let from = PeerAddr::gsi(A_GID);
    // Short, wrong base version, wrong class, wrong class version, unknown
    // attribute, all zeros.
    let mut good = [0u8; MAD_LEN];
    CmMadRepr::new(
        1,
        CmMessage::Rtu(CommIdsRepr {
            local_comm_id: 5,
            remote_comm_id: 6,
            private_data: &[],
        }),
    )
    .emit(&mut good)
    .unwrap();
    let mut bad = Vec::new();
    bad.push(good[..100].to_vec());
    for (at, v) in [(0, 2u8), (1, 0x81), (2, 1)] {
        let mut m = good;
        m[at] = v;
        bad.push(m.to_vec());
    }
    let mut m = good;
    m[17] = 0x99;
    bad.push(m.to_vec());
    bad.push(vec![0; MAD_LEN]);
    for m in &bad {
        b.handle_mad(from, B_GID, m, 0);
    }
    assert_eq!(b.stats().malformed, 6);
    // A well-formed RTU, REP, REJ, DREP, MRA for nobody.
    b.handle_mad(from, B_GID, &good, 0);
    assert_eq!(b.stats().unknown_comm_id, 1);
    // LAP: path migration is not supported.
    let mut lap = good;
    lap[17] = 0x19;
    b.handle_mad(from, B_GID, &lap, 0);
    assert_eq!(b.stats().unsupported, 1);
    assert_eq!(b.stats().received, 8);
    assert_eq!(b.stats().sent, 0);
    assert!(b.poll_event().is_none());
    assert!(b.poll_transmit().is_none());
}

#[test]
fn sidr_round_trip_and_unknown_service() {
    let mut sim = Sim::new(9, CLEAN);
    let usid = 0x0111_1c06;
    sim.b.listen(usid, 0).unwrap();
    let req = |sid| SidrRequestParams {
        service_id: sid,
        local_gid: A_GID,
        remote_gid: B_GID,
        pkey: 0xffff,
        timeout: 20,
        max_retries: 15,
        private_data: b"who serves this?".to_vec(),
    };
    let known = sim.a.sidr_request(&req(usid), 0).unwrap();
    let unknown = sim.a.sidr_request(&req(usid + 1), 0).unwrap();
    sim.run(
        |sim, at_a, e| {
            if let (
                false,
                CmEvent::SidrRequest {
                    conn,
                    private_data,
                    pkey,
                    ..
                },
            ) = (at_a, e)
            {
                assert_eq!(&private_data[..16], b"who serves this?");
                assert_eq!(*pkey, 0xffff);
                let reply = SidrReplyParams {
                    status: SidrStatus::Success,
                    qpn: 0x1234,
                    qkey: 0x0123_4567,
                    private_data: b"here".to_vec(),
                };
                sim.b.sidr_reply(*conn, &reply).unwrap();
            }
        },
        100,
    );
    let mut responses: Vec<_> = sim
        .a_events
        .iter()
        .map(|(_, e)| match e {
            CmEvent::SidrResponse {
                conn,
                status,
                qpn,
                qkey,
                private_data,
            } => (*conn, *status, *qpn, *qkey, private_data[..4].to_vec()),
            other => panic!("{other:?}"),
        })
        .collect();
    // (The two answers may arrive in either order.)
    responses.sort_by_key(|r| r.1 != SidrStatus::Success);
    assert_eq!(kinds(&sim.a_events), ["SidrResponse", "SidrResponse"]);
    assert_eq!(
        responses,
        [
            (
                known,
                SidrStatus::Success,
                0x1234,
                0x0123_4567,
                b"here".to_vec()
            ),
            (unknown, SidrStatus::ServiceIdNotSupported, 0, 0, vec![0; 4]),
        ]
    );
    assert_eq!(sim.b.stats().sidr_no_listener, 1);
    assert_eq!(sim.a.live_connections() + sim.b.live_connections(), 0);
}

#[test]
fn consumer_misuse_is_refused_without_side_effects() {
    let mut a = engine(A_GID, A_GUID, 1);
    assert_eq!(a.listen(SID, 0), Ok(()));
    assert_eq!(a.listen(SID, 0), Err(CmError::AlreadyListening(SID)));
    assert_eq!(a.unlisten(SID + 1), Err(CmError::NotListening(SID + 1)));
    assert_eq!(
        a.accept(ConnId(77), &RepParams::new(1, 1), 0),
        Err(CmError::UnknownConn(ConnId(77)))
    );
    let mut p = params();
    p.path.local_gid = B_GID;
    assert_eq!(a.connect(&p, 0), Err(CmError::NotLocalGid(B_GID)));
    let mut p = params();
    p.private_data = vec![1; 93];
    assert_eq!(
        a.connect(&p, 0),
        Err(CmError::Mad(MadError::PrivateDataTooLong {
            max: 92,
            len: 93
        }))
    );
    assert_eq!(a.live_connections(), 0);
    let conn = a.connect(&params(), 0).unwrap();
    assert_eq!(
        a.establish(conn, &[]),
        Err(CmError::WrongState(State::ReqSent))
    );
    assert_eq!(
        a.disconnect(conn, &[], 0),
        Err(CmError::WrongState(State::ReqSent))
    );
    assert_eq!(a.stats().sent, 1);
}

#[test]
fn rep_naming_qp1_is_a_connect_error() {
    let mut a = engine(A_GID, A_GUID, 1);
    let conn = a.connect(&params(), 0).unwrap();
    let req = a.poll_transmit().unwrap();
    let tid = parse(&req.mad).header.transaction_id;
    let rep = CmMadRepr::new(
        tid,
        CmMessage::Rep(xroce_wire::cm::RepRepr {
            local_comm_id: 0x99,
            remote_comm_id: conn.0,
            local_qkey: 0,
            local_qpn: 1,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: B_GUID,
            private_data: &[],
        }),
    );
    let mut mad = [0u8; MAD_LEN];
    rep.emit(&mut mad).unwrap();
    a.handle_mad(PeerAddr::gsi(B_GID), A_GID, &mad, 5);
    assert_eq!(
        a.poll_event(),
        Some(CmEvent::ConnectError {
            conn,
            reason: RejReason::InvalidCommId
        })
    );
    let rej = a.poll_transmit().unwrap();
    let r = parse(&rej.mad);
    assert_eq!(r.header.transaction_id, tid);
    let CmMessage::Rej(r) = r.message else {
        panic!()
    };
    assert_eq!((r.local_comm_id, r.remote_comm_id), (conn.0, 0x99));
    assert_eq!(r.message_rejected, MessageRef::Rep);
    assert_eq!(a.live_connections(), 0);
}

#[test]
fn req_replayed_into_timewait_is_a_stale_connection() {
    let mut a = engine(A_GID, A_GUID, 1);
    let mut b = engine(B_GID, B_GUID, 2);
    b.listen(SID, 0).unwrap();
    a.connect(&params(), 0).unwrap();
    let req = a.poll_transmit().unwrap();
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &req.mad, 0);
    let Some(CmEvent::ConnectRequest { conn, .. }) = b.poll_event() else {
        panic!()
    };
    b.accept(conn, &RepParams::new(5, 5), 0).unwrap();
    b.establish(conn, &[]).unwrap();
    b.destroy(conn, 10).unwrap();
    while b.poll_transmit().is_some() {}
    assert_eq!(b.state(conn), Some(State::Timewait));
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &req.mad, 20);
    let rej = b.poll_transmit().unwrap();
    let CmMessage::Rej(r) = parse(&rej.mad).message else {
        panic!()
    };
    assert_eq!(r.reason, RejReason::StaleConn);
    assert_eq!(
        (r.local_comm_id, r.message_rejected),
        (conn.0, MessageRef::Req)
    );
    let events: Vec<CmEvent> = std::iter::from_fn(|| b.poll_event()).collect();
    assert_eq!(events, [CmEvent::Established { conn }]);
}

/// As Linux's ib_cm (cm_match_req): the REQ is rejected as stale, and the
/// old connection, still established here, is taken down with a DREQ so
/// that the peer's next try finds none (after a restart the peer's QPs
/// start at the same numbers again).
#[test]
fn req_from_a_qp_already_connected_is_rejected_stale() {
    let (mut sim, a_conn, b_conn) = established();
    // The same QP asks again (say, after a restart of the peer's CM).
    let now = sim.now;
    let again = sim.a.connect(&params(), now).unwrap();
    assert_ne!(again, a_conn);
    sim.step();
    sim.step();
    assert_eq!(sim.b.stats().req_stale, 1);
    let rej = sim
        .wire
        .iter()
        .find_map(|(_, from_a, t)| match parse(&t.mad).message {
            CmMessage::Rej(r) if !from_a => Some((r.local_comm_id, r.remote_comm_id, r.reason)),
            _ => None,
        })
        .unwrap();
    assert_eq!(rej, (0, again.0, RejReason::StaleConn));
    assert!(matches!(
        sim.a.poll_event(),
        Some(CmEvent::Rejected { conn, reason: RejReason::StaleConn, .. }) if conn == again
    ));
    // B's old connection sends its DREQ right after the REJ.
    assert_eq!(sim.b.state(b_conn), Some(State::DreqSent));
    let dreq = sim
        .wire
        .iter()
        .find_map(|(_, from_a, t)| match parse(&t.mad).message {
            CmMessage::Dreq(d) if !from_a => Some((d.local_comm_id, d.remote_comm_id)),
            _ => None,
        })
        .expect("no DREQ for the stale connection");
    assert_eq!(dreq, (b_conn.0, a_conn.0));
    assert!(sim.b.poll_event().is_none());
    // A's side of it hears of the disconnect; its answer ends it at B.
    sim.step();
    assert!(matches!(
        sim.a.poll_event(),
        Some(CmEvent::DisconnectRequest { conn, .. }) if conn == a_conn
    ));
    let now = sim.now;
    sim.a.disconnect(a_conn, &[], now).unwrap();
    sim.step();
    sim.step();
    assert_eq!(
        sim.b.poll_event(),
        Some(CmEvent::Disconnected { conn: b_conn })
    );
}

#[test]
fn mra_for_our_rep_stretches_the_rep_timer() {
    let mut a = engine(A_GID, A_GUID, 1);
    let mut b = engine(B_GID, B_GUID, 2);
    b.listen(SID, 0).unwrap();
    let a_conn = a.connect(&params(), 0).unwrap();
    let req = a.poll_transmit().unwrap();
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &req.mad, 0);
    let Some(CmEvent::ConnectRequest { conn, .. }) = b.poll_event() else {
        panic!()
    };
    b.accept(conn, &RepParams::new(5, 5), 100).unwrap();
    let rep = b.poll_transmit().unwrap();
    assert_eq!(b.poll_timeout(), Some(100 + timeout_ns(20)));
    let tid = parse(&rep.mad).header.transaction_id;
    let mra = CmMadRepr::new(
        tid,
        CmMessage::Mra(xroce_wire::cm::MraRepr {
            local_comm_id: a_conn.0,
            remote_comm_id: conn.0,
            message_mraed: MessageRef::Rep,
            service_timeout: 21,
            private_data: &[],
        }),
    );
    let mut mad = [0u8; MAD_LEN];
    mra.emit(&mut mad).unwrap();
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &mad, 200);
    assert_eq!(b.state(conn), Some(State::MraRepRcvd));
    assert_eq!(
        b.poll_timeout(),
        Some(200 + timeout_ns(21) + timeout_ns(20))
    );
    // The same MRA again changes nothing.
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &mad, 300);
    assert_eq!(
        b.poll_timeout(),
        Some(200 + timeout_ns(21) + timeout_ns(20))
    );
    assert_eq!(b.stats().duplicates, 1);
    // The RTU establishes from MRA_REP_RCVD and stops the timer.
    a.handle_mad(PeerAddr::gsi(B_GID), A_GID, &rep.mad, 400);
    assert!(matches!(
        a.poll_event(),
        Some(CmEvent::ConnectResponse { .. })
    ));
    a.establish(a_conn, &[]).unwrap();
    let rtu = a.poll_transmit().unwrap();
    b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &rtu.mad, 500);
    assert_eq!(b.poll_event(), Some(CmEvent::Established { conn }));
    assert_eq!(b.poll_timeout(), None);
}

#[test]
fn duplicate_dreq_in_timewait_is_answered_again() {
    let (mut sim, a_conn, b_conn) = established();
    let now = sim.now;
    sim.a.disconnect(a_conn, b"x", now).unwrap();
    let dreq = sim.a.poll_transmit().unwrap();
    // A DREQ naming another QP of B's is not about this connection.
    let mut wrong_qp = dreq.mad;
    wrong_qp[24 + 10] ^= 0x01;
    sim.b
        .handle_mad(PeerAddr::gsi(A_GID), B_GID, &wrong_qp, now);
    assert_eq!(sim.b.stats().unexpected, 1);
    assert!(sim.b.poll_event().is_none());
    sim.b
        .handle_mad(PeerAddr::gsi(A_GID), B_GID, &dreq.mad, now);
    assert!(matches!(
        sim.b.poll_event(),
        Some(CmEvent::DisconnectRequest { .. })
    ));
    // The same DREQ again before the consumer answered: nothing new.
    sim.b
        .handle_mad(PeerAddr::gsi(A_GID), B_GID, &dreq.mad, now);
    assert!(sim.b.poll_transmit().is_none());
    sim.b.disconnect(b_conn, &[], now).unwrap();
    let drep = sim.b.poll_transmit().unwrap();
    let r = parse(&drep.mad);
    assert_eq!(
        r.header.transaction_id,
        parse(&dreq.mad).header.transaction_id
    );
    // Our DREP was lost; A's retransmitted DREQ finds B in TIMEWAIT.
    sim.b
        .handle_mad(PeerAddr::gsi(A_GID), B_GID, &dreq.mad, now + 1);
    assert_eq!(sim.b.poll_transmit().unwrap().mad, drep.mad);
    assert_eq!(sim.b.stats().duplicates, 2);
    assert_eq!(sim.b.state(b_conn), Some(State::Timewait));
    // A gets the DREP twice: one Disconnected.
    sim.a
        .handle_mad(PeerAddr::gsi(B_GID), A_GID, &drep.mad, now + 2);
    sim.a
        .handle_mad(PeerAddr::gsi(B_GID), A_GID, &drep.mad, now + 3);
    assert_eq!(
        sim.a.poll_event(),
        Some(CmEvent::Disconnected { conn: a_conn })
    );
    assert_eq!(sim.a.poll_event(), None);
    assert_eq!(sim.a.stats().duplicates, 1);
}
