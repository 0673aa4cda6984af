//! Protection domains (`ibv_pd`).

use super::device::Device;
use super::srq::SharedReceiveQueue;
use crate::engine::error::Result;
use crate::engine::memory::{AccessFlags, MemoryRegion};

/// A protection domain: MRs, QPs and SRQs created from the same PD may be
/// used together; keys from another PD fail their checks.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) id: u32,
    pub(crate) dev: Device,
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("id", &self.id)
            .finish()
    }
}

impl ProtectionDomain {
    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Allocate and register `len` zeroed bytes (8-byte aligned).
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        MemoryRegion::allocate(&self.dev.shared.mrs, self.id, len, access)
    }

    /// `ibv_reg_mr_iova2`: register `len` bytes of the caller's memory at
    /// `addr`, which peers and SGEs name by `iova` (pass `addr as u64` for
    /// `ibv_reg_mr`). Data moves in and out of that memory in place.
    ///
    /// # Safety
    /// `addr..addr+len` stays mapped and writable (readable, if the access
    /// flags allow only reads) until the returned region is dropped, and
    /// the caller keeps the contract of [`crate::engine::memory`]: no access of its own
    /// to bytes an outstanding work request uses.
    pub unsafe fn reg_user_mr(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        // SAFETY: the caller's contract is register_user's.
        unsafe {
            MemoryRegion::register_user(&self.dev.shared.mrs, self.id, addr, len, iova, access)
        }
    }

    /// Register a region initialised with `data`.
    pub fn reg_mr_with(&self, data: &[u8], access: AccessFlags) -> Result<MemoryRegion> {
        let mr = self.reg_mr(data.len(), access)?;
        // SAFETY: the region is new: no work request can use it yet.
        unsafe { mr.write(0, data)? };
        Ok(mr)
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: usize, max_sge: usize) -> SharedReceiveQueue {
        SharedReceiveQueue::new(self.dev.shared.mrs.clone(), self.id, max_wr, max_sge)
    }
}
