//! Property tests: every header's repr round-trips through emit/parse, every
//! opcode round-trips as a whole frame with a valid ICRC, parsing arbitrary
//! bytes never panics, and the 24-bit PSN laws hold across the wrap.

use proptest::prelude::*;
use xroce_wire::aeth::{AethRepr, Syndrome};
use xroce_wire::bth::BthRepr;
use xroce_wire::eth::{EthRepr, VlanTag, TPID_8021AD, TPID_8021Q};
use xroce_wire::ext::*;
use xroce_wire::psn::*;
use xroce_wire::*;

fn opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::ALL.to_vec())
}

fn vlan(tpid: u16) -> impl Strategy<Value = VlanTag> {
    (0u8..8, any::<bool>(), 0u16..4096).prop_map(move |(pcp, dei, vid)| VlanTag {
        tpid,
        pcp,
        dei,
        vid,
    })
}

fn eth_repr() -> impl Strategy<Value = EthRepr> {
    let tags = prop_oneof![
        Just((None, None)).boxed(),
        vlan(TPID_8021Q).prop_map(|v| (None, Some(v))).boxed(),
        (vlan(TPID_8021AD), vlan(TPID_8021Q))
            .prop_map(|(s, c)| (Some(s), Some(c)))
            .boxed(),
    ];
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        tags,
        prop_oneof![Just(0x0800u16), Just(0x86dd)],
    )
        .prop_map(|(dst, src, (svlan, vlan), ethertype)| EthRepr {
            dst,
            src,
            svlan,
            vlan,
            ethertype,
        })
}

fn ipv4_repr() -> impl Strategy<Value = Ipv4Repr> {
    (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        0u8..64,
        0u8..4,
        any::<u16>(),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|(src, dst, dscp, ecn, ident, dont_frag, ttl)| Ipv4Repr {
            src,
            dst,
            dscp,
            ecn,
            ident,
            dont_frag,
            ttl,
            payload_len: 0,
        })
}

fn ipv6_repr() -> impl Strategy<Value = Ipv6Repr> {
    (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        any::<u8>(),
        0u32..(1 << 20),
        any::<u8>(),
    )
        .prop_map(
            |(src, dst, traffic_class, flow_label, hop_limit)| Ipv6Repr {
                src,
                dst,
                traffic_class,
                flow_label,
                hop_limit,
                payload_len: 0,
            },
        )
}

fn ip_repr() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        ipv4_repr().prop_map(IpRepr::V4),
        ipv6_repr().prop_map(IpRepr::V6)
    ]
}

fn udp_repr() -> impl Strategy<Value = UdpRepr> {
    let ck = prop_oneof![
        Just(UdpChecksum::Zero),
        Just(UdpChecksum::Compute),
        (1u16..).prop_map(UdpChecksum::Value)
    ];
    (any::<u16>(), ck).prop_map(|(src_port, checksum)| UdpRepr {
        src_port,
        dst_port: ROCEV2_PORT,
        checksum,
    })
}

fn bth_repr(op: impl Strategy<Value = Opcode>) -> impl Strategy<Value = BthRepr> {
    (
        op,
        any::<[bool; 6]>(),
        any::<u16>(),
        0u32..(1 << 24),
        0u32..(1 << 24),
        0u16..=xroce_wire::delay_echo::MAX_CODE,
    )
        .prop_map(
            |(
                opcode,
                [solicited, mig_req, fecn, becn, sr_capable, ack_req],
                pkey,
                dest_qp,
                psn,
                delay_echo,
            )| BthRepr {
                opcode,
                solicited,
                mig_req,
                pkey,
                fecn,
                becn,
                sr_capable,
                delay_echo,
                dest_qp,
                ack_req,
                psn,
            },
        )
}

fn syndrome() -> impl Strategy<Value = Syndrome> {
    any::<u8>().prop_map(Syndrome::from_u8)
}

prop_compose! {
    fn ext_values()(
        qkey in any::<u32>(), src_qp in 0u32..(1 << 24),
        sel in 0u8..4, plt in 0u8..16,
        va in any::<u64>(), rkey in any::<u32>(), dma_len in any::<u32>(),
        swap_add in any::<u64>(), compare in any::<u64>(),
        syn in syndrome(), msn in 0u32..(1 << 24),
        orig in any::<u64>(), imm in any::<u32>(), inv in any::<u32>(),
    ) -> (DethRepr, FethRepr, RethRepr, AtomicEthRepr, AethRepr, AtomicAckEthRepr, u32, u32) {
        (
            DethRepr { qkey, src_qp },
            FethRepr { selectivity: sel, placement_type: plt },
            RethRepr { va, rkey, dma_len },
            AtomicEthRepr { va, rkey, swap_add, compare },
            AethRepr { syndrome: syn, msn },
            AtomicAckEthRepr { orig_data: orig },
            imm,
            inv,
        )
    }
}

