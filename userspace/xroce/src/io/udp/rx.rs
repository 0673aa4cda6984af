//! Receiving: one recvmmsg for a batch of datagrams. With UDP_GRO a
//! datagram may hold several RoCEv2 packets the kernel coalesced (a UDP GSO
//! message that crossed a veth whole, or packets GRO merged): the gso_size
//! control message says where each ends, and each is handed on alone. Each
//! packet's ICRC is checked over the IP and UDP headers it arrived with
//! (one pass when its IPv4 id is the one expected), and the engine gets the
//! datagram with that IP header. Only `PacketIo::recv_batch` rebuilds
//! Ethernet and IP headers in front of it, in place (a packet after the first of a coalesced datagram
//! writes them over the tail of the packet before it, which was handed on
//! already).

use std::{
    mem,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::AsRawFd,
};

use xroce_wire::{
    bth, eth, icrc, icrc_solve::solve_ipv4_ident, ipv4, ipv6, udp, EthRepr, IpRepr, UdpChecksum,
    UdpRepr, ICRC_LEN,
};

use super::{kernel_ipv4, kernel_ipv6, sockaddr::addr_of, UdpBackend, CMSG_ROOM, RX_HEADROOM};
use crate::io::{Received, Rejected, RxDatagram};

/// What the control messages and the name say of one received datagram.
#[derive(Clone, Copy, Debug)]
pub(super) struct RxMeta {
    pub src: SocketAddr,
    pub dst: IpAddr,
    pub tos: u8,
    /// TTL / hop limit the datagram arrived with (IP_RECVTTL /
    /// IPV6_RECVHOPLIMIT), so a UD receive's GRH has it as on the wire.
    pub ttl: u8,
    /// Bytes read.
    pub len: usize,
    /// Size of each coalesced packet (UDP_GRO); `None`: one packet.
    pub gso_size: Option<usize>,
    /// When it reached the host, on the engine's clock (SO_TIMESTAMPNS).
    pub arrived_ns: Option<u64>,
}

/// The packets of a datagram of `len` bytes coalesced at `gso_size`: every
/// one `gso_size` long but the last, which may be shorter (what the kernel's
/// GSO cut and GRO merged). Yields (offset, length).
pub(super) fn split(len: usize, gso_size: Option<usize>) -> impl Iterator<Item = (usize, usize)> {
    let size = gso_size.filter(|&s| s > 0).unwrap_or(len.max(1));
    (0..len)
        .step_by(size)
        .map(move |at| (at, size.min(len - at)))
}

impl UdpBackend {
    /// Reads up to a batch from the IPv6 (`v6`) or the IPv4 socket.
    pub(super) fn recvmmsg(&mut self, v6: bool) -> std::io::Result<usize> {
        let Some(socket) = (if v6 { &self.v6 } else { &self.v4 }) else {
            return Ok(0);
        };
        let fd = socket.fd.as_raw_fd();
        let batch = self.rx_slots;
        for i in 0..batch {
            self.rx_iov[i] = libc::iovec {
                iov_base: self.rx_buf[i * self.slot_len + RX_HEADROOM..]
                    .as_mut_ptr()
                    .cast(),
                iov_len: self.slot_len - RX_HEADROOM,
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
                fd,
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

    /// The addresses, TOS and GRO size of datagram `i`, read from the IPv6
    /// (`v6`) or the IPv4 socket; `None` (counted) if it cannot be used.
    pub(super) fn rx_meta(&mut self, i: usize, v6: bool) -> Option<RxMeta> {
        let hdr = &self.rx_hdrs[i].msg_hdr;
        let len = self.rx_hdrs[i].msg_len as usize;
        if hdr.msg_flags & libc::MSG_TRUNC != 0 {
            self.stats.rx_dropped += 1;
            return None;
        }
        // Control messages: destination address, TOS, GRO size, drops.
        let mut dst: Option<IpAddr> = None;
        let mut tos = 0u8;
        let mut ttl = 64u8;
        let mut gso_size = None;
        let mut arrived_ns = None;
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
                    (libc::IPPROTO_IP, libc::IP_TTL) => {
                        ttl = std::ptr::read_unaligned(data as *const libc::c_int) as u8
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                        ttl = std::ptr::read_unaligned(data as *const libc::c_int) as u8
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                        let pi = &*(data as *const libc::in6_pktinfo);
                        dst = Some(IpAddr::V6(Ipv6Addr::from(pi.ipi6_addr.s6_addr)));
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                        tos = std::ptr::read_unaligned(data as *const libc::c_int) as u8
                    }
                    (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                        let ts = std::ptr::read_unaligned(data as *const libc::timespec);
                        let rt = u64::try_from(ts.tv_sec).ok().and_then(|s| {
                            s.checked_mul(1_000_000_000)?
                                .checked_add(u64::try_from(ts.tv_nsec).ok()?)
                        });
                        arrived_ns = rt.and_then(|rt| self.rx_clock.engine_ns(rt));
                    }
                    (libc::SOL_UDP, libc::UDP_GRO) => {
                        let size = std::ptr::read_unaligned(data as *const libc::c_int);
                        gso_size = usize::try_from(size).ok().filter(|&s| s > 0);
                    }
                    (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                        let v = std::ptr::read_unaligned(data as *const u32);
                        let last = &mut self.last_ovfl[v6 as usize];
                        if v > *last {
                            self.stats.rx_dropped += (v - *last) as u64;
                            self.udp_stats.socket_drops += (v - *last) as u64;
                            *last = v;
                        }
                    }
                    _ => {}
                }
                c = libc::CMSG_NXTHDR(hdr, c);
            }
        }
        let src = addr_of(&self.rx_names[i]);
        // IP_PKTINFO / IPV6_PKTINFO are on: always there.
        let (Some(src), Some(dst)) = (src, dst) else {
            self.stats.rx_dropped += 1;
            return None;
        };
        Some(RxMeta {
            src,
            dst,
            tos,
            ttl,
            len,
            gso_size,
            arrived_ns,
        })
    }

