//! Every RoCEv2 frame of the reference rxe captures decodes, its ICRC is
//! recomputed exactly, and emit(parse(frame)) reproduces it byte for byte.
mod common;

use xroce_wire::{emit_frame, icrc, parse_frame};

#[test]
fn reference_pcaps_roundtrip() {
    for path in common::pcaps() {
        let frames = common::read_pcap(&path);
        let mut roce = 0;
        for (i, f) in frames.iter().enumerate() {
            let (repr, payload) = match parse_frame(f) {
                Ok(x) => x,
                Err(e) if e.is_not_roce() => continue,
                Err(e) => panic!("{} frame {}: {e}", path.display(), i + 1),
            };
            roce += 1;
            let (computed, found) = icrc::frame_icrc(f).unwrap();
            assert_eq!(computed, found, "{} frame {}: ICRC", path.display(), i + 1);
            let mut out = vec![0u8; repr.frame_len(payload.len())];
            let n = emit_frame(&repr, payload, &mut out).unwrap();
            assert_eq!(n, f.len(), "{} frame {}: length", path.display(), i + 1);
            assert_eq!(
                &out[..],
                &f[..],
                "{} frame {}: bytes differ",
                path.display(),
                i + 1
            );
        }
        assert!(roce > 0, "{}: no RoCEv2 frames", path.display());
        eprintln!(
            "{}: {} frames, {} RoCEv2 ok",
            path.display(),
            frames.len(),
            roce
        );
    }
}
