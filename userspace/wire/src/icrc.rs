//! The RoCEv2 Invariant CRC (IBTA RoCEv2 annex A17.4.1, and what rxe's
//! rxe_icrc.c computes).
//!
//! CRC-32 (IEEE, reflected, as `crc32fast`) over:
//! 1. 8 bytes of 0xFF standing for the (absent) LRH;
//! 2. the IP header with the variant fields set to all ones — IPv4: TOS
//!    (DSCP+ECN), TTL and header checksum; IPv6: traffic class, flow label
//!    and hop limit;
//! 3. the UDP header with the checksum set to 0xFFFF;
//! 4. the BTH with byte 4 (resv8a: FECN, BECN, reserved) set to 0xFF;
//! 5. the extension headers, payload and pad, unchanged.
//!
//! The Ethernet header (and VLAN tags) are not covered. The 4-byte result
//! is appended in little-endian byte order (the CRC register as it comes
//! out of a reflected CRC).

use crate::bth;
use crate::error::{Error, Layer, Result};
use crate::eth::{EthRepr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::{ipv4, ipv6, udp};

/// ICRC length in bytes.
pub const ICRC_LEN: usize = 4;

/// ICRC over an IP header (20-byte IPv4 or 40-byte IPv6, unmasked as on the
/// wire) and `l4`: the UDP header followed by BTH, extension headers,
/// payload and pad, *without* the ICRC itself.
pub fn compute(ip_header: &[u8], l4: &[u8]) -> Result<u32> {
    compute_with(ip_header, l4, |_| {})
}

/// [`compute`] over a datagram in pieces: `head` (the UDP header, the BTH
/// and whatever follows them in one piece), then each slice `rest` hands
/// to the function it is given, in order (a payload gathered from
/// elsewhere, then the pad), still without the ICRC itself.
pub fn compute_with(
    ip_header: &[u8],
    head: &[u8],
    rest: impl FnOnce(&mut dyn FnMut(&[u8])),
) -> Result<u32> {
    let l4 = head;
    let mut ip = [0u8; ipv6::HEADER_LEN];
    let ip_len = match ip_header.first().map(|b| b >> 4) {
        Some(4) if ip_header.len() >= ipv4::HEADER_LEN => {
            ip[..20].copy_from_slice(&ip_header[..20]);
            ip[1] = 0xff; // TOS
            ip[8] = 0xff; // TTL
            ip[10] = 0xff; // header checksum
            ip[11] = 0xff;
            ipv4::HEADER_LEN
        }
        Some(6) if ip_header.len() >= ipv6::HEADER_LEN => {
            ip.copy_from_slice(&ip_header[..40]);
            ip[0] |= 0x0f; // traffic class (high nibble) ...
            ip[1] = 0xff; // ... traffic class (low nibble) + flow label
            ip[2] = 0xff;
            ip[3] = 0xff;
            ip[7] = 0xff; // hop limit
            ipv6::HEADER_LEN
        }
        Some(v) if v == 4 || v == 6 => return Err(Error::Truncated(Layer::Icrc)),
        Some(v) => return Err(Error::BadIpVersion(v)),
        None => return Err(Error::Truncated(Layer::Icrc)),
    };
    if l4.len() < udp::HEADER_LEN + bth::HEADER_LEN {
        return Err(Error::Truncated(Layer::Icrc));
    }
    let mut hdr = [0u8; udp::HEADER_LEN + bth::HEADER_LEN];
    hdr.copy_from_slice(&l4[..20]);
    hdr[6] = 0xff; // UDP checksum
    hdr[7] = 0xff;
    hdr[8 + 4] = 0xff; // BTH resv8a
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(&ip[..ip_len]);
    h.update(&hdr);
    h.update(&l4[20..]);
    rest(&mut |piece| h.update(piece));
    Ok(h.finalize())
}

/// Where the pieces of an Ethernet RoCEv2 frame are, for ICRC work.
struct Layout {
    ip: usize,
    ip_len: usize,
    l4: usize,
    /// End of the UDP datagram (the ICRC is its last 4 bytes).
    end: usize,
}

fn layout(frame: &[u8]) -> Result<Layout> {
    let (eth, ip) = EthRepr::parse(frame)?;
    let rest = &frame[ip..];
    let (ip_len, l4_len) = match eth.ethertype {
        ETHERTYPE_IPV4 => {
            let p = ipv4::Ipv4Packet::new_checked(rest)?;
            let ihl = p.ihl() as usize * 4;
            let tl = p.total_len() as usize;
            if ihl != ipv4::HEADER_LEN {
                return Err(Error::Ipv4Options(p.ihl()));
            }
            if tl < ihl || tl > rest.len() {
                return Err(Error::BadLength(Layer::Ipv4));
            }
            (ihl, tl - ihl)
        }
        ETHERTYPE_IPV6 => {
            let p = ipv6::Ipv6Packet::new_checked(rest)?;
            let pl = p.payload_len() as usize;
            if ipv6::HEADER_LEN + pl > rest.len() {
                return Err(Error::BadLength(Layer::Ipv6));
            }
            (ipv6::HEADER_LEN, pl)
        }
        t => return Err(Error::NotIp(t)),
    };
    let l4 = ip + ip_len;
    let u = udp::UdpPacket::new_checked(&frame[l4..l4 + l4_len])?;
    let ulen = u.len() as usize;
    if ulen < udp::HEADER_LEN + bth::HEADER_LEN + ICRC_LEN || ulen > l4_len {
        return Err(Error::BadLength(Layer::Udp));
    }
    Ok(Layout {
        ip,
        ip_len,
        l4,
        end: l4 + ulen,
    })
}

/// `(computed, found)` ICRC of an Ethernet RoCEv2 frame.
pub fn frame_icrc(frame: &[u8]) -> Result<(u32, u32)> {
    let l = layout(frame)?;
    let computed = compute(
        &frame[l.ip..l.ip + l.ip_len],
        &frame[l.l4..l.end - ICRC_LEN],
    )?;
    let f = &frame[l.end - ICRC_LEN..l.end];
    let found = u32::from_le_bytes([f[0], f[1], f[2], f[3]]);
    Ok((computed, found))
}

/// Check the ICRC of an Ethernet RoCEv2 frame: `Err(Error::BadIcrc{..})` on mismatch.
pub fn verify_frame(frame: &[u8]) -> Result<()> {
    let (computed, found) = frame_icrc(frame)?;
    if computed == found {
        Ok(())
    } else {
        Err(Error::BadIcrc { computed, found })
    }
}

/// Compute and store the ICRC of an Ethernet RoCEv2 frame whose headers
/// and lengths are already in place.
pub fn fill_frame(frame: &mut [u8]) -> Result<()> {
    let l = layout(frame)?;
    let c = compute(
        &frame[l.ip..l.ip + l.ip_len],
        &frame[l.l4..l.end - ICRC_LEN],
    )?;
    frame[l.end - ICRC_LEN..l.end].copy_from_slice(&c.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_in_pieces_has_the_icrc_of_the_whole() {
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[9] = 17;
        let mut l4 = [0u8; 300];
        for (i, b) in l4.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let whole = compute(&ip, &l4).unwrap();
        // Head (UDP + BTH + 12 bytes), then the rest in three pieces.
        let pieces = compute_with(&ip, &l4[..40], |f| {
            f(&l4[40..41]);
            f(&l4[41..200]);
            f(&l4[200..]);
        })
        .unwrap();
        assert_eq!(pieces, whole);
        let short = compute_with(&ip, &l4[..40], |f| f(&l4[40..299])).unwrap();
        assert_ne!(short, whole, "every byte counts");
    }
}
