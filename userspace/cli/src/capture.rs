//! `xroce capture --iface IF -w FILE`: receive the RoCEv2 frames xroce's XDP
//! program steers to AF_XDP, on every RX queue of the interface (or one,
//! `--queue`), and write them as a pcap file that `xroce decode`, tshark
//! and Wireshark read; tcpdump's `-w`, `-c`, `-s`, `-U` and
//! `--time-stamp-precision`. SIGINT, SIGTERM and SIGHUP end it with the
//! file flushed and complete.
//!
//! Frames redirected to an AF_XDP socket go to that socket alone (the
//! kernel, tcpdump included, never sees them), so the capture stands in
//! for the device's AF_XDP owner: it takes the same holds an xroce process
//! takes (QPN block 0 and the AF_XDP sockets, `device::block`) and refuses,
//! naming the holders, when a process has either: capturing then would
//! take that process's frames. xroce processes started during the capture
//! get other blocks and run over UDP, which the XDP program keeps serving.

use std::{
    fs,
    path::PathBuf,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context};
use xroce::{
    capture::{PcapWriter, WriteOptions, DEFAULT_SNAPLEN},
    device::{AfXdpHold, Hold, QpnBlock},
    io::{
        afxdp::{rx_queue_count, XskConfig, XskMultiQueue},
        PacketIo,
    },
    xdp,
};
use xroce_report::CaptureReport;

const AFTER_HELP: &str = "\
What is captured: the RoCEv2 frames (UDP port 4791) that xroce's XDP program hands to \
AF_XDP on this interface, i.e. what an xroce process holding QPN block 0 would receive \
(incoming only, nothing this host sends). The program must be attached \
(`xroce attach --iface IF`). Those frames go to the capture alone: it refuses to start \
while an xroce process uses the device's AF_XDP sockets or QPN block 0, and names it. \
Timestamps are taken when the frames are read.

Examples:
  xroce capture -i eth1 -w roce.pcap -c 1000     then: xroce decode roce.pcap; tshark -r roce.pcap
  xroce capture -i eth1 -w - | tshark -r - -V
  xroce capture -i eth1 --seconds 5 --json";

#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct CaptureArgs {
    /// Interface with xroce's XDP program attached
    #[arg(long, short = 'i')]
    pub iface: String,
    /// Capture this RX queue only (default: every RX queue)
    #[arg(long)]
    pub queue: Option<u32>,
    /// Write the frames to FILE as pcap (`-`: stdout), as tcpdump -w
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    pub write: Option<PathBuf>,
    /// Stop after N frames (tcpdump -c)
    #[arg(short = 'c', long)]
    pub count: Option<u64>,
    /// Stop after this many seconds (default: at -c or Ctrl-C)
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Bytes kept of each frame; 0 means 262144 (tcpdump -s)
    #[arg(short = 's', long, default_value_t = DEFAULT_SNAPLEN)]
    pub snaplen: u32,
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

/// The processes (PID and name) holding `hold` of device `ifindex`.
fn who(ifindex: u32, hold: Hold) -> String {
    let found: Vec<String> = xroce::device::holders()
        .into_iter()
        .filter(|h| h.ifindex == ifindex && h.hold == hold)
        .map(|h| match h.pid {
            Some(pid) => format!("PID {pid} ({})", xroce::device::command_name(pid)),
            None => "a process we may not look into".into(),
        })
        .collect();
    match found.as_slice() {
        [] => "another process".into(),
        h => h.join(", "),
    }
}

