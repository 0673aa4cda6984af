//! The processes of a workload (hidden subcommands, started by the
//! experiment in each host's namespace):
//!
//! - `xroce experiment workload-receiver`: one per receiver host; serves
//!   every sender on one xroce stack, checks every flow's data when its
//!   descriptor arrives and answers with an acknowledgement.
//! - `xroce experiment workload-sender`: one per sender host; connects to
//!   every receiver, then starts each of its flows at its scheduled time as
//!   one RDMA WRITE of the flow's size on an RC QP of its own (a pool of
//!   QPs per receiver, one flow per QP at a time), followed on the same QP
//!   by a SEND of the flow's descriptor (id, where, how long). With
//!   `--op read` only the descriptor: the receiver READs the data from the
//!   same place in the sender's arena into its own, checks it once the
//!   READ completed and then acknowledges (the sender's QP and region stay
//!   taken until that ack).
//!
//! Memory: per sender-receiver pair, an arena of `--arena` bytes (at least
//! the pair's largest flow) on both sides; a flow takes a region of it from
//! its start until the receiver acknowledged it (then it was checked and may
//! be overwritten). A flow that finds no idle QP or no room waits; the time
//! it waited is part of its completion time and reported
//! (`post_delay_us` in flows.csv).
//!
//! Both sides take their flows from the experiment's schedule.csv; the
//! sender writes a row to flows-s<i>.csv as each flow is acknowledged (the
//! progress bar counts them), the receiver a row to received-r<j>.csv as
//! each flow arrives.
//!
//! A sender whose stop file appears in the folder (`collective
//! --background`: the job ended) starts no more flows, waits for the
//! acknowledgements of those it started and ends as after its last flow:
//! the receivers check and count only the flows it started.

use std::{
    collections::{HashMap, VecDeque},
    io::Write,
    net::{IpAddr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use xroce::{
    cc::CcKind,
    connect::{self, ConnInfo, Role, Session},
    device::BackendKind,
    verbs::{
        CompletionQueue, MemoryRegion, Mtu, ProtectionDomain, QpInitAttr, QueuePair, RecvWr,
        SendWr, Wc, WcOpcode, WrOpcode,
    },
};

use super::flows::{self, Flow};
use crate::{
    experiment::{procs::stop_requested, sampler::monotonic_ns},
    perf::{
        conn::{check_wc, connect_qp, peer_mac, Peer, ALL_ACCESS, DEFAULT_QP_TIMEOUT},
        stack::{Stack, StackOptions},
    },
};

const MAGIC: &str = "xroce-workload/1";
/// Receive buffers per QP, and their size (descriptors and acks are small).
const RECV_SLOTS: usize = 8;
const RECV_LEN: usize = 64;
const OOB_TIMEOUT: Duration = Duration::from_secs(30);
/// Regions in an arena start at multiples of this.
const ALIGN: u64 = 64;
/// Sequential small WRITEs that measure a pair's base RTT (the minimum).
const PINGS: usize = 20;

/// Flags of both processes.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// Interface of this host
    #[arg(long)]
    pub iface: String,
    /// The experiment's schedule.csv
    #[arg(long)]
    pub schedule: PathBuf,
    /// This host's index among the senders (or receivers)
    #[arg(long)]
    pub index: usize,
    /// The experiment's folder (ready/start files, our CSVs)
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the flows' data pattern
    #[arg(long)]
    pub seed: u64,
    /// Sender: every receiver's exchange address, in receiver order
    #[arg(long, value_delimiter = ',')]
    pub receivers: Vec<SocketAddr>,
    /// Receiver: where the senders connect
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Receiver: how many senders connect
    #[arg(long, default_value_t = 1)]
    pub peers: usize,
    #[arg(long, default_value = "none", value_parser = crate::units::cc())]
    pub cc: CcKind,
    /// Line rate in bit/s the pacer and congestion control start from
    #[arg(long)]
    pub rate_bps: u64,
    /// Sender: QPs per receiver (at most; one flow per QP at a time)
    #[arg(long, default_value_t = 16)]
    pub qps: usize,
    /// Sender: bytes of flows in flight per receiver (at least the largest flow)
    #[arg(long, default_value_t = 64 << 20)]
    pub arena: u64,
    /// write or read (see `workload --op`)
    #[arg(long, default_value = "write", value_parser = ["write", "read"])]
    pub op: String,
    /// afxdp (the interface's AF_XDP sockets) or udp (the kernel's UDP
    /// sockets: beside a process that owns the AF_XDP sockets, or on an
    /// interface without xroce's XDP program)
    #[arg(long, default_value = "afxdp", value_parser = ["afxdp", "udp"])]
    pub backend: String,
}

/// Sender -> receiver: who we are and what to make.
#[derive(Serialize, Deserialize, Debug)]
struct Hello {
    magic: String,
    sender: usize,
    qps: usize,
    arena: u64,
}

/// Receiver -> sender.
#[derive(Serialize, Deserialize, Debug)]
struct Greeting {
    magic: String,
}

/// Sender -> receiver when every flow was acknowledged.
#[derive(Serialize, Deserialize, Debug)]
struct Done {
    flows: u64,
}

/// Receiver -> sender: what arrived from it.
#[derive(Serialize, Deserialize, Debug)]
struct Verdict {
    received: u64,
    errors: Vec<String>,
}

/// The sender's report beside its flows-s<i>.csv.
#[derive(Serialize, Deserialize, Debug, Default)]
pub struct SenderReport {
    /// Per receiver: the smallest round trip of a 64-byte WRITE, ns.
    pub base_rtt_ns: Vec<u64>,
    pub retransmits: u64,
    pub cnps: u64,
    /// Times a QP with a new message waited for room in the engine's
    /// device-wide in-flight budget.
    pub budget_waits: u64,
    pub path_mtu: u32,
}

pub fn sender_csv(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("flows-s{i}.csv"))
}
pub fn sender_json(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("sender{i}.json"))
}
pub fn receiver_csv(dir: &Path, j: usize) -> PathBuf {
    dir.join(format!("received-r{j}.csv"))
}
pub fn ready_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("ready-s{i}"))
}
pub fn start_file(dir: &Path) -> PathBuf {
    dir.join("start")
}
/// Sender `i`'s flows started per receiver (`n0,n1,...`), written once
/// every one was acknowledged: after a stop, what each receiver waits for.
pub fn started_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("started-s{i}"))
}
/// Its presence tells the senders to start no more flows.
pub fn stop_file(dir: &Path) -> PathBuf {
    dir.join("stop")
}

