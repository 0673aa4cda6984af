//! `xroce capture --iface IF -w FILE`: every RoCEv2 frame xroce's XDP
//! program sees arrive on the interface, and every frame the xroce
//! processes of the device send, in one pcapng (or pcap) file in time
//! order, while the traffic runs as it would without the capture.
//!
//! Nothing is taken from anyone: the XDP program copies each frame it
//! receives into a per-CPU perf buffer before it redirects or passes it
//! (`bpf_xdp_output`, as xdpdump does; `xroce_common::capture`), and each
//! sending process copies its transmitted frames to the capture's Unix
//! socket (`xroce::capture_tap`), since frames sent over AF_XDP (and
//! through the kernel) never pass XDP. Processes that start or stop during
//! the capture are seen as they come and go. A copy the capture cannot
//! take in time (a full perf buffer, a full socket) is lost to the file,
//! never to the traffic, and counted.
//!
//! Holds: the device's capture hold (one capture at a time: the perf
//! buffers take one reader per CPU) and one of root's QPN blocks, so that
//! the device's last process does not detach a program it attached for
//! itself while the capture reads it. It attaches the program itself if
//! none is there (and detaches it at the end if no one else uses it).

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
    fs,
    net::IpAddr,
    os::fd::{AsRawFd, BorrowedFd},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use xroce::{
    capture::{Direction, FileFormat, PcapWriter, WriteOptions, DEFAULT_SNAPLEN},
    capture_tap::TapListener,
    device::{claim_capture, QpnBlock},
    xdp::{self, capture_ring::CaptureRings},
};
use xroce_common::capture::{CaptureMeta, MAX_COPY, META_LEN};
use xroce_report::CaptureReport;

const AFTER_HELP: &str = "\
What is captured: the RoCEv2 frames (UDP port 4791) that arrive on the interface, as \
xroce's XDP program sees them (before it steers them), and the frames the xroce processes \
of this device send (each process copies what it transmits while a capture runs), in time \
order. The running traffic keeps every frame: copies the capture cannot keep up with are \
lost to the file and counted (rx_lost, tx_lost). Frames between two processes of this host \
appear once, as sent. Needs root; attaches the XDP program if none is attached.

pcapng files (the default) mark each frame inbound or outbound; `--format pcap` writes \
classic pcap without directions.

Examples:
  xroce capture -i eth1 -w roce.pcapng -c 1000     then: xroce decode roce.pcapng; tshark -r roce.pcapng
  xroce capture -i eth1 --qpn 0x11 --peer 10.0.0.2 -w qp.pcapng
  xroce capture -i eth1 -w - | tshark -r - -V
  xroce capture -i eth1 --seconds 5 --json";

#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct CaptureArgs {
    /// Interface of the xroce device
    #[arg(long, short = 'i')]
    pub iface: String,
    /// Write the frames to FILE (`-`: stdout), as tcpdump -w
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    pub write: Option<PathBuf>,
    /// File format: pcapng (with each frame's direction) or classic pcap
    #[arg(long, value_enum, default_value_t = Format::Pcapng)]
    pub format: Format,
    /// Stop after N frames (tcpdump -c)
    #[arg(short = 'c', long)]
    pub count: Option<u64>,
    /// Stop after this many seconds (default: at -c or Ctrl-C)
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Bytes kept of each frame; 0 means 262144 (tcpdump -s)
    #[arg(short = 's', long, default_value_t = DEFAULT_SNAPLEN)]
    pub snaplen: u32,
    /// Only frames to this destination QP (BTH DestQP; decimal or 0x hex)
    #[arg(long, value_parser = parse_qpn)]
    pub qpn: Option<u32>,
    /// Only frames with this BTH opcode (decimal or 0x hex, e.g. 0x0a for RC RDMA WRITE ONLY)
    #[arg(long, value_parser = parse_u8)]
    pub opcode: Option<u8>,
    /// Only frames from or to this IP address
    #[arg(long)]
    pub peer: Option<IpAddr>,
    /// Timestamp precision in the file
    #[arg(long = "time-stamp-precision", value_enum, default_value_t = Precision::Micro)]
    pub precision: Precision,
    /// Flush the file after every batch of frames (tcpdump -U; always so with -w -)
    #[arg(short = 'U', long = "packet-buffered")]
    pub packet_buffered: bool,
    /// print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Micro,
    Nano,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Pcapng,
    Pcap,
}

