//! `cargo xtask vagrant`: the Vagrantfile in vagrant/ run here, with no box
//! catalogue and no systemd.
//!
//! - `box`: a vagrant-libvirt box packed from the xtask VMs' root file
//!   system (image.rs) plus what Vagrant expects: systemd, sshd, a `vagrant`
//!   user with Vagrant's insecure public key and passwordless sudo,
//!   ifupdown with DHCP on eth0 (vagrant's Debian guest plugin writes the
//!   private network there), and bookworm's 6.1 kernel (the matrix's, from
//!   the same cached .deb) whose vmlinuz and initrd ship in the box and are
//!   booted directly (the box's Vagrantfile sets libvirt's kernel/initrd/
//!   cmdline; the disk is one ext4 file system, made by `mkfs.ext4 -d`
//!   without loop devices). Cached under target/vagrant/, keyed by a hash
//!   of its inputs, and `vagrant box add`ed as xroce/bookworm.
//! - libvirtd (and virtlogd) in namespaces this module makes: a network
//!   namespace (so the management network, dnsmasq and the VMs' bridges
//!   exist only there and route nowhere) and, inside it, a private mount +
//!   PID namespace whose tmpfs /run, /var/lib/libvirt and /var/log/libvirt
//!   hold every libvirt domain, volume, network and socket. Killing the PID
//!   namespace's init (by PID, on every exit path; the kernel then kills
//!   libvirtd, qemu and dnsmasq) and deleting the network namespace leaves
//!   nothing behind. Vagrant and virsh reach libvirtd through
//!   /proc/<init>/root/run/libvirt/libvirt-sock (LIBVIRT_DEFAULT_URI) and
//!   run in the network namespace (ssh to the VMs).
//! - `shell`: that environment with a shell (or a command) in vagrant/, for
//!   the README's commands; `test` (the VM suite `vagrant`): box, `vagrant
//!   up` of both VMs, rxe <-> rxe and xroce (host) <-> rxe cases, `vagrant
//!   destroy -f`.

use std::{os::unix::process::CommandExt, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

mod boxfile;
mod libvirt;
mod suite;

pub use boxfile::{add_box, pack_box};
pub use suite::suite;

use super::image::{self, vm_dir, Kernel};
use crate::util::{describe, is_root, output, run, step, workspace_root};
use libvirt::Libvirt;

#[derive(Args)]
pub struct VagrantArgs {
    #[command(subcommand)]
    cmd: VagrantCmd,
}

#[derive(Subcommand)]
enum VagrantCmd {
    /// Pack (or reuse) the vagrant-libvirt box from the VM root file system and `vagrant box add` it
    Box {
        /// Repack even if the cached box matches
        #[arg(long)]
        force: bool,
    },
    /// libvirtd in a namespace, then a shell (or COMMAND) in vagrant/; everything stops when it ends
    Shell {
        /// A command for bash -c instead of an interactive shell
        #[arg(trailing_var_arg = true)]
        command: Vec<String>,
    },
    /// The VM suite `vagrant`: box, vagrant up, interop cases, vagrant destroy
    Test,
}

/// The box's name in Vagrant (the Vagrantfile's default, XROCE_BOX).
pub const BOX_NAME: &str = "xroce/bookworm";
/// The private network's prefix (the Vagrantfile's XROCE_PRIVATE_PREFIX).
const PREFIX: &str = "192.168.77.";
/// xroce's side of the private network: a veth in the network's bridge.
const HOST_IFACE: &str = "xr0";
const HOST_IP: &str = "192.168.77.10";
const BRIDGE: &str = "xrvbr0";

pub fn run_cmd(args: &VagrantArgs) -> Result<()> {
    ensure_tools()?;
    match &args.cmd {
        VagrantCmd::Box { force } => {
            let b = pack_box(*force)?;
            add_box(&b)
        }
        VagrantCmd::Shell { command } => shell(command),
        VagrantCmd::Test => suite(),
    }
}

/// Debian's vagrant, vagrant-libvirt and libvirt, and the tools that pack
/// the box; installed if missing (as root).
fn ensure_tools() -> Result<()> {
    image::ensure_host_tools()?;
    let packages = [
        ("vagrant", "vagrant"),
        ("vagrant-libvirt", "vagrant-libvirt"),
        ("libvirtd", "libvirt-daemon-system"),
        ("libvirt-daemon-driver-qemu", "libvirt-daemon-driver-qemu"),
        ("dnsmasq", "dnsmasq-base"),
        ("qemu-img", "qemu-utils"),
        ("mkfs.ext4", "e2fsprogs"),
        ("rsync", "rsync"),
        ("unshare", "util-linux"),
    ];
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(_, pkg)| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
                .map(|s| s.contains("install ok installed"))
                .unwrap_or(false)
        })
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        eprintln!("vagrant: vagrant, vagrant-libvirt and libvirt present");
        return Ok(());
    }
    if !is_root() {
        bail!(
            "cargo xtask vagrant needs {} (run it as root: it installs them)",
            missing.join(" ")
        );
    }
    step(&format!("vagrant: installing {}", missing.join(" ")));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    // qemu-utils as the backport: bookworm's would conflict with the
    // backported qemu-system-x86 the VM suites use.
    let (bpo, plain): (Vec<&str>, Vec<&str>) = missing.iter().partition(|p| **p == "qemu-utils");
    for (list, backports) in [(plain, false), (bpo, true)] {
        if list.is_empty() {
            continue;
        }
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y", "-qq", "--no-install-recommends"])
            .env("DEBIAN_FRONTEND", "noninteractive");
        if backports {
            cmd.args(["-t", "bookworm-backports"]);
        }
        run(cmd.args(&list))?;
    }
    Ok(())
}

fn dir() -> PathBuf {
    workspace_root().join("target/vagrant")
}

fn vagrant_dir() -> PathBuf {
    workspace_root().join("vagrant")
}

/// Vagrant's insecure public key, as the vagrant package ships it.
fn insecure_key() -> Result<PathBuf> {
    let out = output(Command::new("dpkg").args(["-L", "vagrant"]))?;
    out.lines()
        .find(|l| l.ends_with("/keys/vagrant.pub"))
        .map(PathBuf::from)
        .context("the vagrant package ships no keys/vagrant.pub")
}

/// `cargo xtask vagrant shell [-- COMMAND]`.
fn shell(command: &[String]) -> Result<()> {
    let b = pack_box(false)?;
    add_box(&b)?;
    let lv = Libvirt::start()?;
    let mut c = if command.is_empty() {
        eprintln!(
            "vagrant: a shell in {} (network namespace {}): vagrant up, vagrant ssh rxe1, ...; \
             xroce's interface is {HOST_IFACE} ({HOST_IP}). Exit it to stop everything.",
            vagrant_dir().display(),
            lv.ns().name()
        );
        lv.command("bash")
    } else {
        let mut c = lv.command("bash");
        c.arg("-c").arg(command.join(" "));
        c
    };
    // SAFETY: prctl in the child before exec: the shell ends with xtask.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    eprintln!("+ {}", describe(&c));
    let st = c.status()?;
    drop(lv);
    if !st.success() {
        bail!("the shell exited {st}");
    }
    Ok(())
}
