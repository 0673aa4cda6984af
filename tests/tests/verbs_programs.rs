//! Debian's unmodified rdma-core programs over xroce's drop-in
//! libibverbs.so.1: `xroce run --iface IF --backend B -- PROGRAM` between two
//! namespaces joined by veth (servers in b, clients in a), on both backends.
//!
//! - ibv_devices, ibv_devinfo -v: the device is listed, its port active,
//!   GID 1 the IPv4-mapped address;
//! - ibv_rc_pingpong / ibv_ud_pingpong -g 1 (with -c: the receiver checks
//!   the data), several sizes, with and without -e;
//! - perftest -x 1 -F: ib_{write,read,send,atomic}_bw and
//!   ib_{write,read,send}_lat, with -a, -q 4, -D 2 and -e where the tool
//!   has them; both sides exit 0 without error lines, the result table has
//!   a bandwidth / latency;
//! - a capture of the traffic on the wire (a bridge in a third namespace:
//!   AF_XDP frames pass no tcpdump at either end), decoded by `xroce
//!   decode`: every frame RoCEv2 with a good ICRC, the expected opcodes;
//! - path MTU 4096 on a 9000-byte link.
//!
//! Each test runs all its cases and reports every failing one (first lines
//! of stderr, where the library explains failing verbs under
//! XROCE_VERBS_DEBUG). Tests take turns ([`serial`]): two pairs of
//! busy-polling programs on two cores would starve each other.

use std::time::Duration;

use xroce_tests::{
    per_backend,
    programs::{
        args, check_bw_table, check_lat_table, check_opcode_counts, decode, serial, Backend, Cases,
        Node, Topology,
    },
    require_root,
};

/// One program run: a minute is plenty.
const RUN: Duration = Duration::from_secs(60);
/// perftest -a walks 23 sizes up to 8 MiB.
const ALL_SIZES: Duration = Duration::from_secs(240);
/// Rows of perftest -a: 2 B .. 8 MiB.
const ALL_SIZES_ROWS: usize = 23;

/// `-g 1 -d xroce_IF` plus `extra`.
fn pingpong_args(node: Node<'_>, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["-g", "1", "-d", &node.device()]);
    a.extend(args(extra));
    a
}

/// `-x 1 -F -d xroce_IF` plus `extra`.
fn perftest_args(node: Node<'_>, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["-x", "1", "-F", "-d", &node.device()]);
    a.extend(args(extra));
    a
}

/// An ibv_{rc,ud}_pingpong pair: both exit 0 and print their totals, the
/// server's check (-c) found no bad page.
fn pingpong(
    t: &Topology,
    program: &str,
    extra: &[&str],
    timeout: Duration,
) -> Result<String, String> {
    let out = t.pair(
        program,
        &pingpong_args(t.server(), extra),
        &pingpong_args(t.client(), extra),
        timeout,
    );
    out.check_pingpong()
}

enum Table {
    Bw,
    Lat,
}

/// A perftest pair with `extra` on both sides; checks the client's table
/// (`rows` rows if given) and both sides' health. `want` must be on the
/// client's stdout too.
fn perftest(
    t: &Topology,
    program: &str,
    extra: &[&str],
    table: Table,
    rows: Option<usize>,
    want: &[&str],
    timeout: Duration,
) -> Result<String, String> {
    let out = t.pair(
        program,
        &perftest_args(t.server(), extra),
        &perftest_args(t.client(), extra),
        timeout,
    );
    let client = out.check()?;
    for w in want {
        if !client.stdout.contains(w) {
            return Err(format!("client stdout lacks {w:?}\n{}", client.describe()));
        }
    }
    match table {
        Table::Bw => check_bw_table(client, rows),
        Table::Lat => check_lat_table(client, rows),
    }
}

fn bw(t: &Topology, program: &str, extra: &[&str]) -> Result<String, String> {
    perftest(t, program, extra, Table::Bw, None, &[], RUN)
}