pub const SENDER_CSV_HEADER: &str = "flow,dst,size_bytes,start_ns,post_ns,done_ns,ack_ns,verified";
pub const RECEIVER_CSV_HEADER: &str = "flow,src,size_bytes,verified,t_ns";

// ------------------------------------------------------------- wr ids

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write = 0,
    Desc = 1,
    Recv = 2,
    Ping = 3,
}

/// kind (2 bits) | pair (14) | qp (16) | value (32).
fn wr_id(kind: Kind, pair: usize, qp: usize, value: u32) -> u64 {
    ((kind as u64) << 62)
        | ((pair as u64 & 0x3fff) << 48)
        | ((qp as u64 & 0xffff) << 32)
        | value as u64
}

fn split(id: u64) -> (Kind, usize, usize, u32) {
    let kind = match id >> 62 {
        0 => Kind::Write,
        1 => Kind::Desc,
        2 => Kind::Recv,
        _ => Kind::Ping,
    };
    (
        kind,
        ((id >> 48) & 0x3fff) as usize,
        ((id >> 32) & 0xffff) as usize,
        id as u32,
    )
}

// ------------------------------------------------------------- arena

/// First-fit allocator of one pair's arena (free ranges kept sorted and
/// merged).
#[derive(Debug)]
pub struct Arena {
    free: Vec<(u64, u64)>,
}

