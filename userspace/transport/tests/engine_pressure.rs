//! Many QPs against one receiver (issue 13, goal 3), without I/O: the
//! device-wide in-flight budget (`EngineConfig::max_device_inflight_pkts`)
//! bounds what 1,024 QPs put on the link at once and shares it fairly, and
//! a receiver under pressure (`Engine::set_rx_pressure`) slows its senders
//! through CNPs and DCQCN.

use std::sync::{Arc, Mutex};

use xroce_transport::cc::{Dcqcn, DcqcnConfig};
use xroce_transport::engine::completion::{Completion, WcStatus};
use xroce_transport::engine::memory::MrTable;
use xroce_transport::engine::qp_attr::Mtu;
use xroce_transport::engine::sim::pattern;
use xroce_transport::engine::sim::{
    connect_engines, sim_configs, EngineEndpoint, LinkConfig, PairParams, Sim, SimLink,
};
use xroce_transport::engine::work::{SendWr, WrOpcode};
use xroce_transport::engine::{Engine, EngineConfig, SrMode};

const MSG: usize = 4096;

fn sim_with(link: LinkConfig, f: impl Fn(&mut EngineConfig)) -> Sim<Mutex<Engine>> {
    let (mut ca, mut cb) = sim_configs();
    f(&mut ca);
    f(&mut cb);
    let engine = |cfg| Mutex::new(Engine::new(cfg, Arc::new(MrTable::default())));
    Sim::new(engine(ca), engine(cb), SimLink::new(link, 13))
}

fn write(id: u64, from: &EngineEndpoint, to: &EngineEndpoint, slot: usize) -> SendWr {
    SendWr::new(
        id,
        WrOpcode::RdmaWrite {
            remote_addr: to.mr.addr() + (slot * MSG) as u64,
            rkey: to.mr.rkey(),
        },
        vec![from.mr.sge(slot * MSG, MSG)],
    )
}

fn take(e: &Mutex<Engine>, into: &mut Vec<Completion>) {
    e.lock().unwrap().take_completions(into);
}

/// 1,024 QPs, each with 16 WRITEs of 4 KiB posted at once (2 packets each
/// at path MTU 2048: 32,768 packets wanting the link together), under a
/// device budget of 256 packets: the sender never has more in flight, the
/// link never carries more, every WRITE completes once and its bytes
/// arrive exactly, nothing is sent twice, and no QP gets ahead of another
/// by more than a turn (a quantum of 16 packets: 8 such messages) and one
/// message.
#[test]
fn device_inflight_is_bounded_and_shared_fairly_by_1024_qps() {
    const QPS: usize = 1024;
    const PER_QP: usize = 16;
    const BUDGET: u32 = 256;
    // Messages of one QP's turn (engine::MESSAGE_QUANTUM_PKTS / 2 packets).
    const TURN: usize = 8;
    let link = LinkConfig {
        delay_ns: 20_000,
        rate_bps: 10_000_000_000,
        ..Default::default()
    };
    let mut sim = sim_with(link, |c| c.max_device_inflight_pkts = BUDGET);
    let p = PairParams {
        mtu: Mtu::Mtu2048,
        mr_len: PER_QP * MSG,
        // An RTO of ~67 ms: only a bug would make a packet wait that long.
        timeout: 14,
        retry_cnt: 0,
        ..Default::default()
    };
    let eps: Vec<_> = (0..QPS).map(|_| connect_engines(&sim, &p)).collect();
    let mut sent = Vec::with_capacity(QPS);
    for (q, (a, _)) in eps.iter().enumerate() {
        let data = pattern(q as u64, PER_QP * MSG);
        // SAFETY: nothing is posted on this MR yet.
        unsafe { a.mr.write(0, &data).unwrap() };
        sent.push(data);
    }
    {
        let mut ga = sim.a.lock().unwrap();
        for (q, (a, b)) in eps.iter().enumerate() {
            for s in 0..PER_QP {
                let mut wr = write((q * PER_QP + s) as u64, a, b, s);
                wr.flags |= xroce_transport::engine::work::SendFlags::SIGNALED;
                ga.post_send(a.qpn, &wr).unwrap();
            }
        }
    }
    let slot_of = |qpn: u32| eps.iter().position(|(a, _)| a.qpn == qpn).unwrap();
    let mut done = vec![0usize; QPS];
    let mut wcs = Vec::new();
    let mut max_inflight = 0u64;
    let mut max_link = 0usize;
    let mut spread_at_half = None;
    let total = QPS * PER_QP;
    let finished = sim.run_until(sim.now + 5_000_000_000, |s| {
        let inflight = s.a.lock().unwrap().inflight_pkts();
        max_inflight = max_inflight.max(inflight);
        max_link = max_link.max(s.link.in_flight());
        take(&s.a, &mut wcs);
        for c in wcs.drain(..) {
            assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
            done[slot_of(c.wc.qp_num)] += 1;
        }
        let n: usize = done.iter().sum();
        if spread_at_half.is_none() && n >= total / 2 {
            let (lo, hi) = (done.iter().min().unwrap(), done.iter().max().unwrap());
            spread_at_half = Some((*lo, *hi));
        }
        n == total
    });
    assert!(
        finished,
        "completed {:?} of {total}",
        done.iter().sum::<usize>()
    );
    assert!(done.iter().all(|&d| d == PER_QP), "a WRITE completed twice");
    assert!(
        max_inflight <= u64::from(BUDGET),
        "{max_inflight} packets in flight, budget {BUDGET}"
    );
    assert!(
        max_inflight >= u64::from(BUDGET) / 2,
        "budget barely used: {max_inflight}"
    );
    // Data one way, at most one ACK per data packet the other.
    assert!(
        max_link <= 2 * BUDGET as usize,
        "{max_link} frames on the link"
    );
    let (lo, hi) = spread_at_half.unwrap();
    eprintln!("halfway: slowest QP {lo} WRITEs done, fastest {hi}");
    assert!(
        hi - lo <= TURN + 1,
        "halfway, the slowest QP had {lo} WRITEs done and the fastest {hi}"
    );
    let (sa, sb) = (sim.a.lock().unwrap().stats(), sim.b.lock().unwrap().stats());

    assert_eq!(sa.tx_retransmitted, 0);
    assert_eq!(sb.rx_duplicate, 0);
    assert_eq!(sa.tx_data_packets, (total * 2) as u64, "each packet once");
    assert!(sa.tx_budget_waits > 0, "the budget never held anyone");
    assert_eq!(sim.a.lock().unwrap().inflight_pkts(), 0);
    for (q, (_, b)) in eps.iter().enumerate() {
        let mut got = vec![0; PER_QP * MSG];
        // SAFETY: every WRITE to it has completed.
        unsafe { b.mr.read(0, &mut got).unwrap() };
        assert!(got == sent[q], "QP {q}: the data differs");
    }
}

