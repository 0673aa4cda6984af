//! Property tests of the engine against the semantics of RDMA verbs.
//!
//! A [`Track`] follows every WR posted to a QP and checks each completion
//! as it is polled:
//! - it names a WR posted to that QP and not yet completed: no completion
//!   without a WR, none twice, none for a WR that a RESET discarded;
//! - send completions come in posting order: the WRs a completion skips
//!   over are unsignalled ones that succeeded silently, and an unsignalled
//!   WR never completes successfully; receive completions come in posting
//!   order (one per receive WR);
//! - on an RC queue, after the first error only WR_FLUSH_ERR follows, and
//!   once the QP is known to be in ERR no WR succeeds;
//! - [`flush_all`]: after ERR, every outstanding WR, send and receive,
//!   has completed exactly once and every unsignalled WR is accounted for.
//!
//! On top of that:
//! - `rc_data_exactly_once`: SEND/WRITE/READ/atomics both ways over a link
//!   with loss, duplication, reordering, CE marks and corruption: every WR
//!   succeeds, the bytes land exactly where they belong (whole destination
//!   regions are compared), each receive gets exactly one message (spare
//!   receives stay unused), READs bring back the remote bytes, atomics
//!   apply exactly once (FETCH_ADD/CMP_SWAP sequences return exactly the
//!   running value and leave exactly the final one);
//! - `errors_flush_everything_once`: bad lkeys and rkeys, out-of-bounds
//!   addresses, short receive buffers, missing receives (RNR), retry
//!   exhaustion and ERR forced mid-flight: each WR completes once, with a
//!   status its fault allows;
//! - `random_verbs_sequences`: every verbs call's result against a model of
//!   the QP state machine (IBTA 10.3.1) and of the posting rules;
//! - the packet fuzzers (random bytes, mutated and forged frames) never
//!   panic the engine and keep the completion invariants;
//! - `same_seed_same_run`: one seed fixes every frame on the link and
//!   every MR key; another seed gives another run.

use std::collections::{HashMap, HashSet, VecDeque};

use proptest::prelude::*;
use xroce::engine::AsyncEvent;
use xroce::verbs::sim::{connect_pair, sim_pair, Endpoint, LinkConfig, PairParams, Sim};
use xroce::verbs::*;
use xroce_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, FrameRepr, Gid,
    HeaderSet, Opcode, RethRepr, Syndrome, TransportRepr,
};

use xroce::engine::sim::pattern;

const MS: u64 = 1_000_000;

// ---------------------------------------------------------------------------
// The completion tracker

#[derive(Debug, Clone, Copy)]
struct Posted {
    wr_id: u64,
    signaled: bool,
    opcode: WcOpcode,
}

/// Every WR posted to one QP and every completion it got; see the module
/// docs for what [`Track::check`] enforces.
struct Track {
    name: String,
    qpn: u32,
    /// RC: errors take the QP to ERR, so the first error on a queue is
    /// followed only by flushes.
    rc: bool,
    next_id: u64,
    /// Posted send WRs not yet completed or retired.
    sq: VecDeque<Posted>,
    /// Posted receive WRs not yet completed.
    rq: VecDeque<u64>,
    posted: HashSet<u64>,
    /// WRs a RESET removed without a completion.
    discarded: HashSet<u64>,
    sq_failed: bool,
    rq_failed: bool,
    /// The QP is known to be in ERR (every completion polled before that
    /// was checked): nothing may succeed any more.
    in_err: bool,
    /// Send completions in order, with the WR each one is for.
    sends: Vec<(Posted, Wc)>,
    recvs: Vec<Wc>,
    /// Unsignalled WRs retired by a later completion.
    retired_silently: usize,
}

impl Track {
    fn new(name: &str, qpn: u32, id_base: u64, rc: bool) -> Self {
        Self {
            name: name.to_string(),
            qpn,
            rc,
            next_id: id_base,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            posted: HashSet::new(),
            discarded: HashSet::new(),
            sq_failed: false,
            rq_failed: false,
            in_err: false,
            sends: Vec::new(),
            recvs: Vec::new(),
            retired_silently: 0,
        }
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Note a send WR the QP accepted.
    fn record_send(&mut self, wr_id: u64, signaled: bool, opcode: WcOpcode) {
        assert!(self.posted.insert(wr_id), "wr_id reused");
        self.sq.push_back(Posted {
            wr_id,
            signaled,
            opcode,
        });
    }

    fn record_recv(&mut self, wr_id: u64) {
        assert!(self.posted.insert(wr_id), "wr_id reused");
        self.rq.push_back(wr_id);
    }

    /// Post `wr` (under a fresh wr_id) and track it if accepted.
    fn post_send(&mut self, qp: &QueuePair, mut wr: SendWr) -> Result<u64, VerbsError> {
        wr.wr_id = self.fresh_id();
        qp.post_send(&wr)?;
        self.record_send(
            wr.wr_id,
            wr.flags.contains(SendFlags::SIGNALED),
            wr.opcode.wc_opcode(),
        );
        Ok(wr.wr_id)
    }

    fn post_recv(&mut self, qp: &QueuePair, sg_list: Vec<Sge>) -> Result<u64, VerbsError> {
        let wr_id = self.fresh_id();
        qp.post_recv(&RecvWr { wr_id, sg_list })?;
        self.record_recv(wr_id);
        Ok(wr_id)
    }

    /// The QP went to RESET: its WRs are gone without completions.
    fn reset(&mut self) {
        self.discarded.extend(self.sq.drain(..).map(|p| p.wr_id));
        self.discarded.extend(self.rq.drain(..));
        self.sq_failed = false;
        self.rq_failed = false;
        self.in_err = false;
    }

    fn unknown(&self, id: u64) -> &'static str {
        if self.discarded.contains(&id) {
            "completion of a WR that RESET discarded"
        } else if self.posted.contains(&id) {
            "second completion of a WR"
        } else {
            "completion of a WR never posted to this QP"
        }
    }

    /// Check one completion against everything posted and completed so far.
    fn check(&mut self, wc: &Wc) -> Result<(), String> {
        let why = |name: &str, what: &str| format!("{name}: {what}: {wc:?}");
        if wc.qp_num != self.qpn {
            return Err(why(&self.name, "completion for another QP"));
        }
        let id = wc.wr_id;
        if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            match self.rq.iter().position(|&r| r == id) {
                Some(0) => {
                    self.rq.pop_front();
                }
                Some(k) => {
                    return Err(why(
                        &self.name,
                        &format!("receive completed before {k} receives posted earlier"),
                    ))
                }
                None => return Err(why(&self.name, self.unknown(id))),
            }
            if wc.status == WcStatus::Success {
                if self.in_err {
                    return Err(why(&self.name, "receive succeeded with the QP in ERR"));
                }
                if self.rc && self.rq_failed {
                    return Err(why(&self.name, "receive succeeded after an error"));
                }
            } else {
                if self.rc && self.rq_failed && wc.status != WcStatus::WrFlushErr {
                    return Err(why(&self.name, "a second error that is not a flush"));
                }
                self.rq_failed = true;
            }
            self.recvs.push(*wc);
            return Ok(());
        }
        let Some(k) = self.sq.iter().position(|p| p.wr_id == id) else {
            return Err(why(&self.name, self.unknown(id)));
        };
        let p = self.sq[k];
        if wc.opcode != p.opcode {
            return Err(why(&self.name, &format!("opcode of a {:?} WR", p.opcode)));
        }
        for s in self.sq.iter().take(k) {
            if s.signaled {
                return Err(why(
                    &self.name,
                    &format!(
                        "signalled WR {} (posted earlier) has no completion",
                        s.wr_id
                    ),
                ));
            }
            if self.sq_failed {
                return Err(why(
                    &self.name,
                    &format!("unsignalled WR {} was not flushed after an error", s.wr_id),
                ));
            }
        }
        self.retired_silently += k;
        self.sq.drain(..=k);
        match wc.status {
            WcStatus::Success => {
                if !p.signaled {
                    return Err(why(&self.name, "success completion of an unsignalled WR"));
                }
                if self.in_err {
                    return Err(why(&self.name, "WR succeeded with the QP in ERR"));
                }
                if self.rc && self.sq_failed {
                    return Err(why(&self.name, "WR succeeded after an error"));
                }
            }
            WcStatus::WrFlushErr => self.sq_failed = true,
            _ => {
                if self.rc && self.sq_failed {
                    return Err(why(&self.name, "a second error that is not a flush"));
                }
                self.sq_failed = true;
            }
        }
        self.sends.push((p, *wc));
        Ok(())
    }
}

/// Poll `cq` dry, checking each completion with the track of its QP.
fn drain_cq(cq: &CompletionQueue, tracks: &mut [&mut Track]) -> usize {
    let mut buf = [Wc::default(); 32];
    let mut total = 0;
    loop {
        let n = cq
            .poll(&mut buf)
            .expect("CQ overflow (size the CQ for the test)");
        if n == 0 {
            return total;
        }
        total += n;
        for wc in &buf[..n] {
            let t = tracks
                .iter_mut()
                .find(|t| t.qpn == wc.qp_num)
                .unwrap_or_else(|| panic!("completion for a QP nobody created: {wc:?}"));
            if let Err(e) = t.check(wc) {
                panic!("{e}");
            }
        }
    }
}

