//! What `xroce bench` / `xroce lat` print: the report ([`xroce_report`],
//! shared with its readers) as one JSON object on stdout with `--json`,
//! else a perftest-style table.

use serde::Serialize;
pub use xroce_report::{
    BenchReport, LatReport, Latency, PerftestBw, PerftestBwFigures, PerftestLat, PerftestRole,
};

/// One JSON object on stdout.
pub fn print_json(report: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(report)?);
    Ok(())
}

/// The bandwidth table: the settings of a run and its figures.
pub struct Table<'a> {
    pub op: &'a str,
    pub backend: &'a str,
    pub mtu: u32,
    pub qps: u64,
    /// `None` prints as "none".
    pub cc: Option<&'a str>,
    pub size: u64,
    pub iters: u64,
    pub gbps: f64,
    pub msgs_per_sec: f64,
    pub retransmits: u64,
    /// `None` prints as "n/a".
    pub verified: Option<bool>,
    /// Added to the title after the op (" UC", " bidirectional").
    pub title: String,
}

impl<'a> From<&'a BenchReport> for Table<'a> {
    fn from(r: &'a BenchReport) -> Self {
        Table {
            op: &r.op,
            backend: &r.backend,
            mtu: r.mtu,
            qps: r.qps,
            cc: Some(&r.cc),
            size: r.size,
            iters: r.iters,
            gbps: r.gbps,
            msgs_per_sec: r.msgs_per_sec,
            retransmits: r.retransmits,
            verified: r.verified,
            title: String::new(),
        }
    }
}

const RULE: &str =
    "---------------------------------------------------------------------------------------";

impl Table<'_> {
    pub fn print(&self) {
        self.print_rows(true, true);
    }

    /// The header (`first`), this run's row, the closing rule (`last`):
    /// one table for the runs of -a.
    pub fn print_rows(&self, first: bool, last: bool) {
        if first {
            println!("{RULE}");
            println!(
                " xroce {}{} bandwidth   backend {}   path MTU {}   QPs {}   cc {}",
                self.op,
                self.title,
                self.backend,
                self.mtu,
                self.qps,
                self.cc.unwrap_or("none"),
            );
            println!(
                " #bytes     #iterations    BW average[Gb/sec]    MsgRate[Mpps]    retransmits   verified"
            );
        }
        println!(
            " {:<10} {:<14} {:<21.3} {:<16.4} {:<13} {}",
            self.size,
            self.iters,
            self.gbps,
            self.msgs_per_sec / 1e6,
            self.retransmits,
            self.verified
                .map_or_else(|| "n/a".to_string(), |v| v.to_string()),
        );
        if last {
            println!("{RULE}");
        }
    }
}
