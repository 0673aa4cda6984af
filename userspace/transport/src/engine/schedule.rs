//! Which QPs `Engine::poll_transmit` and `Engine::handle_timeout` visit, so
//! their cost per packet does not grow with the number of QPs.
//!
//! - A ready list: a FIFO of slots that may have something to send. A slot
//!   enters it after any event on its QP (a verb, a received packet, a timer
//!   that fired) and at most once (`queued`); a slot whose QP produced a
//!   frame goes to the back once it used its quantum (round-robin between
//!   busy QPs, `Engine::poll_transmit`; until then it stays at the front,
//!   [`Schedule::front_is`]), one that produced nothing leaves until its
//!   next event. Wake-ups that only time
//!   brings (pacer, RNR back-off, congestion-control timers) are timers in
//!   `QpCtx::next_timeout`, which is what makes leaving the list safe.
//! - A timer heap of (deadline, slot, generation) with lazy deletion: a QP's
//!   `next_timeout()` is recomputed after each of its events and pushed when
//!   it changed; entries that no longer match (`armed`) or belong to an
//!   earlier QP of the slot (`gen`) are dropped when they reach the top. A
//!   binary heap rather than a timer wheel: O(log n) per re-arm is small
//!   next to a packet, it needs no tick size (deadlines range from a pacer
//!   gap of nanoseconds to seconds of RTO) and it is easy to get right.
//! - A wait list: a FIFO of slots whose requester has new data but found
//!   the device's in-flight budget used up (`EngineConfig::
//!   max_device_inflight_pkts`). They leave the ready list; when
//!   acknowledgements free room, `Engine::poll_transmit` serves them first,
//!   oldest first, one packet per turn, so the QPs share the budget fairly
//!   and none polls for room.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

#[derive(Default)]
struct SlotState {
    /// Bumped when the slot's QP is created or destroyed.
    gen: u64,
    /// The slot is in the ready list (with the current `gen`).
    queued: bool,
    /// The slot is in the wait list (with the current `gen`).
    waiting: bool,
    /// The deadline the heap holds a live entry for.
    armed: Option<u64>,
}

#[derive(Default)]
pub(crate) struct Schedule {
    slots: Vec<SlotState>,
    ready: VecDeque<(usize, u64)>,
    waiters: VecDeque<(usize, u64)>,
    timers: BinaryHeap<Reverse<(u64, usize, u64)>>,
    /// Slots with `armed` set: the heap is rebuilt when stale entries
    /// (a re-armed RTO stays in it until its old time) outnumber them.
    armed: usize,
    scratch: Vec<Reverse<(u64, usize, u64)>>,
}

impl Schedule {
    fn slot(&mut self, idx: usize) -> &mut SlotState {
        if idx >= self.slots.len() {
            self.slots.resize_with(idx + 1, SlotState::default);
        }
        &mut self.slots[idx]
    }

    /// A QP was created in or removed from `idx`: whatever the list and
    /// the heap hold for the slot is stale from now on.
    pub fn reset_slot(&mut self, idx: usize) {
        let s = self.slot(idx);
        s.gen += 1;
        s.queued = false;
        s.waiting = false;
        if s.armed.take().is_some() {
            self.armed -= 1;
        }
        self.clean_top();
    }

    /// The QP in `idx` may have something to send.
    pub fn wake(&mut self, idx: usize) {
        let s = self.slot(idx);
        if !s.queued {
            s.queued = true;
            let gen = s.gen;
            self.ready.push_back((idx, gen));
        }
    }

    /// As [`wake`](Self::wake), at the front: the slot goes next.
    pub fn wake_front(&mut self, idx: usize) {
        let s = self.slot(idx);
        if !s.queued {
            s.queued = true;
            let gen = s.gen;
            self.ready.push_front((idx, gen));
        }
    }

    /// Whether `idx` is next on the ready list (a live entry at its front).
    pub fn front_is(&self, idx: usize) -> bool {
        self.ready.front().is_some_and(|&(i, gen)| {
            i == idx && self.slots.get(i).is_some_and(|s| s.gen == gen && s.queued)
        })
    }