impl Arena {
    pub fn new(len: u64) -> Self {
        Arena {
            free: vec![(0, len)],
        }
    }

    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.div_ceil(ALIGN) * ALIGN;
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (off + len, l - len);
        }
        Some(off)
    }

    pub fn release(&mut self, off: u64, len: u64) {
        let len = len.div_ceil(ALIGN) * ALIGN;
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Merge with the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

// ------------------------------------------------------------- shared

/// QPs, arena MR and receive buffers of one sender-receiver pair.
struct PairConn {
    qps: Vec<QueuePair>,
    psns: Vec<u32>,
    arena: MemoryRegion,
    recv: MemoryRegion,
}

fn make_pair(
    stack: &Stack,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    qps: usize,
    arena: u64,
) -> anyhow::Result<PairConn> {
    let mut init = QpInitAttr::rc(cq);
    init.cap.max_send_wr = 64;
    init.cap.max_recv_wr = RECV_SLOTS as u32;
    init.cap.max_inline_data = RECV_LEN as u32;
    let qps = (0..qps)
        .map(|_| stack.device.create_qp(pd, &init))
        .collect::<Result<Vec<_>, _>>()
        .context("create RC QPs")?;
    let arena = pd
        .reg_mr(arena as usize, ALL_ACCESS)
        .with_context(|| format!("register a {arena}-byte arena"))?;
    let recv = pd
        .reg_mr(qps.len() * RECV_SLOTS * RECV_LEN, ALL_ACCESS)
        .context("register receive buffers")?;
    let mut rng = rand::rng();
    let psns = qps
        .iter()
        .map(|_| rng.random::<u32>() & 0xff_ffff)
        .collect();
    Ok(PairConn {
        qps,
        psns,
        arena,
        recv,
    })
}

impl PairConn {
    fn infos(&self, stack: &Stack) -> Vec<ConnInfo> {
        self.qps
            .iter()
            .zip(&self.psns)
            .map(|(qp, &psn)| ConnInfo {
                qpn: qp.qp_num(),
                psn,
                gid: stack.gid(),
                mac: stack.mac(),
                mtu: stack.path_mtu.bytes(),
                mr_addr: self.arena.addr(),
                rkey: self.arena.rkey(),
                mr_len: self.arena.len() as u64,
            })
            .collect()
    }

    /// Every QP to RTS towards the peer's; returns the path MTU used.
    fn connect(&self, stack: &Stack, theirs: &[ConnInfo], peer: IpAddr) -> anyhow::Result<Mtu> {
        if theirs.len() != self.qps.len() {
            bail!(
                "peer offered {} QPs, we have {}",
                theirs.len(),
                self.qps.len()
            );
        }
        let IpAddr::V4(ip) = peer else {
            bail!("peer {peer} is not IPv4");
        };
        let mac = peer_mac(stack, ip.into(), theirs[0].mac)?;
        let mtu = match Mtu::from_bytes(theirs[0].mtu) {
            Some(m) if m.bytes() < stack.path_mtu.bytes() => m,
            _ => stack.path_mtu,
        };
        for ((qp, &psn), r) in self.qps.iter().zip(&self.psns).zip(theirs) {
            connect_qp(
                qp,
                psn,
                mtu,
                16,
                DEFAULT_QP_TIMEOUT,
                r.qpn,
                r.psn,
                mac,
                ip.into(),
            )?;
        }
        Ok(mtu)
    }

    fn post_recv(&self, pair: usize, q: usize, slot: usize) -> anyhow::Result<()> {
        let off = (q * RECV_SLOTS + slot) * RECV_LEN;
        self.qps[q].post_recv(&RecvWr {
            wr_id: wr_id(Kind::Recv, pair, q, slot as u32),
            sg_list: vec![self.recv.sge(off, RECV_LEN)],
        })?;
        Ok(())
    }

    fn post_all_recvs(&self, pair: usize) -> anyhow::Result<()> {
        for q in 0..self.qps.len() {
            for s in 0..RECV_SLOTS {
                self.post_recv(pair, q, s)?;
            }
        }
        Ok(())
    }

    /// The message in receive slot `slot` of QP `q`, as u64 words.
    fn recv_words(&self, q: usize, slot: usize, n: usize) -> anyhow::Result<Vec<u64>> {
        let mut buf = vec![0u8; n * 8];
        // SAFETY: this slot's receive completed; it is reposted after this read.
        unsafe { self.recv.read((q * RECV_SLOTS + slot) * RECV_LEN, &mut buf) }?;
        Ok(buf
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }

    fn send_inline(&self, id: u64, q: usize, words: &[u64]) -> anyhow::Result<()> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.qps[q].post_send_inline(&SendWr::new(id, WrOpcode::Send, vec![]), &bytes)?;
        Ok(())
    }
}

fn open_stack(a: &NodeArgs, ip: IpAddr) -> anyhow::Result<Stack> {
    Stack::open_with(
        &StackOptions {
            iface: a.iface.clone(),
            backend: match a.backend.as_str() {
                "udp" => BackendKind::Udp,
                _ => BackendKind::AfXdp,
            },
            mtu: None,
            cc: a.cc,
            line_rate_bps: a.rate_bps,
            busy_poll: false,
            spin_after_activity: xroce::runtime::RuntimeConfig::default().spin_after_activity,
            stream_nap: xroce::runtime::RuntimeConfig::default().stream_nap,
        },
        ip,
    )
}

fn csv_writer(path: &Path, header: &str) -> anyhow::Result<std::io::BufWriter<std::fs::File>> {
    let mut w = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
    );
    writeln!(w, "{header}")?;
    w.flush()?;
    Ok(w)
}

