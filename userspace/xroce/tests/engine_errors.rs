//! Error paths, QP state machine, CQ behaviour, pacing and ECN/CNP over the
//! simulated link.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xroce::cc::CongestionControl;
use xroce::engine::timers;
use xroce::verbs::sim::{
    connect_pair, sim_configs, sim_pair, Endpoint, LinkConfig, PairParams, Sim, SimLink,
};
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

/// Run until `n` completions are on `cq` (or `limit_ns` of simulated time).
fn wait_wcs(sim: &mut Sim, cq: &CompletionQueue, n: usize, limit_ns: u64) -> Vec<Wc> {
    let mut got = Vec::new();
    let deadline = sim.now + limit_ns;
    sim.run_until(deadline, |_| {
        got.extend(drain(cq));
        got.len() >= n
    });
    got.extend(drain(cq));
    got
}

fn write_wr(id: u64, a: &Endpoint, len: usize, remote_addr: u64, rkey: u32) -> SendWr {
    SendWr::new(
        id,
        WrOpcode::RdmaWrite { remote_addr, rkey },
        vec![a.mr.sge(0, len)],
    )
}

#[test]
fn bad_rkey_is_remote_access_error_and_flushes() {
    let mut sim = sim_pair(LinkConfig::default(), 1);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    b.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: vec![b.mr.sge(0, 64)],
    })
    .unwrap();
    a.qp.post_send(&write_wr(1, &a, 100, b.mr.addr(), b.mr.rkey() ^ 0x5a5))
        .unwrap();
    a.qp.post_send(&write_wr(2, &a, 100, b.mr.addr(), b.mr.rkey()))
        .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 2, 100 * MS);
    assert_eq!(w[0].wr_id, 1);
    assert_eq!(w[0].status, WcStatus::RemAccessErr);
    assert_eq!(w[1].wr_id, 2);
    assert_eq!(w[1].status, WcStatus::WrFlushErr);
    assert_eq!(a.qp.state(), QpState::Err);
    // The responder took a class C error too and flushed its receive queue.
    assert_eq!(b.qp.state(), QpState::Err);
    let wb = drain(&b.cq);
    assert_eq!(wb.len(), 1);
    assert_eq!(wb[0].status, WcStatus::WrFlushErr);
    assert_eq!(wb[0].wr_id, 9);
    // The requester's error completion is its report (no async event); the
    // responder, whose error no receive WQE carries, raised
    // IBV_EVENT_QP_ACCESS_ERR (IBTA C9-222.1.1, as rxe).
    use xroce::engine::AsyncEvent;
    assert_eq!(sim.a.poll_async_event(), None);
    assert_eq!(
        sim.b.poll_async_event(),
        Some(AsyncEvent::QpAccessError { qpn: b.qp.qp_num() })
    );
    assert_eq!(sim.b.poll_async_event(), None);
    assert_eq!(sim.a.poll_async_event(), None);
}

#[test]
fn out_of_bounds_and_missing_permission() {
    // READ past the end of the MR.
    let mut sim = sim_pair(LinkConfig::default(), 2);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let wr = SendWr::new(
        1,
        WrOpcode::RdmaRead {
            remote_addr: b.mr.addr() + b.mr.len() as u64 - 10,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, 20)],
    );
    a.qp.post_send(&wr).unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 100 * MS);
    assert_eq!(w[0].status, WcStatus::RemAccessErr);

    // WRITE to an MR without REMOTE_WRITE, atomic to one without REMOTE_ATOMIC.
    for (i, atomic) in [false, true].into_iter().enumerate() {
        let mut sim = sim_pair(LinkConfig::default(), 3 + i as u64);
        let (a, b) = connect_pair(&sim, &PairParams::default());
        let ro =
            b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
                .unwrap();
        let wr = if atomic {
            SendWr::new(
                1,
                WrOpcode::AtomicFetchAndAdd {
                    remote_addr: ro.addr(),
                    rkey: ro.rkey(),
                    add: 1,
                },
                vec![a.mr.sge(0, 8)],
            )
        } else {
            write_wr(1, &a, 10, ro.addr(), ro.rkey())
        };
        a.qp.post_send(&wr).unwrap();
        let w = wait_wcs(&mut sim, &a.cq, 1, 100 * MS);
        assert_eq!(w[0].status, WcStatus::RemAccessErr, "atomic={atomic}");
        // SAFETY: the only WR aimed at ro was rejected and has completed; ro has none of its own.
        assert_eq!(unsafe { ro.load_u64(0) }.unwrap(), 0);
    }

    // Misaligned atomic: invalid request.
    let mut sim = sim_pair(LinkConfig::default(), 5);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let wr = SendWr::new(
        1,
        WrOpcode::AtomicCmpAndSwp {
            remote_addr: b.mr.addr() + 4,
            rkey: b.mr.rkey(),
            compare: 0,
            swap: 1,
        },
        vec![a.mr.sge(0, 8)],
    );
    a.qp.post_send(&wr).unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 100 * MS);
    assert_eq!(w[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn local_protection_errors() {
    let mut sim = sim_pair(LinkConfig::default(), 6);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    // A good WRITE first, then a bad lkey: the good one completes, the bad
    // one completes in order with LOC_PROT_ERR.
    a.qp.post_send(&write_wr(1, &a, 100, b.mr.addr(), b.mr.rkey()))
        .unwrap();
    let mut bad = a.mr.sge(0, 10);
    bad.lkey ^= 0x777;
    a.qp.post_send(&SendWr::new(
        2,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![bad],
    ))
    .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 2, 100 * MS);
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::Success));
    assert_eq!((w[1].wr_id, w[1].status), (2, WcStatus::LocProtErr));
    assert_eq!(a.qp.state(), QpState::Err);

    // SGE out of the MR's bounds; READ into an MR without LOCAL_WRITE.
    let mut sim = sim_pair(LinkConfig::default(), 7);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let ro = a.pd.reg_mr(4096, AccessFlags::empty()).unwrap();
    a.qp.post_send(&SendWr::new(
        1,
        WrOpcode::RdmaRead {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![ro.sge(0, 64)],
    ))
    .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 100 * MS);
    assert_eq!(w[0].status, WcStatus::LocProtErr);
    let mut sim = sim_pair(LinkConfig::default(), 8);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let mut oob = a.mr.sge(a.mr.len() - 8, 16);
    oob.length = 16;
    a.qp.post_send(&SendWr::new(1, WrOpcode::Send, vec![oob]))
        .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 100 * MS);
    assert_eq!(w[0].status, WcStatus::LocProtErr);
    let _ = b;
}

