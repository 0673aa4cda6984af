//! Debian's unmodified libfabric (libfabric-bin 1.17: fi_info,
//! fi_pingpong) over xroce's drop-in libibverbs.so.1 and librdmacm.so.1,
//! between two namespaces joined by veth, under `xroce run --iface IF
//! --backend B`, on both backends. libfabric's verbs provider finds its
//! devices through rdma_get_devices and the interfaces' addresses through
//! rdma_bind_addr ("localhost" first, then each interface's address), and
//! connects MSG endpoints with RDMA-CM; it reads nothing under
//! /sys/class/infiniband (strace: it only probes for qib0/hfi1_0, the PSM
//! providers' devices).
//!
//! - `fi_info -p verbs` lists the device `xroce_IF`: an FI_EP_MSG entry
//!   (RDMA-CM over IB RC) whose source address is the interface's, and
//!   the FI_EP_DGRAM domain `xroce_IF-dgram`;
//! - `fi_info -p "verbs;ofi_rxm"` lists FI_EP_RDM entries on `xroce_IF`
//!   (before loopback binds worked, the verbs provider answered ENODATA);
//! - fi_pingpong with data checks (-c), server in b, client in a: verbs
//!   MSG endpoints, verbs;ofi_rxm RDM endpoints, verbs DGRAM endpoints.
//!   Both sides exit 0 and print a row per transfer size with every
//!   iteration sent and acknowledged.

use std::time::Duration;

use xroce_tests::{
    per_backend,
    programs::{args, serial, wait_listening, Backend, Cases, Finished, Topology},
    require_root,
    verbs::{rdmacm_cdylib, which},
};

/// One program run.
const RUN: Duration = Duration::from_secs(90);
/// fi_pingpong's iterations per size.
const ITERATIONS: usize = 10;
/// fi_pingpong's control port (TCP, in the server's namespace).
const CONTROL_PORT: u16 = 47592;
/// The sizes fi_pingpong -S all tries: up to 1 MiB on MSG and RDM
/// endpoints, up to what fits a 1500-byte link's datagram on DGRAM.
const STREAM_SIZES: &[&str] = &["64", "256", "1k", "4k", "64k", "1m"];
const DGRAM_SIZES: &[&str] = &["64", "256", "1k"];

fn require_programs() {
    for program in ["fi_info", "fi_pingpong"] {
        assert!(
            which(program).is_some(),
            "{program} is missing: install libfabric-bin (cargo xtask setup does)"
        );
    }
    // `xroce run` links both libraries beside itself; build them as they
    // are now (Topology builds libibverbs.so.1).
    let _ = rdmacm_cdylib();
}

/// fi_info's `key: value` lines, entry by entry (each starts with
/// "provider:").
fn fi_info_entries(stdout: &str) -> Vec<Vec<(String, String)>> {
    let mut entries: Vec<Vec<(String, String)>> = Vec::new();
    for line in stdout.lines() {
        let Some((k, v)) = line.trim().split_once(": ") else {
            continue;
        };
        if k == "provider" {
            entries.push(Vec::new());
        }
        if let Some(e) = entries.last_mut() {
            e.push((k.to_string(), v.trim().to_string()));
        }
    }
    entries
}

fn field<'a>(entry: &'a [(String, String)], key: &str) -> Option<&'a str> {
    entry
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Runs fi_info ARGS in the client's namespace; exit 0 required.
fn fi_info(t: &Topology, extra: &[&str]) -> Result<Finished, String> {
    let f = t.run(t.client(), "fi_info", &args(extra), RUN);
    f.check()?;
    Ok(f)
}

/// An entry of `provider` with `domain` and `ep_type`, or an error listing
/// what fi_info printed.
fn find_entry<'a>(
    f: &Finished,
    entries: &'a [Vec<(String, String)>],
    provider: &str,
    domain: &str,
    ep_type: &str,
) -> Result<&'a [(String, String)], String> {
    entries
        .iter()
        .find(|e| {
            field(e, "provider") == Some(provider)
                && field(e, "domain") == Some(domain)
                && field(e, "type") == Some(ep_type)
        })
        .map(Vec::as_slice)
        .ok_or_else(|| {
            format!(
                "no {provider} entry for domain {domain} with type {ep_type}\n{}",
                f.describe()
            )
        })
}

/// `fi_info -v`'s entries (each after a "fi_info:" line) as
/// "section.key" -> value, sections nested by indentation
/// ("fi_domain_attr.name", "fi_ep_attr.type", top-level "src_addr").
fn fi_info_verbose_entries(stdout: &str) -> Vec<Vec<(String, String)>> {
    let mut entries: Vec<Vec<(String, String)>> = Vec::new();
    let mut sections: Vec<(usize, String)> = Vec::new();
    for line in stdout.lines() {
        if line.trim() == "fi_info:" {
            entries.push(Vec::new());
            sections.clear();
            continue;
        }
        let Some(entry) = entries.last_mut() else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        sections.retain(|(i, _)| *i < indent);
        if let Some(name) = text.strip_suffix(':') {
            sections.push((indent, name.to_string()));
        } else if let Some((k, v)) = text.split_once(": ") {
            let path: Vec<&str> = sections
                .iter()
                .map(|(_, n)| n.as_str())
                .chain([k])
                .collect();
            entry.push((path.join("."), v.trim().to_string()));
        }
    }
    entries
}