/// A connected endpoint and its tracker.
struct Side {
    ep: Endpoint,
    t: Track,
}

impl Side {
    fn new(ep: Endpoint, name: &str, id_base: u64) -> Self {
        let qpn = ep.qp.qp_num();
        Self {
            ep,
            t: Track::new(name, qpn, id_base, true),
        }
    }
    fn send(&mut self, wr: SendWr) -> Result<u64, VerbsError> {
        self.t.post_send(&self.ep.qp, wr)
    }
    fn recv(&mut self, sg_list: Vec<Sge>) -> Result<u64, VerbsError> {
        self.t.post_recv(&self.ep.qp, sg_list)
    }
    fn drain(&mut self) -> usize {
        drain_cq(&self.ep.cq, &mut [&mut self.t])
    }
}

fn to_err() -> (QpAttr, QpAttrMask) {
    (
        QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        },
        QpAttrMask::STATE,
    )
}

/// Move every QP to ERR and check that every outstanding WR completes
/// exactly once: receives and signalled sends by their own completions,
/// unsignalled sends by a later one (a signalled WR posted in ERR flushes
/// at once and closes the account).
fn flush_all(sim: &mut Sim, sides: &mut [&mut Side]) {
    for s in sides.iter_mut() {
        s.drain();
        let (attr, mask) = to_err();
        s.ep.qp.modify(&attr, mask).expect("any state -> ERR");
        s.t.in_err = true;
    }
    let until = sim.now + MS;
    sim.run_until(until, |_| false);
    for s in sides.iter_mut() {
        s.drain();
        s.send(SendWr::new(0, WrOpcode::Send, vec![]))
            .expect("posting to a QP in ERR is allowed");
        s.drain();
        assert!(
            s.t.sq.is_empty() && s.t.rq.is_empty(),
            "{}: in ERR but never completed: sends {:?}, receives {:?}",
            s.t.name,
            s.t.sq,
            s.t.rq
        );
        let last = s.t.sends.last().expect("the closing WR completed").1;
        assert_eq!(last.status, WcStatus::WrFlushErr);
    }
    let until = sim.now + MS;
    sim.run_until(until, |_| false);
    for s in sides.iter_mut() {
        assert_eq!(s.drain(), 0, "{}: completions after the flush", s.t.name);
        assert_eq!(s.ep.qp.state(), QpState::Err);
    }
}

#[test]
fn track_catches_lost_duplicated_and_invented_completions() {
    // The checker itself must not be vacuous: feed it completion streams
    // of an engine that drops, duplicates, reorders or invents them.
    let wc = |wr_id, status, opcode| Wc {
        wr_id,
        status,
        opcode,
        qp_num: 0x11,
        ..Default::default()
    };
    let ok = WcStatus::Success;
    let fresh = || {
        let mut t = Track::new("t", 0x11, 0, true);
        t.record_send(1, true, WcOpcode::RdmaWrite);
        t.record_send(2, false, WcOpcode::RdmaWrite);
        t.record_send(3, true, WcOpcode::RdmaWrite);
        t.record_recv(10);
        t.record_recv(11);
        t
    };
    let w = WcOpcode::RdmaWrite;
    let r = WcOpcode::Recv;
    let flush = WcStatus::WrFlushErr;
    // The good stream passes.
    let mut t = fresh();
    for c in [wc(1, ok, w), wc(10, ok, r), wc(3, ok, w), wc(11, flush, r)] {
        t.check(&c).unwrap();
    }
    assert_eq!(t.retired_silently, 1);
    let bad: &[&[Wc]] = &[
        &[wc(3, ok, w)],                                    // 1's completion dropped
        &[wc(1, ok, w), wc(1, ok, w)],                      // duplicated
        &[wc(99, ok, w)],                                   // invented
        &[wc(2, ok, w)],                                    // unsignalled success
        &[wc(11, ok, r)],                                   // receives out of order
        &[wc(10, ok, r), wc(10, ok, r)],                    // a receive twice
        &[wc(1, ok, WcOpcode::Send)],                       // wrong WR's opcode
        &[wc(1, WcStatus::RemAccessErr, w), wc(3, ok, w)],  // success after error
        &[wc(1, flush, w), wc(3, flush, w)],                // unsignalled 2 not flushed
        &[wc(1, flush, w), wc(2, WcStatus::LocProtErr, w)], // error after flush
        &[Wc {
            qp_num: 0x12,
            ..wc(1, ok, w)
        }],
    ];
    for (i, stream) in bad.iter().enumerate() {
        let mut t = fresh();
        let r: Result<Vec<()>, String> = stream.iter().map(|c| t.check(c)).collect();
        assert!(r.is_err(), "bad stream {i} passed");
    }
    let mut t = fresh();
    t.in_err = true;
    assert!(t.check(&wc(1, ok, w)).is_err(), "success in ERR passed");
    let mut t = fresh();
    t.reset();
    assert!(t.check(&wc(1, flush, w)).is_err(), "completion after RESET");
}

// ---------------------------------------------------------------------------
// Packet fuzzing with traffic in flight

/// A connected pair with traffic posted (signalled and unsignalled) and
/// some packets in flight, over a lossy link.
fn setup(seed: u64) -> (Sim, Side, Side) {
    let mut sim = sim_pair(LinkConfig::lossy(0.05), seed);
    let p = PairParams {
        mr_len: 1 << 16,
        psn_a: 0xff_fff0,
        psn_b: 5,
        rnr_retry: 3,
        retry_cnt: 3,
        timeout: 4,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    let mut a = Side::new(a, "A", 1 << 32);
    let mut b = Side::new(b, "B", 2 << 32);
    for _ in 0..4 {
        let sge = b.ep.mr.sge(0, 8192);
        b.recv(vec![sge]).unwrap();
        let sge = a.ep.mr.sge(0, 8192);
        a.recv(vec![sge]).unwrap();
    }
    let (b_addr, b_rkey) = (b.ep.mr.addr(), b.ep.mr.rkey());
    let ops = [
        WrOpcode::Send,
        WrOpcode::RdmaWrite {
            remote_addr: b_addr + 100,
            rkey: b_rkey,
        },
        WrOpcode::RdmaRead {
            remote_addr: b_addr,
            rkey: b_rkey,
        },
        WrOpcode::AtomicFetchAndAdd {
            remote_addr: b_addr + 64,
            rkey: b_rkey,
            add: 1,
        },
    ];
    for (i, op) in ops.iter().enumerate() {
        let len = if op.is_atomic() { 8 } else { 5000 };
        // The WRITE is unsignalled: the READ after it accounts for it.
        let flags = if i == 1 {
            SendFlags::empty()
        } else {
            SendFlags::SIGNALED
        };
        let sge = a.ep.mr.sge(16384, len);
        a.send(SendWr::new(0, *op, vec![sge]).flags(flags)).unwrap();
        let op = WrOpcode::RdmaWrite {
            remote_addr: a.ep.mr.addr() + 30000,
            rkey: a.ep.mr.rkey(),
        };
        let flags = if i % 2 == 0 {
            SendFlags::empty()
        } else {
            SendFlags::SIGNALED
        };
        let sge = b.ep.mr.sge(16384, 3000);
        b.send(SendWr::new(0, op, vec![sge]).flags(flags)).unwrap();
    }
    // Get some packets in flight.
    for _ in 0..5 {
        sim.step();
    }
    (sim, a, b)
}

/// A connected pair plus valid frames both engines produced (they are
/// also put on the link, so the engines' state stays consistent).
fn setup_with_corpus(seed: u64) -> (Sim, Side, Side, Vec<(bool, Vec<u8>)>) {
    let (mut sim, a, b) = setup(seed);
    let mut corp = Vec::new();
    let mut buf = vec![0u8; 9000];
    for _ in 0..50 {
        for (to_b, dev) in [(true, sim.a.clone()), (false, sim.b.clone())] {
            while let Some(n) = dev.poll_transmit_frame(sim.now, &mut buf) {
                corp.push((to_b, buf[..n].to_vec()));
                sim.link.send(to_b, &buf[..n], sim.now);
            }
        }
        if corp.len() >= 16 {
            break;
        }
        sim.step();
    }
    (sim, a, b, corp)
}

/// Let the dust settle (checking completions as they come), then flush.
fn finish(sim: &mut Sim, a: &mut Side, b: &mut Side) {
    let until = sim.now + 5 * MS;
    sim.run_until(until, |_| {
        a.drain();
        b.drain();
        false
    });
    flush_all(sim, &mut [a, b]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..16), seed in 0u64..4) {
        let (mut sim, mut a, mut b) = setup(seed);
        for f in &frames {
            sim.a.handle_frame(f, sim.now);
            sim.b.handle_frame(f, sim.now);
        }
        finish(&mut sim, &mut a, &mut b);
    }

    #[test]
    fn mutated_valid_frames(muts in proptest::collection::vec((any::<usize>(), any::<usize>(), any::<u8>(), 0u8..4), 1..24), seed in 0u64..4) {
        let (mut sim, mut a, mut b, corp) = setup_with_corpus(seed);
        prop_assert!(!corp.is_empty());
        for (pick, pos, val, kind) in muts {
            let (to_b, mut f) = corp[pick % corp.len()].clone();
            match kind {
                0 => { let i = pos % f.len(); f[i] = val; }
                1 => { let i = BTH_OFFSET + pos % 40; if i < f.len() { f[i] ^= val | 1; } }
                2 => f.truncate(pos % (f.len() + 1)),
                _ => f.extend(std::iter::repeat_n(val, pos % 64)),
            }
            let _ = xroce_wire::icrc::fill_frame(&mut f); // not every mutant has one
            let dev = if to_b { &sim.b } else { &sim.a };
            dev.handle_frame(&f, sim.now);
            // Replays of the unmodified frame (duplicates) as well.
            let (to_b, f) = &corp[pos % corp.len()];
            let dev = if *to_b { &sim.b } else { &sim.a };
            dev.handle_frame(f, sim.now);
            a.drain();
            b.drain();
        }
        finish(&mut sim, &mut a, &mut b);
    }

    #[test]
    fn structured_random_headers(
        pkts in proptest::collection::vec((
            prop_oneof![0u8..0x18, Just(0x81u8), any::<u8>()],
            any::<bool>(),
            prop_oneof![any::<u32>(), 0u32..32, 0xff_ffe0u32..0x100_0000],
            any::<u64>(), any::<u32>(), any::<u32>(), any::<u8>(),
            0usize..4200,
            any::<bool>(),
        ), 1..24),
        seed in 0u64..4,
    ) {
        let (mut sim, mut a, mut b) = setup(seed);
        let mut buf = vec![0u8; 9000];
        for (opcode, to_b, psn, va, key, len, syn, plen, use_real_key) in pkts {
            let dst = if to_b { &b.ep } else { &a.ep };
            let rkey = if use_real_key { dst.mr.rkey() } else { key };
            let va = if use_real_key { dst.mr.addr() + (va % 70000) } else { va };
            let (from, to) = if to_b { (1, 2) } else { (2, 1) };
            let mut t = every_header(dst.qp.qp_num(), psn & 0xff_ffff, va, rkey, key);
            t.bth.ack_req = psn & 1 == 0;
            t.reth = Some(RethRepr { va, rkey, dma_len: len });
            t.aeth = Some(AethRepr { syndrome: Syndrome::from_u8(syn), msn: len & 0xff_ffff });
            let Some(mut f) = forge(from, to, opcode, t) else { continue };
            f.ip.set_ecn(syn & 3);
            let Ok(n) = xroce_wire::emit_frame(&f, &vec![0x5a; plen], &mut buf) else { continue };
            let dev = if to_b { &sim.b } else { &sim.a };
            dev.handle_frame(&buf[..n], sim.now);
            sim.step();
            a.drain();
            b.drain();
        }
        finish(&mut sim, &mut a, &mut b);
    }
}

