//! Named network namespaces for tests, benchmarks, VMs and `xroce
//! experiment`: made with iproute2, deleted when their [`Netns`] guard drops
//! (on success and on panic alike) and, once [`delete_on_interrupt`] is
//! installed, on Ctrl-C.
//!
//! Commands run inside with `nsenter --net=/run/netns/NAME`, never `ip netns
//! exec`: the latter mounts a fresh /sys, which hides the bpffs where xroce
//! pins its XDP maps between commands. Threads enter a namespace with
//! setns(2), which moves only the calling thread.

use std::{
    ffi::OsStr,
    fs::File,
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, Once},
    thread::JoinHandle,
};

use nix::sched::{setns, CloneFlags};

/// Where iproute2 keeps the named namespaces' mount points.
pub const NETNS_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot run {command} (is iproute2 installed?)")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("open {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("setns into {name}")]
    Setns {
        name: String,
        #[source]
        source: nix::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `/run/netns/<name>`.
pub fn path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// A command that runs `program` in namespace `name`'s network stack while
/// keeping the host's mounts (so /sys/fs/bpf pins stay visible; `ip netns
/// exec` would mount a fresh /sys and hide them).
pub fn command(name: &str, program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", path(name).display()))
        .arg("--")
        .arg(program);
    cmd
}

/// Runs `cmd` to completion; an error carries its stderr.
fn run(cmd: &mut Command) -> Result<()> {
    let describe = |cmd: &Command| {
        std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(OsStr::to_string_lossy)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let out = cmd.output().map_err(|source| Error::Spawn {
        command: describe(cmd),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Failed {
            command: describe(cmd),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// `ip -n NAME ARGS...`: iproute2 inside a namespace without entering it.
pub fn ip(name: &str, args: &[&str]) -> Result<()> {
    run(Command::new("ip").arg("-n").arg(name).args(args))
}

/// Deletes namespace `name` if it exists (best effort: for leftovers of
/// killed runs; guards delete their own).
pub fn delete(name: &str) {
    let _ = Command::new("ip").args(["netns", "delete", name]).output();
}

/// Moves the calling thread (only it) into namespace `name`.
pub fn enter(name: &str) -> Result<()> {
    let path = path(name);
    let file = File::open(&path).map_err(|source| Error::Open { path, source })?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| Error::Setns {
        name: name.to_string(),
        source,
    })
}

/// Runs `f` on a new thread inside namespace `name`; [`NsThread::join`]
/// gives its result. Fails, without running `f`, if the thread cannot enter.
pub fn spawn_in<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<NsThread<T>> {
    let name = name.to_string();
    let (entered_tx, entered_rx) = std::sync::mpsc::sync_channel(1);
    let handle = std::thread::spawn(move || {
        let entered = enter(&name);
        let ran = entered.is_ok();
        let _ = entered_tx.send(entered);
        ran.then(f)
    });
    match entered_rx.recv() {
        Ok(Ok(())) => Ok(NsThread(handle)),
        Ok(Err(e)) => Err(e),
        // The thread died before reporting: join says why.
        Err(_) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(_) => unreachable!("the thread reports before it returns"),
        },
    }
}

/// A thread running inside a namespace (from [`spawn_in`]).
#[derive(Debug)]
pub struct NsThread<T>(JoinHandle<Option<T>>);

impl<T> NsThread<T> {
    /// Waits for the thread; its result, or the panic it died of.
    pub fn join(self) -> std::thread::Result<T> {
        self.0
            .join()
            .map(|ran| ran.expect("spawn_in returns a thread only once it entered"))
    }

    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

/// Namespaces alive now, for [`delete_on_interrupt`].
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// On Ctrl-C: runs `before` (e.g. stop the processes using the
/// namespaces), deletes every namespace whose [`Netns`] guard is alive, and
/// exits with 130. Installed once per process; later calls do nothing.
pub fn delete_on_interrupt(before: impl Fn() + Send + 'static) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = ctrlc::set_handler(move || {
            before();
            let names = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
            for name in names.iter().rev() {
                delete(name);
            }
            std::process::exit(130);
        });
    });
}

/// A named network namespace with its loopback up; deleted on drop, which
/// also deletes the interfaces inside it (and so the peers of its veths).
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// `ip netns add NAME`, then `lo` up. A name already taken is an error.
    pub fn create(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        run(Command::new("ip").args(["netns", "add", &name]))?;
        if let Ok(mut live) = LIVE.lock() {
            live.push(name.clone());
        }
        // From here on a failure drops the guard, which deletes it.
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`, for `nsenter --net=`.
    pub fn path(&self) -> PathBuf {
        path(&self.name)
    }

    /// `program` in this namespace's network stack with the host's mounts
    /// (see [`command`]).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        command(&self.name, program)
    }

    /// `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> Result<()> {
        ip(&self.name, args)
    }

    /// Sets `iface`'s MTU, adds `addr/prefix_len` to it and brings it up.
    pub fn configure(&self, iface: &str, mtu: u32, addr: IpAddr, prefix_len: u8) -> Result<()> {
        self.ip(&["link", "set", iface, "mtu", &mtu.to_string()])?;
        self.ip(&["addr", "add", &format!("{addr}/{prefix_len}"), "dev", iface])?;
        self.ip(&["link", "set", iface, "up"])
    }

    /// Moves the calling thread (only it) into this namespace.
    pub fn enter_current_thread(&self) -> Result<()> {
        enter(&self.name)
    }

    /// Runs `f` on a new thread inside this namespace (see [`spawn_in`]).
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<NsThread<T>> {
        spawn_in(&self.name, f)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        delete(&self.name);
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|n| n != &self.name);
        }
    }
}

