//! A deterministic simulated link between two engines: loss, duplication,
//! reordering, delay, jitter, serialization rate and ECN CE marking, driven
//! by a seeded RNG and simulated nanoseconds. Used by the tests and the
//! engine-only benchmark; also handy for experiments.
//!
//! [`Sim`] drives two [`EngineHost`]s: bare engines (`Mutex<Engine>`, see
//! [`Sim::engine_pair`] and [`connect_engines`]: completions then stay in
//! the engine for [`Engine::take_completions`]) or anything else that
//! holds an engine behind a lock, such as the verbs device.
//!
//! Determinism: every random choice of a simulation comes from one `u64`
//! seed through ChaCha8, a fixed algorithm (unlike `StdRng`, whose
//! algorithm may change between `rand` releases): the link's impairments
//! draw from stream 0 of ChaCha8 keyed by the seed, and a pair of hosts
//! gets MR keys from streams 1 and 2 ([`derive_seed`], [`MrTable::seeded`]).
//! The engine itself reads no clock and no RNG, so the same seed replays
//! the same frames, byte for byte, provided the MRs' addresses are the same
//! too (heap addresses of allocated regions appear in RETHs; register
//! memory under a fixed iova with [`MemoryRegion::register_user`] to
//! compare traces across runs). [`SimLink::record_trace`] keeps a digest
//! of every frame the link carries for such comparisons.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::DerefMut;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::completion::CqId;
use super::memory::{AccessFlags, MemoryRegion, MrTable};
use super::qp_attr::{AddressVector, Mtu, QpAttr, QpCap, QpType, RemoteQp};
use super::{Engine, EngineConfig, QpCreate};

/// Link impairments (per direction, same for both).
#[derive(Debug, Clone, Copy)]
pub struct LinkConfig {
    /// Probability a frame is dropped.
    pub loss: f64,
    /// Probability a frame is delivered twice.
    pub dup: f64,
    /// Probability a frame is held back by up to `reorder_ns` extra.
    pub reorder: f64,
    pub reorder_ns: u64,
    /// One-way propagation delay.
    pub delay_ns: u64,
    /// Uniform extra delay in 0..jitter_ns (FIFO order is kept: a frame
    /// never overtakes an earlier one unless `reorder` picks it).
    pub jitter_ns: u64,
    /// Serialization rate in bits/s (0 = infinitely fast).
    pub rate_bps: u64,
    /// Probability a frame gets its IP ECN field set to CE.
    pub ce_mark: f64,
    /// Probability one random byte of a frame is flipped.
    pub corrupt: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            reorder_ns: 20_000,
            delay_ns: 5_000,
            jitter_ns: 0,
            rate_bps: 100_000_000_000,
            ce_mark: 0.0,
            corrupt: 0.0,
        }
    }
}

impl LinkConfig {
    /// `loss` loss with 1/4 of that as duplication and reordering.
    pub fn lossy(loss: f64) -> Self {
        Self {
            loss,
            dup: loss / 4.0,
            reorder: loss / 2.0,
            jitter_ns: 1_000,
            ..Default::default()
        }
    }
}

struct InFlight {
    at: u64,
    seq: u64,
    to_b: bool,
    data: Vec<u8>,
}
impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at && self.seq == o.seq
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq)) // min-heap
    }
}

/// Counters of what the link did.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkStats {
    pub sent: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub bytes: u64,
}

/// The seed of consumer `stream` of a simulation's randomness keyed by
/// `seed`: the first word of ChaCha8 stream `stream` (the link itself uses
/// stream 0 directly; `xroce::verbs::sim::sim_pair` seeds the MR keys of
/// device A from stream 1 and of device B from stream 2).
pub fn derive_seed(seed: u64, stream: u64) -> u64 {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(stream);
    r.next_u64()
}

/// FNV-1a (64 bit) over `parts`: a fixed, platform-independent digest.
/// What [`SimLink::tap_frames`] calls with each frame and its time (ns).
pub type FrameTap = Box<dyn FnMut(u64, &[u8]) + Send>;

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The link: frames in flight in both directions.
pub struct SimLink {
    pub cfg: LinkConfig,
    rng: ChaCha8Rng,
    q: BinaryHeap<InFlight>,
    seq: u64,
    busy_until: [u64; 2],
    last_at: [u64; 2],
    pool: Vec<Vec<u8>>,
    pub stats: LinkStats,
    /// Drop everything (peer gone).
    pub cut: bool,
    tap: Option<FrameTap>,
    drop_when: Option<FrameFilter>,
    trace: Option<Vec<u64>>,
}

