//! The GSI QP of one device and what it needs: a completion channel and
//! one CQ, registered receive buffers (GRH + MAD) kept posted, registered
//! send buffers, and the address handles of the peers. Only the agent's
//! thread uses a [`Gsi`] once it is made.
//!
//! QP1 comes from xroce's private libibverbs entry point
//! `xroce_create_gsi_qp` (version node XROCE_PRIVATE_1), looked up at run
//! time: under another libibverbs there is no GSI QP to drive.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::os::fd::RawFd;

use xroce_cm::Transmit;
use xroce_wire::mad::{GSI_QKEY, MAD_LEN};
use xroce_wire::Gid;

use super::grh::GRH_LEN;
use crate::abi::*;
use crate::base::errno::fail;
use crate::base::verbs::*;
use crate::objects::devices::{Device, PORT};

/// Receive buffers kept posted.
pub(super) const RECV_BUFFERS: u32 = 64;
/// Send buffers (every send is signalled and returns its buffer).
pub(super) const SEND_BUFFERS: u32 = 64;
/// One receive buffer: the GRH area, then the MAD.
pub(super) const RECV_LEN: usize = GRH_LEN + MAD_LEN;
/// Receive and send completions together.
const CQ_ENTRIES: c_int = (RECV_BUFFERS + SEND_BUFFERS) as c_int;
/// The hop limit of our MADs (rdma_cm's default).
const HOP_LIMIT: u8 = 64;

/// `struct ibv_qp *xroce_create_gsi_qp(struct ibv_pd *, struct ibv_qp_init_attr *)`.
type CreateGsiQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;

// The libibverbs calls librdmacm's other modules do not need.
#[link(name = "ibverbs")]
extern "C" {
    fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr;
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah;
    fn ibv_get_cq_event(
        channel: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int;
    fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint);
}

/// What a work request ID names: receive buffer or send buffer `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WrId {
    Recv(u32),
    Send(u32),
}

const SEND_TAG: u64 = 1 << 32;

impl WrId {
    pub(super) fn encode(self) -> u64 {
        match self {
            WrId::Recv(n) => u64::from(n),
            WrId::Send(n) => SEND_TAG | u64::from(n),
        }
    }
    pub(super) fn decode(wr_id: u64) -> WrId {
        if wr_id & SEND_TAG != 0 {
            WrId::Send(wr_id as u32)
        } else {
            WrId::Recv(wr_id as u32)
        }
    }
}

/// A registered buffer of `count` slots of `len` bytes, alive for the
/// process (the agent never stops).
struct Buffers {
    base: *mut u8,
    len: usize,
    count: u32,
    mr: *mut ibv_mr,
}

impl Buffers {
    fn new(pd: *mut ibv_pd, len: usize, count: u32, access: c_int) -> Result<Buffers, i32> {
        let total = len * count as usize;
        let base = Box::leak(vec![0u8; total].into_boxed_slice()).as_mut_ptr();
        // SAFETY: a live PD and `total` bytes leaked above, never freed
        // while registered.
        let mr = unsafe { ibv_reg_mr(pd, base.cast(), total, access) };
        if mr.is_null() {
            let e = crate::base::errno::errno();
            // SAFETY: the allocation leaked above, not registered.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(base, total)) });
            return Err(e);
        }
        Ok(Buffers {
            base,
            len,
            count,
            mr,
        })
    }

    fn slot(&self, n: u32) -> *mut u8 {
        assert!(n < self.count, "buffer {n} of {}", self.count);
        // SAFETY: within the allocation (checked above).
        unsafe { self.base.add(n as usize * self.len) }
    }

    fn sge(&self, n: u32, length: usize) -> ibv_sge {
        ibv_sge {
            addr: self.slot(n) as u64,
            length: length as u32,
            // SAFETY: the MR registered in `new`.
            lkey: unsafe { (*self.mr).lkey },
        }
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: the MR of `new`, deregistered once; then nobody uses the
        // memory (only a Gsi that failed to start is ever dropped).
        unsafe {
            ibv_dereg_mr(self.mr);
            let total = self.len * self.count as usize;
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.base, total,
            )));
        }
    }
}

