//! The engine's ready list and timer heap (engine/schedule.rs): only QPs
//! with an event or a due timer are visited, so these check the wake-ups a
//! scan of every QP used to hide.

use std::sync::{Arc, Mutex};

use xroce_transport::engine::completion::{Completion, WcStatus};
use xroce_transport::engine::memory::MrTable;
use xroce_transport::engine::qp_attr::{Mtu, QpCap, QpType};
use xroce_transport::engine::sim::{
    connect_engines, sim_configs, EngineEndpoint, LinkConfig, PairParams, Sim, SimLink,
};
use xroce_transport::engine::work::{SendWr, WrOpcode};
use xroce_transport::engine::{Engine, EngineConfig, QpCreate, SrMode, QPN_BASE};

fn sim_with(f: impl Fn(&mut EngineConfig)) -> Sim<Mutex<Engine>> {
    let (mut ca, mut cb) = sim_configs();
    f(&mut ca);
    f(&mut cb);
    let engine = |cfg| Mutex::new(Engine::new(cfg, Arc::new(MrTable::default())));
    Sim::new(
        engine(ca),
        engine(cb),
        SimLink::new(LinkConfig::default(), 7),
    )
}

fn write(id: u64, from: &EngineEndpoint, to: &EngineEndpoint, len: usize) -> SendWr {
    SendWr::new(
        id,
        WrOpcode::RdmaWrite {
            remote_addr: to.mr.addr(),
            rkey: to.mr.rkey(),
        },
        vec![from.mr.sge(0, len)],
    )
}

fn fill(ep: &EngineEndpoint, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..ep.mr.len())
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    // SAFETY: no WR is outstanding on this MR yet.
    unsafe { ep.mr.write(0, &data).unwrap() };
    data
}

fn contents(ep: &EngineEndpoint) -> Vec<u8> {
    let mut v = vec![0; ep.mr.len()];
    // SAFETY: every WR writing it has completed.
    unsafe { ep.mr.read(0, &mut v).unwrap() };
    v
}

fn completions(e: &Mutex<Engine>) -> Vec<Completion> {
    let mut v = Vec::new();
    e.lock().unwrap().take_completions(&mut v);
    v
}

/// A QP held by its pacer becomes sendable only because time passes: the
/// pacer's time is a timer, and the data moves at the paced rate.
#[test]
fn paced_qp_sends_when_its_pacer_opens() {
    const RATE: u64 = 1_000_000_000; // 1 Gb/s
    let mut sim = sim_with(|c| {
        c.line_rate_bps = RATE;
        c.pacing_burst_bytes = 2048;
    });
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        mr_len: 64 * 1024,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    let data = fill(&a, 1);
    sim.a
        .lock()
        .unwrap()
        .post_send(a.qpn, &write(1, &a, &b, 64 * 1024))
        .unwrap();
    let t0 = sim.now;
    let mut wcs = Vec::new();
    let done = sim.run_until(t0 + 1_000_000_000, |s| {
        wcs.extend(completions(&s.a));
        !wcs.is_empty()
    });
    assert!(done, "the paced WRITE never completed");
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].wc.status, WcStatus::Success);
    assert_eq!(contents(&b), data);
    // 64 KiB at 1 Gb/s is ~524 us: it waited for the pacer, not less.
    let took = sim.now - t0;
    assert!(took >= 450_000, "took {took} ns: not paced");
    assert!(took < 5_000_000, "took {took} ns: a pacer wake-up was late");
}

/// Without the timers run, `poll_transmit` at a later time still sends what
/// the pacer lets out by then (as the full scan did).
#[test]
fn pacer_opening_is_seen_by_poll_transmit_alone() {
    let sim = sim_with(|c| {
        c.line_rate_bps = 1_000_000_000;
        c.pacing_burst_bytes = 1;
    });
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        mr_len: 4096,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    let mut ga = sim.a.lock().unwrap();
    ga.post_send(a.qpn, &write(1, &a, &b, 4096)).unwrap();
    let mut buf = vec![0u8; 9000];
    let mut now = 2_000_000;
    assert!(ga.poll_transmit_frame(now, &mut buf).is_some());
    assert!(
        ga.poll_transmit_frame(now, &mut buf).is_none(),
        "pacer held nothing"
    );
    let open = ga.poll_timeout().expect("the pacer's time is a timer");
    assert!(open > now && open < now + 100_000, "pacer timer at {open}");
    now = open;
    assert!(ga.poll_transmit_frame(now, &mut buf).is_some());
}

