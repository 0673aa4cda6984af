//! Selective repeat between two xroce perf tools over a veth pair with XDP
//! on both ends, 1 % of the requests dropped in XDP (`xroce fault`): both
//! sides pass --selective-repeat and agree on it; data verified; far fewer
//! retransmissions than go-back-N at the same drop seed; a peer that does
//! not offer it gets go-back-N; READ, SEND and atomics verified on an SR
//! connection too.

use xroce_report::BenchReport;
use xroce_tests::{perf::run_ok, require_root, AttachedXdp, VethPair};

fn write_run(pair: &VethPair, server_sr: bool, client_sr: bool) -> BenchReport {
    let mut server = vec!["write"];
    let mut client = vec!["write", "--size", "65536", "--iters", "300"];
    if server_sr {
        server.push("--selective-repeat");
    }
    if client_sr {
        client.push("--selective-repeat");
    }
    let r: BenchReport = run_ok(pair, "bench", &server, &client);
    assert_eq!(r.verified, Some(true), "{r:?}");
    assert_eq!(r.iters, 300, "{r:?}");
    r
}

#[test]
fn selective_repeat_recovers_xdp_loss_with_few_retransmits() {
    require_root();
    let pair = VethPair::new(1500);
    let _xdp_a = AttachedXdp::new(&pair.a, &pair.if_a, "native");
    let xdp_b = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    xdp_b.xroce(&[
        "fault", "--iface", &pair.if_b, "--drop", "0.01", "--seed", "17",
    ]);
    let sr = write_run(&pair, true, true);
    let gbn = write_run(&pair, false, false);
    // The server does not offer it: go-back-N although the client asks.
    let one_sided = write_run(&pair, false, true);
    eprintln!(
        "retransmits at 1 % loss: SR {}, go-back-N {}, client-only offer {}",
        sr.retransmits, gbn.retransmits, one_sided.retransmits
    );
    assert!(sr.retransmits > 0, "no loss seen: {sr:?}");
    assert!(
        sr.retransmits * 3 < gbn.retransmits,
        "SR {} vs go-back-N {} retransmits",
        sr.retransmits,
        gbn.retransmits
    );
    assert!(
        one_sided.retransmits > sr.retransmits * 2,
        "one-sided offer ran SR? {} vs SR {}",
        one_sided.retransmits,
        sr.retransmits
    );
    // The operations that stay in order under selective repeat still
    // arrive verified on an SR connection under the same loss.
    for (op, iters) in [("read", "300"), ("send", "300"), ("atomic", "2000")] {
        let mut client = vec![op, "--iters", iters, "--selective-repeat"];
        if op != "atomic" {
            client.extend(["--size", "65536"]);
        }
        let r: BenchReport = run_ok(&pair, "bench", &[op, "--selective-repeat"], &client);
        assert_eq!(r.verified, Some(true), "{op}: {r:?}");
    }
    let c = pair.in_b(xroce::xdp::read_counters).unwrap();
    assert!(c.get(xroce_common::Counter::DropFault) > 0, "{c:?}");
}
