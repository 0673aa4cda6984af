//! What the engine exchanges with an I/O backend: RoCEv2 datagrams (the
//! UDP payload, BTH .. ICRC) with their addresses, ports and ECN/DSCP.
//! The headers below and the ICRC are the backend's: AF_XDP writes and
//! checks Ethernet, IP and UDP itself, a UDP socket has the kernel's.

use xroce_wire::{eth::MacAddr, EthRepr, IpRepr, UdpChecksum, UdpRepr};

/// One received RoCEv2 datagram.
#[derive(Clone, Copy, Debug)]
pub struct RxDatagram<'a> {
    /// The IP header it came with: addresses, DSCP/ECN (a CE mark makes
    /// a CNP), TTL; a UD receive copies it whole into the GRH.
    pub ip: IpRepr,
    pub udp_src_port: u16,
    /// The UDP payload: BTH, extension headers, payload, pad, then the
    /// ICRC, which the backend has checked.
    pub udp_payload: &'a [u8],
    /// When it reached the host (the XDP program's timestamp), on the
    /// engine's clock; `None` where the backend cannot tell (the engine
    /// then takes the time it handles it). The responder's delay echo and
    /// the requester's fabric RTT leave out the time a frame waited for
    /// its process (see `engine::delay_echo`).
    pub arrived_ns: Option<u64>,
}

impl RxDatagram<'_> {
    /// Its length as an untagged Ethernet frame (what the engine's byte
    /// counters count).
    pub fn frame_len(&self) -> usize {
        frame_len(&self.ip, self.udp_payload.len())
    }
}

/// A datagram [`Engine::poll_transmit`](super::Engine::poll_transmit)
/// wrote into the buffer it was given: its UDP payload is `len` bytes at
/// `payload_at`, the last [`ICRC_LEN`](xroce_wire::ICRC_LEN) of them a
/// zeroed ICRC slot for the backend to fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Our MAC and the next hop's.
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    /// Addresses, DSCP/ECN, TTL / hop limit, and for IPv4 id 0 with DF (as
    /// rxe); its length fields are the backend's to fill.
    pub ip: IpRepr,
    pub udp_src_port: u16,
    /// Where the UDP payload starts: behind room for exactly the frame's
    /// Ethernet (untagged), IP and UDP headers, so a backend that sends
    /// frames writes them in front of it ([`xroce_wire::emit_headers`]
    /// on the buffer) and moves nothing; one that sends datagrams skips it.
    pub payload_at: usize,
    /// UDP payload bytes, ICRC slot included.
    pub len: usize,
}

impl Transmit {
    /// Its length as an untagged Ethernet frame (byte counters, pacing).
    pub fn frame_len(&self) -> usize {
        frame_len(&self.ip, self.len)
    }

    /// Its UDP payload in the buffer `poll_transmit` wrote it into.
    pub fn payload<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.payload_at..self.payload_at + self.len]
    }

    /// It as its destination receives it when that is this device (the
    /// loopback of two QPs of one device, which never reaches the wire):
    /// its ICRC slot stays unfilled, nobody checks it.
    pub fn looped_back<'a>(&self, buf: &'a [u8]) -> RxDatagram<'a> {
        let mut ip = self.ip;
        ip.set_payload_len((xroce_wire::udp::HEADER_LEN + self.len) as u16);
        RxDatagram {
            ip,
            udp_src_port: self.udp_src_port,
            udp_payload: self.payload(buf),
            arrived_ns: None,
        }
    }

    /// The Ethernet and UDP headers of its frame (UDP checksum 0 over
    /// IPv4, computed over IPv6, as rxe sends), for
    /// [`xroce_wire::emit_headers`].
    pub fn frame_headers(&self) -> (EthRepr, UdpRepr) {
        let eth = EthRepr {
            dst: self.dst_mac,
            src: self.src_mac,
            svlan: None,
            vlan: None,
            ethertype: 0,
        };
        let mut udp = UdpRepr::rocev2(self.udp_src_port);
        if let IpRepr::V6(_) = self.ip {
            udp.checksum = UdpChecksum::Compute;
        }
        (eth, udp)
    }
}

/// Ethernet, IP and UDP headers, then `udp_payload` bytes.
fn frame_len(ip: &IpRepr, udp_payload: usize) -> usize {
    xroce_wire::eth::HEADER_LEN + ip.header_len() + xroce_wire::udp::HEADER_LEN + udp_payload
}

/// A frame or datagram a backend dropped before the engine saw it (not
/// RoCEv2, malformed, a bad ICRC): [`Engine::count_rejected`](super::Engine::count_rejected)
/// counts it where a frame the engine parsed itself would be.
#[derive(Clone, Copy, Debug)]
pub struct Rejected {
    /// Its length as it arrived.
    pub len: usize,
    pub error: xroce_wire::Error,
}
