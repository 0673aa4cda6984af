//! The CM codec on its own: proptest round trips of every message, and the
//! errors malformed or truncated MADs give.

use proptest::prelude::*;
use xroce_wire::cm::{
    Attribute, CmMadRepr, CmMessage, CommIdsRepr, DreqRepr, MessageRef, MraRepr, PathRepr,
    RejReason, RejRepr, RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr, SidrStatus, TransportType,
    DATA_LEN,
};
use xroce_wire::mad::{MadError, MadHeader, CLASS_CM, MAD_LEN};
use xroce_wire::Gid;

fn bits(n: u32) -> impl Strategy<Value = u32> {
    0..(1u32 << n)
}
fn bits8(n: u32) -> impl Strategy<Value = u8> {
    (0..(1u16 << n)).prop_map(|v| v as u8)
}

/// Private data of at most `max` bytes (a parse gives the whole field:
/// the round trips compare its prefix and check the zero padding).
fn private(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..=max)
}

fn path() -> impl Strategy<Value = PathRepr> {
    (
        any::<(u16, u16)>(),
        any::<([u8; 16], [u8; 16])>(),
        bits(20),
        bits8(6),
        any::<(u8, u8)>(),
        bits8(4),
        any::<bool>(),
        bits8(5),
    )
        .prop_map(
            |(lids, gids, fl, rate, (tc, hop), sl, local, ack)| PathRepr {
                local_lid: lids.0,
                remote_lid: lids.1,
                local_gid: Gid(gids.0),
                remote_gid: Gid(gids.1),
                flow_label: fl,
                packet_rate: rate,
                traffic_class: tc,
                hop_limit: hop,
                sl,
                subnet_local: local,
                local_ack_timeout: ack,
            },
        )
}

fn transport_type() -> impl Strategy<Value = TransportType> {
    prop_oneof![
        Just(TransportType::Rc),
        Just(TransportType::Uc),
        Just(TransportType::Rd),
        Just(TransportType::Extended)
    ]
}

fn message_ref() -> impl Strategy<Value = MessageRef> {
    prop_oneof![
        Just(MessageRef::Req),
        Just(MessageRef::Rep),
        Just(MessageRef::Other),
        Just(MessageRef::Reserved)
    ]
}

