//! TIMELY (Mittal et al., "TIMELY: RTT-based Congestion Control for the
//! Datacenter", SIGCOMM 2015): rate control from the RTT gradient.
//!
//! On each completion event with an RTT sample (Algorithm 1 of the paper):
//!
//! ```text
//! new_rtt_diff = new_rtt - prev_rtt;  prev_rtt = new_rtt
//! rtt_diff     = (1 - a) * rtt_diff + a * new_rtt_diff        (EWMA)
//! gradient     = rtt_diff / min_rtt                            (normalised)
//! new_rtt < Tlow   -> rate += delta
//! new_rtt > Thigh  -> rate *= 1 - beta * (1 - Thigh / new_rtt)
//! gradient <= 0    -> rate += N * delta after `hai_threshold` such
//!                     completions in a row (HAI), else rate += delta
//! gradient > 0     -> rate *= 1 - beta * gradient
//! ```
//!
//! A completion event is an ACK carrying an RTT sample (optionally only once
//! `segment_bytes` have been acknowledged since the previous event, as the
//! paper's NIC completes 16-64 KB segments).

use super::CongestionControl;

/// TIMELY parameters; [`Default`] holds the paper's values.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelyConfig {
    /// EWMA weight of the newest RTT difference. Paper: 0.875. (The
    /// authors' published code snippet, as used by eRPC, uses 0.02.)
    pub ewma_alpha: f64,
    /// Multiplicative decrease factor beta. Paper: 0.8.
    pub beta: f64,
    /// Additive increase step delta, bit/s. Paper: 10 Mbit/s.
    pub delta_bps: u64,
    /// Below this RTT the rate always grows by delta. Paper: 50 us.
    pub t_low_ns: u64,
    /// Above this RTT the rate always falls. Paper: 500 us.
    pub t_high_ns: u64,
    /// Propagation RTT normalising the gradient. Paper: 20 us. 0 = use the
    /// smallest RTT seen so far (useful where the base RTT is unknown, as
    /// for a software stack).
    pub min_rtt_ns: u64,
    /// Completions with a non-positive gradient in a row before hyper-active
    /// increase. Paper: N = 5.
    pub hai_threshold: u32,
    /// Multiple of delta added per completion in HAI mode. Paper: N = 5.
    pub hai_multiplier: u32,
    /// Acknowledged bytes per completion event; 0 (default) = every ACK
    /// that carries an RTT sample is an event. The paper's NIC completes
    /// 16-64 KB segments; set that here to gate updates the same way. With
    /// 16 KB gating a flow cut to the rate floor gets one event per 13 ms at
    /// 10 Mbit/s and recovers very slowly (see `sim_tests`).
    pub segment_bytes: u64,
    /// Lowest rate, bit/s (not in the paper; 10 Mbit/s here).
    pub min_rate_bps: u64,
    /// The RTT of an event is the smallest of this many latest samples
    /// ([`super::RttFilter`]); 1: each sample (the paper, with NIC
    /// timestamps).
    pub rtt_filter: u32,
    /// Tlow and Thigh are queueing delays on top of the smallest RTT the
    /// flow has seen rather than absolute RTTs (see
    /// [`super::swift::SwiftConfig::over_base`]). false in the paper.
    pub over_base: bool,
}

impl Default for TimelyConfig {
    fn default() -> Self {
        TimelyConfig {
            ewma_alpha: 0.875,
            beta: 0.8,
            delta_bps: 10_000_000,
            t_low_ns: 50_000,
            t_high_ns: 500_000,
            min_rtt_ns: 20_000,
            hai_threshold: 5,
            hai_multiplier: 5,
            segment_bytes: 0,
            min_rate_bps: 10_000_000,
            rtt_filter: 1,
            over_base: false,
        }
    }
}

impl TimelyConfig {
    /// The paper's parameters ([`Default`]).
    pub fn paper() -> Self {
        Self::default()
    }

