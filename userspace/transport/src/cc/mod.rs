//! Congestion control: the reaction point's interface and its algorithms.
//!
//! The requester asks the controller for the rate it may send at and reports
//! what happens (packets sent, ACKs with RTT samples, CNPs). Time is the
//! engine's simulated or real clock in nanoseconds, so algorithms stay
//! deterministic under test.
//!
//! - [`dcqcn`]: DCQCN (Zhu et al., SIGCOMM 2015), ECN/CNP driven.
//! - [`timely`]: TIMELY (Mittal et al., SIGCOMM 2015), RTT-gradient driven.
//! - [`swift`]: Swift (Kumar et al., SIGCOMM 2020), delay-target driven
//!   (a window turned into a rate; `$XROCE_SWIFT`).
//! - [`NoCc`]: line rate always.
//! - [`pacer`]: the token bucket that turns a rate into send times; each
//!   engine QP paces its data with one, and the closed-loop tests run it.
//! - [`units`]: the rates, sizes and durations of a DCQCN spec
//!   (`$XROCE_DCQCN`), which the CLI's flags take too.
//!
//! [`build`] makes a controller from a [`CcKind`] ("none", "dcqcn", "timely",
//! "swift").

pub mod dcqcn;
pub mod pacer;
mod spec;
pub mod swift;
pub mod timely;
pub mod units;

#[cfg(test)]
mod delay_sim_tests;
#[cfg(test)]
mod sim_tests;

pub use dcqcn::{Dcqcn, DcqcnConfig};
pub use pacer::Pacer;
pub use swift::{Swift, SwiftConfig};
pub use timely::{Timely, TimelyConfig};

/// A pluggable rate controller for one QP (DCQCN reacts per flow).
pub trait CongestionControl: Send {
    /// Short name shown in stats and experiment output ("dcqcn", "timely",
    /// "swift", "none").
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

/// The delay signal a delay-based controller reads from a software path's
/// RTT samples: the smallest of the last `window` samples, and the
/// smallest sample ever seen (the path's base RTT).
///
/// On a NIC the RTT is timestamped on the wire; here it is taken by the
/// engine threads at both ends, so each sample also carries how long they
/// waited for a core (2 ms and more on a loaded host) and ACK batching.
/// That host delay only ever adds, while a standing queue delays every
/// packet, so the minimum over a few samples keeps the queue and drops
/// the host's spikes; one sample alone would read a scheduling hiccup as
/// congestion. The price: a queue that grows is seen `window` samples
/// late (a few round trips), and a sample shorter than the queue allows
/// hides it for `window` samples. In the congestion lab (a veth path, a
/// tbf bottleneck) about a tenth of the samples were 5-15 us while the
/// queue stood at 2 ms, and with a window of 4-8 the senders held the
/// queue there: the `software` presets take each sample (window 1). The
/// simulation with spikes only (`delay_sim_tests`) shows what it is for.
#[derive(Debug, Clone)]
pub struct RttFilter {
    window: usize,
    recent: std::collections::VecDeque<u64>,
    base: Option<u64>,
}

impl RttFilter {
    /// Keeps the last `window` samples (0 and 1: each sample as it comes).
    pub fn new(window: u32) -> Self {
        let window = window.max(1) as usize;
        RttFilter {
            window,
            recent: std::collections::VecDeque::with_capacity(window),
            base: None,
        }
    }

    /// Adds a sample; returns the filtered RTT.
    pub fn push(&mut self, rtt_ns: u64) -> u64 {
        if self.recent.len() == self.window {
            self.recent.pop_front();
        }
        self.recent.push_back(rtt_ns);
        self.base = Some(self.base.map_or(rtt_ns, |b| b.min(rtt_ns)));
        self.recent.iter().copied().min().unwrap_or(rtt_ns)
    }

    /// The smallest sample so far.
    pub fn base_ns(&self) -> Option<u64> {
        self.base
    }
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

/// Which congestion controller a QP runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum CcKind {
    /// [`NoCc`]: always the line rate.
    #[default]
    None,
    /// [`Dcqcn`].
    Dcqcn,
    /// [`Timely`].
    Timely,
    /// [`Swift`].
    Swift,
}

impl CcKind {
    pub const ALL: [CcKind; 4] = [CcKind::None, CcKind::Dcqcn, CcKind::Timely, CcKind::Swift];

    /// The name [`std::str::FromStr`] accepts and [`CongestionControl::name`] reports.
    pub const fn name(self) -> &'static str {
        match self {
            CcKind::None => "none",
            CcKind::Dcqcn => "dcqcn",
            CcKind::Timely => "timely",
            CcKind::Swift => "swift",
        }
    }
}

