//! A network interface as an RDMA device: the XDP program attached (by us,
//! or found attached), the local addresses and RoCEv2 GID, MAC and MTU, the
//! RoCE path MTU that fits, and neighbour (ARP/NDP) lookups for peer MACs.
//!
//! Everything is read in the calling thread's network namespace (ioctls,
//! getifaddrs, /proc/thread-self/net), so a thread that entered a namespace
//! sees that namespace's interfaces.
//!
//! ```ignore
//! let dev = Device::open("eth1", DeviceConfig::default())?; // attaches if needed
//! let gid = dev.gid()?;                       // ::ffff:10.0.0.1
//! let mtu = dev.path_mtu();                   // e.g. 1024 on a 1500-byte link
//! let peer_mac = dev.neighbour_mac(peer_ip, Duration::from_secs(3))?;
//! let io = XskSocket::open(dev.name(), 0, XskConfig::default())?;
//! // dropping `dev` detaches the program if this process attached it
//! ```

use std::{
    ffi::{CStr, CString},
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    process::Command,
    time::{Duration, Instant},
};

use xroce_wire::Gid;

use crate::io::{
    afxdp::{XskConfig, XskError, XskMultiQueue},
    udp::{UdpBackend, UdpConfig},
    IoError, PacketIo,
};
use crate::xdp::{self, Mode, XdpError};

/// Bytes of a RoCEv2 packet besides its payload, counted as rxe does
/// (RXE_MAX_HDR_LENGTH): IP + UDP + BTH + the largest extension + ICRC.
pub const ROCE_HEADER_ALLOWANCE: u32 = 80;

/// IB path MTUs, smallest first.
pub const IB_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Xdp(#[from] XdpError),
    #[error(transparent)]
    Xsk(#[from] XskError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(
        "interface {0} has no xroce XDP program, so the afxdp backend cannot run; \
         use `--backend udp` or let the device attach it"
    )]
    NoXdp(String),
    #[error("unknown backend {0:?}; use `afxdp` or `udp`")]
    BadBackend(String),
    #[error(
        "interface {0} does not exist in this network namespace; `ip link` lists the interfaces"
    )]
    NoSuchInterface(String),
    #[error("{what} of {iface}: {source}")]
    Query {
        iface: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "interface {0} has no IP address; RoCEv2 needs one for its GID (`ip addr add ADDR dev {0}`)"
    )]
    NoAddress(String),
    #[error("interface {iface} MTU {mtu} is too small for RoCEv2 (it needs at least {min})")]
    MtuTooSmall { iface: String, mtu: u32, min: u32 },
    #[error(
        "no {proto} reply from {peer} on {iface} within {timeout:?}: is the peer up and on this \
         link? (for a peer behind a router, look up the gateway instead)"
    )]
    NeighbourTimeout {
        iface: String,
        peer: IpAddr,
        proto: &'static str,
        timeout: Duration,
    },
}

/// How to open a device.
#[derive(Clone, Copy, Debug)]
pub struct DeviceConfig {
    /// Attach the XDP program if it is not attached yet.
    pub attach: bool,
    /// Mode to try first.
    pub mode: Mode,
    /// If native mode fails, try skb (generic) mode.
    pub fallback_to_skb: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            attach: true,
            mode: Mode::Native,
            fallback_to_skb: true,
        }
    }
}

/// How the XDP program came to be on the interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attachment {
    /// It was there (pinned) before we opened the device; we leave it.
    Existing,
    /// We attached it in this mode; `fallback` says why native failed.
    Ours {
        mode: Mode,
        fallback: Option<String>,
    },
    /// Not attached (DeviceConfig::attach was false and it was absent):
    /// only the UDP backend can run.
    None,
}

/// Which packet-I/O backend to run over a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// AF_XDP sockets on every RX queue (needs the XDP program).
    AfXdp,
    /// A kernel UDP socket on port 4791.
    Udp,
}

impl std::str::FromStr for BackendKind {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self, DeviceError> {
        match s {
            "afxdp" | "xdp" => Ok(BackendKind::AfXdp),
            "udp" => Ok(BackendKind::Udp),
            other => Err(DeviceError::BadBackend(other.into())),
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::AfXdp => "afxdp",
            BackendKind::Udp => "udp",
        })
    }
}

/// An open interface.
#[derive(Debug)]
pub struct Device {
    name: String,
    ifindex: u32,
    mac: [u8; 6],
    mtu: u32,
    ipv4: Vec<Ipv4Addr>,
    ipv6: Vec<Ipv6Addr>,
    attachment: Attachment,
}

