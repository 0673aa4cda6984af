//! `xroce run [--iface IF]... [--backend afxdp|udp] [--cc none|dcqcn|timely|swift]
//! -- PROGRAM [ARGS...]`: runs an unmodified libibverbs program over xroce.
//!
//! It finds xroce's drop-in `libibverbs.so.1` (crate `xroce-ibverbs`), puts
//! its directory first on `LD_LIBRARY_PATH`, passes the interfaces, backend
//! and congestion control to it through the environment the library reads
//! (`userspace/ibverbs/src/base/config.rs`), attaches the XDP program where
//! the AF_XDP backend needs it, and then exec(2)s PROGRAM: the PID, the signals
//! and the exit status are the program's own.

use std::{
    env,
    ffi::{CString, OsStr, OsString},
    fs,
    os::unix::{ffi::OsStrExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{anyhow, bail, Context};
use xroce::xdp::{self, Mode, XdpError};

/// The name programs look up (their DT_NEEDED entry).
const LIB: &str = "libibverbs.so.1";
/// The drop-in libraries: the name programs look up, and the cdylib
/// `cargo build` leaves next to the `xroce` executable.
const LIBS: &[(&str, &str)] = &[
    (LIB, "libxroce_ibverbs.so"),
    ("librdmacm.so.1", "libxroce_rdmacm.so"),
];

pub const LONG_ABOUT: &str = "\
Run an unmodified libibverbs program over xroce.

PROGRAM (ibv_devinfo, ibv_rc_pingpong, perftest's ib_write_bw, ...) is exec'd
in place of xroce, with xroce's drop-in libibverbs.so.1 first on its library
path: it sees one RDMA device per interface, named xroce_IF, and its PID,
signals and exit status are its own.

The library is found in $XROCE_LIB_DIR if set, else in lib/ next to the xroce
executable (made there from cargo's libxroce_ibverbs.so when missing), with
xroce's drop-in librdmacm.so.1 beside it (from libxroce_rdmacm.so).

With the afxdp backend, xroce's XDP program is attached to each --iface that
lacks it (native mode, else skb) and stays attached after PROGRAM exits, for
the next run; `xroce detach --iface IF` removes it. Without --iface, the
library itself attaches the program to each device PROGRAM opens and detaches
it when the device is closed.

PROGRAM and its children also see the devices where UCX, hwloc, pyverbs'
tests and rdma-core look for kernel RDMA devices: /sys/class/infiniband/xroce_IF,
/sys/class/infiniband_verbs/uverbsN and /dev/infiniband/{uverbsN,rdma_cm},
in a mount namespace of their own (without root, inside a user namespace
that keeps the caller's uid and gid); nothing on the host changes.
--no-device-view leaves that out.

Exit status: PROGRAM's; 127 if PROGRAM is not found, 126 if it cannot be
executed, 1 if xroce could not prepare the run.";

pub const AFTER_HELP: &str = "\
Examples:
  xroce run --iface eth1 -- ibv_devinfo -v
  xroce run --iface eth1 -- ib_write_bw -d xroce_eth1 -x 1            (server)
  xroce run --iface eth1 -- ib_write_bw -d xroce_eth1 -x 1 10.0.0.1   (client)
  xroce run --backend udp --iface eth1 -- ibv_rc_pingpong -d xroce_eth1 -g 1";

#[derive(clap::Args, Debug)]
#[command(override_usage = "xroce run [OPTIONS] -- PROGRAM [ARGS]...")]
pub struct RunArgs {
    /// Offer interface IF as RDMA device xroce_IF (repeat for several);
    /// without --iface, every Ethernet interface with an IPv4 address
    #[arg(long = "iface", value_name = "IF")]
    pub ifaces: Vec<String>,
    /// Packet I/O: afxdp (XDP + AF_XDP sockets; needs root; the default as
    /// root) or udp (a kernel UDP socket on port 4791; the default otherwise)
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Congestion control of the program's QPs
    #[arg(long, default_value = "none", value_parser = crate::units::cc())]
    pub cc: xroce::cc::CcKind,
    /// Do not give PROGRAM the private view of /sys/class/infiniband and
    /// /dev/infiniband (UCX, hwloc and pyverbs' tests then find no device;
    /// programs that only ask libibverbs/librdmacm, such as perftest and
    /// libfabric's verbs provider, still do)
    #[arg(long)]
    pub no_device_view: bool,
    /// The program to run and its arguments (put them after `--`)
    #[arg(
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<OsString>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Afxdp,
    Udp,
}

impl Backend {
    /// The value of `XROCE_BACKEND` the library reads.
    fn name(self) -> &'static str {
        match self {
            Backend::Afxdp => "afxdp",
            Backend::Udp => "udp",
        }
    }
}

/// Why `xroce run` stopped before exec'ing PROGRAM, with the exit status
/// a shell would give.
struct Failure {
    status: i32,
    error: anyhow::Error,
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure { status: 1, error }
    }
}

/// Prepares the environment and exec's PROGRAM; returns only by exiting
/// (with a one-line reason on stderr) when that fails.
pub fn run(args: &RunArgs) -> ! {
    let failure = match prepare(args) {
        Ok(mut command) => {
            // exec only returns on failure.
            let e = command.exec();
            let program = args.command[0].to_string_lossy();
            Failure {
                status: if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                },
                error: anyhow!("{program}: {e}"),
            }
        }
        Err(f) => f,
    };
    eprintln!("xroce run: {:#}", failure.error);
    std::process::exit(failure.status);
}

/// Everything before the exec: the command to exec, fully set up.
fn prepare(args: &RunArgs) -> Result<Command, Failure> {
    let (program, program_args) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow!("no PROGRAM given: xroce run [OPTIONS] -- PROGRAM [ARGS...]"))?;
    let path = find_program(program)?;
    let lib_dir = library_dir()?;

    let ifaces = dedup(&args.ifaces);
    for iface in &ifaces {
        check_interface(iface)?;
    }

    let root = is_root();
    let (backend, why) = match args.backend {
        Some(b) => (b, "asked for with --backend"),
        None if root => (
            Backend::Afxdp,
            "the default as root; --backend udp uses a kernel UDP socket instead",
        ),
        None => (
            Backend::Udp,
            "the default without root, since AF_XDP needs root; run as root for --backend afxdp",
        ),
    };
    if backend == Backend::Afxdp && !root {
        return Err(anyhow!(
            "--backend afxdp needs root (the XDP program and AF_XDP sockets need CAP_BPF and \
             CAP_NET_ADMIN): run it as root (sudo xroce run ...), or use --backend udp"
        )
        .into());
    }
    eprintln!("xroce run: backend {} ({why})", backend.name());
    if backend == Backend::Afxdp {
        for iface in &ifaces {
            ensure_attached(iface)?;
        }
    }

    let mut command = Command::new(&path);
    command.arg0(program).args(program_args);
    let mut library_path = lib_dir.into_os_string();
    if let Some(previous) = env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        library_path.push(":");
        library_path.push(previous);
    }
    command.env("LD_LIBRARY_PATH", library_path);
    if ifaces.is_empty() {
        command.env_remove("XROCE_IFACES");
    } else {
        command.env("XROCE_IFACES", ifaces.join(","));
    }
    command.env("XROCE_BACKEND", backend.name());
    command.env("XROCE_CC", args.cc.name());
    if !args.no_device_view {
        let devices = if ifaces.is_empty() {
            xroce::device::sysfs::default_interfaces()
        } else {
            ifaces
        };
        crate::view::enter(&devices).context(
            "the device view (--no-device-view runs PROGRAM without it; UCX and hwloc then find \
             no device)",
        )?;
    }
    Ok(command)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn dedup(ifaces: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for iface in ifaces {
        if !out.contains(iface) {
            out.push(iface.clone());
        }
    }
    out
}

/// True if this process may execute `path` (access(2) with X_OK, which
/// knows root's rules).
fn executable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access reads one NUL-terminated string and nothing else.
    path.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
}

