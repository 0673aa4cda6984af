//! One MPI job of a collective experiment: Debian's unmodified Open MPI
//! running collective_step.c on every rank's host.
//!
//! mpirun runs in the bridge's namespace like on a head node (the bridge
//! has an address there); its launch agent (`--mca plm_rsh_agent`, a
//! script written per job) enters the rank's namespace, gives it an IPC and
//! UTS namespace of its own (a host name, and no shared memory with the
//! other ranks: UCX takes processes of one IPC namespace for one host) and
//! starts orted there, under `xroce run --iface IF` over xroce. As in
//! tests/tests/openmpi.rs and xtask's MPI bench:
//!
//! - over xroce: `--mca pml ucx --mca osc ucx` (Debian's
//!   openmpi-mca-params.conf turns both off), `UCX_TLS=rc,self`;
//! - over TCP: `--mca pml ob1 --mca btl tcp,self`, Open MPI's own TCP.
//!
//! `--bind-to none`: every "host" is this machine, and each rank would
//! otherwise be bound to the same first core. Over xroce the ranks get
//! `XROCE_SELECTIVE_REPEAT` (`-x`): how the drop-in recovers loss.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use xroce::cc::CcKind;

use crate::experiment::{
    procs::{self, Proc},
    topology::Topology,
};

/// The program every rank runs, compiled with mpicc at run time.
const SOURCE: &str = include_str!("../../../c/collective_step.c");

/// How the drop-in libibverbs recovers loss: `off` (go-back-N), `on`
/// (selective repeat) or `auto` (the two xroce peers agree in band).
pub const SELECTIVE_REPEAT: &str = "XROCE_SELECTIVE_REPEAT";

/// How the ranks move data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// pml ucx over UCX's rc_verbs over xroce's drop-in libibverbs.
    Xroce,
    /// pml ob1 with btl tcp, the XDP program detached.
    Tcp,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Xroce => "xroce",
            Transport::Tcp => "tcp",
        }
    }
}

/// mpicc and mpirun are there, or an error naming the packages.
pub fn check_tools() -> anyhow::Result<()> {
    for (tool, package) in [("mpicc", "libopenmpi-dev"), ("mpirun", "openmpi-bin")] {
        if Command::new(tool).arg("--version").output().is_err() {
            bail!("`{tool}` is missing: install {package} (`apt-get install openmpi-bin libopenmpi-dev`, or `cargo xtask setup`)");
        }
    }
    Ok(())
}

/// Writes collective_step.c into `dir` and compiles it there.
pub fn build_program(dir: &Path) -> anyhow::Result<PathBuf> {
    super::program::compile(
        dir,
        "collective_step.c",
        SOURCE,
        "mpicc",
        &["-O2", "-Wall", "-Werror"],
        &[],
    )
}

/// What one job runs and where.
pub struct Job<'a> {
    pub topo: &'a Topology,
    /// The xroce binary (for `xroce run`).
    pub xroce: &'a Path,
    pub program: &'a Path,
    pub schedule: &'a Path,
    pub transport: Transport,
    pub cc: CcKind,
    /// The controllers' parameters of the ranks over xroce.
    pub cc_params: &'a crate::experiment::cc_params::CcParams,
    /// XROCE_SELECTIVE_REPEAT of the ranks over xroce: off, on or auto.
    pub selective_repeat: &'a str,
    pub ops: &'a [String],
    pub sizes: &'a [u64],
    pub iters: usize,
    pub warmup: usize,
    /// This job's folder: agent, hostfile, the program's CSV, mpirun.log.
    pub dir: &'a Path,
    /// A job with no new iteration for this long is killed.
    pub stall: Duration,
}

/// A job that ran to its end.
pub struct Finished {
    /// The program's CSV.
    pub steps: String,
}

