//! The device view of `xroce run` (userspace/cli/src/view.rs): a program
//! run with `xroce run --iface IF` finds `xroce_IF` where UCX, hwloc,
//! pyverbs' tests and rdma-core look for rxe's devices, and nothing of it
//! is left on the host afterwards.
//!
//! For root (afxdp backend) and for an unprivileged user (`setpriv
//! --reuid=65534 --regid=65534 --clear-groups`, udp backend), each entered
//! both ways the harness and users enter a namespace (`nsenter --net`, which
//! keeps the host's /sys, and `ip netns exec`, which mounts the
//! namespace's own):
//! - a shell reads every file of /sys/class/infiniband/xroce_IF (each
//!   equal to what `xroce::device::sysfs` generates for the interface, and
//!   the main ones to values spelled out here: "1: CA", the EUI-64 GUID,
//!   the IPv4-mapped GID 1, "RoCE v2", the interface as ndev, ...), the
//!   uverbs class files, the /dev/infiniband nodes (character devices that
//!   open read-write), and checks that /sys/class/net still resolves and
//!   pseudo-terminals still open;
//! - ibv_devinfo lists the device with its port active;
//! - `ucx_info -d` lists `xroce_IF:1` with the rc_verbs and ud_verbs
//!   transports (UCX's own check that a verbs device is visible: its
//!   sysfs files and /dev/infiniband/uverbsN);
//! - with `--no-device-view` (as with LD_LIBRARY_PATH alone) `ucx_info -d`
//!   lists no transport on the device;
//! - hwloc (tests/c/hwloc_openfabrics.c, with HWLOC_VIRTUAL_LINUX_OSDEV=1
//!   as for rxe on a veth) lists `xroce_IF` with the GUID and GID 1;
//! - with a second interface, the uverbsN of the view are the drop-in's
//!   own `dev_name`s (read from its device list), in `--iface` order and
//!   in the default (sorted) list;
//! - after each run the host has the /sys/class/infiniband and
//!   /dev/infiniband it had before, no mount of the view and none of its
//!   staging names;
//! - without root where no user namespace may be made (a limit of 0 in a
//!   user namespace of the test's own; the host's stays), `xroce run`
//!   stops before PROGRAM with status 1 and names user.max_user_namespaces.

use std::{collections::BTreeMap, path::Path, process::Command, time::Duration};

use xroce::device::sysfs::DeviceFacts;
use xroce_tests::{
    in_netns,
    programs::{serial, Backend, Cases, Finished, Proc, TempDir, Topology},
    require_root,
    verbs::compile_c,
    workspace_bin,
};

const RUN: Duration = Duration::from_secs(60);
/// Where the unprivileged user runs xroce from (see [`reachable_copy`]).
const REACHABLE_XROCE: &str = "bin/xroce";

/// xroce and its libraries linked (or copied) into the test's directory,
/// which every user may enter: the workspace's target directory may lie
/// below one the unprivileged user cannot (/root).
fn reachable_copy(dir: &Path) {
    let bin = dir.join(REACHABLE_XROCE);
    let lib = bin.parent().unwrap().join("lib");
    std::fs::create_dir_all(&lib).unwrap_or_else(|e| panic!("mkdir {}: {e}", lib.display()));
    for (from, to) in [
        (workspace_bin("xroce"), bin.clone()),
        (
            workspace_bin("libxroce_ibverbs.so"),
            lib.join("libibverbs.so.1"),
        ),
        (
            workspace_bin("libxroce_rdmacm.so"),
            lib.join("librdmacm.so.1"),
        ),
    ] {
        std::fs::hard_link(&from, &to)
            .or_else(|_| std::fs::copy(&from, &to).map(drop))
            .unwrap_or_else(|e| panic!("link {} to {}: {e}", from.display(), to.display()));
    }
    for d in [dir, bin.parent().unwrap(), &lib] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", d.display()));
    }
}

#[derive(Clone, Copy, Debug)]
enum Who {
    Root,
    Nobody,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Nsenter,
    IpNetnsExec,
}

/// `xroce run --iface IF --backend B -- ARGV` in the node's namespace,
/// entered as `entry` says, as `who`.
fn xroce_run(t: &Topology, who: Who, entry: Entry, argv: &[&str]) -> Command {
    let backend = match who {
        Who::Root => Backend::AfXdp,
        Who::Nobody => Backend::Udp,
    };
    xroce_run_on(t, &[t.client().iface], backend, who, entry, argv)
}

