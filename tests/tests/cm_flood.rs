//! A REQ flood at a real RDMA-CM listener (issue 25, item 2), on both
//! backends: crafted REQ MADs, each a new connection request, sent as raw
//! RoCEv2 UD SEND frames to the listener's GSI QP from the other namespace
//! while the listener fetches no event (tests/c/cm_flood_listener.c, `rdma_listen(id, -1)`: no limit
//! asked for, so ucma's maximum of 1024 applies).
//!
//! Asserted: the listener survives; exactly [`MAX_BACKLOG`] requests were
//! queued for it (the rest dropped, as Linux's ib_cm drops a REQ ucma has
//! no room for); its RSS grew by less than [`RSS_BOUND_KB`]; and a
//! legitimate client connects afterwards.
//!
//! The listener is a C program rather than rping or ucmatose: rping listens
//! with a backlog of 3, and ucmatose accepts the first (flood) request and
//! fails when it never completes; neither shows a backlog of 0 or -1 filling.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    time::{Duration, Instant},
};

use xroce_cm::{CmConfig, CmEngine, ConnectParams, PathParams, MAX_BACKLOG};
use xroce_tests::{
    datagram::EthernetSender,
    in_netns,
    programs::{args, next_port, serial, Backend, Proc, Topology},
    require_root,
    verbs::{compile_c, ibverbs_cdylib, rdmacm_cdylib, workspace_root},
    Netns,
};
use xroce_wire::{
    cm::{CmMadRepr, CmMessage, RejReason},
    emit_frame,
    rdma_cm::{service_id, CmaHeader, PortSpace, CMA_HEADER_LEN, CMA_VERSION},
    BthRepr, DethRepr, FrameRepr, Gid, IpRepr, Opcode, TransportRepr, ROCEV2_PORT,
};

/// Connection requests in the flood: far more than the backlog.
const FLOOD: u32 = 8_000;
/// The listener's RSS may grow by this much under the flood. Each queued
/// request costs the library a few hundred bytes (engine state, event, new
/// id: about 2 kB measured), so 1024 of them stay below; thousands do not
/// (before the cap: all 8,000 queued, +16 MB; after: 1024, +3.3 MB).
const RSS_BOUND_KB: i64 = 8 * 1024;
/// REQs sent before waiting for the listener to catch up: fewer than the
/// library's GSI QP has receives posted (64).
const BURST: u32 = 48;
const GSI_QKEY: u32 = 0x8001_0000;
/// The client's side of the link, where the crafted frames leave.
struct Wire {
    sender: EthernetSender,
    client_mac: [u8; 6],
    server_mac: [u8; 6],
}

/// The MAC address of `iface` in namespace `ns` (`ip -br link`).
fn mac_of(ns: &Netns, iface: &str) -> [u8; 6] {
    let out = ns.exec(&["ip", "-br", "link", "show", "dev", iface]);
    let text = String::from_utf8_lossy(&out.stdout);
    let field = text
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("no MAC for {iface} in `{text}`"));
    let mut mac = [0u8; 6];
    for (m, h) in mac.iter_mut().zip(field.split(':')) {
        *m = u8::from_str_radix(h, 16).expect("hex MAC");
    }
    mac
}

/// Sends `mad` as a RoCEv2 UD SEND from the client's GSI QP to the
/// server's, a whole Ethernet frame as rxe would send it (UDP source port
/// 4791, IPv4 DF, identification 0), so both backends see one frame.
fn send_gsi(wire: &Wire, reqs: &Requests, psn: u32, mad: &[u8]) {
    let mut t = TransportRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, 1, psn));
    t.deth = Some(DethRepr {
        qkey: GSI_QKEY,
        src_qp: 1,
    });
    let mut repr = FrameRepr::new(
        wire.client_mac,
        wire.server_mac,
        Gid::from_ipv4(reqs.client.octets()),
        Gid::from_ipv4(reqs.server.octets()),
        ROCEV2_PORT,
        t,
    );
    if let IpRepr::V4(ip) = &mut repr.ip {
        ip.ident = 0;
        ip.dont_frag = true;
    }
    let mut frame = vec![0u8; repr.frame_len(mad.len())];
    emit_frame(&repr, mad, &mut frame).expect("emit the REQ frame");
    wire.sender.send(&frame);
}

/// REQs from `client` to `server`'s `port` as rdma_cm sends them (CMA
/// header in the private data), each a new connection (comm ID, QPN); the
/// REQ's comm IDs come back in REJs.
struct Requests {
    engine: CmEngine,
    client: Ipv4Addr,
    server: Ipv4Addr,
    next_qpn: u32,
}

impl Requests {
    fn new(client: Ipv4Addr, server: Ipv4Addr) -> Self {
        let gid = Gid::from_ipv4(client.octets());
        Requests {
            engine: CmEngine::new(CmConfig::new(vec![gid], 0xf100_d000, 25)),
            client,
            server,
            next_qpn: 0x100,
        }
    }

    fn req(&mut self, port: u16) -> Vec<u8> {
        let mut p = ConnectParams::new(
            service_id(PortSpace::Tcp, port),
            self.next_qpn,
            0,
            PathParams::roce(
                Gid::from_ipv4(self.client.octets()),
                Gid::from_ipv4(self.server.octets()),
                3,
                0,
            ),
        );
        self.next_qpn += 1;
        let mut cma = vec![0u8; CMA_HEADER_LEN];
        CmaHeader {
            cma_version: CMA_VERSION,
            src_port: 40000,
            src_ip: self.client.into(),
            dst_ip: self.server.into(),
        }
        .emit(&mut cma)
        .unwrap();
        p.private_data = cma;
        self.engine.connect(&p, 0).expect("build a REQ");
        self.engine.poll_transmit().expect("the REQ").mad.to_vec()
    }
}

