//! Protection domains (`ibv_pd`).

use super::device::Device;
use super::error::Result;
use super::mr::{AccessFlags, MemoryRegion};
use super::srq::SharedReceiveQueue;

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

    /// `ibv_reg_mr`: allocate and register `len` zeroed bytes.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        MemoryRegion::register(&self.dev.shared.mrs, self.id, len, access)
    }

    /// Register a region initialised with `data`.
    pub fn reg_mr_with(&self, data: &[u8], access: AccessFlags) -> Result<MemoryRegion> {
        let mr = self.reg_mr(data.len(), access)?;
        mr.write(0, data)?;
        Ok(mr)
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: usize, max_sge: usize) -> SharedReceiveQueue {
        SharedReceiveQueue::new(self.dev.shared.mrs.clone(), self.id, max_wr, max_sge)
    }
}
