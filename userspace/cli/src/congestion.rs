//! `xroce ecn` and `xroce fault`: program the XDP congestion point and loss
//! injection of an interface at run time, through its pinned maps.

use crate::units::{Fraction, Rate, Size};
use anyhow::{bail, Context};
use xroce_common::{
    congestion::{EcnConfig, EcnPolicy},
    fault::FaultConfig,
    opcode_class::OpcodeClass,
};

#[derive(clap::Args, Debug)]
pub struct EcnArgs {
    /// Network interface with xroce's XDP program (as `ip link` names it)
    #[arg(long, value_name = "IF")]
    pub iface: String,
    /// Turn the congestion point off
    #[arg(long, conflicts_with_all = ["link_rate", "kmin", "kmax", "pmax", "buffer"])]
    pub off: bool,
    /// Drain rate of the virtual bottleneck, e.g. 5gbit, 100mbit
    #[arg(long, value_parser = crate::units::rate)]
    pub link_rate: Option<Rate>,
    /// RED: no marking up to this queue length (step: the threshold K), e.g. 5KB
    #[arg(long, value_parser = crate::units::size)]
    pub kmin: Option<Size>,
    /// RED: marking probability reaches --pmax here, e.g. 200KB
    #[arg(long, value_parser = crate::units::size)]
    pub kmax: Option<Size>,
    /// RED: marking probability at kmax, e.g. 0.01
    #[arg(long, default_value = "0.01", value_parser = crate::units::fraction)]
    pub pmax: Fraction,
    /// red (DCQCN switch) or step (DCTCP)
    #[arg(long, default_value = "red")]
    pub policy: String,
    /// Virtual buffer: frames beyond it are tail-dropped (default: unlimited)
    #[arg(long, value_parser = crate::units::size)]
    pub buffer: Option<Size>,
}

pub fn ecn(args: &EcnArgs) -> anyhow::Result<()> {
    if args.off {
        xroce::xdp::set_ecn(&args.iface, EcnConfig::default())?;
        eprintln!("xroce: congestion point off on {}", args.iface);
        return Ok(());
    }
    let Some(rate) = &args.link_rate else {
        bail!("give --link-rate (e.g. --link-rate 5gbit --kmin 5KB --kmax 200KB), or --off");
    };
    let Some(kmin) = &args.kmin else {
        bail!("give --kmin (e.g. --kmin 5KB): the queue length where marking starts");
    };
    let (link_rate, kmin) = (rate.value, kmin.value);
    let buffer = args.buffer.as_ref().map_or(0, |b| b.value);
    let config = match EcnPolicy::from_name(&args.policy) {
        Some(EcnPolicy::Red) => {
            let Some(kmax) = &args.kmax else {
                bail!("RED needs --kmax (e.g. --kmax 200KB), or use --policy step");
            };
            EcnConfig::red(link_rate, kmin, kmax.value, args.pmax.value, buffer)
        }
        Some(EcnPolicy::Step) => EcnConfig::step(link_rate, kmin, buffer),
        None => bail!("unknown --policy {:?}; use red or step", args.policy),
    };
    if let Err(why) = config.validate() {
        bail!("{why}");
    }
    xroce::xdp::set_ecn(&args.iface, config)?;
    eprintln!(
        "xroce: congestion point on {}: {}",
        args.iface,
        describe_ecn(&config)
    );
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct FaultArgs {
    /// Network interface with xroce's XDP program (as `ip link` names it)
    #[arg(long, value_name = "IF")]
    pub iface: String,
    /// Turn loss injection off
    #[arg(long, conflicts_with_all = ["drop", "opcode", "qpn", "seed"])]
    pub off: bool,
    /// Fraction of RoCEv2 frames to drop, e.g. 0.01
    #[arg(long, value_parser = crate::units::fraction)]
    pub drop: Option<Fraction>,
    /// Only this opcode class: send, write, read, read-request, read-response, ack, atomic, cnp
    #[arg(long)]
    pub opcode: Option<String>,
    /// Only frames to this destination QPN (decimal or 0x hex)
    #[arg(long)]
    pub qpn: Option<String>,
    /// Seed for a reproducible drop pattern (0 or absent: kernel randomness)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn fault(args: &FaultArgs) -> anyhow::Result<()> {
    if args.off {
        xroce::xdp::set_fault(&args.iface, FaultConfig::default())?;
        eprintln!("xroce: loss injection off on {}", args.iface);
        return Ok(());
    }
    let Some(drop) = &args.drop else {
        bail!("give --drop FRACTION (e.g. --drop 0.01), or --off");
    };
    let drop = drop.value;
    let mask = match &args.opcode {
        Some(name) => OpcodeClass::mask_from_name(name).with_context(|| {
            format!(
                "unknown --opcode {name:?}; use one of {}",
                OpcodeClass::NAMES
            )
        })?,
        None => 0,
    };
    let qpn = match &args.qpn {
        Some(q) => Some(parse_qpn(q)?),
        None => None,
    };
    let config = FaultConfig::new(drop, mask, qpn, args.seed);
    xroce::xdp::set_fault(&args.iface, config)?;
    eprintln!(
        "xroce: loss injection on {}: {}",
        args.iface,
        describe_fault(&config)
    );
    Ok(())
}

fn parse_qpn(s: &str) -> anyhow::Result<u32> {
    let value = match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    match value {
        Ok(q) if q <= 0x00ff_ffff => Ok(q),
        _ => bail!("--qpn {s:?} is not a 24-bit QP number (e.g. 17 or 0x11)"),
    }
}

pub fn describe_ecn(c: &EcnConfig) -> String {
    if c.enabled == 0 {
        return "off".into();
    }
    let policy = EcnPolicy::from_u32(c.policy);
    let mut s = format!(
        "{} at {} bit/s, kmin {} B",
        policy.name(),
        c.link_rate_bps,
        c.kmin
    );
    if policy == EcnPolicy::Red {
        s += &format!(
            ", kmax {} B, pmax {:.4}",
            c.kmax,
            xroce_common::fixed::fixed_to_fraction(c.pmax_fixed)
        );
    }
    if c.buffer_bytes != 0 {
        s += &format!(", buffer {} B", c.buffer_bytes);
    }
    s
}

pub fn describe_fault(c: &FaultConfig) -> String {
    if c.enabled == 0 {
        return "off".into();
    }
    let mut s = format!(
        "drop {:.4}",
        xroce_common::fixed::fixed_to_fraction(c.drop_fixed)
    );
    if c.opcode_mask != 0 {
        s += &format!(" of opcode classes {:#x}", c.opcode_mask);
    }
    if c.qpn != xroce_common::fault::ANY_QPN {
        s += &format!(" to QPN {:#x}", c.qpn);
    }
    if c.seed != 0 {
        s += &format!(", seed {}", c.seed);
    }
    s
}