/// [`xroce_run`] with an `--iface` for each of `ifaces` (none: the
/// default list) and the given backend.
fn xroce_run_on(
    t: &Topology,
    ifaces: &[&str],
    backend: Backend,
    who: Who,
    entry: Entry,
    argv: &[&str],
) -> Command {
    let node = t.client();
    let mut cmd = match entry {
        Entry::Nsenter => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", node.ns.path().display()))
                .arg("--");
            c
        }
        Entry::IpNetnsExec => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &node.ns.name]);
            c
        }
    };
    if let Who::Nobody = who {
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]);
    }
    let xroce = match who {
        Who::Root => workspace_bin("xroce"),
        Who::Nobody => t.dir.0.join(REACHABLE_XROCE),
    };
    cmd.arg(xroce).arg("run");
    for iface in ifaces {
        cmd.args(["--iface", iface]);
    }
    cmd.args(["--backend", backend.as_str(), "--"]).args(argv);
    cmd
}

fn run(t: &Topology, who: Who, entry: Entry, argv: &[&str]) -> Finished {
    let node = t.client();
    let what = format!("[{who:?} {entry:?} in {}] {}", node.ns.name, argv.join(" "));
    Proc::spawn(xroce_run(t, who, entry, argv), what, &t.dir.0).finish(RUN)
}

/// The shell that reports what the program sees: `./REL:CONTENT` for
/// every file of the device's directory, then `KEY=VALUE` lines.
fn checker(iface: &str) -> String {
    format!(
        r#"set -u
d=/sys/class/infiniband/xroce_{iface}
cd "$d" || exit 2
grep -r . .
echo "classes=$(echo $(ls /sys/class/infiniband))"
echo "class_link=$(readlink /sys/class/infiniband/xroce_{iface})"
echo "uverbs_link=$(readlink /sys/class/infiniband_verbs/uverbs0)"
echo "verbs=$(echo $(ls /sys/class/infiniband_verbs))"
echo "verbs_abi=$(cat /sys/class/infiniband_verbs/abi_version)"
for f in ibdev abi_version dev; do echo "uverbs0/$f=$(cat /sys/class/infiniband_verbs/uverbs0/$f)"; done
echo "uverbs0/device=$(readlink /sys/class/infiniband_verbs/uverbs0/device)"
echo "net=$(echo $(ls device/net))"
echo "net_link=$(readlink device/net/{iface})"
for n in uverbs0 rdma_cm; do
  echo "$n=$(stat -L -c %F /dev/infiniband/$n)"
  if (exec 3<>/dev/infiniband/$n); then echo "${{n}}_rw=ok"; else echo "${{n}}_rw=failed"; fi
done
echo "lo=$(realpath /sys/class/net/lo)"
echo "iface=$(realpath -e -q /sys/class/net/{iface})"
echo "mntns=$(readlink /proc/self/ns/mnt)"
echo "id=$(id -u):$(id -g)"
python3 -c 'import os; os.openpty(); print("pty=ok")'
"#
    )
}

/// (files by relative path, key=value lines).
fn parse(stdout: &str) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut files = BTreeMap::new();
    let mut keys = BTreeMap::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("./") {
            if let Some((path, content)) = rest.split_once(':') {
                files.insert(path.to_string(), content.to_string());
            }
        } else if let Some((k, v)) = line.split_once('=') {
            keys.insert(k.to_string(), v.to_string());
        }
    }
    (files, keys)
}

fn expect_eq(what: &str, got: Option<&String>, want: &str, errors: &mut Vec<String>) {
    if got.map(String::as_str) != Some(want) {
        errors.push(format!("{what}: {got:?}, want {want:?}"));
    }
}

