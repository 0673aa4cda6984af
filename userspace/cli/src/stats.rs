//! `xroce stats --iface IF [--json]`: the pinned XDP counters of an
//! interface, the congestion point's settings and virtual queue, and the
//! loss-injection settings.

use xroce_report::{EcnSettings, EngineCounters, FaultSettings, StatsReport};

use crate::congestion::{describe_ecn, describe_fault};

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    #[arg(long)]
    pub iface: String,
    /// print one JSON object on stdout
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

pub fn run(args: &StatsArgs) -> anyhow::Result<()> {
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
        for engine in xroce::stats_export::read_published(iface) {
            println!("engine counters (process {})", engine.pid);
            for (name, value) in engine.fields.iter().filter(|(_, v)| *v != 0) {
                println!("  {name:<20} {value:>14}");
            }
        }
    }
    Ok(())
}
