//! WRITE against TCP on pairs of three MTUs (issue 27, goal 2): on veth
//! pairs of MTU 1500, 3500 and 9000, xroce's RDMA WRITE of 64 KiB on 1 QP
//! over each backend (AF_XDP with its XDP program; UDP with GSO and GRO,
//! no XDP program) and iperf3's TCP stream, in alternating rounds, each
//! with its CPU seconds per GB (machine-wide, see cpu.rs); medians. RoCE
//! takes the largest path MTU that fits the link (1024, 2048, 4096): the
//! frames per byte, which is what xroce's cost follows, fall 4x from the
//! first pair to the last, while TCP crosses every veth in 64 KB GSO
//! packets whatever the MTU.

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::{cpu, iperf3, median, udp_gso, xroce_pair_with, SECONDS};
use crate::{
    dropin,
    netns::{xroce_bin, NsPair},
    util::step,
};

/// The links' MTUs, and the third octet of each pair's addresses.
const PAIRS: [(u32, u8); 3] = [(1500, 7), (3500, 8), (9000, 9)];
const ROUNDS: usize = 3;

/// One transport on one pair: medians of its rounds.
#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct Run {
    pub gbps: f64,
    pub cpu_seconds_per_gb: f64,
}

/// One pair.
#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct AtMtu {
    pub veth_mtu: u32,
    /// The RoCE path MTU both backends ran with.
    pub path_mtu: u32,
    pub tcp: Run,
    pub afxdp: Run,
    pub udp_gso: Run,
    /// The faster backend ("afxdp" or "udp") and its ratios to TCP.
    pub best_backend: String,
    /// Goal (issue 27, 2): >= 1.0.
    pub best_gbps_vs_tcp: f64,
    /// Goal (issue 27, 1, at this MTU): <= 1.0.
    pub best_cpu_per_gb_vs_tcp: f64,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct MtuSweep {
    pub rounds: usize,
    pub pairs: Vec<AtMtu>,
}

impl Run {
    fn of(gbps: f64, cost: cpu::CpuCost) -> Self {
        Self {
            gbps,
            cpu_seconds_per_gb: cost.cpu_seconds_per_gb,
        }
    }
}

fn medians(runs: &[Run]) -> Run {
    Run {
        gbps: median(&runs.iter().map(|r| r.gbps).collect::<Vec<_>>()),
        cpu_seconds_per_gb: median(
            &runs
                .iter()
                .map(|r| r.cpu_seconds_per_gb)
                .collect::<Vec<_>>(),
        ),
    }
}

fn at(veth_mtu: u32, octet: u8) -> Result<AtMtu> {
    let ns = NsPair::new(&format!("m{veth_mtu}"), octet, veth_mtu)?;
    let exe = xroce_bin();
    let write = ["write", "--size", "65536", "--duration", SECONDS];
    let (mut tcp, mut afxdp, mut udp) = (Vec::new(), Vec::new(), Vec::new());
    let mut path_mtu = 0;
    for round in 0..ROUNDS {
        step(&format!("MTU {veth_mtu}, round {}/{ROUNDS}", round + 1));
        let (gbps, cost) = cpu::measure(|| iperf3(&ns))?;
        tcp.push(Run::of(gbps, cost));
        let (r, cost) = cpu::measure_bench(|| xroce_pair_with(&exe, &ns, "bench", &write))?;
        path_mtu = r.mtu;
        afxdp.push(Run::of(r.gbps, cost));
        // No XDP program for the UDP backend: on a veth whose peer runs
        // one, the kernel cuts GSO packets into frames in software.
        dropin::detach(&ns);
        let (r, cost) = cpu::measure_bench(|| {
            udp_gso::udp_pair(&ns, &["--duration", SECONDS], &[], udp_gso::GSO_ON)
        })?;
        udp.push(Run::of(r.gbps, cost));
        eprintln!(
            "  MTU {veth_mtu}: TCP {:.2} Gb/s ({:.2} CPU s/GB), AF_XDP {:.2} ({:.2}), UDP GSO {:.2} ({:.2})",
            tcp[round].gbps,
            tcp[round].cpu_seconds_per_gb,
            afxdp[round].gbps,
            afxdp[round].cpu_seconds_per_gb,
            udp[round].gbps,
            udp[round].cpu_seconds_per_gb
        );
    }
    let (tcp, afxdp, udp_gso) = (medians(&tcp), medians(&afxdp), medians(&udp));
    let (best_backend, best) = if afxdp.gbps >= udp_gso.gbps {
        ("afxdp", afxdp)
    } else {
        ("udp", udp_gso)
    };
    Ok(AtMtu {
        veth_mtu,
        path_mtu,
        tcp,
        afxdp,
        udp_gso,
        best_backend: best_backend.into(),
        best_gbps_vs_tcp: best.gbps / tcp.gbps,
        best_cpu_per_gb_vs_tcp: best.cpu_seconds_per_gb / tcp.cpu_seconds_per_gb,
    })
}

pub fn measure() -> Result<MtuSweep> {
    let pairs = PAIRS
        .iter()
        .map(|&(mtu, octet)| at(mtu, octet))
        .collect::<Result<Vec<_>>>()?;
    Ok(MtuSweep {
        rounds: ROUNDS,
        pairs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_take_each_column_on_its_own() {
        let runs = [
            Run {
                gbps: 1.0,
                cpu_seconds_per_gb: 9.0,
            },
            Run {
                gbps: 3.0,
                cpu_seconds_per_gb: 1.0,
            },
            Run {
                gbps: 2.0,
                cpu_seconds_per_gb: 2.0,
            },
        ];
        let m = medians(&runs);
        assert_eq!((m.gbps, m.cpu_seconds_per_gb), (2.0, 2.0));
    }
}
