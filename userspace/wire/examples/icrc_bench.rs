//! ICRC throughput: the codec's ICRC (crc32fast: PCLMULQDQ when the CPU has
//! it) against two peers measured in the same run over the same frames — a
//! byte-at-a-time table CRC-32 (Sarwate) and a bitwise CRC-32 — plus whole
//! frame emit and verify. Every peer's result is checked against the codec's.
//!
//! `cargo run --release -p xroce-wire --example icrc_bench [-- SECONDS_PER_CASE]`
//! prints one JSON object on stdout.
use std::hint::black_box;
use std::time::{Duration, Instant};

use xroce_wire::ext::RethRepr;
use xroce_wire::*;

/// A frame of `payload` bytes: RC RDMA WRITE FIRST (RETH), IPv4, like rxe sends.
fn frame(payload: usize) -> Vec<u8> {
    let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_RDMA_WRITE_FIRST, 0x11, 0x1234));
    t.reth = Some(RethRepr {
        va: 0x7f00_0000_1000,
        rkey: 0x1234,
        dma_len: 1 << 20,
    });
    let r = FrameRepr::new(
        [2, 0, 0, 0, 0, 1],
        [2, 0, 0, 0, 0, 2],
        Gid::from_ipv4([10, 0, 0, 1]),
        Gid::from_ipv4([10, 0, 0, 2]),
        0xc123,
        t,
    );
    let data: Vec<u8> = (0..payload).map(|i| (i * 7) as u8).collect();
    let mut b = vec![0u8; r.frame_len(payload)];
    emit_frame(&r, &data, &mut b).unwrap();
    b
}

/// The bytes the ICRC covers, masked, for an untagged IPv4 frame (the same
/// rules as the codec, spelled out independently).
fn masked_icrc_input(f: &[u8]) -> Vec<u8> {
    let mut v = vec![0xffu8; 8];
    let mut ip = f[14..34].to_vec();
    ip[1] = 0xff;
    ip[8] = 0xff;
    ip[10] = 0xff;
    ip[11] = 0xff;
    v.extend_from_slice(&ip);
    let mut rest = f[34..f.len() - 4].to_vec();
    rest[6] = 0xff;
    rest[7] = 0xff;
    rest[8 + 4] = 0xff;
    v.extend_from_slice(&rest);
    v
}

fn make_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    for (i, e) in t.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *e = c;
    }
    t
}

fn crc_table(t: &[u32; 256], data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = t[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

fn crc_bitwise(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = (c >> 1) ^ (0xedb8_8320 & (c & 1).wrapping_neg());
        }
    }
    !c
}

/// Run `f` over `bytes`-sized inputs for about `dur`; returns bytes/s.
fn measure(dur: Duration, bytes: usize, mut f: impl FnMut() -> u32) -> f64 {
    // Warm up, then time batches until `dur` has passed.
    for _ in 0..16 {
        black_box(f());
    }
    let start = Instant::now();
    let mut n = 0u64;
    let mut batch = 1u64;
    while start.elapsed() < dur {
        for _ in 0..batch {
            black_box(f());
        }
        n += batch;
        batch = (batch * 2).min(1 << 14);
    }
    (n as f64 * bytes as f64) / start.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.4);
    let dur = Duration::from_secs_f64(secs);
    let table = make_table();
    let mut cases = Vec::new();
    let mut ratio_4096 = 0.0;
    for payload in [64usize, 1024, 4096] {
        let f = frame(payload);
        let input = masked_icrc_input(&f);
        let (computed, found) = icrc::frame_icrc(&f).unwrap();
        assert_eq!(computed, found);
        assert_eq!(
            crc_table(&table, &input),
            computed,
            "table peer disagrees with the codec"
        );
        assert_eq!(
            crc_bitwise(&input),
            computed,
            "bitwise peer disagrees with the codec"
        );
        let covered = input.len();
        let ip = &f[14..34];
        let l4 = &f[34..f.len() - 4];
        let codec = measure(dur, covered, || {
            icrc::compute(black_box(ip), black_box(l4)).unwrap()
        });
        let tab = measure(dur, covered, || crc_table(&table, black_box(&input)));
        let bit = measure(dur / 2, covered, || crc_bitwise(black_box(&input)));
        let verify = measure(dur, f.len(), || {
            icrc::verify_frame(black_box(&f)).is_ok() as u32
        });
        let (repr, payload_bytes) = parse_frame(&f).unwrap();
        let mut out = vec![0u8; f.len()];
        let emit = measure(dur, f.len(), || {
            emit_frame(&repr, black_box(payload_bytes), &mut out).unwrap() as u32
        });
        if payload == 4096 {
            ratio_4096 = codec / tab;
        }
        cases.push(format!(
            concat!(
                "{{\"payload\":{},\"frame_bytes\":{},\"icrc_bytes\":{},",
                "\"icrc_bytes_per_s\":{:.0},\"table_crc_bytes_per_s\":{:.0},\"bitwise_crc_bytes_per_s\":{:.0},",
                "\"ratio_vs_table\":{:.2},\"ratio_vs_bitwise\":{:.2},",
                "\"verify_frame_bytes_per_s\":{:.0},\"emit_frame_bytes_per_s\":{:.0}}}"
            ),
            payload,
            f.len(),
            covered,
            codec,
            tab,
            bit,
            codec / tab,
            codec / bit,
            verify,
            emit
        ));
    }
    #[cfg(target_arch = "x86_64")]
    let pclmul = std::is_x86_feature_detected!("pclmulqdq");
    #[cfg(not(target_arch = "x86_64"))]
    let pclmul = false;
    println!(
        "{{\"bench\":\"icrc\",\"unit\":\"bytes/s\",\"peer\":\"byte-table CRC-32 (Sarwate)\",\"pclmulqdq\":{pclmul},\"seconds_per_case\":{secs},\"ratio_vs_table_4096\":{ratio_4096:.2},\"cases\":[{}]}}",
        cases.join(",")
    );
}
