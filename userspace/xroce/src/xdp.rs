//! Loads xroce's XDP program, attaches it to an interface, pins its maps and
//! link under `/sys/fs/bpf/xroce/<iface>/`, and reads them back from any
//! process (`xroce stats` runs apart from `xroce attach`).

use std::{
    ffi::CString,
    fmt, fs,
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, PerCpuArray, XskMap},
    programs::{links::FdLink, links::PinnedLink, Xdp, XdpMode},
    Ebpf, EbpfLoader,
};
use xroce_common::{
    config_flags,
    congestion::{EcnConfig, VirtualQueue},
    fault::FaultConfig,
    names, qpn_block, Counter,
};

/// The XDP object built from ebpf/ by build.rs.
static XDP_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xroce-xdp"));

/// How the program runs on the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// In the driver (veth, most NICs): fastest; needed for AF_XDP at speed.
    Native,
    /// Generic XDP in the kernel stack: works on any interface.
    Skb,
}

impl Mode {
    fn xdp_mode(self) -> XdpMode {
        match self {
            Mode::Native => XdpMode::Driver,
            Mode::Skb => XdpMode::Skb,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Native => "native",
            Mode::Skb => "skb",
        })
    }
}

impl std::str::FromStr for Mode {
    type Err = XdpError;
    fn from_str(s: &str) -> Result<Self, XdpError> {
        match s {
            "native" | "driver" => Ok(Mode::Native),
            "skb" | "generic" => Ok(Mode::Skb),
            other => Err(XdpError::BadMode(other.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    #[error("interface {0} does not exist; `ip link` lists the interfaces here")]
    NoSuchInterface(String),
    #[error("attaching XDP needs root (CAP_BPF and CAP_NET_ADMIN); run it with sudo")]
    NotRoot,
    #[error("interface {0} has no xroce XDP program; run `xroce attach --iface {0}`")]
    NotAttached(String),
    #[error(
        "interface {0} already has the xroce XDP program; run `xroce detach --iface {0}` first"
    )]
    AlreadyAttached(String),
    #[error("unknown XDP mode {0:?}; use `native` or `skb`")]
    BadMode(String),
    #[error("bpffs is not mounted at /sys/fs/bpf; run `mount -t bpf bpf /sys/fs/bpf`")]
    NoBpffs,
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the xroce XDP object has no program named {0}")]
    NoProgram(&'static str),
    /// A BPF operation failed; `source` is aya's error (for a rejected
    /// program, the verifier log is in its chain).
    #[error("{what}")]
    Bpf {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

/// Wraps an aya error as [`XdpError::Bpf`] saying what was being done.
fn bpf_err<E>(what: impl Into<String>) -> impl FnOnce(E) -> XdpError
where
    E: std::error::Error + Send + Sync + 'static,
{
    let what = what.into();
    move |e| XdpError::Bpf {
        what,
        source: Box::new(e),
    }
}

/// Directory holding one interface's pinned maps and link.
pub fn pin_dir(iface: &str) -> PathBuf {
    Path::new(names::PIN_ROOT).join(iface)
}

/// Kernel index of `iface`, or a clear error if there is no such interface.
pub fn if_index(iface: &str) -> Result<u32, XdpError> {
    let name = CString::new(iface).map_err(|_| XdpError::NoSuchInterface(iface.into()))?;
    // SAFETY: if_nametoindex reads a NUL-terminated string and nothing else.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => Err(XdpError::NoSuchInterface(iface.into())),
        index => Ok(index),
    }
}

/// Whether this process runs as root (attaching XDP needs it).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn require_root() -> Result<(), XdpError> {
    if !is_root() {
        return Err(XdpError::NotRoot);
    }
    Ok(())
}

fn bpffs_mounted() -> bool {
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf"))
}

/// Mounts bpffs at /sys/fs/bpf if it is not there (as bpftool does), since
/// pinning is how other processes find our maps.
fn ensure_bpffs() -> Result<(), XdpError> {
    if bpffs_mounted() {
        return Ok(());
    }
    let _ = fs::create_dir_all("/sys/fs/bpf");
    // SAFETY: all arguments are valid NUL-terminated strings or null.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c"/sys/fs/bpf".as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 || bpffs_mounted() {
        Ok(())
    } else {
        Err(XdpError::NoBpffs)
    }
}

/// Loads the program, attaches it to `iface` in `mode` and pins the link and
/// maps, so the attachment outlives this process until [`detach`].
pub fn attach(iface: &str, mode: Mode) -> Result<(), XdpError> {
    require_root()?;
    let ifindex = if_index(iface)?;
    ensure_bpffs()?;
    // One attacher at a time: the check below and the clean-up after a
    // failure must not meet another process's half-made attachment.
    let _attaching = crate::device::attaching(ifindex, std::time::Duration::from_secs(10))
        .map_err(|source| XdpError::Io {
            what: format!("wait to attach to {iface}"),
            source,
        })?;
    let dir = pin_dir(iface);
    let link_pin = dir.join(names::LINK_PIN);
    if link_pin.exists() {
        return Err(XdpError::AlreadyAttached(iface.into()));
    }
    fs::create_dir_all(&dir).map_err(|source| XdpError::Io {
        what: format!("create {}", dir.display()),
        source,
    })?;
    let result = load_and_attach(iface, mode, &dir, &link_pin);
    if result.is_err() {
        // Leave nothing half-made behind: a later attach starts clean.
        let _ = fs::remove_dir_all(&dir);
    }
    result
}

fn load_and_attach(iface: &str, mode: Mode, dir: &Path, link_pin: &Path) -> Result<(), XdpError> {
    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(dir);
    let btf_pins: Vec<(&str, PathBuf)> = names::BTF_MAPS
        .iter()
        .map(|name| (*name, dir.join(name)))
        .collect();
    for (name, path) in &btf_pins {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf: Ebpf = loader
        .load(XDP_OBJECT)
        .map_err(bpf_err("load the xroce XDP object"))?;
    let program: &mut Xdp = ebpf
        .program_mut(names::PROGRAM)
        .ok_or(XdpError::NoProgram(names::PROGRAM))?
        .try_into()
        .map_err(bpf_err("XDP program type"))?;
    program
        .load()
        .map_err(bpf_err("the kernel verifier rejected the XDP program"))?;
    let link_id = program
        .attach(iface, mode.xdp_mode())
        .map_err(bpf_err(format!("attach XDP to {iface} in {mode:?} mode")))?;
    let link = program
        .take_link(link_id)
        .map_err(bpf_err("take the XDP link"))?;
    let fd_link: FdLink = link.try_into().map_err(bpf_err(
        "pin the XDP link (this kernel has no bpf_link for XDP; it needs 5.9 or later)",
    ))?;
    fd_link.pin(link_pin).map_err(bpf_err(format!(
        "pin the XDP link at {}",
        link_pin.display()
    )))?;
    Ok(())
}

/// Detaches the program from `iface` and removes its pins.
pub fn detach(iface: &str) -> Result<(), XdpError> {
    require_root()?;
    let dir = pin_dir(iface);
    let link_pin = dir.join(names::LINK_PIN);
    if !link_pin.exists() {
        if_index(iface)?;
        return Err(XdpError::NotAttached(iface.into()));
    }
    let link =
        PinnedLink::from_pin(&link_pin).map_err(bpf_err(format!("open {}", link_pin.display())))?;
    let fd_link = link.unpin().map_err(|source| XdpError::Io {
        what: format!("unpin {}", link_pin.display()),
        source,
    })?;
    // Dropping the last reference to the link detaches the program.
    drop(fd_link);
    fs::remove_dir_all(&dir).map_err(|source| XdpError::Io {
        what: format!("remove {}", dir.display()),
        source,
    })
}

/// True if `iface` has xroce's program attached (its link is pinned).
pub fn is_attached(iface: &str) -> bool {
    pin_dir(iface).join(names::LINK_PIN).exists()
}

/// Name of the (empty) directory in an interface's pin directory that says
/// a process attached the program for itself: the last process that uses
/// the device detaches it, where one an administrator attached stays.
const PROCESS_ATTACHED: &str = "attached_by_process";

/// Marks `iface`'s attachment as made by a process (see [`PROCESS_ATTACHED`]).
pub fn mark_process_attached(iface: &str) -> Result<(), XdpError> {
    let dir = pin_dir(iface).join(PROCESS_ATTACHED);
    fs::create_dir_all(&dir).map_err(|source| XdpError::Io {
        what: format!("create {}", dir.display()),
        source,
    })
}

/// Whether `iface`'s attachment was made by a process, not by `xroce attach`.
pub fn is_process_attached(iface: &str) -> bool {
    pin_dir(iface).join(PROCESS_ATTACHED).exists()
}

/// Tells the program which QPN block the owner of `iface`'s AF_XDP sockets
/// holds: frames for the other blocks go to the kernel, on their ports.
pub fn set_xsk_block(iface: &str, block: u32) -> Result<(), XdpError> {
    let map = open_pinned(iface, names::CONFIG)?;
    let mut config = aya::maps::Array::<MapData, u32>::try_from(aya::maps::Map::Array(map))
        .map_err(bpf_err("config map"))?;
    config
        .set(qpn_block::CONFIG_XSK_BLOCK, block, 0)
        .map_err(bpf_err("write XDP config"))
}

fn open_pinned(iface: &str, map: &str) -> Result<MapData, XdpError> {
    let path = pin_dir(iface).join(map);
    if !path.exists() {
        if_index(iface)?;
        return Err(XdpError::NotAttached(iface.into()));
    }
    MapData::from_pin(&path).map_err(bpf_err(format!("open {}", path.display())))
}

/// Sums of the per-CPU XDP counters of one interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XdpCounters {
    pub values: Vec<(Counter, u64)>,
}

impl XdpCounters {
    pub fn get(&self, counter: Counter) -> u64 {
        self.values
            .iter()
            .find(|(c, _)| *c == counter)
            .map_or(0, |(_, v)| *v)
    }
}

/// Reads the counters pinned for `iface` (works from any process).
pub fn read_counters(iface: &str) -> Result<XdpCounters, XdpError> {
    let map = open_pinned(iface, names::COUNTERS)?;
    let array = PerCpuArray::<MapData, u64>::try_from(aya::maps::Map::PerCpuArray(map))
        .map_err(bpf_err("counter map"))?;
    let mut values = Vec::with_capacity(Counter::ALL.len());
    for counter in Counter::ALL {
        let per_cpu = array
            .get(&(counter as u32), 0)
            .map_err(bpf_err(format!("read counter {}", counter.name())))?;
        values.push((counter, per_cpu.iter().sum()));
    }
    Ok(XdpCounters { values })
}

/// The pinned XSKMAP of `iface`: AF_XDP sockets register here per RX queue.
pub fn xsk_map(iface: &str) -> Result<XskMap<MapData>, XdpError> {
    let map = open_pinned(iface, names::XSKS)?;
    XskMap::try_from(aya::maps::Map::XskMap(map)).map_err(bpf_err("XSK map"))
}

/// Turns the destination-QPN filter on or off: when on, RoCEv2 frames whose
/// QPN was not registered with [`register_qpn`] are dropped in the kernel.
pub fn set_qpn_filter(iface: &str, on: bool) -> Result<(), XdpError> {
    let map = open_pinned(iface, names::CONFIG)?;
    let mut config = aya::maps::Array::<MapData, u32>::try_from(aya::maps::Map::Array(map))
        .map_err(bpf_err("config map"))?;
    let flags = config.get(&0, 0).map_err(bpf_err("read XDP config"))?;
    let flags = if on {
        flags | config_flags::QPN_FILTER
    } else {
        flags & !config_flags::QPN_FILTER
    };
    config.set(0, flags, 0).map_err(bpf_err("write XDP config"))
}

fn qpn_map(iface: &str) -> Result<aya::maps::HashMap<MapData, u32, u8>, XdpError> {
    let map = open_pinned(iface, names::QPNS)?;
    aya::maps::HashMap::try_from(aya::maps::Map::HashMap(map)).map_err(bpf_err("QPN map"))
}

/// Lets frames for local QP `qpn` through the QPN filter.
pub fn register_qpn(iface: &str, qpn: u32) -> Result<(), XdpError> {
    qpn_map(iface)?
        .insert(qpn & 0x00ff_ffff, 1, 0)
        .map_err(bpf_err(format!("register QPN {qpn:#x}")))
}

/// Removes `qpn` from the filter (a destroyed QP).
pub fn unregister_qpn(iface: &str, qpn: u32) -> Result<(), XdpError> {
    qpn_map(iface)?
        .remove(&(qpn & 0x00ff_ffff))
        .map_err(bpf_err(format!("unregister QPN {qpn:#x}")))
}

/// A one-entry array map of `T` pinned for `iface`.
fn single<T: aya::Pod>(iface: &str, name: &str) -> Result<aya::maps::Array<MapData, T>, XdpError> {
    let map = open_pinned(iface, name)?;
    aya::maps::Array::try_from(aya::maps::Map::Array(map)).map_err(bpf_err(name.to_string()))
}

fn read_single<T: aya::Pod>(iface: &str, name: &str) -> Result<T, XdpError> {
    single::<T>(iface, name)?
        .get(&0, 0)
        .map_err(bpf_err(format!("read {name}")))
}

fn write_single<T: aya::Pod>(iface: &str, name: &str, value: T) -> Result<(), XdpError> {
    single::<T>(iface, name)?
        .set(0, value, 0)
        .map_err(bpf_err(format!("write {name}")))
}

/// The congestion point's settings on `iface`.
pub fn ecn_config(iface: &str) -> Result<EcnConfig, XdpError> {
    read_single(iface, names::ECN_CONFIG)
}

/// Configures (or, with `enabled == 0`, turns off) the congestion point.
/// The virtual queue restarts empty so old state does not leak into a new
/// experiment. Writing the queue while packets flow is safe: the XDP side
/// only ever sees a whole old or a whole new value of each field it reads.
pub fn set_ecn(iface: &str, config: EcnConfig) -> Result<(), XdpError> {
    write_single(iface, names::ECN_QUEUE, VirtualQueue::default())?;
    write_single(iface, names::ECN_CONFIG, config)
}

/// The virtual queue as the XDP program last left it.
pub fn virtual_queue(iface: &str) -> Result<VirtualQueue, XdpError> {
    read_single(iface, names::ECN_QUEUE)
}

/// Loss injection settings on `iface`.
pub fn fault_config(iface: &str) -> Result<FaultConfig, XdpError> {
    read_single(iface, names::FAULT_CONFIG)
}

/// Configures (or, with `enabled == 0`, turns off) loss injection.
pub fn set_fault(iface: &str, config: FaultConfig) -> Result<(), XdpError> {
    write_single(iface, names::FAULT_CONFIG, config)
}
