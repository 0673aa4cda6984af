//! Monitoring as xdp-tools users expect it, end to end:
//!
//! - stats_interval_rates_on_the_right_rx_queue: `xroce stats --interval
//!   0.5 --json` (JSON lines) on the server side of a `xroce bench write
//!   -n N` pair (server on AF_XDP, client on UDP), where the client's
//!   namespace sends everything on TX queue 1 (XPS) of a two-queue veth:
//!   the rates show on RX queue 1 only, redirected to AF_XDP; every
//!   line's rates times its length add up to the totals' growth; the XDP
//!   program counted exactly the WRITE packets the client sent, and the
//!   queue's bytes are those packets' bytes plus the little TCP and ARP
//!   of the exchange.
//! - status_lists_attachment_and_processes: `xroce status` names the
//!   interface xroce is attached to with mode and program id, a running
//!   `xroce bench` server with its pid, command name and QPN block, and
//!   no process once it has exited; the client's own attachment on the
//!   other side (by a process, gone with it); a UDP-backend server on an
//!   interface without the program.
//!
//! Run under `flock /tmp/xroce-netns.lock` beside other namespace tests.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use xroce_report::{BenchReport, StatsInterval, StatsReport, StatusReport, XdpStatus};
use xroce_tests::{
    perf,
    programs::{self, Proc, TempDir},
    require_root, workspace_bin, AttachedXdp, Netns, VethPair,
};

/// Two namespaces joined by a veth pair with two RX and two TX queues on
/// each end; a's kernel sends every frame on its TX queue 1 (XPS), which
/// veth delivers on b's RX queue 1.
fn two_queue_pair() -> VethPair {
    let pair = VethPair::with_queues(1500, 2);
    let (a, if_a) = (&pair.a, &pair.if_a);
    // XPS lives in sysfs, which only `ip netns exec` shows for a's
    // interfaces (nsenter keeps the host's /sys).
    let xps = format!(
        "echo 0 > /sys/class/net/{if_a}/queues/tx-0/xps_cpus && \
         echo {} > /sys/class/net/{if_a}/queues/tx-1/xps_cpus",
        all_cpus_mask()
    );
    xroce_tests::run(Command::new("ip").args(["netns", "exec", &a.name, "sh", "-c", &xps]));
    pair
}

/// The cpumask of every CPU the kernel may run (sysfs's format: 32-bit
/// hex groups, most significant first, separated by commas).
fn all_cpus_mask() -> String {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
    let groups: Vec<String> = (0..n.div_ceil(32))
        .rev()
        .map(|g| {
            let bits = (n - g * 32).min(32);
            format!("{:08x}", (u64::MAX >> (64 - bits)) as u32)
        })
        .collect();
    groups.join(",")
}

/// `xroce ARGS` in `ns`; its stdout, which must be success.
fn xroce_out(ns: &Netns, args: &[&str]) -> String {
    let out = xroce_tests::run(ns.command(workspace_bin("xroce")).args(args));
    String::from_utf8(out.stdout).expect("UTF-8 stdout")
}

/// The JSON lines `xroce stats --interval --json` has written so far.
fn lines(text: &str) -> Vec<StatsInterval> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("stats line {l:?}: {e}")))
        .collect()
}

/// What the one process started in `dir` has written to stdout so far
/// (Proc names its files by a counter shared by the tests).
fn stdout_so_far(dir: &TempDir) -> String {
    let files = std::fs::read_dir(&dir.0).expect("read the monitor's directory");
    let out = files
        .flatten()
        .find(|f| f.path().extension().is_some_and(|e| e == "out"))
        .expect("the monitor's stdout file");
    std::fs::read_to_string(out.path()).unwrap_or_default()
}

/// A queue's totals in a line (zero when the line does not list it: it
/// has seen no frame yet).
fn queue(line: &StatsInterval, q: u32) -> (u64, u64, u64) {
    line.rx_queues
        .iter()
        .find(|r| r.queue == q)
        .map_or((0, 0, 0), |r| (r.frames, r.bytes, r.redirected))
}

