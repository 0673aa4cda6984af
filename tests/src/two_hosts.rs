//! Two network namespaces that UCX and Open MPI take for two hosts, for
//! running their unmodified tools over xroce.
//!
//! - Both ends of the link have the same interface name, so both hosts
//!   have the same device `xroce_IF` (port 1, UCX's `xroce_IF:1`):
//!   ucx_perftest's server takes the client's UCT device name.
//! - Each program runs in an IPC namespace of its own (`unshare --ipc`):
//!   UCX decides that two processes share a host (and talk through shared
//!   memory: sysv, posix, cma) when their boot id and IPC namespace match;
//!   the namespaces share the boot id, so without this UCX would bypass the
//!   network whenever it may choose its transports.
//! - The hosts hang off a bridge in a third namespace `m` that has an
//!   address of its own: mpirun runs there and reaches both hosts (its
//!   launch agent starts their daemons), as it would on a head node.
//!
//! Namespaces are deleted when dropped (XDP detached first); processes are
//! [`Proc`]s, killed by PID when dropped.

use std::{
    ffi::OsString,
    net::Ipv4Addr,
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

use crate::{
    programs::{Backend, Proc, TempDir},
    run, unique_tag, workspace_bin, Netns,
};

/// One of the two hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

pub struct TwoHosts {
    pub backend: Backend,
    /// The interface name on both hosts.
    pub iface: String,
    pub addr_a: Ipv4Addr,
    pub addr_b: Ipv4Addr,
    /// The bridge's address in `m`.
    pub addr_m: Ipv4Addr,
    pub dir: TempDir,
    // Namespaces last: deleted (with their interfaces) after the rest.
    pub a: Netns,
    pub b: Netns,
    pub m: Netns,
}

fn next_subnet() -> u8 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    ((std::process::id().wrapping_mul(11) + NEXT.fetch_add(1, Ordering::Relaxed)) % 250) as u8 + 1
}

impl TwoHosts {
    /// The two hosts on a 1500-byte link through the bridge in `m`.
    pub fn new(backend: Backend) -> Self {
        if std::env::var_os("XROCE_LIB_DIR").is_none() {
            crate::verbs::ibverbs_cdylib();
        }
        let tag = unique_tag();
        let (a, b, m) = (
            Netns::new(format!("xr{tag}a")),
            Netns::new(format!("xr{tag}b")),
            Netns::new(format!("xr{tag}m")),
        );
        let iface = format!("xr{tag}");
        let bridge = format!("xr{tag}br");
        let octet = next_subnet();
        let addr_a = Ipv4Addr::new(10, 79, octet, 1);
        let addr_b = Ipv4Addr::new(10, 79, octet, 2);
        let addr_m = Ipv4Addr::new(10, 79, octet, 3);
        m.exec(&["ip", "link", "add", &bridge, "type", "bridge"]);
        m.exec(&["ip", "addr", "add", &format!("{addr_m}/24"), "dev", &bridge]);
        m.exec(&["ip", "link", "set", &bridge, "up"]);
        for (ns, port, addr) in [
            (&a, format!("xr{tag}pa"), addr_a),
            (&b, format!("xr{tag}pb"), addr_b),
        ] {
            run(Command::new("ip").args([
                "link", "add", &iface, "netns", &ns.name, "type", "veth", "peer", "name", &port,
                "netns", &m.name,
            ]));
            m.exec(&["ip", "link", "set", &port, "master", &bridge]);
            m.exec(&["ip", "link", "set", &port, "up"]);
            ns.exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", &iface]);
            ns.exec(&["ip", "link", "set", &iface, "up"]);
        }
        Self {
            backend,
            iface,
            addr_a,
            addr_b,
            addr_m,
            dir: TempDir::new(),
            a,
            b,
            m,
        }
    }

    pub fn ns(&self, side: Side) -> &Netns {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    pub fn addr(&self, side: Side) -> Ipv4Addr {
        match side {
            Side::A => self.addr_a,
            Side::B => self.addr_b,
        }
    }

    /// The verbs device on either host.
    pub fn ib_device(&self) -> String {
        format!("xroce_{}", self.iface)
    }

    /// The device as UCX names it (`UCX_NET_DEVICES`, `ucx_perftest -d`).
    pub fn ucx_device(&self) -> String {
        format!("{}:1", self.ib_device())
    }

    /// `xroce run --iface IF --backend B --`.
    pub fn xroce_run_argv(&self) -> Vec<OsString> {
        let mut v = vec![OsString::from(workspace_bin("xroce"))];
        v.extend(
            [
                "run",
                "--iface",
                &self.iface,
                "--backend",
                self.backend.as_str(),
                "--",
            ]
            .map(OsString::from),
        );
        v
    }

    /// `unshare --ipc -- xroce run --iface IF --backend B --`: what goes
    /// before a program so that it runs on a host of its own over xroce.
    pub fn host_prefix(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = ["unshare", "--ipc", "--"].map(OsString::from).into();
        v.extend(self.xroce_run_argv());
        v
    }

    /// PROGRAM ARGS on `side` ([`Self::host_prefix`] in its namespace),
    /// with `env` and `XROCE_VERBS_DEBUG=1` (failing verbs explain
    /// themselves on stderr).
    pub fn command(
        &self,
        side: Side,
        program: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Command {
        let prefix = self.host_prefix();
        let mut cmd = self.ns(side).command(&prefix[0]);
        cmd.args(&prefix[1..])
            .arg(program)
            .args(args)
            .env("XROCE_VERBS_DEBUG", "1")
            .envs(env.iter().copied());
        cmd
    }

    /// Starts PROGRAM on `side` (see [`Self::command`]).
    pub fn start(&self, side: Side, program: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
        let what = format!(
            "[{} on {side:?}] {}{program} {}",
            self.backend.as_str(),
            env.iter()
                .map(|(k, v)| format!("{k}={v} "))
                .collect::<String>(),
            args.join(" ")
        );
        Proc::spawn(self.command(side, program, args, env), what, &self.dir.0)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        // `xroce run --backend afxdp` leaves XDP attached.
        for ns in [&self.a, &self.b] {
            let _ = ns
                .command(workspace_bin("xroce"))
                .args(["detach", "--iface", &self.iface])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
