//! Engine-only throughput: two engines in one thread hand frames to each
//! other directly (no I/O, no loss), RDMA WRITE / SEND streams at several
//! MTUs. The peer measured in the same run is the codec alone (emit + parse
//! with ICRC of frames of the same size), i.e. the floor any RoCEv2 stack
//! pays per packet; the ratio says how much the transport adds on top.
//!
//! Then the cost per packet against the number of QPs: N RC QP pairs of
//! which K stream 4 KiB WRITEs (MTU 4096: one packet each, plus ACKs), in
//! ns per frame (both directions): it should not grow with N, the idle QPs
//! cost nothing per packet.
//!
//! `cargo run --release -p xroce --example engine_bench [-- seconds]`
//! prints one JSON object on stdout.

use std::sync::{Arc, Mutex};
use std::time::Instant;

#[path = "common/write_pump.rs"]
mod write_pump;
use write_pump::WritePump;

use xroce::engine::completion::{Completion, WcStatus};
use xroce::engine::memory::MrTable;
use xroce::engine::qp_attr::Mtu;
use xroce::engine::sim::{connect_engines, PairParams, Sim};
use xroce::engine::sim::{LinkConfig, SimLink};
use xroce::engine::work::{RecvWr, SendWr, WrOpcode};
use xroce::engine::{Engine, EngineConfig};
use xroce_wire::{emit_frame, parse_frame_checked, BthRepr, FrameRepr, Gid, Opcode, TransportRepr};

struct Res {
    name: String,
    gbps: f64,
    mpps: f64,
    codec_gbps: f64,
}

fn codec_only(mtu: usize, secs: f64) -> f64 {
    let t = TransportRepr::new(BthRepr::new(Opcode::RC_RDMA_WRITE_MIDDLE, 0x11, 0));
    let ip = Gid::from_ipv4([10, 0, 0, 1]);
    let h = FrameRepr::new([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], ip, ip, 0xc000, t);
    let payload = vec![0xa5u8; mtu];
    let mut buf = vec![0u8; 9000];
    let mut sink = vec![0u8; mtu];
    let t0 = Instant::now();
    let mut bytes = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        for _ in 0..1000 {
            let n = emit_frame(&h, &payload, &mut buf).unwrap();
            let (_, p) = parse_frame_checked(&buf[..n]).unwrap();
            // The engine copies the payload once on each side; so does this.
            sink.copy_from_slice(p);
            bytes += mtu as u64;
        }
    }
    bytes as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9
}

fn engine(op: &str, mtu: Mtu, msg: usize, secs: f64) -> (f64, f64) {
    let (mut ca, mut cb) = xroce::engine::sim::sim_configs();
    for c in [&mut ca, &mut cb] {
        *c = EngineConfig {
            line_rate_bps: 1 << 50,
            ..c.clone()
        };
    }
    let engine = |cfg| Mutex::new(Engine::new(cfg, Arc::new(MrTable::default())));
    let sim = Sim::new(
        engine(ca),
        engine(cb),
        SimLink::new(LinkConfig::default(), 0),
    );
    let p = PairParams {
        mtu,
        mr_len: msg.max(8),
        max_wr: 64,
        cq_depth: 1024,
        ..Default::default()
    };
    let (a, b) = connect_engines(&sim, &p);
    let wr = |id: u64| match op {
        "write" => SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(0, msg)],
        ),
        _ => SendWr::new(id, WrOpcode::Send, vec![a.mr.sge(0, msg)]),
    };
    let recv = RecvWr {
        wr_id: 0,
        sg_list: vec![b.mr.sge(0, msg)],
    };
    let mut posted = 0u64;
    let mut done = 0u64;
    let mut completions: Vec<Completion> = Vec::with_capacity(64);
    let mut buf = vec![0u8; 9000];
    let t0 = Instant::now();
    let mut frames = 0u64;
    loop {
        let now = t0.elapsed().as_nanos() as u64 + 1_000_000;
        let mut ga = sim.a.lock().unwrap();
        let mut gb = sim.b.lock().unwrap();
        while posted - done < 32 {
            if op == "send" {
                gb.post_recv(b.qpn, &recv).unwrap();
            }
            ga.post_send(a.qpn, &wr(posted)).unwrap();
            posted += 1;
        }
        for _ in 0..64 {
            let mut moved = false;
            if let Some(n) = ga.poll_transmit_frame(now, &mut buf) {
                gb.handle_frame(&buf[..n], now);
                frames += 1;
                moved = true;
            }
            if let Some(n) = gb.poll_transmit_frame(now, &mut buf) {
                ga.handle_frame(&buf[..n], now);
                frames += 1;
                moved = true;
            }
            if !moved {
                break;
            }
        }
        if ga.poll_timeout().is_some_and(|t| t <= now) {
            ga.handle_timeout(now);
        }
        ga.take_completions(&mut completions);
        assert!(completions
            .iter()
            .all(|c| c.cq == a.cq && c.wc.status == WcStatus::Success));
        done += completions.len() as u64;
        completions.clear();
        gb.take_completions(&mut completions);
        completions.clear();
        drop((ga, gb));
        if t0.elapsed().as_secs_f64() >= secs {
            break;
        }
    }
    let el = t0.elapsed().as_secs_f64();
    (
        done as f64 * msg as f64 * 8.0 / el / 1e9,
        frames as f64 / el / 1e6,
    )
}

/// ns per frame (both directions) with `n` connected RC QP pairs of which
/// the first `k` keep 8 4-KiB WRITEs outstanding each.
fn many_qps(n: usize, k: usize, secs: f64) -> f64 {
    let mut pump = WritePump::new(n, k);
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        pump.round(t0.elapsed().as_nanos() as u64 + 1_000_000);
    }
    let el = t0.elapsed().as_secs_f64();
    pump.verify();
    el * 1e9 / pump.frames as f64
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let mut res = Vec::new();
    for (op, mtu, msg) in [
        ("write", Mtu::Mtu4096, 1 << 20),
        ("write", Mtu::Mtu1024, 1 << 20),
        ("send", Mtu::Mtu4096, 65536),
        ("write", Mtu::Mtu1024, 64),
    ] {
        let (gbps, mpps) = engine(op, mtu, msg, secs);
        let codec_gbps = codec_only(mtu.bytes().min(msg as u32) as usize, secs / 2.0);
        res.push(Res {
            name: format!("{op}_{}B_mtu{}", msg, mtu.bytes()),
            gbps,
            mpps,
            codec_gbps,
        });
    }
    let items: Vec<String> = res
        .iter()
        .map(|r| {
            format!(
                "{{\"case\":\"{}\",\"engine_goodput_gbps\":{:.2},\"engine_mpps_both_directions\":{:.3},\"codec_only_gbps\":{:.2},\"ratio_engine_vs_codec\":{:.3}}}",
                r.name,
                r.gbps,
                r.mpps,
                r.codec_gbps,
                r.gbps / r.codec_gbps
            )
        })
        .collect();
    let mut scale = Vec::new();
    for k in [1, 16] {
        for n in [1, 100, 10_000] {
            let ns = many_qps(n.max(k), k, secs);
            scale.push(format!(
                "{{\"qps\":{},\"busy\":{k},\"ns_per_frame\":{ns:.1}}}",
                n.max(k)
            ));
        }
    }
    println!(
        "{{\"bench\":\"engine_only\",\"seconds_per_case\":{secs},\"results\":[{}],\"qp_scaling\":[{}]}}",
        items.join(","),
        scale.join(",")
    );
}
