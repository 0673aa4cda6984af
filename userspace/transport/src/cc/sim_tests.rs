//! A deterministic closed-loop check of the pieces together: N paced senders
//! run a congestion controller into the XDP congestion point's virtual queue
//! (`xroce_common::congestion`), and the notification point answers CE marks with at
//! most one CNP per flow per 50 us after a feedback delay. An incast in
//! miniature, without sockets or threads.
//!
//! Each sender paces exactly as an engine QP does: the engine's
//! [`Pacer`] with [`EngineConfig`]'s default bucket, gated on the largest
//! frame at MTU 4096 (`may_send`), charged with each frame sent
//! (`on_send`). A last test runs that pacer inside the engine itself, two
//! simulated devices and a fixed-rate controller.

use super::{build_with, CcConfig, CcKind, Pacer};
use crate::engine::qp::pacing_frame_bytes;
use crate::engine::EngineConfig;
use xroce_common::{
    congestion::{congestion_point, DropReason, EcnConfig, EcnPolicy, Verdict, VirtualQueue},
    ecn::Ecn,
    fixed::fraction_to_fixed,
};

struct Outcome {
    /// Bytes each flow got through the queue in the measured window.
    goodput: Vec<u64>,
    /// Largest backlog in the measured window.
    max_queue: u64,
    /// Mean backlog in the measured window.
    mean_queue: u64,
    tail_drops: u64,
    cnps: u64,
    /// The backlog every 10 steps of the measured window.
    queue_samples: Vec<u64>,
}

const LINK: u64 = 10_000_000_000;
const FRAME: u64 = 4_096 + 78;

/// The bottleneck and feedback loop a closed-loop run models.
#[derive(Clone, Copy)]
struct Scenario {
    link_bps: u64,
    /// Bytes of every data frame on the wire.
    frame: u64,
    /// The RoCE MTU the pacer gates on.
    mtu: u32,
    /// RED marking, bytes; tail drop beyond `buffer`.
    kmin: u64,
    kmax: u64,
    buffer: u64,
    /// From a CE mark at the bottleneck to its CNP at the sender, ns.
    feedback_ns: u64,
    /// Time step of the loop, ns.
    step_ns: u64,
    /// Flows from this index on stop sending at this time (a departure
    /// that frees capacity for the others).
    stop: Option<(usize, u64)>,
}

/// The 10 Gbit/s switch-scale loop of the tests below: 4 KB frames, CNPs
/// 10 us after the mark.
const SWITCH: Scenario = Scenario {
    link_bps: LINK,
    frame: FRAME,
    mtu: 4096,
    kmin: 5_000,
    kmax: 200_000,
    buffer: 1_000_000,
    feedback_ns: 10_000,
    step_ns: 100,
    stop: None,
};

fn run(kind: CcKind, cfg: &CcConfig, flows: usize, duration_ns: u64, warmup_ns: u64) -> Outcome {
    run_in(SWITCH, kind, cfg, flows, duration_ns, warmup_ns)
}

