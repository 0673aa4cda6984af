//! The simulator ([`crate::engine::sim`]) with a verbs [`Device`] at each
//! end, and connected endpoints made through the verbs API: what the tests
//! and examples of the verbs layer run on.

use super::cq::CompletionQueue;
use super::device::Device;
use super::pd::ProtectionDomain;
use super::qp::{QpInitAttr, QueuePair};
use crate::engine::memory::MemoryRegion;
pub use crate::engine::sim::{
    derive_seed, mark_ce, sim_configs, EngineHost, LinkConfig, LinkStats, PairParams, SimLink,
};

/// Two verbs devices joined by a [`SimLink`], in simulated time.
pub type Sim = crate::engine::sim::Sim<Device>;

/// Two devices with default configs (10.0.0.1 / 10.0.0.2), everything
/// random drawn from `seed`: the link's impairments and both devices'
/// MR keys (see [`crate::engine::sim`]).
pub fn sim_pair(link: LinkConfig, seed: u64) -> Sim {
    let (ca, cb) = sim_configs();
    Sim::new(
        Device::with_seed(ca, derive_seed(seed, 1)),
        Device::with_seed(cb, derive_seed(seed, 2)),
        SimLink::new(link, seed),
    )
}

/// One connected endpoint: PD, CQ, QP and a data MR.
pub struct Endpoint {
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub mr: MemoryRegion,
}

fn endpoint(dev: &Device, p: &PairParams) -> Endpoint {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(p.cq_depth).expect("cq");
    let mut init = QpInitAttr::rc(&cq);
    init.qp_type = p.qp_type;
    init.cap.max_send_wr = p.max_wr;
    init.cap.max_recv_wr = p.max_wr;
    let qp = dev.create_qp(&pd, &init).expect("qp");
    let mr = pd.reg_mr(p.mr_len, p.access).expect("mr");
    Endpoint { pd, cq, qp, mr }
}

/// Create an endpoint on each device of `sim` and connect their QPs.
pub fn connect_pair(sim: &Sim, p: &PairParams) -> (Endpoint, Endpoint) {
    let ea = endpoint(&sim.a, p);
    let eb = endpoint(&sim.b, p);
    let (ca, cb) = (sim.a.lock().config().clone(), sim.b.lock().config().clone());
    let ra = p.remote(&ca, ea.qp.qp_num(), p.psn_a);
    let rb = p.remote(&cb, eb.qp.qp_num(), p.psn_b);
    ea.qp
        .connect(&p.local_attr(p.psn_a), &rb)
        .expect("connect a");
    eb.qp
        .connect(&p.local_attr(p.psn_b), &ra)
        .expect("connect b");
    (ea, eb)
}
