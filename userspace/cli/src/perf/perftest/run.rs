//! The measurement loops, as perftest's run_iter_bw, run_iter_bw_server
//! and run_iter_lat_{write,send} / run_iter_lat (READ).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use xroce::{
    connect::{perftest::BwReport, Role},
    verbs::{RecvWr, SendWr, Wc, WcOpcode, WrOpcode},
};

use super::{rx_depth, Params, Test};
use crate::perf::{conn::check_wc, Op};

/// A run that makes no progress for this long has failed.
const STALL: Duration = Duration::from_secs(10);
/// MB as perftest counts them.
pub(super) const MB: f64 = 1048576.0;

/// The bandwidth one side measured.
pub(super) struct BwResult {
    pub(super) msgs: u64,
    pub(super) seconds: f64,
    pub(super) retransmits: u64,
    pub(super) cnps: u64,
}

impl BwResult {
    pub(super) fn bytes(&self, p: Params) -> u64 {
        self.msgs * p.size as u64
    }

    fn mb_per_sec(&self, p: Params) -> f64 {
        if self.seconds > 0.0 {
            self.bytes(p) as f64 / self.seconds / MB
        } else {
            0.0
        }
    }

    pub(super) fn to_report(&self, p: Params) -> BwReport {
        let bw = self.mb_per_sec(p);
        BwReport {
            size: p.size as u64,
            iters: self.msgs,
            bw_peak: bw,
            bw_avg: bw,
            msg_rate_avg: if self.seconds > 0.0 {
                self.msgs as f64 / self.seconds / 1e6
            } else {
                0.0
            },
        }
    }
}

impl Test {
    pub(super) fn post_recv(&self, q: usize) -> anyhow::Result<()> {
        self.qps[q]
            .post_recv(&RecvWr {
                wr_id: q as u64,
                sg_list: vec![self.mr.sge(self.recv_off(q), self.p.size)],
            })
            .context("post receive")
    }

    fn post(&self, q: usize, k: u64) -> anyhow::Result<()> {
        let p = self.p;
        let off = self.cycle_off(k);
        let r = &self.rem[q];
        let remote_addr = r.vaddr + off;
        let local = self.send_off(q) + off as usize;
        let opcode = match p.op {
            Op::Write => WrOpcode::RdmaWrite {
                remote_addr,
                rkey: r.rkey,
            },
            Op::Read => WrOpcode::RdmaRead {
                remote_addr,
                rkey: r.rkey,
            },
            Op::Send => WrOpcode::Send,
            Op::Atomic => WrOpcode::AtomicFetchAndAdd {
                remote_addr,
                rkey: r.rkey,
                add: 1,
            },
        };
        self.qps[q]
            .post_send(&self.send_wr(q as u64, opcode, self.mr.sge(local, p.size)))
            .with_context(|| format!("post {} on QP {q}", p.verb()))
    }

