//! Selective repeat (engine/selective.rs) between two engines over the
//! simulated link: data placed exactly once and verified, completions in
//! order, at 1 % and 5 % loss with reordering and duplication; far fewer
//! retransmissions than go-back-N at the same seed; the simulated goodput
//! under loss against lossless for both modes; go-back-N untouched when SR
//! is off.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use xroce_transport::engine::completion::{Completion, WcFlags, WcOpcode, WcStatus};
use xroce_transport::engine::qp_attr::Mtu;
use xroce_transport::engine::sim::{
    connect_engines, EngineEndpoint, EngineHost, LinkConfig, PairParams, Sim,
};
use xroce_transport::engine::work::{RecvWr, SendWr, WrOpcode};
use xroce_transport::engine::{Engine, EngineStats, SrMode};

use xroce_transport::engine::sim::pattern;

const SEC: u64 = 1_000_000_000;
/// Source data on A / READ source on B, then destinations.
const REGION: usize = 4 << 20;

type EngineSim = Sim<Mutex<Engine>>;

fn lk(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    EngineHost::lock(m)
}

fn setup(
    link: LinkConfig,
    seed: u64,
    sr: bool,
    mtu: Mtu,
) -> (EngineSim, EngineEndpoint, EngineEndpoint) {
    let sim = Sim::engine_pair(link, seed);
    let p = PairParams {
        mtu,
        psn_a: (1 << 24) - 40, // across the PSN wrap
        psn_b: (1 << 24) - 3,
        mr_len: 2 * REGION,
        timeout: 12, // 16.8 ms: the tail-loss probe (>= 500 us) comes first
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    // Forced on both sides, or go-back-N (Off) for the comparisons.
    let mode = if sr { SrMode::On } else { SrMode::Off };
    lk(&sim.a).set_selective_repeat(a.qpn, mode).unwrap();
    lk(&sim.b).set_selective_repeat(b.qpn, mode).unwrap();
    let st = lk(&sim.a).selective_repeat(a.qpn).unwrap();
    assert_eq!((st.requester, st.responder), (sr, sr));
    // SAFETY: no work request is posted yet.
    unsafe {
        a.mr.write(0, &pattern(seed ^ 1, REGION)).unwrap();
        b.mr.write(0, &pattern(seed ^ 2, REGION)).unwrap();
    }
    (sim, a, b)
}

/// Run until A has `want_a` completions and B `want_b`.
fn run(sim: &mut EngineSim, want_a: usize, want_b: usize) -> (Vec<Completion>, Vec<Completion>) {
    let (mut ca, mut cb) = (Vec::new(), Vec::new());
    let deadline = sim.now + 120 * SEC;
    let ok = sim.run_until(deadline, |s| {
        lk(&s.a).take_completions(&mut ca);
        lk(&s.b).take_completions(&mut cb);
        ca.len() >= want_a && cb.len() >= want_b
    });
    assert!(
        ok,
        "timed out: A {}/{want_a} B {}/{want_b}; A {:?}; B {:?}; link {:?}",
        ca.len(),
        cb.len(),
        lk(&sim.a).stats(),
        lk(&sim.b).stats(),
        sim.link.stats
    );
    (ca, cb)
}

struct Outcome {
    sim_ns: u64,
    a: EngineStats,
    b: EngineStats,
}

/// `msgs` WRITEs of `size` bytes from A to B, all posted at once; data
/// verified, completions in order.
fn write_stream(link: LinkConfig, seed: u64, sr: bool, msgs: usize, size: usize) -> Outcome {
    let (mut sim, a, b) = setup(link, seed, sr, Mtu::Mtu4096);
    let start = sim.now;
    for i in 0..msgs {
        let off = (i * size) % (REGION - size);
        let wr = SendWr::new(
            i as u64,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr() + (REGION + off) as u64,
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(off, size)],
        );
        lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    }
    let (ca, _) = run(&mut sim, msgs, 0);
    let sim_ns = sim.now - start;
    let ids: Vec<u64> = ca.iter().map(|c| c.wc.wr_id).collect();
    assert_eq!(ids, (0..msgs as u64).collect::<Vec<_>>(), "in order");
    assert!(ca.iter().all(|c| c.wc.status == WcStatus::Success));
    let src = pattern(seed ^ 1, REGION);
    for i in 0..msgs {
        let off = (i * size) % (REGION - size);
        // SAFETY: every WRITE has completed.
        let got = unsafe { b.mr.to_vec(REGION + off, size) }.unwrap();
        assert!(got == src[off..off + size], "message {i} differs");
    }
    let (sa, sb) = (lk(&sim.a).stats(), lk(&sim.b).stats());
    Outcome {
        sim_ns,
        a: sa,
        b: sb,
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Write(usize),
    WriteImm(usize),
    Send(usize),
    Read(usize),
    FetchAdd,
}

/// A random mix of every RC operation under `link`; everything verified.
fn mixed(link: LinkConfig, seed: u64, sr: bool, n: usize) -> Outcome {
    let (mut sim, a, b) = setup(link, seed, sr, Mtu::Mtu1024);
    let mut rng = StdRng::seed_from_u64(seed);
    let start = sim.now;
    let a_src = pattern(seed ^ 1, REGION);
    let b_src = pattern(seed ^ 2, REGION);
    // B: [REGION, 2 REGION) takes WRITEs and SENDs, A's the same READs and
    // fetched values; the atomic counter is B's first 8 bytes.
    let (mut b_dst, mut a_dst) = (REGION, REGION);
    let mut checks_b = Vec::new(); // (b offset, a src offset, len)
    let mut checks_a = Vec::new(); // (a offset, b src offset, len)
    let mut recvs = Vec::new(); // (wr_id, byte_len, imm)
    let mut adds = 0u64;
    let ctr = u64::from_ne_bytes(b_src[..8].try_into().unwrap());
    let mut fetches = Vec::new();
    for i in 0..n {
        let op = match rng.random_range(0..10) {
            0..=3 => Op::Write(rng.random_range(1..=24 << 10)),
            4 => Op::WriteImm(rng.random_range(0..=16 << 10)),
            5 | 6 => Op::Send(rng.random_range(0..=16 << 10)),
            7 | 8 => Op::Read(rng.random_range(1..=32 << 10)),
            _ => Op::FetchAdd,
        };
        let src = rng.random_range(8..REGION / 2);
        let id = i as u64;
        let wr = match op {
            Op::Write(len) | Op::WriteImm(len) => {
                checks_b.push((b_dst, src, len));
                let ra = b.mr.addr() + b_dst as u64;
                b_dst += len;
                let opcode = if let Op::WriteImm(_) = op {
                    lk(&sim.b)
                        .post_recv(
                            b.qpn,
                            &RecvWr {
                                wr_id: id,
                                sg_list: vec![],
                            },
                        )
                        .unwrap();
                    recvs.push((id, len as u32, Some(id as u32)));
                    WrOpcode::RdmaWriteWithImm {
                        remote_addr: ra,
                        rkey: b.mr.rkey(),
                        imm: id as u32,
                    }
                } else {
                    WrOpcode::RdmaWrite {
                        remote_addr: ra,
                        rkey: b.mr.rkey(),
                    }
                };
                SendWr::new(id, opcode, vec![a.mr.sge(src, len)])
            }
            Op::Send(len) => {
                checks_b.push((b_dst, src, len));
                lk(&sim.b)
                    .post_recv(
                        b.qpn,
                        &RecvWr {
                            wr_id: id,
                            sg_list: vec![b.mr.sge(b_dst, len)],
                        },
                    )
                    .unwrap();
                b_dst += len;
                recvs.push((id, len as u32, None));
                SendWr::new(id, WrOpcode::Send, vec![a.mr.sge(src, len)])
            }
            Op::Read(len) => {
                checks_a.push((a_dst, src, len));
                let wr = SendWr::new(
                    id,
                    WrOpcode::RdmaRead {
                        remote_addr: b.mr.addr() + src as u64,
                        rkey: b.mr.rkey(),
                    },
                    vec![a.mr.sge(a_dst, len)],
                );
                a_dst += len;
                wr
            }
            Op::FetchAdd => {
                let add = rng.random_range(1..1000u64);
                fetches.push((a_dst, ctr.wrapping_add(adds)));
                adds = adds.wrapping_add(add);
                let wr = SendWr::new(
                    id,
                    WrOpcode::AtomicFetchAndAdd {
                        remote_addr: b.mr.addr(),
                        rkey: b.mr.rkey(),
                        add,
                    },
                    vec![a.mr.sge(a_dst, 8)],
                );
                a_dst += 8;
                wr
            }
        };
        lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    }
    let (ca, cb) = run(&mut sim, n, recvs.len());
    let sim_ns = sim.now - start;
    let ids: Vec<u64> = ca.iter().map(|c| c.wc.wr_id).collect();
    assert_eq!(
        ids,
        (0..n as u64).collect::<Vec<_>>(),
        "send completions in order"
    );
    if let Some(c) = ca.iter().find(|c| c.wc.status != WcStatus::Success) {
        panic!("{:?}", c.wc);
    }
    let got: Vec<(u64, u32, Option<u32>)> = cb
        .iter()
        .map(|c| {
            assert_eq!(c.wc.status, WcStatus::Success);
            let imm =
                c.wc.flags
                    .contains(WcFlags::WITH_IMM)
                    .then_some(c.wc.imm_data);
            if imm.is_some() {
                assert_eq!(c.wc.opcode, WcOpcode::RecvRdmaWithImm);
            }
            (c.wc.wr_id, c.wc.byte_len, imm)
        })
        .collect();
    assert_eq!(
        got, recvs,
        "receive completions in order, lengths, immediates"
    );
    for (k, &(dst, src, len)) in checks_b.iter().enumerate() {
        // SAFETY: everything has completed.
        let got = unsafe { b.mr.to_vec(dst, len) }.unwrap();
        assert!(
            got == a_src[src..src + len],
            "B check {k} ({len} bytes) differs"
        );
    }
    for (k, &(dst, src, len)) in checks_a.iter().enumerate() {
        // SAFETY: everything has completed.
        let got = unsafe { a.mr.to_vec(dst, len) }.unwrap();
        assert!(
            got == b_src[src..src + len],
            "READ check {k} ({len} bytes) differs"
        );
    }
    for &(dst, want) in &fetches {
        // SAFETY: everything has completed.
        let got = unsafe { a.mr.to_vec(dst, 8) }.unwrap();
        assert_eq!(
            u64::from_ne_bytes(got.try_into().unwrap()),
            want,
            "fetch-add result"
        );
    }
    // SAFETY: everything has completed.
    let c = unsafe { b.mr.to_vec(0, 8) }.unwrap();
    assert_eq!(
        u64::from_ne_bytes(c.try_into().unwrap()),
        ctr.wrapping_add(adds),
        "each add once"
    );
    let (sa, sb) = (lk(&sim.a).stats(), lk(&sim.b).stats());
    Outcome {
        sim_ns,
        a: sa,
        b: sb,
    }
}

#[test]
fn sr_mixed_ops_lossless_and_lossy() {
    for (loss, seed) in [(0.0, 1), (0.01, 2), (0.01, 3), (0.05, 4), (0.05, 5)] {
        let o = mixed(LinkConfig::lossy(loss), seed, true, 300);
        println!(
            "SR mixed loss {loss} seed {seed}: A retransmitted {}, B placed {} out of order, dropped {}, SACKs {}",
            o.a.tx_retransmitted, o.b.sr_placed_out_of_order, o.b.sr_dropped_out_of_order, o.b.tx_sacks
        );
        if loss > 0.0 {
            assert!(
                o.b.sr_placed_out_of_order > 0,
                "loss {loss}: nothing placed out of order"
            );
            let g = mixed(LinkConfig::lossy(loss), seed, false, 300);
            println!(
                "  go-back-N, same seed: retransmitted {}",
                g.a.tx_retransmitted
            );
            assert!(o.a.tx_retransmitted < g.a.tx_retransmitted);
        } else {
            assert_eq!(o.a.tx_retransmitted, 0);
        }
    }
}

#[test]
fn sr_write_stream_under_loss_reorder_duplication() {
    for (loss, seed) in [(0.01, 11), (0.05, 12)] {
        let mut link = LinkConfig::lossy(loss);
        link.dup = loss;
        link.reorder = loss;
        let o = write_stream(link, seed, true, 64, 64 << 10);
        assert!(o.b.sr_placed_out_of_order > 0);
        assert!(o.b.tx_sacks > 0 && o.a.sr_holes_retransmitted > 0);
    }
}

/// Late duplicates (the link delivers some frames twice, some late) never
/// place data again once their message completed.
#[test]
fn sr_late_duplicates_are_not_placed_again() {
    let mut link = LinkConfig::lossy(0.02);
    link.dup = 0.2;
    link.reorder = 0.2;
    link.reorder_ns = 200_000;
    let seed = 21;
    let (mut sim, a, b) = setup(link, seed, true, Mtu::Mtu1024);
    let size = 32 << 10;
    for i in 0..16u64 {
        let wr = SendWr::new(
            i,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr() + REGION as u64 + i * size as u64,
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(0, size)],
        );
        lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    }
    run(&mut sim, 16, 0);
    // The application reuses the buffer at once; what is still on the
    // link must not overwrite it.
    let zeros = vec![0u8; 16 * size];
    // SAFETY: every WRITE has completed (late frames may still arrive: the point).
    unsafe { b.mr.write(REGION, &zeros) }.unwrap();
    let in_flight = sim.link.in_flight();
    let until = sim.now + SEC / 10;
    sim.run_until(until, |_| false);
    // SAFETY: the link is idle.
    let got = unsafe { b.mr.to_vec(REGION, zeros.len()) }.unwrap();
    assert!(
        got == zeros,
        "a late duplicate was placed again ({in_flight} frames were in flight)"
    );
    assert!(
        lk(&sim.b).stats().rx_duplicate > 0,
        "the link delivered no duplicate"
    );
}

