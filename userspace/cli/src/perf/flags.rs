//! perftest's flags as `bench` and `lat` take them: which combinations
//! work (checked before anything is opened, with the fix in the message),
//! the GID table `-x` indexes, the sizes of `-a`, `-I`'s limit, and
//! perftest's address lines.

use std::net::{IpAddr, Ipv6Addr};

use anyhow::{bail, Context};
use xroce::{connect::perftest::PerftestDest, verbs::QpCap};

use super::{Op, PerfArgs, Transport};

/// perftest's -a: 2 B .. 8 MiB.
const ALL_SIZES_LOG2: std::ops::RangeInclusive<u32> = 1..=23;

/// Which tool checks the flags.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Tool {
    Bench,
    Lat,
}

/// The most inline bytes a QP takes: the engine's (and the drop-in
/// libibverbs') max_inline_data.
pub fn max_inline() -> u32 {
    QpCap::default().max_inline_data
}

/// Rejects combinations perftest (or xroce) does not run, naming the fix.
pub fn check(args: &PerfArgs, tool: Tool) -> anyhow::Result<()> {
    let (op, c) = (args.op, args.connection);
    match c {
        Transport::Rc => {}
        Transport::Uc if matches!(op, Op::Write | Op::Send) => {}
        Transport::Uc => bail!(
            "-c UC carries write and send, not {}: use `-c UC write`, `-c UC send`, or -c RC for {}",
            op.name(),
            op.name()
        ),
        Transport::Ud if op == Op::Send => {}
        Transport::Ud => bail!(
            "-c UD carries only send, not {}: use `-c UD send`, or -c RC (or UC for write) for {}",
            op.name(),
            op.name()
        ),
    }
    if let Some(n) = args.inline_size {
        let max = max_inline();
        if n > max {
            bail!("--inline_size {n}: xroce's engine inlines at most {max} bytes; use -I {max} or less");
        }
        if !matches!(op, Op::Write | Op::Send) {
            bail!(
                "--inline_size applies to write and send (a {} brings data back); leave out -I",
                op.name()
            );
        }
    }
    if args.gid_index.is_some() {
        // Fails early on an index that is not there.
        source_ip(args, IpAddr::from([0, 0, 0, 0]))?;
    }
    if args.hold && (tool == Tool::Lat || args.perftest) {
        bail!("--hold is for `xroce bench` between xroce peers; leave it out");
    }
    if args.bidirectional && tool == Tool::Lat {
        bail!("-b is for bandwidth (`xroce bench`); latency runs ping-pong already: leave out -b");
    }
    if args.perftest {
        if args.all && !matches!(op, Op::Write | Op::Read) {
            bail!(
                "-a with --perftest runs write and read (ib_write_*/ib_read_*); for {} pass one --size per run, or run -a against an xroce peer (without --perftest)",
                op.name()
            );
        }
        if args.bidirectional {
            bail!("-b with --perftest is not supported yet: run -b against an xroce peer (without --perftest)");
        }
        if c == Transport::Ud {
            bail!("-c UD with --perftest is not supported yet: use -c RC or UC, or -c UD against an xroce peer (without --perftest)");
        }
    }
    Ok(())
}

/// The sizes to run: -a's, else --size or `default`. UD's stop at
/// `ud_limit` (one path MTU), as perftest's -a does.
pub fn sizes(args: &PerfArgs, default: usize, ud_limit: usize) -> anyhow::Result<Vec<usize>> {
    if !args.all {
        return Ok(vec![args.size_or(default)?]);
    }
    let mut v: Vec<usize> = ALL_SIZES_LOG2.map(|i| 1usize << i).collect();
    if args.connection == Transport::Ud {
        v.retain(|&s| s <= ud_limit);
    }
    Ok(v)
}

/// The largest UD message on `args.iface`: its path MTU (or --mtu).
pub fn ud_limit(args: &PerfArgs) -> usize {
    let link = xroce::device::interface_mtu(&args.iface)
        .ok()
        .and_then(xroce::device::path_mtu_for)
        .unwrap_or(1024);
    args.mtu.map_or(link, |m| m.min(link)) as usize
}

/// The GID table of `iface` as the drop-in libibverbs shows it (rxe's):
/// the link-local GID, the IPv4-mapped address, then IPv6 addresses.
pub fn gid_table(iface: &str) -> anyhow::Result<Vec<Ipv6Addr>> {
    let mac = xroce::device::interface_mac(iface)
        .with_context(|| format!("-x: the MAC address of {iface}"))?;
    let (v4, v6) = xroce::device::interface_addrs(iface)
        .with_context(|| format!("-x: the addresses of {iface}"))?;
    Ok(xroce::device::gid_table(mac, v4.first().copied(), &v6))
}

