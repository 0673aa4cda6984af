//! `xroce bench` and `xroce lat`: perftest-style bandwidth and latency
//! between two xroce peers (`--listen` on one host, `--connect` on the
//! other). Data is a pattern the receiving side checks ("verified").
//!
//! - `stack.rs`: interface, engine, packet-I/O backend (sized for the path
//!   MTU by `Device::open_io`) and runtime.
//! - `conn.rs`: verbs objects and the out-of-band exchange over TCP
//!   (`xroce::connect::Session`: a hello and results as blobs, the QPs as
//!   `ConnInfo`, barriers as `sync`).
//! - `bw.rs` / `lat.rs`: the measurements.
//! - `report.rs`: printing their reports (the types are `xroce-report`'s,
//!   shared with the tools that read them): JSON or a table.
//! - `perftest/`: `--perftest`, the same measurements against perftest's
//!   ib_*_bw / ib_*_lat (its OOB exchange, defaults and report).

mod bw;
pub mod conn;
pub(crate) mod flags;
mod lat;
mod pattern;
mod perftest;
mod report;
pub mod stack;

use std::{net::SocketAddr, time::Duration};

use anyhow::bail;
use xroce::{cc::CcKind, device::BackendKind};

pub use bw::run as bench;
pub use lat::run as lat;

/// `--recovery`: how RC QPs recover loss.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// Selective repeat when the peer is xroce (agreed in band).
    Auto,
    /// Go-back-N only.
    Gbn,
    /// Selective repeat from the start (both sides ask for it).
    Sr,
}

impl PerfArgs {
    /// `--recovery`, with `--selective-repeat` for `sr`.
    pub fn recovery(&self) -> Recovery {
        if self.selective_repeat {
            Recovery::Sr
        } else {
            self.recovery
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Write,
    Read,
    Send,
    Atomic,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
        }
    }

