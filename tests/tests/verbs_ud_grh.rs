//! What a UD receive finds in front of its payload through the drop-in,
//! end to end on both backends: two C programs (tests/c/ud_grh_probe.c)
//! in two namespaces exchange datagrams from normal UD QPs, and each
//! reports its first receive's 40-byte GRH area and completion. RoCEv2
//! over IPv4, as rxe writes it and the RoCEv2 annex (A17.4.5.2) says: 20
//! zero bytes, then the IPv4 header as received (version/IHL, ECT(0) as
//! xroce sends, total length, DF, TTL 64, UDP, a valid checksum, the
//! peer's address, then ours, which UCX's UD transport compares with the
//! device's GIDs); the completion has IBV_WC_GRH and sl 0xa (mlx5's packet
//! type: UDP, IPv4), from which UCX 1.13 knows to read a 4-byte address.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use xroce_tests::{
    per_backend,
    programs::{serial, Backend, Topology},
    require_root,
    verbs::{compile_c, ibverbs_cdylib, require_verbs_header, workspace_root, Scratch},
};

const GRH_LEN: usize = 40;
/// UDP 8 + BTH 12 + DETH 8 + the probe's 16-byte payload + ICRC 4.
const AFTER_IP: usize = 48;
const RUN: Duration = Duration::from_secs(40);

per_backend!(ipv4_grh_and_completion);

fn build_probe(b: Backend) -> (Scratch, PathBuf) {
    require_root();
    require_verbs_header();
    let _ = ibverbs_cdylib();
    let dir = Scratch::new(&format!("ud-grh-{}", b.as_str()));
    let exe = dir.0.join("ud_grh_probe");
    compile_c(
        &workspace_root().join("tests/c/ud_grh_probe.c"),
        &exe,
        &["-libverbs"],
    );
    (dir, exe)
}

/// The value of the probe's `key value` line.
fn fact<'a>(stdout: &'a str, key: &str) -> Option<&'a str> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// RFC 1071: 0 over a header with its checksum in place means it is valid.
fn checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Everything wrong with one side's report (`me` received from `peer`).
fn problems(stdout: &str, me: Ipv4Addr, peer: Ipv4Addr) -> Vec<String> {
    let mut p = Vec::new();
    for (k, want) in [
        ("qpn", "0x11"),
        ("up", "0"),
        ("status", "0"),
        ("grh_flag", "1"),
        ("sl", "10"),
        ("byte_len", "56"),
        ("src_qp", "0x11"),
        ("payload_intact", "1"),
        ("heard", "1"),
        ("send_errors", "0"),
        ("destroy", "0"),
        ("done", "1"),
    ] {
        if fact(stdout, k) != Some(want) {
            p.push(format!("{k}: want {want}, got {:?}", fact(stdout, k)));
        }
    }
    let grh = hex(fact(stdout, "grh").unwrap_or(""));
    if grh.len() != GRH_LEN {
        p.push(format!("grh: {} bytes", grh.len()));
        return p;
    }
    let ip = &grh[20..];
    let total = (20 + AFTER_IP) as u16;
    let checks = [
        ("first 20 bytes zero", grh[..20].iter().all(|&b| b == 0)),
        ("version 4, IHL 5", ip[0] == 0x45),
        ("ECT(0)", ip[1] & 3 == 2),
        ("total length", u16::from_be_bytes([ip[2], ip[3]]) == total),
        ("DF, no fragment", ip[6..8] == [0x40, 0]),
        ("TTL 64", ip[8] == 64),
        ("protocol UDP", ip[9] == 17),
        ("valid checksum", checksum(ip) == 0),
        ("source: the peer", ip[12..16] == peer.octets()),
        ("destination: us", ip[16..20] == me.octets()),
    ];
    for (what, ok) in checks {
        if !ok {
            p.push(format!("GRH {what}: {grh:02x?}"));
        }
    }
    p
}

fn ipv4_grh_and_completion(b: Backend) {
    let (_dir, exe) = build_probe(b);
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let exe = exe.to_string_lossy().to_string();
    let (server, client) = (t.server(), t.client());
    // The probes address each other's UD QP by the well-known number
    // 0x11: QPNs from the start of the block, not at random.
    let side = |me: xroce_tests::programs::Node<'_>, peer: Ipv4Addr| {
        let args = [me.addr.to_string(), peer.to_string()];
        let mut cmd = t.command(me, &exe, &args);
        cmd.env("XROCE_QPN_OFFSET", "0");
        let what = format!(
            "[{} in {}] {exe} {}",
            b.as_str(),
            me.ns.name,
            args.join(" ")
        );
        xroce_tests::programs::Proc::spawn(cmd, what, &t.dir.0)
    };
    let ps = side(server, client.addr);
    let pc = side(client, server.addr);
    let mut all = Vec::new();
    for (p, me, peer) in [
        (ps, server.addr, client.addr),
        (pc, client.addr, server.addr),
    ] {
        let f = p.finish(RUN);
        let wrong = problems(&f.stdout, me, peer);
        if !wrong.is_empty() || !f.success() {
            all.push(format!("{}\n{}", wrong.join("\n"), f.describe()));
        }
    }
    assert!(all.is_empty(), "{}: {}", b.as_str(), all.join("\n\n"));
}
