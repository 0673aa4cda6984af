//! The AF_XDP backend end to end: two namespaces joined by veth, xroce's XDP
//! program attached in native mode on both ends by `NetDevice::open`, RoCEv2
//! frames exchanged both ways through `XskSocket`s with their ICRC checked,
//! and the socket and XDP counters adding up.

use std::{
    net::IpAddr,
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use xroce::{
    device::{Attachment, NetDevice, NetDeviceConfig},
    io::{
        afxdp::{BusyPoll, BusyPollStatus, XskConfig, XskMultiQueue, XskSocket, XskStats},
        IoError, IoStats, PacketIo,
    },
    xdp::{self, ArrivalStamp, Mode},
};
use xroce_common::Counter;
use xroce_tests::{
    arrival_stamp_here, expected_stamped, require_root,
    roce::{assert_exchange, exchange, roce_frame, roce_frames, Exchange, FrameSpec},
    spawn_in, VethPair,
};

struct SideResult {
    exchange: Exchange,
    io: IoStats,
    xsk: XskStats,
    redirected: u64,
    no_socket: u64,
    peer_mac: [u8; 6],
    mac: [u8; 6],
    too_big: String,
    /// How the attached program stamps arrivals.
    stamp: ArrivalStamp,
}

#[allow(clippy::too_many_arguments)]
fn side(iface: String, me: IpAddr, peer: IpAddr, frames: u32, barrier: Arc<Barrier>) -> SideResult {
    let dev = NetDevice::open(&iface, NetDeviceConfig::default()).expect("open device");
    assert_eq!(
        dev.attachment(),
        &Attachment::Ours {
            mode: Mode::Native,
            fallback: None
        },
        "native XDP on veth"
    );
    assert_eq!(dev.ip().unwrap(), me);
    assert_eq!(dev.gid().unwrap(), xroce::io::wire::Gid::from(me));
    assert_eq!(dev.mtu(), 3500);
    assert_eq!(dev.path_mtu(), 2048);
    let config = XskConfig {
        frames: 8192,
        ..XskConfig::default()
    };
    let mut sock = XskSocket::open(&iface, 0, config).expect("open AF_XDP");
    assert!(!sock.zero_copy().unwrap(), "veth has no zero-copy AF_XDP");
    // Both sockets registered before anyone sends.
    barrier.wait();
    let peer_mac = dev
        .neighbour_mac(peer, Duration::from_secs(5))
        .expect("ARP for the peer");
    let sizes = [0usize, 1, 64, 511, 1024, 2048];
    let list = roce_frames(dev.mac(), peer_mac, me, peer, frames, |psn| FrameSpec {
        qpn: 0x11,
        psn,
        len: sizes[psn as usize % sizes.len()],
        ecn: (psn % 3) as u8,
        ip_id: 0,
    });
    let ex = exchange(
        &mut sock,
        &list,
        frames as usize,
        32,
        Duration::from_millis(1),
        Duration::from_secs(60),
    );
    // A frame larger than a UMEM chunk is refused with an explanation.
    let big = vec![0u8; XskConfig::default().max_frame_len() + 1];
    let too_big = match sock.send_batch(&[&big]) {
        Err(e @ IoError::FrameTooBig { .. }) => e.to_string(),
        other => panic!("oversized frame: {other:?}"),
    };
    let counters = xdp::read_counters(&iface).expect("XDP counters");
    let stamp = arrival_stamp_here(&iface);
    let io = PacketIo::stats(&mut sock);
    let xsk = sock.stats().expect("XDP_STATISTICS");
    drop(sock);
    let mac = dev.mac();
    drop(dev);
    assert!(
        !xdp::is_attached(&iface),
        "NetDevice detached what it attached"
    );
    SideResult {
        exchange: ex,
        io,
        xsk,
        redirected: counters.get(Counter::Redirected),
        no_socket: counters.get(Counter::NoSocket),
        peer_mac,
        mac,
        too_big,
        stamp,
    }
}

#[test]
fn afxdp_to_afxdp_both_directions_native() {
    require_root();
    const N: u32 = 4000;
    let pair = VethPair::new(3500);
    let barrier = Arc::new(Barrier::new(2));
    let (a_ip, b_ip): (IpAddr, IpAddr) = (pair.addr_a.into(), pair.addr_b.into());
    let (if_a, bar) = (pair.if_a.clone(), barrier.clone());
    let a = spawn_in(&pair.a.name, move || side(if_a, a_ip, b_ip, N, bar));
    let (if_b, bar) = (pair.if_b.clone(), barrier);
    let b = spawn_in(&pair.b.name, move || side(if_b, b_ip, a_ip, N, bar));
    let a = a.join().expect("side a");
    let b = b.join().expect("side b");
    assert_eq!(a.peer_mac, b.mac, "ARP found b's MAC");
    assert_eq!(b.peer_mac, a.mac, "ARP found a's MAC");
    for (name, r) in [("a", &a), ("b", &b)] {
        let got = assert_exchange(name, &r.exchange, N, &format!("xsk {:?}", r.xsk));
        for c in &got {
            assert_eq!(c.ecn, (c.psn % 3) as u8, "{name}: ECN kept");
            assert_eq!(c.qpn, 0x11);
        }
        assert_eq!(r.io.tx_frames, N as u64, "{name}: {:?}", r.io);
        assert_eq!(r.io.rx_frames, N as u64, "{name}: {:?}", r.io);
        // Every frame came with the XDP program's arrival time (none with
        // xroce_xdp_plain).
        assert_eq!(
            r.io.rx_timestamped,
            expected_stamped(r.stamp, N as u64),
            "{name}: {:?} {:?}",
            r.stamp,
            r.io
        );
        assert_eq!(r.xsk.rx_dropped, 0, "{name}: {:?}", r.xsk);
        assert_eq!(r.xsk.rx_ring_full, 0, "{name}: {:?}", r.xsk);
        assert_eq!(r.xsk.tx_invalid_descs, 0, "{name}: {:?}", r.xsk);
        assert_eq!(r.redirected, N as u64, "{name}: XDP redirected");
        assert_eq!(r.no_socket, 0, "{name}: frames before the socket was there");
        assert!(r.too_big.contains("multi-buffer"), "{}", r.too_big);
        eprintln!(
            "afxdp {name}: {} frames each way, {:.0} frames/s received (paced), {} TX kicks",
            N,
            N as f64 / r.exchange.seconds,
            r.io.tx_kicks
        );
    }
}

/// Unpaced: one side sends as fast as the TX ring allows; every frame the
/// XDP program redirected is either received or counted by the socket.
#[test]
fn afxdp_blast_is_accounted_for_and_measured() {
    require_root();
    const N: u32 = 50_000;
    let pair = VethPair::new(1500);
    let (a_ip, b_ip): (IpAddr, IpAddr) = (pair.addr_a.into(), pair.addr_b.into());
    let barrier = Arc::new(Barrier::new(2));

    let (if_b, bar) = (pair.if_b.clone(), barrier.clone());
    let receiver = spawn_in(&pair.b.name, move || {
        let dev = NetDevice::open(&if_b, NetDeviceConfig::default()).expect("open b");
        let mut io = XskMultiQueue::open(
            &if_b,
            XskConfig {
                busy_poll: Some(BusyPoll::default()),
                ..XskConfig::default()
            },
        )
        .expect("AF_XDP on every queue");
        assert_eq!(io.sockets().len(), 1, "veth has one RX queue");
        let busy = io.sockets()[0].busy_poll().clone();
        assert!(
            !matches!(busy, BusyPollStatus::Off),
            "busy poll was asked for"
        );
        bar.wait();
        let mut got = 0u64;
        let mut first = None;
        let mut last = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut idle_since = Instant::now();
        while Instant::now() < deadline {
            let n = io
                .recv_batch(Duration::from_millis(10), &mut |f| {
                    assert!(f.len() >= 60);
                })
                .unwrap();
            if n > 0 {
                first.get_or_insert_with(Instant::now);
                last = Instant::now();
                idle_since = last;
                got += n as u64;
            } else if got > 0 && idle_since.elapsed() > Duration::from_millis(500) {
                break;
            }
        }
        let counters = xdp::read_counters(&if_b).unwrap();
        let xsk = io.xsk_stats().unwrap();
        let secs = first.map_or(0.0, |f| (last - f).as_secs_f64());
        drop(io);
        drop(dev);
        (got, xsk, counters.get(Counter::Redirected), secs, busy)
    });

    let (if_a, bar) = (pair.if_a.clone(), barrier);
    let sender = spawn_in(&pair.a.name, move || {
        let dev = NetDevice::open(&if_a, NetDeviceConfig::default()).expect("open a");
        let mut sock = XskSocket::open(&if_a, 0, XskConfig::default()).unwrap();
        bar.wait();
        let peer_mac = dev.neighbour_mac(b_ip, Duration::from_secs(5)).unwrap();
        // 1024-byte payloads: 1100-byte frames.
        let frame = roce_frame(
            dev.mac(),
            peer_mac,
            a_ip,
            b_ip,
            FrameSpec {
                qpn: 7,
                psn: 1,
                len: 1024,
                ecn: 0,
                ip_id: 0,
            },
        );
        let start = Instant::now();
        let mut sent = 0u32;
        while sent < N {
            let want = (N - sent).min(64) as usize;
            let mut left = want;
            let n = sock
                .transmit(&mut |buf| {
                    if left == 0 {
                        return None;
                    }
                    left -= 1;
                    buf[..frame.len()].copy_from_slice(&frame);
                    Some(frame.len())
                })
                .unwrap();
            sent += n as u32;
            if n == 0 {
                sock.wait_writable(Duration::from_millis(5)).unwrap();
            }
        }
        // Let the last frames complete.
        while sock.tx_in_flight() > 0 && start.elapsed() < Duration::from_secs(30) {
            sock.wait_writable(Duration::from_millis(5)).unwrap();
        }
        let secs = start.elapsed().as_secs_f64();
        let stats = PacketIo::stats(&mut sock);
        drop(sock);
        drop(dev);
        (sent, secs, stats, frame.len())
    });
    let (sent, tx_secs, tx_stats, frame_len) = sender.join().expect("sender");
    let (got, xsk, redirected, rx_secs, busy) = receiver.join().expect("receiver");
    assert_eq!(sent, N);
    assert_eq!(tx_stats.tx_frames, N as u64);
    // Unpaced, veth may drop frames before XDP sees them (its per-queue
    // ring is small); what XDP redirected must all be accounted for.
    assert!(
        redirected <= N as u64 && redirected > 0,
        "redirected {redirected}"
    );
    assert_eq!(
        got + xsk.rx_ring_full + xsk.rx_dropped,
        redirected,
        "received + socket drops = redirected ({xsk:?})"
    );
    assert!(got > 0);
    eprintln!(
        "afxdp blast: {frame_len}-byte frames: sent {N} in {tx_secs:.3}s = {:.0} frames/s \
         ({:.2} Gb/s), {} kicks; XDP redirected {redirected}; received {got} at {:.0} frames/s; \
         socket drops {:?}; busy poll {busy:?}",
        N as f64 / tx_secs,
        N as f64 * frame_len as f64 * 8.0 / tx_secs / 1e9,
        tx_stats.tx_kicks,
        got as f64 / rx_secs.max(1e-9),
        xsk,
    );
}

/// RoCE path MTU 4096 over AF_XDP multi-buffer: an MTU 9000 veth, frames of
/// up to ~8 KB spread over 4 KB UMEM chunks both ways, ICRC checked.
#[test]
fn afxdp_multi_buffer_carries_path_mtu_4096_frames() {
    require_root();
    const N: u32 = 600;
    let sizes = [64usize, 2048, 4096, 8000];
    let pair = VethPair::new(9000);
    let (a_ip, b_ip): (IpAddr, IpAddr) = (pair.addr_a.into(), pair.addr_b.into());
    let barrier = Arc::new(Barrier::new(2));
    let run = move |iface: String, me: IpAddr, peer: IpAddr, bar: Arc<Barrier>| {
        let dev = NetDevice::open(&iface, NetDeviceConfig::default()).expect("open device");
        assert!(
            matches!(
                dev.attachment(),
                Attachment::Ours {
                    mode: Mode::Native,
                    ..
                }
            ),
            "native XDP at MTU 9000 (frags-aware program): {:?}",
            dev.attachment()
        );
        assert_eq!(dev.path_mtu(), 4096);
        let config = XskConfig {
            multi_buffer: true,
            ..XskConfig::default()
        };
        let mut sock = XskSocket::open(&iface, 0, config).expect("AF_XDP with XDP_USE_SG");
        assert!(sock.max_frame_len() >= 8000 + 80);
        bar.wait();
        let peer_mac = dev.neighbour_mac(peer, Duration::from_secs(5)).unwrap();
        let frames = roce_frames(dev.mac(), peer_mac, me, peer, N, |psn| FrameSpec {
            qpn: 0x41,
            psn,
            len: sizes[psn as usize % sizes.len()],
            ecn: 0,
            ip_id: 0,
        });
        let ex = exchange(
            &mut sock,
            &frames,
            N as usize,
            16,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        let xsk = sock.stats().unwrap();
        let io = PacketIo::stats(&mut sock);
        let stamp = arrival_stamp_here(&iface);
        drop(sock);
        drop(dev);
        (ex, xsk, io, stamp)
    };
    let (if_a, bar) = (pair.if_a.clone(), barrier.clone());
    let a = spawn_in(&pair.a.name, move || run(if_a, a_ip, b_ip, bar));
    let (if_b, bar) = (pair.if_b.clone(), barrier);
    let b = spawn_in(&pair.b.name, move || run(if_b, b_ip, a_ip, bar));
    for (name, (ex, xsk, io, stamp)) in [("a", a.join().unwrap()), ("b", b.join().unwrap())] {
        let got = assert_exchange(name, &ex, N, &format!("xsk {xsk:?}"));
        for c in &got {
            assert_eq!(c.len, sizes[c.psn as usize % sizes.len()], "{name}");
        }
        assert_eq!(xsk.rx_dropped, 0, "{name}: {xsk:?}");
        // Frames over several chunks too: the first one's metadata.
        assert_eq!(
            io.rx_timestamped,
            expected_stamped(stamp, N as u64),
            "{name}: {stamp:?} {io:?}"
        );
    }
}

/// A veth with two RX queues: `XskMultiQueue` finds both (ethtool, in the
/// namespace), registers a socket per queue, and receives the frames the
/// kernel spread over them.
#[test]
fn multi_queue_wrapper_receives_from_every_queue() {
    use std::net::UdpSocket;
    require_root();
    let pair = xroce_tests::VethPair::with_queues(1500, 2);
    let (a, b, if_b) = (&pair.a, &pair.b, pair.if_b.clone());
    let (addr_a, addr_b) = (pair.addr_a, pair.addr_b);
    const SOCKETS: u32 = 16;
    const EACH: u32 = 50;
    let barrier = Arc::new(Barrier::new(2));
    let bar = barrier.clone();
    let ifb = if_b.clone();
    let rx = spawn_in(&b.name, move || {
        assert_eq!(
            xroce::io::afxdp::rx_queue_count(&ifb),
            2,
            "ethtool channels"
        );
        let dev = NetDevice::open(&ifb, NetDeviceConfig::default()).unwrap();
        let mut io = XskMultiQueue::open(&ifb, XskConfig::default()).unwrap();
        assert_eq!(io.sockets().len(), 2);
        bar.wait();
        let mut got = 0u32;
        let deadline = Instant::now() + Duration::from_secs(20);
        while got < SOCKETS * EACH && Instant::now() < deadline {
            got += io
                .recv_batch(Duration::from_millis(20), &mut |f| {
                    assert!(f.len() > 42 + 12);
                })
                .unwrap() as u32;
        }
        let per_queue: Vec<u64> = io
            .sockets_mut()
            .iter_mut()
            .map(|s| PacketIo::stats(s).rx_frames)
            .collect();
        drop(io);
        drop(dev);
        (got, per_queue)
    });
    spawn_in(&a.name, move || {
        barrier.wait();
        let payload = roce_frame(
            [0; 6],
            [0; 6],
            addr_a.into(),
            addr_b.into(),
            FrameSpec {
                qpn: 3,
                psn: 0,
                len: 64,
                ecn: 0,
                ip_id: 0,
            },
        );
        // Many sockets: the kernel hashes each flow to a TX queue, and veth
        // delivers on the peer's RX queue of the same index.
        for _ in 0..SOCKETS {
            let s = UdpSocket::bind((addr_a, 0)).unwrap();
            for _ in 0..EACH {
                s.send_to(&payload[42..], (addr_b, 4791)).unwrap();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    })
    .join()
    .unwrap();
    let (got, per_queue) = rx.join().unwrap();
    assert_eq!(got, SOCKETS * EACH, "per queue {per_queue:?}");
    assert_eq!(per_queue.iter().sum::<u64>(), (SOCKETS * EACH) as u64);
    assert!(
        per_queue.iter().all(|&n| n > 0),
        "frames arrived on both queues: {per_queue:?}"
    );
    eprintln!("multi-queue: frames per RX queue {per_queue:?}");
}
