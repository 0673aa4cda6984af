//! CPU cost of moving data: CPU seconds (all CPUs, user + system + IRQ +
//! softirq, from /proc/stat) spent while a transfer runs, per GB it moved.
//! Machine-wide, because a veth transfer's kernel work runs in softirq
//! context that no process is charged for; so the figure includes whatever
//! else runs meanwhile, and is compared against kernel TCP measured the
//! same way in the same run.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Busy CPU time of the whole machine so far, in seconds.
fn busy_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("/proc/stat has no `cpu` line")?;
    // user nice system idle iowait irq softirq steal ...
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum();
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(busy as f64 / hz)
}

/// CPU seconds (user and system) the process `pid` has used so far.
pub fn process_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis start at the state
    // (field 3); utime and stime are fields 14 and 15, in clock ticks.
    let rest = stat.rsplit_once(')').context("/proc/PID/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

/// What one measured transfer cost.
#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct CpuCost {
    pub cpu_seconds: f64,
    pub gigabytes: f64,
    pub cpu_seconds_per_gb: f64,
}

/// Runs an xroce transfer and measures its CPU time per byte it reports.
pub fn measure_bench(
    transfer: impl FnOnce() -> Result<xroce_report::BenchReport>,
) -> Result<(xroce_report::BenchReport, CpuCost)> {
    measure(|| {
        let r = transfer()?;
        let bytes = r.bytes;
        Ok((r, bytes))
    })
}

/// Runs `transfer`, which returns the bytes it moved, and measures the CPU
/// time spent meanwhile.
pub fn measure<R>(transfer: impl FnOnce() -> Result<(R, u64)>) -> Result<(R, CpuCost)> {
    let before = busy_seconds()?;
    let (r, bytes) = transfer()?;
    let cpu_seconds = busy_seconds()? - before;
    let gigabytes = bytes as f64 / 1e9;
    Ok((
        r,
        CpuCost {
            cpu_seconds,
            gigabytes,
            cpu_seconds_per_gb: cpu_seconds / gigabytes.max(1e-9),
        },
    ))
}
