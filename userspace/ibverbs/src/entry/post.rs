//! The post paths: `context->ops.post_send` / `post_recv` (what the
//! inline `ibv_post_send` / `ibv_post_recv` call) and the conversion of
//! `ibv_send_wr` / `ibv_recv_wr` into xroce's [`SendWr`] / [`RecvWr`].
//!
//! Work requests are converted field by field (`imm_data` is big-endian
//! in the WR as on the wire; the engine's `imm` is the host-order value of
//! those 4 bytes). Inline data follows rdma-core's contract
//! (`ibv_post_send(3)`): the SGEs of an IBV_SEND_INLINE request need no
//! lkey, and the program may reuse their bytes as soon as the call
//! returns. So the bytes are gathered during the post into a buffer of
//! the QP, reused from post to post, and handed to the engine with
//! [`QueuePair::post_send_inline`](xroce::verbs::QueuePair::post_send_inline),
//! which copies them. Runs of other requests go to the engine in one
//! batch ([`QueuePair::post_send_list`](xroce::verbs::QueuePair::post_send_list)),
//! keeping the program's order.

use std::ffi::c_int;

use xroce::verbs::{RecvWr, SendFlags, SendWr, Sge, UdAddress, WrOpcode};

use crate::abi::*;
use crate::base::errno::{fail, ffi_int, verbs_fail};
use crate::objects::{lock, qp_ref};
use crate::objects::{outer, Ah, Qp};

// ---------------------------------------------------------------------
// Converting requests.

/// The operation of an `ibv_send_wr`.
pub(crate) fn send_opcode(w: &ibv_send_wr) -> Result<WrOpcode, i32> {
    // SAFETY: the unions of ibv_send_wr hold plain integers (and one
    // pointer, not read here): every bit pattern is a valid value.
    let (imm, inv, rdma, atomic) = unsafe {
        (
            w.__bindgen_anon_1.imm_data,
            w.__bindgen_anon_1.invalidate_rkey,
            w.wr.rdma,
            w.wr.atomic,
        )
    };
    Ok(match w.opcode {
        IBV_WR_SEND => WrOpcode::Send,
        // imm_data holds the wire's bytes; the engine wants their value.
        IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm {
            imm: u32::from_be(imm),
        },
        IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv {
            invalidate_rkey: inv,
        },
        IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: u32::from_be(imm),
        },
        IBV_WR_RDMA_READ => WrOpcode::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpAndSwp {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAndAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        op => {
            return Err(fail(
                libc::EINVAL,
                format_args!("post_send: opcode {op} is not supported by xroce"),
            ))
        }
    })
}

pub(crate) fn send_flags(f: u32) -> SendFlags {
    // IBV_SEND_IP_CSUM (checksum offload of raw/UD Ethernet) means nothing here.
    SendFlags::from_bits_truncate(
        f & (IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE),
    )
}

/// Does this operation carry data from the local side (so that INLINE
/// applies)? IBV_SEND_INLINE on a READ or an atomic is ignored: their
/// SGEs are where the response lands.
pub(crate) fn carries_payload(op: &WrOpcode) -> bool {
    !op.is_read_or_atomic()
}

fn remote_addr_of(op: &WrOpcode) -> u64 {
    match *op {
        WrOpcode::AtomicCmpAndSwp { remote_addr, .. }
        | WrOpcode::AtomicFetchAndAdd { remote_addr, .. } => remote_addr,
        _ => 0,
    }
}

/// A converted `ibv_send_wr`, and for an inline request the program's
/// SGEs whose bytes are its payload (its `sg_list` is then empty).
type Converted<'a> = (SendWr, Option<&'a [ibv_sge]>);