/// A transport repr for `op` with exactly the headers it carries.
fn transport_for(op: impl Strategy<Value = Opcode>) -> impl Strategy<Value = TransportRepr> {
    (bth_repr(op), ext_values()).prop_map(
        |(bth, (deth, feth, reth, aeth_atomic, aeth, ack, imm, inv))| {
            let h = bth.opcode.headers();
            let mut t = TransportRepr::new(bth);
            let pick = |set: HeaderSet| h.contains(set);
            t.deth = pick(HeaderSet::DETH).then_some(deth);
            t.feth = pick(HeaderSet::FETH).then_some(feth);
            t.reth = pick(HeaderSet::RETH).then_some(reth);
            t.atomic_eth = pick(HeaderSet::ATOMIC_ETH).then_some(aeth_atomic);
            t.aeth = pick(HeaderSet::AETH).then_some(aeth);
            t.atomic_ack_eth = pick(HeaderSet::ATOMIC_ACK_ETH).then_some(ack);
            t.imm_data = pick(HeaderSet::IMM_DT).then_some(imm);
            t.invalidate_rkey = pick(HeaderSet::IETH).then_some(inv);
            t
        },
    )
}

fn transport_and_payload() -> impl Strategy<Value = (TransportRepr, Vec<u8>)> {
    transport_for(opcode()).prop_flat_map(|t| {
        let max = if t.bth.opcode.has_payload() { 300 } else { 0 };
        (Just(t), proptest::collection::vec(any::<u8>(), 0..=max))
    })
}

fn frame_and_payload() -> impl Strategy<Value = (FrameRepr, Vec<u8>)> {
    (eth_repr(), ip_repr(), udp_repr(), transport_and_payload()).prop_map(
        |(mut eth, ip, udp, (transport, p))| {
            eth.ethertype = match ip {
                IpRepr::V4(_) => 0x0800,
                IpRepr::V6(_) => 0x86dd,
            };
            (
                FrameRepr {
                    eth,
                    ip,
                    udp,
                    transport,
                },
                p,
            )
        },
    )
}

