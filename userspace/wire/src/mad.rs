//! Management datagrams (MADs, IBTA vol.1 13.4): the 256-byte messages the
//! general services (here: connection management, [`crate::cm`]) send in
//! a UD SEND to QP1, the GSI QP, with the well-known Q_Key 0x80010000.
//!
//! ```text
//! 0: BaseVersion | 1: MgmtClass | 2: ClassVersion | 3: R Method(7)
//! 4-5: Status | 6-7: ClassSpecific | 8-15: TransactionID
//! 16-17: AttributeID | 18-19: reserved | 20-23: AttributeModifier
//! 24-255: class data
//! ```

use core::fmt;

use crate::bytes::{be16, be32, be64, put16, put32, put64};

/// Every MAD is this long (the UD SEND payload to/from QP1).
pub const MAD_LEN: usize = 256;
/// The common header that starts every MAD.
pub const HEADER_LEN: usize = 24;
/// The only base version there is.
pub const BASE_VERSION: u8 = 1;
/// The general services QP.
pub const GSI_QPN: u32 = 1;
/// The Q_Key every GSI MAD carries in its DETH.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Management class of connection management.
pub const CLASS_CM: u8 = 0x07;
/// Method: a one-way message (what every CM message uses).
pub const METHOD_SEND: u8 = 0x03;

/// What is wrong with a MAD (or with a repr given to `emit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MadError {
    /// The buffer is shorter than the MAD (or its header).
    Truncated { needed: usize, have: usize },
    /// The output buffer is too small.
    BufferTooSmall { needed: usize, have: usize },
    /// BaseVersion is not 1.
    BadBaseVersion(u8),
    /// Not the management class the parser was asked for.
    WrongClass(u8),
    /// The class version is not one this codec speaks.
    BadClassVersion(u8),
    /// An attribute ID the class does not define.
    UnknownAttribute(u16),
    /// Private data longer than the message's field.
    PrivateDataTooLong { max: usize, len: usize },
    /// A value that does not fit its field (a QPN above 24 bits, ...), or a
    /// length field larger than the data it counts.
    FieldOverflow(&'static str),
}

impl fmt::Display for MadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MadError::Truncated { needed, have } => {
                write!(f, "truncated MAD: {have} bytes, need {needed}")
            }
            MadError::BufferTooSmall { needed, have } => {
                write!(
                    f,
                    "output buffer too small: need {needed} bytes, have {have}"
                )
            }
            MadError::BadBaseVersion(v) => write!(f, "MAD base version {v} (must be 1)"),
            MadError::WrongClass(c) => {
                write!(f, "MAD management class {c:#04x} is not the one expected")
            }
            MadError::BadClassVersion(v) => write!(f, "unsupported MAD class version {v}"),
            MadError::UnknownAttribute(a) => write!(f, "unknown MAD attribute {a:#06x}"),
            MadError::PrivateDataTooLong { max, len } => {
                write!(f, "private data of {len} bytes exceeds the field's {max}")
            }
            MadError::FieldOverflow(n) => write!(f, "value does not fit field {n}"),
        }
    }
}

impl core::error::Error for MadError {}

/// The MAD common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeader {
    pub base_version: u8,
    pub mgmt_class: u8,
    pub class_version: u8,
    /// Method, the response bit (0x80) included.
    pub method: u8,
    pub status: u16,
    pub class_specific: u16,
    pub transaction_id: u64,
    pub attribute_id: u16,
    pub attribute_modifier: u32,
}

impl MadHeader {
    /// A SEND of `class`/`class_version`, status 0, attribute modifier 0.
    pub const fn send(
        class: u8,
        class_version: u8,
        attribute_id: u16,
        transaction_id: u64,
    ) -> Self {
        MadHeader {
            base_version: BASE_VERSION,
            mgmt_class: class,
            class_version,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Parses the header of a whole MAD: `buf` must be [`MAD_LEN`] bytes or
    /// more (a UD payload may not be shorter), base version 1.
    pub fn parse(buf: &[u8]) -> Result<MadHeader, MadError> {
        if buf.len() < MAD_LEN {
            return Err(MadError::Truncated {
                needed: MAD_LEN,
                have: buf.len(),
            });
        }
        if buf[0] != BASE_VERSION {
            return Err(MadError::BadBaseVersion(buf[0]));
        }
        Ok(MadHeader {
            base_version: buf[0],
            mgmt_class: buf[1],
            class_version: buf[2],
            method: buf[3],
            status: be16(buf, 4),
            class_specific: be16(buf, 6),
            transaction_id: be64(buf, 8),
            attribute_id: be16(buf, 16),
            attribute_modifier: be32(buf, 20),
        })
    }

    /// Writes the 24 header bytes (the reserved ones zero).
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), MadError> {
        if buf.len() < HEADER_LEN {
            return Err(MadError::BufferTooSmall {
                needed: HEADER_LEN,
                have: buf.len(),
            });
        }
        buf[0] = self.base_version;
        buf[1] = self.mgmt_class;
        buf[2] = self.class_version;
        buf[3] = self.method;
        put16(buf, 4, self.status);
        put16(buf, 6, self.class_specific);
        put64(buf, 8, self.transaction_id);
        put16(buf, 16, self.attribute_id);
        put16(buf, 18, 0);
        put32(buf, 20, self.attribute_modifier);
        Ok(())
    }
}

/// Whether a frame's transport headers are those of a GSI MAD: a UD SEND
/// (without immediate) to QP1 with the GSI Q_Key.
pub fn is_gsi(t: &crate::TransportRepr) -> bool {
    t.bth.opcode == crate::Opcode::UD_SEND_ONLY
        && t.bth.dest_qp == GSI_QPN
        && t.deth.is_some_and(|d| d.qkey == GSI_QKEY)
}
