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

/// A connected pair plus valid frames both engines produced (they are
/// also put on the link, so the engines' state stays consistent).
fn setup_with_corpus(seed: u64) -> (Sim, Endpoint, Endpoint, Vec<(bool, Vec<u8>)>) {
    let (mut sim, a, b) = setup(seed);
    let mut corp = Vec::new();
    let mut buf = vec![0u8; 9000];
    for _ in 0..50 {
        for (to_b, dev) in [(true, sim.a.clone()), (false, sim.b.clone())] {
            while let Some(n) = dev.poll_transmit(sim.now, &mut buf) {
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
        let (mut sim, _a, _b, corp) = setup_with_corpus(seed);
        assert!(!corp.is_empty());
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
        remote_ok: bool,
    },
    Recv {
        a_side: bool,
        len: u32,
        key_ok: bool,
    },
    Step(u8),
    Poll,
    DropMr,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        (
            any::<bool>(),
            0u8..7,
            any::<u32>(),
            any::<u8>(),
            any::<u32>()
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
            any::<bool>()
        )
            .prop_map(|(a_side, op, addr_off, len, key_ok, flags, remote_ok)| {
                Action::Post {
                    a_side,
                    op,
                    addr_off,
                    len,
                    key_ok,
                    flags,
                    remote_ok,
                }
            }),
        (any::<bool>(), 0u32..70_000, any::<bool>()).prop_map(|(a_side, len, key_ok)| {
            Action::Recv {
                a_side,
                len,
                key_ok,
            }
        }),
        (1u8..50).prop_map(Action::Step),
        Just(Action::Poll),
        Just(Action::DropMr),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random verbs calls (legal and illegal transitions and attributes,
    /// bad keys, huge lengths, posting in every state, deregistering MRs
    /// with traffic in flight) interleaved with a lossy link: errors are
    /// returned or completed, nothing panics.
    #[test]
    fn random_verbs_sequences(actions in proptest::collection::vec(action(), 1..60), seed in 0u64..8) {
        let (mut sim, a, b) = setup(seed);
        let mut extra = vec![
            a.pd.reg_mr(4096, AccessFlags::all()).unwrap(),
            b.pd.reg_mr(4096, AccessFlags::all()).unwrap(),
        ];
        let mut wcs = [Wc::default(); 16];
        for act in actions {
            match act {
                Action::Modify { a_side, state, mask, val, psn } => {
                    let ep = if a_side { &a } else { &b };
                    let st = [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Err][state as usize];
                    let attr = QpAttr {
                        qp_state: st,
                        qp_access_flags: AccessFlags::from_bits_truncate(val as u32),
                        path_mtu: [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096][val as usize % 5],
                        dest_qp_num: psn % 64,
                        rq_psn: psn,
                        sq_psn: psn.rotate_left(7),
                        timeout: val % 40,
                        retry_cnt: val % 9,
                        rnr_retry: val % 9,
                        min_rnr_timer: val % 33,
                        max_rd_atomic: val % 20,
                        max_dest_rd_atomic: val % 20,
                        ..Default::default()
                    };
                    let _ = ep.qp.modify(&attr, QpAttrMask::from_bits_truncate(mask) | QpAttrMask::STATE);
                }
                Action::Post { a_side, op, addr_off, len, key_ok, flags, remote_ok } => {
                    let (ep, peer) = if a_side { (&a, &b) } else { (&b, &a) };
                    let mut sge = ep.mr.sge(0, 0);
                    sge.addr = ep.mr.addr() + addr_off;
                    sge.length = len;
                    if !key_ok { sge.lkey = sge.lkey.rotate_left(3); }
                    let (raddr, rkey) = if remote_ok {
                        (peer.mr.addr() + addr_off, peer.mr.rkey())
                    } else {
                        (addr_off, addr_off as u32)
                    };
                    let opc = match op {
                        0 => WrOpcode::Send,
                        1 => WrOpcode::SendWithImm { imm: len },
                        2 => WrOpcode::SendWithInv { invalidate_rkey: rkey },
                        3 => WrOpcode::RdmaWrite { remote_addr: raddr, rkey },
                        4 => WrOpcode::RdmaWriteWithImm { remote_addr: raddr, rkey, imm: 1 },
                        5 => WrOpcode::RdmaRead { remote_addr: raddr, rkey },
                        6 => WrOpcode::AtomicCmpAndSwp { remote_addr: raddr, rkey, compare: 0, swap: 1 },
                        _ => WrOpcode::AtomicFetchAndAdd { remote_addr: raddr, rkey, add: 1 },
                    };
                    let wr = SendWr::new(1, opc, vec![sge]).flags(SendFlags::from_bits_truncate(flags));
                    let _ = ep.qp.post_send(&wr);
                }
                Action::Recv { a_side, len, key_ok } => {
                    let ep = if a_side { &a } else { &b };
                    let mut sge = ep.mr.sge(0, len as usize);
                    if !key_ok { sge.lkey ^= 1; }
                    let _ = ep.qp.post_recv(&RecvWr { wr_id: 3, sg_list: vec![sge] });
                }
                Action::Step(n) => {
                    for _ in 0..n { if !sim.step() { break; } }
                }
                Action::Poll => {
                    let _ = a.cq.poll(&mut wcs);
                    let _ = b.cq.poll(&mut wcs);
                }
                Action::DropMr => { extra.pop(); }
            }
        }
        finish(&mut sim);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random datagrams (opcodes, Q_Keys, sizes, ECN) to UD and UC QPs with
    /// receive buffers of random sizes.
    #[test]
    fn ud_and_uc_receivers(
        pkts in proptest::collection::vec((any::<u8>(), any::<bool>(), any::<u32>(), 0usize..5000, any::<u8>(), any::<u32>()), 1..40),
        bufs in proptest::collection::vec(0usize..3000, 0..8),
    ) {
        let sim = Sim::pair(LinkConfig::default(), 1);
        let pd = sim.b.alloc_pd();
        let cq = sim.b.create_cq(16).unwrap();
        let mr = pd.reg_mr(1 << 16, AccessFlags::all()).unwrap();
        let mut qps = Vec::new();
        for t in [QpType::Ud, QpType::Uc] {
            let mut init = QpInitAttr::rc(&cq);
            init.qp_type = t;
            let qp = sim.b.create_qp(&pd, &init).unwrap();
            let mut a = QpAttr { qp_state: QpState::Init, qkey: 5, qp_access_flags: AccessFlags::all(), ..Default::default() };
            qp.modify(&a, QpAttrMask::STATE | QpAttrMask::QKEY | QpAttrMask::ACCESS_FLAGS).unwrap();
            a.qp_state = QpState::Rtr;
            let m = QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
            qp.modify(&a, m).unwrap();
            for (i, len) in bufs.iter().enumerate() {
                let _ = qp.post_recv(&RecvWr { wr_id: i as u64, sg_list: vec![mr.sge(i * 3000, *len)] });
            }
            qps.push(qp);
        }
        let mut buf = vec![0u8; 9000];
        for (opcode, ud, key, plen, ecn, psn) in pkts {
            let qp = &qps[if ud { 0 } else { 1 }];
            let opcode = if ud { 0x64 | (opcode & 1) } else { 0x20 | (opcode % 0x0c) };
            let h = PktHdr {
                dst_mac: [2, 0, 0, 0, 0, 2],
                src_mac: [2, 0, 0, 0, 0, 1],
                src_ip: [10, 0, 0, 1],
                dst_ip: [10, 0, 0, 2],
                udp_sport: 0xc000,
                opcode,
                pkey: 0xffff,
                dqpn: qp.qp_num(),
                psn: psn & 0xff_ffff,
                ecn: ecn & 3,
                deth: Some((if key & 1 == 0 { 5 } else { key }, key >> 8)),
                reth: Some(Reth { va: mr.addr() + (key as u64 % 70000), rkey: mr.rkey(), len: plen as u32 }),
                imm: Some(key),
                ..Default::default()
            };
            if let Some(n) = codec::emit(&h, &vec![0x11; plen], &mut buf) {
                sim.b.handle_frame(&buf[..n], 1_000);
            }
            let mut wcs = [Wc::default(); 16];
            let _ = cq.poll(&mut wcs);
        }
    }
}
