//! The XDP program in two network namespaces: RoCEv2 frames reach the AF_XDP
//! socket, malformed ones are dropped, everything else still works through
//! the kernel, and the counters (found through the interface) add up.

use std::{
    io::{Read, Write},
    net::{SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    process::Command,
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use xroce::io::afxdp::{XskConfig, XskSocket};
use xroce_common::Counter;
use xroce_tests::{
    datagram::{self as roce, set_tos, RC_SEND_ONLY as SEND_ONLY},
    in_netns, require_root, spawn_in, workspace_bin, VethPair,
};

const ROCE_FRAMES: usize = 5000;
/// Too short for a BTH and an ICRC.
const RUNT_FRAMES: usize = 10;
/// BTH opcode 0x1f: reserved in RC.
const BAD_OPCODE_FRAMES: usize = 7;

fn roce_payload(opcode: u8, qpn: u32, seq: u32) -> Vec<u8> {
    roce::payload(opcode, qpn, seq, 64)
}

/// Detaches the program when the test ends, however it ends.
struct Attached<'a> {
    pair: &'a VethPair,
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        let _ = self
            .pair
            .b
            .command(workspace_bin("xroce"))
            .args(["detach", "--iface", &self.pair.if_b])
            .output();
        let _ = std::fs::remove_dir_all(xroce::xdp::pin_dir(&self.pair.if_b));
    }
}

