//! Whole Ethernet frames in and out of the datagram-level engine, for the
//! simulator, tests and backends that carry frames (AF_XDP): the
//! Ethernet, IP and UDP headers and the ICRC are written and checked here.

use super::datagram::{Rejected, RxDatagram, Transmit};
use super::Engine;

impl Engine {
    /// Feed one received Ethernet frame: its headers parsed and its ICRC
    /// checked, the datagram to [`handle_datagram`](Self::handle_datagram);
    /// what fails is counted ([`count_rejected`](Self::count_rejected)).
    pub fn handle_frame(&mut self, frame: &[u8], now_ns: u64) {
        match datagram_of(frame) {
            Ok(d) => self.handle_datagram(&d, now_ns),
            Err(r) => self.count_rejected(&r),
        }
    }

    /// [`handle_frame`](Self::handle_frame) of a frame that reached the
    /// host at `arrived_ns` ([`RxDatagram::arrived_ns`]).
    pub fn handle_frame_at(&mut self, frame: &[u8], arrived_ns: u64, now_ns: u64) {
        match datagram_of(frame) {
            Ok(d) => self.handle_datagram(
                &RxDatagram {
                    arrived_ns: Some(arrived_ns),
                    ..d
                },
                now_ns,
            ),
            Err(r) => self.count_rejected(&r),
        }
    }

    /// [`poll_transmit`](Self::poll_transmit) as a whole Ethernet frame
    /// (with its ICRC) at the start of `buf`, which should hold at least
    /// `path MTU + 128` bytes; returns its length.
    pub fn poll_transmit_frame(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<usize> {
        let t = self.poll_transmit(now_ns, buf)?;
        Some(complete_frame(&t, buf))
    }
}

/// Writes the Ethernet, IP and UDP headers of `t` in front of its UDP
/// payload in `buf` (where `poll_transmit` left room for them) and its
/// ICRC, in one pass; returns the frame's length (it starts at `buf[0]`).
pub fn complete_frame(t: &Transmit, buf: &mut [u8]) -> usize {
    let (eth, udp) = t.frame_headers();
    debug_assert_eq!(xroce_wire::headers_len(&eth, &t.ip), t.payload_at);
    xroce_wire::emit_headers(&eth, &t.ip, &udp, t.len, buf)
        .expect("the engine left room for its headers and wrote a datagram that fits IP")
}

/// A received frame as the engine takes it: its headers parsed and its
/// ICRC checked (one pass), or why it is dropped.
pub fn datagram_of(frame: &[u8]) -> Result<RxDatagram<'_>, Rejected> {
    match xroce_wire::parse_frame_datagram(frame) {
        Ok((f, udp_payload)) => Ok(RxDatagram {
            ip: f.ip,
            udp_src_port: f.udp.src_port,
            udp_payload,
            arrived_ns: None,
        }),
        Err(error) => Err(Rejected {
            len: frame.len(),
            error,
        }),
    }
}

/// The [`Transmit`] a frame's headers say, its UDP payload where it is in
/// `frame` (the inverse of [`complete_frame`]; the ICRC is not checked):
/// for a backend handed a frame that it sends as a datagram.
pub fn transmit_of(frame: &[u8]) -> Option<Transmit> {
    let (f, payload) = xroce_wire::parse_frame(frame).ok()?;
    Some(Transmit {
        src_mac: f.eth.src,
        dst_mac: f.eth.dst,
        ip: f.ip,
        udp_src_port: f.udp.src_port,
        payload_at: xroce_wire::headers_len(&f.eth, &f.ip),
        len: f.transport.buffer_len(payload.len()),
    })
}