/// Normalize the fields emit derives so a parsed repr compares equal.
fn normalized(mut r: FrameRepr, parsed: &FrameRepr) -> FrameRepr {
    match (&mut r.ip, &parsed.ip) {
        (IpRepr::V4(a), IpRepr::V4(b)) => a.payload_len = b.payload_len,
        (IpRepr::V6(a), IpRepr::V6(b)) => a.payload_len = b.payload_len,
        _ => {}
    }
    if r.udp.checksum == UdpChecksum::Compute {
        r.udp.checksum = parsed.udp.checksum;
    }
    r
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn eth_roundtrip(e in eth_repr()) {
        let mut b = [0u8; 22];
        let n = e.emit(&mut b).unwrap();
        prop_assert_eq!(n, e.header_len());
        let (p, m) = EthRepr::parse(&b[..n]).unwrap();
        prop_assert_eq!(m, n);
        prop_assert_eq!(p, e);
    }

    #[test]
    fn ipv4_roundtrip(mut r in ipv4_repr(), len in 0u16..1500) {
        r.payload_len = len;
        let mut b = vec![0u8; 20 + len as usize];
        r.emit(&mut b).unwrap();
        prop_assert!(xroce_wire::ipv4::Ipv4Packet::new_checked(&b[..]).unwrap().verify_checksum());
        prop_assert_eq!(Ipv4Repr::parse(&b).unwrap(), r);
    }

    #[test]
    fn ipv6_roundtrip(mut r in ipv6_repr(), len in 0u16..1500) {
        r.payload_len = len;
        let mut b = vec![0u8; 40 + len as usize];
        r.emit(&mut b).unwrap();
        prop_assert_eq!(Ipv6Repr::parse(&b).unwrap(), r);
    }

    #[test]
    fn udp_roundtrip(r in udp_repr(), len in 0usize..100) {
        let mut b = vec![0u8; 8 + len];
        r.emit(&mut b, len).unwrap();
        let (p, payload) = UdpRepr::parse(&b).unwrap();
        prop_assert_eq!(payload.len(), len);
        let want = if r.checksum == UdpChecksum::Compute { UdpChecksum::Zero } else { r.checksum };
        prop_assert_eq!(p, UdpRepr { checksum: want, ..r });
    }

    #[test]
    fn bth_roundtrip(r in bth_repr(opcode()), pad in 0u8..4) {
        let mut b = [0u8; 12];
        r.emit(&mut b, pad).unwrap();
        prop_assert_eq!(BthRepr::parse(&b).unwrap(), (r, pad));
    }

    #[test]
    fn ext_roundtrips(v in ext_values()) {
        let (deth, feth, reth, atomic, aeth, ack, imm, inv) = v;
        let mut b = [0u8; 28];
        deth.emit(&mut b).unwrap(); prop_assert_eq!(DethRepr::parse(&b).unwrap(), deth);
        feth.emit(&mut b).unwrap(); prop_assert_eq!(FethRepr::parse(&b).unwrap(), feth);
        reth.emit(&mut b).unwrap(); prop_assert_eq!(RethRepr::parse(&b).unwrap(), reth);
        atomic.emit(&mut b).unwrap(); prop_assert_eq!(AtomicEthRepr::parse(&b).unwrap(), atomic);
        aeth.emit(&mut b).unwrap(); prop_assert_eq!(AethRepr::parse(&b).unwrap(), aeth);
        ack.emit(&mut b).unwrap(); prop_assert_eq!(AtomicAckEthRepr::parse(&b).unwrap(), ack);
        ImmDtRepr { imm }.emit(&mut b).unwrap(); prop_assert_eq!(ImmDtRepr::parse(&b).unwrap().imm, imm);
        IethRepr { rkey: inv }.emit(&mut b).unwrap(); prop_assert_eq!(IethRepr::parse(&b).unwrap().rkey, inv);
    }

    #[test]
    fn syndrome_byte_roundtrip(s in any::<u8>()) {
        prop_assert_eq!(Syndrome::from_u8(s).to_u8(), s);
    }

    #[test]
    fn transport_roundtrip((t, payload) in transport_and_payload()) {
        let mut b = vec![0u8; t.buffer_len(payload.len())];
        let n = emit_transport(&t, &payload, &mut b).unwrap();
        prop_assert_eq!(n, b.len());
        prop_assert_eq!(n % 4, 0);
        let (p, pl) = parse_transport(&b).unwrap();
        prop_assert_eq!(p, t);
        prop_assert_eq!(pl, &payload[..]);
    }

    #[test]
    fn frame_roundtrip_every_opcode((r, payload) in frame_and_payload()) {
        let mut b = vec![0u8; r.frame_len(payload.len())];
        let n = emit_frame(&r, &payload, &mut b).unwrap();
        prop_assert_eq!(n, b.len());
        icrc::verify_frame(&b).unwrap();
        let (p, pl) = parse_frame_checked(&b).unwrap();
        prop_assert_eq!(pl, &payload[..]);
        prop_assert_eq!(p, normalized(r, &p));
        // emit(parse(frame)) == frame
        let mut again = vec![0u8; n];
        emit_frame(&p, pl, &mut again).unwrap();
        prop_assert_eq!(again, b.clone());
        // A computed UDP checksum verifies.
        if r.udp.checksum == UdpChecksum::Compute {
            let l4 = r.eth.header_len() + r.ip.header_len();
            let (s, d) = match r.ip { IpRepr::V4(_) => (&b[l4 - 8..l4 - 4], &b[l4 - 4..l4]),
                                      IpRepr::V6(_) => (&b[l4 - 32..l4 - 16], &b[l4 - 16..l4]) };
            prop_assert_eq!(xroce_wire::udp::udp_checksum(s, d, &b[l4..]), u16::from_be_bytes([b[l4 + 6], b[l4 + 7]]));
        }
    }

    /// Filling the payload in place gives the very frame emit_frame
    /// copies; a fill that fails is the emit's error.
    #[test]
    fn in_place_emit_is_emit((r, payload) in frame_and_payload()) {
        let mut want = vec![0u8; r.frame_len(payload.len())];
        emit_frame(&r, &payload, &mut want).unwrap();
        let op = r.transport.bth.opcode;
        let mut got = vec![0xa5u8; want.len()];
        let n = emit_frame_in_place(&r, payload.len(), &mut got, |p| {
            p.copy_from_slice(&payload);
            Ok(())
        });
        if !op.has_payload() && !payload.is_empty() {
            // An ACK's SACK block goes through emit_frame alone.
            prop_assert_eq!(n, Err(Error::UnexpectedPayload(op as u8)));
            return Ok(());
        }
        prop_assert_eq!(n, Ok(want.len()));
        prop_assert_eq!(&got, &want);
        let failed = emit_frame_in_place(&r, payload.len(), &mut got, |_| Err(Error::PayloadUnavailable));
        prop_assert_eq!(failed, Err(Error::PayloadUnavailable));
    }

    #[test]
    fn icrc_detects_corruption_and_ignores_masked_fields((r, payload) in frame_and_payload(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut b = vec![0u8; r.frame_len(payload.len())];
        emit_frame(&r, &payload, &mut b).unwrap();
        let ip = r.eth.header_len();
        let l4 = ip + r.ip.header_len();
        let masked: Vec<usize> = match r.ip {
            IpRepr::V4(_) => vec![ip + 1, ip + 8, ip + 10, ip + 11],
            IpRepr::V6(_) => vec![ip, ip + 1, ip + 2, ip + 3, ip + 7],
        }.into_iter().chain([l4 + 6, l4 + 7, l4 + 8 + 4]).collect();
        // Flipping any bit in a masked field leaves the ICRC valid.
        for &m in &masked {
            let mut c = b.clone();
            c[m] ^= if m == ip && matches!(r.ip, IpRepr::V6(_)) { 0x0f } else { 1 << bit };
            prop_assert!(icrc::frame_icrc(&c).map(|(a, f)| a == f).unwrap_or(true));
        }
        // Flipping a bit of the payload, ext headers or BTH (not byte 4) breaks it.
        let from = l4 + 8;
        let covered: Vec<usize> = (from..b.len() - 4).filter(|&i| i != from + 4).collect();
        let i = covered[pos.index(covered.len())];
        b[i] ^= 1 << bit;
        let (c, f) = icrc::frame_icrc(&b).unwrap();
        prop_assert_ne!(c, f);
    }

    #[test]
    fn parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_frame(&data);
        let _ = parse_transport(&data);
        let _ = icrc::frame_icrc(&data);
        let _ = EthRepr::parse(&data);
        let _ = Ipv4Repr::parse(&data);
        let _ = Ipv6Repr::parse(&data);
        let _ = UdpRepr::parse(&data);
        let _ = BthRepr::parse(&data);
    }

    #[test]
    fn parse_never_panics_on_mutated_frames((r, payload) in frame_and_payload(), edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4), cut in any::<prop::sample::Index>()) {
        let mut b = vec![0u8; r.frame_len(payload.len())];
        emit_frame(&r, &payload, &mut b).unwrap();
        for (i, v) in edits {
            let i = i.index(b.len());
            b[i] = v;
        }
        let _ = parse_frame_checked(&b);
        let n = cut.index(b.len() + 1);
        let _ = parse_frame_checked(&b[..n]);
        let _ = icrc::frame_icrc(&b[..n]);
    }

    // ---- PSN laws, with values concentrated around the 2^24 wrap.
    #[test]
    fn psn_add_sub_inverse(a in psn_near_wrap(), n in any::<u32>()) {
        prop_assert_eq!(psn_sub(psn_add(a, n), n), a);
        prop_assert!(psn_add(a, n) <= PSN_MASK);
    }

    #[test]
    fn psn_diff_of_add(a in psn_near_wrap(), n in 0u32..PSN_HALF) {
        prop_assert_eq!(psn_diff(psn_add(a, n), a), n as i32);
        prop_assert_eq!(psn_diff(a, psn_add(a, n)), -(n as i32));
        prop_assert_eq!(psn_distance(a, psn_add(a, n)), n);
        prop_assert!(psn_in_window(a, n + 1, psn_add(a, n)));
        prop_assert!(!psn_in_window(a, n, psn_add(a, n)));
        if n > 0 {
            prop_assert!(psn_lt(a, psn_add(a, n)));
            prop_assert!(psn_gt(psn_add(a, n), a));
            prop_assert!(!psn_lt(psn_add(a, n), a));
        }
    }

    #[test]
    fn psn_order_antisymmetric(a in psn_near_wrap(), b in psn_near_wrap()) {
        prop_assert!(!(psn_lt(a, b) && psn_lt(b, a)));
        prop_assert!(!(psn_lt(a, b) && psn_lt(b, psn_add(a, 1)) && a != b && psn_distance(a, b) < PSN_HALF - 1));
        prop_assert_eq!(psn_lt(a, b) || psn_lt(b, a), a != b);
        prop_assert_eq!(psn_cmp(a, b), psn_cmp(b, a).reverse());
        prop_assert_eq!(psn_le(a, b), !psn_gt(a, b));
        prop_assert_eq!(psn_ge(a, b), !psn_lt(a, b));
        if psn_distance(a, b) != PSN_HALF {
            prop_assert_eq!(psn_lt(a, b), psn_diff(a, b) < 0);
        }
        let d = psn_diff(a, b);
        prop_assert!((-(PSN_HALF as i32)..PSN_HALF as i32).contains(&d));
        prop_assert_eq!(psn_add(b, d as u32), a);
        prop_assert_eq!(Psn::new(a).diff(Psn::new(b)), d);
    }
}