    pub fn from_name(s: &str) -> anyhow::Result<Op> {
        Ok(match s {
            "write" => Op::Write,
            "read" => Op::Read,
            "send" => Op::Send,
            "atomic" => Op::Atomic,
            other => bail!("unknown operation {other:?}; use write, read, send or atomic"),
        })
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// AF_XDP sockets fed by the XDP program
    Afxdp,
    /// A kernel UDP socket on port 4791 (no XDP needed)
    Udp,
}

impl From<Backend> for BackendKind {
    fn from(b: Backend) -> Self {
        match b {
            Backend::Afxdp => BackendKind::AfXdp,
            Backend::Udp => BackendKind::Udp,
        }
    }
}

/// Flags shared by `bench` and `lat`, close to perftest's.
#[derive(clap::Args, Debug, Clone)]
pub struct PerfArgs {
    /// write, read, send or atomic (lat: write, read or send)
    #[arg(value_enum)]
    pub op: Op,
    /// With --perftest: the server to run against (as `ib_write_bw HOST`);
    /// without it, serve a perftest client on --port
    #[arg(requires = "perftest")]
    pub server: Option<String>,
    /// Interface to run RoCEv2 on (or xroce's device on it, as perftest's
    /// -d: xroce_IF)
    #[arg(long, short = 'd', value_parser = crate::iface::interface)]
    pub iface: String,
    /// Serve a peer on ADDR:PORT (the TCP port of the exchange)
    #[arg(
        long,
        conflicts_with = "connect",
        required_unless_present_any = ["connect", "perftest"]
    )]
    pub listen: Option<SocketAddr>,
    /// Run against a peer listening on ADDR:PORT
    #[arg(long)]
    pub connect: Option<SocketAddr>,
    /// With --listen: how many clients to serve (in parallel) before exiting
    #[arg(long, default_value_t = 1)]
    pub peers: usize,
    /// Message size, e.g. 65536, 64KiB, 8 (default 65536; --perftest lat: 2)
    #[arg(long, short = 's', value_parser = crate::units::size)]
    pub size: Option<crate::units::Size>,
    /// Messages per QP (client)
    #[arg(long, short = 'n', conflicts_with = "duration")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of --iters (client)
    #[arg(long, short = 'D')]
    pub duration: Option<f64>,
    /// Queue pairs
    #[arg(long, short = 'q', default_value_t = 1)]
    pub qps: usize,
    /// Path MTU: 256, 512, 1024, 2048, 4096 (default: the largest the interface allows)
    #[arg(long, short = 'm')]
    pub mtu: Option<u32>,
    /// Outstanding work requests per QP
    #[arg(long, short = 't', default_value_t = 128)]
    pub tx_depth: usize,
    /// Local ACK timeout of the QPs, 4.096 us * 2^N (perftest's -u): set it
    /// above the path's worst round trip, queueing included, or a deep
    /// queue reads as loss and runs out the retries
    #[arg(
        long = "qp-timeout",
        short = 'u',
        value_name = "N",
        default_value_t = conn::DEFAULT_QP_TIMEOUT,
        value_parser = clap::value_parser!(u8).range(1..=31)
    )]
    pub qp_timeout: u8,
    /// Packet I/O: afxdp or udp
    #[arg(long, value_enum, default_value = "afxdp")]
    pub backend: Backend,
    /// Congestion control
    #[arg(long, default_value = "none", value_parser = crate::units::cc())]
    pub cc: CcKind,
    /// Line rate the pacer and congestion control start from, e.g. 10gbit
    #[arg(long, default_value = "100gbit", value_parser = crate::units::rate)]
    pub rate: crate::units::Rate,
    /// Write a CSV of progress per time bin (t_ms,bytes,rate_bps,cnps,retransmits)
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
    /// Width of a --trace bin in milliseconds
    #[arg(long, default_value_t = 10)]
    pub bin_ms: u64,
    /// Spin on the packet rings instead of sleeping (lowest latency)
    #[arg(long)]
    pub busy_poll: bool,
    /// Microseconds the I/O thread keeps polling after its last frame
    /// before it sleeps: less saves CPU while a stream waits for ACKs,
    /// and costs latency (as XROCE_SPIN_US for the drop-in library)
    #[arg(long, default_value_t = xroce::runtime::SPIN_AFTER_ACTIVITY_US, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub spin_us: u64,
    /// Microseconds the I/O thread sleeps, instead of yielding, after an
    /// empty round while frames stream in (they gather in the ring
    /// meanwhile); 0: yield (as XROCE_STREAM_NAP_US for the drop-in)
    #[arg(long, default_value_t = xroce::runtime::STREAM_NAP_US, value_parser = clap::value_parser!(u64).range(0..=1_000))]
    pub stream_nap_us: u64,
    /// I/O threads (engines) to spread the QPs over, each with its own QPN
    /// block and, on AF_XDP, its own RX queues (q % N == i; the interface
    /// needs N queues); the QPs go round-robin. Default 1
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub io_threads: u16,
    /// Loss recovery of RC QPs: auto (xroce peers agree on selective
    /// repeat by themselves, in band; any other RoCE peer gets go-back-N),
    /// gbn (go-back-N only, e.g. to compare), or sr (selective repeat
    /// forced from the start, agreed out of band: when the peer asks for
    /// it too, else auto)
    #[arg(long, value_enum, default_value_t = Recovery::Auto)]
    pub recovery: Recovery,
    /// The same as --recovery sr
    #[arg(long)]
    pub selective_repeat: bool,
    /// print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
    /// bench: after the run keep the QPs, as the run left them, until
    /// standard input ends (to look at them with `xroce status --qps` or
    /// `xroce exporter`)
    #[arg(long)]
    pub hold: bool,
    /// Speak perftest's out-of-band protocol (v4.5-0.17) so ib_write_bw,
    /// ib_read_bw, ib_send_bw, ib_atomic_bw, ib_write_lat, ib_read_lat and
    /// ib_send_lat can be the peer; perftest's defaults and report
    #[arg(long)]
    pub perftest: bool,
    /// With --perftest: TCP port of the exchange (perftest's -p)
    #[arg(long, short = 'p', default_value_t = xroce::connect::perftest::PORT)]
    pub port: u16,
    /// GID index of the source address, as perftest's -x: the table the
    /// drop-in libibverbs shows (0 link-local, 1 the IPv4 address, then
    /// IPv6 ones): RoCEv2 over IPv4 from 1, over IPv6 from the others
    #[arg(long = "gid-index", short = 'x', value_name = "N")]
    pub gid_index: Option<u32>,
    /// All sizes 2..2^23 (perftest's -a), one report row per size (client;
    /// --json: one object per size, one per line; --perftest: write and
    /// read, both sides)
    #[arg(long, short = 'a', conflicts_with = "size")]
    pub all: bool,
    /// bench: both sides send at once; the report is the sum of both
    /// directions (perftest's -b; client, the server follows)
    #[arg(long, short = 'b')]
    pub bidirectional: bool,
    /// Transport: RC, UC (write, send) or UD (send) (perftest's -c; client
    /// and server alike with --perftest, else the server follows)
    #[arg(
        long = "connection",
        short = 'c',
        value_enum,
        ignore_case = true,
        default_value = "RC"
    )]
    pub connection: Transport,
    /// Send write/send messages of up to N bytes inline (perftest's -I;
    /// at most 256, the engine's limit)
    #[arg(
        long = "inline_size",
        alias = "inline-size",
        short = 'I',
        value_name = "N"
    )]
    pub inline_size: Option<u32>,
    /// Bandwidth in Gb/s instead of MB/s in perftest's tables (--perftest;
    /// xroce's own table is in Gb/s already)
    #[arg(long = "report_gbits", alias = "report-gbits")]
    pub report_gbits: bool,
}