// ------------------------------------------------------------- receiver

pub fn receiver(a: &NodeArgs) -> anyhow::Result<()> {
    let addr = a.listen.context("--listen is required")?;
    let schedule = flows::read_schedule(&a.schedule)?;
    let listener = TcpListener::bind(addr).with_context(|| format!("listen on {addr}"))?;
    let stack = open_stack(a, addr.ip())?;
    let out = Mutex::new(csv_writer(
        &receiver_csv(&a.out, a.index),
        RECEIVER_CSV_HEADER,
    )?);
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for _ in 0..a.peers {
            let (stream, _) = listener.accept().context("accept")?;
            let peer_addr = stream.peer_addr()?;
            let peer = Peer {
                session: Session::new(stream, Role::Server, OOB_TIMEOUT),
                addr: peer_addr,
            };
            let (stack, schedule, out) = (&stack, &schedule, &out);
            handles.push(s.spawn(move || serve(a, stack, peer, schedule, out)));
        }
        let mut errors = Vec::new();
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(format!("{e:#}")),
                Err(_) => errors.push("a connection thread panicked".into()),
            }
        }
        out.lock().expect("not poisoned").flush()?;
        if !errors.is_empty() {
            bail!("{}", errors.join("; "));
        }
        Ok(())
    })
}

