//! Two engines agree on selective repeat in band (engine/selective.rs,
//! "Agreement"): Auto QPs switch each half on by themselves from the
//! BTH's capable bit and recover loss with SACKs; an Auto QP facing a peer
//! that never sets the bit (an Off engine, as rxe) stays go-back-N, its
//! frames bit for bit those of an Off QP but for the bit; a switch in the
//! middle of a multi-packet WRITE, with drops around it, still delivers
//! the data exactly once.

use std::sync::{Arc, Mutex};

use xroce_transport::engine::completion::{Completion, WcOpcode, WcStatus};
use xroce_transport::engine::qp_attr::Mtu;
use xroce_transport::engine::sim::{
    connect_engines, pattern, EngineEndpoint, EngineHost, LinkConfig, PairParams, Sim,
};
use xroce_transport::engine::work::{RecvWr, SendWr, WrOpcode};
use xroce_transport::engine::{Engine, EngineStats, SrMode, SrStatus};
use xroce_wire::{parse_frame, Opcode};

const SEC: u64 = 1_000_000_000;
/// Each side's source data, then what the peer writes into it.
const REGION: usize = 1 << 20;

type EngineSim = Sim<Mutex<Engine>>;

fn lk(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    EngineHost::lock(m)
}

/// A connected pair with modes `ma` on A and `mb` on B.
fn setup(
    link: LinkConfig,
    seed: u64,
    ma: SrMode,
    mb: SrMode,
) -> (EngineSim, EngineEndpoint, EngineEndpoint) {
    let sim = Sim::engine_pair(link, seed);
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        psn_a: (1 << 24) - 100, // across the PSN wrap
        psn_b: 7,
        mr_len: 2 * REGION,
        timeout: 12,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    lk(&sim.a).set_selective_repeat(a.qpn, ma).unwrap();
    lk(&sim.b).set_selective_repeat(b.qpn, mb).unwrap();
    // SAFETY: no work request is posted yet.
    unsafe {
        a.mr.write(0, &pattern(seed ^ 1, REGION)).unwrap();
        b.mr.write(0, &pattern(seed ^ 2, REGION)).unwrap();
    }
    (sim, a, b)
}

fn status(sim: &EngineSim, a: &EngineEndpoint, b: &EngineEndpoint) -> (SrStatus, SrStatus) {
    (
        lk(&sim.a).selective_repeat(a.qpn).unwrap(),
        lk(&sim.b).selective_repeat(b.qpn).unwrap(),
    )
}

fn write(id: u64, from: &EngineEndpoint, to: &EngineEndpoint, off: usize, len: usize) -> SendWr {
    SendWr::new(
        id,
        WrOpcode::RdmaWrite {
            remote_addr: to.mr.addr() + (REGION + off) as u64,
            rkey: to.mr.rkey(),
        },
        vec![from.mr.sge(off, len)],
    )
}

/// Run until A has `want_a` completions and B `want_b`.
fn run(sim: &mut EngineSim, want_a: usize, want_b: usize) -> (Vec<Completion>, Vec<Completion>) {
    let (mut ca, mut cb) = (Vec::new(), Vec::new());
    let deadline = sim.now + 60 * SEC;
    let ok = sim.run_until(deadline, |s| {
        lk(&s.a).take_completions(&mut ca);
        lk(&s.b).take_completions(&mut cb);
        ca.len() >= want_a && cb.len() >= want_b
    });
    assert!(
        ok,
        "timed out: A {}/{want_a} B {}/{want_b}; A {:?}; B {:?}",
        ca.len(),
        cb.len(),
        lk(&sim.a).stats(),
        lk(&sim.b).stats(),
    );
    (ca, cb)
}

