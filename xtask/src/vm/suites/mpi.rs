//! Open MPI interop (XROCE_VM_ONLY=mpi): MPI_Allreduce (mpi_allreduce.c,
//! every element checked on every rank) with pml ucx over RC verbs
//! (UCX_TLS=rc), two ranks: first one in each of two rxe VMs, then one on
//! the host under `xroce run` (xroce_xr0) and one in the guest on rxe0.
//! Debian 12's Open MPI 4.1.4 and UCX 1.13.1 on both sides (checked).
//!
//! Launch: mpirun runs on the host (in the VMs' namespace). The guest has
//! no sshd; mpirun's remote shell (`plm_rsh_agent`) is a script that hands
//! the orted command line to this process through a file, and this
//! process runs it in the guest over the VM's agent channel. The script
//! ends with orted's exit status, as ssh would.
//!
//! `pml_ucx_devices any`: Open MPI 4.1 takes pml ucx only on mlx* devices
//! unless told which devices are fine (a choice of pml, not a check).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{artifacts_dir, captured, save_stats, wanted, Table};
use crate::{
    util::output,
    vm::{
        image::vm_dir,
        qemu::{base64, Bg, Netns, Vm, HOST_IFACE, HOST_IP},
    },
};

const PROGRAM_C: &str = include_str!("mpi_allreduce.c");
/// Where the guest gets the program (copied over the agent channel).
const GUEST_PROGRAM: &str = "/opt/xroce/mpi_allreduce";
/// The longest a job may take (MPI_Init under TCG takes seconds).
const JOB: Duration = Duration::from_secs(240);
/// The backends the host's rank runs on.
const BACKENDS: &[&str] = &["udp", "afxdp"];
/// Lines of "allreduce ok" rank 0 prints when every check passed.
const OK_LINES: usize = 4;

/// One rank: the node mpirun starts it on, its device, its program.
struct Rank {
    node: String,
    dev: String,
    program: String,
}

