//! Debian's unmodified UCX 1.13 tools (ucx-utils) over xroce between two
//! namespaces that UCX takes for two hosts ([`TwoHosts`]: the same device
//! `xroce_IF:1` on both, each program in its own IPC namespace so that UCX
//! cannot use shared memory), every program under `xroce run`, on both
//! backends:
//!
//! - `ucx_info -d` lists the device `xroce_IF:1` with the transports
//!   rc_verbs and ud_verbs;
//! - UCT (`ucx_perftest -x TL -d xroce_IF:1`): am_lat, am_bw over rc_verbs
//!   and ud_verbs, put_bw, get (zero-copy RDMA READ), fadd and cswap
//!   (the verbs' 64-bit atomics) over rc_verbs;
//!   put_bw over ud_verbs is refused by UCX itself (UD has no RDMA), which
//!   is checked too;
//! - UCP: tag_lat, tag_bw (8 B and 1 MiB: the rendezvous protocol),
//!   ucp_put_bw, ucp_get and ucp_am_bw with UCX_TLS unset, =rc and =ud
//!   (UCX_NET_DEVICES=xroce_IF:1 picks the device); UCX's own report of
//!   the lanes it chose (UCX_LOG_LEVEL=info, `ep_cfg[N]: tag(...)`) must
//!   name only rc_verbs (unset, rc) or ud_verbs (ud) on xroce.
//!
//! Every run exits 0 on both sides, prints no UCX error or warning (nor an
//! assertion or a backtrace, nor a verb failing under XROCE_VERBS_DEBUG) and the client's last line is perftest's
//! `Final:` line with the iterations asked for and a message rate.
//! Iterations are few (1000, 20 for 1 MiB): a case takes a few seconds.

use std::time::Duration;

use xroce_tests::{
    per_backend,
    programs::{args, next_port, serial, wait_listening, Backend, Cases, Finished},
    require_root,
    two_hosts::{Side, TwoHosts},
};

/// One program run; the slowest (UD with 1 MiB messages on a busy debug
/// build) take a few seconds.
const RUN: Duration = Duration::from_secs(90);
/// Iterations of a small-message run and of a large-message one (64 KiB
/// UCT get, 1 MiB UCP tag_bw).
const ITERS: u64 = 1000;
const ITERS_LARGE: u64 = 20;

per_backend!(
    ucx_info_devices,
    uct_transports,
    ucp_tls_unset,
    ucp_tls_rc,
    ucp_tls_ud
);

/// A line of UCX's log (`[time] [host:pid:thread] file.c:line UCX  LEVEL ...`),
/// which UCX writes to stdout.
fn is_ucx_log(line: &str) -> bool {
    line.starts_with('[') && line.contains(" UCX  ")
}

/// Lines of a UCX program's output that a healthy run never prints.
fn bad_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| {
            // A verb that failed (XROCE_VERBS_DEBUG says why).
            l.contains("(errno ")
                || l.contains("UCX  ERROR")
                || l.contains("UCX  WARN")
                || l.contains("Assertion")
                || l.contains("Fatal")
                || l.contains("backtrace")
                || l.contains("Segmentation fault")
        })
        .collect()
}

fn healthy(f: &Finished) -> Result<(), String> {
    if !f.success() {
        return Err(f.describe());
    }
    let bad: Vec<&str> = bad_lines(&f.stderr)
        .into_iter()
        .chain(bad_lines(&f.stdout))
        .collect();
    if !bad.is_empty() {
        return Err(format!("UCX reported errors {bad:?}\n{}", f.describe()));
    }
    Ok(())
}

fn ucx_info_devices(b: Backend) {
    require_root();
    let _turn = serial();
    let h = TwoHosts::new(b);
    let mut c = Cases::new(&format!("ucx_info_devices/{}", b.as_str()));
    for side in [Side::A, Side::B] {
        c.case(&format!("ucx_info -d on {side:?}"), || {
            let f = h.start(side, "ucx_info", &args(&["-d"]), &[]).finish(RUN);
            healthy(&f)?;
            let found = transports(&f.stdout);
            let dev = h.ucx_device();
            for tl in ["rc_verbs", "ud_verbs"] {
                if !found.iter().any(|(t, d)| t == tl && *d == dev) {
                    return Err(format!(
                        "no {tl} on {dev}; transports {found:?}\n{}",
                        f.describe()
                    ));
                }
            }
            Ok(format!("{found:?}"))
        });
    }
    c.finish();
}

/// (transport, device) of every `# Transport:` / `# Device:` pair of
/// `ucx_info -d`.
fn transports(stdout: &str) -> Vec<(String, String)> {
    let field = |l: &str, key: &str| {
        l.trim_start_matches('#')
            .trim()
            .strip_prefix(key)
            .map(|v| v.trim().to_string())
    };
    let mut out = Vec::new();
    let mut tl = None;
    for l in stdout.lines() {
        if let Some(t) = field(l, "Transport:") {
            tl = Some(t);
        } else if let Some(d) = field(l, "Device:") {
            if let Some(t) = tl.take() {
                out.push((t, d));
            }
        }
    }
    out
}

