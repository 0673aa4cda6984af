//! xroce's stack on one interface: the interface ([`NetDevice`]), the
//! engine behind a verbs [`Device`] with its congestion control, a
//! packet-I/O backend sized for the path MTU, the [`Runtime`] thread that
//! joins them, and the counters exported for `xroce stats`. The CLI's
//! tools and the drop-in libibverbs both open their devices here.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
    time::Duration,
};

use crate::{
    cc::{self, CcKind},
    device::{Attachment, BackendKind, NetDevice, NetDeviceConfig, NetDeviceError},
    engine::EngineConfig,
    io::wire::Gid,
    runtime::{Runtime, RuntimeConfig},
    stats_export::StatsExporter,
    verbs::{Device, Mtu},
};

/// How to open a [`Stack`].
#[derive(Clone, Debug)]
pub struct StackConfig {
    pub iface: String,
    /// The backend; `None`: AF_XDP where xroce's XDP program is attached,
    /// UDP elsewhere.
    pub backend: Option<BackendKind>,
    /// The address RoCEv2 runs from; `None`: the interface's first IPv4.
    pub local_ip: Option<Ipv4Addr>,
    /// Path MTU; `None`: the largest the interface allows.
    pub path_mtu: Option<Mtu>,
    pub cc: CcKind,
    /// Line rate the pacer and congestion control start from.
    pub line_rate_bps: u64,
    /// Spin the I/O thread instead of sleeping when idle.
    pub busy_poll: bool,
}

impl StackConfig {
    pub fn new(iface: &str) -> Self {
        Self {
            iface: iface.to_string(),
            backend: None,
            local_ip: None,
            path_mtu: None,
            cc: CcKind::None,
            line_rate_bps: 100_000_000_000,
            busy_poll: false,
        }
    }
}

/// Why a stack could not open.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error(transparent)]
    Device(#[from] NetDeviceError),
    #[error("{0} has no IPv4 address; xroce's RoCEv2 runs over IPv4: add one")]
    NoIpv4(String),
    #[error("{ip} is not an address of {iface}; use the interface that has it")]
    NotOurAddress { ip: Ipv4Addr, iface: String },
    #[error(
        "path MTU {want} does not fit {iface} (MTU {if_mtu}, path MTU {fits} at most); \
         raise the interface MTU (e.g. 9000 for 4096) or ask for {fits}"
    )]
    MtuTooLarge {
        iface: String,
        want: u32,
        if_mtu: u32,
        fits: u32,
    },
    #[error("the {backend} backend on {iface}")]
    Backend {
        backend: BackendKind,
        iface: String,
        #[source]
        source: NetDeviceError,
    },
}

/// One interface opened for RDMA. Dropping it stops the I/O thread and
/// releases the interface (detaching the XDP program if it attached it).
pub struct Stack {
    pub device: Device,
    /// The largest path MTU this side runs (connections may agree on less).
    pub path_mtu: Mtu,
    pub backend: &'static str,
    pub ip: Ipv4Addr,
    // Drop order: the exporter and the runtime stop before the interface
    // is released.
    _stats: StatsExporter,
    runtime: Runtime,
    net: NetDevice,
}

impl Stack {
    pub fn open(cfg: &StackConfig) -> Result<Stack, StackError> {
        let iface = cfg.iface.as_str();
        let net = NetDevice::open(
            iface,
            NetDeviceConfig {
                attach: cfg.backend == Some(BackendKind::AfXdp),
                ..NetDeviceConfig::default()
            },
        )?;
        let backend = cfg.backend.unwrap_or(match net.attachment() {
            Attachment::None => BackendKind::Udp,
            _ => BackendKind::AfXdp,
        });
        let ip = match cfg.local_ip {
            Some(ip) if !net.ipv4().contains(&ip) => {
                return Err(StackError::NotOurAddress {
                    ip,
                    iface: iface.into(),
                })
            }
            Some(ip) => ip,
            None => *net
                .ipv4()
                .first()
                .ok_or_else(|| StackError::NoIpv4(iface.into()))?,
        };
        let fits = net.checked_path_mtu()?;
        let path_mtu = match cfg.path_mtu {
            Some(m) if m.bytes() > fits => {
                return Err(StackError::MtuTooLarge {
                    iface: iface.into(),
                    want: m.bytes(),
                    if_mtu: net.mtu(),
                    fits,
                })
            }
            Some(m) => m,
            None => Mtu::from_bytes(fits).unwrap_or(Mtu::Mtu1024),
        };
        let (kind, rate) = (cfg.cc, cfg.line_rate_bps);
        let engine = EngineConfig {
            mac: net.mac(),
            ip,
            ipv6: net.ipv6().to_vec(),
            line_rate_bps: rate,
            cc: Some(Arc::new(move || cc::build(kind, rate))),
            ..EngineConfig::default()
        };
        let io = net
            .open_io(backend, path_mtu.bytes())
            .map_err(|source| StackError::Backend {
                backend,
                iface: iface.into(),
                source,
            })?;
        let backend = io.name();
        let device = Device::new(engine);
        let runtime = Runtime::start(
            device.clone(),
            io,
            RuntimeConfig {
                busy_poll: cfg.busy_poll,
                ..RuntimeConfig::default()
            },
        );
        // `xroce stats --iface` in another process shows our counters.
        let stats = StatsExporter::start(device.clone(), iface);
        Ok(Stack {
            device,
            path_mtu,
            backend,
            ip,
            _stats: stats,
            runtime,
            net,
        })
    }

    /// The interface.
    pub fn net(&self) -> &NetDevice {
        &self.net
    }

    pub fn mac(&self) -> [u8; 6] {
        self.net.mac()
    }

    /// Our RoCEv2 GID (IPv4-mapped).
    pub fn gid(&self) -> Gid {
        Gid::from(self.ip)
    }

    /// MAC to reach `peer` on this link (ARP/NDP); our own for our own
    /// address (loopback).
    pub fn neighbour(&self, peer: IpAddr, timeout: Duration) -> Result<[u8; 6], NetDeviceError> {
        if peer == IpAddr::V4(self.ip) {
            return Ok(self.net.mac());
        }
        self.net.neighbour_mac(peer, timeout)
    }

    /// Is the I/O thread still running (it stops on an I/O error)?
    pub fn is_running(&self) -> bool {
        self.runtime.is_running()
    }
}
