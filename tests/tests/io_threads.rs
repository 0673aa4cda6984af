//! Several I/O threads per device (issue 13, goal 6) as its users see it:
//! the drop-in libibverbs under `XROCE_IO_THREADS=2` and `xroce bench
//! --io-threads 2`, both ends of a veth pair with 2 queues. Four QPs a
//! side go to the two engines in turn (0, 1, 0, 1 on both ends: paired
//! shard by shard), each engine sends on its own queue, so each RX queue
//! of both ends must see RoCE frames redirected to its AF_XDP socket
//! (with one thread everything is sent on queue 0, and the peer's queue 1
//! stays idle). Data is checked: the CLI verifies every byte, the
//! unmodified `ibv_srq_pingpong -c` checks what it received through one
//! SRQ and one CQ shared by QPs of both engines, and `ib_write_bw -q 4`
//! completes every WRITE of its 4 QPs into one CQ; `ib_send_bw -e -q 4`
//! waits on a completion channel that either engine fires, and
//! `ib_write_bw -R -q 4` connects through rdma_cm (QP1 on engine 0).
//! Also: a 2-thread process and a 1-thread one sharing one device (the
//! shards' UDP sockets carry their frames), and the error when the
//! interface has fewer RX queues than threads.

use std::time::Duration;

use xroce::xdp::rx_queue_counters;
use xroce_common::RxQueueCounters;
use xroce_report::{BenchReport, LatReport};
use xroce_tests::{
    in_netns, perf,
    programs::{args, check_bw_table, serial, Backend, Node, Proc, Topology},
    require_root,
    shared::pair_on,
    verbs::{ibverbs_cdylib, rdmacm_cdylib},
    AttachedXdp, VethPair,
};

const THREADS: u32 = 2;
/// One program run; the whole test stays well under a minute.
const RUN: Duration = Duration::from_secs(40);
/// RoCE frames each of a requester's queues gets at least: an ACK for
/// each of its 2 QPs (redirected frames are RoCE only, never ARP & co).
const ACKS_MIN: u64 = 2;

/// The XDP program's per-RX-queue counters of `iface` in `ns`.
fn queues(ns: &str, iface: &str) -> Vec<RxQueueCounters> {
    let iface = iface.to_string();
    in_netns(ns, move || {
        rx_queue_counters(&iface).expect("per-queue XDP counters")
    })
}

/// Every RX queue of `iface` redirected at least `min` frames to AF_XDP.
fn assert_every_queue(what: &str, ns: &str, iface: &str, min: u64) -> Vec<RxQueueCounters> {
    // The map has a slot per possible queue; the veth has THREADS.
    let mut q = queues(ns, iface);
    q.truncate(THREADS as usize);
    assert_eq!(q.len(), THREADS as usize, "{what}: {iface}'s queues {q:?}");
    for (i, c) in q.iter().enumerate() {
        assert!(
            c.redirected >= min,
            "{what}: {iface}'s RX queue {i} redirected {} RoCE frames, fewer than {min}: {q:?}",
            c.redirected
        );
    }
    q
}

/// Every RX queue of the server redirected at least `more` RoCE frames
/// since `before`; returns the counters now.
fn assert_every_queue_grew(
    what: &str,
    server: Node<'_>,
    before: &[RxQueueCounters],
    more: u64,
) -> Vec<RxQueueCounters> {
    let now = assert_every_queue(what, &server.ns.name, server.iface, 0);
    for (i, (b, a)) in before.iter().zip(&now).enumerate() {
        assert!(
            a.redirected >= b.redirected + more,
            "{what}: server RX queue {i} redirected {} more frames, fewer than {more}: {now:?}",
            a.redirected - b.redirected
        );
    }
    now
}

/// The library says, under XROCE_VERBS_DEBUG, how many threads it runs.
fn assert_threads_announced(node: Node<'_>, stderr: &str) {
    let want = format!("{} runs over the afxdp backend", node.device());
    let line = stderr
        .lines()
        .find(|l| l.contains(&want))
        .unwrap_or_else(|| panic!("no {want:?} line in stderr:\n{stderr}"));
    assert!(
        line.contains(&format!("{THREADS} I/O thread(s)")),
        "{line:?}"
    );
}

