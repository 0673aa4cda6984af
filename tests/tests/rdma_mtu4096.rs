//! Path MTU 4096: veth MTU 9000 on both ends, so a RoCE frame of a 4096-byte
//! payload outgrows an AF_XDP chunk and travels as a multi-buffer frame
//! (`Device::open_io`). WRITE, READ and SEND with data verified, and the UDP
//! backend against AF_XDP at the same MTU.

use xroce_report::{BenchReport, LatReport};
use xroce_tests::{
    perf::{bench_udp_against_afxdp, run_ok},
    require_root, VethPair,
};

#[test]
fn write_read_send_verified_at_4096() {
    require_root();
    let pair = VethPair::new(9000);
    for op in ["write", "read", "send"] {
        for (size, iters) in [("4096", "300"), ("65536", "100"), ("1MiB", "10")] {
            let r: BenchReport = run_ok(
                &pair,
                "bench",
                &[op],
                &[op, "--size", size, "--iters", iters],
            );
            assert_eq!(r.verified, Some(true), "{r:?}");
            assert_eq!(r.mtu, 4096, "{r:?}");
            assert_eq!(r.backend, "afxdp", "{r:?}");
            assert_eq!(r.iters, iters.parse::<u64>().unwrap());
        }
    }
    let r: LatReport = run_ok(
        &pair,
        "lat",
        &["send"],
        &["send", "--size", "8000", "--iters", "200"],
    );
    assert_eq!(r.verified, Some(true), "{r:?}");
    assert_eq!(r.mtu, 4096, "{r:?}");
}

#[test]
fn udp_backend_against_afxdp_at_4096() {
    require_root();
    let pair = VethPair::new(9000);
    for r in bench_udp_against_afxdp(&pair, "20000", "100") {
        assert_eq!(r.mtu, 4096, "{r:?}");
    }
}