/// The node GUID rxe shows for `mac`: the modified EUI-64 in four groups.
fn eui64_groups(mac: [u8; 6]) -> String {
    let b = [
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    b.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// What the host has, to compare before and after a run.
#[derive(Debug, PartialEq, Eq)]
struct HostState {
    sys_class_infiniband: bool,
    dev_infiniband: bool,
    view_mounts: usize,
    staging: bool,
}

fn host_state() -> HostState {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    HostState {
        sys_class_infiniband: Path::new("/sys/class/infiniband").exists()
            || Path::new("/sys/devices/virtual/infiniband").exists(),
        dev_infiniband: Path::new("/dev/infiniband").exists(),
        view_mounts: mountinfo
            .lines()
            .filter(|l| l.contains("xroce-view"))
            .count(),
        staging: Path::new("/dev/.xroce-host-dev").exists()
            || Path::new("/sys/class/.xroce-dev-stage").exists(),
    }
}

fn check_view(t: &Topology, who: Who, entry: Entry) -> Result<String, String> {
    let node = t.client();
    let iface = node.iface.to_string();
    let facts = {
        let iface = iface.clone();
        in_netns(&node.ns.name, move || DeviceFacts::read(&iface))
    }
    .map_err(|e| format!("read {iface}: errno {e}"))?;
    let before = host_state();
    let script = checker(&iface);
    let out = run(t, who, entry, &["sh", "-c", &script]);
    let after = host_state();
    if !out.success() {
        return Err(out.describe());
    }
    let (files, keys) = parse(&out.stdout);
    let mut errors = Vec::new();

    // Every file xroce::device::sysfs generates, with its content.
    let expected: BTreeMap<String, String> = facts
        .files()
        .into_iter()
        .map(|(p, c)| (p, c.trim_end().to_string()))
        .collect();
    for (path, want) in &expected {
        expect_eq(path, files.get(path), want, &mut errors);
    }
    let extra: Vec<&String> = files
        .keys()
        .filter(|p| !expected.contains_key(*p) && !p.starts_with("device/"))
        .collect();
    if !extra.is_empty() {
        errors.push(format!("files the generator does not list: {extra:?}"));
    }
    let gid_files = files
        .keys()
        .filter(|p| p.starts_with("ports/1/gids/"))
        .count();
    if gid_files != 1024 {
        errors.push(format!("{gid_files} GID files, want 1024 (rxe's table)"));
    }

    // The main values, spelled out.
    let v4 = node.addr.octets();
    let spelled = [
        ("node_type", "1: CA".to_string()),
        ("node_guid", eui64_groups(facts.mac)),
        ("sys_image_guid", eui64_groups(facts.mac)),
        ("ports/1/state", "4: ACTIVE".into()),
        ("ports/1/phys_state", "5: LinkUp".into()),
        ("ports/1/link_layer", "Ethernet".into()),
        ("ports/1/lid", "0x0".into()),
        ("ports/1/sm_lid", "0x0".into()),
        ("ports/1/lid_mask_count", "0".into()),
        ("ports/1/cap_mask", "0x04010000".into()),
        // A veth's ethtool speed, 10000 Mb/s, as rxe maps it; the same
        // whichever /sys the program has.
        ("ports/1/rate", "10 Gb/sec (1X QDR)".into()),
        (
            "ports/1/gids/1",
            format!(
                "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
                v4[0], v4[1], v4[2], v4[3]
            ),
        ),
        (
            "ports/1/gids/1023",
            "0000:0000:0000:0000:0000:0000:0000:0000".into(),
        ),
        ("ports/1/gid_attrs/types/0", "RoCE v2".into()),
        ("ports/1/gid_attrs/types/1", "RoCE v2".into()),
        ("ports/1/gid_attrs/ndevs/0", iface.clone()),
        ("ports/1/gid_attrs/ndevs/1", iface.clone()),
        ("ports/1/pkeys/0", "0xffff".into()),
        ("device/numa_node", "-1".into()),
    ];
    for (path, want) in &spelled {
        expect_eq(path, files.get(*path), want, &mut errors);
    }
    if !files
        .get("device/local_cpus")
        .is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_hexdigit() || c == ','))
    {
        errors.push(format!(
            "device/local_cpus: {:?}",
            files.get("device/local_cpus")
        ));
    }

    let ibdev = format!("xroce_{iface}");
    let uid_gid = match who {
        Who::Root => "0:0",
        Who::Nobody => "65534:65534",
    };
    let sys_net = format!("/sys/devices/virtual/net/{iface}");
    let want_keys = [
        ("classes", ibdev.clone()),
        ("verbs", "abi_version uverbs0".into()),
        // Where the kernel puts a parentless device (rxe on a veth).
        (
            "class_link",
            format!("../../devices/virtual/infiniband/{ibdev}"),
        ),
        (
            "uverbs_link",
            "../../devices/virtual/infiniband_verbs/uverbs0".into(),
        ),
        ("verbs_abi", "6".into()),
        ("uverbs0/ibdev", ibdev.clone()),
        ("uverbs0/abi_version", "6".into()),
        ("uverbs0/dev", "231:192".into()),
        ("uverbs0/device", format!("../../infiniband/{ibdev}/device")),
        ("net", iface.clone()),
        // A link to the interface where this /sys shows it.
        (
            "net_link",
            if entry == Entry::IpNetnsExec {
                sys_net.clone()
            } else {
                String::new()
            },
        ),
        ("uverbs0", "character special file".into()),
        ("uverbs0_rw", "ok".into()),
        ("rdma_cm", "character special file".into()),
        ("rdma_cm_rw", "ok".into()),
        ("lo", "/sys/devices/virtual/net/lo".into()),
        (
            "iface",
            if entry == Entry::IpNetnsExec {
                sys_net
            } else {
                String::new()
            },
        ),
        ("id", uid_gid.into()),
        ("pty", "ok".into()),
    ];
    for (key, want) in &want_keys {
        expect_eq(key, keys.get(*key), want, &mut errors);
    }
    let own_mntns = std::fs::read_link("/proc/self/ns/mnt")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if keys.get("mntns") == Some(&own_mntns) {
        errors.push(format!(
            "the program ran in the host's mount namespace {own_mntns}"
        ));
    }
    if before != after || after.view_mounts != 0 || after.staging {
        errors.push(format!(
            "the host changed: before {before:?}, after {after:?}"
        ));
    }
    if errors.is_empty() {
        Ok(format!(
            "{} files as generated, device nodes rw, host unchanged ({after:?})",
            files.len()
        ))
    } else {
        Err(format!("{}\n{}", errors.join("\n"), out.describe()))
    }
}

