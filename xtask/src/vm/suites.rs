//! The VM suites: kernel matrix and interop with rdma_rxe.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{
    image::{self, vm_dir, Kernel},
    qemu::{BootOpts, Netns, Vm, HOST_IFACE},
};
use crate::util::{cargo, step, workspace_root};

const MEM_MIB: u32 = 1536;

/// One line of the pass table.
struct Case {
    name: String,
    ok: bool,
    secs: f64,
    note: String,
}

#[derive(Default)]
pub struct Table(Vec<Case>);

impl Table {
    fn record(&mut self, name: &str, t: Instant, r: &Result<String>) {
        let (ok, note) = match r {
            Ok(n) => (true, n.clone()),
            Err(e) => (
                false,
                format!("{e:#}").lines().next().unwrap_or("").to_string(),
            ),
        };
        eprintln!(
            "vm: {} {name} ({:.1} s) {note}",
            if ok { "PASS" } else { "FAIL" },
            t.elapsed().as_secs_f64()
        );
        self.0.push(Case {
            name: name.into(),
            ok,
            secs: t.elapsed().as_secs_f64(),
            note,
        });
    }

    fn print(&self, title: &str) -> Result<()> {
        let mut s = format!("\n{title}\n| case | result | time | note |\n|---|---|---|---|\n");
        for c in &self.0 {
            s.push_str(&format!(
                "| {} | {} | {:.1} s | {} |\n",
                c.name,
                if c.ok { "pass" } else { "FAIL" },
                c.secs,
                c.note.replace('|', "/")
            ));
        }
        eprint!("{s}");
        let dir = vm_dir().join("artifacts");
        fs::create_dir_all(&dir)?;
        let file = dir.join(format!(
            "{}.md",
            title.split_whitespace().next().unwrap_or("table")
        ));
        fs::write(&file, &s)?;
        eprintln!("vm: table written to {}", file.display());
        let failed: Vec<&str> = self
            .0
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name.as_str())
            .collect();
        if !failed.is_empty() {
            bail!("{title}: failed: {}", failed.join(", "));
        }
        Ok(())
    }
}

fn newest(dir: &Path, prefix: &str) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(prefix) && !n.ends_with(".d") && p.is_file()
        })
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
}

/// Builds the binaries the guest gets and packs them at /opt/xroce/target/...
/// (where the tests' `workspace_bin` finds xroce): release and debug
/// `xroce`, and the xdp_redirect end-to-end test binary.
fn payload() -> Result<PathBuf> {
    step("vm: building the xroce binaries for the guest");
    cargo(&["build", "--release", "-p", "xroce-cli", "--bin", "xroce"])?;
    cargo(&["build", "-p", "xroce-cli", "--bin", "xroce"])?;
    cargo(&[
        "test",
        "--no-run",
        "-p",
        "xroce-tests",
        "--test",
        "xdp_redirect",
    ])?;
    let root = workspace_root().join("target");
    let stage = vm_dir().join("payload");
    let _ = fs::remove_dir_all(&stage);
    let opt = stage.join("opt/xroce/target");
    fs::create_dir_all(opt.join("release"))?;
    fs::create_dir_all(opt.join("debug/deps"))?;
    fs::copy(root.join("release/xroce"), opt.join("release/xroce"))?;
    fs::copy(root.join("debug/xroce"), opt.join("debug/xroce"))?;
    let t = newest(&root.join("debug/deps"), "xdp_redirect-")
        .context("no target/debug/deps/xdp_redirect-* test binary")?;
    fs::copy(&t, opt.join("debug/deps/xdp_redirect"))?;
    let out = vm_dir().join("payload.cpio");
    image::pack_cpio(&stage, &out)?;
    fs::remove_dir_all(&stage)?;
    Ok(out)
}