/// `msgs` WRITEs of `size` bytes each way at once (A to B and B to A),
/// under `link`; completions in order, data verified on both sides.
fn both_ways(
    link: LinkConfig,
    seed: u64,
    ma: SrMode,
    mb: SrMode,
    msgs: usize,
    size: usize,
) -> (EngineSim, EngineEndpoint, EngineEndpoint) {
    let (mut sim, a, b) = setup(link, seed, ma, mb);
    for i in 0..msgs {
        let off = i * size;
        lk(&sim.a)
            .post_send(a.qpn, &write(i as u64, &a, &b, off, size))
            .unwrap();
        lk(&sim.b)
            .post_send(b.qpn, &write(i as u64, &b, &a, off, size))
            .unwrap();
    }
    let (ca, cb) = run(&mut sim, msgs, msgs);
    for (side, cs) in [("A", &ca), ("B", &cb)] {
        let ids: Vec<u64> = cs.iter().map(|c| c.wc.wr_id).collect();
        assert_eq!(
            ids,
            (0..msgs as u64).collect::<Vec<_>>(),
            "{side}: in order"
        );
        assert!(
            cs.iter().all(|c| c.wc.status == WcStatus::Success),
            "{side}"
        );
    }
    let n = msgs * size;
    // SAFETY: every WRITE has completed.
    let (at_b, at_a) = unsafe {
        (
            b.mr.to_vec(REGION, n).unwrap(),
            a.mr.to_vec(REGION, n).unwrap(),
        )
    };
    assert!(at_b == pattern(seed ^ 1, REGION)[..n], "A's data at B");
    assert!(at_a == pattern(seed ^ 2, REGION)[..n], "B's data at A");
    (sim, a, b)
}

fn retransmitted(s: &EngineStats) -> u64 {
    s.tx_retransmitted
}

/// Two Auto QPs (the default) under 2 % loss with reordering switch all
/// four halves on by themselves and recover with selective repeat: SACKs
/// sent, packets placed ahead, and far fewer retransmissions than the
/// same run between two go-back-N (Off) QPs.
#[test]
fn two_auto_qps_switch_both_halves_and_recover_with_sacks() {
    let link = LinkConfig::lossy(0.02);
    let (msgs, size) = (24, 16 << 10);
    let (sim, a, b) = both_ways(link, 7, SrMode::Auto, SrMode::Auto, msgs, size);
    let on = SrStatus {
        mode: SrMode::Auto,
        requester: true,
        responder: true,
    };
    assert_eq!(status(&sim, &a, &b), (on, on));
    let (sa, sb) = (lk(&sim.a).stats(), lk(&sim.b).stats());
    assert!(
        sa.tx_sacks > 0 && sb.tx_sacks > 0,
        "SACKs: {} {}",
        sa.tx_sacks,
        sb.tx_sacks
    );
    assert!(
        sa.sr_placed_out_of_order > 0 && sb.sr_placed_out_of_order > 0,
        "placed ahead: {} {}",
        sa.sr_placed_out_of_order,
        sb.sr_placed_out_of_order
    );
    let sr = retransmitted(&sa) + retransmitted(&sb);

    let (gsim, ga, gb) = both_ways(link, 7, SrMode::Off, SrMode::Off, msgs, size);
    let off = SrStatus {
        mode: SrMode::Off,
        requester: false,
        responder: false,
    };
    assert_eq!(status(&gsim, &ga, &gb), (off, off));
    let gbn = retransmitted(&lk(&gsim.a).stats()) + retransmitted(&lk(&gsim.b).stats());
    assert!(
        sr * 3 < gbn,
        "selective repeat retransmitted {sr} packets, go-back-N {gbn}"
    );
}

/// Every frame the link carries, both ways, in order.
type Frames = Arc<Mutex<Vec<(bool, Vec<u8>)>>>;

fn record(sim: &mut EngineSim) -> Frames {
    let frames: Frames = Arc::default();
    let f = frames.clone();
    // The tap sees frames before loss; which way a frame goes is in its
    // source MAC (A's ends in 1).
    sim.link.tap_frames(move |_, frame| {
        f.lock().unwrap().push((frame[11] == 1, frame.to_vec()));
    });
    frames
}

/// Byte 4 of the BTH of a RoCEv2 frame over IPv4 without VLAN tags.
const BTH_BYTE4: usize = 14 + 20 + 8 + 4;

