//! `xroce bench write|read|send|atomic`: bandwidth and message rate with
//! `--tx-depth` WRs in flight per QP, every message checked at the end
//! (write, read, atomic) or on arrival (send).
//!
//! Like perftest's bandwidth tests (`--cq-mod`), only every
//! [`signal_every`]th WR of a QP asks for a completion: on RC one
//! completion says that every WR before it is done too, and the sender
//! wakes once per group instead of once per message.

use std::{
    io::Write,
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use xroce::verbs::{RecvWr, SendFlags, Wc, WcStatus, WrOpcode};

use super::{
    conn::{
        check_wc, client_setup_until_ready, serve_clients, server_connect, slots_for, ClientSide,
        Conn, Done, Hello, Remote, Run, ServerSide, Verdict,
    },
    flags::{self, Tool},
    pattern,
    report::{print_json, BenchReport, Table},
    stack::Stack,
    Op, PerfArgs, RunLength, Transport,
};

pub fn run(args: &PerfArgs) -> anyhow::Result<()> {
    flags::check(args, Tool::Bench)?;
    if args.op == Op::Atomic && args.size.is_some() && args.size_bytes()? != 8 {
        bail!("atomics move 8 bytes; leave out --size or pass --size 8");
    }
    if args.perftest {
        return super::perftest::bench(args);
    }
    if args.listen.is_some() {
        return serve_clients(args, serve);
    }
    let sizes = if args.op == Op::Atomic {
        vec![8]
    } else {
        flags::sizes(args, 65536, flags::ud_limit(args))?
    };
    let mut stack = None;
    for (i, &size) in sizes.iter().enumerate() {
        let run = Run {
            size,
            more: i + 1 < sizes.len(),
        };
        let rows = Rows {
            first: i == 0,
            last: !run.more,
        };
        client(args, &mut stack, run, rows)?;
    }
    Ok(())
}

/// Which rows of an -a table this run prints.
#[derive(Clone, Copy)]
struct Rows {
    first: bool,
    last: bool,
}

// ---------------------------------------------------------------- server

fn serve(mut side: ServerSide<'_>) -> anyhow::Result<()> {
    let op = Op::from_name(&side.hello.op)?;
    let (conn, remote) = server_connect(&mut side)?;
    let ServerSide {
        stack,
        mut peer,
        hello,
        hold,
        ..
    } = side;
    let bidi = hello.bidirectional;
    // What the client READs, and with -b what we send.
    if op == Op::Read || (bidi && matches!(op, Op::Write | Op::Send)) {
        fill_slots(&conn, hello.size)?;
    }
    if op == Op::Send {
        // The client keeps at most `slots` sends in flight per QP.
        post_all_recvs(&conn)?;
    }
    peer.sync(1)?;
    peer.session.set_timeout(hello.run_timeout());
    let length = match (hello.iters, hello.seconds) {
        (Some(n), _) => RunLength::Iters(n),
        (None, Some(s)) => RunLength::Duration(Duration::from_secs_f64(s.max(0.0))),
        (None, None) => RunLength::Iters(0),
    };
    let target = OnceLock::new();
    let (done, arrivals, sent) = std::thread::scope(|s| -> anyhow::Result<_> {
        // Sends need the CPU of their receiver on every message; one-sided ops do not.
        let receiver = (op == Op::Send)
            .then(|| s.spawn(|| receive_loop(stack, &conn, hello.size, hello.qps, &target)));
        let sender = bidi.then(|| {
            s.spawn(|| {
                send_loop(
                    stack,
                    &conn,
                    &remote,
                    op,
                    hello.size,
                    hello.depth,
                    length,
                    None,
                )
            })
        });
        let done: anyhow::Result<Done> = peer.recv("the end of the run");
        // Whatever happens, the receiver must stop.
        let _ = target.set(
            done.as_ref()
                .map_or_else(|_| vec![], |d| d.completed.clone()),
        );
        let arrivals = receiver.map(|h| join(h, "receiver")).transpose();
        let sent = sender.map(|h| join(h, "sender")).transpose();
        Ok((done?, arrivals?, sent?))
    })?;
    peer.session.set_timeout(super::OOB_TIMEOUT);
    let mut arrived = None;
    let check = match arrivals {
        Some(a) => {
            arrived = Some(a.arrived.iter().sum::<u64>());
            a.check
        }
        None => Ok(()),
    }
    .and_then(|()| verify_server(op, &conn, &hello, &done))
    .and_then(|()| match (&sent, op) {
        // Our READs of the client's memory.
        (Some(sent), Op::Read) => verify_reads(&conn, &sent.completed, hello.size),
        _ => Ok(()),
    });
    let stats = stack.device.stats();
    dump_stats("server", &stats);
    let verdict = Verdict {
        verified: check.is_ok(),
        detail: check.err().map_or_else(String::new, |e| e.to_string()),
        cnps_sent: stats.tx_cnps,
        ce_marked: stats.rx_ce_marked,
        sent: sent.as_ref().map(|s| s.completed.clone()),
        sent_seconds: sent.as_ref().map(|s| s.seconds),
    };
    let counted = match arrived {
        Some(n) => format!(
            " ({n} of {} messages arrived)",
            done.completed.iter().sum::<u64>()
        ),
        None => String::new(),
    };
    eprintln!(
        "xroce: {} {} from {}: {}{counted}",
        hello.transport,
        hello.op,
        peer.addr.ip(),
        if verdict.verified {
            "data verified".to_string()
        } else {
            format!("data NOT verified: {}", verdict.detail)
        }
    );
    peer.send(&verdict, "the verdict")?;
    super::hold_qps(hold)
}

fn join<T>(
    h: std::thread::ScopedJoinHandle<'_, anyhow::Result<T>>,
    what: &str,
) -> anyhow::Result<T> {
    h.join()
        .map_err(|_| anyhow::anyhow!("the {what} thread panicked"))?
}

/// Our slots hold the pattern (what we send, or what the peer READs).
fn fill_slots(conn: &Conn, size: usize) -> anyhow::Result<()> {
    for q in 0..conn.qps.len() {
        for s in 0..conn.slots {
            // SAFETY: nothing is posted on these slots yet (before sync(1) / the first post).
            unsafe {
                conn.mr
                    .write(conn.slot_offset(q, s), &pattern::make(q, s, size))
            }?;
        }
    }
    Ok(())
}

fn post_all_recvs(conn: &Conn) -> anyhow::Result<()> {
    for q in 0..conn.qps.len() {
        for s in 0..conn.slots {
            post_recv(conn, q, s)?;
        }
    }
    Ok(())
}

fn post_recv(conn: &Conn, q: usize, s: usize) -> anyhow::Result<()> {
    conn.qps[q].post_recv(&RecvWr {
        wr_id: wr_id(q, s as u64),
        sg_list: vec![conn.mr.sge(conn.inbound_offset(q, s), conn.slot_len)],
    })?;
    Ok(())
}

/// What a receiver took.
struct Arrivals {
    arrived: Vec<u64>,
    /// Every message that arrived holds what was sent; on RC, all arrived.
    check: anyhow::Result<()>,
}

/// Takes SENDs as they land on `conn.rcq`, checks each and reposts its
/// buffer, until `target` (the sender's completions per QP) is known and
/// has arrived. RC delivers before it acknowledges, so all of it arrives;
/// UC and UD drop a message that finds no receive, so there a shortfall
/// is counted, not a failure.
fn receive_loop(
    stack: &Stack,
    conn: &Conn,
    size: usize,
    qps: usize,
    target: &OnceLock<Vec<u64>>,
) -> anyhow::Result<Arrivals> {
    let reliable = conn.transport == Transport::Rc;
    let mut arrived = vec![0u64; qps];
    let mut bad: anyhow::Result<()> = Ok(());
    let mut buf = vec![0u8; size];
    // Each slot's pattern, made once: making it per message cost the
    // receiver more CPU than the transport did.
    let mut want: Vec<Option<Vec<u8>>> = vec![None; qps * conn.slots];
    let slots = conn.slots;
    let mut holds = |buf: &[u8], q: usize, s: usize| -> bool {
        buf == want[q * slots + s].get_or_insert_with(|| pattern::make(q, s, size))
    };
    let mut wcs = [Wc::default(); 64];
    let mut deadline = None;
    loop {
        let n = conn.rcq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            check_wc(wc, "receive")?;
            let (q, slot) = split_wr_id(wc.wr_id);
            arrived[q] += 1;
            if bad.is_ok() {
                let at = conn.inbound_offset(q, slot) + conn.grh;
                // SAFETY: this slot's only receive has completed and is reposted after this read.
                unsafe { conn.mr.read(at, &mut buf) }?;
                let len = wc.byte_len as usize - conn.grh.min(wc.byte_len as usize);
                // Unreliable transports lose messages: the next one may be any slot's.
                let intact = holds(&buf, q, slot)
                    || (!reliable && (0..conn.slots).any(|s| holds(&buf, q, s)));
                if len != size || !intact {
                    bad = Err(anyhow::anyhow!(
                        "message {} on QP {q} differs from what was sent",
                        arrived[q]
                    ));
                }
            }
            post_recv(conn, q, slot)?;
        }
        if n > 0 {
            continue;
        }
        if let Some(t) = target.get() {
            if t.len() != qps || arrived.iter().zip(t).all(|(a, t)| a >= t) {
                break;
            }
            let wait = if reliable { 5 } else { 1 };
            let d = *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(wait));
            if Instant::now() > d {
                break;
            }
        }
        stack.check_running()?;
        conn.rcq.wait(Duration::from_millis(5))?;
    }
    let t = target.get().cloned().unwrap_or_default();
    if bad.is_ok() && t.len() == qps {
        let short = arrived.iter().zip(&t).any(|(a, t)| a < t);
        if arrived.iter().zip(&t).any(|(a, t)| a > t) || (reliable && short) {
            bad = Err(anyhow::anyhow!(
                "the sender completed {t:?} sends per QP, {arrived:?} arrived"
            ));
        } else if short && arrived.iter().sum::<u64>() == 0 {
            bad = Err(anyhow::anyhow!(
                "none of the {:?} {} sends arrived",
                t,
                conn.transport.name()
            ));
        }
    }
    Ok(Arrivals {
        arrived,
        check: bad,
    })
}

