//! Connection management MADs (IBTA vol.1 chapter 12, management class
//! 0x07, class version 2): REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ
//! and SIDR_REP field by field; LAP and APR recognised and kept opaque.
//!
//! Byte offsets below are from the start of the CM data (MAD byte 24).
//! Bit-packed fields follow the spec: a field that starts at byte B, bit 0
//! begins at B's most significant bit. Reserved bits are ignored on parse
//! and written as zero. Private data is the whole fixed field on parse
//! (the wire has no length); `emit` takes up to the field's size and pads
//! with zeros. rdma_cm's use of the private data and service IDs is in
//! [`crate::rdma_cm`].

use core::fmt;

use crate::bytes::{be16, be24, be32, be64, put16, put24, put32, put64};
use crate::gid::Gid;
use crate::mad::{MadError, MadHeader, CLASS_CM, HEADER_LEN, MAD_LEN};

/// The CM class version Linux and the spec use.
pub const CM_CLASS_VERSION: u8 = 2;
/// Bytes of CM data after the MAD header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;

/// CM attribute IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Attribute {
    Req = 0x0010,
    Mra = 0x0011,
    Rej = 0x0012,
    Rep = 0x0013,
    Rtu = 0x0014,
    Dreq = 0x0015,
    Drep = 0x0016,
    SidrReq = 0x0017,
    SidrRep = 0x0018,
    Lap = 0x0019,
    Apr = 0x001a,
}

impl Attribute {
    pub fn from_u16(v: u16) -> Result<Attribute, MadError> {
        Ok(match v {
            0x0010 => Attribute::Req,
            0x0011 => Attribute::Mra,
            0x0012 => Attribute::Rej,
            0x0013 => Attribute::Rep,
            0x0014 => Attribute::Rtu,
            0x0015 => Attribute::Dreq,
            0x0016 => Attribute::Drep,
            0x0017 => Attribute::SidrReq,
            0x0018 => Attribute::SidrRep,
            0x0019 => Attribute::Lap,
            0x001a => Attribute::Apr,
            other => return Err(MadError::UnknownAttribute(other)),
        })
    }

    /// The spec's short name ("REQ", "SIDR_REP", ...).
    pub const fn name(self) -> &'static str {
        match self {
            Attribute::Req => "REQ",
            Attribute::Mra => "MRA",
            Attribute::Rej => "REJ",
            Attribute::Rep => "REP",
            Attribute::Rtu => "RTU",
            Attribute::Dreq => "DREQ",
            Attribute::Drep => "DREP",
            Attribute::SidrReq => "SIDR_REQ",
            Attribute::SidrRep => "SIDR_REP",
            Attribute::Lap => "LAP",
            Attribute::Apr => "APR",
        }
    }

    /// Where the message's private data starts (CM data offset) and its
    /// size; `None` for LAP/APR, which this codec keeps opaque.
    pub const fn private_data_field(self) -> Option<(usize, usize)> {
        match self {
            Attribute::Req => Some((140, 92)),
            Attribute::Mra => Some((10, 222)),
            Attribute::Rej => Some((84, 148)),
            Attribute::Rep => Some((36, 196)),
            Attribute::Rtu => Some((8, 224)),
            Attribute::Dreq => Some((12, 220)),
            Attribute::Drep => Some((8, 224)),
            Attribute::SidrReq => Some((16, 216)),
            Attribute::SidrRep => Some((96, 136)),
            Attribute::Lap | Attribute::Apr => None,
        }
    }

    /// The most private data the message carries.
    pub const fn max_private_data(self) -> usize {
        match self.private_data_field() {
            Some((_, len)) => len,
            None => 0,
        }
    }
}