/// Where the BTH starts in the engine's (untagged IPv4) frames.
const BTH_OFFSET: usize =
    xroce_wire::eth::HEADER_LEN + xroce_wire::ipv4::HEADER_LEN + xroce_wire::udp::HEADER_LEN;

/// A transport repr holding every extension header (values from the
/// arguments), for [`forge`] to cut down to an opcode's.
fn every_header(dest_qp: u32, psn: u32, va: u64, rkey: u32, key: u32) -> TransportRepr {
    let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, dest_qp, psn));
    t.deth = Some(DethRepr {
        qkey: key,
        src_qp: key >> 8,
    });
    t.feth = Some(FethRepr {
        selectivity: 0,
        placement_type: 0,
    });
    t.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: key,
    });
    t.atomic_eth = Some(AtomicEthRepr {
        va,
        rkey,
        swap_add: va,
        compare: 0,
    });
    t.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK,
        msn: key & 0xff_ffff,
    });
    t.atomic_ack_eth = Some(AtomicAckEthRepr { orig_data: va });
    t.imm_data = Some(key);
    t.invalidate_rkey = Some(key);
    t
}

/// A frame from sim endpoint `from` (1 or 2: MAC 02::0n, IP 10.0.0.n) to
/// `to` with opcode byte `opcode` (`None` if the codec does not carry it)
/// and, of `t`'s headers, exactly those the opcode has.
fn forge(from: u8, to: u8, opcode: u8, mut t: TransportRepr) -> Option<FrameRepr> {
    let op = Opcode::from_u8(opcode).ok()?;
    let has = |h: HeaderSet| op.headers().contains(h);
    t.bth.opcode = op;
    t.deth = t.deth.filter(|_| has(HeaderSet::DETH));
    t.feth = t.feth.filter(|_| has(HeaderSet::FETH));
    t.reth = t.reth.filter(|_| has(HeaderSet::RETH));
    t.atomic_eth = t.atomic_eth.filter(|_| has(HeaderSet::ATOMIC_ETH));
    t.aeth = t.aeth.filter(|_| has(HeaderSet::AETH));
    t.atomic_ack_eth = t.atomic_ack_eth.filter(|_| has(HeaderSet::ATOMIC_ACK_ETH));
    t.imm_data = t.imm_data.filter(|_| has(HeaderSet::IMM_DT));
    t.invalidate_rkey = t.invalidate_rkey.filter(|_| has(HeaderSet::IETH));
    Some(FrameRepr::new(
        [2, 0, 0, 0, 0, from],
        [2, 0, 0, 0, 0, to],
        Gid::from_ipv4([10, 0, 0, from]),
        Gid::from_ipv4([10, 0, 0, to]),
        0xc000,
        t,
    ))
}

// ---------------------------------------------------------------------------
// Data exactly once under impairment

const SRC_LEN: usize = 12 << 10;
const DST_LEN: usize = 192 << 10;
const SPARE_RECVS: usize = 2;
const SPARE_LEN: usize = 8192;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd(u64),
    CmpSwap { hit: bool, swap: u64 },
}

#[derive(Debug, Clone)]
struct DataOp {
    from_a: bool,
    kind: Kind,
    len: usize,
    src: u16,
    signaled: bool,
    gap: u8,
}

fn data_op() -> impl Strategy<Value = DataOp> {
    (
        any::<bool>(),
        0u8..7,
        prop_oneof![2 => 0usize..=16, 3 => 0usize..5000],
        any::<u16>(),
        any::<bool>(),
        0u8..6,
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(from_a, k, len, src, signaled, gap, arg, hit)| DataOp {
            from_a,
            kind: match k {
                0 => Kind::Send,
                1 => Kind::SendImm,
                2 => Kind::Write,
                3 => Kind::WriteImm,
                4 => Kind::Read,
                5 => Kind::FetchAdd(arg),
                _ => Kind::CmpSwap { hit, swap: arg },
            },
            len,
            src,
            signaled,
            gap,
        })
}

fn impaired_link() -> impl Strategy<Value = LinkConfig> {
    (
        0.0..0.12f64,
        0.0..0.12f64,
        0.0..0.25f64,
        0.0..0.05f64,
        0.0..0.02f64,
        0u64..3000,
        1_000u64..50_000,
    )
        .prop_map(
            |(loss, dup, reorder, ce_mark, corrupt, jitter_ns, reorder_ns)| LinkConfig {
                loss,
                dup,
                reorder,
                reorder_ns,
                jitter_ns,
                ce_mark,
                corrupt,
                ..Default::default()
            },
        )
}

fn mtu() -> impl Strategy<Value = Mtu> {
    prop_oneof![Just(Mtu::Mtu256), Just(Mtu::Mtu1024), Just(Mtu::Mtu4096)]
}

fn start_psn() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..16, 0xff_fff0u32..0x100_0000, 0u32..0x100_0000]
}

/// One side of the data test: the tracked endpoint (its MR is the
/// destination region), a source region with a pattern, an atomic counter,
/// and the model of what all of them must hold in the end.
struct DataSide {
    s: Side,
    src: MemoryRegion,
    src_bytes: Vec<u8>,
    ctr: MemoryRegion,
    /// The counter's value once every atomic aimed at it has executed.
    ctr_val: u64,
    /// The destination region as it must end up.
    expect: Vec<u8>,
    cursor: usize,
    /// Receive buffers to post, in the order messages arrive.
    recv_bufs: Vec<(usize, usize)>,
    /// Receive completions expected, in order: (byte_len, opcode, imm).
    msgs: Vec<(u32, WcOpcode, Option<u32>)>,
    /// Posts to make: (WR, steps to run after it).
    wrs: Vec<(SendWr, u8)>,
}

impl DataSide {
    fn new(ep: Endpoint, name: &str, id: u64, seed: u64) -> Self {
        let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        let seed = seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let src_bytes = pattern(seed, SRC_LEN);
        let src = ep.pd.reg_mr_with(&src_bytes, acc).unwrap();
        let ctr = ep.pd.reg_mr(64, AccessFlags::all()).unwrap();
        let ctr_val = seed.rotate_left(17) ^ 0x5555;
        // SAFETY: no WR is posted yet.
        unsafe { ctr.write(0, &ctr_val.to_ne_bytes()) }.unwrap();
        Self {
            s: Side::new(ep, name, id << 40),
            src,
            src_bytes,
            ctr,
            ctr_val,
            expect: vec![0; DST_LEN],
            cursor: 0,
            recv_bufs: Vec::new(),
            msgs: Vec::new(),
            wrs: Vec::new(),
        }
    }
    fn alloc(&mut self, n: usize, align: usize) -> usize {
        let off = self.cursor.next_multiple_of(align);
        self.cursor = off + n;
        assert!(self.cursor + SPARE_RECVS * SPARE_LEN <= DST_LEN);
        off
    }
}

