//! The `xroce` command.
//!
//! Measuring commands take `--json` and then print exactly one JSON object on
//! stdout; human-readable output goes to stderr or a table on stdout.

mod capture;
mod congestion;
mod decode;
mod experiment;
mod exporter;
mod iface;
mod perf;
// rc_pingpong's refill loop bumps the count its range started from (on purpose).
mod pingpong;
mod run;
mod stats;
mod status;
mod stop;
mod units;
mod view;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "xroce",
    version,
    about = "RDMA over XDP/AF_XDP for hosts without RDMA NICs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Attach the XDP program to an interface (it stays after this process exits; nothing is pinned)
    Attach {
        /// Network interface (as `ip link` names it)
        #[arg(long, value_name = "IF")]
        iface: String,
        /// native (in the driver) or skb (generic)
        #[arg(long, default_value = "native")]
        mode: xroce::xdp::Mode,
    },
    /// Detach xroce's XDP program from an interface (and what an older xroce pinned for it)
    Detach {
        /// Network interface (as `ip link` names it)
        #[arg(long, value_name = "IF")]
        iface: String,
    },
    /// Show the XDP program's counters for an interface (--interval S: rates every S seconds)
    Stats(stats::StatsArgs),
    /// List the interfaces xroce's XDP program is attached to and the processes using them
    Status(status::StatusArgs),
    /// Serve the XDP, engine and per-QP counters to Prometheus (http://ADDR/metrics)
    Exporter(exporter::ExporterArgs),
    /// Program the XDP congestion point (virtual bottleneck, ECN marking)
    Ecn(congestion::EcnArgs),
    /// Inject loss into RoCEv2 traffic in the XDP program
    Fault(congestion::FaultArgs),
    /// Bandwidth between two xroce peers (perftest-style): write, read, send, atomic
    Bench(perf::PerfArgs),
    /// Latency between two xroce peers: write, read, send
    Lat(perf::PerfArgs),
    /// Capture the RoCEv2 frames XDP steers to AF_XDP into a pcap file (-w), as tcpdump
    Capture(capture::CaptureArgs),
    /// Decode RoCEv2 frames in a pcap or pcapng file and verify their ICRC
    Decode(decode::DecodeArgs),
    /// Run a congestion experiment in namespaces of its own
    Experiment(experiment::ExperimentArgs),
    /// RC SEND/RECV ping-pong compatible with rdma-core's ibv_rc_pingpong
    Pingpong(pingpong::PingpongArgs),
    /// Run an unmodified libibverbs program (perftest, ibv_devinfo, ...) over xroce
    #[command(long_about = run::LONG_ABOUT, after_help = run::AFTER_HELP)]
    Run(run::RunArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Attach { iface, mode } => xroce::xdp::attach(&iface, mode)
            .map(|()| {
                // The interface (or libxdp's dispatcher on it) holds the
                // program: it stays after this command until detach.
                let how = match xroce::xdp::query(&iface) {
                    Ok(Some(a)) => match a.dispatcher {
                        Some(d) => format!(
                            "program {} in {} mode, under libxdp's dispatcher {d} \
                             (`xdp-loader status {iface}`)",
                            a.prog_id, a.mode
                        ),
                        None => format!("program {} in {} mode", a.prog_id, a.mode),
                    },
                    _ => format!("{mode} mode"),
                };
                eprintln!(
                    "xroce: attached to {iface} ({how}); it stays until \
                     `xroce detach --iface {iface}`"
                )
            })
            .map_err(anyhow::Error::from),
        Command::Detach { iface } => xroce::xdp::detach(&iface)
            .map(|()| eprintln!("xroce: detached from {iface}"))
            .map_err(anyhow::Error::from),
        Command::Stats(args) => stats::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Exporter(args) => exporter::run(&args),
        Command::Capture(args) => capture::run(&args),
        Command::Bench(args) => perf::bench(&args),
        Command::Lat(args) => perf::lat(&args),
        Command::Ecn(args) => congestion::ecn(&args),
        Command::Fault(args) => congestion::fault(&args),
        Command::Decode(args) => decode::run(&args),
        Command::Experiment(args) => experiment::run(&args),
        Command::Pingpong(args) => pingpong::run(&args),
        Command::Run(args) => run::run(&args),
    };
    if let Err(e) = result {
        // One line: what went wrong and, from the error itself, what to do.
        eprintln!("xroce: {e:#}");
        std::process::exit(1);
    }
}