impl Job<'_> {
    /// The program's CSV.
    pub fn steps_path(&self) -> PathBuf {
        self.dir.join("steps.csv")
    }

    fn progress_path(&self) -> PathBuf {
        self.dir.join("steps.csv.progress")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("mpirun.log")
    }

    /// Runs the job; `progress(n)` hears of each iteration rank 0 finished.
    /// Retries once on UCX 1.13's UD connection race (see
    /// [`ucx_ud_connection_race`]), saying so.
    pub fn run(&self, progress: &mut dyn FnMut(u64)) -> anyhow::Result<Finished> {
        std::fs::create_dir_all(self.dir)
            .with_context(|| format!("create {}", self.dir.display()))?;
        match self.run_once(progress) {
            Err(e) if ucx_ud_connection_race(&self.log_text()).is_some() => {
                let sign = ucx_ud_connection_race(&self.log_text()).unwrap_or_default();
                eprintln!(
                    "xroce: the {} job hit UCX 1.13's UD connection race ({sign}; \
                     openucx/ucx#6040, #8743): running it once more ({e:#})",
                    self.transport.name()
                );
                let _ = std::fs::rename(self.log_path(), self.dir.join("mpirun-race.log"));
                self.run_once(progress)
            }
            other => other,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn run_once(&self, progress: &mut dyn FnMut(u64)) -> anyhow::Result<Finished> {
        for p in [self.steps_path(), self.progress_path()] {
            let _ = std::fs::remove_file(p);
        }
        let ranks = self.topo.hosts.len();
        let mut mpirun = Proc::spawn("mpirun", self.command()?, &self.log_path())?;
        let mut last = (0, Instant::now());
        let status = loop {
            if let Some(status) = mpirun.poll() {
                break status;
            }
            let done = line_count(&self.progress_path());
            if done != last.0 {
                progress(done - last.0);
                last = (done, Instant::now());
            }
            if procs::stop_requested() {
                mpirun.kill();
                bail!("interrupted (signal)");
            }
            if last.1.elapsed() > self.stall {
                mpirun.kill();
                bail!(
                    "the {} job made no progress for {} s: killed (its log: {})",
                    self.transport.name(),
                    self.stall.as_secs(),
                    self.log_path().display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        progress(line_count(&self.progress_path()).saturating_sub(last.0));
        let stdout = mpirun.stdout();
        append(&self.log_path(), &stdout);
        let log = self.log_text();
        if let Some(line) = log.lines().find(|l| l.contains("CHECK FAILED")) {
            bail!("a collective returned a wrong result: {}", line.trim());
        }
        if !status.success() {
            bail!(
                "mpirun ({}) exited {status}: {}",
                self.transport.name(),
                tail(&log, 8)
            );
        }
        let ok = format!("collective_step: ok: {ranks} ranks");
        if !stdout.lines().any(|l| l.starts_with(&ok)) {
            bail!(
                "the program did not report its results checked ({ok:?}): {}",
                tail(&log, 8)
            );
        }
        let steps = std::fs::read_to_string(self.steps_path())
            .with_context(|| format!("read {}", self.steps_path().display()))?;
        Ok(Finished { steps })
    }

    /// mpirun in the bridge's namespace.
    fn command(&self) -> anyhow::Result<Command> {
        let topo = self.topo;
        let head = topo
            .bridge_addr
            .context("the topology has no head node address")?;
        let subnet = format!(
            "{}.0/24",
            head.octets()[..3]
                .iter()
                .map(u8::to_string)
                .collect::<Vec<_>>()
                .join(".")
        );
        let hostfile = self.dir.join("hosts");
        let hosts: String = topo
            .hosts
            .iter()
            .map(|h| format!("{} slots=1\n", h.addr))
            .collect();
        std::fs::write(&hostfile, hosts).context("write the hostfile")?;
        let agent = self.write_agent()?;
        let home = self.dir.join("home");
        std::fs::create_dir_all(&home).context("create mpirun's HOME")?;

        let mut cmd = xroce_netns::command(&topo.bridge_netns, "mpirun");
        cmd.args(["--allow-run-as-root", "-np", &topo.hosts.len().to_string()])
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["--map-by", "node", "--bind-to", "none"])
            .arg("--mca")
            .arg("plm_rsh_agent")
            .arg(&agent)
            .args(["--mca", "oob_tcp_if_include", &subnet]);
        match self.transport {
            Transport::Xroce => {
                cmd.args(["--mca", "pml", "ucx", "--mca", "osc", "ucx"])
                    .args(["-x", "UCX_TLS", "-x", SELECTIVE_REPEAT])
                    .env("UCX_TLS", "rc,self")
                    .env(SELECTIVE_REPEAT, self.selective_repeat);
                for (name, spec) in self.cc_params.envs() {
                    cmd.args(["-x", name]).env(name, spec);
                }
            }
            Transport::Tcp => {
                cmd.args(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"])
                    .args(["--mca", "btl_tcp_if_include", &subnet]);
            }
        }
        let join = |v: Vec<String>| v.join(",");
        cmd.arg(self.program)
            .arg(join(self.ops.to_vec()))
            .arg(join(self.sizes.iter().map(u64::to_string).collect()))
            .arg(self.iters.to_string())
            .arg(self.warmup.to_string())
            .arg(self.schedule)
            .arg(self.steps_path())
            .env("HOME", &home)
            // mpirun takes the local shell from $SHELL when it may not
            // know root's; without one it warns.
            .env("SHELL", "/bin/sh");
        Ok(cmd)
    }

    /// The launch agent: `AGENT HOST COMMAND...` runs COMMAND (orted's
    /// command line, a shell snippet) as HOST's rank host.
    fn write_agent(&self) -> anyhow::Result<PathBuf> {
        let mut cases = String::new();
        for (i, h) in self.topo.hosts.iter().enumerate() {
            cases += &format!(
                "  {}) ns={}; iface={}; name=rank{i};;\n",
                h.addr,
                sh_quote(&xroce_netns::path(&h.netns).to_string_lossy()),
                sh_quote(&h.iface)
            );
        }
        let under_xroce = match self.transport {
            Transport::Xroce => format!(
                "{} run --iface \"$iface\" --backend afxdp --cc {} -- ",
                sh_quote(&self.xroce.to_string_lossy()),
                self.cc.name()
            ),
            Transport::Tcp => String::new(),
        };
        let script = format!(
            "#!/bin/sh\n\
             # Open MPI launch agent (plm_rsh_agent) of `xroce experiment collective`:\n\
             # HOST COMMAND... runs COMMAND on HOST's namespace as a host of its own.\n\
             host=$1; shift\n\
             case $host in\n{cases}  *) echo \"agent: unknown host $host\" >&2; exit 1;;\n\
             esac\n\
             exec nsenter --net=\"$ns\" -- unshare --ipc --uts -- \
             sh -c 'hostname \"$0\" && exec \"$@\"' \"$name\" \
             {under_xroce}sh -c \"$*\"\n"
        );
        let path = self.dir.join("agent.sh");
        std::fs::write(&path, script).context("write the launch agent")?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .context("chmod the launch agent")?;
        Ok(path)
    }
}

/// Single-quoted for sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub(super) fn line_count(path: &Path) -> u64 {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count() as u64)
        .unwrap_or(0)
}

pub(super) fn append(path: &Path, text: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path) {
        let _ = f.write_all(text.as_bytes());
    }
}

pub(super) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// The signs of UCX 1.13's UD transport mishandling crossing connection
/// requests, a bug of UCX's own (openucx/ucx#6040, open upstream;
/// #8743, fixed in UCX 1.20), whose window is wide when many ranks
/// connect at once on a loaded host (docs/clients.md). Returns the sign
/// seen, if any.
fn ucx_ud_connection_race(log: &str) -> Option<&'static str> {
    if log.contains("ud_ep.c:891") && log.contains("ep->dest_ep_id == ctl->conn_rep.src_ep_id") {
        return Some("UD CREP assertion");
    }
    if log.contains("Caught signal 11") && log.contains("uct_ud_ep_process_rx") {
        return Some("SIGSEGV in uct_ud_ep_process_rx");
    }
    if log.contains("ud_ep.c:") && log.contains("must be smaller than current_psn") {
        return Some("UD stale ACK assertion");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_ud_race_is_retried() {
        assert_eq!(
            ucx_ud_connection_race(
                "ud_ep.c:891  Assertion `ep->dest_ep_id == ctl->conn_rep.src_ep_id' failed"
            ),
            Some("UD CREP assertion")
        );
        assert_eq!(
            ucx_ud_connection_race("Caught signal 11\n ibv_poll_cq"),
            None
        );
        assert_eq!(
            ucx_ud_connection_race("collective_step: CHECK FAILED: allreduce"),
            None
        );
    }

    #[test]
    fn sh_quotes() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
    }
}
