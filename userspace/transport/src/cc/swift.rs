//! Swift (Kumar et al., "Swift: Delay is Simple and Effective for Congestion
//! Control in the Datacenter", SIGCOMM 2020): AIMD on a congestion window
//! against a target delay.
//!
//! On each ACK that carries an RTT sample `delay` (Algorithm 1 of the paper,
//! with the ACKs since the previous sample counted as `acked` packets):
//!
//! ```text
//! target = base_target + hops * per_hop + fs(cwnd)
//! fs(cwnd) = clamp(fs_alpha / sqrt(cwnd) + fs_beta, 0, fs_range)
//!     fs_alpha = fs_range / (1/sqrt(fs_min_cwnd) - 1/sqrt(fs_max_cwnd))
//!     fs_beta  = -fs_alpha / sqrt(fs_max_cwnd)
//! delay < target:  cwnd += ai * acked / cwnd   (cwnd >= 1)
//!                  cwnd += ai * acked          (cwnd <  1)
//! delay >= target, and no decrease within the last RTT:
//!                  cwnd *= max(1 - beta * (delay - target) / delay, 1 - max_mdf)
//! cwnd = clamp(cwnd, min_cwnd, max_cwnd)
//! ```
//!
//! Flow scaling raises the target for flows with small windows, so that
//! many flows sharing a bottleneck (each with a small cwnd) settle at a
//! somewhat larger queue instead of all being pushed below one packet;
//! `fs_range` bounds how much. Hop scaling adds `per_hop` for each switch on
//! the path; xroce cannot see the path's TTL from an ACK, so the hop count is
//! a parameter (`hops`).
//!
//! # Mapping to xroce: a rate from the window
//!
//! xroce's controllers hand the engine's pacer a rate, not a window (see
//! [`super::CongestionControl::rate_bps`]). Swift's window becomes the rate
//! a window-limited sender would reach at the RTT it measures:
//!
//! ```text
//! rate = cwnd * packet_bytes * 8 / rtt        (rtt = the latest sample)
//! ```
//!
//! With N flows on a link of capacity C and base RTT `b`, the link queues
//! once `sum(rate) > C`, i.e. once `sum(cwnd) * packet > C * (b + q / C)`:
//! the same standing queue `q = sum(cwnd) * packet - C * b` a window would
//! build, so Swift's equilibrium carries over. Below one packet the paper
//! paces one packet every `rtt / cwnd`; the formula is that same rate, so
//! the pacer covers both regimes. The window is capped at the one that
//! fills the line rate at the current RTT (`max_cwnd`), so a flow that was
//! unconstrained does not bank window it could never use.
//!
//! Before the first RTT sample the flow sends at the line rate (as DCQCN and
//! TIMELY start); the first sample sets cwnd to what that rate was at that
//! RTT, and Swift runs from there.
//!
//! On a software path (`over_base`, the `software` preset) the target is a
//! queueing delay over the smallest RTT the flow has seen, and the rate is
//! never paced over an RTT below the target (see [`SwiftConfig::software`]).
//!
//! Not modelled: retransmission-timeout and fast-recovery decreases (the
//! [`super::CongestionControl`] interface reports no losses), and the
//! separate endpoint (host) delay target: xroce's RTT sample includes host
//! delays (there is no NIC timestamp to split them off).

use super::CongestionControl;

