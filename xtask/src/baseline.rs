//! The xroce of a fixed earlier commit, built beside the current one, so a
//! benchmark can measure what a change costs in the same run (same machine,
//! same minute) rather than against figures from another day.
//!
//! The source is a detached git worktree under target/bench/, built in
//! release mode into a target directory of its own; both are reused by the
//! next run.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::util::{run, step, succeeds, workspace_root};

/// The last commit before processes could share a device (issue 12): the
/// single-process figures the shared device is held to.
pub const BEFORE_SHARED_DEVICE: &str = "ee12b18";

/// The last commit whose posts took the engine lock (issue 26, item 2):
/// what the post ring is measured against.
pub const BEFORE_POST_RING: &str = "3842216";

/// Builds `xroce` at `rev` (once) and returns the executable.
pub fn xroce_at(rev: &str) -> Result<PathBuf> {
    let root = workspace_root();
    let dir = root.join("target/bench").join(format!("src-{rev}"));
    let exe = dir.join("target/release/xroce");
    if !dir.join("Cargo.toml").is_file() {
        let known = succeeds(
            std::process::Command::new("git")
                .args(["cat-file", "-e", &format!("{rev}^{{commit}}")])
                .current_dir(&root),
        );
        if !known {
            bail!(
                "commit {rev} is not in this clone's history (a shallow clone?): \
                 `git fetch --unshallow` brings it"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
        let _ = run(std::process::Command::new("git")
            .args(["worktree", "prune"])
            .current_dir(&root));
        run(std::process::Command::new("git")
            .args(["worktree", "add", "--detach"])
            .arg(&dir)
            .arg(rev)
            .current_dir(&root))?;
    }
    if !exe.is_file() {
        step(&format!("build xroce at {rev} (release, once)"));
        run(
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args(["build", "--release", "-p", "xroce-cli"])
                .current_dir(&dir),
        )
        .with_context(|| format!("build xroce at {rev} in {}", dir.display()))?;
    }
    Ok(exe)
}
