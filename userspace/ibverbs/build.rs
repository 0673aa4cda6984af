//! Gives the shared library rdma-core's identity: SONAME libibverbs.so.1
//! and every exported symbol at rdma-core 44's default version
//! (`ibv_get_device_list@@IBVERBS_1.1`), so that programs linked against
//! rdma-core bind to it and `dlvsym(h, name, "IBVERBS_1.1")` finds it.
//!
//! rustc hands the linker its own anonymous version script for a cdylib,
//! which leaves the names listed in ours unversioned; `.symver` directives
//! in the object itself do give them their nodes (seen with rust-lld), so
//! this script turns `exports.txt` into those directives (included by
//! lib.rs) and into the version script that defines the nodes.

use std::{collections::BTreeMap, env, fmt::Write as _, fs, path::PathBuf};

/// rdma-core's version nodes in order; each inherits from the one before.
const NODES: &[&str] = &[
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
];
const PRIVATE_NODE: &str = "IBVERBS_PRIVATE_34";

fn main() {
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=exports.txt");
    let list = fs::read_to_string(dir.join("exports.txt")).expect("exports.txt");
    let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut asm = String::from("core::arch::global_asm!(\n");
    for line in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (name, node) = line.split_once(' ').expect("NAME NODE");
        assert!(
            NODES.contains(&node) || node == PRIVATE_NODE,
            "exports.txt: unknown version node {node}"
        );
        by_node.entry(node).or_default().push(name);
        writeln!(asm, "    \".symver {name}, {name}@@{node}\",").unwrap();
    }
    asm.push_str(");\n");
    fs::write(out.join("symver.rs"), asm).unwrap();

    // Nodes hold no names themselves (the .symver directives place them);
    // the chain of inheritance is rdma-core's.
    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for node in NODES {
        match prev {
            None => writeln!(map, "{node} {{ }};").unwrap(),
            Some(p) => writeln!(map, "{node} {{ }} {p};").unwrap(),
        }
        prev = Some(node);
    }
    writeln!(map, "{PRIVATE_NODE} {{ }};").unwrap();
    let map_path = out.join("libibverbs.map");
    fs::write(&map_path, map).unwrap();
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map_path.display()
    );
}
