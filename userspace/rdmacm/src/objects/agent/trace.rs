//! The one-line summary of a MAD that the agent prints per MAD sent and
//! received under XROCE_RDMACM_DEBUG: enough to follow a handshake.

use xroce_wire::cm::Attribute;
use xroce_wire::mad::{MadHeader, CLASS_CM, HEADER_LEN};

/// `REQ tid 0x…` plus the two comm IDs every CM message starts with (the
/// sender's, then the receiver's; SIDR: the request ID); other classes by
/// their class and attribute numbers.
pub(super) fn describe(mad: &[u8]) -> String {
    let Ok(h) = MadHeader::parse(mad) else {
        return format!("malformed MAD ({} bytes)", mad.len());
    };
    let word = |at: usize| {
        u32::from_be_bytes([
            mad[HEADER_LEN + at],
            mad[HEADER_LEN + at + 1],
            mad[HEADER_LEN + at + 2],
            mad[HEADER_LEN + at + 3],
        ])
    };
    match Attribute::from_u16(h.attribute_id) {
        Ok(a) if h.mgmt_class == CLASS_CM => format!(
            "{} tid {:#018x} comm ids {:#010x}/{:#010x}",
            a.name(),
            h.transaction_id,
            word(0),
            word(4)
        ),
        _ => format!(
            "class {:#04x} method {:#04x} attribute {:#06x} tid {:#018x}",
            h.mgmt_class, h.method, h.attribute_id, h.transaction_id
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xroce_wire::cm::CM_CLASS_VERSION;
    use xroce_wire::mad::MAD_LEN;

    #[test]
    fn cm_message_names_attribute_tid_and_comm_ids() {
        let mut mad = [0u8; MAD_LEN];
        MadHeader::send(CLASS_CM, CM_CLASS_VERSION, 0x0013, 0x1122_3344_5566_7788)
            .emit(&mut mad)
            .unwrap();
        mad[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&[0, 0, 0, 7, 0xaa, 0xbb, 0xcc, 0xdd]);
        assert_eq!(
            describe(&mad),
            "REP tid 0x1122334455667788 comm ids 0x00000007/0xaabbccdd"
        );
    }

    #[test]
    fn other_class_and_short_buffers() {
        let mut mad = [0u8; MAD_LEN];
        MadHeader::send(0x01, 1, 0x0010, 5).emit(&mut mad).unwrap();
        assert_eq!(
            describe(&mad),
            "class 0x01 method 0x03 attribute 0x0010 tid 0x0000000000000005"
        );
        assert_eq!(describe(&mad[..10]), "malformed MAD (10 bytes)");
    }
}