#[test]
fn rnr_then_success_once_posted() {
    let mut sim = sim_pair(LinkConfig::default(), 9);
    let p = PairParams {
        rnr_retry: 7,
        min_rnr_timer: 14,
        ..Default::default()
    }; // 1.28 ms
    let (a, b) = connect_pair(&sim, &p);
    // SAFETY: no WR is posted on a.mr yet (the sim engine runs only inside sim.run_until).
    unsafe { a.mr.write(0, b"hello rnr") }.unwrap();
    a.qp.post_send(&SendWr::new(1, WrOpcode::Send, vec![a.mr.sge(0, 9)]))
        .unwrap();
    // Nothing posted: RNR NAKs, no completion for 5 ms.
    let w = wait_wcs(&mut sim, &a.cq, 1, 5 * MS);
    assert!(w.is_empty(), "{w:?}");
    assert!(sim.a.stats().rx_rnr_naks >= 2);
    assert!(sim.b.stats().tx_naks_rnr >= 2);
    b.qp.post_recv(&RecvWr {
        wr_id: 5,
        sg_list: vec![b.mr.sge(0, 64)],
    })
    .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 10 * MS);
    assert_eq!(w[0].status, WcStatus::Success);
    let wb = drain(&b.cq);
    assert_eq!(wb[0].byte_len, 9);
    // SAFETY: receive 5, the only WR on these bytes, has completed.
    assert_eq!(unsafe { b.mr.to_vec(0, 9) }.unwrap(), b"hello rnr");
}

