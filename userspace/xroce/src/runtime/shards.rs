//! One device over several I/O threads (opt-in; the default is one
//! [`Runtime`]): shard `i` is a verbs [`Device`] of its own, whose engine
//! holds QPN block `base + i`, driven by a runtime thread of its own with a
//! backend of its own (for AF_XDP: the sockets of the RX queues `q` with
//! `q % shards == i`, sending on the first of them). An application spreads
//! its QPs by creating them on the shards in turn; a QP's number says its
//! shard ([`shard_of_qpn`]).
//!
//! Where frames land: the XDP program redirects a frame for any of the
//! device's blocks to the AF_XDP socket of the queue it arrived on
//! ([`steer_blocks`] tells it the range). On a veth the receiving queue is
//! the queue the sender transmitted on, so a frame can reach the socket of
//! a shard that does not own its QP; that shard hands it over, copied, to
//! the owner's inbox, whose eventfd wakes the owner's thread. What is
//! handed over is the datagram the backend parsed and checked, with its
//! arrival time ([`RxDatagram::arrived_ns`]), so the owner's engine sees it
//! as if its own socket had received it. Between two
//! xroce peers whose QPs are paired shard by shard (each side creates its
//! QPs on the shards in the same order) nothing is handed over. Frames
//! between two shards of this device (own MAC) go through the inboxes too.
//!
//! Nothing here changes the frames on the wire.

use std::{
    collections::VecDeque,
    os::fd::{AsFd, AsRawFd},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use nix::sys::eventfd::{EfdFlags, EventFd};

use xroce_common::qpn_block;

use super::{dest_block, Runtime, RuntimeConfig};
use crate::{
    io::{
        afxdp::{rx_queue_count, XskConfig, XskMultiQueue},
        IoError, IoStats, PacketIo, Received, RxDatagram, Transmit,
    },
    verbs::Device,
};
use xroce_transport::engine::frame;
use xroce_wire::{eth, ipv4, ipv6, udp, IpRepr};

/// Frames one inbox holds at most; more are dropped (and retransmitted by
/// the transport), so a stalled shard cannot grow its siblings' memory.
const INBOX_LIMIT: usize = 4096;

/// The shard of QP `qpn` on a device whose shards hold blocks
/// `base_block .. base_block + shards`; `None` if it is not this device's.
pub fn shard_of_qpn(qpn: u32, base_block: u32, shards: usize) -> Option<usize> {
    let i = qpn_block::of_qpn(qpn).wrapping_sub(base_block) as usize;
    (i < shards).then_some(i)
}

/// Counters of the handoffs between shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandoffStats {
    /// Frames one shard received (or sent to its own MAC) for another.
    pub handed: u64,
    /// Of those, dropped because the owner's inbox was full.
    pub dropped: u64,
}

/// A datagram one shard received (or sent to its own MAC) for a QP of
/// another, copied out of the backend's buffer. Its ICRC was checked when
/// it was received (one sent to our own MAC never left the host).
struct Handed {
    ip: IpRepr,
    udp_src_port: u16,
    arrived_ns: Option<u64>,
    /// BTH .. ICRC.
    udp_payload: Vec<u8>,
}

impl Handed {
    fn datagram(&self) -> RxDatagram<'_> {
        RxDatagram {
            ip: self.ip,
            udp_src_port: self.udp_src_port,
            udp_payload: &self.udp_payload,
            arrived_ns: self.arrived_ns,
        }
    }

    /// It as an Ethernet frame to and from `mac` in `buf` (its headers
    /// and ICRC written anew), for a caller that takes frames.
    fn frame<'a>(&self, mac: [u8; 6], buf: &'a mut Vec<u8>) -> &'a [u8] {
        let mut t = Transmit {
            src_mac: mac,
            dst_mac: mac,
            ip: self.ip,
            udp_src_port: self.udp_src_port,
            payload_at: 0,
            len: self.udp_payload.len(),
        };
        let (eth, _) = t.frame_headers();
        t.payload_at = xroce_wire::headers_len(&eth, &self.ip);
        buf.clear();
        buf.resize(t.payload_at, 0);
        buf.extend_from_slice(&self.udp_payload);
        let len = frame::complete_frame(&t, buf);
        &buf[..len]
    }
}

struct Inbox {
    datagrams: Mutex<VecDeque<Handed>>,
    /// Payload buffers of datagrams the owner has taken, for the next
    /// handoffs.
    spare: Mutex<Vec<Vec<u8>>>,
    /// Readable while datagrams wait (written when the queue turns
    /// non-empty).
    bell: EventFd,
}

/// The inboxes of every shard of one device.
struct Hub {
    inboxes: Vec<Inbox>,
    base_block: u32,
    handed: AtomicU64,
    dropped: AtomicU64,
}

