//! Helpers shared by the engine integration tests.

/// Deterministic bytes for `seed`: what a transfer must deliver exactly.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    // xorshift64*: cheap even in debug builds.
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}