/// The REJ message's reason codes (IBTA vol.1 chapter 12; names as ib_cm has them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejReason {
    NoQp,
    NoEec,
    NoResources,
    Timeout,
    Unsupported,
    InvalidCommId,
    InvalidCommInstance,
    InvalidServiceId,
    InvalidTransportType,
    StaleConn,
    RdcNotExist,
    InvalidGid,
    InvalidLid,
    InvalidSl,
    InvalidTrafficClass,
    InvalidHopLimit,
    InvalidPacketRate,
    InvalidAltGid,
    InvalidAltLid,
    InvalidAltSl,
    InvalidAltTrafficClass,
    InvalidAltHopLimit,
    InvalidAltPacketRate,
    PortCmRedirect,
    PortRedirect,
    InvalidMtu,
    InsufficientRespResources,
    ConsumerDefined,
    InvalidRnrRetry,
    DuplicateLocalCommId,
    InvalidClassVersion,
    InvalidFlowLabel,
    InvalidAltFlowLabel,
    VendorOptionNotSupported,
    /// A code the spec does not define (kept so it re-emits).
    Other(u16),
}

/// (reason, code, name): the one table both directions read.
const REJ_REASONS: [(RejReason, u16, &str); 34] = [
    (RejReason::NoQp, 1, "no QP"),
    (RejReason::NoEec, 2, "no EEC"),
    (RejReason::NoResources, 3, "no resources"),
    (RejReason::Timeout, 4, "timeout"),
    (RejReason::Unsupported, 5, "unsupported request"),
    (RejReason::InvalidCommId, 6, "invalid communication ID"),
    (
        RejReason::InvalidCommInstance,
        7,
        "invalid communication instance",
    ),
    (RejReason::InvalidServiceId, 8, "invalid service ID"),
    (
        RejReason::InvalidTransportType,
        9,
        "invalid transport service type",
    ),
    (RejReason::StaleConn, 10, "stale connection"),
    (RejReason::RdcNotExist, 11, "RDC does not exist"),
    (RejReason::InvalidGid, 12, "invalid GID"),
    (RejReason::InvalidLid, 13, "invalid LID"),
    (RejReason::InvalidSl, 14, "invalid SL"),
    (RejReason::InvalidTrafficClass, 15, "invalid traffic class"),
    (RejReason::InvalidHopLimit, 16, "invalid hop limit"),
    (RejReason::InvalidPacketRate, 17, "invalid packet rate"),
    (RejReason::InvalidAltGid, 18, "invalid alternate GID"),
    (RejReason::InvalidAltLid, 19, "invalid alternate LID"),
    (RejReason::InvalidAltSl, 20, "invalid alternate SL"),
    (
        RejReason::InvalidAltTrafficClass,
        21,
        "invalid alternate traffic class",
    ),
    (
        RejReason::InvalidAltHopLimit,
        22,
        "invalid alternate hop limit",
    ),
    (
        RejReason::InvalidAltPacketRate,
        23,
        "invalid alternate packet rate",
    ),
    (RejReason::PortCmRedirect, 24, "port and CM redirection"),
    (RejReason::PortRedirect, 25, "port redirection"),
    (RejReason::InvalidMtu, 26, "invalid path MTU"),
    (
        RejReason::InsufficientRespResources,
        27,
        "insufficient responder resources",
    ),
    (RejReason::ConsumerDefined, 28, "consumer reject"),
    (
        RejReason::InvalidRnrRetry,
        29,
        "invalid RNR NAK retry count",
    ),
    (
        RejReason::DuplicateLocalCommId,
        30,
        "duplicate local communication ID",
    ),
    (RejReason::InvalidClassVersion, 31, "invalid class version"),
    (RejReason::InvalidFlowLabel, 32, "invalid flow label"),
    (
        RejReason::InvalidAltFlowLabel,
        33,
        "invalid alternate flow label",
    ),
    (
        RejReason::VendorOptionNotSupported,
        35,
        "vendor option not supported",
    ),
];

impl RejReason {
    pub fn from_u16(code: u16) -> RejReason {
        REJ_REASONS
            .iter()
            .find(|(_, c, _)| *c == code)
            .map_or(RejReason::Other(code), |(r, _, _)| *r)
    }
    pub fn code(self) -> u16 {
        match self {
            RejReason::Other(c) => c,
            r => REJ_REASONS
                .iter()
                .find(|(x, _, _)| *x == r)
                .map_or(0, |(_, c, _)| *c),
        }
    }
    /// What the reason means ("invalid service ID"); "unknown" for `Other`.
    pub fn name(self) -> &'static str {
        REJ_REASONS
            .iter()
            .find(|(x, _, _)| *x == self)
            .map_or("unknown", |(_, _, n)| n)
    }
}