/// The allreduce program built with the host's mpicc (Debian's Open MPI).
fn build_program() -> Result<PathBuf> {
    let dir = vm_dir().join("mpi");
    fs::create_dir_all(&dir)?;
    let src = dir.join("mpi_allreduce.c");
    let bin = dir.join("mpi_allreduce");
    fs::write(&src, PROGRAM_C)?;
    let out = Command::new("mpicc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .context("running mpicc (Debian's libopenmpi-dev)")?;
    if !out.status.success() {
        bail!(
            "mpicc {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(bin)
}

/// Copies the program into the guest and checks it links there.
fn install(vm: &mut Vm, bin: &Path) -> Result<()> {
    let b64 = base64(&fs::read(bin)?);
    eprintln!("[{}] installing {GUEST_PROGRAM}", vm.name);
    let (rc, out) = vm.run(
        &format!(
            "mkdir -p /opt/xroce && echo {b64} | base64 -d >{GUEST_PROGRAM} && chmod 755 {GUEST_PROGRAM} && \
             ! ldd {GUEST_PROGRAM} | grep 'not found'"
        ),
        Duration::from_secs(60),
    )?;
    if rc != 0 {
        bail!("installing {GUEST_PROGRAM} in {}: {}", vm.name, out.trim());
    }
    Ok(())
}

/// Open MPI and UCX versions: the guest's must be the host's.
fn same_versions(vm: &mut Vm) -> Result<String> {
    let q = "dpkg-query -W -f '${Package} ${Version}\\n' openmpi-bin libopenmpi3 libucx0";
    let host = output(Command::new("sh").args(["-c", q]))?;
    let guest = vm.check(q, Duration::from_secs(30))?;
    if host.trim() != guest.trim() {
        bail!(
            "Open MPI/UCX differ: host {:?}, guest {:?}",
            host.trim(),
            guest.trim()
        );
    }
    Ok(host.trim().lines().collect::<Vec<_>>().join(", "))
}

/// mpirun's remote shell: `vm-launch NODE COMMAND...` writes the command
/// for NODE's relay and waits for orted's exit status there.
fn write_launch_agent(dir: &Path, nodes: &[&str]) -> Result<PathBuf> {
    let script = dir.join("vm-launch");
    let text = format!(
        r#"#!/bin/sh
# plm_rsh_agent of the VM interop's mpirun (written by xtask/src/vm/suites/mpi.rs):
# hands "$2..." to the relay of VM "$1" and ends with the remote command's status.
dir=$(dirname "$0")
node=$1
shift
case " {nodes} " in
*" $node "*) ;;
*) echo "vm-launch: $node is none of the VMs ({nodes})" >&2; exit 1 ;;
esac
printf '%s\n' "$*" >"$dir/launch-$node.tmp" && mv "$dir/launch-$node.tmp" "$dir/launch-$node.cmd" || exit 1
while [ ! -s "$dir/launch-$node.rc" ]; do sleep 0.1; done
exit "$(cat "$dir/launch-$node.rc")"
"#,
        nodes = nodes.join(" ")
    );
    fs::write(&script, text)?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    Ok(script)
}

/// mpirun's arguments for `ranks` (one app context each: rank i is ranks[i]).
/// The agent is `sh SCRIPT`: mpirun passes plm_rsh_agent on to the orted it
/// starts, which checks that its program exists there too (sh does).
fn mpirun_args(agent: &Path, ranks: &[Rank]) -> Vec<String> {
    let mut a: Vec<String> = [
        "mpirun",
        "--allow-run-as-root",
        // orted stays attached: the relay's command returns when the job
        // ends, with orted's messages.
        "--leave-session-attached",
        "--mca",
        "plm_rsh_agent",
        &format!("sh {}", agent.display()),
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "--mca",
        "oob_tcp_if_include",
        "10.77.0.0/24",
        "--mca",
        "btl",
        "self,tcp",
        "--mca",
        "btl_tcp_if_include",
        "10.77.0.0/24",
        "--mca",
        "pml",
        "ucx",
        "--mca",
        "pml_ucx_devices",
        "any",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (i, r) in ranks.iter().enumerate() {
        if i > 0 {
            a.push(":".into());
        }
        a.extend(
            [
                "-np",
                "1",
                "--host",
                &r.node,
                "env",
                "UCX_TLS=rc",
                &format!("UCX_NET_DEVICES={}:1", r.dev),
                &format!("UCX_IB_GID_INDEX={}", super::ucx::UD_GID_INDEX),
                &r.program,
            ]
            .iter()
            .map(|s| s.to_string()),
        );
    }
    a
}

/// Waits for `vm`'s launch request and runs it there (orted; it returns
/// when the job ends); writes its exit status for the launch script.
/// Returns orted's output, or None if mpirun ended without asking.
fn relay(vm: &mut Vm, dir: &Path, done: &AtomicBool) -> Result<Option<String>> {
    let cmd = dir.join(format!("launch-{}.cmd", vm.ip));
    let rc_file = dir.join(format!("launch-{}.rc", vm.ip));
    while !done.load(Ordering::Relaxed) {
        let Ok(line) = fs::read_to_string(&cmd) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        fs::remove_file(&cmd)?;
        eprintln!("[{}] mpirun launches: {}", vm.name, line.trim());
        let r = vm.run(line.trim(), JOB);
        let rc = r.as_ref().map_or(124, |(rc, _)| *rc);
        fs::write(&rc_file, format!("{rc}\n"))?;
        let (_, out) = r?;
        for l in out.lines() {
            eprintln!("[{} orted] {l}", vm.name);
        }
        return Ok(Some(out));
    }
    Ok(None)
}

/// Runs one job: `prefix` (e.g. `xroce run ... --`) then mpirun with
/// `ranks`, relaying launches into `vms`; checks mpirun's status and the
/// program's report; `vm_names` are the guests' host names, each of which
/// must have run a rank.
fn job(
    ns: &Netns,
    prefix: &[String],
    ranks: &[Rank],
    vms: Vec<&mut Vm>,
    log: &Path,
) -> Result<String> {
    let dir = log.with_extension("launch");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let nodes: Vec<String> = vms.iter().map(|v| v.ip.clone()).collect();
    let names: Vec<String> = vms.iter().map(|v| v.name.clone()).collect();
    let agent = write_launch_agent(&dir, &nodes.iter().map(String::as_str).collect::<Vec<_>>())?;
    let mut argv: Vec<String> = prefix.to_vec();
    argv.extend(mpirun_args(&agent, ranks));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let done = AtomicBool::new(false);
    let mut mpirun = Bg::spawn(ns.enter(&argv), log)?;
    let (status, relayed) = std::thread::scope(|s| {
        let relays: Vec<_> = vms
            .into_iter()
            .map(|vm| {
                let (dir, done) = (&dir, &done);
                s.spawn(move || relay(vm, dir, done))
            })
            .collect();
        let status = mpirun.wait_timeout(JOB + Duration::from_secs(10));
        if !matches!(status, Ok(Some(_))) {
            mpirun.stop();
        }
        done.store(true, Ordering::Relaxed);
        let relayed: Vec<Result<Option<String>>> = relays
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("relay panicked")))
            })
            .collect();
        (status, relayed)
    });
    let text = fs::read_to_string(log).unwrap_or_default();
    for l in text.lines() {
        eprintln!("[host mpirun] {l}");
    }
    let why = text
        .lines()
        .find(|l| l.contains("FAILED") || l.to_lowercase().contains("error"))
        .or_else(|| text.lines().rfind(|l| l.chars().any(char::is_alphanumeric)))
        .unwrap_or("")
        .trim()
        .to_string();
    match status? {
        Some(s) if s.success() => {}
        Some(s) => bail!("mpirun {s}: {why}"),
        None => bail!("mpirun did not finish in {:.0?}: {why}", JOB),
    }
    for (node, r) in nodes.iter().zip(relayed) {
        if r?.is_none() {
            bail!("mpirun never launched orted on {node}");
        }
    }
    check_report(&text, ranks.len(), &names)
}