fn lat(t: &Topology, program: &str, extra: &[&str]) -> Result<String, String> {
    perftest(t, program, extra, Table::Lat, None, &[], RUN)
}

per_backend!(
    devices,
    rc_pingpong,
    ud_pingpong,
    bw_basic,
    bw_all_sizes,
    bw_duration_and_events,
    atomic_bw,
    latency,
    capture,
    mtu_4096,
);

fn devices(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("devices/{}", b.as_str()));
    for node in [t.server(), t.client()] {
        let dev = node.device();
        c.case(&format!("ibv_devices in {}", node.ns.name), || {
            let f = t.run(node, "ibv_devices", &[], RUN);
            f.check()?;
            let listed: Vec<&str> = f
                .stdout
                .lines()
                .skip(2)
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            if listed != [dev.as_str()] {
                return Err(format!(
                    "devices {listed:?}, expected [{dev}]\n{}",
                    f.describe()
                ));
            }
            Ok(f.stdout
                .lines()
                .nth(2)
                .unwrap_or_default()
                .trim()
                .to_string())
        });
        c.case(&format!("ibv_devinfo -v in {}", node.ns.name), || {
            let f = t.run(node, "ibv_devinfo", &args(&["-v"]), RUN);
            for want in [
                format!("hca_id:\t{dev}\n"),
                "PORT_ACTIVE (4)".to_string(),
                "link_layer:\t\tEthernet".to_string(),
                // The largest IB MTU a 1500-byte link carries.
                "active_mtu:\t\t1024 (3)".to_string(),
                format!("GID[  1]:\t\t::ffff:{}, RoCE v2", node.addr),
            ] {
                f.check_has(&want)?;
            }
            Ok(String::new())
        });
        c.case(&format!("ibv_devinfo -d {dev} in {}", node.ns.name), || {
            let f = t.run(node, "ibv_devinfo", &args(&["-d", &dev]), RUN);
            f.check_has("PORT_ACTIVE")?;
            Ok(String::new())
        });
    }
    c.finish();
}

fn rc_pingpong(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("rc_pingpong/{}", b.as_str()));
    for size in ["1", "1024", "4096"] {
        c.case(&format!("ibv_rc_pingpong -s {size} -n 100"), || {
            pingpong(&t, "ibv_rc_pingpong", &["-s", size, "-n", "100", "-c"], RUN)
        });
    }
    for size in ["1", "4096"] {
        c.case(&format!("ibv_rc_pingpong -e -s {size} -n 100"), || {
            pingpong(
                &t,
                "ibv_rc_pingpong",
                &["-e", "-s", size, "-n", "100", "-c"],
                RUN,
            )
        });
    }
    // Defaults: 4096 bytes, 1000 iterations, rx depth 500.
    c.case("ibv_rc_pingpong (defaults)", || {
        pingpong(&t, "ibv_rc_pingpong", &["-c"], RUN)
    });
    c.finish();
}

fn ud_pingpong(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("ud_pingpong/{}", b.as_str()));
    // ud_pingpong allows up to the active MTU (1024 here); its receive
    // buffers hold the 40-byte GRH in front of the payload.
    for size in ["1", "984", "1024"] {
        c.case(&format!("ibv_ud_pingpong -s {size} -n 100"), || {
            pingpong(&t, "ibv_ud_pingpong", &["-s", size, "-n", "100", "-c"], RUN)
        });
    }
    c.case("ibv_ud_pingpong -e -s 1024 -n 100", || {
        pingpong(
            &t,
            "ibv_ud_pingpong",
            &["-e", "-s", "1024", "-n", "100", "-c"],
            RUN,
        )
    });
    c.case("ibv_ud_pingpong -s 2048 refused (port MTU 1024)", || {
        let f = t.run(
            t.server(),
            "ibv_ud_pingpong",
            &pingpong_args(t.server(), &["-s", "2048"]),
            RUN,
        );
        if f.success()
            || !f
                .stderr
                .contains("Requested size larger than port MTU (1024)")
        {
            return Err(format!("expected the MTU refusal\n{}", f.describe()));
        }
        Ok(String::new())
    });
    c.finish();
}

