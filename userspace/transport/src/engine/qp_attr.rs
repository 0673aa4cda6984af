//! Queue pair types, attributes, capacities and the IBTA state-transition
//! rule (10.3.1) that `modify_qp` checks.

use std::net::{IpAddr, Ipv4Addr};

use super::error::{Result, TransportError};
use super::memory::AccessFlags;

/// `ibv_qp_type`: RC, UC and UD are implemented (UD: SEND / SEND_WITH_IMM
/// of at most one path MTU, GRH space in receive buffers as in ibverbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    Rc,
    Uc,
    Ud,
}

/// `ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    #[default]
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

impl QpState {
    /// Every state, in `ibv_qp_state` order (IBV_QPS_RESET = 0 ...).
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
}

/// `ibv_mtu`: the RoCE path MTU (payload bytes per packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mtu {
    Mtu256,
    Mtu512,
    #[default]
    Mtu1024,
    Mtu2048,
    Mtu4096,
}

impl Mtu {
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }
    pub fn from_bytes(b: u32) -> Option<Self> {
        Some(match b {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// Where the remote QP lives (`ibv_ah_attr` reduced to what RoCEv2/IPv4
/// needs): next-hop MAC and the peer's IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    pub dest_mac: [u8; 6],
    /// The peer's address: IPv4 (an IPv4-mapped GID) or IPv6.
    pub dest_ip: IpAddr,
    /// DSCP for the IP header (traffic class >> 2).
    pub dscp: u8,
    /// UDP source port; `None` derives one from the QPN like rxe.
    pub udp_sport: Option<u16>,
}

impl Default for AddressVector {
    fn default() -> Self {
        Self {
            dest_mac: [0; 6],
            dest_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dscp: 0,
            udp_sport: None,
        }
    }
}

bitflags::bitflags! {
    /// `ibv_qp_attr_mask` (same bit values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        const STATE = 1 << 0;
        const CUR_STATE = 1 << 1;
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        const ACCESS_FLAGS = 1 << 3;
        const PKEY_INDEX = 1 << 4;
        const PORT = 1 << 5;
        const QKEY = 1 << 6;
        const AV = 1 << 7;
        const PATH_MTU = 1 << 8;
        const TIMEOUT = 1 << 9;
        const RETRY_CNT = 1 << 10;
        const RNR_RETRY = 1 << 11;
        const RQ_PSN = 1 << 12;
        const MAX_QP_RD_ATOMIC = 1 << 13;
        const ALT_PATH = 1 << 14;
        const MIN_RNR_TIMER = 1 << 15;
        const SQ_PSN = 1 << 16;
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        const PATH_MIG_STATE = 1 << 18;
        const CAP = 1 << 19;
        const DEST_QPN = 1 << 20;
    }
}

/// `ibv_qp_attr` (the fields this engine uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub qp_access_flags: AccessFlags,
    pub pkey_index: u16,
    pub port_num: u8,
    pub ah_attr: AddressVector,
    pub path_mtu: Mtu,
    pub dest_qp_num: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    /// Local ACK timeout, encoded: 4.096 us * 2^timeout (0 = infinite).
    pub timeout: u8,
    /// Transport retries (0..=7; 7 means infinite here as in rxe).
    pub retry_cnt: u8,
    /// RNR retries (0..=7; 7 = infinite).
    pub rnr_retry: u8,
    /// Encoded RNR NAK timer this QP advertises as responder.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests this QP may issue.
    pub max_rd_atomic: u8,
    /// READ/atomic requests this QP accepts as responder.
    pub max_dest_rd_atomic: u8,
    /// Q_Key of a UD QP (incoming DETH Q_Keys must match it).
    pub qkey: u32,
}

/// What one side learns about the other out of band (like the
/// `LID:QPN:PSN:GID` string of ibv_rc_pingpong).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    pub qpn: u32,
    /// The peer's initial send PSN (our rq_psn).
    pub psn: u32,
    pub av: AddressVector,
}

/// `ibv_qp_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        Self {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 8,
            max_recv_sge: 8,
            max_inline_data: 256,
        }
    }
}

/// Largest `max_rd_atomic` / `max_dest_rd_atomic` accepted: rxe's
/// (RXE_MAX_QP_RD_ATOM). perftest sets a QP's initiator depth to what the
/// peer device advertises, so against rxe it asks for 128.
pub const MAX_RD_ATOMIC: u8 = 128;

