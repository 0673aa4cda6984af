//! The send side of the agent: the engine's MADs wait here for an address
//! handle and a free send buffer, then go out as UD SENDs. Kept apart from
//! the verbs calls ([`Link`]) so the bookkeeping is testable.
//!
//! xroce's `ibv_create_ah` resolves the peer's MAC through the kernel's
//! neighbour table and blocks up to 3 s while the peer does not answer.
//! The agent's one thread must not stall: an AH is only created once the
//! neighbour entry exists (our own GIDs need none); until then the MAD
//! waits, the kernel is asked to resolve the peer once, and the table is
//! looked at again every [`NEIGHBOUR_RETRY_NS`] until [`NEIGHBOUR_WAIT_NS`]
//! have passed (then the MAD is dropped: the engine retransmits).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use xroce_cm::Transmit;
use xroce_wire::Gid;

/// How long a MAD waits for its peer's neighbour entry (xroce's
/// libibverbs waits as long in `ibv_create_ah`).
pub(super) const NEIGHBOUR_WAIT_NS: u64 = 3_000_000_000;
/// How often the neighbour table is looked at while MADs wait.
pub(super) const NEIGHBOUR_RETRY_NS: u64 = 10_000_000;

/// What the sender needs of the GSI QP.
pub(super) trait Link {
    type Ah: Copy;
    /// Whether the kernel's neighbour table has `peer`'s MAC.
    fn neighbour_known(&mut self, peer: Gid) -> bool;
    /// Asks the kernel to resolve `peer` (ARP / NDP).
    fn solicit(&mut self, peer: Gid);
    /// An address handle from our GID `sgid_index` to `peer`'s.
    fn create_ah(&mut self, sgid_index: u8, peer: Gid) -> Result<Self::Ah, i32>;
    /// Copies the MAD into send buffer `slot` and posts it to the peer.
    fn post(&mut self, slot: u32, ah: Self::Ah, t: &Transmit) -> Result<(), i32>;
}

/// What went wrong on the send side (the engine's retries cover it).
#[derive(Debug, Default)]
pub(super) struct SendCounters {
    pub(super) sent: AtomicU64,
    /// The engine named a local GID the port does not have.
    pub(super) unknown_local_gid: AtomicU64,
    /// The peer's neighbour entry did not appear in time.
    pub(super) neighbour_timeouts: AtomicU64,
    pub(super) ah_failures: AtomicU64,
    pub(super) post_failures: AtomicU64,
    /// Send completions with an error status.
    pub(super) send_errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Waiting {
    t: Transmit,
    /// When the neighbour wait started (`None`: not waited yet).
    since: Option<u64>,
}

/// Why a MAD was not posted now.
enum Stuck {
    /// Keep it (waiting for the neighbour).
    Wait,
    /// Keep it and everything after it (no send buffer free).
    NoSlot,
    /// Drop it (counted).
    Drop,
}

pub(super) struct Sender<A> {
    local_gids: Vec<Gid>,
    /// Address handles by (our GID index, peer GID); kept for the life of
    /// the process (a host talks to few peers).
    ahs: HashMap<(u8, Gid), A>,
    /// Send buffers not in flight.
    free_slots: Vec<u32>,
    queue: VecDeque<Waiting>,
}

impl<A: Copy> Sender<A> {
    pub(super) fn new(local_gids: Vec<Gid>, slots: u32) -> Sender<A> {
        Sender {
            local_gids,
            ahs: HashMap::new(),
            free_slots: (0..slots).rev().collect(),
            queue: VecDeque::new(),
        }
    }

    pub(super) fn push(&mut self, t: Transmit) {
        self.queue.push_back(Waiting { t, since: None });
    }

    /// Send buffer `slot` completed (successfully or not).
    pub(super) fn completed(&mut self, slot: u32) {
        debug_assert!(!self.free_slots.contains(&slot), "slot {slot} freed twice");
        self.free_slots.push(slot);
    }

    /// Nothing waits to be posted and no send is in flight.
    pub(super) fn is_idle(&self, slots: u32) -> bool {
        self.queue.is_empty() && self.free_slots.len() == slots as usize
    }

    /// MADs not posted yet.
    #[cfg(test)]
    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// When [`Sender::flush`] should run again although nothing else
    /// happened: while MADs wait for a neighbour entry.
    pub(super) fn next_retry(&self, now: u64) -> Option<u64> {
        self.queue
            .iter()
            .any(|w| w.since.is_some())
            .then_some(now + NEIGHBOUR_RETRY_NS)
    }

