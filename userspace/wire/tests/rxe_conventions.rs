//! What rxe puts on the wire, checked against the reference captures: the
//! UDP source port is derived from the QP pair, ACKs carry syndrome 0x1f.
mod common;

use std::collections::BTreeMap;
use xroce_wire::{parse_frame, rocev2_src_port, Opcode, Syndrome};

#[test]
fn udp_source_port_is_rxe_hash_of_qp_pair() {
    for path in common::pcaps() {
        // (src ip, dst ip) -> (udp sport, dest qpn)
        let mut flows: BTreeMap<(xroce_wire::Gid, xroce_wire::Gid), (u16, u32)> = BTreeMap::new();
        for f in common::read_pcap(&path) {
            let Ok((r, _)) = parse_frame(&f) else {
                continue;
            };
            if r.transport.bth.opcode == Opcode::CNP {
                continue;
            }
            flows.insert(
                (r.ip.src_gid(), r.ip.dst_gid()),
                (r.udp.src_port, r.transport.bth.dest_qp),
            );
        }
        let mut checked = 0;
        for (&(a, b), &(sport, rqpn)) in &flows {
            if let Some(&(_, lqpn)) = flows.get(&(b, a)) {
                assert_eq!(
                    sport,
                    rocev2_src_port(0, lqpn, rqpn),
                    "{}: flow {a} -> {b} (lqpn {lqpn:#x}, rqpn {rqpn:#x})",
                    path.display()
                );
                checked += 1;
            }
        }
        assert!(checked >= 2, "{}: no bidirectional flow", path.display());
    }
}

#[test]
fn rxe_acks_have_invalid_credit_syndrome() {
    let mut acks = 0;
    for path in common::pcaps() {
        for f in common::read_pcap(&path) {
            let Ok((r, _)) = parse_frame(&f) else {
                continue;
            };
            if r.transport.bth.opcode == Opcode::RC_ACKNOWLEDGE {
                assert_eq!(r.transport.aeth.unwrap().syndrome, Syndrome::ACK);
                acks += 1;
            }
        }
    }
    assert!(acks > 0);
}
