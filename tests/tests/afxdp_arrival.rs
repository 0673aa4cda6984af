//! Arrival times over real AF_XDP: two namespaces joined by veth, xroce's
//! XDP program attached on both ends by `NetDevice::open`. The program puts
//! its timestamp in front of every frame it redirects; the AF_XDP backend
//! hands it to the engine as `RxDatagram::arrived_ns`, on the engine's
//! clock (`xroce::runtime::now_ns`), and counts such frames in
//! `IoStats::rx_timestamped`.
//!
//! The receiver reads nothing until the program has redirected every
//! frame, so each frame's time must lie between the start and that moment,
//! well before the backend reads it: the time it waited on the ring is
//! not in it.
//!
//! Run under `flock /tmp/xroce-netns.lock` beside other namespace tests.

use std::{
    net::IpAddr,
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use xroce::{
    device::{NetDevice, NetDeviceConfig},
    io::{
        afxdp::{XskConfig, XskSocket},
        send_all, PacketIo,
    },
    runtime::now_ns,
    xdp,
};
use xroce_common::Counter;
use xroce_tests::{
    require_root,
    roce::{roce_frames, FrameSpec},
    spawn_in, VethPair,
};

/// Frames sent (fewer than the RX ring holds: none is dropped while the
/// receiver waits).
const N: u32 = 500;

#[test]
fn redirected_frames_carry_the_time_xdp_saw_them() {
    require_root();
    let pair = VethPair::new(3500);
    let (a_ip, b_ip): (IpAddr, IpAddr) = (pair.addr_a.into(), pair.addr_b.into());
    let barrier = Arc::new(Barrier::new(2));

    let (if_b, bar) = (pair.if_b.clone(), barrier.clone());
    let receiver = spawn_in(&pair.b.name, move || {
        let dev = NetDevice::open(&if_b, NetDeviceConfig::default()).expect("open b");
        let mut sock = XskSocket::open(&if_b, 0, XskConfig::default()).expect("AF_XDP on b");
        // Before anything can be sent: every arrival is later.
        let start = now_ns();
        bar.wait();
        // Wait for the program to have redirected (and so stamped) every
        // frame, reading none of them.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let redirected = xdp::read_counters(&if_b)
                .expect("XDP counters")
                .get(Counter::Redirected);
            if redirected >= N as u64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the XDP program redirected {redirected} of {N} frames"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let all_stamped = now_ns();
        // (arrived, read) per frame, in ring order; through the engine's
        // own path: parsed, ICRC checked.
        let mut got: Vec<(Option<u64>, u64)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < N as usize && Instant::now() < deadline {
            sock.recv_datagrams(Duration::from_millis(100), &mut |r| {
                let d = r.expect("a valid RoCEv2 datagram");
                got.push((d.arrived_ns, now_ns()));
            })
            .unwrap();
        }
        let io = PacketIo::stats(&mut sock);
        // Which of xroce's programs the kernel took decides where the
        // times are, or that there are none.
        let stamp = xroce_tests::arrival_stamp_here(&if_b);
        drop(sock);
        drop(dev);
        (start, all_stamped, got, io, stamp)
    });

    let (if_a, bar) = (pair.if_a.clone(), barrier);
    let sender = spawn_in(&pair.a.name, move || {
        let dev = NetDevice::open(&if_a, NetDeviceConfig::default()).expect("open a");
        let mut sock = XskSocket::open(&if_a, 0, XskConfig::default()).expect("AF_XDP on a");
        bar.wait();
        let peer_mac = dev
            .neighbour_mac(b_ip, Duration::from_secs(5))
            .expect("ARP for b");
        let frames = roce_frames(dev.mac(), peer_mac, a_ip, b_ip, N, |psn| FrameSpec {
            qpn: 0x11,
            psn,
            len: [0usize, 64, 1024, 2048][psn as usize % 4],
            ecn: 0,
            ip_id: 0,
        });
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let sent = send_all(&mut sock, &refs, Duration::from_secs(30)).expect("send");
        let deadline = Instant::now() + Duration::from_secs(30);
        while sock.tx_in_flight() > 0 && Instant::now() < deadline {
            sock.wait_writable(Duration::from_millis(5)).unwrap();
        }
        drop(sock);
        drop(dev);
        sent
    });

    let sent = sender.join().expect("sender");
    let (start, all_stamped, got, io, stamp) = receiver.join().expect("receiver");
    assert_eq!(sent, N as usize);
    assert_eq!(got.len(), N as usize, "frames received: {io:?}");
    assert_eq!(io.rx_frames, N as u64, "{io:?}");
    if stamp == xdp::ArrivalStamp::None {
        // The kernel refused both timestamping programs (a libxdp
        // dispatcher's component on kernels from 6.12 on): no frame may
        // claim a time.
        assert_eq!(io.rx_timestamped, 0, "{io:?}");
        assert!(got.iter().all(|(arrived, _)| arrived.is_none()));
        eprintln!("afxdp arrival: the kernel took xroce_xdp_plain: {N} frames, none stamped");
        return;
    }
    assert_eq!(
        io.rx_timestamped, N as u64,
        "every frame timestamped: {io:?}"
    );
    let mut last = 0;
    let mut waits = Vec::new();
    for (i, &(arrived, read)) in got.iter().enumerate() {
        let arrived = arrived.unwrap_or_else(|| panic!("frame {i} has no arrival time"));
        assert!(
            start <= arrived && arrived <= all_stamped,
            "frame {i}: arrived at {arrived} ns, outside [{start}, {all_stamped}]"
        );
        assert!(
            arrived <= read,
            "frame {i}: arrived {arrived} after read {read}"
        );
        // One RX queue: the program saw them in ring order.
        assert!(arrived >= last, "frame {i}: {arrived} before {last}");
        last = arrived;
        waits.push(read - arrived);
    }
    waits.sort_unstable();
    eprintln!(
        "afxdp arrival: {N} frames timestamped ({stamp:?}); waited on the ring {} us (median) to {} us",
        waits[waits.len() / 2] / 1000,
        waits[waits.len() - 1] / 1000,
    );
}
