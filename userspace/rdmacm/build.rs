//! Gives the shared library rdma-core's identity: SONAME librdmacm.so.1 and
//! every symbol of `exports.txt` at rdma-core 44's default version
//! (`rdma_create_id@@RDMACM_1.0`), through xroce-symver.

fn main() {
    xroce_symver::Library {
        soname: "librdmacm.so.1",
        exports: "exports.txt",
        // rdma-core's nodes in order; each inherits from the one before.
        nodes: &["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"],
        standalone_nodes: &[],
    }
    .generate();
    // librdmacm reaches the devices through libibverbs.so.1's public API.
    println!("cargo:rustc-link-lib=dylib=ibverbs");
}