/// A slow path (a 1 Gb/s link: 256 packets of 2 KB queue for 4.4 ms on it)
/// shrinks the device's window until ACKs come within its target round
/// trip (1 ms), so the queue it builds stays short, nothing waits long
/// enough for a tail-loss probe or a timeout, and all data arrives once.
#[test]
fn a_slow_path_shrinks_the_device_window_to_its_target_delay() {
    const QPS: usize = 64;
    const PER_QP: usize = 16;
    let link = LinkConfig {
        delay_ns: 10_000,
        rate_bps: 1_000_000_000,
        ..Default::default()
    };
    // Go-back-N: the waits this is built around are its tail-loss
    // probe's (selective repeat probes from 500 us on, and on this path
    // it does so needlessly: see selective.rs).
    let mut sim = sim_with(link, |c| c.selective_repeat = SrMode::Off);
    let (budget, target) = {
        let a = sim.a.lock().unwrap();
        (
            a.config().max_device_inflight_pkts,
            a.config().device_target_rtt_ns,
        )
    };
    assert_eq!((budget, target), (256, 500_000), "the defaults");
    let p = PairParams {
        mtu: Mtu::Mtu2048,
        mr_len: PER_QP * MSG,
        timeout: 14,
        retry_cnt: 0,
        ..Default::default()
    };
    let eps: Vec<_> = (0..QPS).map(|_| connect_engines(&sim, &p)).collect();
    {
        let mut ga = sim.a.lock().unwrap();
        for (q, (a, b)) in eps.iter().enumerate() {
            // SAFETY: nothing is posted on this MR yet.
            unsafe { a.mr.write(0, &pattern(q as u64, PER_QP * MSG)).unwrap() };
            for s in 0..PER_QP {
                let mut wr = write((q * PER_QP + s) as u64, a, b, s);
                wr.flags |= xroce_transport::engine::work::SendFlags::SIGNALED;
                ga.post_send(a.qpn, &wr).unwrap();
            }
        }
    }
    let total = QPS * PER_QP;
    let (mut done, mut wcs) = (0, Vec::new());
    let (mut late_max, mut late_window) = (0u64, 0u32);
    let t0 = sim.now;
    let finished = sim.run_until(t0 + 10_000_000_000, |s| {
        let a = s.a.lock().unwrap();
        if s.now > t0 + 20_000_000 {
            late_max = late_max.max(a.inflight_pkts());
            late_window = late_window.max(a.device_window_pkts());
        }
        drop(a);
        take(&s.a, &mut wcs);
        for c in wcs.drain(..) {
            assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
            done += 1;
        }
        done == total
    });
    assert!(finished, "{done} of {total} WRITEs completed");
    let sa = sim.a.lock().unwrap().stats();
    assert!(sa.device_window_cuts > 0, "the window never shrank");
    // ~1 ms of a 1 Gb/s link is ~60 packets of 2 KB (the window starts
    // at 32 and grows while ACKs are timely).
    assert!(late_window < 160, "window up to {late_window} of 256");
    assert!(
        late_max < 160,
        "{late_max} packets in flight after the first 20 ms"
    );
    assert_eq!(sa.tx_retransmitted, 0, "probes or timeouts fired");
    for (q, (_, b)) in eps.iter().enumerate() {
        let mut got = vec![0; PER_QP * MSG];
        // SAFETY: every WRITE to it has completed.
        unsafe { b.mr.read(0, &mut got).unwrap() };
        assert!(got == pattern(q as u64, PER_QP * MSG), "QP {q}");
    }
}

