//! BTH opcodes of RC, UC and UD (IBTA vol. 1, 9.2 / table 39), the RoCEv2 CNP,
//! and the exact set of extension headers each one carries.

use crate::error::{Error, Result};

/// Transport service of an opcode (the high three bits, except CNP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Reliable Connected (0b000).
    Rc,
    /// Unreliable Connected (0b001).
    Uc,
    /// Unreliable Datagram (0b011).
    Ud,
    /// RoCEv2 Congestion Notification Packet (opcode 0x81).
    Cnp,
}

/// A set of BTH extension headers, in wire order: DETH, FETH, RETH, AtomicETH,
/// AETH, AtomicAckETH, ImmDt, IETH, then (CNP only) 16 reserved bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HeaderSet(u16);

impl HeaderSet {
    pub const EMPTY: HeaderSet = HeaderSet(0);
    /// Datagram ETH, 8 bytes (UD).
    pub const DETH: HeaderSet = HeaderSet(1 << 0);
    /// Flush ETH, 4 bytes (RC FLUSH).
    pub const FETH: HeaderSet = HeaderSet(1 << 1);
    /// RDMA ETH, 16 bytes.
    pub const RETH: HeaderSet = HeaderSet(1 << 2);
    /// Atomic ETH, 28 bytes.
    pub const ATOMIC_ETH: HeaderSet = HeaderSet(1 << 3);
    /// ACK ETH, 4 bytes.
    pub const AETH: HeaderSet = HeaderSet(1 << 4);
    /// Atomic ACK ETH, 8 bytes.
    pub const ATOMIC_ACK_ETH: HeaderSet = HeaderSet(1 << 5);
    /// Immediate data, 4 bytes.
    pub const IMM_DT: HeaderSet = HeaderSet(1 << 6);
    /// Invalidate ETH, 4 bytes.
    pub const IETH: HeaderSet = HeaderSet(1 << 7);
    /// CNP's 16 reserved bytes.
    pub const CNP_RESERVED: HeaderSet = HeaderSet(1 << 8);

    /// Every header in wire order with its length in bytes.
    pub const ORDER: [(HeaderSet, usize); 9] = [
        (Self::DETH, 8),
        (Self::FETH, 4),
        (Self::RETH, 16),
        (Self::ATOMIC_ETH, 28),
        (Self::AETH, 4),
        (Self::ATOMIC_ACK_ETH, 8),
        (Self::IMM_DT, 4),
        (Self::IETH, 4),
        (Self::CNP_RESERVED, 16),
    ];

    pub const fn union(self, o: HeaderSet) -> HeaderSet {
        HeaderSet(self.0 | o.0)
    }
    pub const fn contains(self, o: HeaderSet) -> bool {
        self.0 & o.0 == o.0
    }
    pub const fn bits(self) -> u16 {
        self.0
    }
    /// Total length of these headers in bytes (BTH not included).
    pub const fn len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.0 & Self::ORDER[i].0 .0 != 0 {
                n += Self::ORDER[i].1;
            }
            i += 1;
        }
        n
    }
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl HeaderSet {
    /// The longest set of extension headers any opcode carries, in bytes
    /// (the AtomicETH of COMPARE_SWAP / FETCH_ADD).
    pub const MAX_LEN: usize = {
        let mut max = 0;
        let mut i = 0;
        while i < Opcode::ALL.len() {
            let n = Opcode::ALL[i].headers().len();
            if n > max {
                max = n;
            }
            i += 1;
        }
        max
    };
}

impl core::ops::BitOr for HeaderSet {
    type Output = HeaderSet;
    fn bitor(self, o: HeaderSet) -> HeaderSet {
        self.union(o)
    }
}

