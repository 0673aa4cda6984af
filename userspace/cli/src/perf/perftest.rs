//! `--perftest`: `xroce bench` / `xroce lat` against perftest v4.5-0.17's
//! ib_{write,read,send,atomic}_bw and ib_{write,read,send}_lat (RC, no
//! rdma_cm), as client (`xroce bench write --perftest -d IF HOST`, like
//! `ib_write_bw HOST`) or server (`xroce bench write --perftest -d IF`,
//! like `ib_write_bw`).
//!
//! What perftest does, and so do we:
//!
//! - the OOB exchange of [`xroce::connect::perftest`]: versions, cycle
//!   buffer and cache line (the larger of each side's), MTU (the smaller),
//!   then the per-tool sequence of hand shakes below;
//! - one buffer of 2 x QPs x `BUFF_SIZE` (a QP's message size, at least the
//!   cycle buffer): QP i sends from slot i of the first half and gives the
//!   peer slot i of the second half as its `vaddr` (`rkey` of the buffer);
//! - below half a cycle buffer, RDMA addresses step by the message size
//!   rounded up to a cache line and wrap at the cycle buffer;
//! - write/read/atomic bw: the server is passive and waits in a hand shake;
//!   the client runs, hand-shakes, exchanges the bw report, closes;
//!   send bw: the server receives `iters` messages per QP and reports its
//!   own bandwidth;
//! - write lat: both poll the last byte of their buffer for the peer's
//!   counter (the server writes first); send lat: the client sends first;
//!   read lat: the client reads, the server waits to close;
//! - defaults: size 65536 (bw) / 2 (lat), 5000 (bw) / 1000 (lat) iterations,
//!   tx depth 128 (bw) / 1 (lat), port 18515; latency as half the gap
//!   between successive posts (write, send) or the gap (read).
//!
//! perftest does not check data; neither does this mode (`verified` is
//! null in the JSON report).

use std::{
    net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use rand::Rng;
use xroce::{
    connect::{
        perftest::{BwReport, PerftestConn, PerftestDest, VERSION},
        ConnectError, Role,
    },
    verbs::{
        CompletionQueue, MemoryRegion, Mtu, ProtectionDomain, QpInitAttr, QueuePair, RecvWr,
        SendWr, Wc, WcOpcode, WrOpcode,
    },
};

use super::{
    bw::print_report,
    conn::{check_wc, connect_qp, peer_mac, percentiles, ALL_ACCESS},
    stack::{first_ipv4, Stack},
    Op, PerfArgs, RunLength, OOB_TIMEOUT,
};

/// perftest's defaults.
const DEF_SIZE_BW: usize = 65536;
const DEF_SIZE_LAT: usize = 2;
const DEF_ITERS_BW: u64 = 5000;
const DEF_ITERS_LAT: u64 = 1000;
/// perftest's DEF_RX_SEND: receives the send server keeps posted.
const DEF_RX_SEND: usize = 512;
/// `sysconf(_SC_PAGESIZE)` on the hosts we run on.
const CYCLE_BUFFER: i32 = 4096;
const CACHE_LINE: i32 = 64;
/// Outstanding RDMA reads/atomics we accept as responder (and announce).
const OUT_READS: u16 = 16;
/// How long a server waits for a client to connect.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// A run that makes no progress for this long has failed.
const STALL: Duration = Duration::from_secs(10);
/// MB as perftest counts them.
const MB: f64 = 1048576.0;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tool {
    Bw,
    Lat,
}

/// Run parameters after perftest's defaults.
#[derive(Clone, Copy, Debug)]
struct Params {
    tool: Tool,
    op: Op,
    size: usize,
    iters: u64,
    qps: usize,
    tx_depth: usize,
}

impl Params {
    fn new(args: &PerfArgs, tool: Tool) -> anyhow::Result<Params> {
        let size = match (tool, args.op) {
            (_, Op::Atomic) => 8,
            (Tool::Bw, _) => args.size_or(DEF_SIZE_BW)?,
            (Tool::Lat, _) => args.size_or(DEF_SIZE_LAT)?,
        };
        if size == 0 {
            bail!("--size must be at least 1");
        }
        let iters = match args.run_length(match tool {
            Tool::Bw => DEF_ITERS_BW,
            Tool::Lat => DEF_ITERS_LAT,
        }) {
            RunLength::Iters(n) if n > 0 => n,
            RunLength::Iters(_) => bail!("--iters must be at least 1"),
            RunLength::Duration(_) => {
                bail!("--perftest runs a number of iterations (-n); perftest's -D mode is not supported")
            }
        };
        if args.qps == 0 {
            bail!("--qps must be at least 1");
        }
        if tool == Tool::Lat && args.qps != 1 {
            bail!("perftest's latency tools run one QP");
        }
        let tx_depth = match tool {
            Tool::Bw => args.tx_depth.max(1),
            Tool::Lat => 1,
        };
        Ok(Params {
            tool,
            op: args.op,
            size,
            iters,
            qps: args.qps,
            tx_depth,
        })
    }

    fn verb(&self) -> &'static str {
        match self.op {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
        }
    }
}