/// The program's report: every rank up (the guests' among them), and
/// rank 0's "allreduce ok" lines, every size checked.
fn check_report(text: &str, size: usize, guests: &[String]) -> Result<String> {
    for r in 0..size {
        if !text.contains(&format!("rank {r} of {size} on ")) {
            bail!("rank {r} of {size} never reported");
        }
    }
    for g in guests {
        if !text.contains(&format!(" of {size} on {g}")) {
            bail!("no rank ran in the guest {g}");
        }
    }
    let ok: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("allreduce ok:"))
        .collect();
    if ok.len() != OK_LINES {
        bail!("{} of {OK_LINES} allreduce checks reported ok", ok.len());
    }
    let big = ok
        .iter()
        .find(|l| l.contains("131072 x"))
        .map(|l| l.trim().trim_start_matches("allreduce ok: ").to_string())
        .unwrap_or_default();
    Ok(format!("{size} ranks, {OK_LINES} checks ok ({big})"))
}

/// Both ranks in rxe VMs (a and b); mpirun on the host, not under xroce.
pub(super) fn rxe_rxe(ns: &Netns, a: &mut Vm, b: &mut Vm, table: &mut Table) -> Result<()> {
    if !rxe_rxe_wanted() {
        return Ok(());
    }
    let t = Instant::now();
    let cap = artifacts_dir().join("mpi_rxe-rxe_allreduce.pcap");
    let ranks = [&a.ip, &b.ip].map(|ip| Rank {
        node: ip.clone(),
        dev: "rxe0".into(),
        program: GUEST_PROGRAM.into(),
    });
    let r = prepare(&mut [&mut *a, &mut *b]).and_then(|(versions, _)| {
        captured(ns, &cap, || {
            job(
                ns,
                &[],
                &ranks,
                vec![a, b],
                &cap.with_extension("mpirun.log"),
            )
        })
        .map(|n| format!("{n}; {versions}"))
    });
    table.record(RXE_RXE, t, &r);
    Ok(())
}

const RXE_RXE: &str = "mpi rxe<->rxe allreduce pml ucx";

pub(super) fn rxe_rxe_wanted() -> bool {
    wanted(RXE_RXE)
}

/// Builds the program, installs it in each VM, checks the versions;
/// returns them and the host's program.
fn prepare(vms: &mut [&mut Vm]) -> Result<(String, PathBuf)> {
    let bin = build_program()?;
    let mut versions = String::new();
    for vm in vms.iter_mut() {
        install(vm, &bin)?;
        versions = same_versions(vm)?;
    }
    Ok((versions, bin))
}

