//! The receiver and sender processes of an experiment, and what ends them:
//! each child is killed by its own PID (never by name) when its guard
//! drops, and SIGINT/SIGTERM/SIGHUP only raise a flag the run loop polls,
//! so the usual unwinding path tears everything down.

use std::{
    fs::File,
    io::Read,
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context;

pub use crate::stop::{install_signal_handlers, stop_requested};

/// A child process, killed (by PID) on drop if it still runs.
pub struct Proc {
    child: Child,
    reader: Option<std::thread::JoinHandle<String>>,
    status: Option<ExitStatus>,
    /// When it was first seen exited (to within one poll).
    pub exited: Option<Instant>,
    /// When it was started, on the experiment's clock.
    pub started: Instant,
}

impl Proc {
    /// Starts `cmd` with stdout piped (one JSON object at the end) and
    /// stderr to `log`. Its own process group keeps a terminal's Ctrl-C
    /// for us: we end it in order.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let log_file = File::create(log).with_context(|| format!("create {}", log.display()))?;
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        // SAFETY: prctl is async-signal-safe; nsenter execs the program
        // without forking, so the child dies with us even on SIGKILL.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .with_context(|| format!("start the {name}: {cmd:?}"))?;
        // Read stdout as it comes so a chatty child never blocks on a pipe.
        let mut out = child.stdout.take().expect("piped stdout");
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            text
        });
        Ok(Self {
            child,
            reader: Some(reader),
            status: None,
            exited: None,
            started: Instant::now(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if it has exited (reaped once).
    pub fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
            if self.status.is_some() {
                self.exited = Some(Instant::now());
            }
        }
        self.status
    }

    /// Waits up to `timeout` for it to exit.
    pub fn wait_for(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.poll().is_none() && Instant::now() < deadline && !stop_requested() {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.poll()
    }

    /// Everything it printed on stdout (call after it exited).
    pub fn stdout(&mut self) -> String {
        self.reader
            .take()
            .and_then(|r| r.join().ok())
            .unwrap_or_default()
    }

    /// SIGTERM, then SIGKILL after a grace period; by PID only.
    pub fn kill(&mut self) {
        if self.poll().is_some() {
            return;
        }
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signalling our own unreaped child: its PID cannot have
        // been reused while we have not waited for it.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        if self.wait_for_quietly(Duration::from_millis(1500)).is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
            self.exited = Some(Instant::now());
        }
    }

    fn wait_for_quietly(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.poll().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.poll()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// True once `pid` (a process in another namespace) has a socket listening
/// on TCP `port` or bound to UDP `port`, from /proc/PID/net (which shows the
/// process's own namespace).
pub fn listening(pid: u32, port: u16) -> bool {
    let hex = format!(":{port:04X}");
    let tcp_listen = |path: String| {
        std::fs::read_to_string(path).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1].ends_with(&hex) && f[3] == "0A"
            })
        })
    };
    let udp_bound = |path: String| {
        std::fs::read_to_string(path).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|local| local.ends_with(&hex))
            })
        })
    };
    tcp_listen(format!("/proc/{pid}/net/tcp"))
        || tcp_listen(format!("/proc/{pid}/net/tcp6"))
        || udp_bound(format!("/proc/{pid}/net/udp"))
        || udp_bound(format!("/proc/{pid}/net/udp6"))
}

/// Kills (SIGKILL, by PID) every process whose network namespace is the
/// one pinned at `netns_path`, and waits until they are gone (up to 5 s).
/// Only for namespaces the experiment made: whatever runs there it
/// started, directly or through its children (mpirun's daemons outlive a
/// killed mpirun).
pub fn kill_in_netns(netns_path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(ns) = std::fs::metadata(netns_path) else {
        return;
    };
    let in_ns = |pid: &str| {
        std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .is_ok_and(|m| (m.dev(), m.ino()) == (ns.dev(), ns.ino()))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids: Vec<String> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|name| name.parse::<u32>().is_ok() && in_ns(name))
            .collect();
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids {
            kill_if(&pid, &in_ns);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILL to `pid` through a pidfd, if `still_ours` holds once the pidfd
/// pins the process (so a PID reused since the scan is never signalled).
fn kill_if(pid: &str, still_ours: &dyn Fn(&str) -> bool) {
    let Ok(n) = pid.parse::<libc::pid_t>() else {
        return;
    };
    // SAFETY: pidfd_open takes a PID and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, n, 0) } as libc::c_int;
    if fd < 0 {
        return;
    }
    if still_ours(pid) {
        // SAFETY: fd is the pidfd opened above; no siginfo is passed.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }
    // SAFETY: closing the fd we own.
    unsafe { libc::close(fd) };
}
