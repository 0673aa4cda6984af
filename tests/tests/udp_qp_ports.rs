//! Per-QP UDP source ports on the UDP backend (issue 13, goal 6): `xroce
//! bench write -q 4` over the UDP backend at both ends of a veth pair, with
//! XROCE_UDP_QP_PORTS=1 (and UDP GSO on the sender, so the send-only
//! sockets carry GSO messages too), data verified, while tcpdump captures
//! on b. Every data frame a -> b leaves from the source port rxe's rule
//! (`rocev2_src_port`) gives its QP pair, the ACKs b -> a likewise, and the
//! four QPs use four ports (none 4791). The same run without the variable
//! sends everything from 4791, as before (the opt-in is needed).
//!
//! Run under `flock /tmp/xroce-netns.lock` beside other namespace tests.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader, Read},
    process::{Child, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use xroce::io::wire::{rocev2_src_port, ROCEV2_PORT};
use xroce_report::BenchReport;
use xroce_tests::{
    perf::{next_port, Server},
    require_root, workspace_bin, VethPair,
};

/// (source IPv4, UDP source port, BTH destination QPN) of every RoCEv2
/// packet in a pcap of Ethernet frames (a GSO packet counts once, by its
/// first datagram's headers).
fn roce_packets(pcap: &[u8]) -> Vec<([u8; 4], u16, u32)> {
    assert!(pcap.len() >= 24, "no pcap header ({} bytes)", pcap.len());
    let magic = u32::from_le_bytes(pcap[..4].try_into().unwrap());
    assert!(
        magic == 0xa1b2_c3d4 || magic == 0xa1b2_3c4d,
        "not a little-endian pcap: {magic:#x}"
    );
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let caplen = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        let f = &pcap[(at + 16).min(pcap.len())..(at + 16 + caplen).min(pcap.len())];
        at += 16 + caplen;
        // Ethernet, IPv4 without options, UDP to 4791, BTH.
        if f.len() < 14 + 20 + 8 + 12 || f[12..14] != [0x08, 0x00] || f[14] != 0x45 || f[23] != 17 {
            continue;
        }
        let udp = &f[34..];
        if u16::from_be_bytes([udp[2], udp[3]]) != ROCEV2_PORT {
            continue;
        }
        let sport = u16::from_be_bytes([udp[0], udp[1]]);
        let dqpn = u32::from_be_bytes([0, udp[8 + 5], udp[8 + 6], udp[8 + 7]]);
        out.push((f[26..30].try_into().unwrap(), sport, dqpn));
    }
    out
}

/// tcpdump on b's end, writing the pcap to its stdout.
struct Capture {
    child: Child,
    pcap: thread::JoinHandle<Vec<u8>>,
}

impl Capture {
    fn start(pair: &VethPair) -> Self {
        let mut child = pair
            .b
            .command("tcpdump")
            .args(["-i", &pair.if_b, "-n", "-U", "-s", "128", "-w", "-"])
            .args(["udp", "port", "4791"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump (Debian package tcpdump) must be installed");
        let mut stdout = child.stdout.take().unwrap();
        let pcap = thread::spawn(move || {
            let mut v = Vec::new();
            stdout.read_to_end(&mut v).unwrap();
            v
        });
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let line = line.unwrap_or_default();
                if line.contains("listening on") {
                    let _ = tx.send(());
                }
            }
        });
        let mut me = Self { child, pcap };
        if rx.recv_timeout(Duration::from_secs(15)).is_err() {
            let _ = me.child.kill();
            let _ = me.child.wait();
            panic!("tcpdump did not start listening within 15 s");
        }
        me
    }

    /// Stops it (SIGINT, so it flushes) and returns the pcap.
    fn finish(mut self) -> Vec<u8> {
        // SAFETY: kill(2) on the PID of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().expect("wait tcpdump");
        assert!(status.success() || status.code().is_some(), "{status:?}");
        self.pcap.join().unwrap()
    }
}

