//! Recovering the IPv4 identification and DF bit of a RoCEv2 datagram from
//! its ICRC.
//!
//! A kernel UDP socket delivers a datagram without its IP header. The
//! addresses, TOS and TTL come back as control messages, but the
//! identification field and the DF bit do not, and the ICRC covers both
//! (it masks only TOS, TTL and the checksum). A receiver that rebuilds the
//! frame must put back the values the sender's ICRC was computed over, or
//! the frame fails its ICRC check. xroce sends id 0 with DF; rdma_rxe sends
//! random ids.
//!
//! CRC-32 is affine over GF(2) in the message bits: flipping a set of
//! message bits changes the CRC by the XOR of what flipping each alone does.
//! So 18 ICRC passes (a base, then each of the 16 id bits and DF flipped
//! alone) give a 32-equation, 17-unknown linear system whose solution is
//! the id and DF that make the ICRC come out as received. A corrupt datagram
//! has (almost surely) no solution.

use crate::{icrc, ipv4, Ipv4Repr};

/// Unknowns: the 16 identification bits (bit i = id bit i), then DF (bit 16).
const UNKNOWNS: usize = 17;
const DF_UNKNOWN: u32 = 1 << 16;

/// The identification and DF bit that make `found` the ICRC of the datagram
/// `l4` (UDP header through pad, without the ICRC) behind the IPv4 header
/// `ip` (whose own `ident` and `dont_frag` are ignored). `None` if no value
/// does (the datagram is corrupt) or `ip`/`l4` cannot carry an ICRC.
pub fn solve_ipv4_ident(ip: &Ipv4Repr, l4: &[u8], found: u32) -> Option<(u16, bool)> {
    let icrc_with = |ident: u16, dont_frag: bool| -> Option<u32> {
        let mut header = [0u8; ipv4::HEADER_LEN];
        Ipv4Repr {
            ident,
            dont_frag,
            ..*ip
        }
        .emit(&mut header)
        .ok()?;
        icrc::compute(&header, l4).ok()
    };
    let base = icrc_with(0, false)?;
    let mut basis = Basis::default();
    for i in 0..UNKNOWNS {
        let flipped = if i < 16 {
            icrc_with(1 << i, false)?
        } else {
            icrc_with(0, true)?
        };
        basis.insert(flipped ^ base, 1 << i);
    }
    let (rest, unknowns) = basis.reduce(base ^ found, 0);
    (rest == 0).then_some((unknowns as u16, unknowns & DF_UNKNOWN != 0))
}

/// A row-echelon basis over GF(2): `rows[b]` is a CRC change whose highest
/// set bit is `b`, with the set of unknowns (as a bit mask) that produces it.
#[derive(Default)]
struct Basis {
    rows: [(u32, u32); 32],
}

impl Basis {
    /// Eliminates from `change` every bit a row leads with, highest first;
    /// returns what is left and the unknowns whose flips were used.
    fn reduce(&self, mut change: u32, mut unknowns: u32) -> (u32, u32) {
        for b in (0..32).rev() {
            let (row, row_unknowns) = self.rows[b];
            if change & (1 << b) != 0 && row != 0 {
                change ^= row;
                unknowns ^= row_unknowns;
            }
        }
        (change, unknowns)
    }

    /// Adds a column unless it depends on the rows already there.
    fn insert(&mut self, change: u32, unknowns: u32) {
        let (change, unknowns) = self.reduce(change, unknowns);
        if change != 0 {
            self.rows[31 - change.leading_zeros() as usize] = (change, unknowns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{emit_frame, BthRepr, FrameRepr, Gid, IpRepr, Opcode, TransportRepr};

    /// An RC SEND_ONLY frame from 10.1.2.3 to 10.1.2.4 and its IPv4 repr.
    fn frame(buf: &mut [u8; 128]) -> (Ipv4Repr, usize) {
        let t = TransportRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, 0x11, 7));
        let repr = FrameRepr::new(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            Gid::from_ipv4([10, 1, 2, 3]),
            Gid::from_ipv4([10, 1, 2, 4]),
            0xc011,
            t,
        );
        let n = emit_frame(&repr, b"hello world, rdma", buf).unwrap();
        let IpRepr::V4(ip) = repr.ip else {
            unreachable!("an IPv4 GID makes an IPv4 frame")
        };
        (ip, n)
    }

    fn icrc_over(ip: &Ipv4Repr, ident: u16, dont_frag: bool, l4: &[u8]) -> u32 {
        let mut h = [0u8; ipv4::HEADER_LEN];
        Ipv4Repr {
            ident,
            dont_frag,
            ..*ip
        }
        .emit(&mut h)
        .unwrap();
        icrc::compute(&h, l4).unwrap()
    }

    #[test]
    fn the_sender_ident_and_df_are_recovered() {
        let mut buf = [0u8; 128];
        let (ip, n) = frame(&mut buf);
        let l4 = &buf[34..n - 4];
        for (ident, df) in [
            (0x1234u16, true),
            (0xfffe, true),
            (7, false),
            (0, true),
            (0, false),
            (0xffff, false),
        ] {
            let found = icrc_over(&ip, ident, df, l4);
            assert_eq!(solve_ipv4_ident(&ip, l4, found), Some((ident, df)));
        }
        // What the header's own ident/DF say does not matter.
        let other = Ipv4Repr {
            ident: 0xabcd,
            dont_frag: false,
            ..ip
        };
        let found = icrc_over(&ip, 0x4321, true, l4);
        assert_eq!(solve_ipv4_ident(&other, l4, found), Some((0x4321, true)));
    }

    #[test]
    fn a_corrupt_icrc_has_no_solution() {
        let mut buf = [0u8; 128];
        let (ip, n) = frame(&mut buf);
        let l4 = &buf[34..n - 4];
        let good = icrc_over(&ip, 0, true, l4);
        // 17 unknowns reach 2^17 of the 2^32 ICRC values: a random wrong
        // one is reachable with probability 2^-15.
        let misses = (1..200u32)
            .filter(|k| solve_ipv4_ident(&ip, l4, good ^ k.wrapping_mul(0x9e37_79b9)).is_none())
            .count();
        assert!(misses >= 190, "{misses}");
    }

    #[test]
    fn too_short_a_datagram_is_refused() {
        let mut buf = [0u8; 128];
        let (ip, _) = frame(&mut buf);
        assert_eq!(solve_ipv4_ident(&ip, &buf[34..40], 0), None);
    }
}