#[test]
fn dropin_programs_spread_their_qps_over_two_io_threads() {
    require_root();
    let _turn = serial();
    // `xroce run` puts both of xroce's libraries first; build them as they
    // are now (cargo test builds no cdylib, and without xroce's
    // librdmacm.so.1 `ib_write_bw -R` would load Debian's, which finds no
    // kernel RDMA CM: "rdma_create_event_channel failed").
    let _ = (ibverbs_cdylib(), rdmacm_cdylib());
    let mut t = Topology::direct_queues(Backend::AfXdp, 3500, THREADS);
    t.env.push(("XROCE_IO_THREADS".into(), THREADS.to_string()));
    let (server, client) = (t.server(), t.client());

    // ib_write_bw: 4 QPs x 200 WRITEs of 64 KiB (path MTU 2048: 32 frames
    // each), one send CQ for all of them.
    let perftest = |node: Node<'_>, extra: &[&str]| {
        let mut a = args(&[
            "-x",
            "1",
            "-F",
            "-d",
            &node.device(),
            "-q",
            "4",
            "-n",
            "200",
        ]);
        a.extend(args(extra));
        a
    };
    let out = t.pair(
        "ib_write_bw",
        &perftest(server, &[]),
        &perftest(client, &[]),
        RUN,
    );
    let row = out
        .check()
        .and_then(|c| check_bw_table(c, Some(1)))
        .unwrap_or_else(|e| panic!("ib_write_bw -q 4 on {THREADS} I/O threads: {e}"));
    assert_threads_announced(server, &out.server.stderr);
    assert_threads_announced(client, &out.client.as_ref().unwrap().stderr);
    // Each queue of the server carries 2 QPs' WRITEs (2 x 200 x 32 data
    // frames); the client's carry their ACKs: hundreds here, but as few as
    // one per QP once the responder coalesces them, so only that is asked.
    let srv = assert_every_queue("ib_write_bw", &server.ns.name, server.iface, 2 * 200 * 32);
    let cli = assert_every_queue("ib_write_bw", &client.ns.name, client.iface, ACKS_MIN);
    eprintln!("ib_write_bw -q 4: {row}; server queues {srv:?}; client queues {cli:?}");

    // ib_send_bw -e: completions through a completion channel (one CQ
    // armed with ibv_req_notify_cq, fired by either engine's thread), the
    // server's receives spread over QPs of both engines.
    let out = t.pair(
        "ib_send_bw",
        &perftest(server, &["-e"]),
        &perftest(client, &["-e"]),
        RUN,
    );
    let row = out
        .check()
        .and_then(|c| check_bw_table(c, Some(1)))
        .unwrap_or_else(|e| panic!("ib_send_bw -e -q 4 on {THREADS} I/O threads: {e}"));
    let srv1 = assert_every_queue_grew("ib_send_bw -e", server, &srv, 200 * 32);
    eprintln!("ib_send_bw -e -q 4: {row}; server queues {srv1:?}");
    let srv = srv1;

    // ibv_srq_pingpong -c: 4 QPs (2 per engine) receive through one SRQ
    // into one CQ, both ways; the receiver checks the data.
    let pingpong = |node: Node<'_>| {
        args(&[
            "-g",
            "1",
            "-d",
            &node.device(),
            "-q",
            "4",
            "-n",
            "200",
            "-c",
        ])
    };
    let out = t.pair(
        "ibv_srq_pingpong",
        &pingpong(server),
        &pingpong(client),
        RUN,
    );
    let line = out
        .check_pingpong()
        .unwrap_or_else(|e| panic!("ibv_srq_pingpong -q 4 -c on {THREADS} I/O threads: {e}"));
    // `-n` counts the iterations of all QPs together, and a QP sends
    // again once its last SEND completed and its peer's arrived: the QPs
    // of the engine that gets more CPU take more of them (beside two CPU
    // hogs one queue saw 96 frames, the other 940). Every QP still sends
    // first on the client and answers on the server, so each server
    // queue gets its 2 QPs' first SENDs and an ACK for each QP's answer;
    // with one thread, queue 1 would get none.
    let srv2 = assert_every_queue_grew("ibv_srq_pingpong", server, &srv, 2 * ACKS_MIN);
    eprintln!("ibv_srq_pingpong -q 4 -c: {line}; server queues {srv2:?}");

    // ib_write_bw -R: 4 QPs connected by rdma_cm, whose MADs go through
    // QP1 (the GSI QP, kept on engine 0 and not counted in its load, so
    // the connections' QPs still alternate and pair engine by engine).
    // rdma_cm servers listen on no TCP port: the client starts a second
    // later and is tried again while a quick failure may mean too early.
    let port = xroce_tests::programs::next_port().to_string();
    let cm = |node: Node<'_>| {
        args(&[
            "-R",
            "-F",
            "-d",
            &node.device(),
            "-p",
            &port,
            "-q",
            "4",
            "-n",
            "200",
        ])
    };
    let mut srv = t.start(server, "ib_write_bw", &cm(server));
    let mut cargs = cm(client);
    cargs.push(server.addr.to_string());
    let mut attempts = 0;
    let cli = loop {
        attempts += 1;
        std::thread::sleep(Duration::from_secs(1));
        let cli = t.run(client, "ib_write_bw", &cargs, RUN);
        if cli.success() || attempts == 3 || cli.secs > 5.0 || srv.exited() {
            break cli;
        }
    };
    let srvf = srv.finish(RUN);
    let out = xroce_tests::programs::PairOutput {
        server: srvf,
        client: Some(cli),
        setup_error: None,
    };
    let row = out
        .check()
        .and_then(|c| check_bw_table(c, Some(1)))
        .unwrap_or_else(|e| panic!("ib_write_bw -R -q 4 on {THREADS} I/O threads: {e}"));
    let srv3 = assert_every_queue_grew("ib_write_bw -R", server, &srv2, 200 * 32);
    eprintln!("ib_write_bw -R -q 4 ({attempts} attempt(s)): {row}; server queues {srv3:?}");
}

