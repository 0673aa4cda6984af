//! Types shared by the XDP program (`ebpf/`, built for bpfel) and userspace.
//!
//! Everything here is `#[repr(C)]` plain data and `no_std`, so the kernel and
//! userspace agree on layout without a serialisation step.
#![no_std]

pub mod bottleneck;
pub mod congestion;
pub mod ecn;
pub mod fault;
pub mod fixed;
pub mod opcode_class;
pub mod qpn_block;

/// UDP destination port that identifies RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Names of the maps and the program as the kernel (and `bpftool`) shows them.
/// The kernel keeps 15 characters of a name, so these stay short.
pub mod names {
    pub const PROGRAM: &str = "xroce_xdp";
    /// The same program with the arrival time in front of the frame's own
    /// bytes (`rx_meta`), for kernels that refuse `bpf_xdp_adjust_meta`.
    pub const PROGRAM_HEAD: &str = "xroce_xdp_head";
    /// The same program without arrival times, where the kernel refuses
    /// both (a libxdp dispatcher component on kernels that refuse extension
    /// programs moving packet data).
    pub const PROGRAM_PLAIN: &str = "xroce_xdp_plain";
    /// The programs the loader tries, in order: the first the kernel takes
    /// is attached.
    pub const PROGRAMS: [&str; 3] = [PROGRAM, PROGRAM_HEAD, PROGRAM_PLAIN];
    pub const COUNTERS: &str = "XROCE_COUNTERS";
    pub const XSKS: &str = "XROCE_XSKS";
    pub const CONFIG: &str = "XROCE_CONFIG";
    pub const QPNS: &str = "XROCE_QPNS";
    pub const ECN_CONFIG: &str = "XROCE_ECN_CFG";
    pub const ECN_QUEUE: &str = "XROCE_ECN_Q";
    pub const FAULT_CONFIG: &str = "XROCE_FAULT";
    pub const FAULT_RNG: &str = "XROCE_FAULT_RNG";
    /// Per-RX-queue counters ([`crate::RxQueueCounters`]).
    pub const RXQ_COUNTERS: &str = "XROCE_RXQ";
    /// Perf event array the program copies frames to while a capture runs
    /// ([`crate::capture`]).
    pub const CAPTURE: &str = "XROCE_CAPTURE";
    /// Directory under bpffs where xroce before 2026-12 pinned one
    /// interface's maps and link (`<PIN_ROOT>/<iface>/`). Nothing is pinned
    /// now (the program is found through the interface); only cleaned.
    pub const PIN_ROOT: &str = "/sys/fs/bpf/xroce";
    /// Name of the pinned XDP link inside an old pin directory.
    pub const LINK_PIN: &str = "link";
}

/// Slots in the `XROCE_CONFIG` array (slot 0: [`config_flags`]; slot 1:
/// [`qpn_block::CONFIG_XSK_BLOCK`]; slot 2: [`qpn_block::CONFIG_XSK_BLOCKS`];
/// slot 3: [`capture::CONFIG_SNAPLEN`]).
pub const CONFIG_SLOTS: u32 = 4;

/// Largest number of QPNs the XDP QPN filter can hold.
pub const MAX_FILTERED_QPNS: u32 = 65536;

/// Maximum number of RX queues (one AF_XDP socket each) per interface.
pub const MAX_QUEUES: u32 = 64;

/// What the XDP program counts per RX queue (`XROCE_RXQ`: a per-CPU array
/// indexed by the queue, [`MAX_QUEUES`] entries; queues beyond it are not
/// counted). Every frame ends redirected, passed or dropped, so
/// `frames - redirected - passed` is what was dropped.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxQueueCounters {
    /// Frames the program looked at on this queue.
    pub frames: u64,
    /// Their bytes (the whole frame, fragments included).
    pub bytes: u64,
    /// Handed to this queue's AF_XDP socket.
    pub redirected: u64,
    /// Left to the kernel stack.
    pub passed: u64,
}

const _: () = assert!(core::mem::size_of::<RxQueueCounters>() == 32);

// SAFETY: plain #[repr(C)] u64s; every bit pattern is a valid value.
#[cfg(feature = "user")]
unsafe impl aya::Pod for RxQueueCounters {}