fn bw_basic(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("bw_basic/{}", b.as_str()));
    for tool in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
        // perftest's default size (64 KiB), fewer iterations.
        c.case(&format!("{tool} -n 500"), || bw(&t, tool, &["-n", "500"]));
        c.case(&format!("{tool} -s 1 -n 1000"), || {
            bw(&t, tool, &["-s", "1", "-n", "1000"])
        });
        c.case(&format!("{tool} -q 4 -n 200"), || {
            bw(&t, tool, &["-q", "4", "-n", "200"])
        });
    }
    c.finish();
}

fn bw_all_sizes(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("bw_all_sizes/{}", b.as_str()));
    for tool in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
        // -a: 2 B .. 8 MiB; -n bounds the time (perftest's minimum is 5).
        c.case(&format!("{tool} -a -n 5"), || {
            perftest(
                &t,
                tool,
                &["-a", "-n", "5"],
                Table::Bw,
                Some(ALL_SIZES_ROWS),
                &[],
                ALL_SIZES,
            )
        });
    }
    c.finish();
}

fn bw_duration_and_events(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("bw_duration_and_events/{}", b.as_str()));
    for tool in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
        c.case(&format!("{tool} -D 2"), || bw(&t, tool, &["-D", "2"]));
    }
    // ib_write_bw has no -e.
    for tool in ["ib_read_bw", "ib_send_bw"] {
        c.case(&format!("{tool} -e -n 500"), || {
            bw(&t, tool, &["-e", "-n", "500"])
        });
    }
    c.case("ib_send_bw -e -q 4 -n 200", || {
        bw(&t, "ib_send_bw", &["-e", "-q", "4", "-n", "200"])
    });
    c.finish();
}

fn atomic_bw(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("atomic_bw/{}", b.as_str()));
    for kind in ["CMP_AND_SWAP", "FETCH_AND_ADD"] {
        c.case(&format!("ib_atomic_bw -A {kind} -n 1000"), || {
            bw(&t, "ib_atomic_bw", &["-A", kind, "-n", "1000"])
        });
        c.case(&format!("ib_atomic_bw -A {kind} -q 4 -n 200"), || {
            bw(&t, "ib_atomic_bw", &["-A", kind, "-q", "4", "-n", "200"])
        });
    }
    c.case("ib_atomic_bw -e -n 1000", || {
        bw(&t, "ib_atomic_bw", &["-e", "-n", "1000"])
    });
    c.case("ib_atomic_bw -D 2", || bw(&t, "ib_atomic_bw", &["-D", "2"]));
    c.finish();
}

fn latency(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("latency/{}", b.as_str()));
    for tool in ["ib_write_lat", "ib_read_lat", "ib_send_lat"] {
        // perftest's default size (2 bytes), fewer iterations.
        c.case(&format!("{tool} -n 300"), || lat(&t, tool, &["-n", "300"]));
        c.case(&format!("{tool} -s 4096 -n 100"), || {
            lat(&t, tool, &["-s", "4096", "-n", "100"])
        });
    }
    // -a: 2 B .. 8 MiB. ib_write_lat's responder sees each message only by
    // its last byte; ib_read_lat's reads span up to 8 MiB. (ib_send_lat -a
    // adds little over ib_send_bw -a and costs half a minute.)
    for tool in ["ib_write_lat", "ib_read_lat"] {
        c.case(&format!("{tool} -a -n 5"), || {
            perftest(
                &t,
                tool,
                &["-a", "-n", "5"],
                Table::Lat,
                Some(ALL_SIZES_ROWS),
                &[],
                ALL_SIZES,
            )
        });
    }
    // ib_write_lat has no -e (its responder polls memory).
    for tool in ["ib_read_lat", "ib_send_lat"] {
        c.case(&format!("{tool} -e -n 300"), || {
            lat(&t, tool, &["-e", "-n", "300"])
        });
    }
    c.finish();
}

