//! The stacks HPC and AI jobs move data with, each over xroce against its
//! own TCP transport on the same veth pair (issue 23, item 4), in
//! alternating rounds, medians:
//!
//! - UCX's `ucx_perftest` UCP tag_bw (1 MiB) and tag_lat (8 B) with
//!   `UCX_TLS=rc` (rc_verbs over xroce's drop-in libibverbs, both ends
//!   under `xroce run`) against `UCX_TLS=tcp`;
//! - Open MPI's MPI_Allreduce of 16 MiB, 4 ranks (2 per host), with pml
//!   ucx over xroce (`UCX_TLS=rc,sm,self`) against Open MPI's own TCP
//!   (pml ob1, btl tcp); both use shared memory between the two ranks of
//!   a host. The program (allreduce_time.c) checks every element.
//!
//! xroce runs on both backends: AF_XDP (the default as root) and the UDP
//! backend with GSO and GRO (`XROCE_UDP_GSO=1 XROCE_UDP_GRO=1`, no XDP
//! program on the pair: the veth then carries 64 KB packets whole, as it
//! does TCP's). Each figure's ratio is the better backend's.
//!
//! Each host runs in an IPC namespace of its own (`unshare --ipc`): UCX
//! takes two processes of one IPC namespace for one host and would move
//! the data through shared memory instead of the network. The XDP program
//! `xroce run` attached is detached before each TCP run, so TCP crosses
//! the pair as it would without xroce.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{median, udp_gso::GSO_ON};
use crate::netns::{in_ns, xroce_bin, NsPair, Started};

/// Alternating rounds of each transport; the figure is the median.
const ROUNDS: usize = 3;
/// ucx_perftest's out-of-band TCP port (its default is 13337).
const PORT: u16 = 13337;

/// One figure of a client over xroce's two backends and TCP.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Figure {
    /// e.g. "tag_bw 1048576 B" (ucx_perftest's test),
    /// "MPI_Allreduce 16777216 B, 4 ranks on 2 hosts".
    pub test: String,
    /// Of every figure below: "MB/s", "us" or "s" (per call).
    pub unit: String,
    /// Every round, in order.
    pub rounds: Rounds,
    /// The medians.
    pub xroce_afxdp: f64,
    pub xroce_udp_gso: f64,
    pub tcp: f64,
    /// The better xroce backend ("afxdp" or "udp_gso").
    pub best: String,
    /// The better backend's figure over TCP's. Goals: >= 1.0 for UCX
    /// bandwidth, <= 0.7 for UCX latency, <= 1.0 for MPI's time.
    pub ratio: f64,
}

impl Figure {
    /// The medians of `rounds` and the better xroce backend: the larger
    /// figure if `higher_is_better`, else the smaller. Prints the rounds.
    fn of(test: String, unit: &str, rounds: Rounds, higher_is_better: bool) -> Self {
        eprintln!(
            "{test}: xroce AF_XDP {:?}, xroce UDP GSO {:?}, TCP {:?} {unit}",
            rounds.xroce_afxdp, rounds.xroce_udp_gso, rounds.tcp
        );
        let (a, u, t) = (
            median(&rounds.xroce_afxdp),
            median(&rounds.xroce_udp_gso),
            median(&rounds.tcp),
        );
        let udp_wins = if higher_is_better { u > a } else { u < a };
        let (best, x) = if udp_wins {
            ("udp_gso", u)
        } else {
            ("afxdp", a)
        };
        Figure {
            test,
            unit: unit.to_string(),
            rounds,
            xroce_afxdp: a,
            xroce_udp_gso: u,
            tcp: t,
            best: best.to_string(),
            ratio: x / t,
        }
    }
}

/// Every round of one figure, in order, per transport.
#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct Rounds {
    pub xroce_afxdp: Vec<f64>,
    pub xroce_udp_gso: Vec<f64>,
    pub tcp: Vec<f64>,
}