fn parse_u32(s: &str) -> Result<u32, String> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))
}

fn parse_qpn(s: &str) -> Result<u32, String> {
    let q = parse_u32(s)?;
    if q > 0xff_ffff {
        return Err(format!("{s}: a QPN has 24 bits"));
    }
    Ok(q)
}

fn parse_u8(s: &str) -> Result<u8, String> {
    u8::try_from(parse_u32(s)?).map_err(|_| format!("{s}: an opcode is one byte"))
}

/// What the filters look at in a frame: the IP addresses and the BTH's
/// opcode and destination QP. None if the frame is not RoCEv2 over UDP.
#[derive(Debug, PartialEq, Eq)]
struct Fields {
    src: IpAddr,
    dst: IpAddr,
    opcode: u8,
    dest_qp: u32,
}

/// [`Fields`] of an Ethernet frame (802.1Q/802.1ad tags skipped), from its
/// headers alone, so that a frame cut short after its BTH still matches.
fn fields(f: &[u8]) -> Option<Fields> {
    let mut at = 12;
    let mut ethertype = u16::from_be_bytes(f.get(at..at + 2)?.try_into().ok()?);
    while ethertype == 0x8100 || ethertype == 0x88a8 {
        at += 4;
        ethertype = u16::from_be_bytes(f.get(at..at + 2)?.try_into().ok()?);
    }
    let l3 = at + 2;
    let (src, dst, l4) = match ethertype {
        0x0800 => {
            let ihl = usize::from(f.get(l3)? & 0x0f) * 4;
            if *f.get(l3 + 9)? != 17 || ihl < 20 {
                return None;
            }
            let a: [u8; 4] = f.get(l3 + 12..l3 + 16)?.try_into().ok()?;
            let b: [u8; 4] = f.get(l3 + 16..l3 + 20)?.try_into().ok()?;
            (IpAddr::from(a), IpAddr::from(b), l3 + ihl)
        }
        0x86dd => {
            if *f.get(l3 + 6)? != 17 {
                return None;
            }
            let a: [u8; 16] = f.get(l3 + 8..l3 + 24)?.try_into().ok()?;
            let b: [u8; 16] = f.get(l3 + 24..l3 + 40)?.try_into().ok()?;
            (IpAddr::from(a), IpAddr::from(b), l3 + 40)
        }
        _ => return None,
    };
    let bth = f.get(l4 + 8..l4 + 20)?;
    Some(Fields {
        src,
        dst,
        opcode: bth[0],
        dest_qp: u32::from_be_bytes([0, bth[5], bth[6], bth[7]]),
    })
}

/// The filters asked for; a frame passes when it matches every one.
struct Filter {
    qpn: Option<u32>,
    opcode: Option<u8>,
    peer: Option<IpAddr>,
}

impl Filter {
    fn any(&self) -> bool {
        self.qpn.is_some() || self.opcode.is_some() || self.peer.is_some()
    }

    fn pass(&self, frame: &[u8]) -> bool {
        if !self.any() {
            return true;
        }
        let Some(f) = fields(frame) else {
            return false;
        };
        self.qpn.is_none_or(|q| f.dest_qp == q)
            && self.opcode.is_none_or(|o| f.opcode == o)
            && self.peer.is_none_or(|p| f.src == p || f.dst == p)
    }
}

/// A copied frame waiting for its turn in the file; ordered by time,
/// then arrival.
#[derive(Debug)]
struct Pending {
    /// CLOCK_MONOTONIC nanoseconds (both sources use it).
    ts_ns: u64,
    /// Arrival order among equal timestamps.
    order: u64,
    direction: Direction,
    orig_len: u32,
    frame: Vec<u8>,
}

impl Pending {
    fn key(&self) -> (u64, u64) {
        (self.ts_ns, self.order)
    }
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// Where a copy came from. Each source stamps its copies in the order it
/// hands them over: a CPU's perf ring (the XDP program on that CPU), a
/// sending process's tap (its I/O thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    Ring(u32),
    Tap { pid: u32, tap: u32 },
}

