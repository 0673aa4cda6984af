//! Selective repeat of READ responses at the requester (engine/sr_read.rs):
//! responses ahead of a lost one are placed at once and only the gap is
//! asked for again (the responder answers a READ request for part of a
//! READ it executed with that part alone); a lost re-request is asked for
//! again by the tail-loss probe; go-back-N (Off) resends everything from
//! the first loss on. Data verified, one completion per READ, in order.

use std::sync::{Arc, Mutex};

use xroce_transport::engine::completion::{Completion, WcOpcode, WcStatus};
use xroce_transport::engine::qp_attr::Mtu;
use xroce_transport::engine::sim::{
    connect_engines, pattern, EngineEndpoint, EngineHost, LinkConfig, PairParams, Sim,
};
use xroce_transport::engine::work::{SendWr, WrOpcode};
use xroce_transport::engine::{Engine, EngineStats, SrMode};
use xroce_wire::{parse_frame, psn_add, Opcode};

const SEC: u64 = 1_000_000_000;
const REGION: usize = 8 << 20;
/// A's first PSN: across the wrap.
const PSN_A: u32 = (1 << 24) - 20;

type EngineSim = Sim<Mutex<Engine>>;

fn lk(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    EngineHost::lock(m)
}

fn setup(mode: SrMode, seed: u64) -> (EngineSim, EngineEndpoint, EngineEndpoint) {
    let sim = Sim::engine_pair(LinkConfig::default(), seed);
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        psn_a: PSN_A,
        mr_len: 2 * REGION,
        timeout: 14,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    lk(&sim.a).set_selective_repeat(a.qpn, mode).unwrap();
    lk(&sim.b).set_selective_repeat(b.qpn, mode).unwrap();
    // SAFETY: no work request is posted yet.
    unsafe { b.mr.write(0, &pattern(seed, REGION)).unwrap() };
    (sim, a, b)
}

fn read(id: u64, a: &EngineEndpoint, b: &EngineEndpoint, off: usize, len: usize) -> SendWr {
    SendWr::new(
        id,
        WrOpcode::RdmaRead {
            remote_addr: b.mr.addr() + off as u64,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(REGION + off, len)],
    )
}

/// READ response frames B sent, by PSN, in order.
type Responses = Arc<Mutex<Vec<u32>>>;

/// Record B's READ responses; drop a response PSN while `drops` has a
/// count left for it (the first N times it goes).
fn impair(sim: &mut EngineSim, drops: Vec<(u32, u32)>) -> Responses {
    let sent: Responses = Arc::default();
    let s = sent.clone();
    sim.link.tap_frames(move |_, frame| {
        if let Ok((p, _)) = parse_frame(frame) {
            if is_read_response(p.transport.bth.opcode) {
                s.lock().unwrap().push(p.transport.bth.psn);
            }
        }
    });
    let mut drops = drops;
    sim.link.drop_when(move |to_b, frame| {
        let Ok((p, _)) = parse_frame(frame) else {
            return false;
        };
        if to_b || !is_read_response(p.transport.bth.opcode) {
            return false;
        }
        match drops
            .iter_mut()
            .find(|(psn, n)| *psn == p.transport.bth.psn && *n > 0)
        {
            Some((_, n)) => {
                *n -= 1;
                true
            }
            None => false,
        }
    });
    sent
}

fn is_read_response(o: Opcode) -> bool {
    matches!(
        o,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST
            | Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
            | Opcode::RC_RDMA_READ_RESPONSE_LAST
            | Opcode::RC_RDMA_READ_RESPONSE_ONLY
    )
}

/// Run until A has `want` completions (and a little longer: no more come).
fn run(sim: &mut EngineSim, want: usize) -> Vec<Completion> {
    let mut ca = Vec::new();
    let ok = sim.run_until(sim.now + 10 * SEC, |s| {
        lk(&s.a).take_completions(&mut ca);
        ca.len() >= want
    });
    assert!(
        ok,
        "timed out: {} of {want}; A {:?}",
        ca.len(),
        lk(&sim.a).stats()
    );
    let settle = sim.now + SEC / 20;
    sim.run_until(settle, |s| {
        lk(&s.a).take_completions(&mut ca);
        false
    });
    ca
}

