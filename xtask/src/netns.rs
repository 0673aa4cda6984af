//! Two network namespaces joined by a veth pair, for the demo and the
//! benchmarks. Deleted on drop and on Ctrl-C; addresses exist only inside.

use std::{
    net::Ipv4Addr,
    process::{Child, Command},
};

use anyhow::{Context, Result};
use xroce_netns::{Netns, VethEnd};

/// A command in a namespace that keeps the host's mounts (so bpffs pins
/// stay visible, unlike `ip netns exec`).
pub use xroce_netns::command as in_ns;

pub struct NsPair {
    pub a: String,
    pub b: String,
    pub if_a: String,
    pub if_b: String,
    pub addr_a: Ipv4Addr,
    pub addr_b: Ipv4Addr,
    /// Deleted on drop, `a` first.
    _netns: [Netns; 2],
}

impl NsPair {
    /// `tag` keeps concurrent runs apart; `octet` picks 10.78.<octet>.0/24.
    pub fn new(tag: &str, octet: u8, mtu: u32) -> Result<Self> {
        Self::with_queues(tag, octet, mtu, 1)
    }

    /// [`NsPair::new`] with `queues` RX and TX queues on each end.
    pub fn with_queues(tag: &str, octet: u8, mtu: u32, queues: u32) -> Result<Self> {
        let id = std::process::id() & 0xffff;
        let (a, b) = (format!("xr{tag}{id:x}a"), format!("xr{tag}{id:x}b"));
        let (if_a, if_b) = (a.clone(), b.clone());
        let (addr_a, addr_b) = (
            Ipv4Addr::new(10, 78, octet, 1),
            Ipv4Addr::new(10, 78, octet, 2),
        );
        // Ctrl-C: delete what we made, then exit.
        xroce_netns::delete_on_interrupt(|| {});
        let netns = [Netns::create(&a)?, Netns::create(&b)?];
        xroce_netns::add_veth_queues(
            VethEnd {
                netns: &a,
                iface: &if_a,
            },
            VethEnd {
                netns: &b,
                iface: &if_b,
            },
            mtu,
            queues,
        )?;
        netns[0].configure(&if_a, mtu, addr_a.into(), 24)?;
        netns[1].configure(&if_b, mtu, addr_b.into(), 24)?;
        Ok(Self {
            a,
            b,
            if_a,
            if_b,
            addr_a,
            addr_b,
            _netns: netns,
        })
    }
}

/// A child we started: killed by PID when dropped if still running.
pub struct Started(pub Child);

impl Started {
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        Ok(Self(cmd.spawn().with_context(|| {
            format!("start {}", crate::util::describe(cmd))
        })?))
    }

    pub fn wait(mut self) -> Result<std::process::ExitStatus> {
        Ok(self.0.wait()?)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn xroce_bin() -> std::path::PathBuf {
    crate::util::workspace_root().join("target/release/xroce")
}