/// Chooses frames to lose: (towards B, the frame) -> drop it.
type FrameFilter = Box<dyn FnMut(bool, &[u8]) -> bool + Send>;

impl SimLink {
    /// A link whose impairments draw from ChaCha8 keyed by `seed`.
    pub fn new(cfg: LinkConfig, seed: u64) -> Self {
        Self {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(seed),
            q: BinaryHeap::new(),
            seq: 0,
            busy_until: [0; 2],
            last_at: [0; 2],
            pool: Vec::new(),
            stats: LinkStats::default(),
            cut: false,
            tap: None,
            drop_when: None,
            trace: None,
        }
    }

    /// From now on keep one digest per frame event: every frame put on
    /// the link (direction, time, bytes) and every frame delivered (the
    /// same, after loss, duplication, reordering, marking, corruption).
    /// Two runs from the same seed give identical traces.
    pub fn record_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// The digests recorded since [`SimLink::record_trace`].
    pub fn trace(&self) -> &[u64] {
        self.trace.as_deref().unwrap_or(&[])
    }

    fn trace_frame(&mut self, delivered: bool, to_b: bool, at: u64, frame: &[u8]) {
        if let Some(t) = &mut self.trace {
            t.push(fnv1a(&[
                &[delivered as u8, to_b as u8],
                &at.to_le_bytes(),
                frame,
            ]));
        }
    }

    /// From now on hand every frame put on the link (both directions,
    /// before loss or marking) to `tap` with its simulated time in
    /// nanoseconds: a pcap writer (`xroce::capture::record_sim_link`), a
    /// test's own check.
    pub fn tap_frames(&mut self, tap: impl FnMut(u64, &[u8]) + Send + 'static) {
        self.tap = Some(Box::new(tap));
    }

    /// From now on lose every frame `drop` picks (after the random loss
    /// left it): the exact losses a test needs, e.g. one PSN and the NAK
    /// it draws.
    pub fn drop_when(&mut self, drop: impl FnMut(bool, &[u8]) -> bool + Send + 'static) {
        self.drop_when = Some(Box::new(drop));
    }

    fn enqueue(&mut self, to_b: bool, at: u64, frame: &[u8]) {
        let mut v = self.pool.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(frame);
        self.seq += 1;
        self.q.push(InFlight {
            at,
            seq: self.seq,
            to_b,
            data: v,
        });
    }

    /// Frames put on the link towards B (`to_b`) or A from now on leave no
    /// earlier than `until_ns`, behind one another: the sending host off
    /// its cores for a while, its frames waiting in its queue. Nothing is
    /// lost, everything is late.
    pub fn stall_until(&mut self, to_b: bool, until_ns: u64) {
        let d = to_b as usize;
        self.busy_until[d] = self.busy_until[d].max(until_ns);
    }

