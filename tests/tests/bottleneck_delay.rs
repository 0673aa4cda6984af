//! The delay bottleneck (xroce::bottleneck) on a bridge port, as the incast
//! experiment uses it: a sender namespace and a receiver namespace meet at
//! a bridge in a third; the TC program and tbf sit on the bridge's port
//! toward the receiver. A burst of UDP datagrams far faster than the link
//! must come out at the link's rate, each one late by the queue it found
//! over the rate (queue / rate, predicted from the send times alone);
//! ECN-capable RoCEv2-port datagrams are marked exactly when the queue they
//! find is over the step threshold, Not-ECT ones dropped there instead;
//! and once the bottleneck is dropped nothing of it stays on the port.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    sync::mpsc,
    time::Duration,
};

use xroce::bottleneck::{has_tbf, tcx_egress_programs, Bottleneck};
use xroce_common::congestion::EcnConfig;
use xroce_tests::{datagram::set_tos, in_netns, require_root, unique_tag, Netns};

/// 100 Mbit/s: 1442-byte frames leave every 115 us, far slower than the
/// sender can write them, and slow enough for a loaded 2-core machine to
/// time each one within a few percent of the queue's delay.
const RATE_BPS: u64 = 100_000_000;
/// UDP payload: frames of 14 + 20 + 8 + 1400 bytes.
const PAYLOAD: usize = 1400;
const FRAME: u64 = 14 + 20 + 8 + PAYLOAD as u64;
const PORT: u16 = 4791;
/// IPv6 addresses of the sender and the receiver.
const V6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, 1),
];

/// Sender, bridge and receiver namespaces; everything goes with them.
struct Lab {
    // Dropped in this order: the bottleneck before its namespace.
    sender: Netns,
    receiver: Netns,
    bridge: Netns,
    /// The bridge's port toward the receiver: the bottleneck's.
    port: String,
    sender_addr: Ipv4Addr,
    receiver_addr: Ipv4Addr,
}

