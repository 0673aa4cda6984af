//! Helpers for end-to-end tests: network namespaces joined by veth pairs,
//! commands run inside them, and threads that live inside them.
//!
//! Every namespace made here has a unique name and is deleted when its guard
//! drops, on success and on panic alike. Addresses are only ever assigned
//! inside those namespaces.

pub mod roce;

use std::{
    path::PathBuf,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

pub use xroce_netns::NsThread;

pub mod datagram;
pub mod experiment;
pub mod lan;
pub mod perf;
pub mod programs;
pub mod shared;
pub mod two_hosts;
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

/// Moves the calling thread into the named network namespace.
pub fn enter_netns(name: &str) {
    xroce_netns::enter(name).unwrap_or_else(|e| panic!("{e}: {:?}", e));
}

/// A network namespace (xroce-netns's guard: deleted on drop, on success
/// and on panic alike), with panicking helpers for tests.
pub struct Netns {
    pub name: String,
    guard: xroce_netns::Netns,
}

impl Drop for Netns {
    /// What a root hold of an xroce process the test killed (SIGKILL)
    /// left in /run/xroce-holds goes with the test's namespace: nothing
    /// else would remove it until the next xroce takes a hold.
    fn drop(&mut self) {
        xroce::device::sweep_stale_holds();
    }
}

impl Netns {
    pub fn new(name: String) -> Self {
        let guard = xroce_netns::Netns::create(name.clone())
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        Self { name, guard }
    }

    pub fn path(&self) -> PathBuf {
        self.guard.path()
    }

    /// A command that runs in this namespace's network stack but keeps the
    /// host's mounts (`nsenter --net`; xdp_attach checks `ip netns exec` too).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.guard.command(program)
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

impl Drop for VethPair {
    fn drop(&mut self) {
        // The XDP programs go with the interfaces; what an older xroce
        // pinned under these (this test's own) names goes too.
        for iface in [&self.if_a, &self.if_b] {
            let _ = std::fs::remove_dir_all(xroce::xdp::pin_dir(iface));
        }
        // And their root, once nothing else is in it.
        let _ = std::fs::remove_dir(xroce_common::names::PIN_ROOT);
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
        Self::with_queues(mtu, 1)
    }

    /// A pair with `queues` RX and TX queues on each end.
    pub fn with_queues(mtu: u32, queues: u32) -> Self {
        let tag = unique_tag();
        let a = Netns::new(format!("xr{tag}a"));
        let b = Netns::new(format!("xr{tag}b"));
        let if_a = format!("xr{tag}a");
        let if_b = format!("xr{tag}b");
        // Third octet from the tag keeps parallel tests on separate subnets.
        let octet = (unique_subnet() % 250) as u8 + 1;
        let addr_a = std::net::Ipv4Addr::new(10, 77, octet, 1);
        let addr_b = std::net::Ipv4Addr::new(10, 77, octet, 2);
        xroce_netns::add_veth_queues(
            xroce_netns::VethEnd {
                netns: &a.name,
                iface: &if_a,
            },
            xroce_netns::VethEnd {
                netns: &b.name,
                iface: &if_b,
            },
            mtu,
            queues,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        for (ns, ifname, addr) in [(&a, &if_a, addr_a), (&b, &if_b, addr_b)] {
            ns.guard
                .configure(ifname, mtu, addr.into(), 24)
                .unwrap_or_else(|e| panic!("{e}"));
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

    /// Runs `f(if_b)` on a thread inside namespace b: xroce finds an
    /// interface's XDP program (and its maps) through the interface, so
    /// from the interface's network namespace.
    pub fn in_b<T: Send + 'static>(&self, f: impl FnOnce(&str) -> T + Send + 'static) -> T {
        let iface = self.if_b.clone();
        in_netns(&self.b.name, move || f(&iface))
    }

    /// Gives both ends an IPv6 address in fd77:<the IPv4 subnet's octet>::/64
    /// (`nodad`: no duplicate detection to wait for); returns (a's, b's).
    pub fn add_ipv6(&self) -> (std::net::Ipv6Addr, std::net::Ipv6Addr) {
        let subnet = u16::from(self.addr_a.octets()[2]);
        let addr_a = std::net::Ipv6Addr::new(0xfd77, subnet, 0, 0, 0, 0, 0, 1);
        let addr_b = std::net::Ipv6Addr::new(0xfd77, subnet, 0, 0, 0, 0, 0, 2);
        for (ns, iface, addr) in [(&self.a, &self.if_a, addr_a), (&self.b, &self.if_b, addr_b)] {
            let cidr = format!("{addr}/64");
            ns.exec(&["ip", "-6", "addr", "add", &cidr, "dev", iface, "nodad"]);
        }
        (addr_a, addr_b)
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
        run(xroce_netns::command(&self.ns, workspace_bin("xroce")).args(args))
    }
}

impl Drop for AttachedXdp {
    fn drop(&mut self) {
        let _ = xroce_netns::command(&self.ns, workspace_bin("xroce"))
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
) -> NsThread<Vec<Vec<u8>>> {
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
/// gives its result. Panics if the thread cannot enter `ns`.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> NsThread<T> {
    xroce_netns::spawn_in(ns, f).unwrap_or_else(|e| panic!("enter namespace {ns}: {e}"))
}

/// Runs `f` on a thread inside namespace `ns` and returns its result.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    spawn_in(ns, f)
        .join()
        .expect("thread in namespace panicked")
}

/// How xroce's XDP program on `iface` (in namespace `ns`) stamps the
/// arrival of the frames it redirects; panics if it runs none of xroce's.
pub fn xdp_arrival_stamp(ns: &str, iface: &str) -> xroce::xdp::ArrivalStamp {
    let iface = iface.to_string();
    in_netns(ns, move || arrival_stamp_here(&iface))
}

/// [`xdp_arrival_stamp`] for an interface of the calling thread's namespace.
pub fn arrival_stamp_here(iface: &str) -> xroce::xdp::ArrivalStamp {
    xroce::xdp::query(iface)
        .unwrap_or_else(|e| panic!("query XDP on {iface}: {e}"))
        .unwrap_or_else(|| panic!("{iface} runs no xroce XDP program"))
        .arrival
}

/// Frames of `received` that must carry an arrival time: all of them,
/// unless the kernel took xroce_xdp_plain, which stamps none.
pub fn expected_stamped(stamp: xroce::xdp::ArrivalStamp, received: u64) -> u64 {
    match stamp {
        xroce::xdp::ArrivalStamp::None => 0,
        _ => received,
    }
}
