//! Unmodified rdma-core programs (ibverbs-utils, perftest) run under
//! `xroce run` between two namespaces: the server in one, the client in the
//! other, each on its own end of a veth link and its own `xroce_IF` device.
//!
//! Everything a test starts is ended by PID when its guard drops (a hung
//! program is killed after its timeout), XDP is detached and the pins
//! removed before the namespaces go, and the temporary files are deleted.
//! Tests in one binary share the two cores with each other: [`serial`]
//! makes them take turns so that timing-sensitive programs do not starve.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs::File,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicU16, AtomicU32, Ordering},
        Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use crate::{run, unique_tag, workspace_bin, Netns, VethPair};

/// The packet-I/O backend the library is told to use (`xroce run --backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    AfXdp,
    Udp,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::AfXdp => "afxdp",
            Backend::Udp => "udp",
        }
    }
}

/// Makes the tests of one binary run one at a time (held for a whole test);
/// a test that panicked does not block the others.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// One end of the link: its namespace, interface and address.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    pub ns: &'a Netns,
    pub iface: &'a str,
    pub addr: Ipv4Addr,
}

impl Node<'_> {
    /// The device the library offers for this interface.
    pub fn device(&self) -> String {
        format!("xroce_{}", self.iface)
    }
}

/// Two namespaces joined through a bridge in a third one, where a capture
/// sees every frame on the wire (AF_XDP frames bypass tcpdump at both ends:
/// transmitted ones skip the packet taps, received ones are redirected by
/// XDP before them).
pub struct Bridged {
    // Namespaces are deleted when dropped, with every interface in them.
    pub a: Netns,
    pub b: Netns,
    pub m: Netns,
    pub if_a: String,
    pub if_b: String,
    /// The bridge port (in `m`) facing `if_b`: where to capture.
    pub port_b: String,
    pub addr_a: Ipv4Addr,
    pub addr_b: Ipv4Addr,
}

fn next_subnet() -> u8 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    ((std::process::id().wrapping_mul(13) + NEXT.fetch_add(1, Ordering::Relaxed)) % 250) as u8 + 1
}

impl Bridged {
    pub fn new(mtu: u32) -> Self {
        let tag = unique_tag();
        let a = Netns::new(format!("xr{tag}a"));
        let b = Netns::new(format!("xr{tag}b"));
        let m = Netns::new(format!("xr{tag}m"));
        let (if_a, if_b) = (format!("xr{tag}a"), format!("xr{tag}b"));
        let (port_a, port_b, bridge) = (
            format!("xr{tag}ma"),
            format!("xr{tag}mb"),
            format!("xr{tag}br"),
        );
        let octet = next_subnet();
        let addr_a = Ipv4Addr::new(10, 78, octet, 1);
        let addr_b = Ipv4Addr::new(10, 78, octet, 2);
        let mtu = mtu.to_string();
        m.exec(&["ip", "link", "add", &bridge, "type", "bridge"]);
        m.exec(&["ip", "link", "set", &bridge, "mtu", &mtu]);
        for (ns, ifname, port, addr) in [(&a, &if_a, &port_a, addr_a), (&b, &if_b, &port_b, addr_b)]
        {
            run(Command::new("ip").args([
                "link", "add", ifname, "netns", &ns.name, "type", "veth", "peer", "name", port,
                "netns", &m.name,
            ]));
            m.exec(&["ip", "link", "set", port, "mtu", &mtu]);
            m.exec(&["ip", "link", "set", port, "master", &bridge]);
            m.exec(&["ip", "link", "set", port, "up"]);
            ns.exec(&["ip", "link", "set", ifname, "mtu", &mtu]);
            ns.exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", ifname]);
            ns.exec(&["ip", "link", "set", ifname, "up"]);
        }
        m.exec(&["ip", "link", "set", &bridge, "up"]);
        Self {
            a,
            b,
            m,
            if_a,
            if_b,
            port_b,
            addr_a,
            addr_b,
        }
    }
}

enum Wire {
    Direct(VethPair),
    Bridged(Bridged),
}

