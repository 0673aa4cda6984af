//! Per-QP state and metrics of a known run, end to end:
//!
//! - qps_and_metrics_of_a_known_write_run: an `xroce bench write` pair of
//!   N messages over AF_XDP between two namespaces, both sides holding
//!   their QPs after the run (`--hold`). `xroce status --qps --json` on
//!   each side lists the one RC QP in RTS with the other's QPN and GID;
//!   the client's next send PSN is its initial PSN plus the run's packets,
//!   all acknowledged, and the server expects exactly that PSN; packets,
//!   retransmits and NAKs agree with the bench's report. Then `xroce
//!   exporter` in the server's namespace is scraped over HTTP there, its
//!   text read by a Prometheus text-format parser (prometheus-parse): the
//!   QP's metrics equal what status showed, the engine's counters what the
//!   engine published, the XDP counters what `xroce stats` reads.
//!
//! Run under `flock /tmp/xroce-netns.lock` beside other namespace tests.

use std::{
    fs::File,
    io::{Read, Write},
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant},
};

use xroce_report::{BenchReport, QpStatus, StatsReport, StatusReport};
use xroce_tests::{
    programs::{self, Proc, TempDir},
    require_root, workspace_bin, AttachedXdp, Netns, VethPair,
};

/// A `--hold` bench process: stdin a pipe we close to let it go, output
/// in files; killed by PID if the test ends first.
struct Held {
    child: Child,
    stdin: Option<ChildStdin>,
    out: PathBuf,
    err: PathBuf,
}