/// Frames from every source merged in time order: a frame is written once
/// nothing older can still come (copies arrive within a batch of their
/// taking: [`REORDER_WINDOW`]). Each source's copies come in time order,
/// so they wait in a queue per source and only the queues' heads are
/// ordered (a heap of a few entries, not of every frame in the window); a
/// copy older than its source's last is put in its place all the same. A
/// written frame's buffer is kept for a later copy: hundreds of thousands
/// of frames a second stream through here, and an allocation and a free
/// each cost the capture more CPU than ordering them.
#[derive(Default)]
struct Reorder {
    sources: HashMap<Source, usize>,
    /// The last source and its queue: copies come in runs from one.
    last: Option<(Source, usize)>,
    queues: Vec<VecDeque<Pending>>,
    /// (time, arrival, queue) of each queue's head, oldest first. An entry
    /// whose queue's head is no longer that frame is stale and skipped.
    heads: BinaryHeap<Reverse<(u64, u64, usize)>>,
    order: u64,
    spare: Vec<Vec<u8>>,
}

/// How late a copy may arrive after a newer one and still be put in order:
/// a sending process's batch, a perf buffer read a poll later.
const REORDER_WINDOW: Duration = Duration::from_millis(50);

/// The longest the capture waits without looking at the rings.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// While the senders' datagrams stream, the capture reads them this often
/// on its own clock instead of waiting for them in poll: a capture asleep
/// on the socket is woken by every datagram, and the wake-up is an
/// inter-processor interrupt charged to the sending CPU (in a VM an exit
/// to the host): 5.7 % of a WRITE stream's CPU in the pinned profile,
/// about 6 us per datagram. The socket queues 11 datagrams
/// (`net.unix.max_dgram_qlen` + 1); a WRITE stream of 3.4 Gb/s fills
/// about 2 in this time.
const STREAM_NAP: Duration = Duration::from_micros(250);

/// Datagrams in one round that say the senders' queue was half full.
const QUEUE_HALF: u64 = 5;

/// Buffers kept for reuse at most (a few ms of a stream's frames).
const SPARE_BUFFERS: usize = 4096;

impl Reorder {
    /// Queues a copy of `frame` from `source`.
    fn push(
        &mut self,
        source: Source,
        ts_ns: u64,
        direction: Direction,
        orig_len: u32,
        frame: &[u8],
    ) {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        self.order += 1;
        let p = Pending {
            ts_ns,
            order: self.order,
            direction,
            orig_len,
            frame: buf,
        };
        let key = p.key();
        let at = match self.last {
            Some((s, at)) if s == source => at,
            _ => {
                let queues = &mut self.queues;
                let at = *self.sources.entry(source).or_insert_with(|| {
                    queues.push(VecDeque::new());
                    queues.len() - 1
                });
                self.last = Some((source, at));
                at
            }
        };
        let q = &mut self.queues[at];
        if q.back().is_none_or(|b| b.key() <= key) {
            q.push_back(p);
            if q.len() == 1 {
                self.heads.push(Reverse((key.0, key.1, at)));
            }
        } else {
            // Older than its source's last copy: into its place.
            let i = q.partition_point(|x| x.key() <= key);
            q.insert(i, p);
            if i == 0 {
                self.heads.push(Reverse((key.0, key.1, at)));
            }
        }
    }

    /// The oldest frame, if it is older than `before_ns`.
    fn pop_before(&mut self, before_ns: u64) -> Option<Pending> {
        loop {
            let Reverse((ts, order, at)) = *self.heads.peek()?;
            let q = &mut self.queues[at];
            if q.front().map(Pending::key) != Some((ts, order)) {
                self.heads.pop();
                continue;
            }
            if ts >= before_ns {
                return None;
            }
            self.heads.pop();
            let p = q.pop_front();
            if let Some(next) = q.front() {
                let (t, o) = next.key();
                self.heads.push(Reverse((t, o, at)));
            }
            return p;
        }
    }

    /// Takes back a popped frame's buffer once it is written.
    fn recycle(&mut self, p: Pending) {
        if self.spare.len() < SPARE_BUFFERS {
            self.spare.push(p.frame);
        }
    }
}

fn clock_ns(clock: nix::time::ClockId) -> u64 {
    nix::time::clock_gettime(clock).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    })
}

/// The clock both sources stamp with (bpf_ktime_get_ns, the taps).
fn monotonic_ns() -> u64 {
    clock_ns(nix::time::ClockId::CLOCK_MONOTONIC)
}

fn realtime_ns() -> u64 {
    clock_ns(nix::time::ClockId::CLOCK_REALTIME)
}

