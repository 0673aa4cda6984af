//! perftest's flags on `xroce bench` / `xroce lat` between two namespaces:
//! -a (one verified row per size), -b (both directions at once, summed,
//! both sides checking data), -c UC / UD (and the ops they refuse), -I
//! (inline, and its limit), --report_gbits (units), -x (the source GID),
//! --perftest's address lines against Debian's ib_write_bw / ib_read_bw
//! run under `xroce run` (each side's remote line is the other's local
//! line), and --perftest -a against Debian's ib_write_bw / ib_write_lat -a.

use std::{process::Output, time::Duration};

use xroce_report::{BenchReport, LatReport};
use xroce_tests::{
    perf::{next_port, run_client, start_server, Server},
    programs::{serial, wait_listening, Backend, Finished, Proc, Topology},
    require_root, workspace_bin, VethPair,
};

/// A client run whose JSON lines (one per size with -a) are returned;
/// fails the test with both sides' stderr otherwise.
fn run_lines<R: serde::de::DeserializeOwned>(
    pair: &VethPair,
    tool: &str,
    server: &[&str],
    client: &[&str],
) -> (Vec<R>, String) {
    let port = next_port();
    let srv = start_server(pair, tool, port, server);
    let out = run_client(pair, tool, port, client);
    let srv = srv.finish(Duration::from_secs(20));
    let srv_err = String::from_utf8_lossy(&srv.stderr).into_owned();
    assert!(
        out.status.success(),
        "client {client:?} failed: {}\nserver: {srv_err}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(srv.status.success(), "server {server:?} failed: {srv_err}");
    let text = String::from_utf8_lossy(&out.stdout);
    let rows = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("client JSON {l:?}: {e}")))
        .collect();
    (rows, srv_err)
}

