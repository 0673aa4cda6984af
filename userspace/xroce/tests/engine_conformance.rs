//! IBTA conformance of the transport where clients depend on it, over the
//! simulated link: zero-length RDMA WRITE and READ need no valid R_Key or
//! VA (C9-88; UCX's rc_verbs flush posts a zero-length WRITE with VA 0 and
//! R_Key 0), and access errors are reported as IBTA and rxe report them (an
//! error completion at the requester, an affiliated asynchronous error at
//! the responder when no receive WQE carries it; C9-222.1.1).

use xroce::engine::{AsyncEvent, SrMode};
use xroce::verbs::sim::{connect_pair, sim_pair, Endpoint, LinkConfig, PairParams, Sim};
use xroce::verbs::*;

const MS: u64 = 1_000_000;

fn drain(cq: &CompletionQueue) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut buf = [Wc::default(); 32];
    while let Ok(n) = cq.poll(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// Run until `na` completions are on A's CQ and `nb` on B's (or 100 ms of
/// simulated time), and return them.
fn run(sim: &mut Sim, a: &Endpoint, b: &Endpoint, na: usize, nb: usize) -> (Vec<Wc>, Vec<Wc>) {
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let deadline = sim.now + 100 * MS;
    sim.run_until(deadline, |_| {
        wa.extend(drain(&a.cq));
        wb.extend(drain(&b.cq));
        wa.len() >= na && wb.len() >= nb
    });
    wa.extend(drain(&a.cq));
    wb.extend(drain(&b.cq));
    (wa, wb)
}

fn events(dev: &Device) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| dev.poll_async_event()).collect()
}

fn ok(wc: &[Wc]) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    wc.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

/// A zero-length SGE whose lkey names no MR: like zero SGEs, it needs none.
fn empty_sge() -> Sge {
    Sge {
        addr: 0,
        length: 0,
        lkey: 0xdead_beef,
    }
}

fn pair(seed: u64, qp_type: QpType) -> (Sim, Endpoint, Endpoint) {
    let sim = sim_pair(LinkConfig::default(), seed);
    let p = PairParams {
        qp_type,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    (sim, a, b)
}

#[test]
fn zero_length_write_and_read_with_rkey_0_complete_on_both_sides() {
    for mode in [SrMode::Off, SrMode::Auto, SrMode::On] {
        let (mut sim, a, b) = pair(1, QpType::Rc);
        // A verbs QP agrees in band unless told otherwise.
        assert_eq!(a.qp.selective_repeat().unwrap().mode, SrMode::Auto);
        sim.a
            .lock()
            .set_selective_repeat(a.qp.qp_num(), mode)
            .unwrap();
        sim.b
            .lock()
            .set_selective_repeat(b.qp.qp_num(), mode)
            .unwrap();
        b.qp.post_recv(&RecvWr {
            wr_id: 50,
            sg_list: vec![b.mr.sge(0, 64)],
        })
        .unwrap();
        let null = |id, op| SendWr::new(id, op, vec![]);
        let wrs = [
            // UCX's flush: VA 0, R_Key 0, no SGE.
            null(
                1,
                WrOpcode::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0,
                },
            ),
            SendWr::new(
                2,
                WrOpcode::RdmaWrite {
                    remote_addr: 0x1234_5678,
                    rkey: 0x0bad_0bad,
                },
                vec![empty_sge()],
            ),
            null(
                3,
                WrOpcode::RdmaWriteWithImm {
                    remote_addr: 0,
                    rkey: 0,
                    imm: 0x0102_0304,
                },
            ),
            null(
                4,
                WrOpcode::RdmaRead {
                    remote_addr: 0,
                    rkey: 0,
                },
            ),
            SendWr::new(
                5,
                WrOpcode::RdmaRead {
                    remote_addr: u64::MAX,
                    rkey: 0xffff_ffff,
                },
                vec![empty_sge()],
            ),
        ];
        for w in &wrs {
            a.qp.post_send(w).unwrap();
        }
        let (wa, wb) = run(&mut sim, &a, &b, 5, 1);
        use WcOpcode::{RdmaRead, RdmaWrite, RecvRdmaWithImm};
        use WcStatus::Success;
        assert_eq!(
            ok(&wa),
            [
                (1, Success, RdmaWrite, 0),
                (2, Success, RdmaWrite, 0),
                (3, Success, RdmaWrite, 0),
                (4, Success, RdmaRead, 0),
                (5, Success, RdmaRead, 0),
            ],
            "mode={mode}"
        );
        assert_eq!(ok(&wb), [(50, Success, RecvRdmaWithImm, 0)], "mode={mode}");
        assert_eq!(wb[0].imm_data, 0x0102_0304);
        // A's requests went to B: A's requester and B's responder run
        // selective repeat unless Off; B sent no request.
        let (sa, sb) = (
            a.qp.selective_repeat().unwrap(),
            b.qp.selective_repeat().unwrap(),
        );
        let on = mode != SrMode::Off;
        assert_eq!((sa.requester, sb.responder), (on, on), "mode={mode}");
        assert_eq!(sb.requester, mode == SrMode::On, "mode={mode}");
        assert_eq!((a.qp.state(), b.qp.state()), (QpState::Rts, QpState::Rts));
        assert_eq!(sim.b.stats().tx_naks_other, 0);
        assert_eq!(events(&sim.a), []);
        assert_eq!(events(&sim.b), []);
        // The QPs carry on: a real WRITE after them lands.
        // SAFETY: no WR reads a.mr; b.mr is written only by this WRITE.
        unsafe { a.mr.write(0, b"after the flush") }.unwrap();
        let w = SendWr::new(
            6,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr() + 8,
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(0, 15)],
        );
        a.qp.post_send(&w).unwrap();
        let (wa, _) = run(&mut sim, &a, &b, 1, 0);
        assert_eq!(ok(&wa), [(6, Success, RdmaWrite, 15)]);
        // SAFETY: the WRITE has completed.
        assert_eq!(unsafe { b.mr.to_vec(8, 15) }.unwrap(), b"after the flush");
    }
}