/// An Auto QP facing a peer that never sets the bit (an Off QP: what rxe
/// is to us) stays go-back-N in both halves and never sends a SACK, and
/// every frame either side sends is, but for the capable bit on the Auto
/// side's requests, the frame an Off QP in its place sends: go-back-N bit
/// for bit, under loss with reordering and duplication. (Frames are
/// compared parsed, each RETH's VA taken relative to its MR: the two runs'
/// MRs lie at different addresses.)
#[test]
fn an_auto_qp_facing_a_peer_without_the_bit_stays_go_back_n_bit_for_bit() {
    let link = LinkConfig::lossy(0.02);
    let (msgs, size) = (16, 8 << 10);
    let traced = |ma: SrMode| {
        let (mut sim, a, b) = setup(link, 11, ma, SrMode::Off);
        let frames = record(&mut sim);
        for i in 0..msgs {
            let off = i * size;
            lk(&sim.a)
                .post_send(a.qpn, &write(i as u64, &a, &b, off, size))
                .unwrap();
            lk(&sim.b)
                .post_send(b.qpn, &write(i as u64, &b, &a, off, size))
                .unwrap();
        }
        run(&mut sim, msgs, msgs);
        let off = SrStatus {
            mode: ma,
            requester: false,
            responder: false,
        };
        assert_eq!(status(&sim, &a, &b).0, off, "A ({ma}) stays go-back-N");
        for s in [lk(&sim.a).stats(), lk(&sim.b).stats()] {
            assert_eq!((s.tx_sacks, s.sr_placed_out_of_order), (0, 0));
            assert!(s.tx_retransmitted > 0, "the loss drew retransmissions");
        }
        let frames = std::mem::take(&mut *frames.lock().unwrap());
        (frames, a.mr.addr(), b.mr.addr())
    };
    let (auto, auto_a, auto_b) = traced(SrMode::Auto);
    let (off, off_a, off_b) = traced(SrMode::Off);
    assert_eq!(auto.len(), off.len(), "as many frames");
    let (mut with_bit, mut requests) = (0, 0);
    for (i, ((from_a, fa), (_, fo))) in auto.iter().zip(&off).enumerate() {
        let (mut pa, data_a) = parse_frame(fa).expect("a RoCEv2 frame");
        let (mut po, data_o) = parse_frame(fo).expect("a RoCEv2 frame");
        let bth = pa.transport.bth;
        let request = !bth.opcode.is_response() && bth.opcode != Opcode::CNP;
        // Only A's requests carry the bit; B (Off) and A's responses never.
        assert_eq!(bth.sr_capable, *from_a && request, "frame {i}: {bth:?}");
        assert_eq!(fa[BTH_BYTE4] & 0x01, u8::from(bth.sr_capable));
        requests += usize::from(*from_a && request);
        with_bit += usize::from(bth.sr_capable);
        pa.transport.bth.sr_capable = false;
        // A RETH names the receiving side's MR.
        let (base_a, base_o) = if *from_a {
            (auto_b, off_b)
        } else {
            (auto_a, off_a)
        };
        if let (Some(ra), Some(ro)) = (pa.transport.reth.as_mut(), po.transport.reth.as_mut()) {
            ra.va -= base_a;
            ro.va -= base_o;
        }
        assert_eq!(pa, po, "frame {i} differs beyond the bit");
        assert!(data_a == data_o, "frame {i}: the payload differs");
    }
    assert!(with_bit > 0 && with_bit == requests);
}

