//! `xroce bench write|read|send|atomic`: bandwidth and message rate with
//! `--tx-depth` WRs in flight per QP, every message checked at the end
//! (write, read, atomic) or on arrival (send).

use std::{
    io::Write,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use xroce::verbs::{RecvWr, SendWr, Wc, WrOpcode};

use super::{
    conn::{
        check_wc, client_setup_until_ready, serve_clients, server_connect, slots_for, ClientSide,
        Conn, Done, Hello, Peer, Remote, ServerSide, Verdict,
    },
    pattern,
    report::{print_bench, BenchReport},
    stack::Stack,
    Op, PerfArgs, RunLength,
};

pub fn run(args: &PerfArgs) -> anyhow::Result<()> {
    if args.op == Op::Atomic && args.size.is_some() && args.size_bytes()? != 8 {
        bail!("atomics move 8 bytes; leave out --size or pass --size 8");
    }
    if args.perftest {
        return super::perftest::bench(args);
    }
    let size = args.size_bytes()?;
    if args.listen.is_some() {
        serve_clients(args, serve)
    } else {
        client(args, if args.op == Op::Atomic { 8 } else { size })
    }
}

// ---------------------------------------------------------------- server

fn serve(mut side: ServerSide<'_>) -> anyhow::Result<()> {
    let op = Op::from_name(&side.hello.op)?;
    let (conn, _) = server_connect(&mut side)?;
    let ServerSide {
        stack,
        mut peer,
        hello,
    } = side;
    match op {
        Op::Read => {
            for q in 0..hello.qps {
                for s in 0..conn.slots {
                    let off = conn.slot_offset(q, s);
                    // SAFETY: before sync(1) the client posts no READ, and this side posts nothing.
                    unsafe { conn.mr.write(off, &pattern::make(q, s, hello.size)) }?;
                }
            }
        }
        Op::Send => {
            // The client keeps at most `slots` sends in flight per QP.
            for q in 0..hello.qps {
                for s in 0..conn.slots {
                    post_recv(&conn, q, s)?;
                }
            }
        }
        Op::Write | Op::Atomic => {}
    }
    peer.sync(1)?;
    peer.session.set_timeout(hello.run_timeout());

    // Sends need the server's CPU on every message; one-sided ops do not.
    let (done, received) = if op == Op::Send {
        receive_sends(stack, &conn, &mut peer, &hello)?
    } else {
        let done: Done = peer.recv("the end of the run")?;
        (done, Ok(()))
    };
    peer.session.set_timeout(super::OOB_TIMEOUT);
    let check = received.and_then(|()| verify_server(op, &conn, &hello, &done));
    let stats = stack.device.stats();
    let verdict = Verdict {
        verified: check.is_ok(),
        detail: check.err().map_or_else(String::new, |e| e.to_string()),
        cnps_sent: stats.tx_cnps,
        ce_marked: stats.rx_ce_marked,
    };
    eprintln!(
        "xroce: {} from {}: {}",
        hello.op,
        peer.addr.ip(),
        if verdict.verified {
            "data verified".to_string()
        } else {
            format!("data NOT verified: {}", verdict.detail)
        }
    );
    peer.send(&verdict, "the verdict")
}

fn post_recv(conn: &Conn, q: usize, s: usize) -> anyhow::Result<()> {
    conn.qps[q].post_recv(&RecvWr {
        wr_id: wr_id(q, s),
        sg_list: vec![conn.mr.sge(conn.slot_offset(q, s), conn.slot_len)],
    })?;
    Ok(())
}

/// Checks each SEND as it lands, reposts its buffer, until the client says
/// it is done and every message it counted has arrived.
fn receive_sends(
    stack: &Stack,
    conn: &Conn,
    peer: &mut Peer,
    hello: &Hello,
) -> anyhow::Result<(Done, anyhow::Result<()>)> {
    let finished = AtomicBool::new(false);
    let mut arrived = vec![0u64; hello.qps];
    let mut bad: anyhow::Result<()> = Ok(());
    let mut buf = vec![0u8; hello.size];
    let mut wcs = [Wc::default(); 64];
    let mut done = None;
    std::thread::scope(|s| -> anyhow::Result<()> {
        let reader = s.spawn(|| {
            let r: anyhow::Result<Done> = peer.recv("the end of the run");
            finished.store(true, Ordering::Release);
            r
        });
        loop {
            let n = conn.cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                check_wc(wc, "receive")?;
                let (q, slot) = split_wr_id(wc.wr_id);
                arrived[q] += 1;
                if bad.is_ok() {
                    // SAFETY: this slot's only receive has completed and is reposted after this read.
                    unsafe { conn.mr.read(conn.slot_offset(q, slot), &mut buf) }?;
                    if wc.byte_len as usize != hello.size
                        || buf != pattern::make(q, slot, hello.size)
                    {
                        bad = Err(anyhow::anyhow!(
                            "message {} on QP {q} differs from what was sent",
                            arrived[q]
                        ));
                    }
                }
                post_recv(conn, q, slot)?;
            }
            if n == 0 {
                if finished.load(Ordering::Acquire) {
                    break;
                }
                stack.check_running()?;
                conn.cq.wait(Duration::from_millis(5))?;
            }
        }
        let d = reader
            .join()
            .map_err(|_| anyhow::anyhow!("reader thread panicked"))??;
        // Whatever the client completed has arrived here (RC delivers
        // before it acknowledges), but may still sit in the CQ.
        let deadline = Instant::now() + Duration::from_secs(5);
        while arrived.iter().sum::<u64>() < d.completed.iter().sum() && Instant::now() < deadline {
            let n = conn.cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                check_wc(wc, "receive")?;
                arrived[split_wr_id(wc.wr_id).0] += 1;
            }
            if n == 0 {
                conn.cq.wait(Duration::from_millis(5))?;
            }
        }
        if arrived != d.completed {
            bad = Err(anyhow::anyhow!(
                "client completed {:?} sends per QP, {:?} arrived",
                d.completed,
                arrived
            ));
        }
        done = Some(d);
        Ok(())
    })?;
    Ok((done.expect("set above"), bad))
}