fn psn_near_wrap() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..(1 << 24),
        ((1u32 << 24) - 64)..(1 << 24),
        0u32..64,
        (PSN_HALF - 32)..(PSN_HALF + 32),
    ]
}

#[test]
fn psn_wrap_examples() {
    assert_eq!(psn_add(0xff_ffff, 1), 0);
    assert_eq!(psn_sub(0, 1), 0xff_ffff);
    assert!(psn_lt(0xff_fffe, 0x00_0001));
    assert_eq!(psn_diff(0x00_0001, 0xff_fffe), 3);
    assert_eq!(psn_distance(0xff_fffe, 0x00_0001), 3);
    assert!(psn_in_window(0xff_fff0, 0x20, 0x00_000f));
    assert!(!psn_in_window(0xff_fff0, 0x20, 0x00_0010));
    assert_eq!(Psn::new(0xff_ffff).next(), Psn::ZERO);
    // Exactly opposite: one direction only.
    assert!(psn_lt(0x80_0000, 0) ^ psn_lt(0, 0x80_0000));
}

#[test]
fn opcode_byte_decoding_is_total() {
    let mut ok = 0;
    for v in 0..=255u8 {
        match Opcode::from_u8(v) {
            Ok(o) => {
                assert_eq!(o.as_u8(), v);
                ok += 1;
            }
            Err(e) => assert_eq!(e, Error::UnknownOpcode(v)),
        }
    }
    assert_eq!(ok, Opcode::ALL.len());
}