#[test]
fn rnr_retry_exhausted() {
    let mut sim = sim_pair(LinkConfig::default(), 10);
    let p = PairParams {
        rnr_retry: 2,
        min_rnr_timer: 1,
        ..Default::default()
    };
    let (a, _b) = connect_pair(&sim, &p);
    a.qp.post_send(&SendWr::new(1, WrOpcode::Send, vec![a.mr.sge(0, 9)]))
        .unwrap();
    a.qp.post_send(&SendWr::new(2, WrOpcode::Send, vec![a.mr.sge(0, 9)]))
        .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 2, 100 * MS);
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::RnrRetryExcErr));
    assert_eq!((w[1].wr_id, w[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(sim.a.stats().rx_rnr_naks, 3); // first try + 2 retries
}

#[test]
fn peer_gone_retry_exceeded_within_timeout() {
    let mut sim = sim_pair(LinkConfig::default(), 11);
    let p = PairParams {
        timeout: 10,
        retry_cnt: 3,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    sim.link.cut = true;
    let t0 = sim.now;
    a.qp.post_send(&write_wr(1, &a, 5000, b.mr.addr(), b.mr.rkey()))
        .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 1000 * MS);
    assert_eq!(w[0].status, WcStatus::RetryExcErr);
    let rto = timers::ack_timeout_ns(10).unwrap();
    let took = sim.now - t0;
    // First transmission + 3 retries; the timeout doubles with each
    // consecutive expiry (engine_rto.rs): 1 + 2 + 4 + 8 timeouts.
    assert!(
        took >= 15 * rto && took <= 15 * rto + rto / 2,
        "took {took} ns, rto {rto}"
    );
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn qp_to_err_mid_transfer_flushes() {
    let mut sim = sim_pair(
        LinkConfig {
            rate_bps: 10_000_000_000,
            ..Default::default()
        },
        12,
    );
    let (a, b) = connect_pair(&sim, &PairParams::default());
    for i in 0..4 {
        a.qp.post_send(&write_wr(i, &a, 256 * 1024, b.mr.addr(), b.mr.rkey()))
            .unwrap();
    }
    for i in 0..3 {
        b.qp.post_recv(&RecvWr {
            wr_id: 100 + i,
            sg_list: vec![b.mr.sge(0, 64)],
        })
        .unwrap();
    }
    // Let about one message go through.
    let stop = sim.now + 300_000;
    sim.run_until(stop, |s| s.now >= stop);
    let first = drain(&a.cq);
    assert!(first.len() < 4);
    let mut attr = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    a.qp.modify(&attr, QpAttrMask::STATE).unwrap();
    let rest = drain(&a.cq);
    assert_eq!(first.len() + rest.len(), 4);
    assert!(!rest.is_empty());
    assert!(rest.iter().all(|w| w.status == WcStatus::WrFlushErr));
    // Posting in ERR completes immediately with a flush error.
    a.qp.post_send(&write_wr(9, &a, 10, b.mr.addr(), b.mr.rkey()))
        .unwrap();
    assert_eq!(drain(&a.cq)[0].status, WcStatus::WrFlushErr);
    attr.qp_state = QpState::Err;
    b.qp.modify(&attr, QpAttrMask::STATE).unwrap();
    let wb = drain(&b.cq);
    assert_eq!(wb.len(), 3);
    assert!(wb
        .iter()
        .all(|w| w.status == WcStatus::WrFlushErr && w.opcode == WcOpcode::Recv));
    // The engine keeps running without panics.
    sim.run_until(sim.now + 10 * MS, |_| false);
    // ERR -> RESET -> INIT is legal again.
    attr.qp_state = QpState::Reset;
    a.qp.modify(&attr, QpAttrMask::STATE).unwrap();
    attr.qp_state = QpState::Init;
    a.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS)
        .unwrap();
}

#[test]
fn state_machine_rejects_illegal_transitions() {
    let sim = sim_pair(LinkConfig::default(), 13);
    let pd = sim.a.alloc_pd();
    let cq = sim.a.create_cq(16).unwrap();
    let qp = sim.a.create_qp(&pd, &QpInitAttr::rc(&cq)).unwrap();
    let mut attr = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    let e = qp.modify(&attr, QpAttrMask::all()).unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Transport(TransportError::IllegalTransition {
                from: QpState::Reset,
                to: QpState::Rts
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("RESET -> INIT"));
    // Posting before RTS is refused.
    let e = qp
        .post_send(&SendWr::new(1, WrOpcode::Send, vec![]))
        .unwrap_err();
    assert!(matches!(
        e,
        VerbsError::Transport(TransportError::BadQpState(QpState::Reset))
    ));
    attr.qp_state = QpState::Init;
    qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS)
        .unwrap();
    attr.qp_state = QpState::Rtr;
    let e = qp
        .modify(&attr, QpAttrMask::STATE | QpAttrMask::AV)
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Transport(TransportError::MissingAttributes { .. })
        ),
        "{e}"
    );
    assert_eq!(qp.state(), QpState::Init);
    // UD needs a Q_Key to leave RESET.
    let mut init = QpInitAttr::rc(&cq);
    init.qp_type = QpType::Ud;
    let ud = sim.a.create_qp(&pd, &init).unwrap();
    attr.qp_state = QpState::Init;
    let e = ud
        .modify(&attr, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS)
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Transport(TransportError::MissingAttributes {
                missing: "QKEY",
                ..
            })
        ),
        "{e}"
    );
    // A PD of another device is refused.
    let pd_b = sim.b.alloc_pd();
    assert!(sim.a.create_qp(&pd_b, &QpInitAttr::rc(&cq)).is_err());
}