/// Runs a bw tool while tcpdump listens on the bridge port facing the
/// server, then decodes the capture: every frame a RoCEv2 frame with a good
/// ICRC, and at least `n` frames of each (opcode-name prefix, n) expected.
/// `tool` between the two nodes captured on the bridge: every frame
/// RoCEv2 with a good ICRC, at least `expect` frames of each opcode
/// prefix and at most `at_most`.
fn captured_run(
    t: &Topology,
    tool: &str,
    extra: &[&str],
    expect: &[(&str, u64)],
    at_most: &[(&str, u64)],
) -> Result<String, String> {
    let (run, file, summary) = t.captured(&format!("{tool}.pcap"), || bw(t, tool, extra))?;
    let table = run?;
    let r = decode(&file)?;
    let ops = &r.opcodes_named;
    if r.roce == 0 {
        return Err(format!("no RoCEv2 frame captured ({summary}): {r:?}"));
    }
    if r.icrc_bad != 0 || r.malformed != 0 || r.not_roce != 0 || r.icrc_ok != r.roce {
        return Err(format!("bad frames on the wire ({summary}): {r:?}"));
    }
    check_opcode_counts(ops, expect, &summary)?;
    for (prefix, max) in at_most {
        let count: u64 = ops
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, c)| c)
            .sum();
        if count > *max {
            return Err(format!(
                "{count} {prefix}* frames, expected at most {max} ({summary}): {ops:?}"
            ));
        }
    }
    Ok(format!(
        "{table}; {summary}, all RoCEv2 with good ICRC, psn_gaps {}, {ops:?}",
        r.psn_gaps
    ))
}

fn capture(b: Backend) {
    require_root();
    let _turn = serial();
    // AF_XDP frames never pass tcpdump at either end; a bridge in a third
    // namespace carries them and the capture runs on its port.
    let mut t = Topology::bridged(b, 1500);
    let mut c = Cases::new(&format!("capture/{}", b.as_str()));
    // 100 messages of 16 KiB at path MTU 1024: 16 packets each. The two
    // drop-in libraries agree on selective repeat in band: from the first
    // ACK on every WRITE packet carries its own RETH (FIRST ... ONLY),
    // go-back-N's MIDDLE/LAST only before it.
    c.case(
        "ib_write_bw on the wire (selective repeat, agreed in band)",
        || {
            captured_run(
                &t,
                "ib_write_bw",
                &["-s", "16384", "-n", "100"],
                &[
                    ("RC_RDMA_WRITE_FIRST", 1400),
                    ("RC_RDMA_WRITE_ONLY", 90),
                    ("RC_ACKNOWLEDGE", 1),
                ],
                &[("RC_RDMA_WRITE_MIDDLE", 150), ("RC_RDMA_WRITE_LAST", 10)],
            )
        },
    );
    // XROCE_SELECTIVE_REPEAT=off on both sides: go-back-N, a RETH on each
    // message's first packet only.
    t.env.push(("XROCE_SELECTIVE_REPEAT".into(), "off".into()));
    c.case(
        "ib_write_bw on the wire (XROCE_SELECTIVE_REPEAT=off)",
        || {
            captured_run(
                &t,
                "ib_write_bw",
                &["-s", "16384", "-n", "100"],
                &[
                    ("RC_RDMA_WRITE_FIRST", 100),
                    ("RC_RDMA_WRITE_MIDDLE", 1400),
                    ("RC_RDMA_WRITE_LAST", 100),
                    ("RC_ACKNOWLEDGE", 1),
                ],
                &[("RC_RDMA_WRITE_ONLY", 0)],
            )
        },
    );
    t.env.clear();
    c.case("ib_read_bw on the wire", || {
        captured_run(
            &t,
            "ib_read_bw",
            &["-s", "16384", "-n", "100"],
            &[
                ("RC_RDMA_READ_REQUEST", 100),
                ("RC_RDMA_READ_RESPONSE_FIRST", 100),
                ("RC_RDMA_READ_RESPONSE_MIDDLE", 1400),
                ("RC_RDMA_READ_RESPONSE_LAST", 100),
            ],
            &[],
        )
    });
    c.case("ib_send_bw on the wire", || {
        captured_run(
            &t,
            "ib_send_bw",
            &["-s", "4096", "-n", "100"],
            &[
                ("RC_SEND_FIRST", 100),
                ("RC_SEND_MIDDLE", 200),
                ("RC_SEND_LAST", 100),
            ],
            &[],
        )
    });
    for (kind, opcode) in [
        ("CMP_AND_SWAP", "RC_COMPARE_SWAP"),
        ("FETCH_AND_ADD", "RC_FETCH_ADD"),
    ] {
        c.case(&format!("ib_atomic_bw -A {kind} on the wire"), || {
            captured_run(
                &t,
                "ib_atomic_bw",
                &["-A", kind, "-n", "100"],
                &[(opcode, 100), ("RC_ATOMIC_ACKNOWLEDGE", 100)],
                &[],
            )
        });
    }
    c.finish();
}

