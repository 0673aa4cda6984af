//! Multi-core (issue 13, goal 6), engine only: 4 RC QPs of 4 KiB WRITEs on
//! one engine shard and thread against the same 4 QPs on 2 shards and
//! threads (userspace/xroce's `multicore_bench` example: no I/O, as
//! `engine_bench`), runs alternating in the same process. Goal: the 2-thread
//! rate >= 1.6 x the 1-thread rate. Every WRITE completes successfully and
//! each QP's data is checked at the end, or the example fails.

use std::process::Command;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::util::{output, workspace_root};

/// Seconds per run, and alternating rounds (1 thread, then 2).
const SECONDS: &str = "1";
const ROUNDS: &str = "5";

/// What `multicore_bench` prints.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Multicore {
    pub bench: String,
    pub qps: u32,
    pub message_bytes: u32,
    /// CPUs the process could use.
    pub cores: u32,
    pub seconds_per_run: f64,
    pub rounds: u32,
    /// Medians over the rounds.
    pub one_thread_msgs_per_s: f64,
    pub two_threads_msgs_per_s: f64,
    pub one_thread_frames_per_s: f64,
    pub two_threads_frames_per_s: f64,
    pub one_thread_runs: Vec<f64>,
    pub two_threads_runs: Vec<f64>,
    /// two_threads_msgs_per_s / one_thread_msgs_per_s (goal: >= 1.6).
    pub two_vs_one: f64,
    /// Messages per CPU-second the shard threads got (medians).
    pub one_thread_msgs_per_cpu_s: f64,
    pub two_threads_msgs_per_cpu_s: f64,
    /// two_threads_msgs_per_cpu_s / one_thread_msgs_per_cpu_s: 1.0 when
    /// splitting the QPs costs nothing per message, so that two_vs_one
    /// reaches 2 x this on two cores nothing else uses (other load on the
    /// host lowers two_vs_one, not this).
    pub cpu_efficiency_two_vs_one: f64,
    /// The host's 1-minute load average during the runs.
    pub load_average_1m: f64,
}

/// Builds and runs the example (release).
pub fn measure() -> Result<Multicore> {
    let out = output(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "run",
                "--quiet",
                "--release",
                "-p",
                "xroce",
                "--example",
                "multicore_bench",
                "--",
                SECONDS,
                ROUNDS,
            ])
            .current_dir(workspace_root()),
    )?;
    let m: Multicore = serde_json::from_str(out.trim()).context("multicore_bench's JSON output")?;
    eprintln!(
        "4 QPs, engine only: 2 threads {:.0} msg/s vs 1 thread {:.0} msg/s: {:.2}x ({} cores, \
         load {:.1}); per CPU-second {:.2}x",
        m.two_threads_msgs_per_s,
        m.one_thread_msgs_per_s,
        m.two_vs_one,
        m.cores,
        m.load_average_1m,
        m.cpu_efficiency_two_vs_one
    );
    Ok(m)
}
