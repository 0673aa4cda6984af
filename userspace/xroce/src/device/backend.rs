//! The backend factory: a packet-I/O backend over an open device, sized
//! for a RoCE path MTU.

use super::{Attachment, BackendKind, NetDevice, NetDeviceError, ROCE_HEADER_ALLOWANCE};
use crate::io::{
    afxdp::{XskConfig, XskMultiQueue},
    udp::{UdpBackend, UdpConfig},
    PacketIo,
};

/// Whether the UDP sockets a backend on interface `iface` (index
/// `ifindex`) binds for a port are free: its first IPv4 address and, if it
/// has IPv6 addresses, `[::]` there, as [`NetDevice::open_udp`] binds
/// them. For choosing a QPN block before the device is opened: one whose
/// port another user's process bound is skipped.
pub fn udp_port_free(iface: &str, ifindex: u32) -> impl Fn(u16) -> bool {
    let (v4, v6) = super::interface_addrs(iface).unwrap_or_default();
    let ipv4 = v4.first().copied();
    let ipv6_ifindex = (!v6.is_empty()).then_some(ifindex);
    move |port| crate::io::udp::port_free(ipv4, ipv6_ifindex, port)
}

impl NetDevice {
    /// Opens a packet-I/O backend on this device for RoCE path MTU
    /// `path_mtu`: AF_XDP on every RX queue (multi-buffer when a frame of
    /// that MTU outgrows a UMEM chunk), or the UDP backend bound to
    /// [`ip`](Self::ip) and, if the device has IPv6 addresses, to all of
    /// them. Frames of `path_mtu` fit the backend's buffers.
    pub fn open_io(
        &self,
        kind: BackendKind,
        path_mtu: u32,
    ) -> Result<Box<dyn PacketIo>, NetDeviceError> {
        let frame = frame_len(path_mtu);
        match kind {
            BackendKind::AfXdp => {
                if self.attachment == Attachment::None {
                    return Err(NetDeviceError::NoXdp(self.name.clone()));
                }
                let mut cfg = XskConfig::default();
                if frame > cfg.chunk_capacity() {
                    cfg.multi_buffer = true;
                    cfg.multi_buffer_max_frame = cfg.multi_buffer_max_frame.max(frame);
                }
                Ok(Box::new(XskMultiQueue::open(&self.name, cfg)?))
            }
            BackendKind::Udp => Ok(Box::new(self.open_udp(path_mtu, None)?)),
        }
    }

    /// The UDP backend for RoCE path MTU `path_mtu`, bound to
    /// [`ip`](Self::ip) and, if the device has IPv6 addresses, to all of
    /// them; on the port of QPN block `qpn_block` when the device is shared
    /// ([`crate::io::udp::UdpConfig::qpn_block`]).
    pub fn open_udp(
        &self,
        path_mtu: u32,
        qpn_block: Option<u32>,
    ) -> Result<UdpBackend, NetDeviceError> {
        let mut cfg = UdpConfig::new(self.ip()?);
        // IPv6 GIDs (link-local included) on a socket of their own.
        cfg.ipv6_ifindex = (!self.ipv6.is_empty()).then_some(self.ifindex);
        cfg.local_mac = self.mac;
        cfg.max_frame_len = cfg.max_frame_len.max(frame_len(path_mtu));
        cfg.qpn_block = qpn_block;
        Ok(UdpBackend::open(cfg)?)
    }
}

/// Largest frame of path MTU `path_mtu`: Ethernet + VLAN + IPv6 + UDP +
/// BTH + largest extension + ICRC around it.
fn frame_len(path_mtu: u32) -> usize {
    path_mtu as usize + 14 + 4 + ROCE_HEADER_ALLOWANCE as usize + 20
}