/// Convert one `ibv_send_wr` of a QP.
fn convert_send<'a>(q: &Qp, w: &'a ibv_send_wr) -> Result<Converted<'a>, i32> {
    let op = send_opcode(w)?;
    let flags = send_flags(w.send_flags);
    let n = w.num_sge;
    if n < 0 || n as u32 > q.cap.max_send_sge {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "post_send: num_sge {n} (max_send_sge is {})",
                q.cap.max_send_sge
            ),
        ));
    }
    let sges: &[ibv_sge] = if n == 0 {
        &[]
    } else if w.sg_list.is_null() {
        return Err(libc::EINVAL);
    } else {
        // SAFETY: the program's sg_list holds num_sge entries.
        unsafe { std::slice::from_raw_parts(w.sg_list, n as usize) }
    };
    let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
    if op.is_atomic() && (total < 8 || remote_addr_of(&op) & 7 != 0) {
        return Err(fail(
            libc::EINVAL,
            "post_send: an atomic needs an 8-byte local buffer and an 8-byte aligned remote_addr",
        ));
    }
    let ud = if q.qp_type == IBV_QPT_UD {
        // SAFETY: wr.ud is the member a UD send uses.
        let u = unsafe { w.wr.ud };
        // SAFETY: an AH pointer comes from this library's create_ah.
        let ah = unsafe { outer::<_, Ah>(u.ah) }
            .ok_or_else(|| fail(libc::EINVAL, "post_send: UD send without an AH"))?;
        Some(UdAddress {
            av: ah.av,
            remote_qpn: u.remote_qpn,
            remote_qkey: u.remote_qkey,
        })
    } else {
        None
    };
    let inline = flags.contains(SendFlags::INLINE) && carries_payload(&op);
    if inline && total > u64::from(q.cap.max_inline_data) {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "post_send: {total} inline bytes (max_inline_data is {})",
                q.cap.max_inline_data
            ),
        ));
    }
    let sg_list = if inline {
        Vec::new()
    } else {
        sges.iter()
            .map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect()
    };
    let wr = SendWr {
        wr_id: w.wr_id,
        opcode: op,
        sg_list,
        flags,
        ud,
    };
    Ok((wr, inline.then_some(sges)))
}

/// Convert an `ibv_recv_wr` whose queue takes `max_sge` SGEs.
pub(crate) fn recv_wr(w: &ibv_recv_wr, max_sge: u32, what: &str) -> Result<RecvWr, i32> {
    let n = w.num_sge;
    if n < 0 || n as u32 > max_sge {
        return Err(fail(
            libc::EINVAL,
            format_args!("{what}: num_sge {n} (the queue's max_sge is {max_sge})"),
        ));
    }
    let sg_list = if n == 0 {
        Vec::new()
    } else if w.sg_list.is_null() {
        return Err(libc::EINVAL);
    } else {
        // SAFETY: the program's sg_list holds num_sge entries.
        unsafe { std::slice::from_raw_parts(w.sg_list, n as usize) }
            .iter()
            .map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect()
    };
    Ok(RecvWr {
        wr_id: w.wr_id,
        sg_list,
    })
}

// ---------------------------------------------------------------------
// Posting.

/// Hand `batch` to the engine (one lock, one doorbell) and empty it. On
/// failure, the index in `batch` of the request that failed (those before
/// it are posted).
pub(crate) fn flush(q: &Qp, batch: &mut Vec<SendWr>) -> Result<(), (usize, i32)> {
    if batch.is_empty() {
        return Ok(());
    }
    let r = q.inner.post_send_list(batch);
    batch.clear();
    r.map_err(|(i, e)| (i, verbs_fail(e)))
}

