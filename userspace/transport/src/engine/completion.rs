//! Work completions (`ibv_wc`) and how they leave the engine: as
//! [`Completion`] values naming their CQ by [`CqId`], which whoever holds
//! the engine drains ([`super::Engine::take_completions`]) into its
//! completion queues, in order.

/// `ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    #[default]
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    WrFlushErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    FatalErr,
    GeneralErr,
}

/// `ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    #[default]
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    Recv,
    RecvRdmaWithImm,
}

bitflags::bitflags! {
    /// `ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// UD receive: the first 40 bytes of the buffer hold the GRH (for
        /// RoCEv2/IPv4: the IPv4 header in bytes 20..40).
        const GRH = 1;
        const WITH_IMM = 2;
        const WITH_INV = 4;
        /// Receive: the message's last packet had the solicited-event bit
        /// (decides `ibv_req_notify_cq(cq, 1)`).
        const SOLICITED = 8;
    }
}

/// The network header a UD receive found in front of its payload, which
/// its GRH area holds (the kernel's `wc->network_hdr_type`; see
/// [`super::ud`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NetworkHdr {
    /// Not a UD receive (no GRH).
    #[default]
    None,
    /// RoCEv2 over IPv4: the IPv4 header in bytes 20..40.
    Ipv4,
    /// RoCEv2 over IPv6: the IPv6 header in bytes 0..40.
    Ipv6,
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    /// Valid when `flags` has WITH_IMM (host order).
    pub imm_data: u32,
    /// Valid when `flags` has WITH_INV.
    pub invalidated_rkey: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub flags: WcFlags,
    /// UD receive with `flags` GRH: which header the GRH area holds.
    pub network_hdr: NetworkHdr,
}

/// Names a completion queue to the engine. The engine only tags
/// completions with it; the layer that owns the CQs (verbs) maps it to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CqId(pub u32);

/// A work completion on its way out of the engine, bound for CQ `cq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub cq: CqId,
    pub wc: Wc,
}