    /// Put a frame on the link at `now`.
    pub fn send(&mut self, to_b: bool, frame: &[u8], now: u64) {
        if let Some(tap) = &mut self.tap {
            tap(now, frame);
        }
        self.trace_frame(false, to_b, now, frame);
        self.stats.sent += 1;
        self.stats.bytes += frame.len() as u64;
        let d = to_b as usize;
        let start = now.max(self.busy_until[d]);
        let ser = if self.cfg.rate_bps == 0 {
            0
        } else {
            (frame.len() as u64 * 8 * 1_000_000_000).div_ceil(self.cfg.rate_bps)
        };
        self.busy_until[d] = start + ser;
        if self.cut
            || self.rng.random_bool(self.cfg.loss.clamp(0.0, 1.0))
            || self.drop_when.as_mut().is_some_and(|d| d(to_b, frame))
        {
            self.stats.dropped += 1;
            return;
        }
        let mut at = start + ser + self.cfg.delay_ns;
        if self.cfg.jitter_ns > 0 {
            at += self.rng.random_range(0..self.cfg.jitter_ns);
        }
        at = at.max(self.last_at[d]);
        self.last_at[d] = at;
        if self.cfg.reorder > 0.0 && self.rng.random_bool(self.cfg.reorder.clamp(0.0, 1.0)) {
            self.stats.reordered += 1;
            at += self.rng.random_range(0..self.cfg.reorder_ns.max(1));
        }
        if self.cfg.ce_mark > 0.0 && self.rng.random_bool(self.cfg.ce_mark.clamp(0.0, 1.0)) {
            let mut f = frame.to_vec();
            mark_ce(&mut f);
            self.enqueue(to_b, at, &f);
        } else if self.cfg.corrupt > 0.0 && self.rng.random_bool(self.cfg.corrupt.clamp(0.0, 1.0)) {
            let mut f = frame.to_vec();
            let i = self.rng.random_range(0..f.len());
            f[i] ^= 1 << self.rng.random_range(0..8);
            self.enqueue(to_b, at, &f);
        } else {
            self.enqueue(to_b, at, frame);
        }
        if self.cfg.dup > 0.0 && self.rng.random_bool(self.cfg.dup.clamp(0.0, 1.0)) {
            self.stats.duplicated += 1;
            let extra = self.rng.random_range(0..self.cfg.reorder_ns.max(1));
            self.enqueue(to_b, at + extra, frame);
        }
    }

    /// Arrival time of the next frame.
    pub fn next_arrival(&self) -> Option<u64> {
        self.q.peek().map(|p| p.at)
    }

    /// Pop the next frame due at or before `now`: (to_b, frame). Give the
    /// buffer back with [`SimLink::recycle`].
    pub fn pop_due(&mut self, now: u64) -> Option<(bool, Vec<u8>)> {
        if self.q.peek()?.at > now {
            return None;
        }
        let p = self.q.pop()?;
        self.stats.delivered += 1;
        self.trace_frame(true, p.to_b, p.at, &p.data);
        Some((p.to_b, p.data))
    }

    pub fn recycle(&mut self, v: Vec<u8>) {
        if self.pool.len() < 4096 {
            self.pool.push(v);
        }
    }

    pub fn in_flight(&self) -> usize {
        self.q.len()
    }
}

/// Set ECN=CE in an IPv4 frame and fix the IP header checksum (RFC 1624).
pub fn mark_ce(f: &mut [u8]) {
    if f.len() < 34 || f[12] != 0x08 || f[13] != 0x00 {
        return;
    }
    let old = u16::from_be_bytes([f[14], f[15]]);
    f[15] |= 3;
    let new = u16::from_be_bytes([f[14], f[15]]);
    let hc = u16::from_be_bytes([f[24], f[25]]);
    let mut s = (!hc as u32) + (!old as u32 & 0xffff) + new as u32;
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    let c = !(s as u16);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

/// Something that holds an engine behind a lock and hands it out for a
/// batch of calls: a bare `Mutex<Engine>`, or an owner that does more when
/// the lock is released (the verbs device drains completions into its CQs).
pub trait EngineHost {
    type Locked<'a>: DerefMut<Target = Engine>
    where
        Self: 'a;
    fn lock(&self) -> Self::Locked<'_>;
}

impl EngineHost for Mutex<Engine> {
    type Locked<'a> = MutexGuard<'a, Engine>;
    fn lock(&self) -> MutexGuard<'_, Engine> {
        Mutex::lock(self).unwrap_or_else(|e| e.into_inner())
    }
}

/// A host whose engine thread is off its core for `off_ns` of every
/// `period_ns`, from `phase_ns` on (a busy host's scheduler): meanwhile it
/// sends nothing, its timers wait, and what arrives waits in its receive
/// queue, then is handled with the time it arrived (as an XDP timestamp
/// tells the engine, [`super::RxDatagram::arrived_ns`]).
#[derive(Debug, Clone, Copy)]
pub struct OffCore {
    pub period_ns: u64,
    pub off_ns: u64,
    pub phase_ns: u64,
}

impl OffCore {
    /// The first time at or after `t` that the host runs.
    pub fn on_at(&self, t: u64) -> u64 {
        let into = t.saturating_sub(self.phase_ns) % self.period_ns.max(1);
        if t < self.phase_ns || into >= self.off_ns {
            t
        } else {
            t + (self.off_ns - into)
        }
    }
}

