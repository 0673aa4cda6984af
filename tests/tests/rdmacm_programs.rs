//! Debian's unmodified rdmacm-utils and perftest (-R) over xroce's drop-in
//! librdmacm.so.1 and libibverbs.so.1: `xroce run --iface IF --backend B --
//! PROGRAM` between two namespaces joined by veth (servers in b, clients in
//! a), on both backends. Connections are made by RDMA-CM: CM MADs on QP1.
//!
//! - rping -C 50 -V -v at 64, 4096 and 65535 bytes (rping's largest: it
//!   refuses -S 65536), over IPv4 and once over IPv6 (a ULA on the veth):
//!   every ping line there with the full payload, both sides exit 0;
//! - ucmatose (one and four connections), udaddy (UD, SIDR), rdma_server /
//!   rdma_client: both sides exit 0 with their success lines;
//! - ib_write_bw -R and ib_send_lat -R: the result tables;
//! - immediate disconnects (tests/c/rdmacm_quick_close.c): a client that
//!   disconnects as soon as its one message is sent, against a server
//!   that answers the DREQ, one that disconnects at the same time and
//!   one that exits with the connection open: every message arrives, both
//!   sides exit 0 and the client's DISCONNECTED follows its first DREQ;
//! - a connect to a port nobody listens on is REJECTED (the peer's xroce
//!   answers for it) and ends at once; a connect to an address whose host
//!   runs nothing that answers CM ends UNREACHABLE within a bound, never
//!   hangs (the time is measured and printed);
//! - an rping captured on the wire (a bridge in a third namespace) and
//!   decoded by `xroce decode`: REQ, REP, RTU, DREQ, DREP on QP1 as UD
//!   SENDs, the RC traffic between them, every ICRC good.
//!
//! rdma_cm servers listen on no TCP port, so a client cannot wait for one
//! as the verbs tests do: it starts a second after its server and is tried
//! again (up to [`ATTEMPTS`] times) if it fails at once while the server
//! still runs; the attempts are named in the case's summary. Each test runs
//! all its cases and reports every failing one with the head of both sides'
//! stderr (XROCE_VERBS_DEBUG / XROCE_RDMACM_DEBUG: the libraries explain
//! failing calls there).

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use xroce_tests::{
    per_backend,
    programs::{
        args, check_bw_table, check_lat_table, check_opcode_counts, decode, next_port, serial,
        Backend, Cases, Finished, Node, PairOutput, Proc, Topology,
    },
    require_root,
    verbs::{compile_c, ibverbs_cdylib, rdmacm_cdylib, which, workspace_root},
};

/// One program run: a minute is plenty.
const RUN: Duration = Duration::from_secs(60);
/// How long a connect nobody answers may take: ib_cm retries its REQ 15
/// times at ~4.3 s (rdma_cm's CM response timeout 20); the library may
/// differ, but it must end.
const UNANSWERED_BOUND: Duration = Duration::from_secs(150);
/// A rejected connect ends at once; this much is generous.
const REJECTED_BOUND: Duration = Duration::from_secs(10);
/// The server's head start before its client (xroce run attaching XDP,
/// the program reaching rdma_listen).
const SETTLE: Duration = Duration::from_secs(1);
/// Tries of a client that fails at once while its server still runs.
const ATTEMPTS: u32 = 3;
/// A client failing faster than this may have been before its server's
/// rdma_listen.
const QUICK_FAILURE: Duration = Duration::from_secs(5);
/// rping's iterations in the tests.
const PINGS: usize = 50;

fn require_programs() {
    for program in [
        "rping",
        "ucmatose",
        "udaddy",
        "rdma_server",
        "rdma_client",
        "ib_write_bw",
        "ib_send_lat",
    ] {
        assert!(
            which(program).is_some(),
            "{program} is missing: install rdmacm-utils and perftest (cargo xtask setup does)"
        );
    }
    // `xroce run` links both libraries beside itself; build them as they
    // are now (`cargo test` builds no cdylib).
    let _ = (ibverbs_cdylib(), rdmacm_cdylib());
}

