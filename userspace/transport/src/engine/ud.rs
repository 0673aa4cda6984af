//! Unreliable Datagram receive side (IBTA 9.8.5 / rxe): one SEND per packet,
//! Q_Key checked against the QP's, no PSN ordering, no ACKs. As in ibverbs,
//! the first 40 bytes of the receive buffer get the GRH ([`grh`]); the
//! completion has the GRH flag, the header's family and the sender's QPN.

use xroce_wire::{IpRepr, Opcode, TransportRepr};

use super::completion::{NetworkHdr, WcFlags, WcStatus};
use super::qp::QpCtx;
use super::wqe::sgl_write;
use super::Env;

pub(crate) const GRH_LEN: usize = 40;

/// The 40 bytes in front of a UD receive's payload for a packet that came
/// with IP header `ip`, as rxe writes them (rxe_resp.c execute(): the
/// received header copied) and the RoCEv2 annex says (A17.4.5.2): the IPv6
/// header whole; for IPv4, 20 zero bytes and then the IPv4 header with its
/// fields as received (TOS = DSCP/ECN, total length, identification, DF,
/// TTL, protocol UDP, checksum, addresses). Consumers read the destination
/// address from the last 16 (IPv6) or 4 (IPv4) bytes: UCX's UD transport
/// drops datagrams whose destination is none of the device's GIDs. The
/// parser accepted only 20-byte IPv4 headers with a valid checksum, so
/// emitting the parsed fields again gives the received bytes.
pub(crate) fn grh(ip: &IpRepr) -> [u8; GRH_LEN] {
    let mut out = [0u8; GRH_LEN];
    let emitted = match ip {
        IpRepr::V4(ip) => ip.emit(&mut out[GRH_LEN - xroce_wire::ipv4::HEADER_LEN..]),
        IpRepr::V6(ip) => ip.emit(&mut out),
    };
    debug_assert!(emitted.is_ok(), "a parsed IP header emits: {emitted:?}");
    out
}

impl QpCtx {
    pub(crate) fn ud_recv(
        &mut self,
        env: &mut Env<'_>,
        ip: &IpRepr,
        t: &TransportRepr,
        payload: &[u8],
    ) {
        if !matches!(
            t.bth.opcode,
            Opcode::UD_SEND_ONLY | Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
        ) {
            env.stats.rx_unsupported += 1;
            return;
        }
        let Some(deth) = t.deth else {
            env.stats.rx_malformed += 1;
            return;
        };
        // As rxe: QP1 takes only the GSI Q_Key, whatever INIT set.
        let qkey = if self.qpn == super::GSI_QPN {
            super::GSI_QKEY
        } else {
            self.attr.qkey
        };
        if deth.qkey != qkey {
            env.stats.rx_dropped_other += 1; // Q_Key violation: silently dropped
            return;
        }
        if payload.len() > self.mtu as usize {
            env.stats.rx_dropped_other += 1;
            return;
        }
        let Some(r) = self.take_recv_wqe(env) else {
            env.stats.rx_dropped_other += 1; // no receive WQE: UD drops
            return;
        };
        let mut wc = self.recv_wc(r.wr_id, WcStatus::Success);
        wc.src_qp = deth.src_qp;
        if let Some(st) = r.local_err {
            wc.status = st;
            self.complete(env, false, wc);
            return;
        }
        if GRH_LEN + payload.len() > r.len {
            wc.status = WcStatus::LocLenErr;
            self.complete(env, false, wc);
            return;
        }
        let grh = grh(ip);
        if !sgl_write(&r.sges, 0, &grh) || !sgl_write(&r.sges, GRH_LEN, payload) {
            wc.status = WcStatus::LocProtErr;
            self.complete(env, false, wc);
            return;
        }
        wc.byte_len = (GRH_LEN + payload.len()) as u32;
        wc.flags |= WcFlags::GRH;
        wc.network_hdr = match ip {
            IpRepr::V4(_) => NetworkHdr::Ipv4,
            IpRepr::V6(_) => NetworkHdr::Ipv6,
        };
        if t.bth.solicited {
            wc.flags |= WcFlags::SOLICITED;
        }
        if let Some(imm) = t.imm_data {
            wc.imm_data = imm;
            wc.flags |= WcFlags::WITH_IMM;
        }
        self.complete(env, false, wc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xroce_wire::{Ipv4Repr, Ipv6Repr};

    /// A UD SEND of 4 bytes (UDP 8 + BTH 12 + DETH 8 + 4 + ICRC 4 = 36
    /// bytes after the IP header), sent with TTL/hop limit 1 as
    /// ibv_ud_pingpong's AH asks, DSCP 26 and ECT(0).
    const AFTER_IP: u16 = 36;

    #[test]
    fn ipv4_header_in_the_last_20_bytes_as_received() {
        let ip = IpRepr::V4(Ipv4Repr {
            src: [10, 0, 0, 2],
            dst: [10, 0, 0, 1],
            dscp: 26,
            ecn: 2,
            ident: 0x1c46,
            dont_frag: true,
            ttl: 1,
            payload_len: AFTER_IP,
        });
        let mut want = [0u8; GRH_LEN];
        want[20..].copy_from_slice(&[
            0x45, 0x6a, 0x00, 0x38, // version/IHL, TOS 26 << 2 | 2, total length 56
            0x1c, 0x46, 0x40, 0x00, // identification, DF
            0x01, 0x11, 0x49, 0x03, // TTL 1, UDP, header checksum
            10, 0, 0, 2, // source
            10, 0, 0, 1, // destination: UCX's DGID check reads these 4 bytes
        ]);
        assert_eq!(grh(&ip), want);
    }

    #[test]
    fn ipv6_header_fills_all_40_bytes() {
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        (src[0], src[15], dst[0], dst[15]) = (0xfd, 2, 0xfd, 1);
        let ip = IpRepr::V6(Ipv6Repr {
            src,
            dst,
            traffic_class: 0x6a,
            flow_label: 0xabcde,
            hop_limit: 1,
            payload_len: AFTER_IP,
        });
        let mut want = vec![
            0x66, 0xaa, 0xbc, 0xde, // version 6, traffic class 0x6a, flow label
            0x00, 0x24, 0x11, 0x01, // payload length 36, next header UDP, hop limit 1
        ];
        want.extend_from_slice(&src);
        want.extend_from_slice(&dst);
        assert_eq!(grh(&ip).to_vec(), want);
    }
}
