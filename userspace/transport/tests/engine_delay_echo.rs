//! Swift between two xroce engines whose threads are off their cores for
//! milliseconds at a time (a busy host), on a link that never queues: the
//! round trip the engines meet is mostly that wait, the fabric's is a few
//! microseconds. With the responder's delay echo and the arrival times
//! (selective repeat agreed: both are xroce), Swift sees the fabric and
//! keeps its rate; without them (selective repeat off: no echo) it read the
//! wait as queueing and sat at its floor.

use std::sync::{Arc, Mutex};

use xroce_transport::cc::{CongestionControl, Swift, SwiftConfig};
use xroce_transport::engine::completion::{Completion, WcStatus};
use xroce_transport::engine::memory::MrTable;
use xroce_transport::engine::qp_attr::Mtu;
use xroce_transport::engine::qp_info::QpInfo;
use xroce_transport::engine::sim::{
    connect_engines, derive_seed, pattern, sim_configs, EngineEndpoint, EngineHost, LinkConfig,
    OffCore, PairParams, Sim, SimLink,
};
use xroce_transport::engine::work::{SendWr, WrOpcode};
use xroce_transport::engine::{Engine, SrMode};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const LINE: u64 = 10_000_000_000;
/// A's source data, then where B receives it (READs: the other way).
const REGION: usize = 4 << 20;
const SIZE: usize = 64 << 10;
/// Bytes moved: enough round trips for Swift to settle where it settles.
const TOTAL: usize = 32 << 20;

type EngineSim = Sim<Mutex<Engine>>;

fn lk(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    EngineHost::lock(m)
}

/// A pair with Swift (the software preset) on both ends, recovery `sr`,
/// and each thread off its core 1 ms (A) and 2 ms (B) of every 4 ms, at
/// different times.
fn busy_pair(sr: SrMode, seed: u64) -> (EngineSim, EngineEndpoint, EngineEndpoint) {
    let (mut ca, mut cb) = sim_configs();
    for c in [&mut ca, &mut cb] {
        c.selective_repeat = sr;
        c.line_rate_bps = LINE;
        c.cc = Some(Arc::new(|| {
            Box::new(Swift::new(LINE, SwiftConfig::software())) as Box<dyn CongestionControl>
        }));
    }
    let engine = |cfg, stream| {
        Mutex::new(Engine::new(
            cfg,
            Arc::new(MrTable::seeded(derive_seed(seed, stream))),
        ))
    };
    let link = LinkConfig {
        delay_ns: 5 * US,
        rate_bps: LINE,
        ..Default::default()
    };
    let mut sim = Sim::new(engine(ca, 1), engine(cb, 2), SimLink::new(link, seed));
    let p = PairParams {
        mtu: Mtu::Mtu4096,
        mr_len: 2 * REGION,
        timeout: 18,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    sim.off_core = [
        Some(OffCore {
            period_ns: 4 * MS,
            off_ns: MS,
            phase_ns: 0,
        }),
        Some(OffCore {
            period_ns: 4 * MS,
            off_ns: 2 * MS,
            phase_ns: 2 * MS,
        }),
    ];
    (sim, a, b)
}

/// Moves [`TOTAL`] bytes from A to B by `SIZE` WRITEs (or into A by
/// READs), REGION at a time, and returns the simulated time it took and A's
/// QP at the end; the data must arrive whole and the completions in order.
fn transfer(sr: SrMode, read: bool) -> (u64, QpInfo) {
    let (mut sim, a, b) = busy_pair(sr, 7);
    let data = pattern(7, REGION);
    let (src, dst) = if read { (&b, &a) } else { (&a, &b) };
    // SAFETY: no work request is posted yet.
    unsafe { src.mr.write(0, &data) }.unwrap();
    let n = (TOTAL / SIZE) as u64;
    for id in 0..n {
        let off = id as usize * SIZE % REGION;
        let remote = |e: &EngineEndpoint, at: usize| (e.mr.addr() + at as u64, e.mr.rkey());
        let wr = if read {
            let (remote_addr, rkey) = remote(&b, off);
            SendWr::new(
                id,
                WrOpcode::RdmaRead { remote_addr, rkey },
                vec![a.mr.sge(REGION + off, SIZE)],
            )
        } else {
            let (remote_addr, rkey) = remote(&b, REGION + off);
            SendWr::new(
                id,
                WrOpcode::RdmaWrite { remote_addr, rkey },
                vec![a.mr.sge(off, SIZE)],
            )
        };
        lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    }
    let start = sim.now;
    let mut done: Vec<Completion> = Vec::new();
    let ok = sim.run_until(start + 120 * SEC, |s| {
        lk(&s.a).take_completions(&mut done);
        done.len() as u64 >= n
    });
    assert!(ok, "{}/{n} done; A {:?}", done.len(), lk(&sim.a).stats());
    let took = sim.now - start;
    let got: Vec<(u64, WcStatus)> = done.iter().map(|c| (c.wc.wr_id, c.wc.status)).collect();
    assert_eq!(
        got,
        (0..n).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    // SAFETY: every work request has completed.
    let moved = unsafe { dst.mr.to_vec(REGION, REGION) }.unwrap();
    assert!(moved == data, "the data arrived whole");
    let info = lk(&sim.a)
        .qp_infos()
        .into_iter()
        .find(|q| q.qpn == a.qpn)
        .unwrap();
    (took, info)
}

fn check(read: bool) {
    let (echoed, qa) = transfer(SrMode::Auto, read);
    let (plain, qp) = transfer(SrMode::Off, read);
    let what = if read { "READ" } else { "WRITE" };
    assert!(
        qa.sr_requester,
        "two xroce engines agree on selective repeat"
    );
    let fabric = qa.last_fabric_rtt_ns.expect("the peer echoed its delay");
    assert!(
        fabric < 200 * US,
        "{what}: Swift's last sample {fabric} ns is the fabric's (the link: 10 us and serialisation)"
    );
    assert_eq!(
        qp.last_fabric_rtt_ns, None,
        "no echo without selective repeat"
    );
    let rates = format!(
        "rate at the end {} vs {} Mbit/s",
        qa.rate_bps / 1_000_000,
        qp.rate_bps / 1_000_000
    );
    eprintln!(
        "{what}: {} ms with the echo, {} ms without; {rates}",
        echoed / MS,
        plain / MS
    );
    assert!(qa.rate_bps >= LINE / 2, "{what}: with the echo, {rates}");
    assert!(qp.rate_bps < LINE / 2, "{what}: without the echo, {rates}");
    if read {
        // READ data is the responder's, paced by B's controller, which has
        // no samples (B sends no requests): A's rate paces only requests.
        return;
    }
    // 32 MiB at 10 Gbit/s is 27 ms on the wire; with each thread off a
    // quarter and a half of the time, a few times that. At Swift's floor
    // (10 Mbit/s) it is 27 s.
    assert!(
        echoed * 10 <= plain,
        "{what}: {} ms with the echo, {} ms without ({rates})",
        echoed / MS,
        plain / MS,
    );
    assert!(
        echoed < 300 * MS,
        "{what}: {} ms with the echo",
        echoed / MS
    );
}

#[test]
fn writes_between_busy_hosts_keep_their_rate_when_the_peer_echoes_its_delay() {
    check(false);
}

#[test]
fn reads_between_busy_hosts_keep_their_rate_when_the_peer_echoes_its_delay() {
    check(true);
}
