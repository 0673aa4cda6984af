//! BTH opcode classes: what the XDP program counts frames by and what loss
//! injection filters on.

/// Bit positions of [`OpcodeClass`] in [`FaultConfig::opcode_mask`](crate::fault::FaultConfig::opcode_mask).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpcodeClass {
    /// SEND first/middle/last/only, with immediate or invalidate.
    Send = 0,
    /// RDMA WRITE first/middle/last/only, with immediate.
    Write = 1,
    /// RDMA READ request.
    ReadRequest = 2,
    /// RDMA READ response first/middle/last/only.
    ReadResponse = 3,
    /// ACKNOWLEDGE and ATOMIC ACKNOWLEDGE (also NAKs, which are ACKs).
    Ack = 4,
    /// CMP&SWAP and FETCH&ADD requests.
    Atomic = 5,
    /// Congestion Notification Packet (opcode 0x81).
    Cnp = 6,
    /// Anything else (reserved, vendor-specific, ...).
    Other = 7,
}

impl OpcodeClass {
    /// Classifies a BTH opcode. RC, UC, RD and UD share the low five bits
    /// (the operation); the top three bits are the transport.
    #[inline(always)]
    pub const fn of(opcode: u8) -> OpcodeClass {
        if opcode == 0x81 {
            return OpcodeClass::Cnp;
        }
        if opcode >> 5 > 3 {
            return OpcodeClass::Other;
        }
        match opcode & 0x1f {
            0x00..=0x05 | 0x16 | 0x17 => OpcodeClass::Send,
            0x06..=0x0b => OpcodeClass::Write,
            0x0c => OpcodeClass::ReadRequest,
            0x0d..=0x10 => OpcodeClass::ReadResponse,
            0x11 | 0x12 => OpcodeClass::Ack,
            0x13 | 0x14 => OpcodeClass::Atomic,
            _ => OpcodeClass::Other,
        }
    }

    /// This class's bit in [`FaultConfig::opcode_mask`](crate::fault::FaultConfig::opcode_mask).
    #[inline(always)]
    pub const fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// The mask for a CLI name: "send", "write", "read" (request and
    /// response), "read-request", "read-response", "ack", "atomic", "cnp",
    /// "other". `None` for anything else.
    pub fn mask_from_name(name: &str) -> Option<u32> {
        Some(match name {
            "send" => OpcodeClass::Send.bit(),
            "write" => OpcodeClass::Write.bit(),
            "read" => OpcodeClass::ReadRequest.bit() | OpcodeClass::ReadResponse.bit(),
            "read-request" => OpcodeClass::ReadRequest.bit(),
            "read-response" => OpcodeClass::ReadResponse.bit(),
            "ack" => OpcodeClass::Ack.bit(),
            "atomic" => OpcodeClass::Atomic.bit(),
            "cnp" => OpcodeClass::Cnp.bit(),
            "other" => OpcodeClass::Other.bit(),
            _ => return None,
        })
    }

    /// The names [`OpcodeClass::mask_from_name`] accepts, for error messages.
    pub const NAMES: &'static str =
        "send, write, read, read-request, read-response, ack, atomic, cnp, other";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_classes() {
        assert_eq!(OpcodeClass::of(0x04), OpcodeClass::Send); // RC SEND_ONLY
        assert_eq!(OpcodeClass::of(0x64), OpcodeClass::Send); // UD SEND_ONLY
        assert_eq!(OpcodeClass::of(0x17), OpcodeClass::Send); // SEND_ONLY_INV
        assert_eq!(OpcodeClass::of(0x06), OpcodeClass::Write);
        assert_eq!(OpcodeClass::of(0x0b), OpcodeClass::Write);
        assert_eq!(OpcodeClass::of(0x2a), OpcodeClass::Write); // UC WRITE_ONLY
        assert_eq!(OpcodeClass::of(0x0c), OpcodeClass::ReadRequest);
        assert_eq!(OpcodeClass::of(0x10), OpcodeClass::ReadResponse);
        assert_eq!(OpcodeClass::of(0x11), OpcodeClass::Ack);
        assert_eq!(OpcodeClass::of(0x12), OpcodeClass::Ack);
        assert_eq!(OpcodeClass::of(0x14), OpcodeClass::Atomic);
        assert_eq!(OpcodeClass::of(0x81), OpcodeClass::Cnp);
        assert_eq!(OpcodeClass::of(0x15), OpcodeClass::Other);
        assert_eq!(OpcodeClass::of(0xc0), OpcodeClass::Other);
        assert_eq!(OpcodeClass::mask_from_name("read"), Some(0b1100));
        assert_eq!(OpcodeClass::mask_from_name("writes"), None);
    }
}
