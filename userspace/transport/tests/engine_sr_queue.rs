//! Selective repeat behind a standing queue deeper than the tail-loss
//! probe's cap (8 ms): nothing is lost, the ACKs just come late and in
//! bursts. The probes may send the last packet again, but a probe must
//! not send every unacknowledged packet again each round trip: in a real
//! incast (4 senders into 200 Mbit/s) those copies joined the queue that
//! delayed the ACKs, and the link carried little else (7 % goodput).

use std::sync::Mutex;

use xroce_transport::engine::completion::{Completion, WcStatus};
use xroce_transport::engine::qp_attr::Mtu;
use xroce_transport::engine::sim::{
    connect_engines, pattern, EngineEndpoint, EngineHost, LinkConfig, PairParams, Sim,
};
use xroce_transport::engine::work::{SendWr, WrOpcode};
use xroce_transport::engine::Engine;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// A's source data, then where B receives it.
const REGION: usize = 1 << 20;
const SIZE: usize = 16 << 10;

type EngineSim = Sim<Mutex<Engine>>;

fn lk(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    EngineHost::lock(m)
}

fn write(id: u64, a: &EngineEndpoint, b: &EngineEndpoint) -> SendWr {
    let off = id as usize % (REGION / SIZE) * SIZE;
    SendWr::new(
        id,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr() + (REGION + off) as u64,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(off, SIZE)],
    )
}

/// Posts WRITEs `ids` from A and runs until all complete, in order.
fn writes(sim: &mut EngineSim, a: &EngineEndpoint, b: &EngineEndpoint, ids: std::ops::Range<u64>) {
    for id in ids.clone() {
        lk(&sim.a).post_send(a.qpn, &write(id, a, b)).unwrap();
    }
    let mut done: Vec<Completion> = Vec::new();
    let want = ids.clone().count();
    let ok = sim.run_until(sim.now + 60 * SEC, |s| {
        lk(&s.a).take_completions(&mut done);
        done.len() >= want
    });
    assert!(ok, "{}/{want} done; A {:?}", done.len(), lk(&sim.a).stats());
    let got: Vec<(u64, WcStatus)> = done.iter().map(|c| (c.wc.wr_id, c.wc.status)).collect();
    let expected: Vec<(u64, WcStatus)> = ids.map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(got, expected, "completions in order");
}

/// A pair (seeded with `seed`) after a warm-up on the short path:
/// selective repeat agreed, a round trip of microseconds learnt, A's
/// source data (returned) in place.
fn warmed_up(seed: u64) -> (EngineSim, EngineEndpoint, EngineEndpoint, Vec<u8>) {
    let mut sim = Sim::engine_pair(LinkConfig::default(), seed);
    // UCX's local ACK timeout (1.07 s): only the probes can fire.
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        mr_len: 2 * REGION,
        timeout: 18,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    let data = pattern(seed, REGION);
    // SAFETY: no work request is posted yet.
    unsafe { a.mr.write(0, &data) }.unwrap();
    writes(&mut sim, &a, &b, 0..4);
    let sr = lk(&sim.a).selective_repeat(a.qpn).unwrap();
    assert!(sr.requester, "A's requester switched to selective repeat");
    (sim, a, b, data)
}

#[test]
fn a_standing_queue_deeper_than_the_probe_time_does_not_draw_windows_sent_again() {
    let (mut sim, a, b, data) = warmed_up(41);

    // Then 60 ms round trips: a queue the other senders keep full.
    sim.link.cfg.delay_ns = 30 * MS;
    let before = lk(&sim.a).stats();
    let msgs = 64;
    writes(&mut sim, &a, &b, 4..4 + msgs);
    // What is still on the way arrives.
    sim.run_until(sim.now + 100 * MS, |_| false);
    let after = lk(&sim.a).stats();
    let sent = after.tx_data_packets - before.tx_data_packets;
    let again = after.tx_retransmitted - before.tx_retransmitted;
    let packets = msgs * (SIZE as u64 / 1024);
    assert_eq!(after.retry_timeouts, before.retry_timeouts, "no timeout");
    // The estimate catches up after a few probes; until then each probe
    // may send a window, each waiting four times as long as the one before
    // (without that, 7,616 probes sent 121,920 copies of 1,024 packets).
    let windows = after.probe_retries - before.probe_retries;
    assert!(
        windows <= 4 && again * 8 <= packets,
        "{again} of {sent} packets sent again for {packets} ({windows} probes sent windows)"
    );
    // SAFETY: every WRITE has completed.
    let at_b = unsafe { b.mr.to_vec(REGION, REGION) }.unwrap();
    assert!(at_b == data, "A's data at B");
    assert_eq!(
        lk(&sim.b).stats().rx_duplicate,
        again,
        "every copy sent again reached B as a duplicate: none was lost"
    );
}

/// A peer whose ACKs stop for a few milliseconds with nothing lost (on a
/// busy host its thread is off its core for a scheduler tick or two):
/// the probes in that silence send one packet each, never every
/// unacknowledged packet again. Sending them all on the second probe cost
/// 760 duplicates a second in a 64 KiB WRITE stream on 2 cores.
#[test]
fn a_silence_of_a_few_milliseconds_draws_single_packet_probes() {
    let (mut sim, a, b, data) = warmed_up(43);

    // 8 WRITEs (128 packets) whose ACKs come 4 ms late: many probe times.
    sim.link.cfg.delay_ns = 2 * MS;
    let before = lk(&sim.a).stats();
    writes(&mut sim, &a, &b, 4..12);
    sim.run_until(sim.now + 20 * MS, |_| false);
    let after = lk(&sim.a).stats();
    let again = after.tx_retransmitted - before.tx_retransmitted;
    let probes = after.probe_retries - before.probe_retries;
    assert_eq!(after.retry_timeouts, before.retry_timeouts, "no timeout");
    assert!(probes >= 1, "the silence outlasted two probe times");
    assert!(
        again <= 8,
        "{again} packets sent again in a silence without loss ({probes} second probes)"
    );
    // SAFETY: every WRITE has completed.
    let at_b = unsafe { b.mr.to_vec(REGION, REGION) }.unwrap();
    assert!(at_b[..12 * SIZE] == data[..12 * SIZE], "A's data at B");
    assert_eq!(lk(&sim.b).stats().rx_duplicate, again, "nothing was lost");
}
