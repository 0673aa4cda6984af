//! The `ibv_wr_*` builders of `struct ibv_qp_ex` (a QP made by
//! `ibv_create_qp_ex` with send_ops_flags): `wr_start`, the builders and
//! setters, `wr_complete` and `wr_abort`.
//!
//! Requests are built under the QP's pending lock and handed to the
//! engine by wr_complete, in order: none of them when an error was
//! recorded while building or one is incomplete. Inline data given to
//! `ibv_wr_set_inline_data*` is copied by the setter (rdma-core's
//! contract, `ibv_wr_post(3)`) into a buffer of the QP reused from batch to
//! batch, and posted with
//! [`QueuePair::post_send_inline`](xroce::verbs::QueuePair::post_send_inline).

use std::ffi::{c_int, c_void};

use xroce::verbs::{SendFlags, SendWr, Sge, UdAddress, WrOpcode};

use crate::abi::*;
use crate::base::errno::{fail, ffi, ffi_int, verbs_fail};
use crate::entry::post::{carries_payload, flush, gather_inline, send_flags};
use crate::objects::{lock, qpx_ref};
use crate::objects::{outer, Ah, InlineBytes, PendingWrs, Qp};

/// Install the `ibv_wr_*` function pointers of an extended QP.
pub(crate) fn set_wr_ops(x: &mut ibv_qp_ex) {
    x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    x.wr_bind_mw = Some(wr_bind_mw);
    x.wr_local_inv = Some(wr_local_inv);
    x.wr_rdma_read = Some(wr_rdma_read);
    x.wr_rdma_write = Some(wr_rdma_write);
    x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    x.wr_send = Some(wr_send);
    x.wr_send_imm = Some(wr_send_imm);
    x.wr_send_inv = Some(wr_send_inv);
    x.wr_send_tso = Some(wr_send_tso);
    x.wr_set_ud_addr = Some(wr_set_ud_addr);
    x.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    x.wr_atomic_write = Some(wr_atomic_write);
}

/// Run `f` on the QP's pending state unless an error is already recorded;
/// an error `f` returns is recorded (the first one wins).
fn with_pending(qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut PendingWrs) -> Result<(), i32>) {
    ffi((), || {
        // SAFETY: the program passes a live extended QP of ours.
        let Some(q) = (unsafe { qpx_ref(qp) }) else {
            return;
        };
        let mut st = lock(q);
        if st.error != 0 {
            return;
        }
        if let Err(e) = f(q, &mut st) {
            st.error = e;
        }
    })
}

/// A builder: a new request with the QP's current wr_id and wr_flags.
fn build(qp: *mut ibv_qp_ex, op: WrOpcode) {
    with_pending(qp, |q, st| {
        if st.wrs.len() >= q.cap.max_send_wr as usize {
            return Err(fail(
                libc::ENOSPC,
                "ibv_wr_*: more requests than max_send_wr",
            ));
        }
        let wr = SendWr {
            wr_id: q.qp.wr_id,
            opcode: op,
            sg_list: Vec::new(),
            flags: send_flags(q.qp.wr_flags),
            ud: None,
        };
        st.wrs.push((wr, None));
        Ok(())
    })
}

/// A setter: changes the last request built.
fn set_last(
    qp: *mut ibv_qp_ex,
    f: impl FnOnce(&Qp, &mut (SendWr, InlineBytes)) -> Result<(), i32>,
) {
    with_pending(qp, |q, st| match st.wrs.last_mut() {
        Some(last) => f(q, last),
        None => Err(fail(
            libc::EINVAL,
            "ibv_wr_set_*: no request built since wr_start",
        )),
    })
}

fn unsupported(qp: *mut ibv_qp_ex, what: &str) {
    with_pending(qp, |_, _| {
        Err(fail(
            libc::EOPNOTSUPP,
            format_args!("{what} is not supported by xroce"),
        ))
    })
}

/// Forget the requests built (wr_start, wr_abort, after wr_complete).
fn reset(st: &mut PendingWrs) {
    st.wrs.clear();
    st.wr_inline.clear();
    st.error = 0;
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    ffi((), || {
        // SAFETY: the program passes a live extended QP of ours.
        if let Some(q) = unsafe { qpx_ref(qp) } {
            reset(&mut lock(q));
        }
    })
}

/// Is this request's payload inline (IBV_SEND_INLINE on an operation that
/// carries data; READs and atomics ignore the flag)?
fn is_inline(wr: &SendWr) -> bool {
    wr.flags.contains(SendFlags::INLINE) && carries_payload(&wr.opcode)
}

