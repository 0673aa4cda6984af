//! The lab's topology: hosts, each a network namespace with one veth whose
//! peer sits on a bridge in another namespace. Two shapes: the incast's
//! (one receiver, N senders) and the collective's (N ranks, and an address
//! on the bridge for the head node that launches them).
//!
//! ```text
//!   ns s0: s0 10.201.0.2 ──┐
//!   ns s1: s1 10.201.0.3 ──┤ ns br: bridge br ── r-peer ── ns r: r 10.201.0.1
//!   ...                   ──┘
//!
//!   ns c0: c0 10.201.0.1 ──┐
//!   ns c1: c1 10.201.0.2 ──┤ ns br: bridge br 10.201.0.254 (head node)
//!   ...                   ──┘
//! ```
//!
//! Names carry this process's PID (base 36), so several experiments (and a
//! crashed one's leftovers) never collide; interface names are globally
//! unique too (older xroce pinned under `/sys/fs/bpf/xroce/<iface>/` in
//! the one bpffs every namespace shares). The 10.201.0.0/24 addresses exist
//! only inside these namespaces. [`Topology`] deletes everything on drop,
//! which runs on every exit path but SIGKILL; [`sweep_stale`] removes what a
//! killed run left behind.

use std::{net::Ipv4Addr, path::Path, process::Command};

use anyhow::{bail, Context};
use xroce_netns::{ip as ip_in, Netns, VethEnd};

/// Prefix of every namespace an experiment makes.
const NS_PREFIX: &str = "xroce-exp-";
/// Prefix of every interface an experiment makes.
const IF_PREFIX: &str = "xe";
/// Largest sender count: one /24 with the receiver at .1.
pub const MAX_SENDERS: usize = 250;
/// Largest rank count: a rank's role is `c` and one hex digit, so that
/// `xroce_` + the interface's name stays within the 15 characters UCX
/// keeps of a device's name (docs/clients.md) even with a 5-digit tag.
pub const MAX_RANKS: usize = 16;
/// The bridge's address in the ranks' shape: the head node's.
const HEAD_OCTET: u8 = 254;
/// Hosts beside the ranks: at most this many, from this address on.
pub const MAX_OTHERS: usize = 16;
const OTHERS_OCTET: u8 = 200;

/// `n` in base 36 (a PID fits in 5 digits).
fn base36(mut n: u32) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII digits")
}

/// One endpoint: its namespace, its interface inside it, the interface's
/// peer in the bridge namespace, and its address.
#[derive(Clone, Debug)]
pub struct Host {
    pub netns: String,
    pub iface: String,
    pub peer: String,
    pub addr: Ipv4Addr,
}

impl Host {
    /// A command that runs `program` in this host's network namespace while
    /// keeping the host's mounts (nsenter --net).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        xroce_netns::command(&self.netns, program)
    }
}

/// The namespaces, bridge and veth pairs of one experiment; all deleted on
/// drop (and the XDP pins of its interfaces removed).
pub struct Topology {
    pub bridge_netns: String,
    /// The bridge's own address, if it has one (the ranks' head node).
    pub bridge_addr: Option<Ipv4Addr>,
    /// The receiver first in the incast's shape; rank order in the ranks'.
    pub hosts: Vec<Host>,
    /// Hosts beside those on the same bridge (the collective's background
    /// senders `b0`, `b1`, ...).
    pub others: Vec<Host>,
    /// Namespaces made so far, deleted on drop, the first (the bridge's)
    /// last.
    made: Vec<Netns>,
}

impl Topology {
    /// The incast's shape: a receiver and `senders` senders with
    /// interface MTU `mtu`.
    pub fn build(senders: usize, mtu: u32) -> anyhow::Result<Self> {
        if senders == 0 || senders > MAX_SENDERS {
            bail!("--senders must be 1..={MAX_SENDERS}, not {senders}");
        }
        let hosts = std::iter::once(host("r", 1))
            .chain((0..senders).map(|i| host(&format!("s{i}"), i as u8 + 2)))
            .collect();
        Self::with_hosts(hosts, Vec::new(), None, mtu)
    }