fn mtu_4096(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::direct(b, 9000);
    let mut c = Cases::new(&format!("mtu_4096/{}", b.as_str()));
    c.case("ibv_devinfo: active_mtu 4096", || {
        let f = t.run(t.server(), "ibv_devinfo", &args(&["-v"]), RUN);
        f.check_has("active_mtu:\t\t4096 (5)")?;
        Ok(String::new())
    });
    c.case("ibv_rc_pingpong -m 4096 -s 16384", || {
        pingpong(
            &t,
            "ibv_rc_pingpong",
            &["-m", "4096", "-s", "16384", "-n", "100", "-c"],
            RUN,
        )
    });
    for size in ["4056", "4096"] {
        c.case(&format!("ibv_ud_pingpong -s {size}"), || {
            pingpong(&t, "ibv_ud_pingpong", &["-s", size, "-n", "100", "-c"], RUN)
        });
    }
    for tool in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
        c.case(&format!("{tool} -n 300 at MTU 4096"), || {
            perftest(
                &t,
                tool,
                &["-n", "300"],
                Table::Bw,
                None,
                &["Mtu             : 4096[B]"],
                RUN,
            )
        });
    }
    c.case("ib_send_lat -s 8000 -n 200 at MTU 4096", || {
        perftest(
            &t,
            "ib_send_lat",
            &["-s", "8000", "-n", "200"],
            Table::Lat,
            None,
            &["Mtu             : 4096[B]"],
            RUN,
        )
    });
    c.finish();
}

/// The harness itself: a program that never ends (a server nobody connects
/// to) is killed by its PID after its timeout and reported as timed out;
/// `xroce run` and nsenter exec, so that PID is the program's own.
#[test]
fn a_hung_program_is_killed_after_its_timeout() {
    require_root();
    let _turn = serial();
    let t = Topology::direct(Backend::Udp, 1500);
    let server = t.server();
    let mut p = t.start(
        server,
        "ibv_rc_pingpong",
        &pingpong_args(
            server,
            &["-p", &xroce_tests::programs::next_port().to_string()],
        ),
    );
    let pid = p.pid();
    std::thread::sleep(Duration::from_millis(500));
    assert!(!p.exited(), "the server should wait for a client");
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert_eq!(
        comm.trim(),
        "ibv_rc_pingpong",
        "PID {pid} is not the program"
    );
    let f = p.finish(Duration::from_secs(2));
    assert!(f.status.is_none(), "{}", f.describe());
    assert!(f.describe().contains("TIMED OUT"), "{}", f.describe());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "PID {pid} still exists"
    );
}
