//! Posting work: `ibv_post_send` / `ibv_post_recv` checks and WQE creation.

use super::completion::WcStatus;
use super::error::{Result, TransportError};
use super::memory::AccessFlags;
use super::qp::QpCtx;
use super::qp_attr::{QpState, QpType};
use super::work::{RecvWr, SendFlags, SendWr, WrOpcode};
use super::wqe::{resolve_sgl, sgl_read, RecvWqe, SendWqe};
use super::Env;

impl QpCtx {
    /// Post a send WR. With `inline`, those bytes are the payload (copied
    /// now) and `wr.sg_list` is not read: the C ABI's IBV_SEND_INLINE,
    /// whose SGEs need no lkey.
    pub(crate) fn post_send(
        &mut self,
        env: &mut Env<'_>,
        wr: &SendWr,
        inline_data: Option<&[u8]>,
    ) -> Result<()> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
            s => return Err(TransportError::BadQpState(s)),
        }
        if self.sq.len() >= self.cap.max_send_wr as usize {
            return Err(TransportError::QueueFull("send queue"));
        }
        if wr.sg_list.len() > self.cap.max_send_sge as usize {
            return Err(TransportError::TooManySge {
                got: wr.sg_list.len(),
                max: self.cap.max_send_sge as usize,
            });
        }
        if self.qp_type == QpType::Uc
            && (wr.opcode.is_read_or_atomic() || matches!(wr.opcode, WrOpcode::SendWithInv { .. }))
        {
            return Err(TransportError::InvalidArgument(
                "UC QPs carry only SEND, SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM",
            ));
        }
        if self.qp_type == QpType::Ud {
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
            let total: u64 = match inline_data {
                Some(d) => d.len() as u64,
                None => wr.sg_list.iter().map(|s| s.length as u64).sum(),
            };
            if total > self.mtu as u64 {
                return Err(TransportError::InvalidArgument(
                    "UD messages are limited to one path MTU",
                ));
            }
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
            if writes_local {
                return Err(TransportError::InvalidArgument(
                    "inline data is for SEND and RDMA WRITE, not READ or atomics",
                ));
            }
            if data.len() > self.cap.max_inline_data as usize {
                return Err(TransportError::InlineTooLarge {
                    got: data.len(),
                    max: self.cap.max_inline_data as usize,
                });
            }
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
        if self.srq.is_some() {
            return Err(TransportError::InvalidArgument(
                "this QP uses a shared receive queue: post to the SRQ",
            ));
        }
        if self.state == QpState::Reset {
            return Err(TransportError::BadQpState(self.state));
        }
        if self.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(TransportError::QueueFull("receive queue"));
        }
        if wr.sg_list.len() > self.cap.max_recv_sge as usize {
            return Err(TransportError::TooManySge {
                got: wr.sg_list.len(),
                max: self.cap.max_recv_sge as usize,
            });
        }
        self.rq.push_back(RecvWqe::new(env.mrs, self.pd, wr));
        if self.state == QpState::Err {
            self.enter_error(env);
        }
        Ok(())
    }
}
