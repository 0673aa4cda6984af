//! One connection's verbs objects (PD, CQ, QPs, MR), the exchange that
//! connects them to the peer's, and the report both tools print.

use std::{
    net::{IpAddr, TcpListener, TcpStream},
    time::Duration,
};

use anyhow::{bail, Context};
use rand::Rng;
use xroce::verbs::{
    AccessFlags, AddressVector, CompletionQueue, MemoryRegion, ProtectionDomain, QpAttr,
    QpInitAttr, QueuePair, RemoteQp, Wc, WcStatus,
};

use super::{
    session::{check_hello, Endpoint, Hello, QpInfo, Session, MAGIC},
    stack::{first_ipv4, Stack},
    PerfArgs, OOB_TIMEOUT,
};

pub const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Memory both sides register for message slots, at most.
const MR_BUDGET: usize = 256 << 20;

/// Message slots in the MRs: `slots` per QP, each `size` bytes (at least 8,
/// so a slot can hold an atomic counter). Big messages get fewer slots than
/// WRs in flight; those WRs then share slots (same data, so checks hold).
pub struct Conn {
    pub _pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qps: Vec<QueuePair>,
    pub mr: MemoryRegion,
    pub psns: Vec<u32>,
    pub slot_len: usize,
    pub slots: usize,
}

/// Slots per QP for a run (both sides compute it from the hello).
pub fn slots_for(size: usize, qps: usize, depth: usize) -> usize {
    let per_qp = MR_BUDGET / qps.max(1) / size.max(8);
    depth.min(per_qp.max(2))
}

impl Conn {
    pub fn create(stack: &Stack, hello: &Hello) -> anyhow::Result<Conn> {
        let pd = stack.device.alloc_pd();
        let cq = stack
            .device
            .create_cq(hello.qps * hello.depth * 2 + 64)
            .context("create CQ")?;
        let mut init = QpInitAttr::rc(&cq);
        init.cap.max_send_wr = hello.depth as u32;
        init.cap.max_recv_wr = hello.depth as u32;
        let qps = (0..hello.qps)
            .map(|_| stack.device.create_qp(&pd, &init))
            .collect::<Result<Vec<_>, _>>()
            .context("create QP")?;
        let slot_len = hello.size.max(8);
        let slots = slots_for(hello.size, hello.qps, hello.depth.max(2));
        let mr = pd
            .reg_mr(hello.qps * slots * slot_len, ALL_ACCESS)
            .context("register MR")?;
        let mut rng = rand::rng();
        let psns = (0..hello.qps)
            .map(|_| rng.random::<u32>() & 0xff_ffff)
            .collect();
        Ok(Conn {
            _pd: pd,
            cq,
            qps,
            mr,
            psns,
            slot_len,
            slots,
        })
    }

    pub fn slot_offset(&self, qp: usize, slot: usize) -> usize {
        (qp * self.slots + slot) * self.slot_len
    }

    pub fn endpoint(&self, mac: [u8; 6]) -> Endpoint {
        Endpoint {
            mac,
            qps: self
                .qps
                .iter()
                .zip(&self.psns)
                .map(|(qp, &psn)| QpInfo {
                    qpn: qp.qp_num(),
                    psn,
                })
                .collect(),
            mr_addr: self.mr.addr(),
            rkey: self.mr.rkey(),
            mr_len: self.mr.len() as u64,
        }
    }

    /// Brings every QP to RTS towards the peer's matching QP.
    pub fn connect(
        &self,
        remote: &Endpoint,
        peer_mac: [u8; 6],
        peer_ip: IpAddr,
        stack: &Stack,
    ) -> anyhow::Result<()> {
        let IpAddr::V4(dest_ip) = peer_ip else {
            bail!("peer {peer_ip} is not IPv4");
        };
        if remote.qps.len() != self.qps.len() {
            bail!(
                "peer offered {} QPs, we have {}",
                remote.qps.len(),
                self.qps.len()
            );
        }
        for ((qp, &psn), r) in self.qps.iter().zip(&self.psns).zip(&remote.qps) {
            let local = QpAttr {
                qp_access_flags: ALL_ACCESS,
                path_mtu: stack.path_mtu,
                sq_psn: psn,
                // 4.096 us * 2^14 = 67 ms; six retries: a dead peer shows
                // up as RETRY_EXC_ERR in about half a second.
                timeout: 14,
                retry_cnt: 6,
                rnr_retry: 7,
                min_rnr_timer: 12,
                max_rd_atomic: 16,
                max_dest_rd_atomic: 16,
                ..Default::default()
            };
            let remote_qp = RemoteQp {
                qpn: r.qpn,
                psn: r.psn,
                av: AddressVector {
                    dest_mac: peer_mac,
                    dest_ip,
                    ..Default::default()
                },
            };
            qp.connect(&local, &remote_qp)
                .with_context(|| format!("connect QP {:#x} to {:#x}", qp.qp_num(), r.qpn))?;
        }
        Ok(())
    }
}

