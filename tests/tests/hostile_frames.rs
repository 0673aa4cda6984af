//! Crafted RoCEv2 frames at a running `xroce bench` server, on both of its
//! backends (AF_XDP and UDP), sent from the client's namespace through a
//! raw packet socket by an attacker on the path. The attacker learns the
//! server's QPN, R_Key, VA and PSNs from a capture of the legitimate
//! exchange (the client runs the UDP backend without XDP, so a packet tap
//! on its interface sees both directions):
//!
//! - duplicate READs naming a PSN long past, another R_Key, or another
//!   range of a recent READ: the server answers none with MR data (the
//!   tap, which lost nothing, sees no response at those PSNs), counts each
//!   (`dup_read_unmatched` in its published counters) and the legitimate
//!   READ stream finishes verified;
//! - under selective repeat, a WRITE ahead of the expected PSN with a
//!   wrong R_Key: the server places nothing ahead from then on, and when
//!   the client's stream reaches that PSN it NAKs remote access error
//!   (naming that PSN) and its QP goes to ERR, so the client's WRITE
//!   stream fails, instead of dropping it silently: R_Keys cannot be
//!   guessed for free;
//! - junk at a WRITE stream: frames with a bad ICRC, frames spoofed from
//!   another address of the client's subnet (valid ICRC, the connected
//!   QP, the legitimate R_Key), frames too short for a BTH, then a flood
//!   of 1,000 bad-ICRC frames: each kind is dropped where IBTA and rxe
//!   drop it and counted (`rx_bad_icrc`, `rx_bad_header`; the short ones
//!   by the XDP program's `drop_bad_udp_length` on AF_XDP, by the UDP
//!   backend as runts before the engine), none is answered, and the
//!   stream finishes verified with the server alive.

use std::{
    process::Stdio,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use xroce_report::BenchReport;
use xroce_tests::{
    datagram::EthernetSender,
    perf::{next_port, start_server, Server},
    require_root, spawn_in, workspace_bin, AttachedXdp, VethPair,
};
use xroce_wire::{
    emit_frame, parse_frame, psn_add, psn_diff, psn_sub, BthRepr, FrameRepr, Gid, NakCode, Opcode,
    RethRepr, Syndrome, TransportRepr,
};

/// A RoCEv2 frame the tap saw, without its payload.
#[derive(Clone, Debug)]
struct Seen {
    /// Sent by this side (the client), else received.
    outgoing: bool,
    frame: FrameRepr,
}

/// What the tap saw and whether it lost any frame on the way.
struct TapResult {
    seen: Vec<Seen>,
    drops: u32,
}

/// A packet socket on `iface` of namespace `ns` recording every RoCEv2
/// frame until `stop`, each also handed to `tx` as it comes.
fn tap(
    ns: &str,
    iface: &str,
    stop: Arc<AtomicBool>,
    tx: mpsc::Sender<Seen>,
) -> xroce_netns::NsThread<TapResult> {
    let iface = iface.to_string();
    let (ready_tx, ready_rx) = mpsc::channel();
    let t = spawn_in(ns, move || {
        let name = std::ffi::CString::new(iface.clone()).unwrap();
        // SAFETY: if_nametoindex reads one NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(index, 0, "no interface {iface}");
        let all = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2); closed at the end of this thread.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, all as i32) };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        // SAFETY: an all-zero sockaddr_ll is valid; the fields are set below.
        let mut at: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        at.sll_family = libc::AF_PACKET as u16;
        at.sll_protocol = all;
        at.sll_ifindex = index as i32;
        // SAFETY: `at` is a sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                fd,
                &at as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        let set = |opt: i32, val: &[u8]| {
            // SAFETY: `val` is the option's value, of its length.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    val.as_ptr() as *const libc::c_void,
                    val.len() as u32,
                )
            };
            assert_eq!(
                rc,
                0,
                "setsockopt {opt}: {}",
                std::io::Error::last_os_error()
            );
        };
        set(libc::SO_RCVBUFFORCE, &(64i32 << 20).to_ne_bytes());
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: timeval is plain data; viewed as its bytes.
        set(libc::SO_RCVTIMEO, unsafe {
            std::slice::from_raw_parts(
                &tv as *const libc::timeval as *const u8,
                std::mem::size_of::<libc::timeval>(),
            )
        });
        ready_tx.send(()).unwrap();
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: all-zero sockaddr_ll is valid; recvfrom fills it.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: the buffer and address outlive the call; sizes are theirs.
            let n = unsafe {
                libc::recvfrom(
                    fd,
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                    &mut from as *mut libc::sockaddr_ll as *mut libc::sockaddr,
                    &mut len,
                )
            };
            if n <= 0 {
                continue;
            }
            if let Ok((frame, _)) = parse_frame(&buf[..n as usize]) {
                let s = Seen {
                    outgoing: from.sll_pkttype == libc::PACKET_OUTGOING,
                    frame,
                };
                let _ = tx.send(s.clone());
                seen.push(s);
            }
        }
        let mut stats = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as u32;
        // SAFETY: tpacket_stats is what PACKET_STATISTICS writes, of this size.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                &mut stats as *mut libc::tpacket_stats as *mut libc::c_void,
                &mut len,
            )
        };
        assert_eq!(rc, 0, "PACKET_STATISTICS");
        // SAFETY: the fd is ours and closed once.
        unsafe { libc::close(fd) };
        TapResult {
            seen,
            drops: stats.tp_drops,
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("packet tap did not open");
    t
}

