//! Helpers for end-to-end tests: network namespaces joined by veth pairs,
//! commands run inside them, and threads that live inside them.
//!
//! Every namespace made here has a unique name and is deleted when its guard
//! drops, on success and on panic alike. Addresses are only ever assigned
//! inside those namespaces.

pub mod roce;

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::PathBuf,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

pub mod datagram;
pub mod experiment;
pub mod perf;
pub mod programs;
pub mod verbs;

/// Fails the test (never skips it) unless we are root with the tools we need.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this end-to-end test needs root (network namespaces, XDP, AF_XDP); run `sudo cargo xtask test`"
    );
    for tool in ["ip", "nsenter"] {
        assert!(
            Command::new(tool).arg("-V").output().is_ok()
                || Command::new(tool).arg("--version").output().is_ok(),
            "`{tool}` is missing; run `cargo xtask setup` (installs iproute2 / util-linux)"
        );
    }
}

/// Short unique prefix for namespace and interface names (IFNAMSIZ is 16).
pub fn unique_tag() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:x}{n}", std::process::id() & 0xffff)
}

/// Runs a command and panics with its output if it fails.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ip(args: &[&str]) -> Output {
    run(Command::new("ip").args(args))
}

/// Moves the calling thread into the named network namespace.
pub fn enter_netns(name: &str) {
    let path = PathBuf::from("/run/netns").join(name);
    let file = File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // SAFETY: setns on a valid netns fd only changes this thread's netns.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {name}: {}", std::io::Error::last_os_error());
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(name: String) -> Self {
        ip(&["netns", "add", &name]);
        let ns = Self { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// A command that runs in this namespace's network stack but keeps the
    /// host's mounts (so /sys/fs/bpf pins are shared, unlike `ip netns exec`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// Runs `argv` inside the namespace; panics on failure.
    pub fn exec(&self, argv: &[&str]) -> Output {
        run(self.command(argv[0]).args(&argv[1..]))
    }

    /// Moves the calling thread into this namespace (for sockets opened by
    /// the test itself). Use it on a thread made for the purpose.
    pub fn enter_current_thread(&self) {
        enter_netns(&self.name);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace also removes the veth ends inside it.
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // A process killed mid-test cannot detach: its pins would outlive
        // the interfaces. The names are this test's own.
        for iface in [&self.if_a, &self.if_b] {
            let _ = std::fs::remove_dir_all(xroce::xdp::pin_dir(iface));
        }
    }
}

/// Two namespaces joined by a veth pair with IPv4 addresses in 10.77.x/24,
/// which exist only inside these namespaces.
pub struct VethPair {
    // Field order matters: both namespaces are dropped (deleted) last.
    pub a: Netns,
    pub b: Netns,
    pub if_a: String,
    pub if_b: String,
    pub addr_a: std::net::Ipv4Addr,
    pub addr_b: std::net::Ipv4Addr,
}

impl VethPair {
    pub fn new(mtu: u32) -> Self {
        let tag = unique_tag();
        let a = Netns::new(format!("xr{tag}a"));
        let b = Netns::new(format!("xr{tag}b"));
        let if_a = format!("xr{tag}a");
        let if_b = format!("xr{tag}b");
        // Third octet from the tag keeps parallel tests on separate subnets.
        let octet = (unique_subnet() % 250) as u8 + 1;
        let addr_a = std::net::Ipv4Addr::new(10, 77, octet, 1);
        let addr_b = std::net::Ipv4Addr::new(10, 77, octet, 2);
        ip(&[
            "link", "add", &if_a, "netns", &a.name, "type", "veth", "peer", "name", &if_b, "netns",
            &b.name,
        ]);
        for (ns, ifname, addr) in [(&a, &if_a, addr_a), (&b, &if_b, addr_b)] {
            ns.exec(&["ip", "link", "set", ifname, "mtu", &mtu.to_string()]);
            ns.exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", ifname]);
            ns.exec(&["ip", "link", "set", ifname, "up"]);
        }
        Self {
            a,
            b,
            if_a,
            if_b,
            addr_a,
            addr_b,
        }
    }
}

fn unique_subnet() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::process::id().wrapping_mul(7) + NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Path of a binary built by this workspace (target/<profile>/<name>).
pub fn workspace_bin(name: &str) -> PathBuf {
    // Integration tests run from target/<profile>/deps/.
    let mut path = std::env::current_exe().expect("current_exe");
    path.pop();
    if path.ends_with("deps") {
        path.pop();
    }
    let bin = path.join(name);
    assert!(
        bin.exists(),
        "{} is not built; run `cargo build --workspace` (cargo xtask test does)",
        bin.display()
    );
    bin
}

/// xroce's XDP program attached to `iface` in namespace `ns` with the
/// `xroce` binary; detached (and its pins removed) on drop.
pub struct AttachedXdp {
    ns: String,
    iface: String,
}

impl AttachedXdp {
    pub fn new(ns: &Netns, iface: &str, mode: &str) -> Self {
        let xroce = workspace_bin("xroce");
        ns.exec(&[
            xroce.to_str().unwrap(),
            "attach",
            "--iface",
            iface,
            "--mode",
            mode,
        ]);
        Self {
            ns: ns.name.clone(),
            iface: iface.to_string(),
        }
    }

    /// Runs `xroce ARGS...` in the namespace; panics on failure.
    pub fn xroce(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.ns))
            .arg("--")
            .arg(workspace_bin("xroce"))
            .args(args);
        run(&mut cmd)
    }
}

impl Drop for AttachedXdp {
    fn drop(&mut self) {
        let _ = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns))
            .arg("--")
            .arg(workspace_bin("xroce"))
            .args(["detach", "--iface", &self.iface])
            .output();
        let _ = std::fs::remove_dir_all(xroce::xdp::pin_dir(&self.iface));
    }
}

/// Opens an AF_XDP socket on queue 0 of `iface` inside `ns` on a thread of
/// its own and collects the frames that arrive until `stop` says so (it is
/// asked after each batch with the frames so far) or `timeout` passes.
/// Returns once the socket is open.
pub fn collect_frames(
    ns: &str,
    iface: &str,
    timeout: std::time::Duration,
    stop: impl Fn(&[Vec<u8>]) -> bool + Send + 'static,
) -> std::thread::JoinHandle<Vec<Vec<u8>>> {
    use xroce::io::afxdp::{XskConfig, XskSocket};
    let iface = iface.to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handle = spawn_in(ns, move || {
        let mut socket = XskSocket::open(&iface, 0, XskConfig::default()).expect("open AF_XDP");
        ready_tx.send(()).unwrap();
        let deadline = std::time::Instant::now() + timeout;
        let mut frames = Vec::new();
        while std::time::Instant::now() < deadline && !stop(&frames) {
            socket
                .recv(50, |f| frames.push(f.to_vec()))
                .expect("AF_XDP recv");
        }
        frames
    });
    ready_rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("AF_XDP socket did not open");
    handle
}

/// Runs `f` on a new thread inside namespace `ns`; the handle's `join`
/// gives its result.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter_netns(&ns);
        f()
    })
}

/// Runs `f` on a thread inside namespace `ns` and returns its result.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    spawn_in(ns, f)
        .join()
        .expect("thread in namespace panicked")
}
