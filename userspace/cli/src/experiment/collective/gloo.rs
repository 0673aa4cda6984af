//! One Gloo job of a collective experiment (`--library gloo`): Debian's
//! unmodified Gloo (libgloo-dev) running collective_step_gloo.cc on every
//! rank's host, no mpirun. Each rank is started here, in its namespace
//! (`nsenter --net`), and the ranks meet through Gloo's FileStore in the
//! job's folder (every namespace sees the same files):
//!
//! - over xroce: Gloo's ibverbs transport on the drop-in libibverbs, under
//!   `xroce run --iface IF --backend afxdp --cc CC` with
//!   XROCE_SELECTIVE_REPEAT (device `xroce_IF`, GID index 1: RoCEv2 over
//!   IPv4);
//! - over TCP: Gloo's TCP transport bound to the rank's address (XDP
//!   detached, as for MPI).
//!
//! Gloo's ring allreduce of floats, every element checked; the program
//! writes the same CSV as collective_step.c.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use xroce::cc::CcKind;

use super::job::{append, line_count, tail, Finished, Transport, SELECTIVE_REPEAT};
use crate::experiment::{
    procs::{self, Proc},
    topology::Topology,
};

/// The program every rank runs, compiled with g++ at run time.
const SOURCE: &str = include_str!("../../../c/collective_step_gloo.cc");

/// A header of Debian's libgloo-dev the program needs (its ibverbs
/// transport).
const GLOO_HEADER: &str = "/usr/include/gloo/transport/ibverbs/device.h";

/// g++ and Gloo's headers are there, or an error naming the packages.
pub fn check_tools() -> anyhow::Result<()> {
    if Command::new("g++").arg("--version").output().is_err() {
        bail!("`g++` is missing (--library gloo compiles its program): install g++ (`apt-get install g++ libgloo-dev`, or `cargo xtask setup`)");
    }
    if !Path::new(GLOO_HEADER).exists() {
        bail!("Gloo's headers are missing ({GLOO_HEADER}): install libgloo-dev (`apt-get install libgloo-dev`, or `cargo xtask setup`)");
    }
    Ok(())
}

/// Writes collective_step_gloo.cc into `dir` and compiles it there
/// against Debian's libgloo (which calls libibverbs and uses threads).
pub fn build_program(dir: &Path) -> anyhow::Result<PathBuf> {
    super::program::compile(
        dir,
        "collective_step_gloo.cc",
        SOURCE,
        "g++",
        &["-std=c++17", "-O2", "-Wall", "-Werror"],
        &["-L/usr/lib", "-lgloo", "-libverbs", "-lpthread"],
    )
}

/// What one Gloo job runs and where.
pub struct GlooJob<'a> {
    pub topo: &'a Topology,
    /// The xroce binary (for `xroce run`).
    pub xroce: &'a Path,
    pub program: &'a Path,
    pub schedule: &'a Path,
    pub transport: Transport,
    pub cc: CcKind,
    /// The controllers' parameters of the ranks over xroce.
    pub cc_params: &'a crate::experiment::cc_params::CcParams,
    /// XROCE_SELECTIVE_REPEAT of the ranks over xroce.
    pub selective_repeat: &'a str,
    pub sizes: &'a [u64],
    pub iters: usize,
    pub warmup: usize,
    /// This job's folder: the store, the program's CSV, a log per rank.
    pub dir: &'a Path,
    /// A job with no new iteration for this long is killed.
    pub stall: Duration,
}