/// One end of a veth pair: its namespace and its interface name there.
#[derive(Clone, Copy, Debug)]
pub struct VethEnd<'a> {
    pub netns: &'a str,
    pub iface: &'a str,
}

/// Makes a veth pair from `a` to `b`, each end created directly in its
/// namespace with MTU `mtu` (both ends may share one namespace). The ends
/// stay down; [`Netns::configure`] or `ip link set ... up` raise them.
/// Deleting either namespace deletes the pair.
pub fn add_veth(a: VethEnd, b: VethEnd, mtu: u32) -> Result<()> {
    add_veth_queues(a, b, mtu, 1)
}

/// [`add_veth`] with `queues` RX and TX queues on each end (multi-queue
/// veth: the kernel spreads flows over them, and AF_XDP binds per queue).
pub fn add_veth_queues(a: VethEnd, b: VethEnd, mtu: u32, queues: u32) -> Result<()> {
    let (mtu, q) = (mtu.to_string(), queues.to_string());
    let mut args = vec!["link", "add"];
    for (i, e) in [a, b].into_iter().enumerate() {
        if i == 1 {
            args.extend(["type", "veth", "peer", "name"]);
        }
        args.extend([e.iface, "netns", e.netns, "mtu", &mtu]);
        args.extend(["numtxqueues", &q, "numrxqueues", &q]);
    }
    run(Command::new("ip").args(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_use_nsenter_with_the_netns_path() {
        let cmd = command("xr-test", "ip");
        assert_eq!(cmd.get_program(), "nsenter");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args, ["--net=/run/netns/xr-test", "--", "ip"]);
    }

    #[test]
    fn entering_a_missing_namespace_is_an_open_error() {
        let err = enter("xroce-netns-test-does-not-exist").unwrap_err();
        assert!(
            matches!(&err, Error::Open { path, source }
                if path == Path::new("/run/netns/xroce-netns-test-does-not-exist")
                    && source.kind() == std::io::ErrorKind::NotFound),
            "{err:?}"
        );
        let spawned = spawn_in("xroce-netns-test-does-not-exist", || 1);
        assert!(matches!(spawned, Err(Error::Open { .. })));
    }
}