/// Round trip: emit, parse back, the same fields, private data as the
/// prefix of the parsed field and zeros after it; emit again gives the
/// same bytes.
fn round_trip(tid: u64, msg: CmMessage<'_>, pd: &[u8]) -> Result<(), TestCaseError> {
    let repr = CmMadRepr::new(tid, msg);
    let mut buf = [0xffu8; MAD_LEN];
    prop_assert_eq!(repr.emit(&mut buf), Ok(MAD_LEN));
    prop_assert_eq!(
        u16::from_be_bytes([buf[16], buf[17]]),
        msg.attribute() as u16
    );
    let back = CmMadRepr::parse(&buf).unwrap();
    prop_assert_eq!(back.header, repr.header);
    let field = back.message.private_data();
    prop_assert_eq!(field.len(), msg.attribute().max_private_data());
    prop_assert_eq!(&field[..pd.len()], pd);
    prop_assert!(field[pd.len()..].iter().all(|&b| b == 0));
    let mut again = [0u8; MAD_LEN];
    back.emit(&mut again).unwrap();
    prop_assert_eq!(&again[..], &buf[..]);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn req_round_trips(
        tid in any::<u64>(),
        ids in any::<(u32, u64, u64, u32)>(),
        (vendor, qpn, eecn, reecn, psn) in (bits(24), bits(24), bits(24), bits(24), bits(24)),
        (rr, id) in any::<(u8, u8)>(),
        (rto, lto, retry, mtu, rnr, cmr, ext) in (bits8(5), bits8(5), bits8(3), bits8(4), bits8(3), bits8(4), bits8(3)),
        tt in transport_type(),
        flags in any::<(bool, bool, bool, bool)>(),
        pkey in any::<u16>(),
        primary in path(),
        alternate in proptest::option::of(path().prop_filter("non-zero", |p| *p != PathRepr::default())),
        pd in private(92),
    ) {
        let m = ReqRepr {
            local_comm_id: ids.0, vendor_id: vendor, service_id: ids.1, local_ca_guid: ids.2,
            local_qkey: ids.3, local_qpn: qpn, responder_resources: rr, local_eecn: eecn,
            initiator_depth: id, remote_eecn: reecn, remote_cm_response_timeout: rto,
            transport_type: tt, end_to_end_flow_control: flags.0, starting_psn: psn,
            local_cm_response_timeout: lto, retry_count: retry, pkey, path_mtu: mtu,
            rdc_exists: flags.1, rnr_retry_count: rnr, max_cm_retries: cmr, srq: flags.2,
            extended_transport_type: ext, primary_path: primary, alternate_path: alternate,
            sap_supported: flags.3, private_data: &pd,
        };
        round_trip(tid, CmMessage::Req(m), &pd)?;
        let mut buf = [0u8; MAD_LEN];
        CmMadRepr::new(tid, CmMessage::Req(m)).emit(&mut buf).unwrap();
        let CmMessage::Req(back) = CmMadRepr::parse(&buf).unwrap().message else { unreachable!() };
        prop_assert_eq!(back, ReqRepr { private_data: back.private_data, ..m });
    }

    #[test]
    fn rep_round_trips(
        tid in any::<u64>(),
        ids in any::<(u32, u32, u32, u64)>(),
        (qpn, vendor, eecn, psn) in (bits(24), bits(24), bits(24), bits(24)),
        (rr, id) in any::<(u8, u8)>(),
        (delay, failover, rnr) in (bits8(5), bits8(2), bits8(3)),
        flags in any::<(bool, bool)>(),
        pd in private(196),
    ) {
        let m = RepRepr {
            local_comm_id: ids.0, remote_comm_id: ids.1, local_qkey: ids.2, local_qpn: qpn,
            vendor_id: vendor, local_eecn: eecn, starting_psn: psn, responder_resources: rr,
            initiator_depth: id, target_ack_delay: delay, failover_accepted: failover,
            end_to_end_flow_control: flags.0, rnr_retry_count: rnr, srq: flags.1,
            local_ca_guid: ids.3, private_data: &pd,
        };
        round_trip(tid, CmMessage::Rep(m), &pd)?;
        let mut buf = [0u8; MAD_LEN];
        CmMadRepr::new(tid, CmMessage::Rep(m)).emit(&mut buf).unwrap();
        let CmMessage::Rep(back) = CmMadRepr::parse(&buf).unwrap().message else { unreachable!() };
        prop_assert_eq!(back, RepRepr { private_data: back.private_data, ..m });
    }

    #[test]
    fn rej_mra_round_trip(
        tid in any::<u64>(),
        ids in any::<(u32, u32)>(),
        of in message_ref(),
        code in any::<u16>(),
        ari in proptest::collection::vec(any::<u8>(), 0..=72),
        timeout in bits8(5),
        pd in private(222),
    ) {
        let reason = RejReason::from_u16(code);
        prop_assert_eq!(reason.code(), code);
        let rej = RejRepr {
            local_comm_id: ids.0, remote_comm_id: ids.1, message_rejected: of, reason,
            ari: &ari, private_data: &pd[..pd.len().min(148)],
        };
        round_trip(tid, CmMessage::Rej(rej), rej.private_data)?;
        let mut buf = [0u8; MAD_LEN];
        CmMadRepr::new(tid, CmMessage::Rej(rej)).emit(&mut buf).unwrap();
        let CmMessage::Rej(back) = CmMadRepr::parse(&buf).unwrap().message else { unreachable!() };
        prop_assert_eq!(back.ari, &ari[..]);
        prop_assert_eq!(back.reason, reason);
        let mra = MraRepr {
            local_comm_id: ids.0, remote_comm_id: ids.1, message_mraed: of,
            service_timeout: timeout, private_data: &pd,
        };
        round_trip(tid, CmMessage::Mra(mra), &pd)?;
    }

    #[test]
    fn rtu_dreq_drep_round_trip(
        tid in any::<u64>(),
        ids in any::<(u32, u32)>(),
        qpn in bits(24),
        pd in private(220),
    ) {
        let c = CommIdsRepr { local_comm_id: ids.0, remote_comm_id: ids.1, private_data: &pd };
        round_trip(tid, CmMessage::Rtu(c), &pd)?;
        round_trip(tid, CmMessage::Drep(c), &pd)?;
        let d = DreqRepr { local_comm_id: ids.0, remote_comm_id: ids.1, remote_qpn: qpn, private_data: &pd };
        round_trip(tid, CmMessage::Dreq(d), &pd)?;
    }

    #[test]
    fn sidr_round_trips(
        tid in any::<u64>(),
        (req_id, sid, qkey) in any::<(u32, u64, u32)>(),
        pkey in any::<u16>(),
        status in any::<u8>(),
        (vendor, qpn) in (bits(24), bits(24)),
        info in proptest::collection::vec(any::<u8>(), 0..=72),
        pd in private(216),
    ) {
        let q = SidrReqRepr { request_id: req_id, pkey, service_id: sid, private_data: &pd };
        round_trip(tid, CmMessage::SidrReq(q), &pd)?;
        let status = SidrStatus::from_u8(status);
        let p = SidrRepRepr {
            request_id: req_id, status, vendor_id: vendor, qpn, service_id: sid, qkey,
            additional_info: &info, private_data: &pd[..pd.len().min(136)],
        };
        round_trip(tid, CmMessage::SidrRep(p), p.private_data)?;
        let mut buf = [0u8; MAD_LEN];
        CmMadRepr::new(tid, CmMessage::SidrRep(p)).emit(&mut buf).unwrap();
        let CmMessage::SidrRep(back) = CmMadRepr::parse(&buf).unwrap().message else { unreachable!() };
        prop_assert_eq!(back, SidrRepRepr { private_data: back.private_data, ..p });
    }

    /// Any 256 bytes: parse never panics, and what parses re-emits to a
    /// MAD that parses to the same repr.
    #[test]
    fn arbitrary_bytes_parse_or_error(mut b in proptest::collection::vec(any::<u8>(), MAD_LEN), attr in 0x10u16..=0x1a) {
        b[0] = 1;
        b[1] = CLASS_CM;
        b[2] = 2;
        b[16..18].copy_from_slice(&attr.to_be_bytes());
        if let Ok(m) = CmMadRepr::parse(&b) {
            let mut out = [0u8; MAD_LEN];
            m.emit(&mut out).unwrap();
            prop_assert_eq!(CmMadRepr::parse(&out).unwrap(), m);
        }
    }
}