impl Lab {
    fn new() -> Self {
        let tag = unique_tag();
        let lab = Lab {
            sender: Netns::new(format!("xbn{tag}s")),
            receiver: Netns::new(format!("xbn{tag}r")),
            bridge: Netns::new(format!("xbn{tag}b")),
            port: format!("xbn{tag}rb"),
            sender_addr: Ipv4Addr::new(10, 78, 0, 2),
            receiver_addr: Ipv4Addr::new(10, 78, 0, 1),
        };
        let br = format!("xbn{tag}br");
        lab.bridge
            .exec(&["ip", "link", "add", &br, "type", "bridge"]);
        lab.bridge.exec(&[
            "ip",
            "link",
            "set",
            &br,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ]);
        lab.bridge.exec(&["ip", "link", "set", &br, "up"]);
        let hosts = [
            (
                &lab.sender,
                format!("xbn{tag}s"),
                format!("xbn{tag}sb"),
                lab.sender_addr,
            ),
            (
                &lab.receiver,
                format!("xbn{tag}r"),
                lab.port.clone(),
                lab.receiver_addr,
            ),
        ];
        let mut macs = Vec::new();
        for (ns, iface, peer, addr) in &hosts {
            xroce_netns::add_veth(
                xroce_netns::VethEnd {
                    netns: &ns.name,
                    iface,
                },
                xroce_netns::VethEnd {
                    netns: &lab.bridge.name,
                    iface: peer,
                },
                1500,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            lab.bridge.exec(&["ip", "link", "set", peer, "master", &br]);
            lab.bridge.exec(&["ip", "link", "set", peer, "up"]);
            let cidr = format!("{addr}/24");
            ns.exec(&["ip", "addr", "add", &cidr, "dev", iface]);
            ns.exec(&["ip", "link", "set", iface, "up"]);
            let out = ns.exec(&["ip", "-o", "link", "show", "dev", iface]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let mac = text
                .split_whitespace()
                .skip_while(|w| *w != "link/ether")
                .nth(1)
                .unwrap_or_else(|| panic!("no MAC in {text}"));
            macs.push(mac.to_string());
        }
        // IPv6 too (no duplicate detection to wait for).
        for (i, (ns, iface, _, _)) in hosts.iter().enumerate() {
            let cidr = format!("{}/64", V6[i]);
            ns.exec(&["ip", "-6", "addr", "add", &cidr, "dev", iface, "nodad"]);
        }
        // Static neighbours: no ARP or NDP waiting behind the queue.
        for (i, (ns, iface, _, _)) in hosts.iter().enumerate() {
            let (other, mac) = (hosts[1 - i].3.to_string(), &macs[1 - i]);
            let other6 = V6[1 - i].to_string();
            ns.exec(&[
                "ip",
                "-6",
                "neigh",
                "replace",
                &other6,
                "lladdr",
                mac,
                "dev",
                iface,
                "nud",
                "permanent",
            ]);
            ns.exec(&[
                "ip",
                "neigh",
                "replace",
                &other,
                "lladdr",
                mac,
                "dev",
                iface,
                "nud",
                "permanent",
            ]);
        }
        lab
    }

    /// Puts the bottleneck on the bridge's port toward the receiver.
    fn bottleneck(&self, cfg: EcnConfig) -> Bottleneck {
        let port = self.port.clone();
        in_netns(&self.bridge.name, move || Bottleneck::attach(&port, cfg))
            .unwrap_or_else(|e| panic!("attach the bottleneck: {e:#?}"))
    }

    /// Whether the port still has tbf or any TCX egress program.
    fn port_clean(&self) -> (bool, usize) {
        let port = self.port.clone();
        in_netns(&self.bridge.name, move || {
            (
                !has_tbf(&port),
                tcx_egress_programs(&port).expect("query TCX"),
            )
        })
    }
}

/// One test of this file at a time: parallel bursts share the CPUs' input
/// queues (netdev_max_backlog), which then drop datagrams outside the
/// bottleneck.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// At most this many datagrams of a burst may be lost outside the
/// bottleneck (a busy host's input queues).
fn lost_ok(n: u32) -> u64 {
    n as u64 / 20
}

/// One received datagram.
#[derive(Clone, Copy, Debug)]
struct Rx {
    seq: u32,
    /// CLOCK_REALTIME at the sender just before sendto.
    sent_ns: u64,
    /// Whether sendto returned within [`SURE_NS`] of `sent_ns`: if not
    /// (the sender was preempted), when the datagram reached the bottleneck
    /// is not known, so its own delay and mark are not checked (it still
    /// counts in the queue others find).
    sure: bool,
    /// The kernel's CLOCK_REALTIME receive timestamp.
    rx_ns: u64,
    tos: u8,
}

fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32) {
    // SAFETY: an int option on a live socket.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        )
    };
    assert_eq!(
        rc,
        0,
        "setsockopt {level}/{name}: {}",
        std::io::Error::last_os_error()
    );
}

fn realtime_ns() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    d.as_nanos() as u64
}