impl Rounds {
    /// One round of each transport, in turn; the XDP program `xroce run`
    /// attached for AF_XDP is detached before the others.
    fn measure(ns: &NsPair, mut one: impl FnMut(Transport) -> Result<f64>) -> Result<Self> {
        let mut r = Rounds::default();
        for _ in 0..ROUNDS {
            r.xroce_afxdp.push(one(Transport::XroceAfxdp)?);
            crate::dropin::detach(ns);
            r.xroce_udp_gso.push(one(Transport::XroceUdpGso)?);
            r.tcp.push(one(Transport::Tcp)?);
        }
        Ok(r)
    }
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Clients {
    pub ucx_tag_bw_1mib: Figure,
    pub ucx_tag_lat_8b: Figure,
    pub mpi_allreduce_16mib: Figure,
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
    let allreduce = mpi_figure(ns, ALLREDUCE_BYTES)?;
    Ok(Clients {
        ucx_tag_bw_1mib: bw,
        ucx_tag_lat_8b: lat,
        mpi_allreduce_16mib: allreduce,
    })
}

/// The MPI figure's message: 16 MiB.
const ALLREDUCE_BYTES: u64 = 16 << 20;
/// Timed calls per run (after one that connects the ranks).
const ALLREDUCE_CALLS: u32 = 5;

fn mpi_figure(ns: &NsPair, bytes: u64) -> Result<Figure> {
    let dir = std::env::temp_dir().join(format!("xroce-bench-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = (|| {
        let exe = dir.join("allreduce_time");
        let src = crate::util::workspace_root().join("xtask/src/bench/allreduce_time.c");
        crate::util::run(
            Command::new("mpicc")
                .args(["-O2", "-Wall", "-Werror", "-o"])
                .arg(&exe)
                .arg(&src),
        )?;
        let rounds = Rounds::measure(ns, |t| mpirun(ns, &dir, &exe, t, bytes))?;
        Ok(Figure::of(
            format!("MPI_Allreduce {bytes} B, 4 ranks on 2 hosts"),
            "s",
            rounds,
            false,
        ))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The words that start `COMMAND` as host `name` in namespace `netns`:
/// its own IPC and UTS namespaces (a host name of its own, no shared
/// memory with the other host), under `xroce run` for xroce.
fn host_prefix(netns: &str, iface: &str, name: &str, transport: Transport) -> Vec<String> {
    let mut argv: Vec<String> = ["ip", "netns", "exec", netns, "unshare", "--ipc", "--uts"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.extend(
        ["--", "sh", "-c", "hostname \"$0\" && exec \"$@\"", name]
            .iter()
            .map(|s| s.to_string()),
    );
    if let Some(backend) = transport.backend() {
        if transport == Transport::XroceUdpGso {
            argv.push("env".into());
            argv.extend(GSO_ON.iter().map(|(k, v)| format!("{k}={v}")));
        }
        argv.push(xroce_bin().to_string_lossy().into_owned());
        argv.extend(
            ["run", "--iface", iface, "--backend", backend, "--"]
                .iter()
                .map(|s| s.to_string()),
        );
    }
    argv
}

/// Single-quoted for sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// One mpirun of 4 ranks, 2 per host: mpirun runs as host a (its ranks
/// there are its children, under its `xroce run`); its launch agent starts
/// orted as host b. Returns the seconds per call rank 0 printed.
fn mpirun(ns: &NsPair, dir: &Path, exe: &Path, transport: Transport, bytes: u64) -> Result<f64> {
    let b_prefix = host_prefix(&ns.b, &ns.if_b, "hostb", transport)
        .iter()
        .map(|a| sh_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    let agent: PathBuf = dir.join("agent.sh");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n# plm_rsh_agent of the MPI bench: HOST COMMAND...\n\
             shift\nexec {b_prefix} sh -c \"$*\"\n"
        ),
    )?;
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let hostfile = dir.join("hosts");
    std::fs::write(
        &hostfile,
        format!("{} slots=2\n{} slots=2\n", ns.addr_a, ns.addr_b),
    )?;
    let subnet = format!("{}/24", Ipv4Net(ns.addr_a));
    let argv = host_prefix(&ns.a, &ns.if_a, "hosta", transport);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd.args(["mpirun", "--allow-run-as-root", "-np", "4", "--hostfile"])
        .arg(&hostfile)
        .args(["--map-by", "node", "--mca", "plm_rsh_agent"])
        .arg(&agent)
        .args(["--mca", "oob_tcp_if_include", &subnet]);
    match transport {
        Transport::XroceAfxdp | Transport::XroceUdpGso => {
            cmd.args([
                "--mca", "pml", "ucx", "--mca", "osc", "ucx", "-x", "UCX_TLS",
            ]);
            cmd.env("UCX_TLS", "rc,sm,self");
        }
        Transport::Tcp => {
            cmd.args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp"]);
            cmd.args(["--mca", "btl_tcp_if_include", &subnet]);
        }
    }
    cmd.arg(exe)
        .arg(bytes.to_string())
        .arg(ALLREDUCE_CALLS.to_string())
        .env("HOME", dir)
        .env("SHELL", "/bin/sh");
    let out = cmd.output().context("start mpirun")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "mpirun ({:?}) failed ({}):\n{stdout}\n{}",
            transport_name(transport),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("allreduce_seconds ")?.trim().parse().ok())
        .with_context(|| format!("allreduce_time printed no time:\n{stdout}"))
}

/// The /24 network of an address, as Open MPI's *_if_include take it.
struct Ipv4Net(std::net::Ipv4Addr);

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, _] = self.0.octets();
        write!(f, "{a}.{b}.{c}.0")
    }
}