/// READs of `lens` bytes back to back (WR ids 1, 2, ...), some response
/// PSNs (relative to A's first PSN) dropped; everything verified. Returns
/// the responses B sent and A's counters.
fn reads(mode: SrMode, lens: &[usize], drops: &[(u32, u32)]) -> (Vec<u32>, EngineStats) {
    let (mut sim, a, b) = setup(mode, 5);
    let drops = drops.iter().map(|&(k, n)| (psn_add(PSN_A, k), n)).collect();
    let sent = impair(&mut sim, drops);
    let mut off = 0;
    for (i, &len) in lens.iter().enumerate() {
        lk(&sim.a)
            .post_send(a.qpn, &read(i as u64 + 1, &a, &b, off, len))
            .unwrap();
        off += len;
    }
    let ca = run(&mut sim, lens.len());
    let got: Vec<_> = ca
        .iter()
        .map(|c| (c.wc.wr_id, c.wc.status, c.wc.opcode))
        .collect();
    let want: Vec<_> = (1..=lens.len() as u64)
        .map(|id| (id, WcStatus::Success, WcOpcode::RdmaRead))
        .collect();
    assert_eq!(got, want, "{mode}: one completion per READ, in order");
    // SAFETY: every READ has completed.
    let data = unsafe { a.mr.to_vec(REGION, off) }.unwrap();
    assert!(
        data == pattern(5, REGION)[..off],
        "{mode}: the data differs"
    );
    let sent = std::mem::take(&mut *sent.lock().unwrap());
    let stats = lk(&sim.a).stats();
    (sent, stats)
}

/// A 64-packet READ loses its responses 10 and 40: with selective
/// repeat the 62 others are placed as they come and exactly those two are
/// asked for and sent again; go-back-N resends everything after the first
/// loss.
#[test]
fn read_responses_ahead_are_placed_and_only_the_gaps_are_asked_for() {
    let lens = [64 << 10];
    let drops = [(10, 1), (40, 1)];
    let (sent, st) = reads(SrMode::On, &lens, &drops);
    assert_eq!(sent.len(), 64 + 2, "responses sent: {sent:?}");
    let again: Vec<u32> = sent[64..].to_vec();
    assert_eq!(again, [psn_add(PSN_A, 10), psn_add(PSN_A, 40)]);
    assert_eq!(st.sr_read_gaps_requested, 2, "{st:?}");
    // 0..10 come in order, 11..40 and 41..64 ahead.
    assert_eq!(st.sr_read_placed_out_of_order, 29 + 23, "{st:?}");

    let (gbn, gst) = reads(SrMode::Off, &lens, &drops);
    assert!(
        gbn.len() >= 64 + 50,
        "go-back-N sent {} responses",
        gbn.len()
    );
    assert_eq!(gst.sr_read_placed_out_of_order, 0);
}

/// A READ of 4,096 packets, four times the SACK's reach, loses its
/// response 3: the 4,092 after it are placed ahead, however far, and only
/// that one is sent again, while the READ is still under way. Before,
/// responses beyond 1,024 were refused and the READ went back N; and B,
/// asked for the gap, went back to it and sent again the 177 responses it
/// had sent since.
#[test]
fn a_read_longer_than_the_sack_reach_asks_only_for_its_gap() {
    let (sent, st) = reads(SrMode::On, &[4 << 20], &[(3, 1)]);
    assert_eq!(sent.len(), 4096 + 1, "responses sent; {st:?}");
    let gap = psn_add(PSN_A, 3);
    assert_eq!(sent.iter().filter(|&&p| p == gap).count(), 2);
    let again = sent.iter().rposition(|&p| p == gap).unwrap();
    assert!(again < 4096, "the gap went before the READ's end ({again})");
    assert_eq!(st.sr_read_gaps_requested, 1, "{st:?}");
    // What came between the loss and the gap's answer was placed ahead,
    // nothing arrived twice.
    assert!(st.sr_read_placed_out_of_order > 0, "{st:?}");
    assert_eq!(st.rx_duplicate, 0, "{st:?}");
}

/// The same agreed in band (Auto): the first response switches A's
/// requester, the rest goes as with On.
#[test]
fn in_band_agreement_covers_read_responses_too() {
    let (sent, st) = reads(SrMode::Auto, &[64 << 10], &[(10, 1), (40, 1)]);
    assert_eq!(sent.len(), 64 + 2, "responses sent: {sent:?}");
    assert_eq!(st.sr_read_gaps_requested, 2, "{st:?}");
}

