//! Opening an AF_XDP socket (UMEM, rings, bind, busy polling, XSKMAP
//! registration) and what can be asked of an open one.

use std::{
    num::NonZeroU32,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use xsk_rs::{
    config::{BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig},
    CompQueue, FillQueue, FrameDesc, RxQueue, TxQueue, Umem,
};

use super::{
    setup_err, setup_src, BusyPoll, BusyPollStatus, XskConfig, XskError, XskStats,
    XDP_PACKET_HEADROOM,
};
use crate::io::{sockopt, IoStats};
use crate::xdp;

/// One AF_XDP socket bound to one RX queue.
pub struct XskSocket {
    pub(super) umem: Umem,
    pub(super) rx: RxQueue,
    pub(super) tx: TxQueue,
    pub(super) fill: FillQueue,
    pub(super) comp: CompQueue,
    /// RX descriptors of one batch (length = batch size).
    pub(super) rx_batch: Vec<FrameDesc>,
    /// RX frames the fill ring did not take back yet.
    pub(super) fill_pending: Vec<FrameDesc>,
    /// TX frames owned by us, ready to be written.
    pub(super) tx_free: Vec<FrameDesc>,
    /// TX frames written, not yet on the ring.
    pub(super) tx_batch: Vec<FrameDesc>,
    /// Completion-ring scratch.
    pub(super) comp_batch: Vec<FrameDesc>,
    pub(super) tx_total: usize,
    pub(super) frame_size: u32,
    pub(super) need_wakeup: bool,
    /// Multi-buffer mode: staging buffer for TX, reassembly buffer for RX.
    pub(super) multi_buffer: bool,
    pub(super) mb_max: usize,
    pub(super) tx_stage: Vec<u8>,
    pub(super) rx_reasm: Vec<u8>,
    /// The frame being reassembled outgrew `mb_max`: drop it at its end.
    pub(super) rx_reasm_bad: bool,
    /// When the frame being reassembled arrived (its first fragment's
    /// XDP timestamp, on the engine's clock).
    pub(super) rx_reasm_arrived: Option<u64>,
    /// The interface's program puts arrival times at the start of a
    /// frame's data (`xroce_xdp_head`), not in front of it.
    pub(super) arrival_in_head: bool,
    pub(super) busy_poll: BusyPollStatus,
    pub(super) iface: String,
    pub(super) queue: u32,
    pub(super) io_stats: IoStats,
    /// Frames left on the RX ring after a batch at or above which the
    /// socket reports pressure (a quarter of the ring).
    pub(super) pressure_frames: u32,
    /// The last batch left at least `pressure_frames` behind it.
    pub(super) rx_pressure: bool,
}

fn enable_busy_poll(fd: i32, bp: BusyPoll) -> BusyPollStatus {
    let opts = [
        ("SO_PREFER_BUSY_POLL", libc::SO_PREFER_BUSY_POLL, 1),
        ("SO_BUSY_POLL", libc::SO_BUSY_POLL, bp.usecs),
        ("SO_BUSY_POLL_BUDGET", libc::SO_BUSY_POLL_BUDGET, bp.budget),
    ];
    for (name, opt, value) in opts {
        // The kernel reads an int; a u32 above i32::MAX reads as negative
        // (and is refused) either way.
        if let Err(e) = sockopt::set_int(fd, libc::SOL_SOCKET, opt, value as libc::c_int) {
            // Leave the socket as the kernel would without any of them.
            let _ = sockopt::set_int(fd, libc::SOL_SOCKET, libc::SO_PREFER_BUSY_POLL, 0);
            let _ = sockopt::set_int(fd, libc::SOL_SOCKET, libc::SO_BUSY_POLL, 0);
            return BusyPollStatus::Unavailable(format!("{name}: {e}"));
        }
    }
    BusyPollStatus::On(bp)
}

/// True if `e` (or a cause of it) is EBUSY.
fn is_busy(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.raw_os_error() == Some(libc::EBUSY) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

impl XskSocket {
    /// Opens a socket on `iface`/`queue` and registers it in the interface's
    /// pinned XSKMAP. The XDP program must already be attached.
    pub fn open(iface: &str, queue: u32, config: XskConfig) -> Result<Self, XskError> {
        let mut xsks = xdp::xsk_map(iface)?;
        // The engine's clock starts no later than the first frame can
        // arrive: an arrival time before its start would be lost.
        crate::runtime::now_ns();
        // Where the program puts arrival times decides where a frame starts.
        let arrival_in_head =
            xdp::query(iface)?.is_some_and(|a| a.arrival == xdp::ArrivalStamp::Head);
        if config.frames < 2 || !config.frames.is_power_of_two() {
            return Err(setup_err(
                iface,
                queue,
                format!(
                    "UMEM frames must be a power of two >= 2, not {}",
                    config.frames
                ),
            ));
        }
        if config.frame_size != 2048 && config.frame_size != 4096 {
            return Err(setup_err(
                iface,
                queue,
                format!(
                    "UMEM frame size must be 2048 or 4096, not {}",
                    config.frame_size
                ),
            ));
        }
        let half = config.frames / 2;
        let batch = config.batch.clamp(1, half) as usize;
        let ring = QueueSize::new(half).map_err(setup_src(iface, queue, "ring size"))?;
        let umem_config = UmemConfig::builder()
            .frame_size(FrameSize::new(config.frame_size).map_err(setup_src(
                iface,
                queue,
                "UMEM frame size",
            ))?)
            .fill_queue_size(ring)
            .comp_queue_size(ring)
            .build()
            .map_err(setup_src(iface, queue, "UMEM configuration"))?;
        let frame_count = NonZeroU32::new(config.frames)
            .ok_or_else(|| setup_err(iface, queue, "UMEM needs at least one frame"))?;
        let (umem, mut descs) = Umem::new(umem_config, frame_count, false).map_err(setup_src(
            iface,
            queue,
            "create the UMEM",
        ))?;
        let mut bind = BindFlags::empty();
        if config.copy_mode {
            bind |= BindFlags::XDP_COPY;
        }
        if config.need_wakeup {
            bind |= BindFlags::XDP_USE_NEED_WAKEUP;
        }
        if config.multi_buffer {
            bind |= BindFlags::XDP_USE_SG;
        }
        let socket_config = SocketConfig::builder()
            .rx_queue_size(ring)
            .tx_queue_size(ring)
            // Our own program is attached; libxdp must not load its default one.
            .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
            .bind_flags(bind)
            .build();
        let if_name: Interface =
            iface
                .parse()
                .map_err(setup_src(iface, queue, "interface name"))?;
        // A socket just closed on this queue (by us or a process that just
        // exited) holds it until the kernel frees its pool from a work
        // queue: EBUSY for a moment is worth a short wait.
        let busy_until = Instant::now() + Duration::from_secs(3);
        let (tx, rx, rings) = loop {
            // SAFETY: the UMEM is not shared with another socket.
            match unsafe { xsk_rs::Socket::new(socket_config, &umem, &if_name, queue) } {
                Err(e) if is_busy(&e) && Instant::now() < busy_until => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => {
                    break other.map_err(setup_src(
                        iface,
                        queue,
                        format!(
                            "create the socket (is {queue} a valid RX queue of {iface}? \
                         is another socket bound to it?)"
                        ),
                    ))?
                }
            }
        };
        let (mut fill, comp) =
            rings.ok_or_else(|| setup_err(iface, queue, "socket came without fill/comp rings"))?;
        let tx_free = descs.split_off(half as usize);
        // SAFETY: these descriptors belong to this UMEM and are not in use.
        let filled = unsafe { fill.produce(&descs) };
        if filled != descs.len() {
            return Err(setup_err(iface, queue, "fill ring refused the RX frames"));
        }
        let fd = rx.fd().as_raw_fd();
        let busy_poll = match config.busy_poll {
            Some(bp) => enable_busy_poll(fd, bp),
            None => BusyPollStatus::Off,
        };
        xsks.set(queue, fd, 0)
            .map_err(setup_src(iface, queue, "register in XSKMAP"))?;
        descs.truncate(batch);
        Ok(Self {
            umem,
            rx,
            tx,
            fill,
            comp,
            rx_batch: descs,
            fill_pending: Vec::with_capacity(half as usize),
            tx_batch: Vec::with_capacity(half as usize),
            comp_batch: vec![FrameDesc::default(); batch],
            tx_total: tx_free.len(),
            tx_free,
            frame_size: config.frame_size,
            need_wakeup: config.need_wakeup,
            busy_poll,
            iface: iface.into(),
            queue,
            io_stats: IoStats::default(),
            multi_buffer: config.multi_buffer,
            mb_max: config.multi_buffer_max_frame,
            tx_stage: if config.multi_buffer {
                vec![0; config.multi_buffer_max_frame]
            } else {
                Vec::new()
            },
            rx_reasm: Vec::with_capacity(if config.multi_buffer {
                config.multi_buffer_max_frame
            } else {
                0
            }),
            rx_reasm_bad: false,
            rx_reasm_arrived: None,
            arrival_in_head,
            pressure_frames: (half / 4).max(1),
            rx_pressure: false,
        })
    }

    /// The interface and RX queue this socket is bound to.
    pub fn queue(&self) -> (&str, u32) {
        (&self.iface, self.queue)
    }

    /// Whether busy polling is on, off, or was refused (and why).
    pub fn busy_poll(&self) -> &BusyPollStatus {
        &self.busy_poll
    }

    /// The socket's file descriptor (for poll/epoll by a runtime).
    pub fn raw_fd(&self) -> i32 {
        self.rx.fd().as_raw_fd()
    }

    /// Whether the kernel bound the socket in zero-copy mode (getsockopt
    /// XDP_OPTIONS); veth and skb-mode XDP are always copy mode.
    pub fn zero_copy(&self) -> std::io::Result<bool> {
        let flags = sockopt::get_u32(self.raw_fd(), libc::SOL_XDP, libc::XDP_OPTIONS)?;
        Ok(flags & libc::XDP_OPTIONS_ZEROCOPY != 0)
    }

    pub(super) fn max_frame_len(&self) -> usize {
        if self.multi_buffer {
            self.mb_max
        } else {
            self.chunk_capacity()
        }
    }

    pub(super) fn chunk_capacity(&self) -> usize {
        (self.frame_size - XDP_PACKET_HEADROOM) as usize
    }

    /// The kernel's counters for this socket.
    pub fn stats(&self) -> Result<XskStats, XskError> {
        let s = self.rx.fd().xdp_statistics()?;
        Ok(XskStats {
            rx_dropped: s.rx_dropped(),
            rx_invalid_descs: s.rx_invalid_descs(),
            rx_ring_full: s.rx_ring_full(),
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs(),
            tx_invalid_descs: s.tx_invalid_descs(),
            tx_ring_empty_descs: s.tx_ring_empty_descs(),
        })
    }

    pub(super) fn folded_stats(&mut self) -> IoStats {
        let mut s = self.io_stats;
        if let Ok(k) = XskSocket::stats(self) {
            s.rx_dropped += k.rx_dropped + k.rx_ring_full + k.rx_invalid_descs;
            s.rx_ring_full += k.rx_ring_full;
            s.rx_fill_ring_empty += k.rx_fill_ring_empty_descs;
            s.tx_errors += k.tx_invalid_descs;
        }
        s
    }
}
