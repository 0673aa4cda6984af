//! libvirtd and virtlogd in namespaces of their own (a network namespace,
//! and in it a private mount + PID namespace), killed by PID and deleted on
//! every exit path.

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{dir, vagrant_dir, BRIDGE, HOST_IFACE, HOST_IP, PREFIX};
use crate::util::{is_root, output, run, succeeds};

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
