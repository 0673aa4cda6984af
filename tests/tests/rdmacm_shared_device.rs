//! RDMA-CM from several processes of one device (the QP1 relay of
//! userspace/rdmacm/src/objects/agent/relay.rs), with Debian's unmodified rping
//! under `xroce run`, on both backends:
//!
//! - one device: an rping server and its client are two processes on the
//!   same namespace and interface, the client connecting to the
//!   interface's own address (the first process holds QPN block 0 and
//!   QP1, the other's MADs go through its relay); both exit 0 with every
//!   ping;
//! - a server that does not hold QP1: a first rping server on b (holding
//!   block 0, listening on a port nobody uses) serves the relay; a second
//!   rping server on b, which gets EBUSY for QP1 and uses the relay,
//!   accepts an rping client from namespace a. The holder's debug lines
//!   show the second server registering its service ID and the client's
//!   MADs handed to it.
//!
//! Readiness is awaited on the libraries' debug lines (XROCE_RDMACM_DEBUG):
//! the holder's agent line, then the relay's registration of the second
//! server's listener. rping prints nothing when it listens, so a client
//! that fails at once while its server runs is tried again (up to 3 times).

use std::time::{Duration, Instant};

use xroce_tests::{
    per_backend,
    programs::{args, next_port, serial, Backend, Cases, Finished, Node, Proc, Topology},
    require_root,
    verbs::{ibverbs_cdylib, rdmacm_cdylib, which},
};

/// One program run.
const RUN: Duration = Duration::from_secs(60);
/// Waiting for a debug line that says a process is ready.
const READY: Duration = Duration::from_secs(30);
const PINGS: usize = 20;
const SIZE: usize = 100;
const ATTEMPTS: u32 = 3;
const QUICK_FAILURE: Duration = Duration::from_secs(5);

fn require_programs() {
    assert!(
        which("rping").is_some(),
        "rping is missing: install rdmacm-utils (cargo xtask setup does)"
    );
    let _ = (ibverbs_cdylib(), rdmacm_cdylib());
}

fn start(t: &Topology, node: Node<'_>, program_args: &[String], role: &str) -> Proc {
    let mut cmd = t.command(node, "rping", program_args);
    cmd.env("XROCE_RDMACM_DEBUG", "1");
    let what = format!(
        "[{} in {}] {role}: rping {}",
        t.backend.as_str(),
        node.ns.name,
        program_args.join(" ")
    );
    Proc::spawn(cmd, what, &t.dir.0)
}

/// Waits until `p`'s stderr has `needle`.
fn await_line(p: &mut Proc, needle: &str) -> Result<(), String> {
    let until = Instant::now() + READY;
    loop {
        if p.stderr_so_far().contains(needle) {
            return Ok(());
        }
        if p.exited() || Instant::now() >= until {
            return Err(format!(
                "{} never printed {needle:?}; stderr:\n{}",
                p.what,
                p.stderr_so_far()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn rping_args(server: bool, addr: &str, port: &str, count: usize) -> Vec<String> {
    let mut a = args(&[if server { "-s" } else { "-c" }, "-a", addr, "-p", port]);
    a.extend(args(&[
        "-C",
        &count.to_string(),
        "-V",
        "-v",
        "-S",
        &SIZE.to_string(),
    ]));
    a
}

/// rping's "ping data: rdma-ping-N: ..." lines, every one of them whole.
fn check_pings(f: &Finished, prefix: &str) -> Result<(), String> {
    let lines: Vec<&str> = f
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .collect();
    if lines.len() != PINGS {
        return Err(format!(
            "{} lines {prefix:?}, expected {PINGS}\n{}",
            lines.len(),
            f.describe()
        ));
    }
    for (n, line) in lines.iter().enumerate() {
        if !line.starts_with(&format!("rdma-ping-{n}: ")) || line.len() != SIZE - 1 {
            return Err(format!("ping {n} is {line:?}\n{}", f.describe()));
        }
    }
    Ok(())
}

/// Runs a client on `node` against `server` (running), tried again while
/// it fails at once; then checks both ends.
fn client_against(
    t: &Topology,
    node: Node<'_>,
    mut server: Proc,
    client_args: &[String],
) -> Result<String, String> {
    let mut attempts = 0;
    let client = loop {
        attempts += 1;
        let c = start(t, node, client_args, "client").finish(RUN);
        let early = !c.success() && c.secs < QUICK_FAILURE.as_secs_f64();
        if !early || attempts >= ATTEMPTS || server.exited() {
            break c;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let server = server.finish(if client.success() {
        RUN
    } else {
        Duration::from_secs(10)
    });
    client.check()?;
    server.check()?;
    check_pings(&client, "ping data: ")?;
    check_pings(&server, "server ping data: ")?;
    Ok(format!(
        "{PINGS} pings of {SIZE} B both ways, client {:.1}s, {attempts} attempt(s)",
        client.secs
    ))
}

per_backend!(two_processes_one_device, server_without_qp1,);

fn two_processes_one_device(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("two_processes_one_device/{}", b.as_str()));
    c.case("rping server and client on one device", || {
        let node = t.server();
        let addr = node.addr.to_string();
        let port = next_port().to_string();
        let mut server = start(
            &t,
            t.server(),
            &rping_args(true, &addr, &port, PINGS),
            "server",
        );
        await_line(&mut server, "CM agent of")?;
        let out = client_against(
            &t,
            t.server(),
            server,
            &rping_args(false, &addr, &port, PINGS),
        )?;
        Ok(out)
    });
    c.finish();
}

fn server_without_qp1(b: Backend) {
    require_root();
    require_programs();
    let _turn = serial();
    let t = Topology::direct(b, 1500);
    let mut c = Cases::new(&format!("server_without_qp1/{}", b.as_str()));
    c.case(
        "rping server relayed by the QP1 holder, client from the other namespace",
        || {
            let addr = t.server().addr.to_string();
            // The holder: listens on a port no client uses, holds block 0.
            let idle_port = next_port().to_string();
            let mut holder = start(
                &t,
                t.server(),
                &rping_args(true, &addr, &idle_port, 1),
                "holder",
            );
            await_line(&mut holder, "CM agent of")?;
            let port = next_port().to_string();
            let server = start(
                &t,
                t.server(),
                &rping_args(true, &addr, &port, PINGS),
                "server",
            );
            await_line(&mut holder, "CM relay: process 1 listens on service ID")?;
            let result = client_against(
                &t,
                t.client(),
                server,
                &rping_args(false, &addr, &port, PINGS),
            );
            // The holder waits for a client forever: end it (by PID).
            holder.signal(libc::SIGTERM);
            let holder = holder.finish(Duration::from_secs(10));
            let out = result?;
            if !holder.stderr.contains("CM relay: handed to process 1") {
                return Err(format!("the holder relayed nothing\n{}", holder.describe()));
            }
            Ok(out)
        },
    );
    c.finish();
}