/// Swift parameters. [`Default`] is [`SwiftConfig::paper`].
#[derive(Debug, Clone, PartialEq)]
pub struct SwiftConfig {
    /// Base target delay, ns: the RTT a flow aims for with a large window,
    /// on a path of no hops. Paper: a few tens of microseconds for the
    /// fabric (25 us here).
    pub base_target_ns: u64,
    /// Switch hops on the path (xroce cannot count them: set it).
    pub hops: u32,
    /// Target added per hop, ns (1 us here).
    pub per_hop_ns: u64,
    /// Largest extra target flow scaling adds, ns (0 turns flow scaling
    /// off). Here 4 x the base target.
    pub fs_range_ns: u64,
    /// Window (packets) at and below which flow scaling adds all of
    /// `fs_range`. 0.1 here.
    pub fs_min_cwnd: f64,
    /// Window (packets) at and above which flow scaling adds nothing. 100
    /// here.
    pub fs_max_cwnd: f64,
    /// Additive increase, packets per RTT. 1 here.
    pub ai: f64,
    /// Multiplicative decrease gain beta. Paper: 0.8.
    pub beta: f64,
    /// Largest cut of one decrease, as a fraction. Paper: 0.5.
    pub max_mdf: f64,
    /// Bytes per window packet (the RoCE MTU). 4096 here.
    pub packet_bytes: u64,
    /// Smallest window, packets (the paper lets cwnd fall to a small
    /// fraction of a packet and paces). 0.001 here.
    pub min_cwnd: f64,
    /// Lowest rate, bit/s, whatever cwnd and RTT say. 1 Mbit/s here.
    pub min_rate_bps: u64,
    /// The delay is the smallest of this many latest RTT samples
    /// ([`super::RttFilter`]); 1: each sample (the paper, with NIC
    /// timestamps).
    pub rtt_filter: u32,
    /// The target is a queueing delay on top of the smallest RTT the flow
    /// has seen (its base RTT) rather than an absolute RTT: a software
    /// path's base RTT is mostly host delay, which differs from host to
    /// host and build to build. false in the paper.
    pub over_base: bool,
}

const US: u64 = 1_000;

impl SwiftConfig {
    /// Fabric-scale targets, as a NIC-based stack with microsecond RTTs
    /// would run: base target 25 us, one hop of 1 us, flow scaling up to
    /// 100 us extra between 0.1 and 100 packets, AI 1 packet per RTT,
    /// beta 0.8, max_mdf 0.5, packets of 4096 bytes.
    pub fn paper() -> Self {
        SwiftConfig {
            base_target_ns: 25 * US,
            hops: 1,
            per_hop_ns: US,
            fs_range_ns: 100 * US,
            fs_min_cwnd: 0.1,
            fs_max_cwnd: 100.0,
            ai: 1.0,
            beta: 0.8,
            max_mdf: 0.5,
            packet_bytes: 4096,
            min_cwnd: 0.001,
            min_rate_bps: 1_000_000,
            rtt_filter: 1,
            over_base: false,
        }
    }

    /// The paper's rules re-targeted for xroce's software path, from what
    /// the congestion lab measured (`xroce experiment incast --bottleneck
    /// delay`, 4 senders, a 2-core VM, veths through a bridge, AF_XDP,
    /// release build):
    ///
    /// - The base RTT is host time, not wire: 5-10 us unloaded on a veth
    ///   (min and p10 of the samples), while host scheduling adds 30 us at
    ///   p90 and 0.4-1 ms at p99, and about 100 us at the median under an
    ///   incast. An absolute target (this preset's 500 us before) would
    ///   mean a different queue on every host and build, so the target is
    ///   a queueing delay over the smallest RTT seen (`over_base`).
    /// - Target 200 us over that base: above the host delay most samples
    ///   carry, so it is not read as queue, and a tenth of the ~2 ms the
    ///   senders' windows queue at a 200 Mbit/s bottleneck without
    ///   congestion control. 200 us is 5 KB at 200 Mbit/s, 25 KB at
    ///   1 Gbit/s. Measured there: RTT median 180-220 us, the bottleneck's
    ///   queueing delay median about 90 us (the rest is host time).
    /// - No hops, no flow scaling: the lab's path has one queue, and its
    ///   windows are a packet or two, where flow scaling would add nearly
    ///   its whole range whatever the number of flows.
    /// - Windows counted in 1 KB packets (the RoCE MTU on a 1500-byte
    ///   link), AI 0.25 of one per RTT: a flow's window at the target is
    ///   about 1.2 KB at 200 Mbit/s over 4 flows, and a whole packet per
    ///   round from each of 4 flows would add 4 KB, ~160 us of queue, per
    ///   round, close to the target itself.
    /// - Floor 10 Mbit/s: at 1 Mbit/s a 1 KB packet leaves every 8 ms,
    ///   longer than the tail-loss probe waits (spurious retransmissions),
    ///   and one RTT sample per 8 ms hardly lets the window grow back.
    /// - Every sample counts (`rtt_filter` 1): the smallest of 4-8 samples
    ///   held the queue at the engine's limit (2 ms) in the lab, because
    ///   about a tenth of the samples are 5-15 us even while the queue
    ///   stands (see [`super::RttFilter`]).
    pub fn software() -> Self {
        SwiftConfig {
            base_target_ns: 200 * US,
            hops: 0,
            fs_range_ns: 0,
            ai: 0.25,
            packet_bytes: 1024,
            min_rate_bps: 10_000_000,
            rtt_filter: 1,
            over_base: true,
            ..Self::paper()
        }
    }

