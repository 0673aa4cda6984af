//! A network namespace for VMs and xroce, qemu inside it, and the agent
//! protocol on the guest's second serial port.
//!
//! Namespace layout (all made here, deleted on drop and on Ctrl-C):
//!
//! ```text
//!   [ns xrvm-<tag>]  br0 ── tap0 ── VM 0 eth0 10.77.0.10
//!                        ├─ tap1 ── VM 1 eth0 10.77.0.11
//!                        └─ xrb ─ veth ─ xr0 10.77.0.1  (xroce, tcpdump)
//! ```

use std::{
    fs,
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::image::{vm_dir, KernelFiles};
use crate::util::describe;

/// qemu and background PIDs alive now, for the Ctrl-C handler (which
/// then deletes the namespaces: xroce-netns keeps that list).
static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn install_ctrlc() {
    xroce_netns::delete_on_interrupt(|| {
        eprintln!("\nvm: interrupted: stopping VMs, deleting namespaces");
        let pids = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
        for pid in pids {
            // SAFETY: kill on a PID we spawned (qemu), no memory involved.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(200));
    });
}

pub const HOST_IP: &str = "10.77.0.1";
pub const HOST_IFACE: &str = "xr0";

pub fn vm_ip(index: usize) -> String {
    format!("10.77.0.{}", 10 + index)
}

pub struct Netns {
    pub name: String,
    pub mtu: u32,
    /// Deleted on drop (with everything in it) and on Ctrl-C.
    netns: xroce_netns::Netns,
}

impl Netns {
    /// A namespace with a bridge, `taps` tap devices and the xr0 veth.
    pub fn create(taps: usize, mtu: u32) -> Result<Netns> {
        install_ctrlc();
        let name = format!("xrvm-{}-{}", std::process::id(), next_id());
        let netns = xroce_netns::Netns::create(name.clone())?;
        let ns = Netns { name, mtu, netns };
        let m = mtu.to_string();
        // Only xr0 may answer ARP for 10.77.0.1. With the default
        // arp_ignore=0, br0 (same namespace, no address) answers too, with
        // its own MAC: a guest that caches it sends RoCE to br0, where the
        // kernel drops it and xroce's XDP program on xr0 never sees it (rxe
        // retransmitted for ~5 s, until its neighbour entry was re-probed).
        crate::util::run(
            Command::new("ip")
                .args(["netns", "exec", &ns.name, "sysctl", "-q", "-w"])
                .args(["net.ipv4.conf.all.arp_ignore=1"]),
        )?;
        ns.ip(&["link", "add", "br0", "mtu", &m, "type", "bridge"])?;
        for i in 0..taps {
            let tap = format!("tap{i}");
            ns.ip(&["tuntap", "add", &tap, "mode", "tap"])?;
            ns.ip(&["link", "set", &tap, "mtu", &m, "master", "br0", "up"])?;
        }
        let end = |iface| xroce_netns::VethEnd {
            netns: &ns.name,
            iface,
        };
        xroce_netns::add_veth(end(HOST_IFACE), end("xrb"), mtu)?;
        ns.ip(&["link", "set", "xrb", "master", "br0", "up"])?;
        ns.netns.configure(HOST_IFACE, mtu, HOST_IP.parse()?, 24)?;
        ns.ip(&["link", "set", "br0", "up"])?;
        eprintln!(
            "vm: namespace {} (br0, {taps} tap, {HOST_IFACE} {HOST_IP}, MTU {mtu})",
            ns.name
        );
        Ok(ns)
    }

    pub fn ip(&self, args: &[&str]) -> Result<()> {
        Ok(self.netns.ip(args)?)
    }

    /// `nsenter --net=/run/netns/NS <argv>`: in the namespace's network but
    /// the host's mounts (`ip netns exec` mounts a fresh /sys, which hides
    /// the bpffs where xroce pins its maps between commands).
    pub fn enter(&self, argv: &[&str]) -> Command {
        let mut c = self.netns.command(argv[0]);
        c.args(&argv[1..]);
        c
    }

    /// `ip netns exec NS <argv>`.
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(argv);
        c
    }
}

fn next_id() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// How qemu accelerates: KVM only if asked (XROCE_VM_ACCEL=kvm) or if a
/// probe guest ran under it; /dev/kvm on this machine kind opens but cannot
/// run guests, so TCG is the default.
fn accel() -> String {
    if let Ok(a) = std::env::var("XROCE_VM_ACCEL") {
        return a;
    }
    "tcg".into()
}

pub struct Vm {
    pub name: String,
    child: Child,
    pid: u32,
    agent: UnixStream,
    pending: Vec<u8>,
    pub dir: PathBuf,
    pub ip: String,
    seq: u32,
}

pub struct BootOpts<'a> {
    pub kernel: &'a KernelFiles,
    pub rootfs: &'a Path,
    /// Extra cpio appended to the initramfs (xroce binaries), optional
    pub payload: Option<&'a Path>,
    pub index: usize,
    pub mem_mib: u32,
    pub cpus: u32,
}

