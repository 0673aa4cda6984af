//! The capture tap: copies of the frames an xroce process sends, for a
//! running `xroce capture`.
//!
//! Frames an xroce process sends (through AF_XDP or its UDP socket) never
//! pass the XDP program that shows the capture what arrives, so every
//! sending process copies them itself. [`Tapped`] wraps a backend: while a
//! capture of the interface runs, each frame it transmits is copied, as the
//! engine wrote it, into a batch that goes to the capture as one Unix
//! datagram at the end of the `transmit` call. The capture side is
//! [`TapListener`].
//!
//! # Rendezvous
//!
//! The capture binds a `SOCK_DGRAM` Unix socket at [`tap_path`]:
//! `/run/xroce-capture/<netns>.<ifindex>.sock`, `<netns>` the inode of the
//! calling thread's network namespace (an ifindex means something only
//! within one). A sender without a capture looks for that path at most
//! every [`LOOK_EVERY`] (one `stat` then, nothing per frame), connects when
//! it appears and goes back to looking when a send says the capture is
//! gone.
//!
//! # Trust
//!
//! The folder is made by the capture (root), mode 0755; the socket is 0666
//! so that unprivileged processes (the UDP backend run as `nobody`) can
//! send their copies too. A sender connects only if the folder is a real
//! directory owned by root (or by the sender's own user: only it or root
//! could have made that one, OpenSSH's StrictModes rule) and writable by
//! nobody else: no other local user can plant a socket there that would
//! receive copies of everybody's frames. In the other direction anyone may
//! send to the socket, so the listener trusts nothing in a datagram: it
//! checks every length, takes the sender's pid from the kernel
//! (`SCM_CREDENTIALS`) rather than from the record, and leaves no room for
//! descriptors a sender might pass.
//!
//! # Records
//!
//! A datagram holds one or more records, each starting 8-byte aligned;
//! every field is little-endian:
//!
//! | offset | field      | meaning                                           |
//! |-------:|------------|---------------------------------------------------|
//! |      0 | `magic`    | u32 [`MAGIC`], the bytes "XCTP"                   |
//! |      4 | `caplen`   | u32, frame bytes that follow the header           |
//! |      8 | `orig_len` | u32, the frame's length (more when cut at [`SNAPLEN`]) |
//! |     12 | `flags`    | u32, bit 0 [`FLAG_OUTBOUND`]; the others zero, ignored |
//! |     16 | `pid`      | u32, the sender's pid as it sees it               |
//! |     20 | `tap`      | u32, which tap of that process ([`CaptureTap::id`]) |
//! |     24 | `seq`      | u64, the tap's sequence number of the frame       |
//! |     32 | `ts_ns`    | u64, CLOCK_MONOTONIC ns when the frame was copied |
//! |     40 | frame      | `caplen` bytes, then zeros up to a multiple of 8  |
//!
//! `seq` counts every frame the tap copied while connected, delivered or
//! not, so the listener counts what was lost from the gaps. It is per tap,
//! not per process: a sharded process has one tap per I/O thread, each
//! sending from its own socket, and their datagrams interleave in any
//! order. CLOCK_MONOTONIC is the clock of `bpf_ktime_get_ns`, which the
//! XDP side's timestamps use.
//!
//! # Queueing
//!
//! An AF_UNIX datagram is charged to the sender's SO_SNDBUF until it is
//! read, and the receiver's queue is limited to `net.unix.max_dgram_qlen`
//! (default 10) datagrams, whatever its SO_RCVBUF. Hence ~60 KiB batches
//! (fewer datagrams for the same frames) and a sender buffer that holds a
//! full queue of them. A send that finds no room drops its batch and counts
//! the frames: the data path never waits for the capture.

use std::{
    collections::HashMap,
    fs, io,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd},
        unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt},
    },
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    poll::{poll, PollFd, PollFlags, PollTimeout},
    sys::socket::{
        bind, connect, send, setsockopt, socket, sockopt, AddressFamily, MsgFlags, SockFlag,
        SockType, UnixAddr,
    },
};

use crate::engine::frame::complete_frame;
use crate::io::{Gather, IoStats, PacketIo, Received, Result as IoResult, Transmit};

/// Where captures bind their sockets.
pub const TAP_DIR: &str = "/run/xroce-capture";

/// First field of every record: the bytes "XCTP" read as a little-endian u32.
pub const MAGIC: u32 = 0x5054_4358;

/// Bytes of a record header.
pub const HEADER_LEN: usize = 40;

/// Record flag: a frame this host sent (as opposed to received).
pub const FLAG_OUTBOUND: u32 = 1;

/// Largest datagram a sender makes: a batch is sent before it would grow
/// past this (well under the 208 KiB default SO_SNDBUF, which bounds one
/// AF_UNIX datagram).
pub const MAX_DATAGRAM: usize = 60 * 1024;

/// A batch this large goes out at once ([`CaptureTap::flush_if_due`]).
/// Near a full datagram: the capture's socket queues a few datagrams,
/// whatever their size (net.unix.max_dgram_qlen), so fuller ones carry more.
pub const FLUSH_BYTES: usize = 48 * 1024;

/// A batch waits at most this long for more records, or until the I/O
/// thread is about to block.
pub const FLUSH_AFTER: Duration = Duration::from_millis(1);

/// Frame bytes one record carries at most; a longer frame is cut, keeping
/// its length in `orig_len` (no xroce frame is this long: jumbo frames
/// are 9 KiB).
pub const SNAPLEN: usize = MAX_DATAGRAM - HEADER_LEN;

/// How often a sender without a capture looks for one.
pub const LOOK_EVERY: Duration = Duration::from_millis(20);

/// A sender's SO_SNDBUF: a full receive queue (`max_dgram_qlen` + 1 = 11
/// datagrams by default) of [`MAX_DATAGRAM`]s; the kernel doubles it.
const SENDER_SNDBUF: usize = 512 * 1024;

/// The listener's SO_RCVBUF, as asked for. AF_UNIX datagrams are charged to
/// their senders (see the module doc), so this only matters to kernels that
/// start charging the receiver.
const LISTENER_RCVBUF: usize = 8 << 20;

/// Datagrams one [`TapListener::recv`] reads at most, so that senders that
/// never pause cannot keep the caller from its other descriptors.
const RECV_BURST: usize = 256;

