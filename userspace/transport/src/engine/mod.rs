//! The sans-I/O RC transport engine (one per device).
//!
//! [`Engine`] owns every QP of a device and runs the three state machines
//! of IBTA chapter 9 / rxe per QP: the requester (`requester.rs`: segments
//! WQEs into packets, assigns PSNs, paces, retransmits), the responder
//! (`responder.rs`: PSN checks, placement into MRs, ACK/NAK/READ response/
//! atomic replay) and the completer (`completer.rs`: matches ACKs and
//! responses to WQEs, completes them in order, maps errors to WC status).
//!
//! QP types: RC (the full reliable machinery), UC (`uc.rs`: the same
//! segmentation and placement without ACKs or retransmission; a gap drops
//! the message) and UD (`ud.rs`: one-packet SENDs with a DETH, Q_Key check,
//! GRH space in receive buffers). The GSI QP, QP1 ([`Engine::create_gsi_qp`],
//! for a connection manager's MADs), is a UD QP in a reserved slot of the
//! QP table: it alone sends and takes the GSI Q_Key [`GSI_QKEY`].
//!
//! It performs no I/O and no syscalls and never reads a clock. An I/O
//! backend drives it like quinn-proto:
//!
//! ```text
//! loop {
//!     for d in rx_batch { engine.handle_datagram(&d, now_ns) }
//!     if engine.poll_timeout().is_some_and(|t| t <= now_ns) { engine.handle_timeout(now_ns) }
//!     while let Some(t) = engine.poll_transmit(now_ns, &mut tx_buf) { send(&t, t.payload(&tx_buf)) }
//!     sleep/poll until min(next rx, engine.poll_timeout())
//! }
//! ```
//!
//! Its unit is the RoCEv2 datagram ([`datagram`]): the UDP payload (BTH
//! through payload and pad, and the ICRC's slot) with the addresses, ports
//! and ECN/DSCP it came or goes with. The headers below it and the ICRC
//! are the backend's. [`Engine::handle_frame`] and
//! [`Engine::poll_transmit_frame`] wrap it in whole Ethernet frames for the
//! simulator and tests. Bad input from the wire is counted in
//! [`EngineStats`] and dropped or NAKed; it never panics. Completions and asynchronous events leave it as values
//! ([`Engine::take_completions`], [`Engine::poll_async_event`]): it knows
//! no completion queue, only the [`completion::CqId`] a QP was created with.
//! Threading: its owner (the verbs device) keeps it behind one `Mutex`,
//! which the backend's I/O thread takes for its batches. Application
//! threads post into their QP's ring without it, checked by the same
//! [`check_send`] / [`check_recv`], and the owner moves those WRs in
//! whenever it locks the engine; [`Engine::take_retired`] tells it the
//! room the queues gave back. The owner drains the completions into its
//! CQs before letting go of the lock, so polling completions never
//! contends with the I/O thread.

//! # Spec coverage
//!
//! Implemented (RC unless noted): segmentation FIRST/MIDDLE/LAST/ONLY by
//! path MTU; PSN assignment with 24-bit wraparound (a READ consumes one PSN
//! per response packet); AckReq on message ends, every `ack_every` packets
//! and when the window (default 128 PSNs, like rxe) fills; `max_rd_atomic`
//! and FENCE; retransmission timer 4.096 us * 2^timeout; `retry_cnt` and
//! `rnr_retry` (7 = infinite), reset on progress; go-back-N from the
//! completer PSN on NAK-sequence-error, timeout, an ACK or READ response
//! beyond an unanswered READ/atomic; RNR back-off by the NAK's encoded timer;
//! responder PSN checks (duplicate / in order / one NAK per gap), opcode
//! sequence and length checks, coalesced ACKs (rxe-identical PSN/MSN in the
//! capture replays), duplicate SEND/WRITE re-ACKed, duplicate READ
//! re-executed from its PSN, duplicate atomics answered from a replay cache,
//! rkey/bounds/permission/QP-access failures NAKed (class C: the responder
//! QP then goes to ERR, as rxe, with IBV_EVENT_QP_ACCESS_ERR or
//! QP_REQ_ERR unless a receive WQE's completion reports the error),
//! zero-length RDMA WRITE/READ without R_Key or VA checks (C9-88), RNR NAK with `min_rnr_timer`, immediate
//! data / invalidate rkey in the receive WC; completer matching ACKs, READ
//! responses and atomic ACKs in order, statuses RETRY_EXC_ERR,
//! RNR_RETRY_EXC_ERR, REM_ACCESS_ERR, REM_INV_REQ_ERR, REM_OP_ERR,
//! LOC_PROT_ERR, LOC_LEN_ERR, WR_FLUSH_ERR; UC; UD (one-MTU SENDs, Q_Key);
//! CNP out on CE-marked arrivals (once per QP per `cnp_interval_ns`), CNP in
//! -> `on_cnp`, ECT(0) on everything sent except CNPs, pacing of requests
//! and READ responses by the controller's rate; P_Key and peer-address
//! checks; async events COMM_EST / SQ_DRAINED / QP_FATAL / QP_ACCESS_ERR /
//! QP_REQ_ERR (a requester error is reported by its completion alone).
//!
//! Selective repeat between two xroce engines (`selective.rs`, after IRN):
//! per RC QP, agreed in band by default (a reserved BTH bit says "capable";
//! each direction switches on by itself once the peer's packets carry it;
//! [`Engine::set_selective_repeat`] turns that off or forces it on); WRITE
//! packets then carry a RETH each and are placed out of order, ACKs carry a
//! SACK block and only holes are retransmitted. Every other peer gets
//! go-back-N.
//!
//! Not yet: end-to-end credits (ACKs carry "invalid credits" 0x1f like
//! rxe's and incoming credits are ignored); SEND_WITH_INV does not
//! invalidate anything (no memory windows / fast-reg MRs); alternate paths
//! and path migration; SQE for UC/UD send errors (they go to ERR);
//! RD/XRC; memory windows.

mod codec;
mod completer;
pub mod completion;
pub mod datagram;
mod delay_echo;
mod dispatch;
pub mod error;
pub mod frame;
pub mod gather;
pub mod memory;
mod modify;
mod post;
pub(crate) mod qp;
pub mod qp_attr;
pub mod qp_info;
mod requester;
mod responder;
mod schedule;
pub mod selective;
pub mod sim;
mod sr_read;
pub mod srq;
pub mod timers;
mod uc;
mod ud;
pub mod work;
mod wqe;