/// The header table, written out independently from IBTA vol. 1 table 39
/// (and rxe_opcode.c) rather than derived from the codec's own table.
#[test]
fn opcode_header_table_matches_ibta() {
    use HeaderSet as H;
    let e = H::EMPTY;
    let table: &[(u8, HeaderSet, bool)] = &[
        (0x00, e, true),
        (0x01, e, true),
        (0x02, e, true),
        (0x03, H::IMM_DT, true),
        (0x04, e, true),
        (0x05, H::IMM_DT, true),
        (0x06, H::RETH, true),
        (0x07, e, true),
        (0x08, e, true),
        (0x09, H::IMM_DT, true),
        (0x0a, H::RETH, true),
        (0x0b, H::RETH | H::IMM_DT, true),
        (0x0c, H::RETH, false),
        (0x0d, H::AETH, true),
        (0x0e, e, true),
        (0x0f, H::AETH, true),
        (0x10, H::AETH, true),
        (0x11, H::AETH, false),
        (0x12, H::AETH | H::ATOMIC_ACK_ETH, false),
        (0x13, H::ATOMIC_ETH, false),
        (0x14, H::ATOMIC_ETH, false),
        (0x16, H::IETH, true),
        (0x17, H::IETH, true),
        (0x1c, H::FETH | H::RETH, false),
        (0x1d, H::RETH, true),
        (0x20, e, true),
        (0x21, e, true),
        (0x22, e, true),
        (0x23, H::IMM_DT, true),
        (0x24, e, true),
        (0x25, H::IMM_DT, true),
        (0x26, H::RETH, true),
        (0x27, e, true),
        (0x28, e, true),
        (0x29, H::IMM_DT, true),
        (0x2a, H::RETH, true),
        (0x2b, H::RETH | H::IMM_DT, true),
        (0x64, H::DETH, true),
        (0x65, H::DETH | H::IMM_DT, true),
        (0x81, H::CNP_RESERVED, false),
    ];
    assert_eq!(table.len(), Opcode::ALL.len());
    for &(v, h, payload) in table {
        let o = Opcode::from_u8(v).unwrap();
        assert_eq!(o.headers(), h, "{o}");
        assert_eq!(o.has_payload(), payload, "{o}");
    }
    // RD (0x40..) and XRC (0xa0..) are not carried; reserved RC slots either.
    for v in [
        0x15u8, 0x18, 0x1b, 0x1e, 0x1f, 0x2c, 0x40, 0x4a, 0x60, 0x66, 0x80, 0xa0, 0xff,
    ] {
        assert!(Opcode::from_u8(v).is_err(), "{v:#x}");
    }
    assert_eq!(H::ATOMIC_ETH.len(), 28);
    assert_eq!((H::AETH | H::ATOMIC_ACK_ETH).len(), 12);
    assert_eq!(H::CNP_RESERVED.len(), 16);
}

#[test]
fn emit_rejects_wrong_header_sets_and_payloads() {
    let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_RDMA_WRITE_FIRST, 1, 2));
    let mut b = [0u8; 128];
    assert_eq!(t.emit(&[1, 2, 3], &mut b), Err(Error::HeaderMismatch(0x06)));
    t.reth = Some(RethRepr {
        va: 1,
        rkey: 2,
        dma_len: 3,
    });
    assert!(t.emit(&[1, 2, 3], &mut b).is_ok());
    t.imm_data = Some(5);
    assert_eq!(t.emit(&[], &mut b), Err(Error::HeaderMismatch(0x06)));
    let mut ack = TransportRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, 1, 2));
    ack.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK,
        msn: 7,
    });
    assert_eq!(ack.emit(&[0], &mut b), Err(Error::UnexpectedPayload(0x11)));
    assert_eq!(
        ack.emit(&[], &mut b[..10]),
        Err(Error::BufferTooSmall {
            needed: 20,
            have: 10
        })
    );
}

#[test]
fn aeth_tables() {
    use xroce_wire::aeth::*;
    assert_eq!(rnr_timer_us(0), 655_360);
    assert_eq!(rnr_timer_us(1), 10);
    assert_eq!(rnr_timer_us(14), 1_280);
    assert_eq!(rnr_timer_us(31), 491_520);
    for c in 1..32u8 {
        assert_eq!(rnr_timer_code(rnr_timer_us(c)), c);
    }
    assert_eq!(rnr_timer_code(1_000_000), 0);
    let expect = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];
    for (c, &n) in expect.iter().enumerate() {
        assert_eq!(credits_from_code(c as u8), Some(n), "code {c}");
        assert_eq!(credit_code(n), c as u8);
    }
    assert_eq!(credits_from_code(0x1f), None);
    assert_eq!(Syndrome::from_u8(0x1f), Syndrome::ACK);
    assert_eq!(
        Syndrome::from_u8(0x60),
        Syndrome::Nak(NakCode::PsnSequenceError)
    );
    assert_eq!(
        Syndrome::from_u8(0x61),
        Syndrome::Nak(NakCode::InvalidRequest)
    );
    assert_eq!(
        Syndrome::from_u8(0x62),
        Syndrome::Nak(NakCode::RemoteAccessError)
    );
    assert_eq!(
        Syndrome::from_u8(0x63),
        Syndrome::Nak(NakCode::RemoteOperationalError)
    );
    assert_eq!(
        Syndrome::from_u8(0x64),
        Syndrome::Nak(NakCode::InvalidRdRequest)
    );
    assert_eq!(Syndrome::from_u8(0x65), Syndrome::Reserved(0x65));
    assert_eq!(Syndrome::from_u8(0x2e), Syndrome::RnrNak { timer: 14 });
    assert_eq!(Syndrome::from_u8(0x40), Syndrome::Reserved(0x40));
}

