//! The programs the ranks run, written into the experiment's work folder
//! and compiled there at run time (mpicc for Open MPI's, g++ for Gloo's),
//! so the experiment needs no build step of its own.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context};

/// Writes `source` to `dir/file` and compiles it with `compiler` into
/// `dir/<file without extension>`: `compiler FLAGS -o EXE SRC LIBS`.
pub fn compile(
    dir: &Path,
    file: &str,
    source: &str,
    compiler: &str,
    flags: &[&str],
    libs: &[&str],
) -> anyhow::Result<PathBuf> {
    let src = dir.join(file);
    let exe = src.with_extension("");
    std::fs::write(&src, source).with_context(|| format!("write {}", src.display()))?;
    let out = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(libs)
        .output()
        .with_context(|| format!("run {compiler}"))?;
    if !out.status.success() {
        bail!(
            "{compiler} {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(exe)
}
