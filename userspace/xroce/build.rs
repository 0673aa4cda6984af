//! Builds the XDP program in ebpf/ from source for bpfel-unknown-none and
//! leaves the object in OUT_DIR, where src/xdp/mod.rs embeds it. No prebuilt
//! object is ever committed.
//!
//! The nested build uses the nightly toolchain (-Z build-std=core) and
//! bpf-linker; `cargo xtask setup` installs both.
//!
//! `XROCE_BUILD_EBPF=0` skips it (as aya-template's AYA_BUILD_EBPF does):
//! an empty object is embedded, so the crate checks, builds and runs its
//! UDP backend and simulator on stable alone; loading XDP then fails with
//! an error that says how to rebuild.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

const EBPF_TARGET: &str = "bpfel-unknown-none";
const EBPF_BIN: &str = "xroce-xdp";
const SKIP_VAR: &str = "XROCE_BUILD_EBPF";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.join("../..").canonicalize().unwrap();
    let ebpf_dir = root.join("ebpf");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    // One shared target dir for every host profile (dev, release, clippy) so
    // core is built for bpfel once, not once per profile.
    let target_dir = root.join("target").join("ebpf");

    println!("cargo:rerun-if-env-changed={SKIP_VAR}");
    if env::var(SKIP_VAR).is_ok_and(|v| matches!(v.as_str(), "0" | "false" | "no")) {
        println!("cargo:warning={SKIP_VAR}=0: the XDP program is not built; this xroce runs the UDP backend only");
        std::fs::write(out_dir.join(EBPF_BIN), []).expect("write the empty XDP object");
        return;
    }

    for path in ["src", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", ebpf_dir.join(path).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        root.join("userspace/common/src").display()
    );

    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "build", "--release", "--locked"])
        .args(["--target", EBPF_TARGET, "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(&ebpf_dir);
    // The outer cargo sets these for the host build (stable rustc, clippy's
    // wrapper, host flags); the nested build must not inherit them.
    for var in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTUP_TOOLCHAIN",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO",
    ] {
        cmd.env_remove(var);
    }
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PROFILE_") || key.starts_with("CARGO_CFG_") {
            cmd.env_remove(key.as_ref());
        }
    }
    // BTF in the object lets bpftool and the kernel describe maps and code.
    cmd.env(
        "CARGO_ENCODED_RUSTFLAGS",
        ["-C", "debuginfo=2", "-C", "link-arg=--btf"].join("\x1f"),
    );

    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run `rustup run nightly cargo` to build the XDP program ({e}); run `cargo xtask setup`")
    });
    if !status.success() {
        panic!(
            "building the XDP program in {} failed; if the nightly toolchain, rust-src or bpf-linker is missing, run `cargo xtask setup`",
            ebpf_dir.display()
        );
    }
    let object = target_dir.join(EBPF_TARGET).join("release").join(EBPF_BIN);
    copy(&object, &out_dir.join(EBPF_BIN));
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), to.display()));
}