pub(super) struct Gsi {
    pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    recv: Option<Buffers>,
    send: Option<Buffers>,
}

// SAFETY: libibverbs objects are thread-safe; the buffers are only
// touched by the one thread that owns the Gsi (and the device, which
// fills receive buffers between post and completion).
unsafe impl Send for Gsi {}

/// xroce's `xroce_create_gsi_qp`, if the libibverbs in the process has it.
fn create_gsi_qp_fn() -> Option<CreateGsiQp> {
    const NAME: &CStr = c"xroce_create_gsi_qp";
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the
    // process's global scope.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, NAME.as_ptr()) };
    // SAFETY: xroce's libibverbs exports the symbol with this signature.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, CreateGsiQp>(p) })
}

impl Gsi {
    /// Makes the GSI QP of `dev` and brings it to RTS with every receive
    /// buffer posted. What was made is undone on failure.
    pub(super) fn open(dev: &Device) -> Result<Gsi, i32> {
        let create = create_gsi_qp_fn().ok_or_else(|| {
            fail(
                libc::ENOSYS,
                "xroce's librdmacm needs xroce's libibverbs (xroce_create_gsi_qp is missing: \
                 run the program under `xroce run`)",
            )
        })?;
        let mut g = Gsi {
            pd: dev.default_pd()?,
            channel: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            recv: None,
            send: None,
        };
        let errno_or = |what: &str| {
            let e = crate::base::errno::errno();
            fail(
                if e == 0 { libc::EIO } else { e },
                format_args!("CM agent of {}: {what} failed", dev.name),
            )
        };
        // SAFETY: an open context.
        g.channel = unsafe { ibv_create_comp_channel(dev.context) };
        if g.channel.is_null() {
            return Err(errno_or("ibv_create_comp_channel"));
        }
        // SAFETY: the channel's pollable fd; the agent drains it without
        // blocking.
        unsafe { set_nonblocking((*g.channel).fd) }?;
        // SAFETY: an open context and the channel made above.
        g.cq =
            unsafe { ibv_create_cq(dev.context, CQ_ENTRIES, std::ptr::null_mut(), g.channel, 0) };
        if g.cq.is_null() {
            return Err(errno_or("ibv_create_cq"));
        }
        let mut init = ibv_qp_init_attr {
            send_cq: g.cq,
            recv_cq: g.cq,
            cap: ibv_qp_cap {
                max_send_wr: SEND_BUFFERS,
                max_recv_wr: RECV_BUFFERS,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_UD,
            sq_sig_all: 1,
            ..Default::default()
        };
        // SAFETY: xroce's entry point with a live PD and a filled attr.
        g.qp = unsafe { create(g.pd, &mut init) };
        if g.qp.is_null() {
            // EBUSY: another process holds QP1 (the agent then uses its relay).
            return Err(errno_or("xroce_create_gsi_qp"));
        }
        g.to_rts().map_err(|e| {
            fail(
                e,
                format_args!("CM agent of {}: GSI QP to RTS failed", dev.name),
            )
        })?;
        g.send = Some(
            Buffers::new(g.pd, MAD_LEN, SEND_BUFFERS, 0)
                .map_err(|e| fail(e, "CM agent: ibv_reg_mr of the send buffers failed"))?,
        );
        g.recv = Some(
            Buffers::new(
                g.pd,
                RECV_LEN,
                RECV_BUFFERS,
                IBV_ACCESS_LOCAL_WRITE as c_int,
            )
            .map_err(|e| fail(e, "CM agent: ibv_reg_mr of the receive buffers failed"))?,
        );
        for n in 0..RECV_BUFFERS {
            g.post_recv(n)
                .map_err(|e| fail(e, "CM agent: posting a receive buffer failed"))?;
        }
        g.request_notify()?;
        Ok(g)
    }

    fn to_rts(&self) -> Result<(), i32> {
        let steps = [
            (
                ibv_qp_attr {
                    qp_state: IBV_QPS_INIT,
                    pkey_index: 0,
                    port_num: PORT,
                    qkey: GSI_QKEY,
                    ..Default::default()
                },
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
            ),
            (
                ibv_qp_attr {
                    qp_state: IBV_QPS_RTR,
                    ..Default::default()
                },
                IBV_QP_STATE,
            ),
            (
                ibv_qp_attr {
                    qp_state: IBV_QPS_RTS,
                    sq_psn: 0,
                    ..Default::default()
                },
                IBV_QP_STATE | IBV_QP_SQ_PSN,
            ),
        ];
        for (mut attr, mask) in steps {
            // SAFETY: our QP and a filled attr.
            let rc = unsafe { ibv_modify_qp(self.qp, &mut attr, mask as c_int) };
            if rc != 0 {
                return Err(rc);
            }
        }
        Ok(())
    }

    /// The completion channel's fd (readable when a CQ event is queued).
    pub(super) fn channel_fd(&self) -> RawFd {
        // SAFETY: the channel made in `open`.
        unsafe { (*self.channel).fd }
    }

    fn request_notify(&self) -> Result<(), i32> {
        // SAFETY: our CQ; the op table of its context is libibverbs'.
        let rc = unsafe {
            let ops = &(*(*self.cq).context).ops;
            (ops.req_notify_cq.expect("libibverbs fills req_notify_cq"))(self.cq, 0)
        };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// Takes and acknowledges the queued CQ events and re-arms the CQ.
    pub(super) fn take_cq_events(&self) {
        let mut acked: c_uint = 0;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: our channel, set non-blocking in `open`.
            if unsafe { ibv_get_cq_event(self.channel, &mut cq, &mut ctx) } != 0 {
                break;
            }
            acked += 1;
        }
        if acked > 0 {
            // SAFETY: the events taken above, all of our one CQ.
            unsafe { ibv_ack_cq_events(self.cq, acked) };
        }
        let _ = self.request_notify();
    }

    /// Polls up to `wcs.len()` completions; how many were filled.
    pub(super) fn poll(&self, wcs: &mut [ibv_wc]) -> usize {
        // SAFETY: our CQ and room for `wcs.len()` completions.
        let n = unsafe {
            let ops = &(*(*self.cq).context).ops;
            (ops.poll_cq.expect("libibverbs fills poll_cq"))(
                self.cq,
                wcs.len() as c_int,
                wcs.as_mut_ptr(),
            )
        };
        n.max(0) as usize
    }

    /// The GRH area and the MAD bytes `byte_len` of a completion covers,
    /// of receive buffer `n` (valid until it is posted again).
    pub(super) fn received(&self, n: u32, byte_len: u32) -> (&[u8; GRH_LEN], &[u8]) {
        let recv = self.recv.as_ref().expect("made in open");
        let len = (byte_len as usize).clamp(GRH_LEN, RECV_LEN);
        // SAFETY: buffer n's RECV_LEN bytes, which the device filled and
        // no longer writes (the completion was polled, not reposted yet).
        let bytes = unsafe { std::slice::from_raw_parts(recv.slot(n), RECV_LEN) };
        let (grh, mad) = bytes.split_at(GRH_LEN);
        (
            grh.try_into().expect("GRH_LEN bytes"),
            &mad[..len - GRH_LEN],
        )
    }

    pub(super) fn post_recv(&self, n: u32) -> Result<(), i32> {
        let recv = self.recv.as_ref().expect("made in open");
        let mut sge = recv.sge(n, RECV_LEN);
        let mut wr = ibv_recv_wr {
            wr_id: WrId::Recv(n).encode(),
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP; the SGE names buffer n of the registered pool,
        // which is not posted now.
        let rc = unsafe {
            let ops = &(*(*self.qp).context).ops;
            (ops.post_recv.expect("libibverbs fills post_recv"))(self.qp, &mut wr, &mut bad)
        };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// An address handle from our GID `sgid_index` to `peer`'s GSI QP.
    pub(super) fn create_ah(&self, sgid_index: u8, peer: Gid) -> Result<*mut ibv_ah, i32> {
        let mut attr = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw: peer.0 },
                flow_label: 0,
                sgid_index,
                hop_limit: HOP_LIMIT,
                traffic_class: 0,
            },
            is_global: 1,
            port_num: PORT,
            ..Default::default()
        };
        // SAFETY: our PD and a filled attr.
        let ah = unsafe { ibv_create_ah(self.pd, &mut attr) };
        if ah.is_null() {
            return Err(crate::base::errno::errno());
        }
        Ok(ah)
    }

