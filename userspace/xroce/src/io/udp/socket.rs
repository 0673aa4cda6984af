//! Opening the backend: the sockets (IPv4, IPv6 or both), their options,
//! the binds, and the batch buffers every later call reuses.

use std::{
    mem,
    net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6},
    os::fd::AsRawFd,
};

use nix::sys::socket::{
    bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage,
};
use xroce_wire::{bth, eth, ipv4, ipv6, udp, ICRC_LEN};

use super::{
    setup_err, tx::TxMeta, UdpBackend, UdpConfig, UdpSocket, UdpStats, CMSG_ROOM, RX_HEADROOM,
};

/// Largest UDP payload a coalesced datagram can have.
const GRO_MAX_DATAGRAM: usize = 65535;
/// Receive slots with GRO (each 64 KiB).
const GRO_SLOTS: usize = 32;
use crate::io::{sockopt as raw_sockopt, Gather, IoStats, Result};
use crate::runtime::RealtimeToEngine;

/// What a socket option failed with, named as the kernel names it.
fn option_err(name: &str) -> impl FnOnce(nix::Error) -> crate::io::IoError + '_ {
    move |e| setup_err(name, Some(e.into()))
}

/// Opens a UDP socket on `local:port`; with `ifindex`, bound to that
/// interface too (the IPv6 socket that carries every address of one
/// interface binds `[::]` there).
pub(super) fn open_socket(
    cfg: &UdpConfig,
    local: IpAddr,
    ifindex: Option<u32>,
    port: u16,
) -> Result<UdpSocket> {
    let v6 = local.is_ipv6();
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
    // UDP_SEGMENT readable: the kernel has UDP GSO (4.18+).
    let gso = cfg.gso && raw_sockopt::get_u32(raw, libc::SOL_UDP, libc::UDP_SEGMENT).is_ok();
    let gro = cfg.gro && raw_sockopt::set_int(raw, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
    // When each datagram reached the host (the kernel's receive timestamp,
    // CLOCK_REALTIME): the engine's delay echo and fabric round trips leave
    // out the time it then waited for this process. Without it they count
    // from when the engine handled it.
    let _ = raw_sockopt::set_int(raw, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);
    if v6 {
        setsockopt(&fd, sockopt::Ipv6V6Only, &true).map_err(option_err("IPV6_V6ONLY"))?;
        setsockopt(&fd, sockopt::Ipv6RecvPacketInfo, &true)
            .map_err(option_err("IPV6_RECVPKTINFO"))?;
        setsockopt(&fd, sockopt::Ipv6RecvTClass, &true).map_err(option_err("IPV6_RECVTCLASS"))?;
        raw_sockopt::set_int(raw, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1)
            .map_err(|e| setup_err("IPV6_RECVHOPLIMIT", Some(e)))?;
        raw_sockopt::set_int(raw, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1)
            .map_err(|e| setup_err("IPV6_DONTFRAG", Some(e)))?;
        // rxe sends RoCEv2 over IPv6 with UDP checksum 0 (the ICRC protects
        // the data); the kernel drops such datagrams unless told to take them.
        raw_sockopt::set_int(raw, libc::IPPROTO_UDP, libc::UDP_NO_CHECK6_RX, 1)
            .map_err(|e| setup_err("UDP_NO_CHECK6_RX", Some(e)))?;
    } else {
        setsockopt(&fd, sockopt::Ipv4PacketInfo, &true).map_err(option_err("IP_PKTINFO"))?;
        setsockopt(&fd, sockopt::IpRecvTos, &true).map_err(option_err("IP_RECVTOS"))?;
        raw_sockopt::set_int(raw, libc::IPPROTO_IP, libc::IP_RECVTTL, 1)
            .map_err(|e| setup_err("IP_RECVTTL", Some(e)))?;
        raw_sockopt::set_int(
            raw,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
        .map_err(|e| setup_err("IP_MTU_DISCOVER", Some(e)))?;
        // UDP checksum 0 over IPv4, as rxe sends (the ICRC protects the
        // data); with GSO the kernel's checksum (udp_send_skb refuses
        // UDP_SEGMENT on a SO_NO_CHECK socket), which the ICRC masks and
        // rxe accepts. On a veth it is offloaded, never computed.
        if !gso {
            raw_sockopt::set_int(raw, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)
                .map_err(|e| setup_err("SO_NO_CHECK", Some(e)))?;
        }
    }
    if let Some(ifindex) = ifindex {
        raw_sockopt::set_int(
            raw,
            libc::SOL_SOCKET,
            libc::SO_BINDTOIFINDEX,
            ifindex as libc::c_int,
        )
        .map_err(|e| setup_err(format_args!("SO_BINDTOIFINDEX {ifindex}"), Some(e)))?;
    }
    let at = match local {
        // A link-local address names its interface by scope id.
        IpAddr::V6(a) if a.is_unicast_link_local() => {
            SocketAddr::V6(SocketAddrV6::new(a, port, 0, ifindex.unwrap_or(0)))
        }
        a => SocketAddr::new(a, port),
    };
    if let Err(e) = bind(raw, &SockaddrStorage::from(at)) {
        let hint = if e == nix::Error::EADDRINUSE {
            " (another RoCEv2 stack, e.g. rdma_rxe, or a process of another user owns the \
             port on this host)"
        } else {
            ""
        };
        return Err(setup_err(format_args!("bind {at}{hint}"), Some(e.into())));
    }
    Ok(UdpSocket {
        fd,
        local,
        port,
        ifindex: ifindex.unwrap_or(0),
        gso,
        gro,
    })
}

/// Whether a backend could bind `port` now as [`UdpBackend::open`] would:
/// on `ipv4`, and on `[::]` of interface `ipv6_ifindex` (IPv6-only). A
/// process of another user that bound it first makes the bind fail with
/// EADDRINUSE, which is all this looks for: other failures are left to the
/// real bind to report.
pub fn port_free(ipv4: Option<std::net::Ipv4Addr>, ipv6_ifindex: Option<u32>, port: u16) -> bool {
    let in_use = |family, ifindex: Option<u32>, at: SocketAddr| {
        let Ok(fd) = socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None) else {
            return false;
        };
        let raw = fd.as_raw_fd();
        if family == AddressFamily::Inet6 {
            let _ = setsockopt(&fd, sockopt::Ipv6V6Only, &true);
        }
        if let Some(ifindex) = ifindex {
            let _ = raw_sockopt::set_int(
                raw,
                libc::SOL_SOCKET,
                libc::SO_BINDTOIFINDEX,
                ifindex as libc::c_int,
            );
        }
        bind(raw, &SockaddrStorage::from(at)) == Err(nix::Error::EADDRINUSE)
    };
    let v4 =
        ipv4.is_some_and(|a| in_use(AddressFamily::Inet, None, SocketAddr::new(a.into(), port)));
    let v6 = ipv6_ifindex.is_some_and(|i| {
        in_use(
            AddressFamily::Inet6,
            Some(i),
            SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port),
        )
    });
    !v4 && !v6
}