fn check_devinfo(t: &Topology, who: Who, entry: Entry) -> Result<String, String> {
    let out = run(t, who, entry, &["ibv_devinfo"]);
    out.check()?;
    let want = format!("hca_id:\txroce_{}", t.client().iface);
    if !out.stdout.contains(&want) || !out.stdout.contains("PORT_ACTIVE") {
        return Err(format!("no {want:?} with PORT_ACTIVE\n{}", out.describe()));
    }
    Ok("device listed, port active".into())
}

/// The transports `ucx_info -d` lists on `device` (its "Transport:" lines
/// followed by "Device: DEVICE").
fn ucx_transports(stdout: &str, device: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut transport = None;
    for line in stdout.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(t) = line.strip_prefix("Transport:") {
            transport = Some(t.trim().to_string());
        } else if let Some(d) = line.strip_prefix("Device:") {
            if d.trim() == device {
                out.extend(transport.take());
            }
        }
    }
    out
}

fn check_ucx(t: &Topology, who: Who, entry: Entry) -> Result<String, String> {
    let out = run(t, who, entry, &["ucx_info", "-d"]);
    // (Its listing has "error handling:" lines, so no check of words.)
    if !out.success() {
        return Err(out.describe());
    }
    let device = format!("xroce_{}:1", t.client().iface);
    let transports = ucx_transports(&out.stdout, &device);
    for want in ["rc_verbs", "ud_verbs"] {
        if !transports.iter().any(|t| t == want) {
            return Err(format!(
                "ucx_info -d lists {transports:?} on {device}, not {want}\n{}",
                out.describe()
            ));
        }
    }
    Ok(format!("{device}: {transports:?}"))
}

/// Each device of the drop-in's list, through ctypes: its name, its
/// `dev_name`, the `ibdev` file under its `dev_path`, whether its
/// `ibdev_path` is a directory and `/dev/infiniband/<dev_name>` a
/// character device.
const LIST_DEVICES: &str = r#"
import ctypes, os, stat
lib = ctypes.CDLL("libibverbs.so.1")
lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
n = ctypes.c_int()
devs = lib.ibv_get_device_list(ctypes.byref(n))
for i in range(n.value):
    # struct ibv_device: ops (2 pointers), node_type, transport_type,
    # name[64], dev_name[64], dev_path[256], ibdev_path[256]
    s = lambda off, size: ctypes.string_at(devs[i] + off, size).split(b"\0")[0].decode()
    name, dev_name, dev_path, ibdev_path = s(24, 64), s(88, 64), s(152, 256), s(408, 256)
    ibdev = open(dev_path + "/ibdev").read().strip()
    chr_dev = stat.S_ISCHR(os.stat("/dev/infiniband/" + dev_name).st_mode)
    print(name, dev_name, ibdev, os.path.isdir(ibdev_path), chr_dev)
