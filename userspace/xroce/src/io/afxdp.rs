//! AF_XDP sockets on the RX queues of an interface that has xroce's XDP
//! program attached. The program redirects RoCEv2 frames of a queue to the
//! socket registered for that queue in the pinned XSKMAP; frames we send
//! leave through the socket's queue.
//!
//! UMEM layout: `frames` chunks of `frame_size` bytes. The first half feeds
//! the fill ring (RX) and goes straight back to it after each batch; the
//! second half is a free list for TX, refilled from the completion ring.
//! All descriptor arrays are allocated when the socket opens: the steady
//! state allocates nothing.
//!
//! Frame size: a chunk holds `frame_size - 256` bytes of frame (the kernel
//! keeps XDP_PACKET_HEADROOM in front), so 4096-byte chunks carry RoCE path
//! MTU 2048 (2122-byte frames) but not path MTU 4096 (~4.2 KB frames). Those
//! need AF_XDP multi-buffer ([`XskConfig::multi_buffer`]: XDP_USE_SG, frames
//! spread over chunks with XDP_PKT_CONTD, and xroce's frags-aware XDP
//! program). Without it, sending such a frame is [`IoError::FrameTooBig`]
//! with that explanation, and the kernel drops received ones (counted in
//! `rx_dropped`).
//!
//! Wake-ups: sockets bind with XDP_USE_NEED_WAKEUP, so a kick (sendto /
//! recvfrom with MSG_DONTWAIT) happens only when the kernel flags the ring.
//! Busy polling (SO_PREFER_BUSY_POLL, SO_BUSY_POLL, SO_BUSY_POLL_BUDGET) is
//! asked for when configured; a kernel that refuses it leaves the socket in
//! interrupt mode and [`XskSocket::busy_poll`] says so.

use std::{
    ffi::CString,
    fs,
    io::Write,
    num::NonZeroU32,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use xsk_rs::{
    config::{BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig},
    CompQueue, FillQueue, FrameDesc, RxQueue, TxQueue, Umem,
};

use super::{poll_ms, IoError, IoStats, PacketIo};
use crate::xdp;

/// Bytes the kernel reserves in front of every received frame.
pub const XDP_PACKET_HEADROOM: u32 = 256;

/// Descriptor option: more fragments of this frame follow.
const XDP_PKT_CONTD: u32 = 1;
const SO_BUSY_POLL: libc::c_int = 46;
const SO_PREFER_BUSY_POLL: libc::c_int = 69;
const SO_BUSY_POLL_BUDGET: libc::c_int = 70;

const MTU4096_HINT: &str = " (frames larger than one UMEM chunk, as RoCE path MTU 4096 makes, \
     need AF_XDP multi-buffer: set XskConfig::multi_buffer)";

/// Busy-poll settings (see the kernel's Documentation/networking/af_xdp.rst).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusyPoll {
    /// SO_BUSY_POLL: microseconds to busy-poll in a blocking call.
    pub usecs: u32,
    /// SO_BUSY_POLL_BUDGET: packets per busy-poll round.
    pub budget: u32,
}

impl Default for BusyPoll {
    fn default() -> Self {
        Self {
            usecs: 20,
            budget: 64,
        }
    }
}

/// What became of a busy-poll request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BusyPollStatus {
    /// Not asked for.
    Off,
    /// All three socket options took.
    On(BusyPoll),
    /// The kernel refused an option; the socket works in interrupt mode.
    Unavailable(String),
}

/// Sizes and modes of one socket.
#[derive(Clone, Copy, Debug)]
pub struct XskConfig {
    /// UMEM chunks in all (half RX, half TX); a power of two, at least 2.
    pub frames: u32,
    /// Bytes per UMEM chunk: 2048 or 4096 (a chunk holds `frame_size - 256`
    /// bytes of frame).
    pub frame_size: u32,
    /// Force copy mode (veth has no zero-copy).
    pub copy_mode: bool,
    /// Bind with XDP_USE_NEED_WAKEUP and kick only when the ring asks.
    pub need_wakeup: bool,
    /// Ask for busy polling.
    pub busy_poll: Option<BusyPoll>,
    /// Most frames handed over per `recv_batch` (RX descriptors per batch).
    pub batch: u32,
    /// AF_XDP multi-buffer (XDP_USE_SG): frames larger than a chunk span
    /// several chunks (RoCE path MTU 4096 needs it). Needs a frags-aware
    /// XDP program (xroce's is) and kernel 6.6+. Costs one copy per frame
    /// on TX (frames are staged, then spread over chunks) and one per
    /// multi-chunk frame on RX (reassembled).
    pub multi_buffer: bool,
    /// Largest frame in multi-buffer mode.
    pub multi_buffer_max_frame: usize,
}