use std::collections::VecDeque;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use crate::cc::{CongestionControl, NoCc};
use completion::{Completion, CqId};
pub use datagram::{Rejected, RxDatagram, Transmit};
use error::{Result, TransportError};
use memory::MrTable;
use qp_attr::{check_modify_for, QpAttr, QpAttrMask, QpCap, QpState, QpType, RemoteQp};
use srq::Srq;
use work::{RecvWr, SendWr};
use xroce_common::qpn_block;

pub use post::{check_recv, check_send, PostLimits};
pub use qp::pacing_frame_bytes;
pub(crate) use qp::QpCtx;
pub use selective::{SrMode, SrStatus};

/// First QP number handed out in QPN block 0 (rxe also starts above the
/// special QPs 0/1); block `b` starts at `b << 16` plus the same offset.
pub const QPN_BASE: u32 = qpn_block::FIRST_QPN_OFFSET;

/// QP number of the General Services Interface QP (IBTA 9.6.1.1.1: QP1
/// carries the CM's and other managers' MADs).
pub const GSI_QPN: u32 = 1;

/// The Q_Key of QP1 (IBTA 9.6.1.1.1, Linux `IB_QP1_QKEY`): its MSB is set,
/// so only the GSI QP itself can send it (see the requester's DETH).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Slot of `Engine::qps` reserved for the GSI QP: `create_qp` never hands
/// it out, so QP1 goes through the same per-QP paths as every other QP.
const GSI_SLOT: usize = 0;

/// Maps QP numbers to slots of `Engine::qps` and back: slot 0 is QP1, slot
/// `i >= 1` is the block's QPN number `(i - 1 + offset) mod QPNS_PER_BLOCK`
/// counted from `first`, the first QPN of the engine's QPN block
/// ([`EngineConfig::qpn_block`], [`EngineConfig::qpn_offset`]): slots fill
/// from 1 up, the numbers they carry start anywhere in the block.
#[derive(Clone, Copy, Debug)]
struct QpnMap {
    first: u32,
    offset: u32,
}

impl QpnMap {
    fn new(block: u32, offset: u32) -> Self {
        Self {
            first: (block << qpn_block::SHIFT) + QPN_BASE,
            offset: offset % qpn_block::QPNS_PER_BLOCK,
        }
    }

    /// The QP number of slot `idx`.
    fn qpn(self, idx: usize) -> u32 {
        if idx == GSI_SLOT {
            GSI_QPN
        } else {
            ((idx - 1) as u32 + self.offset) % qpn_block::QPNS_PER_BLOCK + self.first
        }
    }

    /// The slot QP number `qpn` lives in, if it is one of this block's.
    fn slot(self, qpn: u32) -> Option<usize> {
        let n = qpn_block::QPNS_PER_BLOCK;
        match qpn {
            GSI_QPN => Some(GSI_SLOT),
            q => q
                .checked_sub(self.first)
                .filter(|&i| i < n)
                .map(|i| ((i + n - self.offset) % n) as usize + 1),
        }
    }
}

/// The device's in-flight window never shrinks below this many packets.
pub const DEVICE_WINDOW_MIN_PKTS: u32 = 16;

/// Most packets a QP sends in a row before the next ready QP's turn (see
/// `Engine::poll_transmit`), whole small messages included: their ACKs
/// then coalesce at the responder, which acknowledges what arrived of a
/// QP together with one ACK. One message per turn with many QPs made one
/// ACK per message (1,024 QPs of 4 KiB WRITEs: 0.5 ACK frames per data
/// packet against 0.18 for 1 QP, and 25 % less throughput).
const MESSAGE_QUANTUM_PKTS: u32 = 16;

/// The device window a configuration starts with: the smallest (growing a
/// packet per timely ACK, it reaches the largest within a few round trips
/// on a fast path; starting there would queue it all on a slow one).
fn cfg_window(cfg: &EngineConfig) -> u32 {
    if cfg.device_target_rtt_ns == 0 {
        cfg.max_device_inflight_pkts
    } else {
        DEVICE_WINDOW_MIN_PKTS.min(cfg.max_device_inflight_pkts)
    }
}

/// Builds a congestion controller for each new QP.
pub type CcFactory = Arc<dyn Fn() -> Box<dyn CongestionControl> + Send + Sync>;