/// The source address RoCE runs from: GID `-x N`'s, else `default`.
pub fn source_ip(args: &PerfArgs, default: IpAddr) -> anyhow::Result<IpAddr> {
    gid_source(&args.iface, "-x", args.gid_index, default)
}

/// The address of GID `index` of `iface`'s table (the flag that named it
/// is `flag`), else `default`: an IPv4-mapped GID is RoCEv2 over IPv4, any
/// other over IPv6.
pub fn gid_source(
    iface: &str,
    flag: &str,
    index: Option<u32>,
    default: IpAddr,
) -> anyhow::Result<IpAddr> {
    let Some(n) = index else {
        return Ok(default);
    };
    let table = gid_table(iface)?;
    let listing = || {
        table
            .iter()
            .enumerate()
            .map(|(i, g)| format!("{i} ({})", show_gid(g)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(gid) = table.get(n as usize) else {
        bail!(
            "{flag} {n}: {iface} has no GID index {n}; valid: {}",
            listing()
        );
    };
    Ok(match gid.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(*gid),
    })
}

fn show_gid(g: &Ipv6Addr) -> String {
    match g.to_ipv4_mapped() {
        Some(v4) => format!("::ffff:{v4}"),
        None => g.to_string(),
    }
}

/// C's `%#0Nx`: "0x" and zero padding to `width` in all; no "0x" for 0.
fn c_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{:#0width$x}", v)
    }
}

/// What perftest prints after the address: the RDMA key and address for
/// write and read, with read's outstanding reads first; nothing for send
/// and atomics (perftest's ctx_print_pingpong_data).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AddrExtra {
    None,
    Rdma,
    ReadRdma,
}

impl AddrExtra {
    pub fn for_op(op: Op) -> AddrExtra {
        match op {
            Op::Write => AddrExtra::Rdma,
            Op::Read => AddrExtra::ReadRdma,
            Op::Send | Op::Atomic => AddrExtra::None,
        }
    }
}

/// perftest's two lines for one side of one QP:
/// ` local address: LID 0000 QPN 0x0011 PSN 0x4b7866 RKey 0x010b88 VAddr 0x007f12d9198000`
/// ` GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:201:07:02`
pub fn address_lines(side: &str, d: &PerftestDest, extra: AddrExtra) -> String {
    let mut s = format!(
        " {side} address: LID {} QPN {} PSN {}",
        c_hex(d.lid.into(), 4),
        c_hex(d.qpn.into(), 6),
        c_hex(d.psn.into(), 6)
    );
    if extra == AddrExtra::ReadRdma {
        s += &format!(" OUT {}", c_hex(d.out_reads.into(), 4));
    }
    if extra != AddrExtra::None {
        s += &format!(
            " RKey {} VAddr {}",
            c_hex(d.rkey.into(), 8),
            c_hex(d.vaddr, 16)
        );
    }
    if let Some(gid) = d.gid {
        let bytes: Vec<String> = gid.0.iter().map(|b| format!("{b:02}")).collect();
        s += &format!("\n GID: {}", bytes.join(":"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use xroce_wire::Gid;

    #[test]
    fn c_hex_is_printfs_alternate_form() {
        assert_eq!(c_hex(0, 4), "0000");
        assert_eq!(c_hex(0x11, 6), "0x0011");
        assert_eq!(c_hex(0x4b7866, 6), "0x4b7866");
        assert_eq!(c_hex(0x80, 4), "0x80");
        assert_eq!(c_hex(0x7f12d9198000, 16), "0x007f12d9198000");
    }

    #[test]
    fn address_lines_as_perftest_prints_them() {
        let d = PerftestDest {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0x4b7866,
            rkey: 0x010b88,
            vaddr: 0x7f12d9198000,
            gid: Some(Gid::from(Ipv4Addr::new(10, 201, 7, 2))),
            srqn: 0,
        };
        assert_eq!(
            address_lines("local", &d, AddrExtra::Rdma),
            " local address: LID 0000 QPN 0x0011 PSN 0x4b7866 RKey 0x010b88 VAddr 0x007f12d9198000\n \
             GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:201:07:02"
        );
        assert_eq!(
            address_lines("remote", &d, AddrExtra::ReadRdma).lines().next(),
            Some(" remote address: LID 0000 QPN 0x0011 PSN 0x4b7866 OUT 0x10 RKey 0x010b88 VAddr 0x007f12d9198000")
        );
        assert_eq!(
            address_lines("local", &d, AddrExtra::None).lines().next(),
            Some(" local address: LID 0000 QPN 0x0011 PSN 0x4b7866")
        );
    }
}
