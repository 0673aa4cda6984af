//! One perftest-compatible test: the OOB exchange up to the measurement
//! (versions, system data, MTU, the per-tool hand shakes), the verbs
//! objects, and the buffer layout perftest's addresses follow.

use std::net::IpAddr;

use anyhow::{bail, Context};
use rand::Rng;
use xroce::{
    connect::{
        perftest::{PerftestConn, PerftestDest, VERSION},
        ConnectError, Role,
    },
    verbs::{CompletionQueue, MemoryRegion, Mtu, ProtectionDomain, QpInitAttr, QueuePair},
};

use super::{oob::open_oob, rx_depth, Params, Tool};
use crate::perf::{
    conn::{connect_qp, peer_mac, ALL_ACCESS},
    flags::{address_lines, AddrExtra},
    stack::Stack,
    Op, PerfArgs, OOB_TIMEOUT,
};

/// `sysconf(_SC_PAGESIZE)` on the hosts we run on.
const CYCLE_BUFFER: i32 = 4096;
const CACHE_LINE: i32 = 64;
/// Outstanding RDMA reads/atomics we accept as responder (and announce).
const OUT_READS: u16 = 16;

/// `BUFF_SIZE`: a message, at least a cycle buffer.
fn buff_size(size: usize, cycle: usize) -> usize {
    size.max(cycle)
}

/// `INC`: the step between two messages' addresses.
fn inc(size: usize, cache_line: usize) -> usize {
    if size > cache_line {
        size.div_ceil(cache_line) * cache_line
    } else {
        cache_line
    }
}

/// One perftest-compatible test: the stack, the OOB connection, the verbs
/// objects and both sides' addresses.
pub(super) struct Test {
    pub(super) p: Params,
    pub(super) role: Role,
    pub(super) stack: Stack,
    pub(super) conn: PerftestConn,
    pub(super) peer_version: String,
    /// --cc, for the report.
    pub(super) cc: String,
    _pd: ProtectionDomain,
    pub(super) cq: CompletionQueue,
    pub(super) qps: Vec<QueuePair>,
    pub(super) mr: MemoryRegion,
    pub(super) my: Vec<PerftestDest>,
    pub(super) rem: Vec<PerftestDest>,
    /// `BUFF_SIZE` after the cycle buffer exchange.
    pub(super) buff: usize,
    pub(super) cycle: usize,
    pub(super) cache_line: usize,
    pub(super) mtu: Mtu,
    /// Write/send messages up to this size go inline (-I).
    pub(super) inline: usize,
    /// --report_gbits.
    pub(super) gbits: bool,
    /// -u.
    pub(super) qp_timeout: u8,
    /// Whether the next report prints the table's header and its closing
    /// rule (-a prints one table).
    pub(super) rows: (bool, bool),
}

impl Test {
    pub(super) fn setup(args: &PerfArgs, p: Params) -> anyhow::Result<Test> {
        let (mut conn, local_ip) = open_oob(args)?;
        let role = conn.role();
        let stack = Stack::open(args, local_ip)?;
        if role == Role::Server {
            eprintln!(
                "xroce: perftest {} {} server ready ({} backend, path MTU {})",
                p.verb(),
                if p.tool == Tool::Bw { "bw" } else { "lat" },
                stack.backend,
                stack.path_mtu.bytes()
            );
        }
        let peer_version = conn.exchange_versions(VERSION).map_err(|e| match e {
            ConnectError::Garbage { .. } => anyhow::anyhow!(
                "{e}; is the peer a perftest tool (or `xroce ... --perftest`)? \
                 xroce peers without --perftest speak xroce's own exchange"
            ),
            other => other.into(),
        })?;
        let (their_cycle, their_line) = conn.exchange_sys_data(CYCLE_BUFFER, CACHE_LINE)?;
        let cycle = CYCLE_BUFFER.max(their_cycle).max(64) as usize;
        let cache_line = CACHE_LINE.max(their_line).max(1) as usize;
        let mtu_bytes = conn.exchange_mtu(stack.path_mtu.bytes())?;
        let mtu = Mtu::from_bytes(mtu_bytes).unwrap_or(stack.path_mtu);

        // Resources, as ctx_init: one buffer for all QPs, both halves.
        let buff = buff_size(p.size, cycle);
        let page = 4096;
        let mr_len = (2 * p.qps * buff).div_ceil(page) * page;
        let rx_depth = rx_depth(p);
        let pd = stack.device.alloc_pd();
        let cq = stack
            .device
            .create_cq(p.qps * (p.tx_depth + rx_depth) + 64)
            .context("create CQ")?;
        let mut init = QpInitAttr::rc(&cq);
        init.qp_type = args.connection.qp_type();
        if let Some(n) = args.inline_size {
            init.cap.max_inline_data = n;
        }
        init.cap.max_send_wr = p.tx_depth as u32;
        init.cap.max_recv_wr = rx_depth.max(1) as u32;
        let qps = (0..p.qps)
            .map(|_| stack.device.create_qp(&pd, &init))
            .collect::<Result<Vec<_>, _>>()
            .context("create QP")?;
        let mr = pd.reg_mr(mr_len, ALL_ACCESS).context("register MR")?;
        let mut rng = rand::rng();
        let gid = stack.gid();
        let my: Vec<PerftestDest> = qps
            .iter()
            .enumerate()
            .map(|(i, qp)| PerftestDest {
                lid: 0,
                out_reads: OUT_READS,
                qpn: qp.qp_num(),
                psn: rng.random::<u32>() & 0xff_ffff,
                rkey: mr.rkey(),
                vaddr: mr.addr() + ((p.qps + i) * buff) as u64,
                gid: Some(gid),
                srqn: 0,
            })
            .collect();
        let mut t = Test {
            p,
            role,
            stack,
            conn,
            peer_version,
            cc: args.cc.to_string(),
            _pd: pd,
            cq,
            qps,
            mr,
            rem: Vec::new(),
            my,
            buff,
            cycle,
            cache_line,
            mtu,
            inline: args.inline_size.unwrap_or(0) as usize,
            gbits: args.report_gbits,
            qp_timeout: args.qp_timeout,
            rows: (true, true),
        };
        t.hand_shakes()?;
        if !args.json {
            t.print_addresses();
        }
        Ok(t)
    }