fn fi_info_verbs(t: &Topology) -> Result<String, String> {
    let device = t.client().device();
    let f = fi_info(t, &["-p", "verbs"])?;
    let entries = fi_info_entries(&f.stdout);
    let msg = find_entry(&f, &entries, "verbs", &device, "FI_EP_MSG")?;
    let protocol = field(msg, "protocol").unwrap_or("");
    if protocol != "FI_PROTO_RDMA_CM_IB_RC" {
        return Err(format!("MSG protocol {protocol:?}\n{}", f.describe()));
    }
    find_entry(
        &f,
        &entries,
        "verbs",
        &format!("{device}-dgram"),
        "FI_EP_DGRAM",
    )?;
    // The MSG entries carry the interface's address (found by binding it
    // after "localhost"), not the loopback's.
    let v = fi_info(t, &["-p", "verbs", "-t", "FI_EP_MSG", "-v"])?;
    let want_src = format!("fi_sockaddr_in://{}:0", t.client().addr);
    let verbose = fi_info_verbose_entries(&v.stdout);
    let has_src = verbose.iter().any(|e| {
        field(e, "fi_domain_attr.name") == Some(device.as_str())
            && field(e, "fi_ep_attr.type") == Some("FI_EP_MSG")
            && field(e, "src_addr") == Some(want_src.as_str())
    });
    if !has_src {
        return Err(format!(
            "no MSG entry of {device} with src_addr {want_src}\n{}",
            v.describe()
        ));
    }
    Ok(format!(
        "{} entries; MSG on {device} from {want_src}, DGRAM on {device}-dgram",
        entries.len()
    ))
}

fn fi_info_rxm(t: &Topology) -> Result<String, String> {
    let device = t.client().device();
    let f = fi_info(t, &["-p", "verbs;ofi_rxm"])?;
    let entries = fi_info_entries(&f.stdout);
    find_entry(&f, &entries, "verbs;ofi_rxm", &device, "FI_EP_RDM")?;
    let others: Vec<_> = entries
        .iter()
        .filter(|e| field(e, "provider") != Some("verbs;ofi_rxm"))
        .collect();
    if !others.is_empty() {
        return Err(format!(
            "entries of other providers: {others:?}\n{}",
            f.describe()
        ));
    }
    Ok(format!("{} RDM entries on {device}", entries.len()))
}

/// fi_pingpong's table rows: (size, sent, acked).
fn pingpong_rows(stdout: &str) -> Vec<(String, usize, usize)> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let size = w.next()?.to_string();
            let sent = w.next()?.parse().ok()?;
            let acked = w.next()?.strip_prefix('=')?.parse().ok()?;
            Some((size, sent, acked))
        })
        .collect()
}

/// One row per size in `sizes`, each with every iteration sent and acked.
fn check_rows(f: &Finished, sizes: &[&str]) -> Result<(), String> {
    let rows = pingpong_rows(&f.stdout);
    let got: Vec<&str> = rows.iter().map(|(s, _, _)| s.as_str()).collect();
    if got != sizes {
        return Err(format!(
            "sizes {got:?}, expected {sizes:?}\n{}",
            f.describe()
        ));
    }
    if let Some((size, sent, acked)) = rows
        .iter()
        .find(|(_, sent, acked)| *sent != ITERATIONS || *acked != ITERATIONS)
    {
        return Err(format!(
            "{size}: {sent} sent, {acked} acked, expected {ITERATIONS}\n{}",
            f.describe()
        ));
    }
    Ok(())
}

/// fi_pingpong -p PROVIDER -e EP -c between the namespaces: the server
/// in b (started first, its control port listening), the client in a.
fn pingpong(t: &Topology, provider: &str, ep: &str, sizes: &[&str]) -> Result<String, String> {
    let port = CONTROL_PORT.to_string();
    let iterations = ITERATIONS.to_string();
    let common = ["-p", provider, "-e", ep, "-I", &iterations, "-c"];
    let mut server_args = args(&common);
    server_args.extend(args(&["-B", &port]));
    let mut client_args = args(&common);
    client_args.extend(args(&["-P", &port, &t.server().addr.to_string()]));
    let mut server = t.start(t.server(), "fi_pingpong", &server_args);
    if let Err(why) = wait_listening(t.server().ns, CONTROL_PORT, &mut server, RUN) {
        return Err(format!(
            "{why}\n{}",
            server.finish(Duration::ZERO).describe()
        ));
    }
    let client = t.run(t.client(), "fi_pingpong", &client_args, RUN);
    let grace = if client.success() {
        RUN
    } else {
        Duration::from_secs(10)
    };
    let server = server.finish(grace);
    for f in [&client, &server] {
        f.check()?;
        check_rows(f, sizes)?;
    }
    Ok(format!(
        "{} sizes x {ITERATIONS} checked on both sides, client {:.1}s",
        sizes.len(),
        client.secs
    ))
}

per_backend!(libfabric);

fn libfabric(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("libfabric/{}", b.as_str()));
    c.case("fi_info -p verbs", || fi_info_verbs(&t));
    c.case("fi_info -p \"verbs;ofi_rxm\"", || fi_info_rxm(&t));
    c.case("fi_pingpong -p verbs -e msg -c", || {
        pingpong(&t, "verbs", "msg", STREAM_SIZES)
    });
    c.case("fi_pingpong -p \"verbs;ofi_rxm\" -e rdm -c", || {
        pingpong(&t, "verbs;ofi_rxm", "rdm", STREAM_SIZES)
    });
    c.case("fi_pingpong -p verbs -e dgram -c", || {
        pingpong(&t, "verbs", "dgram", DGRAM_SIZES)
    });
    c.finish();
}