impl fmt::Display for RejReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// The message a REJ or MRA refers to (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageRef {
    Req = 0,
    Rep = 1,
    /// LAP for an MRA, "other" for a REJ.
    Other = 2,
    Reserved = 3,
}

impl MessageRef {
    fn from_bits(v: u8) -> MessageRef {
        match v & 3 {
            0 => MessageRef::Req,
            1 => MessageRef::Rep,
            2 => MessageRef::Other,
            _ => MessageRef::Reserved,
        }
    }
}

/// The REQ's transport service type (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportType {
    Rc = 0,
    Uc = 1,
    Rd = 2,
    /// "Extended": see the REQ's extended transport type (XRC is 1).
    Extended = 3,
}

impl TransportType {
    fn from_bits(v: u8) -> TransportType {
        match v & 3 {
            0 => TransportType::Rc,
            1 => TransportType::Uc,
            2 => TransportType::Rd,
            _ => TransportType::Extended,
        }
    }
}

/// SIDR_REP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SidrStatus {
    Success,
    ServiceIdNotSupported,
    Rejected,
    NoQp,
    Redirect,
    UnsupportedVersion,
    Other(u8),
}

impl SidrStatus {
    pub fn from_u8(v: u8) -> SidrStatus {
        match v {
            0 => SidrStatus::Success,
            1 => SidrStatus::ServiceIdNotSupported,
            2 => SidrStatus::Rejected,
            3 => SidrStatus::NoQp,
            4 => SidrStatus::Redirect,
            5 => SidrStatus::UnsupportedVersion,
            o => SidrStatus::Other(o),
        }
    }
    pub fn code(self) -> u8 {
        match self {
            SidrStatus::Success => 0,
            SidrStatus::ServiceIdNotSupported => 1,
            SidrStatus::Rejected => 2,
            SidrStatus::NoQp => 3,
            SidrStatus::Redirect => 4,
            SidrStatus::UnsupportedVersion => 5,
            SidrStatus::Other(o) => o,
        }
    }
}

/// The IB MTU code of "path packet payload MTU" in bytes (1 = 256 ...
/// 5 = 4096); `None` for reserved codes.
pub const fn ib_mtu_bytes(code: u8) -> Option<u32> {
    match code {
        1..=5 => Some(128 << code),
        _ => None,
    }
}

/// One path of a REQ (primary or alternate): 44 bytes. Over RoCE the LIDs
/// are 0xffff ("permissive") or 0 and the GIDs are the ports' RoCE GIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRepr {
    pub local_lid: u16,
    pub remote_lid: u16,
    pub local_gid: Gid,
    pub remote_gid: Gid,
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits (IB rate code).
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    pub subnet_local: bool,
    /// 5 bits (4.096 us * 2^n).
    pub local_ack_timeout: u8,
}

const PATH_LEN: usize = 44;

impl PathRepr {
    fn parse(b: &[u8]) -> PathRepr {
        let mut lg = [0u8; 16];
        let mut rg = [0u8; 16];
        lg.copy_from_slice(&b[4..20]);
        rg.copy_from_slice(&b[20..36]);
        PathRepr {
            local_lid: be16(b, 0),
            remote_lid: be16(b, 2),
            local_gid: Gid(lg),
            remote_gid: Gid(rg),
            flow_label: be32(b, 36) >> 12,
            packet_rate: b[39] & 0x3f,
            traffic_class: b[40],
            hop_limit: b[41],
            sl: b[42] >> 4,
            subnet_local: b[42] & 0x08 != 0,
            local_ack_timeout: b[43] >> 3,
        }
    }