/// A client run that must fail before any server is needed; returns its stderr.
fn refused(pair: &VethPair, tool: &str, client: &[&str]) -> String {
    let out = run_client(pair, tool, next_port(), client);
    assert!(
        !out.status.success(),
        "{client:?} should have been refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn all_sizes() -> Vec<u64> {
    (1..=23).map(|i| 1u64 << i).collect()
}

#[test]
fn all_sizes_give_one_verified_row_each() {
    require_root();
    let _turn = serial();
    let pair = VethPair::new(1500);
    let (rows, srv) =
        run_lines::<BenchReport>(&pair, "bench", &["write"], &["write", "-a", "-n", "20"]);
    assert_eq!(rows.iter().map(|r| r.size).collect::<Vec<_>>(), all_sizes());
    for r in &rows {
        assert_eq!(r.verified, Some(true), "{r:?}");
        assert_eq!(r.iters, 20, "{r:?}");
        assert_eq!(r.bytes, 20 * r.size, "{r:?}");
    }
    assert_eq!(srv.matches("data verified").count(), 23, "{srv}");

    // Latency too: write ping-pong carries its counter in messages of 2 and 4 bytes.
    let (rows, _) = run_lines::<LatReport>(&pair, "lat", &["write"], &["write", "-a", "-n", "20"]);
    assert_eq!(rows.iter().map(|r| r.size).collect::<Vec<_>>(), all_sizes());
    for r in &rows {
        assert_eq!(r.iters, 20, "{r:?}");
        assert!(r.lat_us.min > 0.0, "{r:?}");
    }

    // The table: one header, a row per size, one closing rule.
    let port = next_port();
    let srv = start_server(&pair, "bench", port, &["send"]);
    let out = table_client(&pair, "bench", port, &["send", "-a", "-n", "5"]);
    srv.finish(Duration::from_secs(20));
    let text = ok(&out, "bench send -a");
    assert_eq!(text.matches("#bytes").count(), 1, "{text}");
    let sizes: Vec<u64> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(sizes, all_sizes(), "{text}");
    assert_eq!(text.matches(" true").count(), 23, "{text}");
}

/// `xroce <tool> <args> --connect addr_b:port -d if_a` in a, without --json.
fn table_client(pair: &VethPair, tool: &str, port: u16, args: &[&str]) -> Output {
    pair.a
        .command(workspace_bin("xroce"))
        .arg(tool)
        .args(args)
        .args(["-d", &pair.if_a])
        .args(["--connect", &format!("{}:{port}", pair.addr_b)])
        .output()
        .expect("run xroce client")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bidirectional_sums_both_directions_and_both_sides_verify() {
    require_root();
    let _turn = serial();
    let pair = VethPair::new(1500);
    for (op, size) in [
        ("write", 16384u64),
        ("read", 16384),
        ("send", 16384),
        ("atomic", 8),
    ] {
        let mut args = vec![op, "-b", "-n", "300"];
        let s = size.to_string();
        if op != "atomic" {
            args.extend(["-s", &s]);
        }
        let (rows, srv) = run_lines::<BenchReport>(&pair, "bench", &[op], &args);
        let r = &rows[0];
        // Both directions: 300 messages each way, counted once each.
        assert_eq!(r.verified, Some(true), "{op}: {r:?}");
        assert_eq!(r.iters, 600, "{op}: {r:?}");
        assert_eq!(r.bytes, 600 * size, "{op}: {r:?}");
        assert!(srv.contains("data verified"), "{op}: {srv}");
        // The rate is the sum of two directions, each slower than the total.
        assert!(r.msgs_per_sec > 0.0 && r.gbps > 0.0, "{op}: {r:?}");
        let one_way_secs = r.seconds;
        assert!(
            r.msgs_per_sec > 300.0 / one_way_secs,
            "{op}: the sum of both directions exceeds one direction's rate: {r:?}"
        );
    }
    // -b is for bandwidth.
    let err = refused(&pair, "lat", &["write", "-b"]);
    assert!(err.contains("-b is for bandwidth"), "{err}");
}

#[test]
fn uc_and_ud_carry_what_perftest_allows() {
    require_root();
    let _turn = serial();
    let pair = VethPair::new(1500);
    let (rows, srv) = run_lines::<BenchReport>(
        &pair,
        "bench",
        &["write"],
        &["write", "-c", "UC", "-n", "300"],
    );
    assert_eq!(rows[0].verified, Some(true), "{:?}", rows[0]);
    assert_eq!(rows[0].iters, 300);
    assert!(
        srv.contains("UC write from") && srv.contains("data verified"),
        "{srv}"
    );

    // UD sends of up to one path MTU; -n below the receive depth, so none is lost.
    let (rows, srv) = run_lines::<BenchReport>(
        &pair,
        "bench",
        &["send"],
        &["send", "-c", "UD", "-s", "1024", "-n", "100"],
    );
    assert_eq!(rows[0].verified, Some(true), "{:?}", rows[0]);
    assert_eq!(rows[0].iters, 100);
    assert!(
        srv.contains("UD send from") && srv.contains("data verified (100 of 100 messages arrived)"),
        "{srv}"
    );
    let (rows, srv) = run_lines::<BenchReport>(
        &pair,
        "bench",
        &["send"],
        &["send", "-c", "uc", "-s", "4096", "-n", "100"],
    );
    assert_eq!(rows[0].verified, Some(true), "{:?}", rows[0]);
    assert!(srv.contains("UC send from"), "{srv}");
    let (rows, _) = run_lines::<LatReport>(
        &pair,
        "lat",
        &["send"],
        &["send", "-c", "UD", "-s", "64", "-n", "200"],
    );
    assert_eq!(rows[0].iters, 200);

    let err = refused(&pair, "bench", &["write", "-c", "UD"]);
    assert!(
        err.contains("-c UD carries only send, not write") && err.contains("-c UD send"),
        "{err}"
    );
    let err = refused(&pair, "bench", &["read", "-c", "UC"]);
    assert!(
        err.contains("-c UC carries write and send, not read") && err.contains("-c RC"),
        "{err}"
    );
    let err = refused(&pair, "bench", &["atomic", "-c", "UC"]);
    assert!(err.contains("not atomic"), "{err}");
    // A UD message is one packet.
    let port = next_port();
    let srv = start_server(&pair, "bench", port, &["send"]);
    let out = run_client(
        &pair,
        "bench",
        port,
        &["send", "-c", "UD", "-s", "4096", "-n", "10"],
    );
    drop(srv);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "-c UD: a message is at most one path MTU (1024 bytes); use --size 1024 or less"
        ),
        "{err}"
    );
}