    /// Copies `t`'s MAD into send buffer `slot` and posts it, signalled.
    pub(super) fn post_send(&self, slot: u32, ah: *mut ibv_ah, t: &Transmit) -> Result<(), i32> {
        let send = self.send.as_ref().expect("made in open");
        // SAFETY: send buffer `slot` is free (the sender hands out each
        // slot once until its completion) and MAD_LEN bytes long.
        unsafe { std::ptr::copy_nonoverlapping(t.mad.as_ptr(), send.slot(slot), MAD_LEN) };
        let mut sge = send.sge(slot, MAD_LEN);
        let mut wr = ibv_send_wr {
            wr_id: WrId::Send(slot).encode(),
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_SEND,
            send_flags: IBV_SEND_SIGNALED,
            ..Default::default()
        };
        wr.wr.ud = ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn: t.peer.qpn,
            remote_qkey: GSI_QKEY,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP, a WR naming a registered buffer and a live AH.
        let rc = unsafe {
            let ops = &(*(*self.qp).context).ops;
            (ops.post_send.expect("libibverbs fills post_send"))(self.qp, &mut wr, &mut bad)
        };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }
}

impl Drop for Gsi {
    /// Undoes a failed `open` (a running agent's Gsi is never dropped).
    fn drop(&mut self) {
        // SAFETY: each object made by `open`, destroyed once, QP first.
        unsafe {
            if !self.qp.is_null() {
                ibv_destroy_qp(self.qp);
            }
            self.recv = None;
            self.send = None;
            if !self.cq.is_null() {
                ibv_destroy_cq(self.cq);
            }
            if !self.channel.is_null() {
                ibv_destroy_comp_channel(self.channel);
            }
        }
    }
}

