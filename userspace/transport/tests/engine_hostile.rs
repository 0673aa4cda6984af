//! Hostile peers against the responder, over the simulated link with frames
//! crafted as an on-path attacker would send them (the victim's QPN, PSNs
//! and R_Keys learned from the legitimate exchange):
//!
//! - a duplicate READ is executed again only if it repeats a READ the
//!   responder executed (its PSN range, R_Key and a range inside its own);
//!   any other duplicate sends no MR data and is counted (rxe's
//!   duplicate_request);
//! - under selective repeat a WRITE ahead of the expected PSN with a bad
//!   R_Key costs the QP exactly as in order: NAK remote access error, ERR,
//!   IBV_EVENT_QP_ACCESS_ERR;
//! - READs and atomics count together against `max_dest_rd_atomic` (one
//!   beyond is an invalid request), and `max_rd_atomic` bounds both
//!   together at the requester;
//! - WRITEs and READs reaching past an MR (its end, its start, 2^64, a
//!   2 GiB READ) are remote access errors and the memory around the MR
//!   stays untouched.

use std::sync::Mutex;

use xroce_transport::engine::completion::{Completion, WcStatus};
use xroce_transport::engine::memory::MemoryRegion;
use xroce_transport::engine::qp_attr::QpState;
use xroce_transport::engine::sim::{
    connect_engines, sim_configs, EngineEndpoint, EngineHost, LinkConfig, PairParams, Sim,
};
use xroce_transport::engine::work::{SendWr, WrOpcode};
use xroce_transport::engine::{AsyncEvent, Engine, SrMode};
use xroce_wire::{
    emit_frame, parse_frame_checked, AtomicEthRepr, BthRepr, FrameRepr, Gid, NakCode, Opcode,
    RethRepr, Syndrome, TransportRepr,
};

use xroce_transport::engine::sim::pattern;

const MS: u64 = 1_000_000;

type EngineSim = Sim<Mutex<Engine>>;

fn lk(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    EngineHost::lock(m)
}

/// A request from A's address to B's QP `qpn` (what the engine accepts
/// as its connected peer's).
fn request(qpn: u32, opcode: Opcode, psn: u32) -> TransportRepr {
    let mut bth = BthRepr::new(opcode, qpn, psn);
    bth.ack_req = true;
    bth.pkey = 0xffff;
    TransportRepr::new(bth)
}

fn frame(t: TransportRepr, payload: &[u8]) -> Vec<u8> {
    let (ca, cb) = sim_configs();
    let f = FrameRepr::new(
        ca.mac,
        cb.mac,
        Gid::from(ca.ip),
        Gid::from(cb.ip),
        0xc000,
        t,
    );
    let mut buf = vec![0u8; 9000];
    let n = emit_frame(&f, payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn read_req(qpn: u32, psn: u32, rkey: u32, va: u64, len: u32) -> Vec<u8> {
    let mut t = request(qpn, Opcode::RC_RDMA_READ_REQUEST, psn);
    t.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: len,
    });
    frame(t, &[])
}

/// Hand `f` to B and return every frame B sends in answer (transport
/// header, payload), given simulated time to pace them out.
fn to_b(sim: &mut EngineSim, f: &[u8]) -> Vec<(TransportRepr, Vec<u8>)> {
    let mut b = lk(&sim.b);
    b.handle_frame(f, sim.now);
    let mut out = Vec::new();
    let mut buf = vec![0u8; 9000];
    for _ in 0..1000 {
        sim.now += 10_000;
        while let Some(n) = b.poll_transmit_frame(sim.now, &mut buf) {
            let (r, payload) = parse_frame_checked(&buf[..n]).expect("B sends valid frames");
            out.push((r.transport, payload.to_vec()));
        }
        if b.poll_timeout().is_none_or(|t| t > sim.now + 100 * MS) {
            break;
        }
    }
    out
}

fn read_responses(out: &[(TransportRepr, Vec<u8>)]) -> Vec<&(TransportRepr, Vec<u8>)> {
    out.iter()
        .filter(|(t, _)| {
            matches!(
                t.bth.opcode,
                Opcode::RC_RDMA_READ_RESPONSE_FIRST
                    | Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
                    | Opcode::RC_RDMA_READ_RESPONSE_LAST
                    | Opcode::RC_RDMA_READ_RESPONSE_ONLY
            )
        })
        .collect()
}