/// Same seed, same 1 % loss: SR retransmits far fewer packets and keeps
/// most of the lossless goodput; go-back-N keeps its behaviour (no SACK,
/// nothing placed out of order). Prints the simulated goodput figure.
#[test]
fn sr_vs_go_back_n_retransmits_and_goodput() {
    let link = |loss: f64| LinkConfig {
        loss,
        rate_bps: 10_000_000_000,
        delay_ns: 5_000,
        ..Default::default()
    };
    let (msgs, size) = (256, 64 << 10);
    let mut line = Vec::new();
    let mut ratios = Vec::new();
    for sr in [false, true] {
        let base = write_stream(link(0.0), 31, sr, msgs, size);
        assert_eq!(base.a.tx_retransmitted, 0);
        let lossy = write_stream(link(0.01), 31, sr, msgs, size);
        let ratio = base.sim_ns as f64 / lossy.sim_ns as f64;
        let gbps = |o: &Outcome| (msgs * size * 8) as f64 / o.sim_ns as f64;
        line.push(format!(
            "{}: lossless {:.2} Gb/s, 1 % loss {:.2} Gb/s ({ratio:.3} x), {} retransmitted",
            if sr { "SR" } else { "go-back-N" },
            gbps(&base),
            gbps(&lossy),
            lossy.a.tx_retransmitted
        ));
        ratios.push((ratio, lossy.a.tx_retransmitted, lossy));
    }
    println!(
        "simulated WRITE 64 KiB x {msgs}, 10 Gb/s, 5 us: {}",
        line.join("; ")
    );
    let (gbn, sr) = (&ratios[0], &ratios[1]);
    assert_eq!((gbn.2.b.tx_sacks, gbn.2.b.sr_placed_out_of_order), (0, 0));
    assert!(
        gbn.2.a.rx_seq_naks > 0,
        "go-back-N recovers by sequence NAKs as before"
    );
    assert_eq!(sr.2.b.tx_naks_seq, 0, "SR sends no sequence NAK");
    assert!(
        sr.1 * 4 <= gbn.1,
        "SR retransmitted {} packets, go-back-N {}",
        sr.1,
        gbn.1
    );
    assert!(
        sr.0 > gbn.0,
        "SR goodput ratio {:.3} <= go-back-N {:.3}",
        sr.0,
        gbn.0
    );
    assert!(
        sr.0 >= 0.9,
        "SR keeps {:.3} x lossless goodput at 1 % loss",
        sr.0
    );
}

