//! One connection's verbs objects (PD, CQ, QPs, MR), the exchange that
//! connects them to the peer's, and the report both tools print.
//!
//! The exchange runs over [`xroce::connect::Session`]:
//!
//! 1. a blob each way: the client's [`Hello`] (what to run), the server's
//!    greeting (JSON; both carry [`MAGIC`]);
//! 2. [`Session::exchange`]: one [`ConnInfo`] per QP (QPN, PSN, GID, MAC,
//!    path MTU, MR address/rkey/length); each side connects its QPs;
//! 3. `sync(1)` once both have posted what the first message needs;
//! 4. after the run, [`Done`] (client -> server) and [`Verdict`]
//!    (server -> client) as blobs.

use std::{
    net::{IpAddr, SocketAddr, TcpListener},
    time::Duration,
};

use anyhow::{bail, Context};
use rand::Rng;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use xroce::{
    connect::{self, ConnInfo, Role, Session},
    engine::SrMode,
    verbs::{
        AccessFlags, AddressVector, CompletionQueue, MemoryRegion, Mtu, ProtectionDomain, QpAttr,
        QpAttrMask, QpInitAttr, QpState, QueuePair, RemoteQp, SendFlags, SendWr, UdAddress, Wc,
        WcStatus, WrOpcode,
    },
};

use super::{
    stack::{first_ipv4, Stack},
    PerfArgs, Recovery, RunLength, Transport, OOB_TIMEOUT,
};

pub const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Memory both sides register for message slots, at most.
const MR_BUDGET: usize = 256 << 20;

/// Identifies the protocol; bumped when messages change.
pub const MAGIC: &str = "xroce-perf/3";

/// perftest's DEF_QKEY, the Q_Key of both sides' UD QPs.
const QKEY: u32 = 0x1111_1111;
/// The GRH a UD receive buffer starts with (as in ibverbs).
const GRH: usize = 40;

/// How long the client may take to connect (the server may start later).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Client -> server: what to run.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Hello {
    pub magic: String,
    pub op: String,
    /// "bw" or "lat".
    pub mode: String,
    pub size: usize,
    pub qps: usize,
    /// Outstanding WRs per QP (and message slots per QP in the MRs).
    pub depth: usize,
    /// Messages per QP when the run has a count (lat always has one).
    pub iters: Option<u64>,
    /// Seconds when the run has a duration.
    pub seconds: Option<f64>,
    /// RC, UC or UD (-c).
    #[serde(default)]
    pub transport: String,
    /// Both sides send (-b).
    #[serde(default)]
    pub bidirectional: bool,
    /// Messages up to this size go inline (-I; 0: none).
    #[serde(default)]
    pub inline: u32,
    /// Another run (the next size of -a) follows on a new connection.
    #[serde(default)]
    pub more: bool,
    /// The client offers selective repeat (--selective-repeat); absent
    /// from older peers, which never get it.
    #[serde(default)]
    pub selective_repeat: bool,
}

impl Hello {
    /// How long the server may wait for the end of the run.
    pub fn run_timeout(&self) -> Duration {
        match self.seconds {
            Some(s) => OOB_TIMEOUT + Duration::from_secs_f64(s.max(0.0)),
            // A count of unknown duration: a client that dies closes the
            // connection and is noticed at once; this bounds a hung one.
            None => Duration::from_secs(3600),
        }
    }
}

/// Server -> client greeting.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Greeting {
    pub magic: String,
    pub backend: String,
    /// The server offers selective repeat (--selective-repeat).
    #[serde(default)]
    pub selective_repeat: bool,
}

/// Whether a connection runs selective repeat: RC, and both sides offered
/// it (each side computes the same from the hello and the greeting).
pub fn selective_repeat_agreed(hello: &Hello, greeting_offers: bool) -> bool {
    hello.selective_repeat
        && greeting_offers
        && Transport::from_name(&hello.transport).is_ok_and(|t| t == Transport::Rc)
}

/// The mode our RC QPs are set to under `recovery` (None: the engine's
/// default, Auto): On when both sides asked for it (`agreed`), Off for
/// go-back-N.
pub fn sr_mode(recovery: Recovery, agreed: bool) -> Option<SrMode> {
    match recovery {
        Recovery::Gbn => Some(SrMode::Off),
        Recovery::Sr if agreed => Some(SrMode::On),
        Recovery::Sr | Recovery::Auto => None,
    }
}

/// Client -> server when the run is over.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Done {
    /// Completed operations per QP.
    pub completed: Vec<u64>,
}