/// Receives datagrams in `ns` until `n` arrived or 2 s pass without one;
/// tells `ready` once it listens.
fn receive(
    ns: &str,
    n: usize,
    v6: bool,
    ready: mpsc::Sender<()>,
) -> std::thread::JoinHandle<Vec<Rx>> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        in_netns(&ns, move || {
            let any: IpAddr = if v6 {
                Ipv6Addr::UNSPECIFIED.into()
            } else {
                Ipv4Addr::UNSPECIFIED.into()
            };
            let udp = UdpSocket::bind((any, PORT)).unwrap();
            let fd = udp.as_raw_fd();
            setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 32 << 20);
            setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);
            if v6 {
                setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1);
            } else {
                setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1);
            }
            udp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            ready.send(()).unwrap();
            let mut got = Vec::with_capacity(n);
            let mut buf = vec![0u8; 2048];
            let mut control = [0u64; 64];
            while got.len() < n {
                let mut iov = libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                };
                // SAFETY: msghdr is plain data; zero is a valid start.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = &mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = std::mem::size_of_val(&control);
                // SAFETY: buffers outlive the call.
                let len = unsafe { libc::recvmsg(fd, &mut msg, 0) };
                if len < 0 {
                    break; // the timeout: nothing more is coming
                }
                if len as usize != PAYLOAD || &buf[..4] != b"XBN1" {
                    continue;
                }
                let seq = u32::from_be_bytes(buf[4..8].try_into().unwrap());
                let sent_ns = u64::from_be_bytes(buf[8..16].try_into().unwrap());
                let (mut rx_ns, mut tos) = (0, 0xff);
                // SAFETY: walking the control messages the kernel wrote.
                unsafe {
                    let mut c = libc::CMSG_FIRSTHDR(&msg);
                    while !c.is_null() {
                        let data = libc::CMSG_DATA(c);
                        match ((*c).cmsg_level, (*c).cmsg_type) {
                            (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                                let ts = std::ptr::read_unaligned(data as *const libc::timespec);
                                rx_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
                            }
                            (libc::IPPROTO_IP, libc::IP_TOS) => tos = *data,
                            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                                tos = std::ptr::read_unaligned(data as *const i32) as u8
                            }
                            _ => {}
                        }
                        c = libc::CMSG_NXTHDR(&msg, c);
                    }
                }
                assert_ne!(rx_ns, 0, "no SO_TIMESTAMPNS on a datagram");
                got.push(Rx {
                    seq,
                    sent_ns,
                    sure: true,
                    rx_ns,
                    tos,
                });
            }
            got
        })
    })
}

/// Longest sendto for which a datagram's send time counts as its arrival
/// at the bottleneck (sendto carries it through the bridge to the qdisc).
const SURE_NS: u64 = 200_000;

/// Sends `n` datagrams back to back from `ns` to `dst` with TOS `tos`, each
/// carrying its sequence number and its send time; returns, by sequence,
/// when each sendto returned.
fn burst(ns: &str, dst: SocketAddr, tos: i32, n: u32) -> Vec<u64> {
    in_netns(ns, move || {
        // The burst must outrun the link. Beside CPU hogs on a 2-core
        // host the sender was preempted mid-burst for longer than the
        // queue took to drain, and too few datagrams left a busy queue to
        // time the link. A real-time thread keeps the burst whole: it
        // lasts a few milliseconds, and this thread ends with it.
        let param = libc::sched_param { sched_priority: 10 };
        // SAFETY: sets this thread's policy from a valid sched_param.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
        assert_eq!(
            rc,
            0,
            "SCHED_FIFO for the burst: {}",
            std::io::Error::last_os_error()
        );
        let udp = if dst.is_ipv6() {
            let udp = UdpSocket::bind("[::]:0").unwrap();
            setsockopt_int(udp.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_TCLASS, tos);
            udp
        } else {
            let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
            set_tos(&udp, tos);
            udp
        };
        setsockopt_int(
            udp.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            32 << 20,
        );
        let mut p = vec![0u8; PAYLOAD];
        p[..4].copy_from_slice(b"XBN1");
        let mut returned = Vec::with_capacity(n as usize);
        for seq in 0..n {
            p[4..8].copy_from_slice(&seq.to_be_bytes());
            p[8..16].copy_from_slice(&realtime_ns().to_be_bytes());
            udp.send_to(&p, dst).unwrap();
            returned.push(realtime_ns());
        }
        returned
    })
}

/// Runs one burst through the lab and returns what arrived, by sequence.
fn run_burst(lab: &Lab, tos: i32, n: u32) -> Vec<Rx> {
    run_burst_to(lab, SocketAddr::new(lab.receiver_addr.into(), PORT), tos, n)
}

fn run_burst_to(lab: &Lab, dst: SocketAddr, tos: i32, n: u32) -> Vec<Rx> {
    let (tx, rx) = mpsc::channel();
    let receiver = receive(&lab.receiver.name, n as usize, dst.is_ipv6(), tx);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the receiver did not start");
    let returned = burst(&lab.sender.name, dst, tos, n);
    let mut got = receiver.join().expect("receiver thread");
    got.sort_by_key(|r| r.seq);
    for r in &mut got {
        r.sure = returned[r.seq as usize].saturating_sub(r.sent_ns) <= SURE_NS;
    }
    let sure = got.iter().filter(|r| r.sure).count();
    assert!(
        sure * 10 >= got.len() * 8,
        "only {sure} of {} sendto calls returned within {SURE_NS} ns: the sender was \
         preempted too often to time the queue",
        got.len()
    );
    got
}