fn verify_server(op: Op, conn: &Conn, hello: &Hello, done: &Done) -> anyhow::Result<()> {
    match op {
        Op::Write => {
            let mut buf = vec![0u8; hello.size];
            for (q, &n) in done.completed.iter().enumerate() {
                for s in 0..(n.min(conn.slots as u64) as usize) {
                    // SAFETY: the client's WRITEs all completed before it sent Done (out-of-band sync).
                    unsafe { conn.mr.read(conn.slot_offset(q, s), &mut buf) }?;
                    if buf != pattern::make(q, s, hello.size) {
                        bail!("slot {s} of QP {q} does not hold what was written");
                    }
                }
            }
            Ok(())
        }
        Op::Atomic => {
            for (q, &n) in done.completed.iter().enumerate() {
                // SAFETY: the client's atomics all completed before it sent Done (out-of-band sync).
                let counter = unsafe { conn.mr.load_u64(conn.slot_offset(q, 0)) }?;
                if counter != n {
                    bail!("QP {q}: {n} fetch-and-adds of 1 completed, counter is {counter}");
                }
            }
            Ok(())
        }
        Op::Read | Op::Send => Ok(()),
    }
}

// ---------------------------------------------------------------- client

/// Sends need a posted receive buffer of their own each: no more in
/// flight than there are slots.
fn client_setup_bw(args: &PerfArgs, size: usize) -> anyhow::Result<ClientSide> {
    let depth = if args.op == Op::Send {
        slots_for(size, args.qps, args.tx_depth)
    } else {
        args.tx_depth
    };
    let length = args.run_length(default_iters(size));
    client_setup_until_ready(args, "bench", size, depth, length, |_| Ok(()))
}

fn default_iters(size: usize) -> u64 {
    if size >= 65536 {
        5000
    } else {
        100_000
    }
}

fn wr_id(qp: usize, slot: usize) -> u64 {
    ((qp as u64) << 32) | slot as u64
}

fn split_wr_id(id: u64) -> (usize, usize) {
    ((id >> 32) as usize, (id & 0xffff_ffff) as usize)
}

/// One bin of `--trace`.
struct TraceRow {
    t_ms: u64,
    bytes: u64,
    rate_bps: u64,
    cnps: u64,
    retransmits: u64,
}