/// Two engine hosts joined by a [`SimLink`], in simulated time.
pub struct Sim<H: EngineHost> {
    pub a: H,
    pub b: H,
    pub link: SimLink,
    pub now: u64,
    buf: Vec<u8>,
    /// Engine events processed (frames + timer runs).
    pub events: u64,
    /// When A's and B's threads are off their cores (none: always on).
    pub off_core: [Option<OffCore>; 2],
    /// Frames that arrived at A and B while off, with when they arrived.
    waiting: [Vec<(u64, Vec<u8>)>; 2],
}

impl<H: EngineHost> Sim<H> {
    /// Join `a` and `b` by `link`. For a run that replays exactly, give the
    /// hosts MR tables from [`MrTable::seeded`] (see the module docs).
    pub fn new(a: H, b: H, link: SimLink) -> Self {
        Self {
            a,
            b,
            link,
            now: 1_000_000,
            buf: vec![0; 9000],
            events: 0,
            off_core: [None, None],
            waiting: [Vec::new(), Vec::new()],
        }
    }

    /// The first time at or after `t` that host `i` (0: A, 1: B) runs.
    fn on_at(&self, i: usize, t: u64) -> u64 {
        self.off_core[i].map_or(t, |o| o.on_at(t))
    }

    fn flush_tx(&mut self) {
        for to_b in [true, false] {
            if self.on_at(!to_b as usize, self.now) != self.now {
                continue;
            }
            let host = if to_b { &self.a } else { &self.b };
            let mut g = host.lock();
            while let Some(n) = g.poll_transmit_frame(self.now, &mut self.buf) {
                self.link.send(to_b, &self.buf[..n], self.now);
            }
        }
    }

    /// Run one round: send what is ready, advance to the next event,
    /// deliver/fire it. Returns false when nothing is pending anywhere.
    pub fn step(&mut self) -> bool {
        self.flush_tx();
        // A host off its core does nothing until it is back.
        let ta = self.a.lock().poll_timeout().map(|t| self.on_at(0, t));
        let tb = self.b.lock().poll_timeout().map(|t| self.on_at(1, t));
        let back = |i: usize| (!self.waiting[i].is_empty()).then(|| self.on_at(i, self.now));
        let next = [self.link.next_arrival(), ta, tb, back(0), back(1)]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else {
            return false;
        };
        self.now = self.now.max(t);
        while let Some((to_b, f)) = self.link.pop_due(self.now) {
            let i = to_b as usize;
            if self.on_at(i, self.now) != self.now {
                self.waiting[i].push((self.now, f));
                continue;
            }
            let host = if to_b { &self.b } else { &self.a };
            host.lock().handle_frame(&f, self.now);
            self.events += 1;
            self.link.recycle(f);
        }
        for i in 0..2 {
            if self.waiting[i].is_empty() || self.on_at(i, self.now) != self.now {
                continue;
            }
            let host = if i == 1 { &self.b } else { &self.a };
            let mut g = host.lock();
            for (arrived, f) in self.waiting[i].drain(..) {
                g.handle_frame_at(&f, arrived, self.now);
                self.events += 1;
            }
        }
        if ta.is_some_and(|t| t <= self.now) {
            self.a.lock().handle_timeout(self.now);
            self.events += 1;
        }
        if tb.is_some_and(|t| t <= self.now) {
            self.b.lock().handle_timeout(self.now);
            self.events += 1;
        }
        true
    }

    /// Step until `done()` or until simulated time passes `deadline_ns`
    /// (absolute) or the system is idle. Returns whether `done()` held.
    pub fn run_until(&mut self, deadline_ns: u64, mut done: impl FnMut(&mut Self) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.now > deadline_ns || !self.step() {
                return done(self);
            }
        }
    }
}