/// Copy the inline payload `pieces` (address, length) describe, at most
/// `max` bytes, into `buf`. `buf` is emptied first and keeps its capacity
/// (`max` bytes, reserved at the first use), so later posts allocate
/// nothing.
///
/// # Safety
/// Each piece of non-zero length names that many readable bytes, which
/// nothing writes during the call (rdma-core's inline contract).
pub(crate) unsafe fn gather_inline(
    buf: &mut Vec<u8>,
    max: usize,
    pieces: impl Iterator<Item = (u64, usize)>,
) -> Result<(), i32> {
    buf.clear();
    buf.reserve(max);
    for (addr, len) in pieces {
        if len == 0 {
            continue;
        }
        if addr == 0 {
            return Err(fail(libc::EINVAL, "inline data at address NULL"));
        }
        if buf.len() + len > max {
            return Err(fail(
                libc::EINVAL,
                format_args!("more than max_inline_data ({max}) inline bytes"),
            ));
        }
        // SAFETY: addr..addr+len is readable and unchanged during the call
        // (the caller's contract).
        let bytes = unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) };
        buf.extend_from_slice(bytes);
    }
    Ok(())
}

/// The request of the program's list at index `i` of a batch that began
/// at `start`, with the error it got.
///
/// # Safety
/// The batch held the requests of the list from `start` on, in order,
/// more than `i` of them.
unsafe fn batch_failure(start: *mut ibv_send_wr, (i, e): (usize, i32)) -> (*mut ibv_send_wr, i32) {
    let mut p = start;
    for _ in 0..i {
        // SAFETY: the caller's contract: the list goes on past `p`.
        p = unsafe { (*p).next };
    }
    (p, e)
}

/// Post the program's list from `wr`: stops at the first request that
/// fails (every request before it is posted), returning it and its errno.
fn post_send_list(q: &Qp, wr: *mut ibv_send_wr) -> Result<(), (*mut ibv_send_wr, i32)> {
    let mut guard = lock(q);
    let st = &mut *guard;
    st.batch.clear();
    let max_inline = q.cap.max_inline_data as usize;
    // The first request of `st.batch`, which holds a run of the list.
    let mut start = wr;
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: a request of the program's list (valid during the call).
        let w = unsafe { &*cur };
        match convert_send(q, w) {
            Ok((sw, None)) => {
                if st.batch.is_empty() {
                    start = cur;
                }
                st.batch.push(sw);
            }
            Ok((sw, Some(sges))) => {
                // The requests before it go first.
                // SAFETY: the batch is the run of the list from `start`.
                flush(q, &mut st.batch).map_err(|f| unsafe { batch_failure(start, f) })?;
                let pieces = sges.iter().map(|s| (s.addr, s.length as usize));
                // SAFETY: rdma-core's inline contract (ibv_post_send(3)):
                // the SGEs of an IBV_SEND_INLINE request name bytes the
                // program keeps readable and unchanged until the post call
                // returns (no lkey needed); they are read here, during it.
                unsafe { gather_inline(&mut st.inline, max_inline, pieces) }
                    .and_then(|()| {
                        q.inner
                            .post_send_inline(&sw, &st.inline)
                            .map_err(verbs_fail)
                    })
                    .map_err(|e| (cur, e))?;
            }
            Err(e) => {
                // The requests before it are posted; it is the bad one.
                // SAFETY: as above.
                flush(q, &mut st.batch).map_err(|f| unsafe { batch_failure(start, f) })?;
                return Err((cur, e));
            }
        }
        cur = w.next;
    }
    // SAFETY: as above.
    flush(q, &mut st.batch).map_err(|f| unsafe { batch_failure(start, f) })
}

/// `context->ops.post_send` (the inline `ibv_post_send`).
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    ffi_int(|| {
        if bad_wr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's bad_wr slot.
        unsafe { *bad_wr = std::ptr::null_mut() };
        // SAFETY: the program passes a live QP of ours.
        let q = unsafe { qp_ref(qp) }.ok_or(libc::EINVAL)?;
        if wr.is_null() {
            return Err(libc::EINVAL);
        }
        post_send_list(q, wr).map_err(|(bad, e)| {
            // SAFETY: as above.
            unsafe { *bad_wr = bad };
            e
        })
    })
}

