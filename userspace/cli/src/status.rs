//! `xroce status [--iface IF] [--json]`: the interfaces of this network
//! namespace that run xroce's XDP program (mode, program id, dispatcher)
//! or that processes use, and those processes: pid, command, QPN blocks,
//! AF_XDP ownership, UDP ports and live QPs.
//!
//! Where it looks: rtnetlink and the program's id for the XDP program
//! (`xroce::xdp::query`); the abstract Unix names the processes hold
//! (`@xroce/<ifindex>/block/<b>`, `@xroce/<ifindex>/afxdp`) in
//! /proc/net/unix, which is this network namespace's; the `socket:[inode]`
//! links under /proc/PID/fd for who holds them; the engines' published
//! counters (/run/xroce) for their QPs.

use std::{collections::BTreeMap, ffi::CStr, fs};

use xroce_common::qpn_block;
use xroce_report::{InterfaceStatus, ProcessStatus, StatusReport, XdpStatus};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Only this network interface (as `ip link` names it)
    #[arg(long, value_name = "IF")]
    pub iface: Option<String>,
    /// Print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

/// What an abstract name `@xroce/<ifindex>/...` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    Block(u32),
    AfXdp,
}

/// Parses a /proc/net/unix path; None for names that are not a hold.
fn parse_hold(path: &str) -> Option<(u32, Hold)> {
    let rest = path.strip_prefix("@xroce/")?;
    let (ifindex, what) = rest.split_once('/')?;
    let ifindex = ifindex.parse().ok()?;
    let hold = match what {
        "afxdp" => Hold::AfXdp,
        w => Hold::Block(w.strip_prefix("block/")?.parse().ok()?),
    };
    Some((ifindex, hold))
}

/// (inode, ifindex, hold) of every hold bound in this network namespace.
fn holds(unix: &str) -> Vec<(u64, u32, Hold)> {
    unix.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (ifindex, hold) = parse_hold(f.get(7)?)?;
            Some((f.get(6)?.parse().ok()?, ifindex, hold))
        })
        .collect()
}

/// Socket inode -> pid, for the inodes in `wanted`, from /proc/PID/fd.
/// Processes we may not look into (another user's, without root) are
/// skipped.
fn socket_owners(wanted: &[u64]) -> BTreeMap<u64, u32> {
    let mut owners = BTreeMap::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return owners;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = fs::read_link(fd.path()) else {
                continue;
            };
            let inode = link
                .to_str()
                .and_then(|l| l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok());
            if let Some(inode) = inode.filter(|i| wanted.contains(i)) {
                owners.insert(inode, pid);
            }
        }
    }
    owners
}

/// The interfaces of this network namespace: (ifindex, name).
fn list_interfaces() -> Vec<(u32, String)> {
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

fn command_name(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default()
}

/// Everything `xroce status` reports; the first error met asking for an
/// interface's XDP program (shown, not fatal: the processes still are).
fn collect(only: Option<&str>) -> anyhow::Result<(StatusReport, Option<String>)> {
    let only = match only {
        Some(name) => Some(xroce::xdp::if_index(name)?),
        None => None,
    };
    // /proc/net is the reading process's network namespace: ours.
    let unix = fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let holds = holds(&unix);
    let inodes: Vec<u64> = holds.iter().map(|h| h.0).collect();
    let owners = socket_owners(&inodes);
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
            }),
            Err(e) => {
                problem.get_or_insert_with(|| format!("{iface}: {e}"));
                None
            }
        };
        let mut by_pid: BTreeMap<u32, ProcessStatus> = BTreeMap::new();
        let mut unattributed_blocks = Vec::new();
        for &(inode, _, hold) in holds.iter().filter(|h| h.1 == ifindex) {
            let Some(&pid) = owners.get(&inode) else {
                if let Hold::Block(b) = hold {
                    unattributed_blocks.push(b);
                }
                continue;
            };
            let p = by_pid.entry(pid).or_insert_with(|| ProcessStatus {
                pid,
                command: command_name(pid),
                blocks: Vec::new(),
                afxdp: false,
                udp_ports: Vec::new(),
                qpns: None,
            });
            match hold {
                Hold::Block(b) => {
                    p.blocks.push(b);
                    p.udp_ports.push(qpn_block::udp_port(b));
                }
                Hold::AfXdp => p.afxdp = true,
            }
        }
        if xdp.is_none() && by_pid.is_empty() && unattributed_blocks.is_empty() {
            continue;
        }
        for published in xroce::stats_export::read_published(&iface) {
            if let Some(p) = by_pid.get_mut(&published.pid) {
                p.qpns = published.qpns;
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
    format!(
        "xroce_xdp, program id {}, {} mode{under}; {by}",
        x.prog_id, x.mode
    )
}

pub fn run(args: &StatusArgs) -> anyhow::Result<()> {
    let (report, problem) = collect(args.iface.as_deref())?;
    if let Some(p) = &problem {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_read_from_proc_net_unix() {
        let unix = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 4242 @xroce/3/block/0\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 4243 @xroce/3/afxdp\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 4244 @xroce/3/attaching\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 4245 @xroce/7/block/12\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 99 /run/systemd/notify\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 100\n";
        assert_eq!(
            holds(unix),
            [
                (4242, 3, Hold::Block(0)),
                (4243, 3, Hold::AfXdp),
                (4245, 7, Hold::Block(12))
            ]
        );
    }

    #[test]
    fn our_own_socket_is_found_by_its_inode() {
        use std::os::unix::fs::MetadataExt;
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
        let inode = fs::metadata(format!("/proc/self/fd/{fd}")).unwrap().ino();
        let owners = socket_owners(&[inode]);
        assert_eq!(owners.get(&inode), Some(&std::process::id()));
    }
}
