//! xroce's stack on one interface: the interface ([`NetDevice`]), the
//! engine behind a verbs [`Device`] with its congestion control, a
//! packet-I/O backend sized for the path MTU, the [`Runtime`] thread that
//! joins them, and the counters exported for `xroce stats`. The CLI's
//! tools and the drop-in libibverbs both open their devices here.
//!
//! With [`StackConfig::io_threads`] > 1 (opt-in: the CLI's `--io-threads`,
//! the library's `XROCE_IO_THREADS`) the stack runs a
//! [`ShardedDevice`]: one engine and I/O thread per shard, QPN block
//! `base + i`, on AF_XDP the RX queues `q % N == i`. [`Stack::device`] is
//! then a spreading handle ([`Device::spreading`]): new QPs go to the
//! least-loaded shard, PDs, MRs and CQs serve every shard.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
    time::Duration,
};

use crate::{
    cc::{self, CcKind},
    device::{
        AfXdpHold, Attachment, BackendKind, NetDevice, NetDeviceConfig, NetDeviceError, QpnBlock,
    },
    engine::EngineConfig,
    io::wire::Gid,
    io::{shared::WireAndLocal, PacketIo},
    runtime::{
        shards::{ShardedConfig, ShardedDevice},
        Runtime, RuntimeConfig,
    },
    stats_export::StatsExporter,
    verbs::{Device, Mtu},
    xdp,
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
    /// How long the I/O thread keeps polling after the last frame before
    /// it sleeps ([`RuntimeConfig::spin_after_activity`]): shorter costs
    /// latency, longer costs CPU while a stream waits for ACKs.
    pub spin_after_activity: std::time::Duration,
    /// How long the I/O thread naps in the spin window while frames
    /// stream in ([`RuntimeConfig::stream_nap`]); zero: it yields.
    pub stream_nap: std::time::Duration,
    /// I/O threads (engines, shards) to spread the QPs over; 1 (the
    /// default): one engine and one thread, as always. More needs xroce's
    /// XDP program (attached here, so root) and, on AF_XDP, as many RX
    /// queues; the device then takes the interface's AF_XDP sockets to
    /// itself.
    pub io_threads: usize,
    /// Selective repeat for every RC QP (the engine's
    /// [`crate::engine::SrMode`]): Auto (the default) agrees with each
    /// xroce peer in band and stays go-back-N with any other.
    pub selective_repeat: crate::engine::SrMode,
    /// Application threads whose CQ poll finds nothing run the transport
    /// themselves ([`RuntimeConfig::app_progress`]); on by default.
    pub app_progress: bool,
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
            spin_after_activity: RuntimeConfig::default().spin_after_activity,
            stream_nap: RuntimeConfig::default().stream_nap,
            io_threads: 1,
            selective_repeat: crate::engine::SrMode::Auto,
            app_progress: true,
        }
    }

    /// The path MTU to run on an interface of MTU `if_mtu`: the asked one
    /// (an error if it does not fit), else the largest that fits.
    fn choose_path_mtu(&self, if_mtu: u32) -> Result<Mtu, StackError> {
        let fits = crate::device::checked_path_mtu_for(&self.iface, if_mtu)?;
        match self.path_mtu {
            Some(m) if m.bytes() > fits => Err(StackError::MtuTooLarge {
                iface: self.iface.clone(),
                want: m.bytes(),
                if_mtu,
                fits,
            }),
            Some(m) => Ok(m),
            None => Ok(Mtu::from_bytes(fits).unwrap_or(Mtu::Mtu1024)),
        }
    }

    /// Makes each QP's congestion controller (`cc` at the line rate).
    fn cc_factory(&self) -> crate::engine::CcFactory {
        let (kind, rate) = (self.cc, self.line_rate_bps);
        Arc::new(move || cc::build(kind, rate))
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
    /// With several I/O threads, a spreading handle over the shards.
    pub device: Device,
    /// The largest path MTU this side runs (connections may agree on less).
    pub path_mtu: Mtu,
    pub backend: &'static str,
    pub ip: Ipv4Addr,
    // Drop order: the exporter and the runtime stop before the interface
    // is released.
    _stats: StatsExporter,
    io: StackIo,
}

/// What runs the engines.
enum StackIo {
    One {
        runtime: Runtime,
        net: NetDevice,
        afxdp: Option<AfXdpHold>,
        block: QpnBlock,
    },
    /// `io_threads` > 1; it leaves the device when dropped.
    Sharded(ShardedDevice),
}