/// `context->ops.post_recv` (the inline `ibv_post_recv`).
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live QP of ours.
        let q = unsafe { qp_ref(qp) }.ok_or(libc::EINVAL)?;
        // SAFETY: the program's request list and bad_wr slot.
        unsafe {
            post_recv_list(wr, bad_wr, q.cap.max_recv_sge, "post_recv", |rw| {
                q.inner.post_recv(rw)
            })
        }
    })
}

/// What ibv_post_recv and ibv_post_srq_recv share: EINVAL for a NULL list
/// or bad_wr, each request converted (at most `max_sge` SGEs) and posted in
/// order, and on the first failure `*bad_wr` naming it.
///
/// # Safety
/// `wr` is NULL or the head of the program's valid request list; `bad_wr`
/// is NULL or writable.
pub(crate) unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    max_sge: u32,
    what: &str,
    mut post: impl FnMut(&RecvWr) -> xroce::verbs::error::Result<()>,
) -> Result<(), i32> {
    if bad_wr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's bad_wr slot.
    unsafe { *bad_wr = std::ptr::null_mut() };
    if wr.is_null() {
        return Err(libc::EINVAL);
    }
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: a request of the program's list.
        let w = unsafe { &*cur };
        if let Err(e) = recv_wr(w, max_sge, what).and_then(|rw| post(&rw).map_err(verbs_fail)) {
            // SAFETY: as above.
            unsafe { *bad_wr = cur };
            return Err(e);
        }
        cur = w.next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(opcode: u32) -> ibv_send_wr {
        ibv_send_wr {
            opcode,
            ..Default::default()
        }
    }

    #[test]
    fn opcodes() {
        let mut w = wr(IBV_WR_SEND_WITH_IMM);
        // The program stores imm_data in network order: these 4 bytes go
        // on the wire as they are.
        w.__bindgen_anon_1.imm_data = u32::from_ne_bytes([0x11, 0x22, 0x33, 0x44]);
        let op = send_opcode(&w).unwrap();
        let WrOpcode::SendWithImm { imm } = op else {
            panic!("{op:?}")
        };
        assert_eq!(imm.to_be_bytes(), [0x11, 0x22, 0x33, 0x44]);

        let mut w = wr(IBV_WR_RDMA_WRITE_WITH_IMM);
        w.wr.rdma.remote_addr = 0x1000;
        w.wr.rdma.rkey = 7;
        w.__bindgen_anon_1.imm_data = 0x0100_0000u32.to_be();
        assert_eq!(
            send_opcode(&w),
            Ok(WrOpcode::RdmaWriteWithImm {
                remote_addr: 0x1000,
                rkey: 7,
                imm: 0x0100_0000
            })
        );

        let mut w = wr(IBV_WR_ATOMIC_CMP_AND_SWP);
        w.wr.atomic.remote_addr = 0x2000;
        w.wr.atomic.rkey = 9;
        w.wr.atomic.compare_add = 1;
        w.wr.atomic.swap = 2;
        assert_eq!(
            send_opcode(&w),
            Ok(WrOpcode::AtomicCmpAndSwp {
                remote_addr: 0x2000,
                rkey: 9,
                compare: 1,
                swap: 2
            })
        );
        let mut w = wr(IBV_WR_ATOMIC_FETCH_AND_ADD);
        w.wr.atomic.compare_add = 5;
        assert!(matches!(
            send_opcode(&w),
            Ok(WrOpcode::AtomicFetchAndAdd { add: 5, .. })
        ));
        let mut w = wr(IBV_WR_SEND_WITH_INV);
        w.__bindgen_anon_1.invalidate_rkey = 0x55;
        assert_eq!(
            send_opcode(&w),
            Ok(WrOpcode::SendWithInv {
                invalidate_rkey: 0x55
            })
        );
        assert_eq!(send_opcode(&wr(IBV_WR_SEND)), Ok(WrOpcode::Send));
        assert!(matches!(
            send_opcode(&wr(IBV_WR_RDMA_READ)),
            Ok(WrOpcode::RdmaRead { .. })
        ));
        for bad in [
            IBV_WR_LOCAL_INV,
            IBV_WR_BIND_MW,
            IBV_WR_TSO,
            IBV_WR_DRIVER1,
            IBV_WR_ATOMIC_WRITE,
            99,
        ] {
            assert_eq!(send_opcode(&wr(bad)), Err(libc::EINVAL));
        }
    }

    #[test]
    fn flags() {
        assert_eq!(
            send_flags(IBV_SEND_SIGNALED | IBV_SEND_INLINE | IBV_SEND_IP_CSUM),
            SendFlags::SIGNALED | SendFlags::INLINE
        );
        assert_eq!(
            send_flags(IBV_SEND_FENCE | IBV_SEND_SOLICITED),
            SendFlags::FENCE | SendFlags::SOLICITED
        );
    }
}