fn serve(
    a: &NodeArgs,
    stack: &Stack,
    mut peer: Peer,
    schedule: &[Flow],
    out: &Mutex<std::io::BufWriter<std::fs::File>>,
) -> anyhow::Result<()> {
    let hello: Hello = peer.swap(
        &Greeting {
            magic: MAGIC.into(),
        },
        "greetings",
    )?;
    if hello.magic != MAGIC {
        bail!("peer speaks {:?}, not {MAGIC}", hello.magic);
    }
    if hello.qps == 0 || hello.qps > connect::MAX_QPS {
        bail!("sender asked for {} QPs", hello.qps);
    }
    let expected: HashMap<u32, &Flow> = schedule
        .iter()
        .filter(|f| f.src == hello.sender && f.dst == a.index)
        .map(|f| (f.id, f))
        .collect();
    let pd = stack.device.alloc_pd();
    let cq = stack
        .device
        .create_cq(hello.qps * (RECV_SLOTS + 64) + 64)
        .context("create CQ")?;
    let conn = make_pair(stack, &pd, &cq, hello.qps, hello.arena)?;
    let theirs = peer
        .session
        .exchange(&conn.infos(stack))
        .with_context(|| format!("exchanging QPs with {}", peer.addr))?;
    conn.connect(stack, &theirs, peer.addr.ip())?;
    conn.post_all_recvs(0)?;
    peer.sync(1)?;

    let read = a.op == "read";
    // --op read: the flows whose READ is on its way: (offset, length).
    let mut reading: HashMap<u32, (u64, u64)> = HashMap::new();
    let mut seen: HashMap<u32, u32> = HashMap::new();
    let mut errors = Vec::new();
    let mut wcs = [Wc::default(); 64];
    let mut chunk = vec![0u8; 64 << 10];
    // All of the sender's flows to us, or after a stop those it started.
    let mut want = expected.len();
    let (stop, started) = (stop_file(&a.out), started_file(&a.out, hello.sender));
    let mut stop_checked = Instant::now();
    while seen.len() < want {
        let n = cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            let (kind, _, q, value) = split(wc.wr_id);
            // A receiver's READs carry Kind::Write (it posts no WRITE).
            let what = match kind {
                Kind::Recv => "receive",
                Kind::Write => "flow READ",
                _ => "ack",
            };
            check_wc(wc, what)?;
            let (id, off, len) = if kind == Kind::Write && wc.opcode == WcOpcode::RdmaRead {
                let id = value;
                let Some((off, len)) = reading.remove(&id) else {
                    bail!("a READ completed for flow {id}, which was not being read");
                };
                (id, off, len)
            } else if kind == Kind::Recv && wc.opcode == WcOpcode::Recv {
                let d = conn.recv_words(q, value as usize, 3)?;
                conn.post_recv(0, q, value as usize)?;
                let (id, off, len) = (d[0] as u32, d[1], d[2]);
                let fits = expected.get(&id).is_some_and(|f| f.size == len)
                    && off + len <= conn.arena.len() as u64;
                if read && fits && !seen.contains_key(&id) && !reading.contains_key(&id) {
                    // The data is still at the sender: READ it into the
                    // same place here, then check it (below, on completion).
                    conn.qps[q]
                        .post_send(&SendWr::new(
                            wr_id(Kind::Write, 0, q, id),
                            WrOpcode::RdmaRead {
                                remote_addr: theirs[0].mr_addr + off,
                                rkey: theirs[0].rkey,
                            },
                            vec![conn.arena.sge(off as usize, len as usize)],
                        ))
                        .with_context(|| format!("post flow {id}'s READ"))?;
                    reading.insert(id, (off, len));
                    continue;
                }
                (id, off, len)
            } else {
                continue;
            };
            let t_ns = monotonic_ns();
            let check = match expected.get(&id) {
                None => Err(format!("flow {id} is not one of this sender's to us")),
                Some(f) if f.size != len => Err(format!("flow {id}: {len} bytes, not {}", f.size)),
                Some(_) if off + len > conn.arena.len() as u64 => {
                    Err(format!("flow {id}: region {off}+{len} outside the arena"))
                }
                Some(_) => verify(
                    &conn.arena,
                    flows::data_key(a.seed, id),
                    off,
                    len,
                    &mut chunk,
                ),
            };
            let count = seen.entry(id).or_insert(0);
            *count += 1;
            let check = if *count > 1 {
                Err(format!("flow {id} arrived {count} times"))
            } else {
                check
            };
            let ok = check.is_ok();
            if let Err(e) = check {
                errors.push(e);
            }
            {
                // Flushed per row: a receiver killed at a deadline still
                // tells what arrived.
                let mut out = out.lock().expect("not poisoned");
                writeln!(out, "{id},{},{len},{},{t_ns}", hello.sender, ok as u8)?;
                out.flush()?;
            }
            // The ack frees the region at the sender: after the check.
            conn.send_inline(wr_id(Kind::Desc, 0, q, id), q, &[id as u64, ok as u64])?;
        }
        if n == 0 {
            if stop_requested() {
                bail!("interrupted");
            }
            if stop_checked.elapsed() >= Duration::from_millis(2) && stop.exists() {
                stop_checked = Instant::now();
                if let Ok(text) = std::fs::read_to_string(&started) {
                    want = text
                        .split(',')
                        .nth(a.index)
                        .and_then(|n| n.trim().parse().ok())
                        .with_context(|| format!("{}: {text:?}", started.display()))?;
                }
            }
            stack.check_running()?;
            cq.wait(Duration::from_millis(5))?;
        }
    }
    // Wait for the sender's end (its last acks must reach it first).
    peer.session.set_timeout(Duration::from_secs(600));
    let done: Done = peer.recv("the end of the run")?;
    if done.flows != want as u64 {
        errors.push(format!(
            "the sender says {} flows, we expected {want}",
            done.flows,
        ));
    }
    peer.session.set_timeout(OOB_TIMEOUT);
    peer.send(
        &Verdict {
            received: seen.len() as u64,
            errors: errors.clone(),
        },
        "the verdict",
    )?;
    if !errors.is_empty() {
        bail!("from sender {}: {}", hello.sender, errors.join("; "));
    }
    Ok(())
}

/// Whether the arena holds flow `key`'s `len` bytes at `off`.
fn verify(
    arena: &MemoryRegion,
    key: u64,
    off: u64,
    len: u64,
    chunk: &mut [u8],
) -> Result<(), String> {
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        // SAFETY: the flow's WRITE was placed before its descriptor (RC
        // order) and the sender leaves the region alone until our ack.
        unsafe { arena.read((off + done) as usize, &mut chunk[..n]) }.map_err(|e| e.to_string())?;
        if !flows::matches(key, done, &chunk[..n]) {
            return Err(format!(
                "flow data differs from what was sent in bytes {done}..{}",
                done + n as u64
            ));
        }
        done += n as u64;
    }
    Ok(())
}

// ------------------------------------------------------------- sender

