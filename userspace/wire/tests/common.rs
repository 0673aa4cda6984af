//! Shared helpers for the integration tests: locating and reading the
//! reference captures.
#![allow(dead_code)]

use std::path::PathBuf;

/// The reference captures of two Linux rdma_rxe peers (`tests/data/rxe`,
/// committed with the crate): every ICRC in them is rxe's.
pub fn pcap_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/rxe");
    assert!(
        d.is_dir(),
        "reference captures not found at {}",
        d.display()
    );
    d
}

/// Every `*.pcap` of the reference captures, sorted; fails if there are none.
pub fn pcaps() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(pcap_dir())
        .expect("read pcap dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no .pcap files in {}", pcap_dir().display());
    v
}

/// All packets of a pcap (Ethernet link type expected) as owned byte vectors.
pub fn read_pcap(path: &std::path::Path) -> Vec<Vec<u8>> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut r = pcap_file::pcap::PcapReader::new(f).expect("pcap header");
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        let p = p.expect("pcap record");
        assert_eq!(
            p.data.len() as u32,
            p.orig_len,
            "capture truncated (snaplen) in {}",
            path.display()
        );
        out.push(p.data.into_owned());
    }
    out
}