    /// Whether the ready list holds anything (maybe a stale entry, which
    /// the next `pop_ready` drops).
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Next slot to ask for a frame, taken off the list (`wake` puts it
    /// back at the end).
    pub fn pop_ready(&mut self) -> Option<usize> {
        while let Some((idx, gen)) = self.ready.pop_front() {
            let s = &mut self.slots[idx];
            if s.gen == gen && s.queued {
                s.queued = false;
                return Some(idx);
            }
        }
        None
    }

    /// The QP in `idx` has new data and waits for room in the device's
    /// in-flight budget (at the back of the wait list, once).
    pub fn wait(&mut self, idx: usize) {
        let s = self.slot(idx);
        if !s.waiting {
            s.waiting = true;
            let gen = s.gen;
            self.waiters.push_back((idx, gen));
        }
    }

    /// As [`wait`](Self::wait), at the front: a QP that was served first
    /// but needs more room than there is keeps its place.
    pub fn wait_front(&mut self, idx: usize) {
        let s = self.slot(idx);
        if !s.waiting {
            s.waiting = true;
            let gen = s.gen;
            self.waiters.push_front((idx, gen));
        }
    }

    /// The slot that has waited longest for room, taken off the wait list.
    pub fn pop_waiter(&mut self) -> Option<usize> {
        while let Some((idx, gen)) = self.waiters.pop_front() {
            let s = &mut self.slots[idx];
            if s.gen == gen && s.waiting {
                s.waiting = false;
                return Some(idx);
            }
        }
        None
    }

    /// The QP in `idx` now wants `handle_timeout` at `deadline`.
    pub fn arm(&mut self, idx: usize, deadline: Option<u64>) {
        let s = self.slot(idx);
        if s.armed == deadline {
            return;
        }
        let was = s.armed.is_some();
        s.armed = deadline;
        let gen = s.gen;
        match (was, deadline) {
            (false, Some(_)) => self.armed += 1,
            (true, None) => self.armed -= 1,
            _ => {}
        }
        if let Some(t) = deadline {
            self.timers.push(Reverse((t, idx, gen)));
        }
        if self.timers.len() > 2 * self.armed + 64 {
            // Amortised O(1) per push: at least half of what is dropped
            // here was pushed since the last rebuild.
            let mut v = std::mem::take(&mut self.timers).into_vec();
            v.retain(|e| self.live(e));
            self.timers = BinaryHeap::from(v);
        }
        self.clean_top();
    }

    fn live(&self, &Reverse((t, idx, gen)): &Reverse<(u64, usize, u64)>) -> bool {
        let s = &self.slots[idx];
        s.gen == gen && s.armed == Some(t)
    }

    /// Drop stale entries from the top, so `next_deadline` can peek: only
    /// `arm` and `reset_slot` make entries stale, and both call this.
    fn clean_top(&mut self) {
        while let Some(top) = self.timers.peek() {
            if self.live(top) {
                break;
            }
            self.timers.pop();
        }
    }

    /// Earliest deadline of any QP.
    pub fn next_deadline(&self) -> Option<u64> {
        self.timers.peek().map(|e| e.0 .0)
    }

    /// Take every slot whose deadline is at or before `now` into `out`;
    /// they are disarmed until the caller re-arms them.
    pub fn take_due(&mut self, now: u64, out: &mut Vec<usize>) {
        while let Some(top) = self.timers.peek() {
            let Reverse((t, idx, _)) = *top;
            if t > now && self.live(top) {
                break;
            }
            let live = self.live(top);
            self.timers.pop();
            if live {
                self.slots[idx].armed = None;
                self.armed -= 1;
                out.push(idx);
            }
        }
    }

    /// Put the slots whose deadline has come on the ready list, leaving
    /// their timers armed for `handle_timeout`: a pacer that opened with
    /// time lets `poll_transmit` send even if the caller has not run the
    /// timers yet (as when it scanned every QP).
    pub fn wake_due(&mut self, now: u64) {
        if self.next_deadline().is_none_or(|t| t > now) {
            return;
        }
        let mut held = std::mem::take(&mut self.scratch);
        while let Some(&top) = self.timers.peek() {
            if top.0 .0 > now {
                break;
            }
            self.timers.pop();
            if self.live(&top) {
                held.push(top);
            }
        }
        for e in held.drain(..) {
            self.wake(e.0 .1);
            self.timers.push(e);
        }
        self.scratch = held;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(s: &mut Schedule, now: u64) -> Vec<usize> {
        let mut v = Vec::new();
        s.take_due(now, &mut v);
        v
    }

    #[test]
    fn ready_list_is_fifo_once_per_slot_and_forgets_reset_slots() {
        let mut s = Schedule::default();
        s.wake(3);
        s.wake(1);
        s.wake(3);
        assert_eq!(s.pop_ready(), Some(3));
        s.wake(3); // back of the list
        assert_eq!(s.pop_ready(), Some(1));
        assert_eq!(s.pop_ready(), Some(3));
        assert_eq!(s.pop_ready(), None);
        // A slot reset while queued: its entry is stale, and the new QP
        // is queued once.
        s.wake(2);
        s.reset_slot(2);
        assert_eq!(s.pop_ready(), None);
        s.wake(2);
        s.reset_slot(2);
        s.wake(2);
        assert_eq!(s.pop_ready(), Some(2));
        assert_eq!(s.pop_ready(), None);
    }

    #[test]
    fn front_is_sees_only_a_live_entry_at_the_front() {
        let mut s = Schedule::default();
        assert!(!s.front_is(0), "empty");
        s.wake(2);
        s.wake(5);
        assert!(s.front_is(2) && !s.front_is(5));
        s.wake_front(5); // queued already: stays behind 2
        assert!(s.front_is(2));
        s.reset_slot(2); // its entry is stale now
        assert!(!s.front_is(2));
        assert_eq!(s.pop_ready(), Some(5));
        s.wake(7);
        s.wake_front(5);
        assert!(s.front_is(5));
    }

    #[test]
    fn rearmed_and_cancelled_timers_fire_once_at_their_last_time() {
        let mut s = Schedule::default();
        s.arm(1, Some(100));
        s.arm(1, None);
        assert_eq!(s.next_deadline(), None);
        s.arm(1, Some(50));
        s.arm(2, Some(70));
        assert_eq!(s.next_deadline(), Some(50));
        assert_eq!(due(&mut s, 60), [1]);
        assert_eq!(s.next_deadline(), Some(70));
        s.arm(1, Some(200));
        s.arm(1, Some(80)); // earlier
        assert_eq!(due(&mut s, 100), [2, 1]);
        assert_eq!(due(&mut s, 1000), Vec::<usize>::new(), "stale 100/200");
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn a_reset_slot_never_gets_its_old_timers() {
        let mut s = Schedule::default();
        s.arm(4, Some(10));
        s.reset_slot(4);
        assert_eq!(s.next_deadline(), None);
        s.arm(4, Some(10)); // the new QP, same time
        assert_eq!(due(&mut s, 10), [4]);
        assert_eq!(due(&mut s, 10), Vec::<usize>::new());
        // Timers that came due wake their slot for poll_transmit, and stay.
        s.arm(5, Some(20));
        s.wake_due(25);
        assert_eq!(s.pop_ready(), Some(5));
        assert_eq!(s.next_deadline(), Some(20));
    }

    #[test]
    fn wait_list_is_fifo_once_per_slot_front_keeps_its_place() {
        let mut s = Schedule::default();
        s.wait(4);
        s.wait(2);
        s.wait(4);
        s.wake(4); // waiting and ready are separate lists
        assert_eq!(s.pop_ready(), Some(4));
        assert_eq!(s.pop_waiter(), Some(4));
        s.wait_front(4);
        assert_eq!(s.pop_waiter(), Some(4));
        assert_eq!(s.pop_waiter(), Some(2));
        assert_eq!(s.pop_waiter(), None);
        s.wait(7);
        s.reset_slot(7);
        assert_eq!(s.pop_waiter(), None, "a reset slot waits no more");
    }

    #[test]
    fn stale_entries_do_not_pile_up() {
        let mut s = Schedule::default();
        for t in 0..100_000u64 {
            s.arm(1, Some(1_000_000 + t)); // an RTO pushed on at every ACK
        }
        assert!(s.timers.len() <= 2 * s.armed + 65, "{}", s.timers.len());
        assert_eq!(due(&mut s, u64::MAX), [1]);
    }
}
