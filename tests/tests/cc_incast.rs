//! Incast of 4 senders into one receiver behind a virtual 100 Mbit/s
//! bottleneck with a 3 MB buffer (RED 5 KB..200 KB, pmax 1%), every sender
//! starting at the 100 Mbit/s line rate, run twice in the same test: with
//! DCQCN (the `software` preset) the queue stays well below the buffer,
//! nothing is dropped and the flows share the link fairly; without
//! congestion control the senders overrun the buffer and frames are
//! tail-dropped (and go-back-N retransmits them). Tail drops can starve a
//! go-back-N flow until its QP runs out of retries (seen on busy hosts):
//! the experiment then reports that flow's end, which this run allows.
//!
//! The overrun needs senders that offer more than the link takes. Beside
//! two CPU hogs on a 2-core host, 4 senders at 200 Mbit/s each offered 224
//! Mbit/s in all to a 200 Mbit/s link: the queue crept up at 3 MB/s and a
//! 4 MB buffer never overflowed in 3 s. At 100 Mbit/s into 3 MB the same
//! starved senders overload the link twice over and fill it in a second.
//! How high DCQCN's queue goes while the flows start, all at line rate,
//! depends on how soon the senders get a core to take their CNPs (1.07 MB
//! beside the hogs): nothing may be lost then, and after the start the
//! queue must stay under half the buffer (a sender the host held back
//! sends a burst at the rate it had; 0.96 MB was seen beside the hogs)
//! and average a tenth of it.

use xroce_tests::{
    experiment::{run_incast, run_incast_where_qps_may_give_up},
    require_root,
};

const BUFFER: f64 = 3_000_000.0;

fn incast(cc: &str) -> xroce_tests::experiment::Incast {
    let run = if cc == "none" {
        run_incast_where_qps_may_give_up
    } else {
        run_incast
    };
    run(
        &format!("cc-incast-{cc}"),
        &[
            "--senders",
            "4",
            "--cc",
            cc,
            "--link-rate",
            "100mbit",
            "--kmin",
            "5KB",
            "--kmax",
            "200KB",
            "--pmax",
            "0.01",
            "--buffer",
            "3MB",
            "--duration",
            "3",
            "--bin-ms",
            "10",
        ],
    )
}

#[test]
fn dcqcn_bounds_the_queue_and_shares_fairly_where_none_overflows() {
    require_root();
    let dcqcn = incast("dcqcn");
    let none = incast("none");
    let (d, n) = (dcqcn.brief(), none.brief());
    eprintln!(
        "dcqcn: {d}\nnone: {n}; QPs that ran out of retries: {:?}",
        none.qp_errors()
    );

    // DCQCN: marks and CNPs, a bounded queue, no loss, a fair share each.
    assert!(dcqcn.num("/marks") > 0.0, "{d}");
    assert!(dcqcn.num("/cnps") > 0.0, "{d}");
    let dcqcn_peak = dcqcn.num("/queue/after_warmup/peak_bytes");
    assert!(
        dcqcn_peak < BUFFER / 2.0,
        "DCQCN queue peak {dcqcn_peak} B after the start is not well below the {BUFFER} B buffer: {d}"
    );
    let dcqcn_mean = dcqcn.num("/queue/after_warmup/mean_bytes");
    assert!(
        dcqcn_mean < BUFFER / 10.0,
        "DCQCN's queue averages {dcqcn_mean} B after the start: {d}"
    );
    assert_eq!(dcqcn.num("/drops/total"), 0.0, "DCQCN lost frames: {d}");
    let jain = dcqcn.num("/jain_index");
    assert!(jain > 0.9, "DCQCN Jain index {jain}: {d}");
    assert!(
        dcqcn.num("/aggregate_gbps") > 0.05,
        "DCQCN used under half of the 100 Mbit/s link: {d}"
    );

    // None: 4 senders at line rate overrun the buffer and lose frames.
    let none_peak = none.num("/queue/peak_bytes");
    assert!(
        none_peak >= BUFFER * 0.9,
        "without CC the queue peaked at {none_peak} B, short of the {BUFFER} B buffer: {n}"
    );
    assert!(
        none.num("/drops/tail") > 0.0,
        "without CC nothing was dropped: {n}"
    );
    let none_mean = none.num("/queue/after_warmup/mean_bytes");
    assert!(
        none_mean > 4.0 * dcqcn_mean,
        "without CC the queue averages {none_mean} B, DCQCN {dcqcn_mean} B: {n}"
    );
    dcqcn.remove();
    none.remove();
}

/// A sender whose every frame is lost runs out of retries: the experiment
/// reports that flow's end (RetryExcErr, after what it moved before, here
/// nothing) and still succeeds with every output written.
#[test]
fn a_sender_whose_qp_gives_up_is_a_result_not_an_error() {
    require_root();
    let dead = run_incast_where_qps_may_give_up(
        "cc-incast-dead",
        &[
            "--senders",
            "1",
            "--cc",
            "none",
            "--link-rate",
            "200mbit",
            "--drop",
            "1",
            "--duration",
            "3",
        ],
    );
    let given_up = dead.qp_errors();
    assert_eq!(given_up.len(), 1, "{given_up:?}: {}", dead.brief());
    assert!(given_up[0].contains("RetryExcErr"), "{given_up:?}");
    assert_eq!(dead.summary["flows"][0]["error"], serde_json::Value::Null);
    assert_eq!(
        dead.summary["flows"][0]["verified"],
        true,
        "{}",
        dead.brief()
    );
    assert_eq!(dead.num("/flows/0/bytes"), 0.0, "{}", dead.brief());
    assert!(
        dead.stderr.contains("ran out of retries"),
        "the run says so: {}",
        dead.stderr
    );
    dead.remove();
}