/// A timer moved earlier fires at its new time; the old, later entry
/// neither fires again nor hides the new one. Here: an RTO armed by a
/// lost request, cancelled by its ACK, re-armed by the next request.
#[test]
fn rearmed_timer_fires_at_its_new_time() {
    // Go-back-N: selective repeat's tail-loss probe (from 500 us on)
    // would come before the timeout.
    let sim = sim_with(|c| c.selective_repeat = SrMode::Off);
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        mr_len: 1024,
        // ~4.2 ms: short enough that no tail-loss probe comes before it.
        timeout: 10,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    let (mut ga, mut gb) = (sim.a.lock().unwrap(), sim.b.lock().unwrap());
    let mut buf = vec![0u8; 9000];
    let rto = 4096u64 << 10;
    // First request at t1, ACKed: its RTO (t1 + rto) is cancelled.
    let t1 = 10_000_000;
    ga.post_send(a.qpn, &write(1, &a, &b, 1024)).unwrap();
    let n = ga.poll_transmit_frame(t1, &mut buf).unwrap();
    gb.handle_frame(&buf[..n], t1);
    assert_eq!(ga.poll_timeout(), Some(t1 + rto));
    let n = gb.poll_transmit_frame(t1, &mut buf).unwrap();
    ga.handle_frame(&buf[..n], t1);
    assert_eq!(ga.poll_timeout(), None, "the ACK cancels the RTO");
    // Second request at t2, lost: RTO at t2 + rto.
    let t2 = t1 + 1_000;
    ga.post_send(a.qpn, &write(2, &a, &b, 1024)).unwrap();
    ga.poll_transmit_frame(t2, &mut buf).unwrap();
    assert_eq!(ga.poll_timeout(), Some(t2 + rto));
    // At the first RTO's time nothing is due (its entry is stale).
    ga.handle_timeout(t1 + rto);
    assert!(ga.poll_transmit_frame(t1 + rto, &mut buf).is_none());
    assert_eq!(ga.poll_timeout(), Some(t2 + rto));
    // At the second, the request is sent again.
    ga.handle_timeout(t2 + rto);
    let n = ga
        .poll_transmit_frame(t2 + rto, &mut buf)
        .expect("retransmission");
    assert_eq!(ga.stats().retry_timeouts, 1);
    gb.handle_frame(&buf[..n], t2 + rto);
    let n = gb.poll_transmit_frame(t2 + rto, &mut buf).unwrap();
    ga.handle_frame(&buf[..n], t2 + rto);
    let mut wcs = Vec::new();
    ga.take_completions(&mut wcs);
    assert_eq!(wcs.iter().map(|c| c.wc.wr_id).collect::<Vec<_>>(), [1, 2]);
    assert!(wcs.iter().all(|c| c.wc.status == WcStatus::Success));
}