/// Senders the listener tracks gaps of; a sender spraying made-up tap ids
/// resets the table rather than growing it without end.
const MAX_STREAMS: usize = 4096;

/// Bytes of the credentials the kernel attaches to each datagram.
const UCRED_LEN: u32 = std::mem::size_of::<libc::ucred>() as u32;

// Field offsets in a record header.
const OFF_MAGIC: usize = 0;
const OFF_CAPLEN: usize = 4;
const OFF_ORIG_LEN: usize = 8;
const OFF_FLAGS: usize = 12;
const OFF_PID: usize = 16;
const OFF_TAP: usize = 20;
const OFF_SEQ: usize = 24;
const OFF_TS: usize = 32;

/// A record header, decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapHeader {
    pub caplen: u32,
    pub orig_len: u32,
    pub flags: u32,
    pub pid: u32,
    pub tap: u32,
    pub seq: u64,
    pub ts_ns: u64,
}

impl TapHeader {
    /// The header's bytes, magic included.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        let mut put32 = |at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put32(OFF_MAGIC, MAGIC);
        put32(OFF_CAPLEN, self.caplen);
        put32(OFF_ORIG_LEN, self.orig_len);
        put32(OFF_FLAGS, self.flags);
        put32(OFF_PID, self.pid);
        put32(OFF_TAP, self.tap);
        b[OFF_SEQ..OFF_SEQ + 8].copy_from_slice(&self.seq.to_le_bytes());
        b[OFF_TS..OFF_TS + 8].copy_from_slice(&self.ts_ns.to_le_bytes());
        b
    }

    /// The header at the start of `bytes`; `None` if they are too short or
    /// the magic is wrong (lengths are checked by the caller, which knows
    /// what follows).
    pub fn decode(bytes: &[u8]) -> Option<TapHeader> {
        let b = bytes.get(..HEADER_LEN)?;
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        (u32_at(OFF_MAGIC) == MAGIC).then(|| TapHeader {
            caplen: u32_at(OFF_CAPLEN),
            orig_len: u32_at(OFF_ORIG_LEN),
            flags: u32_at(OFF_FLAGS),
            pid: u32_at(OFF_PID),
            tap: u32_at(OFF_TAP),
            seq: u64_at(OFF_SEQ),
            ts_ns: u64_at(OFF_TS),
        })
    }
}

/// Bytes a record of `caplen` frame bytes takes, padding included.
pub fn record_len(caplen: usize) -> usize {
    HEADER_LEN + caplen.next_multiple_of(8)
}

/// Appends a record of `frame` (which must be `header.caplen` bytes) to
/// `out`, padded to 8.
pub fn encode_record(header: &TapHeader, frame: &[u8], out: &mut Vec<u8>) {
    debug_assert_eq!(frame.len(), header.caplen as usize);
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(frame);
    out.resize(out.len().next_multiple_of(8), 0);
}

/// The records of one datagram, in order; an `Err` at the first malformed
/// one (after which the iterator ends).
struct Records<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(TapHeader, &'a [u8]), ()>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.data.get(self.at..).filter(|r| !r.is_empty())?;
        let parsed = TapHeader::decode(rest).and_then(|h| {
            let frame = rest.get(HEADER_LEN..HEADER_LEN.checked_add(h.caplen as usize)?)?;
            (h.orig_len >= h.caplen).then_some((h, frame))
        });
        match parsed {
            Some((h, frame)) => {
                // The last record's padding may be left out.
                self.at = self.at.saturating_add(record_len(frame.len()));
                Some(Ok((h, frame)))
            }
            None => {
                self.at = self.data.len();
                Some(Err(()))
            }
        }
    }
}

/// The socket path of interface `ifindex` in the calling thread's network
/// namespace.
pub fn tap_path(ifindex: u32) -> io::Result<PathBuf> {
    // The inode of the namespace, as device/root_lock.rs names its holds.
    let netns = fs::metadata("/proc/thread-self/ns/net")?.ino();
    Ok(Path::new(TAP_DIR).join(format!("{netns}.{ifindex}.sock")))
}

/// The folder of a socket path.
fn folder_of(path: &Path) -> io::Result<&Path> {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "tap socket path has no folder"))
}

/// Whether `dir` may hold tap sockets (see the module doc): a directory,
/// not a symlink, owned by root or by us, writable by its owner alone.
fn check_trusted_dir(dir: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.is_dir() && (meta.uid() == 0 || meta.uid() == euid) && meta.mode() & 0o022 == 0 {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is not a folder of root's (or ours) that only its owner may write \
             (owner {}, mode {:o}): refusing capture sockets in it",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ),
    ))
}

/// CLOCK_MONOTONIC in ns.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives for
    // the call; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// A new `SOCK_DGRAM | SOCK_CLOEXEC` Unix socket.