/// A directory of this test's own, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("xroce-programs-{}", unique_tag()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self(dir)
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The link, the backend every program on it uses, and a scratch
/// directory. Servers run in namespace b, clients in a. On drop, XDP is
/// detached from both interfaces (`xroce run --backend afxdp` leaves it
/// attached) before the namespaces are deleted.
pub struct Topology {
    pub backend: Backend,
    wire: Wire,
    pub dir: TempDir,
    /// Environment every program gets besides `xroce run`'s (e.g.
    /// `XROCE_IO_THREADS`).
    pub env: Vec<(String, String)>,
}

impl Topology {
    /// A veth pair of the given MTU (`VethPair`).
    pub fn direct(backend: Backend, mtu: u32) -> Self {
        Self::direct_queues(backend, mtu, 1)
    }

    /// A veth pair with `queues` RX and TX queues on each end
    /// ([`VethPair::with_queues`]).
    pub fn direct_queues(backend: Backend, mtu: u32, queues: u32) -> Self {
        require_library();
        Self {
            backend,
            wire: Wire::Direct(VethPair::with_queues(mtu, queues)),
            dir: TempDir::new(),
            env: Vec::new(),
        }
    }

    /// Both ends on a bridge in a third namespace ([`Bridged`]).
    pub fn bridged(backend: Backend, mtu: u32) -> Self {
        require_library();
        Self {
            backend,
            wire: Wire::Bridged(Bridged::new(mtu)),
            dir: TempDir::new(),
            env: Vec::new(),
        }
    }