impl Sim<Mutex<Engine>> {
    /// Runs the timers of both engines that are due at `now` (for tests
    /// that carry frames by hand instead of [`Sim::step`]).
    pub fn fire_due_timers(&self, now: u64) {
        for host in [&self.a, &self.b] {
            let mut e = EngineHost::lock(host);
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
            }
        }
    }

    /// Two bare engines with [`sim_configs`], everything random drawn from
    /// `seed`: the link's impairments and both MR tables' keys.
    pub fn engine_pair(link: LinkConfig, seed: u64) -> Self {
        let (ca, cb) = sim_configs();
        let engine = |cfg, stream| {
            let mrs = Arc::new(MrTable::seeded(derive_seed(seed, stream)));
            Mutex::new(Engine::new(cfg, mrs))
        };
        Self::new(engine(ca, 1), engine(cb, 2), SimLink::new(link, seed))
    }
}

/// Engine configs for the two simulated hosts.
pub fn sim_configs() -> (EngineConfig, EngineConfig) {
    let a = EngineConfig {
        mac: [2, 0, 0, 0, 0, 1],
        ip: Ipv4Addr::new(10, 0, 0, 1),
        ipv6: vec![Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)],
        ..Default::default()
    };
    let b = EngineConfig {
        mac: [2, 0, 0, 0, 0, 2],
        ip: Ipv4Addr::new(10, 0, 0, 2),
        ipv6: vec![Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2)],
        ..Default::default()
    };
    (a, b)
}

/// QP parameters both sides of a simulated connection use.
#[derive(Debug, Clone, Copy)]
pub struct PairParams {
    pub mtu: Mtu,
    pub psn_a: u32,
    pub psn_b: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub mr_len: usize,
    pub cq_depth: usize,
    pub max_wr: u32,
    pub access: AccessFlags,
    pub qp_type: QpType,
    /// Connect over the hosts' first IPv6 addresses instead of IPv4.
    pub ipv6: bool,
}

impl Default for PairParams {
    fn default() -> Self {
        Self {
            mtu: Mtu::Mtu1024,
            psn_a: 0,
            psn_b: 0,
            timeout: 8, // ~1 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1, // 10 us
            max_rd_atomic: 8,
            mr_len: 1 << 20,
            cq_depth: 4096,
            max_wr: 1024,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            qp_type: QpType::Rc,
            ipv6: false,
        }
    }
}

impl PairParams {
    /// This side's attributes for `connect` (`sq_psn` its initial PSN).
    pub fn local_attr(&self, sq_psn: u32) -> QpAttr {
        QpAttr {
            qp_access_flags: self.access,
            path_mtu: self.mtu,
            sq_psn,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            min_rnr_timer: self.min_rnr_timer,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_rd_atomic,
            ..Default::default()
        }
    }

    /// What the peer learns about a QP `qpn` on a host configured `cfg`
    /// whose initial send PSN is `psn`: its first IPv6 address if `ipv6`.
    pub fn remote(&self, cfg: &EngineConfig, qpn: u32, psn: u32) -> RemoteQp {
        let dest_ip = match cfg.ipv6.first() {
            Some(v6) if self.ipv6 => IpAddr::V6(*v6),
            _ => IpAddr::V4(cfg.ip),
        };
        RemoteQp {
            qpn,
            psn,
            av: AddressVector {
                dest_mac: cfg.mac,
                dest_ip,
                ..Default::default()
            },
        }
    }
}

/// One connected endpoint made directly on an engine: its QP, the id its
/// completions carry and a data MR (protection domain 1).
pub struct EngineEndpoint {
    pub qpn: u32,
    pub cq: CqId,
    pub mr: MemoryRegion,
}

fn engine_endpoint(e: &mut Engine, p: &PairParams, cq: CqId) -> EngineEndpoint {
    const PD: u32 = 1;
    let cap = QpCap {
        max_send_wr: p.max_wr,
        max_recv_wr: p.max_wr,
        ..Default::default()
    };
    let qpn = e
        .create_qp(QpCreate {
            qp_type: p.qp_type,
            pd: PD,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: false,
        })
        .expect("qp");
    let mr = MemoryRegion::allocate(e.memory(), PD, p.mr_len, p.access).expect("mr");
    EngineEndpoint { qpn, cq, mr }
}

