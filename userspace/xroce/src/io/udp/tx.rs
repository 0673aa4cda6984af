//! Sending: each datagram the engine wrote (or the UDP payload of a frame
//! handed to [`PacketIo::transmit`](crate::io::PacketIo::transmit)) goes
//! to its destination IP, with its TOS as a control message.
//! Consecutive datagrams to the same destination whose payloads have one
//! size leave as one UDP GSO message (a UDP_SEGMENT control message over
//! one iovec per datagram, no copy): the kernel cuts it back into exactly
//! these datagrams, on the device or at the receiver. Each datagram's
//! ICRC is computed once, over the headers the kernel will give it, IPv4
//! id included (see [`gso_ip_id`]); a batch of messages leaves in one
//! sendmmsg.

use std::{
    mem,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6},
    os::fd::AsRawFd,
    time::Duration,
};

use xroce_wire::{
    bth, eth, icrc,
    ipv4::{self, Ipv4Packet, PROTO_UDP},
    ipv6::{self, Ipv6Packet, NEXT_HEADER_UDP},
    udp::{self, UdpPacket},
    EthRepr, IpRepr, UdpChecksum, UdpRepr, ICRC_LEN,
};

use xroce_common::qpn_block;

use super::{kernel_ipv4, kernel_ipv6, sockaddr::sockaddr_of, wait_on, UdpBackend, CMSG_ROOM};
use crate::io::Transmit;
use xroce_transport::engine::gather::GATHER_SEGMENTS;

/// Iovecs one datagram may need: its headers, the MR pieces of a gathered
/// payload, then its pad and ICRC.
pub(super) const IOVECS_PER_DATAGRAM: usize = GATHER_SEGMENTS + 2;

/// Most datagrams one GSO message carries (the kernel's UDP_MAX_SEGMENTS
/// is 64 on older kernels, 128 on newer ones).
pub(super) const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes one GSO message carries: an IPv4 datagram's total
/// length (65535) less the IPv4 and UDP headers (ip_append_data refuses
/// more with EMSGSIZE). IPv6 would allow 20 more; one limit keeps it simple.
pub(super) const GSO_MAX_BYTES: usize = 65535 - ipv4::HEADER_LEN - udp::HEADER_LEN;

/// The IPv4 id the kernel gives datagram `k` of a GSO message sent on an
/// unconnected socket with IP_PMTUDISC_DO.
///
/// - `__ip_make_skb` (net/ipv4/ip_output.c) sets DF (pmtudisc DO) and
///   `ignore_df = 0`, then calls `ip_select_ident(net, skb, sk)` once for
///   the whole message; `ip_select_ident_segs` (include/net/ip.h) takes the
///   per-socket counter only for a connected socket (`inet_daddr != 0`),
///   and otherwise gives a DF packet without ignore_df id 0.
/// - Segmentation, in software on the sending device (validate_xmit_skb →
///   skb_gso_segment, e.g. towards a veth whose peer runs XDP) or at the
///   receiving socket without UDP_GRO (udp_rcv_segment), goes through
///   `inet_gso_segment` (net/ipv4/af_inet.c) → `udp4_ufo_fragment` →
///   `__udp_gso_segment`: for SKB_GSO_UDP_L4 (neither SKB_GSO_UDP nor
///   FIXEDID) every resulting segment gets `iph->id = htons(id++)` from the
///   message's id. DF stays as it was.
///
/// So datagram `k` carries id `k` (mod 2^16) with DF; a datagram sent alone
/// carries id 0. Hardware USO on a real NIC numbers the segments itself
/// (GSO is off unless [`super::UdpConfig::gso`] asks for it).
pub(super) fn gso_ip_id(k: usize) -> u16 {
    k as u16
}

/// What `route` learnt of the datagram in one TX slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct TxMeta {
    /// Its length as a frame (for byte counters).
    frame_len: usize,
    /// Goes out on the IPv6 socket.
    v6: bool,
    /// Where its UDP payload (BTH .. ICRC) is in the slot, and its length.
    payload_at: usize,
    payload_len: usize,
    tos: u8,
    /// Source and destination of the IP header the kernel writes.
    src: IpAddr,
    dst: IpAddr,
    /// Where the datagram goes (destination and port).
    to: SocketAddr,
    /// Send from `src` with IPV6_PKTINFO (interface-wide IPv6 socket).
    pktinfo: bool,
    ifindex: u32,
    /// The socket it leaves on.
    fd: i32,
}