impl Held {
    fn spawn(mut cmd: Command, dir: &TempDir, name: &str) -> Self {
        let out = dir.0.join(format!("{name}.out"));
        let err = dir.0.join(format!("{name}.err"));
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            out,
            err,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Waits until `done(stdout, stderr)`; fails if the process exits or
    /// 60 s pass first.
    fn wait_for(&mut self, what: &str, done: impl Fn(&str, &str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(&self.stdout(), &self.stderr()) {
            let exited = matches!(self.child.try_wait(), Ok(Some(_)));
            assert!(
                !exited && Instant::now() < deadline,
                "{what}: {}\nstdout: {}\nstderr: {}",
                if exited {
                    "exited first"
                } else {
                    "not within 60 s"
                },
                self.stdout(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Closes its stdin (the end of --hold) and waits for a clean exit.
    fn release(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => {
                    assert!(s.success(), "{s}: {}", self.stderr());
                    return;
                }
                _ if Instant::now() > deadline => panic!("no exit 20 s after its stdin closed"),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn xroce_out(ns: &Netns, args: &[&str]) -> String {
    let out = xroce_tests::run(ns.command(workspace_bin("xroce")).args(args));
    String::from_utf8(out.stdout).expect("UTF-8 stdout")
}

/// The QPs `xroce status --qps --json` in `ns` shows for process `pid`.
fn qps_of(ns: &Netns, pid: u32) -> Option<Vec<QpStatus>> {
    let out = xroce_out(ns, &["status", "--qps", "--json"]);
    let s: StatusReport =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("status JSON {out:?}: {e}"));
    s.interfaces
        .into_iter()
        .flat_map(|i| i.processes)
        .find(|p| p.pid == pid)?
        .qps
}

const PSN_MASK: u32 = 0xff_ffff;

/// `GET /metrics` from `addr` inside namespace `ns`: the body.
fn scrape(ns: &Netns, addr: String) -> String {
    let t = xroce_netns::spawn_in(&ns.name, move || {
        let mut s = std::net::TcpStream::connect(&addr).expect("connect to the exporter");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("read the answer");
        answer
    })
    .expect("enter the namespace");
    let answer = t.join().expect("scrape thread");
    let (head, body) = answer.split_once("\r\n\r\n").expect("HTTP head and body");
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    body.to_string()
}

/// The one sample of `name` whose labels include `labels`.
fn sample(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, String)]) -> f64 {
    let found: Vec<_> = s
        .samples
        .iter()
        .filter(|x| {
            x.metric == name
                && labels
                    .iter()
                    .all(|(k, v)| x.labels.get(k) == Some(v.as_str()))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    match found[0].value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn qps_and_metrics_of_a_known_write_run() {
    require_root();
    let pair = VethPair::new(1500);
    let dir = TempDir::new();
    let _attached = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    const ITERS: u64 = 300;
    const SIZE: u64 = 65536;
    const MTU: u64 = 1024;
    // WRITEs of 64 KiB at a 1024-byte MTU: 64 PSNs each.
    let packets = ITERS * SIZE.div_ceil(MTU);

    let xroce = workspace_bin("xroce");
    let port = programs::next_port();
    let listen = format!("{}:{port}", pair.addr_b);
    let mut cmd = pair.b.command(&xroce);
    cmd.args([
        "bench",
        "write",
        "--backend",
        "afxdp",
        "--iface",
        &pair.if_b,
    ]);
    cmd.args(["--listen", &listen, "--hold"]);
    let mut server = Held::spawn(cmd, &dir, "server");
    server.wait_for("the server listening", |_, err| err.contains("waiting for"));
    let mut cmd = pair.a.command(&xroce);
    cmd.args([
        "bench",
        "write",
        "--backend",
        "afxdp",
        "--iface",
        &pair.if_a,
    ]);
    cmd.args(["--connect", &listen, "--size", "64KiB", "--mtu", "1024"]);
    cmd.args(["--iters", &ITERS.to_string(), "--json", "--hold"]);
    let mut client = Held::spawn(cmd, &dir, "client");

    client.wait_for("the client's report", |out, err| {
        !out.trim().is_empty() && err.contains("holding the QPs")
    });
    server.wait_for("the server holding", |_, err| {
        err.contains("holding the QPs")
    });
    let report: BenchReport = serde_json::from_str(client.stdout().trim()).expect("bench JSON");
    assert_eq!(
        (report.verified, report.iters),
        (Some(true), ITERS),
        "{report:?}"
    );
    assert_eq!(u64::from(report.mtu), MTU);

    // The engines publish every half second: until both show the run's end.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (c, s) = loop {
        let c = qps_of(&pair.a, client.pid());
        let s = qps_of(&pair.b, server.pid());
        if let (Some([c]), Some([s])) = (c.as_deref(), s.as_deref()) {
            let sent = (c.sq_psn + packets as u32) & PSN_MASK;
            if c.next_send_psn == sent
                && c.oldest_unacked_psn == sent
                && s.expected_recv_psn == sent
            {
                break (c.clone(), s.clone());
            }
        }
        assert!(
            Instant::now() < deadline,
            "the QPs never showed the run's {packets} packets sent and acknowledged:\nclient {c:#?}\nserver {s:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("client QP {c:?}\nserver QP {s:?}");
    for q in [&c, &s] {
        assert_eq!(
            (q.qp_type.as_str(), q.state.as_str()),
            ("RC", "RTS"),
            "{q:?}"
        );
        // Selective repeat agreed in band (neither side asked for it):
        // on in the direction the data went.
        assert_eq!(
            (q.mtu, q.cc.as_str(), q.selective_repeat),
            (1024, "none", true),
            "{q:?}"
        );
        assert_eq!((q.inflight_pkts, q.send_queue), (0, 0), "{q:?}");
        assert_eq!((q.rnr_naks_received, q.seq_naks_received), (0, 0), "{q:?}");
    }
    // The client's requester and the server's responder switched; the
    // server sent no request, so the other direction stays go-back-N.
    assert_eq!((c.sr_requester, c.sr_responder), (true, false), "{c:?}");
    assert_eq!((s.sr_requester, s.sr_responder), (false, true), "{s:?}");
    assert_eq!(c.peer_qpn, Some(s.qpn));
    assert_eq!(s.peer_qpn, Some(c.qpn));
    assert_eq!(c.peer_gid, Some(format!("::ffff:{}", pair.addr_b)));
    assert_eq!(s.peer_gid, Some(format!("::ffff:{}", pair.addr_a)));
    // The server's receive PSNs started where the client's send PSNs did.
    assert_eq!(s.rq_psn, c.sq_psn);
    // Every packet sent once, plus what the bench counted as retransmitted
    // (nothing on this lossless link unless a timer fired early).
    assert_eq!(c.retransmitted, report.retransmits, "{c:?}");
    assert_eq!(c.tx_packets, packets + report.retransmits, "{c:?}");
    if report.retransmits == 0 {
        assert_eq!((c.timeouts, s.rx_packets), (0, packets), "{c:?}\n{s:?}");
    }
    // The server sent no data: its send PSN never moved.
    assert_eq!((s.next_send_psn, s.tx_packets), (s.sq_psn, 0), "{s:?}");
    assert!(c.last_rtt_ns.is_some() && c.srtt_ns.is_some(), "{c:?}");

    let client_text = xroce_out(&pair.a, &["status", "--qps", "--iface", &pair.if_a]);
    eprintln!("{client_text}");
    assert!(
        client_text.contains(&format!("::ffff:{}", pair.addr_b)),
        "{client_text}"
    );
    // The table names the same QP.
    let text = xroce_out(&pair.b, &["status", "--qps", "--iface", &pair.if_b]);
    eprintln!("{text}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{:#08x}", s.qpn)))
        .unwrap_or_else(|| panic!("no row of QP {:#x}:\n{text}", s.qpn));
    for cell in [
        "RC",
        "RTS",
        "resp",
        &format!("::ffff:{}", pair.addr_a),
        &format!("{:#08x}", c.qpn),
    ] {
        assert!(
            row.split_whitespace().any(|w| w == cell),
            "{cell} not in {row}"
        );
    }

    // --watch: a report per refresh, each showing the held QP.
    let mut cmd = pair.b.command(&xroce);
    cmd.args(["status", "--qps", "--json", "--watch", "0.2"]);
    let watch = Proc::spawn(cmd, "xroce status --watch".into(), &dir.0);
    let watch_dir = dir.0.clone();
    let reports = move || -> Vec<StatusReport> {
        let out = std::fs::read_dir(&watch_dir)
            .unwrap()
            .flatten()
            .filter(|f| f.path().extension().is_some_and(|e| e == "out"))
            .map(|f| std::fs::read_to_string(f.path()).unwrap_or_default())
            .find(|t| t.starts_with("{\"interfaces\""))
            .unwrap_or_default();
        // Whole lines only: the last may still be being written.
        out.lines()
            .filter(|_| out.ends_with('\n'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while reports().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "fewer than 3 --watch reports in 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let watch = watch.finish(Duration::ZERO);
    for r in reports() {
        let p = r
            .interfaces
            .iter()
            .flat_map(|i| &i.processes)
            .find(|p| p.pid == server.pid());
        let qps = p
            .and_then(|p| p.qps.clone())
            .expect("the server's QPs in each report");
        assert_eq!(
            qps[0].expected_recv_psn, s.expected_recv_psn,
            "{}",
            watch.stderr
        );
    }

    // The backend's own counters are published beside the engine's (its
    // I/O thread hands them over every half second): it received every
    // data packet, and the kernel dropped nothing on this link.
    let io_deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let published = xroce::stats_export::read_published(&pair.if_b);
        let field = |name: &str| {
            published
                .iter()
                .find(|p| p.pid == server.pid())
                .and_then(|p| p.fields.iter().find(|(n, _)| n == name))
                .map(|f| f.1)
        };
        let (io_rx, rx) = (field("io_rx_frames"), field("rx_frames"));
        if let (Some(io_rx), Some(rx)) = (io_rx, rx) {
            if io_rx >= packets && rx >= packets {
                assert_eq!(field("io_rx_ring_full"), Some(0));
                // The frames came with the XDP program's arrival time
                // (all of them: every one was redirected to AF_XDP).
                let stamped = field("io_rx_timestamped").unwrap_or(0);
                let stamp = xroce_tests::xdp_arrival_stamp(&pair.b.name, &pair.if_b);
                if stamp == xroce::xdp::ArrivalStamp::None {
                    assert_eq!(stamped, 0, "xroce_xdp_plain stamps nothing");
                } else {
                    assert!(
                        stamped > 0 && stamped * 100 >= io_rx * 99,
                        "{stamped} of {io_rx} frames timestamped ({stamp:?})"
                    );
                }
                break;
            }
        }
        assert!(
            Instant::now() < io_deadline,
            "the backend's rx_frames ({io_rx:?}) never reached the engine's ({rx:?})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The exporter, in the server's namespace, scraped there.
    let mport = programs::next_port();
    let mut cmd = pair.b.command(&xroce);
    cmd.args(["exporter", "--listen", &format!("127.0.0.1:{mport}")]);
    let mut exporter = Proc::spawn(cmd, "xroce exporter".into(), &dir.0);
    programs::wait_listening(&pair.b, mport, &mut exporter, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", exporter.stderr_so_far()));
    let body = scrape(&pair.b, format!("127.0.0.1:{mport}"));
    eprintln!("{body}");
    let scraped = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("a Prometheus exposition");
    let iface = ("iface", pair.if_b.clone());
    let pid = ("pid", server.pid().to_string());
    let qp = [iface.clone(), pid.clone(), ("qpn", s.qpn.to_string())];
    let info: Vec<_> = qp
        .iter()
        .cloned()
        .chain([
            ("type", "RC".to_string()),
            ("state", "RTS".to_string()),
            ("peer_qpn", c.qpn.to_string()),
            ("peer_gid", format!("::ffff:{}", pair.addr_a)),
            ("selective_repeat", "true".to_string()),
        ])
        .collect();
    assert_eq!(sample(&scraped, "xroce_qp_info", &info), 1.0);
    for (name, want) in [
        ("xroce_qp_expected_recv_psn", s.expected_recv_psn as u64),
        ("xroce_qp_initial_recv_psn", s.rq_psn as u64),
        ("xroce_qp_next_send_psn", s.next_send_psn as u64),
        ("xroce_qp_rx_packets_total", s.rx_packets),
        ("xroce_qp_retransmitted_packets_total", s.retransmitted),
        ("xroce_qp_inflight_packets", 0),
        ("xroce_qp_path_mtu_bytes", MTU),
    ] {
        assert_eq!(sample(&scraped, name, &qp), want as f64, "{name}");
    }
    // The engine's counters as it published them (it is idle now).
    let published = xroce::stats_export::read_published(&pair.if_b);
    let engine = published
        .iter()
        .find(|p| p.pid == server.pid())
        .expect("the server's published counters");
    let labels = [iface.clone(), pid.clone(), ("command", "xroce".to_string())];
    for (name, v) in &engine.fields {
        let got = sample(&scraped, &format!("xroce_engine_{name}_total"), &labels);
        assert_eq!(got, *v as f64, "engine counter {name}");
    }
    let rx = engine
        .fields
        .iter()
        .find(|(n, _)| n == "rx_frames")
        .unwrap()
        .1;
    assert!(rx >= packets, "the server's engine received {rx} frames");
    // The XDP counters as `xroce stats` reads them.
    let stats: StatsReport = serde_json::from_str(
        xroce_out(&pair.b, &["stats", "--iface", &pair.if_b, "--json"]).trim(),
    )
    .expect("stats JSON");
    let writes = sample(
        &scraped,
        "xroce_xdp_op_write_frames_total",
        std::slice::from_ref(&iface),
    );
    assert_eq!(writes, stats.xdp["op_write"] as f64);
    assert_eq!(
        writes,
        (packets + report.retransmits) as f64,
        "WRITE packets XDP saw"
    );
    // All but what the kernel's own chatter (IPv6 neighbour discovery)
    // may add between the two reads.
    for (name, v) in stats
        .xdp
        .iter()
        .filter(|(n, _)| !["seen", "passed"].contains(&n.as_str()))
    {
        let got = sample(
            &scraped,
            &format!("xroce_xdp_{name}_frames_total"),
            std::slice::from_ref(&iface),
        );
        assert_eq!(got, *v as f64, "XDP counter {name}");
    }
    let exporter = exporter.finish(Duration::ZERO);
    assert!(
        !exporter.stderr.contains("XDP counters:"),
        "{}",
        exporter.stderr
    );

    let server_pid = server.pid();
    client.release();
    server.release();
    // Gone with their processes.
    assert_eq!(qps_of(&pair.b, server_pid), None);
}