#[test]
fn cq_overflow_is_an_error() {
    let mut sim = sim_pair(LinkConfig::default(), 14);
    let p = PairParams {
        cq_depth: 2,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    for i in 0..5 {
        a.qp.post_send(&write_wr(i, &a, 10, b.mr.addr(), b.mr.rkey()))
            .unwrap();
    }
    sim.run_until(sim.now + 10 * MS, |_| false);
    assert!(a.cq.overflowed());
    let mut buf = [Wc::default(); 8];
    assert_eq!(a.cq.poll(&mut buf).unwrap(), 2);
    assert!(matches!(a.cq.poll(&mut buf), Err(VerbsError::CqOverflow)));
    assert_eq!(a.qp.state(), QpState::Err);
    assert!(sim.a.stats().cq_overflows > 0);
    assert_eq!(
        sim.a.poll_async_event(),
        Some(xroce::engine::AsyncEvent::QpFatal {
            qpn: a.qp.qp_num(),
            cq_overflow: true
        })
    );
}

#[test]
fn cq_wait_with_eventfd() {
    let mut sim = sim_pair(LinkConfig::default(), 15);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    assert!(a.cq.event_fd().is_some());
    assert!(!a.cq.wait(Duration::from_millis(1)).unwrap());
    let cq = a.cq.clone();
    let waiter = std::thread::spawn(move || cq.wait(Duration::from_secs(10)).unwrap());
    a.qp.post_send(&write_wr(1, &a, 10, b.mr.addr(), b.mr.rkey()))
        .unwrap();
    sim.run_until(sim.now + 10 * MS, |s| {
        s.a.stats().tx_data_packets > 0 && !a.cq.is_empty()
    });
    assert!(waiter.join().unwrap());
    assert_eq!(a.cq.poll_one().unwrap().unwrap().status, WcStatus::Success);
}

#[test]
fn dereg_while_in_flight_is_safe() {
    let mut sim = sim_pair(
        LinkConfig {
            rate_bps: 1_000_000_000,
            ..Default::default()
        },
        16,
    );
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let target = b.pd.reg_mr(1 << 20, PairParams::default().access).unwrap();
    let (addr, rkey) = (target.addr(), target.rkey());
    a.qp.post_send(&write_wr(1, &a, 1 << 20, addr, rkey))
        .unwrap();
    // Local side: deregister the source MR while the WRITE is in flight too.
    let stop = sim.now + 200_000;
    sim.run_until(stop, |s| s.now >= stop);
    target.dereg();
    let w = wait_wcs(&mut sim, &a.cq, 1, 100 * MS);
    assert_eq!(w[0].status, WcStatus::RemAccessErr);
}

#[test]
fn srq_feeds_two_qps_and_fences_order_reads() {
    let mut sim = sim_pair(LinkConfig::lossy(0.02), 17);
    let p = PairParams {
        max_rd_atomic: 1,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    // SRQ on B for a second QP pair.
    let srq = b.pd.create_srq(16, 4);
    let cq_b = sim.b.create_cq(64).unwrap();
    let mut init = QpInitAttr::rc(&cq_b);
    init.srq = Some(srq.clone());
    let qp_b2 = sim.b.create_qp(&b.pd, &init).unwrap();
    assert!(qp_b2
        .post_recv(&RecvWr {
            wr_id: 1,
            sg_list: vec![]
        })
        .is_err());
    let cq_a2 = sim.a.create_cq(64).unwrap();
    let qp_a2 = sim.a.create_qp(&a.pd, &QpInitAttr::rc(&cq_a2)).unwrap();
    let (ca, cb) = sim_configs();
    let local = QpAttr {
        qp_access_flags: p.access,
        path_mtu: Mtu::Mtu1024,
        timeout: 8,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        ..Default::default()
    };
    let av = |c: &xroce::engine::EngineConfig| AddressVector {
        dest_mac: c.mac,
        dest_ip: c.ip.into(),
        ..Default::default()
    };
    qp_a2
        .connect(
            &local,
            &RemoteQp {
                qpn: qp_b2.qp_num(),
                psn: 0,
                av: av(&cb),
            },
        )
        .unwrap();
    qp_b2
        .connect(
            &local,
            &RemoteQp {
                qpn: qp_a2.qp_num(),
                psn: 0,
                av: av(&ca),
            },
        )
        .unwrap();
    for i in 0..4 {
        srq.post_recv(&RecvWr {
            wr_id: 50 + i,
            sg_list: vec![b.mr.sge(i as usize * 2048, 2048)],
        })
        .unwrap();
    }
    // Armed at 3: the second receive leaves 2 posted and fires it, once.
    assert!(
        srq.set_limit(17).is_err(),
        "a limit above max_wr is refused"
    );
    srq.set_limit(3).unwrap();
    // SAFETY: no WR is posted on a.mr yet (the sim engine runs only inside sim.run_until).
    unsafe { a.mr.write(0, &[7u8; 2000]) }.unwrap();
    for i in 0..4u64 {
        qp_a2
            .post_send(&SendWr::new(i, WrOpcode::Send, vec![a.mr.sge(0, 1500)]))
            .unwrap();
    }
    let w = wait_wcs(&mut sim, &cq_b, 4, 500 * MS);
    assert_eq!(
        w.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![50, 51, 52, 53]
    );
    assert!(w
        .iter()
        .all(|w| w.qp_num == qp_b2.qp_num() && w.byte_len == 1500));
    assert!(srq.is_empty());
    let limit_events: Vec<_> = std::iter::from_fn(|| sim.b.poll_async_event())
        .filter(|e| matches!(e, xroce::engine::AsyncEvent::SrqLimitReached { .. }))
        .collect();
    assert_eq!(
        limit_events,
        vec![xroce::engine::AsyncEvent::SrqLimitReached { srq: srq.id() }]
    );
    assert_eq!(srq.limit(), 0, "the event disarms the limit");

    // READs limited to one outstanding, then a fenced WRITE of what was read.
    // SAFETY: the SRQ receives (0..8192) have all completed; no WR targets these bytes yet.
    unsafe { b.mr.write(100_000, &[9u8; 5000]) }.unwrap();
    for i in 0..3u64 {
        a.qp.post_send(&SendWr::new(
            i,
            WrOpcode::RdmaRead {
                remote_addr: b.mr.addr() + 100_000,
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(10_000 + i as usize * 5000, 5000)],
        ))
        .unwrap();
    }
    a.qp.post_send(
        &SendWr::new(
            3,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr() + 200_000,
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(10_000, 15_000)],
        )
        .flags(SendFlags::SIGNALED | SendFlags::FENCE),
    )
    .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 4, 500 * MS);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    // SAFETY: WRITE 3, the only WR into these bytes, has completed.
    assert_eq!(
        unsafe { b.mr.to_vec(200_000, 15_000) }.unwrap(),
        vec![9u8; 15_000]
    );
}