impl TxMeta {
    pub(super) const EMPTY: TxMeta = TxMeta {
        frame_len: 0,
        v6: false,
        payload_at: 0,
        payload_len: 0,
        tos: 0,
        src: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        dst: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        to: SocketAddr::V4(std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::UNSPECIFIED,
            0,
        )),
        pktinfo: false,
        ifindex: 0,
        fd: -1,
    };

    /// Payload (BTH .. ICRC) length: what the datagram carries.
    fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// Whether `next` may follow `self` in one GSO message: same socket,
    /// destination, TOS and source.
    fn same_flow(&self, next: &TxMeta) -> bool {
        self.fd == next.fd
            && self.to == next.to
            && self.tos == next.tos
            && self.pktinfo == next.pktinfo
            && (!self.pktinfo || self.src == next.src)
    }
}

/// A datagram to send, as the engine's [`Transmit`] or a frame says it.
pub(super) struct Outgoing {
    frame_len: usize,
    /// The sender's source address (used by the interface-wide IPv6
    /// socket, which sends from it) and the destination.
    src: IpAddr,
    dst: IpAddr,
    tos: u8,
    dst_mac: [u8; 6],
    /// The source port the sender chose (a QP's own, with per-QP ports).
    sport: u16,
    dport: u16,
    payload_at: usize,
    payload_len: usize,
}

impl Outgoing {
    /// What the engine's `t` says.
    pub(super) fn of_transmit(t: &Transmit, dport: u16) -> Outgoing {
        let (src, dst) = match t.ip {
            IpRepr::V4(ip) => (Ipv4Addr::from(ip.src).into(), Ipv4Addr::from(ip.dst).into()),
            IpRepr::V6(ip) => (Ipv6Addr::from(ip.src).into(), Ipv6Addr::from(ip.dst).into()),
        };
        Outgoing {
            frame_len: t.frame_len(),
            src,
            dst,
            tos: (t.ip.dscp() << 2) | t.ip.ecn(),
            dst_mac: t.dst_mac,
            sport: t.udp_src_port,
            dport,
            payload_at: t.payload_at,
            payload_len: t.len,
        }
    }

    /// What the headers of `frame` say (IPv4 without options or IPv6,
    /// UDP, at least a BTH and an ICRC behind it).
    pub(super) fn of_frame(frame: &[u8]) -> Result<Outgoing, String> {
        let len = frame.len();
        if len < eth::HEADER_LEN {
            return Err(format!("{len}-byte frame has no Ethernet header"));
        }
        let (eth, ip_at) = EthRepr::parse(frame).map_err(|e| format!("{len}-byte frame: {e}"))?;
        let (src, dst, tos, udp_at, ip_end) = match eth.ethertype {
            eth::ETHERTYPE_IPV4 => {
                let ip = Ipv4Packet::new_checked(&frame[ip_at..])
                    .map_err(|_| "truncated IPv4 header")?;
                if ip.version() != 4 || ip.ihl() != 5 || ip.protocol() != PROTO_UDP {
                    return Err("not IPv4/UDP without options".into());
                }
                (
                    IpAddr::from(ip.src_addr()),
                    IpAddr::from(ip.dst_addr()),
                    (ip.dscp() << 2) | ip.ecn(),
                    ip_at + ipv4::HEADER_LEN,
                    ip_at + ip.total_len() as usize,
                )
            }
            eth::ETHERTYPE_IPV6 => {
                let ip = Ipv6Packet::new_checked(&frame[ip_at..])
                    .map_err(|_| "truncated IPv6 header")?;
                if ip.next_header() != NEXT_HEADER_UDP {
                    return Err("IPv6 next header is not UDP".into());
                }
                (
                    IpAddr::from(ip.src_addr()),
                    IpAddr::from(ip.dst_addr()),
                    ip.traffic_class(),
                    ip_at + ipv6::HEADER_LEN,
                    ip_at + ipv6::HEADER_LEN + ip.payload_len() as usize,
                )
            }
            t => return Err(format!("ethertype {t:#06x} is neither IPv4 nor IPv6")),
        };
        let datagram =
            UdpPacket::new_checked(&frame[udp_at..]).map_err(|_| "truncated UDP header")?;
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
        Ok(Outgoing {
            frame_len: len,
            src,
            dst,
            tos,
            dst_mac: eth.dst,
            sport: datagram.src_port(),
            dport: datagram.dst_port(),
            payload_at: udp_at + udp::HEADER_LEN,
            payload_len: udp_len - udp::HEADER_LEN,
        })
    }
}