/// Server -> client: the server's check of what arrived.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Verdict {
    pub verified: bool,
    pub detail: String,
    pub cnps_sent: u64,
    pub ce_marked: u64,
    /// With -b: what the server sent, per QP, and in how many seconds.
    #[serde(default)]
    pub sent: Option<Vec<u64>>,
    #[serde(default)]
    pub sent_seconds: Option<f64>,
}

/// The out-of-band connection to the peer: a [`Session`] plus JSON
/// messages sent as blobs (one side sends, the other receives; the
/// receiver's blob is empty).
pub struct Peer {
    pub session: Session,
    pub addr: SocketAddr,
}

impl Peer {
    fn new(stream: std::net::TcpStream, role: Role) -> anyhow::Result<Peer> {
        let addr = stream.peer_addr().context("the peer's address")?;
        Ok(Peer {
            session: Session::new(stream, role, OOB_TIMEOUT),
            addr,
        })
    }

    fn blob(&mut self, ours: &[u8], what: &str) -> anyhow::Result<Vec<u8>> {
        self.session
            .exchange_blob(ours)
            .with_context(|| format!("{what} ({})", self.addr))
    }

    /// Sends `msg` to the peer, which calls [`recv`](Self::recv).
    pub fn send<T: Serialize>(&mut self, msg: &T, what: &str) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(msg)?;
        self.blob(&bytes, &format!("sending {what}"))?;
        Ok(())
    }

    /// Receives what the peer passes to [`send`](Self::send).
    pub fn recv<T: DeserializeOwned>(&mut self, what: &str) -> anyhow::Result<T> {
        let bytes = self.blob(&[], &format!("waiting for {what}"))?;
        decode(&bytes, what, self.addr)
    }

    /// Sends ours and receives theirs in one exchange (the greeting).
    pub fn swap<T: Serialize, U: DeserializeOwned>(
        &mut self,
        ours: &T,
        what: &str,
    ) -> anyhow::Result<U> {
        let bytes = serde_json::to_vec(ours)?;
        let theirs = match self.session.exchange_blob(&bytes) {
            Ok(t) => t,
            Err(e @ connect::ConnectError::Garbage { .. }) => bail!(
                "{} does not speak xroce's exchange ({e}); is it `xroce bench`/`xroce lat` of the \
                 same version? (perftest's ib_*_bw/ib_*_lat need --perftest)",
                self.addr
            ),
            Err(e) => return Err(e).with_context(|| format!("exchanging {what} ({})", self.addr)),
        };
        decode(&theirs, what, self.addr)
    }

    /// A barrier at step `n`.
    pub fn sync(&mut self, n: u32) -> anyhow::Result<()> {
        self.session
            .sync(n)
            .with_context(|| format!("waiting for {} at step {n}", self.addr))
    }
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str, peer: SocketAddr) -> anyhow::Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        let shown: String = String::from_utf8_lossy(bytes).chars().take(60).collect();
        anyhow::anyhow!(
            "{peer} sent garbage instead of {what} ({e}): {shown:?}; is it an xroce peer of the same version?"
        )
    })
}

fn check_magic(magic: &str) -> anyhow::Result<()> {
    if magic != MAGIC {
        bail!("peer speaks {magic:?}, not {MAGIC}: run the same xroce version on both sides");
    }
    Ok(())
}

/// Message slots in the MRs: `slots` per QP, each `size` bytes (at least 8,
/// so a slot can hold an atomic counter). Big messages get fewer slots than
/// WRs in flight; those WRs then share slots (same data, so checks hold).
pub struct Conn {
    pub _pd: ProtectionDomain,
    /// Send completions (and receive ones but with -b).
    pub cq: CompletionQueue,
    /// Receive completions: `cq` itself but with -b, where a thread of
    /// its own takes them.
    pub rcq: CompletionQueue,
    pub transport: Transport,
    pub qps: Vec<QueuePair>,
    pub mr: MemoryRegion,
    pub psns: Vec<u32>,
    pub slot_len: usize,
    pub slots: usize,
    /// Where what the peer sends lands: past our own slots with -b (both
    /// sides write at once), else on them.
    pub inbound: usize,
    /// Bytes before a received message in its slot: UD's GRH.
    pub grh: usize,
    /// Messages up to this size are sent inline.
    pub inline: usize,
    /// The path MTU the QPs run (the smaller of both sides'), once connected.
    pub mtu: Mtu,
    /// How our RC QPs recover loss: forced on when both sides asked for
    /// it ([`selective_repeat_agreed`]), off for `--recovery gbn`, else
    /// the engine's default (Auto: agreed in band).
    pub sr_mode: Option<SrMode>,
    /// Local ACK timeout of our QPs (--qp-timeout; each side its own).
    pub qp_timeout: u8,
}

