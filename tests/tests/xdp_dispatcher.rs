//! xroce's XDP program and libxdp's dispatcher (issue 15, item 4) on the
//! machine the tests run on. xdp-filter is the oracle for what the kernel
//! allows: loaded alone on a fresh interface, it runs under libxdp's
//! dispatcher where the kernel takes EXT programs and directly where it
//! does not (libxdp's fallback, e.g. under lockdown). xroce must do the
//! same: under the dispatcher, with xdp-filter loading beside it and
//! staying after `xroce detach`; else attached directly (xdp-filter
//! refused beside it, as before). Either way RDMA over AF_XDP runs with
//! its data verified and `xroce stats` reads the program's counters. The
//! VM matrix (xtask/src/vm/suites/dispatcher.rs) proves the dispatcher
//! branch on Debian's kernels.

use std::process::Output;

use xroce_report::{StatsReport, StatusReport};
use xroce_tests::{perf::afxdp_write_verified, require_root, workspace_bin, Netns, VethPair};

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn xroce_in(ns: &Netns, args: &[&str]) -> Output {
    ns.command(workspace_bin("xroce"))
        .args(args)
        .output()
        .expect("run xroce")
}

/// The `prog/xdp ...` line `ip -d link` prints for `iface`, if any.
fn ip_link_prog(ns: &Netns, iface: &str) -> Option<String> {
    let out = ns.exec(&["ip", "-d", "link", "show", "dev", iface]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("prog/xdp"))
        .map(|l| l.trim().to_string())
}

fn xdp_tool(ns: &Netns, args: &[&str]) -> Output {
    ns.command(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{} (install xdp-tools): {e}", args[0]))
}

/// The bpffs directories xdp-filter and libxdp make and leave (empty) behind:
/// those that were not there before the test are removed after it, on every
/// exit path; remove_dir takes only empty ones, so no one else's state goes.
struct ToolDirs(Vec<&'static str>);

impl ToolDirs {
    fn new() -> Self {
        let dirs = [
            "/sys/fs/bpf/xdp-filter/programs",
            "/sys/fs/bpf/xdp-filter",
            "/sys/fs/bpf/xdp",
        ];
        Self(
            dirs.into_iter()
                .filter(|d| !std::path::Path::new(d).exists())
                .collect(),
        )
    }
}

impl Drop for ToolDirs {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[test]
fn xroce_joins_libxdp_dispatcher_where_the_kernel_allows_and_attaches_directly_where_not() {
    require_root();
    let _tool_dirs = ToolDirs::new();
    let pair = VethPair::new(1500);
    let (a, b) = (&pair.a, &pair.b);

    // The oracle: xdp-filter alone on if_a.
    let out = xdp_tool(a, &["xdp-filter", "load", &pair.if_a]);
    assert!(
        out.status.success(),
        "xdp-filter load alone: {}",
        text(&out)
    );
    let alone = ip_link_prog(a, &pair.if_a).expect("xdp-filter attached nothing");
    let kernel_allows = alone.contains("xdp_dispatcher");
    let out = xdp_tool(a, &["xdp-filter", "unload", &pair.if_a]);
    assert!(out.status.success(), "xdp-filter unload: {}", text(&out));

    let out = xroce_in(b, &["attach", "--iface", &pair.if_b]);
    assert!(out.status.success(), "xroce attach: {}", text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("libbpf:"),
        "libbpf's messages leak out of attach: {}",
        text(&out)
    );
    let prog = ip_link_prog(b, &pair.if_b).expect("xroce attach attached nothing");
    let out = xroce_in(b, &["status", "--json"]);
    assert!(out.status.success(), "xroce status: {}", text(&out));
    let status: StatusReport = serde_json::from_slice(&out.stdout).expect("status JSON");
    let xdp = status
        .interfaces
        .iter()
        .find(|i| i.iface == pair.if_b)
        .and_then(|i| i.xdp.clone())
        .unwrap_or_else(|| panic!("xroce status does not list {}: {}", pair.if_b, text(&out)));

    let filter = xdp_tool(b, &["xdp-filter", "load", &pair.if_b]);
    if kernel_allows {
        let d = xdp
            .dispatcher
            .expect("xdp-filter ran under a dispatcher, xroce did not");
        assert!(
            prog.contains(&format!("id {d} name xdp_dispatcher")),
            "{prog}"
        );
        assert!(
            filter.status.success(),
            "xdp-filter beside xroce: {}",
            text(&filter)
        );
        let st = xdp_tool(b, &["xdp-loader", "status", &pair.if_b]);
        let st = String::from_utf8_lossy(&st.stdout).into_owned();
        assert!(st.contains("xroce_xdp") && st.contains("xdpfilt_"), "{st}");
    } else {
        assert_eq!(xdp.dispatcher, None, "{xdp:?}");
        assert!(
            prog.contains(&format!("id {} name xroce_xdp", xdp.prog_id)),
            "{prog}"
        );
        assert!(
            !filter.status.success(),
            "xdp-filter loaded beside a directly attached xroce: {}",
            text(&filter)
        );
        assert_eq!(ip_link_prog(b, &pair.if_b).as_deref(), Some(prog.as_str()));
    }

    let r = afxdp_write_verified(&pair);
    let out = xroce_in(b, &["stats", "--iface", &pair.if_b, "--json"]);
    assert!(out.status.success(), "xroce stats: {}", text(&out));
    let stats: StatsReport = serde_json::from_slice(&out.stdout).expect("stats JSON");
    assert!(
        stats.xdp.get("redirected").copied().unwrap_or(0) >= 300,
        "{:?}",
        stats.xdp
    );

    let out = xroce_in(b, &["detach", "--iface", &pair.if_b]);
    assert!(out.status.success(), "xroce detach: {}", text(&out));
    if kernel_allows {
        let left = ip_link_prog(b, &pair.if_b).expect("detach took xdp-filter too");
        let st = xdp_tool(b, &["xdp-loader", "status", &pair.if_b]);
        let st = String::from_utf8_lossy(&st.stdout).into_owned();
        assert!(
            !st.contains("xroce_xdp") && st.contains("xdpfilt_"),
            "{left}\n{st}"
        );
        let out = xdp_tool(b, &["xdp-filter", "unload", &pair.if_b]);
        assert!(out.status.success(), "xdp-filter unload: {}", text(&out));
    }
    assert_eq!(ip_link_prog(b, &pair.if_b), None, "a program is left");
    // The client's device attached if_a for itself and detached it.
    eprintln!(
        "kernel takes EXT: {kernel_allows}; xroce: {prog}; WRITE 64 KiB x {} verified at {:.2} Gbit/s",
        r.iters, r.gbps
    );
}
