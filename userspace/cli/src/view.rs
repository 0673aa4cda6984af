//! The private device view of `xroce run`: the program (and every child it
//! starts) finds its xroce devices where UCX, hwloc, pyverbs'
//! tests and rdma-core look for rxe's, while nothing on the host changes.
//!
//! What the program sees, laid out as the kernel lays out a device
//! without a parent (rxe on a veth):
//! - `/sys/class/infiniband/xroce_IF`, a link to
//!   `/sys/devices/virtual/infiniband/xroce_IF/` with the files of
//!   [`xroce::device::sysfs::DeviceFacts::files`] (node_type, GUIDs,
//!   ports/1/{state,phys_state,link_layer,rate,lid,...}, gids/0..1023,
//!   gid_attrs/{types,ndevs}/N of the populated GIDs, pkeys/0), and
//!   `device/` with `net/IF` (a link to the interface's sysfs directory when
//!   this /sys shows the interface's network namespace, else an empty
//!   directory of that name), `numa_node` and `local_cpus` (the
//!   interface's parent device's, else -1 and every CPU: a virtual device
//!   has no locality);
//! - `/sys/class/infiniband_verbs/abi_version`, and `uverbsN` linked to
//!   `/sys/devices/virtual/infiniband_verbs/uverbsN/{ibdev,abi_version,
//!   dev,device}`, N the device's index in the drop-in's device list (its
//!   `dev_name`);
//! - `/dev/infiniband/uverbsN` and `/dev/infiniband/rdma_cm`: bind mounts
//!   of `/dev/null`, character devices that stat and open read-write
//!   (the drop-in never uses them; UCX checks that they are there).
//!
//! So UCX finds the device as it finds rxe, and hwloc lists it where it
//! lists rxe on a veth (with `HWLOC_VIRTUAL_LINUX_OSDEV=1`: it skips
//! virtual devices by default).
//!
//! How, in this process before it exec's the program:
//! 1. a new mount namespace (`unshare(CLONE_NEWNS)`); without root, in a
//!    new user namespace too (`CLONE_NEWUSER`) that maps the caller's own
//!    uid and gid to themselves (setgroups "deny" first, as the kernel
//!    requires), so the program keeps its identity and the capabilities of
//!    that namespace end at exec;
//! 2. `/` made recursively private, so nothing below propagates out;
//! 3. `/sys/devices/virtual` and `/sys/class` each overmounted by a tmpfs
//!    in which every original entry is bind-mounted back (from an O_PATH
//!    descriptor of the original, opened before the overmount), beside the
//!    new infiniband and infiniband_verbs directories; relative links such
//!    as `/sys/class/net/eth0 -> ../../devices/...` still resolve, since
//!    `..` of a bind mount's root leaves through its mount point;
//! 4. `/dev/infiniband`: a tmpfs mounted on it if it exists; else a new
//!    `/dev`: a tmpfs, built aside and moved onto `/dev`, into which every
//!    original entry comes back (directories and device nodes
//!    bind-mounted, symlinks recreated), with the whole original `/dev`
//!    also bound at `/dev/.xroce-host-dev` for `/dev/ptmx`, which becomes a
//!    symlink there: the kernel finds a pseudo-terminal's devpts through
//!    the directory of the ptmx it opened, which a bind mount of the ptmx
//!    node alone does not have (its open fails with ENOENT). Pseudo-
//!    terminals then show as `/dev/.xroce-host-dev/pts/N` to ttyname(3);
//! 5. the two sysfs tmpfs made read-only, like sysfs.
//!
//! The namespace lives as long as the program and its children, and
//! nothing of it exists outside them: no file under /run or /tmp, no mount
//! left behind. It works under `ip netns exec` (which gives the program a
//! /sys of its own) and `nsenter --net` alike. The content is a snapshot
//! taken before exec; the drop-in's `ibv_read_sysfs_file` still answers
//! from the live interface. Devices or classes that appear in /dev or
//! /sys/class later are not in the view.