/// The NAKs among B's frames: (PSN, code).
/// What B sent, without payloads: (opcode, PSN, AETH syndrome).
fn summary(out: &[(TransportRepr, Vec<u8>)]) -> Vec<(Opcode, u32, Option<Syndrome>)> {
    out.iter()
        .map(|(t, _)| (t.bth.opcode, t.bth.psn, t.aeth.map(|a| a.syndrome)))
        .collect()
}

fn naks(out: &[(TransportRepr, Vec<u8>)]) -> Vec<(u32, NakCode)> {
    out.iter()
        .filter_map(|(t, _)| match t.aeth?.syndrome {
            Syndrome::Nak(c) => Some((t.bth.psn, c)),
            _ => None,
        })
        .collect()
}

fn run_until_completions(sim: &mut EngineSim, n: usize) -> Vec<Completion> {
    let mut done = Vec::new();
    let deadline = sim.now + 200 * MS;
    sim.run_until(deadline, |s| {
        lk(&s.a).take_completions(&mut done);
        done.len() >= n
    });
    assert_eq!(done.len(), n, "completions at A: {done:?}");
    done
}

fn pair(seed: u64, p: &PairParams) -> (EngineSim, EngineEndpoint, EngineEndpoint) {
    let sim = Sim::engine_pair(LinkConfig::default(), seed);
    let (a, b) = connect_engines(&sim, p);
    // SAFETY: no work request is posted yet.
    unsafe { b.mr.write(0, &pattern(seed, b.mr.len())).unwrap() };
    (sim, a, b)
}

