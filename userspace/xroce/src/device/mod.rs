//! A network interface as an RDMA device: the XDP program attached (by us,
//! or found attached), the local addresses and RoCEv2 GID, MAC and MTU, the
//! RoCE path MTU that fits, and neighbour (ARP/NDP) lookups for peer MACs.
//!
//! Everything is read in the calling thread's network namespace (getifaddrs,
//! an ioctl socket, rtnetlink), so a thread that entered a namespace sees
//! that namespace's interfaces.
//!
//! ```ignore
//! let dev = NetDevice::open("eth1", NetDeviceConfig::default())?; // attaches if needed
//! let gid = dev.gid()?;                       // ::ffff:10.0.0.1
//! let mtu = dev.path_mtu();                   // e.g. 1024 on a 1500-byte link
//! let peer_mac = dev.neighbour_mac(peer_ip, Duration::from_secs(3))?;
//! let io = XskSocket::open(dev.name(), 0, XskConfig::default())?;
//! // dropping `dev` detaches the program if this process attached it
//! ```
//!
//! One job per file: `interface` queries MAC, MTU and addresses, `neighbour`
//! finds peer MACs over rtnetlink, `attach` is the attach policy,
//! `backend` the packet-I/O backend factory ([`NetDevice::open_io`]) and
//! `sysfs` what the device shows in sysfs (rxe's files).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use xroce_wire::Gid;

use crate::io::{afxdp::XskError, IoError};
use crate::xdp::{self, Mode, XdpError};

mod attach;
mod backend;
mod block;
mod gid;
mod holders;
mod interface;
mod neighbour;
mod root_lock;

pub use root_lock::sweep_stale as sweep_stale_holds;
pub mod sysfs;

pub use backend::udp_port_free;
pub(crate) use block::attaching;
pub use block::{
    claim_capture, random_qpn_offset, AfXdpHold, BlockError, CaptureHold, Hold, QpnBlock,
};
pub use gid::{gid_table, guid_from_mac, link_local_gid};
pub use holders::{command_name, holders, Holder};
pub(crate) use interface::{ifreq_named, ioctl_socket};
pub use interface::{interface_addrs, interface_mac, interface_mtu};
pub use neighbour::{neighbour_mac, netlink_neighbour};

/// Bytes of a RoCEv2 packet besides its payload, counted as rxe does
/// (RXE_MAX_HDR_LENGTH): IP + UDP + BTH + the largest extension + ICRC.
pub const ROCE_HEADER_ALLOWANCE: u32 = 80;

/// IB path MTUs, smallest first.
pub const IB_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

#[derive(Debug, thiserror::Error)]
pub enum NetDeviceError {
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
    #[error(transparent)]
    Block(#[from] BlockError),
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
pub struct NetDeviceConfig {
    /// Attach the XDP program if it is not attached yet.
    pub attach: bool,
    /// Mode to try first.
    pub mode: Mode,
    /// If native mode fails, try skb (generic) mode.
    pub fallback_to_skb: bool,
}

impl Default for NetDeviceConfig {
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
    /// Not attached (NetDeviceConfig::attach was false and it was absent):
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
    type Err = NetDeviceError;
    fn from_str(s: &str) -> Result<Self, NetDeviceError> {
        match s {
            "afxdp" | "xdp" => Ok(BackendKind::AfXdp),
            "udp" => Ok(BackendKind::Udp),
            other => Err(NetDeviceError::BadBackend(other.into())),
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
pub struct NetDevice {
    name: String,
    ifindex: u32,
    mac: [u8; 6],
    mtu: u32,
    ipv4: Vec<Ipv4Addr>,
    ipv6: Vec<Ipv6Addr>,
    attachment: Attachment,
    detach_on_drop: bool,
}

/// The largest IB path MTU whose packets fit an interface MTU (as rxe
/// computes it), or None if even 256 does not.
pub fn path_mtu_for(if_mtu: u32) -> Option<u32> {
    let room = if_mtu.checked_sub(ROCE_HEADER_ALLOWANCE)?;
    IB_MTUS.iter().rev().copied().find(|&m| m <= room)
}

/// [`path_mtu_for`] of interface `iface` (MTU `if_mtu`), or an error if
/// the link is too small for the smallest RoCE MTU.
pub fn checked_path_mtu_for(iface: &str, if_mtu: u32) -> Result<u32, NetDeviceError> {
    path_mtu_for(if_mtu).ok_or_else(|| NetDeviceError::MtuTooSmall {
        iface: iface.into(),
        mtu: if_mtu,
        min: 256 + ROCE_HEADER_ALLOWANCE,
    })
}

impl NetDevice {
    /// Opens `iface`: reads its MAC, MTU and addresses, and attaches the XDP
    /// program if asked and not attached yet (native first, then skb if
    /// allowed; [`NetDevice::attachment`] tells which, and why).
    pub fn open(iface: &str, cfg: NetDeviceConfig) -> Result<NetDevice, NetDeviceError> {
        let ifindex =
            xdp::if_index(iface).map_err(|_| NetDeviceError::NoSuchInterface(iface.into()))?;
        let mac = interface_mac(iface)?;
        let mtu = interface_mtu(iface)?;
        let (ipv4, ipv6) = interface_addrs(iface)?;
        let attachment = attach::attach(iface, cfg)?;
        Ok(NetDevice {
            detach_on_drop: matches!(attachment, Attachment::Ours { .. }),
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

    /// Whether dropping this value detaches the XDP program: by default
    /// when it attached it. A device shared by several processes hands the
    /// attachment to the last one that leaves.
    pub fn set_detach_on_drop(&mut self, detach: bool) {
        self.detach_on_drop = detach;
    }

    /// The address RoCEv2 uses: the first IPv4 address, else the first
    /// global (non link-local) IPv6 address, else a link-local one.
    pub fn ip(&self) -> Result<IpAddr, NetDeviceError> {
        if let Some(a) = self.ipv4.first() {
            return Ok((*a).into());
        }
        let global = self
            .ipv6
            .iter()
            .find(|a| !a.is_unicast_link_local())
            .or_else(|| self.ipv6.first());
        global
            .map(|a| (*a).into())
            .ok_or_else(|| NetDeviceError::NoAddress(self.name.clone()))
    }

    /// The RoCEv2 GID: IPv4-mapped `::ffff:a.b.c.d` for IPv4 (rxe's GID
    /// index 1), the address itself for IPv6.
    pub fn gid(&self) -> Result<Gid, NetDeviceError> {
        Ok(Gid::from(self.ip()?))
    }

    /// The largest RoCE path MTU (256..4096) that fits the interface MTU.
    pub fn path_mtu(&self) -> u32 {
        path_mtu_for(self.mtu).unwrap_or(256)
    }

    /// [`path_mtu`](Self::path_mtu), or an error if the link is too small.
    pub fn checked_path_mtu(&self) -> Result<u32, NetDeviceError> {
        checked_path_mtu_for(&self.name, self.mtu)
    }

    /// MAC of a peer on this link (see [`neighbour_mac`]).
    pub fn neighbour_mac(
        &self,
        peer: IpAddr,
        timeout: Duration,
    ) -> Result<[u8; 6], NetDeviceError> {
        neighbour_mac(&self.name, peer, timeout)
    }
}

impl Drop for NetDevice {
    fn drop(&mut self) {
        if self.detach_on_drop {
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
    fn opening_a_missing_interface_names_the_problem() {
        let e = NetDevice::open("nosuchif0", NetDeviceConfig::default()).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }
}