impl Default for XskConfig {
    fn default() -> Self {
        Self {
            frames: 4096,
            frame_size: 4096,
            copy_mode: false,
            need_wakeup: true,
            busy_poll: None,
            batch: 64,
            multi_buffer: false,
            multi_buffer_max_frame: 9216,
        }
    }
}

impl XskConfig {
    /// Bytes of frame one UMEM chunk holds.
    pub fn chunk_capacity(&self) -> usize {
        self.frame_size.saturating_sub(XDP_PACKET_HEADROOM) as usize
    }

    /// Largest frame a socket with this configuration carries.
    pub fn max_frame_len(&self) -> usize {
        if self.multi_buffer {
            self.multi_buffer_max_frame
        } else {
            self.chunk_capacity()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum XskError {
    #[error(transparent)]
    Xdp(#[from] xdp::XdpError),
    /// Opening a socket failed; `source` is xsk-rs's, aya's or the OS's
    /// error when there is one.
    #[error("AF_XDP setup on {iface} queue {queue}: {what}")]
    Setup {
        iface: String,
        queue: u32,
        what: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    #[error("AF_XDP I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {len} bytes is larger than this socket carries ({frame_size}-byte UMEM chunks){MTU4096_HINT}")]
    FrameTooBig { len: usize, frame_size: u32 },
}

impl From<XskError> for IoError {
    fn from(e: XskError) -> Self {
        match e {
            XskError::Io(e) => IoError::Io(e),
            XskError::FrameTooBig { len, frame_size } => IoError::FrameTooBig {
                len,
                max: (frame_size - XDP_PACKET_HEADROOM) as usize,
                hint: MTU4096_HINT,
            },
            other => IoError::Xsk(Box::new(other)),
        }
    }
}

/// Kernel counters of the socket (getsockopt XDP_STATISTICS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames dropped for other reasons (e.g. larger than a chunk).
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full (we read too slowly).
    pub rx_ring_full: u64,
    /// Times the kernel found the fill ring empty.
    pub rx_fill_ring_empty_descs: u64,
    pub tx_invalid_descs: u64,
    /// Times the kernel found the TX ring empty when kicked.
    pub tx_ring_empty_descs: u64,
}

impl XskStats {
    fn add(&mut self, o: &XskStats) {
        self.rx_dropped += o.rx_dropped;
        self.rx_invalid_descs += o.rx_invalid_descs;
        self.rx_ring_full += o.rx_ring_full;
        self.rx_fill_ring_empty_descs += o.rx_fill_ring_empty_descs;
        self.tx_invalid_descs += o.tx_invalid_descs;
        self.tx_ring_empty_descs += o.tx_ring_empty_descs;
    }
}

/// One AF_XDP socket bound to one RX queue.
pub struct XskSocket {
    umem: Umem,
    rx: RxQueue,
    tx: TxQueue,
    fill: FillQueue,
    comp: CompQueue,
    /// RX descriptors of one batch (length = batch size).
    rx_batch: Vec<FrameDesc>,
    /// RX frames the fill ring did not take back yet.
    fill_pending: Vec<FrameDesc>,
    /// TX frames owned by us, ready to be written.
    tx_free: Vec<FrameDesc>,
    /// TX frames written, not yet on the ring.
    tx_batch: Vec<FrameDesc>,
    /// Completion-ring scratch.
    comp_batch: Vec<FrameDesc>,
    tx_total: usize,
    frame_size: u32,
    need_wakeup: bool,
    /// Multi-buffer mode: staging buffer for TX, reassembly buffer for RX.
    multi_buffer: bool,
    mb_max: usize,
    tx_stage: Vec<u8>,
    rx_reasm: Vec<u8>,
    /// The frame being reassembled outgrew `mb_max`: drop it at its end.
    rx_reasm_bad: bool,
    busy_poll: BusyPollStatus,
    iface: String,
    queue: u32,
    io_stats: IoStats,
}

fn setup_err(iface: &str, queue: u32, what: impl Into<String>) -> XskError {
    XskError::Setup {
        iface: iface.into(),
        queue,
        what: what.into(),
        source: None,
    }
}

/// Wraps `source` as [`XskError::Setup`] saying what was being done.
fn setup_src<E>(iface: &str, queue: u32, what: impl Into<String>) -> impl FnOnce(E) -> XskError
where
    E: std::error::Error + Send + Sync + 'static,
{
    let (iface, what) = (iface.to_string(), what.into());
    move |e| XskError::Setup {
        iface,
        queue,
        what,
        source: Some(Box::new(e)),
    }
}

fn setsockopt_u32(fd: i32, opt: libc::c_int, value: u32) -> std::io::Result<()> {
    // SAFETY: the option value is a valid u32 that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&value as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn enable_busy_poll(fd: i32, bp: BusyPoll) -> BusyPollStatus {
    let opts = [
        ("SO_PREFER_BUSY_POLL", SO_PREFER_BUSY_POLL, 1),
        ("SO_BUSY_POLL", SO_BUSY_POLL, bp.usecs),
        ("SO_BUSY_POLL_BUDGET", SO_BUSY_POLL_BUDGET, bp.budget),
    ];
    for (name, opt, value) in opts {
        if let Err(e) = setsockopt_u32(fd, opt, value) {
            // Leave the socket as the kernel would without any of them.
            let _ = setsockopt_u32(fd, SO_PREFER_BUSY_POLL, 0);
            let _ = setsockopt_u32(fd, SO_BUSY_POLL, 0);
            return BusyPollStatus::Unavailable(format!("{name}: {e}"));
        }
    }
    BusyPollStatus::On(bp)
}

/// Kicks the kernel on `fd`: sendto for TX, recvfrom for RX/fill.
fn kick(fd: i32, rx: bool) -> std::io::Result<()> {
    // SAFETY: zero-length calls with null buffers are how AF_XDP is woken.
    let rc = unsafe {
        if rx {
            libc::recvfrom(
                fd,
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        } else {
            libc::sendto(
                fd,
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        }
    };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN | libc::EINTR) => {}
            _ => return Err(e),
        }
    }
    Ok(())
}

impl XskSocket {
    /// Opens a socket on `iface`/`queue` and registers it in the interface's
    /// pinned XSKMAP. The XDP program must already be attached.
    pub fn open(iface: &str, queue: u32, config: XskConfig) -> Result<Self, XskError> {
        let mut xsks = xdp::xsk_map(iface)?;
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
        const XDP_OPTIONS: libc::c_int = 8;
        const XDP_OPTIONS_ZEROCOPY: u32 = 1;
        let mut flags: u32 = 0;
        let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
        // SAFETY: `flags` is a valid u32 buffer of `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                self.raw_fd(),
                libc::SOL_XDP,
                XDP_OPTIONS,
                (&mut flags as *mut u32).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(flags & XDP_OPTIONS_ZEROCOPY != 0)
    }

    /// Receives up to one batch, waiting at most `timeout_ms` for the first
    /// frame; calls `on_frame` for each and returns how many arrived.
    pub fn recv(
        &mut self,
        timeout_ms: i32,
        mut on_frame: impl FnMut(&[u8]),
    ) -> Result<usize, XskError> {
        Ok(self.recv_inner(timeout_ms, &mut on_frame)?)
    }

    fn busy(&self) -> bool {
        matches!(self.busy_poll, BusyPollStatus::On(_))
    }

    fn recv_inner(
        &mut self,
        timeout_ms: i32,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> std::io::Result<usize> {
        // TX progresses in the same loop that receives.
        self.complete_tx()?;
        self.refill()?;
        // SAFETY: rx_batch descriptors are only written by the ring here.
        let mut n = unsafe { self.rx.consume(&mut self.rx_batch) };
        if n == 0 && timeout_ms != 0 {
            if self.busy() {
                // Busy polling: drive NAPI from here until a frame shows up.
                let deadline = Instant::now() + Duration::from_millis(timeout_ms.max(0) as u64);
                loop {
                    kick(self.raw_fd(), true)?;
                    // SAFETY: as above.
                    n = unsafe { self.rx.consume(&mut self.rx_batch) };
                    if n > 0 || Instant::now() >= deadline {
                        break;
                    }
                }
            } else if self.rx.poll(timeout_ms)? {
                // SAFETY: as above.
                n = unsafe { self.rx.consume(&mut self.rx_batch) };
            }
        }
        let mut frames = 0;
        for desc in &self.rx_batch[..n] {
            // SAFETY: the kernel handed this frame to us; nothing else reads it.
            let data = unsafe { self.umem.data(desc) };
            let part = data.contents();
            // XDP_PKT_CONTD: more fragments of this frame follow.
            let contd = desc.options() & XDP_PKT_CONTD != 0;
            if !contd && self.rx_reasm.is_empty() && !self.rx_reasm_bad {
                on_frame(part);
                frames += 1;
                self.io_stats.rx_frames += 1;
                self.io_stats.rx_bytes += part.len() as u64;
                continue;
            }
            if self.rx_reasm.len() + part.len() <= self.mb_max {
                self.rx_reasm.extend_from_slice(part);
            } else {
                self.rx_reasm_bad = true;
            }
            if !contd {
                if self.rx_reasm_bad {
                    self.io_stats.rx_dropped += 1;
                } else {
                    on_frame(&self.rx_reasm);
                    frames += 1;
                    self.io_stats.rx_frames += 1;
                    self.io_stats.rx_bytes += self.rx_reasm.len() as u64;
                }
                self.rx_reasm.clear();
                self.rx_reasm_bad = false;
            }
        }
        // Give the frames straight back for new arrivals.
        self.fill_pending.extend_from_slice(&self.rx_batch[..n]);
        self.refill()?;
        Ok(frames)
    }

    /// Puts RX frames back on the fill ring and wakes the kernel if it asks.
    fn refill(&mut self) -> std::io::Result<()> {
        if self.fill_pending.is_empty() {
            return Ok(());
        }
        // SAFETY: the frames were consumed and are ours again.
        let done = unsafe { self.fill.produce(&self.fill_pending) };
        self.fill_pending.drain(..done);
        if done > 0 && (!self.need_wakeup || self.fill.needs_wakeup()) {
            kick(self.raw_fd(), true)?;
        }
        Ok(())
    }

    /// Sends `frames`, waiting for TX frames to come back if all are in
    /// flight. Returns how many were queued.
    pub fn send<'a>(
        &mut self,
        frames: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<usize, XskError> {
        let max = self.max_frame_len();
        let mut queued = 0;
        for frame in frames {
            if frame.len() > max {
                return Err(XskError::FrameTooBig {
                    len: frame.len(),
                    frame_size: self.frame_size,
                });
            }
            let deadline = Instant::now() + Duration::from_secs(1);
            loop {
                let mut once = Some(frame);
                let n = self.transmit_inner(&mut |buf| {
                    let f = once.take()?;
                    buf[..f.len()].copy_from_slice(f);
                    Some(f.len())
                })?;
                if n == 1 {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(XskError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no TX frame came back from the completion ring within 1 s",
                    )));
                }
                self.wait_tx(1)?;
            }
            queued += 1;
        }
        Ok(queued)
    }

    fn max_frame_len(&self) -> usize {
        if self.multi_buffer {
            self.mb_max
        } else {
            self.chunk_capacity()
        }
    }

    fn chunk_capacity(&self) -> usize {
        (self.frame_size - XDP_PACKET_HEADROOM) as usize
    }

    /// Multi-buffer TX: the frame is staged, then spread over chunks.
    fn transmit_mb(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<usize, XskError> {
        let cap = self.chunk_capacity();
        let worst = self.mb_max.div_ceil(cap);
        let mut queued = 0;
        let mut too_big = None;
        // Offer a buffer only while a largest frame would still fit.
        while self.tx_free.len() >= worst {
            let len = match fill(&mut self.tx_stage[..self.mb_max]) {
                None => break,
                Some(0) => break,
                Some(len) if len > self.mb_max => {
                    too_big = Some(len);
                    break;
                }
                Some(len) => len,
            };
            let pieces = len.div_ceil(cap);
            for (j, chunk) in self.tx_stage[..len].chunks(cap).enumerate() {
                let mut desc = self.tx_free.pop().expect("counted above");
                // SAFETY: the descriptor came from the free list.
                let mut data = unsafe { self.umem.data_mut(&mut desc) };
                let mut c = data.cursor();
                c.set_pos(0);
                c.write_all(chunk)?;
                desc.set_options(if j + 1 < pieces { XDP_PKT_CONTD } else { 0 });
                self.tx_batch.push(desc);
            }
            self.io_stats.tx_bytes += len as u64;
            queued += 1;
        }
        self.finish_send(queued, too_big)
    }

    fn transmit_inner(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<usize, XskError> {
        self.complete_tx()?;
        self.tx_batch.clear();
        if self.multi_buffer {
            return self.transmit_mb(fill);
        }
        let max = self.max_frame_len();
        let mut too_big = None;
        while let Some(mut desc) = self.tx_free.pop() {
            // SAFETY: the descriptor came from the free list: nobody uses it.
            let mut data = unsafe { self.umem.data_mut(&mut desc) };
            {
                let mut c = data.cursor();
                let cap = c.buf_len();
                c.set_pos(cap);
            }
            let buf = data.contents_mut();
            let cap = buf.len().min(max);
            match fill(&mut buf[..cap]) {
                Some(len) if len > 0 && len <= cap => {
                    // The length must be set every time: a descriptor back
                    // from the completion ring has none.
                    data.cursor().set_pos(len);
                    desc.set_options(0);
                    self.io_stats.tx_bytes += len as u64;
                    self.tx_batch.push(desc);
                }
                Some(0) => {
                    self.tx_free.push(desc);
                    break;
                }
                Some(len) => {
                    self.tx_free.push(desc);
                    too_big = Some(len);
                    break;
                }
                None => {
                    self.tx_free.push(desc);
                    break;
                }
            }
        }
        let queued = self.tx_batch.len();
        self.finish_send(queued, too_big)
    }

    /// Common end of a send: kick the ring, count, report an oversized frame.
    fn finish_send(&mut self, queued: usize, too_big: Option<usize>) -> Result<usize, XskError> {
        self.flush_tx()?;
        self.io_stats.tx_frames += queued as u64;
        if let Some(len) = too_big {
            self.io_stats.tx_errors += 1;
            return Err(XskError::FrameTooBig {
                len,
                frame_size: self.frame_size,
            });
        }
        Ok(queued)
    }

    fn flush_tx(&mut self) -> Result<(), XskError> {
        if self.tx_batch.is_empty() {
            return Ok(());
        }
        // The TX ring is as large as the TX half of the UMEM, so it always
        // has room for every frame we own.
        // SAFETY: the descriptors were filled above and are owned by us.
        let done = unsafe { self.tx.produce(&self.tx_batch) };
        debug_assert_eq!(done, self.tx_batch.len());
        // Anything the ring did not take goes back to the free list.
        self.tx_free.extend_from_slice(&self.tx_batch[done..]);
        self.tx_batch.clear();
        if done > 0 && (!self.need_wakeup || self.tx.needs_wakeup()) {
            // Copy mode sends at most 32 frames per kick (the kernel's TX
            // batch); kick once per 32 so the whole batch leaves now.
            for _ in 0..done.div_ceil(32) {
                self.io_stats.tx_kicks += 1;
                kick(self.raw_fd(), false)?;
            }
        }
        Ok(())
    }

    /// Kicks the kernel if frames wait on the TX ring and it asks for it
    /// (in copy mode it always does: TX only progresses inside sendto),
    /// then reclaims completed frames.
    fn complete_tx(&mut self) -> std::io::Result<()> {
        self.reclaim();
        if self.tx_free.len() < self.tx_total && (!self.need_wakeup || self.tx.needs_wakeup()) {
            self.io_stats.tx_kicks += 1;
            kick(self.raw_fd(), false)?;
            self.reclaim();
        }
        Ok(())
    }

    /// Moves completed TX frames back to the free list.
    fn reclaim(&mut self) {
        loop {
            // SAFETY: completed descriptors are ours again.
            let n = unsafe { self.comp.consume(&mut self.comp_batch) };
            self.tx_free.extend_from_slice(&self.comp_batch[..n]);
            if n < self.comp_batch.len() {
                break;
            }
        }
    }

    /// Waits up to `timeout_ms` for a TX frame to complete.
    fn wait_tx(&mut self, timeout_ms: u64) -> Result<bool, XskError> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            self.complete_tx()?;
            if !self.tx_free.is_empty() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Frames in flight (queued on the TX ring, not yet completed).
    pub fn tx_in_flight(&mut self) -> usize {
        let _ = self.complete_tx();
        self.tx_total - self.tx_free.len()
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

    fn folded_stats(&mut self) -> IoStats {
        let mut s = self.io_stats;
        if let Ok(k) = XskSocket::stats(self) {
            s.rx_dropped += k.rx_dropped + k.rx_ring_full + k.rx_invalid_descs;
            s.tx_errors += k.tx_invalid_descs;
        }
        s
    }
}

impl PacketIo for XskSocket {
    fn name(&self) -> &'static str {
        "afxdp"
    }

    fn max_frame_len(&self) -> usize {
        XskSocket::max_frame_len(self)
    }

    fn oversize_hint(&self) -> &'static str {
        MTU4096_HINT
    }

    fn recv_batch(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> super::Result<usize> {
        Ok(self.recv_inner(poll_ms(timeout), on_frame)?)
    }

    fn transmit(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> super::Result<usize> {
        Ok(self.transmit_inner(fill)?)
    }

    fn wait_writable(&mut self, timeout: Duration) -> super::Result<bool> {
        Ok(self.wait_tx(timeout.as_millis() as u64)?)
    }

    fn stats(&mut self) -> IoStats {
        self.folded_stats()
    }

    fn poll_fd(&self) -> Option<i32> {
        Some(self.raw_fd())
    }
}

/// Number of RX queues of `iface`: ethtool's channel count (works in the
/// caller's network namespace), else /sys/class/net/IF/queues, else 1.
pub fn rx_queue_count(iface: &str) -> u32 {
    ethtool_rx_queues(iface)
        .or_else(|| sysfs_rx_queues(iface))
        .unwrap_or(1)
        .max(1)
}

fn sysfs_rx_queues(iface: &str) -> Option<u32> {
    let dir = fs::read_dir(format!("/sys/class/net/{iface}/queues")).ok()?;
    let n = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count() as u32;
    (n > 0).then_some(n)
}

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GCHANNELS: u32 = 0x3c;

#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

fn ethtool_rx_queues(iface: &str) -> Option<u32> {
    let name = CString::new(iface).ok()?;
    if name.as_bytes().len() >= libc::IFNAMSIZ {
        return None;
    }
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..Default::default()
    };
    // SAFETY: plain socket; ifreq is zeroed and its name NUL-terminated;
    // the ioctl writes only into `ch`, which outlives the call.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
            *d = *s as libc::c_char;
        }
        ifr.ifr_ifru.ifru_data = (&mut ch as *mut EthtoolChannels).cast();
        let rc = libc::ioctl(fd, SIOCETHTOOL as _, &mut ifr);
        libc::close(fd);
        if rc != 0 {
            return None;
        }
    }
    let n = ch.combined_count + ch.rx_count;
    (n > 0).then_some(n)
}

/// One socket per RX queue of an interface, behind one [`PacketIo`]: frames
/// from every queue are received; frames are sent on one queue (the first),
/// which keeps each flow's order.
pub struct XskMultiQueue {
    sockets: Vec<XskSocket>,
    pollfds: Vec<libc::pollfd>,
    /// Queue whose socket receives first next time (fairness).
    next_rx: usize,
}

impl XskMultiQueue {
    /// Opens a socket on every RX queue of `iface` (see [`rx_queue_count`]).
    pub fn open(iface: &str, config: XskConfig) -> Result<Self, XskError> {
        let queues = rx_queue_count(iface);
        Self::open_queues(iface, 0..queues, config)
    }

    /// Opens sockets on the given queues.
    pub fn open_queues(
        iface: &str,
        queues: impl IntoIterator<Item = u32>,
        config: XskConfig,
    ) -> Result<Self, XskError> {
        let sockets = queues
            .into_iter()
            .map(|q| XskSocket::open(iface, q, config))
            .collect::<Result<Vec<_>, _>>()?;
        if sockets.is_empty() {
            return Err(setup_err(iface, 0, "no RX queues to open"));
        }
        let pollfds = sockets
            .iter()
            .map(|s| libc::pollfd {
                fd: s.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        Ok(Self {
            sockets,
            pollfds,
            next_rx: 0,
        })
    }

    pub fn sockets(&self) -> &[XskSocket] {
        &self.sockets
    }

    /// The sockets, one per queue (e.g. for per-queue counters).
    pub fn sockets_mut(&mut self) -> &mut [XskSocket] {
        &mut self.sockets
    }

    /// Kernel counters summed over all queues.
    pub fn xsk_stats(&self) -> Result<XskStats, XskError> {
        let mut total = XskStats::default();
        for s in &self.sockets {
            total.add(&s.stats()?);
        }
        Ok(total)
    }
}

impl PacketIo for XskMultiQueue {
    fn name(&self) -> &'static str {
        "afxdp"
    }

    fn max_frame_len(&self) -> usize {
        self.sockets[0].max_frame_len()
    }

    fn oversize_hint(&self) -> &'static str {
        MTU4096_HINT
    }

    fn recv_batch(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> super::Result<usize> {
        let count = self.sockets.len();
        let mut total = 0;
        for i in 0..count {
            let q = (self.next_rx + i) % count;
            total += self.sockets[q].recv_inner(0, on_frame)?;
        }
        self.next_rx = (self.next_rx + 1) % count;
        if total > 0 || timeout.is_zero() {
            return Ok(total);
        }
        if count == 1 {
            return Ok(self.sockets[0].recv_inner(poll_ms(timeout), on_frame)?);
        }
        for p in &mut self.pollfds {
            p.revents = 0;
        }
        // SAFETY: pollfds is a valid array of `count` entries.
        let rc = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                poll_ms(timeout),
            )
        };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(0);
            }
            return Err(e.into());
        }
        for q in 0..count {
            if self.pollfds[q].revents & libc::POLLIN != 0 {
                total += self.sockets[q].recv_inner(0, on_frame)?;
            }
        }
        Ok(total)
    }

    fn transmit(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> super::Result<usize> {
        Ok(self.sockets[0].transmit_inner(fill)?)
    }

    fn wait_writable(&mut self, timeout: Duration) -> super::Result<bool> {
        PacketIo::wait_writable(&mut self.sockets[0], timeout)
    }

    fn stats(&mut self) -> IoStats {
        let mut t = IoStats::default();
        for s in &mut self.sockets {
            let x = s.folded_stats();
            t.rx_frames += x.rx_frames;
            t.rx_bytes += x.rx_bytes;
            t.tx_frames += x.tx_frames;
            t.tx_bytes += x.tx_bytes;
            t.rx_dropped += x.rx_dropped;
            t.tx_errors += x.tx_errors;
            t.tx_kicks += x.tx_kicks;
        }
        t
    }

    fn poll_fd(&self) -> Option<i32> {
        (self.sockets.len() == 1).then(|| self.sockets[0].raw_fd())
    }

    fn poll_fds(&self) -> Vec<i32> {
        self.sockets.iter().map(|s| s.raw_fd()).collect()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_limits_and_queue_count_fallback() {
        let c = XskConfig::default();
        assert_eq!(c.max_frame_len(), 3840);
        // RoCE path MTU 2048 frames fit; 4096 ones do not.
        assert!(14 + 20 + 8 + 12 + 16 + 2048 + 4 <= c.max_frame_len());
        assert!(14 + 20 + 8 + 12 + 4096 + 4 > c.max_frame_len());
        assert_eq!(rx_queue_count("lo"), 1);
        assert_eq!(rx_queue_count("no-such-if0"), 1);
        let e: IoError = XskError::FrameTooBig {
            len: 4200,
            frame_size: 4096,
        }
        .into();
        assert!(e.to_string().contains("multi-buffer"), "{e}");
    }
}