use std::{
    ffi::OsString,
    fs,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::{symlink, PermissionsExt},
    },
    path::{Path, PathBuf},
};

use anyhow::{anyhow, Context};
use nix::{
    errno::Errno,
    fcntl::{open, OFlag},
    mount::{mount, MsFlags},
    sched::{unshare, CloneFlags},
    sys::stat::Mode,
    unistd::{getegid, geteuid},
};
use xroce::device::sysfs::{self, DeviceFacts};

/// Where the original /dev stays reachable when /dev is overmounted.
const HOST_DEV: &str = ".xroce-host-dev";

/// One device of the view: its facts and where its interface is in sysfs.
struct ViewDevice {
    facts: DeviceFacts,
    /// `/sys/devices/.../net/IF` if this /sys shows the interface.
    net_dir: Option<PathBuf>,
    numa_node: String,
    local_cpus: String,
}

/// Gives this process (and so the program it exec's) the private view of
/// the devices of `ifaces`, in this order (uverbs0 first).
pub fn enter(ifaces: &[String]) -> anyhow::Result<()> {
    let devices = ifaces
        .iter()
        .map(|iface| view_device(iface))
        .collect::<anyhow::Result<Vec<_>>>()?;
    enter_namespaces()?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| anyhow!("make / private in the new mount namespace: {e}"))?;
    sys_class_view(&devices)?;
    dev_view(devices.len())?;
    // Read-only like sysfs, once /dev no longer needs a place to build.
    for dir in [CLASS, VIRTUAL] {
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | SYSFS_FLAGS,
            None::<&str>,
        )
        .map_err(|e| anyhow!("make the tmpfs on {dir} read-only: {e}"))?;
    }
    Ok(())
}

fn view_device(iface: &str) -> anyhow::Result<ViewDevice> {
    let facts = DeviceFacts::read(iface).map_err(|e| {
        anyhow!(
            "read interface {iface}: {}",
            std::io::Error::from_raw_os_error(e)
        )
    })?;
    let class_dir = Path::new("/sys/class/net").join(iface);
    // This /sys may show another network namespace (nsenter --net): the
    // directory is the interface's only if its index and MAC match.
    let read = |f: &str| fs::read_to_string(class_dir.join(f)).map(|s| s.trim().to_string());
    let ifindex = nix::net::if_::if_nametoindex(iface).ok();
    let mac = facts
        .mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let ours = read("ifindex").ok().and_then(|s| s.parse::<u32>().ok()) == ifindex
        && read("address").ok().as_deref() == Some(mac.as_str());
    let net_dir = ours.then(|| fs::canonicalize(&class_dir).ok()).flatten();
    let parent = |f: &str| {
        ours.then(|| read(&format!("device/{f}")).ok())
            .flatten()
            .filter(|s| !s.is_empty())
    };
    Ok(ViewDevice {
        numa_node: parent("numa_node").unwrap_or_else(|| "-1".into()),
        local_cpus: parent("local_cpus")
            .unwrap_or_else(|| sysfs::all_cpus_mask(sysfs::possible_cpus())),
        facts,
        net_dir,
    })
}

fn is_root() -> bool {
    geteuid().is_root()
}

/// A new mount namespace; without root, inside a new user namespace that
/// maps the caller's uid and gid to themselves.
fn enter_namespaces() -> anyhow::Result<()> {
    if is_root() {
        return unshare(CloneFlags::CLONE_NEWNS).map_err(|e| {
            anyhow!(
                "cannot create a mount namespace for the device view (unshare: {e}): \
                 is CAP_SYS_ADMIN missing (a container)? --no-device-view runs without it"
            )
        });
    }
    let (uid, gid) = (geteuid(), getegid());
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
        .map_err(|e| anyhow!("{}", userns_unavailable(e, &read_sysctls())))?;
    let write = |file: &str, content: String| {
        fs::write(file, &content).with_context(|| format!("write {content:?} to {file}"))
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))?;
    Ok(())
}