#[test]
fn roce_frames_reach_afxdp_and_other_traffic_passes() {
    require_root();
    let pair = VethPair::new(1500);
    let xroce = workspace_bin("xroce");
    pair.b.exec(&[
        xroce.to_str().unwrap(),
        "attach",
        "--iface",
        &pair.if_b,
        "--mode",
        "native",
    ]);
    let _attached = Attached { pair: &pair };

    let prog = Command::new("bpftool").args(["prog", "show"]).output();
    let prog = prog.expect("bpftool is missing; run `cargo xtask setup`");
    assert!(
        String::from_utf8_lossy(&prog.stdout).contains("xroce_xdp"),
        "bpftool prog show does not name xroce_xdp"
    );

    // ICMP first: it also resolves ARP before the UDP burst.
    pair.a.exec(&[
        "ping",
        "-c",
        "3",
        "-i",
        "0.2",
        "-W",
        "2",
        &pair.addr_b.to_string(),
    ]);

    // AF_XDP socket on queue 0 of the receiving veth, from inside namespace b.
    let (ready_tx, ready_rx) = mpsc::channel();
    let if_b = pair.if_b.clone();
    let receiver = spawn_in(&pair.b.name, move || {
        let mut socket = XskSocket::open(&if_b, 0, XskConfig::default()).expect("open AF_XDP");
        ready_tx.send(()).unwrap();
        let mut ours = 0usize;
        let mut other = 0usize;
        let deadline = Instant::now() + Duration::from_secs(30);
        while ours < ROCE_FRAMES && Instant::now() < deadline {
            socket
                .recv(100, |frame| {
                    if roce::is_ours(frame) {
                        ours += 1;
                    } else {
                        other += 1;
                    }
                })
                .expect("recv");
        }
        // Anything late (a duplicate, a malformed frame) would show up now.
        let _ = socket.recv(200, |_| other += 1);
        (ours, other, socket.stats().expect("xsk stats"))
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("AF_XDP socket did not open");

    // Senders in namespace a: RoCEv2 SEND ONLY frames (ECT(0)) in paced
    // bursts, then runts and frames with a reserved opcode.
    let dst = SocketAddrV4::new(pair.addr_b, xroce_common::ROCEV2_UDP_PORT);
    in_netns(&pair.a.name, move || {
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        set_tos(&udp, 2);
        for i in 0..ROCE_FRAMES {
            udp.send_to(&roce_payload(SEND_ONLY, 0x11, i as u32), dst)
                .unwrap();
            if i % 128 == 127 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        for i in 0..RUNT_FRAMES {
            udp.send_to(&roce_payload(SEND_ONLY, 0x11, i as u32)[..8], dst)
                .unwrap();
        }
        for i in 0..BAD_OPCODE_FRAMES {
            udp.send_to(&roce_payload(0x1f, 0x11, i as u32), dst)
                .unwrap();
        }
    });

    let (ours, other, xsk_stats) = receiver.join().unwrap();
    assert_eq!(ours, ROCE_FRAMES, "RoCEv2 frames delivered to AF_XDP");
    assert_eq!(other, 0, "frames that are not ours reached the socket");
    assert_eq!(
        xsk_stats.rx_dropped, 0,
        "socket dropped frames: {xsk_stats:?}"
    );

    // TCP through the kernel while the program is attached.
    let addr_b = pair.addr_b;
    let server = spawn_in(&pair.b.name, move || {
        let listener = TcpListener::bind((addr_b, 18515)).unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).unwrap();
        conn.write_all(&buf).unwrap();
    });
    let echoed = in_netns(&pair.a.name, move || {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut conn = loop {
            match TcpStream::connect((addr_b, 18515)) {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("TCP connect through XDP: {e}"),
            }
        };
        conn.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).unwrap();
        buf
    });
    server.join().unwrap();
    assert_eq!(&echoed, b"hello");

    let counters = pair.in_b(xroce::xdp::read_counters).expect("read counters");
    let get = |c| counters.get(c);
    assert_eq!(get(Counter::Roce), ROCE_FRAMES as u64, "{counters:?}");
    assert_eq!(get(Counter::Redirected), ROCE_FRAMES as u64, "{counters:?}");
    assert_eq!(
        get(Counter::Malformed),
        (RUNT_FRAMES + BAD_OPCODE_FRAMES) as u64,
        "{counters:?}"
    );
    assert_eq!(get(Counter::DropBadUdpLength), RUNT_FRAMES as u64);
    assert_eq!(get(Counter::DropBadOpcode), BAD_OPCODE_FRAMES as u64);
    assert_eq!(get(Counter::OpSend), ROCE_FRAMES as u64, "{counters:?}");
    assert_eq!(get(Counter::EcnEct0), ROCE_FRAMES as u64, "{counters:?}");
    assert_eq!(get(Counter::EcnCe), 0, "{counters:?}");
    assert_eq!(get(Counter::NoSocket), 0, "{counters:?}");
    // ICMP, TCP and ARP went to the kernel: at least the 3 echo requests,
    // 2 TCP segments from a (handshake ACK, data) and a's ARP request
    // (how many more ARP frames cross depends on the neighbour cache).
    const MUST_CROSS: u64 = 3 + 2 + 1;
    assert!(get(Counter::Passed) >= MUST_CROSS, "{counters:?}");
    assert_eq!(
        get(Counter::Seen),
        get(Counter::Redirected) + get(Counter::Passed) + get(Counter::Malformed),
        "every frame is redirected, passed or dropped: {counters:?}"
    );

    // `xroce stats` reads the same maps from another process.
    let out = pair.b.exec(&[
        xroce.to_str().unwrap(),
        "stats",
        "--iface",
        &pair.if_b,
        "--json",
    ]);
    let stats: xroce_report::StatsReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        stats.xdp["redirected"], ROCE_FRAMES as u64,
        "stats --json: {stats:?}"
    );
}

