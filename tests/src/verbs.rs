//! Helpers for the tests of xroce's drop-in `libibverbs.so.1` (crate
//! `xroce-ibverbs`): building it with the tests' own cargo profile, reading
//! a shared library's dynamic symbols and SONAME with `objdump`, and running
//! programs under `xroce run`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::{workspace_bin, Netns};

/// The header the library's types (`userspace/cabi/src/verbs.rs`) mirror.
pub const VERBS_H: &str = "/usr/include/infiniband/verbs.h";
/// Debian's own libibverbs (rdma-core 44), the ABI to match.
pub const DEBIAN_LIBIBVERBS: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";
/// The programs that must run over the library unmodified.
pub const PROGRAMS: &[&str] = &[
    "ibv_devices",
    "ibv_devinfo",
    "ibv_rc_pingpong",
    "ibv_ud_pingpong",
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    "ib_atomic_bw",
    "ib_write_lat",
    "ib_read_lat",
    "ib_send_lat",
];

/// The workspace root (the tests crate is one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// Fails (never skips) unless rdma-core's header is installed.
pub fn require_verbs_header() {
    assert!(
        Path::new(VERBS_H).exists(),
        "{VERBS_H} is missing: install libibverbs-dev (cargo xtask setup does)"
    );
}

/// Fails unless Debian's libibverbs and its programs are installed.
pub fn require_debian_verbs() {
    assert!(
        Path::new(DEBIAN_LIBIBVERBS).exists(),
        "{DEBIAN_LIBIBVERBS} is missing: install ibverbs-utils and perftest \
         (`apt-get install ibverbs-utils perftest`; cargo xtask setup does)"
    );
    for program in PROGRAMS {
        assert!(
            which(program).is_some(),
            "{program} is missing: install ibverbs-utils and perftest \
             (`apt-get install ibverbs-utils perftest`; cargo xtask setup does)"
        );
    }
}

/// `program` on $PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// `(profile dir, cargo's profile arguments)` of this test binary, which
/// runs from `<target>/<profile>/deps/`.
fn build_location() -> (PathBuf, Vec<String>) {
    let mut dir = std::env::current_exe().expect("current_exe");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let profile = dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("profile directory")
        .to_string();
    let args = match profile.as_str() {
        "debug" => vec![],
        "release" => vec!["--release".to_string()],
        other => vec!["--profile".to_string(), other.to_string()],
    };
    (dir, args)
}

/// `cargo build ARGS` into this test's target directory and profile, so
/// what the test uses is never stale. Err holds cargo's complaint.
fn cargo_build(args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let (dir, profile) = build_location();
    let target = dir.parent().expect("target directory");
    let out = Command::new(&cargo)
        .arg("build")
        .args(args)
        .args(&profile)
        .arg("--target-dir")
        .arg(target)
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("cannot run {cargo:?}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The errors and where they are; the rest repeats them.
    let lines: Vec<&str> = stderr.lines().collect();
    let mut errors = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        // The linker's own complaint sits in a `= note:` under the error.
        if line.starts_with("error") || line.contains("lld: error") {
            errors.push(*line);
            if let Some(at) = lines
                .get(i + 1)
                .filter(|l| l.trim_start().starts_with("-->"))
            {
                errors.push(at);
            }
        }
    }
    errors.truncate(60);
    Err(format!(
        "`cargo build {}` failed ({}):\n{}",
        args.join(" "),
        out.status,
        if errors.is_empty() {
            stderr.to_string()
        } else {
            errors.join("\n")
        }
    ))
}

/// xroce's `libibverbs.so.1` (target/<profile>/libxroce_ibverbs.so), built
/// once per test process with `cargo build -p xroce-ibverbs`:
/// `cargo xtask test` builds only binaries before the tests.
pub fn ibverbs_cdylib() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            cargo_build(&["-p", "xroce-ibverbs"])?;
            let lib = build_location().0.join("libxroce_ibverbs.so");
            if lib.exists() {
                Ok(lib)
            } else {
                Err(format!(
                    "cargo built xroce-ibverbs but {} is missing",
                    lib.display()
                ))
            }
        })
        .clone()
        .unwrap_or_else(|e| {
            panic!(
                "xroce's libibverbs.so.1 (crate xroce-ibverbs) does not build: {e}\n\
                 (\"default version symbol X must be defined\" means exports.txt lists X \
                 but no code defines it yet)"
            )
        })
}

