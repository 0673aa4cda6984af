//! The ranks' interfaces before each job: xroce's XDP program attached for
//! xroce and detached for TCP (so TCP crosses the veths as it would without
//! xroce), and the loss asked for on the chosen ranks' ingress:
//!
//! - over xroce, the XDP fault injector (`xroce fault --drop`, seeded):
//!   that fraction of the RoCEv2 frames arriving at the rank;
//! - over TCP, an iptables rule in the rank's namespace (the machine has no
//!   netem): that fraction of the TCP packets arriving from the other ranks
//!   (not from the head node, whose job control stays lossless as it does
//!   over xroce). With segmentation offload a veth carries TCP segments of
//!   up to 64 KiB whole, so one drop there can be several MTU frames' worth.

use std::path::Path;

use anyhow::{bail, Context};

use crate::experiment::{in_netns, topology::Host};
use crate::units::Fraction;

use super::job::Transport;

/// Which ranks' ingress loses frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LossOn {
    All,
    Rank(usize),
}

impl std::str::FromStr for LossOn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(LossOn::All);
        }
        s.strip_prefix("rank:")
            .and_then(|i| i.parse().ok())
            .map(LossOn::Rank)
            .ok_or_else(|| format!("{s:?}: use `all` or `rank:I`"))
    }
}

impl LossOn {
    fn covers(&self, rank: usize) -> bool {
        match self {
            LossOn::All => true,
            LossOn::Rank(i) => *i == rank,
        }
    }
}

