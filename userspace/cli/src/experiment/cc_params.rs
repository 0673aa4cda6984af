//! The congestion controllers' parameters every experiment hands its
//! xroce processes: one set of flags (`--dcqcn`, `--swift`, `--timely`),
//! checked before anything runs, passed on as the environment the drop-in
//! library and `xroce bench` read (`XROCE_DCQCN`, `XROCE_SWIFT`,
//! `XROCE_TIMELY`).

use serde::{Deserialize, Serialize};

/// Specs of `DcqcnConfig`, `SwiftConfig` and `TimelyConfig::from_spec`.
/// Without them a process takes each controller's defaults, the papers'
/// sets, which read a software host's delays as congestion.
#[derive(clap::Args, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CcParams {
    /// DCQCN parameters: a preset (software, paper, nvidia) and key=value
    /// overrides, e.g. "software,timer=1ms" (see DcqcnConfig::from_spec);
    /// "software" re-times the paper's set for xroce's millisecond
    /// feedback loop
    #[arg(long, default_value = "software")]
    pub dcqcn: String,
    /// Swift parameters (--cc swift): a preset (software, paper) and
    /// key=value overrides, e.g. "software,target=300us" (see
    /// SwiftConfig::from_spec); "software" aims at a software host's round
    /// trips, "paper" at the paper's NIC-timestamped 25 us
    #[arg(long, default_value = "software")]
    pub swift: String,
    /// TIMELY parameters (--cc timely): a preset (software, paper) and
    /// key=value overrides, e.g. "software,t_low=300us" (see
    /// TimelyConfig::from_spec); "software" aims at a software host's round
    /// trips, "paper" at the paper's NIC-timestamped ones (Tlow 50 us,
    /// Thigh 500 us)
    #[arg(long, default_value = "software")]
    pub timely: String,
}

impl CcParams {
    /// Each spec checked, a wrong one named by its flag; DCQCN's rates
    /// are resolved against `line_rate_bps` (they scale with the link).
    pub fn check(&self, line_rate_bps: u64) -> anyhow::Result<xroce::cc::DcqcnConfig> {
        let dcqcn = xroce::cc::DcqcnConfig::from_spec(&self.dcqcn, line_rate_bps)
            .map_err(|e| anyhow::anyhow!("--dcqcn: {e}"))?;
        xroce::cc::SwiftConfig::from_spec(&self.swift)
            .map_err(|e| anyhow::anyhow!("--swift: {e}"))?;
        xroce::cc::TimelyConfig::from_spec(&self.timely)
            .map_err(|e| anyhow::anyhow!("--timely: {e}"))?;
        Ok(dcqcn)
    }

    /// The environment that hands them to xroce's processes.
    pub fn envs(&self) -> [(&'static str, &str); 3] {
        [
            (xroce::cc::DCQCN_ENV, &self.dcqcn),
            (xroce::cc::SWIFT_ENV, &self.swift),
            (xroce::cc::TIMELY_ENV, &self.timely),
        ]
    }

    /// Sets that environment on `cmd`.
    pub fn apply(&self, cmd: &mut std::process::Command) {
        cmd.envs(self.envs());
    }

    /// The delay a delay-based controller aims its queue at, in us (None
    /// for DCQCN and none, or a spec that does not parse).
    pub fn delay_target_us(&self, cc: xroce::cc::CcKind) -> Option<f64> {
        let ns = match cc {
            xroce::cc::CcKind::Timely => xroce::cc::TimelyConfig::from_spec(&self.timely)
                .ok()?
                .queue_target_ns(),
            xroce::cc::CcKind::Swift => xroce::cc::SwiftConfig::from_spec(&self.swift)
                .ok()?
                .queue_target_ns(),
            _ => None,
        }?;
        Some(ns as f64 / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        cc_params: CcParams,
    }

    fn parse(args: &[&str]) -> CcParams {
        Flags::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap()
            .cc_params
    }

    #[test]
    fn software_by_default_and_each_flag_reaches_its_variable() {
        let d = parse(&[]);
        assert_eq!(
            d.envs(),
            [
                (xroce::cc::DCQCN_ENV, "software"),
                (xroce::cc::SWIFT_ENV, "software"),
                (xroce::cc::TIMELY_ENV, "software"),
            ]
        );
        let p = parse(&["--timely", "paper,t_low=80us", "--swift", "paper"]);
        let mut cmd = std::process::Command::new("true");
        p.apply(&mut cmd);
        let env: Vec<_> = cmd
            .get_envs()
            .map(|(k, v)| (k.to_str().unwrap(), v.unwrap().to_str().unwrap()))
            .collect();
        assert!(env.contains(&(xroce::cc::TIMELY_ENV, "paper,t_low=80us")));
        assert!(env.contains(&(xroce::cc::SWIFT_ENV, "paper")));
        assert!(env.contains(&(xroce::cc::DCQCN_ENV, "software")));
        assert!(p.check(1_000_000_000).is_ok());
    }

    #[test]
    fn a_wrong_spec_is_refused_by_its_flag() {
        for (flag, spec) in [
            ("--timely", "fast"),
            ("--swift", "target=x"),
            ("--dcqcn", "nope"),
        ] {
            let e = parse(&[flag, spec]).check(1_000_000_000).unwrap_err();
            assert!(e.to_string().starts_with(flag), "{flag}: {e}");
        }
    }

    #[test]
    fn delay_targets_come_from_the_delay_based_controllers_only() {
        let p = parse(&["--timely", "software,t_low=300us"]);
        let timely = xroce::cc::TimelyConfig::from_spec(&p.timely).unwrap();
        let swift = xroce::cc::SwiftConfig::from_spec(&p.swift).unwrap();
        let us = |ns: Option<u64>| ns.map(|ns| ns as f64 / 1e3);
        assert_eq!(
            p.delay_target_us(xroce::cc::CcKind::Timely),
            us(timely.queue_target_ns())
        );
        assert_eq!(
            p.delay_target_us(xroce::cc::CcKind::Swift),
            us(swift.queue_target_ns())
        );
        assert_eq!(p.delay_target_us(xroce::cc::CcKind::Dcqcn), None);
    }
}
