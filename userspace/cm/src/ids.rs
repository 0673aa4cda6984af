//! Local comm IDs: unique among live connections, never 0, unpredictable
//! from outside but fixed by the seed (Linux: a cyclic counter XORed with a
//! random operand).

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Debug)]
pub(crate) struct CommIds {
    operand: u32,
    next: u32,
}

impl CommIds {
    /// IDs from `seed`, the first one `first` if given.
    pub(crate) fn new(seed: u64, first: Option<u32>) -> CommIds {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let operand = rng.next_u32();
        let next = rng.next_u32() & 0xffff;
        CommIds {
            operand: first.map_or(operand, |f| f ^ next),
            next,
        }
    }

    /// The next ID for which `in_use` is false.
    pub(crate) fn allocate(&mut self, in_use: impl Fn(u32) -> bool) -> u32 {
        loop {
            let id = self.next ^ self.operand;
            self.next = self.next.wrapping_add(1);
            if id != 0 && !in_use(id) {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CommIds;

    #[test]
    fn ids_are_seeded_distinct_and_never_zero() {
        let mut a = CommIds::new(7, None);
        let mut b = CommIds::new(7, None);
        let xs: Vec<u32> = (0..1000).map(|_| a.allocate(|_| false)).collect();
        let ys: Vec<u32> = (0..1000).map(|_| b.allocate(|_| false)).collect();
        assert_eq!(xs, ys);
        let mut sorted = xs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 1000);
        assert!(!xs.contains(&0));
        assert_ne!(CommIds::new(8, None).allocate(|_| false), xs[0]);
    }

    #[test]
    fn first_id_and_skipping_ids_in_use() {
        let mut ids = CommIds::new(1, Some(0x7b30_3a2b));
        assert_eq!(ids.allocate(|_| false), 0x7b30_3a2b);
        let second = CommIds::new(1, Some(0x7b30_3a2b)).allocate(|id| id == 0x7b30_3a2b);
        assert_ne!(second, 0x7b30_3a2b);
        assert_eq!(second, ids.allocate(|_| false));
    }
}
