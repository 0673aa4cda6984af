//! Packet I/O backends: they move RoCEv2 packets between the wire and the
//! transport engine and know nothing of RDMA.
//!
//! The engine's unit is the datagram ([`RxDatagram`], [`Transmit`]: the
//! UDP payload, BTH .. ICRC, with addresses, ports and ECN/DSCP); each
//! backend owns the headers below it and the ICRC
//! ([`PacketIo::recv_datagrams`], [`PacketIo::transmit_datagrams`]). Every
//! backend also moves whole Ethernet frames ([`PacketIo::recv_batch`],
//! [`PacketIo::transmit`]), for tests and tools that make or check frames
//! themselves. Every backend implements [`PacketIo`]:
//!
//! - [`afxdp::XskSocket`] / [`afxdp::XskMultiQueue`]: AF_XDP on a device
//!   with xroce's XDP program attached (the fast path); it writes and
//!   checks Ethernet, IP, UDP and the ICRC.
//! - [`udp::UdpBackend`]: a kernel UDP socket on port 4791 for hosts where
//!   XDP cannot be attached; the kernel writes the headers, the backend
//!   computes and checks the ICRC over the ones the kernel actually sends
//!   and received.
//! - [`channel::ChannelIo`]: an in-memory pair for tests (frames).
//!
//! # Driving a backend
//!
//! ```ignore
//! loop {
//!     let now = clock_ns();
//!     // Let the engine write frames straight into the backend's buffers
//!     // (it keeps what does not fit for the next round).
//!     io.transmit_datagrams(&mut |buf| engine.poll_transmit(now, buf))?;
//!     // Wait for frames no longer than the engine's next timer.
//!     let wait = engine
//!         .poll_timeout()
//!         .map_or(MAX_WAIT, |t| Duration::from_nanos(t.saturating_sub(now)))
//!         .min(MAX_WAIT);
//!     let now = clock_ns();
//!     io.recv_datagrams(wait, &mut |r| match r {
//!         Ok(d) => engine.handle_datagram(&d, now),
//!         Err(rejected) => engine.count_rejected(&rejected),
//!     })?;
//!     engine.handle_timeout(clock_ns());
//! }
//! ```
//!
//! A runtime that also waits on other sources (a CQ eventfd, a timerfd)
//! polls [`PacketIo::poll_fds`] and calls `recv_batch` with a zero wait.
//!
//! Neither call allocates per packet: RX datagrams are borrowed from the
//! backend's buffers for the duration of the callback, TX datagrams are
//! written into them. `transmit` never blocks on a full ring; it returns how
//! many frames it took and the engine keeps the rest for the next round
//! ([`PacketIo::wait_writable`] waits for room).

pub mod afxdp;
pub mod channel;
pub mod shared;
mod sockopt;
pub mod udp;

/// The RoCEv2 codec the frames are made of (re-exported so that users of
/// the I/O layer, such as the end-to-end tests, need no second dependency).
pub use xroce_wire as wire;

pub use xroce_transport::engine::{gather::Gather, Rejected, RxDatagram, Transmit};

use std::time::Duration;

use xroce_transport::engine::frame;

/// One packet a backend received: the datagram for the engine, or what
/// it dropped and why (for the engine's counters,
/// [`crate::engine::Engine::count_rejected`]).
pub type Received<'a> = std::result::Result<RxDatagram<'a>, Rejected>;