#[test]
fn gid_mapping() {
    let g = Gid::from_ipv4([10, 99, 0, 11]);
    assert_eq!(g.hex().to_string(), "00000000000000000000ffff0a63000b");
    assert_eq!(g.to_ipv4(), Some([10, 99, 0, 11]));
    assert_eq!(g.to_string(), "10.99.0.11");
    assert_eq!(Gid::from_hex("00000000000000000000ffff0a63000b"), Some(g));
    assert_eq!(
        Gid::from_hex("0000:0000:0000:0000:0000:ffff:0a63:000b"),
        Some(g)
    );
    assert_eq!(Gid::from_hex("xyz"), None);
    let v6: std::net::Ipv6Addr = "fe80::1".parse().unwrap();
    let g6 = Gid::from(v6);
    assert!(!g6.is_ipv4_mapped());
    assert_eq!(std::net::IpAddr::from(g6), std::net::IpAddr::V6(v6));
    assert!(matches!(IpRepr::from_gids(g, g), IpRepr::V4(_)));
    assert!(matches!(IpRepr::from_gids(g6, g6), IpRepr::V6(_)));
}

#[test]
fn udp_sport_examples() {
    use xroce_wire::udp::*;
    for (l, r) in [(0x11u32, 0x12u32), (0xffffff, 0xffffff), (0, 5), (1, 1)] {
        let p = rocev2_src_port(0, l, r);
        assert!(p >= 0xc000);
        assert_eq!(p, rocev2_src_port(0, r, l), "symmetric in the QP pair");
    }
    assert_eq!(flow_label_to_udp_sport(0), 0xc000);
    assert_eq!(
        rocev2_src_port(0x12345, 1, 2),
        flow_label_to_udp_sport(0x12345)
    );
}

/// Found by the fuzzer: a packet whose payload + pad is not a whole number
/// of 4-byte words is rejected (it could not be re-emitted identically).
#[test]
fn unaligned_payload_is_rejected() {
    let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_SEND_LAST, 1, 1));
    t.bth.mig_req = false;
    let mut b = vec![0u8; t.buffer_len(4)];
    t.emit(&[1, 2, 3, 4], &mut b).unwrap();
    assert!(parse_transport(&b).is_ok());
    let mut short = b.clone();
    short.remove(12);
    assert_eq!(parse_transport(&short), Err(Error::BadPad(0)));
}

/// An independent spelling of the ICRC input for IPv6 (rxe_icrc.c: the
/// first 4 bytes become version|0xfffffff, hop limit 0xff) and a check that
/// VLAN tags (not covered) leave the ICRC unchanged.
#[test]
fn icrc_ipv6_and_vlan_reference() {
    let a = Gid::from_hex("fd000000000000000000000000000011").unwrap();
    let b = Gid::from_hex("fd000000000000000000000000000012").unwrap();
    let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, 0x12, 7));
    t.bth.becn = true;
    let mut r = FrameRepr::new([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], a, b, 0xc0de, t);
    if let IpRepr::V6(v6) = &mut r.ip {
        v6.traffic_class = 0x6a;
        v6.flow_label = 0xabcde;
        v6.hop_limit = 3;
    }
    let payload = [9u8; 13];
    let mut f = vec![0u8; r.frame_len(payload.len())];
    emit_frame(&r, &payload, &mut f).unwrap();
    let mut input = vec![0xffu8; 8];
    let mut ip = f[14..54].to_vec();
    ip[0] = 0x6f;
    ip[1..4].fill(0xff);
    ip[7] = 0xff;
    input.extend_from_slice(&ip);
    let mut rest = f[54..f.len() - 4].to_vec();
    rest[6..8].fill(0xff);
    rest[12] = 0xff;
    input.extend_from_slice(&rest);
    let want = crc32fast::hash(&input);
    assert_eq!(
        u32::from_le_bytes(f[f.len() - 4..].try_into().unwrap()),
        want
    );

    let mut tagged = r;
    tagged.eth.svlan = Some(VlanTag {
        tpid: TPID_8021AD,
        pcp: 1,
        dei: false,
        vid: 10,
    });
    tagged.eth.vlan = Some(VlanTag::dot1q(5, 200));
    let mut g = vec![0u8; tagged.frame_len(payload.len())];
    emit_frame(&tagged, &payload, &mut g).unwrap();
    assert_eq!(g.len(), f.len() + 8);
    assert_eq!(g[g.len() - 4..], f[f.len() - 4..]);
    assert_eq!(
        parse_frame_checked(&g).unwrap().0,
        parse_frame(&g).unwrap().0
    );
}

