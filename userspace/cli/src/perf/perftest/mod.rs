//! `--perftest`: `xroce bench` / `xroce lat` against perftest v4.5-0.17's
//! ib_{write,read,send,atomic}_bw and ib_{write,read,send}_lat (RC, no
//! rdma_cm), as client (`xroce bench write --perftest -d IF HOST`, like
//! `ib_write_bw HOST`) or server (`xroce bench write --perftest -d IF`,
//! like `ib_write_bw`).
//!
//! What perftest does, and so do we:
//!
//! - the OOB exchange of [`xroce::connect::perftest`]: versions, cycle
//!   buffer and cache line (the larger of each side's), MTU (the smaller),
//!   then the per-tool sequence of hand shakes below;
//! - one buffer of 2 x QPs x `BUFF_SIZE` (a QP's message size, at least the
//!   cycle buffer): QP i sends from slot i of the first half and gives the
//!   peer slot i of the second half as its `vaddr` (`rkey` of the buffer);
//! - below half a cycle buffer, RDMA addresses step by the message size
//!   rounded up to a cache line and wrap at the cycle buffer;
//! - write/read/atomic bw: the server is passive and waits in a hand shake;
//!   the client runs, hand-shakes, exchanges the bw report, closes;
//!   send bw: the server receives `iters` messages per QP and reports its
//!   own bandwidth;
//! - write lat: both poll the last byte of their buffer for the peer's
//!   counter (the server writes first); send lat: the client sends first;
//!   read lat: the client reads, the server waits to close;
//! - defaults: size 65536 (bw) / 2 (lat), 5000 (bw) / 1000 (lat) iterations,
//!   tx depth 128 (bw) / 1 (lat), port 18515; latency as half the gap
//!   between successive posts (write, send) or the gap (read).
//!
//! perftest does not check data; neither does this mode (`verified` is
//! null in the JSON report).
//!
//! - `oob.rs`: the TCP connection of the exchange (client or server);
//! - `session.rs`: the exchange itself, the verbs objects and the buffer
//!   layout (addresses, hand shakes, QPs to RTS);
//! - `run.rs`: the measurement loops (bw client, send bw server, lat);
//! - `report.rs`: the JSON report and perftest's result tables.

mod oob;
mod report;
mod run;
mod session;

use std::time::Duration;

use anyhow::bail;
use xroce::connect::{perftest::BwReport, Role};

use super::{Op, PerfArgs, RunLength, OOB_TIMEOUT};
use session::Test;

/// perftest's defaults.
const DEF_SIZE_BW: usize = 65536;
const DEF_SIZE_LAT: usize = 2;
const DEF_ITERS_BW: u64 = 5000;
const DEF_ITERS_LAT: u64 = 1000;
/// perftest's DEF_RX_SEND: receives the send server keeps posted.
const DEF_RX_SEND: usize = 512;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tool {
    Bw,
    Lat,
}

/// Run parameters after perftest's defaults.
#[derive(Clone, Copy, Debug)]
struct Params {
    tool: Tool,
    op: Op,
    size: usize,
    iters: u64,
    qps: usize,
    tx_depth: usize,
    /// -a: every size up to `size` (the buffers are made for the largest).
    all: bool,
}

/// perftest's -a: 2 B .. 8 MiB.
const ALL_SIZES: std::ops::RangeInclusive<u32> = 1..=23;

impl Params {
    fn new(args: &PerfArgs, tool: Tool) -> anyhow::Result<Params> {
        let size = match (tool, args.op) {
            (_, Op::Atomic) => 8,
            _ if args.all => 1 << ALL_SIZES.end(),
            (Tool::Bw, _) => args.size_or(DEF_SIZE_BW)?,
            (Tool::Lat, _) => args.size_or(DEF_SIZE_LAT)?,
        };
        if size == 0 {
            bail!("--size must be at least 1");
        }
        let iters = match args.run_length(match tool {
            Tool::Bw => DEF_ITERS_BW,
            Tool::Lat => DEF_ITERS_LAT,
        }) {
            RunLength::Iters(n) if n > 0 => n,
            RunLength::Iters(_) => bail!("--iters must be at least 1"),
            RunLength::Duration(_) => {
                bail!("--perftest runs a number of iterations (-n); perftest's -D mode is not supported")
            }
        };
        if args.qps == 0 {
            bail!("--qps must be at least 1");
        }
        if tool == Tool::Lat && args.qps != 1 {
            bail!("perftest's latency tools run one QP");
        }
        let tx_depth = match tool {
            Tool::Bw => args.tx_depth.max(1),
            Tool::Lat => 1,
        };
        Ok(Params {
            tool,
            op: args.op,
            size,
            iters,
            qps: args.qps,
            tx_depth,
            all: args.all,
        })
    }

