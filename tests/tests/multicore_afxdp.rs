//! One device over two I/O threads (issue 13, goal 6): on each end of a
//! veth pair with 2 queues, a `ShardedRuntime` of 2 shards, each with its
//! own engine (QPN block 0 or 1), its own thread and the AF_XDP socket of
//! its own queue. 4 RC QPs stream 64 KiB WRITEs at once, every byte
//! checked; the XDP program's per-queue counters show the frames spread
//! over both RX queues. The same over the UDP backend: a socket per shard
//! on its block's port, the XDP program moving frames to it.

use std::time::{Duration, Instant};

use xroce::{
    device::BackendKind,
    engine::EngineConfig,
    runtime::{
        shards::{shard_of_qpn, HandoffStats, ShardedConfig, ShardedDevice},
        RuntimeConfig,
    },
    verbs::{
        AccessFlags, AddressVector, CompletionQueue, Device, MemoryRegion, Mtu, QpAttr, QpInitAttr,
        QueuePair, RemoteQp, SendWr, Wc, WcStatus, WrOpcode,
    },
    xdp::rx_queue_counters,
};
use xroce_common::RxQueueCounters;
use xroce_tests::{in_netns, require_root, VethPair};

const SHARDS: usize = 2;
const QPS: usize = 4;
const MSG: usize = 64 * 1024;
const MSGS: usize = 32;
const PATH_MTU: Mtu = Mtu::Mtu2048;

/// One end: a sharded device in its namespace.
struct Side {
    dev: Option<ShardedDevice>,
    devices: Vec<Device>,
    cfg: EngineConfig,
    ns: String,
    iface: String,
}

impl Side {
    /// Opens `iface` in namespace `ns` with SHARDS I/O threads over AF_XDP
    /// (the XDP program attached, blocks 0..SHARDS steered to the sockets,
    /// one queue each) or, `udp`, a UDP socket per shard.
    fn open(ns: &str, iface: &str, udp: bool) -> Side {
        let (ns_name, if_name) = (ns.to_string(), iface.to_string());
        in_netns(ns, move || {
            assert_eq!(
                xroce::io::afxdp::rx_queue_count(&if_name),
                SHARDS as u32,
                "{if_name}: RX queues"
            );
            let dev = ShardedDevice::open(
                &if_name,
                ShardedConfig {
                    shards: SHARDS,
                    backend: if udp {
                        BackendKind::Udp
                    } else {
                        BackendKind::AfXdp
                    },
                    engine: EngineConfig::default(),
                    path_mtu: PATH_MTU.bytes(),
                    runtime: RuntimeConfig::default(),
                },
            )
            .unwrap_or_else(|e| panic!("{if_name}: {SHARDS} I/O threads: {e}"));
            assert_eq!(dev.base_block, 0, "a fresh device: blocks from 0");
            assert_eq!(dev.backend, if udp { "udp" } else { "afxdp" });
            let cfg = dev.devices[0].lock().config().clone();
            Side {
                devices: dev.devices.clone(),
                dev: Some(dev),
                cfg,
                ns: ns_name,
                iface: if_name,
            }
        })
    }

    fn queues(&self) -> Vec<RxQueueCounters> {
        let iface = self.iface.clone();
        in_netns(&self.ns, move || {
            rx_queue_counters(&iface).expect("per-queue XDP counters")
        })
    }

    /// Stops the threads and leaves the device (detaching the program,
    /// from its namespace); each shard's backend counters.
    fn close(mut self) -> (HandoffStats, Vec<xroce::io::IoStats>) {
        let dev = self.dev.take().expect("open");
        let handed = dev.handoff_stats();
        assert!(
            dev.is_running(),
            "{}: a shard's I/O thread stopped",
            self.iface
        );
        let io = in_netns(&self.ns, move || dev.stop()).expect("the shards' I/O");
        (handed, io)
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let dev = self.dev.take();
        let ns = self.ns.clone();
        let _ = std::thread::spawn(move || {
            if xroce_netns::enter(&ns).is_ok() {
                drop(dev);
            }
        })
        .join();
    }
}

struct End {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
}

fn end(dev: &Device, data: &[u8]) -> End {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(256).unwrap();
    let qp = dev.create_qp(&pd, &QpInitAttr::rc(&cq)).unwrap();
    let mr = pd
        .reg_mr_with(data, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    End { qp, cq, mr }
}

fn connect(x: &End, x_cfg: &EngineConfig, y: &End, y_cfg: &EngineConfig) {
    let attr = QpAttr {
        qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        path_mtu: PATH_MTU,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..Default::default()
    };
    for (a, b, b_cfg) in [(x, y, y_cfg), (y, x, x_cfg)] {
        a.qp.connect(
            &attr,
            &RemoteQp {
                qpn: b.qp.qp_num(),
                psn: 0,
                av: AddressVector {
                    dest_mac: b_cfg.mac,
                    dest_ip: b_cfg.ip.into(),
                    ..Default::default()
                },
            },
        )
        .unwrap();
    }
}

fn pattern(qp: usize) -> Vec<u8> {
    (0..MSG * MSGS)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(qp as u32 * 977) as u8
        })
        .collect()
}

