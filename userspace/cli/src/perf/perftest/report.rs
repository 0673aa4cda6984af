//! What a perftest-compatible run prints: one JSON object (`--json`) or
//! perftest's result tables.

use xroce::connect::{perftest::BwReport, Role};

use super::{
    run::{BwResult, MB},
    Test,
};
use crate::perf::{
    report::{
        print_json, BenchReport, LatReport, Latency, PerftestBw, PerftestBwFigures, PerftestLat,
        PerftestRole, Table,
    },
    Op,
};

impl Test {
    fn perftest_role(&self) -> PerftestRole {
        match self.role {
            Role::Client => PerftestRole::Client,
            Role::Server => PerftestRole::Server,
        }
    }

    fn base_report(&self, r: &BwResult) -> BenchReport {
        let p = self.p;
        let bytes = r.bytes(p);
        BenchReport {
            op: p.op.name().into(),
            size: p.size as u64,
            iters: r.msgs,
            qps: p.qps as u64,
            mtu: self.mtu.bytes(),
            backend: self.stack.backend.into(),
            cc: self.cc.clone(),
            seconds: r.seconds,
            bytes,
            gbps: if r.seconds > 0.0 {
                bytes as f64 * 8.0 / r.seconds / 1e9
            } else {
                0.0
            },
            msgs_per_sec: if r.seconds > 0.0 {
                r.msgs as f64 / r.seconds
            } else {
                0.0
            },
            // perftest does not check data.
            verified: None,
            retransmits: r.retransmits,
            cnps: r.cnps,
            server_cnps_sent: None,
            server_ce_marked: None,
            perftest: Some(PerftestBw {
                role: self.perftest_role(),
                peer_version: self.peer_version.clone(),
                bw_peak_mb_per_sec: None,
                bw_avg_mb_per_sec: None,
                msg_rate_mpps: None,
                peer_report: None,
            }),
        }
    }

    pub(super) fn report_bw(
        &self,
        json: bool,
        r: &BwResult,
        theirs: Option<BwReport>,
    ) -> anyhow::Result<()> {
        let p = self.p;
        let mine = r.to_report(p);
        let mut report = self.base_report(r);
        if let Some(perftest) = &mut report.perftest {
            perftest.bw_peak_mb_per_sec = Some(mine.bw_peak);
            perftest.bw_avg_mb_per_sec = Some(mine.bw_avg);
            perftest.msg_rate_mpps = Some(mine.msg_rate_avg);
            perftest.peer_report = theirs.as_ref().map(|t| figures(&in_mb(t, self.gbits)));
        }
        if json {
            print_json(&report)?;
        } else {
            print_perftest_bw(&in_units(&mine, self.gbits), self.gbits, self.rows);
            if p.op != Op::Send && self.role == Role::Client && !p.all {
                Table::from(&report).print();
            }
        }
        Ok(())
    }

    /// The passive server prints the client's report (print_full_bw_report).
    pub(super) fn report_peer_bw(&self, json: bool, theirs: &BwReport) -> anyhow::Result<()> {
        if json {
            let seconds = if theirs.bw_avg > 0.0 {
                (theirs.iters * theirs.size) as f64 / (theirs.bw_avg * MB)
            } else {
                0.0
            };
            let r = BwResult {
                msgs: theirs.iters,
                seconds,
                retransmits: 0,
                cnps: 0,
            };
            let mut report = self.base_report(&r);
            report.size = theirs.size;
            report.bytes = theirs.iters * theirs.size;
            if let Some(perftest) = &mut report.perftest {
                perftest.peer_report = Some(figures(&in_mb(theirs, self.gbits)));
            }
            print_json(&report)?;
        } else {
            print_perftest_bw(theirs, self.gbits, self.rows);
        }
        Ok(())
    }

    pub(super) fn report_lat(&self, json: bool, samples: Vec<u64>) -> anyhow::Result<()> {
        let p = self.p;
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<u64>() as f64 / n.max(1.0);
        let var = samples
            .iter()
            .map(|&s| (s as f64 - mean).powi(2))
            .sum::<f64>()
            / n.max(1.0);
        let stdev_us = var.sqrt() / 1000.0;
        let stats = self.stack.device.stats();
        let report = LatReport {
            op: p.op.name().into(),
            size: p.size as u64,
            iters: p.iters,
            qps: 1,
            mtu: self.mtu.bytes(),
            backend: self.stack.backend.into(),
            seconds: None,
            bytes: None,
            gbps: None,
            msgs_per_sec: None,
            verified: None,
            retransmits: stats.tx_retransmitted,
            cnps: stats.rx_cnps,
            lat_us: Latency::from_ns(samples),
            perftest: Some(PerftestLat {
                role: self.perftest_role(),
                peer_version: self.peer_version.clone(),
                stdev_us,
            }),
        };
        if json {
            return print_json(&report);
        }
        let l = &report.lat_us;
        if self.rows.0 {
            println!("{RESULT_LINE}");
            println!(
                " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
            );
        }
        println!(
            " {:<7} {:<10}     {:<7.2}        {:<7.2}      {:<7.2}     \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2}   \t\t{:<7.2}",
            p.size, p.iters, l.min, l.max, l.p50, l.avg, stdev_us, l.p99, l.p999,
        );
        if self.rows.1 {
            println!("{RESULT_LINE}");
        }
        Ok(())
    }
}

const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// MB/s (2^20 bytes) to Gb/s.
const GBITS_PER_MB: f64 = MB * 8.0 / 1e9;

/// A report in MB/s as perftest exchanges and prints it: in Gb/s with
/// --report_gbits (perftest scales its figures before it sends them).
pub(super) fn in_units(r: &BwReport, gbits: bool) -> BwReport {
    let k = if gbits { GBITS_PER_MB } else { 1.0 };
    BwReport {
        bw_peak: r.bw_peak * k,
        bw_avg: r.bw_avg * k,
        ..*r
    }
}

/// The peer's report back in MB/s (it used our unit, as perftest's pairs do).
fn in_mb(r: &BwReport, gbits: bool) -> BwReport {
    let k = if gbits { 1.0 / GBITS_PER_MB } else { 1.0 };
    BwReport {
        bw_peak: r.bw_peak * k,
        bw_avg: r.bw_avg * k,
        ..*r
    }
}

/// perftest's bw table, its figures as they are; headed Gb/sec with
/// --report_gbits.
/// `rows`: the header (first row of -a), the closing rule (last).
fn print_perftest_bw(r: &BwReport, gbits: bool, rows: (bool, bool)) {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    if rows.0 {
        println!("{RESULT_LINE}");
        println!(
            " #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
        );
    }
    println!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate_avg
    );
    if rows.1 {
        println!("{RESULT_LINE}");
    }
}

/// perftest's report as it goes into ours.
fn figures(r: &BwReport) -> PerftestBwFigures {
    PerftestBwFigures {
        size: r.size,
        iters: r.iters,
        bw_peak_mb_per_sec: r.bw_peak,
        bw_avg_mb_per_sec: r.bw_avg,
        msg_rate_mpps: r.msg_rate_avg,
    }
}
