//! `xroce status [--iface IF] [--qps] [--json] [--watch [S]]`: the
//! interfaces of this network namespace that run xroce's XDP program (mode,
//! program id, dispatcher) or that processes use, and those processes: pid,
//! command, QPN blocks, AF_XDP ownership, UDP ports and live QPs; with
//! --qps each QP's state (`qp_table`), like `ss -i` or `rdma res show qp`.
//!
//! Where it looks: rtnetlink and the program's id for the XDP program
//! (`xroce::xdp::query`); the holds of the processes (abstract Unix names
//! `@xroce/<ifindex>/block/<b>` for users' blocks, flocks in
//! /run/xroce-holds for root's) and who holds them
//! (`xroce::device::holders`); the engines' published counters
//! (/run/xroce) for their QPs.

use std::{collections::BTreeMap, ffi::CStr, time::Duration};

use xroce::device::Hold;

use xroce_common::qpn_block;
use xroce_report::{InterfaceStatus, ProcessStatus, StatusReport, XdpStatus};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Only this network interface (as `ip link` names it)
    #[arg(long, value_name = "IF")]
    pub iface: Option<String>,
    /// Each QP's state: peer, PSNs, in-flight packets, retransmits, NAKs,
    /// rate, RTT (as its engine last published it, every half second)
    #[arg(long)]
    pub qps: bool,
    /// Print one JSON object on stdout (with --watch, one per line)
    #[arg(long)]
    pub json: bool,
    /// Refresh every S seconds (default 1) until interrupted
    #[arg(long, value_name = "S", num_args = 0..=1, default_missing_value = "1",
          value_parser = crate::units::seconds)]
    pub watch: Option<crate::units::Seconds>,
}

mod qp_table;

/// The interfaces of this network namespace: (ifindex, name).
pub(crate) fn list_interfaces() -> Vec<(u32, String)> {
    let mut out = Vec::new();
    // SAFETY: if_nameindex returns an array ended by a zero entry (or
    // null), freed once with if_freenameindex after we copied the names.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return out;
        }
        let mut i = list;
        while (*i).if_index != 0 {
            let name = CStr::from_ptr((*i).if_name).to_string_lossy().into_owned();
            out.push(((*i).if_index, name));
            i = i.add(1);
        }
        libc::if_freenameindex(list);
    }
    out.sort();
    out
}

/// Everything `xroce status` reports; the first error met asking for an
/// interface's XDP program (shown, not fatal: the processes still are).
fn collect(only: Option<&str>, qps: bool) -> anyhow::Result<(StatusReport, Option<String>)> {
    let only = match only {
        Some(name) => Some(xroce::xdp::if_index(name)?),
        None => None,
    };
    let holders = xroce::device::holders();
    let mut problem = None;
    let mut interfaces = Vec::new();
    for (ifindex, iface) in list_interfaces() {
        if only.is_some_and(|o| o != ifindex) {
            continue;
        }
        let xdp = match xroce::xdp::query(&iface) {
            Ok(a) => a.map(|a| XdpStatus {
                prog_id: a.prog_id,
                mode: a.mode.to_string(),
                dispatcher: a.dispatcher,
                by_process: a.by_process,
                arrival_times: a.arrival.as_str().into(),
            }),
            Err(e) => {
                problem.get_or_insert_with(|| format!("{iface}: {e}"));
                None
            }
        };
        let mut by_pid: BTreeMap<u32, ProcessStatus> = BTreeMap::new();
        let mut unattributed_blocks = Vec::new();
        for h in holders.iter().filter(|h| h.ifindex == ifindex) {
            let Some(pid) = h.pid else {
                if let Hold::Block(b) = h.hold {
                    unattributed_blocks.push(b);
                }
                continue;
            };
            let p = by_pid.entry(pid).or_insert_with(|| ProcessStatus {
                pid,
                command: xroce::device::command_name(pid),
                blocks: Vec::new(),
                afxdp: false,
                udp_ports: Vec::new(),
                qpns: None,
                qps: None,
            });
            match h.hold {
                Hold::Block(b) => {
                    p.blocks.push(b);
                    p.udp_ports.push(qpn_block::udp_port(b));
                }
                Hold::AfXdp => p.afxdp = true,
                Hold::Attaching | Hold::Capture => {}
            }
        }
        if xdp.is_none() && by_pid.is_empty() && unattributed_blocks.is_empty() {
            continue;
        }
        for published in xroce::stats_export::read_published(&iface) {
            if let Some(p) = by_pid.get_mut(&published.pid) {
                p.qpns = published.qpns;
                p.qps = published.qps.filter(|_| qps);
            }
        }
        let mut processes: Vec<ProcessStatus> = by_pid.into_values().collect();
        for p in &mut processes {
            p.blocks.sort_unstable();
            p.udp_ports.sort_unstable();
        }
        unattributed_blocks.sort_unstable();
        interfaces.push(InterfaceStatus {
            iface,
            ifindex,
            xdp,
            processes,
            unattributed_blocks,
        });
    }
    Ok((StatusReport { interfaces }, problem))
}