/// perftest's -c.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    /// Reliable Connection
    #[default]
    #[value(name = "RC")]
    Rc,
    /// Unreliable Connection: write and send
    #[value(name = "UC")]
    Uc,
    /// Unreliable Datagram: send, one path MTU at most
    #[value(name = "UD")]
    Ud,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
        }
    }

    pub fn from_name(s: &str) -> anyhow::Result<Transport> {
        Ok(match s {
            "RC" | "" => Transport::Rc,
            "UC" => Transport::Uc,
            "UD" => Transport::Ud,
            other => bail!("unknown transport {other:?}; use RC, UC or UD"),
        })
    }

    pub fn qp_type(self) -> xroce::verbs::QpType {
        match self {
            Transport::Rc => xroce::verbs::QpType::Rc,
            Transport::Uc => xroce::verbs::QpType::Uc,
            Transport::Ud => xroce::verbs::QpType::Ud,
        }
    }
}

impl PerfArgs {
    /// --size, or `default` without it.
    pub fn size_or(&self, default: usize) -> anyhow::Result<usize> {
        let Some(size) = &self.size else {
            return Ok(default);
        };
        if size.value > 1 << 30 {
            bail!("--size {size} is over the 1 GiB limit");
        }
        Ok(size.value as usize)
    }

    /// --size, 65536 without it.
    pub fn size_bytes(&self) -> anyhow::Result<usize> {
        self.size_or(65536)
    }

    /// How long the client runs: --iters, --duration, or 5 s.
    pub fn run_length(&self, default_iters: u64) -> RunLength {
        match (self.iters, self.duration) {
            (Some(n), _) => RunLength::Iters(n),
            (None, Some(s)) => RunLength::Duration(Duration::from_secs_f64(s)),
            (None, None) => RunLength::Iters(default_iters),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum RunLength {
    Iters(u64),
    Duration(Duration),
}

/// With --hold: says so on stderr and waits for the end of standard input
/// while the caller still has its QPs.
pub fn hold_qps(hold: bool) -> anyhow::Result<()> {
    if hold {
        eprintln!("xroce: run done; holding the QPs until standard input ends");
        std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink())?;
    }
    Ok(())
}

/// Timeout of each out-of-band read.
const OOB_TIMEOUT: Duration = Duration::from_secs(30);