/// Takes QPN block 0 and the AF_XDP hold of the device, as the AF_XDP
/// owner does, or says who has them. (The names are `device::block`'s.)
fn take_device(iface: &str, ifindex: u32) -> anyhow::Result<(QpnBlock, AfXdpHold)> {
    let block = QpnBlock::claim(ifindex).context("claim QPN block 0 of the device")?;
    if block.block() != 0 {
        bail!(
            "{iface}: {} uses this xroce device (QPN block 0); its RoCEv2 frames would go to \
             the capture instead. Capture before or after it, or in transit (tcpdump on a \
             bridge between the hosts)",
            who(ifindex, Hold::Block(0))
        );
    }
    let Some(hold) = block
        .claim_afxdp()
        .context("claim the device's AF_XDP sockets")?
    else {
        bail!(
            "{iface}: {} owns this xroce device's AF_XDP sockets; a capture would take its \
             RoCEv2 frames. Capture before or after it, or in transit (tcpdump on a bridge \
             between the hosts)",
            who(ifindex, Hold::AfXdp)
        );
    };
    Ok((block, hold))
}

/// Sockets on `queues`, with AF_XDP multi-buffer where the kernel and
/// driver take it (frames larger than a 4 KiB chunk, path MTU 4096),
/// else without.
fn open_sockets(iface: &str, queues: &[u32]) -> anyhow::Result<XskMultiQueue> {
    let mb = XskConfig {
        multi_buffer: true,
        multi_buffer_max_frame: 16384,
        ..XskConfig::default()
    };
    XskMultiQueue::open_queues(iface, queues.iter().copied(), mb)
        .or_else(|e| {
            eprintln!(
                "xroce: {iface}: no AF_XDP multi-buffer ({e}); frames over {} bytes are dropped",
                XskConfig::default().chunk_capacity()
            );
            XskMultiQueue::open_queues(iface, queues.iter().copied(), XskConfig::default())
        })
        .with_context(|| {
            format!(
                "open AF_XDP sockets on {iface} queues {queues:?} (is xroce's XDP program \
                 attached? `xroce attach --iface {iface}`)"
            )
        })
}

