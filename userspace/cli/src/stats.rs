//! `xroce stats --iface IF [--json]`: the XDP counters of an
//! interface (in all and per RX queue), the congestion point's settings and
//! virtual queue, and the loss-injection settings.
//!
//! `xroce stats --iface IF --interval S [--count N] [--json]`: rates every
//! S seconds until Ctrl-C (or N intervals), as xdp-tools' `xdp-bench` and
//! `xdp-monitor` print them; with `--json` one object per line.

use std::time::{Duration, Instant};

use xroce_common::RxQueueCounters;
use xroce_report::{
    EcnSettings, EngineCounters, FaultSettings, RxQueueRates, StatsInterval, StatsReport,
};

use crate::congestion::{describe_ecn, describe_fault};

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// Network interface (as `ip link` names it)
    #[arg(long, value_name = "IF")]
    pub iface: String,
    /// Print rates every this many seconds (e.g. 1, 0.5, 500ms) until Ctrl-C
    // No -i: capture's -i (tcpdump's) is the interface.
    #[arg(long, value_name = "SECONDS", value_parser = crate::units::seconds)]
    pub interval: Option<crate::units::Seconds>,
    /// With --interval: stop after this many intervals
    #[arg(long, short = 'c', value_name = "N", requires = "interval")]
    pub count: Option<u64>,
    /// Print one JSON object on stdout (with --interval: one per line)
    #[arg(long)]
    pub json: bool,
}

/// CLOCK_MONOTONIC in ns: the clock bpf_ktime_get_ns reads.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The per-RX-queue counters of `iface` summed over the CPUs, indexed by
/// queue; empty if the attached program predates them.
pub fn read_rx_queues(iface: &str) -> anyhow::Result<Vec<RxQueueCounters>> {
    match xroce::xdp::rx_queue_counters(iface) {
        Err(xroce::xdp::XdpError::NoMap(_)) => Ok(Vec::new()),
        r => Ok(r?),
    }
}

/// What one queue dropped: every frame is redirected, passed or dropped.
fn dropped(q: &RxQueueCounters) -> u64 {
    q.frames.saturating_sub(q.redirected + q.passed)
}

pub fn run(args: &StatsArgs) -> anyhow::Result<()> {
    if let Some(interval) = &args.interval {
        return run_interval(args, Duration::from_secs_f64(interval.value));
    }
    let iface = &args.iface;
    let counters = xroce::xdp::read_counters(iface)?;
    let ecn = xroce::xdp::ecn_config(iface)?;
    let fault = xroce::xdp::fault_config(iface)?;
    let queue = xroce::xdp::virtual_queue(iface)?;
    let backlog = if ecn.enabled != 0 {
        queue.backlog_at(monotonic_ns(), ecn.link_rate_bps)
    } else {
        0
    };
    if args.json {
        let out = StatsReport {
            iface: iface.clone(),
            xdp: counters
                .values
                .iter()
                .map(|(counter, value)| (counter.name().to_string(), *value))
                .collect(),
            engines: xroce::stats_export::read_published(iface)
                .into_iter()
                .map(|p| EngineCounters {
                    pid: p.pid,
                    counters: p.fields.into_iter().collect(),
                })
                .collect(),
            ecn: EcnSettings {
                enabled: ecn.enabled != 0,
                policy: xroce_common::congestion::EcnPolicy::from_u32(ecn.policy)
                    .name()
                    .to_string(),
                link_rate_bps: ecn.link_rate_bps,
                kmin: ecn.kmin,
                kmax: ecn.kmax,
                pmax: xroce_common::fixed::fixed_to_fraction(ecn.pmax_fixed),
                buffer_bytes: ecn.buffer_bytes,
                queue_bytes: backlog,
                queue_peak_bytes: queue.peak_bytes,
                queue_enqueued_bytes: queue.enqueued_bytes,
            },
            fault: FaultSettings {
                enabled: fault.enabled != 0,
                drop: xroce_common::fixed::fixed_to_fraction(fault.drop_fixed),
                opcode_mask: fault.opcode_mask,
                qpn: (fault.qpn != xroce_common::fault::ANY_QPN).then_some(fault.qpn),
                seed: fault.seed,
            },
        };
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!("XDP counters on {iface}");
        for (counter, value) in &counters.values {
            println!("  {:<20} {value:>14}", counter.name());
        }
        println!("congestion point: {}", describe_ecn(&ecn));
        if ecn.enabled != 0 {
            println!(
                "  virtual queue: {backlog} B now, peak {} B, {} B admitted",
                queue.peak_bytes, queue.enqueued_bytes
            );
        }
        println!("loss injection: {}", describe_fault(&fault));
        for (queue, q) in read_rx_queues(iface)?.iter().enumerate() {
            if q.frames != 0 {
                println!(
                    "  rx queue {queue}: {} frames, {} bytes; {} redirected, {} passed, {} dropped",
                    q.frames,
                    q.bytes,
                    q.redirected,
                    q.passed,
                    dropped(q)
                );
            }
        }
        for engine in xroce::stats_export::read_published(iface) {
            println!("engine counters (process {})", engine.pid);
            for (name, value) in engine.fields.iter().filter(|(_, v)| *v != 0) {
                println!("  {name:<20} {value:>14}");
            }
        }
    }
    Ok(())
}

