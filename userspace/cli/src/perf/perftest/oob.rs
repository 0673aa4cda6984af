//! The out-of-band TCP connection of perftest's exchange: a client of the
//! server perftest names positionally (or --connect), else a server.

use std::{
    net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs},
    time::Duration,
};

use anyhow::Context;
use xroce::connect::perftest::PerftestConn;

use crate::perf::{stack::first_ipv4, PerfArgs, OOB_TIMEOUT};

/// How long a server waits for a client to connect.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The OOB connection: a client of `SERVER` (positional) or --connect,
/// else a server on --listen or 0.0.0.0:--port. Returns it with the local
/// address RoCE runs from.
pub(super) fn open_oob(args: &PerfArgs) -> anyhow::Result<(PerftestConn, IpAddr)> {
    let target: Option<SocketAddr> = match (&args.server, args.connect) {
        (Some(host), _) => Some(resolve(host, args.port)?),
        (None, Some(addr)) => Some(addr),
        (None, None) => None,
    };
    if let Some(addr) = target {
        let mut conn = PerftestConn::connect(addr, Duration::from_secs(10))
            .with_context(|| format!("connect to {addr}; is a perftest server (or `xroce ... --perftest`) running there?"))?;
        conn.set_timeout(OOB_TIMEOUT);
        let local = conn
            .local_addr()
            .context("the local address of the connection")?
            .ip();
        return Ok((conn, local));
    }
    let listen = args
        .listen
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], args.port)));
    let listener = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    let local_ip = if listen.ip().is_unspecified() {
        IpAddr::V4(first_ipv4(&args.iface)?)
    } else {
        listen.ip()
    };
    eprintln!("xroce: waiting for a perftest client on {listen}");
    let mut conn = PerftestConn::accept(&listener, ACCEPT_TIMEOUT)?;
    conn.set_timeout(OOB_TIMEOUT);
    Ok((conn, local_ip))
}

fn resolve(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    let with_port = if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]:{port}")
    } else if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    with_port
        .to_socket_addrs()
        .with_context(|| format!("resolve {with_port}"))?
        .find(|a| a.is_ipv4())
        .with_context(|| format!("{host} has no IPv4 address"))
}
