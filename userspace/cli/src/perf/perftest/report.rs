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
            qp_error: None,
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
        let PerftestLatency {
            lat,
            stdev_us,
            unseen_ns,
        } = perftest_latency(samples);
        if let Some(ns) = unseen_ns {
            // On stderr: stdout keeps perftest's exact table.
            eprintln!(
                "xroce: as perftest, the largest sample ({:.2} usec) is in no figure",
                ns as f64 / 1000.0
            );
        }
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
            lat_us: lat,
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

/// What perftest's latency table shows (print_report_lat, since
/// 4.5-0.x's "Fix Max and percentile results").
struct PerftestLatency {
    lat: Latency,
    stdev_us: f64,
    /// The largest sample, which perftest shows in no figure.
    unseen_ns: Option<u64>,
}

/// perftest sorts the samples and measures all but the largest
/// [`LAT_MEASURE_TAIL`] (median, average, deviation); t_max and the
/// percentiles index past them, so only the very largest is never shown.
/// That one is usually the first sample of a write or send run, which spans
/// the peer's start-up (the server posts first and waits for the client's
/// first message): 110 ms against rxe in a TCG guest.
fn perftest_latency(mut ns: Vec<u64>) -> PerftestLatency {
    ns.sort_unstable();
    let len = ns.len();
    let m = if len > LAT_MEASURE_TAIL {
        len - LAT_MEASURE_TAIL
    } else {
        len
    };
    let us = |i: usize| {
        ns.get(i.min(len.saturating_sub(1)))
            .map_or(0.0, |&v| v as f64 / 1000.0)
    };
    let measured = &ns[..m];
    let avg = if m == 0 {
        0.0
    } else {
        measured.iter().sum::<u64>() as f64 / m as f64 / 1000.0
    };
    let var = if m == 0 {
        0.0
    } else {
        measured
            .iter()
            .map(|&v| (v as f64 / 1000.0 - avg).powi(2))
            .sum::<f64>()
            / m as f64
    };
    // perftest's get_median: the mean of the middle two of an even count.
    let p50 = if m == 0 {
        0.0
    } else if m % 2 == 0 {
        (us(m / 2) + us(m / 2 - 1)) / 2.0
    } else {
        us(m / 2)
    };
    let rank = |q: f64| (m as f64 * q).ceil() as usize;
    PerftestLatency {
        lat: Latency {
            min: us(0),
            p50,
            p99: us(rank(0.99)),
            p999: us(rank(0.999)),
            max: us(m),
            avg,
        },
        stdev_us: var.sqrt(),
        unseen_ns: (len > m + 1).then(|| ns[len - 1]),
    }
}

/// How many of the largest samples perftest leaves out of its measure.
const LAT_MEASURE_TAIL: usize = 2;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_follow_perftests_report() {
        // 6 samples; the first absorbed the peer's start-up (110 ms).
        let r = perftest_latency(vec![110_000_000, 9_000, 7_000, 8_000, 3_000_000, 10_000]);
        // Measured: 7, 8, 9, 10 us; t_max indexes the next (3 ms).
        assert_eq!(r.lat.min, 7.0);
        assert_eq!(r.lat.p50, 8.5);
        assert_eq!(r.lat.avg, 8.5);
        assert!((r.stdev_us - 1.25f64.sqrt()).abs() < 1e-9);
        assert_eq!(r.lat.max, 3_000.0);
        assert_eq!(r.lat.p99, 3_000.0);
        assert_eq!(r.unseen_ns, Some(110_000_000));
        // Too few samples to leave any out.
        let r = perftest_latency(vec![5_000, 4_000]);
        assert_eq!((r.lat.min, r.lat.max, r.unseen_ns), (4.0, 5.0, None));
        assert_eq!(perftest_latency(vec![]).lat.max, 0.0);
    }
}
