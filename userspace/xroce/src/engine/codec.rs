//! Frame parse/emit used by the engine.
//!
//! TEMPORARY: a minimal, self-contained RoCEv2-over-IPv4 codec (Ethernet /
//! IPv4 / UDP 4791 / BTH / RETH / AETH / AtomicETH / AtomicAckETH / ImmDt /
//! IETH / ICRC) written while `xroce-wire` was still being built. The engine
//! only talks to [`PktHdr`], [`parse`] and [`emit`], so switching to the wire
//! crate replaces this file only. ICRC follows rxe (masked pseudo header with
//! 8 bytes of 0xff for the LRH, TOS/TTL/IP checksum/UDP checksum/BTH resv8a
//! masked to all ones, CRC-32 stored little endian).

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

const F_RETH: u8 = 1;
const F_AETH: u8 = 2;
const F_ATOMIC: u8 = 4;
const F_ATOMIC_ACK: u8 = 8;
const F_IMM: u8 = 16;
const F_IETH: u8 = 32;
const F_CNP: u8 = 64;

/// Extension headers present for an opcode (transport-type bits masked off
/// for RC/UC). `None` for opcodes the engine does not know.
fn ext_flags(opcode: u8) -> Option<u8> {
    if opcode == op::CNP {
        return Some(F_CNP);
    }
    let tt = opcode >> 5;
    if tt != 0 && tt != 1 {
        return None; // RC and UC only
    }
    Some(match opcode & 0x1f {
        op::SEND_FIRST | op::SEND_MIDDLE | op::SEND_LAST | op::SEND_ONLY => 0,
        op::SEND_LAST_IMM | op::SEND_ONLY_IMM => F_IMM,
        op::WRITE_FIRST | op::WRITE_ONLY => F_RETH,
        op::WRITE_MIDDLE | op::WRITE_LAST => 0,
        op::WRITE_LAST_IMM => F_IMM,
        op::WRITE_ONLY_IMM => F_RETH | F_IMM,
        op::READ_REQ => F_RETH,
        op::READ_RESP_FIRST | op::READ_RESP_LAST | op::READ_RESP_ONLY => F_AETH,
        op::READ_RESP_MIDDLE => 0,
        op::ACK => F_AETH,
        op::ATOMIC_ACK => F_AETH | F_ATOMIC_ACK,
        op::CMP_SWAP | op::FETCH_ADD => F_ATOMIC,
        op::SEND_LAST_INV | op::SEND_ONLY_INV => F_IETH,
        _ => return None,
    })
}

fn ext_len(f: u8) -> usize {
    let mut n = 0;
    if f & F_RETH != 0 {
        n += 16;
    }
    if f & F_AETH != 0 {
        n += 4;
    }
    if f & F_ATOMIC != 0 {
        n += 28;
    }
    if f & F_ATOMIC_ACK != 0 {
        n += 8;
    }
    if f & F_IMM != 0 {
        n += 4;
    }
    if f & F_IETH != 0 {
        n += 4;
    }
    if f & F_CNP != 0 {
        n += 16;
    }
    n
}

#[inline]
fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
#[inline]
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
#[inline]
fn be64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(a)
}

/// ICRC over a frame starting at the Ethernet header (`frame` excludes the
/// ICRC itself). `frame.len() >= L2L3L4 + BTH_LEN` is required.
pub fn icrc(frame: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    let mut ip = [0u8; IP_HDR + UDP_HDR + BTH_LEN];
    ip.copy_from_slice(&frame[ETH_HDR..L2L3L4 + BTH_LEN]);
    ip[1] = 0xff; // TOS
    ip[8] = 0xff; // TTL
    ip[10] = 0xff; // header checksum
    ip[11] = 0xff;
    ip[IP_HDR + 6] = 0xff; // UDP checksum
    ip[IP_HDR + 7] = 0xff;
    ip[IP_HDR + UDP_HDR + 4] = 0xff; // BTH FECN/BECN/resv
    h.update(&ip);
    h.update(&frame[L2L3L4 + BTH_LEN..]);
    h.finalize()
}

