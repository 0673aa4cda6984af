//! Hand-made RoCEv2-port datagrams for testing the XDP program: a BTH with
//! the opcode and QPN under test, then a marker so receivers can tell them
//! from anything else.

use std::{net::UdpSocket, os::fd::AsRawFd};

/// Marker after the 12-byte BTH.
pub const MARK: &[u8; 4] = b"XRT1";
/// Offset of the marker in an untagged IPv4 frame: 14 + 20 + 8 + 12.
pub const MARK_AT: usize = 54;
/// BTH opcodes used by the tests.
pub const RC_SEND_ONLY: u8 = 0x04;
pub const RC_WRITE_ONLY: u8 = 0x0a;

/// A UDP payload of `len` bytes (at least 24) starting with a BTH.
pub fn payload(opcode: u8, qpn: u32, seq: u32, len: usize) -> Vec<u8> {
    assert!(len >= 24);
    let mut p = vec![0u8; len];
    p[0] = opcode;
    p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    p[12..16].copy_from_slice(MARK);
    p[16..20].copy_from_slice(&seq.to_be_bytes());
    p
}

/// True if an Ethernet frame carries one of our test payloads.
pub fn is_ours(frame: &[u8]) -> bool {
    frame.len() >= MARK_AT + 4 && &frame[MARK_AT..MARK_AT + 4] == MARK
}

/// Sets the TOS byte (and so the ECN bits) of outgoing datagrams.
pub fn set_tos(udp: &UdpSocket, tos: i32) {
    // SAFETY: IP_TOS takes an int; the fd is a live UDP socket.
    let rc = unsafe {
        libc::setsockopt(
            udp.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_TOS,
            &tos as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        )
    };
    assert_eq!(rc, 0, "IP_TOS: {}", std::io::Error::last_os_error());
}

/// The one's-complement sum of an IPv4 header is 0xffff when its checksum
/// is right.
pub fn ipv4_checksum_ok(header: &[u8]) -> bool {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}