fn run_in(
    sc: Scenario,
    kind: CcKind,
    cfg: &CcConfig,
    flows: usize,
    duration_ns: u64,
    warmup_ns: u64,
) -> Outcome {
    let (link, frame) = (sc.link_bps, sc.frame);
    let ecn = EcnConfig {
        enabled: 1,
        policy: EcnPolicy::Red as u32,
        link_rate_bps: link,
        kmin: sc.kmin,
        kmax: sc.kmax,
        buffer_bytes: sc.buffer,
        pmax_fixed: fraction_to_fixed(0.01),
        _pad: 0,
    };
    let mut ccs: Vec<_> = (0..flows).map(|_| build_with(kind, link, cfg)).collect();
    let burst = EngineConfig::default().pacing_burst_bytes;
    let mut pacers: Vec<_> = (0..flows).map(|_| Pacer::new(burst)).collect();
    let gate = pacing_frame_bytes(sc.mtu);
    let mut q = VirtualQueue::default();
    // Notification point state and CNPs in flight: (arrival time, flow).
    let mut last_cnp: Vec<Option<u64>> = vec![None; flows];
    let mut in_flight: Vec<(u64, usize)> = Vec::new();
    // ACKs in flight: (arrival time, flow, RTT sample). The RTT is the base
    // RTT plus the time the frame waits in the virtual queue.
    let mut acks: Vec<(u64, usize, u64)> = Vec::new();
    let base_rtt_ns = 20_000;
    let feedback_ns = sc.feedback_ns;
    let cnp_interval_ns = EngineConfig::default().cnp_interval_ns;
    let mut rng: u64 = 0x1234_5678_9abc_def0;
    let mut out = Outcome {
        goodput: vec![0; flows],
        max_queue: 0,
        mean_queue: 0,
        tail_drops: 0,
        cnps: 0,
        queue_samples: Vec::new(),
    };
    let (mut queue_sum, mut queue_samples) = (0u128, 0u128);
    let step = sc.step_ns;
    let mut now = 0;
    let mut steps = 0u64;
    while now < duration_ns {
        in_flight.retain(|&(at, f)| {
            if at <= now {
                ccs[f].on_cnp(at);
                false
            } else {
                true
            }
        });
        acks.retain(|&(at, f, rtt)| {
            if at <= now {
                ccs[f].on_ack(at, frame as usize, Some(rtt));
                false
            } else {
                true
            }
        });
        for f in 0..flows {
            if ccs[f].next_timer_ns().is_some_and(|t| t <= now) {
                ccs[f].on_timer(now);
            }
            if sc.stop.is_some_and(|(n, at)| f >= n && now >= at) {
                continue;
            }
            let rate = ccs[f].rate_bps();
            if !pacers[f].may_send(now, rate, gate) {
                continue;
            }
            pacers[f].on_send(now, rate, frame as usize);
            ccs[f].on_send(now, frame as usize);
            // xorshift64 for the marking draw.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            match congestion_point(&mut q, &ecn, now, frame, Ecn::Ect0, (rng >> 32) as u32) {
                Verdict::Drop(DropReason::TailDrop) => {
                    out.tail_drops += u64::from(now >= warmup_ns)
                }
                Verdict::Drop(DropReason::NotEct) => unreachable!("senders set ECT(0)"),
                v => {
                    let rtt = base_rtt_ns + q.backlog_bytes * 8_000_000_000 / link;
                    acks.push((now + rtt, f, rtt));
                    if now >= warmup_ns {
                        out.goodput[f] += frame;
                    }
                    if v == Verdict::Mark && last_cnp[f].is_none_or(|t| now >= t + cnp_interval_ns)
                    {
                        last_cnp[f] = Some(now);
                        in_flight.push((now + feedback_ns, f));
                        out.cnps += 1;
                    }
                }
            }
        }
        if now >= warmup_ns {
            let b = q.backlog_at(now, link);
            out.max_queue = out.max_queue.max(b);
            queue_sum += b as u128;
            queue_samples += 1;
            if steps.is_multiple_of(10) {
                out.queue_samples.push(b);
            }
        }
        steps += 1;
        now += step;
    }
    out.mean_queue = (queue_sum / queue_samples.max(1)) as u64;
    out
}

fn jain(xs: &[u64]) -> f64 {
    let sum: f64 = xs.iter().map(|&x| x as f64).sum();
    let sq: f64 = xs.iter().map(|&x| (x as f64) * (x as f64)).sum();
    sum * sum / (xs.len() as f64 * sq)
}

#[test]
fn dcqcn_incast_keeps_queue_bounded_and_fair() {
    let (duration, warmup) = (40_000_000, 20_000_000);
    let d = run(CcKind::Dcqcn, &CcConfig::default(), 4, duration, warmup);
    let window_s = (duration - warmup) as f64 / 1e9;
    let total_bps = d.goodput.iter().sum::<u64>() as f64 * 8.0 / window_s;
    let fairness = jain(&d.goodput);
    let n = run(CcKind::None, &CcConfig::default(), 4, duration, warmup);
    eprintln!(
        "dcqcn: util {:.3} jain {:.3} mean q {} max q {} drops {} cnps {} | none: max q {} drops {}",
        total_bps / LINK as f64,
        fairness,
        d.mean_queue,
        d.max_queue,
        d.tail_drops,
        d.cnps,
        n.max_queue,
        n.tail_drops
    );
    assert_eq!(d.tail_drops, 0, "DCQCN never fills the 1 MB buffer");
    assert!(d.max_queue < 400_000, "max queue {}", d.max_queue);
    assert!(total_bps > 0.85 * LINK as f64, "utilisation {total_bps}");
    assert!(fairness > 0.95, "Jain {fairness}");
    // Without congestion control the queue sits at the buffer and drops.
    assert!(n.max_queue > 900_000 && n.tail_drops > 0);
}

#[test]
fn timely_incast_keeps_queue_below_thigh() {
    let (duration, warmup) = (40_000_000, 20_000_000);
    // Every ACK with an RTT sample is a completion event (the default).
    // Gating events to 16 KB segments instead (the paper's segment size,
    // `segment_bytes: 16 * 1024`) collapses this start-up incast to ~4%
    // utilisation: the first gradient cuts every flow to the 10 Mbit/s floor,
    // where a 16 KB event comes only every 13 ms.
    let t = run(CcKind::Timely, &CcConfig::default(), 4, duration, warmup);
    let window_s = (duration - warmup) as f64 / 1e9;
    let total_bps = t.goodput.iter().sum::<u64>() as f64 * 8.0 / window_s;
    eprintln!(
        "timely: util {:.3} jain {:.3} mean q {} max q {} drops {}",
        total_bps / LINK as f64,
        jain(&t.goodput),
        t.mean_queue,
        t.max_queue,
        t.tail_drops
    );
    // Thigh = 500 us of queueing at 10 Gbit/s is 625 KB.
    assert_eq!(t.tail_drops, 0);
    assert!(t.max_queue < 625_000, "max queue {}", t.max_queue);
    assert!(total_bps > 0.85 * LINK as f64, "utilisation {total_bps}");
    assert!(jain(&t.goodput) > 0.9);
}

