//! Pure helpers rdma-core exports: the `*_str` names of enum values, the
//! IB static-rate conversions, and the field copies between the kernel's
//! `ib_uverbs_*` / `ib_user_path_rec` structs and the verbs structs
//! (librdmacm uses those on what its kernel interface hands back).
//!
//! The strings are rdma-core 44's, byte for byte (programs print them and
//! scripts match them), with its "unknown" for values outside each table.

use std::ffi::{c_char, c_int, CStr};

use crate::abi::*;
use crate::base::errno::ffi;

const UNKNOWN: &CStr = c"unknown";

/// `table[value]`, or "unknown" past its end.
fn lookup(table: &[&'static CStr], value: u32) -> *const c_char {
    table
        .get(value as usize)
        .copied()
        .unwrap_or(UNKNOWN)
        .as_ptr()
}

/// Indexed by `enum ibv_node_type` (IBV_NODE_CA = 1 .. IBV_NODE_UNSPECIFIED
/// = 7); index 0 is not a node type.
const NODE_TYPES: [&CStr; 8] = [
    c"unknown",
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

const PORT_STATES: [&CStr; 6] = [
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

const EVENT_TYPES: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

const WC_STATUSES: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

/// `ibv_node_type_str`.
#[no_mangle]
pub unsafe extern "C" fn ibv_node_type_str(node_type: ibv_node_type) -> *const c_char {
    ffi(UNKNOWN.as_ptr(), || {
        if node_type < IBV_NODE_CA {
            UNKNOWN.as_ptr()
        } else {
            lookup(&NODE_TYPES, node_type as u32)
        }
    })
}

/// `ibv_port_state_str`.
#[no_mangle]
pub unsafe extern "C" fn ibv_port_state_str(port_state: ibv_port_state) -> *const c_char {
    ffi(UNKNOWN.as_ptr(), || lookup(&PORT_STATES, port_state))
}

/// `ibv_event_type_str`.
#[no_mangle]
pub unsafe extern "C" fn ibv_event_type_str(event: ibv_event_type) -> *const c_char {
    ffi(UNKNOWN.as_ptr(), || lookup(&EVENT_TYPES, event))
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub unsafe extern "C" fn ibv_wc_status_str(status: ibv_wc_status) -> *const c_char {
    ffi(UNKNOWN.as_ptr(), || lookup(&WC_STATUSES, status))
}

/// Every static rate: its enum value, its multiple of 2.5 Gb/s (None for
/// the rates that are not one: FDR/EDR-style signalling) and its Mb/s.
const RATES: [(ibv_rate, Option<c_int>, c_int); 23] = [
    (IBV_RATE_2_5_GBPS, Some(1), 2500),
    (IBV_RATE_5_GBPS, Some(2), 5000),
    (IBV_RATE_10_GBPS, Some(4), 10000),
    (IBV_RATE_20_GBPS, Some(8), 20000),
    (IBV_RATE_30_GBPS, Some(12), 30000),
    (IBV_RATE_40_GBPS, Some(16), 40000),
    (IBV_RATE_60_GBPS, Some(24), 60000),
    (IBV_RATE_80_GBPS, Some(32), 80000),
    (IBV_RATE_120_GBPS, Some(48), 120000),
    (IBV_RATE_14_GBPS, None, 14062),
    (IBV_RATE_56_GBPS, None, 56250),
    (IBV_RATE_112_GBPS, None, 112500),
    (IBV_RATE_168_GBPS, None, 168750),
    (IBV_RATE_25_GBPS, None, 25781),
    (IBV_RATE_100_GBPS, None, 103125),
    (IBV_RATE_200_GBPS, None, 206250),
    (IBV_RATE_300_GBPS, None, 309375),
    (IBV_RATE_28_GBPS, Some(11), 28125),
    (IBV_RATE_50_GBPS, Some(20), 53125),
    (IBV_RATE_400_GBPS, Some(160), 425000),
    (IBV_RATE_600_GBPS, Some(240), 637500),
    (IBV_RATE_800_GBPS, Some(320), 850000),
    (IBV_RATE_1200_GBPS, Some(480), 1275000),
];

pub(crate) fn rate_to_mult(rate: ibv_rate) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate)
        .and_then(|r| r.1)
        .unwrap_or(-1)
}

pub(crate) fn mult_to_rate(mult: c_int) -> ibv_rate {
    RATES
        .iter()
        .find(|r| r.1 == Some(mult))
        .map(|r| r.0)
        .unwrap_or(IBV_RATE_MAX)
}

pub(crate) fn rate_to_mbps(rate: ibv_rate) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate)
        .map(|r| r.2)
        .unwrap_or(-1)
}