fn unix_dgram() -> io::Result<OwnedFd> {
    Ok(socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// Taps made by this process so far: the next one's id.
static NEXT_TAP_ID: AtomicU32 = AtomicU32::new(0);

/// The sending side: copies frames to the capture of one interface, when
/// there is one.
pub struct CaptureTap {
    /// Where the capture's socket would be; `None` if it cannot be known
    /// (no /proc): the tap then stays idle.
    path: Option<PathBuf>,
    /// Connected to a capture.
    sock: Option<OwnedFd>,
    /// Not before then does an idle tap look for a capture again.
    next_look: Instant,
    id: u32,
    /// Our pid, taken at connect (a forked child would send its own).
    pid: u32,
    /// Sequence number of the next frame copied.
    seq: u64,
    /// Records not sent yet, and how many frames they hold.
    batch: Vec<u8>,
    batch_frames: u64,
    /// When the batch's first record was copied.
    batch_since: Instant,
    /// Most bytes of a frame the connected capture keeps.
    snaplen: usize,
    sent: u64,
    dropped: u64,
}

impl CaptureTap {
    /// The tap of interface `ifindex`, in the calling thread's network
    /// namespace (the interface's: the one it was opened in).
    pub fn new(ifindex: u32) -> Self {
        Self::at(tap_path(ifindex).ok())
    }

    /// A tap that looks for a capture socket at `path` (tests; a folder of
    /// one's own is trusted like root's).
    pub fn with_path(path: impl Into<PathBuf>) -> Self {
        Self::at(Some(path.into()))
    }

    fn at(path: Option<PathBuf>) -> Self {
        Self {
            path,
            sock: None,
            next_look: Instant::now(),
            id: NEXT_TAP_ID.fetch_add(1, Ordering::Relaxed),
            pid: std::process::id(),
            seq: 0,
            batch: Vec::new(),
            batch_frames: 0,
            batch_since: Instant::now(),
            snaplen: SNAPLEN,
            sent: 0,
            dropped: 0,
        }
    }

    /// Which tap of this process it is (the records' `tap` field).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Connected to a capture now.
    pub fn is_connected(&self) -> bool {
        self.sock.is_some()
    }

    /// Frames delivered to captures so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Frames copied while connected whose datagram was not delivered (the
    /// capture's queue was full, or it ended).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Whether frames [`copy`](Self::copy)ed now go to a capture. Without
    /// one it looks for one, if [`LOOK_EVERY`] has passed since the last
    /// look: then a `stat` of the folder (and, when there is a socket, a
    /// connect); otherwise it only reads the clock.
    pub fn ready(&mut self) -> bool {
        if self.sock.is_some() {
            return true;
        }
        let Some(path) = &self.path else {
            return false;
        };
        let now = Instant::now();
        if now < self.next_look {
            return false;
        }
        self.next_look = now + LOOK_EVERY;
        self.sock = Self::connect_to(path).ok();
        // The capture's snap length, if it said (a header-only capture
        // then costs the sender a header's copy per frame).
        self.snaplen = fs::read_to_string(snaplen_path(path))
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok())
            .map_or(SNAPLEN, |n| n.clamp(1, SNAPLEN));
        if self.sock.is_some() {
            self.pid = std::process::id();
            // Room for every record of a batch before the first send.
            self.batch.reserve(MAX_DATAGRAM);
        }
        self.sock.is_some()
    }

    fn connect_to(path: &Path) -> io::Result<OwnedFd> {
        check_trusted_dir(folder_of(path)?)?;
        // Most looks while a folder exists find another interface's
        // capture: a stat is cheaper than socket + connect + close.
        if !fs::symlink_metadata(path)?.file_type().is_socket() {
            return Err(io::ErrorKind::NotFound.into());
        }
        let fd = unix_dgram()?;
        connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
        // Root may go past net.core.wmem_max; others get what it allows.
        if setsockopt(&fd, sockopt::SndBufForce, &SENDER_SNDBUF).is_err() {
            let _ = setsockopt(&fd, sockopt::SndBuf, &SENDER_SNDBUF);
        }
        Ok(fd)
    }

    /// Copies `frame` into the batch, if connected (sending the batch first
    /// if the record would not fit).
    pub fn copy(&mut self, frame: &[u8]) {
        if self.sock.is_none() {
            return;
        }
        let caplen = frame.len().min(self.snaplen);
        if self.batch.len() + record_len(caplen) > MAX_DATAGRAM {
            self.flush();
            if self.sock.is_none() {
                return;
            }
        }
        let header = TapHeader {
            caplen: caplen as u32,
            orig_len: frame.len().try_into().unwrap_or(u32::MAX),
            flags: FLAG_OUTBOUND,
            pid: self.pid,
            tap: self.id,
            seq: self.seq,
            ts_ns: monotonic_ns(),
        };
        self.seq += 1;
        if self.batch.is_empty() {
            self.batch_since = Instant::now();
        }
        encode_record(&header, &frame[..caplen], &mut self.batch);
        self.batch_frames += 1;
    }

    /// Sends the batch if it is large or has waited [`FLUSH_AFTER`]: a
    /// datagram per transmit call cost the sender a syscall every few
    /// frames (WRITE at 0.25 x its uncaptured rate on a 2-core host).
    pub fn flush_if_due(&mut self) {
        if self.batch.len() >= FLUSH_BYTES || self.batch_since.elapsed() >= FLUSH_AFTER {
            self.flush();
        }
    }

    /// Sends the batch as one datagram, without waiting. A full queue drops
    /// it (counted); a capture that is gone disconnects the tap, which
    /// looks again after [`LOOK_EVERY`].
    pub fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let frames = std::mem::take(&mut self.batch_frames);
        let result = match &self.sock {
            // NOSIGNAL: the tap must never SIGPIPE the process.
            Some(sock) => send(
                sock.as_raw_fd(),
                &self.batch,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            ),
            None => Err(Errno::ENOTCONN),
        };
        self.batch.clear();
        match result {
            Ok(_) => self.sent += frames,
            // No room (a slow capture) or a transient failure: lose this
            // batch, keep the connection.
            Err(
                Errno::EAGAIN | Errno::ENOBUFS | Errno::EINTR | Errno::ENOMEM | Errno::EMSGSIZE,
            ) => {
                self.dropped += frames;
            }
            // ECONNREFUSED, ENOTCONN, EPIPE, ENOENT: the capture ended;
            // anything else: start over with whatever capture comes next.
            Err(_) => {
                self.dropped += frames;
                self.sock = None;
                self.next_look = Instant::now() + LOOK_EVERY;
            }
        }
    }
}

impl Drop for CaptureTap {
    /// What is batched goes to the capture before the process leaves.
    fn drop(&mut self) {
        self.flush();
    }
}

/// A backend whose transmitted frames are also copied to a running
/// `xroce capture` ([`CaptureTap`]); everything else goes straight to the
/// backend.
pub struct Tapped<P: ?Sized> {
    tap: CaptureTap,
    inner: P,
}

impl<P: PacketIo> Tapped<P> {
    /// `inner` with the tap of interface `ifindex` (see [`CaptureTap::new`]).
    pub fn new(inner: P, ifindex: u32) -> Self {
        Self::with_tap(inner, CaptureTap::new(ifindex))
    }

    pub fn with_tap(inner: P, tap: CaptureTap) -> Self {
        Self { tap, inner }
    }

    pub fn into_inner(self) -> P {
        self.inner
    }
}

impl<P: ?Sized> Tapped<P> {
    pub fn tap(&self) -> &CaptureTap {
        &self.tap
    }

    pub fn inner(&self) -> &P {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }
}