/// MSGS WRITEs of MSG bytes on every pair at once, 8 outstanding per QP;
/// every completion and byte checked.
fn write_all(pairs: &[(End, End)]) {
    let mut posted = vec![0usize; pairs.len()];
    let mut done = vec![0usize; pairs.len()];
    let mut wc = vec![Wc::default(); 64];
    let deadline = Instant::now() + Duration::from_secs(40);
    while done.iter().any(|&d| d < MSGS) {
        let mut idle = true;
        for (p, (a, b)) in pairs.iter().enumerate() {
            while posted[p] < MSGS && posted[p] - done[p] < 8 {
                let off = posted[p] * MSG;
                let wr = SendWr::new(
                    posted[p] as u64,
                    WrOpcode::RdmaWrite {
                        remote_addr: b.mr.addr() + off as u64,
                        rkey: b.mr.rkey(),
                    },
                    vec![a.mr.sge(off, MSG)],
                );
                a.qp.post_send(&wr).unwrap();
                posted[p] += 1;
            }
            let n = a.cq.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success, "QP pair {p}: {c:?}");
            }
            done[p] += n;
            idle &= n == 0;
        }
        if idle {
            assert!(
                Instant::now() < deadline,
                "WRITEs done per QP after 40 s: {done:?} of {MSGS}"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    for (p, (_, b)) in pairs.iter().enumerate() {
        // SAFETY: every WRITE into it has completed.
        let got = unsafe { b.mr.to_vec(0, MSG * MSGS) }.unwrap();
        if let Some(at) = got.iter().zip(pattern(p)).position(|(g, d)| *g != d) {
            panic!("QP pair {p}: data differs from byte {at}");
        }
    }
}

/// Runs the 4 QPs; `crossed`: a's QP on shard i talks to b's QP on shard
/// 1 - i (every frame lands on the other shard's queue and is handed over).
fn run(crossed: bool, udp: bool) -> (HandoffStats, HandoffStats, Vec<RxQueueCounters>) {
    require_root();
    let pair = VethPair::with_queues(3500, SHARDS as u32);
    let a = Side::open(&pair.a.name, &pair.if_a, udp);
    let b = Side::open(&pair.b.name, &pair.if_b, udp);
    assert_eq!((a.cfg.ip, b.cfg.ip), (pair.addr_a, pair.addr_b));
    let zero = vec![0u8; MSG * MSGS];
    let pairs: Vec<(End, End)> = (0..QPS)
        .map(|q| {
            let (sa, sb) = (q % SHARDS, (q + usize::from(crossed)) % SHARDS);
            let x = end(&a.devices[sa], &pattern(q));
            let y = end(&b.devices[sb], &zero);
            assert_eq!(shard_of_qpn(x.qp.qp_num(), 0, SHARDS), Some(sa));
            assert_eq!(shard_of_qpn(y.qp.qp_num(), 0, SHARDS), Some(sb));
            connect(&x, &a.cfg, &y, &b.cfg);
            (x, y)
        })
        .collect();
    let before = b.queues();
    let t0 = Instant::now();
    write_all(&pairs);
    let secs = t0.elapsed().as_secs_f64();
    let after = b.queues();
    let queues: Vec<RxQueueCounters> = (0..SHARDS)
        .map(|q| RxQueueCounters {
            frames: after[q].frames - before[q].frames,
            bytes: after[q].bytes - before[q].bytes,
            redirected: after[q].redirected - before[q].redirected,
            passed: after[q].passed - before[q].passed,
        })
        .collect();
    drop(pairs);
    let (ha, io_a) = a.close();
    let (hb, io_b) = b.close();
    eprintln!(
        "crossed={crossed} udp={udp}: {QPS} QPs x {MSGS} x {} KiB in {secs:.2} s ({:.2} Gb/s); b's RX \
         queues {queues:?}; handed over a {ha:?} b {hb:?}; shards' I/O a {io_a:?} b {io_b:?}",
        MSG / 1024,
        (QPS * MSGS * MSG) as f64 * 8.0 / secs / 1e9
    );
    // Each shard's socket received and sent: both threads carried traffic.
    for (side, io) in [("a", &io_a), ("b", &io_b)] {
        for (s, st) in io.iter().enumerate() {
            assert!(
                st.rx_frames > 0 && st.tx_frames > 0,
                "{side} shard {s}: {st:?}"
            );
        }
    }
    (ha, hb, queues)
}

/// The data frames of 2 QPs (path MTU 2048), the least each queue sees.
const PER_QUEUE: u64 = (2 * MSGS * MSG / 2048) as u64;

#[test]
fn four_qps_on_two_threads_spread_over_both_queues() {
    let (ha, hb, queues) = run(false, false);
    for (q, c) in queues.iter().enumerate() {
        assert!(
            c.redirected >= PER_QUEUE,
            "queue {q} redirected {} frames, fewer than 2 QPs' {PER_QUEUE}: {queues:?}",
            c.redirected
        );
    }
    // QPs paired shard by shard: each frame arrives on its owner's queue.
    assert_eq!(ha.handed + hb.handed, 0, "a {ha:?} b {hb:?}");
}

#[test]
fn qps_paired_across_shards_are_handed_over() {
    let (ha, hb, queues) = run(true, false);
    for (q, c) in queues.iter().enumerate() {
        assert!(c.redirected >= PER_QUEUE, "queue {q}: {queues:?}");
    }
    // Every data frame lands on the other shard's queue on b, every ACK
    // on a's.
    assert!(hb.handed >= QPS as u64 * PER_QUEUE / 2, "b {hb:?}");
    assert!(ha.handed > 0, "a {ha:?}");
    assert_eq!(ha.dropped + hb.dropped, 0, "a {ha:?} b {hb:?}");
}

/// UDP: each shard's socket, on its block's port, receives its own QPs'
/// frames (the XDP program rewrites the port of block 1's), so nothing is
/// handed over; the kernel picks the TX queue (RX queues not asserted).
#[test]
fn udp_shards_receive_their_own_qps_frames() {
    let (ha, hb, queues) = run(false, true);
    let passed: u64 = queues.iter().map(|q| q.passed).sum();
    assert!(passed >= 2 * PER_QUEUE, "{queues:?}");
    assert_eq!(ha.handed + hb.handed, 0, "a {ha:?} b {hb:?}");
}