impl UdpBackend {
    /// Binds the sockets `cfg` asks for and prepares the batch buffers:
    /// an IPv4 `cfg.local` gets an IPv4 socket; with
    /// [`UdpConfig::ipv6_ifindex`] an IPv6 socket on `[::]` of that
    /// interface carries all its IPv6 addresses, otherwise an IPv6
    /// `cfg.local` gets an IPv6 socket of its own.
    pub fn open(cfg: UdpConfig) -> Result<Self> {
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
        let v4 = match cfg.local {
            IpAddr::V4(_) => Some(open_socket(&cfg, cfg.local, None, cfg.bind_port())?),
            IpAddr::V6(_) => None,
        };
        let v6 = match (cfg.ipv6_ifindex, cfg.local) {
            (Some(ifindex), _) => Some(open_socket(
                &cfg,
                Ipv6Addr::UNSPECIFIED.into(),
                Some(ifindex),
                cfg.bind_port(),
            )?),
            (None, IpAddr::V6(_)) => Some(open_socket(&cfg, cfg.local, None, cfg.bind_port())?),
            (None, IpAddr::V4(_)) => None,
        };
        let fds = v4.iter().chain(&v6).map(|s| s.fd.as_raw_fd()).collect();
        let gso = v4.iter().chain(&v6).all(|s| s.gso);
        let gro = v4.iter().chain(&v6).any(|s| s.gro);
        // A coalesced datagram can be 64 KiB: fewer, larger slots (the
        // pages are touched only as far as datagrams reach).
        let (slot_len, rx_slots) = if gro {
            (RX_HEADROOM + GRO_MAX_DATAGRAM, batch.min(GRO_SLOTS))
        } else {
            (
                RX_HEADROOM + cfg.max_frame_len
                    - (eth::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN),
                batch,
            )
        };
        let no_iovec = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: sockaddr_storage and mmsghdr are plain C structs (integers
        // and null pointers) for which all zeroes is a valid value.
        let (no_name, no_hdr): (libc::sockaddr_storage, libc::mmsghdr) =
            unsafe { (mem::zeroed(), mem::zeroed()) };
        let mut me = Self {
            v4,
            v6,
            fds,
            slot_len,
            rx_slots,
            rx_buf: vec![0; slot_len * rx_slots],
            rx_iov: vec![no_iovec; rx_slots],
            rx_names: vec![no_name; rx_slots],
            rx_cmsg: vec![0; CMSG_ROOM * rx_slots],
            rx_hdrs: vec![no_hdr; rx_slots],
            rx_turn: 0,
            rx_v6_first: false,
            tx_buf: vec![0; cfg.max_frame_len * batch],
            tx_iov: vec![no_iovec; batch * super::tx::IOVECS_PER_DATAGRAM],
            tx_gather: (0..batch).map(|_| Gather::enabled()).collect(),
            tx_names: vec![no_name; batch],
            tx_cmsg: vec![0; CMSG_ROOM * batch],
            tx_hdrs: vec![no_hdr; batch],
            tx_meta: vec![TxMeta::EMPTY; batch],
            tx_runs: Vec::with_capacity(batch),
            gso,
            gro,
            ports: super::ports::QpPorts::new(cfg.qp_ports),
            cfg,
            stats: IoStats::default(),
            udp_stats: UdpStats::default(),
            last_ovfl: [0; 2],
            rx_clock: RealtimeToEngine::now(),
            rx_pressure: false,
        };
        me.cfg.batch = batch;
        Ok(me)
    }
}
