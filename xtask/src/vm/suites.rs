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

mod dispatcher;
mod mpi;
mod rdmacm;
mod ucx;

/// Guest memory. The initramfs (root file system ~240 MB with UCX and Open
/// MPI, the payload ~240 MB of xroce binaries) unpacks into a tmpfs of half
/// of it: at 1536 MiB kernel 6.1 failed ("Initramfs unpacking failed:
/// write error") and lost the payload's last files.
const MEM_MIB: u32 = 2560;

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

    /// A line that does not decide the suite's result.
    fn info(&mut self, name: &str, t: Instant, r: &Result<String>) {
        let r = match r {
            Ok(n) => Ok(n.clone()),
            Err(e) => Ok(format!(
                "(info, not counted) failed: {}",
                format!("{e:#}").lines().next().unwrap_or("")
            )),
        };
        self.record(name, t, &r);
    }

    fn print(&self, title: &str) -> Result<()> {
        let mut s = format!("\n{title}\n| case | result | time | note |\n|---|---|---|---|\n");
        for c in &self.0 {
            s.push_str(&format!(
                "| {} | {} | {:.1} s | {} |\n",
                c.name,
                match (c.ok, c.note.starts_with("(info")) {
                    (true, true) => "info",
                    (true, false) => "pass",
                    _ => "FAIL",
                },
                c.secs,
                c.note.replace('|', "/")
            ));
        }
        eprint!("{s}");
        let dir = artifacts_dir();
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

/// This run's artifacts: target/vm/artifacts/<unix time>-<pid>/ (runs never
/// share files), with target/vm/artifacts/latest pointing at it.
pub fn artifacts_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let base = vm_dir().join("artifacts");
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let name = format!("{secs}-{}", std::process::id());
        // Keep the last few runs (pcaps of a full run are ~0.5 GB).
        let mut old: Vec<PathBuf> = fs::read_dir(&base)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        old.retain(|p| !p.is_symlink());
        old.sort();
        for p in old.iter().rev().skip(3) {
            let _ = fs::remove_dir_all(p);
        }
        let dir = base.join(&name);
        let _ = fs::create_dir_all(&dir);
        let latest = base.join("latest");
        let _ = fs::remove_file(&latest);
        let _ = std::os::unix::fs::symlink(&name, &latest);
        dir
    })
    .clone()
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

/// Builds the release CLI and, beside it, xroce's drop-in libibverbs
/// (target/release/libxroce_ibverbs.so, which `xroce run` puts first on the
/// library path as libibverbs.so.1): wherever the suites build the CLI.
pub(super) fn build_release_cli() -> Result<()> {
    cargo(&["build", "--release", "-p", "xroce-cli", "--bin", "xroce"])?;
    build_release_dropin_libs()
}

/// The drop-in libibverbs and librdmacm, release build, beside the CLI.
fn build_release_dropin_libs() -> Result<()> {
    cargo(&[
        "build",
        "--release",
        "-p",
        "xroce-ibverbs",
        "-p",
        "xroce-rdmacm",
    ])
}

/// Builds the binaries the guest gets and packs them at /opt/xroce/target/...
/// (where the tests' `workspace_bin` finds xroce): release and debug
/// `xroce` (the release one with its drop-in libibverbs beside it, so
/// `xroce run` works in the guest too), and the xdp_redirect end-to-end
/// test binary.
fn payload() -> Result<PathBuf> {
    step("vm: building the xroce binaries for the guest");
    build_release_cli()?;
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
    fs::copy(
        root.join(format!("release/{DROPIN_LIB}")),
        opt.join(format!("release/{DROPIN_LIB}")),
    )?;
    fs::create_dir_all(opt.join("release/lib"))?;
    std::os::unix::fs::symlink(
        format!("../{DROPIN_LIB}"),
        opt.join("release/lib/libibverbs.so.1"),
    )?;
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
/// counters read back, the xdp_redirect end-to-end test binary runs
/// (namespaces + veth inside the guest), and xroce shares a veth with
/// xdp-filter through libxdp's dispatcher (suites/dispatcher.rs).
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
        // XROCE_VM_ONLY=dispatcher: only the libxdp dispatcher case.
        if std::env::var("XROCE_VM_ONLY").as_deref() == Ok("dispatcher") {
            dispatcher::run(&mut vm, k, &mut table);
            vm.poweroff()?;
            continue;
        }
        let x = "/opt/xroce/target/release/xroce";
        // (mode, interface MTU, counted): virtio-net takes native XDP only
        // while a frame fits a page; jumbo MTUs are reported, not required.
        for (mode, mtu, counted) in [
            ("native", 1500, true),
            ("native", 3500, true),
            ("skb", 1500, true),
            ("native", 4200, false),
            ("skb", 4200, false),
        ] {
            let t = Instant::now();
            let script = format!(
                "set -e; ip link set eth0 mtu {mtu}; {x} attach --iface eth0 --mode {mode}; \
                 ip -d link show eth0 | grep -o 'xdp[a-z]*'; {x} stats --iface eth0 | head -5; \
                 {x} detach --iface eth0; ip link set eth0 mtu 1500"
            );
            let r = vm
                .run(&script, Duration::from_secs(120))
                .and_then(|(rc, o)| {
                    if rc != 0 {
                        bail!("{}", o.lines().last().unwrap_or("").trim());
                    }
                    Ok(o)
                });
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
            let name = format!("{} attach {mode} MTU {mtu}", k.label());
            if counted {
                table.record(&name, t, &r);
            } else {
                table.info(&name, t, &r);
            }
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
        dispatcher::run(&mut vm, k, &mut table);
        vm.poweroff()?;
        drop(ns);
    }
    table.print("matrix (kernel matrix in VMs)")
}

/// XROCE_VM_ONLY=substring runs only the interop cases whose name has it;
/// several substrings, comma-separated, select the cases having any.
fn wanted(case: &str) -> bool {
    std::env::var("XROCE_VM_ONLY").map_or(true, |w| w.split(',').any(|w| case.contains(w)))
}

