//! How xroce's XDP program is attached and found again (issue 15, items 1
//! and 2): the program belongs to the interface (attached over rtnetlink)
//! and every command finds it through the interface, so
//! - a namespace deleted while attached leaves nothing that makes the next
//!   interface of that name look attached, and what an older xroce left
//!   there (a pin directory) is recognised as stale, removed, and named;
//! - `ip netns exec NS xroce attach` (a private /sys, hence a private
//!   bpffs) leaves the program attached, and stats, ecn and fault reach it
//!   from `ip netns exec` and from `nsenter --net` alike.
//!
//! Both end with RDMA over AF_XDP whose data is verified.

use std::{path::PathBuf, process::Output};

use xroce_tests::{
    in_netns, perf::afxdp_write_verified, require_root, unique_tag, workspace_bin, Netns, VethPair,
};

/// Addresses of these tests' links (only inside their namespaces).
fn addrs(octet: u8) -> (std::net::Ipv4Addr, std::net::Ipv4Addr) {
    (
        std::net::Ipv4Addr::new(10, 77, octet, 1),
        std::net::Ipv4Addr::new(10, 77, octet, 2),
    )
}

/// Two new namespaces `<ns>a`/`<ns>b` joined by a veth `if_a`-`if_b`.
fn link(ns: &str, if_a: &str, if_b: &str, octet: u8) -> (Netns, Netns) {
    let a = Netns::new(format!("{ns}a"));
    let b = Netns::new(format!("{ns}b"));
    xroce_netns::add_veth(
        xroce_netns::VethEnd {
            netns: &a.name,
            iface: if_a,
        },
        xroce_netns::VethEnd {
            netns: &b.name,
            iface: if_b,
        },
        1500,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (addr_a, addr_b) = addrs(octet);
    for (n, iface, addr) in [(&a, if_a, addr_a), (&b, if_b, addr_b)] {
        n.exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", iface]);
        n.exec(&["ip", "link", "set", iface, "up"]);
        n.exec(&["ip", "link", "set", "lo", "up"]);
    }
    (a, b)
}

fn xroce_in(ns: &Netns, args: &[&str]) -> Output {
    ns.command(workspace_bin("xroce"))
        .args(args)
        .output()
        .expect("run xroce")
}

/// `ip netns exec NS xroce ARGS`: the command gets a private /sys.
fn xroce_ip_netns_exec(ns: &str, args: &[&str]) -> Output {
    std::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(workspace_bin("xroce"))
        .args(args)
        .output()
        .expect("run ip netns exec")
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The XDP program `ip link` reports on `iface` in `ns` (name, id), if any.
fn ip_link_prog(ns: &Netns, iface: &str) -> Option<String> {
    let out = ns.exec(&["ip", "-d", "link", "show", "dev", iface]);
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    out.lines()
        .find(|l| l.trim_start().starts_with("prog/xdp"))
        .map(|l| l.trim().to_string())
}

/// What an xroce before this change pinned for `iface` and, when the
/// interface's namespace was deleted, left behind: `<PIN_ROOT>/<iface>/`
/// holding a `link` entry.
fn old_pin_dir(iface: &str) -> PathBuf {
    xroce::xdp::pin_dir(iface)
}

/// Removes what this test planted or an old build left, however it ends.
struct PinCleanup(Vec<String>);

impl Drop for PinCleanup {
    fn drop(&mut self) {
        for iface in &self.0 {
            let _ = std::fs::remove_dir_all(old_pin_dir(iface));
        }
    }
}

#[test]
fn a_deleted_namespace_leaves_no_attachment_behind_and_old_pins_are_cleaned() {
    require_root();
    let tag = unique_tag();
    let (if_a, if_b) = (format!("xs{tag}a"), format!("xs{tag}b"));
    let _cleanup = PinCleanup(vec![if_a.clone(), if_b.clone()]);
    let octet = 200 + (std::process::id() % 50) as u8;

    // Round 1: attach on both ends, then delete the namespaces without
    // detaching (as `ip netns del` after a crash does).
    {
        let (a, b) = link(&format!("xs{tag}1"), &if_a, &if_b, octet);
        for (n, iface) in [(&a, &if_a), (&b, &if_b)] {
            let out = xroce_in(n, &["attach", "--iface", iface]);
            assert!(out.status.success(), "attach {iface}: {}", text(&out));
            assert!(
                ip_link_prog(n, iface).is_some_and(|p| p.contains("xroce_xdp")),
                "{iface} runs no xroce_xdp after attach"
            );
        }
    }

    // What an xroce before this change left for each name (its pinned link
    // and maps under /sys/fs/bpf/xroce/IF). This build pins nothing, so the
    // directory is planted as that version left it; the old code left it
    // itself, then took the next interface of that name for attached.
    for iface in [&if_a, &if_b] {
        let dir = old_pin_dir(iface);
        if !dir.exists() {
            std::fs::create_dir_all(dir.join(xroce_common::names::LINK_PIN))
                .unwrap_or_else(|e| panic!("plant {}: {e}", dir.display()));
        }
    }

    // Round 2: new namespaces, the same interface names.
    let (a, b) = link(&format!("xs{tag}2"), &if_a, &if_b, octet);
    let out = xroce_in(&b, &["attach", "--iface", &if_b]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "attach on a new {if_b} after the old one's namespace was deleted: {}",
        text(&out)
    );
    let dir_b = old_pin_dir(&if_b);
    assert!(
        stderr.contains("stale") && stderr.contains(&dir_b.display().to_string()),
        "attach does not name the stale state it cleaned: {stderr}"
    );
    assert!(!dir_b.exists(), "{} is still there", dir_b.display());
    assert!(
        ip_link_prog(&b, &if_b).is_some_and(|p| p.contains("xroce_xdp")),
        "the new {if_b} runs no xroce_xdp"
    );

    // RDMA WRITE over AF_XDP on both ends (the client attaches to if_a
    // itself, past that interface's stale directory), data verified.
    let (addr_a, addr_b) = addrs(octet);
    let pair = VethPair {
        a,
        b,
        if_a: if_a.clone(),
        if_b: if_b.clone(),
        addr_a,
        addr_b,
    };
    let r = afxdp_write_verified(&pair);
    assert!(
        !old_pin_dir(&if_a).exists(),
        "the client's device did not clean {}",
        old_pin_dir(&if_a).display()
    );
    let out = xroce_in(&pair.b, &["detach", "--iface", &if_b]);
    assert!(out.status.success(), "detach: {}", text(&out));
    assert_eq!(ip_link_prog(&pair.b, &if_b), None, "detach left a program");
    eprintln!(
        "stale state cleaned: {}; WRITE 64 KiB x {} verified at {:.2} Gbit/s",
        stderr.trim(),
        r.iters,
        r.gbps
    );
}

/// `xroce stats --iface IF --json` by one route, parsed.
fn stats(out: Output, route: &str) -> serde_json::Value {
    assert!(out.status.success(), "stats via {route}: {}", text(&out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stats JSON via {route}: {e}\n{}", text(&out)))
}

#[test]
fn ip_netns_exec_attach_outlives_the_command_and_every_route_finds_it() {
    require_root();
    let pair = VethPair::new(1500);
    let (ns_b, if_b) = (pair.b.name.clone(), pair.if_b.clone());

    let out = xroce_ip_netns_exec(&ns_b, &["attach", "--iface", &if_b]);
    assert!(out.status.success(), "ip netns exec attach: {}", text(&out));
    // The command and its private /sys are gone: the program must not be.
    let prog = ip_link_prog(&pair.b, &if_b)
        .unwrap_or_else(|| panic!("nothing attached to {if_b} after `ip netns exec ... attach`"));
    assert!(prog.contains("xroce_xdp"), "{prog}");
    let q = {
        let i = if_b.clone();
        in_netns(&ns_b, move || xroce::xdp::query(&i))
            .unwrap_or_else(|e| panic!("query: {e}"))
            .unwrap_or_else(|| panic!("query finds no xroce program on {if_b}"))
    };
    assert!(
        prog.contains(&format!("id {}", q.prog_id)),
        "{prog} vs {q:?}"
    );
    assert!(!q.by_process, "an admin's attach is not a process's: {q:?}");
    assert_eq!(q.dispatcher, None, "{q:?}");
    // Attaching again, by the other route, sees it.
    let again = xroce_in(&pair.b, &["attach", "--iface", &if_b]);
    assert!(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr).contains("already has the xroce XDP program"),
        "{}",
        text(&again)
    );

    // Frames through the program, then its counters by both routes.
    pair.a.exec(&[
        "ping",
        "-c",
        "3",
        "-i",
        "0.2",
        "-q",
        &pair.addr_b.to_string(),
    ]);
    let args = ["stats", "--iface", if_b.as_str(), "--json"];
    let via_exec = stats(xroce_ip_netns_exec(&ns_b, &args), "ip netns exec");
    let via_nsenter = stats(xroce_in(&pair.b, &args), "nsenter");
    for (route, s) in [("ip netns exec", &via_exec), ("nsenter", &via_nsenter)] {
        let seen = s["xdp"]["seen"].as_u64().unwrap_or(0);
        assert!(seen >= 3, "{route}: the program saw {seen} frames: {s}");
    }

    // ECN set by one route, read by the other; loss injection the other way.
    let out = xroce_ip_netns_exec(
        &ns_b,
        &[
            "ecn",
            "--iface",
            &if_b,
            "--link-rate",
            "1gbit",
            "--kmin",
            "5KB",
            "--kmax",
            "200KB",
        ],
    );
    assert!(
        out.status.success(),
        "ecn via ip netns exec: {}",
        text(&out)
    );
    let s = stats(xroce_in(&pair.b, &args), "nsenter");
    assert_eq!(s["ecn"]["enabled"], true, "{s}");
    assert_eq!(s["ecn"]["link_rate_bps"], 1_000_000_000u64, "{s}");
    let out = xroce_in(
        &pair.b,
        &["fault", "--iface", &if_b, "--drop", "0.25", "--seed", "7"],
    );
    assert!(out.status.success(), "fault via nsenter: {}", text(&out));
    let s = stats(xroce_ip_netns_exec(&ns_b, &args), "ip netns exec");
    assert_eq!(s["fault"]["enabled"], true, "{s}");
    assert_eq!(s["fault"]["seed"], 7, "{s}");
    for (what, off) in [
        ("ecn", ["ecn", "--iface", &if_b, "--off"]),
        ("fault", ["fault", "--iface", &if_b, "--off"]),
    ] {
        let out = xroce_ip_netns_exec(&ns_b, &off);
        assert!(out.status.success(), "{what} --off: {}", text(&out));
    }

    // RDMA over AF_XDP through that attachment (the server's sockets join
    // its XSKMAP, found by id), data verified.
    let r = afxdp_write_verified(&pair);
    assert!(
        ip_link_prog(&pair.b, &if_b).is_some_and(|p| p.contains(&format!("id {}", q.prog_id))),
        "the admin's attachment did not stay through the run"
    );

    let out = xroce_ip_netns_exec(&ns_b, &["detach", "--iface", &if_b]);
    assert!(out.status.success(), "ip netns exec detach: {}", text(&out));
    assert_eq!(ip_link_prog(&pair.b, &if_b), None, "detach left a program");
    let out = xroce_in(&pair.b, &["stats", "--iface", &if_b]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("xroce attach"),
        "stats after detach: {}",
        text(&out)
    );
    eprintln!(
        "attached by ip netns exec as {prog}; WRITE 64 KiB x {} verified at {:.2} Gbit/s",
        r.iters, r.gbps
    );
}
