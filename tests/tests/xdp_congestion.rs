//! The XDP congestion point and loss injection, programmed at run time with
//! `xroce ecn` / `xroce fault` from another process: a burst faster than
//! the virtual link builds a queue, ECN-capable frames get CE with a correct
//! IPv4 checksum, Not-ECT frames over the threshold are dropped, and loss
//! injection drops the configured share of the chosen traffic only.

use std::{
    net::{SocketAddrV4, UdpSocket},
    time::Duration,
};

use xroce_common::Counter;
use xroce_tests::{
    collect_frames,
    datagram::{self as roce, ipv4_checksum_ok, set_tos, RC_SEND_ONLY, RC_WRITE_ONLY},
    in_netns, require_root, AttachedXdp, VethPair,
};

/// Sends `n` datagrams of `len` bytes with `tos` from namespace `ns`.
fn blast(ns: &str, dst: SocketAddrV4, tos: i32, opcode: u8, n: u32, len: usize) {
    in_netns(ns, move || {
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        set_tos(&udp, tos);
        for i in 0..n {
            udp.send_to(&roce::payload(opcode, 0x11, i, len), dst)
                .unwrap();
        }
    })
}

fn ecn_bits(frame: &[u8]) -> u8 {
    frame[15] & 0b11
}

#[test]
fn burst_over_the_virtual_link_is_marked_then_dropped_when_not_ect() {
    require_root();
    let pair = VethPair::new(1500);
    let xdp = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    pair.a
        .exec(&["ping", "-c", "1", "-W", "2", &pair.addr_b.to_string()]);
    // 10 Mbit/s drains 1.25 bytes per microsecond: a back-to-back burst of
    // 1000-byte frames piles up far past K = 20 KB.
    xdp.xroce(&[
        "ecn",
        "--iface",
        &pair.if_b,
        "--link-rate",
        "10mbit",
        "--policy",
        "step",
        "--kmin",
        "20KB",
    ]);
    let dst = SocketAddrV4::new(pair.addr_b, xroce_common::ROCEV2_UDP_PORT);

    let rx = collect_frames(&pair.b.name, &pair.if_b, Duration::from_secs(5), |f| {
        f.len() >= 400
    });
    blast(&pair.a.name, dst, 2, RC_SEND_ONLY, 400, 1000);
    let frames = rx.join().unwrap();
    let ours: Vec<_> = frames.iter().filter(|f| roce::is_ours(f)).collect();
    assert_eq!(ours.len(), 400, "ECT(0) frames are marked, never dropped");
    let marked = ours.iter().filter(|f| ecn_bits(f) == 0b11).count();
    assert!(
        marked >= 300,
        "a 400 KB burst on a 10 Mbit/s link with K = 20 KB: {marked} of 400 marked"
    );
    assert!(marked < 400, "the first frames find an empty queue");
    for f in &ours {
        assert!(ipv4_checksum_ok(&f[14..34]), "IPv4 checksum after marking");
    }
    let c = pair.in_b(xroce::xdp::read_counters).unwrap();
    assert_eq!(c.get(Counter::EcnMarked), marked as u64, "{c:?}");
    assert_eq!(c.get(Counter::EcnEct0), 400, "{c:?}");

    // The queue is still far above K: Not-ECT frames are dropped, not marked.
    let rx = collect_frames(&pair.b.name, &pair.if_b, Duration::from_secs(2), |_| false);
    blast(&pair.a.name, dst, 0, RC_SEND_ONLY, 50, 1000);
    let late: Vec<_> = rx
        .join()
        .unwrap()
        .into_iter()
        .filter(|f| roce::is_ours(f))
        .collect();
    let c = pair.in_b(xroce::xdp::read_counters).unwrap();
    assert!(c.get(Counter::DropCongestion) > 0, "{c:?}");
    assert_eq!(
        late.len() as u64 + c.get(Counter::DropCongestion),
        50,
        "each Not-ECT frame is delivered or dropped: {c:?}"
    );
    assert!(
        late.iter().all(|f| ecn_bits(f) == 0),
        "Not-ECT is never marked"
    );

    // `xroce stats --json` from another process shows the settings and queue.
    let out = xdp.xroce(&["stats", "--iface", &pair.if_b, "--json"]);
    let stats: xroce_report::StatsReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats.ecn.policy, "step", "{stats:?}");
    assert_ne!(stats.ecn.queue_peak_bytes, 0, "{stats:?}");

    xdp.xroce(&["ecn", "--iface", &pair.if_b, "--off"]);
    assert_eq!(pair.in_b(xroce::xdp::ecn_config).unwrap().enabled, 0);
}

#[test]
fn loss_injection_drops_its_share_of_the_chosen_class_only() {
    require_root();
    let pair = VethPair::new(1500);
    let xdp = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    pair.a
        .exec(&["ping", "-c", "1", "-W", "2", &pair.addr_b.to_string()]);
    xdp.xroce(&[
        "fault", "--iface", &pair.if_b, "--drop", "0.3", "--opcode", "write", "--seed", "7",
    ]);
    let dst = SocketAddrV4::new(pair.addr_b, xroce_common::ROCEV2_UDP_PORT);
    // The last frame sent is SEND number 999.
    let rx = collect_frames(&pair.b.name, &pair.if_b, Duration::from_secs(5), |f| {
        f.last().is_some_and(|f| {
            roce::is_ours(f) && f[42] == RC_SEND_ONLY && f[58..62] == 999u32.to_be_bytes()
        })
    });
    // Paced so nothing but the injector can lose a frame.
    in_netns(&pair.a.name, move || {
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..1000u32 {
            for op in [RC_WRITE_ONLY, RC_SEND_ONLY] {
                udp.send_to(&roce::payload(op, 0x11, i, 64), dst).unwrap();
            }
            if i % 64 == 63 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let frames = rx.join().unwrap();
    let count = |op: u8| {
        frames
            .iter()
            .filter(|f| roce::is_ours(f) && f[42] == op)
            .count()
    };
    let (writes, sends) = (count(RC_WRITE_ONLY), count(RC_SEND_ONLY));
    assert_eq!(sends, 1000, "SENDs are not in the chosen class");
    assert!(
        (600..=800).contains(&writes),
        "30% of 1000 WRITEs dropped, {writes} arrived"
    );
    let c = pair.in_b(xroce::xdp::read_counters).unwrap();
    assert_eq!(c.get(Counter::DropFault), 1000 - writes as u64, "{c:?}");
    assert_eq!(c.get(Counter::Malformed), 0, "{c:?}");

    // Bad flags name the fix.
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", pair.b.name))
        .arg("--")
        .arg(xroce_tests::workspace_bin("xroce"))
        .args([
            "fault", "--iface", &pair.if_b, "--drop", "0.1", "--opcode", "bogus",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("send, write"), "{err}");
    xdp.xroce(&["fault", "--iface", &pair.if_b, "--off"]);
}
