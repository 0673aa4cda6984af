//! Loads xroce's XDP program and attaches it to an interface over
//! rtnetlink, then finds it again from any process through the interface
//! ([`query`]): rtnetlink names the attached program, its id leads to its
//! maps. An attachment made over netlink belongs to the interface (no
//! bpf_link, no pin), so it outlives `xroce attach` in any mount namespace
//! (`ip netns exec` gives a command a private /sys, hence a private bpffs),
//! and it goes with its interface: a deleted namespace leaves nothing that
//! could make a later interface of the same name look attached.

use std::{
    ffi::CString,
    fmt, fs,
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, PerCpuArray, XskMap},
    programs::Xdp,
    Ebpf, EbpfLoader,
};
use xroce_common::{
    config_flags,
    congestion::{EcnConfig, VirtualQueue},
    fault::FaultConfig,
    names, qpn_block, Counter,
};
use xroce_netlink::xdp::{flags as xdp_flags, set_xdp};

pub mod capture_ring;
mod find;
mod libxdp;

pub use find::{ArrivalStamp, XdpAttachment};
pub use libxdp::RUN_PRIO;

/// The eBPF object built from ebpf/ by build.rs (the XDP program and the
/// bottleneck's TC program); empty in a build with `XROCE_BUILD_EBPF=0`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xroce-xdp"));

/// The embedded eBPF object, or why this build has none.
pub fn ebpf_object() -> Result<&'static [u8], XdpError> {
    if EBPF_OBJECT.is_empty() {
        return Err(XdpError::NotBuilt);
    }
    Ok(EBPF_OBJECT)
}

/// How the program runs on the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// In the driver (veth, most NICs): fastest; needed for AF_XDP at speed.
    Native,
    /// Generic XDP in the kernel stack: works on any interface.
    Skb,
}