/// Sets every rank's interface up for one job of `transport` with `loss`
/// (None: lossless) on the ranks `on` names.
pub fn prepare(
    xroce: &Path,
    hosts: &[Host],
    head: std::net::Ipv4Addr,
    transport: Transport,
    loss: Option<&Fraction>,
    on: &LossOn,
    seed: u64,
) -> anyhow::Result<()> {
    for (rank, host) in hosts.iter().enumerate() {
        let loss = loss.filter(|_| on.covers(rank));
        match transport {
            Transport::Xroce => {
                let iface = host.iface.clone();
                // `xroce run` leaves it attached after the lossless job.
                if !in_netns(&host.netns, move || xroce::xdp::is_attached(&iface))? {
                    crate::experiment::attach(xroce, host)?;
                }
                let (iface, loss) = (host.iface.clone(), loss.cloned());
                in_netns(&host.netns, move || -> anyhow::Result<()> {
                    match loss {
                        Some(drop) => crate::congestion::fault(&crate::congestion::FaultArgs {
                            iface,
                            off: false,
                            drop: Some(drop),
                            opcode: None,
                            qpn: None,
                            seed,
                        }),
                        None => {
                            xroce::xdp::set_fault(&iface, Default::default()).map_err(Into::into)
                        }
                    }
                })??;
            }
            Transport::Tcp => {
                detach(host)?;
                iptables(host, &["-F", "INPUT"])?;
                if let Some(drop) = loss {
                    let p = xroce_common::fixed::fixed_to_fraction(drop.value).to_string();
                    let head = head.to_string();
                    for rule in [
                        &["-s", &head, "-j", "ACCEPT"][..],
                        &[
                            "-p",
                            "tcp",
                            "-m",
                            "statistic",
                            "--mode",
                            "random",
                            "--probability",
                            &p,
                            "-m",
                            "comment",
                            "--comment",
                            DROPPED,
                            "-j",
                            "DROP",
                        ],
                        &[
                            "-p",
                            "tcp",
                            "-m",
                            "comment",
                            "--comment",
                            PASSED,
                            "-j",
                            "ACCEPT",
                        ],
                    ] {
                        iptables(host, &[&["-A", "INPUT"][..], rule].concat())?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Frames the ranks received and frames the loss dropped, summed over the
/// ranks: RoCEv2 frames by the XDP counters over xroce, TCP packets by the
/// iptables rules' counters over TCP (only while loss is on; else 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub frames: u64,
    pub dropped: u64,
}

pub fn counts(hosts: &[Host], transport: Transport) -> anyhow::Result<Counts> {
    let mut total = Counts::default();
    for host in hosts {
        let c = match transport {
            Transport::Xroce => {
                let iface = host.iface.clone();
                let c = in_netns(&host.netns, move || xroce::xdp::read_counters(&iface))??;
                Counts {
                    frames: c.get(xroce_common::Counter::Roce),
                    dropped: c.get(xroce_common::Counter::DropFault),
                }
            }
            Transport::Tcp => iptables_counts(host)?,
        };
        total.frames += c.frames;
        total.dropped += c.dropped;
    }
    Ok(total)
}

/// Comments of the TCP loss rules, which count what they dropped and
/// passed.
const DROPPED: &str = "xroce-loss-dropped";
const PASSED: &str = "xroce-loss-passed";

/// The TCP packets from other ranks the loss rules saw and dropped, from
/// `iptables -nvxL INPUT`.
fn iptables_counts(host: &Host) -> anyhow::Result<Counts> {
    let out = host
        .command("iptables")
        .args(["-nvxL", "INPUT"])
        .output()
        .context("run iptables -L")?;
    Ok(parse_iptables(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_iptables(text: &str) -> Counts {
    let packets = |comment: &str| -> u64 {
        text.lines()
            .filter(|l| l.contains(&format!("/* {comment} */")))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    };
    let dropped = packets(DROPPED);
    Counts {
        frames: dropped + packets(PASSED),
        dropped,
    }
}

/// iptables is there, or an error naming the package.
pub fn check_iptables() -> anyhow::Result<()> {
    if std::process::Command::new("iptables")
        .arg("-V")
        .output()
        .is_err()
    {
        bail!("`iptables` is missing (loss over TCP uses it): install iptables (`apt-get install iptables`)");
    }
    Ok(())
}

/// `iptables ARGS` in the host's namespace (its own tables).
fn iptables(host: &Host, args: &[&str]) -> anyhow::Result<()> {
    let out = host
        .command("iptables")
        .args(args)
        .output()
        .context("run iptables")?;
    if !out.status.success() {
        bail!(
            "iptables {} in {}: {}",
            args.join(" "),
            host.netns,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Detaches xroce's XDP program from the host's interface, if attached.
fn detach(host: &Host) -> anyhow::Result<()> {
    let iface = host.iface.clone();
    in_netns(&host.netns, move || match xroce::xdp::detach(&iface) {
        Ok(()) | Err(xroce::xdp::XdpError::NotAttached(_)) => Ok(()),
        Err(e) => Err(anyhow::Error::from(e).context(format!("detach XDP from {iface}"))),
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_counters_parse() {
        let text = "Chain INPUT (policy ACCEPT 0 packets, 0 bytes)\n    \
                    pkts      bytes target     prot opt in     out     source               destination\n    \
                    12      720 ACCEPT     all  --  *      *       10.201.0.254         0.0.0.0/0\n    \
                    10    30000 DROP       tcp  --  *      *       0.0.0.0/0            0.0.0.0/0            statistic mode random probability 0.01000000000 /* xroce-loss-dropped */\n    \
                    990  3000000 ACCEPT     tcp  --  *      *       0.0.0.0/0            0.0.0.0/0            /* xroce-loss-passed */\n";
        assert_eq!(
            parse_iptables(text),
            Counts {
                frames: 1000,
                dropped: 10
            }
        );
        assert_eq!(
            parse_iptables("Chain INPUT (policy ACCEPT 5 packets, 300 bytes)\n"),
            Counts::default()
        );
    }

    #[test]
    fn loss_on_parses() {
        assert_eq!("all".parse(), Ok(LossOn::All));
        assert_eq!("rank:3".parse(), Ok(LossOn::Rank(3)));
        assert!("rank:x".parse::<LossOn>().is_err());
        assert!(LossOn::Rank(1).covers(1) && !LossOn::Rank(1).covers(0));
    }
}
