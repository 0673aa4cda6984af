//! `cargo xtask demo`: two network namespaces joined by a veth pair, the XDP
//! program attached natively on the receiver, RoCEv2-port UDP sent across,
//! `xroce capture` receiving it on AF_XDP, and the counters printed.
//!
//! Namespaces are deleted on every exit path (error, panic, Ctrl-C).

use std::{
    net::{Ipv4Addr, UdpSocket},
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::util::{self, require_root_for, run, step, workspace_root};

const FRAMES: u32 = 20_000;
const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);

pub fn demo() -> Result<()> {
    require_root_for("the demo (network namespaces and XDP)")?;
    step("build (release)");
    util::cargo(&["build", "--release", "--package", "xroce-cli"])?;
    let xroce = workspace_root().join("target/release/xroce");

    let tag = std::process::id() & 0xffff;
    let ns = Namespaces::new(format!("xrdemo{tag:x}a"), format!("xrdemo{tag:x}b"))?;
    let (if_a, if_b) = (format!("xrd{tag:x}a"), format!("xrd{tag:x}b"));
    step(&format!(
        "namespaces {} ({ADDR_A}) and {} ({ADDR_B}) joined by veth {if_a} <-> {if_b}",
        ns.a, ns.b
    ));
    run(Command::new("ip").args([
        "link", "add", &if_a, "netns", &ns.a, "type", "veth", "peer", "name", &if_b, "netns", &ns.b,
    ]))?;
    for (name, ifname, addr) in [(&ns.a, &if_a, ADDR_A), (&ns.b, &if_b, ADDR_B)] {
        run(in_ns(name, "ip").args(["link", "set", "lo", "up"]))?;
        run(in_ns(name, "ip").args(["addr", "add", &format!("{addr}/24"), "dev", ifname]))?;
        run(in_ns(name, "ip").args(["link", "set", ifname, "up"]))?;
    }

    step(&format!("attach the XDP program to {if_b} (native mode)"));
    run(in_ns(&ns.b, &xroce).args(["attach", "--iface", &if_b, "--mode", "native"]))?;
    let _detach = Detach {
        xroce: xroce.clone(),
        ns: ns.b.clone(),
        iface: if_b.clone(),
    };
    run(Command::new("bpftool").args(["prog", "show", "name", "xroce_xdp"]))?;

    step(&format!("{if_b}: AF_XDP socket on queue 0 (xroce capture)"));
    let capture = in_ns(&ns.b, &xroce)
        .args(["capture", "--iface", &if_b, "--count", &FRAMES.to_string()])
        .args(["--seconds", "20"])
        .stdout(Stdio::inherit())
        .spawn()
        .context("start xroce capture")?;
    let capture = KillOnDrop(capture);
    thread::sleep(Duration::from_millis(500));

    step(&format!(
        "ping, then {FRAMES} UDP datagrams to {ADDR_B}:4791 from {}",
        ns.a
    ));
    run(in_ns(&ns.a, "ping").args(["-c", "2", "-i", "0.2", &ADDR_B.to_string()]))?;
    send_udp(&ns.a, FRAMES)?;
    let status = capture.wait()?;
    if !status.success() {
        bail!("xroce capture failed ({status})");
    }

    step(&format!(
        "XDP counters on {if_b} (xroce stats, another process)"
    ));
    run(in_ns(&ns.b, &xroce).args(["stats", "--iface", &if_b]))?;
    Ok(())
}

fn in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    // nsenter keeps the host's mounts, so the bpffs pins stay visible.
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{ns}"))
        .arg("--")
        .arg(program);
    cmd
}

/// Sends from inside namespace `ns` on a thread of our own.
fn send_udp(ns: &str, frames: u32) -> Result<()> {
    let path = format!("/run/netns/{ns}");
    thread::spawn(move || -> Result<()> {
        let file = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
        // SAFETY: setns on a netns fd changes only this thread's namespace.
        if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) } != 0 {
            bail!("setns {path}: {}", std::io::Error::last_os_error());
        }
        let udp = UdpSocket::bind("0.0.0.0:0")?;
        // Room for a BTH and an ICRC, so the XDP program counts it as RoCEv2.
        let mut payload = [0u8; 256];
        for i in 0..frames {
            payload[..4].copy_from_slice(&i.to_be_bytes());
            udp.send_to(&payload, (ADDR_B, 4791))?;
            if i % 128 == 127 {
                thread::sleep(Duration::from_micros(500));
            }
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("sender thread panicked"))?
}

struct Namespaces {
    a: String,
    b: String,
}

impl Namespaces {
    fn new(a: String, b: String) -> Result<Self> {
        for name in [&a, &b] {
            run(Command::new("ip").args(["netns", "add", name]))?;
        }
        let ns = Self { a, b };
        let names = [ns.a.clone(), ns.b.clone()];
        // Ctrl-C: delete what we made, then exit.
        let _ = ctrlc::set_handler(move || {
            for name in &names {
                let _ = Command::new("ip").args(["netns", "delete", name]).status();
            }
            std::process::exit(130);
        });
        Ok(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "delete", name]).status();
        }
    }
}

struct Detach {
    xroce: PathBuf,
    ns: String,
    iface: String,
}

impl Drop for Detach {
    fn drop(&mut self) {
        let _ = in_ns(&self.ns, &self.xroce)
            .args(["detach", "--iface", &self.iface])
            .status();
    }
}

/// A child we started: waited for normally, killed by PID if we bail out.
struct KillOnDrop(Child);

impl KillOnDrop {
    fn wait(mut self) -> Result<std::process::ExitStatus> {
        Ok(self.0.wait()?)
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
