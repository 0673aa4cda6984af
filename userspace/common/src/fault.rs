//! Loss injection: which RoCEv2 frames the XDP program drops on purpose
//! (a fraction, optionally only some opcode classes or one QP), drawn from
//! a seeded per-CPU sequence when runs must repeat.

use crate::fixed::fixed_hit;
use crate::opcode_class::OpcodeClass;

/// [`FaultConfig::qpn`] value meaning "every QP" (QPNs are 24 bits).
pub const ANY_QPN: u32 = u32::MAX;

/// Loss injection settings: value of a one-entry array map.
///
/// Layout (24 bytes, no implicit padding):
/// `enabled u32 | drop_fixed u32 | opcode_mask u32 | qpn u32 | seed u64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultConfig {
    /// 0: off; 1: on.
    pub enabled: u32,
    /// Fraction of matching RoCEv2 frames to drop, fixed point (2^32 = 1).
    pub drop_fixed: u32,
    /// Bit set of [`OpcodeClass::bit`]s that may be dropped; 0 = all classes.
    pub opcode_mask: u32,
    /// Only frames to this destination QPN (BTH DestQP); [`ANY_QPN`] = all.
    pub qpn: u32,
    /// Seed of the drop decisions' pseudo-random sequence; 0 = use the
    /// kernel's `bpf_get_prandom_u32` (not reproducible). See [`FaultRng`].
    pub seed: u64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            enabled: 0,
            drop_fixed: 0,
            opcode_mask: 0,
            qpn: ANY_QPN,
            seed: 0,
        }
    }
}

impl FaultConfig {
    /// Drop `drop_fixed` of the frames in `opcode_mask` (0 = all) to `qpn`
    /// (`None` = all QPs), with `seed` (0 = unseeded).
    pub const fn new(drop_fixed: u32, opcode_mask: u32, qpn: Option<u32>, seed: u64) -> Self {
        FaultConfig {
            enabled: 1,
            drop_fixed,
            opcode_mask,
            qpn: match qpn {
                Some(q) => q & 0x00ff_ffff,
                None => ANY_QPN,
            },
            seed,
        }
    }
}

// Layouts are part of the kernel/user contract.
const _: () = assert!(core::mem::size_of::<FaultConfig>() == 24);
const _: () = assert!(core::mem::size_of::<FaultRng>() == 16);

// SAFETY: plain #[repr(C)] integers with explicit padding; every bit pattern
// is a valid value.
#[cfg(feature = "user")]
unsafe impl aya::Pod for FaultConfig {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for FaultRng {}

/// Whether the fault injector drops a RoCEv2 frame with BTH `opcode` to
/// destination QP `dest_qpn` (24 bits), given a uniformly random `rand`.
#[inline(always)]
pub fn fault_should_drop(cfg: &FaultConfig, opcode: u8, dest_qpn: u32, rand: u32) -> bool {
    if cfg.enabled == 0 || cfg.drop_fixed == 0 {
        return false;
    }
    if cfg.opcode_mask != 0 && cfg.opcode_mask & OpcodeClass::of(opcode).bit() == 0 {
        return false;
    }
    if cfg.qpn != ANY_QPN && cfg.qpn != dest_qpn & 0x00ff_ffff {
        return false;
    }
    fixed_hit(cfg.drop_fixed, rand)
}

/// Per-CPU state of the seeded drop sequence: value of a per-CPU array map.
///
/// When [`FaultConfig::seed`] is non-zero, the XDP side draws its random
/// numbers with [`FaultRng::next`] instead of `bpf_get_prandom_u32`, so a run
/// with the same seed, traffic and CPU placement drops the same frames. The
/// state reseeds itself when the configured seed changes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FaultRng {
    /// The seed the state was derived from (0 = not seeded yet).
    pub seed: u64,
    /// SplitMix64 state.
    pub state: u64,
}

impl FaultRng {
    /// Next pseudo-random `u32` of the sequence for `seed` on CPU `cpu`
    /// (`bpf_get_smp_processor_id()`), reseeding first if `seed` changed.
    #[inline(always)]
    pub fn next(&mut self, seed: u64, cpu: u32) -> u32 {
        if self.seed != seed {
            self.seed = seed;
            self.state = seed ^ ((cpu as u64) << 32 | 0x5eed);
        }
        // SplitMix64 (Steele, Lea, Flood 2014): one add, three xor-shift-multiplies.
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 32) as u32
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::fixed::{fraction_to_fixed, FIXED_ONE};
    use std::vec::Vec;

    #[test]
    fn fault_filters() {
        let mut cfg = FaultConfig {
            enabled: 1,
            drop_fixed: fraction_to_fixed(0.25),
            ..Default::default()
        };
        assert!(fault_should_drop(&cfg, 0x0a, 7, 0));
        assert!(fault_should_drop(&cfg, 0x0a, 7, (1 << 30) - 1));
        assert!(!fault_should_drop(&cfg, 0x0a, 7, 1 << 30));
        cfg.opcode_mask = OpcodeClass::mask_from_name("write").unwrap();
        assert!(fault_should_drop(&cfg, 0x0a, 7, 0));
        assert!(!fault_should_drop(&cfg, 0x04, 7, 0));
        cfg.qpn = 7;
        assert!(fault_should_drop(&cfg, 0x0a, 7, 0));
        assert!(!fault_should_drop(&cfg, 0x0a, 8, 0));
        // QPN compared on 24 bits.
        assert!(fault_should_drop(&cfg, 0x0a, 0xff00_0007, 0));
        cfg.drop_fixed = FIXED_ONE;
        assert!(fault_should_drop(&cfg, 0x0a, 7, u32::MAX));
        cfg.enabled = 0;
        assert!(!fault_should_drop(&cfg, 0x0a, 7, 0));
    }

    #[test]
    fn seeded_fault_rng_is_reproducible_and_fair() {
        let mut a = FaultRng::default();
        let mut b = FaultRng::default();
        let xs: Vec<u32> = (0..1000).map(|_| a.next(42, 0)).collect();
        let ys: Vec<u32> = (0..1000).map(|_| b.next(42, 0)).collect();
        assert_eq!(xs, ys);
        let mut c = FaultRng::default();
        let zs: Vec<u32> = (0..1000).map(|_| c.next(42, 1)).collect();
        assert_ne!(xs, zs, "CPUs get different sequences");
        // Changing the seed restarts the sequence.
        let first = a.next(7, 0);
        let mut d = FaultRng::default();
        assert_eq!(d.next(7, 0), first);
        // Roughly 1% of 100_000 draws fall under 1%.
        let f = fraction_to_fixed(0.01);
        let mut r = FaultRng::default();
        let hits = (0..100_000).filter(|_| fixed_hit(f, r.next(1, 0))).count();
        assert!((800..1200).contains(&hits), "{hits}");
    }

    #[test]
    fn constructor() {
        let f = FaultConfig::new(1, 2, Some(0x0100_0007), 9);
        assert_eq!((f.enabled, f.qpn, f.seed), (1, 7, 9));
        assert_eq!(FaultConfig::new(1, 0, None, 0).qpn, ANY_QPN);
    }

    #[test]
    fn layouts() {
        assert_eq!(core::mem::offset_of!(FaultConfig, seed), 16);
    }
}
