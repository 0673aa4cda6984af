//! N namespaces on one Ethernet segment: each has a veth whose peer is a
//! port of a bridge in a hub namespace, and an address in one /24
//! (collectives with more than two ranks; [`crate::programs::Bridged`] is
//! the two-node case with a capture port).

use std::{net::Ipv4Addr, process::Command, process::Stdio};

use crate::{run, unique_tag, workspace_bin, Netns};

/// One member of the segment.
pub struct Member {
    pub ns: Netns,
    pub iface: String,
    pub addr: Ipv4Addr,
}

impl Member {
    /// The device xroce offers for this member's interface.
    pub fn device(&self) -> String {
        format!("xroce_{}", self.iface)
    }

    /// `xroce run --iface IF --backend B -- PROGRAM` in this namespace.
    pub fn xroce_run(&self, backend: &str, program: &std::path::Path) -> Command {
        let mut cmd = self.ns.command(workspace_bin("xroce"));
        cmd.args(["run", "--iface", &self.iface, "--backend", backend, "--"])
            .arg(program)
            .env("XROCE_VERBS_DEBUG", "1");
        cmd
    }
}

/// The segment. On drop, XDP (left attached by `xroce run --backend
/// afxdp`) is detached from every member before the namespaces go.
pub struct Lan {
    // Declared first: dropped (and deleted) before the hub.
    pub members: Vec<Member>,
    pub hub: Netns,
}

fn next_subnet() -> u8 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ((std::process::id().wrapping_mul(7) + n) % 250) as u8 + 1
}

impl Lan {
    pub fn new(n: usize, mtu: u32) -> Self {
        assert!((1..=200).contains(&n), "Lan::new: {n} members");
        let tag = unique_tag();
        let hub = Netns::new(format!("xr{tag}h"));
        let bridge = format!("xr{tag}br");
        let mtu = mtu.to_string();
        hub.exec(&["ip", "link", "add", &bridge, "type", "bridge"]);
        hub.exec(&["ip", "link", "set", &bridge, "mtu", &mtu]);
        let octet = next_subnet();
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let ns = Netns::new(format!("xr{tag}n{i}"));
            let iface = format!("xr{tag}n{i}");
            let port = format!("xr{tag}p{i}");
            let addr = Ipv4Addr::new(10, 79, octet, i as u8 + 1);
            run(Command::new("ip").args([
                "link", "add", &iface, "netns", &ns.name, "type", "veth", "peer", "name", &port,
                "netns", &hub.name,
            ]));
            hub.exec(&["ip", "link", "set", &port, "mtu", &mtu]);
            hub.exec(&["ip", "link", "set", &port, "master", &bridge]);
            hub.exec(&["ip", "link", "set", &port, "up"]);
            ns.exec(&["ip", "link", "set", &iface, "mtu", &mtu]);
            ns.exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", &iface]);
            ns.exec(&["ip", "link", "set", &iface, "up"]);
            members.push(Member { ns, iface, addr });
        }
        hub.exec(&["ip", "link", "set", &bridge, "up"]);
        Self { members, hub }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for m in &self.members {
            let _ =
                m.ns.command(workspace_bin("xroce"))
                    .args(["detach", "--iface", &m.iface])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            let _ = std::fs::remove_dir_all(xroce::xdp::pin_dir(&m.iface));
        }
    }
}