/// PROGRAM ARGS under `xroce run` on `node`, the library's CM explanations
/// on stderr.
fn start(t: &Topology, node: Node<'_>, program: &str, args: &[String]) -> Proc {
    let mut cmd = t.command(node, program, args);
    cmd.env("XROCE_RDMACM_DEBUG", "1");
    let what = format!(
        "[{} in {}] {program} {}",
        t.backend.as_str(),
        node.ns.name,
        args.join(" ")
    );
    Proc::spawn(cmd, what, &t.dir.0)
}

/// The server (in b) then, [`SETTLE`] later, the client (in a), tried
/// again while it fails at once and the server still runs. Returns both
/// ends and the client's attempts.
fn cm_pair(
    t: &Topology,
    (server_program, server_args): (&str, &[String]),
    (client_program, client_args): (&str, &[String]),
    timeout: Duration,
) -> (PairOutput, u32) {
    let mut server = start(t, t.server(), server_program, server_args);
    std::thread::sleep(SETTLE);
    let mut attempts = 0;
    let client = loop {
        attempts += 1;
        if server.exited() {
            let server = server.finish(Duration::ZERO);
            let why = format!("the server exited before client attempt {attempts}");
            return (
                PairOutput {
                    server,
                    client: None,
                    setup_error: Some(why),
                },
                attempts,
            );
        }
        let client = start(t, t.client(), client_program, client_args).finish(timeout);
        let early = !client.success() && client.secs < QUICK_FAILURE.as_secs_f64();
        if !early || attempts >= ATTEMPTS || server.exited() {
            break client;
        }
        eprintln!(
            "  (client attempt {attempts} failed after {:.1}s, trying again)\n{}",
            client.secs,
            client.describe()
        );
        std::thread::sleep(SETTLE);
    };
    // The server ends right after its client; a failed client may leave
    // it waiting.
    let grace = if client.success() {
        timeout
    } else {
        Duration::from_secs(10)
    };
    let server = server.finish(grace);
    (
        PairOutput {
            server,
            client: Some(client),
            setup_error: None,
        },
        attempts,
    )
}

fn attempts_note(attempts: u32) -> String {
    if attempts == 1 {
        String::new()
    } else {
        format!(" (client attempts: {attempts})")
    }
}

/// The payloads of the lines starting with `prefix` (rping -v prints
/// "ping data: rdma-ping-N: ABC..." on the client, "server ping data: ..."
/// on the server).
fn ping_lines<'a>(stdout: &'a str, prefix: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .collect()
}

/// Every ping there, in order, each `size - 1` bytes (rping ends its
/// buffer with a NUL): "rdma-ping-N: " then the pattern.
fn check_pings(f: &Finished, prefix: &str, size: usize) -> Result<(), String> {
    let lines = ping_lines(&f.stdout, prefix);
    if lines.len() != PINGS {
        return Err(format!(
            "{} lines {prefix:?}, expected {PINGS}\n{}",
            lines.len(),
            f.describe()
        ));
    }
    for (n, line) in lines.iter().enumerate() {
        let head = format!("rdma-ping-{n}: ");
        if !line.starts_with(&head) || line.len() != size - 1 {
            return Err(format!(
                "ping {n}: {} bytes starting {:?}, expected {} starting {head:?}\n{}",
                line.len(),
                &line[..line.len().min(40)],
                size - 1,
                f.describe()
            ));
        }
    }
    Ok(())
}

/// An rping pair to `addr` (the server's), -C 50 -V -v -S `size`: both
/// exit 0 and print every ping with its whole payload.
fn rping(t: &Topology, addr: IpAddr, size: usize) -> Result<String, String> {
    let port = next_port().to_string();
    let common = [
        "-a",
        &addr.to_string(),
        "-p",
        &port,
        "-C",
        &PINGS.to_string(),
        "-V",
        "-v",
        "-S",
        &size.to_string(),
    ]
    .map(String::from);
    let server: Vec<String> = args(&["-s"]).into_iter().chain(common.clone()).collect();
    let client: Vec<String> = args(&["-c"]).into_iter().chain(common).collect();
    let (out, attempts) = cm_pair(t, ("rping", &server), ("rping", &client), RUN);
    let client = out.check()?;
    check_pings(client, "ping data: ", size)?;
    check_pings(&out.server, "server ping data: ", size)?;
    Ok(format!(
        "{PINGS} pings of {size} B validated, client {:.1}s{}",
        client.secs,
        attempts_note(attempts)
    ))
}