impl Hub {
    fn new(shards: usize, base_block: u32) -> Result<Self, IoError> {
        let inboxes = (0..shards)
            .map(|_| {
                Ok(Inbox {
                    datagrams: Mutex::new(VecDeque::new()),
                    spare: Mutex::new(Vec::new()),
                    bell: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                        .map_err(std::io::Error::from)?,
                })
            })
            .collect::<Result<_, IoError>>()?;
        Ok(Self {
            inboxes,
            base_block,
            handed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    /// The shard a frame's destination QP belongs to, if one of ours.
    fn shard_of(&self, frame: &[u8]) -> Option<usize> {
        let udp_payload = match frame.get(12..14)? {
            [0x08, 0x00] => eth::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN,
            [0x86, 0xdd] => eth::HEADER_LEN + ipv6::HEADER_LEN + udp::HEADER_LEN,
            _ => return None,
        };
        self.shard_of_datagram(frame.get(udp_payload..)?)
    }

    /// The shard the destination QP of a datagram (its UDP payload)
    /// belongs to, if one of ours.
    fn shard_of_datagram(&self, udp_payload: &[u8]) -> Option<usize> {
        let block = dest_block(udp_payload)?;
        let i = block.wrapping_sub(self.base_block) as usize;
        (i < self.inboxes.len()).then_some(i)
    }

    /// Queues a copy of `d` (its arrival time with it) for shard `to` and
    /// wakes it.
    fn hand(&self, to: usize, d: &RxDatagram<'_>) {
        self.handed.fetch_add(1, Ordering::Relaxed);
        let inbox = &self.inboxes[to];
        let was_empty = {
            let mut q = inbox.datagrams.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() >= INBOX_LIMIT {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let mut buf = inbox
                .spare
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
                .unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(d.udp_payload);
            q.push_back(Handed {
                ip: d.ip,
                udp_src_port: d.udp_src_port,
                arrived_ns: d.arrived_ns,
                udp_payload: buf,
            });
            q.len() == 1
        };
        if was_empty {
            // EAGAIN: the counter is full, so it is rung already.
            let _ = inbox.bell.write(1);
        }
    }

    /// Feeds what waits in shard `me`'s inbox to `on_handed`; `taken` is
    /// the caller's scratch queue (kept empty between calls).
    fn drain(
        &self,
        me: usize,
        taken: &mut VecDeque<Handed>,
        on_handed: &mut dyn FnMut(&Handed),
    ) -> usize {
        let inbox = &self.inboxes[me];
        // Reset the bell before taking the datagrams: one queued after
        // the take rings it again, so none waits unnoticed.
        let _ = inbox.bell.read();
        std::mem::swap(
            taken,
            &mut *inbox.datagrams.lock().unwrap_or_else(|e| e.into_inner()),
        );
        let n = taken.len();
        if n == 0 {
            return 0;
        }
        for h in taken.iter() {
            on_handed(h);
        }
        let mut spare = inbox.spare.lock().unwrap_or_else(|e| e.into_inner());
        let room = INBOX_LIMIT.saturating_sub(spare.len());
        spare.extend(taken.drain(..).take(room).map(|h| h.udp_payload));
        taken.clear();
        n
    }

    fn stats(&self) -> HandoffStats {
        HandoffStats {
            handed: self.handed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

/// One shard's backend: its own sockets, plus the datagrams its siblings
/// hand it; datagrams for the siblings' QPs go to them.
struct ShardIo {
    inner: Box<dyn PacketIo>,
    me: usize,
    hub: Arc<Hub>,
    own_mac: [u8; 6],
    /// Datagrams taken from the inbox in one round (its allocation reused).
    taken: VecDeque<Handed>,
    /// A handed datagram made a frame again, for `recv_batch`.
    frame_buf: Vec<u8>,
}

impl PacketIo for ShardIo {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }

    /// What the runtime calls: the backend's datagrams, with their
    /// arrival times, those for a sibling's QPs handed to it as they are.
    fn recv_datagrams(
        &mut self,
        timeout: Duration,
        on_datagram: &mut dyn FnMut(Received<'_>),
    ) -> Result<usize, IoError> {
        let (hub, me) = (&*self.hub, self.me);
        let mut n = hub.drain(me, &mut self.taken, &mut |h| on_datagram(Ok(h.datagram())));
        let wait = if n > 0 { Duration::ZERO } else { timeout };
        n += self.inner.recv_datagrams(wait, &mut |r| match r {
            Ok(d) => match hub.shard_of_datagram(d.udp_payload) {
                Some(to) if to != me => hub.hand(to, &d),
                _ => on_datagram(Ok(d)),
            },
            Err(rejected) => on_datagram(Err(rejected)),
        })?;
        Ok(n)
    }

    /// Whole frames (for tools and tests; the runtime takes datagrams): a
    /// frame for a sibling goes to it checked, one handed to us comes out
    /// as a frame again.
    fn recv_batch(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, IoError> {
        let (hub, me, mac, buf) = (&*self.hub, self.me, self.own_mac, &mut self.frame_buf);
        let mut n = hub.drain(me, &mut self.taken, &mut |h| on_frame(h.frame(mac, buf)));
        let wait = if n > 0 { Duration::ZERO } else { timeout };
        n += self
            .inner
            .recv_batch(wait, &mut |f| match hub.shard_of(f) {
                Some(to) if to != me => match frame::datagram_of(f) {
                    Ok(d) => hub.hand(to, &d),
                    // Ours to count as rejected.
                    Err(_) => on_frame(f),
                },
                _ => on_frame(f),
            })?;
        Ok(n)
    }

    fn transmit(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<usize, IoError> {
        let (hub, me, mac) = (&*self.hub, self.me, self.own_mac);
        self.inner.transmit(&mut |buf| loop {
            let len = fill(buf)?;
            if len == 0 || buf.get(..6) != Some(&mac[..]) {
                return Some(len);
            }
            // To our own MAC: a QP of a sibling shard (the runtime keeps
            // those of its own shard); another process's otherwise. It
            // never leaves the host: the sibling takes it as it is.
            let frame = &buf[..len];
            match hub.shard_of(frame).zip(frame::transmit_of(frame)) {
                Some((to, t)) if to != me => hub.hand(to, &t.looped_back(frame)),
                _ => return Some(len),
            }
        })
    }

    fn oversize_hint(&self) -> &'static str {
        self.inner.oversize_hint()
    }

    fn wait_writable(&mut self, timeout: Duration) -> Result<bool, IoError> {
        self.inner.wait_writable(timeout)
    }

    fn stats(&mut self) -> IoStats {
        self.inner.stats()
    }

    fn poll_fds(&self) -> Vec<i32> {
        let mut fds = self.inner.poll_fds();
        if fds.is_empty() {
            // The runtime then waits in recv_batch (bounded by its
            // max_wait), which an inbox cannot interrupt.
            return fds;
        }
        fds.push(self.hub.inboxes[self.me].bell.as_fd().as_raw_fd());
        fds
    }

    fn rx_pressure(&self) -> bool {
        self.inner.rx_pressure()
    }
}

/// The I/O threads of one sharded device, one per shard. Stops them on
/// drop (or [`stop`](Self::stop)).
pub struct ShardedRuntime {
    runtimes: Vec<Runtime>,
    hub: Arc<Hub>,
}

impl ShardedRuntime {
    /// Starts one runtime per `(device, backend)` shard; shard `i`'s engine
    /// must hold QPN block `base_block + i` (see [`shard_configs`]) and
    /// `own_mac` is the interface's MAC. The backends need poll
    /// descriptors ([`PacketIo::poll_fds`]): a handed-over frame wakes its
    /// thread through one.
    pub fn start(
        shards: Vec<(Device, Box<dyn PacketIo>)>,
        base_block: u32,
        own_mac: [u8; 6],
        config: RuntimeConfig,
    ) -> Result<Self, IoError> {
        if shards.is_empty() {
            return Err(IoError::Setup {
                what: "a sharded runtime needs at least one shard".into(),
                source: None,
            });
        }
        let hub = Arc::new(Hub::new(shards.len(), base_block)?);
        let runtimes = shards
            .into_iter()
            .enumerate()
            .map(|(me, (device, inner))| {
                let io = ShardIo {
                    inner,
                    me,
                    hub: hub.clone(),
                    own_mac,
                    taken: VecDeque::new(),
                    frame_buf: Vec::new(),
                };
                Runtime::start(device, Box::new(io), config)
            })
            .collect();
        Ok(Self { runtimes, hub })
    }

    pub fn shards(&self) -> usize {
        self.runtimes.len()
    }

    /// True while every shard's thread runs.
    pub fn is_running(&self) -> bool {
        self.runtimes.iter().all(Runtime::is_running)
    }

    pub fn handoff_stats(&self) -> HandoffStats {
        self.hub.stats()
    }

    /// Stops every thread; each shard's final backend counters, or the
    /// first I/O error that stopped one.
    pub fn stop(self) -> Result<Vec<IoStats>, IoError> {
        self.runtimes.into_iter().map(Runtime::stop).collect()
    }
}

/// Engine configurations for `shards` shards: `base` with QPN block
/// `base_block + i` for shard `i`.
pub fn shard_configs(
    base: &crate::engine::EngineConfig,
    base_block: u32,
    shards: usize,
) -> Vec<crate::engine::EngineConfig> {
    (0..shards)
        .map(|i| crate::engine::EngineConfig {
            qpn_block: base_block + i as u32,
            ..base.clone()
        })
        .collect()
}

/// AF_XDP backends for `shards` shards of `iface`: shard `i` gets the
/// sockets of the RX queues `q` with `q % shards == i` and sends on the
/// first of them. Fails if the interface has fewer queues than shards.
pub fn open_afxdp_shards(
    iface: &str,
    shards: usize,
    config: XskConfig,
) -> Result<Vec<Box<dyn PacketIo>>, IoError> {
    let queues = rx_queue_count(iface) as usize;
    if shards == 0 || queues < shards {
        return Err(IoError::Setup {
            what: format!(
                "{iface} has {queues} RX queue(s), fewer than the {shards} I/O threads asked for \
                 (a veth takes `numrxqueues`/`numtxqueues` when created; a NIC `ethtool -L`)"
            ),
            source: None,
        });
    }
    (0..shards)
        .map(|i| {
            let mine = (0..queues as u32).filter(|q| *q as usize % shards == i);
            XskMultiQueue::open_queues(iface, mine, config)
                .map(|io| Box::new(io) as Box<dyn PacketIo>)
                .map_err(|e| IoError::Xsk(Box::new(e)))
        })
        .collect()
}

/// UDP backends for `shards` shards of `net`: shard `i` binds the port of
/// QPN block `base_block + i` ([`qpn_block::udp_port`]; 4791 for block 0)
/// and sends from it. Frames from other hosts reach a shard other than
/// block 0's only through xroce's XDP program, which moves them to their
/// block's port (with no AF_XDP socket holding the blocks); without it they
/// all arrive on 4791 and shard 0 hands them over.
pub fn open_udp_shards(
    net: &crate::device::NetDevice,
    shards: usize,
    base_block: u32,
    path_mtu: u32,
) -> Result<Vec<Box<dyn PacketIo>>, crate::device::NetDeviceError> {
    (0..shards)
        .map(|i| {
            net.open_udp(path_mtu, Some(base_block + i as u32))
                .map(|io| Box::new(io) as Box<dyn PacketIo>)
        })
        .collect()
}

/// Tells `iface`'s XDP program that blocks `base_block .. base_block +
/// shards` all belong to the AF_XDP sockets (1 shard: what one process
/// alone sets).
pub fn steer_blocks(
    iface: &str,
    base_block: u32,
    shards: usize,
) -> Result<(), crate::xdp::XdpError> {
    crate::xdp::set_xsk_block(iface, base_block)?;
    let map = crate::xdp::open_map(iface, xroce_common::names::CONFIG)?;
    let mut config = aya::maps::Array::<aya::maps::MapData, u32>::try_from(aya::maps::Map::Array(
        map,
    ))
    .map_err(|e| crate::xdp::XdpError::Bpf {
        what: "config map".into(),
        source: Box::new(e),
    })?;
    config
        .set(qpn_block::CONFIG_XSK_BLOCKS, shards as u32, 0)
        .map_err(|e| crate::xdp::XdpError::Bpf {
            what: "write XDP config".into(),
            source: Box::new(e),
        })
}

/// How to open a [`ShardedDevice`].
#[derive(Clone)]
pub struct ShardedConfig {
    /// I/O threads (shards), at least 1.
    pub shards: usize,
    pub backend: crate::device::BackendKind,
    /// The engines' settings; the MAC, IP and IPv6 addresses come from the
    /// interface, the QPN blocks from the claim.
    pub engine: crate::engine::EngineConfig,
    /// Largest RoCE path MTU the backends carry (bytes).
    pub path_mtu: u32,
    pub runtime: RuntimeConfig,
}

/// One interface opened for RDMA over several I/O threads: what a
/// [`crate::stack::Stack`] does with one, for `shards` of them (and what
/// a `Stack` opened with `io_threads > 1` runs on). The shards' devices
/// are one [`Device::group`]: PDs, MRs and CQs made on any serve all. It attaches
/// xroce's XDP program if needed (both backends rely on its steering) and
/// claims `shards` consecutive QPN blocks (and, for AF_XDP, the device's
/// sockets). Other processes of this host may share the device as with a
/// `Stack`: with AF_XDP each shard also has a UDP socket on its block's
/// port ([`crate::io::shared::WireAndLocal`]) for their frames; frames a
/// shard sends to a sibling's QP go through the inboxes, to another
/// process's through that socket.
pub struct ShardedDevice {
    /// Shard `i`'s device: create QPs on them in turn to spread them.
    pub devices: Vec<Device>,
    /// QPN block of shard 0 (shard `i` holds `base_block + i`).
    pub base_block: u32,
    pub backend: &'static str,
    // Drop order: the threads stop before the holds and the interface go.
    runtime: Option<ShardedRuntime>,
    afxdp: Option<crate::device::AfXdpHold>,
    blocks: Vec<crate::device::QpnBlock>,
    net: crate::device::NetDevice,
}

impl ShardedDevice {
    pub fn open(iface: &str, cfg: ShardedConfig) -> Result<Self, crate::device::NetDeviceError> {
        use crate::device::{
            Attachment, BackendKind, NetDevice, NetDeviceConfig, NetDeviceError, QpnBlock,
        };
        let setup = |what: String| NetDeviceError::Io(IoError::Setup { what, source: None });
        if cfg.shards == 0 {
            return Err(setup(
                "a sharded device needs at least one I/O thread".into(),
            ));
        }
        let ifindex = crate::xdp::if_index(iface)
            .map_err(|_| NetDeviceError::NoSuchInterface(iface.into()))?;
        let blocks = QpnBlock::claim_run(
            ifindex,
            cfg.shards as u32,
            crate::device::udp_port_free(iface, ifindex),
        )?;
        let base_block = blocks[0].block();
        let net = NetDevice::open(iface, NetDeviceConfig::default())?;
        if let Attachment::Ours { .. } = net.attachment() {
            // The last process of the device detaches it (see Stack).
            crate::xdp::mark_process_attached(iface)?;
        }
        // The engine's address if the interface has it, else its first.
        let ip = match net.ipv4().contains(&cfg.engine.ip) {
            true => cfg.engine.ip,
            false => *net
                .ipv4()
                .first()
                .ok_or_else(|| NetDeviceError::NoAddress(iface.into()))?,
        };
        let engine = crate::engine::EngineConfig {
            mac: net.mac(),
            ip,
            ipv6: net.ipv6().to_vec(),
            qpn_offset: crate::device::random_qpn_offset(),
            ..cfg.engine.clone()
        };
        let (ios, afxdp) = match cfg.backend {
            BackendKind::AfXdp => {
                let hold = blocks[0]
                    .claim_afxdp()
                    .map_err(|e| {
                        NetDeviceError::Io(IoError::Setup {
                            what: "claim the device's AF_XDP sockets".into(),
                            source: Some(e),
                        })
                    })?
                    .ok_or_else(|| {
                        setup(format!("another process owns {iface}'s AF_XDP sockets"))
                    })?;
                steer_blocks(iface, base_block, cfg.shards)?;
                let mut xsk = XskConfig::default();
                // As NetDevice::open_io sizes it: the largest frame of the path MTU.
                let frame = cfg.path_mtu as usize
                    + 14
                    + 4
                    + 20
                    + crate::device::ROCE_HEADER_ALLOWANCE as usize;
                if frame > xsk.chunk_capacity() {
                    xsk.multi_buffer = true;
                    xsk.multi_buffer_max_frame = xsk.multi_buffer_max_frame.max(frame);
                }
                // Each shard also takes its block's UDP port, as Stack's
                // AF_XDP owner does (io::shared): the other processes of
                // this host reach its QPs there, and it theirs.
                let ios = open_afxdp_shards(iface, cfg.shards, xsk)?
                    .into_iter()
                    .enumerate()
                    .map(|(i, wire)| {
                        let local = net.open_udp(cfg.path_mtu, Some(base_block + i as u32))?;
                        Ok(
                            Box::new(crate::io::shared::WireAndLocal::new(wire, local, net.mac()))
                                as Box<dyn PacketIo>,
                        )
                    })
                    .collect::<Result<Vec<_>, NetDeviceError>>()?;
                (ios, Some(hold))
            }
            BackendKind::Udp => (
                open_udp_shards(&net, cfg.shards, base_block, cfg.path_mtu)?,
                None,
            ),
        };
        // Each shard copies what it sends to a running `xroce capture`
        // (capture_tap); frames it hands to a sibling shard stay in the
        // process and are not copied.
        let ios: Vec<Box<dyn PacketIo>> = ios
            .into_iter()
            .map(|io| Box::new(crate::capture_tap::Tapped::new(io, ifindex)) as Box<dyn PacketIo>)
            .collect();
        let backend = ios[0].name();
        // One group: MRs, PDs and CQs shared by the shards (verbs::device).
        let devices = Device::group(shard_configs(&engine, base_block, cfg.shards));
        let runtime = ShardedRuntime::start(
            devices.iter().cloned().zip(ios).collect(),
            base_block,
            net.mac(),
            cfg.runtime,
        )?;
        Ok(Self {
            devices,
            base_block,
            backend,
            runtime: Some(runtime),
            afxdp,
            blocks,
            net,
        })
    }

    /// The interface.
    pub fn net(&self) -> &crate::device::NetDevice {
        &self.net
    }

    /// A handle that spreads new QPs over the shards (the least-loaded
    /// first); PDs, MRs and CQs made on it serve every shard.
    pub fn spreading(&self) -> Device {
        self.devices[0].spreading()
    }

    /// The shard of QP `qpn` (one of ours), see [`shard_of_qpn`].
    pub fn shard_of(&self, qpn: u32) -> Option<usize> {
        shard_of_qpn(qpn, self.base_block, self.devices.len())
    }

    /// True while every shard's thread runs.
    pub fn is_running(&self) -> bool {
        self.runtime
            .as_ref()
            .is_some_and(ShardedRuntime::is_running)
    }

    pub fn handoff_stats(&self) -> HandoffStats {
        self.runtime
            .as_ref()
            .map(ShardedRuntime::handoff_stats)
            .unwrap_or_default()
    }

    /// Stops the threads (each shard's final backend counters, or the
    /// first I/O error) and leaves the device.
    pub fn stop(mut self) -> Result<Vec<IoStats>, IoError> {
        self.leave()
    }

    fn leave(&mut self) -> Result<Vec<IoStats>, IoError> {
        let Some(rt) = self.runtime.take() else {
            return Ok(Vec::new());
        };
        let stats = rt.stop();
        if self.afxdp.take().is_some() {
            // Back to one block for whoever owns the sockets next.
            let _ = steer_blocks(self.net.name(), self.base_block, 1);
        }
        for b in &mut self.blocks {
            b.release();
        }
        let process_attached = match self.net.attachment() {
            crate::device::Attachment::Ours { .. } => true,
            crate::device::Attachment::Existing => crate::xdp::is_process_attached(self.net.name()),
            crate::device::Attachment::None => false,
        };
        if process_attached {
            // Our blocks are given back, so `others` sees only other processes.
            self.net
                .set_detach_on_drop(self.blocks[0].others().is_empty());
        }
        stats
    }
}

impl Drop for ShardedDevice {
    fn drop(&mut self) {
        let _ = self.leave();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::engine::EngineConfig;
    use crate::io::channel::ChannelIo;
    use crate::verbs::{
        AccessFlags, AddressVector, CompletionQueue, MemoryRegion, Mtu, QpAttr, QpInitAttr,
        QueuePair, RemoteQp, SendWr, Wc, WcStatus, WrOpcode,
    };

    const MSG: usize = 16 * 1024;
    const MSGS: usize = 24;

    #[test]
    fn qpns_map_to_their_block_s_shard() {
        assert_eq!(shard_of_qpn(0x11, 0, 2), Some(0));
        assert_eq!(shard_of_qpn(0x01_0011, 0, 2), Some(1));
        assert_eq!(shard_of_qpn(0x02_0011, 0, 2), None);
        assert_eq!(shard_of_qpn(0x11, 1, 2), None);
        assert_eq!(shard_of_qpn(0x03_0012, 2, 2), Some(1));
    }

    /// A backend of frames that says each arrived at [`Stamped::AT`] (as
    /// AF_XDP passes on the XDP program's timestamps).
    struct Stamped(ChannelIo);

    impl Stamped {
        const AT: u64 = 123_456_789;
    }

    impl PacketIo for Stamped {
        fn name(&self) -> &'static str {
            "stamped"
        }
        fn max_frame_len(&self) -> usize {
            self.0.max_frame_len()
        }
        fn recv_batch(
            &mut self,
            timeout: Duration,
            on_frame: &mut dyn FnMut(&[u8]),
        ) -> Result<usize, IoError> {
            self.0.recv_batch(timeout, on_frame)
        }
        fn recv_datagrams(
            &mut self,
            timeout: Duration,
            on_datagram: &mut dyn FnMut(Received<'_>),
        ) -> Result<usize, IoError> {
            self.0.recv_batch(timeout, &mut |f| {
                on_datagram(frame::datagram_of(f).map(|d| RxDatagram {
                    arrived_ns: Some(Self::AT),
                    ..d
                }))
            })
        }
        fn transmit(
            &mut self,
            fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        ) -> Result<usize, IoError> {
            self.0.transmit(fill)
        }
        fn wait_writable(&mut self, timeout: Duration) -> Result<bool, IoError> {
            self.0.wait_writable(timeout)
        }
        fn stats(&mut self) -> IoStats {
            self.0.stats()
        }
    }

    /// A valid RC SEND_ONLY frame to QP `qpn`.
    fn send_only(qpn: u32, payload: &[u8]) -> Vec<u8> {
        use xroce_wire::{emit_frame, BthRepr, FrameRepr, Gid, Opcode, TransportRepr};
        let bth = BthRepr::new(Opcode::RC_SEND_ONLY, qpn, 7);
        let repr = FrameRepr::new(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            Gid::from(std::net::IpAddr::from([10, 0, 0, 1])),
            Gid::from(std::net::IpAddr::from([10, 0, 0, 2])),
            0xc011,
            TransportRepr::new(bth),
        );
        let mut buf = vec![0u8; repr.frame_len(payload.len())];
        emit_frame(&repr, payload, &mut buf).unwrap();
        buf
    }

    /// A datagram that reaches the wrong shard goes to its owner with the
    /// time it arrived; one for the receiving shard stays, time and all.
    /// A caller of frames gets a handed datagram as a valid frame again.
    #[test]
    fn handed_over_datagrams_keep_their_arrival_time() {
        let hub = Arc::new(Hub::new(2, 4).unwrap());
        let mac = [2, 0, 0, 0, 0, 2];
        let shard = |me: usize, inner: Box<dyn PacketIo>| ShardIo {
            inner,
            me,
            hub: hub.clone(),
            own_mac: mac,
            taken: VecDeque::new(),
            frame_buf: Vec::new(),
        };
        let (wire, mut peer) = ChannelIo::pair(16, 9216);
        let (quiet, _quiet_peer) = ChannelIo::pair(16, 9216);
        let mut s0 = shard(0, Box::new(Stamped(wire)));
        let mut s1 = shard(1, Box::new(quiet));
        // Block 5 is shard 1's, block 4 shard 0's.
        let (theirs, ours) = (
            send_only(0x05_0011, b"theirs"),
            send_only(0x04_0011, b"ours"),
        );
        assert_eq!(peer.send_batch(&[&theirs, &ours]).unwrap(), 2);
        let mut at_s0 = Vec::new();
        let n = s0
            .recv_datagrams(Duration::from_secs(5), &mut |r| {
                let d = r.expect("a valid datagram");
                at_s0.push((dest_block(d.udp_payload), d.arrived_ns));
            })
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!(at_s0, [(Some(4), Some(Stamped::AT))]);
        assert_eq!(hub.stats().handed, 1);
        let mut at_s1 = Vec::new();
        s1.recv_datagrams(Duration::ZERO, &mut |r| {
            let d = r.expect("a valid datagram");
            let want = frame::datagram_of(&theirs).unwrap();
            assert_eq!(d.udp_payload, want.udp_payload);
            assert_eq!((d.ip, d.udp_src_port), (want.ip, want.udp_src_port));
            at_s1.push(d.arrived_ns);
        })
        .unwrap();
        assert_eq!(at_s1, [Some(Stamped::AT)]);

        // Through the frame path: handed over checked, given back whole.
        assert_eq!(peer.send_batch(&[&theirs]).unwrap(), 1);
        assert_eq!(
            s0.recv_batch(Duration::from_secs(5), &mut |_| panic!("not ours"))
                .unwrap(),
            1
        );
        let mut frames = 0;
        s1.recv_batch(Duration::ZERO, &mut |f| {
            let d = frame::datagram_of(f).expect("a frame with a valid ICRC");
            let want = frame::datagram_of(&theirs).unwrap();
            assert_eq!(d.udp_payload, want.udp_payload);
            frames += 1;
        })
        .unwrap();
        assert_eq!(frames, 1);
        assert_eq!(hub.stats().dropped, 0);
    }

    #[test]
    fn configs_hold_consecutive_blocks() {
        let c = shard_configs(&EngineConfig::default(), 3, 2);
        assert_eq!(c.iter().map(|c| c.qpn_block).collect::<Vec<_>>(), [3, 4]);
    }

    /// One side of a connection: its QP, CQ and MR (the source data for
    /// a sender, zeroes for a receiver).
    struct End {
        qp: QueuePair,
        cq: CompletionQueue,
        mr: MemoryRegion,
        cfg: EngineConfig,
    }

    fn end(dev: &Device, cfg: &EngineConfig, data: &[u8]) -> End {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(256).unwrap();
        let qp = dev.create_qp(&pd, &QpInitAttr::rc(&cq)).unwrap();
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = pd.reg_mr_with(data, all).unwrap();
        End {
            qp,
            cq,
            mr,
            cfg: cfg.clone(),
        }
    }

    fn connect(a: &End, b: &End) {
        let attr = QpAttr {
            qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            path_mtu: Mtu::Mtu4096,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            ..Default::default()
        };
        for (x, y) in [(a, b), (b, a)] {
            x.qp.connect(
                &attr,
                &RemoteQp {
                    qpn: y.qp.qp_num(),
                    psn: 0,
                    av: AddressVector {
                        dest_mac: y.cfg.mac,
                        dest_ip: y.cfg.ip.into(),
                        ..Default::default()
                    },
                },
            )
            .unwrap();
        }
    }

    fn pattern(p: usize) -> Vec<u8> {
        (0..MSG * MSGS)
            .map(|i| (i * 13 + p * 101 + i / 4093) as u8)
            .collect()
    }

    /// MSGS WRITEs on every (sender, receiver) pair at once; every
    /// completion and every byte checked.
    fn write_all(pairs: &[(End, End)]) {
        let mut posted = vec![0usize; pairs.len()];
        let mut done = vec![0usize; pairs.len()];
        let mut wc = vec![Wc::default(); 64];
        let deadline = Instant::now() + Duration::from_secs(30);
        while done.iter().any(|&d| d < MSGS) {
            let mut idle = true;
            for (p, (a, b)) in pairs.iter().enumerate() {
                while posted[p] < MSGS && posted[p] - done[p] < 8 {
                    let off = posted[p] * MSG;
                    let wr = SendWr::new(
                        posted[p] as u64,
                        WrOpcode::RdmaWrite {
                            remote_addr: b.mr.addr() + off as u64,
                            rkey: b.mr.rkey(),
                        },
                        vec![a.mr.sge(off, MSG)],
                    );
                    a.qp.post_send(&wr).unwrap();
                    posted[p] += 1;
                }
                let n = a.cq.poll(&mut wc).unwrap();
                for c in &wc[..n] {
                    assert_eq!(c.status, WcStatus::Success, "pair {p}: {c:?}");
                }
                done[p] += n;
                idle &= n == 0;
            }
            if idle {
                assert!(
                    Instant::now() < deadline,
                    "WRITEs done: {done:?} of {MSGS} each"
                );
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        for (p, (_, b)) in pairs.iter().enumerate() {
            // SAFETY: every WRITE into it has completed.
            let got = unsafe { b.mr.to_vec(0, MSG * MSGS) }.unwrap();
            assert!(got == pattern(p), "pair {p}: the data differs");
        }
    }

    /// Host `last`'s engine configuration (MAC and IPv4 end in `last`).
    fn host_cfg(last: u8) -> EngineConfig {
        EngineConfig {
            mac: [2, 0, 0, 0, 0, last],
            ip: std::net::Ipv4Addr::new(10, 0, 0, last),
            ..Default::default()
        }
    }

    /// Runs host a's shards (QPN blocks from 0) and host b's (from 4),
    /// shard i of one joined to shard i of the other by a channel link.
    fn linked(
        dev_a: &[Device],
        mac_a: [u8; 6],
        dev_b: &[Device],
        mac_b: [u8; 6],
    ) -> (ShardedRuntime, ShardedRuntime) {
        let (a0, b0) = ChannelIo::pair(256, 9216);
        let (a1, b1) = ChannelIo::pair(256, 9216);
        let rt = RuntimeConfig {
            max_wait: Duration::from_micros(200),
            ..RuntimeConfig::default()
        };
        let shards = |devs: &[Device], ios: [ChannelIo; 2]| -> Vec<(Device, Box<dyn PacketIo>)> {
            devs.iter()
                .cloned()
                .zip(ios.map(|io| Box::new(io) as Box<dyn PacketIo>))
                .collect()
        };
        (
            ShardedRuntime::start(shards(dev_a, [a0, a1]), 0, mac_a, rt).unwrap(),
            ShardedRuntime::start(shards(dev_b, [b0, b1]), 4, mac_b, rt).unwrap(),
        )
    }

    fn host(last: u8, base_block: u32) -> (EngineConfig, Vec<Device>) {
        let cfg = host_cfg(last);
        let devs = shard_configs(&cfg, base_block, 2)
            .into_iter()
            .map(Device::new)
            .collect();
        (cfg, devs)
    }

    /// Two hosts of 2 shards each, joined by two links (like two queues of
    /// a veth: shard i of one side to shard i of the other). QPs paired
    /// shard by shard, QPs paired across shards (every frame arrives at
    /// the wrong shard and is handed over), and QPs between the two shards
    /// of one host (own MAC) all move their data intact.
    #[test]
    fn shards_hand_over_frames_for_each_other_s_qps() {
        let (cfg_a, dev_a) = host(1, 0);
        let (cfg_b, dev_b) = host(2, 4);
        let (run_a, run_b) = linked(&dev_a, cfg_a.mac, &dev_b, cfg_b.mac);
        let zero = vec![0u8; MSG * MSGS];
        let mut pairs = Vec::new();
        for (p, (da, db, ca, cb)) in [
            (&dev_a[0], &dev_b[0], &cfg_a, &cfg_b),
            (&dev_a[1], &dev_b[1], &cfg_a, &cfg_b),
            (&dev_a[0], &dev_b[1], &cfg_a, &cfg_b),
            (&dev_b[0], &dev_a[1], &cfg_b, &cfg_a),
            (&dev_a[0], &dev_a[1], &cfg_a, &cfg_a),
        ]
        .into_iter()
        .enumerate()
        {
            let (x, y) = (end(da, ca, &pattern(p)), end(db, cb, &zero));
            connect(&x, &y);
            pairs.push((x, y));
        }
        assert_eq!(shard_of_qpn(pairs[2].1.qp.qp_num(), 4, 2), Some(1));
        write_all(&pairs);
        let (ha, hb) = (run_a.handoff_stats(), run_b.handoff_stats());
        assert!(run_a.is_running() && run_b.is_running());
        run_a.stop().unwrap();
        // Its links closed with a's ends.
        let b = run_b.stop();
        assert!(matches!(b, Ok(_) | Err(IoError::Closed)), "{b:?}");
        // Pair 2's data reaches b's shard 0 and goes to shard 1, its ACKs
        // come back the same way on a; pair 4 never leaves a.
        assert!(hb.handed >= (MSGS * MSG / 4096) as u64, "{hb:?}");
        assert!(ha.handed >= (MSGS * MSG / 4096) as u64, "{ha:?}");
        assert_eq!(ha.dropped + hb.dropped, 0, "{ha:?} {hb:?}");
    }

    /// Two hosts of 2 shards each, each host's shards one group: one PD,
    /// one MR and one CQ per host made through the spreading handle, 4 QPs
    /// spread over both shards (0, 1, 0, 1 on both hosts: paired shard by
    /// shard). Every WRITE completes into the host's one CQ, from QPs of
    /// both shards, and lands in the one MR at its QP's offset.
    #[test]
    fn a_group_shares_pds_mrs_and_cqs_across_its_shards() {
        const QPS: usize = 4;
        const PER_QP: usize = 6;
        let (cfg_a, cfg_b) = (host_cfg(1), host_cfg(2));
        let dev_a = Device::group(shard_configs(&cfg_a, 0, 2));
        let dev_b = Device::group(shard_configs(&cfg_b, 4, 2));
        let (run_a, run_b) = linked(&dev_a, cfg_a.mac, &dev_b, cfg_b.mac);
        let (sa, sb) = (dev_a[0].spreading(), dev_b[0].spreading());
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let (pd_a, pd_b) = (sa.alloc_pd(), sb.alloc_pd());
        let (cq_a, cq_b) = (sa.create_cq(256).unwrap(), sb.create_cq(256).unwrap());
        let len = QPS * PER_QP * MSG;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 1021) as u8).collect();
        let src = pd_a.reg_mr_with(&data, all).unwrap();
        let dst = pd_b.reg_mr(len, all).unwrap();
        let qps: Vec<(QueuePair, QueuePair)> = (0..QPS)
            .map(|q| {
                let x = sa.create_qp(&pd_a, &QpInitAttr::rc(&cq_a)).unwrap();
                let y = sb.create_qp(&pd_b, &QpInitAttr::rc(&cq_b)).unwrap();
                assert_eq!(shard_of_qpn(x.qp_num(), 0, 2), Some(q % 2), "a's QP {q}");
                assert_eq!(shard_of_qpn(y.qp_num(), 4, 2), Some(q % 2), "b's QP {q}");
                (x, y)
            })
            .collect();
        assert_eq!(
            dev_a.iter().map(Device::live_qps).collect::<Vec<_>>(),
            [2, 2]
        );
        let attr = QpAttr {
            qp_access_flags: all,
            path_mtu: Mtu::Mtu4096,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            ..Default::default()
        };
        for (x, y) in &qps {
            for (me, peer, peer_cfg) in [(x, y, &cfg_b), (y, x, &cfg_a)] {
                let av = AddressVector {
                    dest_mac: peer_cfg.mac,
                    dest_ip: peer_cfg.ip.into(),
                    ..Default::default()
                };
                let remote = RemoteQp {
                    qpn: peer.qp_num(),
                    psn: 0,
                    av,
                };
                me.connect(&attr, &remote).unwrap();
            }
        }
        for (q, (x, _)) in qps.iter().enumerate() {
            for m in 0..PER_QP {
                let off = (q * PER_QP + m) * MSG;
                let op = WrOpcode::RdmaWrite {
                    remote_addr: dst.addr() + off as u64,
                    rkey: dst.rkey(),
                };
                let wr = SendWr::new(off as u64, op, vec![src.sge(off, MSG)]);
                x.post_send(&wr).unwrap();
            }
        }
        let mut per_qp = std::collections::HashMap::new();
        let mut wc = vec![Wc::default(); 64];
        let deadline = Instant::now() + Duration::from_secs(30);
        while per_qp.values().sum::<usize>() < QPS * PER_QP {
            assert!(Instant::now() < deadline, "completions: {per_qp:?}");
            let n = cq_a.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                *per_qp.entry(c.qp_num).or_insert(0usize) += 1;
            }
            if n == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        assert_eq!(per_qp.len(), QPS, "{per_qp:?}");
        // SAFETY: every WRITE into it has completed.
        let got = unsafe { dst.to_vec(0, len) }.unwrap();
        assert!(got == data, "the data differs");
        let stats = sa.stats();
        let shard0 = dev_a[0].stats();
        assert!(stats.tx_data_packets > shard0.tx_data_packets, "{stats:?}");
        drop(qps);
        assert_eq!(dev_a.iter().map(Device::live_qps).sum::<usize>(), 0);
        run_a.stop().unwrap();
        let b = run_b.stop();
        assert!(matches!(b, Ok(_) | Err(IoError::Closed)), "{b:?}");
    }
}
