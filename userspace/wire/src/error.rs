//! The codec's error type. Every malformed or unsupported input maps to one
//! variant; parsing never panics.
use core::fmt;

/// Which header or field an [`Error`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    Ethernet,
    Vlan,
    Ipv4,
    Ipv6,
    Udp,
    Bth,
    Deth,
    Reth,
    AtomicEth,
    Aeth,
    AtomicAckEth,
    ImmDt,
    Ieth,
    Feth,
    Cnp,
    Payload,
    Icrc,
}

/// A codec error. `Display` says what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before the named header (or the payload/ICRC) does.
    Truncated(Layer),
    /// The output buffer is too small for what `emit` must write.
    BufferTooSmall { needed: usize, have: usize },
    /// Ethertype is neither IPv4 nor IPv6 (after any VLAN tags): not RoCEv2.
    NotIp(u16),
    /// IP protocol / next header is not UDP: not RoCEv2.
    NotUdp(u8),
    /// UDP destination port is not 4791: not RoCEv2.
    NotRoceV2Port(u16),
    /// IP version nibble does not match the ethertype.
    BadIpVersion(u8),
    /// IPv4 header with options (IHL != 5); RoCEv2 (and rxe) never sends them.
    Ipv4Options(u8),
    /// First IPv4 fragment of a UDP/4791 datagram: RoCEv2 is never fragmented.
    Ipv4Fragment,
    /// A later IPv4 fragment (offset != 0): its ports are unknown, so it is
    /// counted as not RoCEv2.
    Ipv4LaterFragment,
    /// IPv4 header checksum does not verify.
    BadIpv4Checksum,
    /// IP / UDP length fields disagree with each other or with the buffer.
    BadLength(Layer),
    /// BTH opcode is reserved, unknown, or of a transport we do not carry (RD, XRC).
    UnknownOpcode(u8),
    /// BTH transport header version is not 0.
    BadTver(u8),
    /// BTH pad count larger than the bytes that follow the headers, or
    /// payload + pad not a whole number of 4-byte words.
    BadPad(u8),
    /// A transport repr's optional headers do not match the set its opcode carries.
    HeaderMismatch(u8),
    /// The opcode carries no payload but payload bytes are present / given.
    UnexpectedPayload(u8),
    /// A value does not fit its field (e.g. a QPN or PSN above 24 bits).
    FieldOverflow(&'static str),
    /// The ICRC in the frame is not the one computed from its contents.
    BadIcrc { computed: u32, found: u32 },
    /// The payload an in-place emit asked for could not be written (the
    /// sender's source, e.g. a memory region, is gone).
    PayloadUnavailable,
}

impl Error {
    /// True when the frame is simply not RoCEv2 (other ethertype, not UDP,
    /// other UDP port, a later IPv4 fragment), as opposed to a malformed
    /// RoCEv2 frame.
    pub fn is_not_roce(&self) -> bool {
        matches!(
            self,
            Error::NotIp(_) | Error::NotUdp(_) | Error::NotRoceV2Port(_) | Error::Ipv4LaterFragment
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated(l) => write!(f, "truncated {l:?} header/data: buffer ends early"),
            Error::PayloadUnavailable => write!(f, "the payload to send could not be read"),
            Error::BufferTooSmall { needed, have } => {
                write!(
                    f,
                    "output buffer too small: need {needed} bytes, have {have}"
                )
            }
            Error::NotIp(t) => write!(f, "ethertype {t:#06x} is not IPv4/IPv6 (not RoCEv2)"),
            Error::NotUdp(p) => write!(f, "IP protocol {p} is not UDP (not RoCEv2)"),
            Error::NotRoceV2Port(p) => {
                write!(f, "UDP destination port {p} is not 4791 (not RoCEv2)")
            }
            Error::BadIpVersion(v) => write!(f, "IP version {v} does not match the ethertype"),
            Error::Ipv4Options(ihl) => {
                write!(f, "IPv4 IHL {ihl}: options are not supported in RoCEv2")
            }
            Error::Ipv4Fragment => write!(f, "IPv4 fragment: RoCEv2 packets are never fragmented"),
            Error::Ipv4LaterFragment => write!(f, "later IPv4 fragment (not RoCEv2)"),
            Error::BadIpv4Checksum => write!(f, "IPv4 header checksum does not verify"),
            Error::BadLength(l) => write!(f, "{l:?} length field disagrees with the packet"),
            Error::UnknownOpcode(o) => write!(f, "BTH opcode {o:#04x} is reserved or unsupported"),
            Error::BadTver(v) => write!(f, "BTH TVer {v} (must be 0)"),
            Error::BadPad(p) => write!(
                f,
                "BTH pad count {p} does not fit the packet (payload + pad must fill 4-byte words)"
            ),
            Error::HeaderMismatch(o) => {
                write!(
                    f,
                    "extension headers do not match the set opcode {o:#04x} carries"
                )
            }
            Error::UnexpectedPayload(o) => write!(f, "opcode {o:#04x} carries no payload"),
            Error::FieldOverflow(n) => write!(f, "value does not fit field {n}"),
            Error::BadIcrc { computed, found } => {
                write!(
                    f,
                    "ICRC mismatch: computed {computed:#010x}, frame has {found:#010x}"
                )
            }
        }
    }
}

impl core::error::Error for Error {}

/// `Result` with the codec's [`Error`].
pub type Result<T> = core::result::Result<T, Error>;