/// Sends a REQ to `port + 1`, where nobody listens, until its REJ comes
/// back (a lost one is sent again): the listener's CM has handled every
/// REQ sent before it (one GSI QP, in order) once the REJ is here.
fn round_trip(
    sock: &UdpSocket,
    wire: &Wire,
    reqs: &mut Requests,
    port: u16,
    psn: u32,
) -> Result<(), String> {
    let marker = reqs.req(port + 1);
    let marker_id = u32::from_be_bytes(marker[24..28].try_into().unwrap());
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        send_gsi(wire, reqs, psn, &marker);
        let resent = Instant::now() + Duration::from_millis(200);
        while Instant::now() < resent {
            let Ok(n) = sock.recv(&mut buf) else { break };
            // BTH 12 + DETH 8, then the MAD.
            let Some(mad) = buf.get(20..n.saturating_sub(4)) else {
                continue;
            };
            let Ok(m) = CmMadRepr::parse(mad) else {
                continue;
            };
            match m.message {
                CmMessage::Rej(r) if r.remote_comm_id == marker_id => {
                    return if r.reason == RejReason::InvalidServiceId {
                        Ok(())
                    } else {
                        Err(format!("the marker REQ got REJ {:?}", r.reason))
                    };
                }
                _ => {}
            }
        }
    }
    Err("no REJ for a marker REQ within 60 s: the listener's CM is stuck".into())
}

/// Floods `port` with [`FLOOD`] REQs in bursts of [`BURST`], each burst
/// followed by a [`round_trip`] so that the listener's receive queues do
/// not overflow (the assertion needs more than the backlog to arrive).
/// Returns how long it took.
fn flood(wire: Wire, client: Ipv4Addr, server: Ipv4Addr, port: u16) -> Result<Duration, String> {
    // The REJs come back to the client's RoCEv2 port, where nobody else
    // listens (the client's xroce starts later).
    let sock = UdpSocket::bind(SocketAddrV4::new(client, ROCEV2_PORT))
        .map_err(|e| format!("bind {client}:{ROCEV2_PORT} for the REJs: {e}"))?;
    let mut reqs = Requests::new(client, server);
    let t0 = Instant::now();
    for i in 0..FLOOD {
        let req = reqs.req(port);
        send_gsi(&wire, &reqs, i, &req);
        if i % BURST == BURST - 1 || i == FLOOD - 1 {
            round_trip(&sock, &wire, &mut reqs, port, i)?;
        }
    }
    Ok(t0.elapsed())
}

fn value(stdout: &str, key: &str) -> Option<i64> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

/// Waits until `p` printed `needle`; fails if it exits first.
fn wait_for(p: &mut Proc, needle: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !p.stdout_so_far().contains(needle) {
        if p.exited() || Instant::now() > deadline {
            return Err(format!("{} never printed {needle:?}", p.what));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn req_flood(b: Backend) {
    require_root();
    let _ = (ibverbs_cdylib(), rdmacm_cdylib());
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let exe = t.dir.0.join("cm_flood_listener");
    compile_c(
        &workspace_root().join("tests/c/cm_flood_listener.c"),
        &exe,
        &["-lrdmacm", "-libverbs"],
    );
    let exe = exe.to_string_lossy().into_owned();
    let (client, server) = (t.client().addr, t.server().addr);
    let port = next_port();
    let go = t.dir.0.join("go");
    let mut listener = t.start(
        t.server(),
        &exe,
        &args(&[
            "listen",
            &server.to_string(),
            &port.to_string(),
            "-1",
            &go.to_string_lossy(),
        ]),
    );
    wait_for(&mut listener, "listening").unwrap();
    let iface = t.client().iface.to_string();
    let client_mac = mac_of(t.client().ns, t.client().iface);
    let server_mac = mac_of(t.server().ns, t.server().iface);
    let sent = in_netns(&t.client().ns.name, move || {
        let wire = Wire {
            sender: EthernetSender::new(&iface),
            client_mac,
            server_mac,
        };
        flood(wire, client, server, port)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", listener.stderr_so_far()));
    assert!(!listener.exited(), "the listener died under the flood");
    std::fs::write(&go, b"go").unwrap();
    wait_for(&mut listener, "queued_requests").unwrap();
    let out = listener.stdout_so_far();
    let before = value(&out, "listening rss_kb").expect("RSS before");
    let after = value(&out, "busy_done rss_kb").expect("RSS after");
    let queued = value(&out, "queued_requests").expect("queued requests");
    eprintln!(
        "{FLOOD} REQs sent in {sent:?}; queued {queued}; RSS {before} kB -> {after} kB ({:+} kB)",
        after - before
    );
    assert_eq!(
        queued, MAX_BACKLOG as i64,
        "the listener must hold exactly the maximum backlog of requests"
    );
    assert!(
        after - before < RSS_BOUND_KB,
        "RSS grew by {} kB under the flood (bound {RSS_BOUND_KB} kB)",
        after - before
    );

    let client_run = t.start(
        t.client(),
        &exe,
        &args(&["connect", &server.to_string(), &port.to_string()]),
    );
    let c = client_run.finish(Duration::from_secs(90));
    assert!(c.success(), "the client after the flood:\n{}", c.describe());
    assert!(c.stdout.contains("connected"), "{}", c.describe());
    let l = listener.finish(Duration::from_secs(60));
    assert!(l.success(), "the listener:\n{}", l.describe());
    assert!(
        l.stdout.contains("established") && l.stdout.contains("disconnected"),
        "{}",
        l.describe()
    );
}

#[test]
fn req_flood_udp() {
    req_flood(Backend::Udp);
}

#[test]
fn req_flood_afxdp() {
    req_flood(Backend::AfXdp);
}
