//! `xroce pingpong`: RC SEND/RECV ping-pong that interoperates with
//! rdma-core's `ibv_rc_pingpong` (libibverbs/examples/rc_pingpong.c).
//!
//! Same protocol as that tool, so either side can be rxe or xroce:
//! - out of band, TCP (port 18515 by default), rdma-core's format from
//!   `xroce::connect::pingpong`: the client sends its "LID:QPN:PSN:GID", the
//!   server moves its QP to RTS and answers with its own, the client sends
//!   "done" and moves to RTS;
//! - both sides keep `rx_depth` receives posted; the client sends first;
//!   each side sends again once its previous send and a receive completed,
//!   until both `iters` sends and `iters` receives are done;
//! - the result lines are rc_pingpong's ("N bytes in S seconds = R Mbit/sec",
//!   "N iters in S seconds = U usec/iter").
//!
//! The GID is the RoCEv2 IPv4-mapped one of the interface's address
//! (rxe's GID index 1), so `-g` is accepted and ignored; the peer's
//! address comes from its GID.

use std::{
    net::{IpAddr, Ipv4Addr, TcpListener},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use rand::Rng;
use xroce::{
    cc::CcKind,
    connect::pingpong::{self, PingpongDest},
    verbs::{
        AccessFlags, AddressVector, QpAttr, QpInitAttr, RecvWr, RemoteQp, SendWr, Wc, WcOpcode,
        WrOpcode,
    },
};

use xroce_wire::Gid;

use crate::perf::{
    conn::check_wc,
    stack::{first_ipv4, Stack, StackOptions},
    Backend,
};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// Bound on each out-of-band read and on the client's connect retries.
const OOB_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the server waits for a client.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(600);
/// A ping-pong that makes no progress for this long has failed.
const STALL: Duration = Duration::from_secs(20);

#[derive(clap::Args, Debug, Clone)]
pub struct PingpongArgs {
    /// Server to connect to (client); without it, wait for a client (server)
    pub peer: Option<String>,
    /// Interface to run RoCEv2 on (or, as ibv_rc_pingpong's -d, xroce's
    /// device on it: xroce_IF)
    #[arg(long, short = 'd', value_parser = crate::iface::interface)]
    pub iface: String,
    /// TCP port of the out-of-band exchange
    #[arg(long, short = 'p', default_value_t = 18515)]
    pub port: u16,
    /// Message size in bytes
    #[arg(long, short = 's', default_value_t = 4096)]
    pub size: usize,
    /// Path MTU: 256, 512, 1024, 2048 or 4096
    #[arg(long, short = 'm', default_value_t = 1024)]
    pub mtu: u32,
    /// Receives kept posted
    #[arg(long, short = 'r', default_value_t = 500)]
    pub rx_depth: usize,
    /// Messages each way
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub iters: u64,
    /// Port number (accepted for compatibility, ignored)
    #[arg(long, short = 'i', default_value_t = 1)]
    pub ib_port: u32,
    /// Service level (accepted, ignored)
    #[arg(long, short = 'l', default_value_t = 0)]
    pub sl: u8,
    /// GID index of the source address, as ibv_rc_pingpong's -g (default:
    /// the interface's IPv4-mapped GID; an IPv6 one runs RoCEv2 over IPv6)
    #[arg(long, short = 'g')]
    pub gid_idx: Option<u32>,
    /// Check the received data (the client sends rc_pingpong's -c pattern,
    /// the server checks every byte of every message)
    #[arg(long, short = 'c')]
    pub chk: bool,
    /// Packet I/O: afxdp or udp (path MTU 4096 needs udp for now)
    #[arg(long, value_enum, default_value = "afxdp")]
    pub backend: Backend,
    /// Spin on the packet rings instead of sleeping
    #[arg(long)]
    pub busy_poll: bool,
}

/// The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d).
fn gid_ipv4(gid: &Gid) -> Option<Ipv4Addr> {
    gid.to_ipv4().map(Ipv4Addr::from)
}

fn gid_text(gid: &Gid) -> String {
    match gid_ipv4(gid) {
        Some(ip) => format!("::ffff:{ip}"),
        None => std::net::Ipv6Addr::from(gid.0).to_string(),
    }
}

fn print_dest(which: &str, d: &PingpongDest) {
    println!(
        "  {which} address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        d.lid,
        d.qpn,
        d.psn,
        gid_text(&d.gid)
    );
}

/// The byte at `i` of the client's message when checking (`-c`), as
/// ibv_rc_pingpong's client sends it: its buffer is filled with 0x7b and
/// `-c` zeroes the first byte of every page (rdma-core's server checks
/// those bytes; we check every byte, so either side may be rdma-core's).
fn pattern(i: usize) -> u8 {
    const PAGE: usize = 4096;
    if i.is_multiple_of(PAGE) {
        0
    } else {
        FILL
    }
}

/// What rc_pingpong fills its buffer with.
const FILL: u8 = 0x7b;

pub fn run(args: &PingpongArgs) -> anyhow::Result<()> {
    if args.size == 0 {
        bail!("--size must be at least 1");
    }
    let local_ip = match args.gid_idx {
        Some(_) => crate::perf::flags::gid_source(
            &args.iface,
            "-g",
            args.gid_idx,
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        )?,
        None => IpAddr::V4(first_ipv4(&args.iface)?),
    };
    let stack = Stack::open_with(
        &StackOptions {
            iface: args.iface.clone(),
            backend: args.backend.into(),
            mtu: Some(args.mtu),
            cc: CcKind::None,
            line_rate_bps: 100_000_000_000,
            busy_poll: args.busy_poll,
            spin_after_activity: xroce::runtime::RuntimeConfig::default().spin_after_activity,
            stream_nap: xroce::runtime::RuntimeConfig::default().stream_nap,
        },
        local_ip,
    )?;
    let pd = stack.device.alloc_pd();
    let cq = stack
        .device
        .create_cq(args.rx_depth + 16)
        .context("create CQ")?;
    let mut init = QpInitAttr::rc(&cq);
    init.cap.max_send_wr = 1;
    init.cap.max_recv_wr = args.rx_depth as u32;
    let qp = stack.device.create_qp(&pd, &init).context("create QP")?;
    // One buffer for sends and receives, as rc_pingpong.
    let mr = pd
        .reg_mr(args.size, AccessFlags::LOCAL_WRITE)
        .context("register MR")?;
    let fill: Vec<u8> = if args.chk && args.peer.is_some() {
        (0..args.size).map(pattern).collect()
    } else {
        vec![FILL; args.size]
    };
    // SAFETY: the MR is new: no receive or send is posted on it yet.
    unsafe { mr.write(0, &fill) }?;
    let post_recv = || {
        qp.post_recv(&RecvWr {
            wr_id: RECV_WRID,
            sg_list: vec![mr.sge(0, args.size)],
        })
    };
    let me = PingpongDest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: rand::rng().random::<u32>() & 0xff_ffff,
        gid: stack.gid(),
    };
    print_dest("local", &me);

    let connect = |rem: &PingpongDest| -> anyhow::Result<()> {
        // IPv4-mapped: RoCEv2 over IPv4; any other GID: over IPv6.
        let peer_ip = IpAddr::from(rem.gid);
        if peer_ip.is_unspecified() {
            bail!(
                "peer's GID {} is no RoCEv2 address; use a RoCEv2 GID there (rxe: -g 1)",
                gid_text(&rem.gid)
            );
        }
        let mac = stack.neighbour(peer_ip)?;
        let local = QpAttr {
            qp_access_flags: AccessFlags::LOCAL_WRITE,
            path_mtu: stack.path_mtu,
            sq_psn: me.psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            ..Default::default()
        };
        let remote = RemoteQp {
            qpn: rem.qpn,
            psn: rem.psn,
            av: AddressVector {
                dest_mac: mac,
                dest_ip: peer_ip,
                ..Default::default()
            },
        };
        qp.connect(&local, &remote)
            .with_context(|| format!("connect QP {:#x} to {:#x}", me.qpn, rem.qpn))?;
        // rc_pingpong posts its receives in INIT; our QP goes from RESET to
        // RTS in one call, so they are posted here, before this side tells
        // the peer it may send (server: its address; client: "done").
        for _ in 0..args.rx_depth {
            post_recv().context("couldn't post receive")?;
        }
        Ok(())
    };

    let rem = match &args.peer {
        Some(server) => {
            // rc_pingpong's client exchanges (ending with "done"), then
            // connects: the server sends only in answer to our first message.
            let rem = pingpong::client_exchange((server.as_str(), args.port), &me, OOB_TIMEOUT)
                .with_context(|| {
                    format!("couldn't exchange addresses with {server}:{}", args.port)
                })?;
            connect(&rem)?;
            rem
        }
        None => {
            // Both families where the host has IPv6 (a peer may come over
            // either), else IPv4.
            let listener = TcpListener::bind(("::", args.port))
                .or_else(|_| TcpListener::bind(("0.0.0.0", args.port)))
                .with_context(|| format!("listen on TCP port {}", args.port))?;
            let (server, rem) = pingpong::PingpongServer::accept(&listener, ACCEPT_TIMEOUT)?;
            connect(&rem)?;
            server.reply(&me)?;
            rem
        }
    };
    print_dest("remote", &rem);

    let post_send = || {
        // Signaled, as rc_pingpong's (SendWr::new's default).
        let wr = SendWr::new(SEND_WRID, WrOpcode::Send, vec![mr.sge(0, args.size)]);
        qp.post_send(&wr)
    };
    let start = Instant::now();
    let mut pending = RECV_WRID;
    if args.peer.is_some() {
        if args.chk {
            // SAFETY: nothing sent yet and the server sends only in answer, so the receives stay empty.
            unsafe { mr.write(0, &fill) }?;
        }
        post_send().context("couldn't post send")?;
        pending |= SEND_WRID;
    }
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut routs = args.rx_depth;
    let mut last = Instant::now();
    let mut wcs = [Wc::default(); 16];
    let mut buf = vec![0u8; args.size];
    while rcnt < args.iters || scnt < args.iters {
        let n = cq.poll(&mut wcs)?;
        if n == 0 {
            if last.elapsed() > STALL {
                stack.check_running()?;
                bail!(
                    "no completion for {STALL:?} after {scnt} sends and {rcnt} receives; is the peer alive?"
                );
            }
            std::hint::spin_loop();
            continue;
        }
        last = Instant::now();
        for wc in &wcs[..n] {
            check_wc(
                wc,
                if wc.wr_id == SEND_WRID {
                    "send"
                } else {
                    "receive"
                },
            )?;
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if wc.opcode != WcOpcode::Recv {
                        bail!("receive completed as {:?}", wc.opcode);
                    }
                    if args.chk && args.peer.is_none() {
                        // SAFETY: the client sends again only after our reply (posted below), so
                        // the other receives on this buffer stay empty until then (ping-pong).
                        unsafe { mr.read(0, &mut buf) }?;
                        if let Some(i) = (0..args.size).find(|&i| buf[i] != pattern(i)) {
                            bail!(
                                "message {rcnt}: byte {i} is {:#04x}, not {:#04x}",
                                buf[i],
                                pattern(i)
                            );
                        }
                    }
                    routs -= 1;
                    if routs <= 1 {
                        let refill = args.rx_depth - routs;
                        for _ in 0..refill {
                            post_recv().context("couldn't post receive")?;
                        }
                        routs += refill;
                    }
                    rcnt += 1;
                }
                other => bail!("completion for unknown wr_id {other}"),
            }
            pending &= !wc.wr_id;
            if scnt < args.iters && pending == 0 {
                if args.chk && args.peer.is_some() {
                    // SAFETY: our send completed, the reply arrived, and the server sends only in
                    // answer to our next message (ping-pong): no WR uses the buffer now.
                    unsafe { mr.write(0, &fill) }?;
                }
                post_send().context("couldn't post send")?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = args.size as u64 * args.iters * 2;
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        args.iters,
        secs * 1e6 / args.iters as f64
    );
    stack.check_running()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_gid() {
        let g = Gid::from_ipv4([10, 77, 0, 10]);
        assert_eq!(gid_ipv4(&g), Some(Ipv4Addr::new(10, 77, 0, 10)));
        assert_eq!(gid_text(&g), "::ffff:10.77.0.10");
        assert_eq!(gid_ipv4(&Gid([0xfe; 16])), None);
    }
}
