//! libxdp's multi-program dispatcher (part of the matrix;
//! XROCE_VM_ONLY=dispatcher runs only this case): in the guest, whose
//! Debian kernels take EXT programs, on a veth pair between two
//! namespaces. `xroce attach` puts xroce's program under the dispatcher
//! (`xdp-loader status` lists it), `xdp-filter load` joins it on the same
//! interface, an RDMA WRITE stream over AF_XDP runs with its data verified,
//! `xroce stats` and `xroce status` find the program, and `xroce detach`
//! leaves xdp-filter attached; `ip netns exec xroce attach` (a private
//! bpffs) attaches directly. The same WRITE stream runs first with the
//! program attached directly (libxdp told to skip its dispatcher), for the
//! bandwidth ratio.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::Table;
use crate::vm::{image::Kernel, qemu::Vm};

/// The guest script; prints `BW <label> <gbps>` per bench run and exits
/// non-zero with the reason on the first failed check.
const SCRIPT: &str = r#"
set -eu
x=/opt/xroce/target/release/xroce
A="nsenter --net=/run/netns/xdpda"
B="nsenter --net=/run/netns/xdpdb"
fail() { echo "FAIL: $*"; exit 1; }
cleanup() {
    $B xdp-filter unload vb >/dev/null 2>&1 || true
    ip netns del xdpda 2>/dev/null || true
    ip netns del xdpdb 2>/dev/null || true
}
trap cleanup EXIT
ip netns add xdpda
ip netns add xdpdb
ip link add va netns xdpda type veth peer name vb netns xdpdb
ip -n xdpda addr add 10.77.0.1/24 dev va
ip -n xdpdb addr add 10.77.0.2/24 dev vb
for n in xdpda xdpdb; do ip -n $n link set lo up; done
ip -n xdpda link set va up
ip -n xdpdb link set vb up

# A verified WRITE stream from xdpda to xdpdb over AF_XDP.
bench() {
    $B $x bench write --iface vb --listen 10.77.0.2:18515 >/tmp/srv.$1 2>&1 &
    srv=$!
    for _ in $(seq 100); do $B ss -ltn | grep -q ':18515 ' && break; sleep 0.2; done
    $A $x bench write --iface va --connect 10.77.0.2:18515 -D 3 --json >/tmp/cli.$1 2>/tmp/cli.$1.err \
        || { cat /tmp/cli.$1.err /tmp/srv.$1; fail "bench $1"; }
    wait $srv || { cat /tmp/srv.$1; fail "bench server $1"; }
    grep -q '"verified":true' /tmp/cli.$1 || { cat /tmp/cli.$1; fail "$1: data not verified"; }
    grep -q 'data verified' /tmp/srv.$1 || { cat /tmp/srv.$1; fail "$1: server did not verify"; }
    echo "BW $1 $(grep -o '"gbps":[0-9.eE+-]*' /tmp/cli.$1 | cut -d: -f2)"
}

# 1. Attached directly (libxdp skips its dispatcher): the baseline.
LIBXDP_SKIP_DISPATCHER=1 $A $x attach --iface va
LIBXDP_SKIP_DISPATCHER=1 $B $x attach --iface vb
$B ip -d link show vb | grep -q 'name xroce_xdp' || fail "direct: vb does not run xroce_xdp itself"
bench direct
$A $x detach --iface va
$B $x detach --iface vb

# 2. Through the dispatcher. xroce_xdp, or its fallbacks where the kernel
# refuses their helpers: xroce_xdp_head, xroce_xdp_plain (from 6.12 on a
# dispatcher's component may not move packet data).
$A $x attach --iface va
$B $x attach --iface vb
$B ip -d link show vb | grep -q 'name xdp_dispatcher' || { $B ip -d link show vb; fail "vb runs no dispatcher"; }
$B xdp-loader status vb
$B xdp-loader status vb | grep -qE ' xroce_xdp(_head|_plain)? ' || fail "xdp-loader status does not list xroce_xdp"
$B $x status | grep "under libxdp's dispatcher" || { $B $x status; fail "xroce status names no dispatcher"; }
bench dispatcher

# 3. xdp-filter beside it (priority 10, before xroce's 40).
$B xdp-filter load vb || fail "xdp-filter load beside xroce"
$B xdp-loader status vb
$B xdp-loader status vb | grep -qE ' xroce_xdp(_head|_plain)? ' || fail "xroce_xdp gone after xdp-filter load"
$B xdp-loader status vb | grep -q ' xdpfilt_' || fail "xdp-filter's program not listed"
bench dispatcher+xdp-filter
$B $x stats --iface vb --json >/tmp/stats || fail "xroce stats"
red=$(grep -o '"redirected":[0-9]*' /tmp/stats | cut -d: -f2)
echo "xroce stats: redirected ${red:-none}"
[ "${red:-0}" -gt 0 ] || { cat /tmp/stats; fail "xroce stats: no frame redirected to AF_XDP"; }

# 4. Detach takes only xroce's program.
$B $x detach --iface vb
$B xdp-loader status vb
$B xdp-loader status vb | grep -qE ' xroce_xdp(_head|_plain)? ' && fail "xroce_xdp still listed after detach"
$B xdp-loader status vb | grep -q ' xdpfilt_' || fail "xdp-filter gone with xroce's detach"
$B $x status | grep -q 'vb' && fail "xroce status still lists vb"
$B xdp-filter unload vb
$B ip -d link show vb | grep -q 'prog/xdp' && fail "vb still runs a program after xdp-filter unload"

# 5. From `ip netns exec` (a private /sys, where a libxdp pin would die
# with the command): attached directly, and it outlives the command.
ip netns exec xdpdb $x attach --iface vb
$B ip -d link show vb | grep -q 'name xroce_xdp' || { $B ip -d link show vb; fail "ip netns exec attach: vb does not run xroce_xdp itself"; }
$B $x detach --iface vb
$A $x detach --iface va
echo DISPATCHER-OK
"#;

/// Runs the case in `vm` and records it (one line with the bandwidths).
pub(super) fn run(vm: &mut Vm, k: Kernel, table: &mut Table) {
    let t = Instant::now();
    let r = vm
        .run(SCRIPT, Duration::from_secs(240))
        .and_then(|(rc, out)| {
            // The guest's own words (xdp-loader status, stats) in the log.
            for l in out.lines() {
                eprintln!("[{} dispatcher] {l}", k.label());
            }
            summary(rc, &out)
        });
    table.record(
        &format!("{} dispatcher (xdp-filter beside)", k.label()),
        t,
        &r,
    );
}

fn summary(rc: i32, out: &str) -> Result<String> {
    if rc != 0 || !out.contains("DISPATCHER-OK") {
        let why = out
            .lines()
            .rev()
            .find(|l| l.starts_with("FAIL"))
            .unwrap_or_else(|| out.lines().last().unwrap_or(""));
        bail!("status {rc}: {why}");
    }
    let bw = |label: &str| -> Result<f64> {
        let prefix = format!("BW {label} ");
        out.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .with_context(|| format!("no bandwidth for {label}"))?
            .trim()
            .parse::<f64>()
            .with_context(|| format!("bandwidth of {label}"))
    };
    let direct = bw("direct")?;
    let disp = bw("dispatcher")?;
    let filt = bw("dispatcher+xdp-filter")?;
    Ok(format!(
        "WRITE Gb/s direct {direct:.3}, dispatcher {disp:.3} (x{:.2}), with xdp-filter {filt:.3} (x{:.2}); data verified",
        disp / direct,
        filt / direct
    ))
}