/// The budget frees room when a QP leaves: one that goes to ERR with
/// packets in flight (its peer vanished) gives them back, so the others
/// carry on.
#[test]
fn a_failed_qp_gives_its_budget_back() {
    const BUDGET: u32 = 8;
    let mut sim = sim_with(LinkConfig::default(), |c| {
        c.max_device_inflight_pkts = BUDGET
    });
    let p = PairParams {
        mtu: Mtu::Mtu2048,
        mr_len: 16 * MSG,
        timeout: 8,
        retry_cnt: 1,
        ..Default::default()
    };
    let (a1, b1) = connect_engines(&sim, &p);
    let (a2, b2) = connect_engines(&sim, &p);
    // QP 1's peer is gone: everything it sends is lost.
    sim.b.lock().unwrap().destroy_qp(b1.qpn).unwrap();
    {
        let mut ga = sim.a.lock().unwrap();
        for s in 0..16 {
            ga.post_send(a1.qpn, &write(s as u64, &a1, &b1, s)).unwrap();
        }
        for s in 0..16 {
            let mut wr = write(100 + s as u64, &a2, &b2, s);
            wr.flags |= xroce_transport::engine::work::SendFlags::SIGNALED;
            ga.post_send(a2.qpn, &wr).unwrap();
        }
    }
    let mut wcs = Vec::new();
    let mut ok2 = 0;
    let finished = sim.run_until(sim.now + 2_000_000_000, |s| {
        assert!(s.a.lock().unwrap().inflight_pkts() <= u64::from(BUDGET));
        take(&s.a, &mut wcs);
        ok2 += wcs
            .drain(..)
            .filter(|c| c.wc.qp_num == a2.qpn && c.wc.status == WcStatus::Success)
            .count();
        ok2 == 16
    });
    assert!(finished, "QP 2 completed {ok2} of 16");
    assert_eq!(sim.a.lock().unwrap().inflight_pkts(), 0);
}

fn dcqcn_sim() -> Sim<Mutex<Engine>> {
    let rate = 10_000_000_000;
    let link = LinkConfig {
        delay_ns: 5_000,
        rate_bps: 40_000_000_000,
        ..Default::default()
    };
    sim_with(link, move |c| {
        c.line_rate_bps = rate;
        c.cc = Some(Arc::new(move || {
            Box::new(Dcqcn::new(rate, DcqcnConfig::default()))
        }));
    })
}

/// Streams WRITEs from A to B for `ns` of simulated time, keeping `depth`
/// in flight; returns the bytes completed.
fn stream(sim: &mut Sim<Mutex<Engine>>, a: &EngineEndpoint, b: &EngineEndpoint, ns: u64) -> u64 {
    let depth = 16;
    let mut posted = 0u64;
    let mut completed = 0u64;
    let mut wcs = Vec::new();
    let end = sim.now + ns;
    sim.run_until(end, |s| {
        take(&s.a, &mut wcs);
        completed += wcs
            .drain(..)
            .filter(|c| c.wc.status == WcStatus::Success)
            .count() as u64;
        let mut ga = s.a.lock().unwrap();
        while posted < completed + depth {
            let mut wr = write(posted, a, b, (posted % 4) as usize);
            wr.flags |= xroce_transport::engine::work::SendFlags::SIGNALED;
            ga.post_send(a.qpn, &wr).unwrap();
            posted += 1;
        }
        s.now >= end
    });
    completed * MSG as u64
}