/// Post the requests built since wr_start, in order: none if one of them
/// is invalid; on the engine's refusal of one, those before it are posted.
fn post_built(q: &Qp, st: &mut PendingWrs) -> Result<(), i32> {
    if st.error != 0 {
        return Err(st.error);
    }
    let max_inline = q.cap.max_inline_data as usize;
    for (wr, bytes) in &st.wrs {
        if q.qp_type == IBV_QPT_UD && wr.ud.is_none() {
            return Err(fail(
                libc::EINVAL,
                "ibv_wr_complete: UD request without ibv_wr_set_ud_addr",
            ));
        }
        if is_inline(wr) && bytes.is_none() {
            let total: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
            if total > max_inline as u64 {
                return Err(fail(
                    libc::EINVAL,
                    format_args!(
                        "ibv_wr_complete: {total} inline bytes (max_inline_data is {max_inline})"
                    ),
                ));
            }
        }
    }
    st.batch.clear();
    for (mut wr, bytes) in st.wrs.drain(..) {
        if !is_inline(&wr) {
            st.batch.push(wr);
            continue;
        }
        // The requests before it go first.
        flush(q, &mut st.batch).map_err(|(_, e)| e)?;
        let data: &[u8] = match bytes {
            // Copied by ibv_wr_set_inline_data*.
            Some(r) => &st.wr_inline[r],
            None => {
                let pieces = wr.sg_list.iter().map(|s| (s.addr, s.length as usize));
                // SAFETY: rdma-core's inline contract: the SGEs of an
                // IBV_SEND_INLINE request name readable bytes, no lkey
                // needed, that the program leaves alone until the post
                // (here ibv_wr_complete) returns; they are read now.
                unsafe { gather_inline(&mut st.inline, max_inline, pieces) }?;
                &st.inline
            }
        };
        // The payload is `data`; the engine needs no SGEs.
        wr.sg_list.clear();
        q.inner.post_send_inline(&wr, data).map_err(verbs_fail)?;
    }
    flush(q, &mut st.batch).map_err(|(_, e)| e)
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    ffi_int(|| {
        // SAFETY: the program passes a live extended QP of ours.
        let q = unsafe { qpx_ref(qp) }.ok_or(libc::EINVAL)?;
        let mut guard = lock(q);
        let st = &mut *guard;
        let r = post_built(q, st);
        st.batch.clear();
        reset(st);
        r
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    ffi((), || {
        // SAFETY: the program passes a live extended QP of ours.
        if let Some(q) = unsafe { qpx_ref(qp) } {
            reset(&mut lock(q));
        }
    })
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    build(qp, WrOpcode::Send)
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: __be32) {
    build(
        qp,
        WrOpcode::SendWithImm {
            imm: u32::from_be(imm_data),
        },
    )
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    build(qp, WrOpcode::SendWithInv { invalidate_rkey })
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    build(qp, WrOpcode::RdmaWrite { remote_addr, rkey })
}

unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: __be32,
) {
    build(
        qp,
        WrOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: u32::from_be(imm_data),
        },
    )
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    build(qp, WrOpcode::RdmaRead { remote_addr, rkey })
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    build(
        qp,
        WrOpcode::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        },
    )
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    build(
        qp,
        WrOpcode::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        },
    )
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    _mw: *mut ibv_mw,
    _rkey: u32,
    _bind_info: *const ibv_mw_bind_info,
) {
    unsupported(qp, "ibv_wr_bind_mw (memory windows)")
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, _invalidate_rkey: u32) {
    unsupported(qp, "ibv_wr_local_inv")
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    unsupported(qp, "ibv_wr_send_tso")
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _remote_srqn: u32) {
    unsupported(qp, "ibv_wr_set_xrc_srqn (XRC)")
}

unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    _rkey: u32,
    _remote_addr: u64,
    _atomic_wr: *const c_void,
) {
    unsupported(qp, "ibv_wr_atomic_write")
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    set_last(qp, |_, (wr, _)| {
        // SAFETY: an AH pointer comes from this library's create_ah.
        let a = unsafe { outer::<_, Ah>(ah) }
            .ok_or_else(|| fail(libc::EINVAL, "ibv_wr_set_ud_addr: AH is NULL"))?;
        wr.ud = Some(UdAddress {
            av: a.av,
            remote_qpn,
            remote_qkey,
        });
        Ok(())
    })
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    set_last(qp, |_, (wr, bytes)| {
        *bytes = None;
        wr.sg_list.clear();
        if length != 0 {
            wr.sg_list.push(Sge { addr, length, lkey });
        }
        Ok(())
    })
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    set_last(qp, |q, (wr, bytes)| {
        if num_sge > q.cap.max_send_sge as usize {
            return Err(fail(
                libc::ENOSPC,
                format_args!(
                    "ibv_wr_set_sge_list: {num_sge} SGEs (max_send_sge is {})",
                    q.cap.max_send_sge
                ),
            ));
        }
        if num_sge > 0 && sg_list.is_null() {
            return Err(libc::EINVAL);
        }
        *bytes = None;
        wr.sg_list.clear();
        if num_sge > 0 {
            // SAFETY: the program's list holds num_sge entries.
            let s = unsafe { std::slice::from_raw_parts(sg_list, num_sge) };
            wr.sg_list.extend(s.iter().map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            }));
        }
        Ok(())
    })
}