pub fn bench(args: &PerfArgs) -> anyhow::Result<()> {
    let p = Params::new(args, Tool::Bw)?;
    let mut t = Test::setup(args, p)?;
    match (t.role, p.op) {
        (Role::Client, Op::Send) => {
            let r = t.bw_client()?;
            t.close()?;
            t.report_bw(args.json, &r, None)
        }
        (Role::Server, Op::Send) => {
            let r = t.bw_send_server()?;
            t.close()?;
            t.report_bw(args.json, &r, None)
        }
        (Role::Client, _) => {
            let r = t.bw_client()?;
            t.conn.hand_shake(&t.my[0])?;
            let theirs = t.conn.exchange_bw_report(&r.to_report(p))?;
            t.close()?;
            t.report_bw(args.json, &r, Some(theirs))
        }
        (Role::Server, _) => {
            // perftest's server waits for the client in a hand shake.
            t.conn.set_timeout(run_timeout(p));
            t.conn.hand_shake(&t.my[0])?;
            t.conn.set_timeout(OOB_TIMEOUT);
            let theirs = t.conn.exchange_bw_report(&BwReport::default())?;
            t.close()?;
            t.report_peer_bw(args.json, &theirs)
        }
    }
}

pub fn lat(args: &PerfArgs) -> anyhow::Result<()> {
    let p = Params::new(args, Tool::Lat)?;
    let mut t = Test::setup(args, p)?;
    let samples = match (t.role, p.op) {
        (Role::Server, Op::Read) => {
            // Only the client posts READs; the server waits to close.
            t.conn.set_timeout(run_timeout(p));
            t.close()?;
            eprintln!("xroce: perftest read_lat client done");
            return Ok(());
        }
        (Role::Client, Op::Read) => {
            let s = t.lat_read()?;
            t.close()?;
            s
        }
        (_, Op::Write) => t.lat_write()?,
        (_, Op::Send) => {
            let s = t.lat_send()?;
            t.close()?;
            s
        }
        (_, Op::Atomic) => unreachable!("lat refuses atomics"),
    };
    t.report_lat(args.json, samples)
}

/// How long the passive side may wait for the whole run.
fn run_timeout(p: Params) -> Duration {
    OOB_TIMEOUT + Duration::from_millis(p.iters.saturating_mul(p.qps as u64)) * 10
}

/// `BUFF_SIZE`: a message, at least a cycle buffer.
fn buff_size(size: usize, cycle: usize) -> usize {
    size.max(cycle)
}

/// `INC`: the step between two messages' addresses.
fn inc(size: usize, cache_line: usize) -> usize {
    if size > cache_line {
        size.div_ceil(cache_line) * cache_line
    } else {
        cache_line
    }
}

/// The bandwidth one side measured.
struct BwResult {
    msgs: u64,
    seconds: f64,
    retransmits: u64,
    cnps: u64,
}

impl BwResult {
    fn bytes(&self, p: Params) -> u64 {
        self.msgs * p.size as u64
    }