/// A fixed-rate controller that counts CNPs.
struct FixedRate {
    rate: u64,
    cnps: Arc<AtomicU64>,
    acks: Arc<AtomicU64>,
}

impl CongestionControl for FixedRate {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn on_send(&mut self, _now_ns: u64, _bytes: usize) {}
    fn on_ack(&mut self, _now_ns: u64, _acked_bytes: usize, rtt_ns: Option<u64>) {
        if rtt_ns.is_some() {
            self.acks.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn on_cnp(&mut self, _now_ns: u64) {
        self.cnps.fetch_add(1, Ordering::Relaxed);
    }
    fn on_timer(&mut self, _now_ns: u64) {}
    fn next_timer_ns(&self) -> Option<u64> {
        None
    }
    fn rate_bps(&self) -> u64 {
        self.rate
    }
}

#[test]
fn pacing_follows_cc_rate_and_ce_marks_produce_rate_limited_cnps() {
    let cnps = Arc::new(AtomicU64::new(0));
    let acks = Arc::new(AtomicU64::new(0));
    let (mut ca, cb) = sim_configs();
    let (c2, a2) = (cnps.clone(), acks.clone());
    ca.cc = Some(Arc::new(move || {
        Box::new(FixedRate {
            rate: 2_000_000_000,
            cnps: c2.clone(),
            acks: a2.clone(),
        }) as Box<dyn CongestionControl>
    }));
    ca.pacing_burst_bytes = 8192;
    let link = LinkConfig {
        ce_mark: 0.5,
        ..Default::default()
    };
    let mut sim = Sim::new(Device::new(ca), Device::new(cb), SimLink::new(link, 18));
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let len = 4 << 20;
    let big =
        a.pd.reg_mr(len, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    let t0 = sim.now;
    a.qp.post_send(&SendWr::new(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![big.sge(0, 1 << 20)],
    ))
    .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 1000 * MS);
    assert_eq!(w[0].status, WcStatus::Success);
    let secs = (sim.now - t0) as f64 / 1e9;
    let gbps = (1u64 << 20) as f64 * 8.0 / secs / 1e9;
    // Paced at 2 Gb/s of frame bytes: goodput a little below.
    assert!(gbps > 1.7 && gbps < 2.1, "goodput {gbps} Gb/s");
    let sb = sim.b.stats();
    assert!(sb.rx_ce_marked > 100);
    // At most one CNP per 50 us per QP.
    let max_cnps = (sim.now - t0) / 50_000 + 1;
    assert!(
        sb.tx_cnps > 0 && sb.tx_cnps <= max_cnps,
        "{} CNPs, max {max_cnps}",
        sb.tx_cnps
    );
    assert_eq!(cnps.load(Ordering::Relaxed), sim.a.stats().rx_cnps);
    assert!(cnps.load(Ordering::Relaxed) > 0);
    assert!(acks.load(Ordering::Relaxed) > 0);
    let (qa, qb) = (a.qp.stats().unwrap(), b.qp.stats().unwrap());
    assert_eq!(qa.cnps_received, cnps.load(Ordering::Relaxed));
    assert_eq!(qb.cnps_sent, sb.tx_cnps);
    assert!(qb.ce_marked_received > 100 && qa.tx_packets >= 1024 && qa.tx_bytes > 1 << 20);
    assert_eq!(a.qp.rate_bps(), Some(2_000_000_000));

    // READ responses leave A paced by A's controller too.
    let t1 = sim.now;
    b.qp.post_send(&SendWr::new(
        2,
        WrOpcode::RdmaRead {
            remote_addr: big.addr(),
            rkey: big.rkey(),
        },
        vec![b.mr.sge(0, 1 << 20)],
    ))
    .unwrap();
    let w = wait_wcs(&mut sim, &b.cq, 1, 1000 * MS);
    assert_eq!(w[0].status, WcStatus::Success);
    let gbps = (1u64 << 20) as f64 * 8.0 / ((sim.now - t1) as f64 / 1e9) / 1e9;
    assert!(gbps > 1.7 && gbps < 2.1, "READ goodput {gbps} Gb/s");
}

#[test]
fn sqd_holds_new_work_until_rts() {
    let mut sim = sim_pair(LinkConfig::default(), 19);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let mut attr = QpAttr {
        qp_state: QpState::Sqd,
        ..Default::default()
    };
    a.qp.modify(&attr, QpAttrMask::STATE).unwrap();
    assert_eq!(
        sim.a.poll_async_event(),
        Some(xroce::engine::AsyncEvent::SqDrained { qpn: a.qp.qp_num() })
    );
    a.qp.post_send(&write_wr(1, &a, 100, b.mr.addr(), b.mr.rkey()))
        .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 5 * MS);
    assert!(w.is_empty());
    assert_eq!(sim.a.stats().tx_data_packets, 0);
    attr.qp_state = QpState::Rts;
    a.qp.modify(&attr, QpAttrMask::STATE).unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 5 * MS);
    assert_eq!(w[0].status, WcStatus::Success);
}