/// Slots per QP for a run (both sides compute it from the hello).
pub fn slots_for(size: usize, qps: usize, depth: usize) -> usize {
    let per_qp = MR_BUDGET / qps.max(1) / size.max(8);
    depth.min(per_qp.max(2))
}

/// The peer's memory as the exchange told it.
#[derive(Clone, Debug)]
pub struct Remote {
    pub mr_addr: u64,
    pub rkey: u32,
    /// UD: where each QP's sends go.
    pub ud: Vec<UdAddress>,
}

impl Conn {
    pub fn create(stack: &Stack, hello: &Hello) -> anyhow::Result<Conn> {
        let transport = Transport::from_name(&hello.transport)?;
        let pd = stack.device.alloc_pd();
        let cq = stack
            .device
            .create_cq(hello.qps * hello.depth * 2 + 64)
            .context("create CQ")?;
        let rcq = if hello.bidirectional {
            stack
                .device
                .create_cq(hello.qps * hello.depth + 64)
                .context("create CQ")?
        } else {
            cq.clone()
        };
        let mut init = QpInitAttr::rc(&cq);
        init.qp_type = transport.qp_type();
        init.recv_cq = rcq.clone();
        init.cap.max_send_wr = hello.depth as u32;
        init.cap.max_recv_wr = hello.depth as u32;
        if hello.inline > 0 {
            init.cap.max_inline_data = hello.inline;
        }
        let qps = (0..hello.qps)
            .map(|_| stack.device.create_qp(&pd, &init))
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("create {} QP", transport.name()))?;
        let grh = if transport == Transport::Ud { GRH } else { 0 };
        let slot_len = hello.size.max(8) + grh;
        let slots = slots_for(hello.size, hello.qps, hello.depth.max(2));
        let region = hello.qps * slots * slot_len;
        let inbound = if hello.bidirectional { region } else { 0 };
        let mr = pd
            .reg_mr(region + inbound, ALL_ACCESS)
            .context("register MR")?;
        let mut rng = rand::rng();
        let psns = (0..hello.qps)
            .map(|_| rng.random::<u32>() & 0xff_ffff)
            .collect();
        Ok(Conn {
            _pd: pd,
            cq,
            rcq,
            transport,
            qps,
            mr,
            psns,
            slot_len,
            slots,
            inbound,
            grh,
            inline: hello.inline as usize,
            mtu: stack.path_mtu,
            sr_mode: None,
            qp_timeout: DEFAULT_QP_TIMEOUT,
        })
    }

    /// Our slot `slot` of QP `qp`: what we send from (and READ into
    /// without -b).
    pub fn slot_offset(&self, qp: usize, slot: usize) -> usize {
        (qp * self.slots + slot) * self.slot_len
    }

    /// Where the peer's message for slot `slot` of QP `qp` lands in our
    /// memory (a receive buffer starts here; its data `grh` later).
    pub fn inbound_offset(&self, qp: usize, slot: usize) -> usize {
        self.inbound + self.slot_offset(qp, slot)
    }

    /// Posts `wr` (see [`send_wr`](Self::send_wr)) on QP `q`.
    pub fn post(&self, q: usize, wr: &SendWr) -> anyhow::Result<()> {
        self.qps[q].post_send(wr)?;
        Ok(())
    }

    /// A WR of `opcode` with `len` bytes from our offset `local` for QP
    /// `q`: signaled, inline when -I allows, to the peer's UD QP on UD.
    pub fn send_wr(
        &self,
        remote: &Remote,
        q: usize,
        wr_id: u64,
        opcode: WrOpcode,
        local: usize,
        len: usize,
    ) -> SendWr {
        let mut wr = SendWr::new(wr_id, opcode, vec![self.mr.sge(local, len)]);
        if len <= self.inline && matches!(opcode, WrOpcode::Send | WrOpcode::RdmaWrite { .. }) {
            wr.flags |= SendFlags::INLINE;
        }
        if let Some(ud) = remote.ud.get(q) {
            wr.ud = Some(*ud);
        }
        wr
    }

    /// What the peer needs to know about our QPs and memory.
    pub fn infos(&self, stack: &Stack) -> Vec<ConnInfo> {
        self.qps
            .iter()
            .zip(&self.psns)
            .map(|(qp, &psn)| ConnInfo {
                qpn: qp.qp_num(),
                psn,
                gid: stack.gid(),
                mac: stack.mac(),
                mtu: stack.path_mtu.bytes(),
                mr_addr: self.mr.addr(),
                rkey: self.mr.rkey(),
                mr_len: self.mr.len() as u64,
            })
            .collect()
    }

    /// Brings every QP to RTS towards the peer's matching QP, at the
    /// smaller of both path MTUs. The peer's address is its GID's (the TCP
    /// peer's if the GID is not IPv4).
    pub fn connect(
        &mut self,
        remote: &[ConnInfo],
        tcp_peer: IpAddr,
        stack: &Stack,
    ) -> anyhow::Result<Remote> {
        if remote.len() != self.qps.len() {
            bail!(
                "peer offered {} QPs, we have {}",
                remote.len(),
                self.qps.len()
            );
        }
        let dest_ip = match IpAddr::from(remote[0].gid) {
            IpAddr::V4(v4) if v4.is_unspecified() => tcp_peer,
            IpAddr::V6(v6) if v6.is_unspecified() => tcp_peer,
            a => a,
        };
        let peer_mac = peer_mac(stack, dest_ip, remote[0].mac)?;
        let theirs = Mtu::from_bytes(remote[0].mtu).unwrap_or(Mtu::Mtu1024);
        self.mtu = if theirs.bytes() < stack.path_mtu.bytes() {
            theirs
        } else {
            stack.path_mtu
        };
        let mut ud = Vec::new();
        for ((qp, &psn), r) in self.qps.iter().zip(&self.psns).zip(remote) {
            if self.transport == Transport::Ud {
                ud_ready(qp, psn)?;
                ud.push(UdAddress {
                    av: AddressVector {
                        dest_mac: peer_mac,
                        dest_ip,
                        ..Default::default()
                    },
                    remote_qpn: r.qpn,
                    remote_qkey: QKEY,
                });
            } else {
                connect_qp(
                    qp,
                    psn,
                    self.mtu,
                    16,
                    self.qp_timeout,
                    r.qpn,
                    r.psn,
                    peer_mac,
                    dest_ip,
                )?;
                if let Some(mode) = self.sr_mode.filter(|_| self.transport == Transport::Rc) {
                    // Connected and idle; the peer does the same before
                    // the sync that lets either side post.
                    qp.set_selective_repeat(mode).with_context(|| {
                        format!("selective repeat {mode} on QP {:#x}", qp.qp_num())
                    })?;
                }
            }
        }
        Ok(Remote {
            mr_addr: remote[0].mr_addr,
            rkey: remote[0].rkey,
            ud,
        })
    }
}

