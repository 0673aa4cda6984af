//! Kernel UDP-socket backend for hosts where XDP cannot be attached.
//!
//! One UDP socket bound to `local:4791`. The engine still produces and
//! consumes whole Ethernet frames, so this backend translates:
//!
//! - **send**: the Eth/IP/UDP headers of the engine's frame are dropped and
//!   the UDP payload (BTH .. ICRC) goes to the frame's destination IP with
//!   `sendmmsg`. The kernel writes its own IP and UDP headers, and the ICRC
//!   covers some of their fields, so the ICRC is recomputed over exactly the
//!   headers the kernel sends: source = the bound address, source port 4791
//!   (the socket's), IPv4 id 0 with DF (an unconnected socket with
//!   IP_PMTUDISC_DO gets id 0 from the kernel), lengths from the payload;
//!   TOS/TTL/checksums are masked by the ICRC anyway. The frame's ECN/DSCP
//!   travels as an IP_TOS (IPV6_TCLASS) control message. IPv4 datagrams go
//!   out with UDP checksum 0, as rxe sends them (SO_NO_CHECK).
//! - **receive**: `recvmmsg` puts each payload behind room for headers, and
//!   a full frame is rebuilt in place: a synthesised Ethernet header
//!   (destination = [`UdpConfig::local_mac`], source =
//!   [`UdpConfig::peer_mac`]), an IP header with the real addresses
//!   (IP_PKTINFO) and TOS/ECN (IP_RECVTOS), TTL 64, and the real UDP ports.
//!   The IPv4 id of the received datagram is not visible through a socket
//!   but is covered by the ICRC: id 0 + DF (what xroce and this backend
//!   send) is tried first; otherwise the id and DF bit are solved for from
//!   the ICRC itself (CRC-32 is affine in the message bits, so 17 CRC
//!   passes and a 17-unknown GF(2) elimination find the one id that makes
//!   the ICRC match, as rdma_rxe's random ids need). A frame for which no
//!   id works is delivered with id 0 (the engine's ICRC check drops and
//!   counts it) and counted in [`UdpStats::icrc_unmatched`].
//!
//! No allocation per packet: slots, iovecs, names and control buffers are
//! allocated once.
//!
//! Coexistence: binding fails with EADDRINUSE (and says why) where rdma_rxe
//! owns UDP 4791. On an interface with xroce's XDP program attached, frames
//! are redirected to an AF_XDP socket bound on their RX queue and never
//! reach this socket; with no socket bound there, the program passes them
//! to the kernel and this backend receives them. A datagram with a bad
//! ICRC costs 18 CRC passes (the id search) instead of one.

use std::{
    mem,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use xroce_wire::{icrc, ICRC_LEN, ROCEV2_PORT};

use super::{poll_ms, IoError, IoStats, PacketIo, Result};

const ETH_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
const BTH_LEN: usize = 12;
/// Room in front of a received payload: Ethernet + IPv6 + UDP.
const RX_HEADROOM: usize = ETH_LEN + IPV6_LEN + UDP_LEN;
const SO_NO_CHECK: libc::c_int = 11;
const SO_RXQ_OVFL: libc::c_int = 40;
const IPV6_DONTFRAG: libc::c_int = 62;
/// Control-message room per datagram (pktinfo + tos/tclass + rxq_ovfl).
const CMSG_ROOM: usize = 128;

/// Settings of the UDP backend.
#[derive(Clone, Debug)]
pub struct UdpConfig {
    /// Local address to bind; its family decides IPv4 or IPv6.
    pub local: IpAddr,
    /// UDP port to bind and to send to (4791 for RoCEv2).
    pub port: u16,
    /// Datagrams per recvmmsg/sendmmsg.
    pub batch: usize,
    /// Largest Ethernet frame handled (headers + BTH .. ICRC).
    pub max_frame_len: usize,
    /// Destination MAC written into rebuilt frames.
    pub local_mac: [u8; 6],
    /// Source MAC written into rebuilt frames (the socket cannot see it).
    pub peer_mac: [u8; 6],
    /// SO_RCVBUF / SO_SNDBUF in bytes (forced as root).
    pub socket_buffer: usize,
}

impl UdpConfig {
    pub fn new(local: IpAddr) -> Self {
        Self {
            local,
            port: ROCEV2_PORT,
            batch: 64,
            max_frame_len: 4096 + 256,
            local_mac: [0; 6],
            peer_mac: [0; 6],
            socket_buffer: 4 << 20,
        }
    }
}

/// Counters particular to this backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Received frames whose IPv4 id was not 0 and was solved from the ICRC.
    pub ip_id_recovered: u64,
    /// Received frames no IPv4 id could make the ICRC match (corrupt).
    pub icrc_unmatched: u64,
    /// Datagrams the kernel dropped for a full socket buffer (SO_RXQ_OVFL).
    pub socket_drops: u64,
    /// Received datagrams too short for a BTH + ICRC.
    pub runts: u64,
}