#[test]
fn qpn_filter_drops_frames_for_unregistered_qps() {
    require_root();
    let pair = VethPair::new(1500);
    let xroce = workspace_bin("xroce");
    pair.b
        .exec(&[xroce.to_str().unwrap(), "attach", "--iface", &pair.if_b]);
    let _attached = Attached { pair: &pair };
    pair.in_b(|i| xroce::xdp::set_qpn_filter(i, true)).unwrap();
    pair.in_b(|i| xroce::xdp::register_qpn(i, 0x123)).unwrap();
    pair.a
        .exec(&["ping", "-c", "1", "-W", "2", &pair.addr_b.to_string()]);

    let (ready_tx, ready_rx) = mpsc::channel();
    let if_b = pair.if_b.clone();
    let receiver = spawn_in(&pair.b.name, move || {
        let mut socket = XskSocket::open(&if_b, 0, XskConfig::default()).expect("open AF_XDP");
        ready_tx.send(()).unwrap();
        let mut qpns = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            socket
                .recv(100, |frame| {
                    let bth = &frame[42..54];
                    qpns.push(u32::from_be_bytes([0, bth[5], bth[6], bth[7]]));
                })
                .unwrap();
        }
        qpns
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let dst = SocketAddrV4::new(pair.addr_b, xroce_common::ROCEV2_UDP_PORT);
    in_netns(&pair.a.name, move || {
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..20 {
            let qpn = if i % 2 == 0 { 0x123 } else { 0x456 };
            udp.send_to(&roce_payload(SEND_ONLY, qpn, i), dst).unwrap();
        }
    });
    let qpns = receiver.join().unwrap();
    assert_eq!(
        qpns,
        vec![0x123; 10],
        "only the registered QP's frames arrive"
    );
    let counters = pair.in_b(xroce::xdp::read_counters).unwrap();
    assert_eq!(counters.get(Counter::DropUnknownQpn), 10, "{counters:?}");
    assert_eq!(counters.get(Counter::Malformed), 0, "{counters:?}");

    // Unregistering closes the door; turning the filter off opens it again.
    pair.in_b(|i| xroce::xdp::unregister_qpn(i, 0x123)).unwrap();
    pair.in_b(|i| xroce::xdp::set_qpn_filter(i, false)).unwrap();
}

#[test]
fn bad_input_gets_a_one_line_error() {
    require_root();
    let xroce = workspace_bin("xroce");
    let out = Command::new(&xroce)
        .args(["attach", "--iface", "nosuchif0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("does not exist"), "{err}");

    let out = Command::new(&xroce)
        .args(["stats", "--iface", "lo"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("xroce attach --iface lo"), "{err}");

    let out = Command::new(&xroce)
        .args(["attach", "--iface", "lo", "--mode", "turbo"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("native") && err.contains("skb"), "{err}");

    // Without root: setpriv drops to nobody.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&xroce)
        .args(["attach", "--iface", "lo"])
        .output()
        .expect("setpriv (util-linux) is missing");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("root"), "{err}");
}

/// A frame shorter than its IP header says (IPv4 total length, IPv6
/// payload length) is dropped as a bad IP header even though its UDP
/// length agrees with the IP header: the XDP program checks the IP lengths
/// against the frame itself, so the transport never gets bytes that were
/// not received.
#[test]
fn ip_length_beyond_the_frame_is_dropped() {
    require_root();
    let pair = VethPair::new(1500);
    let (v6_a, v6_b) = pair.add_ipv6();
    let xroce = workspace_bin("xroce");
    pair.b.exec(&[
        xroce.to_str().unwrap(),
        "attach",
        "--iface",
        &pair.if_b,
        "--mode",
        "native",
    ]);
    let _attached = Attached { pair: &pair };
    let mac_b = pair.in_b(xroce::device::interface_mac).expect("b's MAC");
    let if_a = pair.if_a.clone();
    let (addr_a, addr_b) = (pair.addr_a, pair.addr_b);
    const EACH: u64 = 5;
    in_netns(&pair.a.name, move || {
        let mac_a = xroce::device::interface_mac(&if_a).expect("a's MAC");
        for (src, dst) in [(addr_a.into(), addr_b.into()), (v6_a.into(), v6_b.into())] {
            // 100 bytes missing; an honest copy of the same frame follows
            // each, so the counters prove the program saw both.
            let lying = roce::frame_claiming_more(mac_b, mac_a, src, dst, 100);
            let honest = roce::frame_claiming_more(mac_b, mac_a, src, dst, 0);
            for _ in 0..EACH {
                roce::send_ethernet_frame(&if_a, &lying);
                roce::send_ethernet_frame(&if_a, &honest);
            }
        }
    });
    // Wait for the program to have seen all of them (an event, not a delay).
    let deadline = Instant::now() + Duration::from_secs(30);
    let counters = loop {
        let c = pair.in_b(xroce::xdp::read_counters).expect("read counters");
        if c.get(Counter::Roce) + c.get(Counter::Malformed) >= 4 * EACH || Instant::now() > deadline
        {
            break c;
        }
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(counters.get(Counter::DropBadIp), 2 * EACH, "{counters:?}");
    assert_eq!(counters.get(Counter::Malformed), 2 * EACH, "{counters:?}");
    assert_eq!(counters.get(Counter::Roce), 2 * EACH, "{counters:?}");
}
