//! Whole Ethernet frames in and out of the datagram-level engine, for the
//! simulator and tests (and anything else that has frames): the Ethernet,
//! IP and UDP headers and the ICRC are written and checked here, as an
//! AF_XDP backend does.

use xroce_wire::{eth, ipv6, udp};

use super::datagram::{Rejected, RxDatagram};
use super::Engine;

/// Room for the longest headers in front of a datagram: Ethernet, IPv6, UDP.
const HEADROOM: usize = eth::HEADER_LEN + ipv6::HEADER_LEN + udp::HEADER_LEN;

impl Engine {
    /// Feed one received Ethernet frame: its headers parsed and its ICRC
    /// checked, the datagram to [`handle_datagram`](Self::handle_datagram);
    /// what fails is counted ([`count_rejected`](Self::count_rejected)).
    pub fn handle_frame(&mut self, frame: &[u8], now_ns: u64) {
        match xroce_wire::parse_frame_datagram(frame) {
            Ok((f, udp_payload)) => self.handle_datagram(
                &RxDatagram {
                    ip: f.ip,
                    udp_src_port: f.udp.src_port,
                    udp_payload,
                },
                now_ns,
            ),
            Err(error) => self.count_rejected(&Rejected {
                len: frame.len(),
                error,
            }),
        }
    }

    /// [`poll_transmit`](Self::poll_transmit) as a whole Ethernet frame
    /// (with its ICRC) at the start of `buf`, which should hold at least
    /// `path MTU + 128` bytes; returns its length.
    pub fn poll_transmit_frame(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<usize> {
        let t = self.poll_transmit(now_ns, buf.get_mut(HEADROOM..)?)?;
        let (eth, udp) = t.frame_headers();
        let start = HEADROOM - xroce_wire::headers_len(&eth, &t.ip);
        let n = xroce_wire::emit_headers(&eth, &t.ip, &udp, t.len, &mut buf[start..])
            .expect("the engine's headers fit in front of its datagram");
        buf.copy_within(start..start + n, 0);
        Some(n)
    }
}
