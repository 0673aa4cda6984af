//! Two engines over a link that loses, duplicates and reorders MADs
//! (seeded): every run establishes exactly once, carries the private data
//! intact, disconnects and leaves TIMEWAIT on both sides.

mod common;

use common::{kinds, Faults, Sim, A_GID, B_GID, CLEAN, LINK_DELAY_NS};
use xroce_cm::{timeout_ns, CmEvent, ConnId, ConnectParams, PathParams, RepParams};

const SID: u64 = 0x0106_1c06;
const A_QPN: u32 = 0x11;
const A_PSN: u32 = 0x1_c04e;
const B_QPN: u32 = 0x22;
const B_PSN: u32 = 0x5c_b7ea;

fn padded(data: &[u8], field: usize) -> Vec<u8> {
    let mut v = data.to_vec();
    v.resize(field, 0);
    v
}

/// Connect, accept, establish, disconnect from A once B is established.
fn full_run(seed: u64, faults: Faults) -> Sim {
    let mut sim = Sim::new(seed, faults);
    sim.b.listen(SID, 4).unwrap();
    let mut p = ConnectParams::new(
        SID,
        A_QPN,
        A_PSN,
        PathParams::roce(A_GID, B_GID, 5, 0x4_7c23),
    );
    p.private_data = b"REQ private data from A".to_vec();
    let a_conn = sim.a.connect(&p, 0).unwrap();
    let mut b_conn = None;
    sim.run(
        |sim, at_a, e| {
            let now = sim.now;
            match (at_a, e) {
                (
                    false,
                    CmEvent::ConnectRequest {
                        conn,
                        req,
                        private_data,
                        listener,
                        ..
                    },
                ) => {
                    assert_eq!(*listener, SID);
                    assert_eq!(private_data, &padded(b"REQ private data from A", 92));
                    assert_eq!((req.remote_qpn, req.starting_psn), (A_QPN, A_PSN));
                    assert_eq!(req.remote_comm_id, a_conn.0);
                    assert_eq!(req.path, PathParams::roce(B_GID, A_GID, 5, 0x4_7c23));
                    b_conn = Some(*conn);
                    let mut rep = RepParams::new(B_QPN, B_PSN);
                    rep.private_data = b"REP private data from B".to_vec();
                    sim.b.accept(*conn, &rep, now).unwrap();
                }
                (
                    true,
                    CmEvent::ConnectResponse {
                        conn,
                        rep,
                        private_data,
                    },
                ) => {
                    assert_eq!(*conn, a_conn);
                    assert_eq!(private_data, &padded(b"REP private data from B", 196));
                    assert_eq!((rep.remote_qpn, rep.starting_psn), (B_QPN, B_PSN));
                    assert_eq!(Some(ConnId(rep.remote_comm_id)), b_conn);
                    sim.a.establish(*conn, b"RTU").unwrap();
                }
                (false, CmEvent::Established { .. }) => {
                    sim.a.disconnect(a_conn, b"bye", now).unwrap();
                }
                (false, CmEvent::DisconnectRequest { conn, private_data }) => {
                    assert_eq!(private_data, &padded(b"bye", 220));
                    sim.b.disconnect(*conn, &[], now).unwrap();
                }
                _ => {}
            }
        },
        100_000,
    );
    sim
}

#[test]
fn clean_link_exact_sequence_and_times() {
    let sim = full_run(1, CLEAN);
    let d = LINK_DELAY_NS;
    let a: Vec<u64> = sim.a_events.iter().map(|(t, _)| *t).collect();
    let b: Vec<u64> = sim.b_events.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        kinds(&sim.a_events),
        [
            "ConnectResponse",
            "Established",
            "Disconnected",
            "TimewaitExit"
        ]
    );
    assert_eq!(
        kinds(&sim.b_events),
        [
            "ConnectRequest",
            "Established",
            "DisconnectRequest",
            "TimewaitExit"
        ]
    );
    // REQ sent at 0, REP at d, RTU at 2d, DREQ at 3d (once B is
    // established), DREP at 4d; TIMEWAIT is the path's ACK timeout (19).
    let tw = timeout_ns(19);
    assert_eq!(a, [2 * d, 2 * d, 5 * d, 5 * d + tw]);
    assert_eq!(b, [d, 3 * d, 4 * d, 4 * d + tw]);
    let names: Vec<&str> = sim
        .wire
        .iter()
        .map(|(_, _, t)| {
            xroce_wire::cm::CmMadRepr::parse(&t.mad)
                .unwrap()
                .message
                .attribute()
                .name()
        })
        .collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    assert_eq!(sim.a.live_connections() + sim.b.live_connections(), 0);
    assert_eq!(sim.a.stats().retransmits + sim.b.stats().retransmits, 0);
}