#[test]
fn zero_length_uc_write_with_rkey_0_is_placed() {
    let (mut sim, a, b) = pair(2, QpType::Uc);
    b.qp.post_recv(&RecvWr {
        wr_id: 70,
        sg_list: vec![b.mr.sge(0, 64)],
    })
    .unwrap();
    for (id, op) in [
        (
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
        ),
        (
            2,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 7,
            },
        ),
    ] {
        a.qp.post_send(&SendWr::new(id, op, vec![])).unwrap();
    }
    let (wa, wb) = run(&mut sim, &a, &b, 2, 1);
    use WcStatus::Success;
    assert_eq!(
        ok(&wa),
        [
            (1, Success, WcOpcode::RdmaWrite, 0),
            (2, Success, WcOpcode::RdmaWrite, 0)
        ]
    );
    assert_eq!(ok(&wb), [(70, Success, WcOpcode::RecvRdmaWithImm, 0)]);
    assert_eq!(wb[0].imm_data, 7);
}

/// A non-zero WRITE with a bad R_Key: REM_ACCESS_ERR and flushes at the
/// requester, no async event there; the responder moves to ERR with
/// IBV_EVENT_QP_ACCESS_ERR (no receive WQE carries the error) and flushes
/// its receive queue.
#[test]
fn bad_rkey_write_is_rem_access_err_and_a_responder_access_event() {
    for mode in [SrMode::Off, SrMode::Auto, SrMode::On] {
        let (mut sim, a, b) = pair(3, QpType::Rc);
        sim.a
            .lock()
            .set_selective_repeat(a.qp.qp_num(), mode)
            .unwrap();
        sim.b
            .lock()
            .set_selective_repeat(b.qp.qp_num(), mode)
            .unwrap();
        b.qp.post_recv(&RecvWr {
            wr_id: 9,
            sg_list: vec![b.mr.sge(0, 64)],
        })
        .unwrap();
        let write = |id, rkey| {
            SendWr::new(
                id,
                WrOpcode::RdmaWrite {
                    remote_addr: b.mr.addr(),
                    rkey,
                },
                vec![a.mr.sge(0, 100)],
            )
        };
        a.qp.post_send(&write(1, 0)).unwrap();
        a.qp.post_send(&write(2, b.mr.rkey())).unwrap();
        a.qp.post_send(&write(3, b.mr.rkey())).unwrap();
        let (wa, wb) = run(&mut sim, &a, &b, 3, 1);
        use WcOpcode::{RdmaWrite, Recv};
        use WcStatus::{RemAccessErr, WrFlushErr};
        assert_eq!(
            ok(&wa)
                .iter()
                .map(|&(id, st, op, _)| (id, st, op))
                .collect::<Vec<_>>(),
            [
                (1, RemAccessErr, RdmaWrite),
                (2, WrFlushErr, RdmaWrite),
                (3, WrFlushErr, RdmaWrite)
            ],
            "mode={mode}"
        );
        assert_eq!(
            ok(&wb)
                .iter()
                .map(|&(id, st, op, _)| (id, st, op))
                .collect::<Vec<_>>(),
            [(9, WrFlushErr, Recv)]
        );
        assert_eq!((a.qp.state(), b.qp.state()), (QpState::Err, QpState::Err));
        assert_eq!(events(&sim.a), [], "mode={mode}");
        assert_eq!(
            events(&sim.b),
            [AsyncEvent::QpAccessError { qpn: b.qp.qp_num() }],
            "mode={mode}"
        );
        // Posting on the requester in ERR flushes at once.
        a.qp.post_send(&write(4, b.mr.rkey())).unwrap();
        assert_eq!(
            drain(&a.cq)
                .iter()
                .map(|w| (w.wr_id, w.status))
                .collect::<Vec<_>>(),
            [(4, WrFlushErr)]
        );
    }
}

