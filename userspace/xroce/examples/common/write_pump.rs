//! QP pairs streaming 4 KiB RDMA WRITEs between two engines that hand
//! frames to each other directly (no I/O, no loss): the loop the
//! engine-only examples (engine_bench's QP scaling, multicore_bench's
//! shards) time.

use std::sync::{Arc, Mutex};

use xroce::engine::completion::{Completion, WcStatus};
use xroce::engine::memory::MrTable;
use xroce::engine::qp_attr::Mtu;
use xroce::engine::sim::{
    connect_engines, sim_configs, EngineEndpoint, LinkConfig, PairParams, Sim, SimLink,
};
use xroce::engine::work::{SendWr, WrOpcode};
use xroce::engine::Engine;

/// Bytes per WRITE (MTU 4096: one packet each).
pub const MSG: usize = 4096;
/// WRITEs each busy QP keeps outstanding.
pub const DEPTH: u64 = 8;

/// The pattern QP `q` writes, byte `i`.
fn pattern(q: usize, i: usize) -> u8 {
    (i * 7 + q * 31) as u8
}

pub struct WritePump {
    sim: Sim<Mutex<Engine>>,
    pairs: Vec<(EngineEndpoint, EngineEndpoint)>,
    posted: Vec<u64>,
    /// WRITEs completed per busy QP.
    pub done: Vec<u64>,
    /// Frames moved, both directions.
    pub frames: u64,
    completions: Vec<Completion>,
    buf: Vec<u8>,
}

impl WritePump {
    /// `n` connected RC QP pairs, of which the first `busy` are driven.
    pub fn new(n: usize, busy: usize) -> Self {
        let (ca, cb) = sim_configs();
        let engine = |cfg| Mutex::new(Engine::new(cfg, Arc::new(MrTable::default())));
        let sim = Sim::new(
            engine(ca),
            engine(cb),
            SimLink::new(LinkConfig::default(), 0),
        );
        let p = PairParams {
            mtu: Mtu::Mtu4096,
            mr_len: MSG,
            max_wr: 64,
            cq_depth: 1024,
            ..Default::default()
        };
        let pairs: Vec<_> = (0..n).map(|_| connect_engines(&sim, &p)).collect();
        for (q, (a, _)) in pairs.iter().enumerate().take(busy) {
            let data: Vec<u8> = (0..MSG).map(|i| pattern(q, i)).collect();
            // SAFETY: nothing is posted yet; the caller alone drives the engines.
            unsafe { a.mr.write(0, &data) }.unwrap();
        }
        WritePump {
            sim,
            pairs,
            posted: vec![0; busy],
            done: vec![0; busy],
            frames: 0,
            completions: Vec::with_capacity(256),
            buf: vec![0u8; 9000],
        }
    }

    /// One round at time `now` (ns): tops up every busy QP, moves up to 256
    /// frames each way, fires due timers, counts completions (each must
    /// succeed).
    pub fn round(&mut self, now: u64) {
        let mut ga = self.sim.a.lock().unwrap();
        let mut gb = self.sim.b.lock().unwrap();
        for (q, (a, b)) in self.pairs.iter().take(self.posted.len()).enumerate() {
            while self.posted[q] - self.done[q] < DEPTH {
                let wr = SendWr::new(
                    (q as u64) << 32 | self.posted[q],
                    WrOpcode::RdmaWrite {
                        remote_addr: b.mr.addr(),
                        rkey: b.mr.rkey(),
                    },
                    vec![a.mr.sge(0, MSG)],
                );
                ga.post_send(a.qpn, &wr).unwrap();
                self.posted[q] += 1;
            }
        }
        for _ in 0..256 {
            let mut moved = false;
            if let Some(n) = ga.poll_transmit_frame(now, &mut self.buf) {
                gb.handle_frame(&self.buf[..n], now);
                self.frames += 1;
                moved = true;
            }
            if let Some(n) = gb.poll_transmit_frame(now, &mut self.buf) {
                ga.handle_frame(&self.buf[..n], now);
                self.frames += 1;
                moved = true;
            }
            if !moved {
                break;
            }
        }
        for g in [&mut ga, &mut gb] {
            if g.poll_timeout().is_some_and(|t| t <= now) {
                g.handle_timeout(now);
            }
        }
        ga.take_completions(&mut self.completions);
        for c in &self.completions {
            assert_eq!(c.wc.status, WcStatus::Success, "a WRITE failed");
            self.done[(c.wc.wr_id >> 32) as usize] += 1;
        }
        self.completions.clear();
        gb.take_completions(&mut self.completions);
        self.completions.clear();
    }

    /// Checks, once the engines are no longer driven, that every busy QP
    /// completed a WRITE and that its data landed intact.
    pub fn verify(&self) {
        for (q, (_, b)) in self.pairs.iter().take(self.done.len()).enumerate() {
            assert!(self.done[q] > 0, "QP {q} completed no WRITE");
            let mut got = vec![0u8; MSG];
            // SAFETY: the engines are no longer driven, so nothing writes
            // the region (WRITEs still in flight never land).
            unsafe { b.mr.read(0, &mut got) }.unwrap();
            assert!(
                got.iter().enumerate().all(|(i, &v)| v == pattern(q, i)),
                "QP {q}: the data written differs from the data sent"
            );
        }
    }
}
