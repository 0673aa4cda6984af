//! Congestion control: the reaction point's interface and its algorithms.
//!
//! The requester asks the controller for the rate it may send at and reports
//! what happens (packets sent, ACKs with RTT samples, CNPs). Time is the
//! engine's simulated or real clock in nanoseconds, so algorithms stay
//! deterministic under test.

/// A pluggable rate controller for one QP (DCQCN reacts per flow).
pub trait CongestionControl: Send {
    /// Short name shown in stats and experiment output ("dcqcn", "timely", "none").
    fn name(&self) -> &'static str;
    /// Bytes put on the wire at `now_ns` (payload + headers).
    fn on_send(&mut self, now_ns: u64, bytes: usize);
    /// An ACK covering `acked_bytes`; `rtt_ns` when the ACK can be matched to
    /// the send time of the packet it acknowledges.
    fn on_ack(&mut self, now_ns: u64, acked_bytes: usize, rtt_ns: Option<u64>);
    /// A Congestion Notification Packet arrived for this QP.
    fn on_cnp(&mut self, now_ns: u64);
    /// Called when `now_ns` has reached the time `next_timer_ns` asked for.
    fn on_timer(&mut self, now_ns: u64);
    /// When `on_timer` should next run, if at all.
    fn next_timer_ns(&self) -> Option<u64>;
    /// Current allowed sending rate in bits per second (the pacer's rate).
    fn rate_bps(&self) -> u64;
}

/// No congestion control: always send at the line rate given.
#[derive(Debug, Clone)]
pub struct NoCc {
    line_rate_bps: u64,
}

impl NoCc {
    pub fn new(line_rate_bps: u64) -> Self {
        Self { line_rate_bps }
    }
}

impl CongestionControl for NoCc {
    fn name(&self) -> &'static str {
        "none"
    }
    fn on_send(&mut self, _now_ns: u64, _bytes: usize) {}
    fn on_ack(&mut self, _now_ns: u64, _acked_bytes: usize, _rtt_ns: Option<u64>) {}
    fn on_cnp(&mut self, _now_ns: u64) {}
    fn on_timer(&mut self, _now_ns: u64) {}
    fn next_timer_ns(&self) -> Option<u64> {
        None
    }
    fn rate_bps(&self) -> u64 {
        self.line_rate_bps
    }
}