#[test]
fn inline_sizes_up_to_the_engines_limit() {
    require_root();
    let _turn = serial();
    let pair = VethPair::new(1500);
    for op in ["write", "send"] {
        let (rows, _) = run_lines::<BenchReport>(
            &pair,
            "bench",
            &[op],
            &[op, "-I", "256", "-s", "200", "-n", "500"],
        );
        assert_eq!(rows[0].verified, Some(true), "{op}: {:?}", rows[0]);
        assert_eq!(rows[0].iters, 500);
    }
    let err = refused(&pair, "bench", &["write", "-I", "257"]);
    assert!(
        err.contains("--inline_size 257: xroce's engine inlines at most 256 bytes"),
        "{err}"
    );
    let err = refused(&pair, "bench", &["read", "--inline_size", "64"]);
    assert!(err.contains("applies to write and send"), "{err}");
}

/// `xroce <tool> <op> --perftest` in namespace b as server (no JSON:
/// perftest's tables); `extra` added.
fn perftest_server(pair: &VethPair, tool: &str, op: &str, port: u16, extra: &[&str]) -> Server {
    let child = pair
        .b
        .command(workspace_bin("xroce"))
        .args([
            tool,
            op,
            "--perftest",
            "-d",
            &pair.if_b,
            "-p",
            &port.to_string(),
        ])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start xroce perftest server");
    Server::new(child)
}

fn perftest_client(
    pair: &VethPair,
    tool: &str,
    op: &str,
    port: u16,
    host: &str,
    extra: &[&str],
) -> Output {
    pair.a
        .command(workspace_bin("xroce"))
        .args([
            tool,
            op,
            "--perftest",
            "-d",
            &pair.if_a,
            host,
            "-p",
            &port.to_string(),
        ])
        .args(extra)
        .output()
        .expect("run xroce perftest client")
}

/// The average bandwidth in the row after the first "#bytes" header that
/// has `BW average[unit]` and `marker` ("BW peak": perftest's table,
/// "verified": xroce's).
fn bw_average(text: &str, unit: &str, marker: &str) -> Option<f64> {
    let lines: Vec<&str> = text.lines().collect();
    let i = lines.iter().position(|l| {
        l.contains("#bytes") && l.contains(&format!("BW average[{unit}]")) && l.contains(marker)
    })?;
    let header: Vec<&str> = lines[i].split_whitespace().collect();
    let at = header.iter().position(|h| h.starts_with("average"))?;
    // Header words "BW" have no column of their own.
    let col = header[..at].iter().filter(|h| **h != "BW").count();
    lines[i + 1].split_whitespace().nth(col)?.parse().ok()
}