/// Where the frames go.
enum Sink {
    None,
    File(PcapWriter<std::io::BufWriter<fs::File>>),
    Stdout(PcapWriter<std::io::BufWriter<std::io::Stdout>>),
}

impl Sink {
    fn write(&mut self, ts: Duration, p: &Pending) -> std::io::Result<()> {
        let dir = Some(p.direction);
        match self {
            Sink::None => Ok(()),
            Sink::File(w) => w.write_with(ts, &p.frame, p.orig_len, dir),
            Sink::Stdout(w) => w.write_with(ts, &p.frame, p.orig_len, dir),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::None => Ok(()),
            Sink::File(w) => w.flush(),
            Sink::Stdout(w) => w.flush(),
        }
    }

    /// (records, records cut by the snap length)
    fn counts(&self) -> (u64, u64) {
        match self {
            Sink::None => (0, 0),
            Sink::File(w) => (w.packets(), w.truncated()),
            Sink::Stdout(w) => (w.packets(), w.truncated()),
        }
    }
}

/// The program's copies of received frames (its perf rings).
struct RxCopies {
    rings: CaptureRings,
}

impl RxCopies {
    fn open(iface: &str) -> anyhow::Result<Self> {
        // 16 MiB in all, 256 KiB to 2 MiB per CPU: the capture reads them
        // every millisecond or so while copies stream, and a WRITE stream
        // fills about 1 MB/ms.
        let cpus = aya::util::online_cpus().map_or(1, |c| c.len().max(1));
        let per_cpu = ((16 << 20) / cpus).clamp(256 << 10, 2 << 20);
        let rings = CaptureRings::open(iface, per_cpu).with_context(|| {
            format!(
                "{iface}: open the capture's rings (an xroce older than this one attached the \
                 program? `xroce detach --iface {iface}` and attach again)"
            )
        })?;
        Ok(Self { rings })
    }

    /// Moves every copy waiting in the rings to `out`.
    fn drain(&mut self, snaplen: u32, out: &mut impl FnMut(u32, CaptureMeta, &[u8])) {
        self.rings.drain(&mut |cpu, sample| {
            let Some(meta) = CaptureMeta::parse(sample) else {
                return;
            };
            // The sample ends in padding: the copy is as long as the
            // program made it.
            let copied = meta.frame_len.min(snaplen).min(MAX_COPY) as usize;
            let end = (META_LEN + copied).min(sample.len());
            out(cpu, meta, &sample[META_LEN..end]);
        });
    }

    fn lost(&self) -> u64 {
        self.rings.lost()
    }
}

/// Turns the program's copying off when the capture ends, however it ends.
struct CopyingOn<'a>(&'a str);

impl Drop for CopyingOn<'_> {
    fn drop(&mut self) {
        let _ = xdp::set_capture_snaplen(self.0, 0);
    }
}

