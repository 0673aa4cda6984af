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
//! Datagrams: the engine's go out through the trait's frame-completing
//! defaults ([`PacketIo::transmit_datagrams`](super::PacketIo::transmit_datagrams)):
//! it writes its datagram into the UMEM chunk behind room for the headers,
//! and Ethernet, IP, UDP and the ICRC go in front of it and into its slot
//! in one pass, with nothing moved or copied. Received frames are parsed
//! and their ICRC checked in one pass
//! ([`PacketIo::recv_datagrams`](super::PacketIo::recv_datagrams)); the
//! engine gets the datagram where it lies in the chunk.
//!
//! Arrival times: the XDP program puts its timestamp in front of every
//! frame it redirects (`xroce_common::rx_meta`, in the XDP metadata that
//! the kernel copies into the chunk right before the frame); the receive
//! loop takes it from there, on the engine's clock, into
//! [`RxDatagram::arrived_ns`], and counts such frames in
//! [`IoStats::rx_timestamped`](super::IoStats::rx_timestamped). The
//! engine's round-trip samples then leave out the time a frame waited on
//! the ring for its thread. One clock read per batch, nothing per frame
//! but a 16-byte read and a 4-byte write in the chunk.
//!
//! Wake-ups: sockets bind with XDP_USE_NEED_WAKEUP, so a kick (sendto /
//! recvfrom with MSG_DONTWAIT) happens only when the kernel flags the ring.
//! Busy polling (SO_PREFER_BUSY_POLL, SO_BUSY_POLL, SO_BUSY_POLL_BUDGET) is
//! asked for when configured; a kernel that refuses it leaves the socket in
//! interrupt mode and [`XskSocket::busy_poll`] says so.
//!
//! One job per file: `socket` opens a socket and answers questions about
//! it, `rings` moves frames through its four rings (the hot path),
//! `queues` finds an interface's RX queues, and `multi_queue` polls one
//! socket per queue behind one [`PacketIo`](super::PacketIo).

mod multi_queue;
mod queues;
mod rings;
mod socket;

pub use multi_queue::XskMultiQueue;
pub use queues::rx_queue_count;
pub use socket::XskSocket;

use super::{IoError, Received, RxDatagram};
use crate::xdp;
use xroce_transport::engine::frame;

/// Bytes the kernel reserves in front of every received frame.
pub const XDP_PACKET_HEADROOM: u32 = 256;

/// Descriptor option: more fragments of this frame follow.
const XDP_PKT_CONTD: u32 = 1;

/// A received frame as the engine takes it (parsed, its ICRC checked),
/// with the arrival time the XDP program gave it.
#[inline]
fn datagram_at(frame: &[u8], arrived_ns: Option<u64>) -> Received<'_> {
    frame::datagram_of(frame).map(|d| RxDatagram { arrived_ns, ..d })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_limits() {
        let c = XskConfig::default();
        assert_eq!(c.max_frame_len(), 3840);
        // RoCE path MTU 2048 frames fit; 4096 ones do not.
        assert!(14 + 20 + 8 + 12 + 16 + 2048 + 4 <= c.max_frame_len());
        assert!(14 + 20 + 8 + 12 + 4096 + 4 > c.max_frame_len());
        let e: IoError = XskError::FrameTooBig {
            len: 4200,
            frame_size: 4096,
        }
        .into();
        assert!(e.to_string().contains("multi-buffer"), "{e}");
    }
}
