//! The XDP program drops frames whose BTH opcode it does not know; its table
//! (xroce-common, verifier-friendly) must agree with the codec's for all 256.

#[test]
fn xdp_opcode_table_matches_the_codec() {
    for op in 0..=255u8 {
        assert_eq!(
            xroce_common::opcode_is_known(op),
            xroce_wire::Opcode::try_from(op).is_ok(),
            "opcode {op:#04x}"
        );
    }
}