fn client(args: &PerfArgs, size: usize) -> anyhow::Result<()> {
    let ClientSide {
        mut peer,
        remote,
        stack,
        conn,
        hello,
    } = client_setup_bw(args, size)?;
    let op = args.op;
    if matches!(op, Op::Write | Op::Send) {
        for q in 0..hello.qps {
            for s in 0..conn.slots {
                // SAFETY: no WR is posted yet (the first ones go out below).
                unsafe {
                    conn.mr
                        .write(conn.slot_offset(q, s), &pattern::make(q, s, size))
                }?;
            }
        }
    }
    let length = args.run_length(default_iters(size));
    let before = stack.device.stats();
    let mut completed = vec![0u64; hello.qps];
    let mut posted = vec![0u64; hello.qps];
    let mut trace = Vec::new();
    let bin = Duration::from_millis(args.bin_ms.max(1));
    let (mut bin_start, mut bin_bytes) = (Instant::now(), 0u64);
    let start = Instant::now();
    let more = |posted: u64, start: Instant| match length {
        RunLength::Iters(n) => posted < n,
        RunLength::Duration(d) => start.elapsed() < d,
    };
    for (q, posted) in posted.iter_mut().enumerate() {
        while *posted < hello.depth as u64 && more(*posted, start) {
            post(&conn, &remote, op, q, *posted, size)?;
            *posted += 1;
        }
    }
    let mut wcs = [Wc::default(); 64];
    while completed.iter().zip(&posted).any(|(c, p)| c < p) {
        let n = conn.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            check_wc(wc, op.name())?;
            let (q, _) = split_wr_id(wc.wr_id);
            completed[q] += 1;
            bin_bytes += size as u64;
            if more(posted[q], start) {
                post(&conn, &remote, op, q, posted[q], size)?;
                posted[q] += 1;
            }
        }
        if n == 0 {
            stack.check_running()?;
            conn.cq.wait(Duration::from_millis(1))?;
        }
        if args.trace.is_some() && bin_start.elapsed() >= bin {
            let s = stack.device.stats();
            trace.push(TraceRow {
                t_ms: start.elapsed().as_millis() as u64,
                bytes: std::mem::take(&mut bin_bytes),
                rate_bps: stack
                    .device
                    .lock()
                    .qp_rate_bps(conn.qps[0].qp_num())
                    .unwrap_or(0),
                cnps: s.rx_cnps - before.rx_cnps,
                retransmits: s.tx_retransmitted - before.tx_retransmitted,
            });
            bin_start = Instant::now();
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let after = stack.device.stats();
    let mut verified = true;
    let mut detail = String::new();
    if op == Op::Read {
        if let Err(e) = verify_reads(&conn, &completed, size) {
            verified = false;
            detail = e.to_string();
        }
    }
    peer.send(
        &Done {
            completed: completed.clone(),
        },
        "the end of the run",
    )?;
    let verdict: Verdict = peer.recv("the server's verdict")?;
    if !verdict.verified {
        verified = false;
        detail = verdict.detail.clone();
    }
    if let Some(path) = &args.trace {
        write_trace(path, &trace)?;
    }
    let msgs: u64 = completed.iter().sum();
    let bytes = msgs * size as u64;
    let report = BenchReport {
        op: op.name().into(),
        size: size as u64,
        iters: msgs,
        qps: hello.qps as u64,
        mtu: conn.mtu.bytes(),
        backend: stack.backend.into(),
        cc: args.cc.to_string(),
        seconds,
        bytes,
        gbps: bytes as f64 * 8.0 / seconds / 1e9,
        msgs_per_sec: msgs as f64 / seconds,
        verified: Some(verified),
        retransmits: after.tx_retransmitted - before.tx_retransmitted,
        cnps: after.rx_cnps - before.rx_cnps,
        server_cnps_sent: Some(verdict.cnps_sent),
        server_ce_marked: Some(verdict.ce_marked),
        perftest: None,
    };
    print_bench(args.json, &report)?;
    if !verified {
        bail!("data was not verified: {detail}");
    }
    Ok(())
}

fn post(conn: &Conn, remote: &Remote, op: Op, q: usize, i: u64, size: usize) -> anyhow::Result<()> {
    let slot = (i % conn.slots as u64) as usize;
    let local = conn.slot_offset(q, slot);
    let remote_addr = remote.mr_addr + local as u64;
    let rkey = remote.rkey;
    let (opcode, len) = match op {
        Op::Write => (WrOpcode::RdmaWrite { remote_addr, rkey }, size),
        Op::Read => (WrOpcode::RdmaRead { remote_addr, rkey }, size),
        Op::Send => (WrOpcode::Send, size),
        Op::Atomic => (
            WrOpcode::AtomicFetchAndAdd {
                // Every QP adds to its own counter in its first slot.
                remote_addr: remote.mr_addr + conn.slot_offset(q, 0) as u64,
                rkey,
                add: 1,
            },
            8,
        ),
    };
    conn.qps[q]
        .post_send(&SendWr::new(
            wr_id(q, slot),
            opcode,
            vec![conn.mr.sge(local, len)],
        ))
        .with_context(|| format!("post {} on QP {q}", op.name()))
}

fn verify_reads(conn: &Conn, completed: &[u64], size: usize) -> anyhow::Result<()> {
    let mut buf = vec![0u8; size];
    for (q, &n) in completed.iter().enumerate() {
        for s in 0..(n.min(conn.slots as u64) as usize) {
            // SAFETY: every READ has completed (the run loop waited for all posted WRs).
            unsafe { conn.mr.read(conn.slot_offset(q, s), &mut buf) }?;
            if buf != pattern::make(q, s, size) {
                bail!("slot {s} of QP {q} does not hold what the server has");
            }
        }
    }
    Ok(())
}

fn write_trace(path: &std::path::Path, rows: &[TraceRow]) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
    );
    writeln!(f, "t_ms,bytes,rate_bps,cnps,retransmits")?;
    for r in rows {
        writeln!(
            f,
            "{},{},{},{},{}",
            r.t_ms, r.bytes, r.rate_bps, r.cnps, r.retransmits
        )?;
    }
    Ok(f.flush()?)
}