xroce_transport::counters! {
    /// Counters every backend keeps (monotonic since it was opened),
    /// published as `io_<field>` by stats_export.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct IoStats {
        pub rx_frames: u64,
        /// Whole-frame bytes (Ethernet header to ICRC), as the engine sees them.
        pub rx_bytes: u64,
        pub tx_frames: u64,
        /// Whole-frame bytes handed to the backend and sent.
        pub tx_bytes: u64,
        /// Frames the backend threw away on receive (not RoCEv2, truncated,
        /// bigger than a buffer, socket/ring drops reported by the kernel).
        pub rx_dropped: u64,
        /// Of those, frames the kernel dropped because the receive ring was
        /// full (the I/O thread read too slowly).
        pub rx_ring_full: u64,
        /// Times the kernel found the AF_XDP fill ring empty when a frame
        /// came (in copy mode each such frame is dropped and counted in
        /// `rx_dropped` too).
        pub rx_fill_ring_empty: u64,
        /// Frames the backend refused or failed to send.
        pub tx_errors: u64,
        /// Syscalls made to wake the kernel (AF_XDP kicks, sendmmsg calls).
        pub tx_kicks: u64,
        /// Frames that came with the time they reached the host (AF_XDP:
        /// the XDP program's, `xroce_common::rx_meta`; UDP: the socket's
        /// receive timestamp), which the engine then gets as
        /// [`RxDatagram::arrived_ns`].
        pub rx_timestamped: u64,
    }
}

/// Errors of the packet-I/O layer.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("packet I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {len} bytes is larger than this backend's {max}-byte buffers{hint}")]
    FrameTooBig {
        len: usize,
        max: usize,
        hint: &'static str,
    },
    #[error("frame to send is not a RoCEv2 frame the {backend} backend can carry: {detail}")]
    BadFrame {
        backend: &'static str,
        detail: String,
    },
    /// Setting up a backend failed; `source` is the OS error, when there
    /// is one.
    #[error("{what}")]
    Setup {
        what: String,
        #[source]
        source: Option<std::io::Error>,
    },
    /// Opening AF_XDP sockets failed (see [`afxdp::XskError`]).
    #[error(transparent)]
    Xsk(Box<afxdp::XskError>),
    #[error("the I/O thread panicked")]
    ThreadPanicked,
    #[error("the other end of the channel is gone")]
    Closed,
}

pub type Result<T, E = IoError> = std::result::Result<T, E>;

/// A source and sink of RoCEv2 packets, in batches: datagrams for the
/// engine ([`recv_datagrams`](Self::recv_datagrams),
/// [`transmit_datagrams`](Self::transmit_datagrams)), whole Ethernet frames
/// for tests and tools. A backend of frames implements the frame methods
/// and gets the datagram ones, which complete and check frames; a backend
/// of datagrams (UDP) implements both.
pub trait PacketIo: Send {
    /// Short name for stats and reports ("afxdp", "udp", "channel").
    fn name(&self) -> &'static str;

    /// Largest frame (Ethernet header to ICRC) this backend can carry.
    fn max_frame_len(&self) -> usize;

    /// Waits at most `timeout` for the first frame (zero: just looks), then
    /// hands every frame available now, up to one batch, to `on_frame`.
    /// Returns how many frames were handed over.
    fn recv_batch(&mut self, timeout: Duration, on_frame: &mut dyn FnMut(&[u8])) -> Result<usize>;

    /// Offers TX buffers of [`max_frame_len`](Self::max_frame_len) bytes one
    /// at a time; `fill` writes one frame and returns its length, or `None`
    /// when it has nothing more to send. Stops early when the backend has no
    /// free buffer (without blocking); returns how many frames were queued.
    /// `Some(0)` means the same as `None` (nothing written, stop).
    fn transmit(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Result<usize>;

    /// [`recv_batch`](Self::recv_batch) for the engine: hands each packet
    /// as a datagram whose ICRC this backend checked, or as rejected.
    /// By default the frames of `recv_batch`, parsed and checked.
    fn recv_datagrams(
        &mut self,
        timeout: Duration,
        on_datagram: &mut dyn FnMut(Received<'_>),
    ) -> Result<usize> {
        self.recv_batch(timeout, &mut |f| on_datagram(frame::datagram_of(f)))
    }

    /// [`transmit`](Self::transmit) for the engine: `fill` writes a
    /// datagram as [`crate::engine::Engine::poll_transmit`] does and says
    /// where it goes; this backend adds the headers below it and the ICRC.
    /// By default each is completed into a frame for `transmit`.
    fn transmit_datagrams(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<Transmit>,
    ) -> Result<usize> {
        self.transmit(&mut |buf| {
            let t = fill(buf)?;
            Some(frame::complete_frame(&t, buf))
        })
    }

    /// [`transmit_datagrams`](Self::transmit_datagrams) where `fill` may
    /// leave a datagram's payload in registered memory and say where in
    /// the [`Gather`] it is given
    /// ([`crate::engine::Engine::poll_transmit_gather`]): a backend whose
    /// kernel copies from an iovec sends it from there, one copy fewer.
    /// The caller keeps that memory from being deregistered until this
    /// returns. By default the gather is disabled and every payload is
    /// written into the buffer.
    fn transmit_gathered(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8], &mut Gather) -> Option<Transmit>,
    ) -> Result<usize> {
        transmit_copied(self, fill)
    }