    /// Posts what can go now, in order (a MAD waiting for its neighbour
    /// lets later ones to other peers pass; to the same peer they wait
    /// too, as its neighbour is unknown to them as well). Calls `sent`
    /// with each MAD posted.
    pub(super) fn flush<L: Link<Ah = A>>(
        &mut self,
        link: &mut L,
        now: u64,
        counters: &SendCounters,
        mut sent: impl FnMut(&Transmit),
    ) {
        let mut kept = VecDeque::new();
        while let Some(mut w) = self.queue.pop_front() {
            match self.try_post(link, &mut w, now, counters) {
                Ok(()) => {
                    bump(&counters.sent);
                    sent(&w.t);
                }
                Err(Stuck::Wait) => kept.push_back(w),
                Err(Stuck::NoSlot) => {
                    kept.push_back(w);
                    kept.append(&mut self.queue);
                }
                Err(Stuck::Drop) => {}
            }
        }
        self.queue = kept;
    }

    fn try_post<L: Link<Ah = A>>(
        &mut self,
        link: &mut L,
        w: &mut Waiting,
        now: u64,
        counters: &SendCounters,
    ) -> Result<(), Stuck> {
        let Some(index) = self.local_gids.iter().position(|g| *g == w.t.local_gid) else {
            bump(&counters.unknown_local_gid);
            return Err(Stuck::Drop);
        };
        let index = u8::try_from(index).map_err(|_| Stuck::Drop)?;
        let peer = w.t.peer.gid;
        let ah = match self.ahs.get(&(index, peer)) {
            Some(ah) => *ah,
            None => {
                let own = self.local_gids.contains(&peer);
                if !own && !link.neighbour_known(peer) {
                    match w.since {
                        None => {
                            link.solicit(peer);
                            w.since = Some(now);
                            return Err(Stuck::Wait);
                        }
                        Some(s) if now.saturating_sub(s) < NEIGHBOUR_WAIT_NS => {
                            return Err(Stuck::Wait)
                        }
                        Some(_) => {
                            bump(&counters.neighbour_timeouts);
                            return Err(Stuck::Drop);
                        }
                    }
                }
                let ah = link.create_ah(index, peer).map_err(|_| {
                    bump(&counters.ah_failures);
                    Stuck::Drop
                })?;
                self.ahs.insert((index, peer), ah);
                ah
            }
        };
        let slot = self.free_slots.pop().ok_or(Stuck::NoSlot)?;
        link.post(slot, ah, &w.t).map_err(|_| {
            self.free_slots.push(slot);
            bump(&counters.post_failures);
            Stuck::Drop
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xroce_cm::PeerAddr;

    const OURS: [Gid; 2] = [
        Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        Gid::from_ipv4([10, 0, 0, 1]),
    ];
    const PEER: Gid = Gid::from_ipv4([10, 0, 0, 2]);
    const OTHER: Gid = Gid::from_ipv4([10, 0, 0, 3]);

    #[derive(Default)]
    struct FakeLink {
        known: Vec<Gid>,
        solicited: Vec<Gid>,
        /// (sgid index, peer) per AH made; the AH is its position.
        ahs: Vec<(u8, Gid)>,
        ah_error: Option<i32>,
        /// (slot, AH, first MAD byte) per post.
        posts: Vec<(u32, usize, u8)>,
    }

    impl Link for FakeLink {
        type Ah = usize;
        fn neighbour_known(&mut self, peer: Gid) -> bool {
            self.known.contains(&peer)
        }
        fn solicit(&mut self, peer: Gid) {
            self.solicited.push(peer);
        }
        fn create_ah(&mut self, sgid_index: u8, peer: Gid) -> Result<usize, i32> {
            if let Some(e) = self.ah_error {
                return Err(e);
            }
            self.ahs.push((sgid_index, peer));
            Ok(self.ahs.len() - 1)
        }
        fn post(&mut self, slot: u32, ah: usize, t: &Transmit) -> Result<(), i32> {
            self.posts.push((slot, ah, t.mad[0]));
            Ok(())
        }
    }

    fn mad(from: Gid, to: Gid, tag: u8) -> Transmit {
        let mut mad = [0u8; 256];
        mad[0] = tag;
        Transmit {
            local_gid: from,
            peer: PeerAddr::gsi(to),
            mad,
        }
    }

    fn flush(s: &mut Sender<usize>, link: &mut FakeLink, now: u64, c: &SendCounters) -> Vec<u8> {
        let mut tags = Vec::new();
        s.flush(link, now, c, |t| tags.push(t.mad[0]));
        tags
    }

    #[test]
    fn one_ah_per_local_gid_index_and_peer() {
        let mut s = Sender::new(OURS.to_vec(), 8);
        let mut link = FakeLink {
            known: vec![PEER, OTHER],
            ..FakeLink::default()
        };
        let c = SendCounters::default();
        s.push(mad(OURS[1], PEER, 1));
        s.push(mad(OURS[1], PEER, 2));
        s.push(mad(OURS[0], PEER, 3));
        s.push(mad(OURS[1], OTHER, 4));
        assert_eq!(flush(&mut s, &mut link, 0, &c), vec![1, 2, 3, 4]);
        assert_eq!(link.ahs, vec![(1, PEER), (0, PEER), (1, OTHER)]);
        // Slots are handed out from 0 up; the AH of the first MAD is reused.
        assert_eq!(link.posts, vec![(0, 0, 1), (1, 0, 2), (2, 1, 3), (3, 2, 4)]);
        assert_eq!(c.sent.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_full_send_ring_keeps_order_until_completions() {
        let mut s = Sender::new(OURS.to_vec(), 2);
        let mut link = FakeLink {
            known: vec![PEER],
            ..FakeLink::default()
        };
        let c = SendCounters::default();
        for tag in 1..=4 {
            s.push(mad(OURS[1], PEER, tag));
        }
        assert_eq!(flush(&mut s, &mut link, 0, &c), vec![1, 2]);
        assert_eq!(s.queued(), 2);
        assert_eq!(s.next_retry(0), None);
        s.completed(1);
        assert_eq!(flush(&mut s, &mut link, 0, &c), vec![3]);
        s.completed(0);
        s.completed(1);
        assert_eq!(flush(&mut s, &mut link, 0, &c), vec![4]);
        assert_eq!(s.queued(), 0);
        assert_eq!(
            link.posts.iter().map(|p| p.0).collect::<Vec<_>>(),
            [0, 1, 1, 1]
        );
    }

    #[test]
    fn unknown_neighbour_waits_solicits_once_then_gives_up() {
        let mut s = Sender::new(OURS.to_vec(), 8);
        let mut link = FakeLink {
            known: vec![OTHER],
            ..FakeLink::default()
        };
        let c = SendCounters::default();
        s.push(mad(OURS[1], PEER, 1));
        s.push(mad(OURS[1], OTHER, 2));
        // The other peer's MAD passes the waiting one.
        assert_eq!(flush(&mut s, &mut link, 100, &c), vec![2]);
        assert_eq!(link.solicited, vec![PEER]);
        assert_eq!(s.next_retry(100), Some(100 + NEIGHBOUR_RETRY_NS));
        assert_eq!(
            flush(&mut s, &mut link, 100 + NEIGHBOUR_WAIT_NS - 1, &c),
            vec![]
        );
        assert_eq!(link.solicited, vec![PEER]);
        assert_eq!(
            flush(&mut s, &mut link, 100 + NEIGHBOUR_WAIT_NS, &c),
            vec![]
        );
        assert_eq!(s.queued(), 0);
        assert_eq!(c.neighbour_timeouts.load(Ordering::Relaxed), 1);
        assert_eq!(link.ahs, vec![(1, OTHER)]);
    }

    #[test]
    fn neighbour_appearing_releases_the_mad() {
        let mut s = Sender::new(OURS.to_vec(), 8);
        let mut link = FakeLink::default();
        let c = SendCounters::default();
        s.push(mad(OURS[1], PEER, 1));
        assert_eq!(flush(&mut s, &mut link, 0, &c), vec![]);
        link.known.push(PEER);
        assert_eq!(flush(&mut s, &mut link, NEIGHBOUR_RETRY_NS, &c), vec![1]);
        assert_eq!(s.next_retry(NEIGHBOUR_RETRY_NS), None);
    }

    #[test]
    fn own_gid_needs_no_neighbour() {
        let mut s = Sender::new(OURS.to_vec(), 8);
        let mut link = FakeLink::default();
        let c = SendCounters::default();
        s.push(mad(OURS[1], OURS[1], 1));
        assert_eq!(flush(&mut s, &mut link, 0, &c), vec![1]);
        assert!(link.solicited.is_empty());
    }

    #[test]
    fn failures_drop_the_mad_and_count() {
        let mut s = Sender::new(OURS.to_vec(), 8);
        let mut link = FakeLink {
            known: vec![PEER],
            ah_error: Some(libc::EHOSTUNREACH),
            ..FakeLink::default()
        };
        let c = SendCounters::default();
        s.push(mad(Gid::from_ipv4([192, 168, 0, 1]), PEER, 1));
        s.push(mad(OURS[1], PEER, 2));
        assert_eq!(flush(&mut s, &mut link, 0, &c), vec![]);
        assert_eq!(s.queued(), 0);
        assert_eq!(c.unknown_local_gid.load(Ordering::Relaxed), 1);
        assert_eq!(c.ah_failures.load(Ordering::Relaxed), 1);
        // No AH was cached for the failure: the next MAD tries again.
        link.ah_error = None;
        s.push(mad(OURS[1], PEER, 3));
        assert_eq!(flush(&mut s, &mut link, 0, &c), vec![3]);
    }
}
