//! Incast of 4 senders into one receiver behind a virtual 200 Mbit/s
//! bottleneck with a 4 MB buffer (RED 5 KB..200 KB, pmax 1%), every sender
//! starting at the 200 Mbit/s line rate, run twice in the same test: with
//! DCQCN (the `software` preset) the queue stays well below the buffer,
//! nothing is dropped and the flows share the link fairly; without
//! congestion control the senders overrun the buffer and frames are
//! tail-dropped (and go-back-N retransmits them).

use xroce_tests::{experiment::run_incast, require_root};

const BUFFER: f64 = 4_000_000.0;

fn incast(cc: &str) -> xroce_tests::experiment::Incast {
    run_incast(
        &format!("cc-incast-{cc}"),
        &[
            "--senders",
            "4",
            "--cc",
            cc,
            "--link-rate",
            "200mbit",
            "--kmin",
            "5KB",
            "--kmax",
            "200KB",
            "--pmax",
            "0.01",
            "--buffer",
            "4MB",
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
    eprintln!("dcqcn: {d}\nnone: {n}");

    // DCQCN: marks and CNPs, a bounded queue, no loss, a fair share each.
    assert!(dcqcn.num("/marks") > 0.0, "{d}");
    assert!(dcqcn.num("/cnps") > 0.0, "{d}");
    let dcqcn_peak = dcqcn.num("/queue/peak_bytes");
    assert!(
        dcqcn_peak < BUFFER / 2.0,
        "DCQCN queue peak {dcqcn_peak} B (start included) is not well below the {BUFFER} B buffer: {d}"
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
        dcqcn.num("/aggregate_gbps") > 0.1,
        "DCQCN used under half of the 200 Mbit/s link: {d}"
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