impl Stack {
    pub fn open(cfg: &StackConfig) -> Result<Stack, StackError> {
        if cfg.io_threads > 1 {
            return Self::open_sharded(cfg);
        }
        let iface = cfg.iface.as_str();
        let ifindex =
            xdp::if_index(iface).map_err(|_| NetDeviceError::NoSuchInterface(iface.into()))?;
        // A block whose UDP port another process bound is skipped.
        let block = QpnBlock::claim_run(ifindex, 1, crate::device::udp_port_free(iface, ifindex))
            .map_err(NetDeviceError::from)?
            .remove(0);
        // Frames from other hosts reach a block other than 0 only through
        // the XDP program (it moves them to the block's port): attach it
        // where we may.
        let needs_xdp = block.block() != 0;
        let net = NetDevice::open(
            iface,
            NetDeviceConfig {
                attach: cfg.backend == Some(BackendKind::AfXdp) || (needs_xdp && xdp::is_root()),
                ..NetDeviceConfig::default()
            },
        )?;
        if let Attachment::Ours { .. } = net.attachment() {
            // The last process of the device detaches it, not necessarily us.
            xdp::mark_process_attached(iface).map_err(NetDeviceError::from)?;
        }
        // Unprivileged, an attached program goes unrecognised (None): only
        // an interface without any program deserves the warning.
        if needs_xdp && *net.attachment() == Attachment::None && !xdp::runs_a_program(iface) {
            eprintln!(
                "xroce: {iface}: another process uses this device, and without xroce's XDP \
                 program frames from other hosts reach only that one; `sudo xroce attach \
                 --iface {iface}` once lets every process of the device talk to other hosts"
            );
        }
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
        let path_mtu = cfg.choose_path_mtu(net.mtu())?;
        let engine = EngineConfig {
            mac: net.mac(),
            ip,
            ipv6: net.ipv6().to_vec(),
            line_rate_bps: cfg.line_rate_bps,
            cc: Some(cfg.cc_factory()),
            qpn_block: block.block(),
            qpn_offset: crate::device::random_qpn_offset(),
            selective_repeat: cfg.selective_repeat,
            ..EngineConfig::default()
        };
        let backend_err = |source| StackError::Backend {
            backend,
            iface: iface.into(),
            source,
        };
        let mtu = path_mtu.bytes();
        let afxdp = match backend {
            BackendKind::AfXdp => block.claim_afxdp().map_err(|e| {
                backend_err(NetDeviceError::Io(crate::io::IoError::Setup {
                    what: "claim the device's AF_XDP sockets".into(),
                    source: Some(e),
                }))
            })?,
            BackendKind::Udp => None,
        };
        // A process that asked for AF_XDP while another owns the sockets
        // runs over UDP, as the UDP backend's processes do (see io::shared).
        let io: Box<dyn PacketIo> = match (backend, &afxdp) {
            (BackendKind::AfXdp, Some(_)) => {
                let wire = net.open_io(backend, mtu).map_err(backend_err)?;
                xdp::set_xsk_block(iface, block.block())
                    .map_err(|e| backend_err(NetDeviceError::from(e)))?;
                let local = net
                    .open_udp(mtu, Some(block.block()))
                    .map_err(backend_err)?;
                Box::new(WireAndLocal::new(wire, local, net.mac()))
            }
            _ => Box::new(
                net.open_udp(mtu, Some(block.block()))
                    .map_err(backend_err)?,
            ),
        };
        // What we send never passes the XDP program: a running `xroce
        // capture` gets copies from us (capture_tap).
        let io: Box<dyn PacketIo> = Box::new(crate::capture_tap::Tapped::new(io, ifindex));
        let backend = io.name();
        let device = Device::new(engine);
        let runtime = Runtime::start(
            device.clone(),
            io,
            RuntimeConfig {
                busy_poll: cfg.busy_poll,
                spin_after_activity: cfg.spin_after_activity,
                app_progress: cfg.app_progress,
                stream_nap: cfg.stream_nap,
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
            io: StackIo::One {
                runtime,
                net,
                afxdp,
                block,
            },
        })
    }