fn ip_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for i in (0..h.len()).step_by(2) {
        s += u16::from_be_bytes([h[i], h[i + 1]]) as u32;
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Parse a whole frame. On success returns the headers and the payload
/// range (pad bytes and ICRC excluded).
pub fn parse(frame: &[u8]) -> Result<(PktHdr, core::ops::Range<usize>), ParseError> {
    if frame.len() < L2L3L4 + BTH_LEN + ICRC_LEN {
        return Err(ParseError::Truncated);
    }
    if be16(frame, 12) != 0x0800 {
        return Err(ParseError::NotIpv4);
    }
    let ip = &frame[ETH_HDR..];
    if ip[0] != 0x45 {
        return Err(ParseError::NotIpv4);
    }
    if ip[9] != 17 {
        return Err(ParseError::NotUdp);
    }
    let tot = be16(ip, 2) as usize;
    if tot < IP_HDR + UDP_HDR + BTH_LEN + ICRC_LEN || ETH_HDR + tot > frame.len() {
        return Err(ParseError::BadLength);
    }
    let frame = &frame[..ETH_HDR + tot]; // strip Ethernet padding
    let udp = &frame[ETH_HDR + IP_HDR..];
    if be16(udp, 2) != ROCE_UDP_PORT {
        return Err(ParseError::NotRoce);
    }
    if be16(udp, 4) as usize != tot - IP_HDR {
        return Err(ParseError::BadLength);
    }
    let b = &frame[L2L3L4..];
    let opcode = b[0];
    let flags = ext_flags(opcode).ok_or(ParseError::BadOpcode)?;
    let el = ext_len(flags);
    let pad = ((b[1] >> 4) & 3) as usize;
    let body = frame.len() - L2L3L4;
    if body < BTH_LEN + el + pad + ICRC_LEN {
        return Err(ParseError::BadLength);
    }
    let crc_at = frame.len() - ICRC_LEN;
    let got = u32::from_le_bytes([
        frame[crc_at],
        frame[crc_at + 1],
        frame[crc_at + 2],
        frame[crc_at + 3],
    ]);
    if icrc(&frame[..crc_at]) != got {
        return Err(ParseError::BadIcrc);
    }
    let mut h = PktHdr {
        dst_mac: frame[0..6].try_into().unwrap(),
        src_mac: frame[6..12].try_into().unwrap(),
        src_ip: ip[12..16].try_into().unwrap(),
        dst_ip: ip[16..20].try_into().unwrap(),
        ecn: ip[1] & 3,
        dscp: ip[1] >> 2,
        udp_sport: be16(udp, 0),
        opcode,
        se: b[1] & 0x80 != 0,
        mig: b[1] & 0x40 != 0,
        pkey: be16(b, 2),
        fecn: b[4] & 0x80 != 0,
        becn: b[4] & 0x40 != 0,
        dqpn: be32(b, 4) & PSN_MASK,
        ack_req: b[8] & 0x80 != 0,
        psn: be32(b, 8) & PSN_MASK,
        ..Default::default()
    };
    let mut o = BTH_LEN;
    if flags & F_RETH != 0 {
        h.reth = Some(Reth {
            va: be64(b, o),
            rkey: be32(b, o + 8),
            len: be32(b, o + 12),
        });
        o += 16;
    }
    if flags & F_AETH != 0 {
        let v = be32(b, o);
        h.aeth = Some(((v >> 24) as u8, v & PSN_MASK));
        o += 4;
    }
    if flags & F_ATOMIC_ACK != 0 {
        h.atomic_ack = Some(be64(b, o));
        o += 8;
    }
    if flags & F_ATOMIC != 0 {
        h.atomic = Some(AtomicEth {
            va: be64(b, o),
            rkey: be32(b, o + 8),
            swap_add: be64(b, o + 12),
            compare: be64(b, o + 20),
        });
        o += 28;
    }
    if flags & F_IMM != 0 {
        h.imm = Some(be32(b, o));
        o += 4;
    }
    if flags & F_IETH != 0 {
        h.ieth = Some(be32(b, o));
        o += 4;
    }
    if flags & F_CNP != 0 {
        o += 16;
    }
    let start = L2L3L4 + o;
    let end = crc_at - pad;
    if end < start {
        return Err(ParseError::BadLength);
    }
    Ok((h, start..end))
}

/// Emit a frame with headers `h` and a payload written by `fill` (which
/// gets exactly `payload_len` bytes to fill). Returns the frame length or
/// `None` if `buf` is too small or the opcode unknown.
pub fn emit(
    h: &PktHdr,
    payload_len: usize,
    buf: &mut [u8],
    fill: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    let flags = ext_flags(h.opcode)?;
    let el = ext_len(flags);
    let pad = (4 - (payload_len & 3)) & 3;
    let total = L2L3L4 + BTH_LEN + el + payload_len + pad + ICRC_LEN;
    if buf.len() < total {
        return None;
    }
    let f = &mut buf[..total];
    f[0..6].copy_from_slice(&h.dst_mac);
    f[6..12].copy_from_slice(&h.src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    {
        let ip = &mut f[ETH_HDR..ETH_HDR + IP_HDR];
        ip[0] = 0x45;
        ip[1] = (h.dscp << 2) | (h.ecn & 3);
        ip[2..4].copy_from_slice(&((total - ETH_HDR) as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&[0, 0]);
        ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
        ip[8] = 64;
        ip[9] = 17;
        ip[10] = 0;
        ip[11] = 0;
        ip[12..16].copy_from_slice(&h.src_ip);
        ip[16..20].copy_from_slice(&h.dst_ip);
        let c = ip_checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
    }
    {
        let u = &mut f[ETH_HDR + IP_HDR..L2L3L4];
        u[0..2].copy_from_slice(&h.udp_sport.to_be_bytes());
        u[2..4].copy_from_slice(&ROCE_UDP_PORT.to_be_bytes());
        u[4..6].copy_from_slice(&((total - ETH_HDR - IP_HDR) as u16).to_be_bytes());
        u[6..8].copy_from_slice(&[0, 0]);
    }
    let b = &mut f[L2L3L4..];
    b[0] = h.opcode;
    b[1] = (h.se as u8) << 7 | (h.mig as u8) << 6 | (pad as u8) << 4;
    b[2..4].copy_from_slice(&h.pkey.to_be_bytes());
    b[4..8].copy_from_slice(&(h.dqpn & PSN_MASK).to_be_bytes());
    b[4] = (h.fecn as u8) << 7 | (h.becn as u8) << 6;
    b[8..12].copy_from_slice(&(h.psn & PSN_MASK).to_be_bytes());
    b[8] = (h.ack_req as u8) << 7;
    let mut o = BTH_LEN;
    if flags & F_RETH != 0 {
        let r = h.reth.unwrap_or_default();
        b[o..o + 8].copy_from_slice(&r.va.to_be_bytes());
        b[o + 8..o + 12].copy_from_slice(&r.rkey.to_be_bytes());
        b[o + 12..o + 16].copy_from_slice(&r.len.to_be_bytes());
        o += 16;
    }
    if flags & F_AETH != 0 {
        let (s, m) = h.aeth.unwrap_or((aeth::ACK_UNLIMITED, 0));
        b[o..o + 4].copy_from_slice(&((s as u32) << 24 | (m & PSN_MASK)).to_be_bytes());
        o += 4;
    }
    if flags & F_ATOMIC_ACK != 0 {
        b[o..o + 8].copy_from_slice(&h.atomic_ack.unwrap_or(0).to_be_bytes());
        o += 8;
    }
    if flags & F_ATOMIC != 0 {
        let a = h.atomic.unwrap_or_default();
        b[o..o + 8].copy_from_slice(&a.va.to_be_bytes());
        b[o + 8..o + 12].copy_from_slice(&a.rkey.to_be_bytes());
        b[o + 12..o + 20].copy_from_slice(&a.swap_add.to_be_bytes());
        b[o + 20..o + 28].copy_from_slice(&a.compare.to_be_bytes());
        o += 28;
    }
    if flags & F_IMM != 0 {
        b[o..o + 4].copy_from_slice(&h.imm.unwrap_or(0).to_be_bytes());
        o += 4;
    }
    if flags & F_IETH != 0 {
        b[o..o + 4].copy_from_slice(&h.ieth.unwrap_or(0).to_be_bytes());
        o += 4;
    }
    if flags & F_CNP != 0 {
        b[o..o + 16].fill(0);
        o += 16;
    }
    fill(&mut b[o..o + payload_len]);
    b[o + payload_len..o + payload_len + pad].fill(0);
    let crc_at = total - ICRC_LEN;
    let c = icrc(&f[..crc_at]);
    f[crc_at..].copy_from_slice(&c.to_le_bytes());
    Some(total)
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
        let n = emit(&h, 5, &mut buf, |p| p.copy_from_slice(b"hello")).unwrap();
        let (p, r) = parse(&buf[..n]).unwrap();
        assert_eq!(&buf[r], b"hello");
        assert_eq!(p, h);
        h.opcode = op::ATOMIC_ACK;
        h.reth = None;
        h.imm = None;
        h.aeth = Some((aeth::ACK_UNLIMITED, 9));
        h.atomic_ack = Some(42);
        let n = emit(&h, 0, &mut buf, |_| {}).unwrap();
        let (p, _) = parse(&buf[..n]).unwrap();
        assert_eq!(p, h);
        buf[60] ^= 1;
        assert_eq!(parse(&buf[..n]).unwrap_err(), ParseError::BadIcrc);
    }
}
