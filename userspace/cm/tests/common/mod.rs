//! Two engines over a simulated GSI link: seeded loss, duplication and
//! reordering, virtual time.
#![allow(dead_code)]

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use xroce_cm::{CmConfig, CmEngine, CmEvent, PeerAddr, Transmit};
use xroce_wire::Gid;

pub const A_GID: Gid = Gid::from_ipv4([10, 0, 0, 1]);
pub const B_GID: Gid = Gid::from_ipv4([10, 0, 0, 2]);
pub const A_GUID: u64 = 0xa;
pub const B_GUID: u64 = 0xb;

pub fn engine(gid: Gid, guid: u64, seed: u64) -> CmEngine {
    CmEngine::new(CmConfig::new(vec![gid], guid, seed))
}

/// Link behaviour, in per mille.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub loss: u32,
    pub duplicate: u32,
    /// Extra delay of up to this many µs (later MADs may overtake).
    pub jitter_us: u64,
}

pub const CLEAN: Faults = Faults {
    loss: 0,
    duplicate: 0,
    jitter_us: 0,
};

struct InFlight {
    at: u64,
    seq: u64,
    to_b: bool,
    t: Transmit,
}

pub struct Sim {
    pub a: CmEngine,
    pub b: CmEngine,
    pub now: u64,
    pub faults: Faults,
    rng: ChaCha8Rng,
    flight: Vec<InFlight>,
    seq: u64,
    pub a_events: Vec<(u64, CmEvent)>,
    pub b_events: Vec<(u64, CmEvent)>,
    /// Every MAD put on the link: (time, from A, bytes).
    pub wire: Vec<(u64, bool, Transmit)>,
}

/// 10 µs one way.
pub const LINK_DELAY_NS: u64 = 10_000;

impl Sim {
    pub fn new(seed: u64, faults: Faults) -> Sim {
        Sim {
            a: engine(A_GID, A_GUID, seed ^ 0xaaaa),
            b: engine(B_GID, B_GUID, seed ^ 0xbbbb),
            now: 0,
            faults,
            rng: ChaCha8Rng::seed_from_u64(seed),
            flight: Vec::new(),
            seq: 0,
            a_events: Vec::new(),
            b_events: Vec::new(),
            wire: Vec::new(),
        }
    }

    fn chance(&mut self, per_mille: u32) -> bool {
        per_mille > 0 && self.rng.next_u32() % 1000 < per_mille
    }

    fn send_all(&mut self) {
        for from_a in [true, false] {
            loop {
                let e = if from_a { &mut self.a } else { &mut self.b };
                let Some(t) = e.poll_transmit() else { break };
                let expect = if from_a { B_GID } else { A_GID };
                assert_eq!(t.peer.gid, expect, "MAD addressed to the peer");
                self.wire.push((self.now, from_a, t.clone()));
                if self.chance(self.faults.loss) {
                    continue;
                }
                let copies = if self.chance(self.faults.duplicate) {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let jitter = if self.faults.jitter_us > 0 {
                        u64::from(self.rng.next_u32()) % (self.faults.jitter_us * 1000)
                    } else {
                        0
                    };
                    self.seq += 1;
                    self.flight.push(InFlight {
                        at: self.now + LINK_DELAY_NS + jitter,
                        seq: self.seq,
                        to_b: from_a,
                        t: t.clone(),
                    });
                }
            }
        }
    }

    fn drain_events(&mut self) -> bool {
        let mut any = false;
        while let Some(e) = self.a.poll_event() {
            self.a_events.push((self.now, e));
            any = true;
        }
        while let Some(e) = self.b.poll_event() {
            self.b_events.push((self.now, e));
            any = true;
        }
        any
    }

    /// The next moment something happens, if anything is left to happen.
    fn next_time(&self) -> Option<u64> {
        let flight = self.flight.iter().map(|f| f.at).min();
        [flight, self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Advances one moment: delivers what is due, fires timers. False when
    /// nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.send_all();
        let Some(t) = self.next_time() else {
            return false;
        };
        self.now = self.now.max(t);
        let mut due: Vec<InFlight> = Vec::new();
        let mut i = 0;
        while i < self.flight.len() {
            if self.flight[i].at <= self.now {
                due.push(self.flight.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|f| (f.at, f.seq));
        for f in due {
            let (to, from_gid) = if f.to_b {
                (&mut self.b, A_GID)
            } else {
                (&mut self.a, B_GID)
            };
            to.handle_mad(PeerAddr::gsi(from_gid), f.t.peer.gid, &f.t.mad, self.now);
        }
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.send_all();
        true
    }

    /// Runs until `done` holds or nothing is left to happen; the consumer
    /// `react` sees each new event as it comes.
    pub fn run(&mut self, mut react: impl FnMut(&mut Sim, bool, &CmEvent), limit: usize) {
        let (mut seen_a, mut seen_b) = (0, 0);
        for _ in 0..limit {
            self.drain_events();
            while seen_a < self.a_events.len() || seen_b < self.b_events.len() {
                if seen_a < self.a_events.len() {
                    let e = self.a_events[seen_a].1.clone();
                    seen_a += 1;
                    react(self, true, &e);
                } else {
                    let e = self.b_events[seen_b].1.clone();
                    seen_b += 1;
                    react(self, false, &e);
                }
                self.drain_events();
            }
            if !self.step() {
                self.drain_events();
                if seen_a == self.a_events.len() && seen_b == self.b_events.len() {
                    return;
                }
            }
        }
        panic!("simulation did not settle in {limit} steps");
    }
}

/// The events' kinds, for comparing sequences.
pub fn kinds(events: &[(u64, CmEvent)]) -> Vec<&'static str> {
    events
        .iter()
        .map(|(_, e)| match e {
            CmEvent::ConnectRequest { .. } => "ConnectRequest",
            CmEvent::ConnectResponse { .. } => "ConnectResponse",
            CmEvent::Established { .. } => "Established",
            CmEvent::Rejected { .. } => "Rejected",
            CmEvent::Unreachable { .. } => "Unreachable",
            CmEvent::ConnectError { .. } => "ConnectError",
            CmEvent::DisconnectRequest { .. } => "DisconnectRequest",
            CmEvent::Disconnected { .. } => "Disconnected",
            CmEvent::DisconnectTimeout { .. } => "DisconnectTimeout",
            CmEvent::TimewaitExit { .. } => "TimewaitExit",
            CmEvent::SidrRequest { .. } => "SidrRequest",
            CmEvent::SidrResponse { .. } => "SidrResponse",
        })
        .collect()
}