#[test]
fn ack_and_cnp_constructors() {
    let ack = TransportRepr::ack(5, 100, Syndrome::ACK, 3);
    let mut b = [0u8; 64];
    let n = ack.emit(&[], &mut b).unwrap();
    assert_eq!(n, 12 + 4 + 4);
    assert_eq!(b[12], 0x1f);
    let cnp = TransportRepr::cnp(0x42);
    let n = cnp.emit(&[], &mut b).unwrap();
    assert_eq!(n, 12 + 16 + 4);
    assert_eq!(b[0], 0x81);
    assert_eq!(b[4], 0x40, "BECN");
    assert_eq!(parse_transport(&b[..n]).unwrap().0, cnp);
}

#[test]
fn ipv4_fragments() {
    let t = TransportRepr::ack(1, 2, Syndrome::ACK, 3);
    let r = FrameRepr::new(
        [0; 6],
        [0; 6],
        Gid::from_ipv4([1, 2, 3, 4]),
        Gid::from_ipv4([5, 6, 7, 8]),
        0xc000,
        t,
    );
    let mut f = vec![0u8; r.frame_len(0)];
    emit_frame(&r, &[], &mut f).unwrap();
    let refill =
        |f: &mut Vec<u8>| xroce_wire::ipv4::Ipv4Packet::new_unchecked(&mut f[14..]).fill_checksum();
    let mut first = f.clone();
    first[20] |= 0x20; // MF
    refill(&mut first);
    assert_eq!(parse_frame(&first).unwrap_err(), Error::Ipv4Fragment);
    assert!(!Error::Ipv4Fragment.is_not_roce());
    let mut later = f.clone();
    later[21] = 1; // offset 8 bytes
    refill(&mut later);
    let e = parse_frame(&later).unwrap_err();
    assert!(e.is_not_roce(), "{e:?}");
    let mut other = first.clone();
    other[36..38].copy_from_slice(&53u16.to_be_bytes());
    assert_eq!(parse_frame(&other).unwrap_err(), Error::NotRoceV2Port(53));
}

