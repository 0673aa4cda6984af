//! The box: the xtask VMs' root file system plus what Vagrant expects,
//! packed as a vagrant-libvirt .box, cached under target/vagrant/ and
//! `vagrant box add`ed as [`super::BOX_NAME`].

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context, Result};

use super::{dir, image, insecure_key, vm_dir, Kernel, BOX_NAME};
use crate::util::{is_root, output, run, step};

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
const BOX_VAGRANTFILE: &str = r#"# Written by cargo xtask vagrant box (xtask/src/vm/vagrant/boxfile.rs).
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
