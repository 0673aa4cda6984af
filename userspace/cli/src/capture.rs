//! `xroce capture --iface IF`: receive RoCEv2 frames on an AF_XDP socket
//! (what the transport would see) and report how many arrived. The XDP
//! program must be attached; this is a way to check the steering path.

use std::time::{Duration, Instant};

use xroce::io::afxdp::{XskConfig, XskSocket};
use xroce_report::CaptureReport;

#[derive(clap::Args, Debug)]
pub struct CaptureArgs {
    #[arg(long)]
    pub iface: String,
    /// RX queue whose socket to open
    #[arg(long, default_value_t = 0)]
    pub queue: u32,
    /// Stop after this many frames
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &CaptureArgs) -> anyhow::Result<()> {
    let mut socket = XskSocket::open(&args.iface, args.queue, XskConfig::default())?;
    eprintln!(
        "xroce: capturing on {} queue {} for up to {}s",
        args.iface, args.queue, args.seconds
    );
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let (mut frames, mut bytes) = (0u64, 0u64);
    let wanted = args.count.unwrap_or(u64::MAX);
    while frames < wanted && Instant::now() < deadline {
        socket.recv(50, |frame| {
            frames += 1;
            bytes += frame.len() as u64;
        })?;
    }
    let stats = socket.stats()?;
    if args.json {
        let out = CaptureReport {
            iface: args.iface.clone(),
            queue: args.queue,
            frames,
            bytes,
            rx_dropped: stats.rx_dropped,
            rx_ring_full: stats.rx_ring_full,
            rx_invalid_descs: stats.rx_invalid_descs,
        };
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!(
            "received {frames} RoCEv2 frames ({bytes} bytes) on {} queue {}; socket drops: {} (ring full {})",
            args.iface, args.queue, stats.rx_dropped, stats.rx_ring_full
        );
    }
    Ok(())
}