/// The mode is set only while the QP is idle; Off stays off.
#[test]
fn sr_mode_is_set_only_while_idle() {
    let (sim, a, b) = setup(LinkConfig::default(), 41, false, Mtu::Mtu1024);
    let mut e = lk(&sim.a);
    assert!(!e.selective_repeat(a.qpn).unwrap().requester);
    let wr = SendWr::new(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, 8)],
    );
    e.post_send(a.qpn, &wr).unwrap();
    assert!(
        e.set_selective_repeat(a.qpn, SrMode::On).is_err(),
        "busy QP"
    );
    let st = e.selective_repeat(a.qpn).unwrap();
    assert_eq!(
        (st.mode, st.requester, st.responder),
        (SrMode::Off, false, false)
    );
}

/// Errors keep go-back-N's semantics: a WRITE to a bad rkey, placed in
/// order, completes with REM_ACCESS_ERR at the requester, even when its
/// packets arrive out of order first (they are not placed, only checked).
#[test]
fn sr_bad_rkey_is_a_remote_access_error() {
    let mut link = LinkConfig::lossy(0.05);
    link.reorder = 0.3;
    let (mut sim, a, b) = setup(link, 51, true, Mtu::Mtu1024);
    let good = |id: u64, off: usize| {
        SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr() + (REGION + off) as u64,
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(off, 16 << 10)],
        )
    };
    lk(&sim.a).post_send(a.qpn, &good(1, 0)).unwrap();
    let bad = SendWr::new(
        2,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr() + REGION as u64,
            rkey: b.mr.rkey() ^ 0x100,
        },
        vec![a.mr.sge(0, 16 << 10)],
    );
    lk(&sim.a).post_send(a.qpn, &bad).unwrap();
    let (ca, _) = run(&mut sim, 2, 0);
    let got: Vec<_> = ca.iter().map(|c| (c.wc.wr_id, c.wc.status)).collect();
    assert_eq!(
        got,
        [(1, WcStatus::Success), (2, WcStatus::RemAccessErr)],
        "{ca:?}"
    );
    // SAFETY: the first WRITE has completed; the second placed nothing.
    let data = unsafe { b.mr.to_vec(REGION, 16 << 10) }.unwrap();
    assert!(data == pattern(51 ^ 1, 16 << 10), "good WRITE's data");
}

