//! UCX interop (XROCE_VM_ONLY=ucx): Debian's ucx_perftest (ucx-utils, UCX
//! 1.13.1 on both sides) over RC verbs: UCT put_bw and am_lat on rc_verbs,
//! UCP tag_bw with UCX_TLS=rc (RC, and UD for UCP's wireup). First
//! between two rxe VMs (the peers and the image are sane), then with the
//! host's side under `xroce run` against rxe in the guest, both
//! directions. Every run is captured on the bridge and decoded (ICRC good).
//!
//! ucx_perftest's server takes the whole test description from its client,
//! the UCT device name included: for the UCT cases both sides must name
//! their device alike, so the guest's rxe0 is renamed to xroce's name
//! (`rdma dev set rxe0 name xroce_xr0`) for their duration.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{artifacts_dir, captured, guest_server_port, host_result, save_stats, wanted, Table};
use crate::vm::qemu::{Bg, Netns, Vm, HOST_IFACE, HOST_IP};

/// The GID UCP's endpoints use: 0, the link-local IPv6 one (RoCEv2 over
/// IPv6), on both sides. UCX 1.13.1's UD transport (UCP's wireup with
/// UCX_TLS=rc) tells a RoCEv2 packet's IP version by the completion's `sl`
/// (mlx5 puts the L3 type there); rxe reports sl 0, so UCX reads an IPv4
/// packet's GRH as IPv6, finds no GID of its own there and drops it (its
/// endpoints time out: seen rxe<->rxe with the default IPv4 GID).
pub(super) const UD_GID_INDEX: u32 = 0;

/// ucx_perftest's TCP port for exchanging the test and addresses.
const PORT: u16 = 13337;

/// One ucx_perftest test. `args` is what both sides get besides the
/// device (`-d DEV:1` for UCT, UCX_NET_DEVICES for UCP). Iterations are
/// few: rxe under TCG moves ~0.1-0.2 Gb/s.
struct PerfCase {
    name: &'static str,
    args: &'static str,
    uct: bool,
}

const CASES: &[PerfCase] = &[
    PerfCase {
        name: "uct put_bw rc_verbs",
        args: "-t put_bw -x rc_verbs -D zcopy -s 16384 -n 300 -w 20",
        uct: true,
    },
    PerfCase {
        name: "uct am_lat rc_verbs",
        args: "-t am_lat -x rc_verbs -s 8 -n 500 -w 50",
        uct: true,
    },
    PerfCase {
        name: "ucp tag_bw UCX_TLS=rc",
        args: "-t tag_bw -s 65536 -n 100 -w 10",
        uct: false,
    },
];

/// The backends the host side runs on.
const BACKENDS: &[&str] = &["udp", "afxdp"];

fn iters(args: &str) -> u64 {
    args.split_whitespace()
        .skip_while(|a| *a != "-n")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The command line of one side on device `dev`: UCP gets its transports
/// and device from the environment, UCT from its flags.
fn command(case: &PerfCase, dev: &str) -> String {
    if case.uct {
        format!("ucx_perftest {} -d {dev}:1 -p {PORT}", case.args)
    } else {
        format!(
            "env UCX_TLS=rc UCX_NET_DEVICES={dev}:1 UCX_IB_GID_INDEX={UD_GID_INDEX} ucx_perftest {} -p {PORT}",
            case.args
        )
    }
}

/// The client's "Final:" line must count every iteration (the second
/// column); returns it, squeezed.
fn check_final(out: &str, want: u64) -> Result<String> {
    let line = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("Final:"))
        .with_context(|| {
            format!(
                "no \"Final:\" line from the client: {}",
                out.lines().last().unwrap_or("")
            )
        })?;
    let cols: Vec<&str> = line.split_whitespace().collect();
    let got: u64 = cols.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    if got != want {
        bail!("the client counted {got} iterations, ran {want}: {line}");
    }
    Ok(cols.join(" "))
}

