//! A lossless link shows no go-back-N for READ (issue 27): on a busy host
//! the responder's thread can be off its core long enough for the
//! requester's tail-loss probe to fire while READ responses are still
//! queued. The probe repeats the READ request at the last PSN sent, which
//! is the last response PSN of the last READ; the responder must not answer
//! it by cutting that READ's queued response down to its last packet (the
//! requester would see a gap where nothing was lost, count an
//! out-of-sequence response and retransmit every READ after it).

use std::sync::Mutex;

use xroce_transport::engine::completion::{Completion, WcStatus};
use xroce_transport::engine::sim::{connect_engines, EngineHost, LinkConfig, PairParams, Sim};
use xroce_transport::engine::work::{SendWr, WrOpcode};
use xroce_transport::engine::Engine;

use xroce_transport::engine::sim::pattern;

const MS: u64 = 1_000_000;
const READ: usize = 4096;

fn lk(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    EngineHost::lock(m)
}

/// Every frame `from` has ready at `now`, handed to `to`; how many.
fn carry(from: &Mutex<Engine>, to: &Mutex<Engine>, now: u64) -> usize {
    let mut buf = vec![0u8; 9000];
    let mut n = 0;
    while let Some(len) = lk(from).poll_transmit_frame(now, &mut buf) {
        lk(to).handle_frame(&buf[..len], now);
        n += 1;
    }
    n
}

#[test]
fn a_tail_probe_behind_queued_read_responses_causes_no_retransmission() {
    // Timeout 14 (67 ms): the probe comes after 2 ms without progress.
    let p = PairParams {
        timeout: 14,
        psn_a: 5000,
        ..Default::default()
    };
    let mut sim = Sim::engine_pair(LinkConfig::default(), 61);
    let (a, b) = connect_engines(&sim, &p);
    let data = pattern(61, 3 * READ);
    // SAFETY: no work request is posted yet.
    unsafe { b.mr.write(0, &data).unwrap() };
    for i in 0..3u64 {
        let off = i as usize * READ;
        let wr = SendWr::new(
            i,
            WrOpcode::RdmaRead {
                remote_addr: b.mr.addr() + off as u64,
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(off, READ)],
        );
        lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    }
    // A sends the three requests; B takes them, then its thread is off
    // its core for 3 ms: nothing answers them yet.
    let mut now = sim.now;
    assert_eq!(carry(&sim.a, &sim.b, now), 3);
    now += 3 * MS;
    let due = lk(&sim.a).poll_timeout().expect("A's timer is armed");
    assert!(due <= now, "the probe is due within 3 ms");
    lk(&sim.a).handle_timeout(now);
    // The probe: the READ request at the last PSN sent, a duplicate.
    assert_eq!(carry(&sim.a, &sim.b, now), 1);
    // B runs again; both sides exchange everything until A is done.
    let mut done: Vec<Completion> = Vec::new();
    let deadline = now + 200 * MS;
    while done.len() < 3 && now < deadline {
        carry(&sim.b, &sim.a, now);
        carry(&sim.a, &sim.b, now);
        lk(&sim.a).take_completions(&mut done);
        now += 10_000;
        sim.fire_due_timers(now);
    }
    sim.now = now;
    let got: Vec<_> = done.iter().map(|c| (c.wc.wr_id, c.wc.status)).collect();
    assert_eq!(got, [0, 1, 2].map(|i| (i, WcStatus::Success)));
    // SAFETY: the READs have completed.
    assert_eq!(unsafe { a.mr.to_vec(0, 3 * READ) }.unwrap(), data);
    let (sa, sb) = (lk(&sim.a).stats(), lk(&sim.b).stats());
    assert_eq!(
        (sa.rx_out_of_sequence, sa.retries_started, sa.retry_timeouts),
        (0, 0, 0),
        "requester: {sa:?}"
    );
    // The probe is the one request sent twice; the responder had not yet
    // sent the PSN it names, so nothing is sent twice in answer.
    assert_eq!(sa.tx_retransmitted, 1, "{sa:?}");
    assert_eq!(sb.read_reexecuted, 0, "{sb:?}");
    assert_eq!(sb.tx_read_responses, 3 * 4, "{sb:?}");
}