    /// `io_threads` > 1: a [`ShardedDevice`] (AF_XDP unless UDP is asked
    /// for), its shards one group behind a spreading handle.
    fn open_sharded(cfg: &StackConfig) -> Result<Stack, StackError> {
        let iface = cfg.iface.as_str();
        let path_mtu = cfg.choose_path_mtu(crate::device::interface_mtu(iface)?)?;
        let backend = cfg.backend.unwrap_or(BackendKind::AfXdp);
        let sharded = ShardedDevice::open(
            iface,
            ShardedConfig {
                shards: cfg.io_threads,
                backend,
                engine: EngineConfig {
                    // Kept if the interface has it (ShardedDevice checks).
                    ip: cfg.local_ip.unwrap_or(Ipv4Addr::UNSPECIFIED),
                    line_rate_bps: cfg.line_rate_bps,
                    cc: Some(cfg.cc_factory()),
                    selective_repeat: cfg.selective_repeat,
                    ..EngineConfig::default()
                },
                path_mtu: path_mtu.bytes(),
                runtime: RuntimeConfig {
                    busy_poll: cfg.busy_poll,
                    spin_after_activity: cfg.spin_after_activity,
                    app_progress: cfg.app_progress,
                    stream_nap: cfg.stream_nap,
                    ..RuntimeConfig::default()
                },
            },
        )
        .map_err(|source| StackError::Backend {
            backend,
            iface: iface.into(),
            source,
        })?;
        let ip = sharded.devices[0].lock().config().ip;
        if let Some(want) = cfg.local_ip.filter(|w| *w != ip) {
            return Err(StackError::NotOurAddress {
                ip: want,
                iface: iface.into(),
            });
        }
        let device = sharded.spreading();
        let stats = StatsExporter::start(device.clone(), iface);
        Ok(Stack {
            device,
            path_mtu,
            backend: sharded.backend,
            ip,
            _stats: stats,
            io: StackIo::Sharded(sharded),
        })
    }

    /// The QPN block this process holds on the device (with several I/O
    /// threads, the first of its blocks).
    pub fn qpn_block(&self) -> u32 {
        match &self.io {
            StackIo::One { block, .. } => block.block(),
            StackIo::Sharded(s) => s.base_block,
        }
    }

    /// I/O threads (shards) the device runs on.
    pub fn io_threads(&self) -> usize {
        match &self.io {
            StackIo::One { .. } => 1,
            StackIo::Sharded(s) => s.devices.len(),
        }
    }

    /// The shards' devices in order (one without sharding): the engine a
    /// QP lives in is `QueuePair::device`.
    pub fn shards(&self) -> Vec<Device> {
        self.device.members()
    }

    /// The interface.
    pub fn net(&self) -> &NetDevice {
        match &self.io {
            StackIo::One { net, .. } => net,
            StackIo::Sharded(s) => s.net(),
        }
    }

    pub fn mac(&self) -> [u8; 6] {
        self.net().mac()
    }

    /// Our RoCEv2 GID (IPv4-mapped).
    pub fn gid(&self) -> Gid {
        Gid::from(self.ip)
    }

    /// MAC to reach `peer` on this link (ARP/NDP); our own for any of our
    /// own addresses, the GIDs' IPv6 ones included (loopback: nobody
    /// answers NDP for them, and UCX connects a process to its own GID).
    pub fn neighbour(&self, peer: IpAddr, timeout: Duration) -> Result<[u8; 6], NetDeviceError> {
        let own = match peer {
            IpAddr::V4(a) => a == self.ip,
            IpAddr::V6(a) => {
                a == crate::device::link_local_gid(self.mac()) || self.net().ipv6().contains(&a)
            }
        };
        if own {
            return Ok(self.net().mac());
        }
        self.net().neighbour_mac(peer, timeout)
    }

    /// Is the I/O thread (every one of them) still running (it stops on
    /// an I/O error)?
    pub fn is_running(&self) -> bool {
        match &self.io {
            StackIo::One { runtime, .. } => runtime.is_running(),
            StackIo::Sharded(s) => s.is_running(),
        }
    }
}

impl Drop for Stack {
    /// The XDP program a process attached stays while other processes use
    /// the device; the last one to leave detaches it.
    fn drop(&mut self) {
        // Leave the device first (sockets closed, block and AF_XDP hold
        // given back), then look for others: of two processes leaving at
        // once, both may detach (the second finds nothing to detach), but
        // neither leaves the program behind for the other.
        let StackIo::One {
            runtime,
            net,
            afxdp,
            block,
        } = &mut self.io
        else {
            // ShardedDevice follows the same rule when it drops.
            return;
        };
        runtime.halt();
        *afxdp = None;
        block.release();
        let process_attached = match net.attachment() {
            Attachment::Ours { .. } => true,
            Attachment::Existing => xdp::is_process_attached(net.name()),
            Attachment::None => false,
        };
        if process_attached {
            net.set_detach_on_drop(block.others().is_empty());
        }
    }
}