#[test]
fn receive_buffer_too_small() {
    let mut sim = sim_pair(LinkConfig::default(), 20);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    b.qp.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: vec![b.mr.sge(0, 1000)],
    })
    .unwrap();
    a.qp.post_send(&SendWr::new(1, WrOpcode::Send, vec![a.mr.sge(0, 3000)]))
        .unwrap();
    let w = wait_wcs(&mut sim, &a.cq, 1, 100 * MS);
    assert_eq!(w[0].status, WcStatus::RemInvReqErr);
    let wb = drain(&b.cq);
    assert_eq!((wb[0].wr_id, wb[0].status), (7, WcStatus::LocLenErr));
}

#[test]
fn bidirectional_traffic_under_loss() {
    // Both QPs are requester and responder at once: WRITEs and READs in
    // both directions with 5 % loss, duplication and reordering.
    let mut sim = sim_pair(LinkConfig::lossy(0.05), 21);
    let p = PairParams {
        psn_a: 0xff_ff00,
        psn_b: 0xff_fff0,
        timeout: 6,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    let pa: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let pb: Vec<u8> = (0..200_000u32).map(|i| (i * 13 + 5) as u8).collect();
    // SAFETY: no WR is posted on a.mr yet (the sim engine runs only inside sim.run_until).
    unsafe { a.mr.write(0, &pa) }.unwrap();
    // SAFETY: no WR is posted on b.mr yet.
    unsafe { b.mr.write(0, &pb) }.unwrap();
    for (x, y) in [(&a, &b), (&b, &a)] {
        x.qp.post_send(&SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: y.mr.addr() + 300_000,
                rkey: y.mr.rkey(),
            },
            vec![x.mr.sge(0, 200_000)],
        ))
        .unwrap();
        x.qp.post_send(&SendWr::new(
            2,
            WrOpcode::RdmaRead {
                remote_addr: y.mr.addr(),
                rkey: y.mr.rkey(),
            },
            vec![x.mr.sge(600_000, 200_000)],
        ))
        .unwrap();
    }
    let mut wa = Vec::new();
    let mut wb = Vec::new();
    let deadline = sim.now + 10_000 * MS;
    assert!(sim.run_until(deadline, |_| {
        wa.extend(drain(&a.cq));
        wb.extend(drain(&b.cq));
        wa.len() == 2 && wb.len() == 2
    }));
    for w in wa.iter().chain(&wb) {
        assert_eq!(w.status, WcStatus::Success);
    }
    // SAFETY: A's WRITE into these bytes has completed.
    assert_eq!(unsafe { b.mr.to_vec(300_000, 200_000) }.unwrap(), pa);
    // SAFETY: B's WRITE into these bytes has completed.
    assert_eq!(unsafe { a.mr.to_vec(300_000, 200_000) }.unwrap(), pb);
    // SAFETY: A's READ into these bytes has completed.
    assert_eq!(unsafe { a.mr.to_vec(600_000, 200_000) }.unwrap(), pb);
    // SAFETY: B's READ into these bytes has completed.
    assert_eq!(unsafe { b.mr.to_vec(600_000, 200_000) }.unwrap(), pa);
}