macro_rules! opcodes {
    ($( $(#[$m:meta])* $name:ident = $val:literal, $svc:ident, [$($h:ident),*], $payload:ident; )*) => {
        /// A BTH opcode this codec carries. `TryFrom<u8>` rejects reserved,
        /// unknown, RD and XRC opcodes with [`Error::UnknownOpcode`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        #[allow(non_camel_case_types)]
        pub enum Opcode {
            $( $(#[$m])* $name = $val, )*
        }

        impl Opcode {
            /// Every supported opcode, in numeric order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name,)*];

            /// Decode an opcode byte.
            pub const fn from_u8(v: u8) -> Result<Opcode> {
                match v {
                    $( $val => Ok(Opcode::$name), )*
                    _ => Err(Error::UnknownOpcode(v)),
                }
            }
            /// The transport service.
            pub const fn service(self) -> Service {
                match self { $( Opcode::$name => Service::$svc, )* }
            }
            /// The extension headers (after the BTH) this opcode carries.
            pub const fn headers(self) -> HeaderSet {
                match self {
                    $( Opcode::$name => HeaderSet::EMPTY $( .union(HeaderSet::$h) )*, )*
                }
            }
            /// Whether the opcode carries a payload (data segment).
            pub const fn has_payload(self) -> bool {
                match self { $( Opcode::$name => opcodes!(@p $payload), )* }
            }
            /// The IBTA-style name, e.g. `RC_RDMA_WRITE_FIRST`.
            pub const fn name(self) -> &'static str {
                match self { $( Opcode::$name => stringify!($name), )* }
            }
        }
    };
    (@p yes) => { true };
    (@p no) => { false };
}

opcodes! {
    RC_SEND_FIRST = 0x00, Rc, [], yes;
    RC_SEND_MIDDLE = 0x01, Rc, [], yes;
    RC_SEND_LAST = 0x02, Rc, [], yes;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, Rc, [IMM_DT], yes;
    RC_SEND_ONLY = 0x04, Rc, [], yes;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, Rc, [IMM_DT], yes;
    RC_RDMA_WRITE_FIRST = 0x06, Rc, [RETH], yes;
    RC_RDMA_WRITE_MIDDLE = 0x07, Rc, [], yes;
    RC_RDMA_WRITE_LAST = 0x08, Rc, [], yes;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, Rc, [IMM_DT], yes;
    RC_RDMA_WRITE_ONLY = 0x0a, Rc, [RETH], yes;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, Rc, [RETH, IMM_DT], yes;
    RC_RDMA_READ_REQUEST = 0x0c, Rc, [RETH], no;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d, Rc, [AETH], yes;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, Rc, [], yes;
    RC_RDMA_READ_RESPONSE_LAST = 0x0f, Rc, [AETH], yes;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10, Rc, [AETH], yes;
    RC_ACKNOWLEDGE = 0x11, Rc, [AETH], no;
    RC_ATOMIC_ACKNOWLEDGE = 0x12, Rc, [AETH, ATOMIC_ACK_ETH], no;
    RC_COMPARE_SWAP = 0x13, Rc, [ATOMIC_ETH], no;
    RC_FETCH_ADD = 0x14, Rc, [ATOMIC_ETH], no;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, Rc, [IETH], yes;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, Rc, [IETH], yes;
    /// IBTA 1.5 memory placement extension: FLUSH (FETH + RETH).
    RC_FLUSH = 0x1c, Rc, [FETH, RETH], no;
    /// IBTA 1.5 memory placement extension: ATOMIC WRITE (RETH + 8-byte payload).
    RC_ATOMIC_WRITE = 0x1d, Rc, [RETH], yes;
    UC_SEND_FIRST = 0x20, Uc, [], yes;
    UC_SEND_MIDDLE = 0x21, Uc, [], yes;
    UC_SEND_LAST = 0x22, Uc, [], yes;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, Uc, [IMM_DT], yes;
    UC_SEND_ONLY = 0x24, Uc, [], yes;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, Uc, [IMM_DT], yes;
    UC_RDMA_WRITE_FIRST = 0x26, Uc, [RETH], yes;
    UC_RDMA_WRITE_MIDDLE = 0x27, Uc, [], yes;
    UC_RDMA_WRITE_LAST = 0x28, Uc, [], yes;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, Uc, [IMM_DT], yes;
    UC_RDMA_WRITE_ONLY = 0x2a, Uc, [RETH], yes;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, Uc, [RETH, IMM_DT], yes;
    UD_SEND_ONLY = 0x64, Ud, [DETH], yes;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, Ud, [DETH, IMM_DT], yes;
    /// RoCEv2 Congestion Notification Packet (annex A17.9.3): 16 reserved bytes.
    CNP = 0x81, Cnp, [CNP_RESERVED], no;
}

impl Opcode {
    /// The opcode byte.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }
    /// The operation bits (low five), e.g. 0x04 for every SEND_ONLY.
    pub const fn operation(self) -> u8 {
        (self as u8) & 0x1f
    }
    const fn op(self) -> u8 {
        match self.service() {
            Service::Cnp => 0xff,
            _ => self.operation(),
        }
    }
    /// The same operation in another service, e.g. `RC_SEND_ONLY` ->
    /// `UC_SEND_ONLY` or `UD_SEND_ONLY`; `None` if that service lacks it.
    pub const fn in_service(self, service: Service) -> Option<Opcode> {
        let high = match (self.service(), service) {
            (Service::Cnp, _) | (_, Service::Cnp) => return None,
            (_, Service::Rc) => 0x00,
            (_, Service::Uc) => 0x20,
            (_, Service::Ud) => 0x60,
        };
        match Opcode::from_u8(high | self.operation()) {
            Ok(o) => Some(o),
            Err(_) => None,
        }
    }
    /// SEND of any kind (incl. with immediate / invalidate).
    pub const fn is_send(self) -> bool {
        matches!(self.op(), 0x00..=0x05 | 0x16 | 0x17)
    }
    /// RDMA WRITE of any kind.
    pub const fn is_rdma_write(self) -> bool {
        matches!(self.op(), 0x06..=0x0b)
    }
    /// RDMA READ response of any kind.
    pub const fn is_read_response(self) -> bool {
        matches!(self.op(), 0x0d..=0x10) && matches!(self.service(), Service::Rc)
    }
    /// COMPARE SWAP or FETCH ADD.
    pub const fn is_atomic(self) -> bool {
        matches!(self, Opcode::RC_COMPARE_SWAP | Opcode::RC_FETCH_ADD)
    }
    /// A response the requester receives (ACK, atomic ACK, read responses).
    pub const fn is_response(self) -> bool {
        self.is_read_response()
            || matches!(self, Opcode::RC_ACKNOWLEDGE | Opcode::RC_ATOMIC_ACKNOWLEDGE)
    }
    /// A request (everything a requester sends; not responses, not CNP).
    pub const fn is_request(self) -> bool {
        !self.is_response() && !matches!(self, Opcode::CNP)
    }
    /// First packet of a multi-packet message.
    pub const fn is_first(self) -> bool {
        matches!(self.op(), 0x00 | 0x06) || matches!(self, Opcode::RC_RDMA_READ_RESPONSE_FIRST)
    }
    /// Middle packet of a multi-packet message.
    pub const fn is_middle(self) -> bool {
        matches!(self.op(), 0x01 | 0x07) || matches!(self, Opcode::RC_RDMA_READ_RESPONSE_MIDDLE)
    }
    /// Last packet of a multi-packet message.
    pub const fn is_last(self) -> bool {
        matches!(self.op(), 0x02 | 0x03 | 0x08 | 0x09 | 0x16)
            || matches!(self, Opcode::RC_RDMA_READ_RESPONSE_LAST)
    }
    /// A single-packet message (or a single-packet operation such as ACK).
    pub const fn is_only(self) -> bool {
        !self.is_first() && !self.is_middle() && !self.is_last()
    }
    /// Carries immediate data.
    pub const fn has_immediate(self) -> bool {
        self.headers().contains(HeaderSet::IMM_DT)
    }
}

impl TryFrom<u8> for Opcode {
    type Error = Error;
    fn try_from(v: u8) -> Result<Opcode> {
        Opcode::from_u8(v)
    }
}

impl From<Opcode> for u8 {
    fn from(o: Opcode) -> u8 {
        o as u8
    }
}

impl core::fmt::Display for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}