#[test]
fn cli_bench_on_two_io_threads_verifies_its_data() {
    require_root();
    let _turn = serial();
    let pair = VethPair::with_queues(3500, THREADS);
    // Attached for the whole test: the counters outlive the runs.
    let _xdp_a = AttachedXdp::new(&pair.a, &pair.if_a, "native");
    let _xdp_b = AttachedXdp::new(&pair.b, &pair.if_b, "native");
    let threads = THREADS.to_string();
    let common = ["write", "--backend", "afxdp", "--io-threads", &threads];
    let mut client = common.to_vec();
    client.extend(["-q", "4", "--size", "64KiB", "--iters", "200"]);
    let r: BenchReport = perf::run_ok(&pair, "bench", &common, &client);
    assert_eq!(r.verified, Some(true), "{r:?}");
    assert_eq!(r.backend, "afxdp", "{r:?}");
    assert_eq!((r.qps, r.iters), (4, 800), "{r:?}");
    let srv = assert_every_queue("xroce bench", &pair.b.name, &pair.if_b, 2 * 200 * 32);
    let cli = assert_every_queue("xroce bench", &pair.a.name, &pair.if_a, ACKS_MIN);
    eprintln!(
        "xroce bench write -q 4 --io-threads {THREADS}: {:.2} Gb/s, verified; server queues \
         {srv:?}; client queues {cli:?}",
        r.gbps
    );

    // lat: its QP is the first, on engine 0; it polls memory the engine
    // writes. READ checks what it read.
    let lat_args = ["read", "--backend", "afxdp", "--io-threads", &threads];
    let mut lat_client = lat_args.to_vec();
    lat_client.extend(["--size", "64", "--iters", "2000"]);
    let l: LatReport = perf::run_ok(&pair, "lat", &lat_args, &lat_client);
    assert_eq!(l.verified, Some(true), "{l:?}");
    assert_eq!(l.iters, 2000, "{l:?}");

    // UDP: a socket per engine on its block's port (the XDP program moves
    // block 1's frames there); the kernel picks the TX queue.
    let udp = ["write", "--backend", "udp", "--io-threads", &threads];
    let mut udp_client = udp.to_vec();
    udp_client.extend(["-q", "4", "--size", "64KiB", "--iters", "100"]);
    let u: BenchReport = perf::run_ok(&pair, "bench", &udp, &udp_client);
    assert_eq!(u.verified, Some(true), "{u:?}");
    assert_eq!((u.backend.as_str(), u.iters), ("udp", 400), "{u:?}");
    eprintln!(
        "xroce lat read 64 B --io-threads {THREADS}: p50 {:.1} us; bench write UDP -q 4: {:.2} \
         Gb/s, verified",
        l.lat_us.p50, u.gbps
    );
}

