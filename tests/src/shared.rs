//! Helpers for tests where several processes share one xroce device: what
//! a namespace shows of the QPN-block holders (abstract Unix names
//! `@xroce/<ifindex>/...` in its /proc/net/unix) and of their UDP sockets
//! (`qpn_block::udp_port`: 4791 for block 0, 24791.. for users' others,
//! 960..=1023 for root's), read from inside the
//! namespace; server/client pairs whose two sides may be on any node, even
//! the same one; programs run as an unprivileged user.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use xroce_common::qpn_block;

use crate::{
    programs::{args, next_port, wait_listening, Node, PairOutput, Proc, Topology},
    workspace_bin, Netns,
};

/// The unprivileged user (and group) the tests drop to: nobody/nogroup.
pub const NOBODY: u32 = 65534;

/// A file of the namespace's /proc/net (read by `cat` run inside it: the
/// test's own /proc/net is the host namespace's).
fn proc_net(ns: &Netns, file: &str) -> String {
    let out = ns
        .command("cat")
        .arg(format!("/proc/net/{file}"))
        .output()
        .unwrap_or_else(|e| panic!("cat /proc/net/{file} in {}: {e}", ns.name));
    assert!(
        out.status.success(),
        "cat /proc/net/{file} in {}: {}",
        ns.name,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The abstract Unix names starting `@xroce/` bound in the namespace
/// (block holds, the AF_XDP hold, an attach in progress), sorted.
pub fn xroce_unix_names(ns: &Netns) -> Vec<String> {
    let mut names: Vec<String> = proc_net(ns, "unix")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|p| p.starts_with("@xroce/"))
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

/// The QPN-block holds (`@xroce/<ifindex>/block/<b>`) in the namespace.
pub fn block_names(ns: &Netns) -> Vec<String> {
    xroce_unix_names(ns)
        .into_iter()
        .filter(|n| n.contains("/block/"))
        .collect()
}

/// Waits until the namespace shows `n` block holds; the error lists them.
pub fn wait_blocks(ns: &Netns, n: usize, timeout: Duration) -> Result<Vec<String>, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let names = block_names(ns);
        if names.len() == n {
            return Ok(names);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{}: {} block holds after {timeout:?}, expected {n}: {names:?}",
                ns.name,
                names.len()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `port` is one a QPN block receives on.
pub fn is_block_port(port: u16) -> bool {
    (0..qpn_block::COUNT).any(|b| qpn_block::udp_port(b) == port)
}

/// Local ports of the UDP sockets (v4 and v6) bound in the namespace on a
/// QPN block's port ([`is_block_port`]), sorted.
pub fn block_udp_ports(ns: &Netns) -> Vec<u16> {
    let mut ports: Vec<u16> = ["udp", "udp6"]
        .iter()
        .flat_map(|f| {
            proc_net(ns, f)
                .lines()
                .skip(1)
                // "sl local_address:PORT ..." with the port in hex.
                .filter_map(|l| {
                    l.split_whitespace()
                        .nth(1)?
                        .rsplit(':')
                        .next()
                        .map(String::from)
                })
                .filter_map(|p| u16::from_str_radix(&p, 16).ok())
                .collect::<Vec<_>>()
        })
        .filter(|p| is_block_port(*p))
        .collect();
    ports.sort_unstable();
    ports
}

/// The counters file an engine of process `pid` publishes for `iface`
/// (userspace/xroce/src/stats_export.rs).
pub fn stats_file(iface: &str, pid: u32) -> PathBuf {
    xroce::stats_export::export_dir(iface).join(format!("engine.{pid}"))
}

/// `xroce bench ARGS` in the node's namespace, started as a [`Proc`]
/// (output in the topology's directory).
pub fn start_xroce(t: &Topology, node: Node<'_>, bench_args: &[String]) -> Proc {
    let mut cmd = node.ns.command(workspace_bin("xroce"));
    cmd.args(bench_args);
    let what = format!("[in {}] xroce {}", node.ns.name, bench_args.join(" "));
    Proc::spawn(cmd, what, &t.dir.0)
}

/// `xroce run --iface IF --backend udp -- PROGRAM ARGS` in the node's
/// namespace as user and group [`NOBODY`] without supplementary groups
/// (entered as root, then `setpriv` drops the privileges).
pub fn start_as_nobody(t: &Topology, node: Node<'_>, program: &str, prog_args: &[String]) -> Proc {
    let mut cmd = node.ns.command("setpriv");
    cmd.arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .args(["--clear-groups", "--"])
        .arg(workspace_bin("xroce"))
        .args(["run", "--iface", node.iface, "--backend", "udp", "--"])
        .arg(program)
        .args(prog_args)
        .env("XROCE_VERBS_DEBUG", "1");
    let what = format!(
        "[udp in {} as uid {NOBODY}] {program} {}",
        node.ns.name,
        prog_args.join(" ")
    );
    Proc::spawn(cmd, what, &t.dir.0)
}

/// The real and effective uid of a running process (`Uid:` of its
/// /proc status).
pub fn uids(pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    let mut f = line.split_whitespace().skip(1).map(|x| x.parse().ok());
    Some((f.next()??, f.next()??))
}

/// Starts the server of a TCP-exchange pair of an rdma-core program
/// (perftest, the pingpongs) on `server` with `server_args -p PORT` (a
/// port of its own) through `start` (e.g. [`Topology::start`] or
/// [`start_as_nobody`]) and waits until it listens. Returns it with the
/// client's arguments: `client_args -p PORT ADDR` (the server's address);
/// or, if it never listened, what it printed (as a [`PairOutput`] without
/// client).
pub fn start_listening<'a>(
    start: &impl Fn(Node<'a>, &str, &[String]) -> Proc,
    server: Node<'a>,
    program: &str,
    server_args: &[String],
    client_args: &[String],
) -> Result<(Proc, Vec<String>), Box<PairOutput>> {
    let port = next_port().to_string();
    let mut sargs = server_args.to_vec();
    sargs.extend(args(&["-p", &port]));
    let mut cargs = client_args.to_vec();
    cargs.extend(args(&["-p", &port, &server.addr.to_string()]));
    let mut srv = start(server, program, &sargs);
    match wait_listening(
        server.ns,
        port.parse().unwrap(),
        &mut srv,
        Duration::from_secs(30),
    ) {
        Ok(()) => Ok((srv, cargs)),
        Err(why) => Err(Box::new(PairOutput {
            server: srv.finish(Duration::from_secs(1)),
            client: None,
            setup_error: Some(why),
        })),
    }
}

/// Ends a pair whose client was started: the client gets `timeout`, the
/// server as long again if the client succeeded, else 10 s (it ends soon
/// after its client's failure).
pub fn finish_pair(srv: Proc, client: Proc, timeout: Duration) -> PairOutput {
    let client = client.finish(timeout);
    let grace = if client.success() {
        timeout
    } else {
        Duration::from_secs(10)
    };
    PairOutput {
        server: srv.finish(grace),
        client: Some(client),
        setup_error: None,
    }
}

/// A whole pair ([`start_listening`], then the client on `client`, then
/// [`finish_pair`]); the two nodes may be the same one.
pub fn pair_on<'a>(
    start: impl Fn(Node<'a>, &str, &[String]) -> Proc,
    server: Node<'a>,
    client: Node<'a>,
    program: &str,
    server_args: &[String],
    client_args: &[String],
    timeout: Duration,
) -> PairOutput {
    match start_listening(&start, server, program, server_args, client_args) {
        Ok((srv, cargs)) => {
            let cl = start(client, program, &cargs);
            finish_pair(srv, cl, timeout)
        }
        Err(out) => *out,
    }
}