impl<P: PacketIo + ?Sized> PacketIo for Tapped<P> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }

    fn recv_batch(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> IoResult<usize> {
        // About to wait: what is batched goes now, not after the wait.
        if timeout.is_zero() {
            self.tap.flush_if_due();
        } else {
            self.tap.flush();
        }
        self.inner.recv_batch(timeout, on_frame)
    }

    fn transmit(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> IoResult<usize> {
        if !self.tap.ready() {
            return self.inner.transmit(fill);
        }
        let tap = &mut self.tap;
        // Copied as `fill` wrote it, before the backend sees it (the UDP
        // backend rewrites headers in place). A frame the backend then
        // refuses (an error) is in the capture all the same, as a frame
        // the driver drops is in tcpdump's.
        let sent = self.inner.transmit(&mut |buf: &mut [u8]| {
            let len = fill(buf)?;
            if let Some(frame) = buf.get(..len).filter(|f| !f.is_empty()) {
                tap.copy(frame);
            }
            Some(len)
        });
        self.tap.flush_if_due();
        sent
    }

    fn recv_datagrams(
        &mut self,
        timeout: Duration,
        on_datagram: &mut dyn FnMut(Received<'_>),
    ) -> IoResult<usize> {
        if timeout.is_zero() {
            self.tap.flush_if_due();
        } else {
            self.tap.flush();
        }
        self.inner.recv_datagrams(timeout, on_datagram)
    }

    /// While a capture runs, each datagram is completed into the frame the
    /// engine's headers make (Ethernet, IP, UDP, its ICRC over them, as a
    /// frame backend sends it), copied, and handed to the backend as that
    /// frame; otherwise the backend takes the datagram itself.
    fn transmit_datagrams(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<Transmit>,
    ) -> IoResult<usize> {
        if !self.tap.ready() {
            return self.inner.transmit_datagrams(fill);
        }
        let tap = &mut self.tap;
        let sent = self.inner.transmit(&mut |buf: &mut [u8]| {
            let t = fill(buf)?;
            let n = complete_frame(&t, buf);
            tap.copy(&buf[..n]);
            Some(n)
        });
        self.tap.flush_if_due();
        sent
    }

    /// Gathered while no capture runs; while one does, every frame is
    /// written whole (the copy the capture gets is made from it).
    fn transmit_gathered(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8], &mut Gather) -> Option<Transmit>,
    ) -> IoResult<usize> {
        if !self.tap.ready() {
            return self.inner.transmit_gathered(fill);
        }
        crate::io::transmit_copied(self, fill)
    }

    fn oversize_hint(&self) -> &'static str {
        self.inner.oversize_hint()
    }

    fn send_batch(&mut self, frames: &[&[u8]]) -> IoResult<usize> {
        // The backend's own send_batch (its default calls its transmit,
        // not ours, so nothing is copied twice); the frames it says it took
        // are the first `sent`.
        let capturing = self.tap.ready();
        let sent = self.inner.send_batch(frames);
        if let (true, Ok(n)) = (capturing, &sent) {
            for frame in frames.iter().take(*n).filter(|f| !f.is_empty()) {
                self.tap.copy(frame);
            }
            self.tap.flush();
        }
        sent
    }

    fn wait_writable(&mut self, timeout: Duration) -> IoResult<bool> {
        self.tap.flush();
        self.inner.wait_writable(timeout)
    }

    fn before_sleep(&mut self) {
        self.tap.flush();
        self.inner.before_sleep();
    }

    fn rx_waiting(&mut self) -> Option<bool> {
        self.inner.rx_waiting()
    }

    fn coalesces_rx(&self) -> bool {
        self.inner.coalesces_rx()
    }

    fn stats(&mut self) -> IoStats {
        self.inner.stats()
    }

    fn poll_fd(&self) -> Option<i32> {
        self.inner.poll_fd()
    }

    fn poll_fds(&self) -> Vec<i32> {
        self.inner.poll_fds()
    }

    fn rx_pressure(&self) -> bool {
        self.inner.rx_pressure()
    }
}

/// One frame a sender copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapRecord<'a> {
    /// The sending process, as the kernel names it to the capture
    /// (`SCM_CREDENTIALS`, in the capture's pid namespace): a sender cannot
    /// claim another's.
    pub pid: u32,
    /// Which tap of that process sent it.
    pub tap: u32,
    pub seq: u64,
    /// CLOCK_MONOTONIC ns when the sender copied it.
    pub ts_ns: u64,
    /// The frame's length; more than `frame.len()` if it was cut.
    pub orig_len: u32,
    pub outbound: bool,
    pub frame: &'a [u8],
}

/// The capture's side: the socket the senders copy their frames to.
pub struct TapListener {
    fd: OwnedFd,
    path: PathBuf,
    /// (device, inode) of the socket file we bound: on drop it is unlinked
    /// only if it is still ours.
    file_id: (u64, u64),
    buf: Vec<u8>,
    /// Room for SCM_CREDENTIALS alone (u64s: cmsghdr alignment).
    cmsg: Vec<u64>,
    /// Next expected seq of each (pid, tap).
    streams: HashMap<(u32, u32), u64>,
    lost: u64,
    malformed: u64,
    datagrams: u64,
}

impl TapListener {
    /// Binds the socket of interface `ifindex` in the calling thread's
    /// network namespace, making [`TAP_DIR`] if needed, and tells the
    /// senders to copy at most `snaplen` bytes of a frame (see
    /// [`set_snaplen`](Self::set_snaplen)).
    pub fn bind(ifindex: u32, snaplen: u32) -> io::Result<Self> {
        let listener = Self::bind_at(&tap_path(ifindex)?)?;
        listener.set_snaplen(snaplen)?;
        Ok(listener)
    }

