//! One side's RDMA stack: the interface, the engine with its congestion
//! control, the packet-I/O backend and the runtime thread that joins them.
//!
//! The backend comes from [`NetDevice::open_io`], sized for the path MTU
//! (AF_XDP multi-buffer for 4096 on a jumbo link).

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context};
use xroce::{
    cc::{self, units::parse_rate_bps, CcKind},
    device::{BackendKind, Device as NetDevice, DeviceConfig},
    engine::EngineConfig,
    io::wire::Gid,
    runtime::{Runtime, RuntimeConfig},
    stats_export::StatsExporter,
    verbs::{Device, Mtu},
};

use super::PerfArgs;

/// What a stack is opened with (the part of the CLI flags it needs).
#[derive(Clone, Debug)]
pub struct StackOptions {
    pub iface: String,
    pub backend: BackendKind,
    /// Path MTU in bytes; `None`: the largest the interface allows.
    pub mtu: Option<u32>,
    pub cc: CcKind,
    /// Line rate, e.g. "100gbit".
    pub rate: String,
    pub busy_poll: bool,
}

impl From<&PerfArgs> for StackOptions {
    fn from(a: &PerfArgs) -> Self {
        StackOptions {
            iface: a.iface.clone(),
            backend: a.backend.into(),
            mtu: a.mtu,
            cc: a.cc,
            rate: a.rate.clone(),
            busy_poll: a.busy_poll,
        }
    }
}

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
    /// Opens `args.iface` for RoCEv2 from `local_ip`.
    pub fn open(args: &PerfArgs, local_ip: IpAddr) -> anyhow::Result<Stack> {
        Self::open_with(&StackOptions::from(args), local_ip)
    }

    pub fn open_with(opts: &StackOptions, local_ip: IpAddr) -> anyhow::Result<Stack> {
        let IpAddr::V4(ip) = local_ip else {
            bail!(
                "{local_ip}: the engine speaks RoCEv2 over IPv4 only for now; use an IPv4 address"
            );
        };
        let net = NetDevice::open(
            &opts.iface,
            DeviceConfig {
                attach: opts.backend == BackendKind::AfXdp,
                ..DeviceConfig::default()
            },
        )?;
        if !net.ipv4().contains(&ip) {
            bail!(
                "{ip} is not an address of {}; pass the interface that has it (-d/--iface)",
                opts.iface
            );
        }
        let path_mtu = match opts.mtu {
            Some(m) => {
                let mtu = Mtu::from_bytes(m)
                    .with_context(|| format!("--mtu {m}: use 256, 512, 1024, 2048 or 4096"))?;
                let fits = net.checked_path_mtu()?;
                if m > fits {
                    bail!(
                        "--mtu {m} does not fit {} (MTU {}, path MTU {fits} at most); \
                         raise the interface MTU (e.g. 9000 for 4096) or pass --mtu {fits}",
                        opts.iface,
                        net.mtu()
                    );
                }
                mtu
            }
            None => Mtu::from_bytes(net.checked_path_mtu()?).unwrap_or(Mtu::Mtu1024),
        };
        let line_rate = parse_rate_bps(&opts.rate).map_err(|e| anyhow::anyhow!("--rate: {e}"))?;
        let kind = opts.cc;
        let config = EngineConfig {
            mac: net.mac(),
            ip,
            line_rate_bps: line_rate,
            cc: Some(Arc::new(move || cc::build(kind, line_rate))),
            ..EngineConfig::default()
        };
        let io = net
            .open_io(opts.backend, path_mtu.bytes())
            .with_context(|| format!("{} backend on {}", opts.backend, opts.iface))?;
        let backend = io.name();
        let device = Device::new(config);
        let runtime = Runtime::start(
            device.clone(),
            io,
            RuntimeConfig {
                busy_poll: opts.busy_poll,
                ..RuntimeConfig::default()
            },
        );
        // `xroce stats --iface` in another process shows our counters.
        let _stats = StatsExporter::start(device.clone(), &opts.iface);
        Ok(Stack {
            device,
            path_mtu,
            backend,
            ip,
            _stats,
            runtime,
            net,
        })
    }

    pub fn mac(&self) -> [u8; 6] {
        self.net.mac()
    }

    /// Our RoCEv2 GID (IPv4-mapped).
    pub fn gid(&self) -> Gid {
        Gid::from(self.ip)
    }

    /// MAC to reach `peer` on this link (ARP/NDP).
    pub fn neighbour(&self, peer: IpAddr) -> anyhow::Result<[u8; 6]> {
        Ok(self.net.neighbour_mac(peer, Duration::from_secs(3))?)
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