    /// Checks the ICRC of the packet of `payload_len` bytes (BTH .. ICRC)
    /// at `payload_at` in the receive buffer (from datagram `meta`) over
    /// the headers it came with, writing its UDP header in front of it
    /// (the ICRC covers it); `prev_id`: the IPv4 id the packet before it in
    /// the same coalesced datagram matched, so this one is tried with the
    /// next id (how GSO numbers them) before 0 and before solving for it.
    /// `None` (counted) for a packet too short to be RoCEv2.
    pub(super) fn check(
        &mut self,
        payload_at: usize,
        payload_len: usize,
        meta: &RxMeta,
        prev_id: Option<u16>,
    ) -> Option<RxPacket> {
        if payload_len < bth::HEADER_LEN + ICRC_LEN {
            self.udp_stats.runts += 1;
            self.stats.rx_dropped += 1;
            return None;
        }
        let udp_len = udp::HEADER_LEN + payload_len;
        let udp_at = payload_at - udp::HEADER_LEN;
        let end = payload_at + payload_len;
        let sport = meta.src.port();
        UdpRepr {
            src_port: sport,
            dst_port: self.cfg.port,
            checksum: UdpChecksum::Zero,
        }
        .emit(&mut self.rx_buf[udp_at..end], payload_len)
        .ok()?;
        let found = u32::from_le_bytes(self.rx_buf[end - ICRC_LEN..end].try_into().unwrap());
        let l4 = &self.rx_buf[udp_at..end - ICRC_LEN];
        let mut header = [0u8; ipv6::HEADER_LEN];
        let mut computed = None;
        let (ip, used_id) = match (meta.src.ip(), meta.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                // Next in a GSO run, else what a datagram sent alone by
                // xroce (and this backend) carries: id 0 with DF.
                let guesses = [prev_id.map(|p| p.wrapping_add(1)), Some(0)];
                let mut ip = kernel_ipv4(s, d, meta.tos, udp_len, 0);
                // The ICRC masks the TTL: the id search is unaffected.
                ip.ttl = meta.ttl;
                let mut used_id = 0;
                for (k, guess) in guesses.into_iter().enumerate() {
                    let Some(id) = guess else { continue };
                    if k > 0 && guesses[0] == Some(id) {
                        continue;
                    }
                    ip.ident = id;
                    ip.emit(&mut header).ok()?;
                    let c = icrc::compute(&header[..ipv4::HEADER_LEN], l4).ok();
                    computed = c;
                    if c == Some(found) {
                        used_id = id;
                        break;
                    }
                }
                if computed != Some(found) {
                    match solve_ipv4_ident(&ip, l4, found) {
                        Some((ident, dont_frag)) => {
                            ip.ident = ident;
                            ip.dont_frag = dont_frag;
                            used_id = ident;
                            computed = Some(found);
                            self.udp_stats.ip_id_recovered += 1;
                        }
                        None => ip.ident = 0,
                    }
                }
                (IpRepr::V4(ip), used_id)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let mut ip = kernel_ipv6(s, d, meta.tos, udp_len);
                ip.hop_limit = meta.ttl;
                ip.emit(&mut header).ok()?;
                computed = icrc::compute(&header, l4).ok();
                (IpRepr::V6(ip), 0)
            }
            _ => {
                self.stats.rx_dropped += 1;
                return None;
            }
        };
        let computed = computed?;
        if computed != found {
            self.udp_stats.icrc_unmatched += 1;
        }
        Some(RxPacket {
            payload_at,
            payload_len,
            ip,
            udp_src_port: sport,
            icrc: (computed, found),
            ip_id: used_id,
            arrived_ns: meta.arrived_ns,
        })
    }
}