/// `xroce bench write -q 4` over the UDP backend at both ends with `env`;
/// returns the client's report and the packets tcpdump saw on b.
fn run(pair: &VethPair, env: &[(&str, &str)]) -> (BenchReport, Vec<([u8; 4], u16, u32)>) {
    let cap = Capture::start(pair);
    let port = next_port();
    let xroce = workspace_bin("xroce");
    let server = Server::new(
        pair.b
            .command(&xroce)
            .args(["bench", "write", "--backend", "udp", "-d", &pair.if_b])
            .args(["--listen", &format!("{}:{port}", pair.addr_b)])
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start xroce bench server"),
    );
    let out = pair
        .a
        .command(&xroce)
        .args(["bench", "write", "--backend", "udp", "-d", &pair.if_a])
        .args(["--size", "64KiB", "--qps", "4", "--iters", "100", "--json"])
        .args(["--connect", &format!("{}:{port}", pair.addr_b)])
        .envs(env.iter().copied())
        .output()
        .expect("run xroce bench client");
    let srv = server.finish(Duration::from_secs(20));
    assert!(
        out.status.success(),
        "client failed: {}\nserver: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&srv.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let r: BenchReport =
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("client JSON {line:?}: {e}"));
    assert_eq!(r.verified, Some(true), "data not verified: {r:?}");
    assert_eq!(r.backend, "udp", "{r:?}");
    let packets = roce_packets(&cap.finish());
    (r, packets)
}

#[test]
fn each_qp_sends_from_its_own_udp_source_port() {
    require_root();
    let pair = VethPair::new(1500);
    let (a_ip, b_ip) = (pair.addr_a.octets(), pair.addr_b.octets());

    let (r, packets) = run(
        &pair,
        &[("XROCE_UDP_QP_PORTS", "1"), ("XROCE_UDP_GSO", "1")],
    );
    // QPN -> source ports seen towards it, per direction.
    let mut to_b: BTreeMap<u32, BTreeSet<u16>> = BTreeMap::new();
    let mut to_a: BTreeMap<u32, BTreeSet<u16>> = BTreeMap::new();
    for &(src, sport, dqpn) in &packets {
        if src == a_ip {
            to_b.entry(dqpn).or_default().insert(sport);
        } else if src == b_ip {
            to_a.entry(dqpn).or_default().insert(sport);
        }
    }
    let summary = format!("a->b {to_b:?}, b->a {to_a:?}, {r:?}");
    assert_eq!(to_b.len(), 4, "four QPs of b receive: {summary}");
    assert_eq!(to_a.len(), 4, "four QPs of a get ACKs: {summary}");
    // One port per QP, the one rxe's rule gives the QP with one of the
    // peer's QPs (which pairs with which is not on the wire; each port
    // must be a pair's).
    let (qa, qb): (Vec<u32>, Vec<u32>) = (
        to_a.keys().copied().collect(),
        to_b.keys().copied().collect(),
    );
    for (dir, seen, local, remote) in [("a->b", &to_b, &qa, &qb), ("b->a", &to_a, &qb, &qa)] {
        for (dqpn, ports) in seen {
            assert_eq!(
                ports.len(),
                1,
                "{dir}: QP {dqpn:#x} from {ports:?}: {summary}"
            );
            let p = *ports.first().unwrap();
            assert_ne!(p, ROCEV2_PORT, "{dir}: {summary}");
            assert!(
                local.iter().any(|&l| rocev2_src_port(0, l, *dqpn) == p),
                "{dir}: port {p:#x} to QP {dqpn:#x} is no QP pair's rocev2_src_port \
                 (local QPs {local:x?}): {summary}"
            );
            assert!(remote.contains(dqpn));
        }
        let ports: BTreeSet<u16> = seen.values().flatten().copied().collect();
        assert_eq!(ports.len(), 4, "{dir}: four QPs, four ports: {summary}");
    }
    eprintln!("per-QP ports: {summary}");

    // Without the opt-in: every packet from 4791, as before.
    let (_, packets) = run(&pair, &[("XROCE_UDP_GSO", "1")]);
    let ports: BTreeSet<u16> = packets.iter().map(|p| p.1).collect();
    assert!(!packets.is_empty());
    assert_eq!(ports, BTreeSet::from([ROCEV2_PORT]), "default: one port");
}