/// A valid RTU MAD to break in the error tests.
fn rtu() -> [u8; MAD_LEN] {
    let c = CommIdsRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        private_data: b"hi",
    };
    let mut b = [0u8; MAD_LEN];
    CmMadRepr::new(7, CmMessage::Rtu(c)).emit(&mut b).unwrap();
    b
}

#[test]
fn malformed_mads_give_the_right_error() {
    let good = rtu();
    assert_eq!(
        CmMadRepr::parse(&good[..255]),
        Err(MadError::Truncated {
            needed: 256,
            have: 255
        })
    );
    assert_eq!(
        CmMadRepr::parse(&[]),
        Err(MadError::Truncated {
            needed: 256,
            have: 0
        })
    );
    let mut b = good;
    b[0] = 2;
    assert_eq!(CmMadRepr::parse(&b), Err(MadError::BadBaseVersion(2)));
    let mut b = good;
    b[1] = 0x03; // subnet administration
    assert_eq!(CmMadRepr::parse(&b), Err(MadError::WrongClass(0x03)));
    let mut b = good;
    b[2] = 1;
    assert_eq!(CmMadRepr::parse(&b), Err(MadError::BadClassVersion(1)));
    let mut b = good;
    b[16..18].copy_from_slice(&0x0020u16.to_be_bytes());
    assert_eq!(
        CmMadRepr::parse(&b),
        Err(MadError::UnknownAttribute(0x0020))
    );
    // A REJ whose reject-info length says more than the 72-byte ARI field.
    let mut b = good;
    b[17] = Attribute::Rej as u8;
    b[24 + 9] = 73 << 1;
    assert_eq!(
        CmMadRepr::parse(&b),
        Err(MadError::FieldOverflow("reject_info_length"))
    );
    // LAP/APR: recognised, kept opaque, re-emitted as they came.
    let mut b = good;
    b[17] = Attribute::Lap as u8;
    let lap = CmMadRepr::parse(&b).unwrap();
    assert!(matches!(lap.message, CmMessage::Lap(d) if d.len() == DATA_LEN));
    let mut out = [0u8; MAD_LEN];
    lap.emit(&mut out).unwrap();
    assert_eq!(out, b);
    // The header alone parses on a whole MAD of any class.
    let mut b = good;
    b[1] = 0x03;
    assert_eq!(MadHeader::parse(&b).unwrap().mgmt_class, 0x03);
}

