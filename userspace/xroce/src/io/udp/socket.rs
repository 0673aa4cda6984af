//! Opening the backend: the socket, its options, the bind, and the batch
//! buffers every later call reuses.

use std::{mem, net::SocketAddr, os::fd::AsRawFd};

use nix::sys::socket::{
    bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage,
};
use xroce_wire::{bth, eth, ipv6, udp, ICRC_LEN};

use super::{setup_err, UdpBackend, UdpConfig, UdpStats, CMSG_ROOM, RX_HEADROOM};
use crate::io::{sockopt as raw_sockopt, IoStats, Result};

/// What a socket option failed with, named as the kernel names it.
fn option_err(name: &str) -> impl FnOnce(nix::Error) -> crate::io::IoError + '_ {
    move |e| setup_err(name, Some(e.into()))
}

impl UdpBackend {
    /// Binds `cfg.local:cfg.port` and prepares the batch buffers.
    pub fn open(cfg: UdpConfig) -> Result<Self> {
        let v6 = cfg.local.is_ipv6();
        let batch = cfg.batch.clamp(1, 1024);
        let smallest =
            eth::HEADER_LEN + ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN + ICRC_LEN;
        if cfg.max_frame_len < smallest {
            return Err(setup_err(
                format_args!(
                    "max_frame_len {} cannot hold a RoCEv2 frame",
                    cfg.max_frame_len
                ),
                None,
            ));
        }
        let family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let fd = socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
            .map_err(|e| setup_err("socket", Some(e.into())))?;
        // Forced sizes need CAP_NET_ADMIN; without it the plain ones (capped
        // by net.core.*mem_max) are the best there is.
        let buf = cfg.socket_buffer.min(i32::MAX as usize);
        if setsockopt(&fd, sockopt::RcvBufForce, &buf).is_err() {
            let _ = setsockopt(&fd, sockopt::RcvBuf, &buf);
        }
        if setsockopt(&fd, sockopt::SndBufForce, &buf).is_err() {
            let _ = setsockopt(&fd, sockopt::SndBuf, &buf);
        }
        let _ = setsockopt(&fd, sockopt::RxqOvfl, &1);
        let raw = fd.as_raw_fd();
        if v6 {
            setsockopt(&fd, sockopt::Ipv6V6Only, &true).map_err(option_err("IPV6_V6ONLY"))?;
            setsockopt(&fd, sockopt::Ipv6RecvPacketInfo, &true)
                .map_err(option_err("IPV6_RECVPKTINFO"))?;
            setsockopt(&fd, sockopt::Ipv6RecvTClass, &true)
                .map_err(option_err("IPV6_RECVTCLASS"))?;
            raw_sockopt::set_int(raw, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1)
                .map_err(|e| setup_err("IPV6_DONTFRAG", Some(e)))?;
        } else {
            setsockopt(&fd, sockopt::Ipv4PacketInfo, &true).map_err(option_err("IP_PKTINFO"))?;
            setsockopt(&fd, sockopt::IpRecvTos, &true).map_err(option_err("IP_RECVTOS"))?;
            raw_sockopt::set_int(
                raw,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )
            .map_err(|e| setup_err("IP_MTU_DISCOVER", Some(e)))?;
            // UDP checksum 0 over IPv4, as rxe sends (the ICRC protects the data).
            raw_sockopt::set_int(raw, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)
                .map_err(|e| setup_err("SO_NO_CHECK", Some(e)))?;
        }
        let local = SockaddrStorage::from(SocketAddr::new(cfg.local, cfg.port));
        if let Err(e) = bind(raw, &local) {
            let hint = if e == nix::Error::EADDRINUSE {
                " (another RoCEv2 stack, e.g. rdma_rxe, owns the port on this host)"
            } else {
                ""
            };
            return Err(setup_err(
                format_args!("bind {}:{}{hint}", cfg.local, cfg.port),
                Some(e.into()),
            ));
        }
        let slot_len = RX_HEADROOM + cfg.max_frame_len;
        let no_iovec = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: sockaddr_storage and mmsghdr are plain C structs (integers
        // and null pointers) for which all zeroes is a valid value.
        let (no_name, no_hdr): (libc::sockaddr_storage, libc::mmsghdr) =
            unsafe { (mem::zeroed(), mem::zeroed()) };
        let mut me = Self {
            fd,
            v6,
            local: cfg.local,
            slot_len,
            rx_buf: vec![0; slot_len * batch],
            rx_iov: vec![no_iovec; batch],
            rx_names: vec![no_name; batch],
            rx_cmsg: vec![0; CMSG_ROOM * batch],
            rx_hdrs: vec![no_hdr; batch],
            tx_buf: vec![0; cfg.max_frame_len * batch],
            tx_iov: vec![no_iovec; batch],
            tx_names: vec![no_name; batch],
            tx_cmsg: vec![0; CMSG_ROOM * batch],
            tx_hdrs: vec![no_hdr; batch],
            tx_frame_len: vec![0; batch],
            cfg,
            stats: IoStats::default(),
            udp_stats: UdpStats::default(),
            last_ovfl: 0,
        };
        me.cfg.batch = batch;
        Ok(me)
    }
}