impl Vm {
    pub fn boot(ns: &Netns, o: &BootOpts) -> Result<Vm> {
        let t = Instant::now();
        let name = format!("vm{}-{}", o.index, o.kernel.kernel.label());
        let dir = vm_dir().join("runs").join(format!("{}-{name}", ns.name));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        // The initramfs: rootfs + modules (+ payload), concatenated.
        let initrd = dir.join("initrd.cpio");
        {
            let mut f = fs::File::create(&initrd)?;
            let mut parts = vec![o.rootfs, o.kernel.modules_cpio.as_path()];
            if let Some(p) = o.payload {
                parts.push(p);
            }
            for p in parts {
                let mut src = fs::File::open(p).with_context(|| format!("{}", p.display()))?;
                std::io::copy(&mut src, &mut f)?;
            }
        }
        let sock = dir.join("agent.sock");
        let console = dir.join("console.log");
        let ip = vm_ip(o.index);
        let mac = format!("52:54:00:77:00:{:02x}", 0x10 + o.index);
        let append = format!(
            "console=ttyS0 panic=-1 loglevel=4 net.ifnames=0 xroce.name={name} xroce.ip={ip}/24 xroce.mtu={}",
            ns.mtu
        );
        let accel = accel();
        let mut cmd = ns.command(&["qemu-system-x86_64"]);
        cmd.args(["-accel", &accel, "-cpu", "max", "-machine", "q35"])
            .args(["-m", &o.mem_mib.to_string(), "-smp", &o.cpus.to_string()])
            .args([
                "-nodefaults",
                "-no-user-config",
                "-display",
                "none",
                "-no-reboot",
            ])
            .arg("-kernel")
            .arg(&o.kernel.image)
            .arg("-initrd")
            .arg(&initrd)
            .args(["-append", &append])
            .args([
                "-netdev",
                &format!("tap,id=n0,ifname=tap{},script=no,downscript=no", o.index),
                "-device",
                &format!("virtio-net-pci,netdev=n0,mac={mac}"),
            ])
            .args(["-serial", &format!("file:{}", console.display())])
            .args([
                "-chardev",
                &format!("socket,id=agent,path={},server=on,wait=off", sock.display()),
                "-serial",
                "chardev:agent",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("qemu.stderr"))?);
        eprintln!("vm: boot {name} ({accel}): {}", describe(&cmd));
        let mut child = cmd.spawn().context("starting qemu")?;
        // `ip netns exec` execs qemu: the PID is qemu's.
        let pid = child.id();
        LIVE.lock().unwrap().push(pid);
        let agent = loop {
            if let Ok(s) = UnixStream::connect(&sock) {
                break s;
            }
            if let Some(st) = child.try_wait()? {
                bail!(
                    "qemu exited ({st}) before its agent socket appeared: {}",
                    fs::read_to_string(dir.join("qemu.stderr")).unwrap_or_default()
                );
            }
            if t.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                bail!("qemu made no agent socket in 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut vm = Vm {
            name,
            child,
            pid,
            agent,
            pending: Vec::new(),
            dir,
            ip,
            seq: 0,
        };
        let boot_timeout = Duration::from_secs(180);
        vm.read_until(b"__XROCE_AGENT_READY__\n", boot_timeout)
            .with_context(|| {
                format!(
                    "{} did not come up; console: {}",
                    vm.name,
                    vm.console_tail()
                )
            })?;
        eprintln!("vm: {} up in {:.1?}", vm.name, t.elapsed());
        Ok(vm)
    }

    pub fn console_tail(&self) -> String {
        let s = fs::read_to_string(self.dir.join("console.log")).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }

    /// Reads the agent stream until `marker`; returns what came before it.
    fn read_until(&mut self, marker: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 65536];
        loop {
            if let Some(pos) = self.pending.windows(marker.len()).position(|w| w == marker) {
                let before = self.pending[..pos].to_vec();
                self.pending.drain(..pos + marker.len());
                return Ok(before);
            }
            let now = Instant::now();
            if now >= deadline {
                bail!(
                    "timed out after {timeout:.0?}; output so far: {}",
                    String::from_utf8_lossy(&self.pending)
                );
            }
            self.agent
                .set_read_timeout(Some((deadline - now).min(Duration::from_millis(500))))?;
            match self.agent.read(&mut buf) {
                Ok(0) => bail!(
                    "the VM's agent closed; output so far: {}",
                    String::from_utf8_lossy(&self.pending)
                ),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    if let Some(st) = self.child.try_wait()? {
                        bail!("qemu exited ({st}); console: {}", self.console_tail());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Runs `script` (bash) in the guest; returns its exit status and output.
    pub fn run(&mut self, script: &str, timeout: Duration) -> Result<(i32, String)> {
        self.seq += 1;
        let token = format!("{}{}", self.seq, std::process::id());
        // The guest kills the script a little before the host gives up, so
        // a hung command never leaves the (single-threaded) agent busy.
        let limit = timeout.as_secs().saturating_sub(5).max(5);
        let wrapper = format!(
            "echo {} | base64 -d >/tmp/script.{token}\ntimeout -k 3 {limit} bash /tmp/script.{token}\n",
            base64(script.as_bytes())
        );
        let b64 = base64(wrapper.as_bytes());
        writeln!(self.agent, "RUN {token} {b64}")?;
        let marker = format!("__XROCE_END_{token} ");
        let out = self
            .read_until(marker.as_bytes(), timeout)
            .with_context(|| format!("{}: `{}`", self.name, first_line(script)))?;
        let status = self.read_until(b"\n", Duration::from_secs(5))?;
        let rc: i32 = String::from_utf8_lossy(&status)
            .trim()
            .parse()
            .unwrap_or(-1);
        let mut text = String::from_utf8_lossy(&out).into_owned();
        if text.ends_with('\n') {
            text.pop();
        }
        Ok((rc, text))
    }

    /// Runs `script`, echoing its output, and fails unless it exits 0.
    pub fn check(&mut self, script: &str, timeout: Duration) -> Result<String> {
        eprintln!("[{}] $ {}", self.name, first_line(script));
        let (rc, out) = self.run(script, timeout)?;
        for l in out.lines() {
            eprintln!("[{}] {l}", self.name);
        }
        if rc != 0 {
            bail!("{}: `{}` exited {rc}", self.name, first_line(script));
        }
        Ok(out)
    }

    /// Asks the guest to power off; kills qemu if it does not within 15 s.
    pub fn poweroff(mut self) -> Result<()> {
        let _ = writeln!(self.agent, "OFF");
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait()? {
                eprintln!("vm: {} powered off ({st})", self.name);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "vm: {} did not power off; killing qemu {}",
            self.name, self.pid
        );
        Ok(())
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Ok(mut l) = LIVE.lock() {
            l.retain(|p| *p != self.pid);
        }
        let _ = fs::remove_file(self.dir.join("initrd.cpio"));
    }
}

fn first_line(s: &str) -> &str {
    s.trim().lines().next().unwrap_or("")
}

/// A background process in the namespace (tcpdump, xroce): killed by PID on drop.
pub struct Bg {
    pub what: String,
    child: Child,
}

impl Bg {
    pub fn spawn(mut cmd: Command, log: &Path) -> Result<Bg> {
        let what = describe(&cmd);
        eprintln!("+ {what} &  (log {})", log.display());
        let f = fs::File::create(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        LIVE.lock().unwrap().push(child.id());
        Ok(Bg { what, child })
    }

    /// Waits up to `timeout` for it to exit; its status, or None if still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(Some(st));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGINT (tcpdump flushes), then SIGKILL after 3 s.
    pub fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: signal to our own child by PID.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
            if self
                .wait_timeout(Duration::from_secs(3))
                .ok()
                .flatten()
                .is_none()
            {
                eprintln!("vm: killing {}", self.what);
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        self.stop();
        let pid = self.child.id();
        if let Ok(mut l) = LIVE.lock() {
            l.retain(|p| *p != pid);
        }
    }
}

pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        s.push(T[(n >> 18) as usize & 63] as char);
        s.push(T[(n >> 12) as usize & 63] as char);
        s.push(if c.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        s.push(if c.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    s
}