    /// Parameters from a spec: a preset (`paper` or `software`), then any
    /// `key=value` overrides, comma-separated, e.g. `software,target=300us`.
    /// Keys: `target` (base), `hops`, `per_hop`, `fs_range`, `fs_min_cwnd`,
    /// `fs_max_cwnd`, `ai`, `beta`, `max_mdf`, `packet`, `min_cwnd`,
    /// `min_rate`. Durations take a unit (`25us`), rates `mbit`/`gbit`,
    /// sizes `B`/`KB`/`KiB`.
    pub fn from_spec(spec: &str) -> Result<Self, String> {
        let cfg = super::spec::parse(
            "Swift",
            spec,
            &[("paper", &Self::paper), ("software", &Self::software)],
            |cfg, o| {
                match o.key {
                    "target" => cfg.base_target_ns = o.duration_ns()?,
                    "hops" => cfg.hops = o.whole()?,
                    "per_hop" => cfg.per_hop_ns = o.duration_ns()?,
                    "fs_range" => cfg.fs_range_ns = o.duration_ns()?,
                    "fs_min_cwnd" => cfg.fs_min_cwnd = o.number()?,
                    "fs_max_cwnd" => cfg.fs_max_cwnd = o.number()?,
                    "ai" => cfg.ai = o.number()?,
                    "beta" => cfg.beta = o.number()?,
                    "max_mdf" => cfg.max_mdf = o.number()?,
                    "packet" => cfg.packet_bytes = o.size_bytes()?,
                    "min_cwnd" => cfg.min_cwnd = o.number()?,
                    "min_rate" => cfg.min_rate_bps = o.rate_bps()?,
                    "filter" => cfg.rtt_filter = o.samples()?,
                    "over_base" => cfg.over_base = o.flag()?,
                    _ => {
                        return Err(o.unknown(
                            "target, hops, per_hop, fs_range, fs_min_cwnd, fs_max_cwnd, ai, \
                             beta, max_mdf, packet, min_cwnd, min_rate, filter or over_base",
                        ))
                    }
                }
                Ok(())
            },
        )?;
        if cfg.packet_bytes == 0 {
            return Err(format!(
                "Swift packet must be above 0 bytes (spec {spec:?})"
            ));
        }
        if !(0.0..1.0).contains(&cfg.max_mdf) || cfg.beta > 1.0 {
            return Err(format!(
                "Swift max_mdf must be within 0..1 and beta within 0..=1 (spec {spec:?})"
            ));
        }
        if cfg.fs_range_ns > 0 && !(cfg.fs_min_cwnd > 0.0 && cfg.fs_min_cwnd < cfg.fs_max_cwnd) {
            return Err(format!(
                "Swift needs 0 < fs_min_cwnd < fs_max_cwnd for flow scaling (spec {spec:?})"
            ));
        }
        Ok(cfg)
    }

    /// The flow-scaling part of the target for a window of `cwnd` packets, ns.
    pub fn flow_scaling_ns(&self, cwnd: f64) -> f64 {
        let range = self.fs_range_ns as f64;
        if range == 0.0 {
            return 0.0;
        }
        let inv = |c: f64| 1.0 / c.max(f64::MIN_POSITIVE).sqrt();
        let alpha = range / (inv(self.fs_min_cwnd) - inv(self.fs_max_cwnd));
        let beta = -alpha * inv(self.fs_max_cwnd);
        (alpha * inv(cwnd) + beta).clamp(0.0, range)
    }

    /// The queueing delay the flows aim for, ns, where the config makes it
    /// one number: a target over the base RTT without flow scaling.
    pub fn queue_target_ns(&self) -> Option<u64> {
        (self.over_base && self.fs_range_ns == 0)
            .then(|| self.base_target_ns + self.hops as u64 * self.per_hop_ns)
    }