#[test]
fn report_gbits_switches_perftests_tables_to_gbits() {
    require_root();
    let _turn = serial();
    let pair = VethPair::new(1500);
    for gbits in [false, true] {
        let port = next_port();
        let extra: &[&str] = if gbits { &["--report_gbits"] } else { &[] };
        let srv = perftest_server(&pair, "bench", "write", port, extra);
        let mut args = vec!["-n", "2000", "-s", "16384"];
        args.extend(extra);
        let out = perftest_client(
            &pair,
            "bench",
            "write",
            port,
            &pair.addr_b.to_string(),
            &args,
        );
        let srv = srv.finish(Duration::from_secs(20));
        let text = ok(&out, "perftest client");
        let srv_text = String::from_utf8_lossy(&srv.stdout);
        // xroce's own table is in Gb/s either way: the same run's figure.
        let xroce_gbps = bw_average(&text, "Gb/sec", "verified").expect("xroce's table");
        let (unit, want) = if gbits {
            ("Gb/sec", xroce_gbps)
        } else {
            ("MB/sec", xroce_gbps * 1e9 / 8.0 / 1048576.0)
        };
        assert!(text.contains(&format!("BW peak[{unit}]")), "{text}");
        let ours = bw_average(&text, unit, "BW peak")
            .unwrap_or_else(|| panic!("no perftest table in {unit}: {text}"));
        assert!(
            (ours - want).abs() <= want * 0.02 + 0.01,
            "{unit}: perftest's table says {ours}, the run's rate is {want}: {text}"
        );
        // The server prints the client's report in the same unit.
        let theirs = bw_average(&srv_text, unit, "BW peak")
            .unwrap_or_else(|| panic!("server table in {unit}: {srv_text}"));
        assert!((theirs - ours).abs() < 0.011, "{srv_text}\n{text}");
        let other = if gbits { "MB/sec" } else { "Gb/sec" };
        assert!(!srv_text.contains(other), "{srv_text}");
    }
}

/// The address lines (and GID lines) a perftest-style run printed, as
/// (side, text after "address:" or "GID:").
fn address_lines(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut side = String::new();
    for l in text.lines() {
        if let Some((s, rest)) = l.split_once(" address: ") {
            side = s.trim().to_string();
            out.push((side.clone(), rest.trim().to_string()));
        } else if let Some(g) = l.strip_prefix(" GID: ") {
            out.push((format!("{side} GID"), g.trim().to_string()));
        }
    }
    out
}

fn lines_of(lines: &[(String, String)], side: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|(s, _)| s == side || *s == format!("{side} GID"))
        .map(|(_, l)| l.clone())
        .collect()
}

#[test]
fn gid_index_picks_the_source_address() {
    require_root();
    let _turn = serial();
    let pair = VethPair::new(1500);
    // A second address on b: the exchange runs to it, RoCE from GID 1 (b's first).
    let o = pair.addr_b.octets();
    let second = std::net::Ipv4Addr::new(o[0], o[1], o[2], 3);
    pair.b.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{second}/24"),
        "dev",
        &pair.if_b,
    ]);
    let gid_line = |ip: std::net::Ipv4Addr| {
        let b = ip.octets();
        format!(
            "00:00:00:00:00:00:00:00:00:00:255:255:{:02}:{:02}:{:02}:{:02}",
            b[0], b[1], b[2], b[3]
        )
    };
    for (x, want) in [(None, second), (Some("1"), pair.addr_b)] {
        let port = next_port();
        let mut extra = vec!["--listen".to_string(), format!("{second}:{port}")];
        if let Some(x) = x {
            extra.extend(["-x".to_string(), x.to_string()]);
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let srv = perftest_server(&pair, "bench", "write", port, &extra);
        let out = perftest_client(
            &pair,
            "bench",
            "write",
            port,
            &second.to_string(),
            &["-n", "200"],
        );
        let srv = srv.finish(Duration::from_secs(20));
        let text = ok(&out, "perftest client");
        assert!(
            srv.status.success(),
            "{}",
            String::from_utf8_lossy(&srv.stderr)
        );
        let lines = address_lines(&text);
        assert_eq!(
            lines_of(&lines, "remote GID"),
            vec![gid_line(want)],
            "-x {x:?}: {text}"
        );
        let srv_lines = address_lines(&String::from_utf8_lossy(&srv.stdout));
        assert_eq!(lines_of(&srv_lines, "local GID"), vec![gid_line(want)]);
    }
    // An index that is not there. (An IPv6 GID's index is a source like
    // any other now: tests/tests/bench_ipv6.rs runs RoCEv2 over IPv6.)
    let port = next_port();
    let err = perftest_client(&pair, "bench", "write", port, "127.0.0.1", &["-x", "9"]);
    let err = String::from_utf8_lossy(&err.stderr);
    assert!(
        err.contains(&format!(
            "-x 9: {} has no GID index 9; valid: 0 (fe80::",
            pair.if_a
        )) && err.contains(&format!("1 (::ffff:{})", pair.addr_a)),
        "{err}"
    );
}

