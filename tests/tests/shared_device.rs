//! Several processes on one xroce device at once: each holds a QPN block
//! of the device (an abstract Unix name `@xroce/<ifindex>/block/<b>` of
//! its namespace) and receives on that block's UDP port; with AF_XDP the
//! first process owns the sockets and the XDP program moves the other
//! blocks' frames to their ports.
//!
//! - one_device_both_roles: ib_write_bw and ibv_rc_pingpong with server
//!   and client in one namespace on one device (their traffic stays on the
//!   host);
//! - eight_processes_one_killed: eight `xroce bench write -q 4` servers on
//!   one device, their eight clients on the other; one server is SIGKILLed
//!   mid-run: its client reports that the peer stopped answering, the seven
//!   other pairs verify their data, a new server takes the freed block at
//!   once and passes, and afterwards nothing is left (holds, UDP sockets,
//!   counters files, the XDP program the processes attached);
//! - unprivileged_user_udp: ib_write_bw as nobody over the UDP backend,
//!   across the link and, at the same time, a second pair on one device.
//!
//! Tests take turns ([`serial`]): eight busy pairs are enough for the
//! machine.

use std::time::Duration;

use xroce_report::BenchReport;
use xroce_tests::{
    per_backend,
    programs::{
        args, check_bw_table, next_port, serial, wait_listening, Backend, Cases, Finished, Node,
        PairOutput, Proc, Topology,
    },
    require_root,
    shared::{
        block_names, block_udp_ports, finish_pair, pair_on, start_as_nobody, start_listening,
        start_xroce, stats_file, uids, wait_blocks, xroce_unix_names, NOBODY,
    },
    workspace_bin,
};

/// One program run: a minute is plenty.
const RUN: Duration = Duration::from_secs(60);

per_backend!(one_device_both_roles, eight_processes_one_killed);

/// Fails with the evidence unless a perftest bandwidth pair succeeded with
/// a table whose every row ran `iters` iterations (any number if `None`).
fn bw_pair_ok(out: &PairOutput, iters: Option<u64>) -> Result<String, String> {
    let client = out.check()?;
    let summary = check_bw_table(client, Some(1))?;
    if let Some(n) = iters {
        let rows = xroce_tests::programs::perftest_rows(&client.stdout);
        if rows.iter().any(|r| r.iters != n) {
            return Err(format!(
                "rows {rows:?}, expected {n} iterations\n{}",
                client.describe()
            ));
        }
    }
    Ok(summary)
}