/// Bytes on the wire of one RoCEv2 packet with `payload` bytes and
/// `ext` bytes of extension headers after the BTH: Ethernet 14, IPv4 20,
/// UDP 8, BTH 12, ICRC 4.
fn roce_frame_bytes(payload: u64, ext: u64) -> u64 {
    14 + 20 + 8 + 12 + ext + payload + 4
}

#[test]
fn stats_interval_rates_on_the_right_rx_queue() {
    require_root();
    let pair = two_queue_pair();
    let _attached = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    let dir = TempDir::new();

    // The totals before: one interval's line carries them.
    let before = xroce_out(
        &pair.b,
        &[
            "stats",
            "--iface",
            &pair.if_b,
            "--interval",
            "0.2",
            "--count",
            "1",
            "--json",
        ],
    );
    let before = lines(&before).pop().expect("one line with --count 1");

    let mut cmd = pair.b.command(workspace_bin("xroce"));
    cmd.args([
        "stats",
        "--iface",
        &pair.if_b,
        "--interval",
        "0.5",
        "--json",
    ]);
    let monitor = Proc::spawn(cmd, "xroce stats --interval 0.5".into(), &dir.0);
    // Its first line says it is sampling.
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines(&stdout_so_far(&dir)).is_empty() {
        assert!(Instant::now() < deadline, "no stats line within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }

    const ITERS: u64 = 2000;
    const SIZE: u64 = 65536;
    let report: BenchReport = perf::run_ok(
        &pair,
        "bench",
        &["write", "--backend", "afxdp"],
        &[
            "write",
            "--backend",
            "udp",
            "--size",
            "64KiB",
            "--iters",
            &ITERS.to_string(),
            // Go-back-N: the byte count below has a RETH on each message's
            // first packet only (selective repeat, agreed in band after
            // the first ACK, puts one in every packet).
            "--recovery",
            "gbn",
        ],
    );
    assert_eq!(report.verified, Some(true), "{report:?}");
    assert_eq!(report.iters, ITERS, "{report:?}");
    // Two more intervals: the last frames are in a line.
    std::thread::sleep(Duration::from_millis(1200));
    let out = monitor.finish(Duration::ZERO);
    let got = lines(&out.stdout);
    assert!(got.len() >= 3, "too few lines:\n{}", out.stdout);

    // What the client sent b: every message in MTU-sized WRITE packets
    // (RETH on the first), retransmissions included.
    let mtu = u64::from(report.mtu);
    let per_msg = SIZE.div_ceil(mtu);
    let writes = ITERS * per_msg + report.retransmits;
    let write_bytes = ITERS * (SIZE + per_msg * roce_frame_bytes(0, 0) + 16)
        + report.retransmits * roce_frame_bytes(mtu, 0);
    let last = got.last().unwrap();
    let grew = |name: &str| last.xdp[name] - before.xdp[name];
    assert_eq!(
        grew("op_write"),
        writes,
        "WRITE packets counted by XDP vs sent ({ITERS} x {per_msg} + {} retransmitted)",
        report.retransmits
    );
    assert_eq!(grew("redirected"), writes, "all to AF_XDP");

    // Every frame on RX queue 1; queue 0 sees none.
    for l in &got {
        assert_eq!(queue(l, 0), (0, 0, 0), "frames on RX queue 0: {l:?}");
    }
    let busy: Vec<_> = got
        .iter()
        .filter_map(|l| l.rx_queues.iter().find(|q| q.queue == 1))
        .filter(|q| q.rx_pps > 0.0)
        .collect();
    assert!(!busy.is_empty(), "no rate on RX queue 1:\n{}", out.stdout);
    let peak = busy.iter().map(|q| q.redirected_pps).fold(0.0, f64::max);
    assert!(peak > 1000.0, "peak redirected rate {peak} pps on queue 1");
    let (frames0, bytes0, redirected0) = queue(&before, 1);
    let (frames1, bytes1, redirected1) = queue(last, 1);
    assert_eq!(redirected1 - redirected0, writes, "queue 1 redirected");
    // Beside the WRITEs only the exchange's TCP and ARP reach b.
    let (other_frames, other_bytes) = (frames1 - frames0 - writes, bytes1 - bytes0 - write_bytes);
    assert!(
        other_frames < 200 && other_bytes < 40_000,
        "queue 1: {} frames / {} bytes beyond the {writes} WRITEs ({write_bytes} bytes)",
        frames1 - frames0,
        bytes1 - bytes0
    );

    // Rates times seconds give back the totals' growth, line by line.
    let mut prev = &got[0];
    let mut sum_write = prev.xdp_rates["op_write"] * prev.seconds;
    for l in &got[1..] {
        for (name, rate) in &l.xdp_rates {
            let d = (l.xdp[name] - prev.xdp[name]) as f64;
            assert!((rate * l.seconds - d).abs() < 0.01, "{name}: {l:?}");
        }
        let (f, b, _) = queue(l, 1);
        let (pf, pb, _) = queue(prev, 1);
        let q1 = l.rx_queues.iter().find(|q| q.queue == 1);
        let (pps, bps) = q1.map_or((0.0, 0.0), |q| (q.rx_pps, q.rx_bps));
        assert!((pps * l.seconds - (f - pf) as f64).abs() < 0.01, "{l:?}");
        assert!(
            (bps * l.seconds / 8.0 - (b - pb) as f64).abs() < 0.01,
            "{l:?}"
        );
        assert!((l.rx_pps - pps).abs() < 1e-9, "one busy queue: {l:?}");
        sum_write += l.xdp_rates["op_write"] * l.seconds;
        prev = l;
    }
    // The monitor's first sample came after `before`, with no traffic
    // in between: its lines account for every WRITE.
    assert!(
        (sum_write - writes as f64).abs() < 0.5,
        "sum of op_write rate x seconds {sum_write} vs {writes}"
    );
    eprintln!(
        "{} lines; {writes} WRITEs ({write_bytes} B) on queue 1, peak {peak:.0} pps; bench {:.2} Gbit/s",
        got.len(),
        report.gbps
    );
    // Without --interval the one JSON object of before.
    let once: StatsReport = serde_json::from_str(
        xroce_out(&pair.b, &["stats", "--iface", &pair.if_b, "--json"]).trim(),
    )
    .expect("stats --json is one StatsReport");
    assert_eq!(once.xdp["op_write"], last.xdp["op_write"]);
}

/// `xroce status --json` in `ns`.
fn status(ns: &Netns) -> StatusReport {
    let out = xroce_out(ns, &["status", "--json"]);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("status JSON {out:?}: {e}"))
}

/// The program id and mode (`ip -d -j link`: 1 native, 2 skb) `ip link`
/// shows for `iface` in `ns`.
/// The id, mode and name of the XDP program `iface` runs, as `ip link`
/// reports them.
fn ip_link_xdp(ns: &Netns, iface: &str) -> Option<(u32, &'static str, String)> {
    let out = ns.exec(&["ip", "-d", "-j", "link", "show", "dev", iface]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j link");
    let xdp = &v[0]["xdp"];
    let id = xdp["prog"]["id"].as_u64()? as u32;
    let mode = match xdp["mode"].as_u64()? {
        1 => "native",
        2 => "skb",
        _ => "other",
    };
    let name = xdp["prog"]["name"].as_str()?.to_string();
    Some((id, mode, name))
}

#[test]
fn status_lists_attachment_and_processes() {
    require_root();
    let pair = VethPair::new(1500);
    let dir = TempDir::new();
    // b: attached by an administrator in skb mode; a: nothing attached,
    // the client's AF_XDP engine attaches for itself.
    let _attached = AttachedXdp::new(&pair.b, &pair.if_b, "skb");
    let (prog_id, mode, name) = ip_link_xdp(&pair.b, &pair.if_b).expect("ip link shows XDP on b");
    assert_eq!(mode, "skb");
    // Whichever of xroce's programs the kernel took.
    let arrival_times = match name.as_str() {
        "xroce_xdp" => "metadata",
        "xroce_xdp_head" => "head",
        "xroce_xdp_plain" => "none",
        other => panic!("b runs {other}, not xroce's program"),
    };
    let idle = status(&pair.b);
    assert_eq!(idle.interfaces.len(), 1, "{idle:?}");
    let b = &idle.interfaces[0];
    assert_eq!(b.iface, pair.if_b);
    assert_eq!(
        b.xdp,
        Some(XdpStatus {
            prog_id,
            mode: "skb".into(),
            dispatcher: None,
            by_process: false,
            arrival_times: arrival_times.into(),
        })
    );
    assert!(b.processes.is_empty(), "{idle:?}");
    assert!(status(&pair.a).interfaces.is_empty(), "a runs nothing yet");

    let port = programs::next_port();
    let xroce = workspace_bin("xroce");
    let mut cmd = pair.b.command(&xroce);
    let listen = format!("{}:{port}", pair.addr_b);
    cmd.args([
        "bench",
        "write",
        "--backend",
        "afxdp",
        "--iface",
        &pair.if_b,
    ]);
    cmd.args(["--listen", &listen]);
    let mut server = Proc::spawn(cmd, "xroce bench server".into(), &dir.0);
    programs::wait_listening(&pair.b, port, &mut server, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", server.stderr_so_far()));
    let mut cmd = pair.a.command(&xroce);
    cmd.args([
        "bench",
        "write",
        "--backend",
        "afxdp",
        "--iface",
        &pair.if_a,
    ]);
    cmd.args(["--connect", &listen, "--duration", "5", "--json"]);
    let client = Proc::spawn(cmd, "xroce bench client".into(), &dir.0);

    // Until the engines have published their QPs (every half second).
    let deadline = Instant::now() + Duration::from_secs(10);
    let (on_b, on_a) = loop {
        let (sb, sa) = (status(&pair.b), status(&pair.a));
        let has_qps = |s: &StatusReport| {
            s.interfaces.iter().any(|i| {
                i.processes
                    .iter()
                    .any(|p| p.qpns.as_ref().is_some_and(|q| !q.is_empty()))
            })
        };
        if has_qps(&sb) && has_qps(&sa) {
            break (sb, sa);
        }
        assert!(
            Instant::now() < deadline,
            "no QPs listed within 10 s:\nb: {sb:?}\na: {sa:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let b = &on_b.interfaces[0];
    assert_eq!(
        (b.iface.as_str(), b.xdp.as_ref().map(|x| x.prog_id)),
        (pair.if_b.as_str(), Some(prog_id))
    );
    assert_eq!(b.processes.len(), 1, "{on_b:?}");
    let p = &b.processes[0];
    assert_eq!(p.pid, server.pid(), "{on_b:?}");
    assert_eq!(p.command, "xroce");
    assert_eq!((p.blocks.as_slice(), p.afxdp), (&[0][..], true), "{p:?}");
    assert_eq!(p.udp_ports, [4791]);
    let qpns = p.qpns.clone().unwrap();
    assert!(
        qpns.iter().all(|q| qpn_block_of(*q) == 0),
        "QPNs of block 0: {qpns:x?}"
    );
    // a: the client attached the program for itself, natively.
    assert_eq!(on_a.interfaces.len(), 1, "{on_a:?}");
    let a = &on_a.interfaces[0];
    let (a_id, a_mode, _) = ip_link_xdp(&pair.a, &pair.if_a).expect("XDP on a");
    let x = a.xdp.as_ref().expect("program on a");
    assert_eq!(
        (x.prog_id, x.mode.as_str(), x.by_process),
        (a_id, a_mode, true),
        "{a:?}"
    );
    assert_eq!(a.processes.len(), 1);
    assert_eq!(a.processes[0].pid, client.pid());

    // `ip netns exec` (a private /sys) sees the same program and process.
    let out = xroce_tests::run(
        Command::new("ip")
            .args(["netns", "exec", &pair.b.name])
            .args([xroce.to_str().unwrap(), "status", "--json"]),
    );
    let via_exec: StatusReport = serde_json::from_slice(&out.stdout).expect("status JSON");
    let seen = |s: &StatusReport| -> Vec<_> {
        s.interfaces
            .iter()
            .map(|i| {
                let pids: Vec<_> = i
                    .processes
                    .iter()
                    .map(|p| (p.pid, p.blocks.clone()))
                    .collect();
                (i.iface.clone(), i.xdp.clone(), pids)
            })
            .collect()
    };
    assert_eq!(seen(&via_exec), seen(&on_b), "ip netns exec vs nsenter");

    // The human form names the same.
    let text = xroce_out(&pair.b, &["status", "--iface", &pair.if_b]);
    for needle in [
        format!("program id {prog_id}, skb mode"),
        format!("pid {}", server.pid()),
        "block 0 (UDP 4791), AF_XDP owner".into(),
    ] {
        assert!(text.contains(&needle), "{needle:?} not in:\n{text}");
    }

    let client = client.finish(Duration::from_secs(30));
    let server = server.finish(Duration::from_secs(10));
    assert!(client.success(), "{}", client.describe());
    assert!(server.success(), "{}", server.describe());
    let after = status(&pair.b);
    assert_eq!(after.interfaces.len(), 1, "{after:?}");
    assert!(after.interfaces[0].processes.is_empty(), "{after:?}");
    assert_eq!(
        after.interfaces[0].xdp.as_ref().map(|x| x.prog_id),
        Some(prog_id)
    );
    // The client's own attachment left with it.
    let after_a = status(&pair.a);
    assert!(after_a.interfaces.is_empty(), "{after_a:?}");

    // A UDP-backend server on a, which runs no XDP program now: the
    // interface is listed for its process, without a program.
    let port = programs::next_port();
    let listen_a = format!("{}:{port}", pair.addr_a);
    let mut cmd = pair.a.command(&xroce);
    cmd.args(["bench", "write", "--backend", "udp", "--iface", &pair.if_a]);
    cmd.args(["--listen", &listen_a]);
    let mut udp_server = Proc::spawn(cmd, "xroce bench server (udp)".into(), &dir.0);
    programs::wait_listening(&pair.a, port, &mut udp_server, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", udp_server.stderr_so_far()));
    let on_udp = status(&pair.a);
    assert_eq!(on_udp.interfaces.len(), 1, "{on_udp:?}");
    let a = &on_udp.interfaces[0];
    assert_eq!(
        (a.iface.as_str(), &a.xdp),
        (pair.if_a.as_str(), &None),
        "{a:?}"
    );
    let u = &a.processes[..];
    assert_eq!(u.len(), 1, "{a:?}");
    assert_eq!(
        (
            u[0].pid,
            u[0].blocks.as_slice(),
            u[0].afxdp,
            u[0].udp_ports.as_slice()
        ),
        (udp_server.pid(), &[0][..], false, &[4791][..]),
        "{a:?}"
    );
    udp_server.signal(libc::SIGTERM);
    let _ = udp_server.finish(Duration::from_secs(10));
    let gone = status(&pair.a);
    assert!(gone.interfaces.is_empty(), "{gone:?}");
    eprintln!("server pid {} QPs {qpns:x?}; program {prog_id} on b", p.pid);
}

fn qpn_block_of(qpn: u32) -> u32 {
    xroce_common::qpn_block::of_qpn(qpn)
}

/// What an engine publishes under /run/xroce (its counters and QPNs) is
/// its owner's alone: folders 0700, files 0600, and a second, unprivileged
/// local user can neither list the folder nor read the file.
#[test]
fn published_counters_are_private_to_root() {
    require_root();
    let pair = VethPair::new(1500);
    let dir = TempDir::new();
    let port = programs::next_port();
    let listen = format!("{}:{port}", pair.addr_b);
    let mut cmd = pair.b.command(workspace_bin("xroce"));
    cmd.args(["bench", "write", "--backend", "udp", "--iface", &pair.if_b]);
    cmd.args(["--listen", &listen]);
    let mut server = Proc::spawn(cmd, "xroce bench server".into(), &dir.0);
    programs::wait_listening(&pair.b, port, &mut server, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", server.stderr_so_far()));
    let folder = xroce::stats_export::export_dir(&pair.if_b);
    let file = folder.join(format!("engine.{}", server.pid()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !file.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared\n{}",
            file.display(),
            server.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(folder.parent().unwrap()), 0o700, "/run/xroce");
    assert_eq!(mode(&folder), 0o700, "{}", folder.display());
    assert_eq!(mode(&file), 0o600, "{}", file.display());
    for argv in [
        vec!["ls", "/run/xroce"],
        vec!["cat", file.to_str().unwrap()],
    ] {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(&argv)
            .output()
            .expect("setpriv (util-linux) is missing");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("Permission denied"),
            "{argv:?} as nobody: {}{err}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