/// PROGRAM as the shell finds it: a path if it has a `/`, else the first
/// executable of that name on $PATH.
fn find_program(program: &OsStr) -> Result<PathBuf, Failure> {
    let name = program.to_string_lossy();
    let not_found = || Failure {
        status: 127,
        error: anyhow!("{name}: not found"),
    };
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        if !path.exists() {
            return Err(not_found());
        }
        if !executable(&path) {
            return Err(Failure {
                status: 126,
                error: anyhow!("{name}: not an executable file (chmod +x {name}?)"),
            });
        }
        return Ok(path);
    }
    if program.is_empty() {
        return Err(not_found());
    }
    let search = env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    env::split_paths(&search)
        .map(|dir| {
            if dir.as_os_str().is_empty() {
                PathBuf::from(".").join(program)
            } else {
                dir.join(program)
            }
        })
        .find(|candidate| executable(candidate))
        .ok_or_else(not_found)
}

/// The directory holding xroce's `libibverbs.so.1`: `$XROCE_LIB_DIR`, else
/// `lib/` next to the xroce executable, made from cargo's cdylib there if
/// it is missing.
fn library_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = env::var_os("XROCE_LIB_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if !dir.join(LIB).is_file() {
            bail!(
                "XROCE_LIB_DIR={} holds no {LIB}: point it at the directory with xroce's {LIB} \
                 (or unset it to use the one built next to xroce)",
                dir.display()
            );
        }
        let dir =
            fs::canonicalize(&dir).with_context(|| format!("XROCE_LIB_DIR={}", dir.display()))?;
        return checked_for_path_list(dir);
    }
    let exe = env::current_exe().context("find the xroce executable (/proc/self/exe)")?;
    let exe_dir = exe
        .parent()
        .ok_or_else(|| anyhow!("the xroce executable {} has no directory", exe.display()))?;
    let lib_dir = exe_dir.join("lib");
    for (lib, cdylib) in LIBS {
        if !lib_dir.join(lib).is_file() && exe_dir.join(cdylib).is_file() {
            link_cdylib(&lib_dir, lib, cdylib)?;
        }
    }
    if lib_dir.join(LIB).is_file() {
        return checked_for_path_list(lib_dir);
    }
    bail!("xroce's {LIB} is not built: run `cargo build -p xroce-ibverbs` (or `cargo xtask build`)")
}