    /// The target delay for a window of `cwnd` packets, ns.
    pub fn target_ns(&self, cwnd: f64) -> f64 {
        self.base_target_ns as f64
            + self.hops as f64 * self.per_hop_ns as f64
            + self.flow_scaling_ns(cwnd)
    }
}

impl Default for SwiftConfig {
    fn default() -> Self {
        Self::paper()
    }
}

/// What the last RTT sample did (for traces and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwiftAction {
    /// Delay below target: additive increase.
    Increase,
    /// Delay at or above target: multiplicative decrease.
    Decrease,
    /// Delay at or above target within an RTT of the last decrease: held.
    Hold,
}

/// One flow's Swift state.
#[derive(Debug, Clone)]
pub struct Swift {
    cfg: SwiftConfig,
    line_rate: u64,
    /// Congestion window, packets; `None` until the first RTT sample.
    cwnd: Option<f64>,
    /// The latest (filtered) RTT, ns.
    rtt_ns: Option<u64>,
    filter: super::RttFilter,
    last_decrease_ns: Option<u64>,
    /// Bytes acknowledged since the last RTT sample.
    acked_since: u64,
    rate: u64,
    last_action: Option<SwiftAction>,
}

impl Swift {
    /// A flow starting at `line_rate_bps`, which is also its maximum.
    pub fn new(line_rate_bps: u64, cfg: SwiftConfig) -> Self {
        let filter = super::RttFilter::new(cfg.rtt_filter);
        Swift {
            cfg,
            line_rate: line_rate_bps,
            cwnd: None,
            rtt_ns: None,
            filter,
            last_decrease_ns: None,
            acked_since: 0,
            rate: line_rate_bps,
            last_action: None,
        }
    }

    pub fn config(&self) -> &SwiftConfig {
        &self.cfg
    }
    /// The congestion window in packets, once an RTT sample set it.
    pub fn cwnd(&self) -> Option<f64> {
        self.cwnd
    }
    /// The target delay for the current window, ns (the window's maximum
    /// before the first sample, i.e. no flow scaling).
    pub fn target_delay_ns(&self) -> f64 {
        self.base_ns() + self.cfg.target_ns(self.cwnd.unwrap_or(f64::INFINITY))
    }

    /// What the target sits on: the base RTT seen with `over_base`, else 0.
    fn base_ns(&self) -> f64 {
        match (self.cfg.over_base, self.filter.base_ns()) {
            (true, Some(b)) => b as f64,
            _ => 0.0,
        }
    }
    pub fn last_action(&self) -> Option<SwiftAction> {
        self.last_action
    }

    /// The window that sends at the line rate over `rtt_ns`, packets.
    fn max_cwnd(&self, rtt_ns: u64) -> f64 {
        self.line_rate as f64 * rtt_ns as f64 / 1e9 / 8.0 / self.cfg.packet_bytes as f64
    }

