//! RC over IPv6 between two simulated engines (link-local fe80::1 and
//! fe80::2): WRITE, SEND and READ deliver their data exactly, and every
//! frame on the link is RoCEv2 over IPv6 as xroce-wire parses it (ICRC
//! checked), between exactly those addresses, DSCP 0 and ECT(0) on all but
//! CNPs, flow label 0.

use std::net::{IpAddr, Ipv6Addr};

use xroce::verbs::sim::{connect_pair, sim_configs, sim_pair, LinkConfig, PairParams, Sim};
use xroce::verbs::*;
use xroce_wire::{parse_frame_checked, Gid, IpRepr, Opcode};

const MS: u64 = 1_000_000;

fn wait_wcs(sim: &mut Sim, cq: &CompletionQueue, n: usize) -> Vec<Wc> {
    let mut got = Vec::new();
    let deadline = sim.now + 100 * MS;
    let mut buf = vec![Wc::default(); 16];
    sim.run_until(deadline, |_| {
        let k = cq.poll(&mut buf).unwrap();
        got.extend_from_slice(&buf[..k]);
        got.len() >= n
    });
    got
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn rc_write_send_read_over_ipv6() {
    let mut sim = sim_pair(LinkConfig::default(), 6);
    let pcap = std::env::temp_dir().join(format!("xroce-ipv6-{}.pcap", std::process::id()));
    xroce::capture::record_sim_link(&mut sim.link, &pcap).unwrap();
    let p = PairParams {
        ipv6: true,
        psn_a: 0xff_fff0, // across the 24-bit wrap
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    let (ca, cb) = sim_configs();

    // WRITE 10 000 bytes (10 packets at MTU 1024) a -> b.
    let w = pattern(1, 10_000);
    // SAFETY: no WR uses these bytes yet; the engines run only in our calls.
    unsafe { a.mr.write(0, &w) }.unwrap();
    a.qp.post_send(&SendWr::new(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr() + 4096,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, w.len())],
    ))
    .unwrap();
    let wc = wait_wcs(&mut sim, &a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    // SAFETY: the WRITE completed; nothing else writes there.
    assert_eq!(unsafe { b.mr.to_vec(4096, w.len()) }.unwrap(), w);

    // SEND 3000 bytes b -> a.
    let s = pattern(2, 3000);
    a.qp.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: vec![a.mr.sge(100_000, 4096)],
    })
    .unwrap();
    // SAFETY: as above, bytes no WR uses.
    unsafe { b.mr.write(200_000, &s) }.unwrap();
    b.qp.post_send(&SendWr::new(
        2,
        WrOpcode::Send,
        vec![b.mr.sge(200_000, s.len())],
    ))
    .unwrap();
    let wc = wait_wcs(&mut sim, &b.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::Success));
    let wc = wait_wcs(&mut sim, &a.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (7, WcStatus::Success, 3000)
    );
    // SAFETY: the receive completed.
    assert_eq!(unsafe { a.mr.to_vec(100_000, s.len()) }.unwrap(), s);

    // READ back the written bytes b -> a (a reads b's memory).
    a.qp.post_send(&SendWr::new(
        3,
        WrOpcode::RdmaRead {
            remote_addr: b.mr.addr() + 4096,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(300_000, w.len())],
    ))
    .unwrap();
    let wc = wait_wcs(&mut sim, &a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (3, WcStatus::Success));
    // SAFETY: the READ completed.
    assert_eq!(unsafe { a.mr.to_vec(300_000, w.len()) }.unwrap(), w);

    drop(sim); // flush the capture
    let d = std::fs::read(&pcap).unwrap();
    std::fs::remove_file(&pcap).ok();
    let (ga, gb) = (Gid::from(ca.ipv6[0]), Gid::from(cb.ipv6[0]));
    let mut opcodes = std::collections::BTreeSet::new();
    let mut frames = 0;
    for pkt in xroce::capture::Capture::parse(&d).unwrap() {
        let pkt = pkt.unwrap();
        let (f, _) = parse_frame_checked(&pkt.data).expect("RoCEv2 frame, ICRC right");
        let IpRepr::V6(ip) = f.ip else {
            panic!("frame {frames} is not IPv6: {:?}", f.ip)
        };
        let pair = (f.ip.src_gid(), f.ip.dst_gid());
        assert!(pair == (ga, gb) || pair == (gb, ga), "addresses {pair:?}");
        assert_eq!(ip.flow_label, 0);
        assert_eq!(ip.traffic_class, 0b10, "DSCP 0, ECT(0)");
        opcodes.insert(f.transport.bth.opcode);
        frames += 1;
    }
    for op in [
        Opcode::RC_RDMA_WRITE_FIRST,
        Opcode::RC_RDMA_WRITE_MIDDLE,
        Opcode::RC_RDMA_WRITE_LAST,
        Opcode::RC_SEND_FIRST,
        Opcode::RC_SEND_LAST,
        Opcode::RC_RDMA_READ_REQUEST,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_ACKNOWLEDGE,
    ] {
        assert!(opcodes.contains(&op), "no {op} among {opcodes:?}");
    }
    assert!(frames >= 10 + 3 + 1 + 10, "{frames} frames");
    assert_eq!(
        IpAddr::from(ga),
        IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1))
    );
}

/// A connected IPv6 QP drops frames from another address (the peer check
/// works on IPv6 GIDs, not only IPv4 ones).
#[test]
fn ipv6_frames_from_another_address_are_dropped() {
    let mut sim = sim_pair(LinkConfig::default(), 7);
    let p = PairParams {
        ipv6: true,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![b.mr.sge(0, 64)],
    })
    .unwrap();
    let (ca, cb) = sim_configs();
    let mut t = xroce_wire::TransportRepr::new(xroce_wire::BthRepr::new(
        Opcode::RC_SEND_ONLY,
        b.qp.qp_num(),
        0,
    ));
    t.bth.ack_req = true;
    let spoofed: Ipv6Addr = "fe80::9".parse().unwrap();
    let mut buf = vec![0u8; 256];
    for src in [spoofed, ca.ipv6[0]] {
        let f = xroce_wire::FrameRepr::new(
            ca.mac,
            cb.mac,
            Gid::from(src),
            Gid::from(cb.ipv6[0]),
            0xc000,
            t,
        );
        let n = xroce_wire::emit_frame(&f, b"hello", &mut buf).unwrap();
        sim.b.handle_frame(&buf[..n], sim.now);
    }
    assert_eq!(sim.b.stats().rx_bad_header, 1, "the spoofed one");
    let wc = wait_wcs(&mut sim, &b.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (1, WcStatus::Success, 5)
    );
    drop(a);
}