"#;

/// With two interfaces, named in the other order than sorted and then
/// by default: the uverbsN of the view are the drop-in's `dev_name`s,
/// and each `dev_path`/`ibdev_path` of the drop-in is in the view.
fn check_numbering(t: &Topology, who: Who, second: &str) -> Result<String, String> {
    let node = t.client();
    let mut sorted = [node.iface, second];
    sorted.sort();
    let mut seen = Vec::new();
    for (ifaces, order) in [
        (vec![sorted[1], sorted[0]], [sorted[1], sorted[0]]),
        (vec![], sorted),
    ] {
        let out = Proc::spawn(
            // udp: no XDP program left on the second interface.
            xroce_run_on(
                t,
                &ifaces,
                Backend::Udp,
                who,
                Entry::Nsenter,
                &["python3", "-c", LIST_DEVICES],
            ),
            format!("[{who:?}] devices of --iface {ifaces:?}"),
            &t.dir.0,
        )
        .finish(RUN);
        if !out.success() {
            return Err(out.describe());
        }
        let want: Vec<String> = order
            .iter()
            .enumerate()
            .map(|(i, iface)| format!("xroce_{iface} uverbs{i} xroce_{iface} True True"))
            .collect();
        let got: Vec<&str> = out.stdout.lines().collect();
        if got != want {
            return Err(format!(
                "--iface {ifaces:?}: devices {got:?}, want {want:?}\n{}",
                out.describe()
            ));
        }
        seen.push(got.join(", "));
    }
    Ok(seen.join(" / "))
}

/// hwloc (Open MPI's topology library) lists the device as it lists rxe
/// on a veth, with the GUID and GID 1 of the view.
fn check_hwloc(t: &Topology, who: Who) -> Result<String, String> {
    let node = t.client();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/hwloc_openfabrics.c");
    let bin = t.dir.0.join("hwloc_openfabrics");
    compile_c(&src, &bin, &["-lhwloc"]);
    let bin = bin.display().to_string();
    // The unprivileged user needs to reach it in the test's directory.
    for p in [&t.dir.0, Path::new(&bin)] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", p.display()))?;
    }
    let out = run(
        t,
        who,
        Entry::Nsenter,
        &["env", "HWLOC_VIRTUAL_LINUX_OSDEV=1", &bin],
    );
    if !out.success() {
        return Err(out.describe());
    }
    let facts = {
        let iface = node.iface.to_string();
        in_netns(&node.ns.name, move || DeviceFacts::read(&iface))
    }
    .map_err(|e| format!("read {}: errno {e}", node.iface))?;
    let v4 = node.addr.octets();
    let want = format!(
        "xroce_{} {} 0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        node.iface,
        eui64_groups(facts.mac),
        v4[0],
        v4[1],
        v4[2],
        v4[3]
    );
    if out.stdout.lines().collect::<Vec<_>>() != [want.as_str()] {
        return Err(format!(
            "hwloc lists {:?}, want [{want:?}]\n{}",
            out.stdout,
            out.describe()
        ));
    }
    Ok(want)
}

/// With `--no-device-view` (as with LD_LIBRARY_PATH alone) UCX lists no
/// transport on the device: what the view is for.
fn check_ucx_without_view(t: &Topology) -> Result<String, String> {
    let node = t.client();
    let mut cmd = node.ns.command(workspace_bin("xroce"));
    cmd.args(["run", "--no-device-view", "--iface", node.iface])
        .args(["--backend", "udp", "--", "ucx_info", "-d"]);
    let out = Proc::spawn(cmd, "ucx_info -d without the view".into(), &t.dir.0).finish(RUN);
    if !out.success() {
        return Err(out.describe());
    }
    let device = format!("xroce_{}:1", node.iface);
    let transports = ucx_transports(&out.stdout, &device);
    if !transports.is_empty() || !out.stdout.contains("Memory domain: posix") {
        return Err(format!(
            "without the view ucx_info -d lists {transports:?} on {device}\n{}",
            out.describe()
        ));
    }
    Ok(format!("no transport on {device}"))
}