    pub fn server(&self) -> Node<'_> {
        match &self.wire {
            Wire::Direct(p) => Node {
                ns: &p.b,
                iface: &p.if_b,
                addr: p.addr_b,
            },
            Wire::Bridged(p) => Node {
                ns: &p.b,
                iface: &p.if_b,
                addr: p.addr_b,
            },
        }
    }

    pub fn client(&self) -> Node<'_> {
        match &self.wire {
            Wire::Direct(p) => Node {
                ns: &p.a,
                iface: &p.if_a,
                addr: p.addr_a,
            },
            Wire::Bridged(p) => Node {
                ns: &p.a,
                iface: &p.if_a,
                addr: p.addr_a,
            },
        }
    }

    /// Gives both ends an IPv6 address ([`VethPair::add_ipv6`], direct
    /// links only); returns (the client's, the server's).
    pub fn add_ipv6(&self) -> (Ipv6Addr, Ipv6Addr) {
        match &self.wire {
            Wire::Direct(p) => p.add_ipv6(),
            Wire::Bridged(_) => panic!("Topology::add_ipv6: direct links only"),
        }
    }

    /// Where a capture sees the server's traffic: the bridge port facing
    /// it (bridged links only).
    pub fn tap(&self) -> Option<(&Netns, &str)> {
        match &self.wire {
            Wire::Direct(_) => None,
            Wire::Bridged(p) => Some((&p.m, &p.port_b)),
        }
    }

    /// Runs `run` while tcpdump listens on the bridge port facing the
    /// server ([`Self::tap`]), writing `name` in the test's directory;
    /// returns what `run` returned, the capture file and tcpdump's summary.
    pub fn captured<T>(
        &self,
        name: &str,
        run: impl FnOnce() -> T,
    ) -> Result<(T, PathBuf, String), String> {
        let (tap_ns, tap_if) = self.tap().expect("bridged topology");
        let file = self.dir.0.join(name);
        let cap = Tcpdump::start(tap_ns, tap_if, file.clone(), &self.dir.0)?;
        let out = run();
        let summary = cap.stop()?;
        Ok((out, file, summary))
    }

    /// `xroce run --iface IF --backend B -- PROGRAM ARGS` in the node's
    /// namespace (nsenter --net).
    pub fn command(&self, node: Node<'_>, program: &str, args: &[String]) -> Command {
        let mut cmd = node.ns.command(workspace_bin("xroce"));
        cmd.args([
            "run",
            "--iface",
            node.iface,
            "--backend",
            self.backend.as_str(),
        ])
        .arg("--")
        .arg(program)
        .args(args)
        // Failing verbs explain themselves on stderr.
        .env("XROCE_VERBS_DEBUG", "1")
        .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Starts PROGRAM on `node` (see [`Topology::command`]).
    pub fn start(&self, node: Node<'_>, program: &str, args: &[String]) -> Proc {
        let what = format!(
            "[{} in {}] {program} {}",
            self.backend.as_str(),
            node.ns.name,
            args.join(" ")
        );
        Proc::spawn(self.command(node, program, args), what, &self.dir.0)
    }

    /// Runs PROGRAM on `node` to its end (killed after `timeout`).
    pub fn run(
        &self,
        node: Node<'_>,
        program: &str,
        args: &[String],
        timeout: Duration,
    ) -> Finished {
        self.start(node, program, args).finish(timeout)
    }

    /// A server/client pair of PROGRAM: the server (`server_args -p PORT`)
    /// in b, started first; once it listens, the client (`client_args -p
    /// PORT ADDR_B`) in a. Both get `timeout`.
    pub fn pair(
        &self,
        program: &str,
        server_args: &[String],
        client_args: &[String],
        timeout: Duration,
    ) -> PairOutput {
        let port = next_port();
        let (server, client) = (self.server(), self.client());
        let mut sargs = server_args.to_vec();
        sargs.extend(["-p".to_string(), port.to_string()]);
        let mut cargs = client_args.to_vec();
        cargs.extend(["-p".to_string(), port.to_string(), server.addr.to_string()]);
        let mut srv = self.start(server, program, &sargs);
        if let Err(why) = wait_listening(server.ns, port, &mut srv, Duration::from_secs(30)) {
            let srv = srv.finish(Duration::from_secs(1));
            return PairOutput {
                server: srv,
                client: None,
                setup_error: Some(why),
            };
        }
        let client = self.run(client, program, &cargs, timeout);
        // The server ends right after its client (or soon after the
        // client's failure); don't wait the whole timeout for a stuck one.
        let grace = if client.status.is_some_and(|s| s.success()) {
            timeout
        } else {
            Duration::from_secs(10)
        };
        let server = srv.finish(grace);
        PairOutput {
            server,
            client: Some(client),
            setup_error: None,
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // `xroce run --backend afxdp` leaves XDP attached; the program runs
        // have ended (their guards were dropped first).
        for node in [self.server(), self.client()] {
            let _ = node
                .ns
                .command(workspace_bin("xroce"))
                .args(["detach", "--iface", node.iface])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = std::fs::remove_dir_all(xroce::xdp::pin_dir(node.iface));
        }
    }
}

/// `xroce run` finds the library next to itself unless XROCE_LIB_DIR
/// says where: build it there (once per test process), so a test binary
/// that runs before any other built it does not find it missing.
fn require_library() {
    if std::env::var_os("XROCE_LIB_DIR").is_none() {
        crate::verbs::ibverbs_cdylib();
    }
}

/// A TCP port of its own for every run of this test process.
pub fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    33000 + (std::process::id() % 100) as u16 * 200 + NEXT.fetch_add(1, Ordering::Relaxed) % 200
}