#[test]
fn lossy_link_establishes_exactly_once_for_every_seed() {
    let faults = Faults {
        loss: 200,
        duplicate: 150,
        jitter_us: 50,
    };
    let (mut retransmits, mut duplicates) = (0, 0);
    for seed in 0..300 {
        let sim = full_run(seed, faults);
        assert_eq!(
            kinds(&sim.a_events),
            [
                "ConnectResponse",
                "Established",
                "Disconnected",
                "TimewaitExit"
            ],
            "seed {seed}"
        );
        assert_eq!(
            kinds(&sim.b_events),
            [
                "ConnectRequest",
                "Established",
                "DisconnectRequest",
                "TimewaitExit"
            ],
            "seed {seed}"
        );
        assert_eq!(sim.a.live_connections() + sim.b.live_connections(), 0);
        for e in [&sim.a, &sim.b] {
            assert_eq!(e.stats().malformed, 0, "seed {seed}");
        }
        retransmits += sim.a.stats().retransmits + sim.b.stats().retransmits;
        duplicates += sim.a.stats().duplicates + sim.b.stats().duplicates;
    }
    // The faults did happen and were absorbed.
    assert!(retransmits > 100, "{retransmits}");
    assert!(duplicates > 100, "{duplicates}");
}

#[test]
fn same_seed_same_run() {
    let faults = Faults {
        loss: 300,
        duplicate: 200,
        jitter_us: 100,
    };
    let x = full_run(42, faults);
    let y = full_run(42, faults);
    assert_eq!(x.a_events, y.a_events);
    assert_eq!(x.b_events, y.b_events);
    assert_eq!(x.wire, y.wire);
}

#[test]
fn rejects_and_sidr_end_exactly_once_over_a_lossy_link() {
    use xroce_cm::{RejReason, SidrReplyParams, SidrRequestParams, SidrStatus};
    let faults = Faults {
        loss: 250,
        duplicate: 150,
        jitter_us: 50,
    };
    const UDP_SID: u64 = 0x0111_1c06;
    for seed in 0..200 {
        let mut sim = Sim::new(seed, faults);
        sim.b.listen(SID, 0).unwrap();
        sim.b.listen(UDP_SID, 0).unwrap();
        let path = PathParams::roce(A_GID, B_GID, 5, 1);
        let refused = sim
            .a
            .connect(&ConnectParams::new(SID, 1000, 1, path), 0)
            .unwrap();
        let nobody = sim
            .a
            .connect(&ConnectParams::new(SID + 1, 1001, 1, path), 0)
            .unwrap();
        let sidr = SidrRequestParams {
            service_id: UDP_SID,
            local_gid: A_GID,
            remote_gid: B_GID,
            pkey: 0xffff,
            timeout: 16,
            max_retries: 15,
            private_data: Vec::new(),
        };
        let resolve = sim.a.sidr_request(&sidr, 0).unwrap();
        sim.run(
            |sim, at_a, e| match (at_a, e) {
                (false, CmEvent::ConnectRequest { conn, .. }) => {
                    sim.b.reject(*conn, b"full").unwrap();
                }
                (false, CmEvent::SidrRequest { conn, .. }) => {
                    let reply = SidrReplyParams {
                        status: SidrStatus::Success,
                        qpn: 77,
                        qkey: 0x0123_4567,
                        private_data: Vec::new(),
                    };
                    sim.b.sidr_reply(*conn, &reply).unwrap();
                }
                _ => {}
            },
            100_000,
        );
        // Each of A's three ends in exactly one terminal event, the right one.
        let mut a = sim.a_events.clone();
        a.sort_by_key(|(_, e)| e.conn());
        assert_eq!(a.len(), 3, "seed {seed}: {:?}", sim.a_events);
        for (_, e) in &a {
            assert!(e.is_terminal(), "seed {seed}: {e:?}");
            match e {
                CmEvent::Rejected {
                    conn,
                    reason,
                    private_data,
                } if *conn == refused => {
                    assert_eq!(*reason, RejReason::ConsumerDefined);
                    assert_eq!(&private_data[..4], b"full");
                }
                CmEvent::Rejected { conn, reason, .. } if *conn == nobody => {
                    assert_eq!(*reason, RejReason::InvalidServiceId);
                }
                CmEvent::SidrResponse {
                    conn, status, qpn, ..
                } if *conn == resolve => {
                    assert_eq!((*status, *qpn), (SidrStatus::Success, 77));
                }
                other => panic!("seed {seed}: {other:?}"),
            }
        }
        assert_eq!(sim.a.live_connections() + sim.b.live_connections(), 0);
    }
}