/// A pair whose both sides must exit 0 and print every `want` line.
fn programs_pair(
    t: &Topology,
    server: (&str, &[&str]),
    client: (&str, &[&str]),
    want: &[&str],
) -> Result<String, String> {
    let (out, attempts) = cm_pair(
        t,
        (server.0, &args(server.1)),
        (client.0, &args(client.1)),
        RUN,
    );
    for w in want {
        out.check_both_have(w)?;
    }
    let client = out.check()?;
    Ok(format!(
        "client {:.1}s, server {:.1}s{}",
        client.secs,
        out.server.secs,
        attempts_note(attempts)
    ))
}

/// A perftest pair with -R (connections by rdma_cm) and `extra`: both
/// sides healthy, the client's table checked.
fn perftest_r(t: &Topology, tool: &str, extra: &[&str], bw: bool) -> Result<String, String> {
    let port = next_port().to_string();
    let mut server = args(&["-R", "-F", "-d", &t.server().device(), "-p", &port]);
    server.extend(args(extra));
    let mut client = args(&["-R", "-F", "-d", &t.client().device(), "-p", &port]);
    client.extend(args(extra));
    client.push(t.server().addr.to_string());
    let (out, attempts) = cm_pair(t, (tool, &server), (tool, &client), RUN);
    let client = out.check()?;
    let table = if bw {
        check_bw_table(client, None)?
    } else {
        check_lat_table(client, None)?
    };
    Ok(format!("{table}{}", attempts_note(attempts)))
}

per_backend!(
    rping_sizes,
    rping_ipv6,
    cm_programs,
    perftest_rdma_cm,
    immediate_disconnect,
    rejected,
    unanswered,
    capture,
);

fn rping_sizes(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("rping_sizes/{}", b.as_str()));
    let addr = IpAddr::V4(t.server().addr);
    for size in [64, 4096, 65535] {
        c.case(&format!("rping -C {PINGS} -V -v -S {size}"), || {
            rping(&t, addr, size)
        });
    }
    c.finish();
}

fn rping_ipv6(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    // Before the programs start, so that the devices have the GID.
    let (_, server_v6) = t.add_ipv6();
    let mut c = Cases::new(&format!("rping_ipv6/{}", b.as_str()));
    c.case(
        &format!("rping -C {PINGS} -V -v -S 4096 to {server_v6}"),
        || rping(&t, IpAddr::V6(server_v6), 4096),
    );
    c.finish();
}

fn cm_programs(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("cm_programs/{}", b.as_str()));
    let addr = t.server().addr.to_string();
    // ucmatose and udaddy end with "test complete" and "return status 0"
    // on both sides; rdma_server / rdma_client with "end 0".
    let done = ["test complete", "return status 0"];
    for conns in ["1", "4"] {
        c.case(&format!("ucmatose -c {conns}"), || {
            let port = next_port().to_string();
            programs_pair(
                &t,
                ("ucmatose", &["-c", conns, "-p", &port]),
                ("ucmatose", &["-s", &addr, "-c", conns, "-p", &port]),
                &done,
            )
        });
    }
    // udaddy's -p is the port space; it always uses port 7174.
    c.case("udaddy", || {
        programs_pair(&t, ("udaddy", &[]), ("udaddy", &["-s", &addr]), &done)
    });
    c.case("rdma_server / rdma_client", || {
        let port = next_port().to_string();
        let (out, attempts) = cm_pair(
            &t,
            ("rdma_server", &args(&["-p", &port])),
            ("rdma_client", &args(&["-s", &addr, "-p", &port])),
            RUN,
        );
        let client = out.check()?;
        for (f, want) in [
            (client, "rdma_client: end 0"),
            (&out.server, "rdma_server: end 0"),
        ] {
            if !f.stdout.contains(want) {
                return Err(format!("stdout lacks {want:?}\n{}", f.describe()));
            }
        }
        Ok(format!(
            "client {:.1}s{}",
            client.secs,
            attempts_note(attempts)
        ))
    });
    c.finish();
}

