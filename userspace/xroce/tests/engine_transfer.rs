//! Two engines over a simulated link: every operation type, sizes 0 B..1 MiB,
//! PSN wraparound, 0/1/5/20 % loss with reordering and duplication. Every
//! message must arrive exactly once, byte for byte, with in-order
//! completions of the right status.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use xroce::engine::sim::{connect_pair, Endpoint, LinkConfig, PairParams, Sim};
use xroce::verbs::*;

const SEC: u64 = 1_000_000_000;

fn drain(cq: &CompletionQueue, out: &mut Vec<Wc>) {
    let mut buf = [Wc::default(); 64];
    loop {
        let n = cq.poll(&mut buf).expect("cq overflow");
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..len).map(|_| r.random()).collect()
}

/// Run until `want_a` send completions on A and `want_b` completions on B.
fn run(
    sim: &mut Sim,
    a: &Endpoint,
    b: &Endpoint,
    want_a: usize,
    want_b: usize,
) -> (Vec<Wc>, Vec<Wc>) {
    let mut wa = Vec::new();
    let mut wb = Vec::new();
    let deadline = sim.now + 600 * SEC;
    let ok = sim.run_until(deadline, |_| {
        drain(&a.cq, &mut wa);
        drain(&b.cq, &mut wb);
        wa.len() >= want_a && wb.len() >= want_b
    });
    assert!(
        ok,
        "timed out: A {}/{} B {}/{} completions; A {:?} B {:?}; link {:?}",
        wa.len(),
        want_a,
        wb.len(),
        want_b,
        sim.a.stats(),
        sim.b.stats(),
        sim.link.stats
    );
    (wa, wb)
}

#[test]
fn basic_every_opcode_no_loss() {
    let mut sim = Sim::pair(LinkConfig::default(), 1);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let msg = pattern(7, 3000);
    a.mr.write(0, &msg).unwrap();
    // SEND / SEND_WITH_IMM / SEND_WITH_INV to posted receives.
    for i in 0..3 {
        b.qp.post_recv(&RecvWr {
            wr_id: 100 + i,
            sg_list: vec![b.mr.sge(i as usize * 4096, 4096)],
        })
        .unwrap();
    }
    let sge = a.mr.sge(0, 3000);
    a.qp.post_send(&SendWr::new(1, WrOpcode::Send, vec![sge]))
        .unwrap();
    a.qp.post_send(&SendWr::new(
        2,
        WrOpcode::SendWithImm { imm: 0xabcd },
        vec![a.mr.sge(0, 10)],
    ))
    .unwrap();
    a.qp.post_send(&SendWr::new(
        3,
        WrOpcode::SendWithInv {
            invalidate_rkey: 0x1234,
        },
        vec![],
    ))
    .unwrap();
    let (wa, wb) = run(&mut sim, &a, &b, 3, 3);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(
        wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(wb[0].byte_len, 3000);
    assert_eq!(wb[0].opcode, WcOpcode::Recv);
    assert_eq!(wb[0].src_qp, a.qp.qp_num());
    assert_eq!(b.mr.to_vec(0, 3000).unwrap(), msg);
    assert_eq!(wb[1].imm_data, 0xabcd);
    assert!(wb[1].flags.contains(WcFlags::WITH_IMM));
    assert_eq!(wb[2].byte_len, 0);
    assert!(wb[2].flags.contains(WcFlags::WITH_INV));
    assert_eq!(wb[2].invalidated_rkey, 0x1234);

    // RDMA WRITE, WRITE_WITH_IMM, READ, atomics.
    b.qp.post_recv(&RecvWr {
        wr_id: 200,
        sg_list: vec![],
    })
    .unwrap();
    let remote = b.mr.addr() + 65536;
    a.qp.post_send(&SendWr::new(
        10,
        WrOpcode::RdmaWrite {
            remote_addr: remote,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, 3000)],
    ))
    .unwrap();
    a.qp.post_send(&SendWr::new(
        11,
        WrOpcode::RdmaWriteWithImm {
            remote_addr: remote + 8192,
            rkey: b.mr.rkey(),
            imm: 5,
        },
        vec![a.mr.sge(0, 100)],
    ))
    .unwrap();
    a.qp.post_send(&SendWr::new(
        12,
        WrOpcode::RdmaRead {
            remote_addr: remote,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(100_000, 3000)],
    ))
    .unwrap();
    let counter = b.mr.addr() + 200_000;
    a.qp.post_send(&SendWr::new(
        13,
        WrOpcode::AtomicFetchAndAdd {
            remote_addr: counter,
            rkey: b.mr.rkey(),
            add: 5,
        },
        vec![a.mr.sge(200_000, 8)],
    ))
    .unwrap();
    a.qp.post_send(&SendWr::new(
        14,
        WrOpcode::AtomicCmpAndSwp {
            remote_addr: counter,
            rkey: b.mr.rkey(),
            compare: 5,
            swap: 77,
        },
        vec![a.mr.sge(200_008, 8)],
    ))
    .unwrap();
    let (wa, wb) = run(&mut sim, &a, &b, 5, 1);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(
        wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![10, 11, 12, 13, 14]
    );
    assert_eq!(wa[2].opcode, WcOpcode::RdmaRead);
    assert_eq!(b.mr.to_vec(65536, 3000).unwrap(), msg);
    assert_eq!(a.mr.to_vec(100_000, 3000).unwrap(), msg);
    assert_eq!(wb[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(wb[0].imm_data, 5);
    assert_eq!(wb[0].byte_len, 100);
    assert_eq!(a.mr.load_u64(200_000).unwrap(), 0);
    assert_eq!(a.mr.load_u64(200_008).unwrap(), 5);
    assert_eq!(b.mr.load_u64(200_000).unwrap(), 77);
}
