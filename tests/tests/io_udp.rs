//! The kernel UDP backend against the AF_XDP backend on the other side of a
//! veth pair: the same RoCEv2 bytes on the wire both ways, ICRC verified on
//! both sides (the UDP side's ICRC covers the headers the kernel wrote; the
//! AF_XDP side's random IPv4 ids are recovered by the UDP side), ECN carried.

use std::{
    net::IpAddr,
    sync::{Arc, Barrier},
    time::Duration,
};

use xroce::{
    device::{self, NetDevice, NetDeviceConfig},
    io::{
        afxdp::{XskConfig, XskSocket},
        udp::{UdpBackend, UdpConfig, UdpStats},
        IoStats, PacketIo,
    },
    xdp,
};
use xroce_common::Counter;
use xroce_tests::{
    require_root,
    roce::{assert_exchange, exchange, roce_frame, roce_frames, Exchange, FrameSpec},
    spawn_in, VethPair,
};

const N: u32 = 3000;
const SIZES: [usize; 5] = [0, 3, 256, 1024, 1400];

/// The IPv4 id the AF_XDP side puts on frame `psn` (like rxe: mostly random).
fn xdp_ip_id(psn: u32) -> u16 {
    if psn.is_multiple_of(2) {
        0
    } else {
        (psn.wrapping_mul(40503) >> 3) as u16 | 1
    }
}

/// The UDP backend on `ip`:4791, sending with `iface`'s MAC (returned too).
fn udp_backend(iface: &str, ip: IpAddr) -> ([u8; 6], UdpBackend) {
    let mac = device::interface_mac(iface).unwrap();
    let mut cfg = UdpConfig::new(ip);
    cfg.local_mac = mac;
    let io = UdpBackend::open(cfg).unwrap_or_else(|e| panic!("bind {ip}:4791: {e}"));
    (mac, io)
}

fn ecn_of(psn: u32) -> u8 {
    [0u8, 1, 2, 3][psn as usize % 4]
}