/// Waits until process `pid`'s engine on `iface` has published at least
/// `packets` received frames (`rx_frames`, every half second).
fn wait_receiving(iface: &str, pid: u32, packets: u64, timeout: Duration) -> Result<(), String> {
    let until = std::time::Instant::now() + timeout;
    loop {
        let received = xroce::stats_export::read_published(iface)
            .into_iter()
            .find(|p| p.pid == pid)
            .and_then(|p| p.fields.into_iter().find(|(k, _)| k == "rx_frames"))
            .map_or(0, |(_, v)| v);
        if received >= packets {
            return Ok(());
        }
        if std::time::Instant::now() > until {
            return Err(format!(
                "process {pid} received {received} packets on {iface} in {timeout:?}, \
                 expected {packets}: its client never started moving data"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// No hold and no block's UDP socket left in the namespace.
fn nothing_held(node: Node<'_>) -> Result<(), String> {
    let names = xroce_unix_names(node.ns);
    let ports = block_udp_ports(node.ns);
    if !names.is_empty() || !ports.is_empty() {
        return Err(format!(
            "{}: left behind: unix names {names:?}, UDP ports {ports:?}",
            node.ns.name
        ));
    }
    Ok(())
}

fn one_device_both_roles(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let node = t.server();
    let start = |n: Node<'_>, p: &str, a: &[String]| t.start(n, p, a);
    let mut c = Cases::new(&format!("one_device_both_roles/{}", b.as_str()));
    c.case("ib_write_bw -n 300, both sides on one device", || {
        let a = args(&["-d", &node.device(), "-x", "1", "-F", "-n", "300"]);
        let out = pair_on(start, node, node, "ib_write_bw", &a, &a, RUN);
        bw_pair_ok(&out, Some(300))
    });
    c.case("ibv_rc_pingpong, both sides on one device", || {
        let a = args(&[
            "-d",
            &node.device(),
            "-g",
            "1",
            "-s",
            "4096",
            "-n",
            "200",
            "-c",
        ]);
        let out = pair_on(start, node, node, "ibv_rc_pingpong", &a, &a, RUN);
        out.check_pingpong()
    });
    c.case("nothing held afterwards", || {
        nothing_held(node)?;
        Ok(String::new())
    });
    c.finish();
}

/// Pairs in eight_processes_one_killed.
const PAIRS: usize = 8;
/// The server that is killed (the 4th started: neither the AF_XDP owner
/// nor the one that attached XDP).
const KILLED: usize = 3;
/// Seconds each client runs; the kill comes 2 s in.
const SECONDS: &str = "6";

/// A successful client's JSON report with its data verified, and its
/// server's "data verified".
fn bench_ok(client: &Finished, server: &Finished) -> Result<String, String> {
    if !client.success() {
        return Err(format!(
            "client:\n{}\nserver:\n{}",
            client.describe(),
            server.describe()
        ));
    }
    let report: BenchReport = serde_json::from_str(client.stdout.trim())
        .map_err(|e| format!("client JSON: {e}\n{}", client.describe()))?;
    if report.verified != Some(true) || report.iters == 0 || report.qps != 4 {
        return Err(format!("report {report:?}\n{}", client.describe()));
    }
    if !server.success() || !server.stderr.contains("data verified") {
        return Err(format!("server:\n{}", server.describe()));
    }
    Ok(format!(
        "{} messages, {:.2} Gbit/s, {}",
        report.iters, report.gbps, report.backend
    ))
}

fn eight_processes_one_killed(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let (srv_node, cl_node) = (t.server(), t.client());
    // `xroce bench write -q 4` on `node` plus `extra`.
    let bench = |node: Node<'_>, extra: &[&str]| {
        let mut a = args(&["bench", "write", "--backend", b.as_str(), "-q", "4"]);
        a.extend(args(&["-d", node.iface]));
        a.extend(args(extra));
        start_xroce(&t, node, &a)
    };
    // A server listening, its hold taken: `holds` in the namespace then.
    let server = |holds: usize| -> (Proc, String) {
        let port = next_port();
        let listen = format!("{}:{port}", srv_node.addr);
        let mut s = bench(srv_node, &["--listen", &listen]);
        if let Err(e) = wait_listening(srv_node.ns, port, &mut s, RUN) {
            panic!("{e}\n{}", s.finish(Duration::ZERO).describe());
        }
        // It opens the device right after listen().
        wait_blocks(srv_node.ns, holds, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}"));
        (s, listen)
    };
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..PAIRS {
        let (s, a) = server(i + 1);
        servers.push(Some(s));
        addrs.push(a);
    }
    let held = block_names(srv_node.ns);
    let clients: Vec<Proc> = addrs
        .iter()
        .map(|a| bench(cl_node, &["-D", SECONDS, "--json", "--connect", a]))
        .collect();
    wait_blocks(cl_node.ns, PAIRS, RUN).unwrap_or_else(|e| panic!("{e}"));
    // Mid-run means the victim's client is moving data: wait until the
    // victim's engine has received some (its published counters), not a
    // fixed time, which a busy host can spend on setting up.
    let victim_pid = servers[KILLED].as_ref().unwrap().pid();
    wait_receiving(srv_node.iface, victim_pid, 100, RUN)
        .unwrap_or_else(|e| panic!("{e}\n{}", servers[KILLED].as_ref().unwrap().stderr_so_far()));
    // Whether a process attached XDP for itself on each device (the UDP
    // backend's blocks >= 1 need it), to be detached by the last one.
    // (Asked inside each node's namespace: the program is found through its
    // interface.)
    let process_attached = [srv_node, cl_node].map(|n| {
        let iface = n.iface.to_string();
        xroce_tests::in_netns(&n.ns.name, move || xroce::xdp::is_process_attached(&iface))
    });

    // The kill, mid-run.
    let mut victim = servers[KILLED].take().unwrap();
    let victim_stats = stats_file(srv_node.iface, victim_pid);
    assert!(
        victim_stats.exists(),
        "{} missing before the kill: is the victim running?\n{}",
        victim_stats.display(),
        victim.stderr_so_far()
    );
    victim.signal(libc::SIGKILL);
    let victim = victim.finish(Duration::from_secs(5));
    assert_eq!(
        victim
            .status
            .and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
        Some(libc::SIGKILL),
        "the victim did not die of SIGKILL\n{}",
        victim.describe()
    );
    // The kernel frees the victim's name as the process ends.
    let after = wait_blocks(srv_node.ns, PAIRS - 1, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("after the kill: {e}"));
    let freed: Vec<&String> = held.iter().filter(|n| !after.contains(n)).collect();
    assert_eq!(freed.len(), 1, "held {held:?}, after the kill {after:?}");
    let freed = freed[0].clone();

    // A new server takes the freed block while the others still run.
    let (reclaimer, reclaim_addr) = server(PAIRS);
    let now = block_names(srv_node.ns);
    let re_client = bench(
        cl_node,
        &["-n", "500", "--json", "--connect", &reclaim_addr],
    );

    let mut c = Cases::new(&format!("eight_processes_one_killed/{}", b.as_str()));
    let mut pids = vec![victim_pid, reclaimer.pid(), re_client.pid()];
    let mut finished = Vec::new();
    for (i, (client, server)) in clients.into_iter().zip(servers).enumerate() {
        pids.push(client.pid());
        let client = client.finish(RUN);
        let server = server.map(|s| {
            pids.push(s.pid());
            s.finish(Duration::from_secs(10))
        });
        finished.push((i, client, server));
    }
    let re_client = re_client.finish(RUN);
    let reclaimer = reclaimer.finish(Duration::from_secs(10));
    for (i, client, server) in &finished {
        match server {
            Some(server) => c.case(&format!("pair {i}: data verified"), || {
                bench_ok(client, server)
            }),
            None => c.case(&format!("pair {i}: server killed, client fails"), || {
                let want = "completed with RetryExcErr: the peer stopped answering";
                if client.success() || !client.stderr.contains(want) {
                    return Err(format!("expected {want:?}\n{}", client.describe()));
                }
                Ok(client
                    .stderr
                    .lines()
                    .find(|l| l.contains(want))
                    .unwrap_or_default()
                    .to_string())
            }),
        }
    }
    c.case("a new server takes the freed block", || {
        if !now.contains(&freed) {
            return Err(format!("freed {freed}, holds now {now:?}"));
        }
        bench_ok(&re_client, &reclaimer).map(|s| format!("{freed}: {s}"))
    });
    c.case("nothing left behind", || {
        for node in [srv_node, cl_node] {
            nothing_held(node)?;
        }
        let stale: Vec<String> = pids
            .iter()
            .flat_map(|&p| [stats_file(srv_node.iface, p), stats_file(cl_node.iface, p)])
            .filter(|f| f.exists())
            .map(|f| f.display().to_string())
            .collect();
        if !stale.is_empty() {
            return Err(format!("counters files of ended processes: {stale:?}"));
        }
        // `xroce bench` attaches XDP for itself with either backend (for
        // AF_XDP, or for the UDP blocks >= 1), and the last process of each
        // device detaches it.
        if process_attached != [true, true] {
            return Err(format!(
                "no process-attached XDP during the run (server's, client's device): {process_attached:?}"
            ));
        }
        for node in [srv_node, cl_node] {
            let iface = node.iface.to_string();
            let left = xroce_tests::in_netns(&node.ns.name, move || xroce::xdp::query(&iface));
            if let Ok(Some(a)) = left {
                return Err(format!(
                    "XDP program {} left on {} after the last process",
                    a.prog_id, node.iface
                ));
            }
        }
        Ok(format!("killed pid {victim_pid}: no counters file"))
    });
    c.case("a pair afterwards", || {
        let (s, a) = server(1);
        let cl = bench(cl_node, &["-n", "500", "--json", "--connect", &a]);
        let cl = cl.finish(RUN);
        bench_ok(&cl, &s.finish(Duration::from_secs(10)))
    });
    c.finish();
}

#[test]
fn unprivileged_user_udp() {
    require_root();
    let _turn = serial();
    let t = Topology::direct(Backend::Udp, 1500);
    // ns A: a server of the link and a whole pair; ns B: the link's client.
    let (a, b) = (t.server(), t.client());
    // `xroce run` makes target/debug/lib on its first use, which nobody
    // cannot: one run as root first.
    let f = t.run(a, "ibv_devices", &[], RUN);
    f.check()
        .unwrap_or_else(|e| panic!("ibv_devices as root: {e}"));
    if std::env::var_os("XROCE_LIB_DIR").is_none() {
        let lib = workspace_bin("lib").join("libibverbs.so.1");
        assert!(lib.exists(), "{} missing after a run", lib.display());
    }
    let start = |n: Node<'_>, p: &str, a: &[String]| start_as_nobody(&t, n, p, a);
    // -D 3: long enough for both pairs to overlap.
    let bw = |n: Node<'_>| args(&["-d", &n.device(), "-x", "1", "-F", "-D", "3"]);
    let listening = |server: Node<'_>, client: Node<'_>| {
        start_listening(&start, server, "ib_write_bw", &bw(server), &bw(client))
            .unwrap_or_else(|out| panic!("{}", out.check().err().unwrap_or_default()))
    };
    // The link's server first: it takes block 0 (UDP 4791), where the
    // peer's frames arrive (nobody cannot attach the XDP program that
    // would move them to another block's port).
    let (s1, c1_args) = listening(a, b);
    wait_blocks(a.ns, 1, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}"));
    let (s2, c2_args) = listening(a, a);
    wait_blocks(a.ns, 2, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}"));
    let c1 = start(b, "ib_write_bw", &c1_args);
    let c2 = start(a, "ib_write_bw", &c2_args);
    // Three processes of nobody on A's device at once.
    let shared = wait_blocks(a.ns, 3, RUN);
    let running_as: Vec<(String, Option<(u32, u32)>)> = [&s1, &s2, &c1, &c2]
        .iter()
        .map(|p| (p.what.clone(), uids(p.pid())))
        .collect();
    let link = finish_pair(s1, c1, RUN);
    let local = finish_pair(s2, c2, RUN);

    let mut c = Cases::new("unprivileged_user_udp");
    c.case("four processes run as nobody", || {
        for (what, ids) in &running_as {
            if *ids != Some((NOBODY, NOBODY)) {
                return Err(format!("{what}: uid (real, effective) {ids:?}"));
            }
        }
        Ok(String::new())
    });
    c.case("three processes on A's device at once", || {
        shared.clone().map(|names| format!("{names:?}"))
    });
    c.case("ib_write_bw across the link", || bw_pair_ok(&link, None));
    c.case("ib_write_bw pair on A's device", || {
        bw_pair_ok(&local, None)
    });
    c.case("nothing held afterwards", || {
        nothing_held(a)?;
        nothing_held(b)?;
        Ok(String::new())
    });
    c.finish();
}