/// A WRITE of many packets in flight while the requester switches: its
/// first packets go in go-back-N format (MIDDLE), the rest, and the
/// retransmissions of the lost older ones, in SR format (a FIRST with its
/// own RETH each). A go-back-N MIDDLE before the switch and the first SR
/// packet after it are lost; then a WRITE with immediate of many packets.
/// The responder sees both formats in one message and delivers every byte
/// exactly once: the data is right, one completion per WR in order, and
/// the immediate consumes exactly one receive WQE.
#[test]
fn a_switch_in_the_middle_of_a_write_with_drops_delivers_exactly_once() {
    // Slow enough that A sends many packets before B's first ACK comes.
    let link = LinkConfig {
        delay_ns: 20_000,
        ..Default::default()
    };
    let (mut sim, a, b) = setup(link, 21, SrMode::Auto, SrMode::Auto);
    let frames = record(&mut sim);
    let psn0 = (1u32 << 24) - 100;
    // Drop: the 6th packet of the first WRITE (a go-back-N MIDDLE, the
    // first time), and the first SR-format packet of that WRITE (a FIRST
    // at a later PSN), the first time each.
    let (mut dropped_middle, mut dropped_sr) = (false, false);
    sim.link.drop_when(move |to_b, frame| {
        let Ok((p, _)) = parse_frame(frame) else {
            return false;
        };
        let bth = p.transport.bth;
        if !to_b {
            return false;
        }
        if !dropped_middle && bth.psn == (psn0 + 5) & 0xff_ffff {
            assert_eq!(
                bth.opcode,
                Opcode::RC_RDMA_WRITE_MIDDLE,
                "sent before the switch"
            );
            dropped_middle = true;
            return true;
        }
        if !dropped_sr && bth.opcode == Opcode::RC_RDMA_WRITE_FIRST && bth.psn != psn0 {
            dropped_sr = true;
            return true;
        }
        false
    });
    let big = 200 << 10; // 200 packets at MTU 1024
    lk(&sim.a)
        .post_send(a.qpn, &write(1, &a, &b, 0, big))
        .unwrap();
    let imm_len = 64 << 10;
    for id in [100, 101] {
        let wr = RecvWr {
            wr_id: id,
            sg_list: vec![],
        };
        lk(&sim.b).post_recv(b.qpn, &wr).unwrap();
    }
    let wr = SendWr::new(
        2,
        WrOpcode::RdmaWriteWithImm {
            remote_addr: b.mr.addr() + (REGION + big) as u64,
            rkey: b.mr.rkey(),
            imm: 0xabcd,
        },
        vec![a.mr.sge(big, imm_len)],
    );
    lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    let (ca, cb) = run(&mut sim, 2, 1);
    // Let anything still in flight land: no second receive completion.
    let settle = sim.now + SEC / 10;
    let mut more = Vec::new();
    sim.run_until(settle, |s| {
        lk(&s.b).take_completions(&mut more);
        false
    });
    let ids: Vec<u64> = ca.iter().map(|c| c.wc.wr_id).collect();
    assert_eq!(ids, [1, 2]);
    assert!(ca.iter().all(|c| c.wc.status == WcStatus::Success));
    assert_eq!(cb.len(), 1, "one receive WQE consumed: {cb:?}");
    assert!(more.is_empty(), "{more:?}");
    let r = &cb[0].wc;
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.imm_data),
        (
            100,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            imm_len as u32,
            0xabcd
        )
    );
    let n = big + imm_len;
    // SAFETY: both WRITEs have completed.
    let got = unsafe { b.mr.to_vec(REGION, n) }.unwrap();
    assert!(got == pattern(21 ^ 1, REGION)[..n], "the data differs");
    // B's memory past the data is untouched.
    let after = unsafe { b.mr.to_vec(REGION + n, 4096) }.unwrap();
    assert!(after.iter().all(|&x| x == 0));
    let (sa, sb) = status(&sim, &a, &b);
    assert!(sa.requester && sb.responder, "{sa:?} {sb:?}");
    // Both formats of the first WRITE reached B.
    let frames = frames.lock().unwrap();
    let first_write =
        |p: u32| xroce_wire::psn_diff(p, psn0) >= 0 && xroce_wire::psn_diff(p, psn0) < 200;
    let (mut gbn_middle, mut sr_first) = (0, 0);
    for (_, f) in frames.iter().filter(|(from_a, _)| *from_a) {
        let (p, _) = parse_frame(f).unwrap();
        let bth = p.transport.bth;
        if first_write(bth.psn) {
            match bth.opcode {
                Opcode::RC_RDMA_WRITE_MIDDLE => gbn_middle += 1,
                Opcode::RC_RDMA_WRITE_FIRST if bth.psn != psn0 => sr_first += 1,
                _ => {}
            }
        }
    }
    assert!(
        gbn_middle > 5 && sr_first > 5,
        "go-back-N {gbn_middle}, SR {sr_first}"
    );
    assert!(dropped_middle_and_sr(&frames, psn0));
}