fn boot(ns: &Netns, k: Kernel, index: usize, payload: Option<&Path>, cpus: u32) -> Result<Vm> {
    let rootfs = image::rootfs(false)?;
    let kf = image::kernel(k)?;
    Vm::boot(
        ns,
        &BootOpts {
            kernel: &kf,
            rootfs: &rootfs,
            payload,
            index,
            mem_mib: MEM_MIB,
            cpus,
        },
    )
}

const RXE_UP: &str = "rxe-up eth0";

pub fn boot_smoke(k: Kernel) -> Result<()> {
    let ns = Netns::create(1, 1500)?;
    let t = Instant::now();
    let mut vm = boot(&ns, k, 0, None, 1)?;
    vm.check("uname -a; ip -br addr", Duration::from_secs(20))?;
    vm.check(RXE_UP, Duration::from_secs(60))?;
    vm.check("ibv_devinfo -d rxe0 | head -20", Duration::from_secs(30))?;
    let host_ping = ns
        .command(&["ping", "-c", "2", "-W", "5", &vm.ip])
        .output()?;
    eprintln!(
        "vm: host -> guest ping: {}",
        if host_ping.status.success() {
            "ok"
        } else {
            "FAILED"
        }
    );
    vm.poweroff()?;
    eprintln!("vm: boot smoke on {} took {:.1?}", k.label(), t.elapsed());
    Ok(())
}

pub fn run_one(k: Kernel, mtu: u32, script: &str) -> Result<i32> {
    let payload = payload()?;
    let ns = Netns::create(1, mtu)?;
    let mut vm = boot(&ns, k, 0, Some(&payload), 2)?;
    let (rc, out) = vm.run(script, Duration::from_secs(1800))?;
    println!("{out}");
    vm.poweroff()?;
    Ok(rc)
}

/// Kernel matrix: in a VM on each kernel, xroce's XDP program attaches in
/// native mode on virtio-net (through the verifier) and in skb mode, its
/// counters read back, and the xdp_redirect end-to-end test binary runs
/// (namespaces + veth inside the guest).
pub fn matrix(kernels: &[Kernel]) -> Result<()> {
    let payload = payload()?;
    let mut table = Table::default();
    for &k in kernels {
        step(&format!("vm: kernel matrix on {}", k.label()));
        let ns = Netns::create(1, 1500)?;
        let t = Instant::now();
        let vm = boot(&ns, k, 0, Some(&payload), 2);
        let mut vm = match vm {
            Ok(vm) => {
                table.record(&format!("{} boot", k.label()), t, &Ok(String::new()));
                vm
            }
            Err(e) => {
                table.record(&format!("{} boot", k.label()), t, &Err(e));
                continue;
            }
        };
        let x = "/opt/xroce/target/release/xroce";
        for (mode, mtu) in [("native", 1500), ("native", 3500), ("skb", 1500)] {
            let t = Instant::now();
            let script = format!(
                "set -e; ip link set eth0 mtu {mtu}; {x} attach --iface eth0 --mode {mode}; \
                 ip -d link show eth0 | grep -o 'xdp[a-z]*'; {x} stats --iface eth0 | head -5; \
                 {x} detach --iface eth0; ip link set eth0 mtu 1500"
            );
            let r = vm.check(&script, Duration::from_secs(120));
            let r = r.map(|o| {
                o.lines()
                    .find(|l| l.starts_with("xdp"))
                    .unwrap_or("")
                    .to_string()
            });
            if r.is_err() {
                let _ = vm.run(
                    &format!("{x} detach --iface eth0; ip link set eth0 mtu 1500"),
                    Duration::from_secs(30),
                );
            }
            table.record(&format!("{} attach {mode} MTU {mtu}", k.label()), t, &r);
        }
        let t = Instant::now();
        let r = vm
            .check(
                "cd /opt/xroce && ./target/debug/deps/xdp_redirect --test-threads=1 2>&1 | tail -15; exit ${PIPESTATUS[0]}",
                Duration::from_secs(900),
            )
            .map(|o| {
                o.lines()
                    .rev()
                    .find(|l| l.starts_with("test result"))
                    .unwrap_or("")
                    .to_string()
            });
        table.record(&format!("{} e2e xdp_redirect", k.label()), t, &r);
        vm.poweroff()?;
        drop(ns);
    }
    table.print("matrix (kernel matrix in VMs)")
}