/// Device-wide engine parameters.
#[derive(Clone)]
pub struct EngineConfig {
    /// Our Ethernet address (source MAC of every frame).
    pub mac: [u8; 6],
    /// Our IPv4 address (source of frames to IPv4 peers).
    pub ip: Ipv4Addr,
    /// Our IPv6 addresses (source of frames to IPv6 peers: a link-local one
    /// to a link-local peer, else the first other).
    pub ipv6: Vec<Ipv6Addr>,
    /// Rate for the default [`NoCc`] controller, bits per second.
    pub line_rate_bps: u64,
    /// Token-bucket depth of each QP's pacer ([`crate::cc::Pacer`]), bytes:
    /// the most data a QP sends back to back at its controller's rate.
    pub pacing_burst_bytes: u64,
    /// Most unacknowledged PSNs a QP keeps in flight.
    pub max_inflight_pkts: u32,
    /// Most unacknowledged PSNs all RC QPs of the device keep in flight
    /// together (0: no device-wide limit). Each is a packet that lands in
    /// the peer's receive ring (a READ request counts its responses), so
    /// this bounds what many QPs can pile onto it at once: 1,024 QPs x a
    /// window of 128 would otherwise be 131,072 packets against a ring of
    /// a few thousand. QPs that find it used up queue for room (FIFO).
    pub max_device_inflight_pkts: u32,
    /// Round trip the device's in-flight window aims at (0: the window
    /// stays at `max_device_inflight_pkts`). A fixed number of packets in
    /// flight makes the round trip that number over the peer's rate: a
    /// slow peer (a loaded core, a debug build) would queue them for longer
    /// than the tail-loss probe waits, and every message would be sent
    /// twice. So the window shrinks while ACKs come later than this (once
    /// per round trip, in proportion to the excess) and grows by a packet
    /// per ACK that comes sooner, between [`DEVICE_WINDOW_MIN_PKTS`] and
    /// `max_device_inflight_pkts`.
    pub device_target_rtt_ns: u64,
    /// Set AckReq at least every this many packets of a long message.
    pub ack_every: u32,
    /// ... and on a packet when packets sent this long ago have not asked
    /// for an ACK (0: only `ack_every`). A flow its congestion control
    /// paces slowly would otherwise go `ack_every` packets, many
    /// milliseconds, without an ACK, and the tail-loss probe would repeat
    /// packets that were never lost. At full speed `ack_every` packets
    /// take less, so it changes nothing there.
    pub ack_req_interval_ns: u64,
    /// Mark data packets ECT(0).
    pub ecn_capable: bool,
    /// Minimum gap between two CNPs sent for one QP.
    pub cnp_interval_ns: u64,
    /// Congestion controller per QP; `None` uses [`NoCc`] at `line_rate_bps`.
    pub cc: Option<CcFactory>,
    /// The QPN block this engine's process holds on its device
    /// ([`xroce_common::qpn_block`]): its QPs are numbered in it.
    pub qpn_block: u32,
    /// Where in the block the QP numbers start (0: at its first QPN,
    /// `0x11`), then cycling through it. A process draws it at random
    /// (`xroce::device::random_qpn_offset`): a restarted program would otherwise reuse
    /// its predecessor's QPNs at once, which its peers' CM still holds
    /// connected and rejects as stale (REJ 10), where a NIC's or rxe's
    /// device-wide numbering moves on.
    pub qpn_offset: u32,
    /// Selective repeat for each new RC QP ([`selective::SrMode`]; Auto:
    /// agreed in band with each peer, go-back-N with any but xroce).
    pub selective_repeat: selective::SrMode,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("mac", &self.mac)
            .field("ip", &self.ip)
            .field("ipv6", &self.ipv6)
            .field("line_rate_bps", &self.line_rate_bps)
            .field("max_inflight_pkts", &self.max_inflight_pkts)
            .field("max_device_inflight_pkts", &self.max_device_inflight_pkts)
            .field("device_target_rtt_ns", &self.device_target_rtt_ns)
            .field("ack_every", &self.ack_every)
            .field("ack_req_interval_ns", &self.ack_req_interval_ns)
            .field("cnp_interval_ns", &self.cnp_interval_ns)
            .field("qpn_block", &self.qpn_block)
            .field("selective_repeat", &self.selective_repeat)
            .finish()
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            mac: [0x02, 0, 0, 0, 0, 1],
            ip: Ipv4Addr::new(10, 0, 0, 1),
            ipv6: Vec::new(),
            line_rate_bps: 100_000_000_000,
            pacing_burst_bytes: 64 * 1024,
            max_inflight_pkts: 128, // rxe: RXE_MAX_UNACKED_PSNS
            // Two QP windows: one QP still runs at its full window, and the
            // peer's receive queue holds at most an eighth of an AF_XDP RX
            // ring of 2,048 frames (about 512 KB at path MTU 2048), so it
            // drains in a few ms even on a loaded host, well inside the
            // tail-loss probe's and the timeout's waits.
            max_device_inflight_pkts: 256,
            // A quarter of the tail-loss probe's shortest wait (2 ms): a
            // loaded host's scheduling hiccups come on top.
            device_target_rtt_ns: 500_000,
            ack_every: 32,
            // An eighth of the tail-loss probe's shortest wait (2 ms).
            ack_req_interval_ns: 250_000,
            ecn_capable: true,
            cnp_interval_ns: 50_000,
            cc: None,
            qpn_block: 0,
            qpn_offset: 0,
            selective_repeat: selective::SrMode::Auto,
        }
    }
}

/// Declares a counter struct (every field a `u64`) together with its
/// field-name table, so the list of counters is written once: exporters
/// and `xroce stats` walk [`EngineStats::NAMES`] / [`EngineStats::fields`]
/// and can never miss a counter added here. Exported: the I/O backends'
/// `IoStats` in xroce is declared with it too.
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident: u64, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$fmeta])* pub $field: u64, )*
        }

        impl $name {
            /// Every counter's name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Every counter as (name, value), in declaration order.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($field), self.$field)),*].into_iter()
            }
        }

        /// Counter by counter (the engines of a sharded device summed).
        impl std::ops::Add for $name {
            type Output = Self;
            fn add(self, other: Self) -> Self {
                Self { $( $field: self.$field + other.$field, )* }
            }
        }
    };
}

counters! {
    /// Counters; every dropped packet is counted somewhere here.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct EngineStats {
        pub rx_frames: u64,
        /// Bytes of what arrived, counted as untagged Ethernet frames
        /// (Ethernet header to ICRC), however the backend got them.
        pub rx_bytes: u64,
        pub rx_malformed: u64,
        pub rx_bad_icrc: u64,
        pub rx_not_roce: u64,
        pub rx_unknown_qp: u64,
        pub rx_bad_state: u64,
        pub rx_unsupported: u64,
        /// Wrong P_Key, or a connected QP got a packet from another address.
        pub rx_bad_header: u64,
        pub rx_duplicate: u64,
        pub rx_out_of_sequence: u64,
        pub rx_ghost_response: u64,
        pub rx_bad_response: u64,
        pub rx_dropped_other: u64,
        pub tx_frames: u64,
        /// Bytes sent, as untagged Ethernet frames.
        pub tx_bytes: u64,
        pub tx_data_packets: u64,
        pub tx_retransmitted: u64,
        pub tx_acks: u64,
        pub tx_read_responses: u64,
        pub tx_atomic_acks: u64,
        pub tx_naks_seq: u64,
        pub tx_naks_rnr: u64,
        pub tx_naks_other: u64,
        pub tx_cnps: u64,
        pub rx_cnps: u64,
        pub rx_ce_marked: u64,
        /// Data packets that arrived while the receive ring was under
        /// pressure ([`Engine::set_rx_pressure`]), treated as CE-marked.
        pub rx_pressure_marked: u64,
        /// Times a QP with new data waited for room in the device's
        /// in-flight budget ([`EngineConfig::max_device_inflight_pkts`]).
        pub tx_budget_waits: u64,
        /// Times late ACKs shrank the device's in-flight window
        /// ([`EngineConfig::device_target_rtt_ns`]).
        pub device_window_cuts: u64,
        pub retry_timeouts: u64,
        pub retries_started: u64,
        /// Second tail-loss probes before the local ACK timeout: the
        /// first drew no answer, so the responder may wait, silent, for a
        /// packet it already NAKed (the NAK or the retransmission was
        /// lost). Go-back-N sends everything unacknowledged again;
        /// selective repeat with nothing SACKed the oldest packet.
        pub probe_retries: u64,
        pub rx_rnr_naks: u64,
        pub rx_seq_naks: u64,
        pub atomic_replays: u64,
        pub read_reexecuted: u64,
        /// Duplicate READ requests that matched no READ the responder
        /// executed (PSN, R_Key and range): dropped unanswered, as rxe.
        pub dup_read_unmatched: u64,
        pub cq_overflows: u64,
        pub async_events_dropped: u64,
        /// Selective repeat: WRITE packets placed ahead of the expected
        /// PSN, packets ahead of it dropped (in-order-only kinds, failed
        /// checks), ACKs that carried a SACK, holes retransmitted.
        pub sr_placed_out_of_order: u64,
        pub sr_dropped_out_of_order: u64,
        pub tx_sacks: u64,
        pub sr_holes_retransmitted: u64,
        /// Selective repeat: READ response packets placed ahead of the
        /// completer's PSN, and READ requests for just the gap before them.
        pub sr_read_placed_out_of_order: u64,
        pub sr_read_gaps_requested: u64,
    }
}