#[test]
fn duplicate_reads_run_again_only_as_recorded() {
    const PSN: u32 = 1000;
    let p = PairParams {
        psn_a: PSN,
        mr_len: 64 << 10,
        ..Default::default()
    };
    let (mut sim, a, b) = pair(31, &p);
    let secret = pattern(31, b.mr.len());
    // Another MR on B the peer may READ (same PD) but never did.
    let other = MemoryRegion::allocate(lk(&sim.b).memory(), 1, 8192, p.access).unwrap();
    // SAFETY: nothing uses `other` yet.
    unsafe { other.write(0, &[0x5a; 8192]).unwrap() };

    // The legitimate READ: 2 KiB at offset 4 KiB, PSNs 1000 and 1001.
    let (va, rkey) = (b.mr.addr() + 4096, b.mr.rkey());
    let wr = SendWr::new(
        1,
        WrOpcode::RdmaRead {
            remote_addr: va,
            rkey,
        },
        vec![a.mr.sge(0, 2048)],
    );
    lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    let done = run_until_completions(&mut sim, 1);
    assert_eq!(done[0].wc.status, WcStatus::Success);
    // SAFETY: the READ has completed.
    assert_eq!(unsafe { a.mr.to_vec(0, 2048) }.unwrap(), secret[4096..6144]);
    let before = lk(&sim.b).stats();

    let spoofed = [
        // Below the expected PSN but never a READ: the whole MR.
        read_req(b.qpn, PSN - 10, rkey, b.mr.addr(), 64 << 10),
        // The recorded PSN with another range of the same MR.
        read_req(b.qpn, PSN, rkey, b.mr.addr() + 32768, 2048),
        // The recorded PSN and range with another MR's R_Key.
        read_req(b.qpn, PSN, other.rkey(), other.addr(), 2048),
        // The recorded second PSN asking past the recorded end.
        read_req(b.qpn, PSN + 1, rkey, va + 1024, 8192),
    ];
    for f in &spoofed {
        let out = to_b(&mut sim, f);
        let leaked = read_responses(&out).len();
        assert_eq!(leaked, 0, "{leaked} READ response packets carried MR data");
        assert_eq!(naks(&out), []);
    }
    let after = lk(&sim.b).stats();
    assert_eq!(after.dup_read_unmatched - before.dup_read_unmatched, 4);
    assert_eq!(after.read_reexecuted, before.read_reexecuted);
    assert_eq!(after.tx_read_responses, before.tx_read_responses);
    assert_eq!(lk(&sim.b).query_qp(b.qpn).unwrap().qp_state, QpState::Rts);

    // The requester's own retry of the second packet is answered, with the
    // recorded bytes, at its PSN.
    let out = to_b(&mut sim, &read_req(b.qpn, PSN + 1, rkey, va + 1024, 1024));
    let resp = read_responses(&out);
    assert_eq!(resp.len(), 1, "{:?}", summary(&out));
    assert_eq!(resp[0].0.bth.psn, PSN + 1);
    assert_eq!(resp[0].0.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!(resp[0].1, secret[5120..6144]);
    // A retry of the whole READ is answered whole, from the record.
    let out = to_b(&mut sim, &read_req(b.qpn, PSN, rkey, va, 2048));
    let resp = read_responses(&out);
    assert_eq!(resp.len(), 2, "{:?}", summary(&out));
    assert_eq!(resp[0].1, secret[4096..5120]);
    assert_eq!(resp[1].1, secret[5120..6144]);
    assert_eq!(
        lk(&sim.b).stats().read_reexecuted,
        before.read_reexecuted + 2
    );
}

/// A WRITE ahead of the expected PSN with a guessed R_Key writes nothing,
/// stops all placing ahead (so later guesses write nothing either), and
/// costs the QP under its own PSN once the expected PSN reaches it: then
/// the responder NAKs that PSN (remote access error) and its QP goes to
/// ERR, whatever the packet at that PSN holds.
#[test]
fn selective_repeat_write_ahead_with_a_bad_rkey_is_an_access_error() {
    const PSN: u32 = 500;
    let p = PairParams {
        psn_a: PSN,
        ..Default::default()
    };
    let (mut sim, a, b) = pair(32, &p);
    lk(&sim.a).set_selective_repeat(a.qpn, SrMode::On).unwrap();
    lk(&sim.b).set_selective_repeat(b.qpn, SrMode::On).unwrap();
    let canary = pattern(32, 1024);
    let write = |psn: u32, rkey: u32, at: u64, byte: u8| {
        let mut t = request(b.qpn, Opcode::RC_RDMA_WRITE_ONLY, psn);
        t.reth = Some(RethRepr {
            va: b.mr.addr() + at,
            rkey,
            dma_len: 64,
        });
        frame(t, &[byte; 64])
    };
    // 5 PSNs ahead of the expected one (inside the SACK bitmap), a guessed
    // R_Key: no access error yet (its NAK would have to name the expected
    // PSN), only the sequence NAK of a packet dropped ahead; nothing
    // written, the QP still up.
    let out = to_b(&mut sim, &write(PSN + 5, b.mr.rkey() ^ 0x0101, 0, 0xee));
    assert_eq!(
        naks(&out),
        [(PSN, NakCode::PsnSequenceError)],
        "{:?}",
        summary(&out)
    );
    assert_eq!(lk(&sim.b).query_qp(b.qpn).unwrap().qp_state, QpState::Rts);
    // The right R_Key ahead is no longer placed either.
    let out = to_b(&mut sim, &write(PSN + 6, b.mr.rkey(), 64, 0xdd));
    assert_eq!(naks(&out), []);
    assert_eq!(lk(&sim.b).stats().sr_placed_out_of_order, 0);
    // SAFETY: nothing writes B's region but the requests here.
    assert_eq!(unsafe { b.mr.to_vec(0, 1024) }.unwrap(), canary);
    // In order up to the guessed PSN: placed as usual.
    for k in 0..5 {
        let out = to_b(
            &mut sim,
            &write(PSN + k, b.mr.rkey(), 256 + 64 * u64::from(k), 0xcc),
        );
        assert_eq!(naks(&out), [], "PSN {}", PSN + k);
    }
    // SAFETY: as above.
    assert_eq!(unsafe { b.mr.to_vec(256, 320) }.unwrap(), vec![0xcc; 320]);
    // The guessed PSN comes in order, even with the right R_Key: the NAK
    // names it, and the QP goes to ERR with its asynchronous event.
    let out = to_b(&mut sim, &write(PSN + 5, b.mr.rkey(), 0, 0xbb));
    assert_eq!(
        naks(&out),
        [(PSN + 5, NakCode::RemoteAccessError)],
        "{:?}",
        summary(&out)
    );
    let mut b_eng = lk(&sim.b);
    assert_eq!(b_eng.query_qp(b.qpn).unwrap().qp_state, QpState::Err);
    assert_eq!(
        std::iter::from_fn(|| b_eng.poll_async_event()).collect::<Vec<_>>(),
        [AsyncEvent::QpAccessError { qpn: b.qpn }]
    );
    drop(b_eng);
    // Later frames to the dead QP change nothing.
    assert_eq!(to_b(&mut sim, &write(PSN + 6, b.mr.rkey(), 0, 0xaa)), []);
    // SAFETY: as above.
    assert_eq!(unsafe { b.mr.to_vec(0, 256) }.unwrap(), canary[..256]);
}

#[test]
fn selective_repeat_write_ahead_with_a_good_rkey_is_still_placed() {
    const PSN: u32 = 500;
    let p = PairParams {
        psn_a: PSN,
        ..Default::default()
    };
    let (mut sim, a, b) = pair(33, &p);
    lk(&sim.a).set_selective_repeat(a.qpn, SrMode::On).unwrap();
    lk(&sim.b).set_selective_repeat(b.qpn, SrMode::On).unwrap();
    let mut t = request(b.qpn, Opcode::RC_RDMA_WRITE_ONLY, PSN + 5);
    t.reth = Some(RethRepr {
        va: b.mr.addr(),
        rkey: b.mr.rkey(),
        dma_len: 16,
    });
    let out = to_b(&mut sim, &frame(t, &[0xee; 16]));
    assert_eq!(naks(&out), []);
    assert_eq!(lk(&sim.b).stats().sr_placed_out_of_order, 1);
    assert_eq!(lk(&sim.b).query_qp(b.qpn).unwrap().qp_state, QpState::Rts);
    // SAFETY: the placement happened synchronously in handle_frame.
    assert_eq!(unsafe { b.mr.to_vec(0, 16) }.unwrap(), [0xee; 16]);
}

fn fetch_add(qpn: u32, psn: u32, rkey: u32, va: u64) -> Vec<u8> {
    let mut t = request(qpn, Opcode::RC_FETCH_ADD, psn);
    t.atomic_eth = Some(AtomicEthRepr {
        va,
        rkey,
        swap_add: 1,
        compare: 0,
    });
    frame(t, &[])
}

/// With `max_dest_rd_atomic` 1, a READ or atomic arriving while another is
/// unanswered is an invalid request, whichever kinds the two are.
#[test]
fn reads_and_atomics_share_max_dest_rd_atomic() {
    const PSN: u32 = 70;
    let p = PairParams {
        psn_a: PSN,
        max_rd_atomic: 1,
        ..Default::default()
    };
    for (i, first_is_read) in [true, false].into_iter().enumerate() {
        let (mut sim, _a, b) = pair(40 + i as u64, &p);
        let (rkey, va) = (b.mr.rkey(), b.mr.addr());
        let cell = |b: &EngineEndpoint| {
            // SAFETY: read after the engine handled the frames, nothing in flight.
            u64::from_le_bytes(unsafe { b.mr.to_vec(64, 8) }.unwrap().try_into().unwrap())
        };
        let c0 = cell(&b);
        let first = if first_is_read {
            read_req(b.qpn, PSN, rkey, va, 1024)
        } else {
            fetch_add(b.qpn, PSN, rkey, va + 64)
        };
        // Both arrive before B sends anything: the first is unanswered.
        lk(&sim.b).handle_frame(&first, sim.now);
        let out = to_b(&mut sim, &fetch_add(b.qpn, PSN + 1, rkey, va + 64));
        assert_eq!(
            naks(&out),
            [(PSN + 1, NakCode::InvalidRequest)],
            "first is read: {first_is_read}: {:?}",
            summary(&out)
        );
        // The first was answered, the second never executed.
        let answered = out
            .iter()
            .filter(|(t, _)| {
                t.bth.psn == PSN && t.aeth.is_some_and(|a| a.syndrome == Syndrome::ACK)
            })
            .count();
        assert_eq!(answered, 1, "{:?}", summary(&out));
        assert_eq!(cell(&b), c0 + u64::from(!first_is_read));
        let mut e = lk(&sim.b);
        assert_eq!(e.query_qp(b.qpn).unwrap().qp_state, QpState::Err);
        assert_eq!(
            std::iter::from_fn(|| e.poll_async_event()).collect::<Vec<_>>(),
            [AsyncEvent::QpRequestError { qpn: b.qpn }]
        );
    }
}

/// `max_rd_atomic` 2: of READ, atomic, READ, atomic posted together, two
/// requests leave before any answer, and the rest as answers come.
#[test]
fn max_rd_atomic_bounds_reads_and_atomics_together() {
    let p = PairParams {
        max_rd_atomic: 2,
        ..Default::default()
    };
    let (mut sim, a, b) = pair(34, &p);
    let (rkey, va) = (b.mr.rkey(), b.mr.addr());
    let read = |id: u64, off: usize| {
        SendWr::new(
            id,
            WrOpcode::RdmaRead {
                remote_addr: va + off as u64,
                rkey,
            },
            vec![a.mr.sge(off, 512)],
        )
    };
    let atomic = |id: u64, off: usize| {
        SendWr::new(
            id,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: va + 8192,
                rkey,
                add: 1,
            },
            vec![a.mr.sge(off, 8)],
        )
    };
    {
        let mut e = lk(&sim.a);
        for wr in [read(1, 0), atomic(2, 4096), read(3, 1024), atomic(4, 4104)] {
            e.post_send(a.qpn, &wr).unwrap();
        }
        let mut buf = vec![0u8; 9000];
        let mut sent = Vec::new();
        for _ in 0..100 {
            sim.now += 10_000;
            while let Some(n) = e.poll_transmit_frame(sim.now, &mut buf) {
                sent.push(
                    parse_frame_checked(&buf[..n])
                        .unwrap()
                        .0
                        .transport
                        .bth
                        .opcode,
                );
            }
        }
        assert_eq!(
            sent,
            [Opcode::RC_RDMA_READ_REQUEST, Opcode::RC_FETCH_ADD],
            "before any answer"
        );
        // Nothing was delivered: A retransmits those two later, B answers.
    }
    let done = run_until_completions(&mut sim, 4);
    let got: Vec<_> = done.iter().map(|c| (c.wc.wr_id, c.wc.status)).collect();
    assert_eq!(
        got,
        [1, 2, 3, 4].map(|id| (id, WcStatus::Success)),
        "{done:?}"
    );
}

