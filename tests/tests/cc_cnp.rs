//! The congestion loop end to end: a DCQCN sender WRITEs through the XDP
//! congestion point set far below its line rate; CE-marked frames make the
//! receiver's engine send CNPs, they reach the sender (its own XDP program
//! counts them), and the sender's DCQCN rate falls.
//!
//! The bottleneck is 10 Mbit/s. At 50, a sender beside two CPU hogs moved
//! about 30 Mbit/s (a 64 KiB WRITE every 10-20 ms): the queue drained,
//! CNPs stopped and DCQCN rightly climbed back to line rate, so the rate
//! was not "down" in the second half. Its window (128 packets) bounds the
//! queue a fast sender can build, so a slower link does not let the start
//! run away.

use xroce_tests::{experiment::run_incast, require_root};

/// The senders' line rate, bit/s.
const LINE: f64 = 1e9;

#[test]
fn ce_marks_produce_cnps_and_the_dcqcn_rate_falls() {
    require_root();
    let run = run_incast(
        "cc-cnp",
        &[
            "--senders",
            "1",
            "--cc",
            "dcqcn",
            "--link-rate",
            "10mbit",
            "--line-rate",
            "1gbit",
            "--policy",
            "step",
            "--kmin",
            "20KB",
            "--duration",
            "2",
            "--bin-ms",
            "10",
        ],
    );
    let brief = run.brief();
    assert!(run.num("/marks") > 0.0, "no CE marks: {brief}");
    assert!(run.num("/cnps") > 0.0, "the sender got no CNPs: {brief}");
    assert!(
        run.num("/cnps_seen_at_senders") > 0.0,
        "no CNP frame reached the sender's interface: {brief}"
    );
    // DCQCN starts at the 1 Gbit/s line rate; 100x the bottleneck piles up
    // a queue far over K, every frame is marked, and each CNP cuts.
    let trace = run.trace(0);
    assert!(trace.len() >= 10, "a 2 s run in 10 ms bins: {trace:?}");
    let first_cnp = trace
        .iter()
        .position(|r| r.cnps > 0)
        .unwrap_or_else(|| panic!("no trace row counts a CNP: {brief}"));
    let lowest = trace[first_cnp..]
        .iter()
        .map(|r| r.rate_bps)
        .fold(f64::MAX, f64::min);
    assert!(
        lowest < LINE / 4.0,
        "DCQCN rate never fell below a quarter of the {LINE} bit/s line rate after the first CNP (lowest {lowest}): {brief}"
    );
    // It stays down: the second half averages near the 10 Mbit/s bottleneck.
    let tail = &trace[trace.len() / 2..];
    let late_rate = tail.iter().map(|r| r.rate_bps).sum::<f64>() / tail.len() as f64;
    // What the sender moved meanwhile: under the bottleneck, the queue
    // drained and DCQCN rightly climbed back (a host that starves the
    // sender does that).
    let late_sent_bps = tail.iter().map(|r| r.bytes).sum::<u64>() as f64 * 8e3
        / (tail.last().unwrap().t_ms - trace[trace.len() / 2 - 1].t_ms).max(1.0);
    assert!(
        late_rate < LINE / 5.0,
        "DCQCN rate in the second half averages {late_rate} bit/s, not far below the {LINE} \
         bit/s line rate, while the sender moved {late_sent_bps:.0} bit/s through the 10 \
         Mbit/s bottleneck (far under it: the host starved the sender, the queue drained \
         and DCQCN climbed back, as it should): {brief}"
    );
    let cnps_late = trace.last().unwrap().cnps - trace[trace.len() / 2].cnps;
    assert!(cnps_late > 0, "CNPs stopped half way: {trace:?}");
    // No buffer limit: nothing is lost, only marked.
    assert_eq!(run.num("/drops/total"), 0.0, "{brief}");
    run.remove();
}