    /// Appended to [`IoError::FrameTooBig`] messages: how to get bigger frames.
    fn oversize_hint(&self) -> &'static str {
        ""
    }

    /// Sends copies of `frames` in order; returns how many were queued (fewer
    /// than `frames.len()` when the backend is full). A frame larger than
    /// [`max_frame_len`](Self::max_frame_len) is an error, before anything is sent.
    fn send_batch(&mut self, frames: &[&[u8]]) -> Result<usize> {
        let max = self.max_frame_len();
        if let Some(f) = frames.iter().find(|f| f.len() > max) {
            return Err(IoError::FrameTooBig {
                len: f.len(),
                max,
                hint: self.oversize_hint(),
            });
        }
        let mut next = frames.iter();
        self.transmit(&mut |buf| {
            let f = next.next()?;
            buf[..f.len()].copy_from_slice(f);
            Some(f.len())
        })
    }

    /// Waits at most `timeout` until at least one TX buffer is free again.
    fn wait_writable(&mut self, timeout: Duration) -> Result<bool>;

    /// Counters so far (cheap; backends with kernel counters fold them in).
    fn stats(&mut self) -> IoStats;

    /// A descriptor that polls readable when frames arrive, for runtimes
    /// that wait on several sources (epoll with timers, eventfds); `None`
    /// if the backend has no single one.
    fn poll_fd(&self) -> Option<i32> {
        None
    }

    /// Every descriptor that polls readable when frames arrive (one per RX
    /// queue for multi-queue AF_XDP); empty if the backend has none. After
    /// a wait on them, `recv_batch` with a zero timeout collects the frames.
    fn poll_fds(&self) -> Vec<i32> {
        self.poll_fd().into_iter().collect()
    }

    /// Whether the receive side was over its pressure threshold at the
    /// last `recv_batch` (the AF_XDP RX ring, the UDP socket queue): frames
    /// arrive faster than they are taken. The runtime passes it to the
    /// engine ([`crate::engine::Engine::set_rx_pressure`]), which then
    /// treats arriving data as CE-marked so the senders slow down before
    /// the ring overflows. Backends that cannot tell say `false`.
    fn rx_pressure(&self) -> bool {
        false
    }

    /// The I/O thread is about to sleep (nothing to do for a while): a
    /// backend holding something back sends it now.
    fn before_sleep(&mut self) {}

    /// Whether frames wait to be received, read without a syscall (AF_XDP:
    /// its RX rings); `None` where the backend cannot tell so cheaply. The
    /// runtime lets application threads drive only backends that can
    /// ([`crate::runtime::RuntimeConfig::app_progress`]).
    fn rx_waiting(&mut self) -> Option<bool> {
        None
    }

    /// Whether the kernel already gathers what arrives into few large
    /// reads (the UDP backend with UDP_GRO: a 64 KB datagram per read).
    /// The I/O thread then yields between rounds instead of napping while
    /// a stream runs ([`crate::runtime::RuntimeConfig::stream_nap`]).
    fn coalesces_rx(&self) -> bool {
        false
    }
}