/// Requests reaching past an MR (across its end, below its start, an
/// address range that wraps 2^64, a 2 GiB READ) are each a remote access
/// error, NAKed at their PSN with the QP to ERR, and the bytes around the
/// region (an MR over the middle page of three) stay as they were.
#[test]
fn requests_beyond_the_mr_touch_nothing_around_it() {
    use xroce_transport::engine::memory::AccessFlags;
    const PSN: u32 = 900;
    const PAGE: usize = 4096;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // A request of `len` bytes; QPN, R_Key and va are set per case.
    let with_len = |opcode: Opcode, len: u32| {
        let mut t = request(0, opcode, PSN);
        t.reth = Some(RethRepr {
            va: 0,
            rkey: 0,
            dma_len: len,
        });
        t
    };
    let write = |len: u32| with_len(Opcode::RC_RDMA_WRITE_ONLY, len);
    let read = |len: u32| with_len(Opcode::RC_RDMA_READ_REQUEST, len);
    // (what, the va from the region's address, the request; its QPN,
    // R_Key and va are filled in per case).
    type Case = (&'static str, fn(u64) -> u64, TransportRepr);
    let cases: [Case; 5] = [
        (
            "WRITE across the end",
            |a| a + PAGE as u64 - 100,
            write(256),
        ),
        ("WRITE below the start", |a| a - 64, write(128)),
        ("WRITE wrapping 2^64", |_| u64::MAX - 15, write(256)),
        ("READ of 2 GiB", |a| a, read(1 << 31)),
        ("READ wrapping 2^64", |_| u64::MAX - 100, read(256)),
    ];
    for (seed, (what, va_of, mut t)) in (40..).zip(cases) {
        let p = PairParams {
            psn_a: PSN,
            ..Default::default()
        };
        let (mut sim, _a, b) = pair(seed, &p);
        let before = pattern(seed, 3 * PAGE);
        let mut around = before.clone();
        let mr = {
            let eng = lk(&sim.b);
            // SAFETY: `around` outlives `mr` (dropped at the end of this
            // iteration, before it) and nothing else touches it meanwhile.
            unsafe {
                MemoryRegion::register_user(
                    eng.memory(),
                    1,
                    around.as_mut_ptr().add(PAGE),
                    PAGE,
                    around.as_ptr().add(PAGE) as u64,
                    access,
                )
            }
            .unwrap()
        };
        t.bth.dest_qp = b.qpn;
        let reth = t.reth.as_mut().unwrap();
        reth.va = va_of(mr.addr());
        reth.rkey = mr.rkey();
        let payload = vec![
            0xee;
            if t.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY {
                reth.dma_len as usize
            } else {
                0
            }
        ];
        let out = to_b(&mut sim, &frame(t, &payload));
        assert_eq!(
            naks(&out),
            [(PSN, NakCode::RemoteAccessError)],
            "{what}: {:?}",
            summary(&out)
        );
        assert!(read_responses(&out).is_empty(), "{what}: READ data sent");
        assert_eq!(
            lk(&sim.b).query_qp(b.qpn).unwrap().qp_state,
            QpState::Err,
            "{what}"
        );
        drop(mr);
        assert!(around == before, "{what}: memory around the MR changed");
    }
}
