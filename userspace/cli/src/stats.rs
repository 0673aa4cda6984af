//! `xroce stats --iface IF [--json]`: the pinned XDP counters of an interface.

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    #[arg(long)]
    pub iface: String,
    /// print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &StatsArgs) -> anyhow::Result<()> {
    let counters = xroce::xdp::read_counters(&args.iface)?;
    if args.json {
        let mut xdp = serde_json::Map::new();
        for (counter, value) in &counters.values {
            xdp.insert(counter.name().into(), (*value).into());
        }
        let out = serde_json::json!({ "iface": args.iface, "xdp": xdp });
        println!("{out}");
    } else {
        println!("XDP counters on {}", args.iface);
        for (counter, value) in &counters.values {
            println!("  {:<12} {value:>14}", counter.name());
        }
    }
    Ok(())
}