/// One reading of the counters.
struct Sample {
    at: Instant,
    xdp: xroce::xdp::XdpCounters,
    queues: Vec<RxQueueCounters>,
}

fn sample(iface: &str) -> anyhow::Result<Sample> {
    Ok(Sample {
        xdp: xroce::xdp::read_counters(iface)?,
        queues: read_rx_queues(iface)?,
        at: Instant::now(),
    })
}

/// Growth of a counter; a counter that went down was reset (the program
/// attached again), so all of its value is new.
fn delta(now: u64, before: u64) -> u64 {
    if now >= before {
        now - before
    } else {
        now
    }
}

/// The rates between two samples.
fn interval_report(iface: &str, first: Instant, old: &Sample, new: &Sample) -> StatsInterval {
    let secs = new.at.duration_since(old.at).as_secs_f64().max(1e-9);
    let rate = |now: u64, before: u64| delta(now, before) as f64 / secs;
    let xdp_rates = new
        .xdp
        .values
        .iter()
        .map(|(c, v)| (c.name().to_string(), rate(*v, old.xdp.get(*c))))
        .collect();
    let zero = RxQueueCounters::default();
    let rx_queues: Vec<RxQueueRates> = new
        .queues
        .iter()
        .enumerate()
        .filter(|(_, q)| q.frames != 0)
        .map(|(i, q)| {
            let o = old.queues.get(i).unwrap_or(&zero);
            RxQueueRates {
                queue: i as u32,
                rx_pps: rate(q.frames, o.frames),
                rx_bps: 8.0 * rate(q.bytes, o.bytes),
                redirected_pps: rate(q.redirected, o.redirected),
                passed_pps: rate(q.passed, o.passed),
                dropped_pps: rate(dropped(q), dropped(o)),
                frames: q.frames,
                bytes: q.bytes,
                redirected: q.redirected,
                passed: q.passed,
                dropped: dropped(q),
            }
        })
        .collect();
    StatsInterval {
        iface: iface.to_string(),
        t: new.at.duration_since(first).as_secs_f64(),
        seconds: secs,
        rx_pps: rx_queues.iter().map(|q| q.rx_pps).sum(),
        rx_bps: rx_queues.iter().map(|q| q.rx_bps).sum(),
        xdp_rates,
        xdp: new
            .xdp
            .values
            .iter()
            .map(|(c, v)| (c.name().to_string(), *v))
            .collect(),
        rx_queues,
    }
}

/// A rate with an SI prefix: (`1.23`, `M`) for 1234567; below 1000 a
/// whole number and no prefix.
fn prefixed(v: f64) -> (String, &'static str) {
    match v {
        v if v >= 1e9 => (format!("{:.2}", v / 1e9), "G"),
        v if v >= 1e6 => (format!("{:.2}", v / 1e6), "M"),
        v if v >= 1e3 => (format!("{:.2}", v / 1e3), "k"),
        v => (format!("{v:.0}"), ""),
    }
}

/// `1234567` -> `1.23M`: event rates as xdp-bench shows them.
fn si(v: f64) -> String {
    let (n, p) = prefixed(v);
    format!("{n}{p}")
}

/// `1234567` -> `1.23 Mbit/s`.
fn bits(v: f64) -> String {
    let (n, p) = prefixed(v);
    format!("{n} {p}bit/s")
}

