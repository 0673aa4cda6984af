//! Gives a Rust cdylib the identity of an rdma-core library: its SONAME and
//! every exported symbol at the library's default version
//! (`ibv_get_device_list@@IBVERBS_1.1`, `rdma_create_id@@RDMACM_1.0`), so
//! that programs linked against rdma-core bind to it and `dlvsym` finds
//! each name at its node.
//!
//! rustc hands the linker its own anonymous version script for a cdylib,
//! which leaves the names listed in ours unversioned; `.symver` directives
//! in the object itself do give them their nodes (seen with rust-lld). So a
//! build script calls [`Library::generate`], which turns the crate's
//! exports list into those directives (`$OUT_DIR/symver.rs`, to be
//! `include!`d by lib.rs) and into the version script that defines the
//! nodes. The `.symver` directives must sit in the same object as the
//! functions: the crate needs `codegen-units = 1` and no incremental build
//! (see the workspace's profile settings).

use std::{collections::BTreeSet, env, fmt::Write as _, fs, path::PathBuf};

/// One drop-in library's identity.
pub struct Library<'a> {
    /// `libibverbs.so.1`.
    pub soname: &'a str,
    /// The exports list beside Cargo.toml: one `NAME NODE` a line, `#`
    /// comments and blank lines ignored.
    pub exports: &'a str,
    /// The public version nodes in order; each inherits from the one
    /// before, as in rdma-core's version scripts.
    pub nodes: &'a [&'a str],
    /// Nodes that inherit from none (rdma-core's `*_PRIVATE_*`).
    pub standalone_nodes: &'a [&'a str],
}

impl Library<'_> {
    /// Writes `$OUT_DIR/symver.rs` and the version script, and tells cargo
    /// to link the cdylib with the SONAME and that script. Panics (failing
    /// the build) on a malformed list or an unknown node.
    pub fn generate(&self) {
        let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
        let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
        println!("cargo:rerun-if-changed={}", self.exports);
        let list = fs::read_to_string(dir.join(self.exports))
            .unwrap_or_else(|e| panic!("{}: {e}", self.exports));
        fs::write(out.join("symver.rs"), self.symver_directives(&list)).unwrap();

        let map_path = out.join(format!("{}.map", self.soname));
        fs::write(&map_path, self.version_script()).unwrap();
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{}", self.soname);
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
            map_path.display()
        );
    }

    /// `core::arch::global_asm!` with one `.symver NAME, NAME@@NODE` per
    /// listed export.
    fn symver_directives(&self, list: &str) -> String {
        let mut seen = BTreeSet::new();
        let mut asm = String::from("core::arch::global_asm!(\n");
        for line in list
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (name, node) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("{}: {line:?} is not `NAME NODE`", self.exports));
            let node = node.trim();
            assert!(
                self.nodes.contains(&node) || self.standalone_nodes.contains(&node),
                "{}: unknown version node {node}",
                self.exports
            );
            assert!(seen.insert(name), "{}: {name} listed twice", self.exports);
            writeln!(asm, "    \".symver {name}, {name}@@{node}\",").unwrap();
        }
        asm.push_str(");\n");
        asm
    }

    /// The nodes, holding no names themselves (the `.symver` directives
    /// place them), chained as rdma-core chains them.
    fn version_script(&self) -> String {
        let mut map = String::new();
        let mut prev: Option<&str> = None;
        for node in self.nodes {
            match prev {
                None => writeln!(map, "{node} {{ }};").unwrap(),
                Some(p) => writeln!(map, "{node} {{ }} {p};").unwrap(),
            }
            prev = Some(node);
        }
        for node in self.standalone_nodes {
            writeln!(map, "{node} {{ }};").unwrap();
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: Library = Library {
        soname: "libx.so.1",
        exports: "exports.txt",
        nodes: &["X_1.0", "X_1.1"],
        standalone_nodes: &["X_PRIVATE_1"],
    };

    #[test]
    fn directives_name_each_export_at_its_node() {
        let asm = LIB.symver_directives("# comment\n\nf X_1.0\ng X_PRIVATE_1\n");
        assert_eq!(
            asm,
            "core::arch::global_asm!(\n    \".symver f, f@@X_1.0\",\n    \
             \".symver g, g@@X_PRIVATE_1\",\n);\n"
        );
    }

    #[test]
    fn nodes_chain_and_private_nodes_stand_alone() {
        assert_eq!(
            LIB.version_script(),
            "X_1.0 { };\nX_1.1 { } X_1.0;\nX_PRIVATE_1 { };\n"
        );
    }

    #[test]
    #[should_panic(expected = "unknown version node X_2.0")]
    fn an_unknown_node_fails_the_build() {
        LIB.symver_directives("f X_2.0\n");
    }

    #[test]
    #[should_panic(expected = "f listed twice")]
    fn a_name_listed_twice_fails_the_build() {
        LIB.symver_directives("f X_1.0\nf X_1.1\n");
    }
}