/// xroce's `librdmacm.so.1` (target/<profile>/libxroce_rdmacm.so), built
/// once per test process with `cargo build -p xroce-rdmacm`.
pub fn rdmacm_cdylib() -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) = BUILT.get_or_init(|| cargo_build(&["-p", "xroce-rdmacm"])) {
        panic!("xroce's librdmacm.so.1 (crate xroce-rdmacm) does not build: {e}");
    }
    build_location().0.join("libxroce_rdmacm.so")
}

/// The `xroce` executable, built once per test process (`xroce run` is
/// what is under test, so a stale binary would not do).
pub fn xroce_exe() -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) = BUILT.get_or_init(|| cargo_build(&["-p", "xroce-cli", "--bin", "xroce"])) {
        panic!("the xroce command does not build: {e}");
    }
    workspace_bin("xroce")
}

/// `xroce run ARGS...` (in `ns` if given): the caller adds `-- PROGRAM`.
/// XROCE_* variables of the test's own environment are removed so that
/// only the arguments decide.
pub fn xroce_run(ns: Option<&Netns>, args: &[&str]) -> Command {
    let xroce = xroce_exe();
    let mut cmd = match ns {
        Some(ns) => ns.command(&xroce),
        None => Command::new(&xroce),
    };
    cmd.arg("run").args(args);
    for var in [
        "XROCE_LIB_DIR",
        "XROCE_IFACES",
        "XROCE_BACKEND",
        "XROCE_CC",
        "LD_PRELOAD",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Builds the C probe `tests/c/NAME.c` (with -libverbs) and runs it once
/// under `xroce run --backend udp` on one end of a fresh veth pair, with
/// `args` and, when `with_device` is set, the device's name as its first
/// argument; what it printed and its status.
pub fn run_verbs_probe(name: &str, with_device: bool, args: &[&str]) -> std::process::Output {
    run_verbs_probe_with_env(name, with_device, args, &[])
}

/// [`run_verbs_probe`] with `env` set for the program.
pub fn run_verbs_probe_with_env(
    name: &str,
    with_device: bool,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    require_verbs_header();
    let _ = ibverbs_cdylib();
    let dir = Scratch::new(name);
    let exe = dir.0.join(name);
    compile_c(
        &workspace_root().join(format!("tests/c/{name}.c")),
        &exe,
        &["-libverbs"],
    );
    let pair = crate::VethPair::new(1500);
    let mut cmd = xroce_run(
        Some(&pair.a),
        &["--backend", "udp", "--iface", &pair.if_a, "--"],
    );
    cmd.arg(&exe);
    if with_device {
        cmd.arg(format!("xroce_{}", pair.if_a));
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run {name} under xroce run: {e}"))
}

/// One entry of a shared library's dynamic symbol table (`objdump -T`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DynSym {
    pub name: String,
    /// Version node, `Base` when unversioned.
    pub version: String,
    /// The default version (`name@@node`), not a hidden one (`name@node`).
    pub default: bool,
    /// Defined here (not `*UND*`).
    pub defined: bool,
    /// The node's own definition symbol (`*ABS*` with name == node).
    pub node_definition: bool,
}

/// The dynamic symbols of `lib`, read with `objdump -T`.
pub fn dynamic_symbols(lib: &Path) -> Vec<DynSym> {
    let out = crate::run(Command::new("objdump").arg("-T").arg(lib));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut syms = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with("DYNAMIC SYMBOL TABLE") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        // ADDR FLAGS SECTION SIZE [VERSION|(VERSION)] NAME; FLAGS may hold
        // spaces, so read from the right.
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 5 {
            continue;
        }
        let n = fields.len();
        let name = fields[n - 1];
        // An unversioned reference (`w D *UND* SIZE NAME`, such as
        // __gmon_start__) has no version column: SIZE comes before NAME.
        let unversioned =
            fields[n - 2].len() == 16 && fields[n - 2].bytes().all(|b| b.is_ascii_hexdigit());
        let (raw_version, section) = if unversioned {
            ("Base", fields[n - 3])
        } else {
            (fields[n - 2], fields[n - 4])
        };
        let default = !raw_version.starts_with('(');
        let version = raw_version.trim_start_matches('(').trim_end_matches(')');
        syms.push(DynSym {
            name: name.to_string(),
            version: version.to_string(),
            default,
            defined: section != "*UND*",
            node_definition: section == "*ABS*" && name == version,
        });
    }
    syms
}

/// `(name, node)` of every symbol `lib` defines at its default version in
/// a version node (not Base).
pub fn default_versioned_exports(lib: &Path) -> BTreeSet<(String, String)> {
    dynamic_symbols(lib)
        .into_iter()
        .filter(|s| s.defined && s.default && !s.node_definition && s.version != "Base")
        .map(|s| (s.name, s.version))
        .collect()
}

/// The SONAME of `lib` (`objdump -p`).
pub fn soname(lib: &Path) -> Option<String> {
    let out = crate::run(Command::new("objdump").arg("-p").arg(lib));
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some("SONAME")).then(|| f.next().unwrap_or("").to_string())
    })
}