/// Many seeds, heavy impairment: no stall, everything verified.
#[test]
fn sr_seed_sweep() {
    for seed in 100..116u64 {
        let loss = [0.01, 0.03, 0.1][seed as usize % 3];
        let mut link = LinkConfig::lossy(loss);
        link.dup = loss / 2.0;
        link.reorder = loss;
        mixed(link, seed, true, 120);
    }
}

/// A WRITE with immediate and no receive posted: its last packet is RNR
/// NAKed (the ones before it are placed meanwhile), then, once a receive
/// is posted, one completion with the whole length, data intact.
#[test]
fn sr_write_with_imm_waits_for_a_receive() {
    let mut link = LinkConfig::lossy(0.02);
    link.reorder = 0.1;
    let (mut sim, a, b) = setup(link, 61, true, Mtu::Mtu1024);
    let len = 20_000;
    let wr = SendWr::new(
        9,
        WrOpcode::RdmaWriteWithImm {
            remote_addr: b.mr.addr() + REGION as u64,
            rkey: b.mr.rkey(),
            imm: 0xfeed,
        },
        vec![a.mr.sge(100, len)],
    );
    lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    let until = sim.now + SEC / 20;
    sim.run_until(until, |_| false);
    assert!(lk(&sim.b).stats().tx_naks_rnr > 0, "no RNR NAK");
    let mut early = Vec::new();
    lk(&sim.a).take_completions(&mut early);
    assert_eq!(early, [], "completed without a receive");
    lk(&sim.b)
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 77,
                sg_list: vec![],
            },
        )
        .unwrap();
    let (ca, cb) = run(&mut sim, 1, 1);
    assert_eq!((ca[0].wc.wr_id, ca[0].wc.status), (9, WcStatus::Success));
    let w = cb[0].wc;
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data),
        (
            77,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            len as u32,
            0xfeed
        )
    );
    // SAFETY: the WRITE has completed.
    let got = unsafe { b.mr.to_vec(REGION, len) }.unwrap();
    assert!(got == pattern(61 ^ 1, 100 + len)[100..], "data");
}