/// The MAC of `ip` on our link; the one the peer announced if the
/// neighbour table has none (same link, ARP filtered).
pub fn peer_mac(stack: &Stack, ip: IpAddr, announced: [u8; 6]) -> anyhow::Result<[u8; 6]> {
    match stack.neighbour(ip) {
        Ok(mac) => Ok(mac),
        Err(_) if announced != [0; 6] => Ok(announced),
        Err(e) => Err(e),
    }
}

/// The local ACK timeout the tools' QPs run by default: 4.096 us * 2^14
/// = 67 ms; with six retries a dead peer shows up as RETRY_EXC_ERR in
/// about half a second.
pub const DEFAULT_QP_TIMEOUT: u8 = 14;

/// RESET -> RTS for one RC QP, with the retries all tools use and local
/// ACK timeout `timeout` ([`DEFAULT_QP_TIMEOUT`] unless asked).
#[allow(clippy::too_many_arguments)]
pub fn connect_qp(
    qp: &QueuePair,
    sq_psn: u32,
    mtu: Mtu,
    max_rd_atomic: u8,
    timeout: u8,
    dest_qpn: u32,
    rq_psn: u32,
    dest_mac: [u8; 6],
    dest_ip: IpAddr,
) -> anyhow::Result<()> {
    let local = QpAttr {
        qp_access_flags: ALL_ACCESS,
        path_mtu: mtu,
        sq_psn,
        timeout,
        retry_cnt: 6,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic,
        max_dest_rd_atomic: 16,
        ..Default::default()
    };
    let remote_qp = RemoteQp {
        qpn: dest_qpn,
        psn: rq_psn,
        av: AddressVector {
            dest_mac,
            dest_ip,
            ..Default::default()
        },
    };
    qp.connect(&local, &remote_qp)
        .with_context(|| format!("connect QP {:#x} to {:#x}", qp.qp_num(), dest_qpn))
}