pub(crate) fn mbps_to_rate(mbps: c_int) -> ibv_rate {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map(|r| r.0)
        .unwrap_or(IBV_RATE_MAX)
}

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s, -1 if it is
/// not one.
#[no_mangle]
pub unsafe extern "C" fn ibv_rate_to_mult(rate: ibv_rate) -> c_int {
    ffi(-1, || rate_to_mult(rate))
}

/// `mult_to_ibv_rate`: IBV_RATE_MAX for a multiple no rate has.
#[no_mangle]
pub unsafe extern "C" fn mult_to_ibv_rate(mult: c_int) -> ibv_rate {
    ffi(IBV_RATE_MAX, || mult_to_rate(mult))
}

/// `ibv_rate_to_mbps`: -1 for an unknown rate.
#[no_mangle]
pub unsafe extern "C" fn ibv_rate_to_mbps(rate: ibv_rate) -> c_int {
    ffi(-1, || rate_to_mbps(rate))
}

/// `mbps_to_ibv_rate`: exact values only; IBV_RATE_MAX otherwise.
#[no_mangle]
pub unsafe extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> ibv_rate {
    ffi(IBV_RATE_MAX, || mbps_to_rate(mbps))
}

fn ah_attr_from_kern(dst: &mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    dst.grh.dgid.raw = src.grh.dgid;
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

/// The fields rdma-core copies; `qp_state` is not one of them (callers
/// set it themselves), nor is `rate_limit`.
fn qp_attr_from_kern(dst: &mut ibv_qp_attr, src: &ib_uverbs_qp_attr) {
    dst.cur_qp_state = src.cur_qp_state;
    dst.path_mtu = src.path_mtu;
    dst.path_mig_state = src.path_mig_state;
    dst.qkey = src.qkey;
    dst.rq_psn = src.rq_psn;
    dst.sq_psn = src.sq_psn;
    dst.dest_qp_num = src.dest_qp_num;
    dst.qp_access_flags = src.qp_access_flags;
    dst.cap.max_send_wr = src.max_send_wr;
    dst.cap.max_recv_wr = src.max_recv_wr;
    dst.cap.max_send_sge = src.max_send_sge;
    dst.cap.max_recv_sge = src.max_recv_sge;
    dst.cap.max_inline_data = src.max_inline_data;
    ah_attr_from_kern(&mut dst.ah_attr, &src.ah_attr);
    ah_attr_from_kern(&mut dst.alt_ah_attr, &src.alt_ah_attr);
    dst.pkey_index = src.pkey_index;
    dst.alt_pkey_index = src.alt_pkey_index;
    dst.en_sqd_async_notify = src.en_sqd_async_notify;
    dst.sq_draining = src.sq_draining;
    dst.max_rd_atomic = src.max_rd_atomic;
    dst.max_dest_rd_atomic = src.max_dest_rd_atomic;
    dst.min_rnr_timer = src.min_rnr_timer;
    dst.port_num = src.port_num;
    dst.timeout = src.timeout;
    dst.retry_cnt = src.retry_cnt;
    dst.rnr_retry = src.rnr_retry;
    dst.alt_port_num = src.alt_port_num;
    dst.alt_timeout = src.alt_timeout;
}

/// Path record fields, kernel -> verbs (the kernel's u32 flags become the
/// verbs struct's ints and bytes, as C's assignments convert them).
fn path_rec_from_kern(dst: &mut ibv_sa_path_rec, src: &ib_user_path_rec) {
    dst.dgid.raw = src.dgid;
    dst.sgid.raw = src.sgid;
    dst.dlid = src.dlid;
    dst.slid = src.slid;
    dst.raw_traffic = src.raw_traffic as c_int;
    dst.flow_label = src.flow_label;
    dst.hop_limit = src.hop_limit;
    dst.traffic_class = src.traffic_class;
    dst.reversible = src.reversible as c_int;
    dst.numb_path = src.numb_path;
    dst.pkey = src.pkey;
    dst.sl = src.sl;
    dst.mtu_selector = src.mtu_selector;
    dst.mtu = src.mtu as u8;
    dst.rate_selector = src.rate_selector;
    dst.rate = src.rate;
    dst.packet_life_time = src.packet_life_time;
    dst.preference = src.preference;
    dst.packet_life_time_selector = src.packet_life_time_selector;
}

fn path_rec_to_kern(dst: &mut ib_user_path_rec, src: &ibv_sa_path_rec) {
    // SAFETY: every bit pattern of the union is a valid byte array.
    dst.dgid = unsafe { src.dgid.raw };
    // SAFETY: as above.
    dst.sgid = unsafe { src.sgid.raw };
    dst.dlid = src.dlid;
    dst.slid = src.slid;
    dst.raw_traffic = src.raw_traffic as u32;
    dst.flow_label = src.flow_label;
    dst.hop_limit = src.hop_limit;
    dst.traffic_class = src.traffic_class;
    dst.reversible = src.reversible as u32;
    dst.numb_path = src.numb_path;
    dst.pkey = src.pkey;
    dst.sl = src.sl;
    dst.mtu_selector = src.mtu_selector;
    dst.mtu = src.mtu as u32;
    dst.rate_selector = src.rate_selector;
    dst.rate = src.rate;
    dst.packet_life_time = src.packet_life_time;
    dst.preference = src.preference;
    dst.packet_life_time_selector = src.packet_life_time_selector;
}

/// `ibv_copy_ah_attr_from_kern`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *mut ib_uverbs_ah_attr,
) {
    ffi((), || {
        // SAFETY: the caller passes valid, non-overlapping structs (or
        // NULL, which we ignore).
        if let (Some(d), Some(s)) = unsafe { (dst.as_mut(), src.as_ref()) } {
            ah_attr_from_kern(d, s);
        }
    })
}

