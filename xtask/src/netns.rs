//! Two network namespaces joined by a veth pair, for the demo and the
//! benchmarks. Deleted on drop and on Ctrl-C; addresses exist only inside.

use std::{
    net::Ipv4Addr,
    process::{Child, Command},
};

use anyhow::{Context, Result};

use crate::util::run;

pub struct NsPair {
    pub a: String,
    pub b: String,
    pub if_a: String,
    pub if_b: String,
    pub addr_a: Ipv4Addr,
    pub addr_b: Ipv4Addr,
}

impl NsPair {
    /// `tag` keeps concurrent runs apart; `octet` picks 10.78.<octet>.0/24.
    pub fn new(tag: &str, octet: u8, mtu: u32) -> Result<Self> {
        let id = std::process::id() & 0xffff;
        let pair = Self {
            a: format!("xr{tag}{id:x}a"),
            b: format!("xr{tag}{id:x}b"),
            if_a: format!("xr{tag}{id:x}a"),
            if_b: format!("xr{tag}{id:x}b"),
            addr_a: Ipv4Addr::new(10, 78, octet, 1),
            addr_b: Ipv4Addr::new(10, 78, octet, 2),
        };
        for name in [&pair.a, &pair.b] {
            run(Command::new("ip").args(["netns", "add", name]))?;
        }
        let names = [pair.a.clone(), pair.b.clone()];
        // Ctrl-C: delete what we made, then exit.
        let _ = ctrlc::set_handler(move || {
            for name in &names {
                let _ = Command::new("ip").args(["netns", "delete", name]).status();
            }
            std::process::exit(130);
        });
        run(Command::new("ip").args([
            "link", "add", &pair.if_a, "netns", &pair.a, "type", "veth", "peer", "name",
            &pair.if_b, "netns", &pair.b,
        ]))?;
        for (ns, ifname, addr) in [
            (&pair.a, &pair.if_a, pair.addr_a),
            (&pair.b, &pair.if_b, pair.addr_b),
        ] {
            run(in_ns(ns, "ip").args(["link", "set", "lo", "up"]))?;
            run(in_ns(ns, "ip").args(["addr", "add", &format!("{addr}/24"), "dev", ifname]))?;
            run(in_ns(ns, "ip").args(["link", "set", ifname, "mtu", &mtu.to_string(), "up"]))?;
        }
        Ok(pair)
    }
}

impl Drop for NsPair {
    fn drop(&mut self) {
        for name in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "delete", name]).status();
        }
    }
}

/// A command in namespace `ns` that keeps the host's mounts (so bpffs pins
/// stay visible, unlike `ip netns exec`).
pub fn in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{ns}"))
        .arg("--")
        .arg(program);
    cmd
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