    /// The paper's rules re-timed for xroce's software path, from the
    /// congestion lab's measurements (see [`super::SwiftConfig::software`]
    /// for the path: base RTT 5-10 us on a veth, host delays of tens of
    /// microseconds at p90 and up to a millisecond at p99):
    ///
    /// - Tlow 200 us and Thigh 500 us over the smallest RTT seen
    ///   (`over_base`): the paper's 50 us Tlow is under the host delay of
    ///   most samples, so TIMELY never saw an RTT below it, and its fixed
    ///   thresholds would mean a different queue on every host. 200 us is
    ///   Swift's target here; TIMELY holds the RTT between Tlow and Thigh.
    /// - Gradient normalised by 500 us instead of the 20 us propagation
    ///   RTT: a sample's host jitter of 50 us over 20 us read as a gradient
    ///   of 2.5, a cut to the floor (measured: TIMELY with the paper's
    ///   set used 0.70 of a 200 Mbit/s link with no queue); over 500 us a
    ///   rise of that size cuts 8 %. Normalised by 200 us it still used
    ///   only 0.87 of the link, queue median 0; by 500 us 0.95 (as much as
    ///   without congestion control), queue median about 400 us.
    /// - Each sample counts (`rtt_filter` 1; see [`super::RttFilter`]),
    ///   delta, beta, alpha and HAI as in the paper.
    pub fn software() -> Self {
        TimelyConfig {
            t_low_ns: 200_000,
            t_high_ns: 500_000,
            min_rtt_ns: 500_000,
            over_base: true,
            ..Self::paper()
        }
    }

    /// The queueing delay TIMELY aims at, ns, with Tlow over the base RTT:
    /// it raises the rate below Tlow and cuts it on a rise above it, so on
    /// a clean path it holds the RTT at Tlow (see `delay_sim_tests`); with
    /// a software path's jitter it rides between Tlow and Thigh.
    pub fn queue_target_ns(&self) -> Option<u64> {
        self.over_base.then_some(self.t_low_ns)
    }

    /// Parameters from a spec: a preset (`paper` or `software`), then any
    /// `key=value` overrides, comma-separated, e.g. `software,t_low=400us`.
    /// Keys: `alpha`, `beta`, `delta`, `t_low`, `t_high`, `min_rtt`,
    /// `hai_threshold`, `hai_multiplier`, `segment`, `min_rate`. Durations
    /// take a unit (`50us`), rates `mbit`/`gbit`, sizes `B`/`KB`/`KiB`.
    pub fn from_spec(spec: &str) -> Result<Self, String> {
        let cfg = super::spec::parse(
            "TIMELY",
            spec,
            &[("paper", &Self::paper), ("software", &Self::software)],
            |cfg, o| {
                match o.key {
                    "alpha" => cfg.ewma_alpha = o.number()?,
                    "beta" => cfg.beta = o.number()?,
                    "delta" => cfg.delta_bps = o.rate_bps()?,
                    "t_low" => cfg.t_low_ns = o.duration_ns()?,
                    "t_high" => cfg.t_high_ns = o.duration_ns()?,
                    "min_rtt" => cfg.min_rtt_ns = o.duration_ns()?,
                    "hai_threshold" => cfg.hai_threshold = o.whole()?,
                    "hai_multiplier" => cfg.hai_multiplier = o.whole()?,
                    "segment" => cfg.segment_bytes = o.size_bytes()?,
                    "min_rate" => cfg.min_rate_bps = o.rate_bps()?,
                    "filter" => cfg.rtt_filter = o.samples()?,
                    "over_base" => cfg.over_base = o.flag()?,
                    _ => {
                        return Err(o.unknown(
                            "alpha, beta, delta, t_low, t_high, min_rtt, hai_threshold, \
                             hai_multiplier, segment, min_rate, filter or over_base",
                        ))
                    }
                }
                Ok(())
            },
        )?;
        if !(cfg.ewma_alpha > 0.0 && cfg.ewma_alpha <= 1.0) || cfg.beta > 1.0 {
            return Err(format!(
                "TIMELY alpha must be within (0, 1] and beta within 0..=1 (spec {spec:?})"
            ));
        }
        if cfg.t_low_ns >= cfg.t_high_ns {
            return Err(format!("TIMELY needs t_low < t_high (spec {spec:?})"));
        }
        Ok(cfg)
    }
}

/// What the last completion event did (for traces and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelyAction {
    /// RTT below Tlow: additive increase.
    BelowTlow,
    /// RTT above Thigh: multiplicative decrease.
    AboveThigh,
    /// Non-positive gradient: additive increase.
    Increase,
    /// Non-positive gradient for `hai_threshold` completions: N * delta.
    HyperIncrease,
    /// Positive gradient: decrease by beta * gradient.
    Decrease,
}