/// Three READs: a gap's response lost twice (its first transmission and
/// the answer to the re-request) is asked for again by the tail-loss
/// probe; a READ's lost last packet with the next READ's responses ahead
/// of it is a gap like any other; the last READ's lost last packet
/// (nothing ahead of it) comes back through the probe as before.
#[test]
fn a_lost_gap_answer_and_a_lost_last_response_are_asked_for_again() {
    let lens = [32 << 10, 8 << 10, 16 << 10];
    // READ 1: PSNs 0..32, READ 2: 32..40, READ 3: 40..56.
    let drops = [(5, 2), (6, 1), (39, 1), (44, 1), (55, 1)];
    let (sent, st) = reads(SrMode::On, &lens, &drops);
    // Each lost transmission sent once more, nothing else: the gaps
    // [5, 7), 39 and 44 asked for, 5 again by the probe, the last packet
    // (55) by the probe too (the READ's rest from there).
    assert_eq!(sent.len(), 56 + 6, "{sent:?}");
    assert!(st.sr_read_gaps_requested >= 4, "{st:?}");
    assert_eq!(st.retries_started, 0, "no going back: {st:?}");
}

/// READs of one packet each and a short last packet: the offset of a
/// response placed ahead follows from its PSN, a READ's last response is
/// checked against its length.
#[test]
fn short_reads_with_losses_complete_in_order() {
    let lens = [100, 1024, 3000, 1, 5000, 700];
    let drops = [(1, 1), (3, 1), (6, 1), (8, 1)];
    let (_, st) = reads(SrMode::On, &lens, &drops);
    assert_eq!(st.rx_bad_response, 0, "{st:?}");
}

/// An atomic whose answer is lost, then a READ whose responses arrive
/// (one of them lost): the READ's responses are placed behind the atomic;
/// the probe sends the atomic again (the responder answers from its
/// replay cache: executed once), then the READ's gap is asked for. Both
/// complete in order, the atomic's original value and the data right.
#[test]
fn a_read_behind_an_atomic_whose_answer_was_lost() {
    let (mut sim, a, b) = setup(SrMode::On, 9);
    let mut atomic_acks = 1;
    let gap = psn_add(PSN_A, 1 + 3);
    let mut gap_drops = 1;
    sim.link.drop_when(move |to_b, frame| {
        let Ok((p, _)) = parse_frame(frame) else {
            return false;
        };
        let o = p.transport.bth.opcode;
        if to_b {
            return false;
        }
        if o == Opcode::RC_ATOMIC_ACKNOWLEDGE && atomic_acks > 0 {
            atomic_acks -= 1;
            return true;
        }
        if is_read_response(o) && p.transport.bth.psn == gap && gap_drops > 0 {
            gap_drops -= 1;
            return true;
        }
        false
    });
    let counter = 2 * REGION - 8;
    let add = SendWr::new(
        1,
        WrOpcode::AtomicFetchAndAdd {
            remote_addr: b.mr.addr() + counter as u64,
            rkey: b.mr.rkey(),
            add: 7,
        },
        vec![a.mr.sge(0, 8)],
    );
    lk(&sim.a).post_send(a.qpn, &add).unwrap();
    lk(&sim.a)
        .post_send(a.qpn, &read(2, &a, &b, 0, 8 << 10))
        .unwrap();
    let ca = run(&mut sim, 2);
    let got: Vec<_> = ca.iter().map(|c| (c.wc.wr_id, c.wc.status)).collect();
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    // SAFETY: both have completed.
    let (orig, after, data) = unsafe {
        (
            a.mr.to_vec(0, 8).unwrap(),
            b.mr.to_vec(counter, 8).unwrap(),
            a.mr.to_vec(REGION, 8 << 10).unwrap(),
        )
    };
    assert_eq!(u64::from_ne_bytes(orig.try_into().unwrap()), 0);
    assert_eq!(
        u64::from_ne_bytes(after.try_into().unwrap()),
        7,
        "executed once"
    );
    assert!(data == pattern(9, REGION)[..8 << 10]);
    let st = lk(&sim.a).stats();
    assert!(st.sr_read_placed_out_of_order > 0, "{st:?}");
}

