//! One-frame ping-pong between two namespaces through each backend:
//! AF_XDP (interrupt mode and busy-poll) and the kernel UDP backend. Every
//! reply must come back with a valid ICRC; the half round-trip times are
//! printed (p50/p99) for comparison with sockperf's UDP ping-pong.

use std::{
    net::IpAddr,
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use xroce::{
    device::{self, NetDevice, NetDeviceConfig},
    io::{
        afxdp::{BusyPoll, XskConfig, XskSocket},
        udp::{UdpBackend, UdpConfig},
        PacketIo,
    },
};
use xroce_tests::{
    require_root,
    roce::{check_frame, roce_frames, FrameSpec},
    spawn_in, VethPair,
};

const ROUNDS: u32 = 2000;

#[derive(Clone, Copy)]
enum Kind {
    AfXdp,
    AfXdpBusyPoll,
    Udp,
}

fn open(kind: Kind, iface: &str, me: IpAddr) -> (Box<dyn PacketIo>, Option<NetDevice>) {
    match kind {
        Kind::Udp => {
            let mut cfg = UdpConfig::new(me);
            cfg.local_mac = device::interface_mac(iface).unwrap();
            (Box::new(UdpBackend::open(cfg).unwrap()), None)
        }
        Kind::AfXdp | Kind::AfXdpBusyPoll => {
            let dev = NetDevice::open(iface, NetDeviceConfig::default()).unwrap();
            let config = XskConfig {
                busy_poll: matches!(kind, Kind::AfXdpBusyPoll).then(BusyPoll::default),
                ..XskConfig::default()
            };
            let sock = XskSocket::open(iface, 0, config).unwrap();
            (Box::new(sock), Some(dev))
        }
    }
}

fn frames(mac: [u8; 6], peer_mac: [u8; 6], me: IpAddr, peer: IpAddr) -> Vec<Vec<u8>> {
    roce_frames(mac, peer_mac, me, peer, ROUNDS, |psn| FrameSpec {
        qpn: 0x51,
        psn,
        len: 8,
        ecn: 0,
        ip_id: 0,
    })
}

/// Returns the sorted half round-trip times in microseconds.
fn pingpong(kind: Kind) -> Vec<f64> {
    let pair = VethPair::new(1500);
    let (a_ip, b_ip): (IpAddr, IpAddr) = (pair.addr_a.into(), pair.addr_b.into());
    let barrier = Arc::new(Barrier::new(2));
    let (if_b, bar) = (pair.if_b.clone(), barrier.clone());
    let echo = spawn_in(&pair.b.name, move || {
        let (mut io, dev) = open(kind, &if_b, b_ip);
        bar.wait();
        let mac = device::interface_mac(&if_b).unwrap();
        let peer_mac = device::neighbour_mac(&if_b, a_ip, Duration::from_secs(5)).unwrap();
        let replies = frames(mac, peer_mac, b_ip, a_ip);
        let mut answered = 0;
        let mut bad = 0;
        let mut last_done = false;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !last_done && Instant::now() < deadline {
            let mut psns = [0u32; 64];
            let mut n = 0;
            io.recv_batch(Duration::from_millis(50), &mut |f| match check_frame(f) {
                Ok(c) if n < psns.len() => {
                    psns[n] = c.psn;
                    n += 1;
                }
                _ => bad += 1,
            })
            .unwrap();
            for &psn in &psns[..n] {
                let r: &[u8] = &replies[psn as usize];
                while io.send_batch(&[r]).unwrap() == 0 {
                    io.wait_writable(Duration::from_millis(1)).unwrap();
                }
                answered += 1;
                last_done |= psn == ROUNDS - 1;
            }
        }
        drop(dev);
        (answered, bad)
    });
    let if_a = pair.if_a.clone();
    let client = spawn_in(&pair.a.name, move || {
        let (mut io, dev) = open(kind, &if_a, a_ip);
        barrier.wait();
        let mac = device::interface_mac(&if_a).unwrap();
        let peer_mac = device::neighbour_mac(&if_a, b_ip, Duration::from_secs(5)).unwrap();
        let pings = frames(mac, peer_mac, a_ip, b_ip);
        // The echo side may still be resolving ARP: retry the first ping.
        let mut half_us = Vec::with_capacity(ROUNDS as usize);
        for (psn, ping) in pings.iter().enumerate() {
            let mut tries = 0;
            'retry: loop {
                let t0 = Instant::now();
                while io.send_batch(&[ping.as_slice()]).unwrap() == 0 {
                    io.wait_writable(Duration::from_millis(1)).unwrap();
                }
                let deadline = t0 + Duration::from_millis(if psn == 0 { 200 } else { 2000 });
                loop {
                    let mut hit = false;
                    let left = deadline.saturating_duration_since(Instant::now());
                    io.recv_batch(left.min(Duration::from_millis(50)), &mut |f| {
                        let c = check_frame(f).expect("reply with a valid ICRC");
                        hit |= c.psn == psn as u32;
                    })
                    .unwrap();
                    if hit {
                        half_us.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                        break 'retry;
                    }
                    if Instant::now() >= deadline {
                        tries += 1;
                        assert!(tries < 20, "no reply to PSN {psn}");
                        continue 'retry;
                    }
                }
            }
        }
        drop(dev);
        half_us
    });
    let mut half_us = client.join().expect("client");
    let (answered, bad) = echo.join().expect("echo");
    assert!(answered >= ROUNDS, "echo answered {answered}");
    assert_eq!(bad, 0);
    half_us.sort_by(|a, b| a.partial_cmp(b).unwrap());
    half_us
}

fn report(name: &str, v: &[f64]) {
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q) as usize];
    eprintln!(
        "latency {name}: 8-byte SEND frames, half round trip over {} rounds: p50 {:.1} us, \
         p99 {:.1} us, max {:.1} us",
        v.len(),
        p(0.5),
        p(0.99),
        v[v.len() - 1]
    );
}

#[test]
fn pingpong_latency_of_each_backend() {
    require_root();
    for (name, kind) in [
        ("afxdp", Kind::AfXdp),
        ("afxdp+busy-poll", Kind::AfXdpBusyPoll),
        ("udp", Kind::Udp),
    ] {
        let v = pingpong(kind);
        assert_eq!(v.len(), ROUNDS as usize);
        report(name, &v);
    }
}