/// One flow's TIMELY state.
#[derive(Debug, Clone)]
pub struct Timely {
    cfg: TimelyConfig,
    line_rate: u64,
    rate: f64,
    prev_rtt_ns: Option<u64>,
    /// EWMA of RTT differences, ns.
    rtt_diff_ns: f64,
    filter: super::RttFilter,
    /// Completions in a row with a non-positive gradient.
    negative_run: u32,
    acked_since: u64,
    last_action: Option<TimelyAction>,
}

impl Timely {
    /// A flow starting at `line_rate_bps`, which is also its maximum.
    pub fn new(line_rate_bps: u64, cfg: TimelyConfig) -> Self {
        let filter = super::RttFilter::new(cfg.rtt_filter);
        Timely {
            cfg,
            line_rate: line_rate_bps,
            rate: line_rate_bps as f64,
            prev_rtt_ns: None,
            rtt_diff_ns: 0.0,
            filter,
            negative_run: 0,
            acked_since: 0,
            last_action: None,
        }
    }

    pub fn config(&self) -> &TimelyConfig {
        &self.cfg
    }
    pub fn last_action(&self) -> Option<TimelyAction> {
        self.last_action
    }
    /// The smoothed RTT difference, ns.
    pub fn rtt_diff_ns(&self) -> f64 {
        self.rtt_diff_ns
    }
    /// The normalised gradient `rtt_diff / min_rtt`.
    pub fn gradient(&self) -> f64 {
        let min_rtt = if self.cfg.min_rtt_ns != 0 {
            self.cfg.min_rtt_ns
        } else {
            self.filter.base_ns().unwrap_or(1)
        };
        self.rtt_diff_ns / min_rtt.max(1) as f64
    }

    fn clamp(&mut self) {
        let min = self.cfg.min_rate_bps.min(self.line_rate) as f64;
        self.rate = self.rate.clamp(min, self.line_rate as f64);
    }

    /// One completion event with RTT `rtt_ns`.
    pub fn on_rtt_sample(&mut self, rtt_ns: u64) {
        let rtt_ns = self.filter.push(rtt_ns);
        let base = match (self.cfg.over_base, self.filter.base_ns()) {
            (true, Some(b)) => b,
            _ => 0,
        };
        let (t_low, t_high) = (base + self.cfg.t_low_ns, base + self.cfg.t_high_ns);
        if let Some(prev) = self.prev_rtt_ns {
            let new_diff = rtt_ns as f64 - prev as f64;
            let a = self.cfg.ewma_alpha;
            self.rtt_diff_ns = (1.0 - a) * self.rtt_diff_ns + a * new_diff;
        }
        let first = self.prev_rtt_ns.is_none();
        self.prev_rtt_ns = Some(rtt_ns);
        let delta = self.cfg.delta_bps as f64;
        let action = if rtt_ns < t_low {
            self.rate += delta;
            TimelyAction::BelowTlow
        } else if rtt_ns > t_high {
            let factor = 1.0 - self.cfg.beta * (1.0 - t_high as f64 / rtt_ns as f64);
            self.rate *= factor;
            self.negative_run = 0;
            TimelyAction::AboveThigh
        } else if first {
            // No gradient from a single sample: hold the rate.
            self.last_action = None;
            return;
        } else {
            let gradient = self.gradient();
            if gradient <= 0.0 {
                self.negative_run = self.negative_run.saturating_add(1);
                if self.negative_run >= self.cfg.hai_threshold {
                    self.rate += self.cfg.hai_multiplier as f64 * delta;
                    TimelyAction::HyperIncrease
                } else {
                    self.rate += delta;
                    TimelyAction::Increase
                }
            } else {
                self.negative_run = 0;
                self.rate *= (1.0 - self.cfg.beta * gradient).max(0.0);
                TimelyAction::Decrease
            }
        };
        self.clamp();
        self.last_action = Some(action);
    }
}