/// `xroce experiment incast`'s loop: 2 Gbit/s, RoCE MTU 1024 in 1082-byte
/// frames, RED 5-200 KB, and a software feedback loop.
fn incast_scenario(feedback_ns: u64) -> Scenario {
    Scenario {
        link_bps: 2_000_000_000,
        frame: 1_082,
        mtu: 1024,
        kmin: 5_000,
        kmax: 200_000,
        buffer: 0,
        feedback_ns,
        step_ns: 500,
        stop: None,
    }
}

/// Payload share of an incast frame (1024 B of 1082 on the wire), as
/// `xroce experiment incast` reports link use.
const INCAST_PAYLOAD: f64 = 1024.0 / 1082.0;

/// One 4-into-1 incast at 2 Gbit/s: (payload link use over all of it,
/// queue p99 after 500 ms, Jain).
fn incast(spec: &str, feedback_ns: u64, duration_ns: u64) -> (f64, u64, f64) {
    let line = 2_000_000_000;
    let cfg = CcConfig {
        dcqcn: super::DcqcnConfig::from_spec(spec, line).unwrap(),
        ..CcConfig::default()
    };
    let o = run_in(
        incast_scenario(feedback_ns),
        CcKind::Dcqcn,
        &cfg,
        4,
        duration_ns,
        0,
    );
    let util =
        o.goodput.iter().sum::<u64>() as f64 * 8.0 / (duration_ns as f64 / 1e9) / line as f64
            * INCAST_PAYLOAD;
    // Queue samples come every 10 steps of 500 ns.
    let mut q = o.queue_samples[100_000.min(o.queue_samples.len())..].to_vec();
    q.sort_unstable();
    let p99 = q.get(q.len() * 99 / 100).copied().unwrap_or(0);
    (util, p99, jain(&o.goodput))
}

/// The issue-16 goal in the model of `xroce experiment incast` (4 senders,
/// 2 Gbit/s, RED 5-200 KB, 5 s): the `software` preset uses at least 90 %
/// of the link (payload, start-up included) with the queue's p99 at most
/// Kmax and Jain at least 0.95, whether the software loop takes 0.3, 1 or
/// 2 ms; the preset's old numbers (`g` 1/16, 2 ms timer, R_AI line / 200,
/// every CNP cutting) used 0.68 of it with a 1 ms loop. The runs go in
/// parallel threads.
#[test]
fn dcqcn_software_preset_fills_the_incast_link() {
    let duration = 5_000_000_000;
    let old = "software,g=0.0625,timer=2ms,rai=10mbit,reduce_period=0us";
    let cases = [
        ("software", 300_000),
        ("software", 1_000_000),
        ("software", 2_000_000),
        (old, 1_000_000),
    ];
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&(spec, fb)| s.spawn(move || incast(spec, fb, duration)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (&(spec, feedback), &(util, p99, fair)) in cases.iter().zip(&results) {
        eprintln!(
            "{spec}, loop {} us: link use {util:.3} queue p99 {p99} B Jain {fair:.4}",
            feedback / 1000
        );
        if spec == old {
            assert!(util < 0.8, "the old set under-used the link: {util}");
            continue;
        }
        assert!(util >= 0.90, "loop {feedback} ns: link use {util}");
        assert!(p99 <= 200_000, "loop {feedback} ns: queue p99 {p99}");
        assert!(fair >= 0.95, "loop {feedback} ns: Jain {fair}");
    }
}

/// The price of the gentler increase: a flow whose three peers leave
/// climbs back at R_AI per ms (after fast recovery), still reaching most
/// of the link within a second.
#[test]
fn dcqcn_software_preset_reclaims_freed_capacity() {
    let line = 2_000_000_000;
    let cfg = CcConfig {
        dcqcn: super::DcqcnConfig::software(line),
        ..CcConfig::default()
    };
    let mut sc = incast_scenario(1_000_000);
    let left = 1_000_000_000;
    sc.stop = Some((1, left));
    let end = left + 1_000_000_000;
    let o = run_in(sc, CcKind::Dcqcn, &cfg, 4, end, left);
    let alone = o.goodput[0] as f64 * 8.0 / ((end - left) as f64 / 1e9) / line as f64;
    eprintln!("software: flow 0 alone for 1 s: {alone:.3} of the link (wire)");
    assert!(alone >= 0.7, "{alone}");
    assert!(o.goodput[1..].iter().all(|&g| g == 0));
}
