//! Frame parse/emit for the engine, on top of the `xroce-wire` codec.
//!
//! The engine works with the flat [`PktHdr`] (raw opcode byte, optional
//! extension headers); this adapter converts to and from the wire crate's
//! [`xroce_wire::FrameRepr`], which does the byte layout, lengths, IPv4
//! checksum and the rxe-compatible ICRC. Parsing accepts IPv4 and IPv6
//! frames (with VLAN tags); the engine emits IPv4.

use super::psn::PSN_MASK;

pub const ROCE_UDP_PORT: u16 = 4791;
pub const ETH_HDR: usize = 14;
pub const IP_HDR: usize = 20;
pub const UDP_HDR: usize = 8;
pub const BTH_LEN: usize = 12;
pub const ICRC_LEN: usize = 4;
/// Bytes before the BTH.
pub const L2L3L4: usize = ETH_HDR + IP_HDR + UDP_HDR;
/// Largest header + trailer overhead of any packet (BTH + RETH + ImmDt + ICRC).
pub const MAX_OVERHEAD: usize = L2L3L4 + BTH_LEN + 28 + 4 + ICRC_LEN;

/// IBTA opcodes (RC, plus UC/UD prefixes and the RoCEv2 CNP).
pub mod op {
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_IMM: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_IMM: u8 = 0x05;
    pub const WRITE_FIRST: u8 = 0x06;
    pub const WRITE_MIDDLE: u8 = 0x07;
    pub const WRITE_LAST: u8 = 0x08;
    pub const WRITE_LAST_IMM: u8 = 0x09;
    pub const WRITE_ONLY: u8 = 0x0a;
    pub const WRITE_ONLY_IMM: u8 = 0x0b;
    pub const READ_REQ: u8 = 0x0c;
    pub const READ_RESP_FIRST: u8 = 0x0d;
    pub const READ_RESP_MIDDLE: u8 = 0x0e;
    pub const READ_RESP_LAST: u8 = 0x0f;
    pub const READ_RESP_ONLY: u8 = 0x10;
    pub const ACK: u8 = 0x11;
    pub const ATOMIC_ACK: u8 = 0x12;
    pub const CMP_SWAP: u8 = 0x13;
    pub const FETCH_ADD: u8 = 0x14;
    pub const SEND_LAST_INV: u8 = 0x16;
    pub const SEND_ONLY_INV: u8 = 0x17;
    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_IMM: u8 = 0x65;
    pub const CNP: u8 = 0x81;
}