/// Every opcode, one by one (not left to sampling): 64 random frames each
/// round-trip through emit/parse with a valid ICRC.
#[test]
fn every_opcode_roundtrips() {
    use proptest::test_runner::{Config, TestRunner};
    for &op in Opcode::ALL {
        let mut runner = TestRunner::new(Config {
            cases: 64,
            ..Config::default()
        });
        let max = if op.has_payload() { 200 } else { 0 };
        let strat = (
            eth_repr(),
            ip_repr(),
            udp_repr(),
            transport_for(Just(op)),
            proptest::collection::vec(any::<u8>(), 0..=max),
        );
        runner
            .run(&strat, |(mut eth, ip, udp, transport, payload)| {
                eth.ethertype = if matches!(ip, IpRepr::V4(_)) {
                    0x0800
                } else {
                    0x86dd
                };
                let r = FrameRepr {
                    eth,
                    ip,
                    udp,
                    transport,
                };
                let mut b = vec![0u8; r.frame_len(payload.len())];
                emit_frame(&r, &payload, &mut b).unwrap();
                let (p, pl) = parse_frame_checked(&b).unwrap();
                prop_assert_eq!(p.transport, transport);
                prop_assert_eq!(p.transport.bth.opcode, op);
                prop_assert_eq!(pl, &payload[..]);
                prop_assert_eq!(p, normalized(r, &p));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{op}: {e}"));
    }
}

#[test]
fn not_roce_is_decided_before_validation() {
    let t = TransportRepr::ack(1, 2, Syndrome::ACK, 3);
    let r = FrameRepr::new(
        [0; 6],
        [0; 6],
        Gid::from_ipv4([1, 2, 3, 4]),
        Gid::from_ipv4([5, 6, 7, 8]),
        0xc000,
        t,
    );
    let mut f = vec![0u8; r.frame_len(0)];
    emit_frame(&r, &[], &mut f).unwrap();
    // Other UDP port with a broken IPv4 checksum: not RoCE, not malformed.
    let mut g = f.clone();
    g[36..38].copy_from_slice(&53u16.to_be_bytes());
    g[24] ^= 1;
    assert_eq!(parse_frame(&g).unwrap_err(), Error::NotRoceV2Port(53));
    // TCP: not RoCE.
    let mut g = f.clone();
    g[23] = 6;
    assert_eq!(parse_frame(&g).unwrap_err(), Error::NotUdp(6));
    // RoCE with a broken IPv4 checksum: malformed.
    let mut g = f.clone();
    g[24] ^= 1;
    assert_eq!(parse_frame(&g).unwrap_err(), Error::BadIpv4Checksum);
    assert!(!Error::BadIpv4Checksum.is_not_roce());
}

/// The selective-repeat capable bit (BTH byte 4, 0x01) round-trips, sits
/// where IBA's Resv6a is, and leaves the ICRC as it is without it (byte 4
/// is masked to ones in the ICRC, as rxe computes it): a frame with the
/// bit set has the same ICRC as the one without, and either verifies.
#[test]
fn sr_capable_bit_round_trips_and_leaves_the_icrc_unchanged() {
    for (gids, ip_len) in [
        (
            (Gid::from_ipv4([10, 0, 0, 1]), Gid::from_ipv4([10, 0, 0, 2])),
            20,
        ),
        (
            (
                Gid::from_hex("fd000000000000000000000000000001").unwrap(),
                Gid::from_hex("fd000000000000000000000000000002").unwrap(),
            ),
            40,
        ),
    ] {
        let frame = |sr_capable: bool| {
            let mut t = TransportRepr::new(BthRepr {
                sr_capable,
                ..BthRepr::new(Opcode::RC_RDMA_WRITE_FIRST, 0x33, 0x12_3456)
            });
            t.reth = Some(RethRepr {
                va: 0x1000,
                rkey: 7,
                dma_len: 4096,
            });
            let r = FrameRepr::new(
                [2, 0, 0, 0, 0, 1],
                [2, 0, 0, 0, 0, 2],
                gids.0,
                gids.1,
                0xc555,
                t,
            );
            let payload = [0x5au8; 1024];
            let mut f = vec![0u8; r.frame_len(payload.len())];
            emit_frame(&r, &payload, &mut f).unwrap();
            f
        };
        let (with, without) = (frame(true), frame(false));
        let bth_off = 14 + ip_len + 8;
        assert_eq!(with[bth_off + 4], bth::SR_CAPABLE);
        assert_eq!(without[bth_off + 4], 0);
        // Only byte 4 of the BTH differs (and over IPv6 the UDP checksum,
        // which covers it): the ICRC (the last 4 bytes) is the same.
        let udp_check = bth_off - 2..bth_off;
        let diff: Vec<usize> = (0..with.len())
            .filter(|&i| with[i] != without[i] && !udp_check.contains(&i))
            .collect();
        assert_eq!(diff, [bth_off + 4]);
        assert_eq!(
            icrc::frame_icrc(&with).unwrap(),
            icrc::frame_icrc(&without).unwrap()
        );
        icrc::verify_frame(&with).unwrap();
        let (p, _) = parse_frame_checked(&with).unwrap();
        assert!(p.transport.bth.sr_capable);
        assert!(!(p.transport.bth.fecn || p.transport.bth.becn));
        let (p, _) = parse_frame_checked(&without).unwrap();
        assert!(!p.transport.bth.sr_capable);
        // The view sees and sets the same bit, next to FECN and BECN.
        let mut b = without[bth_off..bth_off + 12].to_vec();
        let mut h = bth::BthHeader::new_checked(&mut b[..]).unwrap();
        h.set_becn(true);
        h.set_sr_capable(true);
        assert!(h.sr_capable() && h.becn() && !h.fecn());
        h.set_sr_capable(false);
        assert!(!h.sr_capable() && h.becn());
    }
}

/// What a congestion point does in flight — set ECN CE, fix the IPv4
/// checksum, decrement TTL — and what a receiver's CNP logic may do to the
/// BTH (BECN/FECN) leaves the ICRC valid; changing the PSN through the view
/// breaks it.
#[test]
fn views_in_flight_edits_keep_icrc() {
    use xroce_wire::bth::BthHeader;
    use xroce_wire::ipv4::Ipv4Packet;
    use xroce_wire::ipv6::Ipv6Packet;
    for gids in [
        (Gid::from_ipv4([10, 0, 0, 1]), Gid::from_ipv4([10, 0, 0, 2])),
        (
            Gid::from_hex("fd000000000000000000000000000001").unwrap(),
            Gid::from_hex("fd000000000000000000000000000002").unwrap(),
        ),
    ] {
        let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_RDMA_WRITE_MIDDLE, 0x33, 0xff_ffff));
        t.bth.ack_req = true;
        let r = FrameRepr::new(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            gids.0,
            gids.1,
            0xc555,
            t,
        );
        let payload = [0xabu8; 1024];
        let mut f = vec![0u8; r.frame_len(payload.len())];
        emit_frame(&r, &payload, &mut f).unwrap();
        let ip_len = r.ip.header_len();
        match r.ip {
            IpRepr::V4(_) => {
                let mut ip = Ipv4Packet::new_checked(&mut f[14..]).unwrap();
                ip.set_ecn(3);
                ip.set_ttl(63);
                ip.fill_checksum();
                assert!(ip.verify_checksum());
            }
            IpRepr::V6(_) => Ipv6Packet::new_checked(&mut f[14..]).unwrap().set_ecn(3),
        }
        let bth_off = 14 + ip_len + 8;
        let mut bth = BthHeader::new_checked(&mut f[bth_off..]).unwrap();
        bth.set_becn(true);
        bth.set_fecn(true);
        assert_eq!(bth.psn(), 0xff_ffff);
        assert_eq!(bth.dest_qp(), 0x33);
        assert!(bth.ack_req());
        let (p, _) = parse_frame_checked(&f).unwrap();
        assert_eq!(p.ip.ecn(), 3);
        assert!(p.transport.bth.becn && p.transport.bth.fecn);
        BthHeader::new_unchecked(&mut f[bth_off..]).set_psn(0);
        assert!(matches!(
            parse_frame_checked(&f),
            Err(Error::BadIcrc { .. })
        ));
    }
}