/// Which column of ucx_perftest's CSV line (`-v`) is the figure.
#[derive(Clone, Copy)]
enum Column {
    /// overall_bw, MB/s.
    Bw,
    /// 50.0_percentile_lat, microseconds.
    P50Lat,
}

fn figure(ns: &NsPair, test: &str, size: u32, iters: &[&str], col: Column) -> Result<Figure> {
    let rounds = Rounds::measure(ns, |t| run(ns, t, test, size, iters, col))?;
    let (unit, higher_is_better) = match col {
        Column::Bw => ("MB/s", true),
        Column::P50Lat => ("us", false),
    };
    Ok(Figure::of(
        format!("{test} {size} B"),
        unit,
        rounds,
        higher_is_better,
    ))
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::XroceAfxdp => "UCX_TLS=rc over xroce's AF_XDP backend",
        Transport::XroceUdpGso => "UCX_TLS=rc over xroce's UDP backend with GSO/GRO",
        Transport::Tcp => "TCP",
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Transport {
    /// rc_verbs on the xroce device over AF_XDP, both ends under `xroce run`.
    XroceAfxdp,
    /// The same over xroce's UDP backend with GSO and GRO, no XDP program.
    XroceUdpGso,
    /// The client's TCP transport on the same interfaces, without xroce
    /// (UCX_TLS=tcp; Open MPI's btl tcp).
    Tcp,
}

impl Transport {
    /// `xroce run`'s backend, or `None` for TCP.
    fn backend(self) -> Option<&'static str> {
        match self {
            Transport::XroceAfxdp => Some("afxdp"),
            Transport::XroceUdpGso => Some("udp"),
            Transport::Tcp => None,
        }
    }
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
        match transport.backend() {
            Some(backend) => {
                cmd.arg(xroce_bin());
                cmd.args(["run", "--iface", iface, "--backend", backend, "--"]);
                cmd.env("UCX_TLS", "rc")
                    .env("UCX_NET_DEVICES", format!("xroce_{iface}:1"));
                if transport == Transport::XroceUdpGso {
                    cmd.envs(GSO_ON.iter().copied());
                }
            }
            None => {
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

    /// The better backend is the larger figure for bandwidth and the
    /// smaller for latency and time; the ratio is its median over TCP's.
    #[test]
    fn the_better_backend_is_picked_by_direction() {
        let rounds = || Rounds {
            xroce_afxdp: vec![700.0, 800.0, 750.0],
            xroce_udp_gso: vec![1800.0, 1500.0, 2000.0],
            tcp: vec![2000.0, 2400.0, 2200.0],
        };
        let bw = Figure::of("tag_bw".into(), "MB/s", rounds(), true);
        assert_eq!(
            (bw.best.as_str(), bw.xroce_afxdp, bw.xroce_udp_gso),
            ("udp_gso", 750.0, 1800.0)
        );
        assert_eq!(bw.ratio, 1800.0 / 2200.0);
        let time = Figure::of("allreduce".into(), "s", rounds(), false);
        assert_eq!((time.best.as_str(), time.ratio), ("afxdp", 750.0 / 2200.0));
    }
}
