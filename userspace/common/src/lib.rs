//! Types shared by the XDP program (`ebpf/`, built for bpfel) and userspace.
//!
//! Everything here is `#[repr(C)]` plain data and `no_std`, so the kernel and
//! userspace agree on layout without a serialisation step.
#![no_std]

pub mod ecn;

/// UDP destination port that identifies RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Names of the maps and the program as the kernel (and `bpftool`) shows them.
/// The kernel keeps 15 characters of a name, so these stay short.
pub mod names {
    pub const PROGRAM: &str = "xroce_xdp";
    pub const COUNTERS: &str = "XROCE_COUNTERS";
    pub const XSKS: &str = "XROCE_XSKS";
    /// Directory under bpffs where one interface's maps and link are pinned.
    pub const PIN_ROOT: &str = "/sys/fs/bpf/xroce";
    /// Name of the pinned XDP link inside an interface's pin directory.
    pub const LINK_PIN: &str = "link";
}

/// Maximum number of RX queues (one AF_XDP socket each) per interface.
pub const MAX_QUEUES: u32 = 64;

/// Indices into the per-CPU counter array. Userspace sums the CPUs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Every frame the program looked at.
    Seen = 0,
    /// Well-formed RoCEv2 frames (UDP/4791 with room for a BTH).
    Roce,
    /// RoCEv2 frames handed to an AF_XDP socket.
    Redirected,
    /// Frames left to the kernel stack (everything that is not RoCEv2 and
    /// RoCEv2 frames with no socket bound on their queue).
    Passed,
    /// UDP/4791 frames that fail a length or header check: dropped.
    Malformed,
    /// RoCEv2 frames whose RX queue has no AF_XDP socket: passed to the kernel.
    NoSocket,
}

impl Counter {
    pub const ALL: [Counter; 6] = [
        Counter::Seen,
        Counter::Roce,
        Counter::Redirected,
        Counter::Passed,
        Counter::Malformed,
        Counter::NoSocket,
    ];

    /// Stable snake_case name used in `xroce stats` output and JSON keys.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Seen => "seen",
            Counter::Roce => "roce",
            Counter::Redirected => "redirected",
            Counter::Passed => "passed",
            Counter::Malformed => "malformed",
            Counter::NoSocket => "no_socket",
        }
    }
}

/// Number of slots in the counter array.
pub const COUNTER_SLOTS: u32 = 32;
const _: () = assert!((Counter::ALL.len() as u32) <= COUNTER_SLOTS);