/// One of our flows on its way.
#[derive(Clone, Copy, Debug, Default)]
struct State {
    post_ns: Option<u64>,
    done_ns: Option<u64>,
    region: Option<(usize, u64)>,
}

struct Pair {
    /// Its receiver's index.
    index: usize,
    conn: PairConn,
    peer: Peer,
    idle: Vec<usize>,
    arena: Arena,
    remote_addr: u64,
    rkey: u32,
}

pub fn sender(a: &NodeArgs) -> anyhow::Result<()> {
    let schedule = flows::read_schedule(&a.schedule)?;
    let mine: Vec<Flow> = schedule
        .iter()
        .filter(|f| f.src == a.index)
        .copied()
        .collect();
    if a.receivers.is_empty() {
        bail!("--receivers is required");
    }
    let mut streams = Vec::new();
    for addr in &a.receivers {
        let s = connect::connect_retry(addr, Duration::from_secs(15))
            .with_context(|| format!("connect to receiver {addr}"))?;
        streams.push((s, *addr));
    }
    let local_ip = streams[0].0.local_addr()?.ip();
    let stack = open_stack(a, local_ip)?;
    let pd = stack.device.alloc_pd();
    let total_qps: usize = a.receivers.len() * a.qps.max(1);
    let cq = stack
        .device
        .create_cq(total_qps * (RECV_SLOTS + 64) + 64)
        .context("create CQ")?;
    let mut pairs = Vec::new();
    let mut mtu = stack.path_mtu;
    for (j, (stream, addr)) in streams.into_iter().enumerate() {
        let pair_flows: Vec<&Flow> = mine.iter().filter(|f| f.dst == j).collect();
        let qps = a.qps.min(pair_flows.len()).max(1);
        let largest = pair_flows.iter().map(|f| f.size).max().unwrap_or(0);
        let arena = a.arena.max(largest.div_ceil(ALIGN) * ALIGN).max(4096);
        let mut peer = Peer {
            session: Session::new(stream, Role::Client, OOB_TIMEOUT),
            addr,
        };
        let greeting: Greeting = peer.swap(
            &Hello {
                magic: MAGIC.into(),
                sender: a.index,
                qps,
                arena,
            },
            "greetings",
        )?;
        if greeting.magic != MAGIC {
            bail!("receiver {addr} speaks {:?}, not {MAGIC}", greeting.magic);
        }
        let conn = make_pair(&stack, &pd, &cq, qps, arena)?;
        let theirs = peer
            .session
            .exchange(&conn.infos(&stack))
            .with_context(|| format!("exchanging QPs with {addr}"))?;
        mtu = conn.connect(&stack, &theirs, addr.ip())?;
        conn.post_all_recvs(j)?;
        peer.sync(1)?;
        pairs.push(Pair {
            index: j,
            idle: (0..qps).rev().collect(),
            arena: Arena::new(arena),
            remote_addr: theirs[0].mr_addr,
            rkey: theirs[0].rkey,
            conn,
            peer,
        });
    }
    let before = stack.device.stats();
    let base_rtt_ns = pairs
        .iter()
        .enumerate()
        .map(|(j, p)| ping(&stack, &cq, p, j))
        .collect::<anyhow::Result<Vec<_>>>()?;

    // Ready; wait for the common start.
    std::fs::write(ready_file(&a.out, a.index), b"")?;
    let t0 = wait_for_start(&a.out)?;
    let mut csv = csv_writer(&sender_csv(&a.out, a.index), SENDER_CSV_HEADER)?;
    let index: HashMap<u32, usize> = mine.iter().enumerate().map(|(k, f)| (f.id, k)).collect();
    let mut state = vec![State::default(); mine.len()];
    let mut pending: VecDeque<usize> = VecDeque::new();
    let mut next = 0;
    let mut acked = 0;
    // Flows posted, and how many must be acknowledged before the end: all
    // of them, or those posted when the stop file appeared.
    let mut posted = 0;
    let mut total = mine.len();
    let stop = stop_file(&a.out);
    let mut stop_checked = Instant::now();
    let mut wcs = [Wc::default(); 64];
    while acked < total {
        let now = monotonic_ns().saturating_sub(t0);
        if total == mine.len() && stop_checked.elapsed() >= Duration::from_millis(2) {
            stop_checked = Instant::now();
            if stop.exists() {
                pending.clear();
                next = mine.len();
                total = posted;
                continue;
            }
        }
        while next < mine.len() && mine[next].start_ns <= now {
            pending.push_back(next);
            next += 1;
        }
        // In order of arrival, each flow that finds a QP and room.
        let mut k = 0;
        while k < pending.len() {
            let fi = pending[k];
            let f = mine[fi];
            let p = &mut pairs[f.dst];
            if !p.idle.is_empty() {
                if let Some(off) = p.arena.alloc(f.size) {
                    let q = p.idle.pop().expect("not empty");
                    post_flow(p, f, q, off, a.seed, a.op == "read")?;
                    state[fi].post_ns = Some(monotonic_ns().saturating_sub(t0));
                    state[fi].region = Some((q, off));
                    posted += 1;
                    pending.remove(k);
                    continue;
                }
            }
            k += 1;
        }
        let n = cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            let (kind, j, q, value) = split(wc.wr_id);
            match kind {
                Kind::Write => {
                    check_wc(wc, "flow WRITE")?;
                    let fi = index[&value];
                    state[fi].done_ns = Some(monotonic_ns().saturating_sub(t0));
                    pairs[j].idle.push(q);
                }
                Kind::Desc | Kind::Ping => check_wc(wc, "descriptor SEND")?,
                Kind::Recv => {
                    check_wc(wc, "ack receive")?;
                    let p = &mut pairs[j];
                    let w = p.conn.recv_words(q, value as usize, 2)?;
                    p.conn.post_recv(j, q, value as usize)?;
                    let (id, ok) = (w[0] as u32, w[1] == 1);
                    let fi = *index
                        .get(&id)
                        .with_context(|| format!("ack for flow {id}, not one of ours"))?;
                    let s = &mut state[fi];
                    let Some((_, off)) = s.region.take() else {
                        bail!("flow {id} acknowledged twice");
                    };
                    p.arena.release(off, mine[fi].size);
                    if a.op == "read" {
                        // The receiver has read it: the QP and the region
                        // are free, and the flow's data is where it goes.
                        s.done_ns = Some(monotonic_ns().saturating_sub(t0));
                        p.idle.push(q);
                    }
                    let f = mine[fi];
                    writeln!(
                        csv,
                        "{},{},{},{},{},{},{},{}",
                        f.id,
                        f.dst,
                        f.size,
                        f.start_ns,
                        s.post_ns.unwrap_or(0),
                        s.done_ns.unwrap_or(0),
                        monotonic_ns().saturating_sub(t0),
                        ok as u8
                    )?;
                    csv.flush()?;
                    acked += 1;
                }
            }
        }
        if n == 0 {
            if stop_requested() {
                bail!("interrupted");
            }
            stack.check_running()?;
            // The CQ's wait has millisecond steps (it wakes at once on a
            // completion): close to a start, sleep in short steps instead.
            let until_next = mine
                .get(next)
                .map_or(u64::MAX, |f| f.start_ns.saturating_sub(now));
            if until_next >= 2_000_000 {
                cq.wait(
                    Duration::from_nanos(until_next - 1_000_000).min(Duration::from_millis(5)),
                )?;
            } else {
                std::thread::sleep(Duration::from_nanos(until_next.min(100_000)));
            }
        }
    }
    let started: Vec<u64> = (0..pairs.len())
        .map(|j| {
            mine.iter()
                .zip(&state)
                .filter(|(f, s)| f.dst == j && s.post_ns.is_some())
                .count() as u64
        })
        .collect();
    let text: Vec<String> = started.iter().map(u64::to_string).collect();
    let tmp = a.out.join(format!("started-s{}.tmp", a.index));
    std::fs::write(&tmp, text.join(","))?;
    std::fs::rename(&tmp, started_file(&a.out, a.index))?;
    let mut errors = Vec::new();
    for (j, p) in pairs.iter_mut().enumerate() {
        let flows = started[j];
        p.peer.send(&Done { flows }, "the end of the run")?;
        let v: Verdict = p.peer.recv("the receiver's verdict")?;
        if v.received != flows {
            errors.push(format!(
                "receiver {j} got {} of our {flows} flows",
                v.received
            ));
        }
        errors.extend(v.errors.into_iter().map(|e| format!("receiver {j}: {e}")));
    }
    let after = stack.device.stats();
    let report = SenderReport {
        base_rtt_ns,
        retransmits: after.tx_retransmitted - before.tx_retransmitted,
        cnps: after.rx_cnps - before.rx_cnps,
        budget_waits: after.tx_budget_waits - before.tx_budget_waits,
        path_mtu: mtu.bytes(),
    };
    std::fs::write(
        sender_json(&a.out, a.index),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    Ok(())
}