/// A destroyed QP's heap and ready entries never touch the QP that reuses
/// its slot (the same QPN here: a slot's QPN is fixed).
#[test]
fn destroyed_qp_entries_never_touch_a_reused_slot() {
    let sim = sim_with(|_| {});
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        mr_len: 4096,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    let mut buf = vec![0u8; 9000];
    {
        let mut ga = sim.a.lock().unwrap();
        ga.post_send(a.qpn, &write(1, &a, &b, 4096)).unwrap();
        ga.poll_transmit_frame(2_000_000, &mut buf).unwrap(); // RTO armed
        ga.post_send(a.qpn, &write(2, &a, &b, 4096)).unwrap(); // queued
        assert!(ga.poll_timeout().is_some());
        ga.destroy_qp(a.qpn).unwrap();
        assert_eq!(ga.poll_timeout(), None, "a destroyed QP's timer");
        assert!(ga.poll_transmit_frame(2_000_000, &mut buf).is_none());
    }
    // QPNs go round the block: create and destroy QPs on A up to the
    // block's last QPN; the next QP takes the freed first slot again, with
    // its old number.
    assert_eq!(a.qpn & 0xffff, QPN_BASE, "A's QP had the block's first QPN");
    let last_qpn = a.qpn | 0xffff;
    {
        let mut ga = sim.a.lock().unwrap();
        let mut n = 0;
        loop {
            let q = ga
                .create_qp(QpCreate {
                    qp_type: QpType::Rc,
                    pd: 1,
                    send_cq: a.cq,
                    recv_cq: a.cq,
                    srq: None,
                    cap: QpCap::default(),
                    sq_sig_all: false,
                })
                .unwrap();
            ga.destroy_qp(q).unwrap();
            n += 1;
            if q == last_qpn {
                break;
            }
        }
        assert_eq!(n, 0xffff - QPN_BASE, "every other QPN of the block, once");
    }
    let (a2, b2) = connect_engines(&sim, &p);
    assert_eq!(a2.qpn, a.qpn);
    let mut ga = sim.a.lock().unwrap();
    let mut gb = sim.b.lock().unwrap();
    // Nothing of the old QP's: no frame, no timer, and the old RTO's time
    // does nothing.
    assert!(ga.poll_transmit_frame(3_000_000, &mut buf).is_none());
    assert_eq!(ga.poll_timeout(), None);
    ga.handle_timeout(1 << 40);
    assert_eq!(ga.stats().tx_retransmitted, 0);
    assert!(ga.poll_transmit_frame(1 << 40, &mut buf).is_none());
    // The new QP works, once and only once per packet.
    let data = fill(&a2, 9);
    ga.post_send(a2.qpn, &write(7, &a2, &b2, 4096)).unwrap();
    let now = (1 << 40) + 1;
    let mut sent = 0;
    while let Some(n) = ga.poll_transmit_frame(now, &mut buf) {
        gb.handle_frame(&buf[..n], now);
        sent += 1;
    }
    assert_eq!(sent, 4);
    while let Some(n) = gb.poll_transmit_frame(now, &mut buf) {
        ga.handle_frame(&buf[..n], now);
    }
    let mut wcs = Vec::new();
    ga.take_completions(&mut wcs);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wc.wr_id, wcs[0].wc.status), (7, WcStatus::Success));
    drop((ga, gb));
    assert_eq!(contents(&b2), data);
}

/// Two busy QPs take turns message by message, up to a quantum of 16
/// packets (a message's last packet, which asks for the ACK, follows its
/// first at once rather than a whole round of other QPs later).
#[test]
fn two_busy_qps_alternate() {
    // The whole device budget from the start (no window growing from 16
    // packets), so both QPs have room and only the turn order shows.
    let sim = sim_with(|c| {
        c.line_rate_bps = 1 << 50;
        c.device_target_rtt_ns = 0;
    });
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        mr_len: 16 * 1024,
        ..Default::default()
    };
    let (a1, b1) = connect_engines(&sim, &p);
    let (a2, b2) = connect_engines(&sim, &p);
    let mut ga = sim.a.lock().unwrap();
    ga.post_send(a1.qpn, &write(1, &a1, &b1, 16 * 1024))
        .unwrap();
    ga.post_send(a2.qpn, &write(2, &a2, &b2, 16 * 1024))
        .unwrap();
    let mut buf = vec![0u8; 9000];
    let mut order = Vec::new();
    while let Some(n) = ga.poll_transmit_frame(2_000_000, &mut buf) {
        let (f, _) = xroce_wire::parse_frame_checked(&buf[..n]).unwrap();
        order.push(f.transport.bth.dest_qp);
    }
    assert_eq!(order.len(), 32, "16 packets each");
    for (i, q) in order.iter().enumerate() {
        let want = if (i / 16) % 2 == 0 { b1.qpn } else { b2.qpn };
        assert_eq!(*q, want, "frame {i} of {order:x?}");
    }
}

/// 10,000 idle QPs beside a busy one: the busy one's data moves, and the
/// idle ones have no timers.
#[test]
fn busy_qp_among_ten_thousand_idle_ones() {
    let mut sim = sim_with(|_| {});
    let p = PairParams {
        mtu: Mtu::Mtu4096,
        mr_len: 4096,
        ..Default::default()
    };
    let pairs: Vec<_> = (0..10_000).map(|_| connect_engines(&sim, &p)).collect();
    assert_eq!(sim.a.lock().unwrap().poll_timeout(), None);
    let p = PairParams {
        mr_len: 256 * 1024,
        ..p
    };
    let (a, b) = connect_engines(&sim, &p);
    let data = fill(&a, 3);
    for i in 0..4u64 {
        let off = i as usize * 64 * 1024;
        let wr = SendWr::new(
            i,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr() + off as u64,
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(off, 64 * 1024)],
        );
        sim.a.lock().unwrap().post_send(a.qpn, &wr).unwrap();
    }
    let mut wcs = Vec::new();
    let t0 = sim.now;
    let done = sim.run_until(t0 + 1_000_000_000, |s| {
        wcs.extend(completions(&s.a));
        wcs.len() == 4
    });
    assert!(done, "{} of 4 WRITEs completed", wcs.len());
    assert!(wcs.iter().all(|c| c.wc.status == WcStatus::Success));
    assert_eq!(contents(&b), data);
    assert_eq!(sim.a.lock().unwrap().stats().tx_retransmitted, 0);
    assert_eq!(sim.a.lock().unwrap().qp_count(), 10_001);
    drop(pairs);
}

