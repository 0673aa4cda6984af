//! Parsing any bytes never panics, and whatever parses re-emits to a frame
//! that parses back to the same headers and payload with a valid ICRC.
//!
//! Each input is tried three ways: as a whole Ethernet frame; as a UDP
//! payload (BTH ... ICRC) at the transport level; and wrapped by a valid
//! Ethernet/IPv4/UDP 4791 header, so the fuzzer reaches the transport parser
//! and the ICRC without having to forge an IPv4 checksum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xroce_wire::{
    emit_frame, emit_transport, icrc, parse_frame, parse_frame_checked, parse_transport, FrameRepr,
};

fn check_frame(frame: &[u8]) {
    let _ = icrc::frame_icrc(frame);
    let Ok((repr, payload)) = parse_frame(frame) else { return };
    roundtrip(&repr, payload);
    if parse_frame_checked(frame).is_ok() {
        assert!(icrc::verify_frame(frame).is_ok());
    }
}

fn roundtrip(repr: &FrameRepr, payload: &[u8]) {
    let mut out = vec![0u8; repr.frame_len(payload.len())];
    let n = emit_frame(repr, payload, &mut out).expect("a parsed frame re-emits");
    assert_eq!(n, out.len());
    let (again, p2) = parse_frame_checked(&out).expect("an emitted frame parses with a valid ICRC");
    assert_eq!(&again, repr);
    assert_eq!(p2, payload);
}

fuzz_target!(|data: &[u8]| {
    check_frame(data);

    if let Ok((t, payload)) = parse_transport(data) {
        let mut out = vec![0u8; t.buffer_len(payload.len())];
        emit_transport(&t, payload, &mut out).expect("a parsed transport re-emits");
        let (t2, p2) = parse_transport(&out).expect("an emitted transport parses");
        assert_eq!(t2, t);
        assert_eq!(p2, payload);
    }

    // Wrap as the UDP payload of a valid IPv4 RoCEv2 frame.
    if data.len() <= 9000 {
        let mut f = Vec::with_capacity(42 + data.len());
        f.extend_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]);
        let tl = (20 + 8 + data.len()) as u16;
        f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f[16..18].copy_from_slice(&tl.to_be_bytes());
        xroce_wire::ipv4::Ipv4Packet::new_unchecked(&mut f[14..34]).fill_checksum();
        f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7]);
        f.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(data);
        check_frame(&f);
        // And once more with the ICRC made right, to get past the check.
        if icrc::fill_frame(&mut f).is_ok() {
            check_frame(&f);
        }
    }
});