/// Per-QP counters (for stats and congestion experiments).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Data packets sent (requests and READ responses), with retransmissions.
    pub tx_packets: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    pub retransmitted: u64,
    pub timeouts: u64,
    pub rnr_naks_received: u64,
    pub seq_naks_received: u64,
    /// Packets received for this QP (after header checks).
    pub rx_packets: u64,
    pub ce_marked_received: u64,
    pub cnps_sent: u64,
    pub cnps_received: u64,
}

/// Most asynchronous events queued before the oldest are dropped.
pub const MAX_ASYNC_EVENTS: usize = 1024;

/// Asynchronous events (`ibv_event_type`, the QP-related subset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// `IBV_EVENT_COMM_EST`: first packet received by a QP in RTR.
    CommEstablished { qpn: u32 },
    /// `IBV_EVENT_SQ_DRAINED`: a QP in SQD has no outstanding send WQEs.
    SqDrained { qpn: u32 },
    /// `IBV_EVENT_QP_FATAL` (also raised for CQ overflow, which in ibverbs
    /// is `IBV_EVENT_CQ_ERR`): the QP moved to ERR by itself for a reason
    /// no completion and no more specific event reports.
    QpFatal { qpn: u32, cq_overflow: bool },
    /// `IBV_EVENT_QP_ACCESS_ERR`: the responder QP moved to ERR after an
    /// R_Key, bounds or permission violation of a request that consumed no
    /// receive WQE (an RDMA WRITE without immediate, a READ, an atomic;
    /// IBTA C9-222.1.1, as rxe). The requester gets REM_ACCESS_ERR.
    QpAccessError { qpn: u32 },
    /// `IBV_EVENT_QP_REQ_ERR`: the responder QP moved to ERR after an
    /// invalid request (opcode sequence, length, operation not enabled on
    /// the QP, misaligned atomic) that consumed no receive WQE. The
    /// requester gets REM_INV_REQ_ERR.
    QpRequestError { qpn: u32 },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: taking a WQE left an SRQ below its
    /// armed limit (the limit is disarmed).
    SrqLimitReached { srq: srq::SrqId },
}

impl AsyncEvent {
    /// The QP the event is about (None: an SRQ event).
    pub fn qpn(&self) -> Option<u32> {
        match *self {
            Self::CommEstablished { qpn }
            | Self::SqDrained { qpn }
            | Self::QpFatal { qpn, .. }
            | Self::QpAccessError { qpn }
            | Self::QpRequestError { qpn } => Some(qpn),
            Self::SrqLimitReached { .. } => None,
        }
    }

    /// The SRQ the event is about (None: a QP event).
    pub fn srq(&self) -> Option<srq::SrqId> {
        match *self {
            Self::SrqLimitReached { srq } => Some(srq),
            _ => None,
        }
    }
}

impl Env<'_> {
    pub(crate) fn event(&mut self, e: AsyncEvent) {
        if self.events.len() >= MAX_ASYNC_EVENTS {
            self.events.pop_front();
            self.stats.async_events_dropped += 1;
        }
        self.events.push_back(e);
    }
}

/// What the per-QP state machines need from the device.
pub(crate) struct Env<'a> {
    pub cfg: &'a EngineConfig,
    pub mrs: &'a MrTable,
    pub stats: &'a mut EngineStats,
    pub completions: &'a mut Vec<Completion>,
    pub events: &'a mut VecDeque<AsyncEvent>,
    /// New PSNs the device's in-flight budget still allows (u32::MAX: no
    /// limit).
    pub inflight_room: u32,
    /// The receive ring is under pressure: data packets count as CE-marked.
    pub rx_pressure: bool,
    /// QPs listed for [`Engine::take_retired`] (see [`qp::Retired`]).
    pub retired: &'a mut Vec<u32>,
    /// When the datagram being handled reached the host: as the backend
    /// said ([`RxDatagram::arrived_ns`]), else when the engine got it; 0
    /// outside [`Engine::handle_datagram`].
    pub arrived_ns: u64,
    /// Where a packet's payload may be left in its MRs instead of copied
    /// ([`Engine::poll_transmit_gather`]); `None`: copy it.
    pub gather: Option<&'a mut gather::Gather>,
}

/// The per-device transport engine. See the module documentation.
pub struct Engine {
    cfg: EngineConfig,
    mrs: Arc<MrTable>,
    qps: Vec<Option<Box<QpCtx>>>,
    qpn_map: QpnMap,
    /// The slot `create_qp` tries first. QPNs are handed out in a cycle
    /// through the block, as rxe's pool and NICs do: a destroyed QP's
    /// number comes back only after every other one was used, so a late
    /// packet for it finds no QP (dropped) rather than a new QP that took
    /// its number. Handing a freed number out at once let a UD datagram
    /// of a closed UCX endpoint (UCX keeps sending to a closed peer for
    /// minutes, UD_LINGER_TIMEOUT; UD accepts any sender with the Q_Key)
    /// reach the next UCX worker's new UD QP, which failed UCX's
    /// connection asserts or crashed it on an endpoint id of another
    /// worker.
    next_slot: usize,
    sched: schedule::Schedule,
    due: Vec<usize>,
    completions: Vec<Completion>,
    events: VecDeque<AsyncEvent>,
    stats: EngineStats,
    /// The slot that produced the last frame, and how many in a row.
    last_tx: (usize, u32),
    /// The device's in-flight window in packets (see
    /// [`EngineConfig::device_target_rtt_ns`]), and when it last shrank.
    window: f64,
    window_cut_ns: u64,
    /// Unacknowledged PSNs of all QPs (the sum of their `counted_inflight`).
    inflight: u64,
    rx_pressure: bool,
    /// QPs that gave WQEs back, were modified or entered ERR since
    /// [`Engine::take_retired`], each once.
    retired: Vec<u32>,
}