/// The PSN the test dropped as a go-back-N MIDDLE went again, in SR
/// format (a FIRST with a RETH).
fn dropped_middle_and_sr(frames: &[(bool, Vec<u8>)], psn0: u32) -> bool {
    let p5 = (psn0 + 5) & 0xff_ffff;
    let sent: Vec<Opcode> = frames
        .iter()
        .filter(|(from_a, _)| *from_a)
        .filter_map(|(_, f)| parse_frame(f).ok())
        .filter(|(p, _)| p.transport.bth.psn == p5)
        .map(|(p, _)| p.transport.bth.opcode)
        .collect();
    sent.first() == Some(&Opcode::RC_RDMA_WRITE_MIDDLE)
        && sent[1..].contains(&Opcode::RC_RDMA_WRITE_FIRST)
}

/// The responder placed a WRITE's first packet ahead of a hole, and the
/// requester, which never heard back (every ACK lost), goes back N in
/// go-back-N format: the hole fills, the placed FIRST is absorbed, and the
/// retry's go-back-N MIDDLE after it cannot be placed (the responder
/// knows no go-back-N continuation for a packet placed by its own RETH):
/// it is dropped as lost and acknowledged, the requester switches and
/// sends it again in SR format. Both WRITEs complete, the data once.
#[test]
fn a_go_back_n_retry_after_a_first_placed_ahead_is_sent_again_in_sr_format() {
    let (mut sim, a, b) = setup(LinkConfig::default(), 31, SrMode::Auto, SrMode::Auto);
    let frames = record(&mut sim);
    let psn0 = (1u32 << 24) - 100;
    // Lose PSN psn0 (the one-packet WRITE) the first time, and every
    // frame from B until it goes the second time (A's go-back-N retry).
    let mut p0_sent = 0;
    sim.link.drop_when(move |to_b, frame| {
        let Ok((p, _)) = parse_frame(frame) else {
            return false;
        };
        if to_b && p.transport.bth.psn == psn0 {
            p0_sent += 1;
            return p0_sent == 1;
        }
        !to_b && p0_sent < 2
    });
    lk(&sim.a)
        .post_send(a.qpn, &write(1, &a, &b, 0, 512))
        .unwrap();
    lk(&sim.a)
        .post_send(a.qpn, &write(2, &a, &b, 512, 8 << 10))
        .unwrap();
    let (ca, _) = run(&mut sim, 2, 0);
    let ids: Vec<u64> = ca.iter().map(|c| c.wc.wr_id).collect();
    assert_eq!(ids, [1, 2]);
    assert!(
        ca.iter().all(|c| c.wc.status == WcStatus::Success),
        "{ca:?}"
    );
    let n = 512 + (8 << 10);
    // SAFETY: both WRITEs have completed.
    let got = unsafe { b.mr.to_vec(REGION, n) }.unwrap();
    assert!(got == pattern(31 ^ 1, REGION)[..n], "the data differs");
    // PSN psn0 + 2 (the second packet of the 8-packet WRITE) went as a
    // go-back-N MIDDLE, again in the retry, and then in SR format.
    let p2 = (psn0 + 2) & 0xff_ffff;
    let sent: Vec<Opcode> = frames
        .lock()
        .unwrap()
        .iter()
        .filter(|(from_a, _)| *from_a)
        .filter_map(|(_, f)| parse_frame(f).ok())
        .filter(|(p, _)| p.transport.bth.psn == p2)
        .map(|(p, _)| p.transport.bth.opcode)
        .collect();
    let middles = sent
        .iter()
        .take_while(|&&o| o == Opcode::RC_RDMA_WRITE_MIDDLE)
        .count();
    assert!(
        middles >= 2 && sent[middles..].contains(&Opcode::RC_RDMA_WRITE_FIRST),
        "{sent:?}"
    );
    let (sa, sb) = status(&sim, &a, &b);
    assert!(sa.requester && sb.responder, "{sa:?} {sb:?}");
}