fn is_interrupted(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::Interrupted {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// Where the frames go.
enum Sink {
    None,
    File(PcapWriter<std::io::BufWriter<fs::File>>),
    Stdout(PcapWriter<std::io::BufWriter<std::io::Stdout>>),
}

impl Sink {
    fn write(&mut self, ts: Duration, frame: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::None => Ok(()),
            Sink::File(w) => w.write(ts, frame),
            Sink::Stdout(w) => w.write(ts, frame),
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

pub fn run(args: &CaptureArgs) -> anyhow::Result<()> {
    let iface = args.iface.as_str();
    let to_stdout = args.write.as_deref() == Some(std::path::Path::new("-"));
    if to_stdout && args.json {
        bail!("-w - and --json both want stdout: write the capture to a file with --json");
    }
    let options = WriteOptions {
        snaplen: args.snaplen,
        nanosecond: args.precision == Precision::Nano,
    };
    let ifindex = xdp::if_index(iface)?;
    let (block, hold) = take_device(iface, ifindex)?;
    // Frames of block 0 (ours now) to the AF_XDP sockets; a previous owner
    // may have left its own block there.
    xdp::set_xsk_block(iface, 0).with_context(|| {
        format!("is xroce's XDP program attached to {iface}? `xroce attach --iface {iface}`")
    })?;
    let queues: Vec<u32> = match args.queue {
        Some(q) => vec![q],
        None => (0..rx_queue_count(iface)).collect(),
    };
    let mut sink = match &args.write {
        None => Sink::None,
        Some(_) if to_stdout => Sink::Stdout(PcapWriter::new(
            std::io::BufWriter::with_capacity(1 << 20, std::io::stdout()),
            options,
        )?),
        Some(path) => Sink::File(
            PcapWriter::create(path, options)
                .with_context(|| format!("create {}", path.display()))?,
        ),
    };
    // A reader of -w - sees the header before any frame arrives.
    sink.flush()?;
    crate::stop::install_signal_handlers();
    let mut io = open_sockets(iface, &queues)?;
    let snaplen = if args.snaplen == 0 {
        DEFAULT_SNAPLEN
    } else {
        args.snaplen
    };
    // tcpdump's line: scripts (and our tests) wait for it before sending.
    eprintln!(
        "xroce: listening on {iface} (RX queues {queues:?}), RoCEv2 frames only, \
         snapshot length {snaplen} bytes"
    );

    let start = Instant::now();
    let deadline = args.seconds.map(|s| start + Duration::from_secs_f64(s));
    let wanted = args.count.unwrap_or(u64::MAX);
    let packet_buffered = args.packet_buffered || to_stdout;
    let (mut frames, mut bytes) = (0u64, 0u64);
    let stopped_by = loop {
        if crate::stop::stop_requested() {
            break "signal";
        }
        if frames >= wanted {
            break "count";
        }
        let now = Instant::now();
        let wait = match deadline {
            Some(d) if now >= d => break "seconds",
            Some(d) => (d - now).min(Duration::from_millis(100)),
            None => Duration::from_millis(100),
        };
        let mut write_error = None;
        let before = frames;
        let r = io.recv_batch(wait, &mut |frame| {
            // Frames of the last batch beyond -c are read but not kept.
            if frames >= wanted || write_error.is_some() {
                return;
            }
            frames += 1;
            bytes += frame.len() as u64;
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            if let Err(e) = sink.write(ts, frame) {
                write_error = Some(e);
            }
        });
        match r {
            Ok(_) => {}
            Err(e) if crate::stop::stop_requested() || is_interrupted(&e) => continue,
            Err(e) => return Err(e).context(format!("receive on {iface}")),
        }
        let mut result = match write_error {
            Some(e) => Err(e),
            None if packet_buffered && frames > before => sink.flush(),
            None => Ok(()),
        };
        if let Err(e) = result.as_mut() {
            if to_stdout && e.kind() == std::io::ErrorKind::BrokenPipe {
                break "pipe";
            }
        }
        result.with_context(|| format!("write {}", args.write.as_ref().unwrap().display()))?;
    };
    let seconds = start.elapsed().as_secs_f64();
    if stopped_by != "pipe" {
        sink.flush()
            .with_context(|| format!("write {}", args.write.as_ref().unwrap().display()))?;
    }
    let stats = io.xsk_stats()?;
    let queue_frames: Vec<u64> = io
        .sockets_mut()
        .iter_mut()
        .map(|s| PacketIo::stats(s).rx_frames)
        .collect();
    let (written, truncated) = sink.counts();
    // Sockets closed and holds given back before we look for other users.
    drop(sink);
    drop(io);
    drop(hold);
    let mut block = block;
    block.release();
    // An attachment a process made for itself goes with the device's last
    // user (as io::Stack does); that can be us.
    if xdp::is_process_attached(iface) && block.others().is_empty() {
        xdp::detach(iface).with_context(|| format!("detach the XDP program from {iface}"))?;
        eprintln!("xroce: {iface}: detached the XDP program its last user attached");
    }
    let file = args.write.as_ref().map(|p| p.display().to_string());
    if args.json {
        let out = CaptureReport {
            iface: iface.into(),
            queues,
            queue_frames,
            frames,
            bytes,
            file,
            frames_written: written,
            frames_truncated: truncated,
            snaplen,
            nanosecond: options.nanosecond,
            seconds,
            stopped_by: stopped_by.into(),
            rx_dropped: stats.rx_dropped,
            rx_ring_full: stats.rx_ring_full,
            rx_invalid_descs: stats.rx_invalid_descs,
        };
        println!("{}", serde_json::to_string(&out)?);
    } else {
        let per_queue = queues
            .iter()
            .zip(&queue_frames)
            .map(|(q, n)| format!("queue {q}: {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let to = match &file {
            Some(f) => format!(", {written} written to {f}"),
            None => String::new(),
        };
        // On stderr, as tcpdump's: stdout may be the capture itself.
        eprintln!(
            "xroce: {frames} RoCEv2 frames ({bytes} bytes) captured on {iface} in {seconds:.1}s \
             (stopped by {stopped_by}; {per_queue}){to}; socket drops: {} (ring full {})",
            stats.rx_dropped, stats.rx_ring_full
        );
    }
    Ok(())
}