/// `userspace/ibverbs/exports.txt`: `(name, node)` of every symbol the
/// library must export at its default version.
pub fn exports_list() -> Vec<(String, String)> {
    let path = workspace_root().join("userspace/ibverbs/exports.txt");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, node) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("exports.txt: {l:?} is not `NAME NODE`"));
            (name.to_string(), node.trim().to_string())
        })
        .collect()
}

/// What a layout test's C program printed (`key<TAB>value` lines: a
/// struct's size and alignment, a field's offset and size) against what
/// Rust sees for the same keys: one line per key that differs, is missing
/// on one side, or was printed by C only.
pub fn layout_mismatches(c_stdout: &[u8], rust: &BTreeMap<String, String>) -> Vec<String> {
    let c: BTreeMap<String, String> = String::from_utf8_lossy(c_stdout)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut mismatches = Vec::new();
    for (key, r) in rust {
        match c.get(key) {
            Some(v) if v == r => {}
            Some(v) => mismatches.push(format!("{key}: C {v}, Rust {r}")),
            None => mismatches.push(format!("{key}: missing from the C program's output")),
        }
    }
    for key in c.keys().filter(|k| !rust.contains_key(*k)) {
        mismatches.push(format!("{key}: printed by C only"));
    }
    mismatches
}

/// What the dynamic loader prints when a program cannot start on a library.
const LOADER_FAILURES: &[&str] = &[
    "symbol lookup error",
    "undefined symbol",
    "version `",
    "cannot open shared object",
    "error while loading shared libraries",
];

/// `loader: <line>` for the first of `stderr_lines` that shows each way the
/// dynamic loader fails to start a program on a library; empty when none.
pub fn loader_failures<'a>(stderr_lines: impl IntoIterator<Item = &'a str> + Clone) -> Vec<String> {
    LOADER_FAILURES
        .iter()
        .filter_map(|failure| {
            let line = stderr_lines
                .clone()
                .into_iter()
                .find(|l| l.contains(failure))?;
            Some(format!("loader: {}", line.trim()))
        })
        .collect()
}

/// A scratch directory of this test process, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `$TMPDIR/xroce-WHAT-PID`, made empty.
    pub fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("xroce-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `cc -std=gnu11 -Wall -Werror -o OUT SRC ARGS...`, failing with the
/// compiler's complaint.
pub fn compile_c(src: &Path, out: &Path, args: &[&str]) {
    let compiled = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(out)
        .arg(src)
        .args(args)
        .output()
        .expect("run cc (install gcc: cargo xtask setup does)");
    assert!(
        compiled.status.success(),
        "cc rejected {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&compiled.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_failures_name_the_first_line_of_each_kind() {
        let stderr = "usage: prog\n  rping: symbol lookup error: x: undefined symbol: rdma_y\n\
                      rping: symbol lookup error: again\n";
        assert_eq!(
            loader_failures(stderr.lines()),
            [
                "loader: rping: symbol lookup error: x: undefined symbol: rdma_y",
                "loader: rping: symbol lookup error: x: undefined symbol: rdma_y",
            ]
        );
        assert!(loader_failures("usage: prog [-s]".lines()).is_empty());
    }

    #[test]
    fn layout_mismatches_name_every_difference() {
        let rust: BTreeMap<String, String> =
            [("s", "size 8"), ("s.a", "offset 0"), ("s.b", "offset 4")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into();
        let c = b"s\tsize 8\ns.a\toffset 0\ns.b\toffset 2\ns.c\toffset 6\n";
        assert_eq!(
            layout_mismatches(c, &rust),
            ["s.b: C offset 2, Rust offset 4", "s.c: printed by C only"]
        );
        let rust_only = layout_mismatches(b"s\tsize 8\ns.a\toffset 0\n", &rust);
        assert_eq!(rust_only, ["s.b: missing from the C program's output"]);
    }
}
