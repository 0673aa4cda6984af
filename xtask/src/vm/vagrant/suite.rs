//! The VM suite `vagrant`: the box, `vagrant up` of both VMs, rxe <-> rxe
//! and xroce (host) <-> rxe cases with their results checked, `vagrant
//! destroy -f`.

use std::{
    fs,
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{add_box, dir, ensure_tools, pack_box, Libvirt, HOST_IFACE, HOST_IP, PREFIX};
use crate::util::{describe, step, workspace_root};

/// A command run to completion within `limit` (killed by PID after it).
fn run_timed(mut cmd: Command, limit: Duration) -> Result<(bool, String)> {
    let what = describe(&cmd);
    eprintln!("+ {what}");
    let log = dir().join(format!("cmd-{}.log", std::process::id()));
    let f = fs::File::create(&log)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let t = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if t.elapsed() > limit {
            kill_group(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = fs::read_to_string(&log).unwrap_or_default();
    let _ = fs::remove_file(&log);
    for l in text.lines().filter(|l| !l.contains("Progress:")) {
        eprintln!("  | {l}");
    }
    match st {
        None => bail!("`{what}` did not finish in {limit:.0?}"),
        Some(st) => Ok((st.success(), text)),
    }
}

/// A background command (a server): killed by PID on drop.
struct Bg {
    child: Child,
    log: PathBuf,
}

impl Bg {
    fn spawn(mut cmd: Command, log: PathBuf) -> Result<Bg> {
        eprintln!("+ {} &", describe(&cmd));
        let f = fs::File::create(&log)?;
        // Its own process group: `vagrant ssh` runs ssh as a child,
        // which must go too.
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0)
            .spawn()?;
        Ok(Bg { child, log })
    }

    /// Waits up to `limit`; its success and output.
    fn finish(mut self, limit: Duration) -> Result<(bool, String)> {
        let t = Instant::now();
        let st = loop {
            if let Some(st) = self.child.try_wait()? {
                break Some(st);
            }
            if t.elapsed() > limit {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        for l in text.lines() {
            eprintln!("  |bg| {l}");
        }
        match st {
            None => bail!(
                "did not finish in {limit:.0?}: {}",
                text.lines().last().unwrap_or("")
            ),
            Some(st) => Ok((st.success(), text)),
        }
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

/// SIGKILL to the process group `child` leads (it and what it started,
/// e.g. vagrant's ssh), then reaps it.
fn kill_group(child: &mut Child) {
    // Only while it is unreaped: its PID (= PGID) is still ours then.
    if child.try_wait().ok().flatten().is_none() {
        // SAFETY: a signal to the group of a child we spawned with
        // process_group(0) (its PGID is its PID).
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        let _ = child.wait();
    }
}

/// `vagrant ssh NAME -c SCRIPT`.
fn ssh(lv: &Libvirt, name: &str, script: &str) -> Command {
    let mut c = lv.command("vagrant");
    c.args(["ssh", name, "-c", script]);
    c
}

/// ibv_rc_pingpong's result lines ("819200 bytes in ...", "100 iters in ...").
fn pingpong_ok(who: &str, ok: bool, out: &str, bytes: u64, iters: u32) -> Result<String> {
    let want_bytes = format!("{bytes} bytes in");
    let want_iters = format!("{iters} iters in");
    if !ok {
        bail!("{who} failed: {}", out.lines().last().unwrap_or(""));
    }
    let line = out
        .lines()
        .find(|l| l.contains(&want_bytes))
        .with_context(|| format!("{who}: no `{want_bytes}` line"))?;
    if !out.contains(&want_iters) {
        bail!("{who}: no `{want_iters}` line");
    }
    Ok(line.trim().to_string())
}

/// The suite's cases (XROCE_VM_ONLY filters by substring, as the other
/// VM suites; `vagrant` selects them all).
fn wanted(case: &str) -> bool {
    std::env::var("XROCE_VM_ONLY").map_or(true, |w| case.contains(&w) || w == "vagrant")
}

/// The cases after `vagrant up`.
const CASES: [&str; 4] = [
    "vagrant rxe<->rxe ibv_rc_pingpong -c",
    "vagrant rxe<->rxe rping -V (data verified)",
    "vagrant xroce (host) server <-> rxe ibv_rc_pingpong -c",
    "vagrant xroce run -- rping -V (host) <-> rxe rping (data verified)",
];

const PP: &str = "-m 1024 -s 4096 -n 100";
/// rping: 20 verified round trips of 4096 bytes.
const RPING: &str = "-C 20 -V -S 4096";
const RPING_COUNT: usize = 20;

/// The client's count of verified pings (`grep -c 'ping data:'` of -v).
fn rping_ok(out: &str) -> Result<String> {
    let n: usize = out
        .lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .context("no count of pings")?;
    if n != RPING_COUNT {
        bail!("rping verified {n} pings, not {RPING_COUNT}");
    }
    Ok(format!("{n} pings of 4096 bytes verified by rping -V"))
}
const PP_BYTES: u64 = 2 * 4096 * 100;

/// rxe1 serves, rxe2 connects (retrying until the server listens).
fn rxe_pair(lv: &Libvirt, server: &str, client: &str, limit: Duration) -> Result<(String, String)> {
    let log = dir().join("server.log");
    let srv = Bg::spawn(ssh(lv, "rxe1", &format!("timeout 150 {server}")), log)?;
    let (ok, cout) = run_timed(
        ssh(
            lv,
            "rxe2",
            &format!(
                "for i in $(seq 1 60); do timeout 60 {client} && exit 0; sleep 0.5; done; exit 1"
            ),
        ),
        limit,
    )?;
    if !ok {
        bail!("client failed: {}", cout.lines().last().unwrap_or(""));
    }
    let (sok, sout) = srv.finish(Duration::from_secs(60))?;
    if !sok {
        bail!("server failed: {}", sout.lines().last().unwrap_or(""));
    }
    Ok((sout, cout))
}

/// The VM suite `vagrant`: pack the box (cached), `vagrant up` both VMs,
/// run the interop cases with their results asserted, `vagrant destroy -f`.
pub fn suite() -> Result<()> {
    let t0 = Instant::now();
    step("vagrant: the Vagrantfile's two VMs under vagrant-libvirt");
    if !CASES.iter().any(|c| wanted(c)) {
        eprintln!("vagrant: XROCE_VM_ONLY selects none of this suite's cases; not run");
        return Ok(());
    }
    ensure_tools()?;
    let b = pack_box(false)?;
    add_box(&b)?;
    // The CLI and, beside it for `xroce run`, the drop-in libraries.
    super::super::suites::build_release_cli()?;
    let xroce = workspace_root().join("target/release/xroce");
    let x = xroce.to_string_lossy().into_owned();
    let lv = Libvirt::start()?;
    let mut results: Vec<(String, Result<String>, f64)> = Vec::new();
    let mut record = |name: &str, t: Instant, r: Result<String>| {
        let secs = t.elapsed().as_secs_f64();
        match &r {
            Ok(n) => eprintln!("vagrant: PASS {name} ({secs:.1} s) {n}"),
            Err(e) => eprintln!("vagrant: FAIL {name} ({secs:.1} s) {e:#}"),
        }
        results.push((name.to_string(), r, secs));
    };
    let t = Instant::now();
    let up = run_timed(
        {
            let mut c = lv.command("vagrant");
            c.args(["up", "--provider=libvirt"]);
            c
        },
        Duration::from_secs(1200),
    )
    .and_then(|(ok, out)| {
        if !ok {
            bail!("vagrant up failed: {}", out.lines().last().unwrap_or(""));
        }
        // provision.sh ends with `rdma link show`: rxe0 ACTIVE on eth1 in each.
        let active = out
            .lines()
            .filter(|l| l.contains("link rxe0/1 state ACTIVE") && l.contains("netdev eth1"))
            .count();
        if active != 2 {
            bail!("provisioning brought rxe0 up in {active} VMs, not 2");
        }
        Ok(format!(
            "rxe1 {PREFIX}11, rxe2 {PREFIX}12, rxe0 ACTIVE in both"
        ))
    });
    let up_ok = up.is_ok();
    record("vagrant up (rxe1, rxe2)", t, up);
    if up_ok {
        let name = CASES[0];
        if wanted(name) {
            let t = Instant::now();
            let cmd = format!("ibv_rc_pingpong -d rxe0 -g 1 {PP} -c");
            let r = rxe_pair(
                &lv,
                &cmd,
                &format!("{cmd} {PREFIX}11"),
                Duration::from_secs(180),
            )
            .and_then(|(s, c)| {
                pingpong_ok("rxe1", true, &s, PP_BYTES, 100)?;
                pingpong_ok("rxe2", true, &c, PP_BYTES, 100)
            });
            record(name, t, r);
        }
        let name = CASES[1];
        if wanted(name) {
            let t = Instant::now();
            let r = rxe_pair(
                &lv,
                &format!("rping -s -a {PREFIX}11 {RPING}"),
                &format!(
                    "{}; rping -c -a {PREFIX}11 {RPING} -v | grep -c 'ping data: rdma-ping-'",
                    "set -o pipefail"
                ),
                Duration::from_secs(180),
            )
            .and_then(|(_, c)| rping_ok(&c));
            record(name, t, r);
        }
        let name = CASES[2];
        if wanted(name) {
            let t = Instant::now();
            let r = (|| {
                let mut host = lv.command(&x);
                // -c on both sides: xroce checks every byte rdma-core's client sent.
                host.args(["pingpong", "-d", HOST_IFACE, "--backend", "afxdp", "-c"])
                    .args(PP.split(' '));
                let srv = Bg::spawn(host, dir().join("xroce.log"))?;
                let (ok, cout) = run_timed(
                    ssh(
                        &lv,
                        "rxe2",
                        &format!(
                            "for i in $(seq 1 60); do timeout 60 ibv_rc_pingpong -d rxe0 -g 1 {PP} -c {HOST_IP} && exit 0; sleep 0.5; done; exit 1"
                        ),
                    ),
                    Duration::from_secs(180),
                )?;
                let (hok, hout) = srv.finish(Duration::from_secs(60))?;
                let _ = lv
                    .command(&x)
                    .args(["detach", "--iface", HOST_IFACE])
                    .output();
                let c = pingpong_ok("rxe2", ok, &cout, PP_BYTES, 100)?;
                if !hok {
                    bail!("xroce failed: {}", hout.lines().last().unwrap_or(""));
                }
                let h = hout
                    .lines()
                    .find(|l| l.contains("bytes in"))
                    .context("xroce printed no `bytes in` line")?;
                Ok(format!("xroce: {}; rxe: {c}", h.trim()))
            })();
            record(name, t, r);
        }
        let name = CASES[3];
        if wanted(name) {
            let t = Instant::now();
            let r = (|| {
                let srv = Bg::spawn(
                    ssh(
                        &lv,
                        "rxe1",
                        &format!("timeout 150 rping -s -a {PREFIX}11 {RPING}"),
                    ),
                    dir().join("server.log"),
                )?;
                // rping's own -V compares every byte it reads back; the
                // drop-in librdmacm and libibverbs carry it over xr0.
                let mut host = lv.command("bash");
                host.arg("-c").arg(format!(
                    "set -o pipefail; for i in $(seq 1 30); do {x} run --iface {HOST_IFACE} --backend afxdp -- \
                     rping -c -a {PREFIX}11 {RPING} -v >/tmp/xroce-vagrant-rping.$$ 2>&1 && \
                     {{ grep -c 'ping data: rdma-ping-' /tmp/xroce-vagrant-rping.$$; rm -f /tmp/xroce-vagrant-rping.$$; exit 0; }}; \
                     sleep 1; done; tail -5 /tmp/xroce-vagrant-rping.$$; rm -f /tmp/xroce-vagrant-rping.$$; exit 1"
                ));
                let (ok, hout) = run_timed(host, Duration::from_secs(180))?;
                let _ = lv
                    .command(&x)
                    .args(["detach", "--iface", HOST_IFACE])
                    .output();
                let (sok, sout) = srv.finish(Duration::from_secs(60))?;
                if !ok {
                    bail!(
                        "xroce run rping failed: {}",
                        hout.lines().last().unwrap_or("")
                    );
                }
                if !sok {
                    bail!(
                        "rxe1's rping -s failed: {}",
                        sout.lines().last().unwrap_or("")
                    );
                }
                rping_ok(&hout)
            })();
            record(name, t, r);
        }
    }
    // vagrant destroy -f: both domains go, libvirt has none left.
    let t = Instant::now();
    let destroy = run_timed(
        {
            let mut c = lv.command("vagrant");
            c.args(["destroy", "-f"]);
            c
        },
        Duration::from_secs(300),
    )
    .and_then(|(ok, out)| {
        if !ok {
            bail!(
                "vagrant destroy -f failed: {}",
                out.lines().last().unwrap_or("")
            );
        }
        let left = lv.domains();
        if !left.is_empty() {
            bail!("libvirt still has domains {left:?}");
        }
        Ok("no domains left".to_string())
    });
    record("vagrant destroy -f", t, destroy);
    drop(lv);
    let mut table = String::from(
        "\nvagrant (vagrant-libvirt, TCG)\n| case | result | time | note |\n|---|---|---|---|\n",
    );
    for (name, r, secs) in &results {
        let (res, note) = match r {
            Ok(n) => ("pass", n.clone()),
            Err(e) => (
                "FAIL",
                format!("{e:#}").lines().next().unwrap_or("").to_string(),
            ),
        };
        table.push_str(&format!(
            "| {name} | {res} | {secs:.1} s | {} |\n",
            note.replace('|', "/")
        ));
    }
    eprint!("{table}");
    let art = super::super::suites::artifacts_dir();
    fs::create_dir_all(&art)?;
    fs::write(art.join("vagrant.md"), &table)?;
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, r, _)| r.is_err())
        .map(|(n, _, _)| n.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("vagrant: failed: {}", failed.join(", "));
    }
    eprintln!("vagrant: suite passed in {:.0?}", t0.elapsed());
    Ok(())
}