/// Interop: rxe <-> rxe between two VMs, then xroce (host namespace) <-> rxe.
pub fn interop() -> Result<()> {
    let mut table = Table::default();
    let artifacts = vm_dir().join("artifacts");
    fs::create_dir_all(&artifacts)?;
    let k = Kernel::Bookworm;
    // RoCE MTU 4096 needs netdev MTU >= 4096 + 58 (rxe: IP + UDP + BTH + ICRC).
    let ns = Netns::create(2, 4200)?;
    let t = Instant::now();
    let mut a = boot(&ns, k, 0, None, 1)?;
    let mut b = boot(&ns, k, 1, None, 1)?;
    a.check(RXE_UP, Duration::from_secs(60))?;
    b.check(RXE_UP, Duration::from_secs(60))?;
    eprintln!("vm: two rxe peers up in {:.1?}", t.elapsed());
    let a_ip = a.ip.clone();
    for mtu in [1024, 4096] {
        let t = Instant::now();
        let cap = artifacts.join(format!("rxe-rxe_rc_pingpong_mtu{mtu}.pcap"));
        let r = captured(&ns, &cap, || {
            let server = format!("ibv_rc_pingpong -d rxe0 -g 1 -m {mtu} -s 4096 -n 100");
            let client = format!(
                "for i in $(seq 1 50); do ibv_rc_pingpong -d rxe0 -g 1 -m {mtu} -s 4096 -n 100 {a_ip} && exit 0; sleep 0.3; done; exit 1"
            );
            std::thread::scope(|s| {
                let h = s.spawn(|| a.check(&server, Duration::from_secs(120)));
                let c = b.check(&client, Duration::from_secs(120));
                let sv = h.join().unwrap();
                let c = c?;
                sv?;
                Ok(c.lines()
                    .find(|l| l.contains("bytes in"))
                    .unwrap_or("")
                    .to_string())
            })
        });
        table.record(&format!("rxe<->rxe ibv_rc_pingpong MTU {mtu}"), t, &r);
    }
    a.poweroff()?;
    b.poweroff()?;
    drop(ns);
    table.print("interop (xroce and rxe)")
}

/// Runs `f` with tcpdump capturing on the host side of the VM network, then
/// checks the capture with `xroce decode` (zero ICRC errors).
fn captured(ns: &Netns, pcap: &Path, f: impl FnOnce() -> Result<String>) -> Result<String> {
    let log = pcap.with_extension("tcpdump.log");
    let mut dump = super::qemu::Bg::spawn(
        {
            let mut c = ns.command(&["tcpdump", "-i", "br0", "-s", "0", "-U", "-w"]);
            c.arg(pcap).arg("udp port 4791");
            c
        },
        &log,
    )?;
    // tcpdump reports "listening on" once it captures.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10)
        && !fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("listening on")
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = f();
    std::thread::sleep(Duration::from_millis(300));
    dump.stop();
    let note = r?;
    let decode = decode(pcap)?;
    Ok(format!("{note}; {decode}"))
}

/// `xroce decode PCAP`: fails on any ICRC error; returns its summary line.
fn decode(pcap: &Path) -> Result<String> {
    let xroce = workspace_root().join("target/release/xroce");
    let out = Command::new(&xroce).arg("decode").arg(pcap).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(pcap.with_extension("decode.txt"), &text)?;
    if !out.status.success() {
        bail!(
            "xroce decode {} failed: {}",
            pcap.display(),
            text.lines().last().unwrap_or("")
        );
    }
    let summary = text
        .lines()
        .rev()
        .find(|l| l.to_lowercase().contains("icrc"))
        .unwrap_or("")
        .trim()
        .to_string();
    Ok(summary)
}

#[allow(dead_code)]
fn host_iface() -> &'static str {
    HOST_IFACE
}
