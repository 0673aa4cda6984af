//! ACK Extended Transport Header (AETH): syndrome(8) + MSN(24), the syndrome
//! encodings (ACK with credit count, RNR NAK with timer, NAK codes), and the
//! IBTA credit-count and RNR-timer tables.

use crate::bytes::{be24, put24};
use crate::error::{Error, Layer, Result};

pub const HEADER_LEN: usize = 4;

/// Zero-copy view of an AETH.
#[derive(Debug, Clone)]
pub struct AethHeader<T: AsRef<[u8]>> {
    buffer: T,
}
impl<T: AsRef<[u8]>> AethHeader<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        AethHeader { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated(Layer::Aeth));
        }
        Ok(AethHeader { buffer })
    }
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_u8(self.syndrome_raw())
    }
    pub fn msn(&self) -> u32 {
        be24(self.buffer.as_ref(), 1)
    }
}

/// NAK codes (syndrome type 0b11, low five bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NakCode {
    PsnSequenceError = 0,
    InvalidRequest = 1,
    RemoteAccessError = 2,
    RemoteOperationalError = 3,
    InvalidRdRequest = 4,
}

impl NakCode {
    pub const fn from_u8(v: u8) -> Option<NakCode> {
        Some(match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }
}

/// Credit code meaning "no credit information / invalid" (rxe puts it in every ACK).
pub const CREDITS_INVALID: u8 = 0x1f;

/// The AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK (type 0b00) with a 5-bit credit code (see [`credits_from_code`]; 0x1f = invalid).
    Ack { credit_code: u8 },
    /// RNR NAK (type 0b01) with a 5-bit RNR timer code (see [`rnr_timer_us`]).
    RnrNak { timer: u8 },
    /// NAK (type 0b11).
    Nak(NakCode),
    /// Anything else (type 0b10, bit 7 set, NAK codes 5..=31): kept raw.
    Reserved(u8),
}

impl Syndrome {
    /// ACK with "invalid credit count" (what rxe sends: syndrome 0x1f).
    pub const ACK: Syndrome = Syndrome::Ack {
        credit_code: CREDITS_INVALID,
    };

    pub const fn from_u8(s: u8) -> Syndrome {
        let low = s & 0x1f;
        match s >> 5 {
            0b000 => Syndrome::Ack { credit_code: low },
            0b001 => Syndrome::RnrNak { timer: low },
            0b011 => match NakCode::from_u8(low) {
                Some(c) => Syndrome::Nak(c),
                None => Syndrome::Reserved(s),
            },
            _ => Syndrome::Reserved(s),
        }
    }

    pub const fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credit_code } => credit_code & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => 0x60 | c as u8,
            Syndrome::Reserved(s) => s,
        }
    }

    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
    pub const fn is_nak(self) -> bool {
        matches!(self, Syndrome::Nak(_) | Syndrome::RnrNak { .. })
    }
}

/// Parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    pub syndrome: Syndrome,
    /// Message sequence number, 24 bits.
    pub msn: u32,
}

impl AethRepr {
    pub const LEN: usize = HEADER_LEN;
    pub fn parse(buf: &[u8]) -> Result<AethRepr> {
        let h = AethHeader::new_checked(buf)?;
        Ok(AethRepr {
            syndrome: h.syndrome(),
            msn: h.msn(),
        })
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: HEADER_LEN,
                have: buf.len(),
            });
        }
        if self.msn > crate::psn::PSN_MASK {
            return Err(Error::FieldOverflow("aeth.msn"));
        }
        match self.syndrome {
            Syndrome::Ack { credit_code: v } | Syndrome::RnrNak { timer: v } if v > 0x1f => {
                return Err(Error::FieldOverflow("aeth.syndrome"))
            }
            _ => {}
        }
        buf[0] = self.syndrome.to_u8();
        put24(buf, 1, self.msn);
        Ok(HEADER_LEN)
    }
}

/// IBTA RNR NAK timer table (vol. 1, table 45) in microseconds, by 5-bit code.
/// Code 0 is the longest (655.36 ms).
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// Microseconds an RNR timer code stands for (`code` taken modulo 32).
pub const fn rnr_timer_us(code: u8) -> u32 {
    RNR_TIMER_US[(code & 0x1f) as usize]
}

/// The smallest RNR timer code whose delay is at least `us` (code 0 =
/// 655.36 ms for anything longer than 491.52 ms).
pub const fn rnr_timer_code(us: u32) -> u8 {
    let mut c = 1;
    while c < 32 {
        if RNR_TIMER_US[c] >= us {
            return c as u8;
        }
        c += 1;
    }
    0
}

/// IBTA credit count table (vol. 1, table 44): number of credits by 5-bit
/// code; code 0x1f is "invalid" (None).
pub const fn credits_from_code(code: u8) -> Option<u32> {
    let c = (code & 0x1f) as u32;
    if c == 0x1f {
        None
    } else if c <= 4 {
        Some(c)
    } else {
        // codes 5.. alternate 1.5x / 2x steps: 6, 8, 12, 16, 24, 32, ...
        let k = (c - 5) / 2;
        let base = 4u32 << k; // 4, 8, 16, ...
        Some(if (c - 5) & 1 == 0 {
            base + base / 2
        } else {
            base * 2
        })
    }
}

/// The largest credit code whose count is at most `credits` (saturates at 30 = 32768).
pub const fn credit_code(credits: u32) -> u8 {
    let mut c: u8 = 30;
    loop {
        match credits_from_code(c) {
            Some(n) if n <= credits => return c,
            _ => {}
        }
        if c == 0 {
            return 0;
        }
        c -= 1;
    }
}
