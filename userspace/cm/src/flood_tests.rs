//! A REQ flood against a listener: the state it builds is capped by the
//! backlog, drops are counted, and duplicates are still answered, with the
//! connection indexes matching a scan of the connections throughout.

use xroce_wire::cm::{CmMadRepr, CmMessage};
use xroce_wire::mad::MAD_LEN;
use xroce_wire::Gid;

use crate::{
    CmConfig, CmEngine, CmEvent, ConnId, ConnectParams, PathParams, PeerAddr, RepParams, State,
    MAX_BACKLOG,
};

const SID: u64 = 0x0106_0000_0000_4e20;
const ATTACKER: Gid = Gid::from_ipv4([10, 0, 0, 66]);
const US: Gid = Gid::from_ipv4([10, 0, 0, 2]);

fn listener(backlog: usize) -> CmEngine {
    let mut e = CmEngine::new(CmConfig::new(vec![US], 0xb, 1));
    e.listen(SID, backlog).unwrap();
    e
}

/// `n` REQs from one CA, each with its own comm ID (from `seed`) and QPN
/// (from `first_qpn` on).
fn flood_from(seed: u64, first_qpn: u32, n: u32) -> Vec<[u8; MAD_LEN]> {
    let mut a = CmEngine::new(CmConfig::new(vec![ATTACKER], 0xbad, seed));
    (0..n)
        .map(|i| {
            let path = PathParams::roce(ATTACKER, US, 3, 0);
            a.connect(&ConnectParams::new(SID, first_qpn + i, 0, path), 0)
                .unwrap();
            a.poll_transmit().unwrap().mad
        })
        .collect()
}

fn flood(n: u32) -> Vec<[u8; MAD_LEN]> {
    flood_from(2, 0x100, n)
}

fn feed(e: &mut CmEngine, mads: &[[u8; MAD_LEN]]) {
    for m in mads {
        e.handle_mad(PeerAddr::gsi(ATTACKER), US, m, 0);
    }
}

fn requests(e: &mut CmEngine) -> Vec<ConnId> {
    std::iter::from_fn(|| e.poll_event())
        .map(|ev| match ev {
            CmEvent::ConnectRequest { conn, .. } => conn,
            other => panic!("unexpected event {other:?}"),
        })
        .collect()
}

#[test]
fn req_flood_is_capped_at_the_backlog_and_dropped_silently() {
    // 0 and anything above the maximum mean the maximum, as ucma has it.
    for (backlog, cap) in [(0, MAX_BACKLOG), (MAX_BACKLOG + 1, MAX_BACKLOG), (5, 5)] {
        let mut e = listener(backlog);
        feed(&mut e, &flood(10_000));
        assert_eq!(e.live_connections(), cap, "backlog {backlog}");
        assert_eq!(requests(&mut e).len(), cap);
        let s = e.stats();
        assert_eq!(s.req_backlog_full, 10_000 - cap as u64);
        assert_eq!(s.received, 10_000);
        // As Linux's ib_cm for a full ucma backlog (-ENOMEM): no REJ, so a
        // retransmission may get in later.
        assert_eq!(e.poll_transmit(), None);
        e.conns.check();
    }
}

#[test]
fn answering_frees_a_slot_and_duplicates_are_still_answered() {
    let mut e = listener(0);
    let reqs = flood(2_000);
    feed(&mut e, &reqs);
    let conns = requests(&mut e);
    assert_eq!(conns.len(), MAX_BACKLOG);
    e.mra(conns[0], 10).unwrap();
    let mra = e.poll_transmit().unwrap();
    let rep = RepParams::new(0x77, 0x1000);
    e.accept(conns[1], &rep, 0).unwrap();
    let rep_mad = e.poll_transmit().unwrap();
    e.conns.check();

    // The whole flood again: the pending ones are duplicates (the MRA'd and
    // the accepted one answered again), the first dropped one takes the
    // slot the accept freed, the rest are dropped again.
    feed(&mut e, &reqs);
    let s = e.stats();
    assert_eq!(s.duplicates, MAX_BACKLOG as u64);
    assert_eq!(s.req_backlog_full, 2 * 2_000 - 2 * MAX_BACKLOG as u64 - 1);
    let again: Vec<_> = std::iter::from_fn(|| e.poll_transmit()).collect();
    assert_eq!(again, vec![mra, rep_mad]);
    let new = requests(&mut e);
    assert_eq!(new.len(), 1);
    assert_eq!(e.state(new[0]), Some(State::ReqRcvd));
    assert_eq!(e.live_connections(), MAX_BACKLOG + 1);
    e.conns.check();
}

#[test]
fn unanswered_reps_time_out_and_leave_no_state() {
    let mut e = listener(5);
    feed(&mut e, &flood(100));
    let conns = requests(&mut e);
    for (i, c) in conns.iter().enumerate() {
        e.accept(*c, &RepParams::new(0x200 + i as u32, 0), 0)
            .unwrap();
    }
    // Accepting freed the slots: five more get in.
    feed(&mut e, &flood_from(3, 0x10_000, 100));
    assert_eq!(requests(&mut e).len(), 5);
    e.conns.check();
    let mut rejs = 0;
    while let Some(at) = e.poll_timeout() {
        e.handle_timeout(at);
        e.conns.check();
        for t in std::iter::from_fn(|| e.poll_transmit()) {
            if let CmMessage::Rej(r) = CmMadRepr::parse(&t.mad).unwrap().message {
                assert_eq!(r.reason, crate::RejReason::Timeout);
                rejs += 1;
            }
        }
    }
    assert_eq!(rejs, 5);
    // The five still waiting for the consumer hold their slots; ib_cm has
    // no timer for REQ_RCVD either.
    assert_eq!(e.live_connections(), 5);
}

#[test]
fn sidr_req_flood_is_capped_too_and_duplicates_are_dropped() {
    let mut e = listener(0);
    let mut a = CmEngine::new(CmConfig::new(vec![ATTACKER], 0xbad, 4));
    let sidrs: Vec<[u8; MAD_LEN]> = (0..3_000)
        .map(|_| {
            let p = crate::SidrRequestParams {
                service_id: SID,
                local_gid: ATTACKER,
                remote_gid: US,
                pkey: 0xffff,
                timeout: 20,
                max_retries: 3,
                private_data: Vec::new(),
            };
            a.sidr_request(&p, 0).unwrap();
            a.poll_transmit().unwrap().mad
        })
        .collect();
    feed(&mut e, &sidrs);
    feed(&mut e, &sidrs[..10]);
    assert_eq!(e.live_connections(), MAX_BACKLOG);
    let s = e.stats();
    assert_eq!(s.duplicates, 10);
    assert_eq!(s.req_backlog_full, 3_000 - MAX_BACKLOG as u64);
    assert_eq!(e.poll_transmit(), None);
    let reported = std::iter::from_fn(|| e.poll_event())
        .filter(|ev| matches!(ev, CmEvent::SidrRequest { .. }))
        .count();
    assert_eq!(reported, MAX_BACKLOG);
    e.conns.check();
}