/// A READ loses two responses, 30 packets apart (less than a round trip
/// of them): each gap is asked for as soon as a response beyond it
/// arrives, both before the first answer comes back. Asked for only when
/// the completer reached it, the second waited for the answer to the
/// first, and for everything queued ahead of that answer: a round trip
/// and a queue per loss.
#[test]
fn every_gap_is_asked_for_when_seen_not_when_the_completer_reaches_it() {
    let (mut sim, a, b) = setup(SrMode::On, 11);
    let lost = [10, 40].map(|k| psn_add(PSN_A, k));
    // (A's READ request or B's response, PSN), in the order put on the link.
    let log: Arc<Mutex<Vec<(bool, u32)>>> = Arc::default();
    let l = log.clone();
    sim.link.tap_frames(move |_, frame| {
        if let Ok((p, _)) = parse_frame(frame) {
            let o = p.transport.bth.opcode;
            let request = o == Opcode::RC_RDMA_READ_REQUEST;
            if request || is_read_response(o) {
                l.lock().unwrap().push((request, p.transport.bth.psn));
            }
        }
    });
    let mut drops = lost.map(|p| (p, 1));
    sim.link.drop_when(move |to_b, frame| {
        let Ok((p, _)) = parse_frame(frame) else {
            return false;
        };
        if to_b || !is_read_response(p.transport.bth.opcode) {
            return false;
        }
        let psn = p.transport.bth.psn;
        drops.iter_mut().any(|(q, n)| {
            let hit = *q == psn && *n > 0;
            *n -= u32::from(hit);
            hit
        })
    });
    read_256_packets(&mut sim, &a, &b, 11);

    let log = std::mem::take(&mut *log.lock().unwrap());
    let responses = log.iter().filter(|(req, _)| !req).count();
    assert_eq!(responses, 256 + 2, "each lost response once more");
    let asks: Vec<u32> = log.iter().skip(1).filter(|e| e.0).map(|e| e.1).collect();
    assert_eq!(asks, lost, "one request per gap, in order");
    let first_answer = log.iter().rposition(|&e| e == (false, lost[0])).unwrap();
    let last_ask = log.iter().rposition(|&(req, _)| req).unwrap();
    assert!(
        last_ask < first_answer,
        "every gap asked before the first was answered: {:?}",
        &log[first_answer.min(last_ask)..=first_answer.max(last_ask)]
    );
    let st = lk(&sim.a).stats();
    assert_eq!(
        (st.sr_read_gaps_requested, st.retries_started),
        (2, 0),
        "{st:?}"
    );
}

/// The responder's host stalls for 5 ms with a READ's 256 responses
/// queued: nothing is lost, but nothing arrives for longer than the
/// tail-loss probe waits. Each probe asks for the READ's last response
/// alone, one packet sent again; asking for the rest from the completer's
/// PSN made the responder execute the READ again, 256 packets a probe
/// (before: 512 duplicates here, 2,560 without the warm-up READ's
/// round-trip estimate).
#[test]
fn a_probe_over_late_responses_asks_for_the_last_one_alone() {
    let (mut sim, a, b) = setup(SrMode::On, 13);
    // A round-trip estimate first: with one, a second probe that draws
    // nothing for longer than the round trip goes further (it sent a
    // WRITE's every unacknowledged packet again, and a READ's rest).
    lk(&sim.a)
        .post_send(a.qpn, &read(9, &a, &b, 0, 1024))
        .unwrap();
    assert_eq!(run(&mut sim, 1).len(), 1);
    let sent = impair(&mut sim, vec![]);
    let stall = sim.now + 5_000_000;
    sim.link.stall_until(false, stall);
    read_256_packets(&mut sim, &a, &b, 13);
    let st = lk(&sim.a).stats();
    let probes = st.tx_retransmitted;
    assert!(probes >= 1, "the probe fired: {st:?}");
    let sent = std::mem::take(&mut *sent.lock().unwrap());
    // After the warm-up READ's one PSN.
    let last = psn_add(PSN_A, 256);
    assert_eq!(
        sent.len() as u64,
        256 + probes,
        "one response again per probe: {st:?}"
    );
    assert!(sent[256..].iter().all(|&p| p == last), "{:?}", &sent[256..]);
    assert_eq!(st.retries_started, 0, "{st:?}");
}

/// One READ of 256 packets from `b`'s region (written from `seed`) to
/// `a`'s: it completes, and the data is right.
fn read_256_packets(sim: &mut EngineSim, a: &EngineEndpoint, b: &EngineEndpoint, seed: u64) {
    let len = 256 << 10;
    lk(&sim.a).post_send(a.qpn, &read(1, a, b, 0, len)).unwrap();
    let ca = run(sim, 1);
    assert_eq!(ca.len(), 1);
    assert_eq!(ca[0].wc.status, WcStatus::Success);
    // SAFETY: the READ has completed.
    let data = unsafe { a.mr.to_vec(REGION, len) }.unwrap();
    assert!(data == pattern(seed, REGION)[..len], "the data differs");
}