    /// perftest's address lines: every QP's local one, then every remote.
    fn print_addresses(&self) {
        let extra = AddrExtra::for_op(self.p.op);
        for d in &self.my {
            println!("{}", address_lines("local", d, extra));
        }
        for d in &self.rem {
            println!("{}", address_lines("remote", d, extra));
        }
    }

    /// A send WR of `opcode` from `sge`, inline when -I allows.
    pub(super) fn send_wr(
        &self,
        wr_id: u64,
        opcode: xroce::verbs::WrOpcode,
        sge: xroce::verbs::Sge,
    ) -> xroce::verbs::SendWr {
        let inline = sge.length as usize <= self.inline
            && matches!(
                opcode,
                xroce::verbs::WrOpcode::Send | xroce::verbs::WrOpcode::RdmaWrite { .. }
            );
        let wr = xroce::verbs::SendWr::new(wr_id, opcode, vec![sge]);
        if inline {
            let flags = wr.flags | xroce::verbs::SendFlags::INLINE;
            wr.flags(flags)
        } else {
            wr
        }
    }

    /// The tool's hand shakes up to the measurement, QPs to RTS and
    /// receives posted on the way.
    fn hand_shakes(&mut self) -> anyhow::Result<()> {
        let p = self.p;
        // write_lat and read_lat open with a hand shake of QP 0.
        if p.tool == Tool::Lat && p.op != Op::Send {
            self.conn.hand_shake(&self.my[0])?;
        }
        // Round 1: every QP's address.
        let mut rem = Vec::with_capacity(p.qps);
        for d in &self.my {
            rem.push(self.conn.hand_shake(d)?);
        }
        self.rem = rem;
        self.connect()?;
        // The send tools hand-shake QP 0 after connecting.
        if p.op == Op::Send {
            self.conn.hand_shake(&self.my[0])?;
        }
        // Round 2: the same addresses again (the remote side printed).
        for i in 0..p.qps {
            let again = self.conn.hand_shake(&self.my[i])?;
            if again.qpn != self.rem[i].qpn {
                bail!(
                    "the peer's QP {i} changed from {:#x} to {:#x} between hand shakes",
                    self.rem[i].qpn,
                    again.qpn
                );
            }
        }
        // Receives before the last hand shake: the send bw server, and
        // both sides of send lat.
        if p.op == Op::Send && (p.tool == Tool::Lat || self.role == Role::Server) {
            for q in 0..p.qps {
                for _ in 0..rx_depth(p) {
                    self.post_recv(q)?;
                }
            }
        }
        // "An additional handshake is required after moving qp to RTR."
        self.conn.hand_shake(&self.my[0])?;
        Ok(())
    }

    fn connect(&mut self) -> anyhow::Result<()> {
        let r0 = self.rem[0];
        let Some(gid) = r0.gid else {
            bail!("the peer sent no GID; run it with a RoCE GID (rxe: -x 1)");
        };
        // IPv4-mapped or IPv6: both are RoCEv2 GIDs (perftest -x picks).
        let ip = IpAddr::from(gid);
        if ip.is_unspecified() {
            bail!(
                "the peer's GID {} is no RoCEv2 address; use a RoCEv2 GID (perftest -x)",
                gid.hex()
            );
        }
        let mac = peer_mac(&self.stack, ip, [0; 6])?;
        for ((qp, my), r) in self.qps.iter().zip(&self.my).zip(&self.rem) {
            let max_rd = r.out_reads.clamp(1, OUT_READS) as u8;
            connect_qp(
                qp,
                my.psn,
                self.mtu,
                max_rd,
                self.qp_timeout,
                r.qpn,
                r.psn,
                mac,
                ip,
            )?;
        }
        Ok(())
    }

    /// `ctx_close_connection`: a hand shake, then "done".
    pub(super) fn close(&mut self) -> anyhow::Result<()> {
        self.conn.finish(&self.my[0])?;
        self.conn.set_timeout(OOB_TIMEOUT);
        Ok(())
    }

    /// Our buffer offset of QP `q`'s send slot and receive slot.
    pub(super) fn send_off(&self, q: usize) -> usize {
        q * self.buff
    }
    pub(super) fn recv_off(&self, q: usize) -> usize {
        (self.p.qps + q) * self.buff
    }

    /// Offset of message `k` within a slot (cycling below half a cycle
    /// buffer, as perftest's increase_rem_addr).
    pub(super) fn cycle_off(&self, k: u64) -> u64 {
        let p = self.p;
        if p.size > self.cycle / 2 {
            return 0;
        }
        let step = inc(p.size, self.cache_line);
        let n = (self.cycle / step).max(1) as u64;
        (k % n) * step as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_step_like_perftest() {
        assert_eq!(buff_size(2, 4096), 4096);
        assert_eq!(buff_size(65536, 4096), 65536);
        assert_eq!(inc(2, 64), 64);
        assert_eq!(inc(65, 64), 128);
        assert_eq!(inc(1000, 64), 1024);
    }
}