/// [`PacketIo::transmit_gathered`] through `io`'s
/// [`transmit_datagrams`](PacketIo::transmit_datagrams), with the gather
/// disabled: every payload is written into the buffer.
pub(crate) fn transmit_copied<P: PacketIo + ?Sized>(
    io: &mut P,
    fill: &mut dyn FnMut(&mut [u8], &mut Gather) -> Option<Transmit>,
) -> Result<usize> {
    let mut off = Gather::default();
    io.transmit_datagrams(&mut |buf| fill(buf, &mut off))
}

/// A boxed backend is a backend (for code generic over `impl PacketIo`).
impl<T: PacketIo + ?Sized> PacketIo for Box<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn max_frame_len(&self) -> usize {
        (**self).max_frame_len()
    }
    fn recv_batch(&mut self, timeout: Duration, on_frame: &mut dyn FnMut(&[u8])) -> Result<usize> {
        (**self).recv_batch(timeout, on_frame)
    }
    fn transmit(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Result<usize> {
        (**self).transmit(fill)
    }
    fn recv_datagrams(
        &mut self,
        timeout: Duration,
        on_datagram: &mut dyn FnMut(Received<'_>),
    ) -> Result<usize> {
        (**self).recv_datagrams(timeout, on_datagram)
    }
    fn transmit_datagrams(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<Transmit>,
    ) -> Result<usize> {
        (**self).transmit_datagrams(fill)
    }
    fn transmit_gathered(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8], &mut Gather) -> Option<Transmit>,
    ) -> Result<usize> {
        (**self).transmit_gathered(fill)
    }
    fn oversize_hint(&self) -> &'static str {
        (**self).oversize_hint()
    }
    fn send_batch(&mut self, frames: &[&[u8]]) -> Result<usize> {
        (**self).send_batch(frames)
    }
    fn wait_writable(&mut self, timeout: Duration) -> Result<bool> {
        (**self).wait_writable(timeout)
    }
    fn stats(&mut self) -> IoStats {
        (**self).stats()
    }
    fn poll_fd(&self) -> Option<i32> {
        (**self).poll_fd()
    }
    fn poll_fds(&self) -> Vec<i32> {
        (**self).poll_fds()
    }
    fn rx_pressure(&self) -> bool {
        (**self).rx_pressure()
    }
    fn before_sleep(&mut self) {
        (**self).before_sleep()
    }
    fn rx_waiting(&mut self) -> Option<bool> {
        (**self).rx_waiting()
    }
    fn coalesces_rx(&self) -> bool {
        (**self).coalesces_rx()
    }
}

/// Sends all of `frames`, waiting for room up to `timeout` in all; returns
/// how many were sent (all of them unless the time ran out).
pub fn send_all(io: &mut dyn PacketIo, frames: &[&[u8]], timeout: Duration) -> Result<usize> {
    let deadline = std::time::Instant::now() + timeout;
    let mut done = 0;
    while done < frames.len() {
        done += io.send_batch(&frames[done..])?;
        if done == frames.len() {
            break;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        io.wait_writable(left.min(Duration::from_millis(10)))?;
    }
    Ok(done)
}

/// Whether the receive queue of socket `fd` holds at least `1/fraction` of
/// its receive buffer (SO_MEMINFO: the bytes queued against SO_RCVBUF), the
/// pressure threshold of socket backends ([`PacketIo::rx_pressure`]).
/// `false` if the kernel will not say.
pub(crate) fn socket_rx_queue_over(fd: i32, fraction: u32) -> bool {
    // SK_MEMINFO_RMEM_ALLOC, SK_MEMINFO_RCVBUF, then others we ignore.
    let mut info = [0u32; 16];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `info`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    rc == 0
        && len >= 8
        && info[1] > 0
        && u64::from(info[0]) * u64::from(fraction.max(1)) >= u64::from(info[1])
}

/// Milliseconds for poll(2), rounding a sub-millisecond wait up.
pub(crate) fn poll_ms(timeout: Duration) -> i32 {
    if timeout.is_zero() {
        0
    } else {
        timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
    }
}
