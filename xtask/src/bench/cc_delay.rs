//! TIMELY and Swift at their delay targets on a queue that really delays
//! (`xroce experiment incast --bottleneck delay`: four senders at 200
//! Mbit/s into tbf on the bridge port toward the receiver), the figure
//! tests/tests/cc_delay_targets.rs leaves to the bench: how close the
//! bottleneck's queueing delay comes to each controller's target. The
//! controllers steer the RTT, which carries host delay beside the queue;
//! on a busy host that delay alone can exceed the target and the queue
//! stays empty, so this needs the CPU a bench has. Goals: p99 of the queue
//! delay >= 0.75 x the target (the controller lets the queue reach it),
//! p50 <= 3 x the target, and the link's use >= 0.6 x that of the same
//! incast without congestion control (on a starved host the inflated RTT
//! makes a delay controller hold back, which is no fault of the queue).

use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::netns::xroce_bin;

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct DelayTarget {
    pub cc: String,
    pub target_us: f64,
    pub queue_delay_p50_us: f64,
    pub queue_delay_p99_us: f64,
    pub link_utilisation: f64,
    pub jain_index: f64,
    /// Goal >= 0.75.
    pub p99_vs_target: f64,
    /// Goal <= 3.
    pub p50_vs_target: f64,
    /// Link use over that of the run without congestion control. Goal >= 0.6.
    pub utilisation_vs_none: f64,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct CcDelay {
    /// Link use of the same incast without congestion control.
    pub none_utilisation: f64,
    pub timely: DelayTarget,
    pub swift: DelayTarget,
}

pub fn measure() -> Result<CcDelay> {
    let none = summary("none")?;
    let none_utilisation = none
        .pointer("/link_utilisation")
        .and_then(serde_json::Value::as_f64)
        .context("summary.json has no /link_utilisation")?;
    Ok(CcDelay {
        none_utilisation,
        timely: run("timely", none_utilisation)?,
        swift: run("swift", none_utilisation)?,
    })
}

/// One incast run's summary.json.
fn summary(cc: &str) -> Result<serde_json::Value> {
    let out = std::env::temp_dir().join(format!("xroce-bench-cc-{cc}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(xroce_bin())
        .args(["experiment", "incast", "--senders", "4", "--cc", cc])
        .args(["--link-rate", "200mbit", "--bottleneck", "delay"])
        .args(["--duration", "3", "--bin-ms", "2", "--out"])
        .arg(&out)
        .status()
        .context("run xroce experiment incast")?;
    if !status.success() {
        bail!("xroce experiment incast --cc {cc} failed ({status})");
    }
    let text = std::fs::read_to_string(out.join("summary.json"))
        .with_context(|| format!("{}/summary.json", out.display()))?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(serde_json::from_str(&text)?)
}

fn run(cc: &str, none_utilisation: f64) -> Result<DelayTarget> {
    let s = summary(cc)?;
    let num = |ptr: &str| {
        s.pointer(ptr)
            .and_then(serde_json::Value::as_f64)
            .with_context(|| format!("summary.json has no {ptr}"))
    };
    let target = num("/settings/delay_target_us")?;
    let (p50, p99) = (num("/queue/delay/p50_us")?, num("/queue/delay/p99_us")?);
    let utilisation = num("/link_utilisation")?;
    let figure = DelayTarget {
        cc: cc.to_string(),
        target_us: target,
        queue_delay_p50_us: p50,
        queue_delay_p99_us: p99,
        link_utilisation: utilisation,
        utilisation_vs_none: utilisation / none_utilisation,
        jain_index: num("/jain_index")?,
        p99_vs_target: p99 / target,
        p50_vs_target: p50 / target,
    };
    eprintln!("{figure:?}");
    Ok(figure)
}