    /// The collective's shape: `ranks` hosts `c0`, `c1`, ... and the
    /// bridge addressed as the head node, with interface MTU `mtu`; and
    /// `others` hosts `b0`, `b1`, ... beside them.
    pub fn ranks(ranks: usize, others: usize, mtu: u32) -> anyhow::Result<Self> {
        if !(1..=MAX_RANKS).contains(&ranks) {
            bail!("--ranks must be 1..={MAX_RANKS}, not {ranks}");
        }
        if others > MAX_OTHERS {
            bail!("at most {MAX_OTHERS} hosts beside the ranks, not {others}");
        }
        let hosts = (0..ranks)
            .map(|i| host(&format!("c{i:x}"), i as u8 + 1))
            .collect();
        let others = (0..others)
            .map(|i| host(&format!("b{i:x}"), OTHERS_OCTET + i as u8))
            .collect();
        Self::with_hosts(
            hosts,
            others,
            Some(Ipv4Addr::new(10, 201, 0, HEAD_OCTET)),
            mtu,
        )
    }

    fn with_hosts(
        hosts: Vec<Host>,
        others: Vec<Host>,
        bridge_addr: Option<Ipv4Addr>,
        mtu: u32,
    ) -> anyhow::Result<Self> {
        let mut topo = Topology {
            bridge_netns: netns_name("br"),
            bridge_addr,
            hosts,
            others,
            made: Vec::new(),
        };
        // On error, `topo` drops here and removes what was made.
        topo.make(mtu)?;
        Ok(topo)
    }

    /// The receiver (the incast's shape).
    pub fn receiver(&self) -> &Host {
        &self.hosts[0]
    }

    /// The senders (the incast's shape).
    pub fn senders(&self) -> &[Host] {
        &self.hosts[1..]
    }

    fn add_netns(&mut self, name: &str) -> anyhow::Result<()> {
        self.made.push(Netns::create(name)?);
        Ok(())
    }