/// Copy inline data now (the program may reuse its buffers as soon as
/// the setter returns) to the end of the QP's `wr_inline` buffer.
fn set_inline(qp: *mut ibv_qp_ex, bufs: &[ibv_data_buf]) {
    with_pending(qp, |q, st| {
        let Some((wr, bytes)) = st.wrs.last_mut() else {
            return Err(fail(
                libc::EINVAL,
                "ibv_wr_set_inline_data: no request built since wr_start",
            ));
        };
        if !carries_payload(&wr.opcode) {
            return Err(fail(
                libc::EINVAL,
                "ibv_wr_set_inline_data: inline data is for SEND and RDMA WRITE",
            ));
        }
        let max = q.cap.max_inline_data as usize;
        let total = bufs
            .iter()
            .try_fold(0usize, |n, b| n.checked_add(b.length))
            .filter(|&n| n <= max)
            .ok_or_else(|| {
                fail(
                    libc::ENOSPC,
                    format_args!("ibv_wr_set_inline_data: more than max_inline_data ({max}) bytes"),
                )
            })?;
        if bufs.iter().any(|b| b.length > 0 && b.addr.is_null()) {
            return Err(libc::EINVAL);
        }
        let start = st.wr_inline.len();
        st.wr_inline.reserve(total);
        for b in bufs.iter().filter(|b| b.length > 0) {
            // SAFETY: the program's buffer of `length` readable bytes
            // (checked non-NULL above), read during the setter as
            // ibv_wr_post(3) allows.
            let bytes = unsafe { std::slice::from_raw_parts(b.addr as *const u8, b.length) };
            st.wr_inline.extend_from_slice(bytes);
        }
        wr.sg_list.clear();
        wr.flags |= SendFlags::INLINE;
        *bytes = Some(start..start + total);
        Ok(())
    })
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    set_inline(qp, &[ibv_data_buf { addr, length }])
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    if num_buf > 0 && buf_list.is_null() {
        with_pending(qp, |_, _| Err(libc::EINVAL));
        return;
    }
    let bufs = if num_buf == 0 {
        &[][..]
    } else {
        // SAFETY: the program's list holds num_buf entries.
        unsafe { std::slice::from_raw_parts(buf_list, num_buf) }
    };
    set_inline(qp, bufs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::post::sim_tests::{pair, read, wait, xptr};
    use xroce::verbs::WcStatus;

    #[test]
    fn wr_api() {
        let (mut sim, mut a, b) = pair();
        let x = xptr(&mut a);
        let data = *b"built with ibv_wr_*";
        // SAFETY: the ops set_wr_ops installed, on a live QP.
        unsafe {
            let q = &mut *x;
            (q.wr_start.unwrap())(x);
            q.wr_id = 7;
            q.wr_flags = IBV_SEND_SIGNALED;
            (q.wr_rdma_write.unwrap())(x, b.mr.rkey(), b.mr.addr() + 100);
            (q.wr_set_inline_data.unwrap())(x, data.as_ptr() as *mut c_void, data.len());
            assert_eq!((q.wr_complete.unwrap())(x), 0);
        }
        let wc = wait(&mut sim, &a.cq, 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
        assert_eq!(read(&b.mr, 100, data.len()), data);

        // An unsupported builder makes wr_complete fail and post nothing.
        // SAFETY: as above.
        unsafe {
            let q = &mut *x;
            (q.wr_start.unwrap())(x);
            (q.wr_rdma_write.unwrap())(x, b.mr.rkey(), b.mr.addr());
            (q.wr_set_sge.unwrap())(x, a.mr.lkey(), a.mr.addr(), 8);
            (q.wr_local_inv.unwrap())(x, 1);
            assert_eq!((q.wr_complete.unwrap())(x), libc::EOPNOTSUPP);
            // A setter without a builder.
            (q.wr_start.unwrap())(x);
            (q.wr_set_sge.unwrap())(x, a.mr.lkey(), a.mr.addr(), 8);
            assert_eq!((q.wr_complete.unwrap())(x), libc::EINVAL);
            (q.wr_start.unwrap())(x);
            (q.wr_send.unwrap())(x);
            (q.wr_abort.unwrap())(x);
        }
        assert!(wait(&mut sim, &a.cq, 1).is_empty());
    }

    #[test]
    fn inline_and_plain_requests_in_one_batch() {
        let (mut sim, mut a, mut b) = pair();
        crate::entry::post::sim_tests::recv(&mut b, 1, 64);
        // SAFETY: no request uses a's MR yet.
        unsafe { a.mr.write(0, &[5u8; 16]) }.unwrap();
        let x = xptr(&mut a);
        let mut first = *b"first ";
        let second = *b"second";
        let third = *b"from an SGE";
        let list = [
            ibv_data_buf {
                addr: first.as_mut_ptr() as *mut c_void,
                length: first.len(),
            },
            ibv_data_buf {
                addr: second.as_ptr() as *mut c_void,
                length: second.len(),
            },
        ];
        // SAFETY: the ops set_wr_ops installed, on a live QP; the buffers
        // outlive the calls that read them.
        unsafe {
            let q = &mut *x;
            (q.wr_start.unwrap())(x);
            q.wr_flags = IBV_SEND_SIGNALED;
            q.wr_id = 1;
            (q.wr_rdma_write.unwrap())(x, b.mr.rkey(), b.mr.addr() + 1000);
            (q.wr_set_sge.unwrap())(x, a.mr.lkey(), a.mr.addr(), 16);
            q.wr_id = 2;
            (q.wr_send.unwrap())(x);
            (q.wr_set_inline_data_list.unwrap())(x, 2, list.as_ptr());
            // Copied by the setter: the program may reuse the buffer.
            first.fill(b'!');
            q.wr_id = 3;
            q.wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
            (q.wr_rdma_write.unwrap())(x, b.mr.rkey(), b.mr.addr() + 2000);
            // Inline from an SGE: no lkey, read at wr_complete.
            (q.wr_set_sge.unwrap())(x, 0, third.as_ptr() as u64, third.len() as u32);
            q.wr_id = 4;
            q.wr_flags = IBV_SEND_SIGNALED;
            (q.wr_rdma_write.unwrap())(x, b.mr.rkey(), b.mr.addr() + 3000);
            (q.wr_set_sge.unwrap())(x, a.mr.lkey(), a.mr.addr(), 16);
            assert_eq!((q.wr_complete.unwrap())(x), 0);
        }
        let wc = wait(&mut sim, &a.cq, 4);
        let ids: Vec<u64> = wc.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        assert!(wc.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(read(&b.mr, 1000, 16), [5u8; 16]);
        assert_eq!(read(&b.mr, 2000, third.len()), third);
        assert_eq!(read(&b.mr, 3000, 16), [5u8; 16]);
        let wc = wait(&mut sim, &b.cq, 1);
        assert_eq!((wc[0].byte_len, wc[0].status), (12, WcStatus::Success));
        assert_eq!(read(&b.mr, 0, 12), *b"first second");

        // Inline data on a READ, or too much of it: refused, nothing posted.
        // SAFETY: as above.
        unsafe {
            let q = &mut *x;
            (q.wr_start.unwrap())(x);
            (q.wr_rdma_read.unwrap())(x, b.mr.rkey(), b.mr.addr());
            (q.wr_set_inline_data.unwrap())(x, first.as_mut_ptr() as *mut c_void, 4);
            assert_eq!((q.wr_complete.unwrap())(x), libc::EINVAL);
            let big = [0u8; 257];
            (q.wr_start.unwrap())(x);
            (q.wr_send.unwrap())(x);
            (q.wr_set_inline_data.unwrap())(x, big.as_ptr() as *mut c_void, big.len());
            assert_eq!((q.wr_complete.unwrap())(x), libc::ENOSPC);
            (q.wr_start.unwrap())(x);
            q.wr_flags = IBV_SEND_INLINE;
            (q.wr_send.unwrap())(x);
            (q.wr_set_sge.unwrap())(x, 0, big.as_ptr() as u64, big.len() as u32);
            assert_eq!((q.wr_complete.unwrap())(x), libc::EINVAL);
        }
        assert!(wait(&mut sim, &a.cq, 1).is_empty());
    }
}
