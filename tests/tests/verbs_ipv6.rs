//! RoCEv2 over IPv6 through the drop-in libibverbs between two namespaces:
//! GID 0 is the fe80 link-local GID, so `ibv_rc_pingpong -g 0` and
//! `ib_write_bw -x 0` connect over link-local IPv6. A bridge in a third
//! namespace carries the traffic and tcpdump on its port captures it
//! (AF_XDP frames pass no tcpdump at either end); every captured frame must
//! parse as RoCEv2 over IPv6 with a good ICRC between the two link-local
//! addresses, with the expected opcodes.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use xroce::io::wire::{parse_frame_checked, IpRepr};
use xroce_tests::{
    programs::{args, check_bw_table, check_opcode_counts, serial, Backend, Cases, Node, Topology},
    require_root,
};

const RUN: Duration = Duration::from_secs(60);

/// Waits until `node`'s link-local address has passed duplicate address
/// detection (the kernel answers neighbour solicitations only then).
fn wait_link_local(node: Node<'_>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = node
            .ns
            .command("ip")
            .args(["-6", "addr", "show", "dev", node.iface, "scope", "link"])
            .output()
            .map_err(|e| format!("ip -6 addr: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("inet6 fe80") && !text.contains("tentative") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{}: no usable link-local address: {text}",
                node.iface
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Opcode name -> count of a capture whose every frame must be RoCEv2 over
/// link-local IPv6 with a good ICRC.
fn ipv6_opcodes(file: &Path) -> Result<BTreeMap<String, u64>, String> {
    let packets = xroce::capture::read_packets(file).map_err(|e| format!("{e}"))?;
    let mut ops = BTreeMap::new();
    for (i, p) in packets.iter().enumerate() {
        let (f, _) = parse_frame_checked(&p.data)
            .map_err(|e| format!("frame {i}: not RoCEv2 with a good ICRC: {e}"))?;
        let IpRepr::V6(ip) = f.ip else {
            return Err(format!("frame {i} is not IPv6: {:?}", f.ip));
        };
        for a in [ip.src, ip.dst] {
            match IpAddr::from(a) {
                IpAddr::V6(v6) if v6.is_unicast_link_local() => {}
                other => return Err(format!("frame {i}: {other} is not link-local")),
            }
        }
        *ops.entry(f.transport.bth.opcode.name().to_string())
            .or_insert(0) += 1;
    }
    if ops.is_empty() {
        return Err("no RoCEv2 frame captured".into());
    }
    Ok(ops)
}

/// Runs `program` with `server`/`client` arguments under a capture and
/// checks at least `n` frames of every (opcode-name prefix, n).
fn captured(
    t: &Topology,
    program: &str,
    server: &[&str],
    client: &[&str],
    expect: &[(&str, u64)],
    check: impl FnOnce(&xroce_tests::programs::Finished) -> Result<String, String>,
) -> Result<String, String> {
    let (out, file, summary) = t.captured(&format!("{program}-ipv6.pcap"), || {
        t.pair(program, &args(server), &args(client), RUN)
    })?;
    let result = out.check().and_then(check)?;
    let ops = ipv6_opcodes(&file)?;
    check_opcode_counts(&ops, expect, &summary)?;
    Ok(format!(
        "{result}; {summary}, all IPv6 link-local, good ICRC: {ops:?}"
    ))
}

fn rocev2_over_ipv6(b: Backend) {
    require_root();
    let _turn = serial();
    let t = Topology::bridged(b, 1500);
    let mut c = Cases::new(&format!("ipv6/{}", b.as_str()));
    for node in [t.server(), t.client()] {
        if let Err(e) = wait_link_local(node) {
            panic!("{e}");
        }
    }
    let (sdev, cdev) = (t.server().device(), t.client().device());
    c.case("ibv_rc_pingpong -g 0 -s 4096 -n 100 -c", || {
        captured(
            &t,
            "ibv_rc_pingpong",
            &["-g", "0", "-d", &sdev, "-s", "4096", "-n", "100", "-c"],
            &["-g", "0", "-d", &cdev, "-s", "4096", "-n", "100", "-c"],
            &[
                ("RC_SEND_FIRST", 200),
                ("RC_SEND_LAST", 200),
                ("RC_ACKNOWLEDGE", 1),
            ],
            |f| {
                if f.stdout.contains("invalid data") {
                    return Err(format!("data check failed\n{}", f.describe()));
                }
                f.check_has(" iters in ")?;
                Ok(String::new())
            },
        )
    });
    c.case("ib_write_bw -x 0 -s 16384 -n 100", || {
        captured(
            &t,
            "ib_write_bw",
            &["-x", "0", "-F", "-d", &sdev, "-s", "16384", "-n", "100"],
            &["-x", "0", "-F", "-d", &cdev, "-s", "16384", "-n", "100"],
            // 16 packets per message; the two libraries agree on
            // selective repeat in band (over IPv6 too): from the first
            // ACK on every WRITE packet is a FIRST or an ONLY with its
            // own RETH.
            &[
                ("RC_RDMA_WRITE", 1600),
                ("RC_RDMA_WRITE_FIRST", 1400),
                ("RC_RDMA_WRITE_ONLY", 90),
                ("RC_ACKNOWLEDGE", 1),
            ],
            |f| check_bw_table(f, None),
        )
    });
    c.finish();
}

#[test]
fn afxdp() {
    rocev2_over_ipv6(Backend::AfXdp)
}

#[test]
fn udp() {
    rocev2_over_ipv6(Backend::Udp)
}
