//! The data pattern of message slot `slot` of QP `qp`: cheap to make and to
//! check, different for every slot so misplaced data is caught.

pub fn fill(qp: usize, slot: usize, buf: &mut [u8]) {
    let mut x = seed(qp, slot);
    for chunk in buf.chunks_mut(8) {
        x = next(x);
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

pub fn make(qp: usize, slot: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill(qp, slot, &mut v);
    v
}

fn seed(qp: usize, slot: usize) -> u64 {
    0x9e37_79b9_7f4a_7c15 ^ ((qp as u64) << 32) ^ slot as u64
}

/// xorshift64*: statistically fine for test data, a few cycles a word.
fn next(mut x: u64) -> u64 {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn slots_differ_and_are_reproducible() {
        assert_eq!(super::make(1, 2, 100), super::make(1, 2, 100));
        assert_ne!(super::make(1, 2, 100), super::make(1, 3, 100));
        assert_ne!(super::make(0, 2, 100), super::make(1, 2, 100));
    }
}
