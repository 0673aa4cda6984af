//! QPN blocks (a device shared by several processes, one engine each): an
//! engine numbers its QPs inside its own block, moves data with a peer of
//! another block as with any other, hands out its QPNs in a cycle through
//! the block (a freed number comes back after all the others), starting
//! where its offset says and wrapping within the block, and refuses QP1
//! outside block 0.

use xroce::engine::{EngineConfig, QPN_BASE};
use xroce::verbs::sim::{
    connect_pair, derive_seed, sim_configs, LinkConfig, PairParams, Sim, SimLink,
};
use xroce::verbs::*;

use xroce::engine::sim::pattern;

const SEC: u64 = 1_000_000_000;

fn sim_with_blocks(block_a: u32, block_b: u32) -> Sim {
    let (mut ca, mut cb): (EngineConfig, EngineConfig) = sim_configs();
    ca.qpn_block = block_a;
    cb.qpn_block = block_b;
    Sim::new(
        Device::with_seed(ca, derive_seed(5, 1)),
        Device::with_seed(cb, derive_seed(5, 2)),
        SimLink::new(LinkConfig::default(), 5),
    )
}

#[test]
fn qps_are_numbered_in_the_engines_block_and_talk_across_blocks() {
    let mut sim = sim_with_blocks(3, 0);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    assert_eq!(a.qp.qp_num(), (3 << 16) + QPN_BASE);
    assert_eq!(b.qp.qp_num(), QPN_BASE);
    let msg = pattern(9, 5000);
    // SAFETY: nothing is posted on a.mr yet.
    unsafe { a.mr.write(0, &msg) }.unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: vec![b.mr.sge(0, 8192)],
    })
    .unwrap();
    a.qp.post_send(&SendWr::new(1, WrOpcode::Send, vec![a.mr.sge(0, 5000)]))
        .unwrap();
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let mut buf = [Wc::default(); 8];
    let ok = sim.run_until(sim.now + 10 * SEC, |_| {
        let n = a.cq.poll(&mut buf).unwrap();
        wa.extend_from_slice(&buf[..n]);
        let n = b.cq.poll(&mut buf).unwrap();
        wb.extend_from_slice(&buf[..n]);
        !wa.is_empty() && !wb.is_empty()
    });
    assert!(ok, "no completions: {wa:?} {wb:?}");
    assert_eq!(wa[0].status, WcStatus::Success);
    assert_eq!((wb[0].status, wb[0].byte_len), (WcStatus::Success, 5000));
    assert_eq!(wb[0].src_qp, (3 << 16) + QPN_BASE);
    // SAFETY: receive 7, the only WR that wrote these bytes, has completed.
    assert_eq!(unsafe { b.mr.to_vec(0, 5000) }.unwrap(), msg);
}

#[test]
fn qpns_cycle_through_the_block_and_stay_in_it() {
    let sim = sim_with_blocks(200, 0);
    let pd = sim.a.alloc_pd();
    let cq = sim.a.create_cq(16).unwrap();
    let init = QpInitAttr::rc(&cq);
    let q1 = sim.a.create_qp(&pd, &init).unwrap();
    let q2 = sim.a.create_qp(&pd, &init).unwrap();
    assert_eq!(q1.qp_num(), (200 << 16) + QPN_BASE);
    assert_eq!(q2.qp_num(), (200 << 16) + QPN_BASE + 1);
    let n1 = q1.qp_num();
    drop(q1);
    // A late packet for q1 must find no QP: the next QP takes the next
    // number, not the freed one.
    let q3 = sim.a.create_qp(&pd, &init).unwrap();
    assert_eq!(q3.qp_num(), (200 << 16) + QPN_BASE + 2);
    // Through the rest of the block (each number taken and freed) and
    // around: the freed first number comes back, q2's and q3's (live)
    // are skipped, and nothing leaves the block.
    let last = (200 << 16) + 0xffff;
    for n in (200 << 16) + QPN_BASE + 3..=last {
        let q = sim.a.create_qp(&pd, &init).unwrap();
        assert_eq!(q.qp_num(), n);
    }
    let again = sim.a.create_qp(&pd, &init).unwrap();
    assert_eq!(
        again.qp_num(),
        n1,
        "after the block's last QPN, the first free one"
    );
    let next = sim.a.create_qp(&pd, &init).unwrap();
    assert_eq!(
        next.qp_num(),
        (200 << 16) + QPN_BASE + 3,
        "live q2 and q3 are skipped"
    );
    drop((q2, q3));
}

/// With an offset (what a process draws at random, so that a restarted
/// program does not reuse its predecessor's QPNs), numbers start there,
/// wrap from the block's last QPN to its first, stay in the block, and
/// packets find their QP across the wrap.
#[test]
fn an_offset_starts_the_numbers_anywhere_in_the_block() {
    let (mut ca, mut cb): (EngineConfig, EngineConfig) = sim_configs();
    ca.qpn_block = 7;
    ca.qpn_offset = 0xffff - QPN_BASE; // the block's last QPN first
    cb.qpn_offset = 12345;
    let mut sim = Sim::new(
        Device::with_seed(ca, derive_seed(6, 1)),
        Device::with_seed(cb, derive_seed(6, 2)),
        SimLink::new(LinkConfig::default(), 6),
    );
    let pd = sim.a.alloc_pd();
    let cq = sim.a.create_cq(16).unwrap();
    let q1 = sim.a.create_qp(&pd, &QpInitAttr::rc(&cq)).unwrap();
    assert_eq!(q1.qp_num(), (7 << 16) + 0xffff, "starts at the offset");
    let (a, b) = connect_pair(&sim, &PairParams::default());
    assert_eq!(a.qp.qp_num(), (7 << 16) + QPN_BASE, "wrapped to the first");
    assert_eq!(b.qp.qp_num(), QPN_BASE + 12345);
    let msg = pattern(11, 3000);
    // SAFETY: nothing is posted on a.mr yet.
    unsafe { a.mr.write(0, &msg) }.unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![b.mr.sge(0, 4096)],
    })
    .unwrap();
    a.qp.post_send(&SendWr::new(2, WrOpcode::Send, vec![a.mr.sge(0, 3000)]))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [Wc::default(); 8];
    let ok = sim.run_until(sim.now + 10 * SEC, |_| {
        let n = b.cq.poll(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
        !got.is_empty()
    });
    assert!(ok, "no completion at b");
    assert_eq!(
        (got[0].status, got[0].src_qp),
        (WcStatus::Success, (7 << 16) + QPN_BASE)
    );
    // SAFETY: receive 1 has completed.
    assert_eq!(unsafe { b.mr.to_vec(0, 3000) }.unwrap(), msg);
    drop(q1);
}

#[test]
fn qp1_belongs_to_block_0_only() {
    let sim = sim_with_blocks(1, 0);
    let pd = sim.a.alloc_pd();
    let cq = sim.a.create_cq(16).unwrap();
    let mut init = QpInitAttr::rc(&cq);
    init.qp_type = QpType::Ud;
    match sim.a.create_gsi_qp(&pd, &init) {
        Err(e) => assert!(
            e.to_string().contains("QPN block 0"),
            "the error names the rule: {e}"
        ),
        Ok(_) => panic!("a GSI QP outside block 0 would never get its answers"),
    }
    let pd_b = sim.b.alloc_pd();
    let cq_b = sim.b.create_cq(16).unwrap();
    let mut init_b = QpInitAttr::rc(&cq_b);
    init_b.qp_type = QpType::Ud;
    assert_eq!(sim.b.create_gsi_qp(&pd_b, &init_b).unwrap().qp_num(), 1);
}