impl GlooJob<'_> {
    /// The program's CSV (rank 0 writes it).
    pub fn steps_path(&self) -> PathBuf {
        self.dir.join("steps.csv")
    }

    fn progress_path(&self) -> PathBuf {
        self.dir.join("steps.csv.progress")
    }

    fn store_path(&self) -> PathBuf {
        self.dir.join("store")
    }

    fn log_path(&self, rank: usize) -> PathBuf {
        self.dir.join(format!("rank{rank}.log"))
    }

    /// Runs the job; `progress(n)` hears of each iteration rank 0
    /// finished. Every rank started here has ended when this returns (a
    /// [`Proc`] is killed by PID when dropped).
    pub fn run(&self, progress: &mut dyn FnMut(u64)) -> anyhow::Result<Finished> {
        std::fs::create_dir_all(self.dir)
            .with_context(|| format!("create {}", self.dir.display()))?;
        for p in [self.steps_path(), self.progress_path()] {
            let _ = std::fs::remove_file(p);
        }
        // A store of an earlier run would hand out stale addresses.
        let _ = std::fs::remove_dir_all(self.store_path());
        std::fs::create_dir_all(self.store_path())
            .with_context(|| format!("create {}", self.store_path().display()))?;
        let mut ranks = Vec::new();
        for rank in 0..self.topo.hosts.len() {
            let name = format!("Gloo rank {rank}");
            ranks.push(Proc::spawn(
                &name,
                self.command(rank),
                &self.log_path(rank),
            )?);
        }
        let mut last = (0, Instant::now());
        loop {
            let mut running = 0;
            for (rank, p) in ranks.iter_mut().enumerate() {
                match p.poll() {
                    None => running += 1,
                    Some(s) if s.success() => {}
                    Some(s) => {
                        // The others cannot finish without it.
                        for q in ranks.iter_mut() {
                            q.kill();
                        }
                        return Err(self.failure(rank, &format!("exited {s}")));
                    }
                }
            }
            let done = line_count(&self.progress_path());
            if done != last.0 {
                progress(done - last.0);
                last = (done, Instant::now());
            }
            if running == 0 {
                break;
            }
            if procs::stop_requested() {
                bail!("interrupted (signal)");
            }
            if last.1.elapsed() > self.stall {
                bail!(
                    "the Gloo {} job made no progress for {} s: killed (logs: {})",
                    self.transport.name(),
                    self.stall.as_secs(),
                    self.dir.join("rank*.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut stdout0 = String::new();
        for (rank, p) in ranks.iter_mut().enumerate() {
            let out = p.stdout();
            append(&self.log_path(rank), &out);
            if rank == 0 {
                stdout0 = out;
            }
        }
        let ok = format!("collective_step: ok: {} ranks", ranks.len());
        if !stdout0.lines().any(|l| l.starts_with(&ok)) {
            return Err(self.failure(0, &format!("did not report its results checked ({ok:?})")));
        }
        let steps = std::fs::read_to_string(self.steps_path())
            .with_context(|| format!("read {}", self.steps_path().display()))?;
        Ok(Finished { steps })
    }

    /// The error of a rank that failed: a wrong result first, else the
    /// end of its log.
    fn failure(&self, rank: usize, what: &str) -> anyhow::Error {
        let log = std::fs::read_to_string(self.log_path(rank)).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains("CHECK FAILED")) {
            return anyhow::anyhow!("a collective returned a wrong result: {}", line.trim());
        }
        anyhow::anyhow!(
            "Gloo rank {rank} ({}) {what}: {}",
            self.transport.name(),
            tail(&log, 8)
        )
    }

    /// Rank `rank`'s program in its namespace: under `xroce run` over
    /// xroce, alone over TCP.
    fn command(&self, rank: usize) -> Command {
        let host = &self.topo.hosts[rank];
        let (mut cmd, transport, device) = match self.transport {
            Transport::Xroce => {
                let mut cmd = host.command(self.xroce);
                cmd.args(["run", "--iface", &host.iface, "--backend", "afxdp"])
                    .args(["--cc", self.cc.name(), "--"])
                    .arg(self.program)
                    .env(SELECTIVE_REPEAT, self.selective_repeat)
                    .envs(self.cc_params.envs());
                (cmd, "ibverbs", format!("xroce_{}", host.iface))
            }
            Transport::Tcp => (host.command(self.program), "tcp", host.addr.to_string()),
        };
        let sizes: Vec<String> = self.sizes.iter().map(u64::to_string).collect();
        cmd.args([transport, &device, &rank.to_string()])
            .arg(self.topo.hosts.len().to_string())
            .arg(self.store_path())
            .arg(sizes.join(","))
            .arg(self.iters.to_string())
            .arg(self.warmup.to_string())
            .arg(self.schedule)
            .arg(self.steps_path());
        cmd
    }
}