fn file_tag(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Renames the guest's RDMA device (rdma_rxe keeps its netdev and GIDs).
fn rename(vm: &mut Vm, from: &str, to: &str) -> Result<()> {
    vm.check(
        &format!("rdma dev set {from} name {to} && rdma dev show {to}"),
        Duration::from_secs(30),
    )?;
    Ok(())
}

fn rxe_rxe_name(case: &PerfCase) -> String {
    format!("ucx rxe<->rxe ucx_perftest {}", case.name)
}

pub(super) fn rxe_rxe_wanted() -> bool {
    CASES.iter().any(|c| wanted(&rxe_rxe_name(c)))
}

/// ucx_perftest between two rxe VMs: `a` serves, `b` connects.
pub(super) fn rxe_rxe(ns: &Netns, a: &mut Vm, b: &mut Vm, table: &mut Table) -> Result<()> {
    let artifacts = artifacts_dir();
    let a_ip = a.ip.clone();
    for case in CASES {
        let name = rxe_rxe_name(case);
        if !wanted(&name) {
            continue;
        }
        let t = Instant::now();
        let cap = artifacts.join(format!("ucx_rxe-rxe_{}.pcap", file_tag(case.name)));
        let cmd = command(case, "rxe0");
        let r = captured(ns, &cap, || {
            guest_server_port(a, &cmd, PORT)?;
            let out = b.check(&format!("{cmd} {a_ip}"), Duration::from_secs(240))?;
            fs::write(cap.with_extension("client.log"), &out)?;
            super::guest_server_result(a).context("rxe server")?;
            check_final(&out, iters(case.args))
        });
        table.record(&name, t, &r);
    }
    Ok(())
}

/// ucx_perftest with the host's side under `xroce run` (xroce_xr0)
/// against rxe in the guest, both directions, on each backend.
pub(super) fn interop(ns: &Netns, vm: &mut Vm, x: &str, table: &mut Table) -> Result<()> {
    let artifacts = artifacts_dir();
    let dev = format!("xroce_{HOST_IFACE}");
    let any = BACKENDS.iter().any(|b| {
        CASES.iter().any(|c| {
            ["server", "client"]
                .iter()
                .any(|r| wanted(&interop_name(r, c, b)))
        })
    });
    if !any {
        return Ok(());
    }
    // UCP's endpoints use the link-local GIDs (UD_GID_INDEX).
    let ready = super::ipv6_link_ready(ns, vm);
    for &backend in BACKENDS {
        for case in CASES {
            for xroce_server in [true, false] {
                let role = if xroce_server { "server" } else { "client" };
                let name = interop_name(role, case, backend);
                if !wanted(&name) {
                    continue;
                }
                let t = Instant::now();
                if let Err(e) = &ready {
                    table.record(&name, t, &Err(anyhow::anyhow!("not run: IPv6 link: {e:#}")));
                    continue;
                }
                let cap = artifacts.join(format!(
                    "ucx_xroce-{role}_rxe_{}_{backend}.pcap",
                    file_tag(case.name)
                ));
                // The guest's device carries xroce's name for UCT (above).
                let guest_dev = if case.uct { dev.as_str() } else { "rxe0" };
                let renamed = if case.uct {
                    rename(vm, "rxe0", &dev)
                } else {
                    Ok(())
                };
                let r = renamed.and_then(|()| {
                    captured(ns, &cap, || {
                        pair(ns, vm, x, backend, case, guest_dev, xroce_server, &cap)
                    })
                });
                if case.uct {
                    rename(vm, &dev, "rxe0")?;
                }
                let _ = ns.enter(&[x, "detach", "--iface", HOST_IFACE]).output();
                table.record(&name, t, &r);
            }
        }
    }
    Ok(())
}

fn interop_name(role: &str, case: &PerfCase, backend: &str) -> String {
    format!(
        "ucx xroce-{role} <-> rxe ucx_perftest {} ({backend})",
        case.name
    )
}

/// The host's side: `env ... X run --iface xr0 --backend B -- CMD`.
fn host_argv(x: &str, backend: &str, cmd: &str) -> Vec<String> {
    let mut argv: Vec<String> = ["env", "XROCE_VERBS_DEBUG=1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // `env VAR=... ucx_perftest`: the variables go before `xroce run`.
    let mut words = cmd.split_whitespace().peekable();
    if words.peek() == Some(&"env") {
        words.next();
        while let Some(w) = words.peek() {
            if !w.contains('=') {
                break;
            }
            argv.push(w.to_string());
            words.next();
        }
    }
    argv.extend(
        [x, "run", "--iface", HOST_IFACE, "--backend", backend, "--"]
            .iter()
            .map(|s| s.to_string()),
    );
    argv.extend(words.map(String::from));
    argv
}

/// One run: the server first (it listens on TCP PORT), then its client
/// with the server's address; the client's result line is checked.
#[allow(clippy::too_many_arguments)]
fn pair(
    ns: &Netns,
    vm: &mut Vm,
    x: &str,
    backend: &str,
    case: &PerfCase,
    guest_dev: &str,
    xroce_server: bool,
    cap: &Path,
) -> Result<String> {
    let log = cap.with_extension("xroce.log");
    let label = "ucx_perftest (xroce run)";
    let host_cmd = command(case, &format!("xroce_{HOST_IFACE}"));
    let guest_cmd = command(case, guest_dev);
    let want = iters(case.args);
    if xroce_server {
        let argv = host_argv(x, backend, &host_cmd);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut host = Bg::spawn(ns.enter(&argv), &log)?;
        wait_listening(ns, &mut host, &log)?;
        // The client runs in the guest's background, so that a server
        // that fails ends the case at once instead of the client's wait.
        guest_start(vm, &format!("{guest_cmd} {HOST_IP}"))?;
        let hr = host_result(&mut host, &log, label);
        save_stats(ns, x, cap);
        let wait = if hr.is_ok() { 60 } else { 0 };
        let (rc, out) = guest_result(vm, wait)?;
        fs::write(cap.with_extension("rxe.log"), &out)?;
        let last = out.lines().last().unwrap_or("").to_string();
        match (hr, rc) {
            (Ok(_), 0) => check_final(&out, want).map(|f| format!("rxe client {f}")),
            (Ok(_), rc) => bail!("rxe client exited {rc}: {last}"),
            (Err(hr), _) => Err(hr),
        }
    } else {
        guest_server_port(vm, &guest_cmd, PORT)?;
        let mut argv = host_argv(x, backend, &host_cmd);
        argv.push(vm.ip.clone());
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut host = Bg::spawn(ns.enter(&argv), &log)?;
        let hr = host_result(&mut host, &log, label);
        save_stats(ns, x, cap);
        if let Err(e) = hr {
            // The rxe server would wait for a client that is gone.
            let _ = vm.run(STOP_SERVER, Duration::from_secs(30));
            return Err(e);
        }
        super::guest_server_result(vm).context("rxe server")?;
        let text = fs::read_to_string(&log).unwrap_or_default();
        check_final(&text, want).map(|f| format!("xroce client {f}"))
    }
}

/// Ends the guest's background server (guest_server_port) and its children.
const STOP_SERVER: &str =
    "[ -s /tmp/srv.pid ] && { pkill -P $(cat /tmp/srv.pid); kill $(cat /tmp/srv.pid); }; true";

/// Starts `cmd` in the guest's background (a client); its status goes to
/// /tmp/cli.rc, its output to /tmp/cli.log.
fn guest_start(vm: &mut Vm, cmd: &str) -> Result<()> {
    vm.check(
        &format!(
            "rm -f /tmp/cli.rc /tmp/cli.log; ( {cmd} >/tmp/cli.log 2>&1; echo $? >/tmp/cli.rc ) & echo $! >/tmp/cli.pid"
        ),
        Duration::from_secs(30),
    )?;
    Ok(())
}

/// The background client's status and output, waiting `secs` at most for
/// it to end; one still running then is ended (status 124).
fn guest_result(vm: &mut Vm, secs: u32) -> Result<(i32, String)> {
    let (_, out) = vm.run(
        &format!(
            "for i in $(seq 1 {}); do [ -s /tmp/cli.rc ] && break; sleep 0.1; done; \
             if [ ! -s /tmp/cli.rc ]; then pkill -P $(cat /tmp/cli.pid); kill $(cat /tmp/cli.pid); echo 124 >/tmp/cli.rc; fi 2>/dev/null; \
             cat /tmp/cli.log; echo \"__rc $(cat /tmp/cli.rc)\"",
            secs * 10
        ),
        Duration::from_secs(u64::from(secs) + 30),
    )?;
    let (text, rc) = out.rsplit_once("__rc ").unwrap_or((out.as_str(), "124"));
    Ok((rc.trim().parse().unwrap_or(124), text.to_string()))
}

/// Waits (30 s at most) until the host's server listens on TCP PORT in
/// the namespace; fails early with its log if it exits first.
fn wait_listening(ns: &Netns, host: &mut Bg, log: &Path) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        let ss = ns
            .enter(&["ss", "-ltnH", &format!("sport = :{PORT}")])
            .output()?;
        if !String::from_utf8_lossy(&ss.stdout).trim().is_empty() {
            return Ok(());
        }
        if let Some(st) = host.wait_timeout(Duration::from_millis(100))? {
            bail!(
                "ucx_perftest (xroce run) exited {st} before listening: {}",
                fs::read_to_string(log)
                    .unwrap_or_default()
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
    }
    bail!("ucx_perftest (xroce run) did not listen on TCP {PORT} in 30 s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_argv_puts_the_environment_before_xroce_run() {
        let ucp = &CASES[2];
        let argv = host_argv("X", "udp", &command(ucp, "xroce_xr0"));
        let s = argv.join(" ");
        assert!(
            s.starts_with("env XROCE_VERBS_DEBUG=1 UCX_TLS=rc UCX_NET_DEVICES=xroce_xr0:1 UCX_IB_GID_INDEX=0 X run --iface xr0 --backend udp -- ucx_perftest -t tag_bw"),
            "{s}"
        );
        let uct = &CASES[0];
        let s = host_argv("X", "afxdp", &command(uct, "xroce_xr0")).join(" ");
        assert!(s.ends_with("-- ucx_perftest -t put_bw -x rc_verbs -D zcopy -s 16384 -n 300 -w 20 -d xroce_xr0:1 -p 13337"), "{s}");
    }

    #[test]
    fn final_line_must_count_every_iteration() {
        let out = "| Stage |\nFinal:                   100      0.941  1270.120  1270.120       49.21      49.21         787         787\n";
        assert!(check_final(out, 100)
            .unwrap()
            .starts_with("Final: 100 0.941"));
        assert!(check_final(out, 1000).is_err());
        assert!(check_final("Waiting for connection...", 100).is_err());
        assert_eq!(iters(CASES[1].args), 500);
    }
}
