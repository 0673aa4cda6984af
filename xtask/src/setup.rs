//! Installs what a fresh Debian machine lacks. Idempotent: each step checks
//! first and says what it found or did.

use std::process::Command;

use anyhow::{bail, Result};

use crate::util::{is_root, output, run, step, succeeds};

/// Debian packages: the C libraries xsk-rs builds libxdp/libbpf against
/// (libelf, zlib, libpcap headers), clang/llvm, and the tools the tests and
/// benchmarks drive (ip, ping, nsenter, bpftool, tshark, iperf3, sockperf,
/// xdp-tools' xdp-filter and xdp-loader beside xroce's program),
/// and rdma-core's unmodified programs that run over xroce's drop-in
/// libibverbs and librdmacm (ibverbs-utils, perftest, rdmacm-utils) with the
/// headers the ABI layout tests compare against (libibverbs-dev,
/// librdmacm-dev), and the stacks HPC and AI jobs move data with, run
/// unmodified over the drop-ins: UCX (ucx-utils), Open MPI over pml ucx
/// (openmpi-bin, libopenmpi-dev for the test program's mpicc), libfabric
/// (libfabric-bin), Gloo (libgloo-dev, g++ for the test program) and
/// pyverbs (python3-pyverbs, whose tests rdma-core ships in its docs);
/// libhwloc-dev for the test program that asks hwloc for the devices;
/// iptables, with which `xroce experiment collective` drops TCP segments
/// (the XDP fault injector drops only RoCEv2).
const APT_PACKAGES: &[&str] = &[
    "libelf-dev",
    "zlib1g-dev",
    "libpcap-dev",
    "pkg-config",
    "m4",
    "clang",
    "llvm",
    "iproute2",
    "iputils-ping",
    "util-linux",
    "bpftool",
    "tshark",
    "iperf3",
    "sockperf",
    "ethtool",
    "tcpdump",
    "xdp-tools",
    "ibverbs-utils",
    "perftest",
    "rdmacm-utils",
    "libibverbs-dev",
    "librdmacm-dev",
    "ucx-utils",
    "openmpi-bin",
    "libopenmpi-dev",
    "libfabric-bin",
    "libgloo-dev",
    "g++",
    "python3-pyverbs",
    "libhwloc-dev",
    "iptables",
];

const BPF_LINKER_VERSION: &str = "0.10.3";

pub fn setup() -> Result<()> {
    step("setup: checking what this machine needs");
    apt_packages()?;
    nightly_rust_src()?;
    bpf_linker()?;
    cargo_fuzz()?;
    position_independent_libxdp()?;
    bpffs()?;
    eprintln!("setup: everything is in place");
    Ok(())
}

fn apt_packages() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        eprintln!("setup: apt packages present");
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing packages {}; run `sudo apt-get install -y {}` or run this as root",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("setup: installing {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn dpkg_installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .map(|s| s.contains("install ok installed"))
        .unwrap_or(false)
}

fn nightly_rust_src() -> Result<()> {
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        eprintln!("setup: installing the nightly toolchain (the XDP program needs -Z build-std)");
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("setup: nightly rust-src present");
        return Ok(());
    }
    eprintln!("setup: adding rust-src to nightly (to build core for bpfel)");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn bpf_linker() -> Result<()> {
    let version = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if version.contains(BPF_LINKER_VERSION) {
        eprintln!("setup: bpf-linker {BPF_LINKER_VERSION} present");
        return Ok(());
    }
    eprintln!(
        "setup: installing bpf-linker {BPF_LINKER_VERSION} (newer ones need a system LLVM 22; about a minute)"
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).args([
        "install",
        &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        "--locked",
    ]))?;
    if !succeeds(Command::new("bpf-linker").arg("--version")) {
        bail!("bpf-linker was installed but is not on PATH; add ~/.cargo/bin to PATH");
    }
    Ok(())
}

/// cargo-fuzz runs the codec's coverage-guided fuzz target in `test`.
fn cargo_fuzz() -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if succeeds(Command::new(&cargo).args(["fuzz", "--version"])) {
        eprintln!("setup: cargo-fuzz present");
        return Ok(());
    }
    eprintln!("setup: installing cargo-fuzz (runs the parser fuzzer in `cargo xtask test`; a few minutes)");
    run(Command::new(&cargo).args(["install", "cargo-fuzz", "--locked"]))
}

/// libxdp-sys builds libxdp.a inside its registry source tree with make,
/// which keeps objects it built before. The drop-in libibverbs.so.1 links
/// libxdp into a shared library, so the objects must be position
/// independent (.cargo/config.toml sets CFLAGS=-fPIC); a copy built
/// without it (R_X86_64_PC32 relocations) is removed so that it rebuilds.
fn position_independent_libxdp() -> Result<()> {
    let Some(home) = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")))
    else {
        return Ok(());
    };
    let Ok(registries) = std::fs::read_dir(home.join("registry/src")) else {
        return Ok(());
    };
    for registry in registries.flatten() {
        let Ok(crates) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for krate in crates.flatten() {
            if !krate
                .file_name()
                .to_string_lossy()
                .starts_with("libxdp-sys-")
            {
                continue;
            }
            let lib = krate.path().join("xdp-tools/lib/libxdp");
            let objs = lib.join("staticobjs");
            let Ok(entries) = std::fs::read_dir(&objs) else {
                continue;
            };
            let non_pic = entries.flatten().any(|o| {
                output(Command::new("readelf").arg("-rW").arg(o.path()))
                    .map(|r| {
                        r.lines()
                            .any(|l| l.contains("R_X86_64_PC32") && l.contains(" stderr"))
                    })
                    .unwrap_or(false)
            });
            if non_pic {
                eprintln!(
                    "setup: {} was built without -fPIC; removing it so it rebuilds position-independent",
                    objs.display()
                );
                std::fs::remove_dir_all(&objs)?;
                let _ = std::fs::remove_file(lib.join("libxdp.a"));
                let _ = succeeds(
                    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                        .args(["clean", "-p", "libxdp-sys"])
                        .current_dir(crate::util::workspace_root()),
                );
            }
        }
    }
    Ok(())
}

/// libxdp's dispatcher (xdp-filter, xdp-loader beside xroce's program)
/// keeps its programs under /sys/fs/bpf, which systemd mounts on most
/// machines but a bare container or VM may not have: mount it there when
/// it is absent, as systemd would.
fn bpffs() -> Result<()> {
    let mounted = std::fs::read_to_string("/proc/self/mounts")?
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "));
    if mounted {
        eprintln!("setup: bpffs mounted at /sys/fs/bpf");
        return Ok(());
    }
    if !is_root() {
        bail!("bpffs is not mounted at /sys/fs/bpf: run `sudo mount -t bpf bpf /sys/fs/bpf`");
    }
    eprintln!(
        "setup: mounting bpffs at /sys/fs/bpf (libxdp's dispatcher keeps its programs there)"
    );
    std::fs::create_dir_all("/sys/fs/bpf")?;
    run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))
}