    /// run_iter_bw: `tx_depth` in flight per QP until `iters` per QP.
    pub(super) fn bw_client(&mut self) -> anyhow::Result<BwResult> {
        let p = self.p;
        let before = self.stack.device.stats();
        let mut posted = vec![0u64; p.qps];
        let mut done = vec![0u64; p.qps];
        let start = Instant::now();
        for (q, n) in posted.iter_mut().enumerate() {
            while *n < p.iters && *n < p.tx_depth as u64 {
                self.post(q, *n)?;
                *n += 1;
            }
        }
        let mut wcs = [Wc::default(); 64];
        let mut last = Instant::now();
        while done.iter().any(|&d| d < p.iters) {
            let n = self.cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                check_wc(wc, p.verb())?;
                let q = wc.wr_id as usize;
                done[q] += 1;
                if posted[q] < p.iters {
                    self.post(q, posted[q])?;
                    posted[q] += 1;
                }
            }
            if n == 0 {
                self.stalled(&mut last)?;
                self.cq.wait(Duration::from_millis(1))?;
            } else {
                last = Instant::now();
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let after = self.stack.device.stats();
        Ok(BwResult {
            msgs: done.iter().sum(),
            seconds,
            retransmits: after.tx_retransmitted - before.tx_retransmitted,
            cnps: after.rx_cnps - before.rx_cnps,
        })
    }

    /// run_iter_bw_server: `iters` receives per QP, timed from the first.
    pub(super) fn bw_send_server(&mut self) -> anyhow::Result<BwResult> {
        let p = self.p;
        let before = self.stack.device.stats();
        let total = p.iters * p.qps as u64;
        let mut got = vec![0u64; p.qps];
        let mut posted = vec![rx_depth(p) as u64; p.qps];
        let mut wcs = [Wc::default(); 64];
        let mut first = None;
        let mut last = Instant::now();
        let mut rcnt = 0;
        while rcnt < total {
            let n = self.cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                check_wc(wc, "receive")?;
                first.get_or_insert_with(Instant::now);
                let q = wc.wr_id as usize;
                got[q] += 1;
                rcnt += 1;
                if posted[q] < p.iters {
                    self.post_recv(q)?;
                    posted[q] += 1;
                }
            }
            if n == 0 {
                // The client may take its time to start.
                if first.is_some() {
                    self.stalled(&mut last)?;
                }
                self.cq.wait(Duration::from_millis(1))?;
            } else {
                last = Instant::now();
            }
        }
        let seconds = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
        let after = self.stack.device.stats();
        Ok(BwResult {
            msgs: rcnt,
            seconds,
            retransmits: after.tx_retransmitted - before.tx_retransmitted,
            cnps: after.rx_cnps - before.rx_cnps,
        })
    }

    fn stalled(&self, last: &mut Instant) -> anyhow::Result<()> {
        self.stack.check_running()?;
        if last.elapsed() > STALL {
            bail!("no completion for {STALL:?}; is the peer alive?");
        }
        Ok(())
    }

    /// Waits for one completion of `opcode`-kind (`recv`: a receive;
    /// else a send-side one); counts the other kind in `other`.
    fn wait_wc(&self, want_recv: bool, other: &mut u64) -> anyhow::Result<Wc> {
        let deadline = Instant::now() + STALL;
        loop {
            if let Some(wc) = self.cq.poll_one()? {
                check_wc(&wc, self.p.verb())?;
                let is_recv = wc.opcode == WcOpcode::Recv;
                if is_recv == want_recv {
                    return Ok(wc);
                }
                *other += 1;
                continue;
            }
            if Instant::now() > deadline {
                self.stack.check_running()?;
                bail!("no completion within {STALL:?}; is the peer alive?");
            }
            std::thread::yield_now();
        }
    }

    /// run_iter_lat_write: the counter in the last byte of the buffer.
    pub(super) fn lat_write(&mut self) -> anyhow::Result<Vec<u64>> {
        let p = self.p;
        let post_at = p.size - 1;
        let poll_at = self.recv_off(0) + p.size - 1;
        let mut posted_at = Vec::with_capacity(p.iters as usize);
        let (mut scnt, mut ccnt, mut rcnt) = (0u64, 0u64, 0u64);
        let mut unused = 0;
        let mut byte = [0u8; 1];
        while scnt < p.iters || ccnt < p.iters || rcnt < p.iters {
            if rcnt < p.iters && !(scnt < 1 && self.role == Role::Server) {
                rcnt += 1;
                let deadline = Instant::now() + STALL;
                loop {
                    {
                        // The engine writes MR memory only with the device
                        // locked: holding it, no WRITE lands on the byte.
                        // (QP 0's engine: with --io-threads, its shard.)
                        let _engine = self.qps[0].device().lock();
                        // SAFETY: no concurrent writer while the engine lock is held.
                        unsafe { self.mr.read(poll_at, &mut byte) }?;
                    }
                    if byte[0] == rcnt as u8 {
                        break;
                    }
                    if Instant::now() > deadline {
                        self.stack.check_running()?;
                        bail!("write {rcnt} did not arrive within {STALL:?}; is the peer alive?");
                    }
                    // Yield, do not spin: the I/O thread may share the core.
                    std::thread::yield_now();
                }
            }
            if scnt < p.iters {
                scnt += 1;
                // SAFETY: our last WRITE from here completed (wait_wc below); the peer writes our receive half.
                unsafe { self.mr.write(post_at, &[scnt as u8]) }?;
                posted_at.push(Instant::now());
                self.qps[0].post_send(&self.send_wr(
                    0,
                    WrOpcode::RdmaWrite {
                        remote_addr: self.rem[0].vaddr,
                        rkey: self.rem[0].rkey,
                    },
                    self.mr.sge(0, p.size),
                ))?;
            }
            if ccnt < p.iters {
                self.wait_wc(false, &mut unused)?;
                ccnt += 1;
            }
        }
        Ok(gaps(&posted_at, 2))
    }