/// RESET -> RTS for one UD QP (Q_Key [`QKEY`]); the destination goes
/// in each send.
fn ud_ready(qp: &QueuePair, sq_psn: u32) -> anyhow::Result<()> {
    let mut a = QpAttr {
        qkey: QKEY,
        sq_psn,
        ..Default::default()
    };
    let steps = [
        (
            QpState::Init,
            QpAttrMask::STATE | QpAttrMask::QKEY | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT,
        ),
        (QpState::Rtr, QpAttrMask::STATE),
        (QpState::Rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN),
    ];
    for (state, mask) in steps {
        a.qp_state = state;
        qp.modify(&a, mask)
            .with_context(|| format!("UD QP {:#x} to {state:?}", qp.qp_num()))?;
    }
    Ok(())
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
pub struct ClientSide<'a> {
    pub peer: Peer,
    /// The server's memory.
    pub remote: Remote,
    pub stack: &'a Stack,
    pub conn: Conn,
    pub hello: Hello,
}

/// One run of the client: its size, and whether another follows (-a).
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub size: usize,
    pub more: bool,
}

/// Everything up to the server's "ready": TCP, stack (opened by the first
/// run, kept for the next ones in `stack`), exchange, QPs at RTS, then
/// `before_ready` (e.g. posting receives before the first message).
pub fn client_setup_until_ready<'a>(
    args: &PerfArgs,
    stack: &'a mut Option<Stack>,
    mode: &str,
    run: Run,
    depth: usize,
    length: RunLength,
    before_ready: impl FnOnce(&Conn) -> anyhow::Result<()>,
) -> anyhow::Result<ClientSide<'a>> {
    let size = run.size;
    let server = args.connect.expect("clap: --listen or --connect");
    // Retries while the server is not listening yet (both sides may be
    // started at the same moment).
    let stream = connect::connect_retry(server, CONNECT_TIMEOUT).with_context(|| {
        format!("connect to {server}; is `xroce {mode} --listen` running there?")
    })?;
    let local_ip = stream.local_addr()?.ip();
    let mut peer = Peer::new(stream, Role::Client)?;
    if stack.is_none() {
        *stack = Some(Stack::open(args, local_ip)?);
    }
    let stack: &'a Stack = stack.as_ref().expect("opened above");
    let (iters, seconds) = match length {
        RunLength::Iters(n) => (Some(n), None),
        RunLength::Duration(d) => (None, Some(d.as_secs_f64())),
    };
    let hello = Hello {
        magic: MAGIC.into(),
        op: args.op.name().into(),
        mode: mode.into(),
        size,
        qps: args.qps,
        depth,
        iters,
        seconds,
        transport: args.connection.name().into(),
        bidirectional: args.bidirectional,
        inline: args.inline_size.unwrap_or(0),
        more: run.more,
        selective_repeat: args.recovery() == Recovery::Sr,
    };
    let greeting: Greeting = peer.swap(&hello, "greetings")?;
    check_magic(&greeting.magic)?;
    let mut conn = Conn::create(stack, &hello)?;
    let agreed = selective_repeat_agreed(&hello, greeting.selective_repeat);
    conn.sr_mode = sr_mode(args.recovery(), agreed);
    conn.qp_timeout = args.qp_timeout;
    if hello.selective_repeat && !agreed {
        eprintln!("xroce: the server did not ask for selective repeat: agreeing in band (auto)");
    }
    if conn.transport == Transport::Ud && size > stack.path_mtu.bytes() as usize {
        bail!(
            "-c UD: a message is at most one path MTU ({} bytes); use --size {} or less",
            stack.path_mtu.bytes(),
            stack.path_mtu.bytes()
        );
    }
    let infos = peer
        .session
        .exchange(&conn.infos(stack))
        .with_context(|| format!("exchanging QPs with {server}"))?;
    let remote = conn.connect(&infos, server.ip(), stack)?;
    before_ready(&conn)?;
    peer.sync(1)?;
    Ok(ClientSide {
        peer,
        remote,
        stack,
        conn,
        hello,
    })
}