fn describe_xdp(xdp: &Option<XdpStatus>) -> String {
    let Some(x) = xdp else {
        return "no xroce XDP program (its processes run over UDP)".into();
    };
    let under = match x.dispatcher {
        Some(d) => format!(" under libxdp's dispatcher (id {d})"),
        None => String::new(),
    };
    let by = if x.by_process {
        "attached by a process for itself (its device's last process detaches it)"
    } else {
        "attached by `xroce attach` (stays until `xroce detach`)"
    };
    let program = match x.arrival_times.as_str() {
        "head" => {
            "xroce_xdp_head (arrival times in front of the frames: the kernel \
             refuses bpf_xdp_adjust_meta)"
        }
        "none" => {
            "xroce_xdp_plain (no arrival times: the kernel refused both \
             timestamping programs here)"
        }
        _ => "xroce_xdp",
    };
    format!(
        "{program}, program id {}, {} mode{under}; {by}",
        x.prog_id, x.mode
    )
}

pub fn run(args: &StatusArgs) -> anyhow::Result<()> {
    let Some(every) = &args.watch else {
        return show(args, true);
    };
    let every = Duration::from_secs_f64(every.value);
    let mut first = true;
    loop {
        if !args.json {
            // Clear the terminal and go home, as watch(1) does.
            print!("\x1b[H\x1b[2J");
        }
        show(args, first)?;
        first = false;
        use std::io::Write;
        std::io::stdout().flush()?;
        std::thread::sleep(every);
    }
}

/// One report: JSON or the human form. A problem seeing the XDP
/// programs is told on stderr the first time.
fn show(args: &StatusArgs, first: bool) -> anyhow::Result<()> {
    let (report, problem) = collect(args.iface.as_deref(), args.qps)?;
    if let Some(p) = problem.as_ref().filter(|_| first) {
        eprintln!("xroce: cannot see the XDP programs ({p}); run as root to see them");
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    if report.interfaces.is_empty() {
        println!("no interface here runs xroce's XDP program or has xroce processes");
    }
    for i in &report.interfaces {
        println!(
            "{} (ifindex {}): {}",
            i.iface,
            i.ifindex,
            describe_xdp(&i.xdp)
        );
        for p in &i.processes {
            let blocks: Vec<String> = p.blocks.iter().map(u32::to_string).collect();
            let ports: Vec<String> = p.udp_ports.iter().map(u16::to_string).collect();
            let qps = match &p.qpns {
                Some(q) if q.is_empty() => "no QPs".to_string(),
                Some(q) => {
                    let q: Vec<String> = q.iter().map(|n| format!("{n:#08x}")).collect();
                    format!("QPs {}", q.join(" "))
                }
                None => "QPs not published".to_string(),
            };
            println!(
                "  pid {:<7} {:<16} block {} (UDP {}){}; {qps}",
                p.pid,
                p.command,
                blocks.join(","),
                ports.join(","),
                if p.afxdp { ", AF_XDP owner" } else { "" }
            );
            match &p.qps {
                Some(q) if !q.is_empty() => print!("{}", qp_table::render(q, "    ")),
                Some(_) => {}
                None if args.qps => println!("    (its QPs' state is not published)"),
                None => {}
            }
        }
        if !i.unattributed_blocks.is_empty() {
            println!(
                "  blocks {:?} held by processes not visible here (run as root)",
                i.unattributed_blocks
            );
        }
    }
    Ok(())
}