fn print_interval(r: &StatsInterval) {
    let rate = |name: &str| r.xdp_rates.get(name).copied().unwrap_or(0.0);
    let dropped: f64 = r.rx_queues.iter().map(|q| q.dropped_pps).sum();
    println!(
        "{:>8.1}s {}: rx {} pps {} | roce {} pps, redirected {}, passed {}, dropped {}",
        r.t,
        r.iface,
        si(r.rx_pps),
        bits(r.rx_bps),
        si(rate("roce")),
        si(rate("redirected")),
        si(rate("passed")),
        si(dropped)
    );
    for q in &r.rx_queues {
        if q.rx_pps > 0.0 {
            println!(
                "          queue {:>2}: rx {} pps {} | redirected {}, passed {}, dropped {}",
                q.queue,
                si(q.rx_pps),
                bits(q.rx_bps),
                si(q.redirected_pps),
                si(q.passed_pps),
                si(q.dropped_pps)
            );
        }
    }
    // The other counters that moved, by name (opcode classes, ECN, drops).
    let moved: Vec<String> = r
        .xdp_rates
        .iter()
        .filter(|(n, v)| {
            **v > 0.0 && !matches!(n.as_str(), "seen" | "roce" | "redirected" | "passed")
        })
        .map(|(n, v)| format!("{n} {}/s", si(*v)))
        .collect();
    if !moved.is_empty() {
        println!("          {}", moved.join(", "));
    }
}

fn run_interval(args: &StatsArgs, every: Duration) -> anyhow::Result<()> {
    let iface = &args.iface;
    let mut old = sample(iface)?;
    let first = old.at;
    if !args.json {
        eprintln!(
            "xroce: rates on {iface} every {:.3} s; Ctrl-C stops",
            every.as_secs_f64()
        );
    }
    let mut n = 0u64;
    while args.count.is_none_or(|count| n < count) {
        n += 1;
        // Ticks on a fixed grid: printing does not make the intervals drift.
        let tick = first + every.mul_f64(n as f64);
        std::thread::sleep(tick.saturating_duration_since(Instant::now()));
        let new = sample(iface)?;
        let report = interval_report(iface, first, &old, &new);
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print_interval(&report);
        }
        old = new;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(frames: u64, bytes: u64, redirected: u64, passed: u64) -> RxQueueCounters {
        RxQueueCounters {
            frames,
            bytes,
            redirected,
            passed,
        }
    }

    #[test]
    fn rates_are_per_second_and_queues_without_frames_are_left_out() {
        let t0 = Instant::now();
        let old = Sample {
            at: t0,
            xdp: xroce::xdp::XdpCounters {
                values: vec![(xroce_common::Counter::Roce, 100)],
            },
            queues: vec![q(100, 10_000, 90, 10), q(0, 0, 0, 0)],
        };
        let new = Sample {
            at: t0 + Duration::from_millis(500),
            xdp: xroce::xdp::XdpCounters {
                values: vec![(xroce_common::Counter::Roce, 600)],
            },
            queues: vec![q(600, 60_000, 580, 15), q(0, 0, 0, 0)],
        };
        let r = interval_report("eth1", t0, &old, &new);
        assert_eq!(r.xdp_rates["roce"], 1000.0);
        assert_eq!(r.xdp["roce"], 600);
        assert_eq!(r.rx_queues.len(), 1);
        let q0 = &r.rx_queues[0];
        assert_eq!((q0.queue, q0.rx_pps, q0.rx_bps), (0, 1000.0, 800_000.0));
        assert_eq!((q0.redirected_pps, q0.passed_pps), (980.0, 10.0));
        assert_eq!((q0.dropped, q0.dropped_pps), (5, 10.0));
        assert_eq!((r.rx_pps, r.rx_bps, r.seconds), (1000.0, 800_000.0, 0.5));
    }

    #[test]
    fn rates_print_with_si_prefixes() {
        assert_eq!(si(999.4), "999");
        assert_eq!(si(14_380.0), "14.38k");
        assert_eq!(bits(124_440_000.0), "124.44 Mbit/s");
        assert_eq!(bits(0.0), "0 bit/s");
    }

    #[test]
    fn a_counter_that_went_down_was_reset() {
        assert_eq!(delta(5, 3), 2);
        assert_eq!(delta(4, 1000), 4);
    }
}
