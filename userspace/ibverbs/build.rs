//! Gives the shared library rdma-core's identity: SONAME libibverbs.so.1
//! and every symbol of `exports.txt` at rdma-core 44's default version
//! (`ibv_get_device_list@@IBVERBS_1.1`), through xroce-symver; xroce's
//! own entry points at `XROCE_PRIVATE_1`.

fn main() {
    xroce_symver::Library {
        soname: "libibverbs.so.1",
        exports: "exports.txt",
        // rdma-core's public nodes in order; each inherits from the one before.
        nodes: &[
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
        ],
        // rdma-core's private node, and xroce's own (xroce_create_gsi_qp).
        standalone_nodes: &["IBVERBS_PRIVATE_34", "XROCE_PRIVATE_1"],
    }
    .generate();
}
