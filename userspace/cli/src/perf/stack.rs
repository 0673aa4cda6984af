//! One side's RDMA stack: the interface, the engine with its congestion
//! control, the packet-I/O backend and the runtime thread that joins them.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use anyhow::{bail, Context};
use xroce::{
    cc::{self, units::parse_rate_bps},
    device::{Device as NetDevice, DeviceConfig},
    engine::EngineConfig,
    io::{
        afxdp::{XskConfig, XskMultiQueue},
        udp::{UdpBackend, UdpConfig},
        PacketIo,
    },
    runtime::{Runtime, RuntimeConfig},
    verbs::{Device, Mtu},
};

use super::{Backend, PerfArgs};

pub struct Stack {
    pub device: Device,
    pub path_mtu: Mtu,
    pub backend: &'static str,
    // Drop order: the runtime stops before the interface is released.
    runtime: Runtime,
    _net: NetDevice,
}

impl Stack {
    /// Opens `args.iface` for RoCEv2 from `local_ip`.
    pub fn open(args: &PerfArgs, local_ip: IpAddr) -> anyhow::Result<Stack> {
        let IpAddr::V4(ip) = local_ip else {
            bail!(
                "{local_ip}: the engine speaks RoCEv2 over IPv4 only for now; use an IPv4 address"
            );
        };
        let attach = args.backend == Backend::Afxdp;
        let net = NetDevice::open(
            &args.iface,
            DeviceConfig {
                attach,
                ..DeviceConfig::default()
            },
        )?;
        if !net.ipv4().contains(&ip) {
            bail!(
                "{ip} is not an address of {}; pass the interface that has it (-d/--iface)",
                args.iface
            );
        }
        let path_mtu = match args.mtu {
            Some(m) => Mtu::from_bytes(m)
                .with_context(|| format!("--mtu {m}: use 256, 512, 1024, 2048 or 4096"))?,
            None => Mtu::from_bytes(net.checked_path_mtu()?).unwrap_or(Mtu::Mtu1024),
        };
        let line_rate = parse_rate_bps(&args.rate).map_err(|e| anyhow::anyhow!("--rate: {e}"))?;
        let kind = args.cc;
        let config = EngineConfig {
            mac: net.mac(),
            ip,
            line_rate_bps: line_rate,
            cc: Some(Arc::new(move || cc::build(kind, line_rate))),
            ..EngineConfig::default()
        };
        let io: Box<dyn PacketIo> = match args.backend {
            Backend::Afxdp => Box::new(
                XskMultiQueue::open(&args.iface, XskConfig::default())
                    .with_context(|| format!("AF_XDP on {}", args.iface))?,
            ),
            Backend::Udp => {
                let mut udp = UdpConfig::new(local_ip);
                udp.local_mac = net.mac();
                Box::new(UdpBackend::open(udp).context("UDP backend on port 4791")?)
            }
        };
        let backend = io.name();
        let device = Device::new(config);
        let runtime = Runtime::start(
            device.clone(),
            io,
            RuntimeConfig {
                busy_poll: args.busy_poll,
                ..RuntimeConfig::default()
            },
        );
        Ok(Stack {
            device,
            path_mtu,
            backend,
            runtime,
            _net: net,
        })
    }

    pub fn mac(&self) -> [u8; 6] {
        self._net.mac()
    }

    /// MAC to reach `peer` on this link (ARP/NDP).
    pub fn neighbour(&self, peer: IpAddr) -> anyhow::Result<[u8; 6]> {
        Ok(self
            ._net
            .neighbour_mac(peer, std::time::Duration::from_secs(3))?)
    }

    /// Fails if the I/O thread stopped on an error.
    pub fn check_running(&self) -> anyhow::Result<()> {
        if !self.runtime.is_running() {
            bail!("the {} packet I/O thread stopped", self.backend);
        }
        Ok(())
    }
}

/// The first IPv4 address of `iface`, for a server listening on 0.0.0.0.
pub fn first_ipv4(iface: &str) -> anyhow::Result<Ipv4Addr> {
    let (v4, _) = xroce::device::interface_addrs(iface)?;
    v4.first().copied().with_context(|| {
        format!("{iface} has no IPv4 address; add one or listen on a specific one")
    })
}
