//! TIMELY and Swift hold their delay targets on a queue that really delays
//! (`xroce experiment incast --bottleneck delay`: tbf at the link rate on
//! the bridge's port toward the receiver), while they keep the link in use.
//!
//! Four senders, each starting at the link's rate, run three times in the
//! same test: without congestion control (`none`: the queue grows to
//! whatever the senders' windows hold), under TIMELY and under Swift, both
//! with their `software` presets, whose targets are queueing delays over
//! the base RTT each flow measures (`settings.delay_target_us` in the
//! summary). The bounds are ratios to the target and to the `none` run of
//! the same test, wide enough for a loaded 2-core host running a debug
//! build: the queueing delay (sampled at the bottleneck every 2 ms after a
//! 500 ms warm-up) within 3 x the target at the median and under a third
//! of `none`'s, its p99 under `none`'s median, and no flow starved. Two
//! figures need the CPU a bench has, and `cargo xtask bench` reports them
//! (xtask/src/bench/cc_delay.rs): how close the queue comes to the target
//! (p99 >= 0.75 x the target unloaded), and how much of the link the
//! controllers keep in use against `none`. The controllers steer the RTT,
//! which carries host delay: on a busy host that delay alone exceeds the
//! target, the queue stays empty and the controllers hold back (TIMELY
//! kept 0.40 of the link against none's 0.87 beside a CI run and two
//! builds; 0.95 of it unloaded).
//!
//! Measured here (2-core VM, debug build, 3 runs): none p50 1953-2043 us,
//! utilisation 0.946; TIMELY (Tlow 200 us, Thigh 500 us) p50 253-266 us,
//! p99 648-662, utilisation 0.948-0.952; Swift (200 us) p50 16-44 us, mean
//! about 100-113, p99 497-565, utilisation 0.929-0.933; Jain >= 0.998.
//! With another busy thread: TIMELY p50 0, p99 390-510 us, Jain 0.75-0.94;
//! Swift p50 0, p99 346 us.

use xroce_tests::{
    experiment::{run_incast, Incast},
    require_root,
};

const RATE: &str = "200mbit";
/// Runs of the control (`none`) allowed to find the queue formed.
const CONTROL_RUNS: usize = 3;

fn incast(cc: &str) -> Incast {
    run_incast(
        &format!("cc-delay-{cc}"),
        &[
            "--senders",
            "4",
            "--cc",
            cc,
            "--link-rate",
            RATE,
            "--bottleneck",
            "delay",
            "--duration",
            "3",
            "--bin-ms",
            "2",
        ],
    )
}

#[test]
fn timely_and_swift_hold_their_delay_targets_on_a_real_queue() {
    require_root();
    // The precondition of every bound below: without congestion control the
    // senders stand a queue over the controllers' 200 us targets (about 2 ms
    // at the median unloaded). Senders the host starves leave it empty, and
    // there is nothing to hold down. Beside two CPU hogs that happened in
    // about one run of four (0.52 of the link carried, against 0.82-0.93
    // in the others), so the control runs again, up to CONTROL_RUNS times,
    // until the queue forms: the run waits for its premise, it does not
    // lower a bound. (A slower link instead was tried: at 100 Mbit/s TIMELY
    // held an 8 ms queue even on a quiet host.)
    let mut starved = Vec::new();
    let none = loop {
        let none = incast("none");
        let p50 = none.num("/queue/delay/p50_us");
        let util = none.num("/link_utilisation");
        eprintln!("none: queue delay p50 {p50:.0} us, utilisation {util:.3}");
        if p50 > 200.0 {
            break none;
        }
        starved.push(format!(
            "queue delay median {p50} us, utilisation {util:.2}: {}",
            none.brief()
        ));
        none.remove();
        assert!(
            starved.len() < CONTROL_RUNS,
            "precondition: without congestion control the senders did not outrun the \
             link in {CONTROL_RUNS} runs, so the host starved them (the run needs about \
             one free core):\n{}",
            starved.join("\n")
        );
    };
    let n = none.brief();
    let none_p50 = none.num("/queue/delay/p50_us");
    let none_util = none.num("/link_utilisation");
    let mut runs = vec![none];
    for cc in ["timely", "swift"] {
        let r = incast(cc);
        let b = r.brief();
        let target = r.num("/settings/delay_target_us");
        let p50 = r.num("/queue/delay/p50_us");
        let p99 = r.num("/queue/delay/p99_us");
        let mean = r.num("/queue/delay/mean_us");
        let util = r.num("/link_utilisation");
        let jain = r.num("/jain_index");
        eprintln!(
            "{cc}: target {target:.0} us, queue delay p50 {p50:.0} mean {mean:.0} p99 {p99:.0} us, \
             utilisation {util:.3} (none {none_util:.3}), Jain {jain:.3}"
        );
        assert!(
            p99 < none_p50,
            "{cc}: queue delay p99 {p99} us, without congestion control p50 {none_p50} us: {b}\n{n}"
        );
        // The controllers hold the RTT at their target, and the RTT carries
        // host delay beside the bottleneck's queue: ~100 us at the median
        // in a release build, 150 us and more in a debug one, more than
        // the target with another busy thread on a 2-core host. The queue
        // sits under the target by that much (Swift's median: 96-142 us in
        // a release build, 16-44 us in a debug one, 0 under extra load):
        // only upper bounds hold on any host; the bench has the lower one.
        assert!(
            p50 <= 3.0 * target,
            "{cc}: queue delay p50 {p50} us is far over the target {target} us: {b}"
        );
        assert!(
            p50 < none_p50 / 3.0,
            "{cc}: queue delay p50 {p50} us, without congestion control {none_p50} us: {b}\n{n}"
        );
        // Not abandoned: a controller stuck at its minimum rate keeps the
        // queue empty too. The bench holds it to 0.6 x none's; 0.2 holds
        // on a starved host (0.46 seen beside a CI run and two builds).
        assert!(
            util > 0.2 * none_util,
            "{cc}: the link is all but unused: {util} against {none_util} without CC: {b}\n{n}"
        );
        // TIMELY shares unevenly where host delays differ between senders
        // (0.75-0.82 with another busy thread on a 2-core host; 0.998 unloaded).
        assert!(jain > 0.6, "{cc}: Jain index {jain}: {b}");
        runs.push(r);
    }
    for r in runs {
        r.remove();
    }
}
