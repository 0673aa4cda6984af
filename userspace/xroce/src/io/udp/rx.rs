//! Receiving: one recvmmsg for a batch of datagrams, then each payload gets
//! the Ethernet, IP and UDP headers it arrived with rebuilt in front of it
//! in place, so the engine sees the frame (and ICRC) the sender sent.

use std::{
    mem,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::AsRawFd,
};

use xroce_wire::{
    bth, eth, icrc, icrc_solve::solve_ipv4_ident, ipv4, ipv6, udp, EthRepr, UdpChecksum, UdpRepr,
    ICRC_LEN,
};

use super::{kernel_ipv4, kernel_ipv6, sockaddr::addr_of, UdpBackend, CMSG_ROOM, RX_HEADROOM};

impl UdpBackend {
    /// Reads up to a batch from the IPv6 (`v6`) or the IPv4 socket.
    pub(super) fn recvmmsg(&mut self, v6: bool) -> std::io::Result<usize> {
        let Some(socket) = (if v6 { &self.v6 } else { &self.v4 }) else {
            return Ok(0);
        };
        let fd = socket.fd.as_raw_fd();
        let batch = self.cfg.batch;
        for i in 0..batch {
            self.rx_iov[i] = libc::iovec {
                iov_base: self.rx_buf[i * self.slot_len + RX_HEADROOM..]
                    .as_mut_ptr()
                    .cast(),
                iov_len: self.cfg.max_frame_len
                    - (eth::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN),
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

    /// Rebuilds the frame of datagram `i`, read from the IPv6 (`v6`) or
    /// the IPv4 socket, in its slot; returns its range.
    pub(super) fn rebuild(&mut self, i: usize, v6: bool) -> Option<(usize, usize)> {
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
        let src = addr_of(&self.rx_names[i])?;
        // IP_PKTINFO / IPV6_PKTINFO are on: always there.
        let Some(dst) = dst else {
            self.stats.rx_dropped += 1;
            return None;
        };
        if payload_len < bth::HEADER_LEN + ICRC_LEN {
            self.udp_stats.runts += 1;
            self.stats.rx_dropped += 1;
            return None;
        }
        let udp_len = udp::HEADER_LEN + payload_len;
        let slot = &mut self.rx_buf[i * self.slot_len..(i + 1) * self.slot_len];
        let udp_at = RX_HEADROOM - udp::HEADER_LEN;
        let end = RX_HEADROOM + payload_len;
        UdpRepr {
            src_port: src.port(),
            dst_port: self.cfg.port,
            checksum: UdpChecksum::Zero,
        }
        .emit(&mut slot[udp_at..], payload_len)
        .ok()?;
        let found = u32::from_le_bytes(slot[end - ICRC_LEN..end].try_into().unwrap());
        // The IP header goes right in front of the UDP header.
        let (head, l4) = slot.split_at_mut(udp_at);
        let l4 = &l4[..end - ICRC_LEN - udp_at];
        let (ip_at, ethertype) = match (src.ip(), dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let ip_at = udp_at - ipv4::HEADER_LEN;
                // What xroce (and this backend) send: id 0 with DF.
                let mut ip = kernel_ipv4(s, d, tos, udp_len);
                ip.emit(&mut head[ip_at..]).ok()?;
                if icrc::compute(&head[ip_at..], l4).ok() != Some(found) {
                    match solve_ipv4_ident(&ip, l4, found) {
                        Some((ident, dont_frag)) => {
                            ip.ident = ident;
                            ip.dont_frag = dont_frag;
                            ip.emit(&mut head[ip_at..]).ok()?;
                            self.udp_stats.ip_id_recovered += 1;
                        }
                        None => self.udp_stats.icrc_unmatched += 1,
                    }
                }
                (ip_at, eth::ETHERTYPE_IPV4)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let ip_at = udp_at - ipv6::HEADER_LEN;
                kernel_ipv6(s, d, tos, udp_len)
                    .emit(&mut head[ip_at..])
                    .ok()?;
                if icrc::compute(&head[ip_at..], l4).ok() != Some(found) {
                    self.udp_stats.icrc_unmatched += 1;
                }
                (ip_at, eth::ETHERTYPE_IPV6)
            }
            _ => {
                self.stats.rx_dropped += 1;
                return None;
            }
        };
        let start = ip_at - eth::HEADER_LEN;
        EthRepr {
            dst: self.cfg.local_mac,
            src: self.cfg.peer_mac,
            svlan: None,
            vlan: None,
            ethertype,
        }
        .emit(&mut slot[start..])
        .ok()?;
        Some((i * self.slot_len + start, i * self.slot_len + end))
    }
}