/// Whether a UC WRITE slot that differs from `want` differs only as lost
/// packets leave it: each packet-sized piece either landed whole or is
/// still zero (the slot's memory before any WRITE reached it). UC WRITEs
/// to a slot all carry the same data, so pieces of different WRITEs agree.
fn uc_loss_only(got: &[u8], want: &[u8], mtu: u32) -> bool {
    got.chunks(mtu as usize)
        .zip(want.chunks(mtu as usize))
        .all(|(g, w)| g == w || g.iter().all(|&b| b == 0))
}

fn verify_server(op: Op, conn: &Conn, hello: &Hello, done: &Done) -> anyhow::Result<()> {
    verify_inbound(op, conn, hello.size, &done.completed)
}

/// Checks what the peer's `completed` WRITEs or atomics per QP left in our
/// memory. UC acknowledges nothing: its last WRITEs may still be on the
/// wire when the sender says it is done, so they get a moment to land.
fn verify_inbound(op: Op, conn: &Conn, size: usize, completed: &[u64]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let r = verify_inbound_once(op, conn, size, completed);
        if r.is_ok() || conn.transport == Transport::Rc || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn verify_inbound_once(op: Op, conn: &Conn, size: usize, completed: &[u64]) -> anyhow::Result<()> {
    match op {
        Op::Write => {
            let mut buf = vec![0u8; size];
            let (mut written, mut incomplete) = (0u64, 0u64);
            for (q, &n) in completed.iter().enumerate() {
                for s in 0..(n.min(conn.slots as u64) as usize) {
                    // SAFETY: the peer's WRITEs all completed before it said so (out-of-band sync).
                    unsafe { conn.mr.read(conn.inbound_offset(q, s), &mut buf) }?;
                    let want = pattern::make(q, s, size);
                    written += 1;
                    if buf == want {
                        continue;
                    }
                    if conn.transport == Transport::Uc
                        && uc_loss_only(&buf, &want, conn.mtu.bytes())
                    {
                        incomplete += 1;
                        continue;
                    }
                    bail!("slot {s} of QP {q} does not hold what was written");
                }
            }
            if incomplete > 0 {
                if incomplete == written {
                    bail!("none of the {written} UC WRITE slots holds a whole message");
                }
                eprintln!(
                    "xroce: {incomplete} of {written} UC WRITE slots miss packets the link lost \
                     (UC drops the rest of a message after a lost packet); the rest is intact"
                );
            }
            Ok(())
        }
        Op::Atomic => {
            for (q, &n) in completed.iter().enumerate() {
                // SAFETY: the peer's atomics all completed before it said so (out-of-band sync).
                let counter = unsafe { conn.mr.load_u64(conn.inbound_offset(q, 0)) }?;
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
fn client_setup_bw<'a>(
    args: &PerfArgs,
    stack: &'a mut Option<Stack>,
    run: Run,
) -> anyhow::Result<ClientSide<'a>> {
    let size = run.size;
    let depth = if args.op == Op::Send {
        slots_for(size, args.qps, args.tx_depth)
    } else {
        args.tx_depth
    };
    let length = args.run_length(default_iters(size));
    let (op, bidi) = (args.op, args.bidirectional);
    client_setup_until_ready(args, stack, "bench", run, depth, length, |conn| {
        // What we send, and with -b what the server READs; with -b the
        // server's first sends need our receives before "ready".
        if matches!(op, Op::Write | Op::Send) || (bidi && op == Op::Read) {
            fill_slots(conn, size)?;
        }
        if bidi && op == Op::Send {
            post_all_recvs(conn)?;
        }
        Ok(())
    })
}

fn default_iters(size: usize) -> u64 {
    if size >= 65536 {
        5000
    } else {
        100_000
    }
}

/// How many WRs of a QP one signaled completion stands for: a quarter of
/// the window, so three quarters stay in flight while the sender wakes.
fn signal_every(depth: usize) -> u64 {
    (depth as u64 / 4).max(1)
}

/// The id of the `seq`th WR of QP `qp` (from 0).
fn wr_id(qp: usize, seq: u64) -> u64 {
    ((qp as u64) << 32) | (seq & 0xffff_ffff)
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

/// What one side sent.
struct Sent {
    completed: Vec<u64>,
    seconds: f64,
    retransmits: u64,
    cnps: u64,
    trace: Vec<TraceRow>,
    /// The run ended early because a QP ran out of retries.
    qp_error: Option<String>,
}

/// Whether a completion error means the network beat the QP's retries
/// (the peer or the path stopped answering) rather than a fault of ours:
/// a run that meets one still reports what it moved before.
fn retries_ran_out(wc: &Wc) -> bool {
    matches!(wc.status, WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr)
}

/// `depth` WRs of `op` in flight per QP until `length`; with `trace_bin`,
/// a --trace row per bin.
#[allow(clippy::too_many_arguments)]
fn send_loop(
    stack: &Stack,
    conn: &Conn,
    remote: &Remote,
    op: Op,
    size: usize,
    depth: usize,
    length: RunLength,
    trace_bin: Option<Duration>,
) -> anyhow::Result<Sent> {
    let qps = conn.qps.len();
    let before = stack.device.stats();
    let mut completed = vec![0u64; qps];
    let mut posted = vec![0u64; qps];
    let mut trace = Vec::new();
    let (mut bin_start, mut bin_bytes) = (Instant::now(), 0u64);
    let start = Instant::now();
    let every = signal_every(depth);
    // A timed run ends with a whole group, so that its last WR is signaled.
    let more = |posted: u64, start: Instant| match length {
        RunLength::Iters(n) => posted < n,
        RunLength::Duration(d) => start.elapsed() < d || !posted.is_multiple_of(every),
    };
    let signaled = |seq: u64| {
        (seq + 1).is_multiple_of(every) || matches!(length, RunLength::Iters(n) if seq + 1 == n)
    };
    for (q, posted) in posted.iter_mut().enumerate() {
        while *posted < depth as u64 && more(*posted, start) {
            post(conn, remote, op, q, *posted, size, signaled(*posted))?;
            *posted += 1;
        }
    }
    let mut wcs = [Wc::default(); 64];
    let mut qp_error = None;
    while qp_error.is_none() && completed.iter().zip(&posted).any(|(c, p)| c < p) {
        let n = conn.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            if retries_ran_out(wc) {
                // The rest of the QP's WRs flush; what completed stands.
                qp_error = check_wc(wc, op.name()).err().map(|e| e.to_string());
                break;
            }
            check_wc(wc, op.name())?;
            // This WR and every one before it on its QP are done.
            let (q, low) = split_wr_id(wc.wr_id);
            let newly = (low as u64).wrapping_sub(completed[q]) & 0xffff_ffff;
            completed[q] += newly + 1;
            bin_bytes += (newly + 1) * size as u64;
            for _ in 0..=newly {
                if more(posted[q], start) {
                    post(conn, remote, op, q, posted[q], size, signaled(posted[q]))?;
                    posted[q] += 1;
                }
            }
        }
        if n == 0 {
            stack.check_running()?;
            conn.cq.wait(Duration::from_millis(1))?;
        }
        if let Some(bin) = trace_bin {
            if bin_start.elapsed() >= bin {
                let s = stack.device.stats();
                trace.push(TraceRow {
                    t_ms: start.elapsed().as_millis() as u64,
                    bytes: std::mem::take(&mut bin_bytes),
                    // From the QP's own engine (one of several with
                    // --io-threads).
                    rate_bps: conn.qps[0].rate_bps().unwrap_or(0),
                    cnps: s.rx_cnps - before.rx_cnps,
                    retransmits: s.tx_retransmitted - before.tx_retransmitted,
                });
                bin_start = Instant::now();
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let after = stack.device.stats();
    dump_stats("client", &after);
    Ok(Sent {
        completed,
        seconds,
        retransmits: after.tx_retransmitted - before.tx_retransmitted,
        cnps: after.rx_cnps - before.rx_cnps,
        trace,
        qp_error,
    })
}

fn client(args: &PerfArgs, stack: &mut Option<Stack>, run: Run, rows: Rows) -> anyhow::Result<()> {
    let size = run.size;
    let ClientSide {
        mut peer,
        remote,
        stack,
        conn,
        hello,
    } = client_setup_bw(args, stack, run)?;
    let op = args.op;
    let bidi = args.bidirectional;
    let length = args.run_length(default_iters(size));
    let trace_bin = args
        .trace
        .is_some()
        .then(|| Duration::from_millis(args.bin_ms.max(1)));
    let target = OnceLock::new();
    let (sent, verdict, arrivals) = std::thread::scope(|s| -> anyhow::Result<_> {
        let receiver = (bidi && op == Op::Send)
            .then(|| s.spawn(|| receive_loop(stack, &conn, size, hello.qps, &target)));
        let sent = send_loop(
            stack,
            &conn,
            &remote,
            op,
            size,
            hello.depth,
            length,
            trace_bin,
        );
        let verdict = sent
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e:#}"))
            .and_then(|sent| {
                peer.send(
                    &Done {
                        completed: sent.completed.clone(),
                    },
                    "the end of the run",
                )?;
                peer.recv::<Verdict>("the server's verdict")
            });
        let theirs = verdict
            .as_ref()
            .ok()
            .and_then(|v| v.sent.clone())
            .unwrap_or_default();
        let _ = target.set(theirs);
        let arrivals = receiver.map(|h| join(h, "receiver")).transpose();
        let sent = sent?;
        let verdict = match (verdict, &sent.qp_error) {
            // A dead peer is what most often runs the retries out: its
            // error is the one to report, not the silence that follows.
            (Err(e), Some(qp_error)) => {
                bail!("{qp_error} (the server did not answer after it either: {e:#})")
            }
            (v, _) => v?,
        };
        Ok((sent, verdict, arrivals?))
    })?;
    let mut verified = true;
    let mut detail = String::new();
    let mut fail = |e: anyhow::Error| {
        if verified {
            verified = false;
            detail = e.to_string();
        }
    };
    // Our READs land in our inbound slots.
    if op == Op::Read {
        if let Err(e) = verify_reads(&conn, &sent.completed, size) {
            fail(e);
        }
    }
    if !verdict.verified {
        fail(anyhow::anyhow!("{}", verdict.detail));
    }
    if bidi {
        let theirs = verdict.sent.clone().unwrap_or_default();
        if theirs.len() != hello.qps {
            fail(anyhow::anyhow!(
                "the server did not send in both directions (is it xroce of the same version?)"
            ));
        }
        if let Some(a) = arrivals {
            if let Err(e) = a.check {
                fail(e);
            }
        }
        if let Err(e) = verify_inbound(op, &conn, size, &theirs) {
            fail(e);
        }
    }
    if let Some(path) = &args.trace {
        write_trace(path, &sent.trace)?;
    }
    let msgs: u64 = sent.completed.iter().sum();
    let rate = |msgs: u64, seconds: f64| {
        if seconds > 0.0 {
            msgs as f64 / seconds
        } else {
            0.0
        }
    };
    let mut msgs_per_sec = rate(msgs, sent.seconds);
    let mut total = msgs;
    let mut seconds = sent.seconds;
    if bidi {
        // As perftest's -b: the sum of both directions.
        let theirs: u64 = verdict.sent.iter().flatten().sum();
        let their_secs = verdict.sent_seconds.unwrap_or(0.0);
        msgs_per_sec += rate(theirs, their_secs);
        total += theirs;
        seconds = seconds.max(their_secs);
    }
    let bytes = total * size as u64;
    let report = BenchReport {
        op: op.name().into(),
        size: size as u64,
        iters: total,
        qps: hello.qps as u64,
        mtu: conn.mtu.bytes(),
        backend: stack.backend.into(),
        cc: args.cc.to_string(),
        seconds,
        bytes,
        gbps: msgs_per_sec * size as f64 * 8.0 / 1e9,
        msgs_per_sec,
        verified: Some(verified),
        retransmits: sent.retransmits,
        cnps: sent.cnps,
        server_cnps_sent: Some(verdict.cnps_sent),
        server_ce_marked: Some(verdict.ce_marked),
        perftest: None,
        qp_error: sent.qp_error.clone(),
    };
    if args.json {
        print_json(&report)?;
    } else {
        let mut t = Table::from(&report);
        t.title = title(args);
        t.print_rows(rows.first, rows.last);
    }
    if !verified {
        bail!("data was not verified: {detail}");
    }
    if let Some(e) = &sent.qp_error {
        bail!("{e} (reported above: what completed before)");
    }
    super::hold_qps(args.hold && rows.last)
}

/// The table's title beyond the op: transport, -b.
fn title(args: &PerfArgs) -> String {
    let mut t = String::new();
    if args.connection != Transport::Rc {
        t += &format!(" {}", args.connection.name());
    }
    if args.bidirectional {
        t += " bidirectional";
    }
    t
}

fn post(
    conn: &Conn,
    remote: &Remote,
    op: Op,
    q: usize,
    i: u64,
    size: usize,
    signaled: bool,
) -> anyhow::Result<()> {
    let slot = (i % conn.slots as u64) as usize;
    let local = conn.slot_offset(q, slot);
    let rkey = remote.rkey;
    let (opcode, at, len) = match op {
        Op::Write => (
            WrOpcode::RdmaWrite {
                remote_addr: remote.mr_addr + conn.inbound_offset(q, slot) as u64,
                rkey,
            },
            local,
            size,
        ),
        Op::Read => (
            WrOpcode::RdmaRead {
                remote_addr: remote.mr_addr + local as u64,
                rkey,
            },
            conn.inbound_offset(q, slot),
            size,
        ),
        Op::Send => (WrOpcode::Send, local, size),
        Op::Atomic => (
            WrOpcode::AtomicFetchAndAdd {
                // Every QP adds to its own counter in its first inbound slot.
                remote_addr: remote.mr_addr + conn.inbound_offset(q, 0) as u64,
                rkey,
                add: 1,
            },
            local,
            8,
        ),
    };
    let mut wr = conn.send_wr(remote, q, wr_id(q, i), opcode, at, len);
    if !signaled {
        wr.flags.remove(SendFlags::SIGNALED);
    }
    conn.post(q, &wr)
        .with_context(|| format!("post {} on QP {q}", op.name()))
}

/// With `XROCE_BENCH_STATS` set: every nonzero engine counter on stderr
/// (to compare runs, e.g. ACKs per data packet at 1 and 1,024 QPs).
fn dump_stats(side: &str, s: &xroce::engine::EngineStats) {
    if std::env::var_os("XROCE_BENCH_STATS").is_none() {
        return;
    }
    let nonzero: Vec<String> = s
        .fields()
        .filter(|&(_, v)| v != 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    eprintln!("xroce stats {side}: {}", nonzero.join(" "));
}

/// Our READs brought the peer's pattern into our inbound slots.
fn verify_reads(conn: &Conn, completed: &[u64], size: usize) -> anyhow::Result<()> {
    let mut buf = vec![0u8; size];
    for (q, &n) in completed.iter().enumerate() {
        for s in 0..(n.min(conn.slots as u64) as usize) {
            // SAFETY: every READ has completed (the run loop waited for all posted WRs).
            unsafe { conn.mr.read(conn.inbound_offset(q, s), &mut buf) }?;
            if buf != pattern::make(q, s, size) {
                bail!("slot {s} of QP {q} does not hold what the peer has");
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

#[cfg(test)]
mod tests {
    use super::uc_loss_only;

    #[test]
    fn a_uc_slot_may_miss_whole_packets_but_never_hold_wrong_bytes() {
        let want: Vec<u8> = (1..=10u8).collect();
        assert!(uc_loss_only(&[1, 2, 3, 4, 0, 0, 0, 0, 9, 10], &want, 4));
        assert!(uc_loss_only(&[0; 10], &want, 4), "nothing landed");
        // A piece half written, or data of another slot: not loss.
        assert!(!uc_loss_only(&[1, 2, 0, 0, 5, 6, 7, 8, 9, 10], &want, 4));
        assert!(!uc_loss_only(&[1, 2, 3, 4, 5, 6, 7, 9, 9, 10], &want, 4));
    }
}