/// Splits frames `0..n` (of payload sizes `payload_len`, in flows as
/// `same_flow` says) into GSO messages: runs of one flow and one payload
/// size, at most [`GSO_MAX_SEGMENTS`] datagrams and [`GSO_MAX_BYTES`] bytes
/// each. Calls `out(start, count)` per message.
///
/// UDP GSO would also take a shorter last datagram; leaving it out keeps
/// every message's datagrams alike (a WRITE's LAST of a whole MTU still
/// joins its MIDDLEs) and a datagram of its own size that follows a run
/// with id 0, as it was before GSO.
pub(super) fn gso_runs(
    n: usize,
    payload_len: impl Fn(usize) -> usize,
    same_flow: impl Fn(usize, usize) -> bool,
    mut out: impl FnMut(usize, usize),
) {
    let mut start = 0;
    while start < n {
        let size = payload_len(start);
        let mut end = start + 1;
        while end < n
            && end - start < GSO_MAX_SEGMENTS
            && (end + 1 - start) * size <= GSO_MAX_BYTES
            && payload_len(end) == size
            && same_flow(start, end)
        {
            end += 1;
        }
        out(start, end - start);
        start = end;
    }
}

impl UdpBackend {
    /// Notes where the datagram `o` in TX slot `i` goes (socket, source
    /// port, destination) and writes the UDP header the kernel will send
    /// in front of its payload, which the ICRC covers. The ICRC waits for
    /// [`build_messages`](Self::build_messages), which knows the datagram's
    /// place in its GSO message.
    pub(super) fn route(&mut self, i: usize, o: &Outgoing) -> Result<(), String> {
        let socket = match (o.dst, &self.v4, &self.v6) {
            (IpAddr::V4(_), Some(socket), _) | (IpAddr::V6(_), _, Some(socket)) => socket,
            (_, v4, _) => {
                return Err(format!(
                    "{} has no socket here (this backend carries {})",
                    o.dst,
                    if v4.is_some() { "IPv4" } else { "IPv6" }
                ))
            }
        };
        // Sending from the sender's own source: the socket serves every
        // address of its interface.
        let pktinfo = socket.local.is_unspecified();
        let src = if pktinfo { o.src } else { socket.local };
        if src.is_ipv4() != o.dst.is_ipv4() {
            return Err("address family mismatch".into());
        }
        let ml = self.cfg.max_frame_len;
        let slot = &mut self.tx_buf[i * ml..(i + 1) * ml];
        let udp_at = o.payload_at.checked_sub(udp::HEADER_LEN);
        let Some(udp_at) = udp_at.filter(|_| o.payload_at + o.payload_len <= ml) else {
            return Err(format!(
                "a {}-byte payload at {} does not fit a {ml}-byte slot with its UDP header",
                o.payload_len, o.payload_at
            ));
        };
        if o.payload_len < bth::HEADER_LEN + ICRC_LEN {
            return Err(format!(
                "{}-byte datagram has no BTH and ICRC",
                o.payload_len
            ));
        }
        // Another process of this device (its MAC is ours) receives on the
        // UDP port of the QPN block of the destination QP; the ICRC stays
        // computed over the RoCEv2 port, as the XDP program's port rewrite
        // leaves it for frames from the wire.
        let to_port = match self.cfg.qpn_block {
            Some(_) if o.dst_mac == self.cfg.local_mac => {
                // The length check above left a whole BTH here.
                let bth = bth::BthHeader::new_unchecked(&slot[o.payload_at..]);
                qpn_block::udp_port(qpn_block::of_qpn(bth.dest_qp()))
            }
            _ => o.dport,
        };
        // The QP's own source port (a socket bound to it), else the bound
        // port of the main socket.
        let (fd, sport) = self
            .ports
            .socket_for(&self.cfg, socket, o.sport)
            .unwrap_or((socket.fd.as_raw_fd(), socket.port));
        // What the kernel will send: that port; the checksum (0 here, the
        // kernel's own on the wire) is masked by the ICRC.
        UdpRepr {
            src_port: sport,
            dst_port: o.dport,
            checksum: UdpChecksum::Zero,
        }
        .emit(&mut slot[udp_at..], o.payload_len)
        .map_err(|e| format!("UDP header: {e}"))?;
        let to = match o.dst {
            // A link-local destination is on the socket's interface.
            IpAddr::V6(d) if d.is_unicast_link_local() => {
                SocketAddr::V6(SocketAddrV6::new(d, to_port, 0, socket.ifindex))
            }
            d => SocketAddr::new(d, to_port),
        };
        self.tx_meta[i] = TxMeta {
            frame_len: o.frame_len,
            v6: o.dst.is_ipv6(),
            payload_at: o.payload_at,
            payload_len: o.payload_len,
            tos: o.tos,
            src,
            dst: o.dst,
            to,
            pktinfo,
            ifindex: socket.ifindex,
            fd,
        };
        Ok(())
    }

