//! `xroce decode FILE.pcap [--json]` (filled in with the wire codec work).
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// pcap file to decode
    pub file: PathBuf,
    /// print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &DecodeArgs) -> anyhow::Result<()> {
    anyhow::bail!("decode of {} is not implemented yet", args.file.display())
}