/// The post paths end to end: two engines joined by xroce's simulated
/// link, the QPs wrapped as this library wraps them (the harness serves
/// the `ibv_wr_*` tests too).
#[cfg(test)]
pub(crate) mod sim_tests {
    use super::*;
    use std::sync::Mutex;
    use xroce::verbs::sim::{connect_pair, sim_pair, Endpoint, LinkConfig, PairParams, Sim};
    use xroce::verbs::{CompletionQueue, MemoryRegion, Wc, WcFlags, WcStatus};

    use crate::entry::wr_builder::set_wr_ops;
    use crate::objects::PendingWrs;

    pub(crate) struct Side {
        pub qp: Box<Qp>,
        pub cq: CompletionQueue,
        pub mr: MemoryRegion,
    }

    fn wrap(e: Endpoint) -> Side {
        let Endpoint { cq, qp, mr, .. } = e;
        let cap = ibv_qp_cap {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 8,
            max_recv_sge: 8,
            max_inline_data: 256,
        };
        let mut x = ibv_qp_ex::default();
        x.qp_base.qp_num = qp.qp_num();
        x.qp_base.qp_type = IBV_QPT_RC;
        x.qp_base.state = IBV_QPS_RTS;
        set_wr_ops(&mut x);
        let q = Box::new(Qp {
            qp: x,
            inner: qp,
            ctx: std::ptr::null_mut(),
            has_qp_ex: true,
            pending: Mutex::new(PendingWrs::default()),
            cap,
            sq_sig_all: false,
            qp_type: IBV_QPT_RC,
            srq: std::ptr::null_mut(),
            ah_attr: Mutex::new(ibv_ah_attr::default()),
        });
        Side { qp: q, cq, mr }
    }

    pub(crate) fn pair() -> (Sim, Side, Side) {
        pair_with(&PairParams::default())
    }

    fn pair_with(p: &PairParams) -> (Sim, Side, Side) {
        let sim = sim_pair(LinkConfig::default(), 7);
        let (a, b) = connect_pair(&sim, p);
        (sim, wrap(a), wrap(b))
    }

    /// Link `wrs` into one list, in order.
    fn chain(wrs: &mut [ibv_send_wr]) {
        for i in 1..wrs.len() {
            let next: *mut ibv_send_wr = &mut wrs[i];
            wrs[i - 1].next = next;
        }
    }

    /// A signaled RDMA WRITE of `sge` to `remote_addr` of `to`'s MR.
    fn write_wr(wr_id: u64, sge: *mut ibv_sge, to: &Side, remote_addr: u64) -> ibv_send_wr {
        let mut w = ibv_send_wr {
            wr_id,
            sg_list: sge,
            num_sge: 1,
            opcode: IBV_WR_RDMA_WRITE,
            send_flags: IBV_SEND_SIGNALED,
            ..Default::default()
        };
        w.wr.rdma.remote_addr = to.mr.addr() + remote_addr;
        w.wr.rdma.rkey = to.mr.rkey();
        w
    }