/// Fills the flow's region with its data, then posts its WRITE (unless the
/// receiver READs it) and its descriptor on QP `q`.
fn post_flow(p: &Pair, f: Flow, q: usize, off: u64, seed: u64, read: bool) -> anyhow::Result<()> {
    let key = flows::data_key(seed, f.id);
    let mut buf = vec![0u8; (f.size as usize).min(1 << 20)];
    let mut done = 0u64;
    while done < f.size {
        let n = (f.size - done).min(buf.len() as u64) as usize;
        flows::fill(key, done, &mut buf[..n]);
        // SAFETY: the region is ours alone until the receiver's ack.
        unsafe { p.conn.arena.write((off + done) as usize, &buf[..n]) }?;
        done += n as u64;
    }
    if !read {
        p.conn.qps[q]
            .post_send(&SendWr::new(
                wr_id(Kind::Write, p.index, q, f.id),
                WrOpcode::RdmaWrite {
                    remote_addr: p.remote_addr + off,
                    rkey: p.rkey,
                },
                vec![p.conn.arena.sge(off as usize, f.size as usize)],
            ))
            .with_context(|| format!("post flow {}'s WRITE", f.id))?;
    }
    p.conn
        .send_inline(
            wr_id(Kind::Desc, p.index, q, f.id),
            q,
            &[f.id as u64, off, f.size],
        )
        .with_context(|| format!("post flow {}'s descriptor", f.id))
}

