//! The stacks HPC and AI jobs move data with, each over xroce against its
//! own TCP transport on the same veth pair (issue 23, item 4): UCX's
//! `ucx_perftest` UCP tag_bw (1 MiB) and tag_lat (8 B) with `UCX_TLS=rc`
//! (rc_verbs over xroce's drop-in libibverbs, both ends under `xroce run`)
//! against `UCX_TLS=tcp`, in alternating rounds, medians. Each program
//! runs in an IPC namespace of its own (`unshare --ipc`): UCX takes two
//! processes of one IPC namespace for one host and would move the data
//! through shared memory instead of the network. The XDP program `xroce
//! run` attached is detached before each TCP run, so TCP crosses the pair
//! as it would without xroce.

use std::{
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::netns::{in_ns, xroce_bin, NsPair, Started};

/// Alternating rounds of each transport; the figure is the median.
const ROUNDS: usize = 3;
/// ucx_perftest's out-of-band TCP port (its default is 13337).
const PORT: u16 = 13337;

/// One ucx_perftest figure over both transports.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct UcxFigure {
    /// e.g. "tag_bw 1048576 B".
    pub test: String,
    /// Every round, in order (MB/s for bandwidth, microseconds for latency).
    pub xroce_rc_rounds: Vec<f64>,
    pub tcp_rounds: Vec<f64>,
    pub xroce_rc: f64,
    pub tcp: f64,
    /// xroce over TCP: goal >= 1.0 for bandwidth, <= 0.7 for latency.
    pub ratio: f64,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Clients {
    pub ucx_tag_bw_1mib: UcxFigure,
    pub ucx_tag_lat_8b: UcxFigure,
}

/// On a pair of its own: UCX keeps 15 characters of an IB device's name,
/// and the bench pair's interfaces make longer ones (`xroce_xrbench...`).
pub fn measure(mtu: u32) -> Result<Clients> {
    let ns = &NsPair::new("u", 3, mtu)?;
    let bw = figure(
        ns,
        "tag_bw",
        1 << 20,
        &["-n", "2000", "-w", "100"],
        Column::Bw,
    )?;
    let lat = figure(
        ns,
        "tag_lat",
        8,
        &["-n", "20000", "-w", "1000"],
        Column::P50Lat,
    )?;
    Ok(Clients {
        ucx_tag_bw_1mib: bw,
        ucx_tag_lat_8b: lat,
    })
}

/// Which column of ucx_perftest's CSV line (`-v`) is the figure.
#[derive(Clone, Copy)]
enum Column {
    /// overall_bw, MB/s.
    Bw,
    /// 50.0_percentile_lat, microseconds.
    P50Lat,
}

fn figure(ns: &NsPair, test: &str, size: u32, iters: &[&str], col: Column) -> Result<UcxFigure> {
    let mut xroce_rounds = Vec::new();
    let mut tcp_rounds = Vec::new();
    for _ in 0..ROUNDS {
        xroce_rounds.push(run(ns, Transport::XroceRc, test, size, iters, col)?);
        crate::dropin::detach(ns);
        tcp_rounds.push(run(ns, Transport::Tcp, test, size, iters, col)?);
    }
    let (x, t) = (median(&xroce_rounds), median(&tcp_rounds));
    eprintln!("ucx_perftest {test} {size} B: rc over xroce {xroce_rounds:?}, tcp {tcp_rounds:?}");
    Ok(UcxFigure {
        test: format!("{test} {size} B"),
        xroce_rc_rounds: xroce_rounds,
        tcp_rounds,
        xroce_rc: x,
        tcp: t,
        ratio: x / t,
    })
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::XroceRc => "UCX_TLS=rc over xroce",
        Transport::Tcp => "UCX_TLS=tcp",
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Transport {
    /// UCX_TLS=rc: rc_verbs on the xroce device, both ends under `xroce run`.
    XroceRc,
    /// UCX_TLS=tcp on the same interfaces, without xroce.
    Tcp,
}

/// One ucx_perftest pair: server in b, client in a; the client's figure.
fn run(
    ns: &NsPair,
    transport: Transport,
    test: &str,
    size: u32,
    iters: &[&str],
    col: Column,
) -> Result<f64> {
    let command = |netns: &str, iface: &str| {
        // `ip netns exec` (not nsenter): UCX checks the device's network
        // interface in /sys/class/net, which only shows the namespace's
        // interfaces when /sys is mounted for it.
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", netns, "unshare", "--ipc", "--"]);
        match transport {
            Transport::XroceRc => {
                cmd.arg(xroce_bin());
                cmd.args(["run", "--iface", iface, "--backend", "afxdp", "--"]);
                cmd.env("UCX_TLS", "rc")
                    .env("UCX_NET_DEVICES", format!("xroce_{iface}:1"));
            }
            Transport::Tcp => {
                cmd.env("UCX_TLS", "tcp").env("UCX_NET_DEVICES", iface);
            }
        }
        cmd.args(["ucx_perftest", "-p", &PORT.to_string()]);
        cmd
    };
    let server = Started::spawn(
        command(&ns.b, &ns.if_b)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    wait_listening(&ns.b, PORT)?;
    let client = command(&ns.a, &ns.if_a)
        .arg(ns.addr_b.to_string())
        .args(["-t", test, "-s", &size.to_string(), "-v"])
        .args(iters)
        .output()
        .context("start the ucx_perftest client")?;
    // UCX prints its errors on stdout.
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    if !client.status.success() {
        bail!(
            "ucx_perftest {test} client ({:?}) failed ({}):\n{out}\n{}",
            transport_name(transport),
            client.status,
            String::from_utf8_lossy(&client.stderr)
        );
    }
    if !server.wait()?.success() {
        bail!("the ucx_perftest {test} server failed");
    }
    parse_csv(&out, col).with_context(|| format!("ucx_perftest {test} printed no result:\n{out}"))
}

/// Waits until something listens on TCP `port` in namespace `netns` (the
/// server opens its port once its transports are up).
fn wait_listening(netns: &str, port: u16) -> Result<()> {
    let want = format!(":{port} ");
    for _ in 0..600 {
        let ss = crate::util::output(in_ns(netns, "ss").args(["-Hltn"]))?;
        if ss.lines().any(|l| l.contains(&want)) {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(50));
    }
    bail!("nothing listens on TCP {port} in {netns} after 30 s")
}

/// The figure from ucx_perftest's CSV output (`-v`): a header line naming
/// the columns, then the final line.
fn parse_csv(out: &str, col: Column) -> Option<f64> {
    let mut lines = out.lines().map(str::trim);
    let header: Vec<&str> = lines
        .by_ref()
        .find(|l| l.starts_with("iterations,"))?
        .split(',')
        .collect();
    let name = match col {
        Column::Bw => "overall_bw",
        Column::P50Lat => "50.0_percentile_lat",
    };
    let at = header.iter().position(|h| *h == name)?;
    let last = lines.rfind(|l| l.split(',').count() == header.len())?;
    last.split(',').nth(at)?.trim().parse().ok()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ucx_perftest_csv_parses() {
        let out = "+----+\n| Message size: 1048576 |\n\
                   iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n\
                   50,44.491,404.739,404.739,2470.73,2470.73,2471,2471\n";
        assert_eq!(parse_csv(out, Column::Bw), Some(2470.73));
        assert_eq!(parse_csv(out, Column::P50Lat), Some(44.491));
        assert_eq!(parse_csv("nothing", Column::Bw), None);
    }
}