    fn mb_per_sec(&self, p: Params) -> f64 {
        if self.seconds > 0.0 {
            self.bytes(p) as f64 / self.seconds / MB
        } else {
            0.0
        }
    }

    fn to_report(&self, p: Params) -> BwReport {
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

/// One perftest-compatible test: the stack, the OOB connection, the verbs
/// objects and both sides' addresses.
struct Test {
    p: Params,
    role: Role,
    stack: Stack,
    conn: PerftestConn,
    peer_version: String,
    /// --cc, for the report.
    cc: String,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qps: Vec<QueuePair>,
    mr: MemoryRegion,
    my: Vec<PerftestDest>,
    rem: Vec<PerftestDest>,
    /// `BUFF_SIZE` after the cycle buffer exchange.
    buff: usize,
    cycle: usize,
    cache_line: usize,
    mtu: Mtu,
}

impl Test {
    fn setup(args: &PerfArgs, p: Params) -> anyhow::Result<Test> {
        let (mut conn, local_ip) = open_oob(args)?;
        let role = conn.role();
        let stack = Stack::open(args, local_ip)?;
        if role == Role::Server {
            eprintln!(
                "xroce: perftest {} {} server ready ({} backend, path MTU {})",
                p.verb(),
                if p.tool == Tool::Bw { "bw" } else { "lat" },
                stack.backend,
                stack.path_mtu.bytes()
            );
        }
        let peer_version = conn.exchange_versions(VERSION).map_err(|e| match e {
            ConnectError::Garbage { .. } => anyhow::anyhow!(
                "{e}; is the peer a perftest tool (or `xroce ... --perftest`)? \
                 xroce peers without --perftest speak xroce's own exchange"
            ),
            other => other.into(),
        })?;
        let (their_cycle, their_line) = conn.exchange_sys_data(CYCLE_BUFFER, CACHE_LINE)?;
        let cycle = CYCLE_BUFFER.max(their_cycle).max(64) as usize;
        let cache_line = CACHE_LINE.max(their_line).max(1) as usize;
        let mtu_bytes = conn.exchange_mtu(stack.path_mtu.bytes())?;
        let mtu = Mtu::from_bytes(mtu_bytes).unwrap_or(stack.path_mtu);

        // Resources, as ctx_init: one buffer for all QPs, both halves.
        let buff = buff_size(p.size, cycle);
        let page = 4096;
        let mr_len = (2 * p.qps * buff).div_ceil(page) * page;
        let rx_depth = rx_depth(p);
        let pd = stack.device.alloc_pd();
        let cq = stack
            .device
            .create_cq(p.qps * (p.tx_depth + rx_depth) + 64)
            .context("create CQ")?;
        let mut init = QpInitAttr::rc(&cq);
        init.cap.max_send_wr = p.tx_depth as u32;
        init.cap.max_recv_wr = rx_depth.max(1) as u32;
        let qps = (0..p.qps)
            .map(|_| stack.device.create_qp(&pd, &init))
            .collect::<Result<Vec<_>, _>>()
            .context("create QP")?;
        let mr = pd.reg_mr(mr_len, ALL_ACCESS).context("register MR")?;
        let mut rng = rand::rng();
        let gid = stack.gid();
        let my: Vec<PerftestDest> = qps
            .iter()
            .enumerate()
            .map(|(i, qp)| PerftestDest {
                lid: 0,
                out_reads: OUT_READS,
                qpn: qp.qp_num(),
                psn: rng.random::<u32>() & 0xff_ffff,
                rkey: mr.rkey(),
                vaddr: mr.addr() + ((p.qps + i) * buff) as u64,
                gid: Some(gid),
                srqn: 0,
            })
            .collect();
        let mut t = Test {
            p,
            role,
            stack,
            conn,
            peer_version,
            cc: args.cc.to_string(),
            _pd: pd,
            cq,
            qps,
            mr,
            rem: Vec::new(),
            my,
            buff,
            cycle,
            cache_line,
            mtu,
        };
        t.hand_shakes()?;
        Ok(t)
    }

    /// The tool's hand shakes up to the measurement, QPs to RTS and
    /// receives posted on the way.
    fn hand_shakes(&mut self) -> anyhow::Result<()> {
        let p = self.p;
        // write_lat and read_lat open with a hand shake of QP 0.
        if p.tool == Tool::Lat && p.op != Op::Send {
            self.conn.hand_shake(&self.my[0])?;
        }
        // Round 1: every QP's address.
        let mut rem = Vec::with_capacity(p.qps);
        for d in &self.my {
            rem.push(self.conn.hand_shake(d)?);
        }
        self.rem = rem;
        self.connect()?;
        // The send tools hand-shake QP 0 after connecting.
        if p.op == Op::Send {
            self.conn.hand_shake(&self.my[0])?;
        }
        // Round 2: the same addresses again (the remote side printed).
        for i in 0..p.qps {
            let again = self.conn.hand_shake(&self.my[i])?;
            if again.qpn != self.rem[i].qpn {
                bail!(
                    "the peer's QP {i} changed from {:#x} to {:#x} between hand shakes",
                    self.rem[i].qpn,
                    again.qpn
                );
            }
        }
        // Receives before the last hand shake: the send bw server, and
        // both sides of send lat.
        if p.op == Op::Send && (p.tool == Tool::Lat || self.role == Role::Server) {
            for q in 0..p.qps {
                for _ in 0..rx_depth(p) {
                    self.post_recv(q)?;
                }
            }
        }
        // "An additional handshake is required after moving qp to RTR."
        self.conn.hand_shake(&self.my[0])?;
        Ok(())
    }

    fn connect(&mut self) -> anyhow::Result<()> {
        let r0 = self.rem[0];
        let Some(gid) = r0.gid else {
            bail!("the peer sent no GID; run it with a RoCE GID (rxe: -x 1)");
        };
        let IpAddr::V4(ip) = IpAddr::from(gid) else {
            bail!(
                "the peer's GID {} is not IPv4-mapped; use its RoCEv2 IPv4 GID (perftest -x)",
                gid.hex()
            );
        };
        let mac = peer_mac(&self.stack, ip, [0; 6])?;
        for ((qp, my), r) in self.qps.iter().zip(&self.my).zip(&self.rem) {
            let max_rd = r.out_reads.clamp(1, OUT_READS) as u8;
            connect_qp(qp, my.psn, self.mtu, max_rd, r.qpn, r.psn, mac, ip)?;
        }
        Ok(())
    }

    /// `ctx_close_connection`: a hand shake, then "done".
    fn close(&mut self) -> anyhow::Result<()> {
        self.conn.finish(&self.my[0])?;
        self.conn.set_timeout(OOB_TIMEOUT);
        Ok(())
    }

    /// Our buffer offset of QP `q`'s send slot and receive slot.
    fn send_off(&self, q: usize) -> usize {
        q * self.buff
    }
    fn recv_off(&self, q: usize) -> usize {
        (self.p.qps + q) * self.buff
    }

    /// Offset of message `k` within a slot (cycling below half a cycle
    /// buffer, as perftest's increase_rem_addr).
    fn cycle_off(&self, k: u64) -> u64 {
        let p = self.p;
        if p.size > self.cycle / 2 {
            return 0;
        }
        let step = inc(p.size, self.cache_line);
        let n = (self.cycle / step).max(1) as u64;
        (k % n) * step as u64
    }

    fn post_recv(&self, q: usize) -> anyhow::Result<()> {
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
            .post_send(&SendWr::new(
                q as u64,
                opcode,
                vec![self.mr.sge(local, p.size)],
            ))
            .with_context(|| format!("post {} on QP {q}", p.verb()))
    }

    /// run_iter_bw: `tx_depth` in flight per QP until `iters` per QP.
    fn bw_client(&mut self) -> anyhow::Result<BwResult> {
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
    fn bw_send_server(&mut self) -> anyhow::Result<BwResult> {
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
    fn lat_write(&mut self) -> anyhow::Result<Vec<u64>> {
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
                        let _engine = self.stack.device.lock();
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
                self.qps[0].post_send(&SendWr::new(
                    0,
                    WrOpcode::RdmaWrite {
                        remote_addr: self.rem[0].vaddr,
                        rkey: self.rem[0].rkey,
                    },
                    vec![self.mr.sge(0, p.size)],
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
    fn lat_send(&mut self) -> anyhow::Result<Vec<u64>> {
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
                self.qps[0].post_send(&SendWr::new(
                    0,
                    WrOpcode::Send,
                    vec![self.mr.sge(0, p.size)],
                ))?;
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
    fn lat_read(&mut self) -> anyhow::Result<Vec<u64>> {
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

    fn base_report(&self, r: &BwResult) -> serde_json::Value {
        let p = self.p;
        let bytes = r.bytes(p);
        serde_json::json!({
            "op": p.op.name(),
            "size": p.size,
            "iters": r.msgs,
            "qps": p.qps,
            "mtu": self.mtu.bytes(),
            "backend": self.stack.backend,
            "cc": self.cc,
            "seconds": r.seconds,
            "bytes": bytes,
            "gbps": if r.seconds > 0.0 { bytes as f64 * 8.0 / r.seconds / 1e9 } else { 0.0 },
            "msgs_per_sec": if r.seconds > 0.0 { r.msgs as f64 / r.seconds } else { 0.0 },
            // perftest does not check data.
            "verified": serde_json::Value::Null,
            "retransmits": r.retransmits,
            "cnps": r.cnps,
            "perftest": {
                "role": if self.role == Role::Client { "client" } else { "server" },
                "peer_version": self.peer_version,
            },
        })
    }

    fn report_bw(&self, json: bool, r: &BwResult, theirs: Option<BwReport>) -> anyhow::Result<()> {
        let p = self.p;
        let mine = r.to_report(p);
        let mut report = self.base_report(r);
        report["perftest"]["bw_peak_mb_per_sec"] = mine.bw_peak.into();
        report["perftest"]["bw_avg_mb_per_sec"] = mine.bw_avg.into();
        report["perftest"]["msg_rate_mpps"] = mine.msg_rate_avg.into();
        if let Some(t) = theirs {
            report["perftest"]["peer_report"] = bw_json(&t);
        }
        if json {
            println!("{report}");
        } else {
            print_perftest_bw(&mine);
            if !json && p.op != Op::Send && self.role == Role::Client {
                print_report(false, &report);
            }
        }
        Ok(())
    }

    /// The passive server prints the client's report (print_full_bw_report).
    fn report_peer_bw(&self, json: bool, theirs: &BwReport) -> anyhow::Result<()> {
        if json {
            let p = self.p;
            let seconds = if theirs.bw_avg > 0.0 {
                (theirs.iters * theirs.size) as f64 / (theirs.bw_avg * MB)
            } else {
                0.0
            };
            let r = BwResult {
                msgs: theirs.iters,
                seconds,
                retransmits: 0,
                cnps: 0,
            };
            let mut report = self.base_report(&r);
            report["size"] = theirs.size.into();
            report["bytes"] = (theirs.iters * theirs.size).into();
            report["op"] = p.op.name().into();
            report["perftest"]["peer_report"] = bw_json(theirs);
            println!("{report}");
        } else {
            print_perftest_bw(theirs);
        }
        Ok(())
    }

    fn report_lat(&self, json: bool, samples: Vec<u64>) -> anyhow::Result<()> {
        let p = self.p;
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<u64>() as f64 / n.max(1.0);
        let var = samples
            .iter()
            .map(|&s| (s as f64 - mean).powi(2))
            .sum::<f64>()
            / n.max(1.0);
        let lat = percentiles(samples);
        let stats = self.stack.device.stats();
        let mut report = serde_json::json!({
            "op": p.op.name(),
            "size": p.size,
            "iters": p.iters,
            "qps": 1,
            "mtu": self.mtu.bytes(),
            "backend": self.stack.backend,
            "verified": serde_json::Value::Null,
            "retransmits": stats.tx_retransmitted,
            "cnps": stats.rx_cnps,
            "lat_us": lat,
            "perftest": {
                "role": if self.role == Role::Client { "client" } else { "server" },
                "peer_version": self.peer_version,
                "stdev_us": var.sqrt() / 1000.0,
            },
        });
        if json {
            println!("{report}");
            return Ok(());
        }
        let l = &mut report["lat_us"];
        let g = |k: &str| l[k].as_f64().unwrap_or(0.0);
        println!("{RESULT_LINE}");
        println!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
        );
        println!(
            " {:<7} {:<10}     {:<7.2}        {:<7.2}      {:<7.2}     \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2}   \t\t{:<7.2}",
            p.size,
            p.iters,
            g("min"),
            g("max"),
            g("p50"),
            g("avg"),
            var.sqrt() / 1000.0,
            g("p99"),
            g("p999"),
        );
        println!("{RESULT_LINE}");
        Ok(())
    }
}

const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

fn print_perftest_bw(r: &BwReport) {
    println!("{RESULT_LINE}");
    println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
    println!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate_avg
    );
    println!("{RESULT_LINE}");
}

fn bw_json(r: &BwReport) -> serde_json::Value {
    serde_json::json!({
        "size": r.size,
        "iters": r.iters,
        "bw_peak_mb_per_sec": r.bw_peak,
        "bw_avg_mb_per_sec": r.bw_avg,
        "msg_rate_mpps": r.msg_rate_avg,
    })
}

/// Receives per QP: the send bw server keeps perftest's 512 (shared by the
/// QPs, at least the sender's depth), send lat a few.
fn rx_depth(p: Params) -> usize {
    match (p.op, p.tool) {
        (Op::Send, Tool::Bw) => (DEF_RX_SEND / p.qps).max(p.tx_depth).max(1),
        (Op::Send, Tool::Lat) => 16,
        _ => 1,
    }
}

/// perftest's latency samples: half (or all) of the gap between posts.
fn gaps(posted_at: &[Instant], factor: u32) -> Vec<u64> {
    posted_at
        .windows(2)
        .map(|w| (w[1] - w[0]).as_nanos() as u64 / factor as u64)
        .collect()
}

/// The OOB connection: a client of `SERVER` (positional) or --connect,
/// else a server on --listen or 0.0.0.0:--port. Returns it with the local
/// address RoCE runs from.
fn open_oob(args: &PerfArgs) -> anyhow::Result<(PerftestConn, IpAddr)> {
    let target: Option<SocketAddr> = match (&args.server, args.connect) {
        (Some(host), _) => Some(resolve(host, args.port)?),
        (None, Some(addr)) => Some(addr),
        (None, None) => None,
    };
    if let Some(addr) = target {
        let mut conn = PerftestConn::connect(addr, Duration::from_secs(10))
            .with_context(|| format!("connect to {addr}; is a perftest server (or `xroce ... --perftest`) running there?"))?;
        conn.set_timeout(OOB_TIMEOUT);
        let local = conn
            .local_addr()
            .context("the local address of the connection")?
            .ip();
        return Ok((conn, local));
    }
    let listen = args
        .listen
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], args.port)));
    let listener = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    let local_ip = if listen.ip().is_unspecified() {
        IpAddr::V4(first_ipv4(&args.iface)?)
    } else {
        listen.ip()
    };
    eprintln!("xroce: waiting for a perftest client on {listen}");
    let mut conn = PerftestConn::accept(&listener, ACCEPT_TIMEOUT)?;
    conn.set_timeout(OOB_TIMEOUT);
    Ok((conn, local_ip))
}

fn resolve(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    let with_port = if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]:{port}")
    } else if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    with_port
        .to_socket_addrs()
        .with_context(|| format!("resolve {with_port}"))?
        .find(|a| a.is_ipv4())
        .with_context(|| format!("{host} has no IPv4 address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_step_like_perftest() {
        assert_eq!(buff_size(2, 4096), 4096);
        assert_eq!(buff_size(65536, 4096), 65536);
        assert_eq!(inc(2, 64), 64);
        assert_eq!(inc(65, 64), 128);
        assert_eq!(inc(1000, 64), 1024);
    }

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