fn req(mask: QpAttrMask, need: QpAttrMask, from: QpState, to: QpState) -> Result<()> {
    let missing = need - mask;
    if missing.is_empty() {
        return Ok(());
    }
    let names = [
        (QpAttrMask::ACCESS_FLAGS, "ACCESS_FLAGS"),
        (QpAttrMask::AV, "AV"),
        (QpAttrMask::PATH_MTU, "PATH_MTU"),
        (QpAttrMask::DEST_QPN, "DEST_QPN"),
        (QpAttrMask::RQ_PSN, "RQ_PSN"),
        (QpAttrMask::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (QpAttrMask::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (QpAttrMask::SQ_PSN, "SQ_PSN"),
        (QpAttrMask::TIMEOUT, "TIMEOUT"),
        (QpAttrMask::RETRY_CNT, "RETRY_CNT"),
        (QpAttrMask::RNR_RETRY, "RNR_RETRY"),
        (QpAttrMask::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (QpAttrMask::QKEY, "QKEY"),
    ];
    let first = names
        .iter()
        .find(|(m, _)| missing.contains(*m))
        .map(|(_, n)| *n)
        .unwrap_or("(other)");
    Err(TransportError::MissingAttributes {
        from,
        to,
        missing: first,
    })
}

/// Validate a modify-QP request for an RC QP in state `cur`; returns the
/// target state. Mirrors the kernel's `ib_modify_qp_is_ok` table for RC:
/// required attributes must be present, illegal transitions are refused.
pub fn check_modify(cur: QpState, attr: &QpAttr, mask: QpAttrMask) -> Result<QpState> {
    check_modify_for(QpType::Rc, cur, attr, mask)
}

/// [`check_modify`] for a QP of type `t` (UC needs no READ/atomic or RNR
/// attributes and no retry/timeout attributes).
pub fn check_modify_for(
    t: QpType,
    cur: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<QpState> {
    let to = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };
    let need = match (cur, to) {
        (_, QpState::Reset) | (_, QpState::Err) => QpAttrMask::empty(),
        (QpState::Reset, QpState::Init) => QpAttrMask::ACCESS_FLAGS,
        (QpState::Init, QpState::Init) => QpAttrMask::empty(),
        (QpState::Init, QpState::Rtr) => {
            QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
        }
        (QpState::Rtr, QpState::Rts) => {
            QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        (QpState::Rts, QpState::Rts)
        | (QpState::Rts, QpState::Sqd)
        | (QpState::Sqd, QpState::Sqd)
        | (QpState::Sqd, QpState::Rts)
        | (QpState::Sqe, QpState::Rts) => QpAttrMask::empty(),
        (from, to) => return Err(TransportError::IllegalTransition { from, to }),
    };
    let need = if t == QpType::Ud {
        match (cur, to) {
            (QpState::Reset, QpState::Init) => QpAttrMask::QKEY,
            (QpState::Rtr, QpState::Rts) => QpAttrMask::SQ_PSN,
            _ => QpAttrMask::empty(),
        }
    } else if t == QpType::Uc {
        need - (QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC)
    } else {
        need
    };
    req(mask, need, cur, to)?;
    if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
        return Err(TransportError::InvalidAttribute(
            "timeout",
            format!("{} > 31", attr.timeout),
        ));
    }
    if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
        return Err(TransportError::InvalidAttribute(
            "retry_cnt",
            format!("{} > 7", attr.retry_cnt),
        ));
    }
    if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
        return Err(TransportError::InvalidAttribute(
            "rnr_retry",
            format!("{} > 7", attr.rnr_retry),
        ));
    }
    if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return Err(TransportError::InvalidAttribute(
            "min_rnr_timer",
            format!("{} > 31", attr.min_rnr_timer),
        ));
    }
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > MAX_RD_ATOMIC {
        return Err(TransportError::InvalidAttribute(
            "max_rd_atomic",
            format!("{} > {MAX_RD_ATOMIC}", attr.max_rd_atomic),
        ));
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > MAX_RD_ATOMIC {
        return Err(TransportError::InvalidAttribute(
            "max_dest_rd_atomic",
            format!("{} > {MAX_RD_ATOMIC}", attr.max_dest_rd_atomic),
        ));
    }
    if mask.contains(QpAttrMask::DEST_QPN) && attr.dest_qp_num > 0xff_ffff {
        return Err(TransportError::InvalidAttribute(
            "dest_qp_num",
            "exceeds 24 bits".into(),
        ));
    }
    if mask.contains(QpAttrMask::RQ_PSN) && attr.rq_psn > 0xff_ffff {
        return Err(TransportError::InvalidAttribute(
            "rq_psn",
            "exceeds 24 bits".into(),
        ));
    }
    if mask.contains(QpAttrMask::SQ_PSN) && attr.sq_psn > 0xff_ffff {
        return Err(TransportError::InvalidAttribute(
            "sq_psn",
            "exceeds 24 bits".into(),
        ));
    }
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legal_path_and_errors() {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            ..Default::default()
        };
        assert!(matches!(
            check_modify(QpState::Reset, &a, QpAttrMask::STATE),
            Err(TransportError::MissingAttributes { .. })
        ));
        assert_eq!(
            check_modify(
                QpState::Reset,
                &a,
                QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS
            ),
            Ok(QpState::Init)
        );
        a.qp_state = QpState::Rts;
        assert!(matches!(
            check_modify(QpState::Init, &a, QpAttrMask::all()),
            Err(TransportError::IllegalTransition { .. })
        ));
        a.qp_state = QpState::Err;
        assert_eq!(
            check_modify(QpState::Rtr, &a, QpAttrMask::STATE),
            Ok(QpState::Err)
        );
        a.qp_state = QpState::Rtr;
        assert!(check_modify(QpState::Err, &a, QpAttrMask::all()).is_err());
        a.qp_state = QpState::Rts;
        a.retry_cnt = 8;
        assert!(matches!(
            check_modify(QpState::Rtr, &a, QpAttrMask::all()),
            Err(TransportError::InvalidAttribute("retry_cnt", _))
        ));
    }
}