/// A UDP socket on port 4791 behind the [`PacketIo`] trait.
pub struct UdpBackend {
    fd: OwnedFd,
    v6: bool,
    local: IpAddr,
    cfg: UdpConfig,
    slot_len: usize,
    rx_buf: Vec<u8>,
    rx_iov: Vec<libc::iovec>,
    rx_names: Vec<libc::sockaddr_storage>,
    rx_cmsg: Vec<u8>,
    rx_hdrs: Vec<libc::mmsghdr>,
    tx_buf: Vec<u8>,
    tx_iov: Vec<libc::iovec>,
    tx_names: Vec<libc::sockaddr_storage>,
    tx_cmsg: Vec<u8>,
    tx_hdrs: Vec<libc::mmsghdr>,
    /// Engine frame length of each prepared datagram (for byte counters).
    tx_frame_len: Vec<usize>,
    stats: IoStats,
    udp_stats: UdpStats,
    last_ovfl: u32,
}

// SAFETY: the raw pointers inside the mmsghdr/iovec arrays point only into
// buffers this value owns on the heap (never reallocated); nothing is
// shared with another thread.
unsafe impl Send for UdpBackend {}

fn os_err(what: &str) -> IoError {
    setup_err(what, Some(std::io::Error::last_os_error()))
}

fn setup_err(what: impl std::fmt::Display, source: Option<std::io::Error>) -> IoError {
    IoError::Setup {
        what: format!("UDP backend: {what}"),
        source,
    }
}

fn setopt(fd: i32, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> std::io::Result<()> {
    // SAFETY: `v` is a valid c_int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn sockaddr_of(addr: SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    // SAFETY: sockaddr_storage is large and aligned enough for both.
    unsafe {
        match addr {
            SocketAddr::V4(a) => {
                let sin = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
            }
            SocketAddr::V6(a) => {
                let sin6 = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr.s6_addr = a.ip().octets();
                sin6.sin6_scope_id = a.scope_id();
                mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
            }
        }
    }
}

fn addr_of(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the family field says which view is valid.
    unsafe {
        match ss.ss_family as libc::c_int {
            libc::AF_INET => {
                let sin = &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes())),
                    u16::from_be(sin.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let sin6 = &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                // A v4-mapped peer on a dual-stack socket is really IPv4.
                let ip = match ip.to_ipv4_mapped() {
                    Some(v4) => IpAddr::V4(v4),
                    None => IpAddr::V6(ip),
                };
                Some(SocketAddr::new(ip, u16::from_be(sin6.sin6_port)))
            }
            _ => None,
        }
    }
}