/// More I/O threads than the interface has RX queues: opening the device
/// fails, and the library says why (the program only says it could not).
#[test]
fn more_io_threads_than_queues_fails_with_the_reason() {
    require_root();
    let _turn = serial();
    let mut t = Topology::direct(Backend::AfXdp, 1500);
    t.env.push(("XROCE_IO_THREADS".into(), THREADS.to_string()));
    let node = t.client();
    let f = t.run(node, "ibv_devinfo", &args(&["-d", &node.device()]), RUN);
    assert!(!f.success(), "{}", f.describe());
    let want = format!(
        "{} has 1 RX queue(s), fewer than the {THREADS} I/O threads asked for",
        node.iface
    );
    assert!(
        f.stderr.contains(&format!("cannot open {}", node.device())) && f.stderr.contains(&want),
        "stderr lacks {want:?}:\n{}",
        f.stderr
    );
}

/// A device shared with another process of the host: the server runs 2
/// I/O threads (it owns the AF_XDP sockets and blocks 0 and 1), the client
/// in the same namespace on the same device 1 thread (block 2, over UDP).
/// Their frames never touch the link: each shard reaches the client, and
/// the client each shard, through the shard's UDP socket on its block's
/// port. 4 QPs, so both shards talk to the client.
#[test]
fn shares_its_device_with_a_one_thread_process() {
    require_root();
    let _turn = serial();
    let t = Topology::direct_queues(Backend::AfXdp, 3500, THREADS);
    let node = t.server();
    // pair_on starts the server first, then the client.
    let server_next = std::cell::Cell::new(true);
    let start = |n: Node<'_>, program: &str, a: &[String]| {
        let mut cmd = t.command(n, program, a);
        let threads = if server_next.replace(false) {
            THREADS
        } else {
            1
        };
        cmd.env("XROCE_IO_THREADS", threads.to_string());
        let what = format!("[{threads} I/O thread(s)] {program} {}", a.join(" "));
        Proc::spawn(cmd, what, &t.dir.0)
    };
    let a = args(&[
        "-d",
        &node.device(),
        "-g",
        "1",
        "-q",
        "4",
        "-n",
        "200",
        "-c",
    ]);
    let out = pair_on(start, node, node, "ibv_srq_pingpong", &a, &a, RUN);
    let line = out
        .check_pingpong()
        .unwrap_or_else(|e| panic!("ibv_srq_pingpong -q 4 -c, 2 threads and 1 on one device: {e}"));
    assert_threads_announced(node, &out.server.stderr);
    let client = &out.client.as_ref().unwrap().stderr;
    assert!(
        client.contains("QPN block 2 runs over the UDP backend"),
        "the client should run over UDP in block 2:\n{client}"
    );
    eprintln!("ibv_srq_pingpong -q 4 -c on one device, 2 threads + 1: {line}");
}
