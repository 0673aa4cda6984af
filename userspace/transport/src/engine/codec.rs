//! The engine's packets, as xroce-wire reprs: a QP's header template (IPv4
//! or IPv6 after the peer's address) and the packets made from it. The
//! engine writes only their UDP payload ([`emit`]); the headers go to the
//! backend as a [`Transmit`], which writes them (or has the kernel write
//! them) and the ICRC.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use xroce_wire::{BthRepr, FrameRepr, Gid, Opcode, TransportRepr};

use super::datagram::Transmit;
use super::qp_attr::AddressVector;
use super::EngineConfig;

/// ECN codepoint ECT(0) (RFC 3168), on everything but CNPs when the device
/// is ECN capable.
pub(crate) const ECT0: u8 = 0b10;

/// Our source address towards `dest`: the device's IPv4 address for an IPv4
/// peer; for an IPv6 peer a link-local address if the peer's is link-local,
/// else the first other one (the kernel's source selection, cut down to
/// what one interface needs); `::` if the device has none.
pub(crate) fn source_ip(cfg: &EngineConfig, dest: IpAddr) -> IpAddr {
    match dest {
        IpAddr::V4(_) => IpAddr::V4(cfg.ip),
        IpAddr::V6(d) => {
            let want_ll = d.is_unicast_link_local();
            let pick = cfg
                .ipv6
                .iter()
                .find(|a| a.is_unicast_link_local() == want_ll)
                .or(cfg.ipv6.first());
            IpAddr::V6(pick.copied().unwrap_or(Ipv6Addr::UNSPECIFIED))
        }
    }
}

/// Headers of every frame to `av`'s peer QP `dest_qp`: our MAC and source
/// address, the AV's DSCP, ECT(0) if the device is ECN capable, P_Key
/// 0xffff, M=0 (as rxe 6.1 sends, seen in the reference captures). The
/// transport part is a placeholder: [`packet`] sets opcode and PSN.
pub(crate) fn template(
    cfg: &EngineConfig,
    av: &AddressVector,
    dest_qp: u32,
    udp_sport: u16,
) -> FrameRepr {
    let src = Gid::from(source_ip(cfg, av.dest_ip));
    let mut bth = BthRepr::new(Opcode::RC_ACKNOWLEDGE, dest_qp, 0);
    bth.mig_req = false;
    let mut f = FrameRepr::new(
        cfg.mac,
        av.dest_mac,
        src,
        Gid::from(av.dest_ip),
        udp_sport,
        TransportRepr::new(bth),
    );
    f.ip.set_dscp(av.dscp);
    f.ip.set_ecn(if cfg.ecn_capable { ECT0 } else { 0 });
    f
}

/// The template of a QP not yet connected (peer 0.0.0.0).
pub(crate) fn unconnected() -> FrameRepr {
    let unspecified = Gid::from(Ipv4Addr::UNSPECIFIED);
    let bth = BthRepr::new(Opcode::RC_ACKNOWLEDGE, 0, 0);
    FrameRepr::new(
        [0; 6],
        [0; 6],
        unspecified,
        unspecified,
        0,
        TransportRepr::new(bth),
    )
}

/// A frame of `opcode` at `psn` with `tmpl`'s headers and no extension
/// header yet (the caller adds exactly those `opcode.headers()` names).
pub(crate) fn packet(tmpl: &FrameRepr, opcode: Opcode, psn: u32) -> FrameRepr {
    let mut f = *tmpl;
    f.transport = TransportRepr::new(BthRepr {
        opcode,
        psn,
        ..tmpl.transport.bth
    });
    f
}