/// Indices into the per-CPU counter array. Userspace sums the CPUs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Every frame the program looked at.
    Seen = 0,
    /// Well-formed RoCEv2 frames (UDP/4791 that pass every check).
    Roce,
    /// RoCEv2 frames handed to an AF_XDP socket.
    Redirected,
    /// Frames left to the kernel stack (everything that is not RoCEv2 and
    /// RoCEv2 frames with no socket bound on their queue).
    Passed,
    /// UDP/4791 frames that fail a check: dropped (sum of the drop_* reasons
    /// below that concern the frame itself).
    Malformed,
    /// RoCEv2 frames for block 0 whose RX queue has no AF_XDP socket (or
    /// whose AF_XDP owner holds another block): passed to the kernel.
    NoSocket,
    // RoCEv2 frames by opcode class.
    OpSend,
    OpWrite,
    OpReadRequest,
    OpReadResponse,
    OpAtomic,
    /// ACKNOWLEDGE with an ACK syndrome, and ATOMIC ACKNOWLEDGE.
    OpAck,
    /// ACKNOWLEDGE carrying an RNR NAK or a NAK.
    OpNak,
    OpCnp,
    // ECN codepoint of RoCEv2 frames as they arrived.
    EcnNotEct,
    EcnEct1,
    EcnEct0,
    EcnCe,
    // Why frames were dropped.
    /// IP header inconsistent: total or payload length shorter than a UDP
    /// header, or reaching beyond the end of the frame.
    DropBadIp,
    /// UDP length inconsistent with the IP payload or too short for RoCEv2.
    DropBadUdpLength,
    /// Frame ends before the BTH.
    DropTruncated,
    /// BTH opcode that no transport defines.
    DropBadOpcode,
    /// Destination QPN not registered while the QPN filter is on.
    DropUnknownQpn,
    // The congestion point and loss injection (`xroce ecn`, `xroce fault`).
    /// ECN-capable frames the congestion point marked CE.
    EcnMarked,
    /// Not-ECT frames dropped because the queue was over the threshold.
    DropCongestion,
    /// Frames dropped because the virtual buffer was full.
    DropTail,
    /// Frames dropped by loss injection.
    DropFault,
    /// RoCEv2 frames for the QPN block of a process without the AF_XDP
    /// sockets: passed to the kernel on that block's UDP port.
    ToBlockPort,
}

impl Counter {
    pub const ALL: [Counter; 28] = [
        Counter::Seen,
        Counter::Roce,
        Counter::Redirected,
        Counter::Passed,
        Counter::Malformed,
        Counter::NoSocket,
        Counter::OpSend,
        Counter::OpWrite,
        Counter::OpReadRequest,
        Counter::OpReadResponse,
        Counter::OpAtomic,
        Counter::OpAck,
        Counter::OpNak,
        Counter::OpCnp,
        Counter::EcnNotEct,
        Counter::EcnEct1,
        Counter::EcnEct0,
        Counter::EcnCe,
        Counter::DropBadIp,
        Counter::DropBadUdpLength,
        Counter::DropTruncated,
        Counter::DropBadOpcode,
        Counter::DropUnknownQpn,
        Counter::EcnMarked,
        Counter::DropCongestion,
        Counter::DropTail,
        Counter::DropFault,
        Counter::ToBlockPort,
    ];

    /// Drops for what the frame itself is (summed in [`Counter::Malformed`]),
    /// as opposed to drops by policy (filter, congestion, fault injection).
    pub const fn is_malformed(self) -> bool {
        matches!(
            self,
            Counter::DropBadIp
                | Counter::DropBadUdpLength
                | Counter::DropTruncated
                | Counter::DropBadOpcode
        )
    }

    /// Stable snake_case name used in `xroce stats` output and JSON keys.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Seen => "seen",
            Counter::Roce => "roce",
            Counter::Redirected => "redirected",
            Counter::Passed => "passed",
            Counter::Malformed => "malformed",
            Counter::NoSocket => "no_socket",
            Counter::OpSend => "op_send",
            Counter::OpWrite => "op_write",
            Counter::OpReadRequest => "op_read_request",
            Counter::OpReadResponse => "op_read_response",
            Counter::OpAtomic => "op_atomic",
            Counter::OpAck => "op_ack",
            Counter::OpNak => "op_nak",
            Counter::OpCnp => "op_cnp",
            Counter::EcnNotEct => "ecn_not_ect",
            Counter::EcnEct1 => "ecn_ect1",
            Counter::EcnEct0 => "ecn_ect0",
            Counter::EcnCe => "ecn_ce",
            Counter::DropBadIp => "drop_bad_ip",
            Counter::DropBadUdpLength => "drop_bad_udp_length",
            Counter::DropTruncated => "drop_truncated",
            Counter::DropBadOpcode => "drop_bad_opcode",
            Counter::DropUnknownQpn => "drop_unknown_qpn",
            Counter::EcnMarked => "ecn_marked",
            Counter::DropCongestion => "drop_congestion",
            Counter::DropTail => "drop_tail",
            Counter::DropFault => "drop_fault",
            Counter::ToBlockPort => "to_block_port",
        }
    }
}

/// True for every BTH opcode IBTA defines for RC (with 1.5's FLUSH and ATOMIC
/// WRITE), UC and UD, plus the RoCEv2
/// CNP. The XDP program drops anything else; a test in xroce-wire checks this
/// against the codec's opcode table.
#[inline(always)]
pub const fn opcode_is_known(opcode: u8) -> bool {
    matches!(
        opcode,
        0x00..=0x14 | 0x16 | 0x17 | 0x1c | 0x1d | 0x20..=0x2b | 0x64 | 0x65 | 0x81
    )
}