/// The first frame from `rx` that `want` accepts, within 30 s.
fn first(rx: &mpsc::Receiver<Seen>, want: impl Fn(&Seen) -> bool) -> Seen {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let s = rx
            .recv_timeout(left)
            .expect("no such frame on the wire within 30 s");
        if want(&s) {
            return s;
        }
    }
}

/// `like`'s addresses and ports with transport `t`: a frame as the client
/// would send it, with a valid ICRC.
fn forge(like: &FrameRepr, t: TransportRepr, payload: &[u8]) -> Vec<u8> {
    let f = FrameRepr::new(
        like.eth.src,
        like.eth.dst,
        like.ip.src_gid(),
        like.ip.dst_gid(),
        like.udp.src_port,
        t,
    );
    let mut buf = vec![0u8; 9000];
    let n = emit_frame(&f, payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn request(qpn: u32, opcode: Opcode, psn: u32, reth: RethRepr) -> TransportRepr {
    let mut bth = BthRepr::new(opcode, qpn, psn);
    bth.ack_req = true;
    bth.pkey = 0xffff;
    let mut t = TransportRepr::new(bth);
    t.reth = Some(reth);
    t
}

/// Sends `frames` out of the client's interface from its namespace (one
/// packet socket for all).
fn inject(pair: &VethPair, frames: Vec<Vec<u8>>) {
    let if_a = pair.if_a.clone();
    spawn_in(&pair.a.name, move || {
        let sender = EthernetSender::new(&if_a);
        for f in &frames {
            sender.send(f);
        }
    })
    .join()
    .expect("inject");
}

/// The server's published counter `name` (/run/xroce/IF/engine.PID, the
/// one engine on its interface).
fn server_counter(pair: &VethPair, name: &str) -> Option<u64> {
    let dir = xroce::stats_export::export_dir(&pair.if_b);
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        // Not the half-written engine.PID.tmp; a file being replaced by
        // it may be gone by now: the next look finds the new one.
        if e.path().extension().is_some_and(|x| x == "tmp") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for line in text.lines() {
            let mut w = line.split_whitespace();
            if w.next() == Some(name) {
                return w.next()?.parse().ok();
            }
        }
    }
    None
}

/// Waits until the server's counter `name` is at least `n`; returns it.
fn wait_counter(pair: &VethPair, name: &str, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = server_counter(pair, name).unwrap_or(0);
        if v >= n {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "server's {name} is {v}, not {n}, after 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Namespaces, XDP on the server side if its backend is AF_XDP, and the
/// tap on the client's interface.
struct Setup {
    pair: VethPair,
    _xdp: Option<AttachedXdp>,
    stop: Arc<AtomicBool>,
    tap: Option<xroce_netns::NsThread<TapResult>>,
    rx: mpsc::Receiver<Seen>,
}

impl Setup {
    fn new(backend: &str) -> Self {
        let pair = VethPair::new(1500);
        let xdp = (backend == "afxdp").then(|| AttachedXdp::new(&pair.b, &pair.if_b, "native"));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let tap = Some(tap(&pair.a.name, &pair.if_a, stop.clone(), tx));
        Setup {
            pair,
            _xdp: xdp,
            stop,
            tap,
            rx,
        }
    }

    fn finish_tap(&mut self) -> TapResult {
        self.stop.store(true, Ordering::Relaxed);
        self.tap.take().unwrap().join().expect("tap thread")
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.tap.take() {
            let _ = t.join();
        }
    }
}

/// Starts the server and, in the background, the client (`--json`);
/// both are killed by PID if the test ends early.
fn start(s: &Setup, server: &[&str], client: &[&str]) -> (Server, Server) {
    let port = next_port();
    let srv = start_server(&s.pair, "bench", port, server);
    let child = xroce_netns::command(&s.pair.a.name, workspace_bin("xroce"))
        .arg("bench")
        .args(client)
        .args(["-d", &s.pair.if_a, "--json"])
        .args(["--connect", &format!("{}:{port}", s.pair.addr_b)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start xroce client");
    (srv, Server::new(child))
}

fn is_read_response(o: Opcode) -> bool {
    matches!(
        o,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST
            | Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
            | Opcode::RC_RDMA_READ_RESPONSE_LAST
            | Opcode::RC_RDMA_READ_RESPONSE_ONLY
    )
}

fn duplicate_reads_leak_nothing(backend: &str) {
    require_root();
    let mut s = Setup::new(backend);
    // The server paces its READ responses at 200 Mbit/s so the tap keeps
    // up with everything (it must lose nothing to prove nothing leaked).
    let client = [
        "read",
        "--backend",
        "udp",
        "--size",
        "65536",
        "--duration",
        "4",
    ];
    let (srv, client) = start(
        &s,
        &["read", "--backend", backend, "--rate", "200mbit"],
        &client,
    );
    // The legitimate READ requests give the QPN, R_Key, VA and PSNs.
    let req = first(&s.rx, |x| {
        x.outgoing && x.frame.transport.bth.opcode == Opcode::RC_RDMA_READ_REQUEST
    });
    let t = &req.frame.transport;
    let (qpn, psn, r) = (t.bth.dest_qp, t.bth.psn, t.reth.unwrap());
    // Let a few more READs go, then take the latest as the recent one.
    let mut latest = req.clone();
    for _ in 0..8 {
        latest = first(&s.rx, |x| {
            x.outgoing && x.frame.transport.bth.opcode == Opcode::RC_RDMA_READ_REQUEST
        });
    }
    let lt = latest.frame.transport;
    let lr = lt.reth.unwrap();
    // PSNs far in the past (4 Mi behind the first READ): no legitimate
    // response ever carries them.
    let past = psn_sub(psn, 1 << 22);
    let forged = [
        // A PSN long past with the legitimate R_Key, VA and length.
        request(qpn, Opcode::RC_RDMA_READ_REQUEST, past, r),
        // The same with another R_Key.
        request(
            qpn,
            Opcode::RC_RDMA_READ_REQUEST,
            psn_add(past, 100),
            RethRepr {
                rkey: r.rkey ^ 0x100,
                ..r
            },
        ),
        // A recent READ's PSN asking past its range.
        request(
            qpn,
            Opcode::RC_RDMA_READ_REQUEST,
            lt.bth.psn,
            RethRepr {
                va: lr.va + u64::from(lr.dma_len / 2),
                ..lr
            },
        ),
    ];
    const EACH: usize = 5;
    let frames: Vec<Vec<u8>> = forged
        .iter()
        .flat_map(|t| std::iter::repeat_n(forge(&req.frame, *t, &[]), EACH))
        .collect();
    inject(&s.pair, frames);
    let n = wait_counter(&s.pair, "dup_read_unmatched", (EACH * forged.len()) as u64);
    assert_eq!(n, (EACH * forged.len()) as u64, "dup_read_unmatched");

    let out = client.finish(Duration::from_secs(30));
    let srv = srv.finish(Duration::from_secs(20));
    let tap = s.finish_tap();
    assert!(
        out.status.success(),
        "client: {}\nserver: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&srv.stderr)
    );
    assert!(
        srv.status.success(),
        "server: {}",
        String::from_utf8_lossy(&srv.stderr)
    );
    let report: BenchReport = serde_json::from_slice(&out.stdout).expect("client JSON");
    assert_eq!(report.verified, Some(true), "{report:?}");
    assert_eq!(
        tap.drops, 0,
        "the tap lost frames: it cannot vouch for what left"
    );
    let responses: Vec<_> = tap
        .seen
        .iter()
        .filter(|x| !x.outgoing && is_read_response(x.frame.transport.bth.opcode))
        .collect();
    assert!(responses.len() > 100, "the tap saw the READ stream");
    let leaked = responses
        .iter()
        .filter(|x| (0..200).contains(&psn_diff(x.frame.transport.bth.psn, past)))
        .count();
    assert_eq!(leaked, 0, "READ responses answered the forged requests");
    eprintln!(
        "{backend}: {} READ responses seen, none to the {} forged READs",
        responses.len(),
        EACH * forged.len()
    );
}

#[test]
fn duplicate_reads_leak_nothing_afxdp() {
    duplicate_reads_leak_nothing("afxdp");
}

#[test]
fn duplicate_reads_leak_nothing_udp() {
    duplicate_reads_leak_nothing("udp");
}

fn guessed_rkey_ahead_costs_the_qp(backend: &str) {
    require_root();
    let mut s = Setup::new(backend);
    // A slow stream (20 Mbit/s, ~1,700 packets a second), so a PSN a few
    // hundred ahead of the last one seen is still ahead when it lands,
    // and inside the responder's SACK window (1,024 PSNs).
    let client = [
        "write",
        "--backend",
        "udp",
        "--selective-repeat",
        "--size",
        "65536",
        "--duration",
        "8",
        "--rate",
        "20mbit",
    ];
    let (srv, client) = start(
        &s,
        &["write", "--backend", backend, "--selective-repeat"],
        &client,
    );
    let w = first(&s.rx, |x| {
        x.outgoing
            && x.frame.transport.reth.is_some()
            && x.frame.transport.bth.opcode == Opcode::RC_RDMA_WRITE_FIRST
    });
    // The newest of what is already queued in the channel.
    let mut last = w.clone();
    while let Ok(x) = s.rx.try_recv() {
        if x.outgoing && x.frame.transport.reth.is_some() {
            last = x;
        }
    }
    let r = last.frame.transport.reth.unwrap();
    let ahead = psn_add(last.frame.transport.bth.psn, 300);
    let t = request(
        last.frame.transport.bth.dest_qp,
        Opcode::RC_RDMA_WRITE_ONLY,
        ahead,
        RethRepr {
            rkey: r.rkey ^ 0x5a00,
            dma_len: 256,
            ..r
        },
    );
    inject(&s.pair, vec![forge(&w.frame, t, &[0xee; 256])]);
    // Nothing is placed ahead from then on (the forged packet dropped
    // ahead draws a sequence NAK, as any dropped there); once the client's
    // stream reaches that PSN the server NAKs it (remote access error) and
    // its QP goes to ERR.
    let nak = first(&s.rx, |x| {
        !x.outgoing
            && x.frame.transport.aeth.is_some_and(
                |a| matches!(a.syndrome, Syndrome::Nak(c) if c != NakCode::PsnSequenceError),
            )
    });
    let syndrome = nak.frame.transport.aeth.unwrap().syndrome;
    assert_eq!(
        syndrome,
        Syndrome::Nak(NakCode::RemoteAccessError),
        "{nak:?}"
    );
    assert_eq!(
        psn_diff(nak.frame.transport.bth.psn, ahead),
        0,
        "the NAK names the forged PSN, once the stream reaches it"
    );
    let out = client.finish(Duration::from_secs(30));
    let srv = srv.finish(Duration::from_secs(20));
    let _ = s.finish_tap();
    let client_err = String::from_utf8_lossy(&out.stderr);
    let server_err = String::from_utf8_lossy(&srv.stderr);
    eprintln!("{backend}: client: {client_err}\nserver: {server_err}");
    assert!(
        !out.status.success(),
        "the client's WRITE stream survived a dead QP"
    );
    // The client's WRITE at that PSN fails with the NAK's remote access
    // error.
    assert!(
        client_err.contains("completed with RemAccessErr"),
        "client: {client_err}"
    );
    // The server ends by itself, not by a signal.
    assert!(
        srv.status.code().is_some(),
        "server: {:?} {server_err}",
        srv.status
    );
}

#[test]
fn guessed_rkey_ahead_costs_the_qp_afxdp() {
    guessed_rkey_ahead_costs_the_qp("afxdp");
}

#[test]
fn guessed_rkey_ahead_costs_the_qp_udp() {
    guessed_rkey_ahead_costs_the_qp("udp");
}

/// `frame` (Ethernet, IPv4, UDP, RoCE) cut to `payload` bytes of UDP
/// payload, with IP and UDP lengths and the IP checksum made consistent:
/// well-formed up to UDP, too short for what it claims to carry.
fn cut_udp_payload(frame: &[u8], payload: usize) -> Vec<u8> {
    const IP: usize = 14;
    const UDP: usize = IP + 20;
    let mut f = frame[..UDP + 8 + payload].to_vec();
    f[IP + 2..IP + 4].copy_from_slice(&((20 + 8 + payload) as u16).to_be_bytes());
    f[IP + 10..IP + 12].copy_from_slice(&[0, 0]);
    let sum: u32 = f[IP..UDP]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let check = !(((folded & 0xffff) + (folded >> 16)) as u16);
    f[IP + 10..IP + 12].copy_from_slice(&check.to_be_bytes());
    f[UDP + 4..UDP + 6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    f[UDP + 6..UDP + 8].copy_from_slice(&[0, 0]);
    f
}

/// The XDP program's counter `name` on the server's interface.
fn server_xdp_counter(pair: &VethPair, name: &str) -> u64 {
    let out = xroce_netns::command(&pair.b.name, workspace_bin("xroce"))
        .args(["stats", "--iface", &pair.if_b, "--json"])
        .output()
        .expect("xroce stats");
    let report: xroce_report::StatsReport =
        serde_json::from_slice(&out.stdout).expect("stats --json");
    report.xdp.get(name).copied().unwrap_or(0)
}

fn junk_is_counted_and_dropped(backend: &str) {
    require_root();
    let mut s = Setup::new(backend);
    let client = [
        "write",
        "--backend",
        "udp",
        "--size",
        "65536",
        "--duration",
        "15",
        "--rate",
        "50mbit",
    ];
    let (srv, client) = start(&s, &["write", "--backend", backend], &client);
    let w = first(&s.rx, |x| {
        x.outgoing
            && x.frame.transport.reth.is_some()
            && x.frame.transport.bth.opcode == Opcode::RC_RDMA_WRITE_FIRST
    });
    let t = &w.frame.transport;
    let (qpn, psn, r) = (t.bth.dest_qp, t.bth.psn, t.reth.unwrap());
    // PSNs long past: were one of these accepted, it would be a duplicate
    // (ACKed, never written); dropping comes first.
    let past = psn_sub(psn, 1 << 22);
    let write = |i: u32| {
        request(
            qpn,
            Opcode::RC_RDMA_WRITE_ONLY,
            psn_add(past, i),
            RethRepr { dma_len: 64, ..r },
        )
    };
    const EACH: u32 = 20;
    let bad_icrc = |i: u32| {
        let mut f = forge(&w.frame, write(i), &[0xee; 64]);
        *f.last_mut().unwrap() ^= 0xff;
        f
    };
    let [a, b, c, _] = s.pair.addr_a.octets();
    let spoofed_src = Gid::from(std::net::Ipv4Addr::new(a, b, c, 77));
    let spoofed = |i: u32| {
        let like = &w.frame;
        let f = FrameRepr::new(
            like.eth.src,
            like.eth.dst,
            spoofed_src,
            like.ip.dst_gid(),
            like.udp.src_port,
            write(i),
        );
        let mut buf = vec![0u8; 2048];
        let n = emit_frame(&f, &[0xee; 64], &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let short = |i: u32| cut_udp_payload(&forge(&w.frame, write(i), &[]), 8);
    // Over AF_XDP the XDP program drops the short frames (no program runs
    // on the UDP server's interface).
    let xdp_short_before =
        (backend == "afxdp").then(|| server_xdp_counter(&s.pair, "drop_bad_udp_length"));
    let mut frames: Vec<Vec<u8>> = (0..EACH).map(bad_icrc).collect();
    frames.extend((0..EACH).map(spoofed));
    frames.extend((0..EACH).map(short));
    inject(&s.pair, frames);
    let n = u64::from(EACH);
    assert_eq!(wait_counter(&s.pair, "rx_bad_icrc", n), n, "rx_bad_icrc");
    assert_eq!(
        wait_counter(&s.pair, "rx_bad_header", n),
        n,
        "rx_bad_header"
    );
    if let Some(xdp_short_before) = xdp_short_before {
        let deadline = Instant::now() + Duration::from_secs(20);
        while server_xdp_counter(&s.pair, "drop_bad_udp_length") < xdp_short_before + n {
            assert!(Instant::now() < deadline, "XDP drop_bad_udp_length");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            server_xdp_counter(&s.pair, "drop_bad_udp_length"),
            xdp_short_before + n
        );
    }
    // Over UDP the backend drops them as runts (its own count, which the
    // engine's published counters do not carry); either way the engine
    // never sees them.
    assert_eq!(server_counter(&s.pair, "rx_malformed"), Some(0));
    // A flood: what arrives is counted once, the stream goes on.
    const FLOOD: u32 = 1000;
    inject(&s.pair, (EACH..EACH + FLOOD).map(bad_icrc).collect());
    let flooded = wait_counter(&s.pair, "rx_bad_icrc", n + 1) - n;
    assert!(flooded <= u64::from(FLOOD), "{flooded} counted of {FLOOD}");

    let out = client.finish(Duration::from_secs(30));
    let srv = srv.finish(Duration::from_secs(20));
    let tap = s.finish_tap();
    assert!(
        out.status.success() && srv.status.success(),
        "client: {}\nserver: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&srv.stderr)
    );
    let report: BenchReport = serde_json::from_slice(&out.stdout).expect("client JSON");
    assert_eq!(report.verified, Some(true), "{report:?}");
    // Nothing answered the junk: no response names a PSN of the past.
    let answered = tap
        .seen
        .iter()
        .filter(|x| {
            !x.outgoing
                && (0..(EACH + FLOOD) as i32).contains(&psn_diff(x.frame.transport.bth.psn, past))
        })
        .count();
    assert_eq!(answered, 0, "responses to junk");
    eprintln!(
        "{backend}: {EACH} bad ICRC, {EACH} spoofed counted, {EACH} short dropped; \
         flood of {FLOOD}: at least {flooded} counted while it ran"
    );
}

#[test]
fn junk_is_counted_and_dropped_afxdp() {
    junk_is_counted_and_dropped("afxdp");
}

#[test]
fn junk_is_counted_and_dropped_udp() {
    junk_is_counted_and_dropped("udp");
}