/// Writes the UDP payload of packet `f` into `buf` behind room for its
/// frame's headers (see [`Transmit::payload_at`]): transport headers, the
/// `payload_len` payload bytes `fill` writes in place (from the MR, no
/// copy in between), pad and a zeroed ICRC slot.
pub(crate) fn emit(
    f: &FrameRepr,
    payload_len: usize,
    buf: &mut [u8],
    fill: impl FnOnce(&mut [u8]) -> xroce_wire::Result<()>,
) -> xroce_wire::Result<Transmit> {
    let (at, room) = behind_headers(f, buf)?;
    let len = f.transport.emit_in_place(payload_len, room, fill)?;
    Ok(transmit(f, at, len))
}

/// [`emit`] with the payload copied from `payload` (an ACK's SACK block).
pub(crate) fn emit_copy(
    f: &FrameRepr,
    payload: &[u8],
    buf: &mut [u8],
) -> xroce_wire::Result<Transmit> {
    let (at, room) = behind_headers(f, buf)?;
    let len = f.transport.emit(payload, room)?;
    Ok(transmit(f, at, len))
}

/// Where `f`'s UDP payload starts in `buf` (behind room for its frame's
/// headers), and `buf` from there.
fn behind_headers<'b>(
    f: &FrameRepr,
    buf: &'b mut [u8],
) -> xroce_wire::Result<(usize, &'b mut [u8])> {
    let at = xroce_wire::headers_len(&f.eth, &f.ip);
    let have = buf.len();
    let room = buf
        .get_mut(at..)
        .ok_or(xroce_wire::Error::BufferTooSmall { needed: at, have })?;
    Ok((at, room))
}

fn transmit(f: &FrameRepr, payload_at: usize, len: usize) -> Transmit {
    Transmit {
        src_mac: f.eth.src,
        dst_mac: f.eth.dst,
        ip: f.ip,
        udp_src_port: f.udp.src_port,
        payload_at,
        len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xroce_wire::{emit_frame, parse_frame_checked, IpRepr};

    fn cfg() -> EngineConfig {
        EngineConfig {
            ipv6: vec!["2001:db8::1".parse().unwrap(), "fe80::1".parse().unwrap()],
            ..EngineConfig::default()
        }
    }

    #[test]
    fn source_follows_the_peer_address_family_and_scope() {
        let c = cfg();
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(source_ip(&c, v4), IpAddr::V4(c.ip));
        let ll: IpAddr = "fe80::2".parse().unwrap();
        assert_eq!(source_ip(&c, ll), "fe80::1".parse::<IpAddr>().unwrap());
        let global: IpAddr = "2001:db8::2".parse().unwrap();
        assert_eq!(
            source_ip(&c, global),
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
        let none = EngineConfig::default();
        assert_eq!(source_ip(&none, ll), IpAddr::V6(Ipv6Addr::UNSPECIFIED));
    }

    #[test]
    fn ipv6_template_carries_dscp_and_ect0_and_round_trips() {
        let av = AddressVector {
            dest_mac: [2, 0, 0, 0, 0, 2],
            dest_ip: "fe80::2".parse().unwrap(),
            dscp: 26,
            udp_sport: None,
        };
        let t = template(&cfg(), &av, 0x12, 0xc000);
        let IpRepr::V6(ip) = t.ip else {
            panic!("an IPv6 peer gets IPv6 frames: {:?}", t.ip)
        };
        assert_eq!(ip.traffic_class, (26 << 2) | ECT0);
        assert_eq!(ip.flow_label, 0);
        assert_eq!(
            Ipv6Addr::from(ip.src),
            "fe80::1".parse::<Ipv6Addr>().unwrap()
        );
        let mut f = packet(&t, Opcode::RC_SEND_ONLY, 7);
        f.transport.bth.ack_req = true;
        let mut buf = [0u8; 256];
        let n = emit_frame(&f, b"hello", &mut buf).unwrap();
        let (back, payload) = parse_frame_checked(&buf[..n]).unwrap();
        assert_eq!(payload, b"hello");
        assert_eq!(back.transport, f.transport);
        assert_eq!(back.ip.src_gid(), t.ip.src_gid());
        assert_eq!(back.ip.dst_gid(), Gid::from(av.dest_ip));
    }
}
