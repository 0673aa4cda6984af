//! RoCEv2 wire codec. `no_std`, no allocation, no I/O, no `unsafe`.
//!
//! # API at a glance
//!
//! Whole frames (what the transport engine uses):
//! - [`FrameRepr`] { [`EthRepr`], [`IpRepr`] (V4 [`Ipv4Repr`] | V6 [`Ipv6Repr`]),
//!   [`UdpRepr`], [`TransportRepr`] }; [`FrameRepr::new`] builds one from
//!   MACs, [`Gid`]s, a UDP source port ([`rocev2_src_port`]) and a transport repr.
//! - [`parse_frame`]`(&[u8]) -> Result<(FrameRepr, payload)>` — no ICRC check;
//!   [`parse_frame_checked`] also verifies the ICRC.
//! - [`emit_frame`]`(&FrameRepr, payload, &mut [u8]) -> Result<usize>` fills
//!   ethertype, lengths, pad, IPv4 checksum, UDP checksum (if asked) and ICRC;
//!   [`FrameRepr::frame_len`] tells the size first.
//! - Around a UDP payload already in place (a sender that writes the
//!   datagram first, an I/O backend completing the engine's):
//!   [`emit_headers`] writes Eth/IP/UDP in front of it and its ICRC in one
//!   pass; [`parse_frame_datagram`] is [`parse_frame_checked`] giving the
//!   UDP payload back.
//!
//! Transport level (UDP payload: BTH + ext headers + payload + pad + ICRC):
//! - [`TransportRepr`] { [`BthRepr`], deth, feth, reth, atomic_eth, aeth,
//!   atomic_ack_eth, imm_data, invalidate_rkey } with `parse`/`emit`/`buffer_len`;
//!   aliases [`parse_transport`] / [`emit_transport`]. Exactly the headers
//!   of `bth.opcode.headers()` are `Some`.
//! - [`Opcode`] (every RC/UC/UD opcode + CNP; `Opcode::from_u8` errors on
//!   reserved/unknown), [`HeaderSet`], [`Service`].
//!
//! ICRC ([`icrc`]): [`icrc::compute`]`(ip_header, udp..pad)`,
//! [`icrc::verify_frame`], [`icrc::fill_frame`], [`icrc::frame_icrc`].
//!
//! Helpers: [`psn`] (24-bit serial arithmetic: [`psn_add`], [`psn_diff`],
//! [`psn_lt`], [`psn_in_window`], [`Psn`]), [`aeth`] ([`Syndrome`],
//! [`NakCode`], [`rnr_timer_us`], [`credits_from_code`]), [`gid`] ([`Gid`]
//! <-> IPv4-mapped / IPv6), [`udp::rocev2_src_port`] (rxe's UDP source port
//! from the QP pair), [`bth::pad_count`].
//!
//! Per-header zero-copy views with checked accessors (`new_checked`):
//! [`eth::EthernetFrame`], [`ipv4::Ipv4Packet`], [`ipv6::Ipv6Packet`],
//! [`udp::UdpPacket`], [`bth::BthHeader`], [`aeth::AethHeader`],
//! [`ext::RethHeader`], [`ext::DethHeader`], [`ext::AtomicEthHeader`],
//! [`ext::AtomicAckEthHeader`], [`ext::ImmDtHeader`], [`ext::IethHeader`],
//! [`ext::FethHeader`]; each header also has a `*Repr` with `parse`/`emit`.
//!
//! Errors: [`Error`] ([`Error::is_not_roce`] separates "not RoCEv2" from malformed).
//!
//! # Checks
//!
//! - `cargo test -p xroce-wire`: rxe captures (`tests/data/rxe`) decode, ICRC
//!   recomputed exactly, emit(parse(frame)) == frame; proptest round trips of
//!   every header and opcode; PSN laws across the 2^24 wrap; tshark dissects
//!   codec frames of every opcode cleanly (needs `apt-get install tshark`).
//! - Fuzzing (from `userspace/wire`): `cargo +nightly fuzz run parse_frame
//!   fuzz/corpus/parse_frame fuzz/seeds/parse_frame -- -max_total_time=60`.
//! - ICRC throughput vs a table CRC-32 peer, one JSON object:
//!   `cargo run --release -p xroce-wire --example icrc_bench`.
//!
//! # Example
//!
//! ```
//! use xroce_wire::{emit_frame, parse_frame_checked, ext::RethRepr, BthRepr, FrameRepr, Gid,
//!                  Opcode, TransportRepr, rocev2_src_port};
//!
//! let (lqpn, rqpn) = (0x11, 0x12);
//! let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_RDMA_WRITE_ONLY, rqpn, 0x00ff_fffe));
//! t.bth.ack_req = true;
//! t.reth = Some(RethRepr { va: 0x1000, rkey: 0x42, dma_len: 5 });
//! let repr = FrameRepr::new(
//!     [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2],
//!     Gid::from_ipv4([10, 0, 0, 1]), Gid::from_ipv4([10, 0, 0, 2]),
//!     rocev2_src_port(0, lqpn, rqpn), t,
//! );
//! let mut buf = [0u8; 128];
//! let n = emit_frame(&repr, b"hello", &mut buf)?;      // pad 3, ICRC filled
//! assert_eq!(n, repr.frame_len(5));
//! let (back, payload) = parse_frame_checked(&buf[..n])?; // ICRC verified
//! assert_eq!(payload, b"hello");
//! assert_eq!(back.transport, repr.transport);
//! # Ok::<(), xroce_wire::Error>(())
//! ```
#![no_std]
#![forbid(unsafe_code)]

pub mod aeth;
pub mod bth;
mod bytes;
pub mod cm;
pub mod delay_echo;
pub mod error;
pub mod eth;
pub mod ext;
pub mod frame;
pub mod gid;
pub mod icrc;
pub mod icrc_solve;
pub mod ipv4;
pub mod ipv6;
pub mod mad;
pub mod opcode;
pub mod psn;
pub mod rdma_cm;
pub mod sack;
pub mod transport;
pub mod udp;

pub use aeth::{credits_from_code, rnr_timer_us, AethRepr, NakCode, Syndrome};
pub use bth::{pad_count, BthRepr, QPN_MASK};
pub use error::{Error, Layer, Result};
pub use eth::{EthRepr, VlanTag};
pub use ext::{AtomicAckEthRepr, AtomicEthRepr, DethRepr, FethRepr, RethRepr};
pub use frame::{
    emit_frame, emit_frame_in_place, emit_headers, headers_len, parse_frame, parse_frame_checked,
    parse_frame_datagram, FrameRepr, IpRepr, MAX_OVERHEAD,
};
pub use gid::Gid;
pub use icrc::ICRC_LEN;
pub use ipv4::Ipv4Repr;
pub use ipv6::Ipv6Repr;
pub use opcode::{HeaderSet, Opcode, Service};
pub use psn::{
    psn_add, psn_diff, psn_distance, psn_in_window, psn_le, psn_lt, psn_sub, Psn, PSN_MASK,
};
pub use transport::TransportRepr;
pub use udp::{rocev2_src_port, UdpChecksum, UdpRepr, ROCEV2_PORT};

/// Parse a UDP payload (BTH ... ICRC); see [`TransportRepr::parse`].
pub fn parse_transport(buf: &[u8]) -> Result<(TransportRepr, &[u8])> {
    TransportRepr::parse(buf)
}

/// Emit BTH ... ICRC slot (ICRC left zero); see [`TransportRepr::emit`].
pub fn emit_transport(repr: &TransportRepr, payload: &[u8], buf: &mut [u8]) -> Result<usize> {
    repr.emit(payload, buf)
}