#[test]
fn emit_rejects_what_does_not_fit() {
    let long = [1u8; 93];
    let c = CommIdsRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        private_data: &long[..],
    };
    let mut b = [0u8; MAD_LEN];
    // RTU carries 224 bytes: 93 fit; a REQ's 92 do not.
    assert_eq!(CmMadRepr::new(1, CmMessage::Rtu(c)).emit(&mut b), Ok(256));
    let too_long = [1u8; 225];
    let c = CommIdsRepr {
        private_data: &too_long[..],
        ..c
    };
    assert_eq!(
        CmMadRepr::new(1, CmMessage::Rtu(c)).emit(&mut b),
        Err(MadError::PrivateDataTooLong { max: 224, len: 225 })
    );
    let d = DreqRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        remote_qpn: 1 << 24,
        private_data: &[],
    };
    assert_eq!(
        CmMadRepr::new(1, CmMessage::Dreq(d)).emit(&mut b),
        Err(MadError::FieldOverflow("remote_qpn"))
    );
    let mut small = [0u8; 255];
    let d = DreqRepr { remote_qpn: 1, ..d };
    assert_eq!(
        CmMadRepr::new(1, CmMessage::Dreq(d)).emit(&mut small),
        Err(MadError::BufferTooSmall {
            needed: 256,
            have: 255
        })
    );
    let maxes: Vec<usize> = [
        Attribute::Req,
        Attribute::Mra,
        Attribute::Rej,
        Attribute::Rep,
        Attribute::Rtu,
        Attribute::Dreq,
        Attribute::Drep,
        Attribute::SidrReq,
        Attribute::SidrRep,
    ]
    .iter()
    .map(|a| a.max_private_data())
    .collect();
    assert_eq!(maxes, [92, 222, 148, 196, 224, 220, 224, 216, 136]);
}

#[test]
fn rej_reason_codes() {
    assert_eq!(RejReason::InvalidServiceId.code(), 8);
    assert_eq!(RejReason::InvalidTransportType.code(), 9);
    assert_eq!(RejReason::ConsumerDefined.code(), 28);
    assert_eq!(RejReason::VendorOptionNotSupported.code(), 35);
    assert_eq!(RejReason::from_u16(28), RejReason::ConsumerDefined);
    assert_eq!(RejReason::from_u16(34), RejReason::Other(34));
    assert_eq!(RejReason::ConsumerDefined.name(), "consumer reject");
    assert_eq!(
        RejReason::InvalidServiceId.to_string(),
        "invalid service ID (8)"
    );
    for code in 0..=40u16 {
        assert_eq!(RejReason::from_u16(code).code(), code);
    }
}
