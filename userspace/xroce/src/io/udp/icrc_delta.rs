//! Updating a frame's ICRC for the headers the kernel will send instead of
//! computing it again over the whole datagram.
//!
//! The engine's frame carries a correct ICRC over the IP/UDP headers it
//! wrote; the kernel sends other values in a few header fields (the IPv4 id
//! of a GSO segment, the socket's source port). CRC-32 is affine over GF(2):
//! for two messages `x`, `y` of one length, `crc(x) ^ crc(y)` is the CRC
//! register (started at 0, no final inversion) after `x ^ y`. Here `x ^ y`
//! is non-zero only in the first bytes (the headers) and zero over the
//! `rest` bytes behind them, so the change is the register after the
//! header difference, advanced over `rest` zero bytes; advancing over zeros
//! is linear in the register, a 32x32 bit matrix per `rest`, built once (32
//! CRC passes over `rest` zeros) and kept for the few lengths a stream uses.
//! Per frame: one CRC over ~50 header bytes and a matrix product, instead
//! of one over the datagram.

/// Lengths under this are cheap to recompute; no matrix for them.
pub(super) const MIN_REST: usize = 256;
/// Matrices kept (a WRITE stream uses FIRST, MIDDLE and LAST lengths).
const SLOTS: usize = 8;

/// CRC register (start 0, no final inversion) after `data`.
fn raw_crc(reg: u32, data: &[u8]) -> u32 {
    // crc32fast keeps the register inverted.
    let mut h = crc32fast::Hasher::new_with_initial(!reg);
    h.update(data);
    !h.finalize()
}

/// Matrices of the zero-byte advance for recently used lengths.
pub(super) struct IcrcDelta {
    /// (rest, column j = register 1 << j advanced over `rest` zero bytes).
    slots: Vec<(usize, [u32; 32])>,
    next: usize,
    /// A length missed once; built when it misses again (a length seen
    /// once costs one plain CRC, not 32).
    candidate: usize,
    zeros: Vec<u8>,
}

impl IcrcDelta {
    pub(super) fn new(max_len: usize) -> Self {
        Self {
            slots: Vec::with_capacity(SLOTS),
            next: 0,
            candidate: usize::MAX,
            zeros: vec![0; max_len],
        }
    }

    /// The matrix for `rest` zero bytes, built if asked for the second
    /// time in a row of misses; `None`: compute the ICRC in full.
    fn matrix(&mut self, rest: usize) -> Option<&[u32; 32]> {
        if rest < MIN_REST || rest > self.zeros.len() {
            return None;
        }
        if let Some(i) = self.slots.iter().position(|s| s.0 == rest) {
            return Some(&self.slots[i].1);
        }
        if self.candidate != rest {
            self.candidate = rest;
            return None;
        }
        let zeros = &self.zeros[..rest];
        let mut m = [0u32; 32];
        for (j, col) in m.iter_mut().enumerate() {
            *col = raw_crc(1 << j, zeros);
        }
        let i = if self.slots.len() < SLOTS {
            self.slots.push((rest, m));
            self.slots.len() - 1
        } else {
            let i = self.next;
            self.slots[i] = (rest, m);
            self.next = (i + 1) % SLOTS;
            i
        };
        Some(&self.slots[i].1)
    }

    /// The ICRC of a message whose first `old.len()` bytes change from
    /// `old` to `new` (both as the ICRC sees them: masked), followed by
    /// `rest` unchanged bytes, given its ICRC `icrc` before the change;
    /// `None` when a full computation is cheaper.
    pub(super) fn update(&mut self, icrc: u32, old: &[u8], new: &[u8], rest: usize) -> Option<u32> {
        debug_assert_eq!(old.len(), new.len());
        let mut diff = [0u8; 64];
        let d = diff.get_mut(..old.len())?;
        for ((d, a), b) in d.iter_mut().zip(old).zip(new) {
            *d = a ^ b;
        }
        let reg = raw_crc(0, d);
        if reg == 0 {
            return Some(icrc);
        }
        let m = self.matrix(rest)?;
        let mut change = 0;
        let mut bits = reg;
        while bits != 0 {
            let j = bits.trailing_zeros();
            change ^= m[j as usize];
            bits &= bits - 1;
        }
        Some(icrc ^ change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crc(data: &[u8]) -> u32 {
        crc32fast::hash(data)
    }

    #[test]
    fn a_header_change_moves_the_crc_as_a_full_pass_does() {
        let mut d = IcrcDelta::new(4096);
        for rest in [256usize, 300, 2048, 4000] {
            let mut msg: Vec<u8> = (0..48 + rest).map(|i| (i * 7 + 3) as u8).collect();
            let before = crc(&msg);
            let old = msg[..48].to_vec();
            // An IPv4 id and a UDP source port changed.
            msg[12] ^= 0x01;
            msg[13] = 0x2a;
            msg[36] = 0xc1;
            msg[37] = 0x77;
            let after = crc(&msg);
            // The first miss of a length asks for a full pass.
            assert_eq!(d.update(before, &old, &msg[..48], rest), None);
            assert_eq!(d.update(before, &old, &msg[..48], rest), Some(after));
            // Unchanged headers: the same ICRC at any length.
            assert_eq!(d.update(before, &old, &old, 7), Some(before));
        }
        // Short rests are recomputed.
        assert_eq!(d.update(1, &[0; 48], &[1; 48], 100), None);
        assert_eq!(d.update(1, &[0; 48], &[1; 48], 100), None);
    }

    #[test]
    fn matrices_are_replaced_round_robin() {
        let mut d = IcrcDelta::new(2048);
        for rest in 300..300 + 2 * SLOTS {
            d.matrix(rest);
            assert!(d.matrix(rest).is_some());
        }
        assert_eq!(d.slots.len(), SLOTS);
        assert!(d.slots.iter().any(|s| s.0 == 300 + 2 * SLOTS - 1));
        assert!(!d.slots.iter().any(|s| s.0 == 300));
    }
}
