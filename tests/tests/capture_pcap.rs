//! `xroce capture -w FILE`: two namespaces joined by veth, xroce's XDP
//! program attached on b, valid RoCEv2 frames (ICRC filled) sent from a
//! through a packet socket while `xroce capture` runs in b. The file it
//! writes (pcapng, or pcap) holds exactly the frames sent (up to `-c`),
//! byte for byte, marked inbound, and `xroce decode` and tshark read the
//! same count with every ICRC right. Ctrl-C (SIGINT) ends a capture with a
//! complete file, `-w -` streams a capture to stdout, `--seconds` ends an
//! idle one, a second capture of the device is refused, and the capture
//! takes no QPN block a process would use; its snap length reaches the
//! processes that send. During a verified `xroce bench`
//! run, a capture on each end records every frame both ways: what one end
//! sent is what the other received, frame for frame, none lost.

use std::{
    io::{BufRead, BufReader, Read},
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use xroce_report::{CaptureReport, DecodeReport};
use xroce_tests::{
    in_netns, require_root,
    roce::{roce_frame, FrameSpec},
    run, unique_tag, workspace_bin, AttachedXdp, Netns, VethPair,
};

/// Frames of `n` PSNs from a to b, QPNs of QPN block 0 spread over eight
/// QPs (eight UDP source ports, so a multi-queue veth spreads them).
fn frames(a: ([u8; 6], Ipv4Addr), b: ([u8; 6], Ipv4Addr), n: u32) -> Vec<Vec<u8>> {
    frames_of(a, b, n, |psn| 64 + (psn as usize % 5) * 100)
}

/// The same with payload sizes `len(psn)`.
fn frames_of(
    a: ([u8; 6], Ipv4Addr),
    b: ([u8; 6], Ipv4Addr),
    n: u32,
    len: impl Fn(u32) -> usize,
) -> Vec<Vec<u8>> {
    (0..n)
        .map(|psn| {
            roce_frame(
                a.0,
                b.0,
                IpAddr::V4(a.1),
                IpAddr::V4(b.1),
                FrameSpec {
                    qpn: 0x11 + psn % 8,
                    psn,
                    len: len(psn),
                    ecn: 0,
                    ip_id: 0,
                },
            )
        })
        .collect()
}

fn mac_in(ns: &str, iface: &str) -> [u8; 6] {
    let iface = iface.to_string();
    in_netns(ns, move || {
        xroce::device::interface_mac(&iface).expect("MAC")
    })
}

/// Sends whole Ethernet frames out of `iface` in namespace `ns` through an
/// AF_PACKET socket (the wire bytes are exactly ours), in paced bursts.
fn send_raw(ns: &str, iface: &str, frames: Vec<Vec<u8>>) {
    let iface = iface.to_string();
    in_netns(ns, move || {
        // SAFETY: plain socket(2); protocol 0: this socket receives nothing.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        let name = std::ffi::CString::new(iface.clone()).unwrap();
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert!(ifindex > 0, "no interface {iface}");
        // SAFETY: sockaddr_ll is plain data.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex as i32;
        addr.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        for (i, f) in frames.iter().enumerate() {
            // SAFETY: `f` and `addr` are valid for the lengths given.
            let n = unsafe {
                libc::sendto(
                    fd,
                    f.as_ptr().cast(),
                    f.len(),
                    0,
                    (&addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            assert_eq!(n, f.len() as isize, "{}", std::io::Error::last_os_error());
            if i % 32 == 31 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
    });
}

/// `xroce capture ARGS...` running in a namespace, its stderr collected.
struct Running {
    child: Child,
    stderr: thread::JoinHandle<String>,
}

impl Running {
    /// Starts it and waits for tcpdump's "listening on" line.
    fn start(ns: &Netns, args: &[&str]) -> Self {
        let mut child = ns
            .command(workspace_bin("xroce"))
            .arg("capture")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn xroce capture");
        let err = child.stderr.take().unwrap();
        let (ready_tx, ready_rx) = mpsc::channel();
        let stderr = thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(err).lines() {
                let line = line.unwrap_or_default();
                if line.contains("listening on") {
                    let _ = ready_tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let mut me = Self { child, stderr };
        if ready_rx.recv_timeout(Duration::from_secs(15)).is_err() {
            let _ = me.child.kill();
            let _ = me.child.wait();
            let err = std::mem::replace(&mut me.stderr, thread::spawn(String::new));
            panic!(
                "xroce capture {args:?} did not start listening:\n{}",
                err.join().unwrap()
            );
        }
        me
    }

    /// Waits (up to 30 s) for it to exit; (success, stdout, stderr).
    fn finish(mut self) -> (bool, Vec<u8>, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = self.child.stdout.take().unwrap();
        let reader = thread::spawn(move || {
            let mut v = Vec::new();
            out.read_to_end(&mut v).unwrap();
            v
        });
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("xroce capture did not end within 30 s");
            }
            thread::sleep(Duration::from_millis(20));
        };
        let stdout = reader.join().unwrap();
        let stderr = std::mem::replace(&mut self.stderr, thread::spawn(String::new))
            .join()
            .unwrap();
        (status.success(), stdout, stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Ours, by PID, if a failed assertion left it running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn report(ok: bool, stdout: &[u8], stderr: &str) -> CaptureReport {
    assert!(ok, "xroce capture failed:\n{stderr}");
    serde_json::from_slice(stdout).unwrap_or_else(|e| {
        panic!(
            "capture --json: {e}: {}\n{stderr}",
            String::from_utf8_lossy(stdout)
        )
    })
}

/// `xroce decode --json` and `tshark -r` on `file`: both must see `n`
/// frames, every one RoCEv2 with its ICRC right.
fn check_readers(file: &Path, n: u64) {
    let out = run(Command::new(workspace_bin("xroce")).args([
        "decode",
        "--json",
        file.to_str().unwrap(),
    ]));
    let d: DecodeReport = serde_json::from_slice(&out.stdout).expect("decode --json");
    assert_eq!(
        (d.frames, d.roce, d.icrc_ok, d.icrc_bad, d.malformed),
        (n, n, n, 0, 0),
        "xroce decode of {}: {d:?}",
        file.display()
    );
    assert_eq!(d.link_type, 1, "Ethernet");
    let tshark = Command::new("tshark")
        .args([
            "-r",
            file.to_str().unwrap(),
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "infiniband.bth.psn",
        ])
        .output()
        .unwrap_or_else(|e| panic!("tshark is missing ({e}); run `cargo xtask setup`"));
    assert!(
        tshark.status.success(),
        "tshark -r {}: {}",
        file.display(),
        String::from_utf8_lossy(&tshark.stderr)
    );
    let lines: Vec<String> = String::from_utf8_lossy(&tshark.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len() as u64, n, "tshark -r {} frames", file.display());
    // Wireshark's RoCEv2 dissector found a BTH (a PSN) in every frame.
    let with_bth = lines
        .iter()
        .filter(|l| l.split('\t').nth(1).is_some_and(|p| !p.is_empty()))
        .count();
    assert_eq!(with_bth as u64, n, "tshark saw a BTH in every frame");
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xroce-capture-{}", unique_tag()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `-c N` on a two-queue interface: every queue is captured, exactly N
/// frames are written (the sender sends more), byte for byte the frames
/// sent, and xroce decode and tshark read N frames with N good ICRCs.
#[test]
fn capture_writes_a_pcap_that_decode_and_tshark_read() {
    require_root();
    const N: u32 = 300;
    let pair = VethPair::with_queues(1500, 2);
    let (a, b, if_a, if_b) = (&pair.a, &pair.b, pair.if_a.clone(), pair.if_b.clone());
    let (addr_a, addr_b) = (pair.addr_a, pair.addr_b);
    let _xdp = AttachedXdp::new(b, &if_b, "native");
    let file = tmp("c.pcap");
    let cap = Running::start(
        b,
        &[
            "--iface",
            &if_b,
            "-w",
            file.to_str().unwrap(),
            "-c",
            &N.to_string(),
            "--json",
        ],
    );
    let sent = frames(
        (mac_in(&a.name, &if_a), addr_a),
        (mac_in(&b.name, &if_b), addr_b),
        N + 40,
    );
    send_raw(&a.name, &if_a, sent.clone());
    let (ok, stdout, stderr) = cap.finish();
    let r = report(ok, &stdout, &stderr);
    assert!(r.rx_frames >= N as u64, "{r:?}");
    assert_eq!((r.frames, r.frames_written), (N as u64, N as u64), "{r:?}");
    assert_eq!(
        (r.stopped_by.as_str(), r.format.as_str()),
        ("count", "pcapng")
    );
    assert_eq!(r.file.as_deref(), file.to_str());
    assert_eq!(
        (r.frames_truncated, r.rx_lost, r.tx_lost),
        (0, 0, 0),
        "{r:?}"
    );

    // Byte for byte: the frames of the file are N of those sent, each once
    // (two queues may interleave their order).
    let got = xroce::capture::read_packets(&file).expect("read the capture back");
    assert_eq!(got.len(), N as usize);
    assert!(
        got.iter()
            .all(|p| p.direction == Some(xroce::capture::Direction::Inbound)),
        "every frame marked inbound"
    );
    let mut got: Vec<Vec<u8>> = got.into_iter().map(|p| p.data.into_owned()).collect();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), N as usize, "no frame twice");
    assert!(
        got.iter().all(|f| sent.contains(f)),
        "frames are those sent"
    );
    check_readers(&file, N as u64);
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

/// SIGINT ends a capture with the file complete; `-w -` writes the pcap to
/// stdout, frames of path MTU 4096 whole; `--seconds` ends an idle capture
/// with a valid empty file.
#[test]
fn capture_ends_cleanly_on_sigint_seconds_and_writes_stdout() {
    require_root();
    // Jumbo: frames over one 4 KiB UMEM chunk need AF_XDP multi-buffer.
    let pair = VethPair::new(9000);
    let _xdp = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    let (a, b) = (
        (mac_in(&pair.a.name, &pair.if_a), pair.addr_a),
        (mac_in(&pair.b.name, &pair.if_b), pair.addr_b),
    );

    // Ctrl-C: -U makes the frames visible in the file while it runs.
    const M: u32 = 150;
    let file = tmp("sigint.pcap");
    let cap = Running::start(
        &pair.b,
        &[
            "-i",
            &pair.if_b,
            "-w",
            file.to_str().unwrap(),
            "-U",
            "--seconds",
            "60",
            "--time-stamp-precision",
            "nano",
            "--json",
        ],
    );
    send_raw(&pair.a.name, &pair.if_a, frames(a, b, M));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = std::fs::read(&file)
            .ok()
            .and_then(|d| xroce::capture::Capture::parse(&d).ok().map(|c| c.count()));
        if seen == Some(M as usize) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{seen:?} of {M} frames in the file"
        );
        thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on the child we started, by its PID.
    assert_eq!(
        unsafe { libc::kill(cap.child.id() as i32, libc::SIGINT) },
        0
    );
    let (ok, stdout, stderr) = cap.finish();
    let r = report(ok, &stdout, &stderr);
    assert_eq!(
        (r.frames_written, r.stopped_by.as_str()),
        (M as u64, "signal"),
        "{r:?}"
    );
    assert!(r.nanosecond);
    let c = std::fs::read(&file).unwrap();
    assert!(xroce::capture::Capture::parse(&c).unwrap().nanosecond());
    check_readers(&file, M as u64);

    // -w -: the pcap on stdout, the summary on stderr.
    const K: u32 = 40;
    let cap = Running::start(
        &pair.b,
        &[
            "-i",
            &pair.if_b,
            "-w",
            "-",
            "--format",
            "pcap",
            "-c",
            &K.to_string(),
        ],
    );
    // Every fourth frame carries path MTU 4096 (a 4.2 KB frame).
    let jumbo = |psn: u32| if psn % 4 == 3 { 4096 } else { 64 };
    send_raw(&pair.a.name, &pair.if_a, frames_of(a, b, K, jumbo));
    let (ok, stdout, stderr) = cap.finish();
    assert!(ok, "{stderr}");
    assert!(stderr.contains(&format!("{K} RoCEv2 frames")), "{stderr}");
    let piped = tmp("stdout.pcap");
    std::fs::write(&piped, &stdout).unwrap();
    let got = xroce::capture::read_packets(&piped).expect("stdout is a pcap");
    let want = frames_of(a, b, K, jumbo);
    assert_eq!(
        got.iter().map(|p| p.data.to_vec()).collect::<Vec<_>>(),
        want,
        "one queue: the frames in the order sent, jumbo ones whole"
    );
    check_readers(&piped, K as u64);

    // --seconds with nothing arriving: a valid file without frames.
    let idle = tmp("idle.pcap");
    let started = Instant::now();
    let cap = Running::start(
        &pair.b,
        &[
            "-i",
            &pair.if_b,
            "-w",
            idle.to_str().unwrap(),
            "--seconds",
            "1",
            "--json",
        ],
    );
    let (ok, stdout, stderr) = cap.finish();
    let r = report(ok, &stdout, &stderr);
    assert_eq!((r.frames_written, r.stopped_by.as_str()), (0, "seconds"));
    assert!(started.elapsed() < Duration::from_secs(10));
    check_readers(&idle, 0);
    for f in [file, piped, idle] {
        let _ = std::fs::remove_dir_all(f.parent().unwrap());
    }
}

/// One capture per device: a second is refused while the first runs. The
/// capture holds one of root's QPN blocks, so a process that starts during
/// it still gets block 0 (port 4791, what remote peers reach without XDP).
#[test]
fn a_second_capture_is_refused_and_block_0_stays_free() {
    require_root();
    let pair = VethPair::new(1500);
    let _xdp = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    let file = tmp("first.pcapng");
    let cap = Running::start(
        &pair.b,
        &[
            "-i",
            &pair.if_b,
            "-w",
            file.to_str().unwrap(),
            "--seconds",
            "120",
            "--json",
        ],
    );
    let second = tmp("second.pcapng");
    let out = pair
        .b
        .command(workspace_bin("xroce"))
        .args(["capture", "-i", &pair.if_b, "-w", second.to_str().unwrap()])
        .args(["--seconds", "5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused: {err}");
    assert!(err.contains("another xroce capture"), "{err}");
    assert!(!second.exists(), "nothing written when refused");
    let if_b = pair.if_b.clone();
    let block = in_netns(&pair.b.name, move || {
        let ifindex = xroce::xdp::if_index(&if_b).unwrap();
        xroce::device::QpnBlock::claim(ifindex).unwrap().block()
    });
    assert_eq!(block, 0, "the capture took no user's block");
    // SAFETY: kill(2) on the child we started, by its PID.
    assert_eq!(
        unsafe { libc::kill(cap.child.id() as i32, libc::SIGTERM) },
        0
    );
    let (ok, stdout, stderr) = cap.finish();
    let c = report(ok, &stdout, &stderr);
    assert_eq!((c.frames, c.stopped_by.as_str()), (0, "signal"), "{c:?}");
    for f in [file, second] {
        let _ = std::fs::remove_dir_all(f.parent().unwrap());
    }
}

/// `-s N` reaches the processes that send, as well as the XDP program:
/// while the capture runs, the file beside its socket, which each sender
/// reads when it connects (the capture tap's unit tests show a sender
/// cuts its copies to it), says N; it goes with the capture. (It once
/// said nothing, and every sender copied whole frames into a `-s 128`
/// capture.)
#[test]
fn the_snap_length_reaches_the_sending_processes() {
    require_root();
    let pair = VethPair::new(1500);
    let _xdp = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    let cap = Running::start(
        &pair.b,
        &["-i", &pair.if_b, "-s", "96", "--seconds", "120", "--json"],
    );
    let if_b = pair.if_b.clone();
    let side = in_netns(&pair.b.name, move || {
        let ifindex = xroce::xdp::if_index(&if_b).unwrap();
        xroce::capture_tap::snaplen_path(&xroce::capture_tap::tap_path(ifindex).unwrap())
    });
    let said = std::fs::read_to_string(&side).unwrap_or_default();
    assert_eq!(said.trim(), "96", "{}", side.display());
    // SAFETY: kill(2) on the child we started, by its PID.
    assert_eq!(
        unsafe { libc::kill(cap.child.id() as i32, libc::SIGINT) },
        0
    );
    let (ok, stdout, stderr) = cap.finish();
    let c = report(ok, &stdout, &stderr);
    assert_eq!(c.snaplen, 96, "{c:?}");
    assert!(!side.exists(), "the snap length goes with the capture");
}

/// The RoCE part of each frame of `file` in `direction`, BTH to payload:
/// what both ends agree on, whatever headers the kernel put around it (a
/// process on the UDP backend copies the frame its engine built; the
/// backend fits the ICRC to the IPv4 header the kernel sends).
fn payloads(file: &Path, direction: xroce::capture::Direction) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = xroce::capture::read_packets(file)
        .expect("read the capture")
        .into_iter()
        .filter(|p| p.direction == Some(direction))
        // The frame minus Ethernet, IPv4, UDP and the ICRC.
        .map(|p| p.data[14 + 20 + 8..p.data.len() - 4].to_vec())
        .collect();
    out.sort();
    out
}

/// A capture on each end of a verified RDMA WRITE bench (server on AF_XDP
/// in b, client over UDP in a), both started before it and ended after:
/// each records both directions (received frames from its XDP program,
/// sent ones from the bench process), loses none, and what a sent is
/// exactly what b received and the other way round, frame for frame.
#[test]
fn captures_on_both_ends_of_a_bench_see_every_frame_both_ways() {
    require_root();
    let pair = VethPair::new(1500);
    let (fa, fb) = (tmp("a.pcapng"), tmp("b.pcapng"));
    let args = |iface: &str, f: &Path| {
        [
            "-i".to_string(),
            iface.to_string(),
            "-w".into(),
            f.to_str().unwrap().into(),
            "--seconds".into(),
            "120".into(),
            "--json".into(),
        ]
    };
    let (aa, ab) = (args(&pair.if_a, &fa), args(&pair.if_b, &fb));
    let cap_a = Running::start(&pair.a, &aa.iter().map(String::as_str).collect::<Vec<_>>());
    let cap_b = Running::start(&pair.b, &ab.iter().map(String::as_str).collect::<Vec<_>>());
    let r: xroce_report::BenchReport = xroce_tests::perf::run_ok(
        &pair,
        "bench",
        &["write", "--backend", "afxdp"],
        &[
            "write",
            "--backend",
            "udp",
            "--size",
            "4096",
            "--iters",
            "300",
        ],
    );
    assert_eq!((r.verified, r.iters), (Some(true), 300), "{r:?}");
    let mut reports = Vec::new();
    for cap in [cap_a, cap_b] {
        // SAFETY: kill(2) on the child we started, by its PID.
        assert_eq!(
            unsafe { libc::kill(cap.child.id() as i32, libc::SIGINT) },
            0
        );
        let (ok, stdout, stderr) = cap.finish();
        reports.push(report(ok, &stdout, &stderr));
    }
    for c in &reports {
        assert_eq!((c.rx_lost, c.tx_lost), (0, 0), "no copy lost: {c:?}");
        assert!(c.rx_frames > 0 && c.tx_frames > 0, "both ways: {c:?}");
    }
    use xroce::capture::Direction::{Inbound, Outbound};
    let (a_out, a_in) = (payloads(&fa, Outbound), payloads(&fa, Inbound));
    let (b_out, b_in) = (payloads(&fb, Outbound), payloads(&fb, Inbound));
    // 300 WRITEs of 4 KiB at MTU 1024: at least 1,200 data packets.
    assert!(a_out.len() >= 1200, "a sent {}", a_out.len());
    assert!(
        a_out == b_in,
        "a sent {} frames, b received {}",
        a_out.len(),
        b_in.len()
    );
    assert!(
        b_out == a_in,
        "b sent {} frames, a received {}",
        b_out.len(),
        a_in.len()
    );
    eprintln!(
        "a -> b {} frames, b -> a {} frames, each seen on both ends",
        a_out.len(),
        b_out.len()
    );
    for f in [fa, fb] {
        let _ = std::fs::remove_dir_all(f.parent().unwrap());
    }
}