/// A receiver whose ring is under pressure marks what arrives as CE: its
/// responder sends CNPs, the sender's DCQCN cuts its rate and the sender
/// moves less data than an unpressured one in the same time; once the
/// pressure is gone, no more CNPs come and the rate climbs back.
#[test]
fn receiver_pressure_slows_the_sender_through_cnps() {
    let p = PairParams {
        mtu: Mtu::Mtu2048,
        mr_len: 4 * MSG,
        ..Default::default()
    };
    // Unpressured: no CNPs, the line rate throughout.
    let mut free = dcqcn_sim();
    let (fa, fb) = connect_engines(&free, &p);
    let free_bytes = stream(&mut free, &fa, &fb, 5_000_000);
    let line = free.a.lock().unwrap().qp_rate_bps(fa.qpn).unwrap();
    assert_eq!(free.b.lock().unwrap().stats().tx_cnps, 0);
    assert_eq!(line, 10_000_000_000);

    let mut sim = dcqcn_sim();
    let (a, b) = connect_engines(&sim, &p);
    sim.b.lock().unwrap().set_rx_pressure(true);
    let pressed_bytes = stream(&mut sim, &a, &b, 5_000_000);
    let (sa, sb) = (sim.a.lock().unwrap().stats(), sim.b.lock().unwrap().stats());
    let low = sim.a.lock().unwrap().qp_rate_bps(a.qpn).unwrap();
    assert!(sb.rx_pressure_marked > 0);
    assert_eq!(sb.rx_ce_marked, 0, "nothing was marked on the link");
    assert!(sb.tx_cnps > 10, "receiver sent {} CNPs", sb.tx_cnps);
    assert_eq!(sa.rx_cnps, sb.tx_cnps);
    assert!(low < line / 4, "rate under pressure {low} of {line}");
    assert!(
        pressed_bytes * 2 < free_bytes,
        "under pressure {pressed_bytes} bytes, without {free_bytes}"
    );
    assert_eq!(sa.tx_retransmitted, 0, "slowed down, not dropped");

    // Pressure gone: CNPs stop and DCQCN recovers.
    sim.b.lock().unwrap().set_rx_pressure(false);
    let cnps = sim.b.lock().unwrap().stats().tx_cnps;
    stream(&mut sim, &a, &b, 20_000_000);
    assert_eq!(sim.b.lock().unwrap().stats().tx_cnps, cnps);
    let back = sim.a.lock().unwrap().qp_rate_bps(a.qpn).unwrap();
    assert!(
        back > low * 2,
        "rate after the pressure {back}, under it {low}"
    );
}