/// IPv4 header checksum (RFC 1071).
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in h.chunks_exact(2) {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The IPv4 header the kernel puts in front of our datagram (fields the
/// ICRC masks are left 0).
fn ipv4_header(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    tos: u8,
    udp_len: usize,
    id: u16,
    df: bool,
) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[1] = tos;
    h[2..4].copy_from_slice(&((IPV4_LEN + udp_len) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6] = if df { 0x40 } else { 0 };
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    h
}

fn ipv6_header(src: Ipv6Addr, dst: Ipv6Addr, tclass: u8, udp_len: usize) -> [u8; 40] {
    let mut h = [0u8; 40];
    h[0] = 0x60 | (tclass >> 4);
    h[1] = tclass << 4;
    h[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    h[6] = 17;
    h[7] = 64;
    h[8..24].copy_from_slice(&src.octets());
    h[24..40].copy_from_slice(&dst.octets());
    h
}

/// Finds the IPv4 id and DF bit that make `found` the ICRC of the datagram
/// `l4` (UDP header .. pad, without ICRC) behind `hdr`. `None` if none does.
pub fn solve_ipv4_id(hdr: &[u8; 20], l4: &[u8], found: u32) -> Option<(u16, bool)> {
    let f = |id: u16, df: bool| -> Option<u32> {
        let mut h = *hdr;
        h[4..6].copy_from_slice(&id.to_be_bytes());
        h[6] = (h[6] & !0x40) | if df { 0x40 } else { 0 };
        icrc::compute(&h, l4).ok()
    };
    let base = f(0, false)?;
    // Column i: how flipping unknown i (16 id bits, then DF) changes the CRC.
    let mut cols = [0u32; 17];
    for (i, c) in cols.iter_mut().enumerate() {
        let v = if i < 16 {
            f(1 << i, false)?
        } else {
            f(0, true)?
        };
        *c = v ^ base;
    }
    // Gaussian elimination over GF(2): rows = CRC bits, track combinations.
    let target = base ^ found;
    let mut basis: Vec<(u32, u32)> = Vec::with_capacity(17); // (vector, unknowns mask)
    for (i, &c) in cols.iter().enumerate() {
        let (mut v, mut m) = (c, 1u32 << i);
        for &(bv, bm) in &basis {
            if v ^ bv < v {
                v ^= bv;
                m ^= bm;
            }
        }
        if v != 0 {
            basis.push((v, m));
            basis.sort_by_key(|b| std::cmp::Reverse(b.0));
        }
    }
    let (mut t, mut m) = (target, 0u32);
    for &(bv, bm) in &basis {
        if t ^ bv < t {
            t ^= bv;
            m ^= bm;
        }
    }
    (t == 0).then_some(((m & 0xffff) as u16, m & 0x1_0000 != 0))
}

impl UdpBackend {
    /// Binds `cfg.local:cfg.port` and prepares the batch buffers.
    pub fn open(cfg: UdpConfig) -> Result<Self> {
        let v6 = cfg.local.is_ipv6();
        let batch = cfg.batch.clamp(1, 1024);
        if cfg.max_frame_len < ETH_LEN + IPV6_LEN + UDP_LEN + BTH_LEN + ICRC_LEN {
            return Err(setup_err(
                format_args!(
                    "max_frame_len {} cannot hold a RoCEv2 frame",
                    cfg.max_frame_len
                ),
                None,
            ));
        }
        let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: plain socket(2); the fd is owned right away.
        let raw = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(os_err("socket"));
        }
        // SAFETY: `raw` is a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let buf = cfg.socket_buffer.min(i32::MAX as usize) as libc::c_int;
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setopt(raw, libc::SOL_SOCKET, force, buf).is_err() {
                let _ = setopt(raw, libc::SOL_SOCKET, plain, buf);
            }
        }
        let _ = setopt(raw, libc::SOL_SOCKET, SO_RXQ_OVFL, 1);
        let opts: &[(libc::c_int, libc::c_int, libc::c_int, &str)] = if v6 {
            &[
                (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1, "IPV6_V6ONLY"),
                (
                    libc::IPPROTO_IPV6,
                    libc::IPV6_RECVPKTINFO,
                    1,
                    "IPV6_RECVPKTINFO",
                ),
                (
                    libc::IPPROTO_IPV6,
                    libc::IPV6_RECVTCLASS,
                    1,
                    "IPV6_RECVTCLASS",
                ),
                (libc::IPPROTO_IPV6, IPV6_DONTFRAG, 1, "IPV6_DONTFRAG"),
            ]
        } else {
            &[
                (libc::IPPROTO_IP, libc::IP_PKTINFO, 1, "IP_PKTINFO"),
                (libc::IPPROTO_IP, libc::IP_RECVTOS, 1, "IP_RECVTOS"),
                (
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_DO,
                    "IP_MTU_DISCOVER",
                ),
                (libc::SOL_SOCKET, SO_NO_CHECK, 1, "SO_NO_CHECK"),
            ]
        };
        for &(level, opt, v, name) in opts {
            setopt(raw, level, opt, v).map_err(|e| setup_err(name, Some(e)))?;
        }
        let mut ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
        let len = sockaddr_of(SocketAddr::new(cfg.local, cfg.port), &mut ss);
        // SAFETY: `ss` holds a valid sockaddr of `len` bytes.
        if unsafe { libc::bind(raw, (&ss as *const libc::sockaddr_storage).cast(), len) } != 0 {
            let e = std::io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::EADDRINUSE) {
                " (another RoCEv2 stack, e.g. rdma_rxe, owns the port on this host)"
            } else {
                ""
            };
            return Err(setup_err(
                format_args!("bind {}:{}{hint}", cfg.local, cfg.port),
                Some(e),
            ));
        }
        let slot_len = RX_HEADROOM + cfg.max_frame_len;
        let mut me = Self {
            fd,
            v6,
            local: cfg.local,
            slot_len,
            rx_buf: vec![0; slot_len * batch],
            rx_iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                batch
            ],
            rx_names: vec![unsafe { mem::zeroed() }; batch],
            rx_cmsg: vec![0; CMSG_ROOM * batch],
            rx_hdrs: vec![unsafe { mem::zeroed() }; batch],
            tx_buf: vec![0; cfg.max_frame_len * batch],
            tx_iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                batch
            ],
            tx_names: vec![unsafe { mem::zeroed() }; batch],
            tx_cmsg: vec![0; CMSG_ROOM * batch],
            tx_hdrs: vec![unsafe { mem::zeroed() }; batch],
            tx_frame_len: vec![0; batch],
            cfg,
            stats: IoStats::default(),
            udp_stats: UdpStats::default(),
            last_ovfl: 0,
        };
        me.cfg.batch = batch;
        Ok(me)
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        SocketAddr::new(self.local, self.cfg.port)
    }

    /// Counters particular to this backend.
    pub fn udp_stats(&self) -> UdpStats {
        self.udp_stats
    }

    fn wait(&self, events: libc::c_short, timeout: Duration) -> std::io::Result<bool> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, poll_ms(timeout)) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(false);
            }
            return Err(e);
        }
        Ok(rc > 0)
    }

    fn recvmmsg(&mut self) -> std::io::Result<usize> {
        let batch = self.cfg.batch;
        for i in 0..batch {
            self.rx_iov[i] = libc::iovec {
                iov_base: self.rx_buf[i * self.slot_len + RX_HEADROOM..]
                    .as_mut_ptr()
                    .cast(),
                iov_len: self.cfg.max_frame_len - (ETH_LEN + IPV4_LEN + UDP_LEN),
            };
            let h = &mut self.rx_hdrs[i].msg_hdr;
            h.msg_name = (&mut self.rx_names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.rx_iov[i];
            h.msg_iovlen = 1;
            h.msg_control = self.rx_cmsg[i * CMSG_ROOM..].as_mut_ptr().cast();
            h.msg_controllen = CMSG_ROOM as _;
            h.msg_flags = 0;
            self.rx_hdrs[i].msg_len = 0;
        }
        // SAFETY: every header points into buffers owned by self.
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                self.rx_hdrs.as_mut_ptr(),
                batch as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        Ok(n as usize)
    }

    /// Rebuilds the frame of datagram `i` in its slot; returns its range.
    fn rebuild(&mut self, i: usize) -> Option<(usize, usize)> {
        let hdr = &self.rx_hdrs[i].msg_hdr;
        let payload_len = self.rx_hdrs[i].msg_len as usize;
        if hdr.msg_flags & libc::MSG_TRUNC != 0 {
            self.stats.rx_dropped += 1;
            return None;
        }
        // Control messages: destination address, TOS, drop counter.
        let mut dst: Option<IpAddr> = None;
        let mut tos = 0u8;
        // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG
        // macros walk it within those bounds.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(hdr);
            while !c.is_null() {
                let data = libc::CMSG_DATA(c);
                match ((*c).cmsg_level, (*c).cmsg_type) {
                    (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                        let pi = &*(data as *const libc::in_pktinfo);
                        dst = Some(IpAddr::V4(Ipv4Addr::from(pi.ipi_addr.s_addr.to_ne_bytes())));
                    }
                    (libc::IPPROTO_IP, libc::IP_TOS) => tos = *data,
                    (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                        let pi = &*(data as *const libc::in6_pktinfo);
                        dst = Some(IpAddr::V6(Ipv6Addr::from(pi.ipi6_addr.s6_addr)));
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                        tos = std::ptr::read_unaligned(data as *const libc::c_int) as u8
                    }
                    (libc::SOL_SOCKET, SO_RXQ_OVFL) => {
                        let v = std::ptr::read_unaligned(data as *const u32);
                        self.udp_stats.socket_drops = v as u64;
                        if v > self.last_ovfl {
                            self.stats.rx_dropped += (v - self.last_ovfl) as u64;
                            self.last_ovfl = v;
                        }
                    }
                    _ => {}
                }
                c = libc::CMSG_NXTHDR(hdr, c);
            }
        }
        let src = addr_of(&self.rx_names[i])?;
        let dst = dst.unwrap_or(self.local);
        if payload_len < BTH_LEN + ICRC_LEN {
            self.udp_stats.runts += 1;
            self.stats.rx_dropped += 1;
            return None;
        }
        let udp_len = UDP_LEN + payload_len;
        let slot = &mut self.rx_buf[i * self.slot_len..(i + 1) * self.slot_len];
        let udp_at = RX_HEADROOM - UDP_LEN;
        slot[udp_at..udp_at + 2].copy_from_slice(&src.port().to_be_bytes());
        slot[udp_at + 2..udp_at + 4].copy_from_slice(&self.cfg.port.to_be_bytes());
        slot[udp_at + 4..udp_at + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        slot[udp_at + 6..udp_at + 8].copy_from_slice(&[0, 0]);
        let end = RX_HEADROOM + payload_len;
        let (start, ethertype) = match (src.ip(), dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut h = ipv4_header(s, d, tos, udp_len, 0, true);
                let l4 = &slot[udp_at..end - ICRC_LEN];
                let found = u32::from_le_bytes(slot[end - ICRC_LEN..end].try_into().unwrap());
                if icrc::compute(&h, l4).ok() != Some(found) {
                    match solve_ipv4_id(&h, l4, found) {
                        Some((id, df)) => {
                            h[4..6].copy_from_slice(&id.to_be_bytes());
                            h[6] = if df { 0x40 } else { 0 };
                            self.udp_stats.ip_id_recovered += 1;
                        }
                        None => self.udp_stats.icrc_unmatched += 1,
                    }
                }
                let sum = ipv4_checksum(&h);
                h[10..12].copy_from_slice(&sum.to_be_bytes());
                let ip_at = udp_at - IPV4_LEN;
                slot[ip_at..udp_at].copy_from_slice(&h);
                (ip_at - ETH_LEN, 0x0800u16)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let h = ipv6_header(s, d, tos, udp_len);
                let l4 = &slot[udp_at..end - ICRC_LEN];
                let found = u32::from_le_bytes(slot[end - ICRC_LEN..end].try_into().unwrap());
                if icrc::compute(&h, l4).ok() != Some(found) {
                    self.udp_stats.icrc_unmatched += 1;
                }
                let ip_at = udp_at - IPV6_LEN;
                slot[ip_at..udp_at].copy_from_slice(&h);
                (ip_at - ETH_LEN, 0x86ddu16)
            }
            _ => {
                self.stats.rx_dropped += 1;
                return None;
            }
        };
        slot[start..start + 6].copy_from_slice(&self.cfg.local_mac);
        slot[start + 6..start + 12].copy_from_slice(&self.cfg.peer_mac);
        slot[start + 12..start + 14].copy_from_slice(&ethertype.to_be_bytes());
        Some((i * self.slot_len + start, i * self.slot_len + end))
    }

    /// Turns the engine's frame in TX slot `i` (length `len`) into a
    /// datagram: destination, payload range, fixed ICRC, TOS cmsg.
    fn prepare(&mut self, i: usize, len: usize) -> std::result::Result<(), String> {
        let ml = self.cfg.max_frame_len;
        let frame = &mut self.tx_buf[i * ml..i * ml + len];
        if len < ETH_LEN {
            return Err(format!("{len}-byte frame has no Ethernet header"));
        }
        let mut off = 12;
        let mut ethertype = u16::from_be_bytes([frame[off], frame[off + 1]]);
        // Skip up to two VLAN tags (802.1ad / 802.1Q).
        while (ethertype == 0x8100 || ethertype == 0x88a8) && off + 6 <= len {
            off += 4;
            ethertype = u16::from_be_bytes([frame[off], frame[off + 1]]);
        }
        let ip_at = off + 2;
        let (dst, tos, udp_at, ip_end) = match ethertype {
            0x0800 if !self.v6 => {
                let ip = frame
                    .get(ip_at..ip_at + IPV4_LEN)
                    .ok_or("truncated IPv4 header")?;
                if ip[0] != 0x45 || ip[9] != 17 {
                    return Err("not IPv4/UDP without options".into());
                }
                let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
                let d = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
                (IpAddr::V4(d), ip[1], ip_at + IPV4_LEN, ip_at + total)
            }
            0x86dd if self.v6 => {
                let ip = frame
                    .get(ip_at..ip_at + IPV6_LEN)
                    .ok_or("truncated IPv6 header")?;
                if ip[6] != 17 {
                    return Err("IPv6 next header is not UDP".into());
                }
                let pl = u16::from_be_bytes([ip[4], ip[5]]) as usize;
                let tc = (ip[0] << 4) | (ip[1] >> 4);
                let d: [u8; 16] = ip[24..40].try_into().unwrap();
                (
                    IpAddr::V6(Ipv6Addr::from(d)),
                    tc,
                    ip_at + IPV6_LEN,
                    ip_at + IPV6_LEN + pl,
                )
            }
            t => {
                return Err(format!(
                    "ethertype {t:#06x} does not match this {} socket",
                    if self.v6 { "IPv6" } else { "IPv4" }
                ))
            }
        };
        let udp = frame
            .get(udp_at..udp_at + UDP_LEN)
            .ok_or("truncated UDP header")?;
        let dport = u16::from_be_bytes([udp[2], udp[3]]);
        let udp_len = u16::from_be_bytes([udp[4], udp[5]]) as usize;
        let udp_end = udp_at + udp_len;
        if udp_len < UDP_LEN + BTH_LEN + ICRC_LEN || udp_end > len || udp_end > ip_end {
            return Err(format!(
                "UDP length {udp_len} does not fit the {len}-byte frame"
            ));
        }
        // What the kernel will send: our address and port, id 0, DF.
        frame[udp_at..udp_at + 2].copy_from_slice(&self.cfg.port.to_be_bytes());
        frame[udp_at + 6..udp_at + 8].copy_from_slice(&[0, 0]);
        let l4 = &frame[udp_at..udp_end - ICRC_LEN];
        let crc = match (self.local, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                icrc::compute(&ipv4_header(s, d, tos, udp_len, 0, true), l4)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => icrc::compute(&ipv6_header(s, d, tos, udp_len), l4),
            _ => return Err("address family mismatch".into()),
        }
        .map_err(|e| format!("ICRC: {e:?}"))?;
        frame[udp_end - ICRC_LEN..udp_end].copy_from_slice(&crc.to_le_bytes());
        self.tx_iov[i] = libc::iovec {
            iov_base: frame[udp_at + UDP_LEN..].as_mut_ptr().cast(),
            iov_len: udp_len - UDP_LEN,
        };
        let namelen = sockaddr_of(SocketAddr::new(dst, dport), &mut self.tx_names[i]);
        // One control message: the TOS / traffic class (DSCP + ECN).
        let cm = &mut self.tx_cmsg[i * CMSG_ROOM..(i + 1) * CMSG_ROOM];
        cm.fill(0);
        let h = &mut self.tx_hdrs[i].msg_hdr;
        h.msg_name = (&mut self.tx_names[i] as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = namelen;
        h.msg_iov = &mut self.tx_iov[i];
        h.msg_iovlen = 1;
        h.msg_flags = 0;
        h.msg_control = cm.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE/LEN are pure; the buffer has CMSG_ROOM bytes,
        // more than one int-sized control message needs.
        unsafe {
            h.msg_controllen = libc::CMSG_SPACE(mem::size_of::<libc::c_int>() as u32) as _;
            let c = libc::CMSG_FIRSTHDR(h);
            if self.v6 {
                (*c).cmsg_level = libc::IPPROTO_IPV6;
                (*c).cmsg_type = libc::IPV6_TCLASS;
            } else {
                (*c).cmsg_level = libc::IPPROTO_IP;
                (*c).cmsg_type = libc::IP_TOS;
            }
            (*c).cmsg_len = libc::CMSG_LEN(mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, tos as libc::c_int);
        }
        self.tx_hdrs[i].msg_len = 0;
        self.tx_frame_len[i] = len;
        Ok(())
    }

    /// Sends datagrams 0..n, waiting briefly when the socket is full.
    fn sendmmsg(&mut self, n: usize) -> std::io::Result<usize> {
        let mut done = 0;
        let mut stalls = 0;
        while done < n {
            // SAFETY: headers done..n were prepared and point into self.
            let rc = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    self.tx_hdrs[done..].as_mut_ptr(),
                    (n - done) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            self.stats.tx_kicks += 1;
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR) if stalls < 100 => {
                        stalls += 1;
                        self.wait(libc::POLLOUT, Duration::from_millis(1))?;
                        continue;
                    }
                    Some(libc::EAGAIN | libc::ENOBUFS) => {
                        // Still full: the rest are lost like on a busy link.
                        self.stats.tx_errors += (n - done) as u64;
                        break;
                    }
                    Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH) => {
                        // An ICMP error from an earlier datagram: skip one.
                        self.stats.tx_errors += 1;
                        done += 1;
                        continue;
                    }
                    _ => return Err(e),
                }
            }
            for k in done..done + rc as usize {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += self.tx_frame_len[k] as u64;
            }
            done += rc as usize;
        }
        Ok(done)
    }
}

