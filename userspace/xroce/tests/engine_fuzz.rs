//! The engine never panics on any packet: arbitrary bytes, mutated valid
//! frames (with the ICRC fixed up so they reach the transport) and
//! structurally valid frames with random header fields, fed to a connected
//! requester and responder that have traffic in flight.

use proptest::prelude::*;
use xroce::engine::codec::{self, AtomicEth, PktHdr, Reth};
use xroce::engine::sim::{connect_pair, Endpoint, LinkConfig, PairParams, Sim};
use xroce::verbs::*;

fn setup(seed: u64) -> (Sim, Endpoint, Endpoint) {
    let mut sim = Sim::pair(LinkConfig::lossy(0.05), seed);
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
    for i in 0..4 {
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![b.mr.sge(0, 8192)],
        })
        .unwrap();
        a.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![a.mr.sge(0, 8192)],
        })
        .unwrap();
    }
    let ops = [
        WrOpcode::Send,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr() + 100,
            rkey: b.mr.rkey(),
        },
        WrOpcode::RdmaRead {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        WrOpcode::AtomicFetchAndAdd {
            remote_addr: b.mr.addr() + 64,
            rkey: b.mr.rkey(),
            add: 1,
        },
    ];
    for (i, op) in ops.iter().enumerate() {
        let len = if op.is_atomic() { 8 } else { 5000 };
        a.qp.post_send(&SendWr::new(i as u64, *op, vec![a.mr.sge(16384, len)]))
            .unwrap();
        b.qp.post_send(&SendWr::new(
            i as u64,
            WrOpcode::RdmaWrite {
                remote_addr: a.mr.addr() + 30000,
                rkey: a.mr.rkey(),
            },
            vec![b.mr.sge(16384, 3000)],
        ))
        .unwrap();
    }
    // Get some packets in flight.
    for _ in 0..5 {
        sim.step();
    }
    (sim, a, b)
}

/// Valid frames the two engines produce right now.
fn corpus(sim: &mut Sim) -> Vec<(bool, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 9000];
    for (to_b, dev) in [(true, sim.a.clone()), (false, sim.b.clone())] {
        for _ in 0..8 {
            if let Some(n) = dev.poll_transmit(sim.now, &mut buf) {
                out.push((to_b, buf[..n].to_vec()));
            }
        }
    }
    out
}

fn fix_icrc(f: &mut [u8]) {
    codec::fix_icrc(f);
}

fn finish(sim: &mut Sim) {
    let until = sim.now + 5_000_000;
    sim.run_until(until, |_| false);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..16), seed in 0u64..4) {
        let (mut sim, _a, _b) = setup(seed);
        for f in &frames {
            sim.a.handle_frame(f, sim.now);
            sim.b.handle_frame(f, sim.now);
        }
        finish(&mut sim);
    }

    #[test]
    fn mutated_valid_frames(muts in proptest::collection::vec((any::<usize>(), any::<usize>(), any::<u8>(), 0u8..4), 1..24), seed in 0u64..4) {
        let (mut sim, _a, _b) = setup(seed);
        let corp = corpus(&mut sim);
        prop_assume!(!corp.is_empty());
        for (pick, pos, val, kind) in muts {
            let (to_b, mut f) = corp[pick % corp.len()].clone();
            match kind {
                0 => { let i = pos % f.len(); f[i] = val; }
                1 => { let i = codec::L2L3L4 + pos % 40; if i < f.len() { f[i] ^= val | 1; } }
                2 => f.truncate(pos % (f.len() + 1)),
                _ => f.extend(std::iter::repeat_n(val, pos % 64)),
            }
            fix_icrc(&mut f);
            let dev = if to_b { &sim.b } else { &sim.a };
            dev.handle_frame(&f, sim.now);
            // Replays of the unmodified frame (duplicates) as well.
            let (to_b, f) = &corp[pos % corp.len()];
            let dev = if *to_b { &sim.b } else { &sim.a };
            dev.handle_frame(f, sim.now);
        }
        finish(&mut sim);
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
        let (mut sim, a, b) = setup(seed);
        let mut buf = vec![0u8; 9000];
        for (opcode, to_b, psn, va, key, len, syn, plen, use_real_key) in pkts {
            let (dst, src) = if to_b { (&b, &a) } else { (&a, &b) };
            let rkey = if use_real_key { dst.mr.rkey() } else { key };
            let va = if use_real_key { dst.mr.addr() + (va % 70000) } else { va };
            let h = PktHdr {
                dst_mac: [2, 0, 0, 0, 0, if to_b { 2 } else { 1 }],
                src_mac: [2, 0, 0, 0, 0, if to_b { 1 } else { 2 }],
                src_ip: [10, 0, 0, if to_b { 1 } else { 2 }],
                dst_ip: [10, 0, 0, if to_b { 2 } else { 1 }],
                udp_sport: 0xc000,
                opcode,
                pkey: 0xffff,
                dqpn: dst.qp.qp_num(),
                ack_req: psn & 1 == 0,
                psn: psn & 0xff_ffff,
                ecn: (syn & 3),
                reth: Some(Reth { va, rkey, len }),
                aeth: Some((syn, len & 0xff_ffff)),
                atomic: Some(AtomicEth { va, rkey, swap_add: va, compare: 0 }),
                atomic_ack: Some(va),
                imm: Some(key),
                ieth: Some(key),
                ..Default::default()
            };
            let _ = src;
            let Some(n) = codec::emit(&h, &vec![0x5a; plen], &mut buf) else { continue };
            let dev = if to_b { &sim.b } else { &sim.a };
            dev.handle_frame(&buf[..n], sim.now);
            sim.step();
        }
        finish(&mut sim);
    }
}
