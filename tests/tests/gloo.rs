//! Gloo (Debian's libgloo-dev, ibverbs transport, unmodified) over xroce:
//! tests/c/gloo_collectives.cc runs ring allreduce, halving-doubling
//! allreduce and one-to-all broadcast with a new context and new buffers
//! in every iteration, checks every result exactly, and before each
//! teardown waits until every send it posted has completed (failing if
//! one never does) and stops Gloo's device thread (two teardown races of
//! Gloo 2022 itself; see the program). Each rank runs in its own
//! namespace under `xroce run`:
//! two ranks over a veth pair, four over a bridge, on both backends. The
//! ranks meet through Gloo's FileStore in the test's directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use xroce_tests::{
    lan::Lan,
    programs::{serial, Backend, Finished, Proc, TempDir, Topology},
    require_root,
    verbs::{ibverbs_cdylib, workspace_root},
};

/// Iterations per run: sizes cycle through 1, 1000, 4099, 65536 and
/// 262147 floats (> 1 MiB), three collectives each.
const ITERATIONS: usize = 20;
/// Every rank gets this long (a loaded 2-core host runs four ranks).
const TIMEOUT: Duration = Duration::from_secs(300);

/// The program, compiled with g++ against libgloo-dev into `dir`.
fn build(dir: &Path) -> PathBuf {
    require_root();
    assert!(
        Path::new("/usr/include/gloo/transport/ibverbs/device.h").exists(),
        "Gloo's headers are missing: install libgloo-dev (cargo xtask setup does)"
    );
    let _ = ibverbs_cdylib();
    let exe = dir.join("gloo_collectives");
    let src = workspace_root().join("tests/c/gloo_collectives.cc");
    // Debian's libgloo.so is in /usr/lib; the program calls libibverbs
    // itself (Gloo's headers include verbs.h) and uses threads.
    let out = Command::new("g++")
        .args(["-std=c++17", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-L/usr/lib", "-lgloo", "-libverbs", "-lpthread"])
        .output()
        .expect("run g++ (install g++: cargo xtask setup does)");
    assert!(
        out.status.success(),
        "g++ rejected {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Every rank exited 0 and printed its per-iteration lines and the final
/// count of checked results.
fn check_ranks(ranks: Vec<Finished>) -> Result<String, String> {
    let size = ranks.len();
    let mut waits = Vec::new();
    for (rank, f) in ranks.iter().enumerate() {
        f.check().map_err(|e| format!("rank {rank}:\n{e}"))?;
        let done = format!(
            "gloo_collectives rank {rank} of {size}: all {} checks passed",
            3 * ITERATIONS
        );
        let Some(line) = f.stdout.lines().find(|l| l.starts_with(&done)) else {
            return Err(format!("rank {rank} lacks {done:?}\n{}", f.describe()));
        };
        let per_iteration = f
            .stdout
            .lines()
            .filter(|l| l.ends_with("ring, halving-doubling, broadcast ok"))
            .count();
        if per_iteration != ITERATIONS {
            return Err(format!(
                "rank {rank}: {per_iteration} of {ITERATIONS} iteration lines\n{}",
                f.describe()
            ));
        }
        let wait = line
            .rsplit_once("completions ")
            .map_or("?", |(_, w)| w.trim_end_matches(')'));
        waits.push(format!("rank {rank} {wait}"));
    }
    let secs = ranks.iter().map(|f| f.secs).fold(0.0, f64::max);
    Ok(format!(
        "{size} ranks, {ITERATIONS} iterations in {secs:.1}s; longest wait for send completions: {}",
        waits.join(", ")
    ))
}

fn two_ranks(backend: Backend) {
    let _serial = serial();
    let topo = Topology::direct(backend, 1500);
    let exe = build(&topo.dir.0);
    let store = topo.dir.0.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let procs: Vec<Proc> = [topo.client(), topo.server()]
        .into_iter()
        .enumerate()
        .map(|(rank, node)| {
            let args = [
                node.device(),
                rank.to_string(),
                "2".into(),
                store.display().to_string(),
                ITERATIONS.to_string(),
            ];
            topo.start(node, exe.to_str().unwrap(), &args)
        })
        .collect();
    let ranks = procs.into_iter().map(|p| p.finish(TIMEOUT)).collect();
    match check_ranks(ranks) {
        Ok(summary) => eprintln!("gloo {}: {summary}", backend.as_str()),
        Err(e) => panic!("Gloo over xroce ({}), two ranks:\n{e}", backend.as_str()),
    }
}

fn four_ranks(backend: Backend) {
    let _serial = serial();
    let dir = TempDir::new();
    let exe = build(&dir.0);
    let store = dir.0.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let lan = Lan::new(4, 1500);
    let procs: Vec<Proc> = lan
        .members
        .iter()
        .enumerate()
        .map(|(rank, m)| {
            let mut cmd = m.xroce_run(backend.as_str(), &exe);
            cmd.args([
                m.device(),
                rank.to_string(),
                "4".into(),
                store.display().to_string(),
                ITERATIONS.to_string(),
            ]);
            let what = format!("[{} in {}] rank {rank} of 4", backend.as_str(), m.ns.name);
            Proc::spawn(cmd, what, &dir.0)
        })
        .collect();
    let ranks = procs.into_iter().map(|p| p.finish(TIMEOUT)).collect();
    match check_ranks(ranks) {
        Ok(summary) => eprintln!("gloo {}: {summary}", backend.as_str()),
        Err(e) => panic!("Gloo over xroce ({}), four ranks:\n{e}", backend.as_str()),
    }
}

#[test]
fn gloo_two_ranks_udp() {
    two_ranks(Backend::Udp);
}

#[test]
fn gloo_two_ranks_afxdp() {
    two_ranks(Backend::AfXdp);
}

#[test]
fn gloo_four_ranks_udp() {
    four_ranks(Backend::Udp);
}

#[test]
fn gloo_four_ranks_afxdp() {
    four_ranks(Backend::AfXdp);
}