    /// One RTT sample at `now_ns`, `acked_bytes` acknowledged since the
    /// previous one.
    pub fn on_rtt_sample(&mut self, now_ns: u64, acked_bytes: u64, rtt_ns: u64) {
        let rtt_ns = self.filter.push(rtt_ns).max(1);
        self.rtt_ns = Some(rtt_ns);
        // The first sample: the window the line rate fills at this RTT (at
        // the target, if shorter; see below).
        let mut cwnd = self.cwnd.unwrap_or_else(|| {
            let at = if self.cfg.over_base {
                (rtt_ns as f64).max(self.target_delay_ns())
            } else {
                rtt_ns as f64
            };
            self.max_cwnd(at.round() as u64).max(self.cfg.min_cwnd)
        });
        let acked = acked_bytes as f64 / self.cfg.packet_bytes as f64;
        let target = self.base_ns() + self.cfg.target_ns(cwnd);
        let delay = rtt_ns as f64;
        let action = if delay < target {
            if cwnd >= 1.0 {
                cwnd += self.cfg.ai * acked / cwnd;
            } else {
                cwnd += self.cfg.ai * acked;
            }
            SwiftAction::Increase
        } else if self
            .last_decrease_ns
            .is_none_or(|t| now_ns.saturating_sub(t) >= rtt_ns)
        {
            let cut = self.cfg.beta * (delay - target) / delay;
            cwnd *= (1.0 - cut).max(1.0 - self.cfg.max_mdf);
            self.last_decrease_ns = Some(now_ns);
            SwiftAction::Decrease
        } else {
            SwiftAction::Hold
        };
        // The window becomes a rate over the RTT. With `over_base` (a
        // software path) never over one below the target: below it the
        // window is growing anyway, and there single samples of a few
        // microseconds (the base RTT on a veth, or a token-bucket link
        // passing a burst) next to a target of hundreds would turn a
        // window of a few packets into the line rate for a whole round
        // and cap the window at a tiny fraction of a packet, swinging the
        // rate between line rate and the floor from one sample to the next.
        let paced_rtt = if self.cfg.over_base {
            delay.max(target)
        } else {
            delay
        };
        let max_cwnd = self
            .max_cwnd(paced_rtt.round() as u64)
            .max(self.cfg.min_cwnd);
        cwnd = cwnd.clamp(self.cfg.min_cwnd, max_cwnd);
        self.cwnd = Some(cwnd);
        let rate = cwnd * self.cfg.packet_bytes as f64 * 8.0 * 1e9 / paced_rtt;
        let floor = self.cfg.min_rate_bps.min(self.line_rate) as f64;
        self.rate = rate.clamp(floor, self.line_rate as f64).round() as u64;
        self.last_action = Some(action);
    }
}