#[test]
fn udp_backend_interoperates_with_afxdp() {
    require_root();
    let pair = VethPair::new(1500);
    let (a_ip, b_ip): (IpAddr, IpAddr) = (pair.addr_a.into(), pair.addr_b.into());
    let barrier = Arc::new(Barrier::new(2));

    // Side a: no XDP, the UDP backend on a_ip:4791.
    let (if_a, bar) = (pair.if_a.clone(), barrier.clone());
    let a = spawn_in(&pair.a.name, move || {
        let (mac, mut io) = udp_backend(&if_a, a_ip);
        bar.wait();
        // The engine addresses b by MAC; the kernel does its own ARP, but the
        // frame must still carry one.
        let peer_mac = device::neighbour_mac(&if_a, b_ip, Duration::from_secs(5)).unwrap();
        let frames = roce_frames(mac, peer_mac, a_ip, b_ip, N, |psn| FrameSpec {
            qpn: 0x21,
            psn,
            len: SIZES[psn as usize % SIZES.len()],
            ecn: ecn_of(psn),
            ip_id: 0,
        });
        let ex = exchange(
            &mut io,
            &frames,
            N as usize,
            32,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        let stats = PacketIo::stats(&mut io);
        (ex, stats, io.udp_stats(), mac)
    });

    // Side b: XDP attached natively, AF_XDP socket on queue 0.
    let (if_b, bar) = (pair.if_b.clone(), barrier);
    let b = spawn_in(&pair.b.name, move || {
        let dev = NetDevice::open(&if_b, NetDeviceConfig::default()).expect("open b");
        let mut sock = XskSocket::open(&if_b, 0, XskConfig::default()).unwrap();
        bar.wait();
        let peer_mac = dev.neighbour_mac(a_ip, Duration::from_secs(5)).unwrap();
        let frames = roce_frames(dev.mac(), peer_mac, b_ip, a_ip, N, |psn| FrameSpec {
            qpn: 0x31,
            psn,
            len: SIZES[psn as usize % SIZES.len()],
            ecn: ecn_of(psn),
            ip_id: xdp_ip_id(psn),
        });
        let ex = exchange(
            &mut sock,
            &frames,
            N as usize,
            32,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        let counters = xdp::read_counters(&if_b).unwrap();
        let stats = PacketIo::stats(&mut sock);
        let xsk = sock.stats().unwrap();
        drop(sock);
        drop(dev);
        (ex, stats, counters.get(Counter::Redirected), xsk, peer_mac)
    });

    let (a_ex, a_stats, a_udp, a_mac): (Exchange, IoStats, UdpStats, [u8; 6]) =
        a.join().expect("side a (udp)");
    let (b_ex, b_stats, b_redirected, b_xsk, b_peer_mac) = b.join().expect("side b (afxdp)");
    assert_eq!(b_peer_mac, a_mac);

    // a -> b: what the UDP backend put on the wire is valid RoCEv2 as seen
    // raw by AF_XDP: ICRC right for the kernel's headers, source port 4791,
    // IPv4 id 0, ECN carried by IP_TOS.
    let got = assert_exchange("b", &b_ex, N, &format!("{b_xsk:?}, a sent {a_stats:?}"));
    for c in &got {
        assert_eq!(c.udp_src_port, 4791, "the kernel's source port");
        assert_eq!(c.ip_id, 0, "unconnected socket with DF: IPv4 id 0");
        assert_eq!(c.ecn, ecn_of(c.psn), "ECN of PSN {}", c.psn);
        assert_eq!(c.len, SIZES[c.psn as usize % SIZES.len()]);
        assert_eq!(c.qpn, 0x21);
    }
    assert_eq!(b_redirected, N as u64);

    // b -> a: the UDP backend rebuilt frames whose ICRC holds, with the ids
    // the AF_XDP side used, ECN and the sender's UDP source port.
    let got = assert_exchange("a", &a_ex, N, &format!("{a_udp:?}, b sent {b_stats:?}"));
    let sport = xroce::io::wire::rocev2_src_port(0, 0x31 ^ 0x55, 0x31);
    for c in &got {
        assert_eq!(
            c.ip_id,
            xdp_ip_id(c.psn),
            "IPv4 id recovered for PSN {}",
            c.psn
        );
        assert_eq!(c.ecn, ecn_of(c.psn), "ECN from IP_RECVTOS, PSN {}", c.psn);
        assert_eq!(c.udp_src_port, sport);
        assert_eq!(c.qpn, 0x31);
    }
    assert_eq!(a_udp.ip_id_recovered, (N / 2) as u64, "{a_udp:?}");
    assert_eq!(a_udp.icrc_unmatched, 0, "{a_udp:?}");
    assert_eq!(a_udp.socket_drops, 0, "{a_udp:?}");
    assert_eq!(a_stats.tx_frames, N as u64, "{a_stats:?}");
    assert_eq!(a_stats.rx_frames, N as u64, "{a_stats:?}");
    assert_eq!(
        a_stats.rx_timestamped, N as u64,
        "every datagram came with a plausible receive timestamp: {a_stats:?}"
    );
    assert_eq!(a_stats.tx_errors, 0, "{a_stats:?}");
    assert_eq!(b_xsk.rx_dropped, 0, "{b_xsk:?}");
    eprintln!(
        "udp<->afxdp: {N} frames each way (paced): udp side received {:.0} frames/s with {} \
         sendmmsg calls; afxdp side received {:.0} frames/s",
        N as f64 / a_ex.seconds,
        a_stats.tx_kicks,
        N as f64 / b_ex.seconds,
    );
}

/// Unpaced UDP backend to UDP backend (no XDP anywhere): the rate of the
/// fallback path, with every datagram either received or counted.
#[test]
fn udp_backend_blast_rate() {
    require_root();
    const M: u32 = 50_000;
    let pair = VethPair::new(1500);
    let (a_ip, b_ip): (IpAddr, IpAddr) = (pair.addr_a.into(), pair.addr_b.into());
    let (a_drops0, b_drops0) = (
        link_drops(&pair.a.name, &pair.if_a),
        link_drops(&pair.b.name, &pair.if_b),
    );
    let softnet0 = softnet_drops();
    let rcvbuf0 = udp_rcvbuf_errors(&pair.b.name);
    let barrier = Arc::new(Barrier::new(2));
    let bar = barrier.clone();
    let rx = spawn_in(&pair.b.name, move || {
        let mut io = UdpBackend::open(UdpConfig::new(b_ip)).unwrap();
        bar.wait();
        let mut got = 0u64;
        let mut first = None;
        let mut last = std::time::Instant::now();
        let mut idle = std::time::Instant::now();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut bad = 0u64;
        while std::time::Instant::now() < deadline {
            let n = io
                .recv_batch(Duration::from_millis(10), &mut |f| {
                    if xroce::io::wire::icrc::verify_frame(f).is_err() {
                        bad += 1;
                    }
                })
                .unwrap();
            if n > 0 {
                first.get_or_insert_with(std::time::Instant::now);
                last = std::time::Instant::now();
                idle = last;
                got += n as u64;
            } else if got > 0 && idle.elapsed() > Duration::from_millis(500) {
                break;
            }
        }
        let secs = first.map_or(0.0, |f| (last - f).as_secs_f64());
        (got, bad, secs, io.udp_stats())
    });
    let if_a = pair.if_a.clone();
    let tx = spawn_in(&pair.a.name, move || {
        let mut io = UdpBackend::open(UdpConfig::new(a_ip)).unwrap();
        barrier.wait();
        // Resolve ARP first: datagrams queued behind an unresolved
        // neighbour can be dropped where no counter of ours sees them.
        device::neighbour_mac(&if_a, b_ip, Duration::from_secs(5)).unwrap();
        let frame = roce_frame(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            a_ip,
            b_ip,
            FrameSpec {
                qpn: 9,
                psn: 5,
                len: 1024,
                ecn: 0,
                ip_id: 0,
            },
        );
        let refs: Vec<&[u8]> = vec![&frame; 64];
        let start = std::time::Instant::now();
        let mut sent = 0u32;
        while sent < M {
            let k = ((M - sent) as usize).min(64);
            sent += io.send_batch(&refs[..k]).unwrap() as u32;
        }
        (
            start.elapsed().as_secs_f64(),
            PacketIo::stats(&mut io),
            frame.len(),
        )
    });
    let (tx_secs, tx_stats, len) = tx.join().unwrap();
    let (got, bad, rx_secs, udp) = rx.join().unwrap();
    assert_eq!(bad, 0, "every rebuilt frame has a valid ICRC");
    // An unpaced blast also loses frames in the kernel between the sockets:
    // the sending veth counts a full peer ring as tx_dropped, the receiver
    // rx_dropped, a full per-CPU backlog shows in softnet_stat, and a full
    // socket buffer after the last datagram read (SO_RXQ_OVFL only reports
    // with the next one) in the namespace's UDP RcvbufErrors. Every
    // frame must be received or counted as dropped somewhere.
    let kernel_drops = (link_drops(&pair.a.name, &pair.if_a) - a_drops0)
        + (link_drops(&pair.b.name, &pair.if_b) - b_drops0)
        + (softnet_drops() - softnet0)
        + (udp_rcvbuf_errors(&pair.b.name) - rcvbuf0);
    let accounted = got + udp.socket_drops + tx_stats.tx_errors;
    assert!(
        accounted <= M as u64 && accounted + kernel_drops >= M as u64,
        "received {got} + socket drops {} + send failures {} + kernel drops {kernel_drops} \
         must cover the {M} sent ({udp:?}, {tx_stats:?})",
        udp.socket_drops,
        tx_stats.tx_errors
    );
    eprintln!(
        "udp blast: {len}-byte frames: sent {M} in {tx_secs:.3}s = {:.0} frames/s ({:.2} Gb/s), \
         {} sendmmsg calls; received {got} at {:.0} frames/s; socket drops {}",
        M as f64 / tx_secs,
        M as f64 * len as f64 * 8.0 / tx_secs / 1e9,
        tx_stats.tx_kicks,
        got as f64 / rx_secs.max(1e-9),
        udp.socket_drops
    );
}

/// The same over IPv6 (GIDs are the addresses themselves): the UDP side's
/// ICRC over the kernel's IPv6 header, the AF_XDP side's UDP checksum
/// accepted by the kernel, traffic class (ECN) both ways, NDP lookups.
#[test]
fn udp_backend_interoperates_with_afxdp_over_ipv6() {
    require_root();
    const M: u32 = 1000;
    let pair = VethPair::new(1500);
    let (a_ip, b_ip) = pair.add_ipv6();
    let (a_ip, b_ip): (IpAddr, IpAddr) = (a_ip.into(), b_ip.into());
    let barrier = Arc::new(Barrier::new(2));
    let spec = |qpn: u32, psn: u32| FrameSpec {
        qpn,
        psn,
        len: SIZES[psn as usize % SIZES.len()],
        ecn: ecn_of(psn),
        ip_id: 0,
    };

    let (if_a, bar) = (pair.if_a.clone(), barrier.clone());
    let a = spawn_in(&pair.a.name, move || {
        let (mac, mut io) = udp_backend(&if_a, a_ip);
        bar.wait();
        let peer_mac = device::neighbour_mac(&if_a, b_ip, Duration::from_secs(5)).expect("NDP");
        let frames = roce_frames(mac, peer_mac, a_ip, b_ip, M, |psn| spec(0x22, psn));
        let ex = exchange(
            &mut io,
            &frames,
            M as usize,
            32,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        (ex, io.udp_stats())
    });
    let (if_b, bar) = (pair.if_b.clone(), barrier);
    let b = spawn_in(&pair.b.name, move || {
        let dev = NetDevice::open(&if_b, NetDeviceConfig::default()).expect("open b");
        assert!(dev.ipv6().contains(&match b_ip {
            IpAddr::V6(v6) => v6,
            _ => unreachable!(),
        }));
        let mut sock = XskSocket::open(&if_b, 0, XskConfig::default()).unwrap();
        bar.wait();
        let peer_mac = dev
            .neighbour_mac(a_ip, Duration::from_secs(5))
            .expect("NDP");
        assert_eq!(
            device::netlink_neighbour(dev.ifindex(), a_ip).unwrap(),
            Some(peer_mac),
            "rtnetlink NDP entry"
        );
        let frames = roce_frames(dev.mac(), peer_mac, b_ip, a_ip, M, |psn| spec(0x32, psn));
        let ex = exchange(
            &mut sock,
            &frames,
            M as usize,
            32,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        drop(sock);
        drop(dev);
        ex
    });
    let (a_ex, a_udp) = a.join().expect("udp side");
    let b_ex = b.join().expect("afxdp side");
    for (name, ex, qpn) in [("afxdp side", &b_ex, 0x22), ("udp side", &a_ex, 0x32)] {
        let got = assert_exchange(name, ex, M, "IPv6");
        for c in &got {
            assert_eq!(c.ecn, ecn_of(c.psn), "{name}: traffic class ECN");
            assert_eq!(c.qpn, qpn);
        }
    }
    assert!(b_ex
        .received
        .iter()
        .all(|c| c.as_ref().unwrap().udp_src_port == 4791));
    assert_eq!(a_udp.icrc_unmatched, 0, "{a_udp:?}");
}

/// rx_dropped + tx_dropped of `iface` in namespace `ns` (`ip -s -j link`).
fn link_drops(ns: &str, iface: &str) -> u64 {
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "-s", "-j", "link", "show", iface])
        .output()
        .expect("ip -s -j link");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j output");
    let s = &v[0]["stats64"];
    s["rx"]["dropped"].as_u64().unwrap_or(0) + s["tx"]["dropped"].as_u64().unwrap_or(0)
}

/// Frames dropped because a CPU's backlog was full, all CPUs
/// (/proc/net/softnet_stat, second column, hexadecimal).
fn softnet_drops() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
        .sum()
}

/// UDP RcvbufErrors of namespace `ns` (/proc/net/snmp read inside it).
fn udp_rcvbuf_errors(ns: &str) -> u64 {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{ns}"))
        .args(["--", "cat", "/proc/net/snmp"])
        .output()
        .expect("read /proc/net/snmp");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}