    /// run_iter_lat_send: the client sends first, each side answers.
    pub(super) fn lat_send(&mut self) -> anyhow::Result<Vec<u64>> {
        let p = self.p;
        let mut posted_at = Vec::with_capacity(p.iters as usize);
        let (mut scnt, mut rcnt, mut sdone) = (0u64, 0u64, 0u64);
        let mut recvs_early = 0u64;
        while scnt < p.iters || rcnt < p.iters {
            if rcnt < p.iters && !(scnt < 1 && self.role == Role::Client) {
                if recvs_early > 0 {
                    recvs_early -= 1;
                } else {
                    self.wait_wc(true, &mut sdone)?;
                }
                rcnt += 1;
                self.post_recv(0)?;
            }
            if scnt < p.iters {
                posted_at.push(Instant::now());
                scnt += 1;
                self.qps[0].post_send(&self.send_wr(0, WrOpcode::Send, self.mr.sge(0, p.size)))?;
                // Reap the send's completion (a receive may come first).
                while sdone < scnt {
                    if self.wait_any()?.opcode == WcOpcode::Recv {
                        recvs_early += 1;
                    } else {
                        sdone += 1;
                    }
                }
            }
        }
        Ok(gaps(&posted_at, 2))
    }

    fn wait_any(&self) -> anyhow::Result<Wc> {
        let deadline = Instant::now() + STALL;
        loop {
            if let Some(wc) = self.cq.poll_one()? {
                check_wc(&wc, self.p.verb())?;
                return Ok(wc);
            }
            if Instant::now() > deadline {
                self.stack.check_running()?;
                bail!("no completion within {STALL:?}; is the peer alive?");
            }
            std::thread::yield_now();
        }
    }

    /// run_iter_lat (READ): one READ at a time, post to completion.
    pub(super) fn lat_read(&mut self) -> anyhow::Result<Vec<u64>> {
        let p = self.p;
        let mut samples = Vec::with_capacity(p.iters as usize);
        let mut unused = 0;
        for _ in 0..p.iters {
            let t0 = Instant::now();
            self.qps[0].post_send(&SendWr::new(
                0,
                WrOpcode::RdmaRead {
                    remote_addr: self.rem[0].vaddr,
                    rkey: self.rem[0].rkey,
                },
                vec![self.mr.sge(0, p.size)],
            ))?;
            self.wait_wc(false, &mut unused)?;
            samples.push(t0.elapsed().as_nanos() as u64);
        }
        Ok(samples)
    }
}

/// perftest's latency samples: half (or all) of the gap between posts.
fn gaps(posted_at: &[Instant], factor: u32) -> Vec<u64> {
    posted_at
        .windows(2)
        .map(|w| (w[1] - w[0]).as_nanos() as u64 / factor as u64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_is_half_the_gap_between_posts() {
        let t0 = Instant::now();
        let ts = [
            t0,
            t0 + Duration::from_micros(10),
            t0 + Duration::from_micros(30),
        ];
        assert_eq!(gaps(&ts, 2), vec![5000, 10000]);
        assert_eq!(gaps(&ts, 1), vec![10000, 20000]);
    }
}