fn query_err(iface: &str, what: &'static str) -> DeviceError {
    DeviceError::Query {
        iface: iface.into(),
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// Runs one SIOCGIF* ioctl on `iface` and returns the filled ifreq.
fn ifreq_ioctl(
    iface: &str,
    req: libc::c_ulong,
    what: &'static str,
) -> Result<libc::ifreq, DeviceError> {
    let name = CString::new(iface).map_err(|_| DeviceError::NoSuchInterface(iface.into()))?;
    if name.as_bytes().len() >= libc::IFNAMSIZ {
        return Err(DeviceError::NoSuchInterface(iface.into()));
    }
    // SAFETY: a zeroed ifreq with a NUL-terminated name; the ioctl writes
    // only into it; the socket is closed before returning.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(query_err(iface, "socket"));
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
            *d = *s as libc::c_char;
        }
        let rc = libc::ioctl(fd, req as _, &mut ifr);
        let err = query_err(iface, what);
        libc::close(fd);
        if rc != 0 {
            return Err(err);
        }
        Ok(ifr)
    }
}

/// MAC address of `iface`.
pub fn interface_mac(iface: &str) -> Result<[u8; 6], DeviceError> {
    let ifr = ifreq_ioctl(iface, libc::SIOCGIFHWADDR, "MAC address")?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member.
    let sa = unsafe { ifr.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(mac)
}

/// MTU of `iface`.
pub fn interface_mtu(iface: &str) -> Result<u32, DeviceError> {
    let ifr = ifreq_ioctl(iface, libc::SIOCGIFMTU, "MTU")?;
    // SAFETY: SIOCGIFMTU filled the mtu member.
    Ok(unsafe { ifr.ifr_ifru.ifru_mtu } as u32)
}

/// IPv4 and IPv6 addresses of `iface` (getifaddrs, this namespace).
pub fn interface_addrs(iface: &str) -> Result<(Vec<Ipv4Addr>, Vec<Ipv6Addr>), DeviceError> {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we walk read-only and free.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return Err(query_err(iface, "addresses"));
        }
        let mut cur = head;
        while !cur.is_null() {
            let ifa = &*cur;
            cur = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || CStr::from_ptr(ifa.ifa_name).to_bytes() != iface.as_bytes()
            {
                continue;
            }
            match (*ifa.ifa_addr).sa_family as libc::c_int {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    v4.push(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()));
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    v6.push(Ipv6Addr::from(sin6.sin6_addr.s6_addr));
                }
                _ => {}
            }
        }
        libc::freeifaddrs(head);
    }
    Ok((v4, v6))
}

/// The largest IB path MTU whose packets fit an interface MTU (as rxe
/// computes it), or None if even 256 does not.
pub fn path_mtu_for(if_mtu: u32) -> Option<u32> {
    let room = if_mtu.checked_sub(ROCE_HEADER_ALLOWANCE)?;
    IB_MTUS.iter().rev().copied().find(|&m| m <= room)
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    (parts.next().is_none()).then_some(mac)
}

/// A complete entry for `peer` on `iface` in an /proc/net/arp table.
fn arp_lookup(table: &str, peer: Ipv4Addr, iface: &str) -> Option<[u8; 6]> {
    let peer = peer.to_string();
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[0] != peer || f[5] != iface {
            return None;
        }
        let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).ok()?;
        // ATF_COM: the entry is resolved.
        if flags & 0x2 == 0 {
            return None;
        }
        parse_mac(f[3]).filter(|m| *m != [0; 6])
    })
}

/// A usable entry in `ip -6 neigh show` output.
fn ndp_lookup(out: &str, peer: Ipv6Addr) -> Option<[u8; 6]> {
    out.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first()?.parse::<Ipv6Addr>().ok()? != peer {
            return None;
        }
        let at = f.iter().position(|w| *w == "lladdr")?;
        let state = f.last()?;
        if matches!(*state, "FAILED" | "INCOMPLETE") {
            return None;
        }
        parse_mac(f.get(at + 1)?)
    })
}

