//! Random and mutated MADs against engines in every state: never a panic,
//! every MAD counted, everything sent is a well-formed CM MAD.

mod common;

use common::{engine, A_GID, A_GUID, B_GID, B_GUID};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use xroce_cm::{CmEngine, CmEvent, ConnectParams, PathParams, PeerAddr, RepParams};
use xroce_wire::cm::CmMadRepr;
use xroce_wire::mad::MAD_LEN;

const SID: u64 = 0x0106_0001;

/// Valid MADs of one handshake and teardown between A and B, for mutation.
fn corpus() -> Vec<[u8; MAD_LEN]> {
    let mut a = engine(A_GID, A_GUID, 1);
    let mut b = engine(B_GID, B_GUID, 2);
    b.listen(SID, 0).unwrap();
    let conn = a
        .connect(
            &ConnectParams::new(SID, 9, 9, PathParams::roce(A_GID, B_GID, 5, 1)),
            0,
        )
        .unwrap();
    let mut out = Vec::new();
    let relay = |from: &mut CmEngine, to: &mut CmEngine, peer, to_gid, out: &mut Vec<_>| {
        while let Some(t) = from.poll_transmit() {
            out.push(t.mad);
            to.handle_mad(PeerAddr::gsi(peer), to_gid, &t.mad, 0);
        }
    };
    relay(&mut a, &mut b, A_GID, B_GID, &mut out);
    let Some(CmEvent::ConnectRequest { conn: bc, .. }) = b.poll_event() else {
        panic!()
    };
    b.accept(bc, &RepParams::new(8, 8), 0).unwrap();
    relay(&mut b, &mut a, B_GID, A_GID, &mut out);
    a.establish(conn, &[]).unwrap();
    relay(&mut a, &mut b, A_GID, B_GID, &mut out);
    a.disconnect(conn, &[], 0).unwrap();
    relay(&mut a, &mut b, A_GID, B_GID, &mut out);
    b.disconnect(bc, &[], 0).unwrap();
    relay(&mut b, &mut a, B_GID, A_GID, &mut out);
    assert_eq!(out.len(), 5);
    out
}

#[test]
fn mutated_and_random_mads_never_panic_and_are_all_counted() {
    let corpus = corpus();
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    for round in 0..50 {
        // Fresh engines in a fresh handshake each round.
        let mut b = engine(B_GID, B_GUID, round);
        b.listen(SID, 2).unwrap();
        b.listen(SID + 1, 0).unwrap();
        let mut fed = 0;
        for i in 0..200 {
            let mut mad = corpus[(rng.next_u32() as usize) % corpus.len()];
            let flips = rng.next_u32() % 8;
            for _ in 0..flips {
                let at = (rng.next_u32() as usize) % MAD_LEN;
                mad[at] = rng.next_u32() as u8;
            }
            let len = if i % 17 == 0 {
                (rng.next_u32() as usize) % MAD_LEN
            } else {
                MAD_LEN
            };
            if i % 31 == 0 {
                rng.fill_bytes(&mut mad);
            }
            // Any time at all, the end of time included.
            let now = if i % 13 == 0 {
                u64::MAX - u64::from(rng.next_u32() % 3)
            } else {
                u64::from(rng.next_u32())
            };
            b.handle_mad(PeerAddr::gsi(A_GID), B_GID, &mad[..len], now);
            fed += 1;
            if i % 5 == 0 {
                b.handle_timeout(now);
            }
            // Answer whatever the consumer is asked, sometimes.
            while let Some(e) = b.poll_event() {
                let conn = e.conn();
                let _ = match e {
                    CmEvent::ConnectRequest { .. } if i % 2 == 0 => {
                        b.accept(conn, &RepParams::new(3, 3), now)
                    }
                    CmEvent::ConnectRequest { .. } => b.reject(conn, b"no"),
                    CmEvent::DisconnectRequest { .. } => b.disconnect(conn, &[], now),
                    CmEvent::ConnectResponse { .. } => b.establish(conn, &[]),
                    _ => Ok(()),
                };
            }
            while let Some(t) = b.poll_transmit() {
                let m = CmMadRepr::parse(&t.mad).expect("we send well-formed MADs");
                assert_eq!(t.peer, PeerAddr::gsi(A_GID));
                assert_eq!(m.header.method, 3);
            }
        }
        let s = b.stats();
        assert_eq!(s.received, fed);
        assert!(s.malformed > 0, "round {round}: {s:?}");
        // Let every timer run out: nothing is left behind but what waits
        // for the consumer.
        while let Some(at) = b.poll_timeout() {
            b.handle_timeout(at);
        }
        while b.poll_transmit().is_some() {}
        while b.poll_event().is_some() {}
        assert!(b.poll_timeout().is_none());
    }
}
