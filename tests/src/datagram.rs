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

/// An Ethernet frame carrying a RoCEv2 SEND whose IP header claims
/// `missing` more bytes than the frame holds (IPv4 total length, or IPv6
/// payload length), with the UDP length agreeing with the IP header: the
/// lie is only visible against the frame's own length.
pub fn frame_claiming_more(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: std::net::IpAddr,
    dst: std::net::IpAddr,
    missing: usize,
) -> Vec<u8> {
    use std::net::IpAddr;
    let roce = payload(RC_SEND_ONLY, 0x11, 0, 64 + 4);
    let udp_len = 8 + roce.len() + missing;
    let mut udp = Vec::with_capacity(8 + roce.len());
    udp.extend_from_slice(&49152u16.to_be_bytes());
    udp.extend_from_slice(&xroce_common::ROCEV2_UDP_PORT.to_be_bytes());
    udp.extend_from_slice(&(udp_len as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(&roce);
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            ip[6] = 0x40; // DF
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let mut sum: u32 = ip
                .chunks(2)
                .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
                .sum();
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            f.extend_from_slice(&ip);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&0x86ddu16.to_be_bytes());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            f.extend_from_slice(&ip);
        }
        _ => panic!("source and destination must be of one IP version"),
    }
    f.extend_from_slice(&udp);
    f
}

/// Sends one whole Ethernet frame out of `iface` (of the calling thread's
/// network namespace) through a raw packet socket: the kernel adds nothing
/// and checks nothing.
pub fn send_ethernet_frame(iface: &str, frame: &[u8]) {
    let name = std::ffi::CString::new(iface).unwrap();
    // SAFETY: if_nametoindex reads one NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "no interface {iface} here");
    // SAFETY: plain socket(2); the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    assert!(
        fd >= 0,
        "AF_PACKET socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: an all-zero sockaddr_ll is valid; the fields are set below.
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_ifindex = index as i32;
    to.sll_halen = 6;
    to.sll_addr[..6].copy_from_slice(&frame[..6]);
    // SAFETY: the frame and the address outlive the call; lengths are theirs.
    let sent = unsafe {
        libc::sendto(
            fd,
            frame.as_ptr() as *const libc::c_void,
            frame.len(),
            0,
            &to as *const libc::sockaddr_ll as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: the fd is ours and closed once.
    unsafe { libc::close(fd) };
    assert_eq!(sent, frame.len() as isize, "send on {iface}: {err}");
}

/// A raw packet socket bound to one interface for sending many frames:
/// opening and closing one per frame costs an RCU grace period each (the
/// close waits in synchronize_net), milliseconds per frame.
pub struct EthernetSender {
    fd: std::os::fd::OwnedFd,
    index: i32,
}

impl EthernetSender {
    /// A sender on `iface` of the calling thread's network namespace.
    pub fn new(iface: &str) -> Self {
        use std::os::fd::FromRawFd;
        let name = std::ffi::CString::new(iface).unwrap();
        // SAFETY: if_nametoindex reads one NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(index, 0, "no interface {iface} here");
        // SAFETY: plain socket(2); protocol 0 receives nothing.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        EthernetSender {
            // SAFETY: a fresh fd that nothing else owns.
            fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
            index: index as i32,
        }
    }

    /// Sends one whole Ethernet frame; the kernel adds and checks nothing.
    pub fn send(&self, frame: &[u8]) {
        // SAFETY: an all-zero sockaddr_ll is valid; the fields are set below.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_ifindex = self.index;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: the frame and the address outlive the call; lengths are theirs.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
                &to as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(
            sent,
            frame.len() as isize,
            "send: {}",
            std::io::Error::last_os_error()
        );
    }
}