impl CongestionControl for Swift {
    fn name(&self) -> &'static str {
        "swift"
    }
    fn on_send(&mut self, _now_ns: u64, _bytes: usize) {}
    fn on_ack(&mut self, now_ns: u64, acked_bytes: usize, rtt_ns: Option<u64>) {
        self.acked_since = self.acked_since.saturating_add(acked_bytes as u64);
        let Some(rtt) = rtt_ns else { return };
        let acked = std::mem::take(&mut self.acked_since);
        self.on_rtt_sample(now_ns, acked, rtt);
    }
    fn on_cnp(&mut self, _now_ns: u64) {}
    fn on_timer(&mut self, _now_ns: u64) {}
    fn next_timer_ns(&self) -> Option<u64> {
        None
    }
    fn rate_bps(&self) -> u64 {
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1_000_000_000;

    /// No flow scaling, no hops: the target is the base target.
    fn flat(target_ns: u64) -> SwiftConfig {
        SwiftConfig {
            base_target_ns: target_ns,
            hops: 0,
            fs_range_ns: 0,
            ..SwiftConfig::paper()
        }
    }

    #[test]
    fn first_sample_sets_window_from_line_rate() {
        let mut s = Swift::new(10 * G, flat(50_000));
        assert_eq!(s.rate_bps(), 10 * G);
        assert_eq!(s.cwnd(), None);
        // 10 Gbit/s x 40 us = 50 000 B = 12.207 packets of 4096 B: the
        // increase is capped at the line-rate window, so the rate holds.
        s.on_ack(0, 4096, Some(40_000));
        assert_eq!(s.last_action(), Some(SwiftAction::Increase));
        let w = 10e9 * 40e-6 / 8.0 / 4096.0;
        assert!((s.cwnd().unwrap() - w).abs() < 1e-9);
        assert_eq!(s.rate_bps(), 10 * G);
    }

    #[test]
    fn decrease_is_proportional_bounded_and_once_per_rtt() {
        let mut s = Swift::new(10 * G, flat(50_000));
        // 100 us, target 50 us: cut = 0.8 * 50/100 = 0.4; cwnd from the
        // line-rate window at 100 us (30.52 packets) to 60 % of it.
        s.on_ack(0, 4096, Some(100_000));
        assert_eq!(s.last_action(), Some(SwiftAction::Decrease));
        let w0 = 10e9 * 100e-6 / 8.0 / 4096.0;
        assert!((s.cwnd().unwrap() - 0.6 * w0).abs() < 1e-9);
        // rate = cwnd * 4096 * 8 / 100 us = 6 Gbit/s.
        assert_eq!(s.rate_bps(), 6 * G);
        // Within one RTT (100 us) of that decrease: held.
        s.on_ack(99_999, 4096, Some(100_000));
        assert_eq!(s.last_action(), Some(SwiftAction::Hold));
        assert_eq!(s.rate_bps(), 6 * G);
        // 1 ms delay: 0.8 * 0.95 = 0.76 > max_mdf 0.5: cut by half.
        s.on_ack(1_000_000, 4096, Some(1_000_000));
        assert_eq!(s.last_action(), Some(SwiftAction::Decrease));
        assert!((s.cwnd().unwrap() - 0.3 * w0).abs() < 1e-9);
        // Same window over a ten times longer RTT: 0.3 * 10G / 10.
        assert_eq!(s.rate_bps(), 300_000_000);
    }

    #[test]
    fn additive_increase_is_ai_per_window_and_paces_below_one_packet() {
        let cfg = SwiftConfig {
            max_mdf: 0.9,
            beta: 1.0,
            ..flat(50_000)
        };
        let mut s = Swift::new(10 * G, cfg);
        // Drive cwnd down: delay 500 us: cut 0.9 (capped), a decrease per
        // RTT.
        let mut now = 0;
        for _ in 0..4 {
            s.on_ack(now, 0, Some(500_000));
            now += 500_000;
        }
        let w = s.cwnd().unwrap();
        assert!(w < 1.0, "cwnd {w}");
        // Below one packet: cwnd += ai per packet acked; the rate is one
        // window per RTT (pacing a packet every rtt / cwnd).
        s.on_ack(now, 4096, Some(40_000));
        assert_eq!(s.last_action(), Some(SwiftAction::Increase));
        assert!((s.cwnd().unwrap() - (w + 1.0)).abs() < 1e-9);
        let expect = (w + 1.0) * 4096.0 * 8.0 / 40e-6;
        assert!((s.rate_bps() as f64 - expect).abs() <= 1.0);
        // At 4 packets: a full window acked (4 x 4096 B) adds ai = 1.
        let mut s2 = Swift::new(10 * G, flat(50_000));
        s2.on_ack(0, 0, Some(10_000)); // cwnd = 10G x 10 us = 3.05 pkts
        let c0 = s2.cwnd().unwrap();
        s2.on_ack(1, (c0 * 4096.0) as usize, Some(40_000));
        assert!((s2.cwnd().unwrap() - (c0 + 1.0)).abs() < 1e-3);
    }

    #[test]
    fn target_scales_with_hops_and_small_windows() {
        let c = SwiftConfig::paper();
        // Large window: base + 1 hop, no flow scaling.
        assert_eq!(c.target_ns(100.0), 26_000.0);
        assert_eq!(c.target_ns(1000.0), 26_000.0);
        // At or below fs_min_cwnd: the whole range.
        assert_eq!(c.target_ns(0.1), 126_000.0);
        assert_eq!(c.target_ns(0.01), 126_000.0);
        // In between, a / sqrt(cwnd) + b: at 1 packet
        // a = 100 / (3.1623 - 0.1) us, fs = a * (1 - 0.1) = 29.39 us.
        let a = 100_000.0 / (1.0 / 0.1f64.sqrt() - 0.1);
        assert!((c.flow_scaling_ns(1.0) - a * 0.9).abs() < 1e-6);
        // Monotone: smaller windows get larger targets.
        assert!(c.target_ns(2.0) > c.target_ns(4.0));
        let h = SwiftConfig { hops: 3, ..c };
        assert_eq!(h.target_ns(100.0), 28_000.0);
    }

    #[test]
    fn specs_pick_presets_and_override_fields() {
        assert_eq!(SwiftConfig::from_spec(""), Ok(SwiftConfig::paper()));
        assert_eq!(
            SwiftConfig::from_spec("software"),
            Ok(SwiftConfig::software())
        );
        let o = SwiftConfig::from_spec(
            "paper, target=40us,hops=2,per_hop=2us,fs_range=0us,ai=0.5,beta=0.5,max_mdf=0.25,\
             packet=1KiB,min_cwnd=0.01,min_rate=5mbit",
        )
        .unwrap();
        assert_eq!(o.base_target_ns, 40_000);
        assert_eq!((o.hops, o.per_hop_ns, o.fs_range_ns), (2, 2_000, 0));
        assert_eq!((o.ai, o.beta, o.max_mdf), (0.5, 0.5, 0.25));
        assert_eq!(
            (o.packet_bytes, o.min_cwnd, o.min_rate_bps),
            (1024, 0.01, 5_000_000)
        );
        for bad in [
            "fast",
            "target=1us",
            "paper,target",
            "paper,target=5",
            "paper,bogus=1",
            "paper,max_mdf=1",
            "paper,packet=0",
            "paper,fs_min_cwnd=200",
            "paper,ai=-1",
            "paper,filter=0",
            "paper,over_base=1",
        ] {
            assert!(SwiftConfig::from_spec(bad).is_err(), "{bad}");
        }
        assert!(SwiftConfig::from_spec("paper,bogus=1")
            .unwrap_err()
            .contains("max_mdf"));
    }

    #[test]
    fn over_base_targets_a_queue_and_paces_no_faster_than_the_target() {
        let cfg = SwiftConfig {
            rtt_filter: 4,
            over_base: true,
            packet_bytes: 1024,
            ..flat(200_000)
        };
        assert_eq!(cfg.queue_target_ns(), Some(200_000));
        assert_eq!(SwiftConfig::paper().queue_target_ns(), None);
        let mut s = Swift::new(G / 5, cfg);
        // Base 10 us: the target is 210 us of RTT; the first window is the
        // line rate's over it (200 Mbit/s x 210 us = 5.1 packets).
        s.on_ack(0, 1024, Some(10_000));
        assert_eq!(s.target_delay_ns(), 210_000.0);
        let w = 0.2e9 * 210e-6 / 8.0 / 1024.0;
        assert!((s.cwnd().unwrap() - w).abs() < 1e-9);
        assert_eq!(s.rate_bps(), G / 5);
        // A spike among short samples is not seen: no decrease.
        s.on_ack(1_000, 0, Some(2_000_000));
        assert_eq!(s.last_action(), Some(SwiftAction::Increase));
        // Once the last four samples are over the target (the spike and
        // three more): a decrease, by the smallest (310 us).
        for i in 0..3 {
            s.on_ack(2_000_000 + i, 0, Some(310_000 + i * 1000));
        }
        assert_eq!(s.last_action(), Some(SwiftAction::Decrease));
        let c = s.cwnd().unwrap();
        let rate = c * 1024.0 * 8.0 / 310e-6;
        assert!((s.rate_bps() as f64 - rate).abs() <= 1.0);
        // Samples far below the target pace over the target, not over them.
        for i in 0..4 {
            s.on_ack(3_000_000 + i, 0, Some(12_000));
        }
        let c = s.cwnd().unwrap();
        let rate = c * 1024.0 * 8.0 / 210e-6;
        assert!(
            (s.rate_bps() as f64 - rate).abs() <= 1.0,
            "{}",
            s.rate_bps()
        );
        assert!(s.rate_bps() < G / 5);
    }

    #[test]
    fn rate_stays_within_bounds_and_ack_bytes_accumulate() {
        let mut s = Swift::new(G, flat(50_000));
        for i in 0..200 {
            s.on_ack(i * 10_000_000, 0, Some(10_000_000));
        }
        assert_eq!(s.rate_bps(), 1_000_000, "floored at min rate");
        assert!(s.cwnd().unwrap() >= 0.001);
        // ACKs without a sample count toward the next sample's increase.
        let mut s = Swift::new(10 * G, flat(50_000));
        // Four halvings (200 us apart, one per RTT) from 61 packets to 3.8,
        // well under the line-rate window at 45 us (13.7).
        for i in 0..4 {
            s.on_ack(i * 200_000, 0, Some(200_000));
        }
        let c0 = s.cwnd().unwrap();
        assert!((c0 - 10e9 * 200e-6 / 8.0 / 4096.0 / 16.0).abs() < 1e-9);
        s.on_ack(800_001, 4096 * 10, None);
        s.on_ack(800_002, 4096 * 10, None);
        assert_eq!(s.cwnd(), Some(c0), "no sample, no update");
        s.on_ack(800_003, 0, Some(45_000));
        assert!((s.cwnd().unwrap() - (c0 + 20.0 / c0)).abs() < 1e-9);
    }
}