/// AETH syndromes.
pub mod aeth {
    pub const ACK_UNLIMITED: u8 = 0x1f;
    pub const RNR_NAK: u8 = 0x20; // | timer
    pub const NAK_PSN_SEQ: u8 = 0x60;
    pub const NAK_INV_REQ: u8 = 0x61;
    pub const NAK_REM_ACCESS: u8 = 0x62;
    pub const NAK_REM_OP: u8 = 0x63;
    pub const NAK_INV_RD_REQ: u8 = 0x64;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reth {
    pub va: u64,
    pub rkey: u32,
    pub len: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEth {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

/// Parsed (or to-be-emitted) headers of one RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PktHdr {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    /// Low two bits of the IPv4 TOS byte.
    pub ecn: u8,
    pub dscp: u8,
    pub udp_sport: u16,
    pub opcode: u8,
    pub se: bool,
    pub mig: bool,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dqpn: u32,
    pub ack_req: bool,
    pub psn: u32,
    pub reth: Option<Reth>,
    pub aeth: Option<(u8, u32)>,
    pub atomic: Option<AtomicEth>,
    pub atomic_ack: Option<u64>,
    pub imm: Option<u32>,
    pub ieth: Option<u32>,
    /// DETH (UD): (Q_Key, source QPN).
    pub deth: Option<(u32, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    Truncated,
    NotIpv4,
    NotUdp,
    NotRoce,
    BadOpcode,
    BadLength,
    BadIcrc,
}

/// ICRC of a frame (Ethernet header first) whose last 4 bytes are the ICRC
/// slot: recompute and store it. Returns false for frames too short or not
/// RoCEv2 enough to locate the headers.
pub fn fix_icrc(frame: &mut [u8]) -> bool {
    xroce_wire::icrc::fill_frame(frame).is_ok()
}

/// Parse a whole frame and check its ICRC. On success returns the headers
/// and the payload range (pad and ICRC excluded) within `frame`.
pub fn parse(frame: &[u8]) -> Result<(PktHdr, core::ops::Range<usize>), ParseError> {
    use xroce_wire::{Error, IpRepr};
    let (f, payload) = match xroce_wire::parse_frame_checked(frame) {
        Ok(x) => x,
        Err(e) if e.is_not_roce() => return Err(ParseError::NotRoce),
        Err(Error::BadIcrc { .. }) => return Err(ParseError::BadIcrc),
        Err(Error::UnknownOpcode(_)) => return Err(ParseError::BadOpcode),
        Err(Error::Truncated(_)) => return Err(ParseError::Truncated),
        Err(_) => return Err(ParseError::BadLength),
    };
    let start = payload.as_ptr() as usize - frame.as_ptr() as usize;
    let range = start..start + payload.len();
    let (src_ip, dst_ip, dscp) = match f.ip {
        IpRepr::V4(r) => (r.src, r.dst, r.dscp),
        IpRepr::V6(r) => {
            let s = f.ip.src_gid().to_ipv4().unwrap_or([0; 4]);
            let d = f.ip.dst_gid().to_ipv4().unwrap_or([0; 4]);
            (s, d, r.traffic_class >> 2)
        }
    };
    let t = &f.transport;
    let b = &t.bth;
    let h = PktHdr {
        dst_mac: f.eth.dst,
        src_mac: f.eth.src,
        src_ip,
        dst_ip,
        ecn: f.ip.ecn(),
        dscp,
        udp_sport: f.udp.src_port,
        opcode: b.opcode.as_u8(),
        se: b.solicited,
        mig: b.mig_req,
        pkey: b.pkey,
        fecn: b.fecn,
        becn: b.becn,
        dqpn: b.dest_qp & PSN_MASK,
        ack_req: b.ack_req,
        psn: b.psn & PSN_MASK,
        reth: t.reth.map(|r| Reth {
            va: r.va,
            rkey: r.rkey,
            len: r.dma_len,
        }),
        aeth: t.aeth.map(|a| (a.syndrome.to_u8(), a.msn & PSN_MASK)),
        atomic: t.atomic_eth.map(|a| AtomicEth {
            va: a.va,
            rkey: a.rkey,
            swap_add: a.swap_add,
            compare: a.compare,
        }),
        atomic_ack: t.atomic_ack_eth.map(|a| a.orig_data),
        imm: t.imm_data,
        ieth: t.invalidate_rkey,
        deth: t.deth.map(|d| (d.qkey, d.src_qp & PSN_MASK)),
    };
    Ok((h, range))
}

/// Emit a whole frame (Ethernet/IPv4/UDP/BTH/ext/payload/pad/ICRC) for `h`
/// and `payload` into `buf`. Returns the frame length, or `None` if `buf`
/// is too small or the opcode unknown (headers the opcode needs but `h`
/// lacks are emitted as zero).
pub fn emit(h: &PktHdr, payload: &[u8], buf: &mut [u8]) -> Option<usize> {
    use xroce_wire::{
        AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, FrameRepr, Gid,
        HeaderSet, IpRepr, Opcode, RethRepr, Syndrome, TransportRepr,
    };
    let opcode = Opcode::from_u8(h.opcode).ok()?;
    let hs = opcode.headers();
    let mut t = TransportRepr::new(BthRepr {
        opcode,
        solicited: h.se,
        mig_req: h.mig,
        pkey: h.pkey,
        fecn: h.fecn,
        becn: h.becn,
        dest_qp: h.dqpn & PSN_MASK,
        ack_req: h.ack_req,
        psn: h.psn & PSN_MASK,
    });
    if hs.contains(HeaderSet::RETH) {
        let r = h.reth.unwrap_or_default();
        t.reth = Some(RethRepr {
            va: r.va,
            rkey: r.rkey,
            dma_len: r.len,
        });
    }
    if hs.contains(HeaderSet::AETH) {
        let (s, m) = h.aeth.unwrap_or((aeth::ACK_UNLIMITED, 0));
        t.aeth = Some(AethRepr {
            syndrome: Syndrome::from_u8(s),
            msn: m & PSN_MASK,
        });
    }
    if hs.contains(HeaderSet::ATOMIC_ETH) {
        let a = h.atomic.unwrap_or_default();
        t.atomic_eth = Some(AtomicEthRepr {
            va: a.va,
            rkey: a.rkey,
            swap_add: a.swap_add,
            compare: a.compare,
        });
    }
    if hs.contains(HeaderSet::ATOMIC_ACK_ETH) {
        t.atomic_ack_eth = Some(AtomicAckEthRepr {
            orig_data: h.atomic_ack.unwrap_or(0),
        });
    }
    if hs.contains(HeaderSet::IMM_DT) {
        t.imm_data = Some(h.imm.unwrap_or(0));
    }
    if hs.contains(HeaderSet::IETH) {
        t.invalidate_rkey = Some(h.ieth.unwrap_or(0));
    }
    if hs.contains(HeaderSet::DETH) {
        let (qkey, src_qp) = h.deth.unwrap_or((0, 0));
        t.deth = Some(DethRepr {
            qkey,
            src_qp: src_qp & PSN_MASK,
        });
    }
    if hs.contains(HeaderSet::FETH) {
        t.feth = Some(FethRepr {
            selectivity: 0,
            placement_type: 0,
        });
    }
    let mut f = FrameRepr::new(
        h.src_mac,
        h.dst_mac,
        Gid::from_ipv4(h.src_ip),
        Gid::from_ipv4(h.dst_ip),
        h.udp_sport,
        t,
    );
    if let IpRepr::V4(r) = &mut f.ip {
        r.dscp = h.dscp & 0x3f;
        r.ecn = h.ecn & 3;
    }
    xroce_wire::emit_frame(&f, payload, buf).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_all_headers() {
        let mut h = PktHdr {
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_mac: [2, 0, 0, 0, 0, 1],
            src_ip: [10, 0, 0, 1],
            dst_ip: [10, 0, 0, 2],
            ecn: 2,
            udp_sport: 0xc123,
            opcode: op::WRITE_ONLY_IMM,
            pkey: 0xffff,
            dqpn: 0x11,
            ack_req: true,
            psn: 0xff_fffe,
            reth: Some(Reth {
                va: 0x1234,
                rkey: 0xdead_beef,
                len: 5,
            }),
            imm: Some(77),
            ..Default::default()
        };
        let mut buf = [0u8; 256];
        let n = emit(&h, b"hello", &mut buf).unwrap();
        let (p, r) = parse(&buf[..n]).unwrap();
        assert_eq!(&buf[r], b"hello");
        assert_eq!(p, h);
        h.opcode = op::ATOMIC_ACK;
        h.reth = None;
        h.imm = None;
        h.aeth = Some((aeth::ACK_UNLIMITED, 9));
        h.atomic_ack = Some(42);
        let n = emit(&h, &[], &mut buf).unwrap();
        let (p, _) = parse(&buf[..n]).unwrap();
        assert_eq!(p, h);
        buf[60] ^= 1;
        assert_eq!(parse(&buf[..n]).unwrap_err(), ParseError::BadIcrc);
    }
}
