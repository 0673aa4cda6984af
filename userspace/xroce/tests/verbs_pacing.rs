//! The engine's pacer with a whole verbs pair in the simulator: a QP
//! leaves at its congestion controller's rate.

use std::sync::Arc;

use xroce::cc::{CongestionControl, NoCc};
use xroce::engine::pacing_frame_bytes;
use xroce::verbs::sim::{connect_pair, sim_configs, LinkConfig, PairParams, Sim, SimLink};
use xroce::verbs::{Device, SendWr, Wc, WcStatus, WrOpcode};

/// The same pacer inside the engine: a 1 MB WRITE from a QP whose
/// controller holds `rate` leaves at that rate (token-bucket bound, and
/// within 10% of it unless the window is what limits), and a window or a
/// one-byte bucket holding the data when the pacer opens costs one timer
/// run, not a spin at one instant.
#[test]
fn engine_qp_sends_at_its_controllers_rate() {
    // (rate, window in packets, bucket bytes, window-limited)
    for (rate, window, burst, window_bound) in [
        (2_000_000_000u64, 128u32, 8192u64, false),
        (5_000_000_000, 128, 64 * 1024, false),
        (100_000_000, 1, 1, false),
        (1_000_000_000, 2, 8192, true),
        (20_000_000_000, 4, 64 * 1024, true),
    ] {
        let (mut ca, cb) = sim_configs();
        ca.cc = Some(Arc::new(move || {
            // NoCc holds one rate: the line rate it is given.
            Box::new(NoCc::new(rate)) as Box<dyn CongestionControl>
        }));
        ca.max_inflight_pkts = window;
        ca.pacing_burst_bytes = burst;
        let link = SimLink::new(LinkConfig::default(), 7);
        let mut sim = Sim::new(Device::new(ca), Device::new(cb), link);
        let len = 1 << 20;
        let p = PairParams {
            mr_len: len,
            ..Default::default()
        };
        let (a, b) = connect_pair(&sim, &p);
        let wr = SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(0, len)],
        );
        a.qp.post_send(&wr).unwrap();
        let (t0, e0) = (sim.now, sim.events);
        let mut wcs = [Wc::default(); 4];
        let mut got = 0;
        let mut steps = 0u64;
        // A spin (a send time reported again and again, time standing
        // still) ends the run here instead of hanging the test.
        sim.run_until(t0 + 60_000_000_000, |_| {
            steps += 1;
            got += a.cq.poll(&mut wcs).unwrap();
            got > 0 || steps > 100_000
        });
        let case = format!("rate {rate} window {window} burst {burst}");
        assert_eq!(got, 1, "{case}: no completion after {steps} steps");
        assert_eq!(wcs[0].status, WcStatus::Success, "{case}");
        let secs = (sim.now - t0) as f64 / 1e9;
        let sent = a.qp.stats().unwrap().tx_bytes;
        let wire_bps = sent as f64 * 8.0 / secs;
        let packets = len as u64 / 1024;
        let events = sim.events - e0;
        eprintln!(
            "{case}: {:.3} of the rate, {events} events",
            wire_bps / rate as f64
        );
        // Token-bucket bound over the whole run (a bucket smaller than a
        // frame lets one frame go into debt).
        let bucket = burst.max(pacing_frame_bytes(1024) as u64);
        assert!(
            (sent as f64) <= bucket as f64 + rate as f64 * secs / 8.0,
            "{case}: {sent} bytes in {secs} s"
        );
        if !window_bound {
            assert!(wire_bps > 0.9 * rate as f64, "{case}: {wire_bps} bit/s");
        }
        // Per data packet: its send, its arrival, ACKs and a timer run or two.
        assert!(events < 6 * packets, "{case}: {events} events");
    }
}