/// `ibv_copy_qp_attr_from_kern`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *mut ib_uverbs_qp_attr,
) {
    ffi((), || {
        // SAFETY: as in ibv_copy_ah_attr_from_kern.
        if let (Some(d), Some(s)) = unsafe { (dst.as_mut(), src.as_ref()) } {
            qp_attr_from_kern(d, s);
        }
    })
}

/// `ibv_copy_path_rec_from_kern`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *mut ib_user_path_rec,
) {
    ffi((), || {
        // SAFETY: as in ibv_copy_ah_attr_from_kern.
        if let (Some(d), Some(s)) = unsafe { (dst.as_mut(), src.as_ref()) } {
            path_rec_from_kern(d, s);
        }
    })
}

/// `ibv_copy_path_rec_to_kern`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *mut ibv_sa_path_rec,
) {
    ffi((), || {
        // SAFETY: as in ibv_copy_ah_attr_from_kern.
        if let (Some(d), Some(s)) = unsafe { (dst.as_mut(), src.as_ref()) } {
            path_rec_to_kern(d, s);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: *const c_char) -> &'static str {
        // SAFETY: every pointer these functions return is a static C string.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn enum_strings_match_rdma_core() {
        // SAFETY: the functions take plain values.
        unsafe {
            assert_eq!(s(ibv_wc_status_str(IBV_WC_SUCCESS)), "success");
            assert_eq!(
                s(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR)),
                "Work Request Flushed Error"
            );
            assert_eq!(
                s(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR)),
                "transport retry counter exceeded"
            );
            assert_eq!(
                s(ibv_wc_status_str(IBV_WC_TM_RNDV_INCOMPLETE)),
                "TM software rendezvous"
            );
            assert_eq!(s(ibv_wc_status_str(24)), "unknown");
            assert_eq!(s(ibv_wc_status_str(u32::MAX)), "unknown");
            assert_eq!(s(ibv_event_type_str(IBV_EVENT_CQ_ERR)), "CQ error");
            assert_eq!(s(ibv_event_type_str(IBV_EVENT_WQ_FATAL)), "WQ fatal");
            assert_eq!(s(ibv_event_type_str(20)), "unknown");
            assert_eq!(
                s(ibv_node_type_str(IBV_NODE_CA)),
                "InfiniBand channel adapter"
            );
            assert_eq!(s(ibv_node_type_str(IBV_NODE_UNSPECIFIED)), "unspecified");
            assert_eq!(s(ibv_node_type_str(IBV_NODE_UNKNOWN)), "unknown");
            assert_eq!(s(ibv_node_type_str(0)), "unknown");
            assert_eq!(s(ibv_node_type_str(8)), "unknown");
            assert_eq!(s(ibv_port_state_str(IBV_PORT_ACTIVE)), "active");
            assert_eq!(s(ibv_port_state_str(IBV_PORT_NOP)), "no state change (NOP)");
            assert_eq!(s(ibv_port_state_str(6)), "unknown");
        }
        assert_eq!(WC_STATUSES.len() as u32, IBV_WC_TM_RNDV_INCOMPLETE + 1);
        assert_eq!(EVENT_TYPES.len() as u32, IBV_EVENT_WQ_FATAL + 1);
    }

    #[test]
    fn rates_convert_both_ways() {
        assert_eq!(rate_to_mult(IBV_RATE_2_5_GBPS), 1);
        assert_eq!(rate_to_mult(IBV_RATE_40_GBPS), 16);
        assert_eq!(rate_to_mult(IBV_RATE_50_GBPS), 20);
        assert_eq!(rate_to_mult(IBV_RATE_25_GBPS), -1);
        assert_eq!(rate_to_mult(IBV_RATE_MAX), -1);
        assert_eq!(mult_to_rate(16), IBV_RATE_40_GBPS);
        assert_eq!(mult_to_rate(480), IBV_RATE_1200_GBPS);
        assert_eq!(mult_to_rate(3), IBV_RATE_MAX);
        assert_eq!(rate_to_mbps(IBV_RATE_100_GBPS), 103125);
        assert_eq!(rate_to_mbps(IBV_RATE_14_GBPS), 14062);
        assert_eq!(rate_to_mbps(99), -1);
        assert_eq!(mbps_to_rate(25781), IBV_RATE_25_GBPS);
        assert_eq!(mbps_to_rate(25000), IBV_RATE_MAX);
        for (rate, mult, mbps) in RATES {
            assert_eq!(mbps_to_rate(mbps), rate);
            if let Some(m) = mult {
                assert_eq!(mult_to_rate(m), rate);
            }
        }
    }

    #[test]
    fn kern_copies() {
        let mut k = ib_uverbs_qp_attr {
            qp_state: 3,
            cur_qp_state: 2,
            path_mtu: 5,
            qkey: 0x1111_1111,
            dest_qp_num: 0x12,
            max_send_wr: 7,
            max_inline_data: 64,
            min_rnr_timer: 12,
            alt_timeout: 9,
            ..Default::default()
        };
        k.ah_attr.grh.dgid[15] = 0xaa;
        k.ah_attr.grh.hop_limit = 64;
        k.ah_attr.is_global = 1;
        k.ah_attr.port_num = 1;
        let mut a = ibv_qp_attr::default();
        // SAFETY: both point at live locals.
        unsafe { ibv_copy_qp_attr_from_kern(&mut a, &mut k) };
        assert_eq!(a.qp_state, 0, "rdma-core does not copy qp_state");
        assert_eq!((a.cur_qp_state, a.path_mtu, a.qkey), (2, 5, 0x1111_1111));
        assert_eq!(
            (a.dest_qp_num, a.cap.max_send_wr, a.cap.max_inline_data),
            (0x12, 7, 64)
        );
        assert_eq!((a.min_rnr_timer, a.alt_timeout), (12, 9));
        // SAFETY: reading the byte view of a GID.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }[15], 0xaa);
        assert_eq!((a.ah_attr.grh.hop_limit, a.ah_attr.is_global), (64, 1));

        let mut kp = ib_user_path_rec {
            dgid: [1; 16],
            sgid: [2; 16],
            dlid: 0x1234u16.to_be(),
            reversible: 1,
            mtu: 5,
            rate: 7,
            packet_life_time_selector: 2,
            ..Default::default()
        };
        let mut p = ibv_sa_path_rec::default();
        // SAFETY: both point at live locals.
        unsafe { ibv_copy_path_rec_from_kern(&mut p, &mut kp) };
        // SAFETY: reading the byte view of a GID.
        assert_eq!(unsafe { (p.dgid.raw, p.sgid.raw) }, ([1; 16], [2; 16]));
        assert_eq!(
            (p.dlid, p.reversible, p.mtu, p.rate),
            (0x1234u16.to_be(), 1, 5, 7)
        );
        assert_eq!(p.packet_life_time_selector, 2);
        let mut back = ib_user_path_rec::default();
        // SAFETY: both point at live locals.
        unsafe { ibv_copy_path_rec_to_kern(&mut back, &mut p) };
        assert_eq!(
            (back.dgid, back.sgid, back.dlid),
            (kp.dgid, kp.sgid, kp.dlid)
        );
        assert_eq!((back.mtu, back.rate, back.reversible), (5, 7, 1));
    }
}
