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

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use super::image::{self, vm_dir, Kernel};
use crate::util::{cargo, describe, is_root, output, run, step, succeeds, workspace_root};

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

/// Packages the box adds to the VM root file system: what Vagrant needs
/// from a guest (init, sshd, sudo, ifupdown + DHCP for eth0, rsync for the
/// synced folder) and the initramfs tools the kernel package runs.
const BOX_PACKAGES: &str =
    "systemd-sysv udev openssh-server sudo ifupdown isc-dhcp-client rsync initramfs-tools";

/// Runs in a private mount namespace: installs the packages and the kernel
/// (/tmp/kernel.deb) in the tree ($1).
const BOX_INSTALL: &str = r#"set -eu
T=$1
mount -t proc proc "$T/proc"
mount --rbind /dev "$T/dev"
mount -t sysfs sys "$T/sys"
cp /etc/resolv.conf "$T/etc/resolv.conf"
chroot "$T" /bin/sh -ec "export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $2 /tmp/kernel.deb
apt-get clean"
"#;

/// Configures the tree ($1) as a Vagrant box; $2 is Vagrant's insecure key.
const BOX_CONFIG: &str = r#"set -eu
T=$1
# The xtask VMs' initramfs agent: not used by a box.
rm -f "$T/init" "$T/xroce-agent" "$T/tmp/kernel.deb" "$T/etc/resolv.conf"
chroot "$T" /bin/sh -ec '
id vagrant >/dev/null 2>&1 || useradd -m -s /bin/bash -G sudo vagrant
echo vagrant:vagrant | chpasswd
install -d -m 700 -o vagrant -g vagrant /home/vagrant/.ssh'
install -m 600 "$2" "$T/home/vagrant/.ssh/authorized_keys"
chroot "$T" chown vagrant:vagrant /home/vagrant/.ssh/authorized_keys
echo 'vagrant ALL=(ALL) NOPASSWD:ALL' >"$T/etc/sudoers.d/vagrant"
chmod 440 "$T/etc/sudoers.d/vagrant"
echo 'UseDNS no' >"$T/etc/ssh/sshd_config.d/vagrant.conf"
cat >"$T/etc/network/interfaces" <<EOF
source /etc/network/interfaces.d/*
auto lo
iface lo inet loopback
# The management network: vagrant-libvirt's dnsmasq answers.
auto eth0
iface eth0 inet dhcp
EOF
echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' >"$T/etc/fstab"
echo xroce-box >"$T/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 xroce-box\n' >"$T/etc/hosts"
# Every VM makes its own host keys on first boot.
rm -f "$T"/etc/ssh/ssh_host_*
cat >"$T/etc/systemd/system/ssh-hostkeys.service" <<EOF
[Unit]
Description=SSH host keys, made on first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A
[Install]
WantedBy=ssh.service
EOF
chroot "$T" systemctl enable ssh-hostkeys.service
# No network beyond the namespace: apt's timers would only time out.
chroot "$T" systemctl mask apt-daily.timer apt-daily-upgrade.timer
"#;

/// The box's own Vagrantfile: boot the kernel and initrd shipped beside
/// box.img (libvirt direct kernel boot; the disk has no boot loader).
const BOX_VAGRANTFILE: &str = r#"# Written by cargo xtask vagrant box (xtask/src/vm/vagrant.rs).
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |lv|
    lv.kernel = File.join(__dir__, "vmlinuz")
    lv.initrd = File.join(__dir__, "initrd.img")
    lv.cmd_line = "root=/dev/vda rw console=ttyS0 net.ifnames=0"
  end
end
"#;

/// The kernel .deb the matrix's 6.1 kernel was prepared from (downloaded
/// into target/vm/debs if it is not there).
fn kernel_deb() -> Result<PathBuf> {
    image::kernel(Kernel::Bookworm)?;
    let chosen = vm_dir().join("kernels/6.1.package");
    let s = fs::read_to_string(&chosen).with_context(|| chosen.display().to_string())?;
    let (name, ver) = s.trim().split_once('=').context("bad 6.1.package")?;
    let debs = vm_dir().join("debs");
    fs::create_dir_all(&debs)?;
    let find = || {
        fs::read_dir(&debs).ok().and_then(|d| {
            d.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{name}_"))
            })
        })
    };
    if let Some(d) = find() {
        return Ok(d);
    }
    run(Command::new("apt-get")
        .args(["download", &format!("{name}={ver}")])
        .current_dir(&debs))?;
    find().context("apt-get download left no kernel .deb")
}

fn sha256_file_list(parts: &[&[u8]]) -> Result<String> {
    let tmp = dir().join(format!("hash-{}.in", std::process::id()));
    fs::write(&tmp, parts.concat())?;
    let out = output(Command::new("sha256sum").arg(&tmp));
    let _ = fs::remove_file(&tmp);
    Ok(out?[..16].to_string())
}

/// The cached box file (packed if missing or `force`).
pub fn pack_box(force: bool) -> Result<PathBuf> {
    if !is_root() {
        bail!("packing the box needs root (chroot, debootstrap)");
    }
    fs::create_dir_all(dir())?;
    let rootfs = image::rootfs(false)?;
    let deb = kernel_deb()?;
    let key = insecure_key()?;
    let hash = sha256_file_list(&[
        rootfs.file_name().unwrap().as_encoded_bytes(),
        deb.file_name().unwrap().as_encoded_bytes(),
        BOX_PACKAGES.as_bytes(),
        BOX_INSTALL.as_bytes(),
        BOX_CONFIG.as_bytes(),
        BOX_VAGRANTFILE.as_bytes(),
        &fs::read(&key)?,
    ])?;
    let out = dir().join(format!("xroce-bookworm-{hash}.box"));
    if out.exists() && !force {
        eprintln!("vagrant: box cached ({})", out.display());
        return Ok(out);
    }
    let t = Instant::now();
    step(&format!("vagrant: packing the box {}", out.display()));
    let work = dir().join(format!("box-{hash}.tmp"));
    let _ = fs::remove_dir_all(&work);
    let tree = work.join("tree");
    let content = work.join("box");
    fs::create_dir_all(&tree)?;
    fs::create_dir_all(&content)?;
    let r = (|| -> Result<()> {
        run(Command::new("sh").arg("-c").arg(format!(
            "cd '{}' && cpio -idm --quiet < '{}'",
            tree.display(),
            rootfs.display()
        )))?;
        fs::copy(&deb, tree.join("tmp/kernel.deb"))?;
        // Mounts in a private mount namespace vanish with it.
        run(Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "bash",
                "-c",
                BOX_INSTALL,
                "box-install",
            ])
            .arg(&tree)
            .arg(BOX_PACKAGES))?;
        run(Command::new("bash")
            .args(["-c", BOX_CONFIG, "box-config"])
            .arg(&tree)
            .arg(&key))?;
        let boot = |prefix: &str| -> Result<PathBuf> {
            fs::read_dir(tree.join("boot"))?
                .flatten()
                .map(|e| e.path())
                .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
                .with_context(|| format!("no /boot/{prefix}* in the box"))
        };
        fs::copy(boot("vmlinuz-")?, content.join("vmlinuz"))?;
        fs::copy(boot("initrd.img-")?, content.join("initrd.img"))?;
        let raw = work.join("box.raw");
        run(Command::new("truncate").args(["-s", "4G"]).arg(&raw))?;
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "xroce-box", "-d"])
            .arg(&tree)
            .arg(&raw))?;
        run(Command::new("qemu-img")
            .args(["convert", "-c", "-O", "qcow2"])
            .arg(&raw)
            .arg(content.join("box.img")))?;
        fs::write(
            content.join("metadata.json"),
            "{\"provider\": \"libvirt\", \"format\": \"qcow2\", \"virtual_size\": 4}\n",
        )?;
        fs::write(content.join("Vagrantfile"), BOX_VAGRANTFILE)?;
        // Which box this is, for add_box's check.
        fs::write(content.join("xroce-box-id"), &hash)?;
        let part = out.with_extension("box.part");
        run(Command::new("tar")
            .arg("-C")
            .arg(&content)
            .arg("-cf")
            .arg(&part)
            .args([
                "metadata.json",
                "Vagrantfile",
                "xroce-box-id",
                "box.img",
                "vmlinuz",
                "initrd.img",
            ]))?;
        fs::rename(&part, &out)?;
        Ok(())
    })();
    let _ = fs::remove_dir_all(&work);
    r?;
    for e in fs::read_dir(dir())?.flatten() {
        let p = e.path();
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        if n.starts_with("xroce-bookworm-") && p != out {
            eprintln!("vagrant: removing stale {}", p.display());
            let _ = fs::remove_file(&p);
        }
    }
    eprintln!(
        "vagrant: box packed in {:.0?} ({} MiB)",
        t.elapsed(),
        fs::metadata(&out)?.len() >> 20
    );
    Ok(out)
}

/// `vagrant box add --force --name xroce/bookworm BOX`, unless that very
/// box (its xroce-box-id) is installed already.
pub fn add_box(file: &Path) -> Result<()> {
    let hash = file
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("xroce-bookworm-")
        .to_string();
    let home = std::env::var_os("VAGRANT_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".vagrant.d")
        });
    let id = home
        .join("boxes")
        .join(BOX_NAME.replace('/', "-VAGRANTSLASH-"))
        .join("0/libvirt/xroce-box-id");
    if fs::read_to_string(&id).is_ok_and(|s| s.trim() == hash) {
        eprintln!("vagrant: box {BOX_NAME} is this box ({hash})");
        return Ok(());
    }
    run(Command::new("vagrant")
        .args(["box", "add", "--force", "--name", BOX_NAME])
        .arg(file))
}

/// The PID of the namespaces' holder (unshare), for the Ctrl-C handler.
static HOLDER: Mutex<Option<u32>> = Mutex::new(None);

/// The init of the private PID + mount namespace (in the network
/// namespace): tmpfs over libvirt's state, /etc/libvirt from $1, a sysfs
/// of this network namespace, then virtlogd and libvirtd, logging to $2.
const INNER: &str = r#"set -eu
mount --make-rprivate /
for d in /run /var/lib/libvirt /var/log/libvirt /var/cache/libvirt; do
    mount -t tmpfs -o mode=0755 tmpfs "$d"
done
mkdir -p /run/libvirt /var/lib/libvirt/images /var/lib/libvirt/dnsmasq
mount -t sysfs sysfs /sys
mount --bind "$1" /etc/libvirt
virtlogd -f /etc/libvirt/virtlogd.conf >>"$2/virtlogd.log" 2>&1 &
libvirtd -f /etc/libvirt/libvirtd.conf >>"$2/libvirtd.log" 2>&1 &
wait
"#;

const LIBVIRTD_CONF: &str = r#"# cargo xtask vagrant: root only, no polkit (no D-Bus here).
unix_sock_group = "root"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:stderr"
"#;

/// qemu as root without cgroups, a private /dev or a security driver: none
/// of them work in this container, and the namespaces are the isolation.
const QEMU_CONF: &str = r#"# cargo xtask vagrant
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
"#;

/// libvirtd (and virtlogd) in namespaces of their own; see the module doc.
pub struct Libvirt {
    netns: Option<xroce_netns::Netns>,
    holder: Child,
    init: u32,
    pub uri: String,
    work: PathBuf,
    pub logs: PathBuf,
}

impl Libvirt {
    pub fn start() -> Result<Libvirt> {
        if !is_root() {
            bail!("cargo xtask vagrant runs libvirtd and makes namespaces: run it as root");
        }
        let tag = format!("xrvg-{}", std::process::id());
        remove_stale();
        xroce_netns::delete_on_interrupt(|| {
            eprintln!("\nvagrant: interrupted: stopping libvirtd's namespace");
            if let Some(pid) = HOLDER.lock().ok().and_then(|h| *h) {
                // SAFETY: SIGKILL to the unshare we spawned; its
                // --kill-child takes the whole PID namespace with it.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        });
        let netns = xroce_netns::Netns::create(tag.clone())?;
        let work = dir().join(format!("run-{}", std::process::id()));
        let _ = fs::remove_dir_all(&work);
        let conf = work.join("etc-libvirt");
        let logs = work.join("logs");
        fs::create_dir_all(&logs)?;
        fs::create_dir_all(&conf)?;
        // The package's configuration, minus its default network (it
        // would autostart with NAT), with ours for the daemon and qemu.
        run(Command::new("cp")
            .arg("-a")
            .arg("/etc/libvirt/.")
            .arg(&conf))?;
        let _ = fs::remove_dir_all(conf.join("qemu/networks"));
        fs::create_dir_all(conf.join("qemu/networks/autostart"))?;
        fs::write(conf.join("libvirtd.conf"), LIBVIRTD_CONF)?;
        fs::write(conf.join("qemu.conf"), QEMU_CONF)?;
        let mut cmd = netns.command("unshare");
        cmd.args([
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "bash",
            "-c",
            INNER,
            "xroce-libvirt",
        ])
        .arg(&conf)
        .arg(&logs)
        .stdin(Stdio::null())
        .stdout(fs::File::create(logs.join("init.log"))?)
        .stderr(fs::File::create(logs.join("init.err"))?);
        // SAFETY: prctl in the child before exec; if xtask dies (even by
        // SIGKILL) unshare gets SIGKILL and its --kill-child ends the
        // PID namespace, libvirtd and qemu included.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        eprintln!(
            "vagrant: starting virtlogd and libvirtd in network namespace {tag} (private mount and PID namespaces; state on tmpfs; logs in {})",
            logs.display()
        );
        let holder = cmd.spawn().context("starting unshare")?;
        *HOLDER.lock().unwrap() = Some(holder.id());
        let mut lv = Libvirt {
            netns: Some(netns),
            holder,
            init: 0,
            uri: String::new(),
            work,
            logs,
        };
        // nsenter execs unshare, which forks the namespace's init.
        let t = Instant::now();
        while lv.init == 0 {
            let children =
                fs::read_to_string(format!("/proc/{0}/task/{0}/children", lv.holder.id()))
                    .unwrap_or_default();
            lv.init = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            lv.check_alive()?;
            if t.elapsed() > Duration::from_secs(10) {
                bail!("unshare started no init in 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        lv.uri = format!(
            "qemu:///system?socket=/proc/{}/root/run/libvirt/libvirt-sock",
            lv.init
        );
        while !succeeds(&mut lv.virsh(&["version"])) {
            lv.check_alive()?;
            if t.elapsed() > Duration::from_secs(30) {
                bail!(
                    "libvirtd did not answer in 30 s: {}",
                    tail(&lv.logs.join("libvirtd.log"))
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!(
            "vagrant: libvirtd up in {:.1?} (init PID {}, LIBVIRT_DEFAULT_URI={})",
            t.elapsed(),
            lv.init,
            lv.uri
        );
        lv.private_network()?;
        Ok(lv)
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(st) = self.holder.try_wait()? {
            bail!(
                "libvirt's namespace ended ({st}): {} {}",
                tail(&self.logs.join("init.err")),
                tail(&self.logs.join("libvirtd.log"))
            );
        }
        Ok(())
    }

    pub fn ns(&self) -> &xroce_netns::Netns {
        self.netns.as_ref().unwrap()
    }

    /// `virsh ARGS` against this libvirtd.
    pub fn virsh(&self, args: &[&str]) -> Command {
        let mut c = Command::new("virsh");
        c.args(["-q", "-c", &self.uri]).args(args);
        c
    }

    /// A command in the network namespace, in vagrant/, talking to this
    /// libvirtd.
    pub fn command(&self, program: &str) -> Command {
        let mut c = self.ns().command(program);
        c.current_dir(vagrant_dir())
            .env("LIBVIRT_DEFAULT_URI", &self.uri)
            .env("VAGRANT_DEFAULT_PROVIDER", "libvirt")
            .env("XROCE_HOST_IFACE", HOST_IFACE)
            .env("XROCE_HOST_IP", HOST_IP);
        c
    }

    /// The Vagrantfile's private network (xroce-rxe, isolated, MTU 4200),
    /// defined before `vagrant up` so that its bridge has a known name and
    /// xroce's veth in it: xr0 (192.168.77.10) for the host's side.
    fn private_network(&self) -> Result<()> {
        let xml = self.work.join("xroce-rxe.xml");
        fs::write(
            &xml,
            format!(
                "<network>\n  <name>xroce-rxe</name>\n  <bridge name='{BRIDGE}' stp='off' delay='0'/>\n  \
                 <mtu size='4200'/>\n  <dns enable='no'/>\n  <ip address='{PREFIX}1' netmask='255.255.255.0'/>\n</network>\n"
            ),
        )?;
        run(&mut self.virsh(&["net-create", &xml.to_string_lossy()]))?;
        let ns = self.ns();
        // Only xr0 answers ARP for its address (the bridge, in the same
        // namespace, would too, and RoCE would then miss xroce's XDP).
        run(ns
            .command("sysctl")
            .args(["-q", "-w", "net.ipv4.conf.all.arp_ignore=1"]))?;
        let end = |iface| xroce_netns::VethEnd {
            netns: ns.name(),
            iface,
        };
        xroce_netns::add_veth(end(HOST_IFACE), end("xrb"), 4200)?;
        ns.ip(&["link", "set", "xrb", "master", BRIDGE, "up"])?;
        ns.configure(HOST_IFACE, 4200, HOST_IP.parse()?, 24)?;
        // One route to the VMs, through xr0: programs under `xroce run`
        // find their device from the route (rdma_cm's address resolution),
        // and the bridge's own address serves nothing (no DHCP, no DNS).
        ns.ip(&["route", "del", &format!("{PREFIX}0/24"), "dev", BRIDGE])?;
        eprintln!(
            "vagrant: network xroce-rxe: bridge {BRIDGE} {PREFIX}1/24 (isolated, MTU 4200), {HOST_IFACE} {HOST_IP} for xroce (the route to the VMs)"
        );
        Ok(())
    }

    /// Domains libvirt still has.
    pub fn domains(&self) -> Vec<String> {
        output(&mut self.virsh(&["list", "--all", "--name"]))
            .map(|s| {
                s.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Libvirt {
    fn drop(&mut self) {
        // qemu first, politely; then the PID namespace goes with its init.
        for d in self.domains() {
            eprintln!("vagrant: destroying leftover domain {d}");
            let _ = self.virsh(&["destroy", &d]).output();
        }
        eprintln!(
            "vagrant: stopping libvirtd's namespaces (SIGKILL to unshare {}, init {})",
            self.holder.id(),
            self.init
        );
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        if let Ok(mut h) = HOLDER.lock() {
            *h = None;
        }
        // The init is gone once /proc says so (the kernel reaps the rest).
        let t = Instant::now();
        while self.init != 0
            && Path::new(&format!("/proc/{}", self.init)).exists()
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(self.netns.take());
        // Vagrant's record of machines that died with libvirtd.
        let _ = fs::remove_dir_all(vagrant_dir().join(".vagrant"));
        // Keep the logs of the last run only.
        let last = dir().join("logs-last");
        let _ = fs::remove_dir_all(&last);
        let _ = fs::rename(&self.logs, &last);
        let _ = fs::remove_dir_all(&self.work);
        eprintln!(
            "vagrant: namespaces deleted; libvirt logs in {}",
            last.display()
        );
    }
}

/// What a run killed by SIGKILL leaves (its PID namespace dies with it,
/// see PR_SET_PDEATHSIG above): the named network namespace
/// /run/netns/xrvg-<pid> and target/vagrant/run-<pid>, whose <pid> is gone.
fn remove_stale() {
    let dead = |name: &str, prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    for e in fs::read_dir("/run/netns").into_iter().flatten().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if dead(&n, "xrvg-") {
            eprintln!("vagrant: deleting network namespace {n} (left by a killed run)");
            xroce_netns::delete(&n);
        }
    }
    for e in fs::read_dir(dir()).into_iter().flatten().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if dead(&n, "run-") {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn tail(path: &Path) -> String {
    let s = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
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

/// A command run to completion within `limit` (killed by PID after it).
fn run_timed(mut cmd: Command, limit: Duration) -> Result<(bool, String)> {
    let what = describe(&cmd);
    eprintln!("+ {what}");
    let log = dir().join(format!("cmd-{}.log", std::process::id()));
    let f = fs::File::create(&log)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let t = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if t.elapsed() > limit {
            kill_group(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = fs::read_to_string(&log).unwrap_or_default();
    let _ = fs::remove_file(&log);
    for l in text.lines().filter(|l| !l.contains("Progress:")) {
        eprintln!("  | {l}");
    }
    match st {
        None => bail!("`{what}` did not finish in {limit:.0?}"),
        Some(st) => Ok((st.success(), text)),
    }
}

/// A background command (a server): killed by PID on drop.
struct Bg {
    child: Child,
    log: PathBuf,
}

impl Bg {
    fn spawn(mut cmd: Command, log: PathBuf) -> Result<Bg> {
        eprintln!("+ {} &", describe(&cmd));
        let f = fs::File::create(&log)?;
        // Its own process group: `vagrant ssh` runs ssh as a child,
        // which must go too.
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0)
            .spawn()?;
        Ok(Bg { child, log })
    }

    /// Waits up to `limit`; its success and output.
    fn finish(mut self, limit: Duration) -> Result<(bool, String)> {
        let t = Instant::now();
        let st = loop {
            if let Some(st) = self.child.try_wait()? {
                break Some(st);
            }
            if t.elapsed() > limit {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        for l in text.lines() {
            eprintln!("  |bg| {l}");
        }
        match st {
            None => bail!(
                "did not finish in {limit:.0?}: {}",
                text.lines().last().unwrap_or("")
            ),
            Some(st) => Ok((st.success(), text)),
        }
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

/// SIGKILL to the process group `child` leads (it and what it started,
/// e.g. vagrant's ssh), then reaps it.
fn kill_group(child: &mut Child) {
    // Only while it is unreaped: its PID (= PGID) is still ours then.
    if child.try_wait().ok().flatten().is_none() {
        // SAFETY: a signal to the group of a child we spawned with
        // process_group(0) (its PGID is its PID).
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        let _ = child.wait();
    }
}

/// `vagrant ssh NAME -c SCRIPT`.
fn ssh(lv: &Libvirt, name: &str, script: &str) -> Command {
    let mut c = lv.command("vagrant");
    c.args(["ssh", name, "-c", script]);
    c
}

/// ibv_rc_pingpong's result lines ("819200 bytes in ...", "100 iters in ...").
fn pingpong_ok(who: &str, ok: bool, out: &str, bytes: u64, iters: u32) -> Result<String> {
    let want_bytes = format!("{bytes} bytes in");
    let want_iters = format!("{iters} iters in");
    if !ok {
        bail!("{who} failed: {}", out.lines().last().unwrap_or(""));
    }
    let line = out
        .lines()
        .find(|l| l.contains(&want_bytes))
        .with_context(|| format!("{who}: no `{want_bytes}` line"))?;
    if !out.contains(&want_iters) {
        bail!("{who}: no `{want_iters}` line");
    }
    Ok(line.trim().to_string())
}

/// The suite's cases (XROCE_VM_ONLY filters by substring, as the other
/// VM suites; `vagrant` selects them all).
fn wanted(case: &str) -> bool {
    std::env::var("XROCE_VM_ONLY").map_or(true, |w| case.contains(&w) || w == "vagrant")
}

/// The cases after `vagrant up`.
const CASES: [&str; 4] = [
    "vagrant rxe<->rxe ibv_rc_pingpong -c",
    "vagrant rxe<->rxe rping -V (data verified)",
    "vagrant xroce (host) server <-> rxe ibv_rc_pingpong -c",
    "vagrant xroce run -- rping -V (host) <-> rxe rping (data verified)",
];

const PP: &str = "-m 1024 -s 4096 -n 100";
/// rping: 20 verified round trips of 4096 bytes.
const RPING: &str = "-C 20 -V -S 4096";
const RPING_COUNT: usize = 20;

/// The client's count of verified pings (`grep -c 'ping data:'` of -v).
fn rping_ok(out: &str) -> Result<String> {
    let n: usize = out
        .lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .context("no count of pings")?;
    if n != RPING_COUNT {
        bail!("rping verified {n} pings, not {RPING_COUNT}");
    }
    Ok(format!("{n} pings of 4096 bytes verified by rping -V"))
}
const PP_BYTES: u64 = 2 * 4096 * 100;

/// rxe1 serves, rxe2 connects (retrying until the server listens).
fn rxe_pair(lv: &Libvirt, server: &str, client: &str, limit: Duration) -> Result<(String, String)> {
    let log = dir().join("server.log");
    let srv = Bg::spawn(ssh(lv, "rxe1", &format!("timeout 150 {server}")), log)?;
    let (ok, cout) = run_timed(
        ssh(
            lv,
            "rxe2",
            &format!(
                "for i in $(seq 1 60); do timeout 60 {client} && exit 0; sleep 0.5; done; exit 1"
            ),
        ),
        limit,
    )?;
    if !ok {
        bail!("client failed: {}", cout.lines().last().unwrap_or(""));
    }
    let (sok, sout) = srv.finish(Duration::from_secs(60))?;
    if !sok {
        bail!("server failed: {}", sout.lines().last().unwrap_or(""));
    }
    Ok((sout, cout))
}

/// The VM suite `vagrant`: pack the box (cached), `vagrant up` both VMs,
/// run the interop cases with their results asserted, `vagrant destroy -f`.
pub fn suite() -> Result<()> {
    let t0 = Instant::now();
    step("vagrant: the Vagrantfile's two VMs under vagrant-libvirt");
    if !CASES.iter().any(|c| wanted(c)) {
        eprintln!("vagrant: XROCE_VM_ONLY selects none of this suite's cases; not run");
        return Ok(());
    }
    ensure_tools()?;
    let b = pack_box(false)?;
    add_box(&b)?;
    cargo(&["build", "--release", "-p", "xroce-cli", "--bin", "xroce"])?;
    // The drop-in libibverbs and librdmacm beside it, for `xroce run`.
    cargo(&[
        "build",
        "--release",
        "-p",
        "xroce-ibverbs",
        "-p",
        "xroce-rdmacm",
    ])?;
    let xroce = workspace_root().join("target/release/xroce");
    let x = xroce.to_string_lossy().into_owned();
    let lv = Libvirt::start()?;
    let mut results: Vec<(String, Result<String>, f64)> = Vec::new();
    let mut record = |name: &str, t: Instant, r: Result<String>| {
        let secs = t.elapsed().as_secs_f64();
        match &r {
            Ok(n) => eprintln!("vagrant: PASS {name} ({secs:.1} s) {n}"),
            Err(e) => eprintln!("vagrant: FAIL {name} ({secs:.1} s) {e:#}"),
        }
        results.push((name.to_string(), r, secs));
    };
    let t = Instant::now();
    let up = run_timed(
        {
            let mut c = lv.command("vagrant");
            c.args(["up", "--provider=libvirt"]);
            c
        },
        Duration::from_secs(1200),
    )
    .and_then(|(ok, out)| {
        if !ok {
            bail!("vagrant up failed: {}", out.lines().last().unwrap_or(""));
        }
        // provision.sh ends with `rdma link show`: rxe0 ACTIVE on eth1 in each.
        let active = out
            .lines()
            .filter(|l| l.contains("link rxe0/1 state ACTIVE") && l.contains("netdev eth1"))
            .count();
        if active != 2 {
            bail!("provisioning brought rxe0 up in {active} VMs, not 2");
        }
        Ok(format!(
            "rxe1 {PREFIX}11, rxe2 {PREFIX}12, rxe0 ACTIVE in both"
        ))
    });
    let up_ok = up.is_ok();
    record("vagrant up (rxe1, rxe2)", t, up);
    if up_ok {
        let name = CASES[0];
        if wanted(name) {
            let t = Instant::now();
            let cmd = format!("ibv_rc_pingpong -d rxe0 -g 1 {PP} -c");
            let r = rxe_pair(
                &lv,
                &cmd,
                &format!("{cmd} {PREFIX}11"),
                Duration::from_secs(180),
            )
            .and_then(|(s, c)| {
                pingpong_ok("rxe1", true, &s, PP_BYTES, 100)?;
                pingpong_ok("rxe2", true, &c, PP_BYTES, 100)
            });
            record(name, t, r);
        }
        let name = CASES[1];
        if wanted(name) {
            let t = Instant::now();
            let r = rxe_pair(
                &lv,
                &format!("rping -s -a {PREFIX}11 {RPING}"),
                &format!(
                    "{}; rping -c -a {PREFIX}11 {RPING} -v | grep -c 'ping data: rdma-ping-'",
                    "set -o pipefail"
                ),
                Duration::from_secs(180),
            )
            .and_then(|(_, c)| rping_ok(&c));
            record(name, t, r);
        }
        let name = CASES[2];
        if wanted(name) {
            let t = Instant::now();
            let r = (|| {
                let mut host = lv.command(&x);
                // -c on both sides: xroce checks every byte rdma-core's client sent.
                host.args(["pingpong", "-d", HOST_IFACE, "--backend", "afxdp", "-c"])
                    .args(PP.split(' '));
                let srv = Bg::spawn(host, dir().join("xroce.log"))?;
                let (ok, cout) = run_timed(
                    ssh(
                        &lv,
                        "rxe2",
                        &format!(
                            "for i in $(seq 1 60); do timeout 60 ibv_rc_pingpong -d rxe0 -g 1 {PP} -c {HOST_IP} && exit 0; sleep 0.5; done; exit 1"
                        ),
                    ),
                    Duration::from_secs(180),
                )?;
                let (hok, hout) = srv.finish(Duration::from_secs(60))?;
                let _ = lv
                    .command(&x)
                    .args(["detach", "--iface", HOST_IFACE])
                    .output();
                let c = pingpong_ok("rxe2", ok, &cout, PP_BYTES, 100)?;
                if !hok {
                    bail!("xroce failed: {}", hout.lines().last().unwrap_or(""));
                }
                let h = hout
                    .lines()
                    .find(|l| l.contains("bytes in"))
                    .context("xroce printed no `bytes in` line")?;
                Ok(format!("xroce: {}; rxe: {c}", h.trim()))
            })();
            record(name, t, r);
        }
        let name = CASES[3];
        if wanted(name) {
            let t = Instant::now();
            let r = (|| {
                let srv = Bg::spawn(
                    ssh(
                        &lv,
                        "rxe1",
                        &format!("timeout 150 rping -s -a {PREFIX}11 {RPING}"),
                    ),
                    dir().join("server.log"),
                )?;
                // rping's own -V compares every byte it reads back; the
                // drop-in librdmacm and libibverbs carry it over xr0.
                let mut host = lv.command("bash");
                host.arg("-c").arg(format!(
                    "set -o pipefail; for i in $(seq 1 30); do {x} run --iface {HOST_IFACE} --backend afxdp -- \
                     rping -c -a {PREFIX}11 {RPING} -v >/tmp/xroce-vagrant-rping.$$ 2>&1 && \
                     {{ grep -c 'ping data: rdma-ping-' /tmp/xroce-vagrant-rping.$$; rm -f /tmp/xroce-vagrant-rping.$$; exit 0; }}; \
                     sleep 1; done; tail -5 /tmp/xroce-vagrant-rping.$$; rm -f /tmp/xroce-vagrant-rping.$$; exit 1"
                ));
                let (ok, hout) = run_timed(host, Duration::from_secs(180))?;
                let _ = lv
                    .command(&x)
                    .args(["detach", "--iface", HOST_IFACE])
                    .output();
                let (sok, sout) = srv.finish(Duration::from_secs(60))?;
                if !ok {
                    bail!(
                        "xroce run rping failed: {}",
                        hout.lines().last().unwrap_or("")
                    );
                }
                if !sok {
                    bail!(
                        "rxe1's rping -s failed: {}",
                        sout.lines().last().unwrap_or("")
                    );
                }
                rping_ok(&hout)
            })();
            record(name, t, r);
        }
    }
    // vagrant destroy -f: both domains go, libvirt has none left.
    let t = Instant::now();
    let destroy = run_timed(
        {
            let mut c = lv.command("vagrant");
            c.args(["destroy", "-f"]);
            c
        },
        Duration::from_secs(300),
    )
    .and_then(|(ok, out)| {
        if !ok {
            bail!(
                "vagrant destroy -f failed: {}",
                out.lines().last().unwrap_or("")
            );
        }
        let left = lv.domains();
        if !left.is_empty() {
            bail!("libvirt still has domains {left:?}");
        }
        Ok("no domains left".to_string())
    });
    record("vagrant destroy -f", t, destroy);
    drop(lv);
    let mut table = String::from(
        "\nvagrant (vagrant-libvirt, TCG)\n| case | result | time | note |\n|---|---|---|---|\n",
    );
    for (name, r, secs) in &results {
        let (res, note) = match r {
            Ok(n) => ("pass", n.clone()),
            Err(e) => (
                "FAIL",
                format!("{e:#}").lines().next().unwrap_or("").to_string(),
            ),
        };
        table.push_str(&format!(
            "| {name} | {res} | {secs:.1} s | {} |\n",
            note.replace('|', "/")
        ));
    }
    eprint!("{table}");
    let art = super::suites::artifacts_dir();
    fs::create_dir_all(&art)?;
    fs::write(art.join("vagrant.md"), &table)?;
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, r, _)| r.is_err())
        .map(|(n, _, _)| n.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("vagrant: failed: {}", failed.join(", "));
    }
    eprintln!("vagrant: suite passed in {:.0?}", t0.elapsed());
    Ok(())
}
