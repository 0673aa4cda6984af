//! `cargo xtask`: set-up, build, test, demo and bench for xroce.
//!
//! Every command first runs `setup`, which installs what a fresh Debian
//! machine lacks and says what it does. xtask depends on no xroce crate:
//! building those needs what `setup` installs.

mod baseline;
mod bench;
mod demo;
mod dropin;
mod netns;
mod setup;
mod util;
mod vm;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, test and demo xroce")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what is missing: apt packages (as root), nightly rust-src, bpf-linker
    Setup,
    /// Build the XDP program and all userspace crates (release)
    Build,
    /// fmt check, clippy -D warnings, unit tests, fuzzing, end-to-end tests
    Test {
        /// Skip the slow suites (VMs)
        #[arg(long)]
        quick: bool,
    },
    /// RDMA WRITE and READ between two network namespaces over XDP/AF_XDP
    Demo,
    /// xroce vs kernel TCP/UDP and CRC peers on one veth pair: ratios
    Bench,
    /// VMs with Linux Soft-RoCE: build, boot, run, test
    Vm(vm::VmArgs),
    /// vagrant/'s Vagrantfile here: pack the box, libvirtd in a namespace, test
    Vagrant(vm::VagrantArgs),
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    setup::setup()?;
    match cli.command {
        Cmd::Setup => Ok(()),
        Cmd::Build => build(),
        Cmd::Test { quick } => test(quick),
        Cmd::Demo => demo::demo(),
        Cmd::Bench => bench::bench(),
        Cmd::Vm(args) => vm::run(&args),
        Cmd::Vagrant(args) => vm::vagrant(&args),
    }
}

fn build() -> Result<()> {
    util::cargo(&["build", "--workspace", "--release"])
}

fn test(quick: bool) -> Result<()> {
    util::step("format check");
    util::cargo(&["fmt", "--all", "--", "--check"])?;
    // The XDP program is a workspace of its own (bpf target).
    util::cargo(&["fmt", "--manifest-path", "ebpf/Cargo.toml", "--", "--check"])?;
    util::step("clippy");
    util::cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    util::step("build binaries used by end-to-end tests");
    util::cargo(&["build", "--workspace", "--bins"])?;
    util::step("unit, property and end-to-end tests");
    util::require_root_for("the end-to-end tests (namespaces, XDP, AF_XDP)")?;
    util::cargo(&["test", "--workspace", "--no-fail-fast"])?;
    fuzz(if quick { 20 } else { 60 })?;
    if quick {
        util::step("--quick: slow suites skipped");
    }
    vm::suite(quick)
}

/// Coverage-guided fuzzing of the frame parser for a bounded time: any
/// panic or crash fails the run (libFuzzer exits non-zero).
fn fuzz(seconds: u32) -> Result<()> {
    util::step(&format!("fuzz the RoCEv2 parser for {seconds} s"));
    let wire = util::workspace_root().join("userspace/wire");
    std::fs::create_dir_all(wire.join("fuzz/corpus/parse_frame"))?;
    util::run(
        std::process::Command::new("rustup")
            .args(["run", "nightly", "cargo", "fuzz", "run", "parse_frame"])
            .args(["fuzz/corpus/parse_frame", "fuzz/seeds/parse_frame", "--"])
            .arg(format!("-max_total_time={seconds}"))
            .current_dir(wire)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC"),
    )
}