/// What [`Engine::take_retired`] reports of one QP.
#[derive(Clone, Copy, Debug)]
pub struct RetiredWqes {
    pub qpn: u32,
    /// Send and receive WQEs that left its queues.
    pub send: u32,
    pub recv: u32,
    /// Its state and path MTU (bytes) now.
    pub state: QpState,
    pub mtu: u32,
}

/// What a new QP is made of (`ibv_qp_init_attr` with the CQs named by id).
#[derive(Clone)]
pub struct QpCreate {
    pub qp_type: QpType,
    /// Protection domain: its MRs are the ones the QP may use.
    pub pd: u32,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub srq: Option<Arc<Srq>>,
    pub cap: QpCap,
    /// Every send WR generates a completion (ignore SIGNALED).
    pub sq_sig_all: bool,
}

impl Engine {
    pub fn new(cfg: EngineConfig, mrs: Arc<MrTable>) -> Self {
        let window = f64::from(cfg_window(&cfg));
        Self {
            qpn_map: QpnMap::new(cfg.qpn_block, cfg.qpn_offset),
            cfg,
            mrs,
            qps: vec![None], // GSI_SLOT
            next_slot: GSI_SLOT + 1,
            sched: schedule::Schedule::default(),
            due: Vec::new(),
            completions: Vec::with_capacity(64),
            events: VecDeque::with_capacity(64),
            stats: EngineStats::default(),
            inflight: 0,
            rx_pressure: false,
            last_tx: (usize::MAX, 0),
            window,
            window_cut_ns: 0,
            retired: Vec::new(),
        }
    }

    /// The device's in-flight window now, in packets (0: no limit).
    pub fn device_window_pkts(&self) -> u32 {
        if self.cfg.max_device_inflight_pkts == 0 {
            0
        } else {
            self.window as u32
        }
    }

    /// An ACK answered a packet sent `rtt` ago: the window shrinks if that
    /// was late (at most once per round trip), else grows by a packet.
    fn on_device_rtt(&mut self, rtt: u64, now: u64) {
        let target = self.cfg.device_target_rtt_ns;
        let max = f64::from(self.cfg.max_device_inflight_pkts);
        if target == 0 || max == 0.0 {
            return;
        }
        let min = f64::from(DEVICE_WINDOW_MIN_PKTS).min(max);
        if rtt > target {
            if now.saturating_sub(self.window_cut_ns) >= rtt {
                let excess = (rtt - target) as f64 / rtt as f64;
                self.window = (self.window * (1.0 - 0.5 * excess)).max(min);
                self.window_cut_ns = now;
                self.stats.device_window_cuts += 1;
            }
        } else {
            self.window = (self.window + 1.0).min(max);
        }
    }

    /// Unacknowledged PSNs of all the device's QPs together (bounded by
    /// [`EngineConfig::max_device_inflight_pkts`], give or take one READ).
    pub fn inflight_pkts(&self) -> u64 {
        self.inflight
    }

    /// The backend's receive ring (AF_XDP RX ring, UDP socket queue) is
    /// over its threshold, or no longer: while it is, data packets that
    /// arrive are treated as CE-marked, so the responder sends CNPs and
    /// the senders' congestion control slows them, as a switch queue
    /// marking ECN would make it.
    pub fn set_rx_pressure(&mut self, on: bool) {
        self.rx_pressure = on;
    }