    fn make(&mut self, mtu: u32) -> anyhow::Result<()> {
        let br_ns = self.bridge_netns.clone();
        self.add_netns(&br_ns)?;
        let bridge = format!("{IF_PREFIX}{}br", base36(std::process::id()));
        ip_in(&br_ns, &["link", "add", &bridge, "type", "bridge"])?;
        // No STP and no forwarding delay: ports forward as soon as they are up.
        ip_in(
            &br_ns,
            &[
                "link",
                "set",
                &bridge,
                "type",
                "bridge",
                "stp_state",
                "0",
                "forward_delay",
                "0",
            ],
        )?;
        ip_in(&br_ns, &["link", "set", &bridge, "mtu", &mtu.to_string()])?;
        if let Some(addr) = self.bridge_addr {
            ip_in(
                &br_ns,
                &["addr", "add", &format!("{addr}/24"), "dev", &bridge],
            )?;
        }
        ip_in(&br_ns, &["link", "set", &bridge, "up"])?;
        let hosts: Vec<Host> = self.hosts.iter().chain(&self.others).cloned().collect();
        for h in &hosts {
            self.add_netns(&h.netns)?;
            xroce_netns::add_veth(
                VethEnd {
                    netns: &h.netns,
                    iface: &h.iface,
                },
                VethEnd {
                    netns: &br_ns,
                    iface: &h.peer,
                },
                mtu,
            )?;
            ip_in(&br_ns, &["link", "set", &h.peer, "master", &bridge])?;
            ip_in(&br_ns, &["link", "set", &h.peer, "up"])?;
            let made = self.made.last().expect("added above");
            made.configure(&h.iface, mtu, h.addr.into(), 24)?;
        }
        // Static neighbours: no ARP at the start of a flow, and none lost
        // to a congested virtual queue later.
        let macs: Vec<String> = hosts
            .iter()
            .map(|h| mac_of(&h.netns, &h.iface))
            .collect::<anyhow::Result<_>>()?;
        for h in &hosts {
            for (other, mac) in hosts.iter().zip(&macs) {
                if other.iface != h.iface {
                    ip_in(
                        &h.netns,
                        &[
                            "neigh",
                            "replace",
                            &other.addr.to_string(),
                            "lladdr",
                            mac,
                            "dev",
                            &h.iface,
                            "nud",
                            "permanent",
                        ],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Every interface of the experiment that may have XDP pins.
    pub fn interfaces(&self) -> impl Iterator<Item = &str> {
        self.hosts
            .iter()
            .chain(&self.others)
            .map(|h| h.iface.as_str())
    }
}

/// The name of this experiment's namespace `what`.
fn netns_name(what: &str) -> String {
    format!("{NS_PREFIX}{}-{what}", base36(std::process::id()))
}

/// Host `role` of this experiment at 10.201.0.`last_octet`.
fn host(role: &str, last_octet: u8) -> Host {
    let tag = base36(std::process::id());
    Host {
        netns: netns_name(role),
        iface: format!("{IF_PREFIX}{tag}{role}"),
        peer: format!("{IF_PREFIX}{tag}{role}b"),
        addr: Ipv4Addr::new(10, 201, 0, last_octet),
    }
}

/// The MAC address of `iface` in `netns`, from `ip -o link`.
fn mac_of(netns: &str, iface: &str) -> anyhow::Result<String> {
    let out = Command::new("ip")
        .args(["-n", netns, "-o", "link", "show", "dev", iface])
        .output()
        .context("ip link show")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .map(str::to_string)
        .with_context(|| format!("no MAC address for {iface} in {netns}: {text}"))
}

/// Removes what an older xroce pinned for `iface`. The XDP program itself
/// belongs to the interface and goes with its namespace (detaching it from
/// here would look the name up in this process's namespace, not its own).
pub fn remove_pins(iface: &str) {
    let _ = std::fs::remove_dir_all(xroce::xdp::pin_dir(iface));
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Processes the experiment's children started in its namespaces
        // (an MPI job's daemons and ranks) die with them, not after.
        for ns in &self.made {
            super::procs::kill_in_netns(&ns.path());
        }
        let ifaces: Vec<String> = self.interfaces().map(str::to_string).collect();
        for iface in &ifaces {
            remove_pins(iface);
            // What the killed processes published under /run/xroce.
            let _ = std::fs::remove_dir_all(xroce::stats_export::export_dir(iface));
        }
        // Deleting a namespace deletes the veth ends in it, and with them
        // their peers and so the bridge's ports; the bridge namespace last.
        while let Some(ns) = self.made.pop() {
            drop(ns);
        }
    }
}

/// Removes namespaces and XDP pins left by experiments whose process no
/// longer exists (killed with SIGKILL, or a machine crash). Never touches a
/// running experiment's.
pub fn sweep_stale() {
    let alive = |tag: &str| {
        u32::from_str_radix(tag, 36)
            .map(|pid| Path::new(&format!("/proc/{pid}")).exists())
            .unwrap_or(true)
    };
    if let Ok(dir) = std::fs::read_dir(xroce_netns::NETNS_DIR) {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(NS_PREFIX) else {
                continue;
            };
            let tag = rest.split('-').next().unwrap_or_default();
            if !alive(tag) {
                xroce_netns::delete(&name);
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir(xroce_common::names::PIN_ROOT) {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(IF_PREFIX) else {
                continue;
            };
            // Interface names are xe<tag><r|sN|cX>: base 36 cannot tell the
            // role letter from a tag digit, so try each split and remove the
            // pins only if no split names a live experiment.
            let tags: Vec<&str> = (1..rest.len())
                .map(|i| &rest[..i])
                .filter(|tag| is_role(&rest[tag.len()..]))
                .collect();
            let looks_ours = !tags.is_empty();
            let owned_by_live = tags.iter().any(|tag| alive(tag));
            if looks_ours && !owned_by_live {
                remove_pins(&name);
            }
        }
    }
}

/// The role part of an interface name: `r` (receiver), `s<N>` (sender) or
/// `c<X>` (rank, one hex digit).
fn is_role(role: &str) -> bool {
    role == "r"
        || role
            .strip_prefix('s')
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        || role
            .strip_prefix('c')
            .is_some_and(|x| x.len() == 1 && x.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_ifnamsiz() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        // The largest PID Linux hands out (pid_max <= 2^22).
        let tag = base36(4_194_304);
        let longest = format!("{IF_PREFIX}{tag}s{}b", MAX_SENDERS - 1);
        assert!(longest.len() <= 15, "{longest}");
        // UCX keeps 15 characters of the device `xroce_<iface>`.
        let rank = format!("xroce_{IF_PREFIX}{tag}c{:x}", MAX_RANKS - 1);
        assert!(rank.len() <= 15, "{rank}");
        assert!(is_role("cf") && !is_role("c10") && !is_role("c"));
    }
}
