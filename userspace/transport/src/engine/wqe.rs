//! Work queue entries: send and receive WQEs with their scatter/gather
//! lists resolved to MRs at post time, and copies in and out of those lists.

use std::sync::Arc;

use super::completion::WcStatus;
use super::gather::Gather;
use super::memory::{AccessFlags, MrInner, MrTable};
use super::work::{RecvWr, SendFlags, Sge, UdAddress, WrOpcode};

/// A local SGE resolved to its MR at post time (the Arc keeps the memory
/// alive if the MR is deregistered while the WR is in flight).
#[derive(Clone)]
pub(crate) struct LSge {
    pub mr: Arc<MrInner>,
    pub off: usize,
    pub len: usize,
}

/// Resolve and check a local SGL. Returns `Err(status)` for a WC error.
pub(crate) fn resolve_sgl(
    mrs: &MrTable,
    pd: u32,
    sgl: &[Sge],
    need: AccessFlags,
) -> core::result::Result<(Vec<LSge>, usize), WcStatus> {
    let mut out = Vec::with_capacity(sgl.len());
    let mut total = 0usize;
    for s in sgl {
        if s.length == 0 {
            continue;
        }
        let mr = mrs.by_lkey(s.lkey).ok_or(WcStatus::LocProtErr)?;
        let off = mr
            .check(pd, s.addr, s.length as u64, need)
            .map_err(|_| WcStatus::LocProtErr)?;
        total += s.length as usize;
        out.push(LSge {
            mr,
            off,
            len: s.length as usize,
        });
    }
    if total > (1 << 31) {
        return Err(WcStatus::LocLenErr);
    }
    Ok((out, total))
}

/// Copy `dst.len()` bytes starting at byte `offset` of the SGL into `dst`;
/// false if the SGL is shorter or an MR was deregistered.
pub(crate) fn sgl_read(sges: &[LSge], mut offset: usize, dst: &mut [u8]) -> bool {
    let mut done = 0;
    for s in sges {
        if done == dst.len() {
            break;
        }
        if offset >= s.len {
            offset -= s.len;
            continue;
        }
        if !s.mr.is_valid() {
            return false;
        }
        let n = (s.len - offset).min(dst.len() - done);
        s.mr.read_at(s.off + offset, &mut dst[done..done + n]);
        done += n;
        offset = 0;
    }
    done == dst.len()
}

/// Copy `src` into the SGL starting at byte `offset`; false if it does not fit
/// or an MR was deregistered.
pub(crate) fn sgl_write(sges: &[LSge], mut offset: usize, src: &[u8]) -> bool {
    let mut done = 0;
    for s in sges {
        if done == src.len() {
            break;
        }
        if offset >= s.len {
            offset -= s.len;
            continue;
        }
        if !s.mr.is_valid() {
            return false;
        }
        let n = (s.len - offset).min(src.len() - done);
        s.mr.write_at(s.off + offset, &src[done..done + n]);
        done += n;
        offset = 0;
    }
    done == src.len()
}

pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub op: WrOpcode,
    pub flags: SendFlags,
    pub signaled: bool,
    pub sges: Vec<LSge>,
    /// Inline payload (copied at post time).
    pub inline: Option<Vec<u8>>,
    pub len: u32,
    pub local_err: Option<WcStatus>,
    pub started: bool,
    pub first_psn: u32,
    pub last_psn: u32,
    pub npkts: u32,
    /// UD destination.
    pub ud: Option<UdAddress>,
}

impl SendWqe {
    pub fn read_payload(&self, offset: usize, dst: &mut [u8]) -> bool {
        match &self.inline {
            Some(v) => match v.get(offset..offset + dst.len()) {
                Some(s) => {
                    dst.copy_from_slice(s);
                    true
                }
                None => false,
            },
            None => sgl_read(&self.sges, offset, dst),
        }
    }

    /// Notes in `g` where the `len` payload bytes from byte `offset` are
    /// in the WR's MRs (a gathered send, [`super::gather`]), after `g`
    /// was started at their place in the datagram's buffer; false (and
    /// `g` cleared) when they are to be copied instead: inline data, more
    /// pieces than a datagram may have, a deregistered MR (the copy then
    /// says so).
    pub(crate) fn gather_payload(&self, mut offset: usize, len: usize, g: &mut Gather) -> bool {
        if self.inline.is_some() {
            return false;
        }
        let mut left = len;
        for s in &self.sges {
            if left == 0 {
                break;
            }
            if offset >= s.len {
                offset -= s.len;
                continue;
            }
            let n = (s.len - offset).min(left);
            if !s.mr.is_valid() || !g.push(&s.mr, s.off + offset, n) {
                g.clear();
                return false;
            }
            left -= n;
            offset = 0;
        }
        if left != 0 {
            g.clear();
        }
        left == 0
    }

    /// A started RDMA READ whose response PSNs include `p`.
    pub(crate) fn is_read_holding(&self, p: u32) -> bool {
        matches!(self.op, WrOpcode::RdmaRead { .. })
            && self.started
            && xroce_wire::psn_le(self.first_psn, p)
            && xroce_wire::psn_le(p, self.last_psn)
    }
}

pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: Vec<LSge>,
    pub len: usize,
    pub local_err: Option<WcStatus>,
}

impl RecvWqe {
    pub(crate) fn new(mrs: &MrTable, pd: u32, wr: &RecvWr) -> Self {
        match resolve_sgl(mrs, pd, &wr.sg_list, AccessFlags::LOCAL_WRITE) {
            Ok((sges, len)) => Self {
                wr_id: wr.wr_id,
                sges,
                len,
                local_err: None,
            },
            Err(st) => Self {
                wr_id: wr.wr_id,
                sges: Vec::new(),
                len: 0,
                local_err: Some(st),
            },
        }
    }
}
