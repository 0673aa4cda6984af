//! What the engine is configured with, who it talks to, and what it sends.

use xroce_wire::mad::{GSI_QPN, MAD_LEN};
use xroce_wire::Gid;

/// The CM's response timeout Linux advertises (20: 4.096 µs × 2^20 ≈ 4.3 s).
pub const DEFAULT_CM_RESPONSE_TIMEOUT: u8 = 20;
/// Linux's `CMA_MAX_CM_RETRIES`.
pub const DEFAULT_MAX_CM_RETRIES: u8 = 15;

/// One engine's identity and the seed of its comm IDs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmConfig {
    /// The GIDs of the port; a REQ naming another GID as ours is rejected.
    pub local_gids: Vec<Gid>,
    /// Our CA GUID (REQ/REP's local CA GUID).
    pub ca_guid: u64,
    /// Seeds the comm-ID generator: one seed, the same IDs.
    pub seed: u64,
    /// The high 32 bits of every transaction ID we start (Linux: the MAD
    /// agent's; the low 32 bits are the local comm ID as stored in memory,
    /// i.e. byte-swapped on a little-endian host).
    pub tid_high: u32,
    /// The first comm ID to hand out (later ones follow from it and the
    /// seed); `None`: from the seed alone. For replaying a capture.
    pub first_comm_id: Option<u32>,
}

impl CmConfig {
    pub fn new(local_gids: Vec<Gid>, ca_guid: u64, seed: u64) -> CmConfig {
        CmConfig {
            local_gids,
            ca_guid,
            seed,
            tid_high: 1,
            first_comm_id: None,
        }
    }
}

/// A peer's GSI QP as the receive completion names it: source GID, source
/// QPN (1 for ib_cm) and P_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    pub gid: Gid,
    pub qpn: u32,
    pub pkey: u16,
}

impl PeerAddr {
    /// The peer's GSI QP at `gid`, default P_Key.
    pub const fn gsi(gid: Gid) -> PeerAddr {
        PeerAddr {
            gid,
            qpn: GSI_QPN,
            pkey: 0xffff,
        }
    }
}

/// A MAD to send from `local_gid`'s GSI QP to `peer` (UD SEND, Q_Key
/// 0x80010000).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub local_gid: Gid,
    pub peer: PeerAddr,
    pub mad: [u8; MAD_LEN],
}

/// The IBTA's timeout encoding: 4.096 µs × 2^`exp` (exponents above 31 are
/// clamped to 31), in nanoseconds.
pub const fn timeout_ns(exp: u8) -> u64 {
    let e = if exp > 31 { 31 } else { exp };
    4096u64 << e
}

#[cfg(test)]
mod tests {
    use super::timeout_ns;

    #[test]
    fn ibta_timeout_encoding() {
        assert_eq!(timeout_ns(0), 4_096);
        // Linux's CM response timeout 20: 4.29 s.
        assert_eq!(timeout_ns(20), 4_294_967_296);
        assert_eq!(timeout_ns(19), 2_147_483_648);
        assert_eq!(timeout_ns(40), timeout_ns(31));
    }
}
