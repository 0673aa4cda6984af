//! Sending: each frame the engine wrote becomes one datagram (its UDP
//! payload, to its destination IP, with its TOS as a control message), its
//! ICRC recomputed over the headers the kernel will actually send, and a
//! batch leaves in one sendmmsg.

use std::{
    mem,
    net::{IpAddr, SocketAddr, SocketAddrV6},
    os::fd::AsRawFd,
    time::Duration,
};

use xroce_wire::{
    bth, eth, icrc,
    ipv4::{self, Ipv4Packet, PROTO_UDP},
    ipv6::{self, Ipv6Packet, NEXT_HEADER_UDP},
    udp::{self, UdpPacket},
    EthRepr, UdpChecksum, UdpRepr, ICRC_LEN,
};

use xroce_common::qpn_block;

use super::{kernel_ipv4, kernel_ipv6, sockaddr::sockaddr_of, wait_on, UdpBackend, CMSG_ROOM};

impl UdpBackend {
    /// Turns the engine's frame in TX slot `i` (length `len`) into a
    /// datagram: destination, payload range, fixed ICRC, TOS cmsg.
    pub(super) fn prepare(&mut self, i: usize, len: usize) -> Result<(), String> {
        let ml = self.cfg.max_frame_len;
        let frame = &mut self.tx_buf[i * ml..i * ml + len];
        if len < eth::HEADER_LEN {
            return Err(format!("{len}-byte frame has no Ethernet header"));
        }
        let (eth, ip_at) = EthRepr::parse(frame).map_err(|e| format!("{len}-byte frame: {e}"))?;
        // The frame's source matters only to the interface-wide IPv6
        // socket, which sends from it (IPV6_PKTINFO).
        let (socket, frame_src, dst, tos, udp_at, ip_end) =
            match (eth.ethertype, &self.v4, &self.v6) {
                (eth::ETHERTYPE_IPV4, Some(socket), _) => {
                    let ip = Ipv4Packet::new_checked(&frame[ip_at..])
                        .map_err(|_| "truncated IPv4 header")?;
                    if ip.version() != 4 || ip.ihl() != 5 || ip.protocol() != PROTO_UDP {
                        return Err("not IPv4/UDP without options".into());
                    }
                    (
                        socket,
                        IpAddr::from(ip.src_addr()),
                        IpAddr::from(ip.dst_addr()),
                        (ip.dscp() << 2) | ip.ecn(),
                        ip_at + ipv4::HEADER_LEN,
                        ip_at + ip.total_len() as usize,
                    )
                }
                (eth::ETHERTYPE_IPV6, _, Some(socket)) => {
                    let ip = Ipv6Packet::new_checked(&frame[ip_at..])
                        .map_err(|_| "truncated IPv6 header")?;
                    if ip.next_header() != NEXT_HEADER_UDP {
                        return Err("IPv6 next header is not UDP".into());
                    }
                    (
                        socket,
                        IpAddr::from(ip.src_addr()),
                        IpAddr::from(ip.dst_addr()),
                        ip.traffic_class(),
                        ip_at + ipv6::HEADER_LEN,
                        ip_at + ipv6::HEADER_LEN + ip.payload_len() as usize,
                    )
                }
                (t, v4, _) => {
                    return Err(format!(
                        "ethertype {t:#06x} has no socket here (this backend carries {})",
                        if v4.is_some() { "IPv4" } else { "IPv6" }
                    ))
                }
            };
        let v6 = dst.is_ipv6();
        // Sending from the frame's own source: the socket serves every
        // address of its interface.
        let pktinfo = socket.local.is_unspecified();
        let src = if pktinfo { frame_src } else { socket.local };
        let datagram =
            UdpPacket::new_checked(&frame[udp_at..]).map_err(|_| "truncated UDP header")?;
        let dport = datagram.dst_port();
        let udp_len = datagram.len() as usize;
        let udp_end = udp_at + udp_len;
        if udp_len < udp::HEADER_LEN + bth::HEADER_LEN + ICRC_LEN
            || udp_end > len
            || udp_end > ip_end
        {
            return Err(format!(
                "UDP length {udp_len} does not fit the {len}-byte frame"
            ));
        }
        // Another process of this device (its MAC is ours) receives on the
        // UDP port of the QPN block of the destination QP; the ICRC stays
        // computed over the RoCEv2 port, as the XDP program's port rewrite
        // leaves it for frames from the wire.
        let to_port = match self.cfg.qpn_block {
            Some(_) if eth.dst == self.cfg.local_mac => {
                // The length check above left a whole BTH here.
                let bth = bth::BthHeader::new_unchecked(&frame[udp_at + udp::HEADER_LEN..]);
                qpn_block::udp_port(qpn_block::of_qpn(bth.dest_qp()))
            }
            _ => dport,
        };
        // What the kernel will send: our address and port, IPv4 id 0 with
        // DF, UDP checksum 0 (masked by the ICRC anyway).
        UdpRepr {
            src_port: self.cfg.bind_port(),
            dst_port: dport,
            checksum: UdpChecksum::Zero,
        }
        .emit(&mut frame[udp_at..], udp_len - udp::HEADER_LEN)
        .map_err(|e| format!("UDP header: {e}"))?;
        let l4 = &frame[udp_at..udp_end - ICRC_LEN];
        let mut kernel_ip = [0u8; ipv6::HEADER_LEN];
        let ip_len = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => kernel_ipv4(s, d, tos, udp_len).emit(&mut kernel_ip),
            (IpAddr::V6(s), IpAddr::V6(d)) => kernel_ipv6(s, d, tos, udp_len).emit(&mut kernel_ip),
            _ => return Err("address family mismatch".into()),
        }
        .map_err(|e| format!("IP header: {e}"))?;
        let crc = icrc::compute(&kernel_ip[..ip_len], l4).map_err(|e| format!("ICRC: {e}"))?;
        frame[udp_end - ICRC_LEN..udp_end].copy_from_slice(&crc.to_le_bytes());
        self.tx_iov[i] = libc::iovec {
            iov_base: frame[udp_at + udp::HEADER_LEN..].as_mut_ptr().cast(),
            iov_len: udp_len - udp::HEADER_LEN,
        };
        let to = match dst {
            // A link-local destination is on the socket's interface.
            IpAddr::V6(d) if d.is_unicast_link_local() => {
                SocketAddr::V6(SocketAddrV6::new(d, to_port, 0, socket.ifindex))
            }
            d => SocketAddr::new(d, to_port),
        };
        let ifindex = socket.ifindex;
        let namelen = sockaddr_of(to, &mut self.tx_names[i]);
        // Control messages: the TOS / traffic class (DSCP + ECN), and for
        // the interface-wide socket the IPv6 source.
        let cm = &mut self.tx_cmsg[i * CMSG_ROOM..(i + 1) * CMSG_ROOM];
        cm.fill(0);
        let h = &mut self.tx_hdrs[i].msg_hdr;
        h.msg_name = (&mut self.tx_names[i] as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = namelen;
        h.msg_iov = &mut self.tx_iov[i];
        h.msg_iovlen = 1;
        h.msg_flags = 0;
        h.msg_control = cm.as_mut_ptr().cast();
        let int_len = mem::size_of::<libc::c_int>() as u32;
        let pktinfo_len = mem::size_of::<libc::in6_pktinfo>() as u32;
        // SAFETY: CMSG_SPACE/LEN are pure; the buffer has CMSG_ROOM bytes,
        // more than an int-sized and an in6_pktinfo control message need,
        // and was zeroed above.
        unsafe {
            h.msg_controllen = libc::CMSG_SPACE(int_len) as _;
            let c = libc::CMSG_FIRSTHDR(h);
            if v6 {
                (*c).cmsg_level = libc::IPPROTO_IPV6;
                (*c).cmsg_type = libc::IPV6_TCLASS;
            } else {
                (*c).cmsg_level = libc::IPPROTO_IP;
                (*c).cmsg_type = libc::IP_TOS;
            }
            (*c).cmsg_len = libc::CMSG_LEN(int_len) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, tos as libc::c_int);
            if let (true, IpAddr::V6(from)) = (pktinfo, src) {
                h.msg_controllen += libc::CMSG_SPACE(pktinfo_len) as usize;
                let c = libc::CMSG_NXTHDR(h, c);
                (*c).cmsg_level = libc::IPPROTO_IPV6;
                (*c).cmsg_type = libc::IPV6_PKTINFO;
                (*c).cmsg_len = libc::CMSG_LEN(pktinfo_len) as _;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c) as *mut libc::in6_pktinfo,
                    libc::in6_pktinfo {
                        ipi6_addr: libc::in6_addr {
                            s6_addr: from.octets(),
                        },
                        ipi6_ifindex: ifindex,
                    },
                );
            }
        }
        self.tx_hdrs[i].msg_len = 0;
        self.tx_frame_len[i] = len;
        self.tx_v6[i] = v6;
        Ok(())
    }

    /// Sends prepared datagrams `0..n`, each run of one IP version in one
    /// sendmmsg on its socket; returns how many are done.
    pub(super) fn sendmmsg(&mut self, n: usize) -> std::io::Result<usize> {
        let mut start = 0;
        while start < n {
            let v6 = self.tx_v6[start];
            let end = (start + 1..n).find(|&k| self.tx_v6[k] != v6).unwrap_or(n);
            let done = self.send_run(v6, start, end)?;
            if done < end {
                // Stalled: the rest are lost like on a busy link.
                self.stats.tx_errors += (n - end) as u64;
                return Ok(done);
            }
            start = end;
        }
        Ok(n)
    }

    /// Sends prepared datagrams `start..end` on the IPv6 (`v6`) or IPv4
    /// socket; returns the index reached (`end` unless the socket stayed
    /// full).
    fn send_run(&mut self, v6: bool, start: usize, end: usize) -> std::io::Result<usize> {
        // prepare() only takes frames of a family that has a socket.
        let Some(socket) = (if v6 { &self.v6 } else { &self.v4 }) else {
            return Ok(start);
        };
        let fd = socket.fd.as_raw_fd();
        let mut done = start;
        let mut stalls = 0;
        while done < end {
            // SAFETY: headers done..end were prepared and point into self.
            let rc = unsafe {
                libc::sendmmsg(
                    fd,
                    self.tx_hdrs[done..].as_mut_ptr(),
                    (end - done) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            self.stats.tx_kicks += 1;
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR) if stalls < 100 => {
                        stalls += 1;
                        wait_on(&[fd], libc::POLLOUT, Duration::from_millis(1))?;
                        continue;
                    }
                    Some(libc::EAGAIN | libc::ENOBUFS) => {
                        // Still full: the rest are lost like on a busy link.
                        self.stats.tx_errors += (end - done) as u64;
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