/// Plan `op` from `x` to `y`: the WR, the receive it needs and the bytes
/// it must leave behind.
fn plan(i: usize, op: &DataOp, x: &mut DataSide, y: &mut DataSide) {
    let n = op.len;
    let s = op.src as usize % (SRC_LEN - n + 1);
    let imm = 0x1000_0000 + i as u32;
    let flags = if op.signaled {
        SendFlags::SIGNALED
    } else {
        SendFlags::empty()
    };
    let src_sge = x.src.sge(s, n);
    let (opcode, sge) = match op.kind {
        Kind::Send | Kind::SendImm => {
            // A receive buffer larger than the message: the rest stays 0.
            let off = y.alloc(n + 16, 1);
            y.recv_bufs.push((off, n + 16));
            y.expect[off..off + n].copy_from_slice(&x.src_bytes[s..s + n]);
            if matches!(op.kind, Kind::Send) {
                y.msgs.push((n as u32, WcOpcode::Recv, None));
                (WrOpcode::Send, src_sge)
            } else {
                y.msgs.push((n as u32, WcOpcode::Recv, Some(imm)));
                (WrOpcode::SendWithImm { imm }, src_sge)
            }
        }
        Kind::Write | Kind::WriteImm => {
            let off = y.alloc(n, 1);
            y.expect[off..off + n].copy_from_slice(&x.src_bytes[s..s + n]);
            let remote_addr = y.s.ep.mr.addr() + off as u64;
            let rkey = y.s.ep.mr.rkey();
            if matches!(op.kind, Kind::Write) {
                (WrOpcode::RdmaWrite { remote_addr, rkey }, src_sge)
            } else {
                y.recv_bufs.push((0, 0));
                y.msgs
                    .push((n as u32, WcOpcode::RecvRdmaWithImm, Some(imm)));
                (
                    WrOpcode::RdmaWriteWithImm {
                        remote_addr,
                        rkey,
                        imm,
                    },
                    src_sge,
                )
            }
        }
        Kind::Read => {
            let off = x.alloc(n, 1);
            x.expect[off..off + n].copy_from_slice(&y.src_bytes[s..s + n]);
            (
                WrOpcode::RdmaRead {
                    remote_addr: y.src.addr() + s as u64,
                    rkey: y.src.rkey(),
                },
                x.s.ep.mr.sge(off, n),
            )
        }
        Kind::FetchAdd(add) => {
            let off = x.alloc(8, 8);
            let orig = y.ctr_val;
            y.ctr_val = orig.wrapping_add(add);
            x.expect[off..off + 8].copy_from_slice(&orig.to_ne_bytes());
            (
                WrOpcode::AtomicFetchAndAdd {
                    remote_addr: y.ctr.addr(),
                    rkey: y.ctr.rkey(),
                    add,
                },
                x.s.ep.mr.sge(off, 8),
            )
        }
        Kind::CmpSwap { hit, swap } => {
            let off = x.alloc(8, 8);
            let orig = y.ctr_val;
            let compare = if hit { orig } else { orig ^ 1 };
            if hit {
                y.ctr_val = swap;
            }
            x.expect[off..off + 8].copy_from_slice(&orig.to_ne_bytes());
            (
                WrOpcode::AtomicCmpAndSwp {
                    remote_addr: y.ctr.addr(),
                    rkey: y.ctr.rkey(),
                    compare,
                    swap,
                },
                x.s.ep.mr.sge(off, 8),
            )
        }
    };
    let sg = if n == 0 && !matches!(op.kind, Kind::FetchAdd(_) | Kind::CmpSwap { .. }) {
        vec![]
    } else {
        vec![sge]
    };
    x.wrs
        .push((SendWr::new(0, opcode, sg).flags(flags), op.gap));
}

fn post_recvs(d: &mut DataSide) {
    for (off, len) in std::mem::take(&mut d.recv_bufs) {
        let sg = if len == 0 {
            vec![]
        } else {
            vec![d.s.ep.mr.sge(off, len)]
        };
        d.s.recv(sg).unwrap();
    }
    // Spares at the end of the region: a message delivered twice would
    // consume one (and write into it).
    for k in 0..SPARE_RECVS {
        let sge = d.s.ep.mr.sge(DST_LEN - (k + 1) * SPARE_LEN, SPARE_LEN);
        d.s.recv(vec![sge]).unwrap();
    }
}

#[allow(clippy::too_many_arguments)]
fn data_run(
    seed: u64,
    link: LinkConfig,
    mtu: Mtu,
    psn_a: u32,
    psn_b: u32,
    max_rd_atomic: u8,
    recvs_first: bool,
    mut ops: Vec<DataOp>,
) -> Result<(), TestCaseError> {
    let mut sim = sim_pair(link, seed);
    let p = PairParams {
        mtu,
        psn_a,
        psn_b,
        timeout: 5,
        max_rd_atomic,
        mr_len: DST_LEN,
        ..Default::default()
    };
    let (ea, eb) = connect_pair(&sim, &p);
    let mut a = DataSide::new(ea, "A", 1, seed);
    let mut b = DataSide::new(eb, "B", 2, seed);
    // The last WR of each side is signalled: its success accounts for
    // every unsignalled one before it.
    for side in [true, false] {
        if let Some(o) = ops.iter_mut().rev().find(|o| o.from_a == side) {
            o.signaled = true;
        }
    }
    for (i, op) in ops.iter().enumerate() {
        if op.from_a {
            plan(i, op, &mut a, &mut b);
        } else {
            plan(i, op, &mut b, &mut a);
        }
    }
    if recvs_first {
        post_recvs(&mut a);
        post_recvs(&mut b);
    }
    // Post in op order, both sides interleaved, with traffic running.
    let (mut ia, mut ib) = (0, 0);
    for op in &ops {
        let (x, k) = if op.from_a {
            (&mut a, &mut ia)
        } else {
            (&mut b, &mut ib)
        };
        let (wr, gap) = x.wrs[*k].clone();
        *k += 1;
        x.s.send(wr).unwrap();
        for _ in 0..gap {
            sim.step();
        }
    }
    if !recvs_first {
        // Receives late: SENDs meet RNR NAKs first.
        for _ in 0..30 {
            sim.step();
        }
        post_recvs(&mut a);
        post_recvs(&mut b);
    }
    let deadline = sim.now + 2_000 * MS;
    let done = sim.run_until(deadline, |_| {
        a.s.drain();
        b.s.drain();
        a.s.t.sq.is_empty()
            && b.s.t.sq.is_empty()
            && a.s.t.rq.len() <= SPARE_RECVS
            && b.s.t.rq.len() <= SPARE_RECVS
    });
    prop_assert!(
        done,
        "not done: A sq {:?} rq {:?}; B sq {:?} rq {:?}; link {:?}",
        a.s.t.sq,
        a.s.t.rq,
        b.s.t.sq,
        b.s.t.rq,
        sim.link.stats
    );
    // Late duplicates still in flight must change nothing.
    let until = sim.now + 2 * MS;
    sim.run_until(until, |_| false);
    for d in [&mut a, &mut b] {
        d.s.drain();
        let name = d.s.t.name.clone();
        for (p, wc) in &d.s.t.sends {
            prop_assert_eq!(wc.status, WcStatus::Success, "{}: WR {:?}", name, p);
        }
        let want_signaled = d
            .wrs
            .iter()
            .filter(|(w, _)| w.flags.contains(SendFlags::SIGNALED))
            .count();
        prop_assert_eq!(
            d.s.t.sends.len(),
            want_signaled,
            "{}: signalled WRs vs completions",
            name
        );
        prop_assert_eq!(d.s.t.sends.len() + d.s.t.retired_silently, d.wrs.len());
        // Each receive got exactly one message, the right one.
        prop_assert_eq!(
            d.s.t.recvs.len(),
            d.msgs.len(),
            "{}: receives completed",
            name
        );
        for (wc, &(len, opcode, imm)) in d.s.t.recvs.iter().zip(&d.msgs) {
            prop_assert_eq!(wc.status, WcStatus::Success);
            prop_assert_eq!(
                (wc.byte_len, wc.opcode),
                (len, opcode),
                "{}: {:?}",
                name,
                wc
            );
            prop_assert_eq!(wc.flags.contains(WcFlags::WITH_IMM), imm.is_some());
            if let Some(imm) = imm {
                prop_assert_eq!(wc.imm_data, imm);
            }
        }
        prop_assert_eq!(
            d.s.t.rq.len(),
            SPARE_RECVS,
            "{}: a message was delivered twice",
            name
        );
        // SAFETY: every WR touching these regions has completed.
        let got = unsafe { d.s.ep.mr.to_vec(0, DST_LEN) }.unwrap();
        if got != d.expect {
            let first = got.iter().zip(&d.expect).position(|(g, e)| g != e).unwrap();
            return Err(TestCaseError::fail(format!(
                "{name}: destination bytes differ from offset {first} (planned up to {})",
                d.cursor
            )));
        }
        // SAFETY: as above.
        let ctr = unsafe { d.ctr.load_u64(0) }.unwrap();
        prop_assert_eq!(
            ctr,
            d.ctr_val,
            "{}: atomics applied other than exactly once",
            name
        );
    }
    flush_all(&mut sim, &mut [&mut a.s, &mut b.s]);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// RC moves every byte exactly once whatever the link does.
    #[test]
    fn rc_data_exactly_once(
        seed in any::<u64>(),
        link in impaired_link(),
        mtu in mtu(),
        psn_a in start_psn(),
        psn_b in start_psn(),
        max_rd_atomic in 1u8..=8,
        recvs_first in prop::bool::weighted(0.8),
        ops in proptest::collection::vec(data_op(), 1..24),
    ) {
        data_run(seed, link, mtu, psn_a, psn_b, max_rd_atomic, recvs_first, ops)?;
    }
}