    fn check(&self) -> Result<(), MadError> {
        fits("flow_label", self.flow_label, 20)?;
        fits("packet_rate", self.packet_rate.into(), 6)?;
        fits("sl", self.sl.into(), 4)?;
        fits("local_ack_timeout", self.local_ack_timeout.into(), 5)
    }

    /// Writes the path into `b` (44 bytes); `extra_bit` is the bit the REQ
    /// keeps in the last byte after the alternate path (SAP supported).
    fn emit(&self, b: &mut [u8], extra_bit: bool) {
        put16(b, 0, self.local_lid);
        put16(b, 2, self.remote_lid);
        b[4..20].copy_from_slice(&self.local_gid.0);
        b[20..36].copy_from_slice(&self.remote_gid.0);
        put32(b, 36, (self.flow_label << 12) | u32::from(self.packet_rate));
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = (self.sl << 4) | (u8::from(self.subnet_local) << 3);
        b[43] = (self.local_ack_timeout << 3) | (u8::from(extra_bit) << 2);
    }
}

/// REQ: a connection request (CM data 0..140, private data 92 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqRepr<'a> {
    pub local_comm_id: u32,
    /// 24 bits (ECE: 0 unless both sides agree on options).
    pub vendor_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    pub responder_resources: u8,
    /// 24 bits.
    pub local_eecn: u32,
    pub initiator_depth: u8,
    /// 24 bits.
    pub remote_eecn: u32,
    /// 5 bits (4.096 us * 2^n).
    pub remote_cm_response_timeout: u8,
    pub transport_type: TransportType,
    pub end_to_end_flow_control: bool,
    /// 24 bits.
    pub starting_psn: u32,
    /// 5 bits.
    pub local_cm_response_timeout: u8,
    /// 3 bits.
    pub retry_count: u8,
    pub pkey: u16,
    /// 4 bits, IB MTU code (see [`ib_mtu_bytes`]).
    pub path_mtu: u8,
    pub rdc_exists: bool,
    /// 3 bits (7 = infinite).
    pub rnr_retry_count: u8,
    /// 4 bits.
    pub max_cm_retries: u8,
    pub srq: bool,
    /// 3 bits.
    pub extended_transport_type: u8,
    pub primary_path: PathRepr,
    /// `None` when every field of the alternate path is zero (none given).
    pub alternate_path: Option<PathRepr>,
    pub sap_supported: bool,
    pub private_data: &'a [u8],
}

/// MRA: message receipt acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MraRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_mraed: MessageRef,
    /// 5 bits.
    pub service_timeout: u8,
    pub private_data: &'a [u8],
}

/// REJ: a connection rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_rejected: MessageRef,
    pub reason: RejReason,
    /// Additional rejection information: the first "reject info length"
    /// bytes of the 72-byte field.
    pub ari: &'a [u8],
    pub private_data: &'a [u8],
}

/// REP: a connection reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RepRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// 24 bits, split over three bytes of the message.
    pub vendor_id: u32,
    /// 24 bits.
    pub local_eecn: u32,
    /// 24 bits.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: &'a [u8],
}

/// RTU or DREP: the two comm IDs and private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommIdsRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: &'a [u8],
}

/// DREQ: a disconnection request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DreqRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits: the QP the receiver should disconnect (its own).
    pub remote_qpn: u32,
    pub private_data: &'a [u8],
}

/// SIDR_REQ: service ID resolution request (UD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReqRepr<'a> {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: &'a [u8],
}

/// SIDR_REP: service ID resolution reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRepRepr<'a> {
    pub request_id: u32,
    pub status: SidrStatus,
    /// 24 bits.
    pub vendor_id: u32,
    /// 24 bits.
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    /// The first "additional information length" bytes of the 72-byte field.
    pub additional_info: &'a [u8],
    pub private_data: &'a [u8],
}

