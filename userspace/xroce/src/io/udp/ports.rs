//! Per-QP UDP source ports ([`super::UdpConfig::qp_ports`]): the engine
//! writes each QP's RoCEv2 source port into its frames
//! ([`xroce_wire::rocev2_src_port`], rxe's choice), and the AF_XDP backend
//! sends them as they are. A kernel socket sends from the port it is bound
//! to, so this backend keeps a send-only socket per source port, opened on
//! first use and bounded: RSS and ECMP then spread QPs as they spread
//! rxe's. Receiving stays on the RoCEv2 port's socket; these sockets drop
//! whatever reaches them (a socket filter), and being unconnected they get
//! no ICMP errors.
//!
//! A port that cannot be bound (another socket holds it) is remembered and
//! its frames go out from the main socket's port; past the bound, a new
//! port shares an open socket (chosen by the port, so each QP keeps one).

use std::{collections::HashMap, net::IpAddr, os::fd::AsRawFd};

use super::{socket::open_socket, UdpConfig, UdpSocket};

/// Sockets opened so far, per IP version.
pub(super) struct QpPorts {
    /// Most sockets per IP version.
    cap: usize,
    /// [IPv4, IPv6] sockets, each bound to one source port.
    sockets: [Vec<UdpSocket>; 2],
    /// (IPv6, wanted port) -> index into `sockets`; `None`: bind failed.
    chosen: HashMap<(bool, u16), Option<usize>>,
    /// Ports that could not be bound.
    pub(super) refused: u64,
}

/// A classic BPF program of one instruction, "return 0": the kernel
/// queues nothing on a send-only socket.
fn drop_everything(fd: i32) -> std::io::Result<()> {
    let mut insn = libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: 0,
    };
    let prog = libc::sock_fprog {
        len: 1,
        filter: &mut insn,
    };
    // SAFETY: `prog` points at one valid instruction for the call's length.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl QpPorts {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            cap,
            sockets: [Vec::new(), Vec::new()],
            chosen: HashMap::new(),
            refused: 0,
        }
    }

    /// The socket (descriptor, bound port) to send a frame of source port
    /// `port` from, for the main socket `main` (bound to `main.local`,
    /// on interface `main.ifindex` if any); `None`: send from `main`.
    pub(super) fn socket_for(
        &mut self,
        cfg: &UdpConfig,
        main: &UdpSocket,
        port: u16,
    ) -> Option<(i32, u16)> {
        if self.cap == 0 {
            return None;
        }
        let v6 = main.local.is_ipv6();
        let key = (v6, port);
        let idx = match self.chosen.get(&key) {
            Some(i) => *i,
            None => {
                let list = &mut self.sockets[v6 as usize];
                let i = if list.len() < self.cap {
                    match open_sender(cfg, main.local, main.ifindex, port) {
                        Some(s) => {
                            list.push(s);
                            Some(list.len() - 1)
                        }
                        None => {
                            self.refused += 1;
                            None
                        }
                    }
                } else {
                    Some(port as usize % list.len())
                };
                self.chosen.insert(key, i);
                i
            }
        };
        let s = &self.sockets[v6 as usize][idx?];
        Some((s.fd.as_raw_fd(), s.port))
    }

    /// Sockets open (both IP versions).
    pub(super) fn open_count(&self) -> usize {
        self.sockets[0].len() + self.sockets[1].len()
    }
}

/// A send-only socket on `local:port` (on `ifindex` if not 0), or `None`
/// if the port is taken or the socket cannot be set up.
fn open_sender(cfg: &UdpConfig, local: IpAddr, ifindex: u32, port: u16) -> Option<UdpSocket> {
    let mut c = cfg.clone();
    c.gro = false;
    let s = open_socket(&c, local, (ifindex != 0).then_some(ifindex), port).ok()?;
    drop_everything(s.fd.as_raw_fd()).ok()?;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::udp::qp_ports_from_env;
    use std::net::{Ipv4Addr, UdpSocket as StdUdp};

    #[test]
    fn ports_open_once_share_past_the_bound_and_skip_taken_ones() {
        let lo: IpAddr = Ipv4Addr::new(127, 0, 0, 3).into();
        let mut cfg = UdpConfig::new(lo);
        cfg.port = 0;
        let main = open_socket(&cfg, lo, None, 0).expect("main socket");
        // Three free ports (bound by the kernel, then let go), one taken.
        let free: Vec<u16> = (0..3)
            .map(|_| StdUdp::bind((lo, 0)).unwrap().local_addr().unwrap().port())
            .collect();
        let taken = StdUdp::bind((lo, 0)).unwrap();
        let taken_port = taken.local_addr().unwrap().port();
        let mut p = QpPorts::new(2);
        let (fd0, p0) = p.socket_for(&cfg, &main, free[0]).expect("first port");
        assert_eq!(p0, free[0]);
        // Asked again: the same socket, nothing new opened.
        assert_eq!(p.socket_for(&cfg, &main, free[0]), Some((fd0, p0)));
        // A taken port: the main socket's, counted.
        assert_eq!(p.socket_for(&cfg, &main, taken_port), None);
        assert_eq!(p.refused, 1);
        let (_, p1) = p.socket_for(&cfg, &main, free[1]).expect("second port");
        assert_eq!(p1, free[1]);
        assert_eq!(p.open_count(), 2);
        // Past the bound: one of the two, the same every time.
        let shared = p.socket_for(&cfg, &main, free[2]).expect("shared");
        assert!(shared.1 == free[0] || shared.1 == free[1]);
        assert_eq!(p.socket_for(&cfg, &main, free[2]), Some(shared));
        assert_eq!(p.open_count(), 2);
        // Off: always the main socket.
        assert_eq!(QpPorts::new(0).socket_for(&cfg, &main, free[0]), None);
    }

    #[test]
    fn the_environment_variable_reads_as_documented() {
        assert_eq!(qp_ports_from_env(None), 0);
        assert_eq!(qp_ports_from_env(Some("")), 0);
        assert_eq!(qp_ports_from_env(Some("0")), 0);
        assert_eq!(qp_ports_from_env(Some("1")), 64);
        assert_eq!(qp_ports_from_env(Some("8")), 8);
        assert_eq!(qp_ports_from_env(Some("100000")), 1024);
        assert_eq!(qp_ports_from_env(Some("yes")), 0);
    }
}