    /// Whether [`set_rx_pressure`](Self::set_rx_pressure) is on.
    pub fn rx_pressure(&self) -> bool {
        self.rx_pressure
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Next asynchronous event (`ibv_get_async_event`), oldest first. At
    /// most [`MAX_ASYNC_EVENTS`] are kept; older ones are dropped and
    /// counted in `async_events_dropped`.
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// Are asynchronous events waiting?
    pub fn has_async_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Number of live QPs.
    pub fn qp_count(&self) -> usize {
        self.qps.iter().filter(|q| q.is_some()).count()
    }

    /// Move the completions produced so far, oldest first, to the end of
    /// `out`. Whoever holds the engine drains them into its CQs before
    /// releasing it, so completions appear in the order they were made.
    pub fn take_completions(&mut self, out: &mut Vec<Completion>) {
        if out.is_empty() {
            std::mem::swap(out, &mut self.completions);
        } else {
            out.append(&mut self.completions);
        }
    }

    /// Are completions waiting for [`Engine::take_completions`]?
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Does a QP completing its sends into `cq` hold sends of a service
    /// that completes them once transmitted (UD, UC) and not transmitted
    /// yet? Those complete soon, without any peer.
    pub fn local_sends_pending(&self, cq: CqId) -> bool {
        self.qps.iter().flatten().any(|q| {
            q.send_cq == cq
                && q.qp_type != QpType::Rc
                && q.state == QpState::Rts
                && !q.sq.is_empty()
        })
    }

    /// The CQ a completion of QP `qpn` was bound for was full, so it was
    /// lost: the QP goes to ERR (QP_FATAL, `cq_overflow`) and flushes.
    pub fn cq_overflowed(&mut self, qpn: u32) {
        let _ = self.with_qp(qpn, |qp, env| {
            env.stats.cq_overflows += 1;
            qp.cq_overflowed = true;
            qp.go_error = Some(qp::ErrCause::Fatal);
            Ok(())
        });
    }

    /// The MR table QPs resolve keys in.
    pub fn memory(&self) -> &Arc<MrTable> {
        &self.mrs
    }

    fn split(&mut self) -> (&mut Vec<Option<Box<QpCtx>>>, Env<'_>) {
        let inflight_room = match self.cfg.max_device_inflight_pkts {
            0 => u32::MAX,
            _ => (self.window as u64).saturating_sub(self.inflight) as u32,
        };
        (
            &mut self.qps,
            Env {
                cfg: &self.cfg,
                mrs: &self.mrs,
                stats: &mut self.stats,
                completions: &mut self.completions,
                events: &mut self.events,
                inflight_room,
                rx_pressure: self.rx_pressure,
                retired: &mut self.retired,
                arrived_ns: 0,
                gather: None,
            },
        )
    }

    /// Brings the device's in-flight count up to date with the QP in
    /// `idx` after an event on it.
    fn sync_inflight(&mut self, idx: usize) {
        if let Some(qp) = self.qps.get_mut(idx).and_then(|q| q.as_deref_mut()) {
            let now = qp.unacked_pkts();
            self.inflight = self.inflight + u64::from(now) - u64::from(qp.counted_inflight);
            qp.counted_inflight = now;
        }
    }

    /// `ibv_create_qp`: returns the new QP's number.
    pub fn create_qp(&mut self, c: QpCreate) -> Result<u32> {
        let idx = self
            .take_slot()
            .ok_or(TransportError::NoResources("QP numbers"))?;
        Ok(self.install_qp(idx, c))
    }

    /// The first free slot from `next_slot` on, wrapping past the block's
    /// last QPN to its first (slot 1); `next_slot` moves past it. Slots
    /// are added as the cycle first reaches them.
    fn take_slot(&mut self) -> Option<usize> {
        let last = qpn_block::QPNS_PER_BLOCK as usize; // slot of the last QPN
        for _ in 0..last {
            let idx = self.next_slot;
            self.next_slot = if idx == last { GSI_SLOT + 1 } else { idx + 1 };
            if idx == self.qps.len() {
                self.qps.push(None);
                return Some(idx);
            }
            if self.qps[idx].is_none() {
                return Some(idx);
            }
        }
        None
    }

    /// Create the device's GSI QP (QP1, UD): returns [`GSI_QPN`]. Its Q_Key
    /// starts as [`GSI_QKEY`] and received datagrams are checked against
    /// that, whatever INIT sets (as rxe); there is one per device.
    pub fn create_gsi_qp(&mut self, c: QpCreate) -> Result<u32> {
        if c.qp_type != QpType::Ud {
            return Err(TransportError::InvalidArgument(
                "the GSI QP (QP1) is a UD QP",
            ));
        }
        if self.qps[GSI_SLOT].is_some() {
            return Err(TransportError::AlreadyExists("the device's GSI QP (QP1)"));
        }
        // QP1 traffic reaches the process of QPN block 0 only (see
        // xroce_common::qpn_block): in another process a GSI QP would
        // send requests whose answers never come back to it.
        if self.cfg.qpn_block != 0 {
            return Err(TransportError::Busy(
                "QP1 of a shared device belongs to the process holding QPN block 0",
            ));
        }
        let qpn = self.install_qp(GSI_SLOT, c);
        if let Some(qp) = self.qps[GSI_SLOT].as_deref_mut() {
            qp.attr.qkey = GSI_QKEY;
        }
        Ok(qpn)
    }

    fn install_qp(&mut self, idx: usize, c: QpCreate) -> u32 {
        let qpn = self.qpn_map.qpn(idx);
        let cc: Box<dyn CongestionControl> = match &self.cfg.cc {
            Some(f) => f(),
            None => Box::new(NoCc::new(self.cfg.line_rate_bps)),
        };
        let burst = self.cfg.pacing_burst_bytes;
        let rc = c.qp_type == QpType::Rc;
        let mut qp = Box::new(QpCtx::new(qpn, c, cc, burst));
        if rc {
            qp.set_sr_mode(self.cfg.selective_repeat);
        }
        self.qps[idx] = Some(qp);
        self.sched.reset_slot(idx);
        self.reschedule(idx);
        qpn
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        let idx = self
            .qpn_map
            .slot(qpn)
            .ok_or(TransportError::NoSuchQp(qpn))?;
        match self.qps.get_mut(idx) {
            Some(slot @ Some(_)) => {
                if let Some(qp) = slot.take() {
                    self.inflight -= u64::from(qp.counted_inflight);
                }
                self.sched.reset_slot(idx);
                Ok(())
            }
            _ => Err(TransportError::NoSuchQp(qpn)),
        }
    }

    fn with_qp<R>(
        &mut self,
        qpn: u32,
        f: impl FnOnce(&mut QpCtx, &mut Env<'_>) -> Result<R>,
    ) -> Result<R> {
        let idx = self
            .qpn_map
            .slot(qpn)
            .ok_or(TransportError::NoSuchQp(qpn))?;
        let (qps, mut env) = self.split();
        let qp = qps
            .get_mut(idx)
            .and_then(|q| q.as_deref_mut())
            .ok_or(TransportError::NoSuchQp(qpn))?;
        let r = f(qp, &mut env);
        qp.after_event(&mut env);
        self.reschedule(idx);
        r
    }

    /// After any event on the QP in `idx`: it may have something to send,
    /// and its next timer may have moved.
    fn reschedule(&mut self, idx: usize) {
        self.sync_inflight(idx);
        let Some(qp) = self.qps.get(idx).and_then(|q| q.as_deref()) else {
            return;
        };
        let t = qp.next_timeout();
        self.sched.arm(idx, t);
        self.sched.wake(idx);
    }

    /// QP `qpn`, if it lives.
    fn qp_ref(&self, qpn: u32) -> Option<&QpCtx> {
        let idx = self.qpn_map.slot(qpn)?;
        self.qps.get(idx)?.as_deref().filter(|q| q.qpn == qpn)
    }

    /// What posting to QP `qpn` checks besides the room in its queues
    /// ([`check_send`], [`check_recv`]); the MTU is the current path MTU.
    pub fn post_limits(&self, qpn: u32) -> Result<PostLimits> {
        let qp = self.qp_ref(qpn).ok_or(TransportError::NoSuchQp(qpn))?;
        Ok(qp.post_limits())
    }

    /// Hands over, per QP, how many send and receive WQEs left its queues
    /// (completed, flushed or discarded) since the last call, and forgets
    /// them, with the QP's state and path MTU now; a QP that was modified
    /// or entered ERR since is handed over too (maybe with nothing
    /// retired). A poster that queues work outside the engine (the verbs
    /// layer's post ring) counts the room left in a QP's queues by them and
    /// checks posts against that state.
    pub fn take_retired(&mut self, mut f: impl FnMut(RetiredWqes)) {
        for qpn in self.retired.drain(..) {
            let qp = self
                .qpn_map
                .slot(qpn)
                .and_then(|i| self.qps.get_mut(i))
                .and_then(|q| q.as_deref_mut());
            // A QP destroyed since: nobody counts its queues any more.
            if let Some(qp) = qp.filter(|q| q.qpn == qpn) {
                let r = std::mem::take(&mut qp.retired);
                f(RetiredWqes {
                    qpn,
                    send: r.sq,
                    recv: r.rq,
                    state: qp.state,
                    mtu: qp.mtu,
                });
            }
        }
    }

    /// `ibv_modify_qp`.
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.with_qp(qpn, |qp, env| {
            let to = check_modify_for(qp.qp_type, qp.state, attr, mask)?;
            qp.apply_modify(env, to, attr, mask);
            Ok(())
        })
    }

    /// Move QP `qpn` RESET -> INIT -> RTR -> RTS for a peer described by
    /// `remote` (qpn, psn, address); `local` holds the rest (access flags,
    /// MTU, timers, rd_atomic limits, this side's sq_psn).
    pub fn connect_qp(&mut self, qpn: u32, local: &QpAttr, remote: &RemoteQp) -> Result<()> {
        let mut a = *local;
        a.qp_state = QpState::Init;
        self.modify_qp(
            qpn,
            &a,
            QpAttrMask::STATE
                | QpAttrMask::ACCESS_FLAGS
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT,
        )?;
        a.qp_state = QpState::Rtr;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.ah_attr = remote.av;
        self.modify_qp(
            qpn,
            &a,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        a.qp_state = QpState::Rts;
        self.modify_qp(
            qpn,
            &a,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
    }

    /// Set how RC QP `qpn` uses selective repeat (see [`selective`]):
    /// [`SrMode::Auto`] (the engine's default) agrees with the peer in
    /// band, [`SrMode::Off`] keeps go-back-N, [`SrMode::On`] runs it from
    /// the start (only for a peer that does so too or is Auto: WRITEs then
    /// carry a RETH in every packet and ACKs a SACK block, which no other
    /// RoCE peer understands). Only while the QP is idle (nothing posted,
    /// sent, unacknowledged or received half-way).
    pub fn set_selective_repeat(&mut self, qpn: u32, mode: SrMode) -> Result<()> {
        self.with_qp(qpn, |qp, _| {
            if qp.qp_type != QpType::Rc {
                return Err(TransportError::InvalidAttribute(
                    "selective_repeat",
                    "RC QPs only".into(),
                ));
            }
            let idle = qp.sq.is_empty()
                && !qp.psn_outstanding()
                && qp.resp.out.is_empty()
                && qp.resp.in_msg == qp::InMsg::None;
            if !idle {
                return Err(TransportError::InvalidAttribute(
                    "selective_repeat",
                    "the QP is not idle".into(),
                ));
            }
            qp.set_sr_mode(mode);
            Ok(())
        })
    }

    /// Whether QP `qpn` runs selective repeat, per half.
    pub fn selective_repeat(&mut self, qpn: u32) -> Result<SrStatus> {
        self.with_qp(qpn, |qp, _| {
            Ok(SrStatus {
                mode: qp.sr_mode,
                requester: qp.sr_req.is_some(),
                responder: qp.sr_resp.is_some(),
            })
        })
    }

    /// `ibv_query_qp`: current attributes (qp_state is the live state).
    pub fn query_qp(&mut self, qpn: u32) -> Result<QpAttr> {
        self.with_qp(qpn, |qp, _| {
            let mut a = qp.attr;
            a.qp_state = qp.state;
            Ok(a)
        })
    }

    /// `ibv_post_send` (one WR).
    pub fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<()> {
        self.with_qp(qpn, |qp, env| qp.post_send(env, wr, None))
    }

    /// `ibv_post_send` of one IBV_SEND_INLINE WR whose payload is `data`
    /// (`wr.sg_list` is ignored: inline SGEs carry no lkey).
    pub fn post_send_inline(&mut self, qpn: u32, wr: &SendWr, data: &[u8]) -> Result<()> {
        self.with_qp(qpn, |qp, env| qp.post_send(env, wr, Some(data)))
    }

    /// `ibv_post_recv` (one WR).
    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr) -> Result<()> {
        self.with_qp(qpn, |qp, env| qp.post_recv(env, wr))
    }

    /// Feed one received datagram (its ICRC checked by the backend).
    pub fn handle_datagram(&mut self, d: &RxDatagram<'_>, now_ns: u64) {
        self.stats.rx_frames += 1;
        self.stats.rx_bytes += d.frame_len() as u64;
        let Ok((t, payload)) = xroce_wire::parse_transport(d.udp_payload) else {
            self.stats.rx_malformed += 1;
            return;
        };
        let Some(idx) = self.qpn_map.slot(t.bth.dest_qp) else {
            self.stats.rx_unknown_qp += 1;
            return;
        };
        let (qps, mut env) = self.split();
        let Some(qp) = qps.get_mut(idx).and_then(|q| q.as_deref_mut()) else {
            env.stats.rx_unknown_qp += 1;
            return;
        };
        let sample = qp.req.rtt_sample;
        env.arrived_ns = d.arrived_ns.map_or(now_ns, |t| t.min(now_ns));
        qp.handle_packet(&mut env, &d.ip, &t, payload, now_ns);
        qp.after_event(&mut env);
        // The completer took the QP's round-trip sample: the device's too.
        let rtt = sample
            .filter(|&(p, _)| qp.req.rtt_sample.is_none() && xroce_wire::psn_lt(p, qp.req.comp_psn))
            .map(|(_, t)| now_ns.saturating_sub(t));
        if let Some(rtt) = rtt {
            self.on_device_rtt(rtt, now_ns);
        }
        self.reschedule(idx);
    }

    /// Counts what a backend dropped before the engine saw it (a frame
    /// that is not RoCEv2 or is malformed, a bad ICRC) as
    /// [`handle_frame`](Self::handle_frame) counts it.
    pub fn count_rejected(&mut self, r: &Rejected) {
        self.stats.rx_frames += 1;
        self.stats.rx_bytes += r.len as u64;
        match r.error {
            xroce_wire::Error::BadIcrc { .. } => self.stats.rx_bad_icrc += 1,
            e if e.is_not_roce() => self.stats.rx_not_roce += 1,
            _ => self.stats.rx_malformed += 1,
        }
    }

    /// Write the UDP payload of the next datagram to send into `buf`
    /// (which should hold at least `path MTU + 128` bytes), behind room for
    /// its frame's headers, and say where it is and where it goes; `None`
    /// when nothing is ready now.
    pub fn poll_transmit(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<Transmit> {
        self.poll_transmit_into(now_ns, buf, None)
    }

    /// [`poll_transmit`](Self::poll_transmit) that may leave the payload of
    /// the datagram in the MRs it comes from, saying where in `gather`
    /// (see [`gather`]): `buf` then holds everything but those bytes.
    pub fn poll_transmit_gather(
        &mut self,
        now_ns: u64,
        buf: &mut [u8],
        gather: &mut gather::Gather,
    ) -> Option<Transmit> {
        gather.clear();
        let g = gather.is_enabled().then_some(gather);
        self.poll_transmit_into(now_ns, buf, g)
    }

    fn poll_transmit_into(
        &mut self,
        now_ns: u64,
        buf: &mut [u8],
        mut gather: Option<&mut gather::Gather>,
    ) -> Option<Transmit> {
        // Only QPs that had an event since they last had nothing to send:
        // the rest wait for one (a timer is one, see `schedule`). QPs that
        // wait for room in the in-flight budget go first when there is
        // some, oldest first; one that still finds too little (a READ
        // bigger than the room) ends their turn for this call.
        self.sched.wake_due(now_ns);
        let mut serve_waiters = true;
        loop {
            let room = self.cfg.max_device_inflight_pkts == 0 || self.inflight < self.window as u64;
            // A QP within its quantum keeps its turn ahead of the waiters:
            // they get room a quantum at a time, in FIFO order, as the
            // ready QPs get turns.
            let continuing =
                self.last_tx.1 < MESSAGE_QUANTUM_PKTS && self.sched.front_is(self.last_tx.0);
            let (i, was_waiting) = match (room && serve_waiters && !continuing)
                .then(|| self.sched.pop_waiter())
                .flatten()
            {
                Some(i) => (i, true),
                None => match self.sched.pop_ready() {
                    Some(i) => (i, false),
                    None => return None,
                },
            };
            let (qps, mut env) = self.split();
            let Some(qp) = qps[i].as_deref_mut() else {
                continue;
            };
            // A packet that did not get out leaves nothing behind.
            if let Some(g) = gather.as_deref_mut() {
                g.clear();
            }
            env.gather = gather.as_deref_mut();
            qp.budget_blocked = false;
            let r = qp.poll_transmit(&mut env, now_ns, buf);
            qp.after_event(&mut env);
            let blocked = std::mem::take(&mut qp.budget_blocked);
            let t = qp.next_timeout();
            self.sync_inflight(i);
            self.sched.arm(i, t);
            if blocked {
                if was_waiting {
                    serve_waiters = false;
                    self.sched.wait_front(i);
                } else {
                    self.stats.tx_budget_waits += 1;
                    self.sched.wait(i);
                }
            }
            if let Some(t) = r {
                // Round-robin by quantum: a QP keeps its turn for up to
                // MESSAGE_QUANTUM_PKTS packets, so a message's last packet,
                // which asks for the ACK, is not a whole round behind its
                // first, and the small messages that follow it reach the
                // responder together (one ACK for them all); then it goes
                // to the back.
                let run = if self.last_tx.0 == i {
                    self.last_tx.1 + 1
                } else {
                    1
                };
                self.last_tx = (i, run);
                let more = self.qps[i]
                    .as_deref()
                    .is_some_and(|q| q.reserved_end.is_some() || q.has_new_requests());
                if more && run < MESSAGE_QUANTUM_PKTS {
                    self.sched.wake_front(i);
                } else {
                    self.sched.wake(i);
                }
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += t.frame_len() as u64;
                return Some(t);
            }
        }
    }

    /// Whether a QP had an event since it last had nothing to send (a
    /// post, an ACK, a timer): `poll_transmit` may have a frame now, so
    /// an I/O thread must not go to sleep.
    pub fn wants_to_transmit(&self) -> bool {
        self.sched.has_ready()
    }

    /// Earliest time `handle_timeout` has work to do.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.sched.next_deadline()
    }

    /// Run timers due at `now_ns` (retransmission, RNR back-off, pacing,
    /// congestion-control timers) of the QPs that have one due.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        let mut due = std::mem::take(&mut self.due);
        self.sched.take_due(now_ns, &mut due);
        for &i in &due {
            let (qps, mut env) = self.split();
            if let Some(qp) = qps[i].as_deref_mut() {
                qp.handle_timeout(&mut env, now_ns);
                qp.after_event(&mut env);
                self.reschedule(i);
            }
        }
        due.clear();
        self.due = due;
    }

    /// Current pacing rate of a QP (its congestion controller's rate).
    pub fn qp_rate_bps(&self, qpn: u32) -> Option<u64> {
        let idx = self.qpn_map.slot(qpn)?;
        self.qps.get(idx)?.as_ref().map(|q| q.cc.rate_bps())
    }

    /// Name of a QP's congestion controller ("none", "dcqcn", ...).
    pub fn qp_cc_name(&self, qpn: u32) -> Option<&'static str> {
        let idx = self.qpn_map.slot(qpn)?;
        self.qps.get(idx)?.as_ref().map(|q| q.cc.name())
    }