/// The smallest round trip of [`PINGS`] sequential 64-byte WRITEs on the
/// pair's first QP (into the arena's start, before any flow uses it).
fn ping(stack: &Stack, cq: &CompletionQueue, p: &Pair, j: usize) -> anyhow::Result<u64> {
    let mut best = u64::MAX;
    let mut wcs = [Wc::default(); 16];
    for _ in 0..PINGS {
        let t = monotonic_ns();
        p.conn.qps[0].post_send(&SendWr::new(
            wr_id(Kind::Ping, j, 0, 0),
            WrOpcode::RdmaWrite {
                remote_addr: p.remote_addr,
                rkey: p.rkey,
            },
            vec![p.conn.arena.sge(0, 64)],
        ))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        'wait: loop {
            let n = cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                check_wc(wc, "ping WRITE")?;
                if split(wc.wr_id).0 == Kind::Ping {
                    break 'wait;
                }
            }
            if Instant::now() > deadline {
                bail!("no answer to a 64-byte WRITE within 10 s");
            }
            stack.check_running()?;
            // Sleeps on the CQ's eventfd: spinning here would take the CPU
            // from the I/O thread that brings the answer.
            cq.wait(Duration::from_millis(10))?;
        }
        best = best.min(monotonic_ns() - t);
    }
    Ok(best)
}

/// Waits for the experiment's start file; returns its start time
/// (CLOCK_MONOTONIC ns, which every namespace shares).
fn wait_for_start(dir: &Path) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(text) = std::fs::read_to_string(start_file(dir)) {
            if let Ok(t0) = text.trim().parse::<u64>() {
                return Ok(t0);
            }
        }
        if stop_requested() {
            bail!("interrupted");
        }
        if Instant::now() > deadline {
            bail!("no start signal within 120 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_first_fit_and_merge() {
        let mut a = Arena::new(1024);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(200).unwrap();
        let z = a.alloc(300).unwrap();
        assert_eq!((x, y, z), (0, 128, 384));
        assert_eq!(a.alloc(1024), None);
        a.release(y, 200);
        assert_eq!(a.alloc(150), Some(128));
        a.release(128, 150);
        a.release(x, 100);
        a.release(z, 300);
        // Everything merged back into one range.
        assert_eq!(a.free, vec![(0, 1024)]);
        assert_eq!(a.alloc(1024), Some(0));
    }

    #[test]
    fn wr_ids_round_trip() {
        for (k, p, q, v) in [
            (Kind::Write, 0, 0, 0),
            (Kind::Desc, 3, 15, 77),
            (Kind::Recv, 0x3fff, 0xffff, u32::MAX),
            (Kind::Ping, 1, 2, 3),
        ] {
            assert_eq!(split(wr_id(k, p, q, v)), (k, p, q, v));
        }
    }
}
