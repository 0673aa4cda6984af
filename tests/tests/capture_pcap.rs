//! `xroce capture -w FILE`: two namespaces joined by veth, xroce's XDP
//! program attached on b, valid RoCEv2 frames (ICRC filled) sent from a
//! through a packet socket while `xroce capture` runs in b. The pcap it
//! writes holds exactly the frames sent (up to `-c`), byte for byte, and
//! `xroce decode` and tshark read the same count with every ICRC right.
//! Ctrl-C (SIGINT) ends a capture with a complete file, `-w -` streams a
//! capture to stdout, `--seconds` ends an idle one, and a capture refuses
//! to start while an xroce process holds the device's AF_XDP sockets or
//! QPN block 0 (it would take that process's frames), naming it.

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
    assert_eq!(r.queues, [0, 1], "every RX queue: {r:?}");
    // The flows spread over both queues: one socket would miss frames.
    assert!(r.queue_frames.iter().all(|&n| n > 0), "{r:?}");
    assert!(r.queue_frames.iter().sum::<u64>() >= N as u64, "{r:?}");
    eprintln!("frames per RX queue: {:?}", r.queue_frames);
    assert_eq!((r.frames, r.frames_written), (N as u64, N as u64), "{r:?}");
    assert_eq!(r.stopped_by, "count");
    assert_eq!(r.file.as_deref(), file.to_str());
    assert_eq!((r.frames_truncated, r.rx_dropped), (0, 0), "{r:?}");

    // Byte for byte: the frames of the file are N of those sent, each once
    // (two queues may interleave their order).
    let got = xroce::capture::read_packets(&file).expect("read the capture back");
    assert_eq!(got.len(), N as usize);
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
        &["-i", &pair.if_b, "-w", "-", "-c", &K.to_string()],
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

/// A capture would take the frames of the process that owns the device's
/// AF_XDP sockets or QPN block 0: it refuses, naming that process (here
/// this test, holding them as an xroce process does), and writes nothing.
#[test]
fn capture_refuses_while_an_xroce_process_holds_the_device() {
    require_root();
    let pair = VethPair::new(1500);
    let _xdp = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    let if_b = pair.if_b.clone();
    let xroce = workspace_bin("xroce");
    // The holds are abstract names of b's network namespace: take them
    // from a thread inside it.
    let holds = in_netns(&pair.b.name, move || {
        let ifindex = xroce::xdp::if_index(&if_b).unwrap();
        let block = xroce::device::QpnBlock::claim(ifindex).unwrap();
        assert_eq!(block.block(), 0);
        let afxdp = block.claim_afxdp().unwrap().expect("AF_XDP hold");
        (block, afxdp)
    });
    let me = format!("PID {}", std::process::id());
    let file = tmp("refused.pcap");
    let try_capture = || {
        let out = pair
            .b
            .command(&xroce)
            .args([
                "capture",
                "-i",
                &pair.if_b,
                "-w",
                file.to_str().unwrap(),
                "-c",
                "1",
            ])
            .args(["--seconds", "5"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = try_capture();
    assert_eq!(code, Some(1), "refused: {err}");
    assert!(err.contains(&me), "names the holder: {err}");
    assert!(err.contains("block 0"), "{err}");
    assert!(!file.exists(), "nothing written when refused");

    // Block 0 held by a process over UDP, nobody on AF_XDP: block 0's
    // frames reach it through the kernel, a capture would take them.
    let (block, afxdp) = holds;
    drop(afxdp);
    let (code, err) = try_capture();
    assert_eq!(code, Some(1), "refused: {err}");
    assert!(err.contains(&me) && err.contains("block 0"), "{err}");

    // An AF_XDP owner in another block (block 0 free).
    let if_b = pair.if_b.clone();
    let other = in_netns(&pair.b.name, move || {
        let ifindex = xroce::xdp::if_index(&if_b).unwrap();
        let next = xroce::device::QpnBlock::claim(ifindex).unwrap();
        assert_eq!(next.block(), 1);
        let afxdp = next.claim_afxdp().unwrap().expect("AF_XDP hold");
        (next, afxdp)
    });
    drop(block);
    let (code, err) = try_capture();
    assert_eq!(code, Some(1), "refused: {err}");
    assert!(err.contains(&me) && err.contains("AF_XDP"), "{err}");
    assert!(!file.exists(), "nothing written when refused");
    drop(other);

    // Nobody left: it runs.
    let (code, err) = try_capture();
    assert_eq!(code, Some(0), "{err}");
    assert!(file.exists());
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

/// A capture does not break the xroce processes that start while it runs:
/// they get QPN block 1 and up (the capture holds block 0 and the AF_XDP
/// sockets), run over UDP, and the XDP program moves their frames to their
/// block's port, past the capture. An RDMA WRITE bench (data verified) runs
/// to b during a capture, and the capture holds none of its frames.
#[test]
fn processes_started_during_a_capture_keep_their_traffic() {
    require_root();
    let pair = VethPair::new(1500);
    let _xdp = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    let file = tmp("beside.pcap");
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
            "200",
        ],
    );
    assert_eq!(r.verified, Some(true), "{r:?}");
    // SAFETY: kill(2) on the child we started, by its PID.
    assert_eq!(
        unsafe { libc::kill(cap.child.id() as i32, libc::SIGTERM) },
        0
    );
    let (ok, stdout, stderr) = cap.finish();
    let c = report(ok, &stdout, &stderr);
    assert_eq!((c.frames, c.stopped_by.as_str()), (0, "signal"), "{c:?}");
    check_readers(&file, 0);
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}