/// The sysctls that govern unprivileged user namespaces, those this kernel
/// has: (name, value).
fn read_sysctls() -> Vec<(&'static str, String)> {
    [
        "kernel.unprivileged_userns_clone",
        "user.max_user_namespaces",
        "kernel.apparmor_restrict_unprivileged_userns",
    ]
    .into_iter()
    .filter_map(|name| {
        let path = format!("/proc/sys/{}", name.replace('.', "/"));
        let value = fs::read_to_string(path).ok()?;
        Some((name, value.trim().to_string()))
    })
    .collect()
}

/// Why `unshare(CLONE_NEWUSER)` failed, naming the sysctl that forbids it.
fn userns_unavailable(e: Errno, sysctls: &[(&str, String)]) -> String {
    let value = |name: &str| {
        sysctls
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    };
    let cause = if value("kernel.unprivileged_userns_clone") == Some("0") {
        "unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone=0; \
         `sysctl -w kernel.unprivileged_userns_clone=1` enables them)"
            .to_string()
    } else if value("user.max_user_namespaces") == Some("0") || e == Errno::ENOSPC {
        format!(
            "the limit on user namespaces is reached (sysctl user.max_user_namespaces={} here, \
             or a lower one in an enclosing user namespace; `sysctl -w \
             user.max_user_namespaces=15000` raises it)",
            value("user.max_user_namespaces").unwrap_or("?")
        )
    } else if value("kernel.apparmor_restrict_unprivileged_userns") == Some("1") {
        "AppArmor restricts unprivileged user namespaces (sysctl \
         kernel.apparmor_restrict_unprivileged_userns=1)"
            .to_string()
    } else {
        "unprivileged user namespaces are unavailable here (sysctls \
         kernel.unprivileged_userns_clone and user.max_user_namespaces allow them, so a \
         seccomp filter of a container may forbid unshare)"
            .to_string()
    };
    format!(
        "cannot create the user namespace the device view needs without root \
         (unshare(CLONE_NEWUSER): {e}): {cause}; or run as root"
    )
}

/// Bind-mounts `src` (with everything mounted below it) on `target`.
fn bind(src: &Path, target: &Path) -> anyhow::Result<()> {
    mount(
        Some(src),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| anyhow!("bind {} on {}: {e}", src.display(), target.display()))
}

fn mount_tmpfs(target: impl AsRef<Path>, flags: MsFlags) -> anyhow::Result<()> {
    let target = target.as_ref();
    mount(
        Some("xroce-view"),
        target,
        Some("tmpfs"),
        flags,
        Some("mode=755"),
    )
    .map_err(|e| anyhow!("mount a tmpfs on {}: {e}", target.display()))
}

/// An O_PATH descriptor of a directory, and the /proc path that reaches
/// its entries after the directory is overmounted.
fn open_path(dir: &str) -> anyhow::Result<(OwnedFd, PathBuf)> {
    let fd = open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| anyhow!("open {dir}: {e}"))?;
    let via = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    Ok((fd, via))
}

fn names_in(dir: &str) -> anyhow::Result<Vec<OsString>> {
    let mut names = fs::read_dir(dir)
        .with_context(|| format!("list {dir}"))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("list {dir}"))?;
    names.sort();
    Ok(names)
}

/// Writes a read-only file (sysfs files are r--r--r--), making its
/// directory first if it is not there.
fn write_file(path: &Path, content: &str) -> anyhow::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let create = || {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(path)
    };
    let mut file = match create() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            }
            create()
        }
        other => other,
    }
    .with_context(|| format!("create {}", path.display()))?;
    file.write_all(content.as_bytes())
        .with_context(|| format!("write {}", path.display()))
}

