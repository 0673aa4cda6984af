//! Engine-only multi-core scaling (issue 13, goal 6): 4 RC QPs streaming
//! 4 KiB RDMA WRITEs (MTU 4096) on one engine shard driven by one thread,
//! against the same 4 QPs split over 2 engine shards, each driven by a
//! thread of its own. A shard is a pair of engines (both ends of its QPs)
//! handing frames to each other directly, as in `engine_bench`: no I/O, no
//! loss. Runs alternate (1, 2, 1, 2, ...) so that a load change on the host
//! hits both; the figure is the ratio of the medians, in messages per second.
//! On a host whose other work takes CPU from the shards that ratio says
//! little, so each shard also measures the CPU time its thread got: the
//! messages per CPU-second of 2 shards against 1 (1.0: splitting the QPs
//! costs nothing per message) say what 2 free cores would give.
//!
//! `cargo run --release -p xroce --example multicore_bench [-- seconds rounds]`
//! prints one JSON object on stdout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[path = "common/write_pump.rs"]
mod write_pump;
use write_pump::{WritePump, MSG};

const QPS: usize = 4;

/// One shard's result: messages completed and frames moved.
struct ShardRun {
    messages: u64,
    frames: u64,
    /// CPU time the thread got while it ran.
    cpu_secs: f64,
}

/// CPU time of the calling thread, seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Drives one shard with `qps` QP pairs until `stop`; checks every
/// completion and, at the end, that each QP's last WRITE landed intact.
fn shard(qps: usize, start: &Barrier, stop: &AtomicBool) -> ShardRun {
    let mut pump = WritePump::new(qps, qps);
    start.wait();
    let t0 = Instant::now();
    let cpu0 = thread_cpu();
    while !stop.load(Ordering::Relaxed) {
        pump.round(t0.elapsed().as_nanos() as u64 + 1_000_000);
    }
    let cpu_secs = thread_cpu() - cpu0;
    pump.verify();
    ShardRun {
        messages: pump.done.iter().sum(),
        frames: pump.frames,
        cpu_secs,
    }
}

/// One run of `QPS` QPs over `threads` shards for `secs`: messages/s,
/// frames/s and messages per CPU-second, all shards together.
fn run(threads: usize, secs: f64) -> (f64, f64, f64) {
    let start = Arc::new(Barrier::new(threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|s| {
            // Spread the QPs as evenly as the shards allow.
            let qps = QPS / threads + usize::from(s < QPS % threads);
            let (start, stop) = (start.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("shard-{s}"))
                .spawn(move || shard(qps, &start, &stop))
                .expect("spawn a shard thread")
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let runs: Vec<ShardRun> = handles
        .into_iter()
        .map(|h| h.join().expect("a shard thread panicked"))
        .collect();
    let el = t0.elapsed().as_secs_f64();
    let messages: u64 = runs.iter().map(|r| r.messages).sum();
    let frames: u64 = runs.iter().map(|r| r.frames).sum();
    let cpu: f64 = runs.iter().map(|r| r.cpu_secs).sum();
    (
        messages as f64 / el,
        frames as f64 / el,
        messages as f64 / cpu,
    )
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(5);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (mut one, mut two, mut one_fps, mut two_fps) = (vec![], vec![], vec![], vec![]);
    let (mut one_cpu, mut two_cpu) = (vec![], vec![]);
    for _ in 0..rounds.max(1) {
        let (m, f, c) = run(1, secs);
        one.push(m);
        one_fps.push(f);
        one_cpu.push(c);
        let (m, f, c) = run(2, secs);
        two.push(m);
        two_fps.push(f);
        two_cpu.push(c);
    }
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let (m1, m2) = (median(&mut one.clone()), median(&mut two.clone()));
    let (c1, c2) = (median(&mut one_cpu), median(&mut two_cpu));
    // The host's load while it ran (1-minute average, /proc/loadavg).
    let load: f64 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(-1.0);
    println!(
        "{{\"bench\":\"multicore_engine\",\"qps\":{QPS},\"message_bytes\":{MSG},\"cores\":{cores},\
\"seconds_per_run\":{secs},\"rounds\":{rounds},\
\"one_thread_msgs_per_s\":{m1:.0},\"two_threads_msgs_per_s\":{m2:.0},\
\"one_thread_frames_per_s\":{:.0},\"two_threads_frames_per_s\":{:.0},\
\"one_thread_runs\":[{}],\"two_threads_runs\":[{}],\"two_vs_one\":{:.3},\
\"one_thread_msgs_per_cpu_s\":{c1:.0},\"two_threads_msgs_per_cpu_s\":{c2:.0},\
\"cpu_efficiency_two_vs_one\":{:.3},\"load_average_1m\":{load:.2}}}",
        median(&mut one_fps),
        median(&mut two_fps),
        list(&one),
        list(&two),
        m2 / m1,
        c2 / c1
    );
}