    /// Counters of one QP.
    pub fn qp_stats(&self, qpn: u32) -> Option<QpStats> {
        let idx = self.qpn_map.slot(qpn)?;
        self.qps.get(idx)?.as_ref().map(|q| q.qstats)
    }

    /// Numbers of the live QPs.
    pub fn qp_numbers(&self) -> impl Iterator<Item = u32> + '_ {
        self.qps
            .iter()
            .enumerate()
            .filter(|(_, q)| q.is_some())
            .map(|(i, _)| self.qpn_map.qpn(i))
    }
}

#[cfg(test)]
mod tests {
    use super::EngineStats;

    #[test]
    fn stats_add_counter_by_counter() {
        let a = EngineStats {
            rx_frames: 3,
            tx_acks: 5,
            sr_dropped_out_of_order: 7,
            ..EngineStats::default()
        };
        let b = EngineStats {
            rx_frames: 10,
            tx_acks: 1,
            cq_overflows: 2,
            ..EngineStats::default()
        };
        let sum = a + b;
        for ((name, s), ((_, x), (_, y))) in sum.fields().zip(a.fields().zip(b.fields())) {
            assert_eq!(s, x + y, "{name}");
        }
        assert_eq!((sum.rx_frames, sum.tx_acks, sum.cq_overflows), (13, 6, 2));
    }
}