/// The port's GIDs in index order, up to the first empty entry.
pub(super) fn local_gids(dev: &Device) -> Vec<Gid> {
    let mut gids = Vec::new();
    for index in 0..=c_int::from(u8::MAX) {
        let mut gid = ibv_gid::default();
        // SAFETY: an open context and a GID to fill.
        let rc = unsafe { ibv_query_gid(dev.context, PORT, index, &mut gid) };
        // SAFETY: `raw` is the 16 bytes of the union.
        let raw = unsafe { gid.raw };
        if rc != 0 || raw == [0; 16] {
            break;
        }
        gids.push(Gid(raw));
    }
    gids
}

/// The device's node GUID (the CM's local CA GUID).
pub(super) fn node_guid(dev: &Device) -> Result<u64, i32> {
    let mut attr = ibv_device_attr::default();
    // SAFETY: an open context and an attribute struct to fill.
    let rc = unsafe { ibv_query_device(dev.context, &mut attr) };
    if rc != 0 {
        return Err(rc);
    }
    Ok(u64::from_be(attr.node_guid))
}

/// # Safety
/// `fd` is an open file descriptor.
unsafe fn set_nonblocking(fd: RawFd) -> Result<(), i32> {
    // SAFETY: fcntl on an open fd (caller's promise).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(crate::base::errno::errno());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_request_ids_name_receive_and_send_buffers() {
        for id in [
            WrId::Recv(0),
            WrId::Recv(RECV_BUFFERS - 1),
            WrId::Send(0),
            WrId::Send(SEND_BUFFERS - 1),
        ] {
            assert_eq!(WrId::decode(id.encode()), id);
        }
        assert_eq!(WrId::Recv(3).encode(), 3);
        assert_eq!(WrId::Send(3).encode(), 0x1_0000_0003);
    }

    #[test]
    fn missing_entry_point_is_reported_not_crashed_on() {
        // The test binary links the system libibverbs, which has no GSI
        // entry point.
        assert!(create_gsi_qp_fn().is_none());
    }
}