#[test]
fn sixteen_qps_share_a_device_under_loss() {
    let mut sim = sim_pair(LinkConfig::lossy(0.02), 22);
    let p = PairParams {
        mr_len: 256 * 1024,
        timeout: 6,
        ..Default::default()
    };
    let pairs: Vec<(Endpoint, Endpoint)> = (0..16).map(|_| connect_pair(&sim, &p)).collect();
    for (i, (a, b)) in pairs.iter().enumerate() {
        let data: Vec<u8> = (0..100_000u32)
            .map(|k| (k as usize * 31 + i) as u8)
            .collect();
        // SAFETY: no WR is posted on this pair's MRs yet (the sim engine is idle here).
        unsafe { a.mr.write(0, &data) }.unwrap();
        b.qp.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: vec![b.mr.sge(0, 100_000)],
        })
        .unwrap();
        a.qp.post_send(&SendWr::new(
            i as u64,
            WrOpcode::Send,
            vec![a.mr.sge(0, 100_000)],
        ))
        .unwrap();
        a.qp.post_send(&SendWr::new(
            100 + i as u64,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr() + 120_000,
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(0, 100_000)],
        ))
        .unwrap();
    }
    let deadline = sim.now + 10_000 * MS;
    let mut done = [0usize; 16];
    let mut recvd = [false; 16];
    assert!(sim.run_until(deadline, |_| {
        for (i, (a, b)) in pairs.iter().enumerate() {
            for w in drain(&a.cq) {
                assert_eq!(w.status, WcStatus::Success);
                assert_eq!(w.qp_num, a.qp.qp_num());
                done[i] += 1;
            }
            for w in drain(&b.cq) {
                assert_eq!(
                    (w.status, w.wr_id, w.byte_len),
                    (WcStatus::Success, i as u64, 100_000)
                );
                recvd[i] = true;
            }
        }
        done.iter().all(|&d| d == 2) && recvd.iter().all(|&r| r)
    }));
    for (i, (_, b)) in pairs.iter().enumerate() {
        let data: Vec<u8> = (0..100_000u32)
            .map(|k| (k as usize * 31 + i) as u8)
            .collect();
        // SAFETY: the receive into these bytes has completed (recvd[i]).
        assert_eq!(unsafe { b.mr.to_vec(0, 100_000) }.unwrap(), data);
        // SAFETY: the WRITE into these bytes has completed (done[i] == 2).
        assert_eq!(unsafe { b.mr.to_vec(120_000, 100_000) }.unwrap(), data);
    }
}

