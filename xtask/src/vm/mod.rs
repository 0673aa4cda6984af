//! `cargo xtask vm`: Debian VMs with Linux Soft-RoCE (rdma_rxe) to test xroce
//! against, and inside which xroce's XDP program is loaded on other kernels.
//!
//! - `image`: what a VM is made of, all from Debian's packages and cached
//!   under target/vm/: a debootstrap root file system provisioned by
//!   vagrant/provision.sh (the same script Vagrant runs) packed as an
//!   initramfs, and per kernel (bookworm 6.1, bookworm-backports 6.12) the
//!   uncompressed vmlinux plus the modules a peer needs.
//! - `qemu`: a network namespace with a bridge, one tap per VM and a veth
//!   for xroce; qemu (KVM if it runs guests, TCG otherwise) inside that
//!   namespace; an agent on the guest's second serial port that runs
//!   scripts and reports their output and exit status. Everything is torn
//!   down on every exit path (drop, panic, Ctrl-C).
//! - `suites`: the kernel matrix (XDP attach + end-to-end tests in the
//!   guest) and the interop suite (rxe <-> rxe, xroce <-> rxe, and Debian's
//!   own programs on the host under `xroce run` <-> rxe: "dropin" cases,
//!   RDMA-CM, ucx_perftest and an Open MPI allreduce over pml ucx).

mod image;
mod qemu;
mod suites;
mod vagrant;

use std::time::Instant;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

pub use image::Kernel;
pub use vagrant::{run_cmd as vagrant, VagrantArgs};

#[derive(Args)]
pub struct VmArgs {
    #[command(subcommand)]
    cmd: VmCmd,
}

#[derive(Subcommand)]
enum VmCmd {
    /// Build (or reuse) the VM images: root file system and every kernel of the matrix
    Build {
        /// Rebuild the root file system even if the cached one matches
        #[arg(long)]
        force: bool,
    },
    /// Boot one VM, bring rxe0 up, show it, power off (a smoke test of the harness)
    Boot {
        /// Kernel of the matrix: 6.1 (bookworm) or 6.12 (bookworm-backports)
        #[arg(long, default_value = "6.1")]
        kernel: String,
    },
    /// Boot one VM and run a shell command in it; exits with the command's status
    Run {
        #[arg(long, default_value = "6.1")]
        kernel: String,
        /// Interface MTU of the VM network
        #[arg(long, default_value_t = 1500)]
        mtu: u32,
        /// The command (run by bash in the guest)
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Run VM suites: matrix (XDP in the guest on each kernel), interop (rxe peers)
    Test {
        /// matrix, interop or all
        #[arg(long, default_value = "all")]
        suite: String,
        /// Only this kernel (6.1 or 6.12) for the matrix
        #[arg(long)]
        kernel: Option<String>,
    },
}

pub fn run(args: &VmArgs) -> Result<()> {
    match &args.cmd {
        VmCmd::Build { force } => {
            image::ensure_host_tools()?;
            image::build_all(*force)?;
            Ok(())
        }
        VmCmd::Boot { kernel } => {
            image::ensure_host_tools()?;
            let k = Kernel::parse(kernel)?;
            suites::boot_smoke(k)
        }
        VmCmd::Run {
            kernel,
            mtu,
            command,
        } => {
            image::ensure_host_tools()?;
            let k = Kernel::parse(kernel)?;
            let rc = suites::run_one(k, *mtu, &command.join(" "))?;
            if rc != 0 {
                bail!("the command exited with status {rc} in the guest");
            }
            Ok(())
        }
        VmCmd::Test { suite, kernel } => {
            image::ensure_host_tools()?;
            let kernels = match kernel {
                Some(k) => vec![Kernel::parse(k)?],
                None => Kernel::ALL.to_vec(),
            };
            match suite.as_str() {
                "matrix" => suites::matrix(&kernels),
                "interop" => suites::interop(),
                "vagrant" => vagrant::suite(),
                "all" => {
                    suites::matrix(&kernels)?;
                    suites::interop()?;
                    vagrant::suite()
                }
                other => bail!("unknown suite {other:?} (matrix, interop, vagrant, all)"),
            }
        }
    }
}

/// The VM suites for `cargo xtask test`: installs what they need (as root),
/// builds or reuses the images, runs the kernel matrix and the interop suite.
/// `quick` skips them.
pub fn suite(quick: bool) -> Result<()> {
    if quick {
        eprintln!("vm: --quick: VM suites skipped");
        return Ok(());
    }
    let t = Instant::now();
    image::ensure_host_tools()?;
    image::build_all(false)?;
    eprintln!("vm: images ready in {:.0?}", t.elapsed());
    suites::matrix(Kernel::ALL)?;
    suites::interop()?;
    vagrant::suite()?;
    eprintln!("vm: all VM suites passed in {:.0?}", t.elapsed());
    Ok(())
}
