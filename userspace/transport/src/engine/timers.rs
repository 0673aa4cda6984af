//! A QP's timers, one table indexed by kind, and the local ACK timeout as
//! IBTA encodes it in the QP attributes (the RNR NAK timer is a wire
//! encoding: [`xroce_wire::rnr_timer_us`]).
//!
//! The congestion controller's timer and the pacer's send time are not in
//! the table: they belong to the controller and the pacer, which say when
//! they want to run (`next_timer_ns`, `held_until_ns`).

/// What a QP's timer is for. The order is the order expired timers fire
/// in one `handle_timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// An RNR NAK's back-off: the requester holds until it ends, then
    /// retries from the NAKed PSN.
    RnrBackoff,
    /// Retransmission: a tail-loss probe, then the local ACK timeout
    /// (requester.rs `arm_rto`).
    Retransmit,
}

impl Timer {
    pub(crate) const ALL: [Timer; 2] = [Timer::RnrBackoff, Timer::Retransmit];
}

/// When each [`Timer`] of a QP fires (absolute ns), if armed.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TimerTable {
    at: [Option<u64>; Timer::ALL.len()],
}

impl TimerTable {
    pub(crate) fn arm(&mut self, t: Timer, at: u64) {
        self.at[t as usize] = Some(at);
    }
    pub(crate) fn cancel(&mut self, t: Timer) {
        self.at[t as usize] = None;
    }
    pub(crate) fn cancel_all(&mut self) {
        *self = Self::default();
    }
    pub(crate) fn is_armed(&self, t: Timer) -> bool {
        self.at[t as usize].is_some()
    }
    /// The earliest armed deadline.
    pub(crate) fn earliest(&self) -> Option<u64> {
        self.at.iter().flatten().min().copied()
    }
    /// Disarms `t` if it is due at `now`, and says whether it was.
    pub(crate) fn take_due(&mut self, t: Timer, now: u64) -> bool {
        let due = self.at[t as usize].is_some_and(|at| at <= now);
        if due {
            self.cancel(t);
        }
        due
    }
}

/// Local ACK timeout for the encoded `timeout` attribute: 4.096 us * 2^t;
/// 0 means "infinite" (no retransmission timer).
pub fn ack_timeout_ns(t: u8) -> Option<u64> {
    if t == 0 {
        None
    } else {
        Some(4096u64 << t.min(31))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_table_keeps_one_deadline_per_kind() {
        let mut t = TimerTable::default();
        assert_eq!(t.earliest(), None);
        t.arm(Timer::Retransmit, 50);
        t.arm(Timer::RnrBackoff, 70);
        t.arm(Timer::Retransmit, 90);
        assert_eq!(t.earliest(), Some(70));
        assert!(!t.take_due(Timer::RnrBackoff, 69));
        assert!(t.take_due(Timer::RnrBackoff, 70));
        assert!(!t.is_armed(Timer::RnrBackoff));
        assert_eq!(t.earliest(), Some(90));
        t.cancel_all();
        assert_eq!(t.earliest(), None);
    }

    #[test]
    fn encodings() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(1), Some(8192));
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
    }
}