/// `lib_dir/LIB -> ../CDYLIB` (`libibverbs.so.1 -> ../libxroce_ibverbs.so`),
/// made under a temporary name and renamed into place, so that concurrent
/// runs never see a half-made link.
fn link_cdylib(lib_dir: &Path, lib: &str, cdylib: &str) -> anyhow::Result<()> {
    let hint = "or set XROCE_LIB_DIR to a directory holding libibverbs.so.1";
    fs::create_dir_all(lib_dir)
        .with_context(|| format!("create {} ({hint})", lib_dir.display()))?;
    let tmp = lib_dir.join(format!(".{lib}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(Path::new("..").join(cdylib), &tmp)
        .with_context(|| format!("create the symlink {} ({hint})", tmp.display()))?;
    let lib = lib_dir.join(lib);
    fs::rename(&tmp, &lib).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        anyhow!(
            "rename {} to {}: {e} ({hint})",
            tmp.display(),
            lib.display()
        )
    })
}

/// LD_LIBRARY_PATH splits at `:`, so a directory holding one cannot be on it.
fn checked_for_path_list(dir: PathBuf) -> anyhow::Result<PathBuf> {
    if dir.as_os_str().as_bytes().contains(&b':') {
        bail!(
            "{} has a `:` in its path, which LD_LIBRARY_PATH cannot hold: \
             set XROCE_LIB_DIR to a copy elsewhere",
            dir.display()
        );
    }
    Ok(dir)
}

/// The interface exists here and has an IPv4 address (its RoCEv2 GID).
fn check_interface(iface: &str) -> anyhow::Result<()> {
    if iface.is_empty() || iface.contains(',') || iface.contains('/') {
        bail!("--iface {iface:?} is not an interface name; `ip link` lists the interfaces");
    }
    xdp::if_index(iface)?;
    if xroce::device::interface_mac(iface)? == [0; 6] {
        bail!(
            "interface {iface} has no Ethernet address (loopback?): xroce's devices run RoCEv2 \
             over Ethernet; pick an Ethernet interface (`ip -br link`)"
        );
    }
    let (ipv4, _) = xroce::device::interface_addrs(iface)?;
    if ipv4.is_empty() {
        bail!(
            "interface {iface} has no IPv4 address, which xroce's devices need for their RoCEv2 \
             GID: add one (`ip addr add ADDR/LEN dev {iface}`) or pick another --iface"
        );
    }
    Ok(())
}

/// Attaches xroce's XDP program to `iface` unless it is there, as `xroce
/// attach` does (native mode), falling back to skb mode when the driver
/// refuses native XDP.
fn ensure_attached(iface: &str) -> anyhow::Result<()> {
    if xdp::is_attached(iface) {
        return Ok(());
    }
    match xdp::attach(iface, Mode::Native) {
        Ok(()) => {}
        // Another run attached it between our look and our attach.
        Err(XdpError::AlreadyAttached(_)) => return Ok(()),
        Err(e @ (XdpError::NotRoot | XdpError::NoBpffs | XdpError::NoSuchInterface(_))) => {
            return Err(e.into())
        }
        Err(native) => match xdp::attach(iface, Mode::Skb) {
            Ok(()) => eprintln!(
                "xroce run: native XDP failed on {iface} ({native}); attached in skb (generic) mode"
            ),
            Err(XdpError::AlreadyAttached(_)) => return Ok(()),
            Err(skb) => bail!(
                "cannot attach the XDP program to {iface}: native mode: {native}; skb mode: {skb} \
                 (--backend udp needs no XDP program)"
            ),
        },
    }
    eprintln!(
        "xroce run: attached the XDP program to {iface} (it stays until `xroce detach --iface {iface}`)"
    );
    Ok(())
}