/// A big WRITE that has started holds no more of the device's budget than
/// its turn gives it: small WRITEs posted on another QP after it started
/// complete long before it does (they used to wait for its end, as a
/// started message went on past the budget with its whole QP window), and
/// the device never has more in flight than the budget plus the packets
/// that ran up to an ACK request.
#[test]
fn a_big_write_does_not_hold_small_ones_on_other_qps_behind_it() {
    const BUDGET: u32 = 64;
    const BIG: usize = 8 << 20; // 4,096 packets at path MTU 2048
    let link = LinkConfig {
        delay_ns: 20_000,
        rate_bps: 10_000_000_000,
        ..Default::default()
    };
    let mut sim = sim_with(link, |c| c.max_device_inflight_pkts = BUDGET);
    let p = PairParams {
        mtu: Mtu::Mtu2048,
        mr_len: BIG,
        timeout: 14,
        retry_cnt: 0,
        ..Default::default()
    };
    let (a1, b1) = connect_engines(&sim, &p);
    let (a2, b2) = connect_engines(&sim, &p);
    let big_data = pattern(7, BIG);
    // SAFETY: nothing is posted on this MR yet.
    unsafe { a1.mr.write(0, &big_data).unwrap() };
    let mut big = SendWr::new(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: b1.mr.addr(),
            rkey: b1.mr.rkey(),
        },
        vec![a1.mr.sge(0, BIG)],
    );
    big.flags |= xroce_transport::engine::work::SendFlags::SIGNALED;
    sim.a.lock().unwrap().post_send(a1.qpn, &big).unwrap();
    // Let the big WRITE get going (a few hundred packets).
    let t0 = sim.now;
    sim.run_until(t0 + 300_000, |_| false);
    let small_data = pattern(9, 16 * MSG);
    // SAFETY: nothing is posted on this part of the MR yet.
    unsafe { a2.mr.write(0, &small_data).unwrap() };
    {
        let mut ga = sim.a.lock().unwrap();
        for s in 0..16 {
            let mut wr = write(100 + s as u64, &a2, &b2, s);
            wr.flags |= xroce_transport::engine::work::SendFlags::SIGNALED;
            ga.post_send(a2.qpn, &wr).unwrap();
        }
    }
    let mut wcs = Vec::new();
    let (mut small_done_at, mut big_done_at) = (None, None);
    let mut small = 0;
    let mut max_inflight = 0;
    let finished = sim.run_until(sim.now + 5_000_000_000, |s| {
        max_inflight = max_inflight.max(s.a.lock().unwrap().inflight_pkts());
        take(&s.a, &mut wcs);
        for c in wcs.drain(..) {
            assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
            if c.wc.qp_num == a2.qpn {
                small += 1;
                if small == 16 {
                    small_done_at = Some(s.now);
                }
            } else {
                big_done_at = Some(s.now);
            }
        }
        small_done_at.is_some() && big_done_at.is_some()
    });
    assert!(
        finished,
        "small {small} of 16, big done {big_done_at:?}, a: {:?}",
        sim.a.lock().unwrap().stats()
    );
    let (small_at, big_at) = (small_done_at.unwrap(), big_done_at.unwrap());
    eprintln!(
        "small WRITEs done after {} us, the big one after {} us, {max_inflight} packets in flight at most",
        (small_at - t0) / 1000,
        (big_at - t0) / 1000
    );
    // 8 MiB at 10 Gb/s is ~6.7 ms; the 16 small ones need well under 1 ms
    // of the link even sharing it.
    assert!(
        small_at - t0 < (big_at - t0) / 3,
        "small WRITEs done at {} us, the big one at {} us",
        (small_at - t0) / 1000,
        (big_at - t0) / 1000
    );
    assert!(
        max_inflight <= u64::from(BUDGET) + 32,
        "{max_inflight} packets in flight, budget {BUDGET}"
    );
    let mut got = vec![0; BIG];
    // SAFETY: the WRITE has completed.
    unsafe { b1.mr.read(0, &mut got).unwrap() };
    assert!(got == big_data, "the big WRITE's data differs");
    let mut got = vec![0; 16 * MSG];
    // SAFETY: the WRITEs have completed.
    unsafe { b2.mr.read(0, &mut got).unwrap() };
    assert!(got == small_data, "the small WRITEs' data differs");
    assert_eq!(sim.a.lock().unwrap().stats().tx_retransmitted, 0);
}

/// A flow its congestion control paces slowly (here 50 Mb/s: a 2 KB
/// packet every 330 us) still gets its ACKs in time: a packet asks for one
/// when the last request is 250 us old, so no tail-loss probe or timeout
/// fires on a link that loses nothing (before, 32 packets went between ACK
/// requests, 10 ms of sending at this rate, and a probe repeated a packet
/// every few milliseconds: the incasts' "retransmits without drops").
#[test]
fn a_slowly_paced_flow_is_acknowledged_before_any_probe() {
    const LEN: usize = 1 << 20; // 512 packets: ~170 ms at 50 Mb/s
    let link = LinkConfig {
        delay_ns: 20_000,
        rate_bps: 10_000_000_000,
        ..Default::default()
    };
    let mut sim = sim_with(link, |c| c.line_rate_bps = 50_000_000);
    let p = PairParams {
        mtu: Mtu::Mtu2048,
        mr_len: LEN,
        timeout: 14,
        retry_cnt: 0,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    let data = pattern(3, LEN);
    // SAFETY: nothing is posted on this MR yet.
    unsafe { a.mr.write(0, &data).unwrap() };
    let mut wr = SendWr::new(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, LEN)],
    );
    wr.flags |= xroce_transport::engine::work::SendFlags::SIGNALED;
    sim.a.lock().unwrap().post_send(a.qpn, &wr).unwrap();
    let mut wcs = Vec::new();
    let finished = sim.run_until(sim.now + 2_000_000_000, |s| {
        take(&s.a, &mut wcs);
        !wcs.is_empty()
    });
    assert!(finished, "the WRITE did not complete");
    assert_eq!(wcs[0].wc.status, WcStatus::Success);
    let sa = sim.a.lock().unwrap().stats();
    assert_eq!(
        (sa.tx_retransmitted, sa.retry_timeouts),
        (0, 0),
        "retransmitted on a lossless link: {sa:?}"
    );
    let mut got = vec![0; LEN];
    // SAFETY: the WRITE has completed.
    unsafe { b.mr.read(0, &mut got).unwrap() };
    assert!(got == data, "the data differs");
}
