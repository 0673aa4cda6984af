//! Selective repeat between two xroce perf tools over a veth pair with XDP
//! on both ends, 1 % of the requests dropped in XDP (`xroce fault`): with
//! no flag at all the two agree on it in band (the BTH's capable bit) and
//! retransmit far fewer packets than go-back-N (`--recovery gbn`, or one
//! side alone asking for it) at the same drop seed, as when both force it
//! (`--selective-repeat`); data verified; READ, SEND and atomics verified
//! on an in-band SR connection and a forced one too.

use xroce_report::BenchReport;
use xroce_tests::{perf::run_ok, require_root, AttachedXdp, VethPair};

fn write_run(pair: &VethPair, server_flags: &[&str], client_flags: &[&str]) -> BenchReport {
    let mut server = vec!["write"];
    server.extend(server_flags);
    let mut client = vec!["write", "--size", "65536", "--iters", "300"];
    client.extend(client_flags);
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
    const SR: &[&str] = &["--selective-repeat"];
    const GBN: &[&str] = &["--recovery", "gbn"];
    let forced = write_run(&pair, SR, SR);
    let gbn = write_run(&pair, GBN, GBN);
    // Neither side asks: agreed in band.
    let auto = write_run(&pair, &[], &[]);
    // One side keeps go-back-N: its peer never sees the bit, neither
    // direction switches.
    let one_gbn = write_run(&pair, &[], GBN);
    eprintln!(
        "retransmits at 1 % loss: forced SR {}, go-back-N {}, in-band SR {}, client gbn {}",
        forced.retransmits, gbn.retransmits, auto.retransmits, one_gbn.retransmits
    );
    for (name, r) in [("forced", &forced), ("in band", &auto)] {
        assert!(r.retransmits > 0, "{name}: no loss seen: {r:?}");
        assert!(
            r.retransmits * 3 < gbn.retransmits,
            "{name} SR {} vs go-back-N {} retransmits",
            r.retransmits,
            gbn.retransmits
        );
    }
    assert!(
        one_gbn.retransmits > auto.retransmits * 2,
        "one side's --recovery gbn ran SR? {} vs in-band SR {}",
        one_gbn.retransmits,
        auto.retransmits
    );
    // The operations that stay in order under selective repeat still
    // arrive verified on an SR connection under the same loss, agreed in
    // band or forced.
    for flags in [&[][..], SR] {
        for (op, iters) in [("read", "300"), ("send", "300"), ("atomic", "2000")] {
            let mut client = vec![op, "--iters", iters];
            client.extend(flags);
            if op != "atomic" {
                client.extend(["--size", "65536"]);
            }
            let mut server = vec![op];
            server.extend(flags);
            let r: BenchReport = run_ok(&pair, "bench", &server, &client);
            assert_eq!(r.verified, Some(true), "{op} {flags:?}: {r:?}");
        }
    }
    let c = pair.in_b(xroce::xdp::read_counters).unwrap();
    assert!(c.get(xroce_common::Counter::DropFault) > 0, "{c:?}");
}
