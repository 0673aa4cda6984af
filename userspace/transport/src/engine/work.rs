//! Work requests the engine executes (`ibv_send_wr`, `ibv_recv_wr`, `ibv_sge`).

use super::completion::WcOpcode;

/// One scatter/gather element (`ibv_sge`): `addr` is an address inside the
/// MR named by `lkey` (see [`super::memory::MemoryRegion::sge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

bitflags::bitflags! {
    /// `ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for all prior READ/atomic operations to complete first.
        const FENCE = 1;
        /// Generate a work completion on success.
        const SIGNALED = 2;
        /// Set the solicited-event bit.
        const SOLICITED = 4;
        /// Copy the data at post time (sg_list addresses are then read
        /// immediately; no lkey check).
        const INLINE = 8;
    }
}

/// The operation of a send work request (`ibv_wr_opcode` plus its fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOpcode {
    Send,
    SendWithImm {
        imm: u32,
    },
    SendWithInv {
        invalidate_rkey: u32,
    },
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    RdmaWriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
    AtomicCmpAndSwp {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    AtomicFetchAndAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
}

impl WrOpcode {
    /// The opcode of the work completion this request ends with.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm { .. } | WrOpcode::SendWithInv { .. } => {
                WcOpcode::Send
            }
            WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
        }
    }
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead { .. }
                | WrOpcode::AtomicCmpAndSwp { .. }
                | WrOpcode::AtomicFetchAndAdd { .. }
        )
    }
    pub fn is_atomic(&self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp { .. } | WrOpcode::AtomicFetchAndAdd { .. }
        )
    }
}

/// Destination of a UD send (`wr.ud` of `ibv_send_wr`: ah, remote_qpn,
/// remote_qkey).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdAddress {
    pub av: super::qp_attr::AddressVector,
    pub remote_qpn: u32,
    /// Q_Key to send with; a value with the high bit set means "use the
    /// QP's own Q_Key" (IBTA 10.2.5).
    pub remote_qkey: u32,
}

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub sg_list: Vec<Sge>,
    pub flags: SendFlags,
    /// Required on UD QPs, ignored otherwise.
    pub ud: Option<UdAddress>,
}

impl SendWr {
    pub fn new(wr_id: u64, opcode: WrOpcode, sg_list: Vec<Sge>) -> Self {
        Self {
            wr_id,
            opcode,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }
    /// Set the UD destination.
    pub fn ud(mut self, ud: UdAddress) -> Self {
        self.ud = Some(ud);
        self
    }
    pub fn flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg_list: Vec<Sge>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wr_opcode_completes_with_its_wc_opcode() {
        let (remote_addr, rkey) = (0x1000, 7);
        let cases = [
            (WrOpcode::Send, WcOpcode::Send),
            (WrOpcode::SendWithImm { imm: 1 }, WcOpcode::Send),
            (WrOpcode::SendWithInv { invalidate_rkey: 2 }, WcOpcode::Send),
            (
                WrOpcode::RdmaWrite { remote_addr, rkey },
                WcOpcode::RdmaWrite,
            ),
            (
                WrOpcode::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm: 3,
                },
                WcOpcode::RdmaWrite,
            ),
            (WrOpcode::RdmaRead { remote_addr, rkey }, WcOpcode::RdmaRead),
            (
                WrOpcode::AtomicCmpAndSwp {
                    remote_addr,
                    rkey,
                    compare: 4,
                    swap: 5,
                },
                WcOpcode::CompSwap,
            ),
            (
                WrOpcode::AtomicFetchAndAdd {
                    remote_addr,
                    rkey,
                    add: 6,
                },
                WcOpcode::FetchAdd,
            ),
        ];
        for (wr, wc) in cases {
            assert_eq!(wr.wc_opcode(), wc, "{wr:?}");
        }
    }
}