/// A ucx_perftest pair: the server (`-p PORT`) on b, then the client
/// (`ADDR_B -p PORT ARGS`) on a, both with `env`. Returns (client,
/// server).
fn perftest(
    h: &TwoHosts,
    client_args: &[String],
    env: &[(&str, &str)],
) -> Result<(Finished, Finished), String> {
    let port = next_port().to_string();
    let mut server = h.start(Side::B, "ucx_perftest", &args(&["-p", &port]), env);
    let port_n = port.parse().expect("port");
    if let Err(why) = wait_listening(h.ns(Side::B), port_n, &mut server, Duration::from_secs(30)) {
        return Err(format!(
            "{why}\n{}",
            server.finish(Duration::from_secs(1)).describe()
        ));
    }
    let mut cargs = args(&[&h.addr_b.to_string(), "-p", &port]);
    cargs.extend_from_slice(client_args);
    let client = h.start(Side::A, "ucx_perftest", &cargs, env).finish(RUN);
    let grace = if client.success() {
        RUN
    } else {
        Duration::from_secs(10)
    };
    let server = server.finish(grace);
    Ok((client, server))
}

/// Both sides healthy and the client's last line `Final: ITERS ...` whole
/// ([`final_is_whole`]); returns that line.
fn check_final(client: &Finished, server: &Finished, iters: u64) -> Result<String, String> {
    healthy(client).map_err(|e| format!("client:\n{e}\nserver:\n{}", server.describe()))?;
    healthy(server).map_err(|e| format!("server:\n{e}\nclient:\n{}", client.describe()))?;
    // UCX logs to stdout too (UCX_LOG_LEVEL=info); its lines are not
    // perftest's.
    let last = client
        .stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty() && !is_ucx_log(l))
        .unwrap_or_default();
    let fields: Vec<&str> = last.split_whitespace().collect();
    let ok = fields.first() == Some(&"Final:") && final_is_whole(&fields[1..], iters);
    if !ok {
        return Err(format!(
            "last line {last:?} is not `Final: {iters} <7 results>` with a message rate\n{}",
            client.describe()
        ));
    }
    Ok(last.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The numbers of a `Final:` line: iterations, latency (percentile,
/// average, overall), bandwidth (average, overall), message rate (average,
/// overall). The "average" columns cover only perftest's last report
/// interval, which on a busy host may hold no iteration at all: then its
/// latency is `inf` and its rate 0 (`Final: 1000 3995.725 inf 4028.024
/// 0.00 0.00 0 248`). What the run as a whole did is in the overall
/// columns: every iteration asked for, a finite latency, a message rate.
fn final_is_whole(numbers: &[&str], iters: u64) -> bool {
    let n: Vec<f64> = numbers.iter().filter_map(|f| f.parse().ok()).collect();
    n.len() == 8
        && n[0] == iters as f64
        && n.iter().all(|x| !x.is_nan() && *x >= 0.0)
        && [n[1], n[3], n[5]].iter().all(|x| x.is_finite())
        && n[3] > 0.0
        && n[7] > 0.0
}

#[test]
fn a_final_line_is_judged_by_its_overall_columns() {
    for (line, whole) in [
        // Quiet host, and a busy one whose last interval held no iteration.
        ("1000 14.2 14.5 14.6 0.52 0.52 68000 68100", true),
        ("1000 3995.725 inf 4028.024 0.00 0.00 0 248", true),
        // Too few iterations, no overall rate, no overall latency, a short line.
        ("999 14.2 14.5 14.6 0.52 0.52 68000 68100", false),
        ("1000 14.2 14.5 14.6 0.52 0.52 68000 0", false),
        ("1000 14.2 14.5 inf 0.52 0.52 68000 68100", false),
        ("1000 14.2 14.5 14.6 0.52 0.52 68000", false),
    ] {
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(final_is_whole(&columns, 1000), whole, "{line}");
    }
}

fn uct_transports(b: Backend) {
    require_root();
    let _turn = serial();
    let h = TwoHosts::new(b);
    let dev = h.ucx_device();
    let n = ITERS.to_string();
    let mut c = Cases::new(&format!("uct_transports/{}", b.as_str()));
    for (tl, test, iters, extra) in [
        ("rc_verbs", "am_lat", ITERS, &[][..]),
        ("rc_verbs", "am_bw", ITERS, &[]),
        ("rc_verbs", "put_bw", ITERS, &[]),
        (
            "rc_verbs",
            "get",
            ITERS_LARGE,
            &["-D", "zcopy", "-s", "65536"],
        ),
        ("rc_verbs", "fadd", ITERS, &[]),
        ("rc_verbs", "cswap", ITERS, &[]),
        ("ud_verbs", "am_lat", ITERS, &[]),
        ("ud_verbs", "am_bw", ITERS, &[]),
    ] {
        c.case(&format!("{test} over {tl} {}", extra.join(" ")), || {
            let (n, w) = (iters.to_string(), (iters / 10).to_string());
            let mut a = args(&["-t", test, "-x", tl, "-d", &dev, "-n", &n, "-w", &w]);
            a.extend(args(extra));
            let (client, server) = perftest(&h, &a, &[])?;
            check_final(&client, &server, iters)
        });
    }
    c.case("put_bw over ud_verbs is refused by UCX", || {
        let a = args(&["-t", "put_bw", "-x", "ud_verbs", "-d", &dev, "-n", &n]);
        let (client, _server) = perftest(&h, &a, &[])?;
        let want = "ud_verbs/".to_string() + &dev + " does not support operation put short";
        if client.success() || !client.stdout.contains(&want) {
            return Err(format!(
                "expected a failure saying {want:?}\n{}",
                client.describe()
            ));
        }
        Ok(want)
    });
    c.finish();
}

/// The transports UCX reported for its lanes: from every `ep_cfg[N]:
/// op(tl/dev tl/dev ...)` line, the `tl/dev` words.
fn lanes(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once("ep_cfg[").map(|(_, r)| r))
        .flat_map(|r| {
            r.split(['(', ')', ' '])
                .filter(|w| w.contains('/'))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The UCP tests with `UCX_TLS=tls` (unset for `None`); every lane must
/// be `want_tl` on xroce.
fn ucp_with(b: Backend, tls: Option<&str>, want_tl: &str) {
    require_root();
    let _turn = serial();
    let h = TwoHosts::new(b);
    let dev = h.ucx_device();
    let mut env = vec![("UCX_NET_DEVICES", dev.as_str()), ("UCX_LOG_LEVEL", "info")];
    if let Some(t) = tls {
        env.push(("UCX_TLS", t));
    }
    let want_lane = format!("{want_tl}/{dev}");
    let mut c = Cases::new(&format!(
        "ucp_tls_{}/{}",
        tls.unwrap_or("unset"),
        b.as_str()
    ));
    for (test, size, iters) in [
        ("tag_lat", 8, ITERS),
        ("tag_bw", 8, ITERS),
        ("tag_bw", 1 << 20, ITERS_LARGE),
        ("ucp_put_bw", 8, ITERS),
        ("ucp_get", 8, ITERS),
        ("ucp_am_bw", 8, ITERS),
    ] {
        c.case(&format!("{test} {size} B"), || {
            let a = args(&[
                "-t",
                test,
                "-s",
                &size.to_string(),
                "-n",
                &iters.to_string(),
                "-w",
                &(iters / 10).to_string(),
            ]);
            let (client, server) = perftest(&h, &a, &env)?;
            let line = check_final(&client, &server, iters)?;
            for f in [&client, &server] {
                let used = lanes(&f.stdout);
                if used.is_empty() || used.iter().any(|l| *l != want_lane) {
                    return Err(format!(
                        "lanes {used:?}, expected only {want_lane}\n{}",
                        f.describe()
                    ));
                }
            }
            Ok(line)
        });
    }
    c.finish();
}

fn ucp_tls_unset(b: Backend) {
    ucp_with(b, None, "rc_verbs");
}

fn ucp_tls_rc(b: Backend) {
    ucp_with(b, Some("rc"), "rc_verbs");
}

fn ucp_tls_ud(b: Backend) {
    ucp_with(b, Some("ud"), "ud_verbs");
}

#[test]
fn lanes_are_read_from_ucx_ep_cfg_lines() {
    let text = "[1.2] [vm:1:0] ucp_worker.c:1763 UCX  INFO    ep_cfg[0]: tag(rc_verbs/xroce_x:1 ud_verbs/xroce_x:1)\n\
                [1.3] [vm:1:0] ucp_worker.c:1763 UCX  INFO    ep_cfg[1]: rma_am(ud_verbs/xroce_x:1)\n\
                other line (x/y)";
    assert_eq!(
        lanes(text),
        [
            "rc_verbs/xroce_x:1",
            "ud_verbs/xroce_x:1",
            "ud_verbs/xroce_x:1"
        ]
    );
}

#[test]
fn transports_pair_with_their_device() {
    let text = "#      Transport: tcp\n#         Device: lo\n#  System device: <unknown>\n\
                #      Transport: rc_verbs\n#         Device: xroce_x:1\n";
    assert_eq!(
        transports(text),
        [
            ("tcp".to_string(), "lo".to_string()),
            ("rc_verbs".to_string(), "xroce_x:1".to_string())
        ]
    );
}