/// Waits up to `timeout` for any of `fds` to become readable.
fn wait_readable(fds: &[i32], timeout: Duration) -> std::io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut pfds: Vec<PollFd> = fds
        .iter()
        // SAFETY: the descriptors belong to objects that outlive this call.
        .map(|&fd| PollFd::new(unsafe { BorrowedFd::borrow_raw(fd) }, PollFlags::POLLIN))
        .collect();
    let ms =
        PollTimeout::try_from(timeout.as_millis().min(60_000) as u32).unwrap_or(PollTimeout::MAX);
    match poll(&mut pfds, ms) {
        Ok(_) | Err(nix::Error::EINTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub fn run(args: &CaptureArgs) -> anyhow::Result<()> {
    let iface = args.iface.as_str();
    let to_stdout = args.write.as_deref() == Some(std::path::Path::new("-"));
    if to_stdout && args.json {
        bail!("-w - and --json both want stdout: write the capture to a file with --json");
    }
    let snaplen = if args.snaplen == 0 {
        DEFAULT_SNAPLEN
    } else {
        args.snaplen
    };
    let filter = Filter {
        qpn: args.qpn,
        opcode: args.opcode,
        peer: args.peer,
    };
    let options = WriteOptions {
        snaplen,
        nanosecond: args.precision == Precision::Nano,
        format: match args.format {
            Format::Pcapng => FileFormat::PcapNg,
            Format::Pcap => FileFormat::Pcap,
        },
        if_name: Some(iface.to_string()),
        ..WriteOptions::default()
    };
    let ifindex = xdp::if_index(iface)?;
    let Some(capture_hold) = claim_capture(ifindex)
        .with_context(|| format!("{iface}: take the device's capture hold (needs root)"))?
    else {
        bail!("{iface}: another xroce capture runs on this device");
    };
    // A user of the device, so that its last process leaves the program.
    let mut block = QpnBlock::claim_root(ifindex)?;
    let attached_here = !xdp::is_attached(iface);
    if attached_here {
        xdp::attach(iface, xdp::Mode::Native)
            .or_else(|_| xdp::attach(iface, xdp::Mode::Skb))
            .with_context(|| format!("attach xroce's XDP program to {iface}"))?;
        xdp::mark_process_attached(iface)?;
        eprintln!("xroce: {iface}: attached the XDP program for the capture");
    }
    let mut rx = RxCopies::open(iface)?;
    // Enough of each frame for the filters to read its headers.
    let copy = if filter.any() {
        snaplen.max(128)
    } else {
        snaplen
    };
    // The senders cut their copies to it too, read when each connects (one
    // that connected in the moment between bind and that copies whole
    // frames, which the file cuts).
    let mut tx = TapListener::bind(ifindex, copy)
        .with_context(|| format!("{iface}: open the socket the sending processes copy to"))?;
    xdp::set_capture_snaplen(iface, copy)?;
    let copying = CopyingOn(iface);

    let mut sink = match &args.write {
        None => Sink::None,
        Some(_) if to_stdout => Sink::Stdout(PcapWriter::new(
            std::io::BufWriter::with_capacity(1 << 20, std::io::stdout()),
            options.clone(),
        )?),
        Some(path) => Sink::File(
            PcapWriter::create(path, options.clone())
                .with_context(|| format!("create {}", path.display()))?,
        ),
    };
    // A reader of -w - sees the header before any frame arrives.
    sink.flush()?;
    crate::stop::install_signal_handlers();
    // Running processes look for the capture's socket every 20 ms
    // (capture_tap): give them that long before saying we listen.
    std::thread::sleep(Duration::from_millis(60));
    // tcpdump's line: scripts (and our tests) wait for it before sending.
    eprintln!(
        "xroce: listening on {iface}, RoCEv2 frames both ways, snapshot length {snaplen} bytes"
    );

    let start = Instant::now();
    let realtime_offset = realtime_ns().saturating_sub(monotonic_ns());
    let deadline = args.seconds.map(|s| start + Duration::from_secs_f64(s));
    let wanted = args.count.unwrap_or(u64::MAX);
    let packet_buffered = args.packet_buffered || to_stdout;
    let mut fds: Vec<i32> = rx.rings.fds();
    fds.push(tx.as_raw_fd());
    let mut order = Reorder::default();
    let (mut frames, mut bytes, mut rx_frames, mut tx_frames, mut filtered_out) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut finishing = false;
    // The last round found ring copies and no datagram.
    let mut busy = false;
    // Datagrams from the senders the last round found.
    let mut datagrams = 0;
    let stopped_by = loop {
        let now = Instant::now();
        let stop = if crate::stop::stop_requested() {
            Some("signal")
        } else if frames >= wanted {
            Some("count")
        } else {
            deadline.filter(|d| now >= *d).map(|_| "seconds")
        };
        if let Some(why) = stop {
            if finishing {
                break why;
            }
            // One last look at both sources, then everything is written.
            finishing = true;
        } else if datagrams > 0 {
            // (After a round that found the queue half full, the next
            // comes at once.)
            if datagrams < QUEUE_HALF {
                std::thread::sleep(STREAM_NAP);
            }
        } else {
            // The rings wake us only when a quarter full: a look every
            // 20 ms brings a trickle of copies in well within the reorder
            // window.
            let wait = deadline.map_or(POLL_EVERY, |d| (d - now).min(POLL_EVERY));
            if let Err(e) = wait_readable(&fds, wait) {
                return Err(e).context("wait for copies");
            }
            // While copies stream, take them a millisecond's worth at a
            // time: the rings wake us only when a quarter full, and the
            // capture's CPU is the traffic's on a small host.
            if busy {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let rx_before = rx_frames + filtered_out;
        rx.drain(copy, &mut |cpu, meta, frame| {
            if filter.pass(frame) {
                rx_frames += 1;
                let source = Source::Ring(cpu);
                order.push(
                    source,
                    meta.ts_ns,
                    Direction::Inbound,
                    meta.frame_len,
                    frame,
                );
            } else {
                filtered_out += 1;
            }
        });
        let rx_copies = rx_frames + filtered_out - rx_before;
        let datagrams_before = tx.datagrams();
        let records = tx
            .recv(Duration::ZERO, &mut |r| {
                if filter.pass(r.frame) {
                    tx_frames += 1;
                    let dir = if r.outbound {
                        Direction::Outbound
                    } else {
                        Direction::Inbound
                    };
                    let source = Source::Tap {
                        pid: r.pid,
                        tap: r.tap,
                    };
                    order.push(source, r.ts_ns, dir, r.orig_len, r.frame);
                } else {
                    filtered_out += 1;
                }
            })
            .context("read the sending processes' copies")?;
        // Only the rings can wait: the senders' socket holds a few
        // datagrams (net.unix.max_dgram_qlen), so while they stream it is
        // read every STREAM_NAP, or at once when it was filling.
        datagrams = tx.datagrams() - datagrams_before;
        busy = rx_copies > 0 && records == 0;
        let horizon = if finishing {
            u64::MAX
        } else {
            monotonic_ns().saturating_sub(REORDER_WINDOW.as_nanos() as u64)
        };
        let before = frames;
        let mut result = Ok(());
        while frames < wanted {
            let Some(p) = order.pop_before(horizon) else {
                break;
            };
            frames += 1;
            bytes += u64::from(p.orig_len);
            let ts = Duration::from_nanos(p.ts_ns.saturating_add(realtime_offset));
            result = sink.write(ts, &p);
            order.recycle(p);
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() && packet_buffered && frames > before {
            result = sink.flush();
        }
        if let Err(e) = result {
            if to_stdout && e.kind() == std::io::ErrorKind::BrokenPipe {
                break "pipe";
            }
            return Err(e)
                .with_context(|| format!("write {}", args.write.as_ref().unwrap().display()));
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    drop(copying);
    if stopped_by != "pipe" {
        sink.flush()
            .with_context(|| format!("write {}", args.write.as_ref().unwrap().display()))?;
    }
    let (written, truncated) = sink.counts();
    let (rx_lost, tx_lost) = (rx.lost(), tx.lost());
    drop(sink);
    drop(rx);
    drop(tx);
    block.release();
    drop(capture_hold);
    // A program attached for the capture, or by a process that has left
    // since, goes with the device's last user.
    if xdp::is_process_attached(iface) && block.others().is_empty() {
        xdp::detach(iface).with_context(|| format!("detach the XDP program from {iface}"))?;
        if !attached_here {
            eprintln!("xroce: {iface}: detached the XDP program its last user attached");
        }
    }
    let file = args.write.as_ref().map(|p| p.display().to_string());
    let out = CaptureReport {
        iface: iface.into(),
        frames,
        bytes,
        rx_frames,
        tx_frames,
        rx_lost,
        tx_lost,
        filtered_out,
        file,
        format: match args.format {
            Format::Pcapng => "pcapng",
            Format::Pcap => "pcap",
        }
        .into(),
        frames_written: written,
        frames_truncated: truncated,
        snaplen,
        nanosecond: options.nanosecond,
        seconds,
        stopped_by: stopped_by.into(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        let to = match &out.file {
            Some(f) => format!(", {written} written to {f}"),
            None => String::new(),
        };
        // On stderr, as tcpdump's: stdout may be the capture itself.
        eprintln!(
            "xroce: {frames} RoCEv2 frames ({bytes} bytes) captured on {iface} in {seconds:.1}s \
             ({rx_frames} in, {tx_frames} out; stopped by {stopped_by}){to}; copies lost: \
             {rx_lost} in, {tx_lost} out; {filtered_out} filtered out"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ipv6: bool, vlan: bool) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0, 5]);
        }
        if ipv6 {
            f.extend_from_slice(&[0x86, 0xdd]);
            let mut ip = vec![0u8; 40];
            ip[0] = 0x60;
            ip[6] = 17;
            ip[8..24].copy_from_slice(&"fe80::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
            ip[24..40].copy_from_slice(&"fe80::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
            f.extend_from_slice(&ip);
        } else {
            f.extend_from_slice(&[0x08, 0x00]);
            let mut ip = vec![0u8; 20];
            ip[0] = 0x45;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
            ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
            f.extend_from_slice(&ip);
        }
        f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7, 0, 40, 0, 0]);
        // BTH: opcode 0x0a, DestQP 0x010011.
        f.extend_from_slice(&[0x0a, 0, 0xff, 0xff, 0, 0x01, 0x00, 0x11, 0, 0, 0, 7]);
        f
    }

    #[test]
    fn fields_are_read_over_ipv4_ipv6_and_vlan_tags() {
        for (v6, vlan) in [(false, false), (true, false), (false, true), (true, true)] {
            let f = fields(&frame(v6, vlan)).unwrap_or_else(|| panic!("{v6} {vlan}"));
            assert_eq!((f.opcode, f.dest_qp), (0x0a, 0x010011));
            assert_eq!(f.src.is_ipv6(), v6);
        }
        assert_eq!(
            fields(&frame(false, false)[..40]),
            None,
            "cut before the BTH"
        );
    }

    #[test]
    fn filters_match_every_condition() {
        let f = frame(false, false);
        let all = |qpn, opcode, peer: Option<&str>| {
            Filter {
                qpn,
                opcode,
                peer: peer.map(|p| p.parse().unwrap()),
            }
            .pass(&f)
        };
        assert!(all(None, None, None));
        assert!(all(Some(0x010011), Some(0x0a), Some("10.0.0.1")));
        assert!(all(None, None, Some("10.0.0.2")), "destination too");
        assert!(!all(Some(0x11), None, None));
        assert!(!all(None, Some(0x06), None));
        assert!(!all(None, None, Some("10.0.0.3")));
        assert!(!Filter {
            qpn: Some(1),
            opcode: None,
            peer: None
        }
        .pass(&[0u8; 10]));
    }

    #[test]
    fn copies_come_out_in_time_order_within_the_window() {
        let (a, b) = (Source::Ring(0), Source::Tap { pid: 7, tap: 0 });
        let mut r = Reorder::default();
        r.push(a, 30, Direction::Inbound, 1, &[3]);
        r.push(b, 10, Direction::Outbound, 1, &[1]);
        r.push(a, 20, Direction::Inbound, 1, &[2]);
        r.push(b, 20, Direction::Outbound, 1, &[22]);
        assert_eq!(r.pop_before(10), None, "nothing older than 10");
        let out: Vec<u8> = std::iter::from_fn(|| r.pop_before(25))
            .map(|p| p.frame[0])
            .collect();
        assert_eq!(out, [1, 2, 22], "by time, then arrival, across sources");
        let last = r.pop_before(u64::MAX).unwrap();
        assert_eq!(last.frame, [3]);
        assert!(r.pop_before(u64::MAX).is_none());
        // A written frame's buffer carries the next copy, and only that.
        r.recycle(last);
        r.push(a, 40, Direction::Inbound, 2, &[4, 4]);
        assert!(r.spare.is_empty(), "the spare buffer was taken");
        assert_eq!(r.pop_before(u64::MAX).map(|p| p.frame), Some(vec![4, 4]));
    }

    #[test]
    fn many_sources_merge_in_time_order_even_out_of_order_within_one() {
        let mut r = Reorder::default();
        let mut want = Vec::new();
        // Four sources, each in order but for one late copy in source 2.
        for i in 0..400u64 {
            let source = Source::Ring((i % 4) as u32);
            let ts = if i == 202 {
                5
            } else {
                1000 + (i * 37) % 1009 * 4 + i % 4
            };
            r.push(source, ts, Direction::Inbound, 0, &i.to_le_bytes());
            want.push((ts, i));
        }
        want.sort();
        let got: Vec<(u64, u64)> = std::iter::from_fn(|| r.pop_before(u64::MAX))
            .map(|p| {
                (
                    p.ts_ns,
                    u64::from_le_bytes(p.frame[..8].try_into().unwrap()),
                )
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn qpns_and_opcodes_parse_as_users_write_them() {
        assert_eq!(parse_qpn("0x11"), Ok(0x11));
        assert_eq!(parse_qpn("17"), Ok(17));
        assert!(parse_qpn("0x1000000").is_err());
        assert_eq!(parse_u8("0x0a"), Ok(10));
        assert!(parse_u8("300").is_err());
    }
}