// ---------------------------------------------------------------------------
// Errors: each WR completes once with a status its fault allows

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    BadLkey,
    BadRkey,
    RemoteBounds,
    ShortRecv,
}

#[derive(Debug, Clone)]
struct ErrOp {
    kind: u8,
    len: usize,
    signaled: bool,
    fault: Fault,
    gap: u8,
}

fn err_op() -> impl Strategy<Value = ErrOp> {
    (
        0u8..7,
        1usize..3000,
        any::<bool>(),
        prop_oneof![
            6 => Just(Fault::None),
            1 => Just(Fault::BadLkey),
            1 => Just(Fault::BadRkey),
            1 => Just(Fault::RemoteBounds),
            1 => Just(Fault::ShortRecv),
        ],
        0u8..4,
    )
        .prop_map(|(kind, len, signaled, fault, gap)| {
            let remote = kind >= 2;
            let sends = kind <= 1;
            let fault = match fault {
                Fault::BadRkey | Fault::RemoteBounds if !remote => Fault::None,
                Fault::ShortRecv if !sends => Fault::None,
                f => f,
            };
            ErrOp {
                kind,
                len,
                signaled,
                fault,
                gap,
            }
        })
}

fn allowed(op: &ErrOp) -> Vec<WcStatus> {
    use WcStatus::*;
    if op.fault == Fault::BadLkey {
        // Found at post time, completed when the WR reaches the front.
        return vec![LocProtErr, WrFlushErr];
    }
    let mut v = vec![WrFlushErr, RetryExcErr];
    if matches!(op.kind, 0 | 1 | 3) {
        v.push(RnrRetryExcErr); // consumes a receive
    }
    v.push(match op.fault {
        Fault::None => Success,
        Fault::BadRkey | Fault::RemoteBounds => RemAccessErr,
        Fault::ShortRecv => RemInvReqErr,
        Fault::BadLkey => unreachable!(),
    });
    v
}