const CLASS: &str = "/sys/class";
/// Where sysfs keeps devices without a parent (rxe's on a veth).
const VIRTUAL: &str = "/sys/devices/virtual";
/// The classes the view replaces.
const IB_CLASSES: [&str; 2] = ["infiniband", "infiniband_verbs"];
/// sysfs's own mount flags.
const SYSFS_FLAGS: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// Overmounts the sysfs directory `dir` by a tmpfs holding every original
/// entry but those named in `skip`.
fn overmount_sysfs_dir(dir: &str, skip: &[&str]) -> anyhow::Result<()> {
    let names: Vec<OsString> = names_in(dir)?
        .into_iter()
        .filter(|n| !skip.iter().any(|s| n == s))
        .collect();
    let (_fd, original) = open_path(dir)?;
    mount_tmpfs(dir, SYSFS_FLAGS)?;
    for name in &names {
        bring_back(&original.join(name), &Path::new(dir).join(name))?;
    }
    Ok(())
}

/// The devices as the kernel lays out a parentless (virtual) RDMA device
/// such as rxe on a veth: the directories under
/// /sys/devices/virtual/{infiniband,infiniband_verbs}, linked from
/// /sys/class/{infiniband,infiniband_verbs}.
fn sys_class_view(devices: &[ViewDevice]) -> anyhow::Result<()> {
    overmount_sysfs_dir(VIRTUAL, &IB_CLASSES)?;
    overmount_sysfs_dir(CLASS, &IB_CLASSES)?;
    let (virt, class) = (Path::new(VIRTUAL), Path::new(CLASS));
    for dir in [virt, class] {
        for name in IB_CLASSES {
            let d = dir.join(name);
            fs::create_dir(&d).with_context(|| format!("create {}", d.display()))?;
        }
    }
    write_file(
        &class.join("infiniband_verbs/abi_version"),
        &format!("{}\n", sysfs::UVERBS_ABI_VERSION),
    )?;
    for (index, d) in devices.iter().enumerate() {
        let ibdev = sysfs::device_name(&d.facts.iface);
        let dir = virt.join("infiniband").join(&ibdev);
        for (rel, content) in d.facts.files() {
            write_file(&dir.join(rel), &content)?;
        }
        let device = dir.join("device");
        write_file(&device.join("numa_node"), &format!("{}\n", d.numa_node))?;
        write_file(&device.join("local_cpus"), &format!("{}\n", d.local_cpus))?;
        let net = device.join("net");
        fs::create_dir_all(&net).with_context(|| format!("create {}", net.display()))?;
        let link = net.join(&d.facts.iface);
        match &d.net_dir {
            Some(target) => symlink(target, &link),
            None => fs::create_dir(&link),
        }
        .with_context(|| format!("create {}", link.display()))?;

        let uverbs_name = sysfs::uverbs_name(index);
        let uverbs = virt.join("infiniband_verbs").join(&uverbs_name);
        for f in ["ibdev", "abi_version", "dev"] {
            let content = sysfs::uverbs_file(&ibdev, index, &[f])
                .map_err(|e| anyhow!("uverbs file {f}: errno {e}"))?;
            write_file(&uverbs.join(f), &content)?;
        }
        // The kernel's uverbs device shares the IB device's parent.
        symlink(
            Path::new("../../infiniband").join(&ibdev).join("device"),
            uverbs.join("device"),
        )
        .with_context(|| format!("link {}/device", uverbs.display()))?;

        for (class_name, name) in [("infiniband", &ibdev), ("infiniband_verbs", &uverbs_name)] {
            let link = class.join(class_name).join(name);
            let target = Path::new("../../devices/virtual")
                .join(class_name)
                .join(name);
            symlink(&target, &link).with_context(|| format!("link {}", link.display()))?;
        }
    }
    Ok(())
}

/// Makes `/dev/infiniband` hold `uverbs0..uverbs{n-1}` and `rdma_cm`.
fn dev_view(n: usize) -> anyhow::Result<()> {
    let ib_dir = Path::new("/dev/infiniband");
    if ib_dir.is_dir() {
        // A host with RDMA devices: ours replace its nodes.
        mount_tmpfs("/dev/infiniband", MsFlags::MS_NOSUID)?;
        populate_infiniband(ib_dir, Path::new("/dev/null"), n)
    } else {
        let null = overmount_dev()?;
        populate_infiniband(ib_dir, &null, n)
    }
}

