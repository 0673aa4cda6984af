//! `cargo xtask demo`: two network namespaces joined by a veth pair, RDMA
//! WRITE and READ bandwidth between them over XDP + AF_XDP (the XDP program
//! is attached natively on both ends by xroce itself), the data verified,
//! perftest-style tables, then the XDP counters of the receiving side; then
//! Debian's own ib_write_bw and ib_read_bw, unmodified, over xroce's
//! drop-in libibverbs between the same namespaces.

use std::{process::Stdio, thread, time::Duration};

use anyhow::{bail, Result};

use crate::{
    dropin,
    netns::{in_ns, xroce_bin, NsPair, Started},
    util::{require_root_for, run, step},
};

/// veth MTU 3500: native XDP on veth refuses larger frames to a plain
/// program, and a RoCE path MTU 2048 frame fits one 4 KiB AF_XDP chunk.
const MTU: u32 = 3500;

pub fn demo() -> Result<()> {
    require_root_for("the demo (network namespaces and XDP)")?;
    step("build (release)");
    dropin::build_release()?;
    let xroce = xroce_bin();
    let ns = NsPair::new("demo", 0, MTU)?;
    step(&format!(
        "namespaces {} ({}) and {} ({}), veth MTU {MTU}",
        ns.a, ns.addr_a, ns.b, ns.addr_b
    ));
    run(in_ns(&ns.b, &xroce).args(["attach", "--iface", &ns.if_b]))?;
    let _detach = Detach(ns.b.clone(), ns.if_b.clone());
    // Which program runs (xroce_xdp, or xroce_xdp_head where the kernel
    // refuses its metadata helper), its id and mode.
    run(in_ns(&ns.b, &xroce).args(["status", "--iface", &ns.if_b]))?;

    for (op, size) in [("write", "65536"), ("read", "65536")] {
        step(&format!(
            "RDMA {} bandwidth, {size}-byte messages, 1 QP, 3 s",
            op.to_uppercase()
        ));
        let listen = format!("{}:18515", ns.addr_b);
        let server = Started::spawn(
            in_ns(&ns.b, &xroce)
                .args(["bench", op, "-d", &ns.if_b, "--listen", &listen])
                .stdout(Stdio::null()),
        )?;
        thread::sleep(Duration::from_millis(300));
        run(in_ns(&ns.a, &xroce).args([
            "bench",
            op,
            "-d",
            &ns.if_a,
            "--connect",
            &listen,
            "--size",
            size,
            "--duration",
            "3",
        ]))?;
        if !server.wait()?.success() {
            bail!("the {op} server failed");
        }
    }
    step(&format!(
        "XDP counters on {} (xroce stats, another process)",
        ns.if_b
    ));
    run(in_ns(&ns.b, &xroce).args(["stats", "--iface", &ns.if_b]))?;
    drop(_detach);

    for tool in ["ib_write_bw", "ib_read_bw"] {
        step(&format!(
            "Debian's {tool}, unmodified, over xroce's libibverbs: \
             `xroce run --iface IF -- {tool} -d xroce_IF -x 1 -F -s 65536 -D 3 --report_gbits`"
        ));
        let row = dropin::perftest(&ns, tool, &["-s", "65536", "-D", "3", "--report_gbits"]);
        dropin::detach(&ns);
        println!("{}", row?.table);
    }
    Ok(())
}

/// Detaches what the demo attached, however it ends.
struct Detach(String, String);

impl Drop for Detach {
    fn drop(&mut self) {
        let _ = in_ns(&self.0, xroce_bin())
            .args(["detach", "--iface", &self.1])
            .status();
    }
}