impl std::fmt::Display for CcKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--cc` value that names no controller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown congestion control {0:?}; valid choices: none, dcqcn, timely, swift")]
pub struct ParseCcKindError(pub String);

impl std::str::FromStr for CcKind {
    type Err = ParseCcKindError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        CcKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(t))
            .ok_or_else(|| ParseCcKindError(s.to_string()))
    }
}

/// Parameters for every algorithm; [`build_with`] uses the one `kind` picks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CcConfig {
    pub dcqcn: DcqcnConfig,
    pub timely: TimelyConfig,
    pub swift: SwiftConfig,
}

/// Environment variable that overrides DCQCN's parameters for every flow a
/// process makes with [`build`]: a [`DcqcnConfig::from_spec`] spec such as
/// `software` or `paper,timer=1ms`. `xroce experiment` sets it for its
/// senders; it reaches any tool without flags of its own for them.
pub const DCQCN_ENV: &str = "XROCE_DCQCN";

/// Environment variable that overrides Swift's parameters for every flow a
/// process makes with [`build`]: a [`SwiftConfig::from_spec`] spec such as
/// `software` or `paper,target=40us,hops=2`.
pub const SWIFT_ENV: &str = "XROCE_SWIFT";

/// Environment variable that overrides TIMELY's parameters for every flow a
/// process makes with [`build`]: a [`TimelyConfig::from_spec`] spec such as
/// `software` or `paper,t_low=100us`.
pub const TIMELY_ENV: &str = "XROCE_TIMELY";

/// A controller of `kind` for a flow on a link of `line_rate_bps`, with the
/// default parameters ([`DcqcnConfig::default`] is the paper's set) or
/// those `$XROCE_DCQCN` ([`DCQCN_ENV`]), `$XROCE_TIMELY` ([`TIMELY_ENV`])
/// or `$XROCE_SWIFT` ([`SWIFT_ENV`]) names. A spec that does not parse is reported on stderr
/// once and the defaults are used.
pub fn build(kind: CcKind, line_rate_bps: u64) -> Box<dyn CongestionControl> {
    let mut cfg = CcConfig::default();
    match kind {
        CcKind::Dcqcn => {
            if let Ok(spec) = std::env::var(DCQCN_ENV) {
                match DcqcnConfig::from_spec(&spec, line_rate_bps) {
                    Ok(dcqcn) => cfg.dcqcn = dcqcn,
                    Err(e) => {
                        static WARNED: std::sync::Once = std::sync::Once::new();
                        WARNED.call_once(|| eprintln!("xroce: ignoring ${DCQCN_ENV}: {e}"));
                    }
                }
            }
        }
        CcKind::Swift => {
            if let Ok(spec) = std::env::var(SWIFT_ENV) {
                match SwiftConfig::from_spec(&spec) {
                    Ok(swift) => cfg.swift = swift,
                    Err(e) => {
                        static WARNED: std::sync::Once = std::sync::Once::new();
                        WARNED.call_once(|| eprintln!("xroce: ignoring ${SWIFT_ENV}: {e}"));
                    }
                }
            }
        }
        CcKind::Timely => {
            if let Ok(spec) = std::env::var(TIMELY_ENV) {
                match TimelyConfig::from_spec(&spec) {
                    Ok(timely) => cfg.timely = timely,
                    Err(e) => {
                        static WARNED: std::sync::Once = std::sync::Once::new();
                        WARNED.call_once(|| eprintln!("xroce: ignoring ${TIMELY_ENV}: {e}"));
                    }
                }
            }
        }
        CcKind::None => {}
    }
    build_with(kind, line_rate_bps, &cfg)
}

/// [`build`] with explicit parameters.
pub fn build_with(kind: CcKind, line_rate_bps: u64, cfg: &CcConfig) -> Box<dyn CongestionControl> {
    match kind {
        CcKind::None => Box::new(NoCc::new(line_rate_bps)),
        CcKind::Dcqcn => Box::new(Dcqcn::new(line_rate_bps, cfg.dcqcn.clone())),
        CcKind::Timely => Box::new(Timely::new(line_rate_bps, cfg.timely.clone())),
        CcKind::Swift => Box::new(Swift::new(line_rate_bps, cfg.swift.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cc_kind_parses_and_errors_name_choices() {
        assert_eq!("none".parse(), Ok(CcKind::None));
        assert_eq!("dcqcn".parse(), Ok(CcKind::Dcqcn));
        assert_eq!("TIMELY".parse(), Ok(CcKind::Timely));
        assert_eq!("swift".parse(), Ok(CcKind::Swift));
        let e = "bbr".parse::<CcKind>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown congestion control \"bbr\"; valid choices: none, dcqcn, timely, swift"
        );
        for k in CcKind::ALL {
            assert_eq!(k.to_string().parse(), Ok(k));
        }
    }

    #[test]
    fn factory_builds_each_kind_at_line_rate() {
        for k in CcKind::ALL {
            let mut cc = build(k, 10_000_000_000);
            assert_eq!(cc.name(), k.name());
            assert_eq!(cc.rate_bps(), 10_000_000_000);
            cc.on_send(0, 4096);
            cc.on_ack(1, 4096, Some(10_000));
        }
        // A CNP slows DCQCN only.
        let mut d = build(CcKind::Dcqcn, 10_000_000_000);
        d.on_cnp(0);
        assert_eq!(d.rate_bps(), 5_000_000_000);
        let mut n = build(CcKind::None, 10_000_000_000);
        n.on_cnp(0);
        assert_eq!(n.rate_bps(), 10_000_000_000);
    }
}