/// The neighbour table entry of `peer` on interface `ifindex`, from an
/// RTM_GETNEIGH dump over rtnetlink (this thread's namespace). `Ok(None)`:
/// no usable entry (absent, incomplete or failed).
pub fn netlink_neighbour(ifindex: u32, peer: IpAddr) -> std::io::Result<Option<[u8; 6]>> {
    const RTM_NEWNEIGH: u16 = 28;
    const RTM_GETNEIGH: u16 = 30;
    const NDA_DST: u16 = 1;
    const NDA_LLADDR: u16 = 2;
    const NUD_INCOMPLETE: u16 = 0x01;
    const NUD_FAILED: u16 = 0x20;
    let family = if peer.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    } as u8;
    let want: Vec<u8> = match peer {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    // SAFETY: plain socket(2); closed by OwnedFd.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // nlmsghdr (16) + ndmsg (12).
    let mut req = [0u8; 28];
    req[0..4].copy_from_slice(&28u32.to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETNEIGH.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[16] = family;
    // SAFETY: sending a buffer we own to the kernel (nl_pid 0).
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    let rc = unsafe {
        libc::sendto(
            raw,
            req.as_ptr().cast(),
            req.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 * 1024];
    let mut found = None;
    loop {
        // SAFETY: receiving into a buffer we own.
        let n = unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut msgs = &buf[..n as usize];
        while msgs.len() >= 16 {
            let len = u32::from_ne_bytes(msgs[0..4].try_into().unwrap()) as usize;
            let ty = u16::from_ne_bytes(msgs[4..6].try_into().unwrap());
            if len < 16 || len > msgs.len() {
                return Ok(found);
            }
            if ty == libc::NLMSG_DONE as u16 {
                return Ok(found);
            }
            if ty == libc::NLMSG_ERROR as u16 {
                let errno = i32::from_ne_bytes(msgs[16..20].try_into().unwrap_or([0; 4]));
                return Err(std::io::Error::from_raw_os_error(-errno));
            }
            if ty == RTM_NEWNEIGH && len >= 28 {
                let nd = &msgs[16..28];
                let if_ok = i32::from_ne_bytes(nd[4..8].try_into().unwrap()) as u32 == ifindex;
                let state = u16::from_ne_bytes(nd[8..10].try_into().unwrap());
                let usable = state & (NUD_INCOMPLETE | NUD_FAILED) == 0 && state != 0;
                let (mut dst, mut ll) = (None, None);
                let mut attrs = &msgs[28..len];
                while attrs.len() >= 4 {
                    let alen = u16::from_ne_bytes(attrs[0..2].try_into().unwrap()) as usize;
                    let aty = u16::from_ne_bytes(attrs[2..4].try_into().unwrap());
                    if alen < 4 || alen > attrs.len() {
                        break;
                    }
                    let data = &attrs[4..alen];
                    match aty {
                        NDA_DST => dst = Some(data),
                        NDA_LLADDR if data.len() == 6 => ll = Some(data),
                        _ => {}
                    }
                    attrs = &attrs[alen.div_ceil(4) * 4..];
                    if attrs.len() < 4 {
                        break;
                    }
                }
                if if_ok && usable && dst == Some(&want[..]) {
                    if let Some(mac) = ll {
                        found = Some(mac.try_into().unwrap());
                    }
                }
            }
            let next = len.div_ceil(4) * 4;
            if next >= msgs.len() {
                break;
            }
            msgs = &msgs[next..];
        }
    }
}

/// Looks up the MAC of `peer` on `iface` in the neighbour table (rtnetlink
/// RTM_GETNEIGH; /proc/net/arp or `ip -6 neigh` as fallbacks), sending one
/// small UDP datagram (to the discard port) to make the kernel resolve it
/// when it is not known, and polling until `timeout`.
pub fn neighbour_mac(iface: &str, peer: IpAddr, timeout: Duration) -> Result<[u8; 6], DeviceError> {
    let ifindex = xdp::if_index(iface).map_err(|_| DeviceError::NoSuchInterface(iface.into()))?;
    let deadline = Instant::now() + timeout;
    let mut poked = false;
    loop {
        // rtnetlink first; /proc/net/arp or `ip -6 neigh` if that fails.
        let found = match netlink_neighbour(ifindex, peer) {
            Ok(found) => found,
            Err(_) => match peer {
                IpAddr::V4(p) => fs::read_to_string("/proc/thread-self/net/arp")
                    .ok()
                    .and_then(|t| arp_lookup(&t, p, iface)),
                IpAddr::V6(p) => Command::new("ip")
                    .args(["-6", "neigh", "show", &p.to_string(), "dev", iface])
                    .output()
                    .ok()
                    .and_then(|o| ndp_lookup(&String::from_utf8_lossy(&o.stdout), p)),
            },
        };
        if let Some(mac) = found {
            return Ok(mac);
        }
        if Instant::now() >= deadline {
            return Err(DeviceError::NeighbourTimeout {
                iface: iface.into(),
                peer,
                proto: if peer.is_ipv4() { "ARP" } else { "NDP" },
                timeout,
            });
        }
        if !poked {
            poked = true;
            let (bind, to): (SocketAddr, SocketAddr) = match peer {
                IpAddr::V4(p) => ((Ipv4Addr::UNSPECIFIED, 0).into(), (p, 9).into()),
                // A link-local peer needs the interface as its scope.
                IpAddr::V6(p) => (
                    (Ipv6Addr::UNSPECIFIED, 0).into(),
                    std::net::SocketAddrV6::new(
                        p,
                        9,
                        0,
                        if p.segments()[0] & 0xffc0 == 0xfe80 {
                            ifindex
                        } else {
                            0
                        },
                    )
                    .into(),
                ),
            };
            // Port 9 (discard): resolution happens on the first send.
            if let Ok(s) = UdpSocket::bind(bind) {
                let _ = s.send_to(&[0], to);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Device {
    /// Opens `iface`: reads its MAC, MTU and addresses, and attaches the XDP
    /// program if asked and not attached yet (native first, then skb if
    /// allowed; [`Device::attachment`] tells which, and why).
    pub fn open(iface: &str, cfg: DeviceConfig) -> Result<Device, DeviceError> {
        let ifindex =
            xdp::if_index(iface).map_err(|_| DeviceError::NoSuchInterface(iface.into()))?;
        let mac = interface_mac(iface)?;
        let mtu = interface_mtu(iface)?;
        let (ipv4, ipv6) = interface_addrs(iface)?;
        let attachment = if xdp::is_attached(iface) {
            Attachment::Existing
        } else if !cfg.attach {
            Attachment::None
        } else {
            match xdp::attach(iface, cfg.mode) {
                Ok(()) => Attachment::Ours {
                    mode: cfg.mode,
                    fallback: None,
                },
                Err(e @ (XdpError::NotRoot | XdpError::NoBpffs | XdpError::NoSuchInterface(_))) => {
                    return Err(e.into())
                }
                Err(e) if cfg.fallback_to_skb && cfg.mode == Mode::Native => {
                    xdp::attach(iface, Mode::Skb)?;
                    Attachment::Ours {
                        mode: Mode::Skb,
                        fallback: Some(e.to_string()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        };
        Ok(Device {
            name: iface.into(),
            ifindex,
            mac,
            mtu,
            ipv4,
            ipv6,
            attachment,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Interface MTU (IP MTU).
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    pub fn ipv4(&self) -> &[Ipv4Addr] {
        &self.ipv4
    }

    pub fn ipv6(&self) -> &[Ipv6Addr] {
        &self.ipv6
    }

    pub fn attachment(&self) -> &Attachment {
        &self.attachment
    }

    /// The address RoCEv2 uses: the first IPv4 address, else the first
    /// global (non link-local) IPv6 address, else a link-local one.
    pub fn ip(&self) -> Result<IpAddr, DeviceError> {
        if let Some(a) = self.ipv4.first() {
            return Ok((*a).into());
        }
        let global = self
            .ipv6
            .iter()
            .find(|a| a.segments()[0] & 0xffc0 != 0xfe80)
            .or_else(|| self.ipv6.first());
        global
            .map(|a| (*a).into())
            .ok_or_else(|| DeviceError::NoAddress(self.name.clone()))
    }

    /// The RoCEv2 GID: IPv4-mapped `::ffff:a.b.c.d` for IPv4 (rxe's GID
    /// index 1), the address itself for IPv6.
    pub fn gid(&self) -> Result<Gid, DeviceError> {
        Ok(Gid::from(self.ip()?))
    }

    /// The largest RoCE path MTU (256..4096) that fits the interface MTU.
    pub fn path_mtu(&self) -> u32 {
        path_mtu_for(self.mtu).unwrap_or(256)
    }

    /// [`path_mtu`](Self::path_mtu), or an error if the link is too small.
    pub fn checked_path_mtu(&self) -> Result<u32, DeviceError> {
        path_mtu_for(self.mtu).ok_or_else(|| DeviceError::MtuTooSmall {
            iface: self.name.clone(),
            mtu: self.mtu,
            min: 256 + ROCE_HEADER_ALLOWANCE,
        })
    }

    /// Opens a packet-I/O backend on this device for RoCE path MTU
    /// `path_mtu`: AF_XDP on every RX queue (multi-buffer when a frame of
    /// that MTU outgrows a UMEM chunk), or the UDP backend bound to
    /// [`ip`](Self::ip). Frames of `path_mtu` fit the backend's buffers.
    pub fn open_io(
        &self,
        kind: BackendKind,
        path_mtu: u32,
    ) -> Result<Box<dyn PacketIo>, DeviceError> {
        // Ethernet + VLAN + IPv6 + UDP + BTH + largest extension + ICRC.
        let frame = path_mtu as usize + 14 + 4 + ROCE_HEADER_ALLOWANCE as usize + 20;
        match kind {
            BackendKind::AfXdp => {
                if self.attachment == Attachment::None {
                    return Err(DeviceError::NoXdp(self.name.clone()));
                }
                let mut cfg = XskConfig::default();
                if frame > cfg.chunk_capacity() {
                    cfg.multi_buffer = true;
                    cfg.multi_buffer_max_frame = cfg.multi_buffer_max_frame.max(frame);
                }
                Ok(Box::new(XskMultiQueue::open(&self.name, cfg)?))
            }
            BackendKind::Udp => {
                let mut cfg = UdpConfig::new(self.ip()?);
                cfg.local_mac = self.mac;
                cfg.max_frame_len = cfg.max_frame_len.max(frame);
                Ok(Box::new(UdpBackend::open(cfg)?))
            }
        }
    }

    /// MAC of a peer on this link (see [`neighbour_mac`]).
    pub fn neighbour_mac(&self, peer: IpAddr, timeout: Duration) -> Result<[u8; 6], DeviceError> {
        neighbour_mac(&self.name, peer, timeout)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Attachment::Ours { .. } = self.attachment {
            let _ = xdp::detach(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_mtu_follows_rxe() {
        assert_eq!(path_mtu_for(1500), Some(1024));
        assert_eq!(path_mtu_for(3500), Some(2048));
        assert_eq!(path_mtu_for(9000), Some(4096));
        assert_eq!(path_mtu_for(4176), Some(4096));
        assert_eq!(path_mtu_for(4175), Some(2048));
        assert_eq!(path_mtu_for(336), Some(256));
        assert_eq!(path_mtu_for(300), None);
        assert_eq!(path_mtu_for(10), None);
    }

    #[test]
    fn arp_and_ndp_tables_parse() {
        let arp =
            "IP address       HW type     Flags       HW address            Mask     Device\n\
                   10.77.3.2        0x1         0x2         aa:bb:cc:dd:ee:01     *        xr1a\n\
                   10.77.3.3        0x1         0x0         00:00:00:00:00:00     *        xr1a\n\
                   10.77.3.2        0x1         0x2         aa:bb:cc:dd:ee:09     *        other\n";
        let p = Ipv4Addr::new(10, 77, 3, 2);
        assert_eq!(
            arp_lookup(arp, p, "xr1a"),
            Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 1])
        );
        assert_eq!(
            arp_lookup(arp, p, "other"),
            Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 9])
        );
        assert_eq!(arp_lookup(arp, Ipv4Addr::new(10, 77, 3, 3), "xr1a"), None);
        assert_eq!(arp_lookup(arp, Ipv4Addr::new(10, 77, 3, 4), "xr1a"), None);
        let ndp = "fd00::2 lladdr 02:11:22:33:44:55 REACHABLE\nfd00::3 INCOMPLETE\n";
        assert_eq!(
            ndp_lookup(ndp, "fd00::2".parse().unwrap()),
            Some([2, 0x11, 0x22, 0x33, 0x44, 0x55])
        );
        assert_eq!(ndp_lookup(ndp, "fd00::3".parse().unwrap()), None);
        assert_eq!(parse_mac("1:2:3:4:5"), None);
        assert_eq!(parse_mac("01:02:03:04:05:06:07"), None);
    }

    #[test]
    fn loopback_queries_work_and_errors_name_the_problem() {
        assert_eq!(interface_mtu("lo").unwrap(), 65536);
        assert_eq!(interface_mac("lo").unwrap(), [0; 6]);
        let (v4, _) = interface_addrs("lo").unwrap();
        assert!(v4.contains(&Ipv4Addr::LOCALHOST));
        let e = interface_mtu("nosuchif0").unwrap_err();
        assert!(e.to_string().contains("nosuchif0"), "{e}");
        let e = Device::open("nosuchif0", DeviceConfig::default()).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        // Loopback has no neighbours: a clear timeout, not a hang.
        let e = neighbour_mac(
            "lo",
            Ipv4Addr::new(127, 9, 9, 9).into(),
            Duration::from_millis(50),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no ARP reply from 127.9.9.9"), "{e}");
    }
}
