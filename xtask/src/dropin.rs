//! Debian's unmodified perftest over xroce's drop-in libibverbs, between
//! the two namespaces of an [`NsPair`], for the demo and the benchmarks:
//! both sides run under `xroce run --iface IF -- ib_...`, which attaches
//! the XDP program (AF_XDP backend) and puts xroce's libibverbs.so.1 first
//! on the library path.

use std::{process::Stdio, thread, time::Duration};

use anyhow::{bail, Context, Result};

use crate::{
    netns::{in_ns, xroce_bin, NsPair, Started},
    util::output,
};

/// Builds (release) the `xroce` binary and the drop-in libraries it runs
/// programs over.
pub fn build_release() -> Result<()> {
    crate::util::cargo(&[
        "build",
        "--release",
        "--package",
        "xroce-cli",
        "--package",
        "xroce-ibverbs",
        "--package",
        "xroce-rdmacm",
    ])
}

/// What one perftest client printed: its result table's first data row.
pub struct PerftestRow {
    /// The whole table, as perftest printed it.
    pub table: String,
    /// The numeric columns of the first row under the `#bytes` header.
    pub columns: Vec<f64>,
}

/// Runs `tool ARGS` (e.g. `ib_write_bw -s 65536`) as a server in namespace
/// b and as a client in a, both through `xroce run` on the AF_XDP backend
/// with `-x 1 -F` (RoCEv2 GID index 1, no CPU-frequency check).
pub fn perftest(ns: &NsPair, tool: &str, args: &[&str]) -> Result<PerftestRow> {
    let xroce = xroce_bin();
    let dev = |ifname: &str| format!("xroce_{ifname}");
    let common = |ifname: &str| {
        let mut v: Vec<String> = vec![
            "run".into(),
            "--iface".into(),
            ifname.into(),
            "--backend".into(),
            "afxdp".into(),
            "--".into(),
            tool.into(),
            "-d".into(),
            dev(ifname),
            "-x".into(),
            "1".into(),
            "-F".into(),
        ];
        v.extend(args.iter().map(|s| s.to_string()));
        v
    };
    let server = Started::spawn(
        in_ns(&ns.b, &xroce)
            .args(common(&ns.if_b))
            .stdout(Stdio::null()),
    )?;
    // perftest's server listens on TCP 18515 once its device is up.
    thread::sleep(Duration::from_millis(1500));
    let out = output(
        in_ns(&ns.a, &xroce)
            .args(common(&ns.if_a))
            .arg(ns.addr_b.to_string()),
    )
    .with_context(|| format!("{tool} client over xroce's libibverbs"))?;
    if !server.wait()?.success() {
        bail!("the {tool} server over xroce's libibverbs failed");
    }
    parse_table(&out).with_context(|| format!("{tool} printed no result table:\n{out}"))
}

/// The first data row after perftest's `#bytes` header.
pub fn parse_table(out: &str) -> Option<PerftestRow> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    let header = lines.next()?;
    let row = lines.next()?;
    let columns: Vec<f64> = row
        .split_whitespace()
        .map(|c| c.parse().ok())
        .collect::<Option<_>>()?;
    Some(PerftestRow {
        table: format!("{header}\n{row}"),
        columns,
    })
}

/// Detaches the XDP program `xroce run` left on both ends.
pub fn detach(ns: &NsPair) {
    for (n, ifname) in [(&ns.a, &ns.if_a), (&ns.b, &ns.if_b)] {
        let _ = in_ns(n, xroce_bin())
            .args(["detach", "--iface", ifname])
            .stderr(Stdio::null())
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perftest_tables_parse() {
        let out = "---\n #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 65536      26000            0.00               2.84   \t\t   0.005423\n---\n";
        let r = parse_table(out).unwrap();
        assert_eq!(r.columns.len(), 5);
        assert_eq!(r.columns[3], 2.84);
        assert!(parse_table("no table").is_none());
    }
}