    fn verb(&self) -> &'static str {
        match self.op {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
        }
    }
}

pub fn bench(args: &PerfArgs) -> anyhow::Result<()> {
    let p = Params::new(args, Tool::Bw)?;
    let mut t = Test::setup(args, p)?;
    match (t.role, p.op) {
        (Role::Client, Op::Send) => {
            let r = t.bw_client()?;
            t.close()?;
            t.report_bw(args.json, &r, None)
        }
        (Role::Server, Op::Send) => {
            let r = t.bw_send_server()?;
            t.close()?;
            t.report_bw(args.json, &r, None)
        }
        (Role::Client, _) if p.all => {
            // As perftest's RUN_ALL: a row per size, then the last report
            // to the passive server.
            let mut last = None;
            for (i, k) in ALL_SIZES.enumerate() {
                t.p.size = 1 << k;
                let r = t.bw_client()?;
                t.rows = (i == 0, k == *ALL_SIZES.end());
                t.report_bw(args.json, &r, None)?;
                last = Some(r);
            }
            let r = last.expect("sizes to run");
            t.conn.hand_shake(&t.my[0])?;
            let theirs = t
                .conn
                .exchange_bw_report(&report::in_units(&r.to_report(t.p), t.gbits))?;
            t.close()?;
            let _ = theirs;
            Ok(())
        }
        (Role::Client, _) => {
            let r = t.bw_client()?;
            t.conn.hand_shake(&t.my[0])?;
            let theirs = t
                .conn
                .exchange_bw_report(&report::in_units(&r.to_report(p), t.gbits))?;
            t.close()?;
            t.report_bw(args.json, &r, Some(theirs))
        }
        (Role::Server, _) => {
            // perftest's server waits for the client in a hand shake.
            t.conn.set_timeout(run_timeout(p));
            t.conn.hand_shake(&t.my[0])?;
            t.conn.set_timeout(OOB_TIMEOUT);
            let theirs = t.conn.exchange_bw_report(&BwReport::default())?;
            t.close()?;
            t.report_peer_bw(args.json, &theirs)
        }
    }
}

pub fn lat(args: &PerfArgs) -> anyhow::Result<()> {
    let p = Params::new(args, Tool::Lat)?;
    let mut t = Test::setup(args, p)?;
    if p.all && !(t.role == Role::Server && p.op == Op::Read) {
        // As perftest's RUN_ALL: the same connection, a row per size.
        for (i, k) in ALL_SIZES.enumerate() {
            t.p.size = 1 << k;
            let samples = match p.op {
                Op::Write => t.lat_write()?,
                _ => t.lat_read()?,
            };
            t.rows = (i == 0, k == *ALL_SIZES.end());
            t.report_lat(args.json, samples)?;
        }
        if p.op == Op::Read {
            t.close()?;
        }
        return Ok(());
    }
    let samples = match (t.role, p.op) {
        (Role::Server, Op::Read) => {
            // Only the client posts READs; the server waits to close.
            t.conn.set_timeout(run_timeout(p));
            t.close()?;
            eprintln!("xroce: perftest read_lat client done");
            return Ok(());
        }
        (Role::Client, Op::Read) => {
            let s = t.lat_read()?;
            t.close()?;
            s
        }
        (_, Op::Write) => t.lat_write()?,
        (_, Op::Send) => {
            let s = t.lat_send()?;
            t.close()?;
            s
        }
        (_, Op::Atomic) => unreachable!("lat refuses atomics"),
    };
    t.report_lat(args.json, samples)
}

/// How long the passive side may wait for the whole run.
fn run_timeout(p: Params) -> Duration {
    let runs = if p.all { ALL_SIZES.count() as u32 } else { 1 };
    OOB_TIMEOUT + Duration::from_millis(p.iters.saturating_mul(p.qps as u64)) * 10 * runs
}

/// Receives per QP: the send bw server keeps perftest's 512 (shared by the
/// QPs, at least the sender's depth), send lat a few.
fn rx_depth(p: Params) -> usize {
    match (p.op, p.tool) {
        (Op::Send, Tool::Bw) => (DEF_RX_SEND / p.qps).max(p.tx_depth).max(1),
        (Op::Send, Tool::Lat) => 16,
        _ => 1,
    }
}