/// Starts `xroce run ... -- PROGRAM ARGS` on the topology's server node.
fn debian_server(t: &Topology, program: &str, args: &[String]) -> Proc {
    t.start(t.server(), program, args)
}

/// `xroce <tool> <op> --perftest` on `node` of the topology.
fn xroce_proc(t: &Topology, server: bool, args: &[String]) -> Proc {
    let node = if server { t.server() } else { t.client() };
    let mut cmd = node.ns.command(workspace_bin("xroce"));
    cmd.args(args).args(["-d", node.iface]);
    Proc::spawn(cmd, format!("xroce {}", args.join(" ")), &t.dir.0)
}

fn finished_ok(f: &Finished) -> &str {
    assert!(
        f.status.is_some_and(|s| s.success()),
        "{} failed ({:?}): {}\n{}",
        f.what,
        f.status,
        f.stderr,
        f.stdout
    );
    &f.stdout
}

/// Each side's remote lines are the other's local lines, field for field.
fn cross_check(xroce: &str, debian: &str, qps: usize, fields: &[&str]) {
    let (x, d) = (address_lines(xroce), address_lines(debian));
    let (xl, xr) = (lines_of(&x, "local"), lines_of(&x, "remote"));
    let (dl, dr) = (lines_of(&d, "local"), lines_of(&d, "remote"));
    assert_eq!(xl.len(), 2 * qps, "xroce:\n{xroce}");
    assert_eq!(dl.len(), 2 * qps, "perftest:\n{debian}");
    assert_eq!(xr, dl, "xroce's remote lines vs perftest's local lines");
    assert_eq!(dr, xl, "perftest's remote lines vs xroce's local lines");
    // The same layout as perftest's own lines.
    let shape = |l: &str| {
        l.split_whitespace()
            .step_by(2)
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for l in xl.iter().chain(&xr).filter(|l| l.starts_with("LID")) {
        assert_eq!(shape(l), fields, "{l}");
    }
    // As printed by perftest: locals first, then remotes.
    let first_remote = xroce.find(" remote address:").expect("remote line");
    assert!(
        xroce.rfind(" local address:").unwrap() < first_remote,
        "{xroce}"
    );
}

#[test]
fn perftest_address_lines_match_debians_ib_write_bw_and_ib_read_bw() {
    require_root();
    let _turn = serial();
    let t = Topology::direct(Backend::AfXdp, 1500);
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();

    // ib_write_bw serves, xroce is its client (2 QPs).
    let port = next_port();
    let debian = debian_server(
        &t,
        "ib_write_bw",
        &s(&[
            "-x",
            "1",
            "-F",
            "-q",
            "2",
            "-n",
            "100",
            "-p",
            &port.to_string(),
        ]),
    );
    let mut debian = debian;
    wait_listening(t.server().ns, port, &mut debian, Duration::from_secs(30))
        .expect("ib_write_bw listens");
    let ours = xroce_proc(
        &t,
        false,
        &s(&[
            "bench",
            "write",
            "--perftest",
            "-q",
            "2",
            "-n",
            "100",
            "-p",
            &port.to_string(),
            &t.server().addr.to_string(),
        ]),
    )
    .finish(Duration::from_secs(60));
    let debian = debian.finish(Duration::from_secs(30));
    cross_check(
        finished_ok(&ours),
        finished_ok(&debian),
        2,
        &["LID", "QPN", "PSN", "RKey", "VAddr"],
    );

    // xroce serves, ib_read_bw is its client: the OUT field too.
    let port = next_port();
    let mut ours = xroce_proc(
        &t,
        true,
        &s(&[
            "bench",
            "read",
            "--perftest",
            "-n",
            "100",
            "-p",
            &port.to_string(),
        ]),
    );
    wait_listening(t.server().ns, port, &mut ours, Duration::from_secs(30)).expect("xroce listens");
    let debian = t
        .start(
            t.client(),
            "ib_read_bw",
            &s(&[
                "-x",
                "1",
                "-F",
                "-n",
                "100",
                "-p",
                &port.to_string(),
                &t.server().addr.to_string(),
            ]),
        )
        .finish(Duration::from_secs(60));
    let ours = ours.finish(Duration::from_secs(30));
    cross_check(
        finished_ok(&ours),
        finished_ok(&debian),
        1,
        &["LID", "QPN", "PSN", "OUT", "RKey", "VAddr"],
    );
}

/// The sizes of the result rows in perftest-style output.
fn row_sizes(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let size = w.next()?.parse().ok()?;
            let iters: u64 = w.next()?.parse().ok()?;
            (iters > 0).then_some(size)
        })
        .collect()
}