/// What the server's per-client function gets.
pub struct ServerSide<'a> {
    pub stack: &'a Stack,
    pub peer: Peer,
    pub hello: Hello,
    /// How our RC QPs recover loss (see [`Conn::sr_mode`]).
    pub sr_mode: Option<SrMode>,
    /// --hold: keep the QPs after the run until stdin ends.
    pub hold: bool,
    /// --qp-timeout.
    pub qp_timeout: u8,
}

/// Accepts `peers` clients on `args.listen`, each served by `serve` on a
/// thread of its own over one shared stack.
pub fn serve_clients(
    args: &PerfArgs,
    serve: impl Fn(ServerSide<'_>) -> anyhow::Result<()> + Sync,
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
    let greeting = Greeting {
        magic: MAGIC.into(),
        backend: stack.backend.into(),
        selective_repeat: args.recovery() == Recovery::Sr,
    };
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        // A client running several sizes (-a) comes back for each.
        let mut left = args.peers;
        while left > 0 {
            let (stream, _) = listener.accept().context("accept")?;
            let mut peer = Peer::new(stream, Role::Server)?;
            let hello: Hello = peer.swap(&greeting, "greetings")?;
            check_magic(&hello.magic)?;
            if hello.qps == 0 || hello.depth == 0 || hello.qps > connect::MAX_QPS {
                bail!("peer asked for {} QPs of depth {}", hello.qps, hello.depth);
            }
            if !hello.more {
                left -= 1;
            }
            let stack = &stack;
            let serve = &serve;
            let sr_mode = sr_mode(
                args.recovery(),
                selective_repeat_agreed(&hello, greeting.selective_repeat),
            );
            handles.push(s.spawn(move || {
                serve(ServerSide {
                    stack,
                    peer,
                    hello,
                    sr_mode,
                    hold: args.hold,
                    qp_timeout: args.qp_timeout,
                })
            }));
        }
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok(())
    })
}

/// The server's half of the exchange for one client: our connected QPs
/// and the client's memory.
pub fn server_connect(side: &mut ServerSide<'_>) -> anyhow::Result<(Conn, Remote)> {
    let mut conn = Conn::create(side.stack, &side.hello)?;
    conn.sr_mode = side.sr_mode;
    conn.qp_timeout = side.qp_timeout;
    let addr = side.peer.addr;
    let infos = side
        .peer
        .session
        .exchange(&conn.infos(side.stack))
        .with_context(|| format!("exchanging QPs with {addr}"))?;
    let remote = conn.connect(&infos, addr.ip(), side.stack)?;
    Ok((conn, remote))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(transport: &str, sr: bool) -> Hello {
        Hello {
            magic: MAGIC.into(),
            op: "write".into(),
            mode: "bw".into(),
            size: 65536,
            qps: 1,
            depth: 128,
            iters: Some(10),
            seconds: None,
            transport: transport.into(),
            bidirectional: false,
            inline: 0,
            more: false,
            selective_repeat: sr,
        }
    }

    #[test]
    fn recovery_sets_off_forces_on_when_agreed_and_else_leaves_auto() {
        assert_eq!(sr_mode(Recovery::Gbn, false), Some(SrMode::Off));
        assert_eq!(sr_mode(Recovery::Gbn, true), Some(SrMode::Off));
        assert_eq!(sr_mode(Recovery::Sr, true), Some(SrMode::On));
        assert_eq!(sr_mode(Recovery::Sr, false), None);
        assert_eq!(sr_mode(Recovery::Auto, false), None);
    }

    #[test]
    fn selective_repeat_only_when_both_offer_it_on_rc() {
        assert!(selective_repeat_agreed(&hello("RC", true), true));
        assert!(!selective_repeat_agreed(&hello("RC", true), false));
        assert!(!selective_repeat_agreed(&hello("RC", false), true));
        assert!(!selective_repeat_agreed(&hello("UC", true), true));
        assert!(!selective_repeat_agreed(&hello("UD", true), true));
    }

    #[test]
    fn a_peer_without_the_field_never_gets_it() {
        // What an xroce perf tool from before selective repeat sends.
        let mut old = serde_json::to_value(hello("RC", true)).unwrap();
        old.as_object_mut().unwrap().remove("selective_repeat");
        let h: Hello = serde_json::from_value(old).unwrap();
        assert!(!selective_repeat_agreed(&h, true));
        let g: Greeting =
            serde_json::from_str(r#"{"magic":"xroce-perf/3","backend":"afxdp"}"#).unwrap();
        assert!(!g.selective_repeat);
        assert!(!selective_repeat_agreed(
            &hello("RC", true),
            g.selective_repeat
        ));
    }
}