impl CongestionControl for Timely {
    fn name(&self) -> &'static str {
        "timely"
    }
    fn on_send(&mut self, _now_ns: u64, _bytes: usize) {}
    fn on_ack(&mut self, _now_ns: u64, acked_bytes: usize, rtt_ns: Option<u64>) {
        self.acked_since = self.acked_since.saturating_add(acked_bytes as u64);
        let Some(rtt) = rtt_ns else { return };
        if self.acked_since < self.cfg.segment_bytes {
            return;
        }
        self.acked_since = 0;
        self.on_rtt_sample(rtt);
    }
    fn on_cnp(&mut self, _now_ns: u64) {}
    fn on_timer(&mut self, _now_ns: u64) {}
    fn next_timer_ns(&self) -> Option<u64> {
        None
    }
    fn rate_bps(&self) -> u64 {
        self.rate.round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1_000_000_000;

    fn per_sample() -> TimelyConfig {
        TimelyConfig {
            segment_bytes: 0,
            ..TimelyConfig::default()
        }
    }

    #[test]
    fn below_tlow_adds_delta() {
        let mut t = Timely::new(10 * G, per_sample());
        // Start below line rate so increases are visible.
        t.rate = 5e9;
        t.on_ack(0, 4096, Some(30_000));
        assert_eq!(t.last_action(), Some(TimelyAction::BelowTlow));
        assert_eq!(t.rate_bps(), 5 * G + 10_000_000);
        // Even a steeply rising RTT below Tlow increases.
        t.on_ack(0, 4096, Some(49_000));
        assert_eq!(t.rate_bps(), 5 * G + 20_000_000);
    }

    #[test]
    fn above_thigh_cuts_by_formula() {
        let mut t = Timely::new(10 * G, per_sample());
        // rtt 1000 us: rate *= 1 - 0.8 * (1 - 500/1000) = 0.6
        t.on_ack(0, 4096, Some(1_000_000));
        assert_eq!(t.last_action(), Some(TimelyAction::AboveThigh));
        assert_eq!(t.rate_bps(), 6 * G);
        // rtt 625 us: factor 1 - 0.8 * 0.2 = 0.84
        t.on_ack(0, 4096, Some(625_000));
        assert_eq!(t.rate_bps(), 5_040_000_000);
    }

    #[test]
    fn rising_gradient_decreases_rate() {
        let cfg = TimelyConfig {
            ewma_alpha: 0.5,
            ..per_sample()
        };
        let mut t = Timely::new(10 * G, cfg);
        t.on_ack(0, 0, Some(100_000)); // first sample: hold
        assert_eq!(t.rate_bps(), 10 * G);
        assert_eq!(t.last_action(), None);
        // +4 us: rtt_diff = 0.5 * 4000 = 2000 ns; gradient 2000/20000 = 0.1;
        // rate *= 1 - 0.8 * 0.1 = 0.92
        t.on_ack(0, 0, Some(104_000));
        assert_eq!(t.last_action(), Some(TimelyAction::Decrease));
        assert!((t.gradient() - 0.1).abs() < 1e-12);
        assert_eq!(t.rate_bps(), 9_200_000_000);
        // +4 us again: rtt_diff = 0.5*2000 + 0.5*4000 = 3000; gradient 0.15;
        // rate *= 0.88
        t.on_ack(0, 0, Some(108_000));
        assert_eq!(t.rate_bps(), 8_096_000_000);
    }

    #[test]
    fn falling_gradient_increases_then_hai() {
        let cfg = TimelyConfig {
            ewma_alpha: 1.0,
            ..per_sample()
        };
        let mut t = Timely::new(10 * G, cfg);
        t.rate = 2e9;
        t.on_ack(0, 0, Some(200_000));
        let mut rtt = 200_000;
        let mut expected = 2 * G;
        for i in 1..=7 {
            rtt -= 1_000;
            t.on_ack(0, 0, Some(rtt));
            if i < 5 {
                expected += 10_000_000;
                assert_eq!(t.last_action(), Some(TimelyAction::Increase), "{i}");
            } else {
                expected += 50_000_000;
                assert_eq!(t.last_action(), Some(TimelyAction::HyperIncrease), "{i}");
            }
            assert_eq!(t.rate_bps(), expected);
        }
        // A rising RTT ends HAI: decrease, then the run starts over.
        t.on_ack(0, 0, Some(rtt + 2_000));
        assert_eq!(t.last_action(), Some(TimelyAction::Decrease));
        t.on_ack(0, 0, Some(rtt + 2_000));
        assert_eq!(t.last_action(), Some(TimelyAction::Increase));
    }

    #[test]
    fn specs_pick_presets_and_override_fields() {
        assert_eq!(TimelyConfig::from_spec(""), Ok(TimelyConfig::paper()));
        assert_eq!(
            TimelyConfig::from_spec("paper"),
            Ok(TimelyConfig::default())
        );
        assert_eq!(
            TimelyConfig::from_spec("software"),
            Ok(TimelyConfig::software())
        );
        let o = TimelyConfig::from_spec(
            "paper, alpha=0.5,beta=0.4,delta=5mbit,t_low=30us,t_high=1ms,min_rtt=0us,\
             hai_threshold=3,hai_multiplier=2,segment=16KiB,min_rate=1mbit,filter=4,\
             over_base=true",
        )
        .unwrap();
        assert_eq!((o.ewma_alpha, o.beta, o.delta_bps), (0.5, 0.4, 5_000_000));
        assert_eq!(
            (o.t_low_ns, o.t_high_ns, o.min_rtt_ns),
            (30_000, 1_000_000, 0)
        );
        assert_eq!((o.hai_threshold, o.hai_multiplier), (3, 2));
        assert_eq!((o.segment_bytes, o.min_rate_bps), (16 * 1024, 1_000_000));
        assert_eq!((o.rtt_filter, o.over_base), (4, true));
        assert_eq!(o.queue_target_ns(), Some(30_000));
        assert_eq!(TimelyConfig::paper().queue_target_ns(), None);
        for bad in [
            "fast",
            "t_low=1us",
            "paper,t_low",
            "paper,t_low=5",
            "paper,bogus=1",
            "paper,alpha=0",
            "paper,t_low=1ms,t_high=500us",
            "paper,filter=0",
            "paper,over_base=yes",
        ] {
            assert!(TimelyConfig::from_spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn min_filter_and_base_move_the_thresholds() {
        let cfg = TimelyConfig {
            rtt_filter: 3,
            over_base: true,
            t_low_ns: 50_000,
            t_high_ns: 500_000,
            ..per_sample()
        };
        let mut t = Timely::new(10 * G, cfg);
        t.rate = 5e9;
        // Base 10 us: Tlow is 60 us. A spike among lower samples is not
        // seen (the smallest of the last three counts).
        t.on_ack(0, 0, Some(10_000));
        assert_eq!(t.last_action(), Some(TimelyAction::BelowTlow));
        t.on_ack(0, 0, Some(900_000));
        assert_eq!(t.last_action(), Some(TimelyAction::BelowTlow));
        t.on_ack(0, 0, Some(55_000));
        assert_eq!(t.last_action(), Some(TimelyAction::BelowTlow));
        // Three samples over 510 us (Thigh over the base): a cut.
        for _ in 0..3 {
            t.on_ack(0, 0, Some(1_020_000));
        }
        assert_eq!(t.last_action(), Some(TimelyAction::AboveThigh));
    }

    #[test]
    fn rate_stays_within_bounds() {
        let mut t = Timely::new(G, per_sample());
        for _ in 0..10 {
            t.on_ack(0, 0, Some(30_000));
        }
        assert_eq!(t.rate_bps(), G, "capped at line rate");
        for _ in 0..100 {
            t.on_ack(0, 0, Some(10_000_000));
        }
        assert_eq!(t.rate_bps(), 10_000_000, "floored at min rate");
    }

    #[test]
    fn segment_gating_and_min_rtt_tracking() {
        let cfg = TimelyConfig {
            segment_bytes: 16 * 1024,
            ..TimelyConfig::default()
        };
        let mut t = Timely::new(10 * G, cfg);
        t.rate = 5e9;
        // 16 KiB per event: 4 KiB ACKs with samples only update every 4th.
        for _ in 0..3 {
            t.on_ack(0, 4096, Some(30_000));
        }
        assert_eq!(t.rate_bps(), 5 * G);
        t.on_ack(0, 4096, Some(30_000));
        assert_eq!(t.rate_bps(), 5 * G + 10_000_000);
        // Bytes from ACKs without a sample still count toward a segment.
        t.on_ack(0, 16 * 1024, None);
        t.on_ack(0, 0, Some(30_000));
        assert_eq!(t.rate_bps(), 5 * G + 20_000_000);

        let cfg = TimelyConfig {
            min_rtt_ns: 0,
            ewma_alpha: 1.0,
            ..per_sample()
        };
        let mut t = Timely::new(10 * G, cfg);
        t.on_ack(0, 0, Some(80_000));
        t.on_ack(0, 0, Some(100_000));
        // gradient = 20_000 / 80_000 (smallest seen) = 0.25
        assert!((t.gradient() - 0.25).abs() < 1e-12);
        assert_eq!(t.rate_bps(), 8 * G);
    }
}