/// Rank 0 on the host under `xroce run` (AF_XDP or UDP backend on xr0),
/// rank 1 in the guest on rxe0.
pub(super) fn interop(ns: &Netns, vm: &mut Vm, x: &str, table: &mut Table) -> Result<()> {
    let names: Vec<(&str, String)> = BACKENDS
        .iter()
        .map(|b| (*b, format!("mpi xroce <-> rxe allreduce pml ucx ({b})")))
        .filter(|(_, n)| wanted(n))
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    // The first case's time includes building and installing the program.
    let mut first = Some(Instant::now());
    // The ranks use the link-local GIDs (ucx::UD_GID_INDEX).
    let prepared = super::ipv6_link_ready(ns, vm).and_then(|_| prepare(&mut [&mut *vm]));
    for (backend, name) in names {
        let t = first.take().unwrap_or_else(Instant::now);
        let cap = artifacts_dir().join(format!("mpi_xroce-rxe_allreduce_{backend}.pcap"));
        let r = match &prepared {
            Err(e) => Err(anyhow::anyhow!("not run: {e:#}")),
            Ok((versions, bin)) => {
                let ranks = [
                    Rank {
                        node: HOST_IP.into(),
                        dev: format!("xroce_{HOST_IFACE}"),
                        program: bin.to_string_lossy().into_owned(),
                    },
                    Rank {
                        node: vm.ip.clone(),
                        dev: "rxe0".into(),
                        program: GUEST_PROGRAM.into(),
                    },
                ];
                let prefix: Vec<String> = [
                    "env",
                    "XROCE_VERBS_DEBUG=1",
                    x,
                    "run",
                    "--iface",
                    HOST_IFACE,
                    "--backend",
                    backend,
                    "--",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                let r = captured(ns, &cap, || {
                    job(
                        ns,
                        &prefix,
                        &ranks,
                        vec![&mut *vm],
                        &cap.with_extension("mpirun.log"),
                    )
                });
                save_stats(ns, x, &cap);
                r.map(|n| format!("{n}; {versions}"))
            }
        };
        let _ = ns.enter(&[x, "detach", "--iface", HOST_IFACE]).output();
        table.record(&name, t, &r);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_app_context_per_rank_with_its_device() {
        let ranks = [
            Rank {
                node: "10.77.0.1".into(),
                dev: "xroce_xr0".into(),
                program: "/h/mpi_allreduce".into(),
            },
            Rank {
                node: "10.77.0.10".into(),
                dev: "rxe0".into(),
                program: GUEST_PROGRAM.into(),
            },
        ];
        let s = mpirun_args(Path::new("/d/vm-launch"), &ranks).join(" ");
        assert!(s.contains("--mca plm_rsh_agent sh /d/vm-launch"), "{s}");
        assert!(s.contains("--mca pml ucx"), "{s}");
        assert!(s.ends_with(
            "-np 1 --host 10.77.0.1 env UCX_TLS=rc UCX_NET_DEVICES=xroce_xr0:1 UCX_IB_GID_INDEX=0 /h/mpi_allreduce : \
             -np 1 --host 10.77.0.10 env UCX_TLS=rc UCX_NET_DEVICES=rxe0:1 UCX_IB_GID_INDEX=0 /opt/xroce/mpi_allreduce"
        ), "{s}");
    }

    #[test]
    fn the_report_needs_every_rank_and_every_check() {
        let good = "rank 0 of 2 on host\nrank 1 of 2 on vm0-6.1\n\
            allreduce ok: 1 x int64 SUM+MAX x 3 rounds in 0.1 s\n\
            allreduce ok: 1000 x int64 SUM+MAX x 3 rounds in 0.1 s\n\
            allreduce ok: 131072 x int64 SUM+MAX x 3 rounds in 2.000 s\n\
            allreduce ok: 4096 x int64 MPI_IN_PLACE SUM\n";
        let guests = ["vm0-6.1".to_string()];
        assert!(check_report(good, 2, &guests)
            .unwrap()
            .contains("131072 x int64"));
        let missing = good.replace("allreduce ok: 4096", "x");
        assert!(check_report(&missing, 2, &guests).is_err());
        assert!(check_report(good, 2, &["vm1-6.1".to_string()]).is_err());
        assert!(check_report(&good.replace("rank 1 of 2", "r"), 2, &guests).is_err());
    }
}