/// Waits until something in `ns` listens on TCP `port`; fails early if
/// `server` exits first.
pub fn wait_listening(
    ns: &Netns,
    port: u16,
    server: &mut Proc,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let out = ns
            .command("ss")
            .args(["-Hltn", "sport", "=", &format!(":{port}")])
            .output()
            .map_err(|e| format!("cannot run ss: {e}"))?;
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return Ok(());
        }
        if server.exited() {
            return Err(format!("server exited before listening on port {port}"));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "server did not listen on port {port} within {timeout:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process we started, its output going to files (no pipe can fill and
/// block it). Killed by PID if still running when dropped.
pub struct Proc {
    child: Child,
    pub what: String,
    out: PathBuf,
    err: PathBuf,
    started: Instant,
}

impl Proc {
    pub fn spawn(mut cmd: Command, what: String, dir: &Path) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let out = dir.join(format!("{n}.out"));
        let err = dir.join(format!("{n}.err"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&out).expect("create stdout file"))
            .stderr(File::create(&err).expect("create stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Self {
            child,
            what,
            out,
            err,
            started: Instant::now(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// What it wrote to stderr so far.
    pub fn stderr_so_far(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// What it wrote to stdout so far.
    pub fn stdout_so_far(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Sends `sig` to the process (by its PID).
    pub fn signal(&mut self, sig: i32) {
        if !self.exited() {
            // SAFETY: kill(2) on the PID of a child we have not reaped yet
            // (try_wait said it is running) reaches only that child.
            unsafe { libc::kill(self.child.id() as i32, sig) };
        }
    }

    /// Waits for the process to end, killing it after `timeout`.
    pub fn finish(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let mut status = None;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => {
                    status = Some(s);
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break,
            }
        }
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        Finished {
            what: self.what.clone(),
            status,
            secs: self.started.elapsed().as_secs_f64(),
            stdout: std::fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A program's end: its status (`None`: killed after its timeout) and
/// output.
pub struct Finished {
    pub what: String,
    pub status: Option<ExitStatus>,
    pub secs: f64,
    pub stdout: String,
    pub stderr: String,
}

/// Lines a healthy run never prints (perftest and the pingpongs say
/// "Couldn't ...", "Failed to ...", "... error ..." when something broke).
/// The libraries' own explanations (`xroce libibverbs: ...`, `xroce
/// librdmacm: ...`, under XROCE_VERBS_DEBUG) and `xroce run`'s notes are
/// shown in reports but not counted (a failing `xroce run` exits non-zero).
pub fn error_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| {
            !l.starts_with("xroce libibverbs:")
                && !l.starts_with("xroce librdmacm:")
                && !l.starts_with("xroce run:")
        })
        .filter(|l| {
            let l = l.to_lowercase();
            l.contains("couldn't") || l.contains("failed") || l.contains("error")
        })
        .collect()
}

fn head(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut s = lines
        .iter()
        .take(n)
        .map(|l| format!("    {l}\n"))
        .collect::<String>();
    if lines.len() > n {
        let _ = writeln!(s, "    ... ({} more lines)", lines.len() - n);
    }
    s
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.len().saturating_sub(n);
    let mut s = String::new();
    if skip > 0 {
        let _ = writeln!(s, "    ... ({skip} lines before)");
    }
    s + &lines[skip..]
        .iter()
        .map(|l| format!("    {l}\n"))
        .collect::<String>()
}

impl Finished {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// What happened, for a failure report: status, stderr's first lines,
    /// stdout's last lines.
    pub fn describe(&self) -> String {
        let status = match self.status {
            Some(s) => format!("{s}"),
            None => format!("TIMED OUT (killed after {:.0}s)", self.secs),
        };
        format!(
            "  {}\n  -> {status} after {:.1}s\n  stderr:\n{}  stdout:\n{}",
            self.what,
            self.secs,
            head(&self.stderr, 25),
            tail(&self.stdout, 15)
        )
    }

    /// Exit 0 and no error line on stdout or stderr.
    pub fn check(&self) -> Result<(), String> {
        if !self.success() {
            return Err(self.describe());
        }
        let bad: Vec<&str> = error_lines(&self.stderr)
            .into_iter()
            .chain(error_lines(&self.stdout))
            .collect();
        if !bad.is_empty() {
            return Err(format!("error lines {bad:?}\n{}", self.describe()));
        }
        Ok(())
    }

    /// [`Finished::check`], and stdout has `needle`.
    pub fn check_has(&self, needle: &str) -> Result<(), String> {
        self.check()?;
        if !self.stdout.contains(needle) {
            return Err(format!("stdout lacks {needle:?}\n{}", self.describe()));
        }
        Ok(())
    }
}

/// Both sides of a server/client run.
pub struct PairOutput {
    pub server: Finished,
    /// `None` when the client never started ([`PairOutput::setup_error`]).
    pub client: Option<Finished>,
    pub setup_error: Option<String>,
}

impl PairOutput {
    /// Both exited 0 without error lines; returns the client's result.
    pub fn check(&self) -> Result<&Finished, String> {
        let Some(client) = &self.client else {
            return Err(format!(
                "{}\n{}",
                self.setup_error.as_deref().unwrap_or("client not started"),
                self.server.describe()
            ));
        };
        match (client.check(), self.server.check()) {
            (Ok(()), Ok(())) => Ok(client),
            (Err(c), Err(s)) => Err(format!("client:\n{c}\nserver:\n{s}")),
            (Err(c), Ok(())) => Err(format!("client:\n{c}\nserver:\n{}", self.server.describe())),
            (Ok(()), Err(s)) => Err(format!("server:\n{s}\nclient:\n{}", client.describe())),
        }
    }

    /// [`PairOutput::check`], and both stdouts have `needle`.
    pub fn check_both_have(&self, needle: &str) -> Result<(), String> {
        let client = self.check()?;
        for f in [client, &self.server] {
            if !f.stdout.contains(needle) {
                return Err(format!("stdout lacks {needle:?}\n{}", f.describe()));
            }
        }
        Ok(())
    }

    /// An rdma-core pingpong pair (ibv_rc_pingpong and kin): both printed
    /// their " bytes in " and " iters in " lines and neither found invalid
    /// data; returns the client's " bytes in " line.
    pub fn check_pingpong(&self) -> Result<String, String> {
        self.check_both_have(" bytes in ")?;
        self.check_both_have(" iters in ")?;
        let client = self.check()?;
        for f in [client, &self.server] {
            if f.stdout.contains("invalid data") {
                return Err(format!("data check failed\n{}", f.describe()));
            }
        }
        Ok(client
            .stdout
            .lines()
            .find(|l| l.contains(" bytes in "))
            .unwrap_or_default()
            .to_string())
    }
}

/// One row of a perftest result table: message size, iterations and the
/// remaining columns in order.
#[derive(Debug, Clone)]
pub struct PerfRow {
    pub bytes: u64,
    pub iters: u64,
    pub values: Vec<f64>,
}

/// The rows under every " #bytes ..." header of perftest's output, up to
/// the dashed line that closes the table.
pub fn perftest_rows(stdout: &str) -> Vec<PerfRow> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in stdout.lines() {
        let t = line.trim();
        if t.starts_with("#bytes") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let fields: Vec<&str> = t.split_whitespace().collect();
        let parsed = (|| {
            let bytes = fields.first()?.parse().ok()?;
            let iters = fields.get(1)?.parse().ok()?;
            let values: Option<Vec<f64>> = fields[2..].iter().map(|f| f.parse().ok()).collect();
            Some(PerfRow {
                bytes,
                iters,
                values: values?,
            })
        })();
        match parsed {
            Some(row) if !row.values.is_empty() => rows.push(row),
            _ => in_table = false,
        }
    }
    rows
}

/// perftest converts cycles to time with a CPU frequency it measures
/// against gettimeofday; on a busy machine the fit fails ("Correlation
/// coefficient r^2: X < 0.9"), the frequency becomes 0 and the table shows
/// 0 MB/s or inf usec. That says nothing about the transfer (which ran and
/// ended with exit 0); such rows are tolerated and named in the summary.
fn clock_failed(f: &Finished) -> bool {
    f.stderr.contains("Correlation coefficient") || f.stdout.contains("Correlation coefficient")
}

fn table_rows(f: &Finished, sizes: Option<usize>) -> Result<Vec<PerfRow>, String> {
    let rows = perftest_rows(&f.stdout);
    if rows.is_empty() {
        return Err(format!(
            "no result table after the #bytes header\n{}",
            f.describe()
        ));
    }
    if let Some(n) = sizes {
        if rows.len() != n {
            return Err(format!(
                "{} result rows, expected {n}\n{}",
                rows.len(),
                f.describe()
            ));
        }
    }
    if let Some(r) = rows.iter().find(|r| r.iters == 0) {
        return Err(format!("row without iterations {r:?}\n{}", f.describe()));
    }
    Ok(rows)
}

/// A bandwidth table (bytes, iterations, BW peak, BW average, MsgRate):
/// every row has a message rate and a bandwidth (the smallest sizes may
/// round to 0.00 MB/s; the largest may not).
pub fn check_bw_table(f: &Finished, sizes: Option<usize>) -> Result<String, String> {
    let rows = table_rows(f, sizes)?;
    let clock_failed = clock_failed(f);
    let good = |r: &PerfRow| {
        r.values.len() >= 3
            && r.values[2].is_finite()
            && r.values[2] > 0.0
            && r.values[1].is_finite()
    };
    let bad: Vec<&PerfRow> = rows.iter().filter(|r| !good(r)).collect();
    let last = rows.iter().max_by_key(|r| r.bytes).unwrap();
    // perftest prints the average bandwidth (MiB/s) with two decimals:
    // tiny messages at a low rate (Mpps; a busy host) print 0.00 though
    // measured.
    let rounds_to_zero = |r: &PerfRow| r.bytes as f64 * r.values[2] * 1e6 / 1048576.0 < 0.005;
    let last_ok = good(last) && (last.values[1] > 0.0 || rounds_to_zero(last));
    let mut summary = format!(
        "{} rows, {} B: {:.2} MB/s",
        rows.len(),
        last.bytes,
        last.values[1]
    );
    if !bad.is_empty() || !last_ok {
        if !clock_failed {
            return Err(format!(
                "rows without a bandwidth or message rate: {bad:?} (largest: {last:?})\n{}",
                f.describe()
            ));
        }
        let _ = write!(
            summary,
            " [perftest's clock calibration failed (machine busy): {} rows unmeasured]",
            bad.len().max(1)
        );
    }
    Ok(summary)
}

/// A latency table (bytes, iterations, t_min, t_max, t_typical, t_avg,
/// ...): positive, ordered latencies on every row.
pub fn check_lat_table(f: &Finished, sizes: Option<usize>) -> Result<String, String> {
    let rows = table_rows(f, sizes)?;
    let clock_failed = clock_failed(f);
    let good = |r: &PerfRow| {
        let v = &r.values;
        v.len() >= 4 && {
            let (min, max, typical, avg) = (v[0], v[1], v[2], v[3]);
            [min, max, typical, avg]
                .iter()
                .all(|x| x.is_finite() && *x > 0.0)
                && min <= avg
                && avg <= max
        }
    };
    let bad: Vec<&PerfRow> = rows.iter().filter(|r| !good(r)).collect();
    let first = &rows[0];
    let mut summary = format!(
        "{} rows, {} B: typical {:.2} us",
        rows.len(),
        first.bytes,
        first.values.get(2).copied().unwrap_or(f64::NAN)
    );
    if !bad.is_empty() {
        if !clock_failed {
            return Err(format!(
                "implausible latencies in rows {bad:?}\n{}",
                f.describe()
            ));
        }
        let _ = write!(
            summary,
            " [perftest's clock calibration failed (machine busy): {} rows unmeasured]",
            bad.len()
        );
    }
    Ok(summary)
}

/// Test cases that all run, failures collected: one failing case does not
/// hide the next. [`Cases::finish`] panics with every failure.
pub struct Cases {
    test: String,
    passed: Vec<String>,
    failed: Vec<(String, String)>,
}

impl Cases {
    pub fn new(test: &str) -> Self {
        Self {
            test: test.to_string(),
            passed: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Runs a case; `Ok` carries a short summary, `Err` the evidence.
    pub fn case(&mut self, name: &str, f: impl FnOnce() -> Result<String, String>) {
        let started = Instant::now();
        match f() {
            Ok(summary) => {
                eprintln!(
                    "PASS {} / {name} ({:.1}s) {summary}",
                    self.test,
                    started.elapsed().as_secs_f64()
                );
                self.passed.push(name.to_string());
            }
            Err(why) => {
                eprintln!(
                    "FAIL {} / {name} ({:.1}s)\n{why}",
                    self.test,
                    started.elapsed().as_secs_f64()
                );
                self.failed.push((name.to_string(), why));
            }
        }
    }

    pub fn finish(self) {
        if self.failed.is_empty() {
            return;
        }
        let mut msg = format!(
            "{}: {} of {} cases failed ({} passed: {:?})\n",
            self.test,
            self.failed.len(),
            self.failed.len() + self.passed.len(),
            self.passed.len(),
            self.passed
        );
        // The evidence was printed as each case failed; name them here
        // with their first line.
        for (name, why) in &self.failed {
            let _ = writeln!(
                msg,
                "  FAILED {name}: {}",
                why.lines().next().unwrap_or_default()
            );
        }
        panic!("{msg}");
    }
}

/// `tcpdump -i IF -w FILE udp port 4791` in a namespace; stopped with
/// SIGINT (it then writes out what it holds), killed if it lingers.
pub struct Tcpdump {
    proc: Option<Proc>,
    pub file: PathBuf,
}

impl Tcpdump {
    pub fn start(ns: &Netns, iface: &str, file: PathBuf, dir: &Path) -> Result<Self, String> {
        let mut cmd = ns.command("tcpdump");
        // --immediate-mode: every frame is handed over as it comes (without
        // it, frames of the last unfilled ring block are lost at SIGINT).
        // In that mode libpcap's ring has one fixed-size slot per frame,
        // sized by the snap length or, on an interface that offloads
        // segmentation as veth does, by up to 64 KiB: with the default
        // snap length a 16 MiB ring held a few hundred frames, and an
        // ib_read_bw burst on a loaded CI host overran it (133 of 1,700
        // dropped). -s: the largest frame the tests send (jumbo MTU and
        // headers); -B: 64 MiB, room for thousands of frames.
        cmd.args([
            "-i",
            iface,
            "--immediate-mode",
            "-s",
            "9216",
            "-B",
            "65536",
            "-U",
            "-w",
        ])
        .arg(&file)
        .args(["udp", "port", "4791"]);
        let mut proc = Proc::spawn(cmd, format!("[in {}] tcpdump -i {iface}", ns.name), dir);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !proc.stderr_so_far().contains("listening on") {
            if proc.exited() || Instant::now() > deadline {
                return Err(proc.finish(Duration::ZERO).describe());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            proc: Some(proc),
            file,
        })
    }

    /// Stops the capture; fails unless tcpdump wrote every frame its
    /// filter took (none dropped by the kernel or left unread).
    pub fn stop(mut self) -> Result<String, String> {
        let mut proc = self.proc.take().unwrap();
        // Frames may still be in flight through the bridge.
        std::thread::sleep(Duration::from_millis(300));
        Self::wait_written(&mut proc);
        proc.signal(libc::SIGINT);
        let f = proc.finish(Duration::from_secs(5));
        if !f.success() {
            return Err(f.describe());
        }
        let counts = tcpdump_counts(&f.stderr);
        let (captured, filtered, dropped) = (
            counts.map(|c| c.0),
            counts.map(|c| c.1),
            counts.map(|c| c.2),
        );
        if captured.is_none() || captured != filtered || dropped != Some(0) {
            return Err(format!("the capture lost frames\n{}", f.describe()));
        }
        Ok(format!("{} frames captured", captured.unwrap()))
    }

    /// Waits (up to 10 s) until tcpdump has written every frame its filter
    /// took so far, as it reports on SIGUSR1: on a busy host it may still
    /// be behind when the programs end, and SIGINT would leave the rest of
    /// its ring unread.
    fn wait_written(proc: &mut Proc) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let reports = |p: &Proc| {
            p.stderr_so_far()
                .matches("packets received by filter")
                .count()
        };
        while Instant::now() < deadline && !proc.exited() {
            let before = reports(proc);
            proc.signal(libc::SIGUSR1);
            while reports(proc) == before {
                if Instant::now() > deadline || proc.exited() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if tcpdump_counts(&proc.stderr_so_far()).is_some_and(|(c, f, _)| c == f) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// tcpdump's latest (captured, received by filter, dropped by kernel)
/// counts: on SIGUSR1 it prints them on one line ("tcpdump: N packets
/// captured, N packets received by filter, N packets dropped by kernel"),
/// on exit a line each ("1 packet" when one).
fn tcpdump_counts(stderr: &str) -> Option<(u64, u64, u64)> {
    let parts: Vec<&str> = stderr
        .lines()
        .flat_map(|l| l.split(", "))
        .map(|p| p.trim_start_matches("tcpdump: "))
        .collect();
    let i = parts
        .iter()
        .rposition(|p| p.ends_with("dropped by kernel"))?;
    let count = |k: usize, what: &str| -> Option<u64> {
        let p = parts.get(k)?;
        p.ends_with(what)
            .then(|| p.split_whitespace().next()?.parse().ok())?
    };
    Some((
        count(i.checked_sub(2)?, "captured")?,
        count(i - 1, "received by filter")?,
        count(i, "dropped by kernel")?,
    ))
}

/// `xroce decode FILE --json`.
pub fn decode(file: &Path) -> Result<xroce_report::DecodeReport, String> {
    let out = Command::new(workspace_bin("xroce"))
        .arg("decode")
        .arg(file)
        .arg("--json")
        .output()
        .map_err(|e| format!("cannot run xroce decode: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "xroce decode {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).map_err(|e| format!("decode JSON {text:?}: {e}"))
}

/// Fails unless `ops` (opcode name -> frames) holds at least `min` frames
/// whose opcode name starts with `prefix`, for every `(prefix, min)`;
/// `summary` (the capture's) goes into the error.
pub fn check_opcode_counts(
    ops: &BTreeMap<String, u64>,
    expect: &[(&str, u64)],
    summary: &str,
) -> Result<(), String> {
    for (prefix, min) in expect {
        let count: u64 = ops
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, c)| c)
            .sum();
        if count < *min {
            return Err(format!(
                "{count} {prefix}* frames, expected at least {min} ({summary}): {ops:?}"
            ));
        }
    }
    Ok(())
}

/// Arguments from string slices.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Declares one #[test] per backend for a test body `fn NAME(Backend)`:
/// `NAME::afxdp` and `NAME::udp`.
#[macro_export]
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn afxdp() {
                super::$name($crate::programs::Backend::AfXdp)
            }
            #[test]
            fn udp() {
                super::$name($crate::programs::Backend::Udp)
            }
        }
    )*};
}

#[cfg(test)]
mod tests {
    #[test]
    fn tcpdump_counts_are_the_latest_report_in_either_form() {
        let err = "tcpdump: listening on x, link-type EN10MB\n\
            tcpdump: 5 packets captured, 7 packets received by filter, 0 packets dropped by kernel\n\
            1701 packets captured\n1701 packets received by filter\n0 packets dropped by kernel\n";
        assert_eq!(super::tcpdump_counts(err), Some((1701, 1701, 0)));
        let usr1 = "tcpdump: 1 packet captured, 2 packets received by filter, 0 packets dropped by kernel\n";
        assert_eq!(super::tcpdump_counts(usr1), Some((1, 2, 0)));
        assert_eq!(super::tcpdump_counts("listening"), None);
    }

    use super::*;

    fn bw_table(row: &str) -> Finished {
        Finished {
            what: "ib_write_bw".into(),
            status: None,
            secs: 0.0,
            stdout: format!(
                " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n {row}\n"
            ),
            stderr: String::new(),
        }
    }

    #[test]
    fn a_bandwidth_that_prints_as_zero_only_passes_when_the_rate_makes_it_round() {
        // 1 B at 0.0043 Mpps is 0.004 MiB/s: perftest prints 0.00.
        assert!(check_bw_table(&bw_table("1 1000 0.03 0.00 0.004331"), None).is_ok());
        // 1 B at 0.02 Mpps would print 0.02: a 0.00 there is wrong.
        assert!(check_bw_table(&bw_table("1 1000 0.03 0.00 0.020000"), None).is_err());
        assert!(check_bw_table(&bw_table("65536 500 30.0 0.00 0.000500"), None).is_err());
        assert!(check_bw_table(&bw_table("65536 500 30.0 28.06 0.000449"), None).is_ok());
    }

    #[test]
    fn opcode_counts_sum_every_name_with_the_prefix() {
        let ops = BTreeMap::from([
            ("RC_RDMA_WRITE_FIRST".to_string(), 3),
            ("RC_RDMA_WRITE_LAST".to_string(), 3),
            ("RC_ACKNOWLEDGE".to_string(), 1),
        ]);
        assert_eq!(
            check_opcode_counts(&ops, &[("RC_RDMA_WRITE", 6), ("RC_ACK", 1)], "s"),
            Ok(())
        );
        assert_eq!(
            check_opcode_counts(&ops, &[("RC_RDMA_WRITE", 7)], "9 frames captured"),
            Err(format!(
                "6 RC_RDMA_WRITE* frames, expected at least 7 (9 frames captured): {ops:?}"
            ))
        );
        assert_eq!(
            check_opcode_counts(&ops, &[("RC_SEND", 1)], "s"),
            Err(format!(
                "0 RC_SEND* frames, expected at least 1 (s): {ops:?}"
            ))
        );
    }
}