/// The R_Key, bounds and permission errors of READs and atomics raise the
/// access error event too; a WRITE with immediate data reports it in the
/// receive WQE it consumed instead (as rxe: no event then).
#[test]
fn access_errors_of_each_operation() {
    let cases: [(&str, bool); 5] = [
        ("read beyond the MR", true),
        ("read with rkey 0", true),
        ("atomic with a bad rkey", true),
        ("write to a read-only MR", true),
        ("write with immediate, bad rkey", false),
    ];
    for (i, (what, event)) in cases.into_iter().enumerate() {
        let (mut sim, a, b) = pair(10 + i as u64, QpType::Rc);
        let ro =
            b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
                .unwrap();
        b.qp.post_recv(&RecvWr {
            wr_id: 90,
            sg_list: vec![b.mr.sge(0, 64)],
        })
        .unwrap();
        let op = match i {
            0 => WrOpcode::RdmaRead {
                remote_addr: b.mr.addr() + b.mr.len() as u64 - 10,
                rkey: b.mr.rkey(),
            },
            1 => WrOpcode::RdmaRead {
                remote_addr: b.mr.addr(),
                rkey: 0,
            },
            2 => WrOpcode::AtomicFetchAndAdd {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey() ^ 0x100,
                add: 1,
            },
            3 => WrOpcode::RdmaWrite {
                remote_addr: ro.addr(),
                rkey: ro.rkey(),
            },
            _ => WrOpcode::RdmaWriteWithImm {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey() ^ 0x100,
                imm: 5,
            },
        };
        a.qp.post_send(&SendWr::new(1, op, vec![a.mr.sge(0, 20)]))
            .unwrap();
        let (wa, wb) = run(&mut sim, &a, &b, 1, 1);
        assert_eq!(wa.len(), 1, "{what}");
        assert_eq!(wa[0].status, WcStatus::RemAccessErr, "{what}");
        assert_eq!(b.qp.state(), QpState::Err, "{what}");
        assert_eq!(events(&sim.a), [], "{what}");
        let access = AsyncEvent::QpAccessError { qpn: b.qp.qp_num() };
        assert_eq!(
            events(&sim.b),
            if event { vec![access] } else { vec![] },
            "{what}"
        );
        let want = if event {
            WcStatus::WrFlushErr
        } else {
            WcStatus::RemAccessErr
        };
        assert_eq!(
            wb.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(90, want)],
            "{what}"
        );
    }
}

/// Invalid requests the responder cannot tie to a receive WQE raise
/// IBV_EVENT_QP_REQ_ERR; the requester gets REM_INV_REQ_ERR.
#[test]
fn invalid_requests_raise_the_request_error_event() {
    for (i, what) in ["READ on a QP without remote read", "misaligned atomic"]
        .into_iter()
        .enumerate()
    {
        let sim = sim_pair(LinkConfig::default(), 20 + i as u64);
        // Case 0: both QPs allow remote WRITEs only.
        let p = PairParams {
            access: match i {
                0 => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                _ => PairParams::default().access,
            },
            ..Default::default()
        };
        let (a, b) = connect_pair(&sim, &p);
        let mut sim = sim;
        let op = match i {
            0 => WrOpcode::RdmaRead {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            _ => WrOpcode::AtomicCmpAndSwp {
                remote_addr: b.mr.addr() + 4,
                rkey: b.mr.rkey(),
                compare: 0,
                swap: 1,
            },
        };
        a.qp.post_send(&SendWr::new(1, op, vec![a.mr.sge(0, 8)]))
            .unwrap();
        let (wa, _) = run(&mut sim, &a, &b, 1, 0);
        assert_eq!(wa.len(), 1, "{what}");
        assert_eq!(wa[0].status, WcStatus::RemInvReqErr, "{what}");
        assert_eq!(events(&sim.a), [], "{what}");
        assert_eq!(
            events(&sim.b),
            [AsyncEvent::QpRequestError { qpn: b.qp.qp_num() }],
            "{what}"
        );
        assert_eq!(b.qp.state(), QpState::Err, "{what}");
    }
}