fn device_view(who: Who) {
    require_root();
    let _turn = serial();
    let backend = match who {
        Who::Root => Backend::AfXdp,
        Who::Nobody => Backend::Udp,
    };
    let t = Topology::direct(backend, 1500);
    // xroce run makes lib/ next to itself on first use, which the
    // unprivileged user may not: a root run first.
    let prep = Proc::spawn(
        xroce_run(&t, Who::Root, Entry::Nsenter, &["true"]),
        "prepare lib/".into(),
        &t.dir.0,
    )
    .finish(RUN);
    assert!(prep.success(), "{}", prep.describe());
    if let Who::Nobody = who {
        reachable_copy(&t.dir.0);
    }
    let mut cases = Cases::new(&format!("device_view_{who:?}"));
    for entry in [Entry::Nsenter, Entry::IpNetnsExec] {
        cases.case(&format!("{entry:?}: files"), || check_view(&t, who, entry));
        cases.case(&format!("{entry:?}: ibv_devinfo"), || {
            check_devinfo(&t, who, entry)
        });
        cases.case(&format!("{entry:?}: ucx_info -d"), || {
            check_ucx(&t, who, entry)
        });
    }
    cases.case("hwloc", || check_hwloc(&t, who));
    if let Who::Root = who {
        cases.case("ucx_info -d without the view", || {
            check_ucx_without_view(&t)
        });
    }
    // A second Ethernet interface with IPv4 in the client's namespace.
    let node = t.client();
    let stem = &node.iface[..node.iface.len() - 1];
    let (second, peer) = (format!("{stem}x"), format!("{stem}y"));
    let addr = format!("10.76.{}.1/24", node.addr.octets()[2]);
    node.ns.exec(&[
        "ip", "link", "add", &second, "type", "veth", "peer", "name", &peer,
    ]);
    node.ns.exec(&["ip", "addr", "add", &addr, "dev", &second]);
    node.ns.exec(&["ip", "link", "set", &second, "up"]);
    cases.case("uverbsN numbering", || check_numbering(&t, who, &second));
    cases.finish();
}

#[test]
fn device_view_as_root() {
    device_view(Who::Root);
}

#[test]
fn device_view_unprivileged() {
    device_view(Who::Nobody);
}

#[test]
fn ucx_transports_are_read_per_device() {
    let text =
        "# Memory domain: xroce_a\n#      Transport: rc_verbs\n#         Device: xroce_a:1\n\
                #      Transport: ud_verbs\n#         Device: xroce_a:1\n\
                # Memory domain: posix\n#      Transport: posix\n#         Device: memory\n";
    assert_eq!(ucx_transports(text, "xroce_a:1"), ["rc_verbs", "ud_verbs"]);
    assert!(ucx_transports(text, "xroce_b:1").is_empty());
}

/// Without root and without user namespaces, `xroce run` stops before
/// PROGRAM and names the sysctl. The limit is set to 0 in a user namespace
/// of the test's own (A), after the unprivileged caller's namespace (B)
/// exists, so the host's limit stays as it is: B's unshare counts against
/// A's limit.
#[test]
fn without_user_namespaces_the_sysctl_is_named() {
    require_root();
    let dir = TempDir::new();
    let xroce = workspace_bin("xroce");
    // lib/ next to xroce, which B's user cannot make.
    let prep = Proc::spawn(
        {
            let mut c = Command::new(&xroce);
            c.args(["run", "--no-device-view", "--backend", "udp", "--", "true"]);
            c
        },
        "prepare lib/".into(),
        &dir.0,
    )
    .finish(RUN);
    assert!(prep.success(), "{}", prep.describe());
    let d = dir.0.display();
    let x = xroce.display();
    let script = format!(
        "mkfifo {d}/ready {d}/go
unshare --user --map-user=65534 --map-group=65534 \
  sh -c 'echo > {d}/ready; read x < {d}/go; exec {x} run --backend udp -- echo PROGRAM-RAN' &
read x < {d}/ready
echo 0 > /proc/sys/user/max_user_namespaces
echo > {d}/go
wait $!
echo status=$?"
    );
    let out = Proc::spawn(
        {
            let mut c = Command::new("unshare");
            c.args(["--user", "--map-root-user", "sh", "-c", &script]);
            c
        },
        "xroce run in a user namespace that may create none".into(),
        &dir.0,
    )
    .finish(RUN);
    let named = out.stderr.contains("user.max_user_namespaces")
        && out.stderr.contains("ENOSPC")
        && out.stderr.contains("--no-device-view");
    assert!(
        out.success()
            && out.stdout.contains("status=1")
            && !out.stdout.contains("PROGRAM-RAN")
            && named,
        "{}",
        out.describe()
    );
}
