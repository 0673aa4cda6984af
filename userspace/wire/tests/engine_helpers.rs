//! The constants and helpers the transport engine takes from the codec
//! instead of keeping copies: header lengths, masks, opcode mapping between
//! services, DSCP/ECN on either IP version.

use xroce_wire::{
    emit_frame, parse_frame_checked, BthRepr, FrameRepr, Gid, HeaderSet, IpRepr, Opcode, Service,
    TransportRepr, MAX_OVERHEAD, PSN_MASK, QPN_MASK, ROCEV2_PORT,
};

#[test]
fn constants() {
    assert_eq!(ROCEV2_PORT, 4791);
    assert_eq!((QPN_MASK, PSN_MASK), (0x00ff_ffff, 0x00ff_ffff));
    // The AtomicETH of COMPARE_SWAP / FETCH_ADD is the longest.
    assert_eq!(HeaderSet::MAX_LEN, 28);
    assert_eq!(MAX_OVERHEAD, 14 + 40 + 8 + 12 + 28 + 3 + 4);
}

#[test]
fn max_overhead_bounds_every_frame() {
    let v6 = Gid::from_ipv6([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    for &op in Opcode::ALL {
        let t = TransportRepr::new(BthRepr::new(op, 1, 2));
        let f = FrameRepr::new([2; 6], [4; 6], v6, v6, 0xc000, t);
        for payload in [0usize, 1, 1021, 4096] {
            assert!(
                f.frame_len(payload) <= payload + MAX_OVERHEAD,
                "{op} {payload}"
            );
        }
    }
}

#[test]
fn in_service_maps_operations_between_services() {
    assert_eq!(
        Opcode::RC_SEND_ONLY.in_service(Service::Uc),
        Some(Opcode::UC_SEND_ONLY)
    );
    assert_eq!(
        Opcode::RC_SEND_ONLY_WITH_IMMEDIATE.in_service(Service::Ud),
        Some(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE)
    );
    assert_eq!(
        Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE.in_service(Service::Uc),
        Some(Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE)
    );
    assert_eq!(
        Opcode::UC_RDMA_WRITE_FIRST.in_service(Service::Rc),
        Some(Opcode::RC_RDMA_WRITE_FIRST)
    );
    // UD has no RDMA WRITE, UC no READ, nothing maps to or from CNP.
    assert_eq!(Opcode::RC_RDMA_WRITE_ONLY.in_service(Service::Ud), None);
    assert_eq!(Opcode::RC_RDMA_READ_REQUEST.in_service(Service::Uc), None);
    assert_eq!(Opcode::CNP.in_service(Service::Rc), None);
    assert_eq!(Opcode::RC_SEND_ONLY.in_service(Service::Cnp), None);
}

#[test]
fn dscp_and_ecn_on_both_ip_versions() {
    let v4 = Gid::from_ipv4([10, 0, 0, 1]);
    let v6 = Gid::from_ipv6([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    for (src, dst) in [(v4, v4), (v6, v6)] {
        let t = TransportRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, 1, 2));
        let mut f = FrameRepr::new([2; 6], [4; 6], src, dst, 0xc000, t);
        f.ip.set_dscp(26);
        f.ip.set_ecn(0b10);
        let mut buf = [0u8; 128];
        let n = emit_frame(&f, b"x", &mut buf).unwrap();
        let (back, _) = parse_frame_checked(&buf[..n]).unwrap();
        assert_eq!((back.ip.dscp(), back.ip.ecn()), (26, 0b10));
        if let IpRepr::V6(ip) = back.ip {
            assert_eq!(ip.traffic_class, (26 << 2) | 0b10);
        }
    }
}