fn populate_infiniband(dir: &Path, null: &Path, n: usize) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    let names = (0..n)
        .map(sysfs::uverbs_name)
        .chain(["rdma_cm".to_string()]);
    for name in names {
        let node = dir.join(name);
        fs::File::create(&node).with_context(|| format!("create {}", node.display()))?;
        bind(null, &node)?;
    }
    Ok(())
}

/// Makes `target` (not there yet) what `original` is: a directory or a
/// file of any kind bind-mounted from it, a symlink with the same target.
/// An original that is gone meanwhile is skipped.
fn bring_back(original: &Path, target: &Path) -> anyhow::Result<()> {
    let Ok(meta) = fs::symlink_metadata(original) else {
        return Ok(());
    };
    let ft = meta.file_type();
    if ft.is_symlink() {
        let to = fs::read_link(original).with_context(|| format!("read {}", original.display()))?;
        return symlink(&to, target).with_context(|| format!("link {}", target.display()));
    }
    if ft.is_dir() {
        fs::create_dir(target)
    } else {
        fs::File::create(target).map(drop)
    }
    .with_context(|| format!("create {}", target.display()))?;
    bind(original, target)
}

/// Overmounts /dev with a tmpfs holding every original entry; returns the
/// path of the original /dev/null in it.
///
/// The new /dev is built aside (in the /sys/class tmpfs, which is still
/// writable) and then moved onto /dev: a recursive bind of the original
/// /dev taken after the overmount would hold the overmount itself.
fn overmount_dev() -> anyhow::Result<PathBuf> {
    let dev = Path::new("/dev");
    let stage = Path::new(CLASS).join(".xroce-dev-stage");
    fs::create_dir(&stage).with_context(|| format!("create {}", stage.display()))?;
    mount_tmpfs(&stage, MsFlags::MS_NOSUID)?;
    let host = stage.join(HOST_DEV);
    fs::create_dir(&host).with_context(|| format!("create {}", host.display()))?;
    bind(dev, &host)?;
    for name in names_in("/dev")? {
        let target = stage.join(&name);
        if name == "ptmx" {
            // Through the whole original /dev: see the module doc.
            symlink(Path::new(HOST_DEV).join("ptmx"), &target).context("link /dev/ptmx")?;
        } else {
            bring_back(&dev.join(&name), &target)?;
        }
    }
    mount(
        Some(&stage),
        dev,
        None::<&str>,
        MsFlags::MS_MOVE,
        None::<&str>,
    )
    .map_err(|e| anyhow!("move the new /dev from {} onto /dev: {e}", stage.display()))?;
    fs::remove_dir(&stage).with_context(|| format!("remove {}", stage.display()))?;
    Ok(dev.join(HOST_DEV).join("null"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_userns_error_names_the_sysctl() {
        let s = |pairs: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
            pairs.iter().map(|(n, v)| (*n, v.to_string())).collect()
        };
        let m = userns_unavailable(
            Errno::EPERM,
            &s(&[
                ("kernel.unprivileged_userns_clone", "0"),
                ("user.max_user_namespaces", "100"),
            ]),
        );
        assert!(m.contains("kernel.unprivileged_userns_clone=0"), "{m}");
        let m = userns_unavailable(Errno::ENOSPC, &s(&[("user.max_user_namespaces", "0")]));
        assert!(m.contains("user.max_user_namespaces=0"), "{m}");
        let m = userns_unavailable(
            Errno::EPERM,
            &s(&[
                ("user.max_user_namespaces", "100"),
                ("kernel.apparmor_restrict_unprivileged_userns", "1"),
            ]),
        );
        assert!(m.contains("apparmor_restrict_unprivileged_userns=1"), "{m}");
        let m = userns_unavailable(Errno::EPERM, &s(&[("user.max_user_namespaces", "100")]));
        assert!(m.contains("seccomp"), "{m}");
    }
}