/// Flags in slot 0 of the `XROCE_CONFIG` array map.
/// What the XDP program copies to `xroce capture` while one runs: each
/// RoCEv2 frame it sees (received), before it redirects, passes or drops
/// it, as a perf event sample of a [`capture::CaptureMeta`] followed by the
/// frame's first bytes (`bpf_xdp_output`, as xdpdump does). Copying takes
/// nothing from the frame's way.
pub mod capture {
    /// Slot of `XROCE_CONFIG`: 0 when no capture runs, else the most bytes
    /// of a frame to copy (the capture's snap length).
    pub const CONFIG_SNAPLEN: u32 = 3;

    /// Most bytes one sample can carry after the meta: the helper's
    /// context-length field is 20 bits, and a perf sample's size 16.
    pub const MAX_COPY: u32 = 65000;

    /// In front of each copied frame.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CaptureMeta {
        /// bpf_ktime_get_ns: CLOCK_MONOTONIC.
        pub ts_ns: u64,
        /// The whole frame's length (what follows may be less).
        pub frame_len: u32,
        pub rx_queue: u32,
    }

    /// Bytes of [`CaptureMeta`] in a sample.
    pub const META_LEN: usize = 16;
    const _: () = assert!(core::mem::size_of::<CaptureMeta>() == META_LEN);

    impl CaptureMeta {
        /// The meta at the start of a sample (native byte order, as the
        /// program wrote it), if the sample is long enough.
        pub fn parse(sample: &[u8]) -> Option<Self> {
            let b = sample.get(..META_LEN)?;
            Some(Self {
                ts_ns: u64::from_ne_bytes(b[0..8].try_into().ok()?),
                frame_len: u32::from_ne_bytes(b[8..12].try_into().ok()?),
                rx_queue: u32::from_ne_bytes(b[12..16].try_into().ok()?),
            })
        }
    }
}

/// What the XDP program puts in front of each RoCEv2 frame it redirects to
/// an AF_XDP socket: an [`rx_meta::RxMeta`] in the frame's XDP metadata
/// area (`bpf_xdp_adjust_meta`), which the kernel copies into the UMEM
/// chunk right in front of the frame's data (copy mode too). The AF_XDP
/// backend reads it there, so the engine learns when the frame reached the
/// host, not when its I/O thread got round to it. Where the kernel refuses
/// that helper, `names::PROGRAM_HEAD` runs instead and puts the same bytes
/// at the start of the frame's data (`bpf_xdp_adjust_head`); the backend,
/// which asks which program runs, takes them off there.
pub mod rx_meta {
    /// [`RxMeta::magic`]: "XRTS" in memory.
    pub const MAGIC: u32 = u32::from_le_bytes(*b"XRTS");

    /// Bytes of [`RxMeta`] (the metadata area the program adds: a multiple
    /// of 4, at most 32, as the kernel wants).
    pub const LEN: usize = 16;

    /// In front of a redirected frame's data, in native byte order.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct RxMeta {
        /// [`MAGIC`]: anything else is not ours (no metadata, another
        /// program's, or one already read and cleared).
        pub magic: u32,
        /// Zero.
        pub reserved: u32,
        /// bpf_ktime_get_ns when the program saw the frame: CLOCK_MONOTONIC.
        pub ktime_ns: u64,
    }

    const _: () = assert!(core::mem::size_of::<RxMeta>() == LEN);

    impl RxMeta {
        /// The metadata of a frame that arrived at `ktime_ns`.
        pub const fn new(ktime_ns: u64) -> Self {
            Self {
                magic: MAGIC,
                reserved: 0,
                ktime_ns,
            }
        }

        /// The timestamp in `bytes` (the [`LEN`] bytes in front of a
        /// frame), if they are an [`RxMeta`].
        pub fn parse(bytes: &[u8; LEN]) -> Option<u64> {
            let [m0, m1, m2, m3, _, _, _, _, t @ ..] = *bytes;
            (u32::from_ne_bytes([m0, m1, m2, m3]) == MAGIC).then(|| u64::from_ne_bytes(t))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn reads_back_what_the_program_writes() {
            let meta = RxMeta::new(0x0123_4567_89ab_cdef);
            // SAFETY: RxMeta is #[repr(C)] plain data of LEN bytes, no padding.
            let bytes: [u8; LEN] = unsafe { core::mem::transmute(meta) };
            assert_eq!(&bytes[..4], b"XRTS");
            assert_eq!(RxMeta::parse(&bytes), Some(0x0123_4567_89ab_cdef));
            let mut cleared = bytes;
            cleared[..4].fill(0);
            assert_eq!(RxMeta::parse(&cleared), None);
            assert_eq!(RxMeta::parse(&[0; LEN]), None);
        }
    }
}

pub mod config_flags {
    /// Only redirect frames whose destination QPN is in `XROCE_QPNS`.
    pub const QPN_FILTER: u32 = 1;
    /// Not read by the program: a process attached it for itself, and the
    /// last process of the device detaches it (`xroce attach`'s stays).
    pub const BY_PROCESS: u32 = 2;
}

/// Number of slots in the counter array.
pub const COUNTER_SLOTS: u32 = 32;
const _: () = assert!((Counter::ALL.len() as u32) <= COUNTER_SLOTS);