/// Create an endpoint on each bare engine of `sim` and connect their QPs
/// (their completions carry `CqId(1)` on A and `CqId(2)` on B).
pub fn connect_engines(
    sim: &Sim<Mutex<Engine>>,
    p: &PairParams,
) -> (EngineEndpoint, EngineEndpoint) {
    let (mut a, mut b) = (EngineHost::lock(&sim.a), EngineHost::lock(&sim.b));
    let ea = engine_endpoint(&mut a, p, CqId(1));
    let eb = engine_endpoint(&mut b, p, CqId(2));
    let ra = p.remote(a.config(), ea.qpn, p.psn_a);
    let rb = p.remote(b.config(), eb.qpn, p.psn_b);
    a.connect_qp(ea.qpn, &p.local_attr(p.psn_a), &rb)
        .expect("connect a");
    b.connect_qp(eb.qpn, &p.local_attr(p.psn_b), &ra)
        .expect("connect b");
    (ea, eb)
}

/// Deterministic bytes for `seed`: what a transfer must deliver exactly,
/// for tests and experiments that check their data.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    // xorshift64*: cheap even in debug builds.
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::completion::{WcOpcode, WcStatus};
    use crate::engine::qp_attr::QpState;
    use crate::engine::work::{SendWr, WrOpcode};
    use crate::engine::AsyncEvent;

    fn write(id: u64, from: &EngineEndpoint, to: &EngineEndpoint, off: u64, len: usize) -> SendWr {
        SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: to.mr.addr() + off,
                rkey: to.mr.rkey(),
            },
            vec![from.mr.sge(0, len)],
        )
    }

    #[test]
    fn bare_engines_hand_out_completions_as_values() {
        let mut sim = Sim::engine_pair(LinkConfig::default(), 3);
        let p = PairParams {
            mr_len: 4096,
            ..Default::default()
        };
        let (a, b) = connect_engines(&sim, &p);
        // SAFETY: no work request uses A's region yet.
        unsafe { a.mr.write(0, b"engine alone").unwrap() };
        EngineHost::lock(&sim.a)
            .post_send(a.qpn, &write(7, &a, &b, 100, 12))
            .unwrap();
        let mut done = Vec::new();
        let deadline = sim.now + 1_000_000_000;
        assert!(sim.run_until(deadline, |s| {
            EngineHost::lock(&s.a).take_completions(&mut done);
            !done.is_empty()
        }));
        assert_eq!(done.len(), 1);
        let c = done[0];
        assert_eq!(c.cq, a.cq);
        assert_eq!(
            (c.wc.wr_id, c.wc.status, c.wc.opcode, c.wc.byte_len),
            (7, WcStatus::Success, WcOpcode::RdmaWrite, 12)
        );
        assert_eq!((c.wc.qp_num, c.wc.src_qp), (a.qpn, b.qpn));
        // SAFETY: the WRITE has completed.
        assert_eq!(unsafe { b.mr.to_vec(100, 12) }.unwrap(), b"engine alone");
        // A WRITE without immediate completes nothing at the responder.
        let mut at_b = Vec::new();
        EngineHost::lock(&sim.b).take_completions(&mut at_b);
        assert_eq!(at_b, []);
    }

    #[test]
    fn a_lost_completion_takes_its_qp_to_err_and_flushes_in_order() {
        let sim = Sim::engine_pair(LinkConfig::default(), 4);
        let (a, b) = connect_engines(&sim, &PairParams::default());
        let mut e = EngineHost::lock(&sim.a);
        for id in [1, 2] {
            e.post_send(a.qpn, &write(id, &a, &b, 0, 8)).unwrap();
        }
        let mut done = Vec::new();
        e.take_completions(&mut done);
        assert_eq!(done, []);
        e.cq_overflowed(a.qpn);
        assert_eq!(
            e.poll_async_event(),
            Some(AsyncEvent::QpFatal {
                qpn: a.qpn,
                cq_overflow: true
            })
        );
        assert_eq!(e.query_qp(a.qpn).unwrap().qp_state, QpState::Err);
        assert_eq!(e.stats().cq_overflows, 1);
        e.take_completions(&mut done);
        let got: Vec<_> = done
            .iter()
            .map(|c| (c.cq, c.wc.wr_id, c.wc.status))
            .collect();
        assert_eq!(
            got,
            [
                (a.cq, 1, WcStatus::WrFlushErr),
                (a.cq, 2, WcStatus::WrFlushErr)
            ]
        );
    }
}
