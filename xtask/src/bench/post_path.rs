//! The post path with and without the engine lock (issue 26, item 2). The
//! xroce of [`baseline::BEFORE_POST_RING`], where every post takes the
//! engine mutex the I/O thread holds for its batches, against this one,
//! where a post goes into its QP's ring and the I/O thread moves it into
//! the engine: 8-byte RDMA WRITEs at the tool's full send depth (the
//! message rate, which the posts per second bound) and 8-byte WRITE
//! latency (p50, p99), in alternating rounds on the same veth pair.
//! Medians of the rounds.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use xroce_report::{BenchReport, LatReport};

use super::{median, xroce_pair_with, SECONDS};
use crate::{
    baseline,
    netns::{xroce_bin, NsPair},
    util::step,
};

const ROUNDS: usize = 3;

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Side {
    /// 8-byte WRITEs completed per second, 1 QP.
    pub write_8b_msgs_per_sec: f64,
    /// 8-byte WRITE half round trip, microseconds.
    pub write_8b_lat_p50_us: f64,
    pub write_8b_lat_p99_us: f64,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct PostPath {
    pub before_commit: String,
    pub rounds: usize,
    pub before: Side,
    pub after: Side,
    /// After over before: above 1 is more posts per second.
    pub msgs_per_sec_after_vs_before: f64,
    /// After over before: below 1 is lower latency.
    pub lat_p50_after_vs_before: f64,
    pub lat_p99_after_vs_before: f64,
}

pub fn measure(ns: &NsPair) -> Result<PostPath> {
    let before_exe = baseline::xroce_at(baseline::BEFORE_POST_RING)?;
    let after_exe = xroce_bin();
    let bw = ["write", "--size", "8", "--duration", SECONDS];
    let lat = ["write", "--size", "8", "--iters", "20000"];
    let mut rates = [Vec::new(), Vec::new()];
    let mut p50 = [Vec::new(), Vec::new()];
    let mut p99 = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        for (i, exe) in [&before_exe, &after_exe].into_iter().enumerate() {
            step(&format!(
                "post path round {}/{ROUNDS}: {}",
                round + 1,
                ["before (engine lock)", "after (post ring)"][i]
            ));
            let b: BenchReport = xroce_pair_with(exe, ns, "bench", &bw)?;
            let l: LatReport = xroce_pair_with(exe, ns, "lat", &lat)?;
            eprintln!(
                "  {:.0} WRITEs/s, latency p50 {:.2} us p99 {:.2} us",
                b.msgs_per_sec, l.lat_us.p50, l.lat_us.p99
            );
            rates[i].push(b.msgs_per_sec);
            p50[i].push(l.lat_us.p50);
            p99[i].push(l.lat_us.p99);
        }
    }
    let side = |i: usize| Side {
        write_8b_msgs_per_sec: median(&rates[i]),
        write_8b_lat_p50_us: median(&p50[i]),
        write_8b_lat_p99_us: median(&p99[i]),
    };
    let (before, after) = (side(0), side(1));
    Ok(PostPath {
        before_commit: baseline::BEFORE_POST_RING.into(),
        rounds: ROUNDS,
        msgs_per_sec_after_vs_before: after.write_8b_msgs_per_sec / before.write_8b_msgs_per_sec,
        lat_p50_after_vs_before: after.write_8b_lat_p50_us / before.write_8b_lat_p50_us,
        lat_p99_after_vs_before: after.write_8b_lat_p99_us / before.write_8b_lat_p99_us,
        before,
        after,
    })
}
