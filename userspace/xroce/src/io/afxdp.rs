//! AF_XDP socket on one RX queue of an interface that has xroce's XDP
//! program attached. The program redirects RoCEv2 frames of that queue here;
//! frames we send leave through the same queue.
//!
//! UMEM layout: the first half of the frames feeds the fill ring (RX), the
//! second half is a free list for TX, refilled from the completion ring.

use std::{io::Write, num::NonZeroU32, os::fd::AsRawFd};

use xsk_rs::{
    config::{BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig},
    CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem,
};

use crate::xdp;

/// Sizes of one socket's rings and UMEM.
#[derive(Clone, Copy, Debug)]
pub struct XskConfig {
    /// UMEM frames in all (half RX, half TX); a power of two.
    pub frames: u32,
    /// Bytes per UMEM frame (2048 or 4096).
    pub frame_size: u32,
    /// Force copy mode (veth has no zero-copy).
    pub copy_mode: bool,
}

impl Default for XskConfig {
    fn default() -> Self {
        Self {
            frames: 4096,
            frame_size: 4096,
            copy_mode: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum XskError {
    #[error(transparent)]
    Xdp(#[from] xdp::XdpError),
    #[error("AF_XDP setup on {iface} queue {queue}: {detail}")]
    Setup {
        iface: String,
        queue: u32,
        detail: String,
    },
    #[error("AF_XDP I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {len} bytes does not fit a {frame_size}-byte UMEM frame")]
    FrameTooBig { len: usize, frame_size: u32 },
}

/// Kernel drop counters of the socket (getsockopt XDP_STATISTICS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskStats {
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub rx_ring_full: u64,
}

pub struct XskSocket {
    umem: Umem,
    rx: RxQueue,
    tx: TxQueue,
    fill: FillQueue,
    comp: CompQueue,
    /// Scratch descriptors for ring batches (no allocation per packet).
    rx_batch: Vec<FrameDesc>,
    tx_free: Vec<FrameDesc>,
    tx_batch: Vec<FrameDesc>,
    frame_size: u32,
}

fn setup_err(iface: &str, queue: u32, detail: impl std::fmt::Display) -> XskError {
    XskError::Setup {
        iface: iface.into(),
        queue,
        detail: detail.to_string(),
    }
}

impl XskSocket {
    /// Opens a socket on `iface`/`queue` and registers it in the interface's
    /// pinned XSKMAP. The XDP program must already be attached.
    pub fn open(iface: &str, queue: u32, config: XskConfig) -> Result<Self, XskError> {
        let mut xsks = xdp::xsk_map(iface)?;
        let half = config.frames / 2;
        let ring = QueueSize::new(half).map_err(|e| setup_err(iface, queue, e))?;
        let umem_config = UmemConfig::builder()
            .frame_size(FrameSize::new(config.frame_size).map_err(|e| setup_err(iface, queue, e))?)
            .fill_queue_size(ring)
            .comp_queue_size(ring)
            .build()
            .map_err(|e| setup_err(iface, queue, e))?;
        let frame_count = NonZeroU32::new(config.frames)
            .ok_or_else(|| setup_err(iface, queue, "UMEM needs at least one frame"))?;
        let (umem, mut descs) =
            Umem::new(umem_config, frame_count, false).map_err(|e| setup_err(iface, queue, e))?;
        let mut bind = BindFlags::empty();
        if config.copy_mode {
            bind |= BindFlags::XDP_COPY;
        }
        let socket_config = SocketConfig::builder()
            .rx_queue_size(ring)
            .tx_queue_size(ring)
            // Our own program is attached; libxdp must not load its default one.
            .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
            .bind_flags(bind)
            .build();
        let if_name: Interface = iface.parse().map_err(|e| setup_err(iface, queue, e))?;
        // SAFETY: the UMEM is not shared with another socket.
        let (tx, rx, rings) = unsafe { Socket::new(socket_config, &umem, &if_name, queue) }
            .map_err(|e| setup_err(iface, queue, e))?;
        let (mut fill, comp) =
            rings.ok_or_else(|| setup_err(iface, queue, "socket came without fill/comp rings"))?;
        let tx_free = descs.split_off(half as usize);
        // SAFETY: these descriptors belong to this UMEM and are not in use.
        let filled = unsafe { fill.produce(&descs) };
        if filled != descs.len() {
            return Err(setup_err(iface, queue, "fill ring refused the RX frames"));
        }
        xsks.set(queue, rx.fd().as_raw_fd(), 0)
            .map_err(|e| setup_err(iface, queue, format!("register in XSKMAP: {e}")))?;
        Ok(Self {
            umem,
            rx,
            tx,
            fill,
            comp,
            rx_batch: descs,
            tx_batch: Vec::with_capacity(half as usize),
            tx_free,
            frame_size: config.frame_size,
        })
    }

    /// Receives up to one batch, waiting at most `timeout_ms` for the first
    /// frame; calls `on_frame` for each and returns how many arrived.
    pub fn recv(
        &mut self,
        timeout_ms: i32,
        mut on_frame: impl FnMut(&[u8]),
    ) -> Result<usize, XskError> {
        // SAFETY: rx_batch descriptors are only written by the ring here.
        let n = unsafe { self.rx.poll_and_consume(&mut self.rx_batch, timeout_ms)? };
        for desc in &self.rx_batch[..n] {
            // SAFETY: the kernel handed this frame to us; nothing else reads it.
            let data = unsafe { self.umem.data(desc) };
            on_frame(data.contents());
        }
        // Give the frames straight back for new arrivals.
        // SAFETY: the frames were consumed above and are ours again.
        unsafe {
            self.fill
                .produce_and_wakeup(&self.rx_batch[..n], self.rx.fd_mut(), 0)?
        };
        Ok(n)
    }

    /// Sends `frames`, waiting for TX frames to come back if all are in
    /// flight. Returns how many were queued.
    pub fn send<'a>(
        &mut self,
        frames: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<usize, XskError> {
        self.reclaim();
        self.tx_batch.clear();
        for frame in frames {
            if frame.len() > self.frame_size as usize {
                return Err(XskError::FrameTooBig {
                    len: frame.len(),
                    frame_size: self.frame_size,
                });
            }
            let mut desc = loop {
                if let Some(desc) = self.tx_free.pop() {
                    break desc;
                }
                self.flush_tx()?;
                self.reclaim();
            };
            // SAFETY: the descriptor came from the free list: nobody uses it.
            let mut data = unsafe { self.umem.data_mut(&mut desc) };
            let mut cursor = data.cursor();
            cursor.set_pos(0);
            cursor.write_all(frame)?;
            self.tx_batch.push(desc);
        }
        let queued = self.tx_batch.len();
        self.flush_tx()?;
        Ok(queued)
    }

    fn flush_tx(&mut self) -> Result<(), XskError> {
        let mut done = 0;
        while done < self.tx_batch.len() {
            // SAFETY: the descriptors were filled above and are owned by us.
            done += unsafe { self.tx.produce_and_wakeup(&self.tx_batch[done..])? };
            if done < self.tx_batch.len() {
                self.reclaim();
            }
        }
        self.tx_batch.clear();
        Ok(())
    }

    /// Moves completed TX frames back to the free list.
    fn reclaim(&mut self) {
        let mut batch = [FrameDesc::default(); 64];
        loop {
            // SAFETY: completed descriptors are ours again.
            let n = unsafe { self.comp.consume(&mut batch) };
            self.tx_free.extend_from_slice(&batch[..n]);
            if n < batch.len() {
                break;
            }
        }
    }

    /// The kernel's drop counters for this socket.
    pub fn stats(&self) -> Result<XskStats, XskError> {
        let s = self.rx.fd().xdp_statistics()?;
        Ok(XskStats {
            rx_dropped: s.rx_dropped(),
            rx_invalid_descs: s.rx_invalid_descs(),
            rx_ring_full: s.rx_ring_full(),
        })
    }
}