/// The link's departure recursion over the send times (a token bucket of
/// `burst` bytes, as tbf: the clock may lag real time by its transmission
/// time; a datagram leaves once the clock has sent its last bit): for each
/// datagram (in send order), the queue in bytes it finds and its predicted
/// one-way delay (the queue over the rate, plus its own transmission
/// beyond what the bucket still holds).
fn predict(sent: &[(u32, u64)], burst: u64) -> Vec<(u32, u64, f64)> {
    let tx_ns = FRAME as f64 * 8e9 / RATE_BPS as f64;
    let credit_ns = burst as f64 * 8e9 / RATE_BPS as f64;
    let mut clock = 0f64;
    sent.iter()
        .map(|&(seq, t)| {
            let t = t as f64;
            let queue = (clock - t).max(0.0) * RATE_BPS as f64 / 8e9;
            clock = clock.max(t - credit_ns) + tx_ns;
            (seq, queue as u64, (clock - t).max(0.0))
        })
        .collect()
}

/// The rate datagrams leave the bottleneck while its queue is busy: the
/// median, over pairs of arrivals half the burst apart with a queue in
/// front of every datagram between them (so they left back to back, after
/// the bucket's burst credit), of the bytes between them over the time
/// between their kernel receive timestamps. One late timestamp (a receive
/// softirq deferred on a busy host) moves a few pairs, not the median; the
/// span from the first to the last arrival would take it whole, and the
/// burst credit with it.
fn departure_rate_bps(got: &[Rx], predicted: &[(u32, u64, f64)]) -> f64 {
    let half = got.len() / 2;
    // idle_before[i]: datagrams in [0, i) that found no queue.
    let idle_before: Vec<usize> = std::iter::once(0)
        .chain(predicted.iter().scan(0, |idle, p| {
            *idle += usize::from(p.1 == 0);
            Some(*idle)
        }))
        .collect();
    let mut rates: Vec<f64> = (0..got.len() - half)
        .filter(|&i| idle_before[i + half + 1] == idle_before[i + 1])
        .map(|i| {
            let (a, b) = (&got[i], &got[i + half]);
            (b.seq - a.seq) as f64 * FRAME as f64 * 8e9 / (b.rx_ns - a.rx_ns) as f64
        })
        .collect();
    assert!(
        rates.len() > half / 2,
        "only {} pairs of arrivals {half} apart left a busy queue",
        rates.len()
    );
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

#[test]
fn burst_waits_queue_over_rate_and_leaves_at_the_link_rate() {
    require_root();
    let _one_at_a_time = serial();
    let lab = Lab::new();
    // Marking far above anything this burst queues: delays only.
    let bottleneck = lab.bottleneck(EcnConfig::step(RATE_BPS, 1 << 30, 0));
    const N: u32 = 300;
    let got = run_burst(&lab, 0, N);
    let state = bottleneck.sample().expect("read the queue").state;
    // The bottleneck drops nothing here; the host may lose a few.
    assert!(
        got.len() as u64 + lost_ok(N) >= N as u64,
        "{} of {N} arrived",
        got.len()
    );
    assert!(state.enqueued_packets >= got.len() as u64, "{state:?}");
    assert_eq!((state.dropped_tail, state.marked), (0, 0), "{state:?}");

    // Delay: measured one-way delay against queue / rate.
    let sent: Vec<(u32, u64)> = got.iter().map(|r| (r.seq, r.sent_ns)).collect();
    let predicted = predict(&sent, bottleneck.burst_bytes());
    let mut errors = Vec::new();
    let mut off = Vec::new();
    for (r, (_, queue, want_ns)) in got.iter().zip(&predicted) {
        let measured = (r.rx_ns - r.sent_ns) as f64;
        // Datagrams behind at least 5 ms of queue: host noise of a few
        // hundred us is then well inside the 10 %.
        if *want_ns < 5e6 || !r.sure {
            continue;
        }
        let err = (measured - want_ns) / want_ns;
        if err.abs() >= 0.10 {
            off.push(format!(
                "datagram {} found {queue} B queued: predicted {:.2} ms, measured {:.2} ms",
                r.seq,
                want_ns / 1e6,
                measured / 1e6
            ));
        }
        errors.push(err.abs());
    }
    let checked = errors.len();
    assert!(
        checked > N as usize / 2,
        "only {checked} datagrams (with a known arrival) queued 5 ms: the sender \
         did not outrun the link"
    );
    errors.sort_by(f64::total_cmp);
    // A softirq deferred under load may still hold a datagram back after
    // its sendto returned: a few may miss, the bulk may not.
    assert!(
        off.len() * 50 <= checked,
        "{} of {checked} datagrams off by 10 % or more: {off:#?}",
        off.len()
    );
    let (median, worst) = (errors[checked / 2], errors[checked - 1]);
    assert!(median < 0.05, "median delay error {:.1} %", median * 100.0);
    let last = predicted.last().unwrap();
    let last_measured = (got.last().unwrap().rx_ns - got.last().unwrap().sent_ns) as f64;
    // The program's own largest sojourn matches too.
    let peak = state.peak_delay_ns as f64;
    let want_peak = got
        .iter()
        .zip(&predicted)
        .filter(|(r, _)| r.sure)
        .map(|(_, p)| p.2)
        .fold(0.0, f64::max);
    assert!(
        (peak - want_peak).abs() / want_peak < 0.10,
        "peak sojourn {peak} ns, predicted {want_peak:.0}"
    );

    let rate = departure_rate_bps(&got, &predicted);
    let rate_err = (rate - RATE_BPS as f64) / RATE_BPS as f64;
    assert!(
        rate_err.abs() < 0.10,
        "departures at {:.2} Mbit/s, link {} Mbit/s",
        rate / 1e6,
        RATE_BPS / 1_000_000
    );
    eprintln!(
        "bottleneck_delay: {checked} datagrams behind >= 5 ms of queue, delay error median {:.2} %, \
         worst {:.2} %; \
         last: queue {} B, predicted {:.2} ms, measured {:.2} ms; departures {:.3} Mbit/s ({:+.2} %)",
        median * 100.0,
        worst * 100.0,
        last.1,
        last.2 / 1e6,
        last_measured / 1e6,
        rate / 1e6,
        rate_err * 100.0
    );

    drop(bottleneck);
    assert_eq!(lab.port_clean(), (true, 0), "tbf or the TC program stayed");
}

#[test]
fn marks_ect_and_drops_not_ect_at_the_threshold() {
    require_root();
    let _one_at_a_time = serial();
    let lab = Lab::new();
    const K: u64 = 100_000;
    let bottleneck = lab.bottleneck(EcnConfig::step(RATE_BPS, K, 0));
    const N: u32 = 200;
    // ECT(0): every datagram arrives; CE exactly on those that found more
    // than K queued (a margin of 3 frames for the time between the sender's
    // clock read and the bottleneck's).
    let got = run_burst(&lab, 2, N);
    assert!(
        got.len() as u64 + lost_ok(N) >= N as u64,
        "{} of {N} arrived",
        got.len()
    );
    let lost = N as u64 - got.len() as u64;
    let sent: Vec<(u32, u64)> = got.iter().map(|r| (r.seq, r.sent_ns)).collect();
    let predicted = predict(&sent, bottleneck.burst_bytes());
    let margin = 3 * FRAME;
    let (mut marked, mut clear, mut missed) = (0, 0, Vec::new());
    for (r, (_, queue, _)) in got.iter().zip(&predicted) {
        let ce = r.tos & 0b11 == 0b11;
        // Arriving later than sent only shortens the queue found: a mark
        // below K is always wrong, a missing one above K only when the
        // datagram's arrival is known (and then rare under load).
        if *queue + margin < K {
            assert!(!ce, "datagram {} found {queue} B < K and was marked", r.seq);
        } else if *queue > K + margin && !ce && r.sure {
            missed.push(format!(
                "datagram {} found {queue} B > K, not marked",
                r.seq
            ));
        }
        if ce {
            marked += 1;
        } else {
            assert_eq!(r.tos & 0b11, 0b10, "ECT(0) kept on unmarked datagrams");
            clear += 1;
        }
    }
    assert!(missed.len() * 50 <= got.len(), "{missed:#?}");
    let state = bottleneck.sample().unwrap().state;
    assert!(
        state.marked >= marked && state.marked <= marked + lost,
        "{marked} arrived marked: {state:?}"
    );
    assert!(marked > 50 && clear > 50, "marked {marked}, clear {clear}");

    // Not-ECT: over K dropped instead; what arrives found at most K.
    std::thread::sleep(Duration::from_millis(100)); // the queue drains
    let got = run_burst(&lab, 0, N);
    let state = bottleneck.sample().unwrap().state;
    let passed = got.len() as u64;
    let lost = (N as u64 - passed).saturating_sub(state.dropped_congestion);
    assert!(lost <= lost_ok(N), "{passed} arrived: {state:?}");
    assert!(passed < N as u64 && passed > K / FRAME, "{passed} arrived");
    assert!(
        got.iter().all(|r| r.tos & 0b11 == 0),
        "Not-ECT never marked"
    );
    eprintln!(
        "bottleneck_delay: step K {K} B: ECT(0) {marked} marked, {clear} not; \
         Not-ECT {passed} of {N} passed, {} dropped",
        state.dropped_congestion
    );

    drop(bottleneck);
    assert_eq!(lab.port_clean(), (true, 0), "tbf or the TC program stayed");
}

/// IPv6: the traffic class's ECN bits get CE (no header checksum to fix)
/// on exactly the datagrams that found more than K queued.
#[test]
fn marks_ipv6_at_the_threshold() {
    require_root();
    let _one_at_a_time = serial();
    let lab = Lab::new();
    const K: u64 = 100_000;
    const FRAME6: u64 = FRAME + 20;
    let bottleneck = lab.bottleneck(EcnConfig::step(RATE_BPS, K, 0));
    const N: u32 = 200;
    let got = run_burst_to(&lab, SocketAddr::new(V6[1].into(), PORT), 2, N);
    assert!(
        got.len() as u64 + lost_ok(N) >= N as u64,
        "{} of {N} arrived",
        got.len()
    );
    let lost = N as u64 - got.len() as u64;
    // The queue each found, from the send times (frames 20 bytes longer).
    let credit_ns = bottleneck.burst_bytes() as f64 * 8e9 / RATE_BPS as f64;
    let tx_ns = FRAME6 as f64 * 8e9 / RATE_BPS as f64;
    let mut clock = 0f64;
    let (mut marked, mut missed) = (0, 0);
    for r in &got {
        let t = r.sent_ns as f64;
        let queue = ((clock - t).max(0.0) * RATE_BPS as f64 / 8e9) as u64;
        clock = clock.max(t - credit_ns) + tx_ns;
        let ce = r.tos & 0b11 == 0b11;
        if queue + 3 * FRAME6 < K {
            assert!(!ce, "datagram {} found {queue} B < K and was marked", r.seq);
        } else if queue > K + 3 * FRAME6 && !ce && r.sure {
            missed += 1;
        }
        if ce {
            marked += 1;
        } else {
            assert_eq!(r.tos & 0b11, 0b10, "ECT(0) kept on unmarked datagrams");
        }
    }
    assert!(missed * 50 <= got.len(), "{missed} not marked above K");
    let state = bottleneck.sample().unwrap().state;
    assert_eq!(
        state.dropped_congestion + state.dropped_tail,
        0,
        "{state:?}"
    );
    assert!(
        state.marked >= marked && state.marked <= marked + lost,
        "{marked} arrived marked: {state:?}"
    );
    assert!(marked > 50, "only {marked} marked");
    eprintln!("bottleneck_delay: IPv6, step K {K} B: {marked} of {N} marked");
    drop(bottleneck);
    assert_eq!(lab.port_clean(), (true, 0), "tbf or the TC program stayed");
}

/// A full buffer drops (any packet, ECN or not), and only the program
/// does: tbf's own drop counter stays at zero.
#[test]
fn tail_drops_at_the_buffer_and_only_there() {
    require_root();
    let _one_at_a_time = serial();
    let lab = Lab::new();
    const BUFFER: u64 = 60_000;
    // Marking beyond the buffer: only the buffer acts.
    let bottleneck = lab.bottleneck(EcnConfig::step(RATE_BPS, BUFFER, BUFFER));
    const N: u32 = 200;
    let got = run_burst(&lab, 2, N);
    let state = bottleneck.sample().unwrap().state;
    let passed = got.len() as u64;
    assert!(state.dropped_tail > 0, "{state:?}");
    let lost = (N as u64 - passed).saturating_sub(state.dropped_tail);
    assert!(lost <= lost_ok(N), "{passed} arrived: {state:?}");
    // What got in fits the buffer (plus what drained while the burst came).
    assert!(state.peak_bytes <= BUFFER, "{state:?}");
    assert!(got.iter().all(|r| r.tos & 0b11 == 0b10), "nothing marked");
    let port = lab.port.clone();
    let stats = in_netns(&lab.bridge.name, move || {
        let out = std::process::Command::new("tc")
            .args(["-s", "qdisc", "show", "dev", &port, "root"])
            .output()
            .expect("tc -s qdisc show");
        String::from_utf8_lossy(&out.stdout).into_owned()
    });
    assert!(stats.contains("qdisc tbf"), "{stats}");
    assert!(stats.contains("dropped 0,"), "tbf dropped packets: {stats}");
    eprintln!(
        "bottleneck_delay: buffer {BUFFER} B: {passed} of {N} passed, {} tail-dropped, peak {} B",
        state.dropped_tail, state.peak_bytes
    );
    drop(bottleneck);
    assert_eq!(lab.port_clean(), (true, 0), "tbf or the TC program stayed");
}

/// `xroce experiment incast --bottleneck delay`: two senders without
/// congestion control overload a 100 Mbit/s bridge port twice over; the
/// queue there delays packets (their sojourn, as the program timed them,
/// reaches milliseconds), and queue.csv and summary.json carry the delay
/// consistent with the bytes queued. run_incast checks nothing is left.
#[test]
fn incast_through_the_delay_bottleneck_reports_its_delay() {
    require_root();
    let _one_at_a_time = serial();
    let run = xroce_tests::experiment::run_incast(
        "bndelay",
        &[
            "--senders",
            "2",
            "--link-rate",
            "100mbit",
            "--duration",
            "1.5",
            "--cc",
            "none",
            "--buffer",
            "1MB",
            "--bottleneck",
            "delay",
        ],
    );
    let s = &run.summary;
    assert_eq!(s["queue"]["bottleneck"], "delay", "{}", run.brief());
    let peak_us = run.num("/queue/delay/peak_us");
    assert!(
        peak_us > 2_000.0,
        "peak sojourn {peak_us} us: {}",
        run.brief()
    );
    // The sampled delay is the sampled queue over the rate.
    let p99_us = run.num("/queue/delay/p99_us");
    let p99_bytes = run.num("/queue/after_warmup/p99_bytes");
    let want_us = p99_bytes * 8.0 / 100.0;
    assert!(
        (p99_us - want_us).abs() <= 0.1 * want_us + 50.0,
        "p99 delay {p99_us} us for p99 queue {p99_bytes} B: {}",
        run.brief()
    );
    let csv = std::fs::read_to_string(run.dir.join("queue.csv")).expect("queue.csv");
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("queue.csv has no {name}: {header:?}"))
    };
    let sojourn = col("sojourn_us");
    let max_sojourn = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(sojourn).unwrap().parse::<f64>().unwrap())
        .fold(0.0, f64::max);
    assert!(
        max_sojourn > 1_000.0,
        "mean sojourn per bin at most {max_sojourn} us: {}",
        run.brief()
    );
    eprintln!(
        "bottleneck_delay: incast through the delay bottleneck: peak sojourn {peak_us:.0} us, \
         p99 delay {p99_us:.0} us for p99 queue {p99_bytes} B, largest mean sojourn in a bin \
         {max_sojourn:.0} us"
    );
    run.remove();
}