fn ud_qp(dev: &Device, pd: &ProtectionDomain, cq: &CompletionQueue, qkey: u32) -> QueuePair {
    let mut init = QpInitAttr::rc(cq);
    init.qp_type = QpType::Ud;
    let qp = dev.create_qp(pd, &init).unwrap();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qkey,
        ..Default::default()
    };
    qp.modify(
        &a,
        QpAttrMask::STATE | QpAttrMask::QKEY | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT,
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    qp.modify(&a, QpAttrMask::STATE).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = 0x123;
    qp.modify(&a, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
    qp
}

#[test]
fn ud_datagrams_to_two_qps_with_qkey_check() {
    let mut sim = sim_pair(LinkConfig::default(), 23);
    let (ca, cb) = sim_configs();
    let (pd_a, pd_b) = (sim.a.alloc_pd(), sim.b.alloc_pd());
    let (cq_a, cq_b) = (sim.a.create_cq(64).unwrap(), sim.b.create_cq(64).unwrap());
    let qa = ud_qp(&sim.a, &pd_a, &cq_a, 0x1111);
    let qb1 = ud_qp(&sim.b, &pd_b, &cq_b, 0x2222);
    let qb2 = ud_qp(&sim.b, &pd_b, &cq_b, 0x3333);
    let src = pd_a
        .reg_mr_with(&[0xabu8; 1024], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let rx = pd_b.reg_mr(8 * 2048, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..4u64 {
        let q = if i < 2 { &qb1 } else { &qb2 };
        q.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![rx.sge(i as usize * 2048, 2048)],
        })
        .unwrap();
    }
    let av = AddressVector {
        dest_mac: cb.mac,
        dest_ip: cb.ip.into(),
        ..Default::default()
    };
    let to = |q: &QueuePair, qkey| UdAddress {
        av,
        remote_qpn: q.qp_num(),
        remote_qkey: qkey,
    };
    // Larger than the path MTU: refused at post time.
    let big = SendWr::new(9, WrOpcode::Send, vec![src.sge(0, 1024), src.sge(0, 1024)])
        .ud(to(&qb1, 0x2222));
    assert!(qa.post_send(&big).is_err());
    // Without a destination: refused.
    assert!(qa
        .post_send(&SendWr::new(9, WrOpcode::Send, vec![]))
        .is_err());
    qa.post_send(
        &SendWr::new(1, WrOpcode::SendWithImm { imm: 7 }, vec![src.sge(0, 100)])
            .ud(to(&qb1, 0x2222)),
    )
    .unwrap();
    qa.post_send(&SendWr::new(2, WrOpcode::Send, vec![src.sge(0, 1000)]).ud(to(&qb2, 0x3333)))
        .unwrap();
    // Wrong Q_Key: sent, completes locally, silently dropped by the receiver.
    qa.post_send(&SendWr::new(3, WrOpcode::Send, vec![src.sge(0, 10)]).ud(to(&qb2, 0x9999)))
        .unwrap();
    qa.post_send(&SendWr::new(4, WrOpcode::Send, vec![src.sge(0, 0)]).ud(to(&qb1, 0x2222)))
        .unwrap();
    let wa = wait_wcs(&mut sim, &cq_a, 4, 10 * MS);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    let mut wb = wait_wcs(&mut sim, &cq_b, 3, 10 * MS);
    wb.sort_by_key(|w| w.wr_id);
    assert_eq!(wb.len(), 3, "{wb:?}");
    assert_eq!(
        (wb[0].wr_id, wb[0].qp_num, wb[0].byte_len, wb[0].imm_data),
        (0, qb1.qp_num(), 140, 7)
    );
    assert!(wb[0].flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    assert_eq!(wb[0].src_qp, qa.qp_num());
    assert_eq!((wb[1].wr_id, wb[1].byte_len), (1, 40));
    assert_eq!(
        (wb[2].wr_id, wb[2].qp_num, wb[2].byte_len),
        (2, qb2.qp_num(), 1040)
    );
    // SAFETY: receive 0 (0..2048) has completed; 3, still posted, uses 6144..8192.
    assert_eq!(unsafe { rx.to_vec(40, 100) }.unwrap(), vec![0xab; 100]);
    // SAFETY: receive 2 (4096..6144) has completed.
    assert_eq!(
        unsafe { rx.to_vec(2 * 2048 + 40, 1000) }.unwrap(),
        vec![0xab; 1000]
    );
    // GRH: IPv4 header of the datagram in bytes 20..40.
    // SAFETY: receive 0 (0..2048) has completed.
    let grh = unsafe { rx.to_vec(0, 40) }.unwrap();
    assert_eq!(grh[20], 0x45);
    assert_eq!(&grh[32..36], &ca.ip.octets());
    assert_eq!(sim.b.stats().rx_dropped_other, 1);
}

#[test]
fn sim_link_records_a_pcap_the_codec_reads_back() {
    let path = std::env::temp_dir().join(format!("xroce-sim-{}.pcap", std::process::id()));
    let mut sim = sim_pair(LinkConfig::default(), 24);
    xroce::capture::record_sim_link(&mut sim.link, &path).unwrap();
    let (a, b) = connect_pair(&sim, &PairParams::default());
    a.qp.post_send(&write_wr(1, &a, 5000, b.mr.addr(), b.mr.rkey()))
        .unwrap();
    assert_eq!(
        wait_wcs(&mut sim, &a.cq, 1, 10 * MS)[0].status,
        WcStatus::Success
    );
    drop(sim); // flush
    let d = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let cap = xroce::capture::Capture::parse(&d).unwrap();
    assert!(cap.nanosecond());
    assert_eq!(cap.link_type(), Some(xroce::capture::LINKTYPE_ETHERNET));
    let mut last = std::time::Duration::ZERO;
    let mut n = 0;
    for p in cap {
        let p = p.unwrap();
        xroce_wire::parse_frame_checked(&p.data).expect("valid RoCEv2 frame");
        assert!(!p.is_truncated() && p.timestamp >= last);
        last = p.timestamp;
        n += 1;
    }
    assert!(last > std::time::Duration::ZERO, "simulated timestamps");
    assert_eq!(n, 5 + 1); // 5 WRITE packets + 1 ACK
}

#[test]
fn foreign_source_and_pkey_are_dropped() {
    use xroce_wire::{emit_frame, BthRepr, FrameRepr, Gid, Opcode, TransportRepr};
    let sim = sim_pair(LinkConfig::default(), 25);
    let p = PairParams {
        psn_a: 77,
        ..Default::default()
    };
    let (_a, b) = connect_pair(&sim, &p);
    b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![b.mr.sge(0, 64)],
    })
    .unwrap();
    let (ca, cb) = sim_configs();
    let mut bth = BthRepr::new(Opcode::RC_SEND_ONLY, b.qp.qp_num(), 77);
    bth.ack_req = true;
    let frame_from = |src: Gid, pkey: u16| {
        let mut t = TransportRepr::new(bth);
        t.bth.pkey = pkey;
        FrameRepr::new(ca.mac, cb.mac, src, Gid::from(cb.ip), 0xc000, t)
    };
    let good = frame_from(Gid::from(ca.ip), 0xffff);
    let mut buf = vec![0u8; 256];
    for bad in [
        frame_from(Gid::from_ipv4([10, 0, 0, 9]), 0xffff),
        frame_from(Gid::from(ca.ip), 0x1234),
    ] {
        let n = emit_frame(&bad, b"spoof", &mut buf).unwrap();
        sim.b.handle_frame(&buf[..n], sim.now);
    }
    assert_eq!(sim.b.stats().rx_bad_header, 2);
    assert!(b.cq.is_empty());
    let n = emit_frame(&good, b"hello", &mut buf).unwrap();
    sim.b.handle_frame(&buf[..n], sim.now);
    let wc = b.cq.poll_one().unwrap().unwrap();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 5));
}
