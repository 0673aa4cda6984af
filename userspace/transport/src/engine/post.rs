//! Posting work: `ibv_post_send` / `ibv_post_recv` checks and WQE creation.

use super::completion::WcStatus;
use super::error::{Result, TransportError};
use super::memory::AccessFlags;
use super::qp::QpCtx;
use super::qp_attr::{QpCap, QpState, QpType};
use super::work::{RecvWr, SendFlags, SendWr, WrOpcode};
use super::wqe::{resolve_sgl, sgl_read, RecvWqe, SendWqe};
use super::Env;

/// What `ibv_post_send` and `ibv_post_recv` check of a QP before a WR is
/// queued, besides the room left in its queues: fixed at creation.
#[derive(Clone, Copy, Debug)]
pub struct PostLimits {
    pub qp_type: QpType,
    pub cap: QpCap,
    pub has_srq: bool,
    /// The path MTU in bytes (UD sends are one packet); 0 before RTR.
    pub mtu: u32,
}

/// The checks of a send WR that fail `ibv_post_send` (its return code, not
/// a completion) for a QP in `state`, with `inline_len` bytes of inline
/// data if it carries them. A pure function, so a poster that queues work
/// without the engine (the verbs layer's post ring) refuses exactly what
/// the engine refuses.
pub fn check_send(
    l: &PostLimits,
    state: QpState,
    wr: &SendWr,
    inline_len: Option<usize>,
) -> Result<()> {
    match state {
        QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
        s => return Err(TransportError::BadQpState(s)),
    }
    if wr.sg_list.len() > l.cap.max_send_sge as usize {
        return Err(TransportError::TooManySge {
            got: wr.sg_list.len(),
            max: l.cap.max_send_sge as usize,
        });
    }
    if l.qp_type == QpType::Uc
        && (wr.opcode.is_read_or_atomic() || matches!(wr.opcode, WrOpcode::SendWithInv { .. }))
    {
        return Err(TransportError::InvalidArgument(
            "UC QPs carry only SEND, SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM",
        ));
    }
    if l.qp_type == QpType::Ud {
        if !matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm { .. }) {
            return Err(TransportError::InvalidArgument(
                "UD QPs carry only SEND and SEND_WITH_IMM",
            ));
        }
        if wr.ud.is_none() {
            return Err(TransportError::InvalidArgument(
                "a UD send needs a destination (SendWr::ud)",
            ));
        }
        let total: u64 = match inline_len {
            Some(n) => n as u64,
            None => wr.sg_list.iter().map(|s| s.length as u64).sum(),
        };
        if total > u64::from(l.mtu) {
            return Err(TransportError::InvalidArgument(
                "UD messages are limited to one path MTU",
            ));
        }
    }
    if let Some(n) = inline_len {
        if wr.opcode.is_read_or_atomic() {
            return Err(TransportError::InvalidArgument(
                "inline data is for SEND and RDMA WRITE, not READ or atomics",
            ));
        }
        if n > l.cap.max_inline_data as usize {
            return Err(TransportError::InlineTooLarge {
                got: n,
                max: l.cap.max_inline_data as usize,
            });
        }
    }
    Ok(())
}

/// The checks of a receive WR that fail `ibv_post_recv`, as [`check_send`].
pub fn check_recv(l: &PostLimits, state: QpState, wr: &RecvWr) -> Result<()> {
    if l.has_srq {
        return Err(TransportError::InvalidArgument(
            "this QP uses a shared receive queue: post to the SRQ",
        ));
    }
    if state == QpState::Reset {
        return Err(TransportError::BadQpState(state));
    }
    if wr.sg_list.len() > l.cap.max_recv_sge as usize {
        return Err(TransportError::TooManySge {
            got: wr.sg_list.len(),
            max: l.cap.max_recv_sge as usize,
        });
    }
    Ok(())
}

impl QpCtx {
    pub(crate) fn post_limits(&self) -> PostLimits {
        PostLimits {
            qp_type: self.qp_type,
            cap: self.cap,
            has_srq: self.srq.is_some(),
            mtu: self.mtu,
        }
    }

    /// Post a send WR. With `inline`, those bytes are the payload (copied
    /// now) and `wr.sg_list` is not read: the C ABI's IBV_SEND_INLINE,
    /// whose SGEs need no lkey.
    pub(crate) fn post_send(
        &mut self,
        env: &mut Env<'_>,
        wr: &SendWr,
        inline_data: Option<&[u8]>,
    ) -> Result<()> {
        check_send(
            &self.post_limits(),
            self.state,
            wr,
            inline_data.map(<[u8]>::len),
        )?;
        if self.sq.len() >= self.cap.max_send_wr as usize {
            return Err(TransportError::QueueFull("send queue"));
        }
        let signaled = self.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let mut w = SendWqe {
            wr_id: wr.wr_id,
            op: wr.opcode,
            flags: wr.flags,
            signaled,
            sges: Vec::new(),
            inline: None,
            len: 0,
            local_err: None,
            started: false,
            first_psn: 0,
            last_psn: 0,
            npkts: 0,
            ud: wr.ud,
        };
        let writes_local = wr.opcode.is_read_or_atomic();
        let inline = wr.flags.contains(SendFlags::INLINE) && !writes_local;
        let need = if writes_local {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::empty()
        };
        if let Some(data) = inline_data {
            w.len = data.len() as u32;
            w.inline = Some(data.to_vec());
            self.sq.push_back(w);
            if self.state == QpState::Err {
                self.enter_error(env);
            }
            return Ok(());
        }
        match resolve_sgl(env.mrs, self.pd, &wr.sg_list, need) {
            Ok((sges, total)) => {
                w.len = total as u32;
                if inline {
                    if total > self.cap.max_inline_data as usize {
                        return Err(TransportError::InlineTooLarge {
                            got: total,
                            max: self.cap.max_inline_data as usize,
                        });
                    }
                    let mut v = vec![0; total];
                    sgl_read(&sges, 0, &mut v);
                    w.inline = Some(v);
                } else {
                    w.sges = sges;
                }
                if wr.opcode.is_atomic() && total < 8 {
                    w.local_err = Some(WcStatus::LocLenErr);
                }
                if wr.opcode.is_atomic() {
                    w.len = 8;
                }
            }
            Err(st) => w.local_err = Some(st),
        }
        self.sq.push_back(w);
        if self.state == QpState::Err {
            self.enter_error(env);
        }
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, env: &mut Env<'_>, wr: &RecvWr) -> Result<()> {
        check_recv(&self.post_limits(), self.state, wr)?;
        if self.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(TransportError::QueueFull("receive queue"));
        }
        self.rq.push_back(RecvWqe::new(env.mrs, self.pd, wr));
        if self.state == QpState::Err {
            self.enter_error(env);
        }
        Ok(())
    }
}