impl Mode {
    /// The XDP_FLAGS_*_MODE bit of this mode.
    fn netlink_flag(self) -> u32 {
        match self {
            Mode::Native => xdp_flags::DRV_MODE,
            Mode::Skb => xdp_flags::SKB_MODE,
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
    #[error("this xroce was built with XROCE_BUILD_EBPF=0 and has no XDP program; rebuild without it (`cargo xtask setup` installs what the build needs), or use the UDP backend")]
    NotBuilt,
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
    #[error(
        "interface {0} runs another XDP program; xroce shares an interface only through \
         libxdp's dispatcher (`xdp-loader status {0}` shows what runs there)"
    )]
    OtherProgram(String),
    #[error("xroce's XDP program has no map named {0}; is it an older build? re-attach it")]
    NoMap(String),
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

/// Where xroce before 2026-12 pinned one interface's maps and link. Only
/// ever read now to clean what such a version left (see [`attach`]).
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

/// xroce's program on `iface`: its id, mode, whether it runs under libxdp's
/// dispatcher and whether a process attached it for itself. `Ok(None)` if
/// the interface runs no program of xroce's. Works from any process and
/// any mount namespace of the interface's network namespace.
pub fn query(iface: &str) -> Result<Option<XdpAttachment>, XdpError> {
    let Some((mut attachment, info)) = find::find(iface)? else {
        return Ok(None);
    };
    attachment.by_process = config_flags_of(&info)? & config_flags::BY_PROCESS != 0;
    Ok(Some(attachment))
}

fn config_flags_of(info: &aya::programs::ProgramInfo) -> Result<u32, XdpError> {
    let map = find::map_of(info, names::CONFIG)?;
    let config = aya::maps::Array::<MapData, u32>::try_from(aya::maps::Map::Array(map))
        .map_err(bpf_err("config map"))?;
    config.get(&0, 0).map_err(bpf_err("read XDP config"))
}

/// Removes what an earlier xroce pinned for `iface` (its link and maps
/// under [`pin_dir`]) when the interface does not run that program: the
/// interface it was made for is gone (its namespace was deleted while
/// attached). Says so on stderr, naming what it removed.
fn clean_stale_pins(iface: &str) {
    let dir = pin_dir(iface);
    if !dir.exists() {
        return;
    }
    match fs::remove_dir_all(&dir) {
        Ok(()) => {
            // Nothing pins there any more: the root goes once it is empty.
            let _ = fs::remove_dir(names::PIN_ROOT);
            eprintln!(
                "xroce: removed stale XDP state {} (left by an interface {iface} that is gone; \
                 {iface} runs no xroce program)",
                dir.display()
            )
        }
        Err(e) => eprintln!(
            "xroce: cannot remove stale XDP state {} ({e}); {iface} runs no xroce program",
            dir.display()
        ),
    }
}

/// Loads the program and attaches it to `iface` in `mode`. Through libxdp's
/// multi-program dispatcher where the kernel takes EXT programs, so other
/// programs share the interface (xdp-filter, a user's own; libxdp pins the
/// component's link in bpffs, which keeps it); where it does not, libxdp
/// attaches the program directly over netlink. Either way the attachment
/// stays until [`detach`] (or the interface goes), whatever becomes of this
/// process. A command whose bpffs dies with it (`ip netns exec` mounts a
/// private /sys) attaches directly over rtnetlink: a pin there would not
/// outlive the command.
pub fn attach(iface: &str, mode: Mode) -> Result<(), XdpError> {
    require_root()?;
    let ifindex = if_index(iface)?;
    // One attacher at a time: two would each load a program, and the check
    // below must not meet another process's half-made attachment.
    let _attaching = crate::device::attaching(ifindex, std::time::Duration::from_secs(10))
        .map_err(|source| XdpError::Io {
            what: format!("wait to attach to {iface}"),
            source,
        })?;
    if find::find(iface)?.is_some() {
        return Err(XdpError::AlreadyAttached(iface.into()));
    }
    clean_stale_pins(iface);
    if !bpffs_outlives_us() {
        return attach_direct(iface, ifindex, mode);
    }
    let object = ebpf_object()?;
    for name in names::PROGRAMS {
        let c_name = CString::new(name).expect("program names have no NUL");
        match libxdp::attach(object, &c_name, ifindex, mode) {
            Ok(()) => return Ok(()),
            Err(libc::EBUSY | libc::EEXIST) => return Err(XdpError::OtherProgram(iface.into())),
            // The verifier refused a helper of this one (the metadata
            // helper on some kernels; from 6.12 on, any helper that moves
            // packet data in a dispatcher's slot): the next does without.
            Err(libc::EINVAL) => continue,
            Err(errno) => return Err(libxdp_error(iface, mode, errno)),
        }
    }
    Err(libxdp_error(iface, mode, libc::EINVAL))
}

fn libxdp_error(iface: &str, mode: Mode, errno: i32) -> XdpError {
    XdpError::Bpf {
        what: format!("attach XDP to {iface} in {mode} mode through libxdp"),
        source: libxdp::strerror(errno).into(),
    }
}

/// Whether libxdp's pins under /sys/fs/bpf outlive this process: this is
/// PID 1's mount namespace, or its /sys/fs/bpf is the same bpffs as PID
/// 1's. Not so under `ip netns exec`, whose private /sys goes with it.
fn bpffs_outlives_us() -> bool {
    let ns = |p: &str| fs::read_link(p).ok();
    if ns("/proc/self/ns/mnt").is_some() && ns("/proc/self/ns/mnt") == ns("/proc/1/ns/mnt") {
        return true;
    }
    use std::os::unix::fs::MetadataExt;
    match (
        fs::metadata("/sys/fs/bpf"),
        fs::metadata("/proc/1/root/sys/fs/bpf"),
    ) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino() && is_bpffs("/sys/fs/bpf"),
        _ => false,
    }
}

fn is_bpffs(path: &str) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    let Ok(c) = CString::new(path) else {
        return false;
    };
    // SAFETY: statfs writes only into `st`.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}

