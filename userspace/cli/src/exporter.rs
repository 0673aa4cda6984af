//! `xroce exporter --listen ADDR`: serves Prometheus on
//! `http://ADDR/metrics` what `xroce stats` and `xroce status --qps` show
//! for the interfaces of this network namespace: the XDP program's
//! counters (each interface that runs it), every engine's counters and
//! each of its QPs' state (`metrics` names them). Each scrape reads them
//! afresh; the engines publish every half second.

use std::net::SocketAddr;

mod metrics;

use metrics::{EngineSample, Snapshot, XdpSample};

#[derive(clap::Args, Debug)]
pub struct ExporterArgs {
    /// Address and TCP port to serve on, e.g. 127.0.0.1:9791 or [::]:9791
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
}

/// Reads what one scrape shows, interface by interface; an interface
/// whose XDP counters cannot be read is told on stderr and left out.
fn snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    for (_, iface) in crate::status::list_interfaces() {
        if let Ok(Some(_)) = xroce::xdp::query(&iface) {
            let read = xroce::xdp::read_counters(&iface)
                .map_err(anyhow::Error::from)
                .and_then(|c| Ok((c, crate::stats::read_rx_queues(&iface)?)));
            match read {
                Ok((c, queues)) => snap.xdp.push(XdpSample {
                    iface: iface.clone(),
                    counters: c.values,
                    rx_queues: (0u32..).zip(queues).filter(|(_, q)| q.frames > 0).collect(),
                }),
                Err(e) => eprintln!("xroce exporter: {iface}: XDP counters: {e}"),
            }
        }
        for p in xroce::stats_export::read_published(&iface) {
            snap.engines.push(EngineSample {
                iface: iface.clone(),
                pid: p.pid,
                command: xroce::device::command_name(p.pid),
                counters: p.fields,
                qps: p.qps.unwrap_or_default(),
            });
        }
    }
    snap
}

pub fn run(args: &ExporterArgs) -> anyhow::Result<()> {
    let server = tiny_http::Server::http(args.listen)
        .map_err(|e| anyhow::anyhow!("cannot serve on {}: {e}", args.listen))?;
    eprintln!(
        "xroce: serving metrics on http://{}/metrics",
        server.server_addr()
    );
    let content_type = tiny_http::Header::from_bytes("Content-Type", metrics::CONTENT_TYPE)
        .expect("a valid header");
    for request in server.incoming_requests() {
        let answer = match (request.method(), request.url()) {
            (tiny_http::Method::Get, "/metrics") => {
                tiny_http::Response::from_string(metrics::encode(snapshot()))
                    .with_header(content_type.clone())
            }
            (tiny_http::Method::Get, "/") => {
                tiny_http::Response::from_string("xroce exporter: metrics on /metrics\n")
            }
            _ => tiny_http::Response::from_string("not found; metrics are on /metrics\n")
                .with_status_code(404),
        };
        // A scraper that went away is its business.
        let _ = request.respond(answer);
    }
    Ok(())
}