/// One CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage<'a> {
    Req(ReqRepr<'a>),
    Mra(MraRepr<'a>),
    Rej(RejRepr<'a>),
    Rep(RepRepr<'a>),
    Rtu(CommIdsRepr<'a>),
    Dreq(DreqRepr<'a>),
    Drep(CommIdsRepr<'a>),
    SidrReq(SidrReqRepr<'a>),
    SidrRep(SidrRepRepr<'a>),
    /// The 232 bytes of CM data, unparsed.
    Lap(&'a [u8]),
    /// The 232 bytes of CM data, unparsed.
    Apr(&'a [u8]),
}

impl CmMessage<'_> {
    pub fn attribute(&self) -> Attribute {
        match self {
            CmMessage::Req(_) => Attribute::Req,
            CmMessage::Mra(_) => Attribute::Mra,
            CmMessage::Rej(_) => Attribute::Rej,
            CmMessage::Rep(_) => Attribute::Rep,
            CmMessage::Rtu(_) => Attribute::Rtu,
            CmMessage::Dreq(_) => Attribute::Dreq,
            CmMessage::Drep(_) => Attribute::Drep,
            CmMessage::SidrReq(_) => Attribute::SidrReq,
            CmMessage::SidrRep(_) => Attribute::SidrRep,
            CmMessage::Lap(_) => Attribute::Lap,
            CmMessage::Apr(_) => Attribute::Apr,
        }
    }

    /// The message's private data (the whole field after a parse); empty
    /// for LAP/APR.
    pub fn private_data(&self) -> &[u8] {
        match self {
            CmMessage::Req(m) => m.private_data,
            CmMessage::Mra(m) => m.private_data,
            CmMessage::Rej(m) => m.private_data,
            CmMessage::Rep(m) => m.private_data,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.private_data,
            CmMessage::Dreq(m) => m.private_data,
            CmMessage::SidrReq(m) => m.private_data,
            CmMessage::SidrRep(m) => m.private_data,
            CmMessage::Lap(_) | CmMessage::Apr(_) => &[],
        }
    }
}

/// A whole CM MAD: the common header (its attribute ID is the message's)
/// and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMadRepr<'a> {
    /// Method, status, class-specific, TID and attribute modifier as sent;
    /// base version, class, class version and attribute ID are checked on
    /// parse and written from the message on emit.
    pub header: MadHeader,
    pub message: CmMessage<'a>,
}

fn fits(name: &'static str, v: u32, bits: u32) -> Result<(), MadError> {
    if v >> bits != 0 {
        return Err(MadError::FieldOverflow(name));
    }
    Ok(())
}

fn put_private(d: &mut [u8], attr: Attribute, pd: &[u8]) -> Result<(), MadError> {
    if let Some((off, max)) = attr.private_data_field() {
        if pd.len() > max {
            return Err(MadError::PrivateDataTooLong { max, len: pd.len() });
        }
        d[off..off + pd.len()].copy_from_slice(pd);
    }
    Ok(())
}

impl<'a> CmMadRepr<'a> {
    /// A SEND with status 0 and attribute modifier 0, as ib_cm sends.
    pub fn new(transaction_id: u64, message: CmMessage<'a>) -> Self {
        CmMadRepr {
            header: MadHeader::send(
                CLASS_CM,
                CM_CLASS_VERSION,
                message.attribute() as u16,
                transaction_id,
            ),
            message,
        }
    }

    /// Parses a whole MAD (the UD SEND payload to QP1; longer buffers are
    /// read up to [`MAD_LEN`]): base version 1, class CM, class version 2,
    /// a known attribute.
    pub fn parse(buf: &'a [u8]) -> Result<CmMadRepr<'a>, MadError> {
        let header = MadHeader::parse(buf)?;
        if header.mgmt_class != CLASS_CM {
            return Err(MadError::WrongClass(header.mgmt_class));
        }
        if header.class_version != CM_CLASS_VERSION {
            return Err(MadError::BadClassVersion(header.class_version));
        }
        let attr = Attribute::from_u16(header.attribute_id)?;
        let d = &buf[HEADER_LEN..MAD_LEN];
        let pd = match attr.private_data_field() {
            Some((off, len)) => &d[off..off + len],
            None => &[][..],
        };
        let message = match attr {
            Attribute::Req => {
                let alt = PathRepr::parse(&d[96..96 + PATH_LEN]);
                CmMessage::Req(ReqRepr {
                    local_comm_id: be32(d, 0),
                    vendor_id: be24(d, 5),
                    service_id: be64(d, 8),
                    local_ca_guid: be64(d, 16),
                    local_qkey: be32(d, 28),
                    local_qpn: be24(d, 32),
                    responder_resources: d[35],
                    local_eecn: be24(d, 36),
                    initiator_depth: d[39],
                    remote_eecn: be24(d, 40),
                    remote_cm_response_timeout: d[43] >> 3,
                    transport_type: TransportType::from_bits(d[43] >> 1),
                    end_to_end_flow_control: d[43] & 1 != 0,
                    starting_psn: be24(d, 44),
                    local_cm_response_timeout: d[47] >> 3,
                    retry_count: d[47] & 7,
                    pkey: be16(d, 48),
                    path_mtu: d[50] >> 4,
                    rdc_exists: d[50] & 0x08 != 0,
                    rnr_retry_count: d[50] & 7,
                    max_cm_retries: d[51] >> 4,
                    srq: d[51] & 0x08 != 0,
                    extended_transport_type: d[51] & 7,
                    primary_path: PathRepr::parse(&d[52..52 + PATH_LEN]),
                    alternate_path: (alt != PathRepr::default()).then_some(alt),
                    sap_supported: d[139] & 0x04 != 0,
                    private_data: pd,
                })
            }
            Attribute::Mra => CmMessage::Mra(MraRepr {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                message_mraed: MessageRef::from_bits(d[8] >> 6),
                service_timeout: d[9] >> 3,
                private_data: pd,
            }),
            Attribute::Rej => {
                let ari_len = usize::from(d[9] >> 1);
                if ari_len > 72 {
                    return Err(MadError::FieldOverflow("reject_info_length"));
                }
                CmMessage::Rej(RejRepr {
                    local_comm_id: be32(d, 0),
                    remote_comm_id: be32(d, 4),
                    message_rejected: MessageRef::from_bits(d[8] >> 6),
                    reason: RejReason::from_u16(be16(d, 10)),
                    ari: &d[12..12 + ari_len],
                    private_data: pd,
                })
            }
            Attribute::Rep => CmMessage::Rep(RepRepr {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                local_qkey: be32(d, 8),
                local_qpn: be24(d, 12),
                vendor_id: (u32::from(d[15]) << 16) | (u32::from(d[19]) << 8) | u32::from(d[23]),
                local_eecn: be24(d, 16),
                starting_psn: be24(d, 20),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: d[26] >> 3,
                failover_accepted: (d[26] >> 1) & 3,
                end_to_end_flow_control: d[26] & 1 != 0,
                rnr_retry_count: d[27] >> 5,
                srq: d[27] & 0x10 != 0,
                local_ca_guid: be64(d, 28),
                private_data: pd,
            }),
            Attribute::Rtu | Attribute::Drep => {
                let m = CommIdsRepr {
                    local_comm_id: be32(d, 0),
                    remote_comm_id: be32(d, 4),
                    private_data: pd,
                };
                if attr == Attribute::Rtu {
                    CmMessage::Rtu(m)
                } else {
                    CmMessage::Drep(m)
                }
            }
            Attribute::Dreq => CmMessage::Dreq(DreqRepr {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                remote_qpn: be24(d, 8),
                private_data: pd,
            }),
            Attribute::SidrReq => CmMessage::SidrReq(SidrReqRepr {
                request_id: be32(d, 0),
                pkey: be16(d, 4),
                service_id: be64(d, 8),
                private_data: pd,
            }),
            Attribute::SidrRep => {
                let info_len = usize::from(d[5]);
                if info_len > 72 {
                    return Err(MadError::FieldOverflow("additional_information_length"));
                }
                CmMessage::SidrRep(SidrRepRepr {
                    request_id: be32(d, 0),
                    status: SidrStatus::from_u8(d[4]),
                    vendor_id: (u32::from(be16(d, 6)) << 8) | u32::from(d[11]),
                    qpn: be24(d, 8),
                    service_id: be64(d, 12),
                    qkey: be32(d, 20),
                    additional_info: &d[24..24 + info_len],
                    private_data: pd,
                })
            }
            Attribute::Lap => CmMessage::Lap(d),
            Attribute::Apr => CmMessage::Apr(d),
        };
        Ok(CmMadRepr { header, message })
    }

    /// Writes the whole 256-byte MAD into `buf` (reserved bits zero,
    /// private data zero-padded); returns [`MAD_LEN`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, MadError> {
        if buf.len() < MAD_LEN {
            return Err(MadError::BufferTooSmall {
                needed: MAD_LEN,
                have: buf.len(),
            });
        }
        let attr = self.message.attribute();
        let buf = &mut buf[..MAD_LEN];
        self.check()?;
        buf.fill(0);
        let header = MadHeader {
            mgmt_class: CLASS_CM,
            class_version: CM_CLASS_VERSION,
            attribute_id: attr as u16,
            ..self.header
        };
        header.emit(buf)?;
        let d = &mut buf[HEADER_LEN..];
        put_private(d, attr, self.message.private_data())?;
        match &self.message {
            CmMessage::Req(m) => {
                put32(d, 0, m.local_comm_id);
                put24(d, 5, m.vendor_id);
                put64(d, 8, m.service_id);
                put64(d, 16, m.local_ca_guid);
                put32(d, 28, m.local_qkey);
                put24(d, 32, m.local_qpn);
                d[35] = m.responder_resources;
                put24(d, 36, m.local_eecn);
                d[39] = m.initiator_depth;
                put24(d, 40, m.remote_eecn);
                d[43] = (m.remote_cm_response_timeout << 3)
                    | ((m.transport_type as u8) << 1)
                    | u8::from(m.end_to_end_flow_control);
                put24(d, 44, m.starting_psn);
                d[47] = (m.local_cm_response_timeout << 3) | m.retry_count;
                put16(d, 48, m.pkey);
                d[50] = (m.path_mtu << 4) | (u8::from(m.rdc_exists) << 3) | m.rnr_retry_count;
                d[51] =
                    (m.max_cm_retries << 4) | (u8::from(m.srq) << 3) | m.extended_transport_type;
                m.primary_path.emit(&mut d[52..52 + PATH_LEN], false);
                m.alternate_path
                    .unwrap_or_default()
                    .emit(&mut d[96..96 + PATH_LEN], m.sap_supported);
            }
            CmMessage::Mra(m) => {
                put32(d, 0, m.local_comm_id);
                put32(d, 4, m.remote_comm_id);
                d[8] = (m.message_mraed as u8) << 6;
                d[9] = m.service_timeout << 3;
            }
            CmMessage::Rej(m) => {
                put32(d, 0, m.local_comm_id);
                put32(d, 4, m.remote_comm_id);
                d[8] = (m.message_rejected as u8) << 6;
                // check() bounds the ARI to 72 bytes.
                d[9] = (m.ari.len() as u8) << 1;
                put16(d, 10, m.reason.code());
                d[12..12 + m.ari.len()].copy_from_slice(m.ari);
            }
            CmMessage::Rep(m) => {
                put32(d, 0, m.local_comm_id);
                put32(d, 4, m.remote_comm_id);
                put32(d, 8, m.local_qkey);
                put24(d, 12, m.local_qpn);
                d[15] = (m.vendor_id >> 16) as u8;
                put24(d, 16, m.local_eecn);
                d[19] = (m.vendor_id >> 8) as u8;
                put24(d, 20, m.starting_psn);
                d[23] = m.vendor_id as u8;
                d[24] = m.responder_resources;
                d[25] = m.initiator_depth;
                d[26] = (m.target_ack_delay << 3)
                    | (m.failover_accepted << 1)
                    | u8::from(m.end_to_end_flow_control);
                d[27] = (m.rnr_retry_count << 5) | (u8::from(m.srq) << 4);
                put64(d, 28, m.local_ca_guid);
            }
            CmMessage::Rtu(m) | CmMessage::Drep(m) => {
                put32(d, 0, m.local_comm_id);
                put32(d, 4, m.remote_comm_id);
            }
            CmMessage::Dreq(m) => {
                put32(d, 0, m.local_comm_id);
                put32(d, 4, m.remote_comm_id);
                put24(d, 8, m.remote_qpn);
            }
            CmMessage::SidrReq(m) => {
                put32(d, 0, m.request_id);
                put16(d, 4, m.pkey);
                put64(d, 8, m.service_id);
            }
            CmMessage::SidrRep(m) => {
                put32(d, 0, m.request_id);
                d[4] = m.status.code();
                d[5] = m.additional_info.len() as u8;
                put16(d, 6, (m.vendor_id >> 8) as u16);
                put24(d, 8, m.qpn);
                d[11] = m.vendor_id as u8;
                put64(d, 12, m.service_id);
                put32(d, 20, m.qkey);
                d[24..24 + m.additional_info.len()].copy_from_slice(m.additional_info);
            }
            CmMessage::Lap(raw) | CmMessage::Apr(raw) => {
                if raw.len() != DATA_LEN {
                    return Err(MadError::FieldOverflow("opaque CM data (232 bytes)"));
                }
                d.copy_from_slice(raw);
            }
        }
        Ok(MAD_LEN)
    }

    /// Every field fits its bits.
    fn check(&self) -> Result<(), MadError> {
        match &self.message {
            CmMessage::Req(m) => {
                fits("vendor_id", m.vendor_id, 24)?;
                fits("local_qpn", m.local_qpn, 24)?;
                fits("local_eecn", m.local_eecn, 24)?;
                fits("remote_eecn", m.remote_eecn, 24)?;
                fits(
                    "remote_cm_response_timeout",
                    m.remote_cm_response_timeout.into(),
                    5,
                )?;
                fits("starting_psn", m.starting_psn, 24)?;
                fits(
                    "local_cm_response_timeout",
                    m.local_cm_response_timeout.into(),
                    5,
                )?;
                fits("retry_count", m.retry_count.into(), 3)?;
                fits("path_mtu", m.path_mtu.into(), 4)?;
                fits("rnr_retry_count", m.rnr_retry_count.into(), 3)?;
                fits("max_cm_retries", m.max_cm_retries.into(), 4)?;
                fits(
                    "extended_transport_type",
                    m.extended_transport_type.into(),
                    3,
                )?;
                m.primary_path.check()?;
                if let Some(p) = &m.alternate_path {
                    p.check()?;
                }
            }
            CmMessage::Mra(m) => fits("service_timeout", m.service_timeout.into(), 5)?,
            CmMessage::Rej(m) => {
                if m.ari.len() > 72 {
                    return Err(MadError::FieldOverflow("ari (72 bytes)"));
                }
            }
            CmMessage::Rep(m) => {
                fits("local_qpn", m.local_qpn, 24)?;
                fits("vendor_id", m.vendor_id, 24)?;
                fits("local_eecn", m.local_eecn, 24)?;
                fits("starting_psn", m.starting_psn, 24)?;
                fits("target_ack_delay", m.target_ack_delay.into(), 5)?;
                fits("failover_accepted", m.failover_accepted.into(), 2)?;
                fits("rnr_retry_count", m.rnr_retry_count.into(), 3)?;
            }
            CmMessage::Dreq(m) => fits("remote_qpn", m.remote_qpn, 24)?,
            CmMessage::SidrRep(m) => {
                fits("qpn", m.qpn, 24)?;
                fits("vendor_id", m.vendor_id, 24)?;
                if m.additional_info.len() > 72 {
                    return Err(MadError::FieldOverflow("additional_information (72 bytes)"));
                }
            }
            CmMessage::Rtu(_)
            | CmMessage::Drep(_)
            | CmMessage::SidrReq(_)
            | CmMessage::Lap(_)
            | CmMessage::Apr(_) => {}
        }
        Ok(())
    }
}