#[allow(clippy::too_many_arguments)]
fn error_run(
    seed: u64,
    loss: f64,
    retry_cnt: u8,
    rnr_retry: u8,
    timeout: u8,
    recv_count: usize,
    err_at: Option<(bool, u16)>,
    ops: Vec<ErrOp>,
) -> Result<(), TestCaseError> {
    let mut sim = sim_pair(LinkConfig::lossy(loss), seed);
    let p = PairParams {
        timeout,
        retry_cnt,
        rnr_retry,
        mr_len: 1 << 20,
        ..Default::default()
    };
    let (ea, eb) = connect_pair(&sim, &p);
    let mut a = Side::new(ea, "A", 1 << 32);
    let mut b = Side::new(eb, "B", 2 << 32);
    let ctr = b.ep.pd.reg_mr(8, AccessFlags::all()).unwrap();
    // Receives on B, in message order, sized per the fault.
    let msgs: Vec<usize> = (0..ops.len())
        .filter(|&i| matches!(ops[i].kind, 0 | 1 | 3))
        .collect();
    let mut recv_of = HashMap::new();
    for (k, &i) in msgs.iter().enumerate().take(recv_count) {
        let op = &ops[i];
        let len = if op.fault == Fault::ShortRecv {
            op.len - 1
        } else {
            op.len
        };
        let sge = b.ep.mr.sge(k * 3000, len);
        let id = b.recv(vec![sge]).unwrap();
        recv_of.insert(id, i);
    }
    let mut wr_of = HashMap::new();
    let last = ops.len() - 1;
    for (i, op) in ops.iter().enumerate() {
        let n = op.len;
        let (mut raddr, mut rkey) = (b.ep.mr.addr() + (i * 3000) as u64, b.ep.mr.rkey());
        match op.fault {
            Fault::BadRkey => rkey ^= 0x5a5a,
            Fault::RemoteBounds => raddr = b.ep.mr.addr() + (1 << 20),
            _ => {}
        }
        let mut sge = a.ep.mr.sge(i * 3000, if op.kind >= 5 { 8 } else { n });
        if op.fault == Fault::BadLkey {
            sge.lkey = sge.lkey.wrapping_add(1);
        }
        let (caddr, ckey) = match op.fault {
            Fault::BadRkey => (ctr.addr(), ctr.rkey() ^ 0x5a5a),
            Fault::RemoteBounds => (ctr.addr() + 64, ctr.rkey()),
            _ => (ctr.addr(), ctr.rkey()),
        };
        let opcode = match op.kind {
            0 => WrOpcode::Send,
            1 => WrOpcode::SendWithImm { imm: i as u32 },
            2 => WrOpcode::RdmaWrite {
                remote_addr: raddr,
                rkey,
            },
            3 => WrOpcode::RdmaWriteWithImm {
                remote_addr: raddr,
                rkey,
                imm: i as u32,
            },
            4 => WrOpcode::RdmaRead {
                remote_addr: raddr,
                rkey,
            },
            5 => WrOpcode::AtomicFetchAndAdd {
                remote_addr: caddr,
                rkey: ckey,
                add: 1,
            },
            _ => WrOpcode::AtomicCmpAndSwp {
                remote_addr: caddr,
                rkey: ckey,
                compare: 0,
                swap: 1,
            },
        };
        // The last WR is signalled: its completion retires the others.
        let flags = if op.signaled || i == last {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        // Posting may find the QP already in ERR (a bad lkey at the front
        // fails at once): the WR is then flushed, still exactly once.
        let id = a
            .send(SendWr::new(0, opcode, vec![sge]).flags(flags))
            .unwrap();
        wr_of.insert(id, i);
        for _ in 0..op.gap {
            sim.step();
        }
    }
    if let Some((on_a, steps)) = err_at {
        for _ in 0..steps {
            sim.step();
        }
        let s = if on_a { &mut a } else { &mut b };
        s.drain();
        let (attr, mask) = to_err();
        s.ep.qp.modify(&attr, mask).unwrap();
        s.t.in_err = true;
    }
    let until = sim.now + 10 * MS;
    sim.run_until(until, |_| {
        a.drain();
        b.drain();
        a.t.sq.is_empty()
    });
    flush_all(&mut sim, &mut [&mut a, &mut b]);
    for (p, wc) in &a.t.sends {
        // (flush_all's closing WR is not one of the ops.)
        let Some(&i) = wr_of.get(&p.wr_id) else {
            continue;
        };
        prop_assert!(
            allowed(&ops[i]).contains(&wc.status),
            "op {} {:?}: status {:?}",
            i,
            ops[i],
            wc.status
        );
    }
    for wc in &b.t.recvs {
        let i = recv_of[&wc.wr_id];
        let op = &ops[i];
        let ok = match wc.status {
            WcStatus::Success => op.fault == Fault::None && wc.byte_len as usize == op.len,
            WcStatus::LocLenErr => op.fault == Fault::ShortRecv,
            // A one-packet WRITE with immediate consumes its receive WQE
            // before the R_Key check, which reports its error (as rxe).
            WcStatus::RemAccessErr => {
                op.kind == 3 && matches!(op.fault, Fault::BadRkey | Fault::RemoteBounds)
            }
            WcStatus::WrFlushErr => true,
            _ => false,
        };
        prop_assert!(ok, "receive for op {} {:?}: {:?}", i, op, wc);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// Faults and forced errors: statuses match the fault, everything
    /// outstanding flushes exactly once.
    #[test]
    fn errors_flush_everything_once(
        seed in any::<u64>(),
        loss in prop_oneof![Just(0.0), 0.0..0.3f64],
        retry_cnt in 0u8..=7,
        rnr_retry in 0u8..=7,
        timeout in 5u8..10,
        recv_count in 0usize..24,
        err_at in proptest::option::of((any::<bool>(), 0u16..200)),
        ops in proptest::collection::vec(err_op(), 1..20),
    ) {
        error_run(seed, loss, retry_cnt, rnr_retry, timeout, recv_count, err_at, ops)?;
    }
}

// ---------------------------------------------------------------------------
// Random verbs calls against a model

#[derive(Debug, Clone, PartialEq, Eq)]
enum ModifyErr {
    Illegal,
    Missing,
    Invalid(&'static str),
}

/// IBTA 10.3.1 for an RC QP, written apart from the engine: the legal
/// transitions, the attributes each requires, the values out of range.
fn model_modify(cur: QpState, a: &QpAttr, m: QpAttrMask) -> Result<QpState, ModifyErr> {
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    type M = QpAttrMask;
    let to = if m.contains(M::STATE) {
        a.qp_state
    } else {
        cur
    };
    let need = match (cur, to) {
        (_, Reset) | (_, QpState::Err) => M::empty(),
        (Reset, Init) => M::ACCESS_FLAGS,
        (Init, Init) => M::empty(),
        (Init, Rtr) => {
            M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER
        }
        (Rtr, Rts) => M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        (Rts, Rts) | (Rts, Sqd) | (Sqd, Sqd) | (Sqd, Rts) | (Sqe, Rts) => M::empty(),
        _ => return Err(ModifyErr::Illegal),
    };
    if !m.contains(need) {
        return Err(ModifyErr::Missing);
    }
    let range = [
        (M::TIMEOUT, a.timeout > 31, "timeout"),
        (M::RETRY_CNT, a.retry_cnt > 7, "retry_cnt"),
        (M::RNR_RETRY, a.rnr_retry > 7, "rnr_retry"),
        (M::MIN_RNR_TIMER, a.min_rnr_timer > 31, "min_rnr_timer"),
        (
            M::MAX_QP_RD_ATOMIC,
            a.max_rd_atomic > xroce::verbs::qp::MAX_RD_ATOMIC,
            "max_rd_atomic",
        ),
        (
            M::MAX_DEST_RD_ATOMIC,
            a.max_dest_rd_atomic > xroce::verbs::qp::MAX_RD_ATOMIC,
            "max_dest_rd_atomic",
        ),
        (M::DEST_QPN, a.dest_qp_num > 0xff_ffff, "dest_qp_num"),
        (M::RQ_PSN, a.rq_psn > 0xff_ffff, "rq_psn"),
        (M::SQ_PSN, a.sq_psn > 0xff_ffff, "sq_psn"),
    ];
    for (bit, bad, name) in range {
        if m.contains(bit) && bad {
            return Err(ModifyErr::Invalid(name));
        }
    }
    Ok(to)
}

#[derive(Debug, Clone)]
enum Action {
    Modify {
        a_side: bool,
        state: u8,
        mask: u32,
        val: u8,
        psn: u32,
    },
    Post {
        a_side: bool,
        op: u8,
        addr_off: u64,
        len: u32,
        key_ok: bool,
        flags: u32,
        local_extra: bool,
        remote: u8,
    },
    Recv {
        a_side: bool,
        len: u32,
        key_ok: bool,
    },
    Reconnect {
        a_side: bool,
        psn: u32,
    },
    Step(u8),
    Poll,
    DropMr(bool),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        (
            any::<bool>(),
            0u8..10,
            prop_oneof![1 => any::<u32>(), 2 => Just(u32::MAX)],
            prop_oneof![4 => 0u8..8, 1 => any::<u8>()],
            prop_oneof![6 => 0u32..0x100_0000, 1 => any::<u32>()],
        )
            .prop_map(|(a_side, state, mask, val, psn)| Action::Modify {
                a_side,
                state,
                mask,
                val,
                psn
            }),
        (
            any::<bool>(),
            0u8..8,
            0u64..70_000,
            prop_oneof![0u32..5000, any::<u32>()],
            any::<bool>(),
            0u32..16,
            any::<bool>(),
            0u8..3,
        )
            .prop_map(
                |(a_side, op, addr_off, len, key_ok, flags, local_extra, remote)| {
                    Action::Post {
                        a_side,
                        op,
                        addr_off,
                        len,
                        key_ok,
                        flags,
                        local_extra,
                        remote,
                    }
                }
            ),
        (any::<bool>(), 0u32..70_000, any::<bool>()).prop_map(|(a_side, len, key_ok)| {
            Action::Recv {
                a_side,
                len,
                key_ok,
            }
        }),
        (
            any::<bool>(),
            prop_oneof![Just(0u32), Just(0xff_fff0), 0u32..0x100_0000]
        )
            .prop_map(|(a_side, psn)| Action::Reconnect { a_side, psn }),
        (1u8..50).prop_map(Action::Step),
        Just(Action::Poll),
        any::<bool>().prop_map(Action::DropMr),
    ]
}

/// One side of the verbs test: the tracked endpoint, the modelled state,
/// and an extra MR that may be deregistered (its keys are kept).
struct VSide {
    s: Side,
    state: QpState,
    extra: Option<MemoryRegion>,
    /// (lkey, rkey, addr, len) of the extra MR, valid or not.
    extra_keys: (u32, u32, u64, usize),
}

const VERBS_MR_LEN: usize = 1 << 16;

/// Drain, then compare every QP's state with the model: the only change
/// the model does not make itself is an error moving a connected QP to
/// ERR, which must be reported: by an error completion (the requester's,
/// or a responder's tied to a receive WQE) or by an affiliated async error
/// (QP_ACCESS_ERR, QP_REQ_ERR, QP_FATAL); and no such event comes without
/// the move.
fn settle(sim: &Sim, sides: &mut [VSide; 2]) {
    for (i, v) in sides.iter_mut().enumerate() {
        v.s.drain();
        let dev = if i == 0 { &sim.a } else { &sim.b };
        let mut event = None;
        while let Some(e) = dev.poll_async_event() {
            let qpn = match e {
                AsyncEvent::QpFatal { qpn, cq_overflow } => {
                    assert!(!cq_overflow, "{e:?}");
                    qpn
                }
                AsyncEvent::QpAccessError { qpn } | AsyncEvent::QpRequestError { qpn } => qpn,
                _ => continue,
            };
            assert_eq!(qpn, v.s.t.qpn, "{e:?}");
            assert!(
                event.is_none(),
                "a second error event {e:?} after {event:?}"
            );
            event = Some(e);
        }
        let completed_error = v.s.t.sq_failed || v.s.t.rq_failed;
        let actual = v.s.ep.qp.state();
        if actual != v.state {
            assert!(
                actual == QpState::Err
                    && matches!(
                        v.state,
                        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
                    )
                    && (event.is_some() || completed_error),
                "{}: state {actual:?}, the model says {:?} (event: {event:?}, error \
                 completion: {completed_error})",
                v.s.t.name,
                v.state
            );
            v.state = QpState::Err;
            v.s.t.in_err = true;
        } else {
            assert!(
                event.is_none(),
                "{}: {event:?} without a move to ERR",
                v.s.t.name
            );
        }
    }
}

/// Modify `v`'s QP and compare the result with [`model_modify`]; the
/// model's state follows.
fn modify_checked(v: &mut VSide, attr: &QpAttr, mask: QpAttrMask) {
    let st = attr.qp_state;
    let cur = v.state;
    let want = model_modify(cur, attr, mask);
    let got = v.s.ep.qp.modify(attr, mask);
    let agree = match (&want, &got) {
        (Ok(_), Ok(())) => true,
        (
            Err(ModifyErr::Illegal),
            Err(VerbsError::Transport(TransportError::IllegalTransition { from, to })),
        ) => *from == cur && *to == st,
        (
            Err(ModifyErr::Missing),
            Err(VerbsError::Transport(TransportError::MissingAttributes { from, to, .. })),
        ) => *from == cur && *to == st,
        (
            Err(ModifyErr::Invalid(n)),
            Err(VerbsError::Transport(TransportError::InvalidAttribute(m, _))),
        ) => n == m,
        _ => false,
    };
    assert!(
        agree,
        "{}: modify {cur:?} -> {st:?} mask {mask:?}: model {want:?}, engine {got:?}",
        v.s.t.name
    );
    if let Ok(to) = want {
        v.state = to;
        match to {
            QpState::Reset => v.s.t.reset(),
            QpState::Err => v.s.t.in_err = true,
            _ => {}
        }
    }
}

fn verbs_run(actions: Vec<Action>, seed: u64) {
    let (mut sim, a, b) = setup(seed);
    let mk = |s: Side| {
        let extra = s.ep.pd.reg_mr(4096, AccessFlags::all()).unwrap();
        let keys = (extra.lkey(), extra.rkey(), extra.addr(), extra.len());
        VSide {
            s,
            state: QpState::Rts,
            extra: Some(extra),
            extra_keys: keys,
        }
    };
    let mut sides = [mk(a), mk(b)];
    let peer_qpn = [sides[1].s.t.qpn, sides[0].s.t.qpn];
    let peer_av = {
        let (ca, cb) = (sim.a.lock().config().clone(), sim.b.lock().config().clone());
        let av = |c: &xroce::engine::EngineConfig| AddressVector {
            dest_mac: c.mac,
            dest_ip: c.ip.into(),
            ..Default::default()
        };
        [av(&cb), av(&ca)]
    };
    settle(&sim, &mut sides);
    for act in actions {
        match act {
            Action::Modify {
                a_side,
                state,
                mask,
                val,
                psn,
            } => {
                let i = usize::from(!a_side);
                // 0..=6 name a state; 7..=9 take the next step towards RTS
                // (so that reconnections happen, not only refusals).
                let st = match (state, sides[i].state) {
                    (7.., QpState::Reset) => QpState::Init,
                    (7.., QpState::Init) => QpState::Rtr,
                    (7.., QpState::Rtr | QpState::Sqd | QpState::Sqe) => QpState::Rts,
                    (7.., QpState::Rts) => QpState::Sqd,
                    (7.., QpState::Err) => QpState::Reset,
                    (s, _) => QpState::ALL[s as usize],
                };
                let attr = QpAttr {
                    qp_state: st,
                    qp_access_flags: AccessFlags::from_bits_truncate(val as u32),
                    path_mtu: [
                        Mtu::Mtu256,
                        Mtu::Mtu512,
                        Mtu::Mtu1024,
                        Mtu::Mtu2048,
                        Mtu::Mtu4096,
                    ][val as usize % 5],
                    ah_attr: peer_av[i],
                    dest_qp_num: if val & 1 == 0 { peer_qpn[i] } else { psn % 64 },
                    rq_psn: psn,
                    sq_psn: if val & 0x40 == 0 {
                        psn.rotate_left(7) & 0xff_ffff
                    } else {
                        psn.rotate_left(7)
                    },
                    timeout: val % 40,
                    retry_cnt: val % 9,
                    rnr_retry: val % 9,
                    min_rnr_timer: val % 33,
                    max_rd_atomic: val % 20,
                    max_dest_rd_atomic: val % 20,
                    ..Default::default()
                };
                let mask = QpAttrMask::from_bits_truncate(mask) | QpAttrMask::STATE;
                modify_checked(&mut sides[i], &attr, mask);
            }
            Action::Reconnect { a_side, psn } => {
                // RESET -> INIT -> RTR -> RTS with every attribute right, to
                // the peer's QP: a fresh connection (which works if the peer
                // reconnects with the same PSN), each step against the model.
                let i = usize::from(!a_side);
                let v = &mut sides[i];
                let mut attr = QpAttr {
                    qp_access_flags: AccessFlags::all(),
                    path_mtu: Mtu::Mtu1024,
                    ah_attr: peer_av[i],
                    dest_qp_num: peer_qpn[i],
                    rq_psn: psn,
                    sq_psn: psn,
                    timeout: 4,
                    retry_cnt: 3,
                    rnr_retry: 3,
                    min_rnr_timer: 1,
                    max_rd_atomic: 8,
                    max_dest_rd_atomic: 8,
                    ..Default::default()
                };
                for st in [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts] {
                    attr.qp_state = st;
                    modify_checked(v, &attr, QpAttrMask::all());
                }
            }
            Action::Post {
                a_side,
                op,
                addr_off,
                len,
                key_ok,
                flags,
                local_extra,
                remote,
            } => {
                let i = usize::from(!a_side);
                let (peer_mr, peer_extra) = {
                    let p = &sides[1 - i];
                    (
                        (p.s.ep.mr.addr(), p.s.ep.mr.rkey()),
                        (p.extra_keys.2, p.extra_keys.1),
                    )
                };
                let v = &mut sides[i];
                let (lkey, base, local_len) = if local_extra {
                    let (lk, _, addr, l) = v.extra_keys;
                    (lk, addr, v.extra.as_ref().map(|_| l))
                } else {
                    (v.s.ep.mr.lkey(), v.s.ep.mr.addr(), Some(VERBS_MR_LEN))
                };
                let sge = Sge {
                    addr: base + addr_off,
                    length: len,
                    lkey: if key_ok { lkey } else { lkey.rotate_left(3) },
                };
                let (raddr, rkey) = match remote {
                    0 => (peer_mr.0 + addr_off, peer_mr.1),
                    1 => (peer_extra.0 + addr_off, peer_extra.1),
                    _ => (addr_off, addr_off as u32),
                };
                let opc = match op {
                    0 => WrOpcode::Send,
                    1 => WrOpcode::SendWithImm { imm: len },
                    2 => WrOpcode::SendWithInv {
                        invalidate_rkey: rkey,
                    },
                    3 => WrOpcode::RdmaWrite {
                        remote_addr: raddr,
                        rkey,
                    },
                    4 => WrOpcode::RdmaWriteWithImm {
                        remote_addr: raddr,
                        rkey,
                        imm: 1,
                    },
                    5 => WrOpcode::RdmaRead {
                        remote_addr: raddr,
                        rkey,
                    },
                    6 => WrOpcode::AtomicCmpAndSwp {
                        remote_addr: raddr,
                        rkey,
                        compare: 0,
                        swap: 1,
                    },
                    _ => WrOpcode::AtomicFetchAndAdd {
                        remote_addr: raddr,
                        rkey,
                        add: 1,
                    },
                };
                let flags = SendFlags::from_bits_truncate(flags);
                // The model of ibv_post_send: the state first, then inline
                // data that fits max_inline_data (256) once the SGE resolves.
                let resolves = len == 0
                    || (key_ok && local_len.is_some_and(|l| addr_off + len as u64 <= l as u64));
                let want = match v.state {
                    s @ (QpState::Reset | QpState::Init | QpState::Rtr) => {
                        Err(VerbsError::Transport(TransportError::BadQpState(s)))
                    }
                    _ if flags.contains(SendFlags::INLINE)
                        && !opc.is_read_or_atomic()
                        && resolves
                        && len > 256 =>
                    {
                        Err(VerbsError::Transport(TransportError::InlineTooLarge {
                            got: len as usize,
                            max: 256,
                        }))
                    }
                    _ => Ok(()),
                };
                let got =
                    v.s.send(SendWr::new(0, opc, vec![sge]).flags(flags))
                        .map(|_| ());
                assert_eq!(
                    got, want,
                    "{}: post_send {opc:?} {flags:?} len {len} in {:?}",
                    v.s.t.name, v.state
                );
            }
            Action::Recv {
                a_side,
                len,
                key_ok,
            } => {
                let v = &mut sides[usize::from(!a_side)];
                let mut sge = v.s.ep.mr.sge(0, len as usize);
                if !key_ok {
                    sge.lkey ^= 1;
                }
                let want = match v.state {
                    QpState::Reset => Err(VerbsError::Transport(TransportError::BadQpState(
                        QpState::Reset,
                    ))),
                    _ => Ok(()),
                };
                let got = v.s.recv(vec![sge]).map(|_| ());
                assert_eq!(got, want, "{}: post_recv in {:?}", v.s.t.name, v.state);
            }
            Action::Step(n) => {
                for _ in 0..n {
                    if !sim.step() {
                        break;
                    }
                }
            }
            Action::Poll => {}
            Action::DropMr(a_side) => {
                sides[usize::from(!a_side)].extra = None;
            }
        }
        settle(&sim, &mut sides);
    }
    let until = sim.now + 5 * MS;
    sim.run_until(until, |_| false);
    settle(&sim, &mut sides);
    let [a, b] = &mut sides;
    flush_all(&mut sim, &mut [&mut a.s, &mut b.s]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random verbs calls (legal and illegal transitions and attributes,
    /// bad keys, huge lengths, posting in every state, deregistering MRs
    /// with traffic in flight) over a lossy link: every call returns what
    /// the model says, states change only as modelled (or to ERR with
    /// QP_FATAL), every completion passes the tracker and everything
    /// flushes in the end.
    #[test]
    fn random_verbs_sequences(actions in proptest::collection::vec(action(), 1..60), seed in 0u64..8) {
        verbs_run(actions, seed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random datagrams (opcodes, Q_Keys, sizes, ECN) to UD and UC QPs with
    /// receive buffers of random sizes: receives complete once each, in
    /// order, never beyond their buffer, and flush in ERR.
    #[test]
    fn ud_and_uc_receivers(
        pkts in proptest::collection::vec((any::<u8>(), any::<bool>(), any::<u32>(), 0usize..5000, any::<u8>(), any::<u32>()), 1..40),
        bufs in proptest::collection::vec(0usize..3000, 0..8),
    ) {
        let sim = sim_pair(LinkConfig::default(), 1);
        let pd = sim.b.alloc_pd();
        let cq = sim.b.create_cq(16).unwrap();
        let mr = pd.reg_mr(1 << 16, AccessFlags::all()).unwrap();
        let mut qps = Vec::new();
        let mut tracks = Vec::new();
        let mut buf_len = HashMap::new();
        for (k, t) in [QpType::Ud, QpType::Uc].into_iter().enumerate() {
            let mut init = QpInitAttr::rc(&cq);
            init.qp_type = t;
            let qp = sim.b.create_qp(&pd, &init).unwrap();
            let mut a = QpAttr { qp_state: QpState::Init, qkey: 5, qp_access_flags: AccessFlags::all(), ..Default::default() };
            qp.modify(&a, QpAttrMask::STATE | QpAttrMask::QKEY | QpAttrMask::ACCESS_FLAGS).unwrap();
            a.qp_state = QpState::Rtr;
            let m = QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
            qp.modify(&a, m).unwrap();
            let mut tr = Track::new(&format!("{t:?}"), qp.qp_num(), (k as u64 + 1) << 32, false);
            for (i, len) in bufs.iter().enumerate() {
                let id = tr.post_recv(&qp, vec![mr.sge(i * 3000, *len)]).unwrap();
                buf_len.insert(id, *len);
            }
            qps.push(qp);
            tracks.push(tr);
        }
        let mut buf = vec![0u8; 9000];
        for (opcode, ud, key, plen, ecn, psn) in pkts {
            let qp = &qps[if ud { 0 } else { 1 }];
            let opcode = if ud { 0x64 | (opcode & 1) } else { 0x20 | (opcode % 0x0c) };
            let va = mr.addr() + (key as u64 % 70000);
            let mut t = every_header(qp.qp_num(), psn & 0xff_ffff, va, mr.rkey(), key);
            t.deth = Some(DethRepr { qkey: if key & 1 == 0 { 5 } else { key }, src_qp: key >> 8 });
            t.reth = Some(RethRepr { va, rkey: mr.rkey(), dma_len: plen as u32 });
            let Some(mut f) = forge(1, 2, opcode, t) else { continue };
            f.ip.set_ecn(ecn & 3);
            if let Ok(n) = xroce_wire::emit_frame(&f, &vec![0x11; plen], &mut buf) {
                sim.b.handle_frame(&buf[..n], 1_000);
            }
            let [ud_t, uc_t] = &mut tracks[..] else { unreachable!() };
            drain_cq(&cq, &mut [ud_t, uc_t]);
        }
        for (qp, t) in qps.iter().zip(&mut tracks) {
            let (attr, mask) = to_err();
            qp.modify(&attr, mask).unwrap();
            t.in_err = true;
        }
        let [ud_t, uc_t] = &mut tracks[..] else { unreachable!() };
        drain_cq(&cq, &mut [ud_t, uc_t]);
        for t in &tracks {
            prop_assert!(t.rq.is_empty(), "{}: receives not flushed: {:?}", t.name, t.rq);
            for wc in t.recvs.iter().filter(|w| w.status == WcStatus::Success) {
                prop_assert!(wc.byte_len as usize <= buf_len[&wc.wr_id], "{}: {:?}", t.name, wc);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Determinism

/// One run with every kind of traffic over an impaired link, recording a
/// digest of every frame. Remote addresses on the wire are iovas fixed
/// here (heap addresses would differ between runs); everything else comes
/// from `seed`. Returns the frame trace and every MR key.
fn traced_run(seed: u64) -> (Vec<u64>, Vec<(u32, u32)>) {
    let link = LinkConfig {
        loss: 0.05,
        dup: 0.05,
        reorder: 0.1,
        jitter_ns: 2_000,
        ce_mark: 0.02,
        corrupt: 0.01,
        ..Default::default()
    };
    // Declared first, dropped last: the engine may hold references to it.
    let mut mem = [vec![0u64; 4096], vec![0u64; 4096]];
    let mut sim = sim_pair(link, seed);
    sim.link.record_trace();
    let (a, b) = connect_pair(
        &sim,
        &PairParams {
            mtu: Mtu::Mtu256,
            timeout: 4,
            ..Default::default()
        },
    );
    let user = |ep: &Endpoint, m: &mut Vec<u64>, iova: u64| {
        // SAFETY: `mem` outlives the region and the engine.
        unsafe {
            ep.pd.reg_user_mr(
                m.as_mut_ptr() as *mut u8,
                m.len() * 8,
                iova,
                AccessFlags::all(),
            )
        }
        .unwrap()
    };
    let [ma, mb] = &mut mem;
    let ua = user(&a, ma, 0x1000_0000);
    let ub = user(&b, mb, 0x2000_0000);
    let data = pattern(seed, 8000);
    // SAFETY: no WR is posted yet.
    unsafe { a.mr.write(0, &data) }.unwrap();
    // SAFETY: as above.
    unsafe { ua.write(0, &data[..4096]) }.unwrap();
    for i in 0..8 {
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![b.mr.sge(i as usize * 4096, 4096)],
        })
        .unwrap();
    }
    let mut n = 0;
    for i in 0..8u64 {
        let ops = [
            WrOpcode::Send,
            WrOpcode::RdmaWrite {
                remote_addr: ub.addr() + i * 2000,
                rkey: ub.rkey(),
            },
            WrOpcode::RdmaRead {
                remote_addr: ub.addr() + i * 100,
                rkey: ub.rkey(),
            },
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: ub.addr() + 30_000,
                rkey: ub.rkey(),
                add: i,
            },
        ];
        for (k, op) in ops.iter().enumerate() {
            let sge = match k {
                2 => a.mr.sge(16_384 + i as usize * 1000, 900),
                3 => a.mr.sge(32_768 + i as usize * 8, 8),
                _ => a.mr.sge(i as usize * 500, 1500),
            };
            a.qp.post_send(&SendWr::new(n, *op, vec![sge])).unwrap();
            n += 1;
        }
        b.qp.post_send(&SendWr::new(
            100 + i,
            WrOpcode::RdmaWrite {
                remote_addr: ua.addr() + 8192 + i * 1000,
                rkey: ua.rkey(),
            },
            vec![b.mr.sge(40_000, 1000)],
        ))
        .unwrap();
    }
    let deadline = sim.now + 1_000 * MS;
    let (mut ca, mut cb) = (0, 0);
    let done = sim.run_until(deadline, |_| {
        while let Ok(Some(wc)) = a.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success);
            ca += 1;
        }
        while let Ok(Some(wc)) = b.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success);
            cb += 1;
        }
        ca == 32 && cb == 16
    });
    assert!(done, "traffic did not complete: {ca}/32 {cb}/16");
    let s = sim.link.stats;
    assert!(
        s.dropped > 0 && s.duplicated > 0 && s.reordered > 0,
        "{s:?}"
    );
    let keys = [&a.mr, &b.mr, &ua, &ub]
        .iter()
        .map(|m| (m.lkey(), m.rkey()))
        .collect();
    (sim.link.trace().to_vec(), keys)
}

#[test]
fn same_seed_same_run() {
    let (t1, k1) = traced_run(42);
    let (t2, k2) = traced_run(42);
    assert!(t1.len() > 300, "{} frame events", t1.len());
    assert_eq!(k1, k2, "MR keys differ for the same seed");
    if let Some(i) = t1.iter().zip(&t2).position(|(x, y)| x != y) {
        panic!("same seed, frame event {i} differs");
    }
    assert_eq!(t1.len(), t2.len());
    let (t3, k3) = traced_run(43);
    assert_ne!(t1, t3, "another seed, the same frames");
    assert!(
        k1.iter().zip(&k3).all(|(x, y)| x != y),
        "another seed, the same keys"
    );
}

// ---------------------------------------------------------------------------
// Regressions the invariants found

/// Two WRs with bad lkeys queued behind a WRITE: once the first completes
/// with LOC_PROT_ERR the QP is in ERR, so the second must be flushed, not
/// reported as a second local protection error.
#[test]
fn after_a_local_error_the_next_bad_wr_is_flushed() {
    let mut sim = sim_pair(LinkConfig::default(), 3);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let mut a = Side::new(a, "A", 1 << 32);
    let mut b = Side::new(b, "B", 2 << 32);
    let write = WrOpcode::RdmaWrite {
        remote_addr: b.ep.mr.addr(),
        rkey: b.ep.mr.rkey(),
    };
    let sge = a.ep.mr.sge(0, 100);
    a.send(SendWr::new(0, write, vec![sge])).unwrap();
    for _ in 0..2 {
        let mut sge = a.ep.mr.sge(0, 100);
        sge.lkey ^= 0x100;
        a.send(SendWr::new(0, WrOpcode::Send, vec![sge])).unwrap();
    }
    let until = sim.now + 10 * MS;
    sim.run_until(until, |_| false);
    a.drain();
    let st: Vec<WcStatus> = a.t.sends.iter().map(|(_, wc)| wc.status).collect();
    assert_eq!(
        st,
        [
            WcStatus::Success,
            WcStatus::LocProtErr,
            WcStatus::WrFlushErr
        ]
    );
    flush_all(&mut sim, &mut [&mut a, &mut b]);
}

/// A READ whose response is lost, then a READ with a bad rkey: the
/// responder NAKs the second (remote access error, PSN of the second).
/// That NAK is not the first READ's status: the first READ has no
/// response yet and is retried (here into a responder now in ERR, so it
/// exhausts its retries), the second is flushed.
#[test]
fn a_nak_for_a_later_psn_is_not_the_status_of_an_unanswered_read() {
    let sim = sim_pair(LinkConfig::default(), 4);
    let p = PairParams {
        retry_cnt: 0,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    let mut a = Side::new(a, "A", 1 << 32);
    let b = Side::new(b, "B", 2 << 32);
    for rkey in [b.ep.mr.rkey(), b.ep.mr.rkey() ^ 0x5a5a] {
        let op = WrOpcode::RdmaRead {
            remote_addr: b.ep.mr.addr(),
            rkey,
        };
        let sge = a.ep.mr.sge(0, 64);
        a.send(SendWr::new(0, op, vec![sge])).unwrap();
    }
    let mut now = sim.now;
    let mut buf = vec![0u8; 9000];
    let mut frames = |dev: &Device, now: u64| {
        let mut v = Vec::new();
        while let Some(n) = dev.poll_transmit_frame(now, &mut buf) {
            v.push(buf[..n].to_vec());
        }
        v
    };
    let reqs = frames(&sim.a, now);
    assert_eq!(reqs.len(), 2, "two READ requests");
    for f in &reqs {
        sim.b.handle_frame(f, now);
    }
    let resps = frames(&sim.b, now);
    assert_eq!(resps.len(), 2, "READ response, then the NAK");
    // The READ response is lost; the NAK arrives.
    sim.a.handle_frame(&resps[1], now);
    while let Some(t) = sim.a.poll_timeout().filter(|&t| t < now + 100 * MS) {
        now = t;
        sim.a.handle_timeout(now);
        frames(&sim.a, now); // retries into the void
    }
    a.drain();
    let st: Vec<WcStatus> = a.t.sends.iter().map(|(_, wc)| wc.status).collect();
    assert_eq!(st, [WcStatus::RetryExcErr, WcStatus::WrFlushErr]);
}