fn perftest_rdma_cm(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("perftest_rdma_cm/{}", b.as_str()));
    c.case("ib_write_bw -R -n 500", || {
        perftest_r(&t, "ib_write_bw", &["-n", "500"], true)
    });
    c.case("ib_write_bw -R -s 1 -n 1000", || {
        perftest_r(&t, "ib_write_bw", &["-s", "1", "-n", "1000"], true)
    });
    c.case("ib_send_lat -R -n 300", || {
        perftest_r(&t, "ib_send_lat", &["-n", "300"], false)
    });
    c.finish();
}

/// Connections closed right after their one message
/// (tests/c/rdmacm_quick_close.c): per case, how many connections, and
/// how many server processes run one after another.
const QUICK_CLOSES: usize = 10;
const EXITING_SERVERS: usize = 3;
/// How long a client's DISCONNECTED may take after its rdma_disconnect:
/// less than one CM retry (4.3 s), so the first DREQ (or the server's
/// crossing it) must have ended it, not a retransmission.
const DISCONNECT_BOUND_MS: u64 = 4000;

/// Starts the quick-close server in `mode` for `count` connections and
/// waits until it says it listens.
fn quick_close_server(
    t: &Topology,
    exe: &str,
    mode: &str,
    port: &str,
    count: usize,
) -> Result<Proc, String> {
    let addr = t.server().addr.to_string();
    let mut server = start(
        t,
        t.server(),
        exe,
        &args(&["server", mode, &addr, port, &count.to_string()]),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.stdout_so_far().contains("listening") {
        if server.exited() || Instant::now() > deadline {
            return Err(format!(
                "the server did not listen\n{}",
                server.finish(Duration::ZERO).describe()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(server)
}

/// The client's "disconnected in N ms" lines: `count` of them, each
/// within [`DISCONNECT_BOUND_MS`]; returns the slowest.
fn check_disconnect_times(client: &Finished, count: usize) -> Result<u64, String> {
    let times: Vec<u64> = client
        .stdout
        .lines()
        .filter_map(|l| {
            l.split_once("disconnected in ")?
                .1
                .strip_suffix(" ms")?
                .parse()
                .ok()
        })
        .collect();
    if times.len() != count {
        return Err(format!(
            "{} disconnects reported, expected {count}\n{}",
            times.len(),
            client.describe()
        ));
    }
    let slowest = times.iter().copied().max().unwrap_or(0);
    if slowest > DISCONNECT_BOUND_MS {
        return Err(format!(
            "a disconnect took {slowest} ms (bound {DISCONNECT_BOUND_MS}): a DREQ went \
             unanswered\n{}",
            client.describe()
        ));
    }
    Ok(slowest)
}

/// A client that connects, sends one message and disconnects at once,
/// against servers that answer its DREQ, disconnect at the same moment,
/// or exit with the connection open (the kernel's rdma_cm ends such a
/// connection when the process's file closes; xroce's library must at
/// exit). Every connection carries its message, both sides exit 0, and
/// the client's DISCONNECTED comes within [`DISCONNECT_BOUND_MS`] of its
/// rdma_disconnect.
fn immediate_disconnect(b: Backend) {
    require_root();
    let _ = (ibverbs_cdylib(), rdmacm_cdylib());
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let exe = t.dir.0.join("rdmacm_quick_close");
    compile_c(
        &workspace_root().join("tests/c/rdmacm_quick_close.c"),
        &exe,
        &["-lrdmacm", "-libverbs"],
    );
    let exe = exe.to_string_lossy().into_owned();
    let addr = t.server().addr.to_string();
    let mut c = Cases::new(&format!("immediate_disconnect/{}", b.as_str()));
    for (mode, what) in [
        ("answer", "the server answers the DREQ"),
        ("first", "the server disconnects at the same time"),
    ] {
        c.case(&format!("{QUICK_CLOSES} connections, {what}"), || {
            let port = next_port().to_string();
            let server = quick_close_server(&t, &exe, mode, &port, QUICK_CLOSES)?;
            let client = start(
                &t,
                t.client(),
                &exe,
                &args(&["client", &addr, &port, &QUICK_CLOSES.to_string()]),
            )
            .finish(RUN);
            let out = PairOutput {
                server: server.finish(if client.success() {
                    RUN
                } else {
                    Duration::from_secs(10)
                }),
                client: Some(client),
                setup_error: None,
            };
            let client = out.check()?;
            let slowest = check_disconnect_times(client, QUICK_CLOSES)?;
            let served = out.server.stdout.matches("bytes ok").count();
            if served != QUICK_CLOSES || !out.server.stdout.contains("server done") {
                return Err(format!(
                    "the server took {served} messages\n{}",
                    out.server.describe()
                ));
            }
            Ok(format!(
                "slowest disconnect {slowest} ms, client {:.1}s",
                client.secs
            ))
        });
    }
    c.case(
        &format!("{EXITING_SERVERS} servers exiting with the connection open"),
        || {
            let mut slowest = 0;
            for _ in 0..EXITING_SERVERS {
                let port = next_port().to_string();
                let server = quick_close_server(&t, &exe, "exit", &port, 1)?;
                let client =
                    start(&t, t.client(), &exe, &args(&["client", &addr, &port, "1"])).finish(RUN);
                let out = PairOutput {
                    server: server.finish(Duration::from_secs(10)),
                    client: Some(client),
                    setup_error: None,
                };
                let client = out.check()?;
                slowest = slowest.max(check_disconnect_times(client, 1)?);
                if !out
                    .server
                    .stdout
                    .contains("exiting with the connection open")
                {
                    return Err(format!(
                        "the server took no message\n{}",
                        out.server.describe()
                    ));
                }
            }
            Ok(format!("slowest disconnect {slowest} ms"))
        },
    );
    c.finish();
}

/// A client that must fail: its end, and whether it ended within `bound`
/// with a status and `want` on its output.
fn expect_failure(f: &Finished, bound: Duration, want: &str) -> Result<String, String> {
    if f.status.is_none() {
        return Err(format!("still running after {bound:?}\n{}", f.describe()));
    }
    if f.success() {
        return Err(format!("the connect succeeded\n{}", f.describe()));
    }
    let text = format!("{}{}", f.stderr, f.stdout);
    let Some(line) = text.lines().find(|l| l.contains(want)) else {
        return Err(format!("no line with {want:?}\n{}", f.describe()));
    };
    Ok(format!("ended after {:.1}s: {}", f.secs, line.trim()))
}

fn rejected(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("rejected/{}", b.as_str()));
    let addr = t.server().addr.to_string();
    // An rping server on another port: xroce runs in b and answers CM.
    let other_server = || {
        let port = next_port().to_string();
        let server = start(
            &t,
            t.server(),
            "rping",
            &args(&["-s", "-a", &addr, "-p", &port]),
        );
        std::thread::sleep(SETTLE * 2);
        server
    };
    c.case("rping -c to port 9999 (nobody listens): REJECTED", || {
        let server = other_server();
        let client = start(
            &t,
            t.client(),
            "rping",
            &args(&["-c", "-a", &addr, "-p", "9999", "-C", "1"]),
        )
        .finish(REJECTED_BOUND);
        // It still waits for its own client: ended by its PID here.
        let server = server.finish(Duration::ZERO);
        // rping: "cma event RDMA_CM_EVENT_REJECTED, error 8" (the IB CM
        // reason: invalid service ID, as Linux answers).
        expect_failure(&client, REJECTED_BOUND, "RDMA_CM_EVENT_REJECTED")
            .and_then(|s| {
                if s.contains("error 8") {
                    Ok(s)
                } else {
                    Err(format!("not reason 8 (invalid service ID): {s}"))
                }
            })
            .map_err(|e| format!("{e}\nthe other rping server:\n{}", server.describe()))
    });
    c.case(
        "ib_write_bw -R to port 9999: REJECTED (event 8), no crash",
        || {
            // perftest tears its ids down after the REJECTED event: the
            // libraries must take that without a signal (exit 1, not 139).
            let server = other_server();
            let client = start(
                &t,
                t.client(),
                "ib_write_bw",
                &args(&["-R", "-F", "-d", &t.client().device(), "-p", "9999", &addr]),
            )
            .finish(REJECTED_BOUND);
            if let Some(sig) = client.status.and_then(|s| {
                use std::os::unix::process::ExitStatusExt;
                s.signal()
            }) {
                return Err(format!("killed by signal {sig}\n{}", client.describe()));
            }
            let server = server.finish(Duration::ZERO);
            // perftest names the event by number: 8 is RDMA_CM_EVENT_REJECTED.
            expect_failure(&client, REJECTED_BOUND, "Unexpected CM event bl blka 8")
                .map_err(|e| format!("{e}\nthe rping server:\n{}", server.describe()))
        },
    );
    c.finish();
}

fn unanswered(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("unanswered/{}", b.as_str()));
    let addr = t.server().addr.to_string();
    // b has the address (its kernel answers ARP) but runs no xroce: no
    // one answers QP1.
    c.case("rping -c to a host without CM: ends UNREACHABLE", || {
        let started = Instant::now();
        let client = start(
            &t,
            t.client(),
            "rping",
            &args(&["-c", "-a", &addr, "-C", "1"]),
        )
        .finish(UNANSWERED_BOUND);
        expect_failure(&client, UNANSWERED_BOUND, "RDMA_CM_EVENT_UNREACHABLE").map(|s| {
            format!(
                "{s} (bound {UNANSWERED_BOUND:?}, {:.1?})",
                started.elapsed()
            )
        })
    });
    c.finish();
}

fn capture(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    // AF_XDP frames pass no tcpdump at either end; the bridge's port does.
    let t = Topology::bridged(b, 1500);
    let mut c = Cases::new(&format!("capture/{}", b.as_str()));
    c.case("rping -C 50 -S 4096 on the wire", || {
        let addr = IpAddr::V4(t.server().addr);
        let (run, file, summary) = t.captured("rping.pcap", || rping(&t, addr, 4096))?;
        let note = run?;
        let r = decode(&file)?;
        if r.roce == 0 {
            return Err(format!("no RoCEv2 frame captured ({summary}): {r:?}"));
        }
        if r.icrc_bad != 0 || r.malformed != 0 || r.not_roce != 0 || r.icrc_ok != r.roce {
            return Err(format!("bad frames on the wire ({summary}): {r:?}"));
        }
        // "CM REQ tid=...": the message's name.
        let names: Vec<&str> =
            r.cm.iter()
                .filter_map(|l| l.message.split_whitespace().nth(1))
                .collect();
        let mut at = 0;
        for want in ["REQ", "REP", "RTU", "DREQ", "DREP"] {
            match names[at..].iter().position(|n| *n == want) {
                Some(i) => at += i + 1,
                None => {
                    return Err(format!(
                        "CM MADs {names:?}: no {want} after the ones before it ({summary})"
                    ))
                }
            }
        }
        if names.contains(&"REJ") {
            return Err(format!("a REJ on the wire: {:?}", r.cm));
        }
        // Every MAD goes to QP1, and only MADs do.
        let to_qp1: u64 = r
            .qps
            .iter()
            .filter(|q| q.dest_qp == 1)
            .map(|q| q.packets)
            .sum();
        if to_qp1 != r.cm.len() as u64 {
            return Err(format!(
                "{to_qp1} frames to QP1, {} CM MADs: {:?}",
                r.cm.len(),
                r.qps
            ));
        }
        // rping, per ping: two SENDs each way (buffer adverts and
        // go-aheads), an RDMA READ and an RDMA WRITE by the server.
        let pings = PINGS as u64;
        check_opcode_counts(
            &r.opcodes_named,
            &[
                ("UD_SEND_ONLY", 5),
                ("RC_SEND", 4 * pings),
                ("RC_RDMA_READ_REQUEST", pings),
                ("RC_RDMA_WRITE", pings),
            ],
            &summary,
        )?;
        Ok(format!(
            "{note}; {summary}, all RoCEv2 with good ICRC; CM {names:?}; {:?}",
            r.opcodes_named
        ))
    });
    c.finish();
}