/// Attaches over rtnetlink without libxdp (no pin, nothing in bpffs).
fn attach_direct(iface: &str, ifindex: u32, mode: Mode) -> Result<(), XdpError> {
    let mut ebpf = load()?;
    let program = load_first_taken(&mut ebpf)?;
    let fd = program.fd().map_err(bpf_err("XDP program fd"))?;
    // UPDATE_IF_NOEXIST: never replace another program the interface runs.
    // Dropping `ebpf` afterwards closes our descriptors; the interface holds
    // the program, and the program its maps.
    set_xdp(
        ifindex,
        fd.as_fd().as_raw_fd(),
        xdp_flags::UPDATE_IF_NOEXIST | mode.netlink_flag(),
        None,
    )
    .map_err(|source| match source.raw_os_error() {
        Some(libc::EBUSY) | Some(libc::EEXIST) => XdpError::OtherProgram(iface.into()),
        _ => XdpError::Bpf {
            what: format!("attach XDP to {iface} in {mode} mode"),
            source: Box::new(source),
        },
    })
}

/// Loads the first of [`names::PROGRAMS`] the kernel's verifier takes:
/// the metadata-stamping program, else the one stamping the frame's head,
/// else the one without stamps (some kernels refuse `bpf_xdp_adjust_meta`
/// to every XDP program). The error is the first program's: it says what
/// the kernel refused.
fn load_first_taken(ebpf: &mut Ebpf) -> Result<&mut Xdp, XdpError> {
    let mut first_error = None;
    let mut taken = None;
    for name in names::PROGRAMS {
        let program: &mut Xdp = ebpf
            .program_mut(name)
            .ok_or(XdpError::NoProgram(name))?
            .try_into()
            .map_err(bpf_err("XDP program type"))?;
        match program.load() {
            Ok(()) => {
                taken = Some(name);
                break;
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match taken {
        Some(name) => Ok(ebpf
            .program_mut(name)
            .expect("loaded above")
            .try_into()
            .expect("an XDP program")),
        None => Err(bpf_err("the kernel verifier rejected the XDP program")(
            first_error.expect("names::PROGRAMS is not empty"),
        )),
    }
}

/// Loads the object. Its maps are all BTF-defined without pinning, so
/// nothing lands in bpffs: the program holds its maps once it is attached.
fn load() -> Result<Ebpf, XdpError> {
    EbpfLoader::new()
        .load(ebpf_object()?)
        .map_err(bpf_err("load the xroce XDP object"))
}

/// Detaches xroce's program from `iface`. Only that program: under a
/// dispatcher libxdp removes xroce's component and the others stay;
/// attached directly, the kernel removes it only if it is still the one
/// attached (XDP_FLAGS_REPLACE with its fd expected).
pub fn detach(iface: &str) -> Result<(), XdpError> {
    require_root()?;
    let Some((attachment, info)) = find::find(iface)? else {
        clean_stale_pins(iface);
        return Err(XdpError::NotAttached(iface.into()));
    };
    if attachment.dispatcher.is_some() {
        return libxdp::detach_component(attachment.ifindex, attachment.prog_id, attachment.mode)
            .map_err(|errno| XdpError::Bpf {
                what: format!(
                    "detach xroce's program from libxdp's dispatcher on {iface} \
                     (libxdp's state is under /sys/fs/bpf/xdp; run this where \
                     `xdp-loader status {iface}` lists the programs)"
                ),
                source: libxdp::strerror(errno).into(),
            });
    }
    let fd = info.fd().map_err(bpf_err("open the XDP program"))?;
    set_xdp(
        attachment.ifindex,
        -1,
        xdp_flags::REPLACE | attachment.mode.netlink_flag(),
        Some(fd.as_fd().as_raw_fd()),
    )
    .map_err(|source| XdpError::Io {
        what: format!("detach XDP from {iface}"),
        source,
    })
}

/// True if `iface` runs xroce's program.
pub fn is_attached(iface: &str) -> bool {
    matches!(find::find(iface), Ok(Some(_)))
}

/// True if `iface` runs some XDP program. rtnetlink tells any user the
/// program's id; whether it is xroce's ([`is_attached`]) takes
/// CAP_SYS_ADMIN (the program is opened by id).
pub fn runs_a_program(iface: &str) -> bool {
    if_index(iface)
        .ok()
        .and_then(|i| xroce_netlink::xdp::xdp_state(i).ok())
        .is_some_and(|s| !s.is_empty())
}

/// Marks `iface`'s attachment as made by a process for itself (a flag in
/// its config map): the last process that uses the device detaches it,
/// where one an administrator attached stays.
pub fn mark_process_attached(iface: &str) -> Result<(), XdpError> {
    update_flags(iface, |f| f | config_flags::BY_PROCESS)
}

/// Whether `iface`'s attachment was made by a process, not by `xroce attach`.
pub fn is_process_attached(iface: &str) -> bool {
    matches!(query(iface), Ok(Some(a)) if a.by_process)
}

fn update_flags(iface: &str, f: impl FnOnce(u32) -> u32) -> Result<(), XdpError> {
    let map = open_map(iface, names::CONFIG)?;
    let mut config = aya::maps::Array::<MapData, u32>::try_from(aya::maps::Map::Array(map))
        .map_err(bpf_err("config map"))?;
    let flags = config.get(&0, 0).map_err(bpf_err("read XDP config"))?;
    config
        .set(0, f(flags), 0)
        .map_err(bpf_err("write XDP config"))
}

/// Tells the program which QPN block the owner of `iface`'s AF_XDP sockets
/// holds: frames for the other blocks go to the kernel, on their ports.
pub fn set_xsk_block(iface: &str, block: u32) -> Result<(), XdpError> {
    let map = open_map(iface, names::CONFIG)?;
    let mut config = aya::maps::Array::<MapData, u32>::try_from(aya::maps::Map::Array(map))
        .map_err(bpf_err("config map"))?;
    config
        .set(qpn_block::CONFIG_XSK_BLOCK, block, 0)
        .map_err(bpf_err("write XDP config"))
}

/// Tells the program to copy each RoCEv2 frame it sees, up to `snaplen`
/// bytes, to the capture's perf buffers (`xroce_common::capture`); 0 stops
/// the copies.
pub fn set_capture_snaplen(iface: &str, snaplen: u32) -> Result<(), XdpError> {
    let map = open_map(iface, names::CONFIG)?;
    let mut config = aya::maps::Array::<MapData, u32>::try_from(aya::maps::Map::Array(map))
        .map_err(bpf_err("config map"))?;
    config
        .set(xroce_common::capture::CONFIG_SNAPLEN, snaplen, 0)
        .map_err(bpf_err("write XDP config"))
}

/// The map `map` (one of [`names`]) of xroce's program on `iface`, found
/// through the interface (any process, any mount namespace).
pub fn open_map(iface: &str, map: &str) -> Result<MapData, XdpError> {
    let Some((_, info)) = find::find(iface)? else {
        return Err(XdpError::NotAttached(iface.into()));
    };
    find::map_of(&info, map)
}

/// The XDP program's per-RX-queue counters on `iface` (what `xroce stats
/// --interval` shows), summed over the CPUs and indexed by queue.
pub fn rx_queue_counters(iface: &str) -> Result<Vec<xroce_common::RxQueueCounters>, XdpError> {
    use xroce_common::{RxQueueCounters, MAX_QUEUES};
    let map = open_map(iface, names::RXQ_COUNTERS)?;
    let array = aya::maps::PerCpuArray::<MapData, RxQueueCounters>::try_from(
        aya::maps::Map::PerCpuArray(map),
    )
    .map_err(bpf_err("per-queue counters"))?;
    (0..MAX_QUEUES)
        .map(|q| {
            let per_cpu = array.get(&q, 0).map_err(bpf_err("per-queue counters"))?;
            Ok(per_cpu
                .iter()
                .fold(RxQueueCounters::default(), |a, c| RxQueueCounters {
                    frames: a.frames + c.frames,
                    bytes: a.bytes + c.bytes,
                    redirected: a.redirected + c.redirected,
                    passed: a.passed + c.passed,
                }))
        })
        .collect()
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
    let map = open_map(iface, names::COUNTERS)?;
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
    let map = open_map(iface, names::XSKS)?;
    XskMap::try_from(aya::maps::Map::XskMap(map)).map_err(bpf_err("XSK map"))
}

/// Turns the destination-QPN filter on or off: when on, RoCEv2 frames whose
/// QPN was not registered with [`register_qpn`] are dropped in the kernel.
pub fn set_qpn_filter(iface: &str, on: bool) -> Result<(), XdpError> {
    let map = open_map(iface, names::CONFIG)?;
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
    let map = open_map(iface, names::QPNS)?;
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
    let map = open_map(iface, name)?;
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