/// One packet received and checked.
pub(super) struct RxPacket {
    /// Where its UDP payload (BTH .. ICRC) is in the receive buffer; its
    /// UDP header is in front of it.
    pub payload_at: usize,
    pub payload_len: usize,
    /// The IP header it came with: addresses and ports from the socket,
    /// TOS and TTL from control messages, the IPv4 id and DF the ICRC
    /// was found to cover (0 with DF if none was).
    pub ip: IpRepr,
    pub udp_src_port: u16,
    /// (computed, found) ICRC.
    pub icrc: (u32, u32),
    /// The IPv4 id it matched (0 if it matched none).
    pub ip_id: u16,
    /// When it reached the host, on the engine's clock.
    pub arrived_ns: Option<u64>,
}

impl RxPacket {
    /// Its length as an untagged Ethernet frame.
    pub fn frame_len(&self) -> usize {
        eth::HEADER_LEN + self.ip.header_len() + udp::HEADER_LEN + self.payload_len
    }

    /// It as the engine takes it, in receive buffer `buf`: the datagram,
    /// or rejected for a bad ICRC.
    pub fn received<'a>(&self, buf: &'a [u8]) -> Received<'a> {
        let (computed, found) = self.icrc;
        if computed != found {
            return Err(Rejected {
                len: self.frame_len(),
                error: xroce_wire::Error::BadIcrc { computed, found },
            });
        }
        Ok(RxDatagram {
            ip: self.ip,
            udp_src_port: self.udp_src_port,
            udp_payload: &buf[self.payload_at..self.payload_at + self.payload_len],
            arrived_ns: self.arrived_ns,
        })
    }

    /// Writes the Ethernet (`dst` <- `src`) and IP headers in front of its
    /// UDP header in `buf`: the frame it came in, as the sender's ICRC
    /// covers it. Returns the frame's range.
    pub fn rebuild_frame(&self, buf: &mut [u8], dst: [u8; 6], src: [u8; 6]) -> (usize, usize) {
        let ip_at = self.payload_at - udp::HEADER_LEN - self.ip.header_len();
        let start = ip_at - eth::HEADER_LEN;
        let (ethertype, emitted) = match &self.ip {
            IpRepr::V4(ip) => (eth::ETHERTYPE_IPV4, ip.emit(&mut buf[ip_at..])),
            IpRepr::V6(ip) => (eth::ETHERTYPE_IPV6, ip.emit(&mut buf[ip_at..])),
        };
        let eth = EthRepr {
            dst,
            src,
            svlan: None,
            vlan: None,
            ethertype,
        };
        let emitted = emitted.and_then(|_| eth.emit(&mut buf[start..]));
        debug_assert!(emitted.is_ok(), "headers fit the receive headroom");
        (start, self.payload_at + self.payload_len)
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn a_coalesced_datagram_splits_at_its_gso_size() {
        let got: Vec<_> = split(10, Some(4)).collect();
        assert_eq!(got, [(0, 4), (4, 4), (8, 2)]);
        let got: Vec<_> = split(8, Some(4)).collect();
        assert_eq!(got, [(0, 4), (4, 4)]);
        // Not coalesced: one packet.
        assert_eq!(split(7, None).collect::<Vec<_>>(), [(0, 7)]);
        assert_eq!(split(7, Some(0)).collect::<Vec<_>>(), [(0, 7)]);
        // Larger than the datagram: one packet.
        assert_eq!(split(7, Some(100)).collect::<Vec<_>>(), [(0, 7)]);
        assert_eq!(split(0, None).count(), 0);
    }
}