    /// Binds at `path` (tests: a folder in a temporary directory). The
    /// folder is made (0755) if missing and must pass the senders' check.
    /// A socket already at `path` is replaced if dead (a capture that was
    /// killed), refused if alive (another capture of the interface).
    pub fn bind_at(path: &Path) -> io::Result<Self> {
        let dir = folder_of(path)?;
        // A capture of another interface that ends may remove the folder
        // between our mkdir and our bind: then again.
        let mut tries = 0;
        let fd = loop {
            tries += 1;
            make_folder(dir)?;
            remove_stale(path)?;
            let fd = unix_dgram()?;
            // Before bind: every datagram comes with its sender's pid.
            setsockopt(&fd, sockopt::PassCred, &true)?;
            if setsockopt(&fd, sockopt::RcvBufForce, &LISTENER_RCVBUF).is_err() {
                let _ = setsockopt(&fd, sockopt::RcvBuf, &LISTENER_RCVBUF);
            }
            match bind(fd.as_raw_fd(), &UnixAddr::new(path)?) {
                Ok(()) => break fd,
                Err(Errno::ENOENT) if tries < 3 => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let meta = fs::symlink_metadata(path)?;
        let listener = Self {
            fd,
            path: path.to_path_buf(),
            file_id: (meta.dev(), meta.ino()),
            buf: vec![0; MAX_DATAGRAM],
            // SAFETY: CMSG_SPACE only computes a size.
            cmsg: vec![0; (unsafe { libc::CMSG_SPACE(UCRED_LEN) } as usize).div_ceil(8)],
            streams: HashMap::new(),
            lost: 0,
            malformed: 0,
            datagrams: 0,
        };
        // bind made it 0777 & ~umask; every user's senders must connect.
        // (Should this fail, dropping `listener` unlinks the socket.)
        fs::set_permissions(path, fs::Permissions::from_mode(0o666))?;
        Ok(listener)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Frames the senders lost so far, from the gaps in each sender's
    /// sequence. A sender's count starts at its first record that arrives,
    /// and a loss shows once a later record of the same sender does: frames
    /// dropped before a sender's first delivered record, or after its last,
    /// are not seen.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Datagrams thrown away because they did not parse.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// Datagrams read so far, good or not.
    pub fn datagrams(&self) -> u64 {
        self.datagrams
    }

    /// Waits up to `timeout` (zero: just looks) for a datagram, then reads
    /// those queued now (up to a bound) and hands each record to
    /// `on_record`, in order. Returns how many records were handed over.
    /// A datagram with a malformed record is skipped whole.
    pub fn recv(
        &mut self,
        timeout: Duration,
        on_record: &mut dyn FnMut(TapRecord<'_>),
    ) -> io::Result<usize> {
        let mut delivered = 0;
        let mut waited = timeout.is_zero();
        let start = self.datagrams;
        while self.datagrams - start < RECV_BURST as u64 {
            let Some((len, pid)) = self.recv_datagram()? else {
                if waited || self.datagrams > start {
                    break;
                }
                waited = true;
                let ms =
                    PollTimeout::try_from(crate::io::poll_ms(timeout)).unwrap_or(PollTimeout::MAX);
                let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, ms) {
                    Ok(_) | Err(Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            self.datagrams += 1;
            let Some(len) = len else {
                self.malformed += 1;
                continue;
            };
            delivered += self.deliver(len, pid, on_record);
        }
        Ok(delivered)
    }

    /// Reads one datagram without waiting: `None` if there is none; its
    /// length (`None` if it was cut or came with more than credentials)
    /// and the sender's pid otherwise.
    fn recv_datagram(&mut self) -> io::Result<Option<(Option<usize>, Option<u32>)>> {
        let mut iov = libc::iovec {
            iov_base: self.buf.as_mut_ptr().cast(),
            iov_len: self.buf.len(),
        };
        // SAFETY: msghdr is integers and raw pointers, all-zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = self.cmsg.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&self.cmsg[..]) as _;
        // SAFETY: `msg` points at `iov` (all of `self.buf`) and at
        // `self.cmsg`, with their lengths; all live through the call.
        let n = unsafe {
            libc::recvmsg(
                self.fd.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n < 0 {
            return match Errno::last() {
                Errno::EAGAIN | Errno::EINTR => Ok(None),
                e => Err(e.into()),
            };
        }
        // MSG_CTRUNC: the sender passed more than credentials (descriptors,
        // which the kernel then did not install here); MSG_TRUNC: longer
        // than any sender makes.
        if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Ok(Some((None, None)));
        }
        let mut pid = None;
        // SAFETY: the CMSG_* walk stays within msg_control/msg_controllen
        // as the kernel filled them; CMSG_DATA of an SCM_CREDENTIALS header
        // whose length covers a ucred points at one (read unaligned, the
        // buffer being only 8-byte aligned).
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET
                    && (*c).cmsg_type == libc::SCM_CREDENTIALS
                    && (*c).cmsg_len as usize >= libc::CMSG_LEN(UCRED_LEN) as usize
                {
                    let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    pid = Some(cred.pid as u32);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(Some((Some(n as usize), pid)))
    }

    /// Hands over the records of the datagram in `buf[..len]` if all of
    /// them parse; counts it malformed otherwise.
    fn deliver(
        &mut self,
        len: usize,
        cred_pid: Option<u32>,
        on_record: &mut dyn FnMut(TapRecord<'_>),
    ) -> usize {
        let data = &self.buf[..len];
        let records = || Records { data, at: 0 };
        if data.is_empty() || records().any(|r| r.is_err()) {
            self.malformed += 1;
            return 0;
        }
        let mut n = 0;
        for (h, frame) in records().flatten() {
            let pid = cred_pid.unwrap_or(h.pid);
            let next = self.streams.get(&(pid, h.tap)).copied();
            match next {
                Some(next) if h.seq >= next => self.lost = self.lost.saturating_add(h.seq - next),
                // Back in time: another sender with a reused pid.
                Some(_) => {}
                None if self.streams.len() >= MAX_STREAMS => self.streams.clear(),
                None => {}
            }
            self.streams.insert((pid, h.tap), h.seq.saturating_add(1));
            on_record(TapRecord {
                pid,
                tap: h.tap,
                seq: h.seq,
                ts_ns: h.ts_ns,
                orig_len: h.orig_len,
                outbound: h.flags & FLAG_OUTBOUND != 0,
                frame,
            });
            n += 1;
        }
        n
    }
}

/// Makes the capture folder (0755 whatever the umask) if it is missing and
/// checks it as the senders will.
fn make_folder(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_trusted_dir(dir)
}

/// Clears `path` for a new capture: a dead capture's socket is unlinked; a
/// live one (it accepts a connect) or anything that is not a socket is
/// left alone and refused.
fn remove_stale(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        r => r?,
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    let probe = unix_dgram()?;
    match connect(probe.as_raw_fd(), &UnixAddr::new(path)?) {
        Ok(()) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "another capture of this interface is running (it listens at {})",
                path.display()
            ),
        )),
        Err(Errno::ECONNREFUSED) => match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        Err(e) => Err(e.into()),
    }
}

impl AsRawFd for TapListener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for TapListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Beside the socket: the capture's snap length, which senders read when
/// they connect.
pub fn snaplen_path(sock: &Path) -> PathBuf {
    let mut p = sock.as_os_str().to_owned();
    p.push(".snaplen");
    PathBuf::from(p)
}

impl TapListener {
    /// Tells senders that connect from now on to copy at most `snaplen`
    /// bytes of each frame.
    pub fn set_snaplen(&self, snaplen: u32) -> io::Result<()> {
        let file = snaplen_path(&self.path);
        let mut tmp = file.as_os_str().to_owned();
        tmp.push(".tmp");
        fs::write(&tmp, format!("{snaplen}\n"))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644))?;
        fs::rename(&tmp, &file)
    }
}

impl Drop for TapListener {
    fn drop(&mut self) {
        let _ = fs::remove_file(snaplen_path(&self.path));
        // Unlinked only if still ours; the folder goes with the last
        // capture (rmdir fails while another's socket is in it).
        if fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file_id) {
            let _ = fs::remove_file(&self.path);
        }
        if let Some(dir) = self.path.parent() {
            let _ = fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    /// Generous bound on waits for events that come quickly.
    const DEADLINE: Duration = Duration::from_secs(10);

    /// A backend that keeps what it transmits.
    struct Recorder {
        sent: Vec<Vec<u8>>,
        buf: Vec<u8>,
        per_call: usize,
    }

    impl Recorder {
        fn new(max_frame_len: usize) -> Self {
            Self {
                sent: Vec::new(),
                buf: vec![0; max_frame_len],
                per_call: 64,
            }
        }
    }

    impl PacketIo for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn max_frame_len(&self) -> usize {
            self.buf.len()
        }
        fn recv_batch(&mut self, _: Duration, _: &mut dyn FnMut(&[u8])) -> IoResult<usize> {
            Ok(0)
        }
        fn transmit(
            &mut self,
            fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        ) -> IoResult<usize> {
            let mut n = 0;
            while n < self.per_call {
                match fill(&mut self.buf) {
                    Some(len) if len > 0 && len <= self.buf.len() => {
                        self.sent.push(self.buf[..len].to_vec());
                        n += 1;
                    }
                    _ => break,
                }
            }
            Ok(n)
        }
        fn wait_writable(&mut self, _: Duration) -> IoResult<bool> {
            Ok(true)
        }
        fn stats(&mut self) -> IoStats {
            IoStats::default()
        }
    }

    /// A folder of this test's own under the temporary directory, removed
    /// when dropped.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("xroce-tap-{name}.{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir(&dir).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
            Self(dir)
        }
        fn sock(&self) -> PathBuf {
            self.0.join("tap.sock")
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// `n` frames of different lengths and contents, starting at `first`.
    fn frames(first: usize, n: usize, max_len: usize) -> Vec<Vec<u8>> {
        (first..first + n)
            .map(|i| {
                let len = 60 + (i * 997) % (max_len - 60);
                (0..len).map(|b| (b * 31 + i) as u8).collect()
            })
            .collect()
    }

    /// Transmits `frames` in one call; returns how many the backend took.
    fn transmit_only(io: &mut impl PacketIo, frames: &[Vec<u8>]) -> usize {
        let mut next = frames.iter();
        io.transmit(&mut |buf| {
            let f = next.next()?;
            buf[..f.len()].copy_from_slice(f);
            Some(f.len())
        })
        .unwrap()
    }

    /// [`transmit_only`], then lets the I/O thread "sleep", which sends
    /// what the tap batched (as the runtime does when it runs out of work).
    fn transmit(io: &mut impl PacketIo, frames: &[Vec<u8>]) -> usize {
        let n = transmit_only(io, frames);
        io.before_sleep();
        n
    }

    /// An owned copy of a record.
    #[derive(Debug)]
    struct Got {
        pid: u32,
        tap: u32,
        seq: u64,
        ts_ns: u64,
        orig_len: u32,
        outbound: bool,
        frame: Vec<u8>,
    }

    fn recv_into(listener: &mut TapListener, timeout: Duration, got: &mut Vec<Got>) -> usize {
        listener
            .recv(timeout, &mut |r| {
                got.push(Got {
                    pid: r.pid,
                    tap: r.tap,
                    seq: r.seq,
                    ts_ns: r.ts_ns,
                    orig_len: r.orig_len,
                    outbound: r.outbound,
                    frame: r.frame.to_vec(),
                })
            })
            .unwrap()
    }

    fn tapped(dir: &TestDir, max_frame_len: usize) -> Tapped<Recorder> {
        Tapped::with_tap(
            Recorder::new(max_frame_len),
            CaptureTap::with_path(dir.sock()),
        )
    }

    #[test]
    fn header_round_trips_and_bad_ones_do_not_decode() {
        let h = TapHeader {
            caplen: 3,
            orig_len: 1500,
            flags: FLAG_OUTBOUND,
            pid: 77,
            tap: 5,
            seq: u64::MAX - 1,
            ts_ns: 123_456_789_012,
        };
        let bytes = h.encode();
        assert_eq!(&bytes[..4], b"XCTP");
        assert_eq!(TapHeader::decode(&bytes), Some(h));
        assert_eq!(TapHeader::decode(&bytes[..HEADER_LEN - 1]), None);
        let mut bad = bytes;
        bad[0] ^= 1;
        assert_eq!(TapHeader::decode(&bad), None);
        let mut rec = Vec::new();
        encode_record(&h, b"abc", &mut rec);
        assert_eq!(rec.len(), record_len(3));
        assert_eq!(rec.len(), HEADER_LEN + 8);
    }

    #[test]
    fn tap_path_names_namespace_and_interface() {
        let path = tap_path(7).unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        let (ns, rest) = name.split_once('.').unwrap();
        assert!(ns.parse::<u64>().is_ok(), "{name}");
        assert_eq!(rest, "7.sock");
        assert_eq!(path.parent().unwrap(), Path::new(TAP_DIR));
    }

    #[test]
    fn frames_arrive_byte_for_byte_in_order() {
        let dir = TestDir::new("order");
        let mut listener = TapListener::bind_at(&dir.sock()).unwrap();
        let mut io = tapped(&dir, 9000);
        // Up to 9000-byte frames: batches reach the datagram limit and
        // are sent before it, not only at the end of each call.
        let sent = frames(0, 300, 9000);
        let mut got = Vec::new();
        for chunk in sent.chunks(40) {
            assert_eq!(transmit(&mut io, chunk), chunk.len());
            recv_into(&mut listener, Duration::ZERO, &mut got);
        }
        // send_batch goes to the backend's own and is copied as well.
        let more = frames(300, 20, 1500);
        let refs: Vec<&[u8]> = more.iter().map(|f| &f[..]).collect();
        assert_eq!(io.send_batch(&refs).unwrap(), 20);
        recv_into(&mut listener, Duration::ZERO, &mut got);
        let all: Vec<Vec<u8>> = sent.into_iter().chain(more).collect();
        assert_eq!(io.inner().sent, all, "the backend got every frame");
        assert_eq!(got.len(), all.len());
        let tap_id = io.tap().id();
        for (i, (g, f)) in got.iter().zip(&all).enumerate() {
            assert_eq!(g.frame, *f, "frame {i}");
            assert_eq!(g.orig_len as usize, f.len());
            assert_eq!(g.seq, i as u64);
            assert!(g.outbound);
            assert_eq!(g.pid, std::process::id());
            assert_eq!(g.tap, tap_id);
        }
        assert!(got.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
        assert_eq!(io.tap().sent(), all.len() as u64);
        assert_eq!(io.tap().dropped(), 0);
        assert_eq!((listener.lost(), listener.malformed()), (0, 0));
    }

    #[test]
    fn without_a_listener_frames_only_reach_the_backend() {
        let dir = TestDir::new("none");
        let mut io = tapped(&dir, 1500);
        let sent = frames(0, 50, 1500);
        assert_eq!(transmit(&mut io, &sent), 50);
        assert_eq!(io.inner().sent, sent);
        assert!(!io.tap().is_connected());
        assert_eq!((io.tap().sent(), io.tap().dropped()), (0, 0));
        // Nor with no folder at all.
        let mut io = Tapped::with_tap(
            Recorder::new(1500),
            CaptureTap::with_path(dir.0.join("missing/tap.sock")),
        );
        assert_eq!(transmit(&mut io, &sent), 50);
        assert_eq!(io.inner().sent, sent);
        assert!(!io.tap().is_connected());
    }

    #[test]
    fn a_listener_that_comes_later_is_found() {
        let dir = TestDir::new("late");
        let mut io = tapped(&dir, 1500);
        let f = frames(0, 1, 1500);
        transmit(&mut io, &f);
        assert!(!io.tap().is_connected());
        let mut listener = TapListener::bind_at(&dir.sock()).unwrap();
        let mut got = Vec::new();
        let start = Instant::now();
        while got.is_empty() && start.elapsed() < DEADLINE {
            transmit(&mut io, &f);
            recv_into(&mut listener, Duration::from_millis(5), &mut got);
        }
        assert!(!got.is_empty(), "the tap never found the listener");
        // Frames before the connection are not counted.
        assert_eq!(got[0].seq, 0);
        assert_eq!(got[0].frame, f[0]);
    }

    #[test]
    fn a_full_listener_makes_the_sender_drop_not_block() {
        let dir = TestDir::new("full");
        let mut listener = TapListener::bind_at(&dir.sock()).unwrap();
        let mut io = tapped(&dir, 1500);
        let batch = frames(0, 8, 1500);
        // Not read: the queue fills and sends fail at once.
        let mut calls = 0;
        while io.tap().dropped() == 0 && calls < 100_000 {
            transmit(&mut io, &batch);
            calls += 1;
        }
        assert!(io.tap().dropped() > 0, "nothing dropped in {calls} calls");
        for _ in 0..10 {
            transmit(&mut io, &batch);
        }
        let mut got = Vec::new();
        while recv_into(&mut listener, Duration::ZERO, &mut got) > 0 {}
        assert_eq!(got.len() as u64, io.tap().sent());
        // A loss shows when a later frame of the sender arrives.
        transmit(&mut io, &batch);
        recv_into(&mut listener, Duration::from_secs(1), &mut got);
        assert_eq!(got.len() as u64, io.tap().sent());
        assert_eq!(listener.lost(), io.tap().dropped());
        assert_eq!(
            got.last().unwrap().seq + 1,
            io.tap().sent() + io.tap().dropped()
        );
        assert_eq!(io.inner().sent.len(), (calls + 11) * batch.len());
    }

    #[test]
    fn a_listener_that_goes_away_is_left_for_the_next() {
        let dir = TestDir::new("gone");
        let f = frames(0, 3, 1500);
        let mut io = tapped(&dir, 1500);
        let mut first = TapListener::bind_at(&dir.sock()).unwrap();
        transmit(&mut io, &f);
        let mut got = Vec::new();
        recv_into(&mut first, Duration::from_secs(1), &mut got);
        assert_eq!(got.len(), 3);
        drop(first);
        transmit(&mut io, &f);
        assert!(
            !io.tap().is_connected(),
            "still connected to a dead capture"
        );
        let mut second = TapListener::bind_at(&dir.sock()).unwrap();
        let mut again = Vec::new();
        let start = Instant::now();
        while again.is_empty() && start.elapsed() < DEADLINE {
            transmit(&mut io, &f);
            recv_into(&mut second, Duration::from_millis(5), &mut again);
        }
        assert!(!again.is_empty(), "the tap never found the second listener");
        assert!(again[0].seq >= 6, "the tap's sequence goes on");
        assert_eq!(second.lost(), 0);
        assert_eq!(io.inner().sent.len() % 3, 0);
    }

    #[test]
    fn malformed_datagrams_are_counted_and_skipped() {
        let dir = TestDir::new("malformed");
        let mut listener = TapListener::bind_at(&dir.sock()).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        sender.connect(dir.sock()).unwrap();
        let header = |caplen: u32, orig_len: u32, seq: u64| TapHeader {
            caplen,
            orig_len,
            flags: FLAG_OUTBOUND,
            pid: 1,
            tap: 9,
            seq,
            ts_ns: 5,
        };
        let record = |h: &TapHeader, frame: &[u8]| {
            let mut v = Vec::new();
            encode_record(h, frame, &mut v);
            v
        };
        let mut bad_magic = record(&header(4, 4, 0), b"abcd");
        bad_magic[3] = b'Q';
        let mut beyond = record(&header(4, 4, 0), b"abcd");
        beyond[OFF_CAPLEN..OFF_CAPLEN + 4].copy_from_slice(&100u32.to_le_bytes());
        let cut_longer = record(&header(4, 3, 0), b"abcd");
        let mut trailing_junk = record(&header(4, 4, 0), b"abcd");
        trailing_junk.extend_from_slice(&[0xee; 8]);
        let bad: Vec<Vec<u8>> = vec![
            Vec::new(),
            vec![0x58; 10],
            bad_magic,
            beyond,
            cut_longer,
            trailing_junk,
            vec![0; MAX_DATAGRAM + 100],
        ];
        for d in &bad {
            sender.send(d).unwrap();
        }
        let mut good = record(&header(4, 4, 0), b"abcd");
        // The last record's padding may be left out.
        good.extend_from_slice(&record(&header(5, 1000, 1), b"efghi")[..HEADER_LEN + 5]);
        sender.send(&good).unwrap();
        let mut got = Vec::new();
        let start = Instant::now();
        while got.len() < 2 && start.elapsed() < DEADLINE {
            recv_into(&mut listener, Duration::from_millis(100), &mut got);
        }
        assert_eq!(listener.malformed(), bad.len() as u64);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].frame, b"abcd");
        assert_eq!(
            (got[1].frame.as_slice(), got[1].orig_len),
            (&b"efghi"[..], 1000)
        );
        // The pid is the kernel's word, not the record's.
        assert_eq!(got[0].pid, std::process::id());
        assert_eq!(listener.lost(), 0);
    }

    /// Small transmits are batched, not a datagram each: a batch goes out
    /// when it is large, has waited FLUSH_AFTER, or the thread will sleep.
    #[test]
    fn small_transmits_are_batched_until_due() {
        let dir = TestDir::new("batch");
        let mut listener = TapListener::bind_at(&dir.sock()).unwrap();
        let mut io = tapped(&dir, 1500);
        // Connects (the listener exists) and batches one frame.
        transmit_only(&mut io, &frames(0, 1, 100));
        let mut got = Vec::new();
        assert_eq!(
            recv_into(&mut listener, Duration::ZERO, &mut got),
            0,
            "held back"
        );
        io.before_sleep();
        recv_into(&mut listener, Duration::from_secs(5), &mut got);
        assert_eq!(got.len(), 1, "sent before the sleep");
        // Past FLUSH_BYTES a batch goes without a sleep; the rest at the
        // sleep.
        let many = frames(1, 64, 1400);
        assert!(many.iter().map(|f| f.len() + HEADER_LEN).sum::<usize>() > FLUSH_BYTES);
        let taken = transmit_only(&mut io, &many);
        recv_into(&mut listener, Duration::from_secs(5), &mut got);
        assert!(got.len() > 1, "a large batch goes at once");
        io.before_sleep();
        let start = Instant::now();
        while got.len() < 1 + taken && start.elapsed() < DEADLINE {
            recv_into(&mut listener, Duration::from_millis(100), &mut got);
        }
        assert_eq!(got.len(), 1 + taken);
    }

    /// A capture's snap length reaches the senders that connect after it.
    #[test]
    fn senders_copy_no_more_than_the_captures_snap_length() {
        let dir = TestDir::new("snap");
        let mut listener = TapListener::bind_at(&dir.sock()).unwrap();
        listener.set_snaplen(64).unwrap();
        let mut io = tapped(&dir, 1500);
        let f = frames(1, 3, 1500);
        assert!(f.iter().all(|x| x.len() > 64));
        transmit(&mut io, &f);
        let mut got = Vec::new();
        let start = Instant::now();
        while got.len() < 3 && start.elapsed() < DEADLINE {
            recv_into(&mut listener, Duration::from_millis(100), &mut got);
        }
        for (g, want) in got.iter().zip(&f) {
            assert_eq!(
                (g.frame.as_slice(), g.orig_len as usize),
                (&want[..64], want.len())
            );
        }
        assert_eq!(got.len(), 3);
        let side = snaplen_path(&dir.sock());
        drop(listener);
        assert!(!side.exists(), "the snap length goes with the capture");
    }

    #[test]
    fn long_frames_are_cut_to_the_snap_length() {
        let dir = TestDir::new("long");
        let mut listener = TapListener::bind_at(&dir.sock()).unwrap();
        let mut io = tapped(&dir, 70_000);
        let long: Vec<u8> = (0..65_000u32).map(|b| b as u8).collect();
        transmit(&mut io, &[long.clone(), vec![1; 100]]);
        let mut got = Vec::new();
        let start = Instant::now();
        while got.len() < 2 && start.elapsed() < DEADLINE {
            recv_into(&mut listener, Duration::from_millis(100), &mut got);
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].frame, long[..SNAPLEN]);
        assert_eq!(got[0].orig_len, 65_000);
        assert_eq!(got[1].frame, vec![1; 100]);
    }

    #[test]
    fn an_untrusted_folder_is_refused_by_both_sides() {
        let dir = TestDir::new("untrusted");
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o777)).unwrap();
        let err = TapListener::bind_at(&dir.sock()).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        // A socket someone planted there gets nothing.
        let planted = UnixDatagram::bind(dir.sock()).unwrap();
        planted.set_nonblocking(true).unwrap();
        let mut io = tapped(&dir, 1500);
        transmit(&mut io, &frames(0, 3, 1500));
        assert!(!io.tap().is_connected());
        let mut buf = [0u8; 64];
        assert_eq!(
            planted.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }

    #[test]
    fn a_dead_capture_socket_is_replaced_a_live_one_is_not() {
        let dir = TestDir::new("stale");
        drop(UnixDatagram::bind(dir.sock()).unwrap());
        assert!(dir.sock().exists(), "a dead socket's file stays");
        let live = TapListener::bind_at(&dir.sock()).unwrap();
        let err = TapListener::bind_at(&dir.sock()).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(dir.sock().exists(), "the live capture keeps its socket");
        let mode = fs::metadata(dir.sock()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o666);
        drop(live);
        assert!(!dir.sock().exists());
        assert!(
            !dir.0.exists(),
            "the empty folder goes with the last capture"
        );
    }
}