    /// Groups prepared frames `0..n` into messages (GSO where allowed),
    /// computes every frame's ICRC with the IPv4 id the kernel will give
    /// it, and fills the message headers; returns the number of messages.
    pub(super) fn build_messages(&mut self, n: usize) -> Result<usize, String> {
        let mut runs = std::mem::take(&mut self.tx_runs);
        runs.clear();
        if self.gso {
            let meta = &self.tx_meta;
            gso_runs(
                n,
                |k| meta[k].payload_len(),
                |a, b| meta[a].same_flow(&meta[b]),
                |s, c| runs.push((s, c)),
            );
        } else {
            runs.extend((0..n).map(|k| (k, 1)));
        }
        let mut result = Ok(runs.len());
        let mut iov = 0;
        for (m, &(start, count)) in runs.iter().enumerate() {
            let first = iov;
            for k in 0..count {
                if let Err(e) = self.seal(start + k, gso_ip_id(k), &mut iov) {
                    result = Err(e);
                }
            }
            self.fill_header(m, start, count, first..iov);
        }
        self.tx_runs = runs;
        result
    }

    /// Writes the ICRC of the datagram in slot `i`, computed in one pass
    /// over the headers the kernel sends with IPv4 id `ident` (DF set;
    /// IPv6 has no id), the UDP header `route` wrote and the payload,
    /// where it is (the slot, or the MRs of its gather), and points its
    /// iovecs from `iov` on at it (`iov` moves past them).
    fn seal(&mut self, i: usize, ident: u16, iov: &mut usize) -> Result<(), String> {
        let ml = self.cfg.max_frame_len;
        let m = self.tx_meta[i];
        let slot = &mut self.tx_buf[i * ml..(i + 1) * ml];
        let udp_len = udp::HEADER_LEN + m.payload_len;
        let mut kernel_ip = [0u8; ipv6::HEADER_LEN];
        let ip_len = match (m.src, m.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                kernel_ipv4(s, d, m.tos, udp_len, ident).emit(&mut kernel_ip)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                kernel_ipv6(s, d, m.tos, udp_len).emit(&mut kernel_ip)
            }
            _ => return Err("address family mismatch".into()),
        }
        .map_err(|e| format!("IP header: {e}"))?;
        let end = m.payload_at + m.payload_len;
        let udp_at = m.payload_at - udp::HEADER_LEN;
        let ip = &kernel_ip[..ip_len];
        let gather = &self.tx_gather[i];
        // A gathered payload lies between the transport headers and the
        // pad (the engine wrote both around it).
        let gathered = match gather.payload() {
            Some((at, len)) if at < m.payload_at + bth::HEADER_LEN || at + len > end - ICRC_LEN => {
                return Err("gathered payload outside its datagram".into())
            }
            g => g,
        };
        let crc = match gathered {
            None => icrc::compute(ip, &slot[udp_at..end - ICRC_LEN]),
            Some((at, len)) => icrc::compute_with(ip, &slot[udp_at..at], |piece| {
                gather.for_each_piece(piece);
                piece(&slot[at + len..end - ICRC_LEN]);
            }),
        }
        .map_err(|e| format!("ICRC: {e}"))?;
        slot[end - ICRC_LEN..end].copy_from_slice(&crc.to_le_bytes());
        let base = slot.as_mut_ptr();
        let mut push = |ptr: *const u8, len: usize| {
            self.tx_iov[*iov] = libc::iovec {
                iov_base: ptr as *mut libc::c_void,
                iov_len: len,
            };
            *iov += 1;
        };
        match gathered {
            None => push(base.wrapping_add(m.payload_at), m.payload_len),
            Some((at, len)) => {
                push(base.wrapping_add(m.payload_at), at - m.payload_at);
                for (ptr, n) in gather.pieces() {
                    push(ptr, n);
                }
                push(base.wrapping_add(at + len), end - at - len);
            }
        }
        Ok(())
    }

    /// Message header `m` for the `count` frames from slot `start` whose
    /// iovecs are `iovs`: those, the first one's destination, the TOS /
    /// traffic class, the IPv6 source for the interface-wide socket, and
    /// UDP_SEGMENT (the first frame's payload size) when there is more
    /// than one.
    fn fill_header(&mut self, m: usize, start: usize, count: usize, iovs: std::ops::Range<usize>) {
        let meta = self.tx_meta[start];
        let namelen = sockaddr_of(meta.to, &mut self.tx_names[start]);
        let cm = &mut self.tx_cmsg[m * CMSG_ROOM..(m + 1) * CMSG_ROOM];
        cm.fill(0);
        let h = &mut self.tx_hdrs[m].msg_hdr;
        h.msg_name = (&mut self.tx_names[start] as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = namelen;
        h.msg_iov = &mut self.tx_iov[iovs.start];
        h.msg_iovlen = iovs.len() as _;
        h.msg_flags = 0;
        h.msg_control = cm.as_mut_ptr().cast();
        let int_len = mem::size_of::<libc::c_int>() as u32;
        let u16_len = mem::size_of::<u16>() as u32;
        let pktinfo_len = mem::size_of::<libc::in6_pktinfo>() as u32;
        // SAFETY: CMSG_SPACE/LEN are pure; the buffer has CMSG_ROOM bytes,
        // more than an int-sized, an in6_pktinfo and a u16 control message
        // need together, and was zeroed above.
        unsafe {
            h.msg_controllen = libc::CMSG_SPACE(int_len) as _;
            let mut c = libc::CMSG_FIRSTHDR(h);
            if meta.v6 {
                (*c).cmsg_level = libc::IPPROTO_IPV6;
                (*c).cmsg_type = libc::IPV6_TCLASS;
            } else {
                (*c).cmsg_level = libc::IPPROTO_IP;
                (*c).cmsg_type = libc::IP_TOS;
            }
            (*c).cmsg_len = libc::CMSG_LEN(int_len) as _;
            std::ptr::write_unaligned(
                libc::CMSG_DATA(c) as *mut libc::c_int,
                meta.tos as libc::c_int,
            );
            if let (true, IpAddr::V6(from)) = (meta.pktinfo, meta.src) {
                h.msg_controllen += libc::CMSG_SPACE(pktinfo_len) as usize;
                c = libc::CMSG_NXTHDR(h, c);
                (*c).cmsg_level = libc::IPPROTO_IPV6;
                (*c).cmsg_type = libc::IPV6_PKTINFO;
                (*c).cmsg_len = libc::CMSG_LEN(pktinfo_len) as _;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c) as *mut libc::in6_pktinfo,
                    libc::in6_pktinfo {
                        ipi6_addr: libc::in6_addr {
                            s6_addr: from.octets(),
                        },
                        ipi6_ifindex: meta.ifindex,
                    },
                );
            }
            if count > 1 {
                h.msg_controllen += libc::CMSG_SPACE(u16_len) as usize;
                c = libc::CMSG_NXTHDR(h, c);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(u16_len) as _;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c) as *mut u16,
                    meta.payload_len() as u16,
                );
            }
        }
        self.tx_hdrs[m].msg_len = 0;
    }

    /// Sends built messages `0..n`, each run of one socket in one
    /// sendmmsg; returns how many frames are done.
    pub(super) fn sendmmsg(&mut self, n: usize) -> std::io::Result<usize> {
        let mut start = 0;
        let mut frames = 0;
        while start < n {
            let fd = self.tx_meta[self.tx_runs[start].0].fd;
            let end = (start + 1..n)
                .find(|&k| self.tx_meta[self.tx_runs[k].0].fd != fd)
                .unwrap_or(n);
            let done = self.send_run(fd, start, end)?;
            frames += self.tx_runs[start..done].iter().map(|r| r.1).sum::<usize>();
            if done < end {
                // Stalled: the rest are lost like on a busy link.
                let lost: usize = self.tx_runs[end..n].iter().map(|r| r.1).sum();
                self.stats.tx_errors += lost as u64;
                return Ok(frames);
            }
            start = end;
        }
        Ok(frames)
    }

    /// Counts message `m` as sent.
    fn count_sent(&mut self, m: usize) {
        let (start, count) = self.tx_runs[m];
        for k in start..start + count {
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += self.tx_meta[k].frame_len as u64;
            self.udp_stats.tx_gathered += self.tx_gather[k].payload().is_some() as u64;
        }
        self.udp_stats.tx_messages += 1;
        if count > 1 {
            self.udp_stats.gso_messages += 1;
            self.udp_stats.gso_segments += count as u64;
        }
    }

    /// Sends messages `start..end` on socket `fd`; returns the message
    /// index reached (`end` unless the socket stayed full).
    fn send_run(&mut self, fd: i32, start: usize, end: usize) -> std::io::Result<usize> {
        let mut done = start;
        let mut stalls = 0;
        while done < end {
            // SAFETY: headers done..end were built and point into self.
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
                let frames = self.tx_runs[done].1;
                match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR) if stalls < 100 => {
                        stalls += 1;
                        wait_on(&[fd], libc::POLLOUT, Duration::from_millis(1))?;
                        continue;
                    }
                    Some(libc::EAGAIN | libc::ENOBUFS) => {
                        // Still full: the rest are lost like on a busy link.
                        let lost: usize = self.tx_runs[done..end].iter().map(|r| r.1).sum();
                        self.stats.tx_errors += lost as u64;
                        break;
                    }
                    Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH) => {
                        // An ICMP error from an earlier datagram: skip one.
                        self.stats.tx_errors += frames as u64;
                        done += 1;
                        continue;
                    }
                    Some(libc::EINVAL | libc::EIO | libc::EMSGSIZE | libc::EOPNOTSUPP)
                        if frames > 1 =>
                    {
                        // The route refuses GSO (e.g. xfrm, or a kernel
                        // limit): one datagram per message from now on;
                        // these frames are lost (their ICRCs assumed GSO
                        // ids) and the engine sends them again.
                        self.gso = false;
                        self.udp_stats.gso_refused += 1;
                        self.stats.tx_errors += frames as u64;
                        done += 1;
                        continue;
                    }
                    _ => return Err(e),
                }
            }
            for m in done..done + rc as usize {
                self.count_sent(m);
            }
            done += rc as usize;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(lens: &[usize], flows: &[u8]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        gso_runs(
            lens.len(),
            |k| lens[k],
            |a, b| flows[a] == flows[b],
            |s, c| out.push((s, c)),
        );
        out
    }

    #[test]
    fn a_write_stream_becomes_few_gso_messages() {
        // WRITE_FIRST (RETH: 16 bytes more), 30 MIDDLEs and a LAST of a
        // whole MTU, then an ACK to the same peer: the FIRST alone, the
        // MIDDLEs and LAST in one message, the ACK alone.
        let mut lens = vec![2048 + 12 + 16 + 4];
        lens.extend([2048 + 12 + 4; 31]);
        lens.push(12 + 4 + 4);
        let flows = vec![0u8; lens.len()];
        assert_eq!(runs(&lens, &flows), [(0, 1), (1, 31), (32, 1)]);
        // A short LAST goes alone.
        lens[31] = 100;
        assert_eq!(runs(&lens, &flows), [(0, 1), (1, 30), (31, 1), (32, 1)]);
    }

    #[test]
    fn limits_split_messages() {
        // 64 KiB at 2 KiB: the byte limit (65507) cuts at 31 datagrams.
        let lens = vec![2064; 40];
        let flows = vec![0u8; 40];
        let got = runs(&lens, &flows);
        assert_eq!(got, [(0, 31), (31, 9)]);
        assert!(got.iter().all(|&(_, c)| c * 2064 <= GSO_MAX_BYTES));
        // Small datagrams: the segment limit.
        let lens = vec![100; 150];
        let flows = vec![0u8; 150];
        assert_eq!(runs(&lens, &flows), [(0, 64), (64, 64), (128, 22)]);
    }

    #[test]
    fn other_destinations_and_sizes_start_a_message() {
        let lens = [500, 500, 500, 600, 600, 100, 100];
        let flows = [0u8, 0, 1, 1, 1, 1, 1];
        assert_eq!(runs(&lens, &flows), [(0, 2), (2, 1), (3, 2), (5, 2)]);
        // Sizes that change every frame (as the AF_XDP interop test
        // sends): one datagram per message, each with id 0.
        let lens = [16, 20, 272, 1040, 1416, 16, 20];
        assert_eq!(runs(&lens, &[0; 7]).len(), 7);
        assert!(runs(&[], &[]).is_empty());
    }

    #[test]
    fn segment_ids_count_from_zero() {
        assert_eq!((0..4).map(gso_ip_id).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(gso_ip_id(65536 + 5), 5);
    }
}