/// Small messages: a QP keeps its turn across message boundaries for up
/// to a quantum of 16 packets, so what it has queued reaches the
/// responder together (one ACK for several messages) instead of one
/// message per turn with every other QP's in between.
#[test]
fn busy_qps_take_turns_by_quantum_across_small_messages() {
    let sim = sim_with(|c| {
        c.line_rate_bps = 1 << 50;
        c.device_target_rtt_ns = 0;
    });
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        mr_len: 2048,
        ..Default::default()
    };
    let pairs: Vec<_> = (0..3).map(|_| connect_engines(&sim, &p)).collect();
    let mut ga = sim.a.lock().unwrap();
    // 12 WRITEs of 2 packets each per QP.
    for (a, b) in &pairs {
        for i in 0..12 {
            ga.post_send(a.qpn, &write(i, a, b, 2048)).unwrap();
        }
    }
    let mut buf = vec![0u8; 9000];
    let mut order = Vec::new();
    while let Some(n) = ga.poll_transmit_frame(2_000_000, &mut buf) {
        let (f, _) = xroce_wire::parse_frame_checked(&buf[..n]).unwrap();
        order.push(f.transport.bth.dest_qp);
    }
    assert_eq!(order.len(), 3 * 24);
    // Runs: 16 packets of each QP in turn, then the remaining 8 of each.
    let mut want = Vec::new();
    for run in [16, 8] {
        for (_, b) in &pairs {
            want.extend(std::iter::repeat_n(b.qpn, run));
        }
    }
    assert_eq!(order, want);
}

/// 64 QPs of 2 KiB WRITEs through a device budget of 64 packets: the
/// waiters get room a quantum at a time, so the responder acknowledges
/// several messages per ACK (one ACK per message when a QP sent one
/// message per turn), and every WRITE
/// completes once with its data, without a retransmission.
#[test]
fn many_qps_under_the_budget_share_acks() {
    let mut sim = sim_with(|c| {
        c.line_rate_bps = 1 << 50;
        c.device_target_rtt_ns = 0;
        c.max_device_inflight_pkts = 64;
    });
    // Frames sent together arrive together, as a receive batch of a real
    // ring does (the responder answers after the whole batch).
    sim.link = SimLink::new(
        LinkConfig {
            rate_bps: 0,
            ..Default::default()
        },
        7,
    );
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        mr_len: 2048,
        ..Default::default()
    };
    const QPS: usize = 64;
    const MSGS: u64 = 32;
    let pairs: Vec<_> = (0..QPS).map(|_| connect_engines(&sim, &p)).collect();
    let data: Vec<_> = pairs
        .iter()
        .enumerate()
        .map(|(i, (a, _))| fill(a, i as u8))
        .collect();
    {
        let mut ga = sim.a.lock().unwrap();
        for (a, b) in &pairs {
            for i in 0..MSGS {
                ga.post_send(a.qpn, &write(i, a, b, 2048)).unwrap();
            }
        }
    }
    let total = QPS * MSGS as usize;
    let mut wcs = Vec::new();
    let t0 = sim.now;
    let done = sim.run_until(t0 + 5_000_000_000, |s| {
        wcs.extend(completions(&s.a));
        wcs.len() >= total
    });
    assert!(done, "{} of {total} WRITEs completed", wcs.len());
    assert_eq!(wcs.len(), total);
    assert!(wcs.iter().all(|c| c.wc.status == WcStatus::Success));
    for ((_, b), d) in pairs.iter().zip(&data) {
        assert_eq!(&contents(b), d);
    }
    let (sa, sb) = (sim.a.lock().unwrap().stats(), sim.b.lock().unwrap().stats());
    assert_eq!(sa.tx_retransmitted, 0);
    assert!(
        sb.tx_acks * 4 <= total as u64,
        "{} ACKs for {total} messages",
        sb.tx_acks
    );
    assert!(sim.a.lock().unwrap().inflight_pkts() == 0);
}