/// A completion that is not a success ends the run with a message that
/// says what happened.
pub fn check_wc(wc: &Wc, what: &str) -> anyhow::Result<()> {
    if wc.status == WcStatus::Success {
        return Ok(());
    }
    let hint = match wc.status {
        WcStatus::RetryExcErr => ": the peer stopped answering (killed? unreachable?)",
        WcStatus::RnrRetryExcErr => ": the peer posted no receive buffers",
        WcStatus::RemAccessErr => ": the peer refused the rkey or address range",
        WcStatus::WrFlushErr => ": the QP went to the error state",
        _ => "",
    };
    bail!(
        "{what} on QP {:#x} completed with {:?}{hint}",
        wc.qp_num,
        wc.status
    )
}

/// The client's side of setting up: TCP, stack, exchange, connected QPs.
pub struct ClientSide {
    pub session: Session,
    /// The server's QPs and memory.
    pub remote: Endpoint,
    pub stack: Stack,
    pub conn: Conn,
    pub hello: Hello,
}

/// Everything up to the server's "ready": TCP, stack, exchange, QPs at RTS,
/// then `before_ready` (e.g. posting receives before the first message).
pub fn client_setup_until_ready(
    args: &PerfArgs,
    mode: &str,
    size: usize,
    depth: usize,
    before_ready: impl FnOnce(&Conn) -> anyhow::Result<()>,
) -> anyhow::Result<ClientSide> {
    let server = args.connect.expect("clap: --listen or --connect");
    let stream = connect_retrying(server, Duration::from_secs(10)).with_context(|| {
        format!("connect to {server}; is `xroce {mode} --listen` running there?")
    })?;
    let local_ip = stream.local_addr()?.ip();
    let mut session = Session::new(stream, OOB_TIMEOUT)?;
    let stack = Stack::open(args, local_ip)?;
    let hello = Hello {
        magic: MAGIC.into(),
        op: args.op.name().into(),
        mode: mode.into(),
        size,
        qps: args.qps,
        depth,
        mtu: stack.path_mtu.bytes(),
    };
    session.send(&hello)?;
    let remote: Endpoint = session.recv("the server's QPs")?;
    let conn = Conn::create(&stack, &hello)?;
    session.send(&conn.endpoint(stack.mac()))?;
    let peer_mac = stack.neighbour(server.ip())?;
    conn.connect(&remote, peer_mac, server.ip(), &stack)?;
    before_ready(&conn)?;
    Ok(ClientSide {
        session,
        remote,
        stack,
        conn,
        hello,
    })
}

/// Connects, retrying while the server is not listening yet (both sides
/// may be started at the same moment).
fn connect_retrying(server: std::net::SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(&server, timeout) {
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Accepts `peers` clients on `args.listen`, each served by `serve` on a
/// thread of its own over one shared stack.
pub fn serve_clients(
    args: &PerfArgs,
    serve: impl Fn(&Stack, Session, Hello, IpAddr) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<()> {
    let addr = args.listen.expect("clap: --listen or --connect");
    let local_ip = if addr.ip().is_unspecified() {
        IpAddr::V4(first_ipv4(&args.iface)?)
    } else {
        addr.ip()
    };
    let listener = TcpListener::bind(addr).with_context(|| format!("listen on {addr}"))?;
    let stack = Stack::open(args, local_ip)?;
    eprintln!(
        "xroce: waiting for {} client(s) on {addr} ({} backend, path MTU {})",
        args.peers,
        stack.backend,
        stack.path_mtu.bytes()
    );
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for _ in 0..args.peers {
            let (stream, peer) = listener.accept().context("accept")?;
            let mut session = Session::new(stream, OOB_TIMEOUT)?;
            let hello: Hello = session.recv("a hello")?;
            check_hello(&hello)?;
            let (stack, serve) = (&stack, &serve);
            handles.push(s.spawn(move || serve(stack, session, hello, peer.ip())));
        }
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok(())
    })
}

/// The server's half of the exchange for one client: our connected QPs
/// and the client's endpoint (its QPs and memory).
pub fn server_connect(
    stack: &Stack,
    session: &mut Session,
    hello: &Hello,
    peer_ip: IpAddr,
) -> anyhow::Result<(Conn, Endpoint)> {
    if hello.mtu != stack.path_mtu.bytes() {
        bail!(
            "client uses path MTU {}, we use {}; pass the same --mtu on both sides",
            hello.mtu,
            stack.path_mtu.bytes()
        );
    }
    let conn = Conn::create(stack, hello)?;
    session.send(&conn.endpoint(stack.mac()))?;
    let remote: Endpoint = session.recv("the client's QPs")?;
    let peer_mac = stack.neighbour(peer_ip)?;
    conn.connect(&remote, peer_mac, peer_ip, stack)?;
    Ok((conn, remote))
}

/// Percentiles of latencies in nanoseconds, reported in microseconds.
pub fn percentiles(mut ns: Vec<u64>) -> serde_json::Value {
    ns.sort_unstable();
    let at = |q: f64| {
        if ns.is_empty() {
            0.0
        } else {
            let i = ((ns.len() as f64 - 1.0) * q).round() as usize;
            ns[i] as f64 / 1000.0
        }
    };
    let avg = if ns.is_empty() {
        0.0
    } else {
        ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0
    };
    serde_json::json!({
        "min": at(0.0), "p50": at(0.5), "p99": at(0.99), "p999": at(0.999),
        "max": at(1.0), "avg": avg,
    })
}