#[test]
fn perftest_all_sizes_against_debians_ib_write_bw_and_ib_write_lat() {
    require_root();
    let _turn = serial();
    let t = Topology::direct(Backend::AfXdp, 1500);
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();

    // ib_write_bw -a serves; xroce's client prints a row per size and hands
    // the last one to the server, which prints it.
    let port = next_port();
    let mut debian = debian_server(
        &t,
        "ib_write_bw",
        &s(&["-x", "1", "-F", "-a", "-n", "5", "-p", &port.to_string()]),
    );
    wait_listening(t.server().ns, port, &mut debian, Duration::from_secs(30))
        .expect("ib_write_bw listens");
    let ours = xroce_proc(
        &t,
        false,
        &s(&[
            "bench",
            "write",
            "--perftest",
            "-a",
            "-n",
            "5",
            "-p",
            &port.to_string(),
            &t.server().addr.to_string(),
        ]),
    )
    .finish(Duration::from_secs(120));
    let debian = debian.finish(Duration::from_secs(30));
    let (ours, debian) = (finished_ok(&ours), finished_ok(&debian));
    assert_eq!(row_sizes(ours), all_sizes(), "{ours}");
    assert_eq!(ours.matches("#bytes").count(), 1, "{ours}");
    assert_eq!(row_sizes(debian), vec![1 << 23], "{debian}");

    // xroce serves ib_write_lat -a: both print a row per size.
    let port = next_port();
    let mut ours = xroce_proc(
        &t,
        true,
        &s(&[
            "lat",
            "write",
            "--perftest",
            "-a",
            "-n",
            "5",
            "-p",
            &port.to_string(),
        ]),
    );
    wait_listening(t.server().ns, port, &mut ours, Duration::from_secs(30)).expect("xroce listens");
    let debian = t
        .start(
            t.client(),
            "ib_write_lat",
            &s(&[
                "-x",
                "1",
                "-F",
                "-a",
                "-n",
                "5",
                "-p",
                &port.to_string(),
                &t.server().addr.to_string(),
            ]),
        )
        .finish(Duration::from_secs(120));
    let ours = ours.finish(Duration::from_secs(30));
    let (ours, debian) = (finished_ok(&ours), finished_ok(&debian));
    assert_eq!(row_sizes(ours), all_sizes(), "{ours}");
    assert_eq!(row_sizes(debian), all_sizes(), "{debian}");

    // Send and atomics are refused with -a --perftest, naming the way out.
    let out = t
        .client()
        .ns
        .command(workspace_bin("xroce"))
        .args([
            "bench",
            "send",
            "--perftest",
            "-a",
            "-d",
            t.client().iface,
            "127.0.0.1",
        ])
        .output()
        .expect("run xroce");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("-a with --perftest runs write and read") && err.contains("pass one --size"),
        "{err}"
    );
}
