//! The raw AF_XDP ceiling (issue 13, goal 1): userspace/xroce's
//! `afxdp_blast` example sends WRITE-middle-sized frames (RoCE path MTU
//! 2048 payload) from namespace a to b through the same AF_XDP backend and
//! XDP program xroce runs on, with no RDMA; b counts the payload bytes that
//! arrive. xroce's WRITE goodput is held against it.

use std::{io::Read, process::Stdio, thread, time::Duration};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::{
    netns::{in_ns, NsPair, Started},
    util::{cargo, output, workspace_root},
};

/// What `afxdp_blast recv` prints.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Blast {
    pub frames: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub payload_gbps: f64,
}

/// Builds the blaster (release).
pub fn build() -> Result<()> {
    cargo(&[
        "build",
        "--release",
        "-p",
        "xroce",
        "--example",
        "afxdp_blast",
    ])
}

/// One blast of `seconds` from a to b; b's count.
pub fn blast(ns: &NsPair, seconds: u32) -> Result<Blast> {
    let exe = workspace_root().join("target/release/examples/afxdp_blast");
    let mut receiver = Started::spawn(
        in_ns(&ns.b, &exe)
            .args(["recv", &ns.if_b, &seconds.to_string()])
            .stdout(Stdio::piped()),
    )?;
    // The receiver attaches XDP and opens its sockets first.
    thread::sleep(Duration::from_millis(1500));
    output(in_ns(&ns.a, &exe).args([
        "send",
        &ns.if_a,
        &ns.addr_b.to_string(),
        &(seconds + 2).to_string(),
        "2048",
    ]))?;
    let mut stdout = String::new();
    if let Some(mut pipe) = receiver.0.stdout.take() {
        pipe.read_to_string(&mut stdout)?;
    }
    if !receiver.wait()?.success() {
        bail!("afxdp_blast recv failed");
    }
    serde_json::from_str(stdout.trim()).context("afxdp_blast recv's JSON")
}