/// The xroce binary on the host side of interop runs: XROCE_BIN, else
/// target/release/xroce.
fn host_xroce() -> PathBuf {
    std::env::var_os("XROCE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/release/xroce"))
}

/// Interop: rxe <-> rxe between two VMs, then xroce (host namespace, on
/// xr0) <-> rxe both ways at path MTU 1024 (AF_XDP backend) and 4096 (AF_XDP
/// with multi-buffer, and the UDP backend): xroce's own tools
/// (`xroce pingpong` against ibv_rc_pingpong, `xroce bench/lat --perftest`
/// against perftest), one run with loss injected by xroce's XDP program,
/// and the drop-in cases (Debian's programs on the host too, under
/// `xroce run`; RDMA-CM in suites/rdmacm.rs, UCX in suites/ucx.rs, Open
/// MPI in suites/mpi.rs). Every run is captured on the bridge and decoded
/// with `xroce decode`.
pub fn interop() -> Result<()> {
    let xroce = host_xroce();
    // The drop-in cases need the library beside the CLI; if it does not
    // build, they fail and the other cases still run.
    let mut lib_built = Ok(());
    if std::env::var_os("XROCE_BIN").is_none() {
        cargo(&["build", "--release", "-p", "xroce-cli", "--bin", "xroce"])?;
        lib_built = build_release_dropin_libs();
    }
    let has_pingpong = Command::new(&xroce)
        .args(["pingpong", "--help"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let mut table = Table::default();
    let artifacts = artifacts_dir();
    fs::create_dir_all(&artifacts)?;
    let k = Kernel::Bookworm;
    // RoCE MTU 4096 needs netdev MTU >= 4096 + 58 (rxe: IP + UDP + BTH + ICRC).
    let ns = Netns::create(2, 4200)?;
    let t = Instant::now();
    let mut a = boot(&ns, k, 0, None, 1)?;
    a.check(RXE_UP, Duration::from_secs(60))?;
    if wanted("rxe<->rxe") {
        let mut b = boot(&ns, k, 1, None, 1)?;
        b.check(RXE_UP, Duration::from_secs(60))?;
        eprintln!("vm: two rxe peers up in {:.1?}", t.elapsed());
        rxe_rxe(&ns, &mut a, &mut b, &mut table)?;
        b.poweroff()?;
    }
    rxe_rxe_cm(&ns, k, &mut a, &mut table)?;
    rxe_rxe_ucx_mpi(&ns, k, &mut a, &mut table)?;
    if !has_pingpong {
        table.record(
            "xroce<->rxe ibv_rc_pingpong",
            Instant::now(),
            &Err(anyhow::anyhow!(
                "{} has no `pingpong` command (wire userspace/cli/src/pingpong.rs into main.rs)",
                xroce.display()
            )),
        );
    }
    let x = xroce.to_string_lossy().into_owned();
    let host_ip = super::qemu::HOST_IP;
    let cases: &[(u32, &str, bool)] = if has_pingpong {
        &[
            (1024, "afxdp", true),
            (1024, "afxdp", false),
            (4096, "udp", true),
            (4096, "udp", false),
            (4096, "afxdp", true),
            (4096, "afxdp", false),
        ]
    } else {
        &[]
    };
    for &(mtu, backend, xroce_server) in cases {
        let role = if xroce_server { "server" } else { "client" };
        let name = format!("xroce {role} <-> rxe ibv_rc_pingpong MTU {mtu} ({backend})");
        if !wanted(&name) {
            continue;
        }
        let t = Instant::now();
        let cap = artifacts.join(format!(
            "xroce-{role}_rxe_rc_pingpong_mtu{mtu}_{backend}.pcap"
        ));
        // -c on both sides: each checks what the other's client sent.
        let common = format!("-m {mtu} -s 4096 -n 100 -c");
        let host: Vec<String> = [&x, "pingpong", "-d", HOST_IFACE, "--backend", backend]
            .iter()
            .map(|s| s.to_string())
            .chain(common.split(' ').map(String::from))
            .collect();
        let guest = format!("ibv_rc_pingpong -d rxe0 -g 1 {common}");
        let r = captured(&ns, &cap, || {
            xroce_vs_rxe(&ns, &mut a, &x, &host, &guest, xroce_server, &cap)
        });
        table.record(&name, t, &r);
    }
    // perftest: xroce bench/lat --perftest against ib_*_bw / ib_*_lat.
    let perftest: &[(&str, &str, &str, &str, bool)] = &[
        // (tool, xroce command, op, tool flags, xroce can be the client)
        ("ib_send_bw", "bench", "send", "", true),
        ("ib_write_bw", "bench", "write", "", true),
        ("ib_read_bw", "bench", "read", "", true),
        ("ib_atomic_bw", "bench", "atomic", "-A FETCH_AND_ADD", true),
        // xroce's atomic client only fetches and adds; as server it answers both.
        ("ib_atomic_bw", "bench", "atomic", "-A CMP_AND_SWAP", false),
        ("ib_write_lat", "lat", "write", "", true),
        ("ib_read_lat", "lat", "read", "", true),
        ("ib_send_lat", "lat", "send", "", true),
    ];
    // AF_XDP at both MTUs (4096: multi-buffer), and the UDP backend at 4096.
    for (mtu, backend) in [(1024u32, "afxdp"), (4096, "afxdp"), (4096, "udp")] {
        for &(tool, cmd, op, flags, client_too) in perftest {
            for xroce_server in [true, false] {
                if !xroce_server && !client_too {
                    continue;
                }
                let role = if xroce_server { "server" } else { "client" };
                let name = format!("xroce {role} <-> rxe {tool} {flags} MTU {mtu} ({backend})")
                    .replace("  ", " ");
                if !wanted(&name) {
                    continue;
                }
                let t = Instant::now();
                let tag = flags.trim_start_matches("-A ").to_lowercase();
                let cap = artifacts.join(format!(
                    "xroce-{role}_rxe_{tool}{}{tag}_mtu{mtu}_{backend}.pcap",
                    if tag.is_empty() { "" } else { "_" }
                ));
                let iters = PERFTEST_ITERS;
                let host: Vec<String> = [
                    &x,
                    cmd,
                    op,
                    "--perftest",
                    "-d",
                    HOST_IFACE,
                    "-m",
                    &mtu.to_string(),
                    "-n",
                    &iters.to_string(),
                    "--backend",
                    backend,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                let guest = format!("{tool} -d rxe0 -x 1 -F -m {mtu} -n {iters} {flags}");
                let r = captured(&ns, &cap, || {
                    xroce_vs_rxe(&ns, &mut a, &x, &host, &guest, xroce_server, &cap)
                });
                table.record(&name, t, &r);
            }
        }
    }
    let loss = "xroce server <-> rxe, 5% of rxe's SENDs lost in XDP (MTU 1024)";
    if has_pingpong && wanted(loss) {
        // Loss on the SENDs rxe sends to xroce, dropped by xroce's XDP
        // program: rxe's retransmissions must bring every message through.
        // SENDs only, not ACKs: the last message's ACK, if dropped, could
        // never come again (rxe exits once its 100th exchange is done and
        // its QP is gone), and the case failed whenever that one frame was
        // among the 5 % (rdma-core's pingpong has the same teardown race).
        let t = Instant::now();
        let cap = artifacts.join("xroce-server_rxe_rc_pingpong_mtu1024_loss5pct.pcap");
        let log = cap.with_extension("xroce.log");
        let r = captured(&ns, &cap, || {
            crate::util::run(&mut ns.enter(&[&x, "attach", "--iface", HOST_IFACE]))?;
            crate::util::run(&mut ns.enter(&[
                &x, "fault", "--iface", HOST_IFACE, "--drop", "0.05", "--opcode", "send", "--seed",
                "7",
            ]))?;
            let common = "-m 1024 -s 4096 -n 100";
            let mut host = super::qemu::Bg::spawn(
                {
                    let mut c = ns.enter(&[&x, "pingpong", "-d", HOST_IFACE, "--backend", "afxdp"]);
                    c.args(common.split(' '));
                    c
                },
                &log,
            )?;
            let g = a.check(
                &format!(
                    "for i in $(seq 1 100); do ibv_rc_pingpong -d rxe0 -g 1 {common} {host_ip} && exit 0; sleep 0.3; done; exit 1"
                ),
                Duration::from_secs(300),
            );
            let h = host_result(&mut host, &log, "xroce");
            let stats = ns
                .enter(&[&x, "stats", "--iface", HOST_IFACE])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            fs::write(cap.with_extension("stats.txt"), &stats)?;
            let _ = ns.enter(&[&x, "detach", "--iface", HOST_IFACE]).status();
            g?;
            let dropped: u64 = stats
                .lines()
                .find_map(|l| l.trim().strip_prefix("drop_fault"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if dropped == 0 {
                bail!("the XDP program dropped nothing (drop_fault 0)");
            }
            Ok(format!("{}; {dropped} frames dropped by XDP", h?))
        });
        table.record(loss, t, &r);
    }
    let ready = lib_built.context("xroce-ibverbs (the drop-in libibverbs) did not build");
    dropin(&ns, &mut a, &x, ready, &mut table)?;
    dropin_ipv6(&ns, &mut a, &x, &mut table)?;
    rdmacm::interop(&ns, &mut a, &x, &mut table)?;
    ucx::interop(&ns, &mut a, &x, &mut table)?;
    mpi::interop(&ns, &mut a, &x, &mut table)?;
    a.poweroff()?;
    drop(ns);
    table.print("interop (xroce and rxe)")
}

/// xroce's drop-in libibverbs as the cdylib names it, beside the CLI.
const DROPIN_LIB: &str = "libxroce_ibverbs.so";

/// The drop-in programs: (program, arguments both sides give it besides
/// the device, with {mtu} and {iters} filled in). ibv_*: `-g 1`, perftest:
/// `-x 1 -F` (GID index 1 is the IPv4-mapped RoCEv2 GID on both sides).
/// ibv_ud_pingpong has no path MTU flag (UD uses the port's active MTU,
/// 4096 on both sides of the 4200-byte network): its messages are MTU
/// bytes, the most one datagram carries at that MTU.
const DROPIN_PROGRAMS: &[(&str, &str)] = &[
    ("ibv_rc_pingpong", "-g 1 -m {mtu} -s 4096 -n 100"),
    ("ibv_ud_pingpong", "-g 1 -s {mtu} -n 100"),
    ("ib_write_bw", "-x 1 -F -m {mtu} -n {iters}"),
    ("ib_read_bw", "-x 1 -F -m {mtu} -n {iters}"),
    ("ib_send_bw", "-x 1 -F -m {mtu} -n {iters}"),
    (
        "ib_atomic_bw",
        "-x 1 -F -m {mtu} -n {iters} -A FETCH_AND_ADD",
    ),
    (
        "ib_atomic_bw",
        "-x 1 -F -m {mtu} -n {iters} -A CMP_AND_SWAP",
    ),
    ("ib_write_lat", "-x 1 -F -m {mtu} -n {iters}"),
    ("ib_read_lat", "-x 1 -F -m {mtu} -n {iters}"),
    ("ib_send_lat", "-x 1 -F -m {mtu} -n {iters}"),
];

/// One drop-in case: `program args` under `xroce run` on the host
/// against the same program on the guest's rxe0, captured to `cap`.
#[allow(clippy::too_many_arguments)]
fn dropin_captured(
    ns: &Netns,
    vm: &mut Vm,
    x: &str,
    backend: &str,
    program: &str,
    args: &str,
    xroce_server: bool,
    cap: &Path,
) -> Result<String> {
    let mut host = dropin_run_argv(x, backend, program);
    host.extend(args.split_whitespace().map(String::from));
    let guest = format!("{program} -d rxe0 {args}");
    captured(ns, cap, || {
        xroce_vs_rxe(ns, vm, x, &host, &guest, xroce_server, cap)
    })
}

/// The host side of a drop-in case: `PROGRAM -d xroce_xr0` under
/// `X run --iface xr0 --backend BACKEND` (arguments of its own follow).
fn dropin_run_argv(x: &str, backend: &str, program: &str) -> Vec<String> {
    let dev = format!("xroce_{HOST_IFACE}");
    // XROCE_VERBS_DEBUG: the library says on stderr (the host log) why a
    // verb failed; programs themselves only see an errno.
    [
        "env",
        "XROCE_VERBS_DEBUG=1",
        x,
        "run",
        "--iface",
        HOST_IFACE,
        "--backend",
        backend,
        "--",
        program,
        "-d",
        &dev,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Drop-in: the very same Debian binaries on both sides, the host's under
/// `xroce run --iface xr0 --backend B -- PROGRAM -d xroce_xr0 ...` (xroce's
/// libibverbs.so.1 first on the library path), the guest's on rxe0; both
/// directions, at the path MTUs and backends of the perftest cases above.
/// Captured and decoded like every other interop run. `ready` is whether
/// the library built; a preflight `ibv_devinfo` over `xroce run` must pass
/// before the cases run (otherwise each fails with its reason, quickly).
fn dropin(ns: &Netns, vm: &mut Vm, x: &str, ready: Result<()>, table: &mut Table) -> Result<()> {
    let artifacts = artifacts_dir();
    let dev = format!("xroce_{HOST_IFACE}");
    let configs = [(1024u32, "afxdp"), (4096, "afxdp"), (4096, "udp")];
    let any_wanted = configs.iter().any(|&(mtu, backend)| {
        DROPIN_PROGRAMS.iter().any(|&(program, args)| {
            ["server", "client"]
                .iter()
                .any(|role| wanted(&dropin_name(role, program, args, mtu, backend)))
        })
    });
    if !any_wanted {
        return Ok(());
    }
    // Preflight: the CLI has `run`, and the library opens xroce_xr0.
    let t = Instant::now();
    let preflight = ready.and_then(|()| {
        let has_run = Command::new(x)
            .args(["run", "--help"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !has_run {
            bail!("{x} has no `run` command (userspace/cli/src/run.rs)");
        }
        let mut argv = dropin_run_argv(x, "udp", "ibv_devinfo");
        argv.push("-v".into());
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let out = ns.enter(&argv).output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        fs::write(artifacts.join("dropin_ibv_devinfo.txt"), &text)?;
        if !out.status.success() {
            bail!(
                "ibv_devinfo over xroce run: {}: {}",
                out.status,
                text.lines().last().unwrap_or("")
            );
        }
        let line = |key: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(key))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        };
        Ok(format!(
            "{}; {}; {}",
            line("hca_id"),
            line("state"),
            line("active_mtu")
        ))
    });
    let blocker = preflight
        .as_ref()
        .err()
        .map(|e| format!("{e:#}").lines().next().unwrap_or("").to_string());
    table.record(&format!("dropin ibv_devinfo -d {dev} (udp)"), t, &preflight);
    for (mtu, backend) in configs {
        for &(program, args) in DROPIN_PROGRAMS {
            for xroce_server in [true, false] {
                let role = if xroce_server { "server" } else { "client" };
                let name = dropin_name(role, program, args, mtu, backend);
                if !wanted(&name) {
                    continue;
                }
                let t = Instant::now();
                if let Some(b) = &blocker {
                    table.record(&name, t, &Err(anyhow::anyhow!("not run: {b}")));
                    continue;
                }
                let args = args
                    .replace("{mtu}", &mtu.to_string())
                    .replace("{iters}", &PERFTEST_ITERS.to_string());
                let tag = dropin_tag(args.as_str());
                let cap = artifacts.join(format!(
                    "dropin_xroce-{role}_rxe_{program}{tag}_mtu{mtu}_{backend}.pcap"
                ));
                let r = dropin_captured(ns, vm, x, backend, program, &args, xroce_server, &cap);
                // `xroce run --backend afxdp` leaves its XDP program
                // attached (pinned) for the next run; the next case (or
                // suite) starts from a clean interface.
                let detach = ns.enter(&[x, "detach", "--iface", HOST_IFACE]).output();
                if backend == "afxdp" && !detach.as_ref().is_ok_and(|o| o.status.success()) {
                    eprintln!("vm: warning: xroce detach --iface {HOST_IFACE} failed after {name}");
                }
                table.record(&name, t, &r);
            }
        }
    }
    Ok(())
}

/// The RoCEv2-over-IPv6 drop-in programs: GID index 0 on both sides is
/// the fe80 link-local GID (xroce's from xr0's MAC, rxe's from the guest
/// NIC's), so the QPs address each other by link-local IPv6.
const DROPIN_IPV6_PROGRAMS: &[(&str, &str)] = &[
    ("ibv_rc_pingpong", "-g 0 -m 1024 -s 4096 -n 100"),
    ("ib_write_bw", "-x 0 -F -m 1024 -n {iters}"),
];

/// RoCEv2 over IPv6 (XROCE_VM_ONLY=dropin-ipv6): Debian's programs on both
/// sides, the host's under `xroce run` (AF_XDP, MTU 1024), both
/// directions, captured and decoded like the other cases; the capture
/// must hold IPv6 RoCEv2 frames and no IPv4 one.
fn dropin_ipv6(ns: &Netns, vm: &mut Vm, x: &str, table: &mut Table) -> Result<()> {
    let artifacts = artifacts_dir();
    let backend = "afxdp";
    for &(program, args) in DROPIN_IPV6_PROGRAMS {
        for xroce_server in [true, false] {
            let role = if xroce_server { "server" } else { "client" };
            let name =
                format!("dropin-ipv6 xroce-{role} <-> rxe {program} GID 0 MTU 1024 ({backend})");
            if !wanted(&name) {
                continue;
            }
            let t = Instant::now();
            let args = args.replace("{iters}", &PERFTEST_ITERS.to_string());
            let cap = artifacts.join(format!(
                "dropin-ipv6_xroce-{role}_rxe_{program}_mtu1024_{backend}.pcap"
            ));
            let r = dropin_captured(ns, vm, x, backend, program, &args, xroce_server, &cap)
                .and_then(|note| {
                    let v6 = roce_frames(&cap, "ip6")?;
                    let v4 = roce_frames(&cap, "ip")?;
                    if v6 == 0 || v4 != 0 {
                        bail!("{v6} IPv6 and {v4} IPv4 RoCEv2 frames captured; expected IPv6 only");
                    }
                    Ok(format!("{note}; {v6} RoCEv2 frames, all IPv6"))
                });
            let _ = ns.enter(&[x, "detach", "--iface", HOST_IFACE]).output();
            table.record(&name, t, &r);
        }
    }
    Ok(())
}

/// RoCEv2 frames of a capture over IP version `ip` ("ip" or "ip6"), as
/// tcpdump's filter counts them.
fn roce_frames(pcap: &Path, ip: &str) -> Result<usize> {
    let out = Command::new("tcpdump")
        .args(["-n", "-r"])
        .arg(pcap)
        .arg(format!("{ip} and udp port 4791"))
        .output()?;
    if !out.status.success() {
        bail!(
            "tcpdump -r {}: {}",
            pcap.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().count())
}

/// "-A CMP_AND_SWAP" -> "_cmp_and_swap" (tells the two atomic runs apart).
fn dropin_tag(args: &str) -> String {
    args.split_whitespace()
        .skip_while(|a| *a != "-A")
        .nth(1)
        .map(|op| format!("_{}", op.to_lowercase()))
        .unwrap_or_default()
}

/// "dropin xroce-server <-> rxe ib_atomic_bw -A CMP_AND_SWAP MTU 1024
/// (afxdp)": `xroce-ROLE` (not "xroce ROLE") so an XROCE_VM_ONLY filter for
/// the xroce-tool cases does not pick these.
fn dropin_name(role: &str, program: &str, args: &str, mtu: u32, backend: &str) -> String {
    let flags = args
        .split_whitespace()
        .skip_while(|a| *a != "-A")
        .collect::<Vec<_>>()
        .join(" ");
    format!("dropin xroce-{role} <-> rxe {program} {flags} MTU {mtu} ({backend})")
        .replace("  ", " ")
}

/// ibv_rc_pingpong between two rxe VMs (the peers are sane).
fn rxe_rxe(ns: &Netns, a: &mut Vm, b: &mut Vm, table: &mut Table) -> Result<()> {
    let artifacts = artifacts_dir();
    let a_ip = a.ip.clone();
    for mtu in [1024, 4096] {
        let t = Instant::now();
        let cap = artifacts.join(format!("rxe-rxe_rc_pingpong_mtu{mtu}.pcap"));
        let r = captured(ns, &cap, || {
            guest_server(
                a,
                &format!("ibv_rc_pingpong -d rxe0 -g 1 -m {mtu} -s 4096 -n 100"),
            )?;
            b.check(
                &format!("ibv_rc_pingpong -d rxe0 -g 1 -m {mtu} -s 4096 -n 100 {a_ip}"),
                Duration::from_secs(120),
            )?;
            guest_server_result(a)
        });
        table.record(&format!("rxe<->rxe ibv_rc_pingpong MTU {mtu}"), t, &r);
    }
    Ok(())
}

/// UCX (ucx_perftest) and Open MPI (allreduce, pml ucx) between two rxe
/// VMs: the guest side of the xroce cases works on its own. Boots its own
/// second VM.
fn rxe_rxe_ucx_mpi(ns: &Netns, k: Kernel, a: &mut Vm, table: &mut Table) -> Result<()> {
    if !ucx::rxe_rxe_wanted() && !mpi::rxe_rxe_wanted() {
        return Ok(());
    }
    let mut b = boot(ns, k, 1, None, 1)?;
    b.check(RXE_UP, Duration::from_secs(60))?;
    ucx::rxe_rxe(ns, a, &mut b, table)?;
    mpi::rxe_rxe(ns, a, &mut b, table)?;
    b.poweroff()
}

/// The RDMA-CM cases between two rxe VMs (XROCE_VM_ONLY=cm): (name,
/// server command on A, client command on B with {a} for A's address, TCP
/// port rdma_cm listens on, whether the client must succeed). Each is
/// captured to artifacts/cm_<name>.pcap: the fixtures of xroce-wire's CM
/// codec (userspace/wire/tests/data/cm).
const CM_CASES: &[(&str, &str, &str, u16, bool)] = &[
    (
        "rping",
        "rping -s -a 0.0.0.0 -C 10 -V -S 4096",
        "rping -c -a {a} -C 10 -V -S 4096",
        7174,
        true,
    ),
    (
        "ucmatose",
        "ucmatose -C 10",
        "ucmatose -s {a} -C 10",
        7471,
        true,
    ),
    ("udaddy", "udaddy", "udaddy -s {a}", 7174, true),
    (
        "rdma_server",
        "rdma_server",
        "rdma_client -s {a}",
        7471,
        true,
    ),
    (
        "ib_write_bw_R",
        "ib_write_bw -d rxe0 -R -F -s 4096 -n 50",
        "ib_write_bw -d rxe0 -R -F -s 4096 -n 50 {a}",
        18515,
        true,
    ),
    // Nobody listens on 7777: the REQ is rejected.
    ("rej", "", "rping -c -a {a} -p 7777 -C 1", 7777, false),
    (
        "rping_ipv6",
        "rping -s -a :: -C 10 -V -S 4096",
        "rping -c -a {a6} -C 10 -V -S 4096",
        7174,
        true,
    ),
];

/// The VMs' global IPv6 addresses for the IPv6 case (rxe adds a GID for
/// each address of its netdev).
fn cm_ipv6(index: usize) -> String {
    format!("fd77::{}", 10 + index)
}

/// RDMA-CM between two rxe VMs (rping, ucmatose, udaddy, rdma_server,
/// ib_write_bw -R, a rejected connect, IPv6 rping): Linux's ib_cm/rdma_cm
/// on both ends, each run captured on the bridge. Boots its own second VM.
fn rxe_rxe_cm(ns: &Netns, k: Kernel, a: &mut Vm, table: &mut Table) -> Result<()> {
    let name = |case: &str| format!("rxe<->rxe cm {case}");
    if !CM_CASES.iter().any(|c| wanted(&name(c.0))) {
        return Ok(());
    }
    let mut b = boot(ns, k, 1, None, 1)?;
    b.check(RXE_UP, Duration::from_secs(60))?;
    a.check(RDMA_UCM, Duration::from_secs(30))?;
    b.check(RDMA_UCM, Duration::from_secs(30))?;
    let artifacts = artifacts_dir();
    let a_ip = a.ip.clone();
    let info = "uname -r; rdma link show; ibv_devinfo -d rxe0 -v | grep -E 'GID|active_mtu'";
    let kinfo = a.check(info, Duration::from_secs(30)).unwrap_or_default();
    fs::write(artifacts.join("cm_guest_info.txt"), kinfo)?;
    'cases: for &(case, server, client, port, must_pass) in CM_CASES {
        let n = name(case);
        if !wanted(&n) {
            continue;
        }
        let t = Instant::now();
        if case.ends_with("ipv6") {
            // nodad: the address (and its GID) is usable at once.
            for (vm, i) in [(&mut *a, 0), (&mut b, 1)] {
                let r = vm.check(
                    &format!(
                        "ip -6 addr replace {}/64 dev eth0 nodad; sleep 1; \
                         cat /sys/class/infiniband/rxe0/ports/1/gids/* | grep -v '^0000:0000:0000:0000:0000:0000:0000:0000'",
                        cm_ipv6(i)
                    ),
                    Duration::from_secs(30),
                );
                if let Err(e) = r {
                    table.record(&n, t, &Err(e));
                    continue 'cases;
                }
            }
        }
        let cap = artifacts.join(format!("cm_{case}.pcap"));
        let client = client.replace("{a6}", &cm_ipv6(0)).replace("{a}", &a_ip);
        let r = captured(ns, &cap, || {
            if !server.is_empty() {
                cm_server(a, server, port)?;
            }
            let (rc, out) = b.run(&client, Duration::from_secs(180))?;
            fs::write(cap.with_extension("client.log"), &out)?;
            let srv = if server.is_empty() {
                Ok(String::new())
            } else {
                guest_server_result(a)
            };
            let last = out.lines().last().unwrap_or("").to_string();
            match (must_pass, rc) {
                (true, 0) => srv.map(|s| format!("client ok {s}")),
                (true, rc) => bail!("client exited {rc}: {last}"),
                (false, 0) => bail!("client succeeded, expected a reject"),
                (false, rc) => Ok(format!("client exited {rc} as expected: {last}")),
            }
        });
        if CM_INFO_ONLY.contains(&case) {
            table.info(&n, t, &r);
        } else {
            table.record(&n, t, &r);
        }
    }
    b.poweroff()
}

/// librdmacm talks to the kernel through rdma_ucm's misc device; the
/// initramfs has no udev to load the module or make the node.
const RDMA_UCM: &str =
    "modprobe rdma_ucm; [ -e /dev/infiniband/rdma_cm ] || { mkdir -p /dev/infiniband; \
     mknod /dev/infiniband/rdma_cm c $(tr : ' ' </sys/class/misc/rdma_cm/dev); }; \
     ls -l /dev/infiniband/rdma_cm";

/// Cases reported but not counted: bookworm's perftest (-R) connects
/// twice, and now and then its second REQ comes before the server listens
/// again (REJ, invalid service ID) and the client segfaults.
const CM_INFO_ONLY: &[&str] = &["ib_write_bw_R"];

/// Starts an rdma_cm server in the guest's background and waits (10 s at
/// most) until rdma_cm lists a listener on `port`.
fn cm_server(vm: &mut Vm, cmd: &str, port: u16) -> Result<()> {
    vm.check(
        &format!(
            "if [ -s /tmp/srv.pid ]; then pkill -P $(cat /tmp/srv.pid); kill $(cat /tmp/srv.pid); sleep 0.2; fi 2>/dev/null; \
             rm -f /tmp/srv.rc /tmp/srv.pid; ( {cmd} >/tmp/srv.log 2>&1; echo $? >/tmp/srv.rc ) & \
             echo $! >/tmp/srv.pid; for i in $(seq 1 100); do rdma res show cm_id | grep LISTEN | grep -q ':{port} ' && exit 0; sleep 0.1; done; \
             rdma res show cm_id; cat /tmp/srv.log; sleep 2"
        ),
        Duration::from_secs(60),
    )?;
    Ok(())
}

/// RoCEv2 over link-local IPv6 between xr0 and the guest's eth0 is
/// usable: neither side's address is still tentative (DAD), and the guest
/// reaches xr0's link-local address (its neighbour entry is made). Right
/// after a boot, rxe's first address handle to xr0 once timed out
/// (ibv_create_ah: Connection timed out) without this.
fn ipv6_link_ready(ns: &Netns, vm: &mut Vm) -> Result<String> {
    let t = Instant::now();
    let host_ll = loop {
        let out = ns
            .enter(&[
                "ip", "-6", "-o", "addr", "show", "dev", HOST_IFACE, "scope", "link",
            ])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let addr = text
            .split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .and_then(|a| a.split('/').next())
            .map(String::from);
        match addr {
            Some(a) if !text.contains("tentative") => break a,
            _ if t.elapsed() > Duration::from_secs(10) => {
                bail!(
                    "{HOST_IFACE} has no usable link-local IPv6 address: {}",
                    text.trim()
                )
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    vm.check(
        &format!(
            "for i in $(seq 1 100); do [ -z \"$(ip -6 addr show dev eth0 tentative)\" ] && break; sleep 0.1; done; \
             ping -6 -c 1 -W 5 {host_ll}%eth0 >/dev/null && echo \"{host_ll} reachable\""
        ),
        Duration::from_secs(30),
    )
}

/// Iterations of each perftest run (rxe under TCG moves ~0.1-0.2 Gb/s).
const PERFTEST_ITERS: u32 = 200;

/// One xroce (host namespace) <-> rxe (guest) run: `host` is the host
/// side's command line (xroce's own tool, or `xroce run -- PROGRAM ...`),
/// `xroce` the CLI that reads the XDP counters afterwards, `guest` the
/// rdma-core/perftest command. The server starts first; the client retries
/// until the server listens. With `xroce_server`, the guest gets the host's
/// address; otherwise the host command gets the guest's.
fn xroce_vs_rxe(
    ns: &Netns,
    vm: &mut Vm,
    xroce: &str,
    host: &[String],
    guest: &str,
    xroce_server: bool,
    cap: &Path,
) -> Result<String> {
    let log = cap.with_extension("xroce.log");
    let host_ip = super::qemu::HOST_IP;
    let mut argv: Vec<&str> = host.iter().map(String::as_str).collect();
    // `xroce run ... -- PROGRAM`: name the program in notes and log lines.
    let label = match argv.iter().position(|a| *a == "--") {
        Some(i) => format!("{} (xroce run)", argv.get(i + 1).unwrap_or(&"?")),
        None => "xroce".to_string(),
    };
    if xroce_server {
        let mut h = super::qemu::Bg::spawn(ns.enter(&argv), &log)?;
        let g = vm.check(
            &format!(
                "for i in $(seq 1 100); do {guest} {host_ip} && exit 0; sleep 0.3; done; exit 1"
            ),
            Duration::from_secs(180),
        );
        let hr = host_result(&mut h, &log, &label);
        save_stats(ns, xroce, cap);
        match (hr, g) {
            (Ok(hr), Ok(g)) => Ok(format!("{hr}; rxe: {}", summary(&g))),
            (Ok(_), Err(g)) => Err(g),
            (Err(hr), Ok(_)) => Err(hr),
            // The server's own reason first: the client's retries only
            // say that it never got through.
            (Err(hr), Err(g)) => bail!("{hr:#}; rxe: {g:#}"),
        }
    } else {
        guest_server(vm, guest)?;
        let ip = vm.ip.clone();
        argv.push(&ip);
        let mut h = super::qemu::Bg::spawn(ns.enter(&argv), &log)?;
        let hr = host_result(&mut h, &log, &label);
        save_stats(ns, xroce, cap);
        let g = guest_server_result(vm);
        let hr = hr?;
        Ok(format!("{hr}; rxe: {}", g?))
    }
}

/// Keeps the XDP counters of xr0 next to the capture (when xroce left its
/// program attached; AF_XDP runs detach it on exit and print nothing).
fn save_stats(ns: &Netns, xroce: &str, cap: &Path) {
    if let Ok(o) = ns.enter(&[xroce, "stats", "--iface", HOST_IFACE]).output() {
        let _ = fs::write(
            cap.with_extension("stats.txt"),
            [o.stdout, o.stderr].concat(),
        );
    }
}

/// Starts `cmd` in the background in the guest (a server) and waits until
/// it listens on TCP 18515 (perftest's port).
fn guest_server(vm: &mut Vm, cmd: &str) -> Result<()> {
    guest_server_port(vm, cmd, 18515)
}

/// Starts `cmd` in the background in the guest and waits (20 s at most)
/// until it listens on TCP `port`.
fn guest_server_port(vm: &mut Vm, cmd: &str, port: u16) -> Result<()> {
    vm.check(
        &format!(
            "if [ -s /tmp/srv.pid ]; then pkill -P $(cat /tmp/srv.pid); kill $(cat /tmp/srv.pid); sleep 0.2; fi 2>/dev/null; \
             rm -f /tmp/srv.rc /tmp/srv.pid; ( {cmd} >/tmp/srv.log 2>&1; echo $? >/tmp/srv.rc ) & \
             echo $! >/tmp/srv.pid; for i in $(seq 1 200); do ss -ltn | grep -q ':{port} ' && exit 0; sleep 0.1; done; \
             cat /tmp/srv.log; exit 1"
        ),
        Duration::from_secs(60),
    )?;
    Ok(())
}

/// Waits for the guest's background server; its output, failing on a non-zero status.
fn guest_server_result(vm: &mut Vm) -> Result<String> {
    let out = vm.check(
        "for i in $(seq 1 1200); do [ -s /tmp/srv.rc ] && break; sleep 0.1; done; \
         cat /tmp/srv.log; exit $(cat /tmp/srv.rc 2>/dev/null || echo 124)",
        Duration::from_secs(150),
    )?;
    // rc_pingpong -c reports bad pages on stdout and still exits 0.
    if let Some(bad) = out.lines().find(|l| l.contains("invalid data")) {
        bail!("rxe's server checked the data: {}", bad.trim());
    }
    Ok(summary(&out))
}

/// The result lines of ibv_rc_pingpong ("bytes in", "iters in") or
/// perftest (the line after the "#bytes" header) or xroce (JSON-less text).
fn summary(out: &str) -> String {
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    let mut picked: Vec<String> = lines
        .iter()
        .filter(|l| l.contains("bytes in") || l.contains("iters in"))
        .map(|l| l.to_string())
        .collect();
    if let Some(i) = lines.iter().position(|l| l.starts_with("#bytes")) {
        if let Some(v) = lines.get(i + 1) {
            picked.push(v.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    picked.join("; ")
}

/// Waits for a host-side run (2 min at most); fails with its log. `label`
/// names it in the note ("xroce", "ib_write_bw (xroce run)").
fn host_result(host: &mut super::qemu::Bg, log: &Path, label: &str) -> Result<String> {
    let st = host.wait_timeout(Duration::from_secs(120))?;
    let text = fs::read_to_string(log).unwrap_or_default();
    for l in text.lines() {
        eprintln!("[host {label}] {l}");
    }
    // xroce's tools end on their error; Debian's programs print their
    // banner (stdout, flushed at exit) after the error (stderr).
    let why = if label == "xroce" {
        text.lines().last().unwrap_or("")
    } else {
        failure_line(&text)
    };
    match st {
        Some(s) if s.success() => Ok(format!("{label}: {}", summary(&text))),
        Some(s) => bail!("{label} {s}: {why}"),
        None => {
            host.stop();
            bail!("{label} did not finish in 120 s: {why}")
        }
    }
}

/// The line of a failed rdma-core/perftest run that says why: the drop-in
/// library's own explanation (XROCE_VERBS_DEBUG), else the program's first
/// complaint, else its last line with words.
fn failure_line(text: &str) -> &str {
    let lines = || text.lines().map(str::trim);
    lines()
        .find(|l| l.starts_with("xroce libibverbs:") && l.contains("errno"))
        .or_else(|| {
            lines().find(|l| {
                let l = l.to_lowercase();
                ["fail", "unable", "couldn't", "error", "cannot", "not found"]
                    .iter()
                    .any(|w| l.contains(w))
            })
        })
        .or_else(|| lines().rfind(|l| l.chars().any(char::is_alphanumeric)))
        .unwrap_or("")
}

/// Runs `f` with tcpdump capturing on the host side of the VM network, then
/// checks the capture with `xroce decode` (zero ICRC errors).
fn captured(ns: &Netns, pcap: &Path, f: impl FnOnce() -> Result<String>) -> Result<String> {
    let log = pcap.with_extension("tcpdump.log");
    let mut dump = super::qemu::Bg::spawn(
        {
            let mut c = ns.enter(&[
                "tcpdump",
                "--immediate-mode",
                "-i",
                "br0",
                "-s",
                "0",
                "-U",
                "-w",
            ]);
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
    std::thread::sleep(Duration::from_millis(500));
    dump.stop();
    let note = r?;
    let decode = decode(pcap)?;
    Ok(format!("{note}; {decode}"))
}

/// `xroce decode PCAP --json`.
fn decode_report(pcap: &Path) -> Result<xroce_report::DecodeReport> {
    let out = Command::new(host_xroce())
        .arg("decode")
        .arg(pcap)
        .arg("--json")
        .output()?;
    let json = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "xroce decode {} --json failed: {}",
            pcap.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    serde_json::from_str(json.trim())
        .with_context(|| format!("xroce decode {} --json: {json:?}", pcap.display()))
}

/// `xroce decode PCAP`: fails on any ICRC error; returns its ICRC counts.
/// The text report is kept beside the capture for people (`*.decode.txt`);
/// the verdict comes from `--json`.
fn decode(pcap: &Path) -> Result<String> {
    let out = Command::new(host_xroce())
        .arg("decode")
        .arg(pcap)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!(
            "xroce decode {} failed: {}",
            pcap.display(),
            stderr.lines().last().unwrap_or("")
        );
    }
    let text = String::from_utf8_lossy(&out.stdout) + stderr;
    fs::write(pcap.with_extension("decode.txt"), text.as_bytes())?;
    let r = decode_report(pcap)?;
    let line = format!(
        "ICRC ok {}  bad {}  malformed {}",
        r.icrc_ok, r.icrc_bad, r.malformed
    );
    if r.icrc_ok == 0 || r.icrc_bad != 0 {
        bail!(
            "xroce decode {}: {line:?} (want ICRC ok > 0, bad 0)",
            pcap.display()
        );
    }
    let sr = go_back_n_only(&r).with_context(|| format!("xroce decode {}", pcap.display()))?;
    Ok(format!("{line}; {sr}"))
}

/// Every capture of this suite has rxe on at least one side, so no QP in
/// it may run selective repeat: no response carries the capable bit (an
/// xroce responder sets it once it runs SR; an xroce requester switches
/// only on such a response) and no ACK a SACK block. xroce's requests
/// carry the bit (it advertises); rxe ignores it.
fn go_back_n_only(r: &xroce_report::DecodeReport) -> Result<String> {
    let sum = |f: fn(&xroce_report::QpTraffic) -> u64| r.qps.iter().map(f).sum::<u64>();
    let (bit, responses, sacks) = (
        sum(|q| q.sr_capable),
        sum(|q| q.sr_responses),
        sum(|q| q.sacks),
    );
    if responses != 0 || sacks != 0 {
        bail!(
            "selective repeat facing rxe: {responses} responses with the SR bit, {sacks} SACKs \
             (want go-back-N: 0 and 0)"
        );
    }
    Ok(format!(
        "go-back-N (SR bit on {bit} requests, 0 SR responses, 0 SACKs)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_line_prefers_the_library_then_the_program() {
        let perftest = "xroce run: backend afxdp\n\
            xroce libibverbs: modify QP: max_rd_atomic 128 exceeds the device's 16 (errno 22)\n\
            Failed to modify QP to RTS\n\
            ---------------\n \
            Data ex. method : Ethernet\n\
            ---------------\n";
        assert!(failure_line(perftest).contains("(errno 22)"));
        let pingpong = "  local address: LID 0x0000\nCouldn't post send\n----\n";
        assert_eq!(failure_line(pingpong), "Couldn't post send");
        assert_eq!(failure_line("a line\n-----\n"), "a line");
    }

    #[test]
    fn a_capture_facing_rxe_must_show_go_back_n_only() {
        let row = |bit, responses, sacks| xroce_report::QpTraffic {
            sr_capable: bit,
            sr_responses: responses,
            sacks,
            ..Default::default()
        };
        let mut r = xroce_report::DecodeReport {
            qps: vec![row(40, 0, 0), row(0, 0, 0)],
            ..Default::default()
        };
        let ok = go_back_n_only(&r).unwrap();
        assert!(ok.contains("SR bit on 40 requests"), "{ok}");
        r.qps.push(row(3, 3, 0));
        assert!(go_back_n_only(&r).is_err(), "an SR responder");
        r.qps[2] = row(0, 0, 1);
        assert!(go_back_n_only(&r).is_err(), "a SACK");
    }

    #[test]
    fn dropin_names_and_tags() {
        let args = "-x 1 -F -m {mtu} -n {iters} -A CMP_AND_SWAP";
        assert_eq!(
            dropin_name("server", "ib_atomic_bw", args, 1024, "afxdp"),
            "dropin xroce-server <-> rxe ib_atomic_bw -A CMP_AND_SWAP MTU 1024 (afxdp)"
        );
        assert_eq!(
            dropin_name("client", "ib_write_bw", "-x 1 -F", 4096, "udp"),
            "dropin xroce-client <-> rxe ib_write_bw MTU 4096 (udp)"
        );
        assert_eq!(dropin_tag(args), "_cmp_and_swap");
        assert_eq!(dropin_tag("-x 1 -F"), "");
    }
}