impl PacketIo for UdpBackend {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn max_frame_len(&self) -> usize {
        self.cfg.max_frame_len
    }

    fn recv_batch(&mut self, timeout: Duration, on_frame: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut n = self.recvmmsg()?;
        if n == 0 && !timeout.is_zero() && self.wait(libc::POLLIN, timeout)? {
            n = self.recvmmsg()?;
        }
        let mut delivered = 0;
        for i in 0..n {
            if let Some((a, b)) = self.rebuild(i) {
                on_frame(&self.rx_buf[a..b]);
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += (b - a) as u64;
                delivered += 1;
            }
        }
        Ok(delivered)
    }

    fn transmit(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Result<usize> {
        let ml = self.cfg.max_frame_len;
        let mut n = 0;
        let mut bad = None;
        while n < self.cfg.batch {
            let Some(len) = fill(&mut self.tx_buf[n * ml..(n + 1) * ml]) else {
                break;
            };
            if len == 0 {
                break;
            }
            if len > ml {
                bad = Some(IoError::FrameTooBig {
                    len,
                    max: ml,
                    hint: "",
                });
                break;
            }
            if let Err(detail) = self.prepare(n, len) {
                bad = Some(IoError::BadFrame {
                    backend: "udp",
                    detail,
                });
                break;
            }
            n += 1;
        }
        let sent = if n > 0 { self.sendmmsg(n)? } else { 0 };
        match bad {
            Some(e) => {
                self.stats.tx_errors += 1;
                Err(e)
            }
            None => Ok(sent),
        }
    }

    fn wait_writable(&mut self, timeout: Duration) -> Result<bool> {
        Ok(self.wait(libc::POLLOUT, timeout)?)
    }

    fn stats(&mut self) -> IoStats {
        self.stats
    }

    fn poll_fd(&self) -> Option<i32> {
        Some(self.fd.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xroce_wire::{emit_frame, BthRepr, FrameRepr, Gid, Opcode, TransportRepr};

    /// A valid RC SEND_ONLY frame from xroce's codec.
    pub(crate) fn send_only(
        src: IpAddr,
        dst: IpAddr,
        qpn: u32,
        psn: u32,
        payload: &[u8],
    ) -> Vec<u8> {
        let bth = BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: true,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: qpn,
            ack_req: true,
            psn,
        };
        let t = TransportRepr::new(bth);
        let repr = FrameRepr::new(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            Gid::from(src),
            Gid::from(dst),
            0xc000 | (qpn as u16 & 0x3fff),
            t,
        );
        let mut buf = vec![0u8; repr.frame_len(payload.len())];
        emit_frame(&repr, payload, &mut buf).unwrap();
        buf
    }

    #[test]
    fn ip_id_is_solved_from_the_icrc() {
        let src = Ipv4Addr::new(10, 1, 2, 3);
        let dst = Ipv4Addr::new(10, 1, 2, 4);
        let frame = send_only(src.into(), dst.into(), 0x11, 7, b"hello world, rdma");
        let l4 = &frame[34..frame.len() - 4];
        // What an rxe sender with a random id would have covered.
        for (id, df) in [(0x1234u16, true), (0xfffe, true), (7, false), (0, true)] {
            let h = ipv4_header(src, dst, 0, l4.len() + 4, id, df);
            let crc = icrc::compute(&h, l4).unwrap();
            let base = ipv4_header(src, dst, 0, l4.len() + 4, 0, true);
            assert_eq!(solve_ipv4_id(&base, l4, crc), Some((id, df)));
        }
        // A corrupt ICRC has (almost surely) no solution.
        let base = ipv4_header(src, dst, 0, l4.len() + 4, 0, true);
        let good = icrc::compute(&base, l4).unwrap();
        let misses = (1..200u32)
            .filter(|k| solve_ipv4_id(&base, l4, good ^ k.wrapping_mul(0x9e37_79b9)).is_none())
            .count();
        assert!(misses >= 190, "{misses}");
    }

    #[test]
    fn loopback_roundtrip_rebuilds_a_checked_frame() {
        let lo: IpAddr = Ipv4Addr::LOCALHOST.into();
        let mut cfg = UdpConfig::new(lo);
        // Two loopback addresses on a port of their own (4791 may be taken).
        cfg.port = 47910 + (std::process::id() % 50) as u16;
        let mut a = UdpBackend::open(cfg.clone()).expect("bind 127.0.0.1");
        let mut cfg_b = cfg.clone();
        cfg_b.local = Ipv4Addr::new(127, 0, 0, 2).into();
        let mut b = UdpBackend::open(cfg_b).expect("bind 127.0.0.2");
        let mut frame = send_only(
            lo,
            Ipv4Addr::new(127, 0, 0, 2).into(),
            0x42,
            99,
            b"payload!",
        );
        // The engine addresses port 4791; this test's backends use another.
        let udp_at = 34;
        frame[udp_at + 2..udp_at + 4].copy_from_slice(&cfg.port.to_be_bytes());
        assert_eq!(a.send_batch(&[&frame]).unwrap(), 1);
        let mut got = Vec::new();
        b.recv_batch(Duration::from_secs(1), &mut |f| got = f.to_vec())
            .unwrap();
        assert!(!got.is_empty(), "nothing received");
        // The ICRC over the rebuilt headers holds; with the real port it
        // would parse as RoCEv2 too.
        icrc::verify_frame(&got).expect("ICRC of the rebuilt frame");
        assert_eq!(&got[26..30], &[127, 0, 0, 1]);
        assert_eq!(&got[30..34], &[127, 0, 0, 2]);
        assert_eq!(
            &got[34..36],
            &cfg.port.to_be_bytes(),
            "source port is the socket's"
        );
        assert_eq!(&got[42..got.len() - 4], &frame[42..frame.len() - 4]);
        assert_eq!(PacketIo::stats(&mut b).rx_frames, 1);
        assert_eq!(b.udp_stats().icrc_unmatched, 0);
        // The kernel sent IPv4 id 0 with DF, as the sender assumed.
        assert_eq!(b.udp_stats().ip_id_recovered, 0);
    }

    #[test]
    fn ipv6_loopback_roundtrip_keeps_the_icrc_and_traffic_class() {
        let lo: IpAddr = Ipv6Addr::LOCALHOST.into();
        let mut cfg = UdpConfig::new(lo);
        cfg.port = 47960 + (std::process::id() % 30) as u16;
        let mut a = UdpBackend::open(cfg.clone()).expect("bind [::1]");
        let mut cfg_b = cfg.clone();
        cfg_b.port += 1;
        let mut b = UdpBackend::open(cfg_b.clone()).expect("bind [::1] again");
        let mut frame = send_only(lo, lo, 0x77, 5, b"over IPv6");
        // Traffic class with ECN CE; UDP at 14 + 40.
        frame[14] = (frame[14] & 0xf0) | 0x0b;
        frame[15] = (frame[15] & 0x0f) | 0x80;
        frame[54 + 2..54 + 4].copy_from_slice(&cfg_b.port.to_be_bytes());
        assert_eq!(a.send_batch(&[&frame]).unwrap(), 1);
        let mut got = Vec::new();
        b.recv_batch(Duration::from_secs(1), &mut |f| got = f.to_vec())
            .unwrap();
        assert_eq!(&got[12..14], &[0x86, 0xdd]);
        icrc::verify_frame(&got).expect("ICRC over the rebuilt IPv6 headers");
        let tclass = (got[14] << 4) | (got[15] >> 4);
        assert_eq!(tclass, 0xb8, "traffic class from IPV6_TCLASS");
        assert_eq!(&got[62..got.len() - 4], &frame[62..frame.len() - 4]);
        assert_eq!(b.udp_stats().icrc_unmatched, 0);
    }

    #[test]
    fn bad_frames_are_refused_with_a_reason() {
        let mut a = UdpBackend::open(UdpConfig {
            port: 0,
            ..UdpConfig::new(Ipv4Addr::LOCALHOST.into())
        })
        .unwrap();
        let e = a.send_batch(&[&[0u8; 20]]).unwrap_err();
        assert!(e.to_string().contains("ethertype"), "{e}");
        let mut v6 = send_only(
            Ipv6Addr::LOCALHOST.into(),
            Ipv6Addr::LOCALHOST.into(),
            1,
            1,
            b"x",
        );
        let e = a.send_batch(&[&v6]).unwrap_err();
        assert!(e.to_string().contains("IPv4"), "{e}");
        v6.truncate(30);
        assert!(a.send_batch(&[&v6]).is_err());
    }
}