    pub(crate) fn ptr(s: &mut Side) -> *mut ibv_qp {
        &mut s.qp.qp.qp_base
    }

    pub(crate) fn xptr(s: &mut Side) -> *mut ibv_qp_ex {
        &mut s.qp.qp
    }

    pub(crate) fn recv(s: &mut Side, n: usize, len: u32) {
        for i in 0..n {
            let mut sge = ibv_sge {
                addr: s.mr.addr() + (i as u64) * u64::from(len),
                length: len,
                lkey: s.mr.lkey(),
            };
            let mut w = ibv_recv_wr {
                wr_id: i as u64,
                sg_list: &mut sge,
                num_sge: 1,
                ..Default::default()
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: a QP wrapped as create does, a well-formed request.
            assert_eq!(unsafe { post_recv(ptr(s), &mut w, &mut bad) }, 0);
        }
    }

    pub(crate) fn wait(sim: &mut Sim, cq: &CompletionQueue, n: usize) -> Vec<Wc> {
        let mut got = Vec::new();
        let deadline = sim.now + 2_000_000_000;
        sim.run_until(deadline, |_| {
            while let Ok(Some(wc)) = cq.poll_one() {
                got.push(wc);
            }
            got.len() >= n
        });
        got
    }

    pub(crate) fn read(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
        // SAFETY: the requests that wrote these bytes completed.
        unsafe { mr.to_vec(off, len) }.unwrap()
    }

    #[test]
    fn inline_send_with_imm_from_unregistered_memory() {
        let (mut sim, mut a, mut b) = pair();
        recv(&mut b, 1, 64);
        // Stack memory no MR covers, and no lkey: rdma-core's contract for
        // inline data.
        let data = *b"inline, no lkey!";
        let mut sge = ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        let mut w = ibv_send_wr {
            wr_id: 42,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_SEND_WITH_IMM,
            send_flags: IBV_SEND_SIGNALED | IBV_SEND_INLINE,
            ..Default::default()
        };
        w.__bindgen_anon_1.imm_data = u32::from_ne_bytes([0x11, 0x22, 0x33, 0x44]);
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in recv.
        assert_eq!(unsafe { post_send(ptr(&mut a), &mut w, &mut bad) }, 0);
        assert!(bad.is_null());
        let wc = wait(&mut sim, &b.cq, 1);
        assert_eq!(wc[0].status, WcStatus::Success);
        assert!(wc[0].flags.contains(WcFlags::WITH_IMM));
        // The same 4 bytes the sender stored.
        assert_eq!(wc[0].imm_data.to_be_bytes(), [0x11, 0x22, 0x33, 0x44]);
        assert_eq!(read(&b.mr, 0, data.len()), data);
        let wc = wait(&mut sim, &a.cq, 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (42, WcStatus::Success));
    }

    #[test]
    fn many_inline_requests_in_one_list() {
        let (mut sim, mut a, mut b) = pair();
        const N: usize = 48;
        recv(&mut b, N, 256);
        let mut bufs: Vec<[u8; 200]> = (0..N).map(|i| [i as u8; 200]).collect();
        let mut sges: Vec<ibv_sge> = bufs
            .iter()
            .map(|b| ibv_sge {
                addr: b.as_ptr() as u64,
                length: 200,
                lkey: 0,
            })
            .collect();
        let mut wrs: Vec<ibv_send_wr> = (0..N)
            .map(|i| ibv_send_wr {
                wr_id: i as u64,
                sg_list: &mut sges[i],
                num_sge: 1,
                opcode: IBV_WR_SEND,
                send_flags: IBV_SEND_INLINE,
                ..Default::default()
            })
            .collect();
        for i in 0..N - 1 {
            let next: *mut ibv_send_wr = &mut wrs[i + 1];
            wrs[i].next = next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in recv.
        assert_eq!(unsafe { post_send(ptr(&mut a), &mut wrs[0], &mut bad) }, 0);
        // Inline bytes were copied during the post: the program may reuse
        // its buffers at once.
        for b in bufs.iter_mut() {
            b.fill(0xff);
        }
        let wc = wait(&mut sim, &b.cq, N);
        assert_eq!(wc.len(), N);
        for (i, w) in wc.iter().enumerate() {
            assert_eq!(
                (w.wr_id, w.status, w.byte_len),
                (i as u64, WcStatus::Success, 200)
            );
            assert_eq!(read(&b.mr, i * 256, 200), vec![i as u8; 200]);
        }
    }

    #[test]
    fn bad_request_in_a_list() {
        let (mut sim, mut a, b) = pair();
        let src = a.mr.sge(0, 8);
        let mut sge = ibv_sge {
            addr: src.addr,
            length: 8,
            lkey: src.lkey,
        };
        let sge_ptr: *mut ibv_sge = &mut sge;
        let mk = |op| {
            let mut w = ibv_send_wr {
                sg_list: sge_ptr,
                num_sge: 1,
                opcode: op,
                send_flags: IBV_SEND_SIGNALED,
                ..Default::default()
            };
            w.wr.rdma.remote_addr = b.mr.addr();
            w.wr.rdma.rkey = b.mr.rkey();
            w
        };
        let mut w3 = mk(IBV_WR_RDMA_WRITE);
        let mut w2 = mk(IBV_WR_LOCAL_INV);
        w2.next = &mut w3;
        let mut w1 = mk(IBV_WR_RDMA_WRITE);
        w1.next = &mut w2;
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in recv.
        let r = unsafe { post_send(ptr(&mut a), &mut w1, &mut bad) };
        assert_eq!(r, libc::EINVAL);
        assert_eq!(bad, &mut w2 as *mut ibv_send_wr);
        // The request before the bad one was posted.
        assert_eq!(wait(&mut sim, &a.cq, 2).len(), 1);

        // Too much inline data, too many SGEs.
        let mut big = mk(IBV_WR_RDMA_WRITE);
        big.send_flags |= IBV_SEND_INLINE;
        let mut bsge = ibv_sge {
            addr: src.addr,
            length: 257,
            lkey: 0,
        };
        big.sg_list = &mut bsge;
        // SAFETY: as in recv.
        let r = unsafe { post_send(ptr(&mut a), &mut big, &mut bad) };
        assert_eq!((r, bad), (libc::EINVAL, &mut big as *mut ibv_send_wr));
        let mut many = mk(IBV_WR_RDMA_WRITE);
        many.num_sge = 9;
        // SAFETY: rejected before the SGE list is read.
        let r = unsafe { post_send(ptr(&mut a), &mut many, &mut bad) };
        assert_eq!(r, libc::EINVAL);
    }

    #[test]
    fn post_recv_checks() {
        let (_sim, mut a, _b) = pair();
        let mut w = ibv_recv_wr {
            num_sge: 9,
            ..Default::default()
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: rejected before the SGE list is read.
        let r = unsafe { post_recv(ptr(&mut a), &mut w, &mut bad) };
        assert_eq!((r, bad), (libc::EINVAL, &mut w as *mut ibv_recv_wr));
        // SAFETY: a NULL bad_wr is refused.
        let r = unsafe { post_recv(ptr(&mut a), &mut w, std::ptr::null_mut()) };
        assert_eq!(r, libc::EINVAL);
    }

    #[test]
    fn inline_and_plain_requests_keep_their_order() {
        let (mut sim, mut a, mut b) = pair();
        recv(&mut b, 1, 64);
        // SAFETY: no request uses a's MR yet.
        unsafe { a.mr.write(0, &[7u8; 32]) }.unwrap();
        let mut plain = ibv_sge {
            addr: a.mr.addr(),
            length: 32,
            lkey: a.mr.lkey(),
        };
        let text = *b"inline";
        let mut inl = ibv_sge {
            addr: text.as_ptr() as u64,
            length: text.len() as u32,
            lkey: 0,
        };
        let mut too_big = ibv_sge { length: 257, ..inl };
        let mut wrs = [
            write_wr(0, &mut plain, &b, 1000),
            ibv_send_wr {
                wr_id: 1,
                sg_list: &mut inl,
                num_sge: 1,
                opcode: IBV_WR_SEND,
                send_flags: IBV_SEND_SIGNALED | IBV_SEND_INLINE,
                ..Default::default()
            },
            write_wr(2, &mut plain, &b, 2000),
            write_wr(3, &mut inl, &b, 3000),
            write_wr(4, &mut too_big, &b, 4000),
            write_wr(5, &mut plain, &b, 5000),
        ];
        wrs[3].send_flags |= IBV_SEND_INLINE;
        wrs[4].send_flags |= IBV_SEND_INLINE;
        chain(&mut wrs);
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in recv.
        let r = unsafe { post_send(ptr(&mut a), &mut wrs[0], &mut bad) };
        assert_eq!((r, bad), (libc::EINVAL, &mut wrs[4] as *mut ibv_send_wr));
        // Everything before the bad request, in the list's order.
        let wc = wait(&mut sim, &a.cq, 5);
        let ids: Vec<u64> = wc.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [0, 1, 2, 3]);
        assert!(wc.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(read(&b.mr, 1000, 32), [7u8; 32]);
        assert_eq!(read(&b.mr, 2000, 32), [7u8; 32]);
        assert_eq!(read(&b.mr, 3000, text.len()), text);
        assert_eq!(read(&b.mr, 5000, 32), [0u8; 32]);
        let wc = wait(&mut sim, &b.cq, 1);
        assert_eq!((wc[0].byte_len, wc[0].status), (6, WcStatus::Success));
        assert_eq!(read(&b.mr, 0, text.len()), text);
    }

    #[test]
    fn engine_refusal_after_an_inline_request_names_the_right_request() {
        // Send queues of 8: the 9th request of the list is refused.
        let p = PairParams {
            max_wr: 8,
            ..Default::default()
        };
        let (mut sim, mut a, b) = pair_with(&p);
        let mut plain = ibv_sge {
            addr: a.mr.addr(),
            length: 8,
            lkey: a.mr.lkey(),
        };
        let text = *b"first";
        let mut inl = ibv_sge {
            addr: text.as_ptr() as u64,
            length: text.len() as u32,
            lkey: 0,
        };
        let mut wrs: Vec<ibv_send_wr> = (0..10)
            .map(|i| write_wr(i, &mut plain, &b, 64 * i))
            .collect();
        wrs[0].sg_list = &mut inl;
        wrs[0].send_flags |= IBV_SEND_INLINE;
        chain(&mut wrs);
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in recv.
        let r = unsafe { post_send(ptr(&mut a), &mut wrs[0], &mut bad) };
        assert_eq!((r, bad), (libc::ENOMEM, &mut wrs[8] as *mut ibv_send_wr));
        let wc = wait(&mut sim, &a.cq, 9);
        assert_eq!(wc.len(), 8);
        assert_eq!(read(&b.mr, 0, text.len()), text);
    }

    #[test]
    fn zero_length_inline_send() {
        let (mut sim, mut a, mut b) = pair();
        recv(&mut b, 1, 64);
        let mut w = ibv_send_wr {
            wr_id: 9,
            opcode: IBV_WR_SEND,
            send_flags: IBV_SEND_SIGNALED | IBV_SEND_INLINE,
            ..Default::default()
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in recv.
        assert_eq!(unsafe { post_send(ptr(&mut a), &mut w, &mut bad) }, 0);
        let wc = wait(&mut sim, &b.cq, 1);
        assert_eq!((wc[0].byte_len, wc[0].status), (0, WcStatus::Success));
    }
}
