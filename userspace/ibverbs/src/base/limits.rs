//! The limits xroce's engine really has, as ibv_query_device reports them
//! and as create/post verbs enforce them (one definition for both).

/// Work requests per send or receive queue.
pub(crate) const MAX_QP_WR: u32 = 16384;
/// Scatter/gather entries per work request.
pub(crate) const MAX_SGE: u32 = 32;
/// Bytes of inline data per send work request.
pub(crate) const MAX_INLINE_DATA: u32 = 256;
/// Completions a CQ holds.
pub(crate) const MAX_CQE: u32 = 1 << 20;
/// QPs per device (24-bit QPNs above the special ones, as the engine
/// hands them out).
pub(crate) const MAX_QP: u32 = 1 << 17;
/// CQs, PDs, SRQs and AHs per device (a bound for programs that size by
/// it; xroce allocates them from memory).
pub(crate) const MAX_CQ: u32 = 1 << 17;
pub(crate) const MAX_PD: u32 = 1 << 17;
pub(crate) const MAX_SRQ: u32 = 1 << 16;
pub(crate) const MAX_SRQ_WR: u32 = MAX_QP_WR;
pub(crate) const MAX_AH: u32 = 1 << 17;
/// Memory regions: 16-bit key slots, as the engine's key table has.
pub(crate) const MAX_MR: u32 = (1 << 16) - 2;
/// Largest MR (the engine's lengths are 64-bit; rdma-core reports u64).
pub(crate) const MAX_MR_SIZE: u64 = u64::MAX;
/// Outstanding READ/atomic requests per QP, each direction: the engine's
/// own bound, so ibv_query_device reports what modify_qp accepts
/// (max_rd_atomic / max_dest_rd_atomic above it are EINVAL).
pub(crate) const MAX_QP_RD_ATOM: u32 = xroce::verbs::qp::MAX_RD_ATOMIC as u32;
/// Largest message (2 GiB, as rxe and the engine's length check).
pub(crate) const MAX_MSG_SZ: u32 = 1 << 31;
/// Vendor id: neither Mellanox's (0x02c9) nor Amazon's (0x1d0f), so that
/// perftest never takes a vendor-specific path. 0x584f is "XO".
pub(crate) const VENDOR_ID: u32 = 0x584f;
pub(crate) const VENDOR_PART_ID: u32 = 0x0001;
