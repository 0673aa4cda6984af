//! `xroce lat write|read|send`: one message in flight, latency per
//! iteration. As perftest reports them: send and write are half the round
//! trip (ping-pong), read is the whole round trip of a READ.
//!
//! Write ping-pong polls memory like ib_write_lat: each side writes the
//! iteration number into the last 8 bytes of the other's buffer (all of
//! it below 8 bytes, the number then truncated) and spins until its own
//! buffer shows the number it expects. Send ping-pong carries the number
//! the same way and each side checks every message it receives.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use xroce::verbs::{RecvWr, Wc, WrOpcode};
use xroce_report::lat_lines::{self, Recovery};

use super::{
    conn::{
        check_wc, client_setup_until_ready, serve_clients, server_connect, ClientSide, Conn, Done,
        Remote, Run, ServerSide, Verdict,
    },
    flags::{self, Tool},
    pattern,
    report::{print_json, LatReport, Latency, Table},
    stack::Stack,
    Op, PerfArgs, RunLength, Transport,
};

const DEFAULT_ITERS: u64 = 1000;
const RULE: &str =
    "---------------------------------------------------------------------------------------";
/// A message that does not come back in this time ends the run.
const STALL: Duration = Duration::from_secs(5);
/// An iteration (send, the peer's answer and the acknowledgement) longer
/// than this is reported on stderr with what the engine did meanwhile, so
/// a tail can be traced to its cause (issue 13: no stall above 10 ms).
const SLOW: Duration = Duration::from_millis(10);

/// With XROCE_LAT_SCHEDSTAT set: the time this process's threads (the
/// application's and the I/O thread) spent runnable but waiting for a CPU
/// (/proc/self/task/*/schedstat, second field), read before every
/// iteration, so a slow one can be told apart: the host's scheduler or
/// xroce. Off by default: the reads cost a few microseconds.
struct RunQueueWait {
    tasks: Vec<std::fs::File>,
    at_start: u64,
}

impl RunQueueWait {
    fn open() -> Option<Self> {
        std::env::var_os("XROCE_LAT_SCHEDSTAT")?;
        let tasks = std::fs::read_dir("/proc/self/task")
            .ok()?
            .filter_map(|e| std::fs::File::open(e.ok()?.path().join("schedstat")).ok())
            .collect();
        Some(Self { tasks, at_start: 0 })
    }

    fn total_ns(&self) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        self.tasks
            .iter()
            .filter_map(|f| {
                let n = f.read_at(&mut buf, 0).ok()?;
                let text = std::str::from_utf8(&buf[..n]).ok()?;
                text.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .sum()
    }

    fn start(&mut self) {
        self.at_start = self.total_ns();
    }

    fn since_start(&self) -> u64 {
        self.total_ns().saturating_sub(self.at_start)
    }
}

/// The engine's recovery counters, as `lat`'s stderr lines report them.
fn recovery(s: &xroce::engine::EngineStats) -> Recovery {
    Recovery {
        retransmit_timeouts: s.retry_timeouts,
        retransmitted: s.tx_retransmitted,
        retries: s.retries_started,
        sequence_naks_in: s.rx_seq_naks,
        duplicates_in: s.rx_duplicate,
    }
}

/// Reports a slow iteration with the engine's recovery counters since the
/// last one reported (`last`), which it then updates.
fn report_slow(
    side: &str,
    i: u64,
    took: Duration,
    stack: &Stack,
    last: &mut Recovery,
    waited: Option<&RunQueueWait>,
) {
    let now = recovery(&stack.device.stats());
    let cpu_wait = waited.map(|w| Duration::from_nanos(w.since_start()));
    eprintln!(
        "{}",
        lat_lines::slow_iteration_line(side, i, took, cpu_wait, &now.since(last))
    );
    *last = now;
}

/// The engine's recovery counters at the end of a run, on stderr.
fn report_recovery(side: &str, stack: &Stack, slow: u64) {
    let total = recovery(&stack.device.stats());
    eprintln!("{}", lat_lines::recovery_line(side, slow, SLOW, &total));
}

pub fn run(args: &PerfArgs) -> anyhow::Result<()> {
    if args.op == Op::Atomic {
        bail!("lat measures write, read or send; use `xroce bench atomic` for atomics");
    }
    flags::check(args, Tool::Lat)?;
    if args.perftest {
        return super::perftest::lat(args);
    }
    if args.listen.is_some() {
        return serve_clients(args, serve);
    }
    let sizes = flags::sizes(args, 65536, flags::ud_limit(args))?;
    if sizes.contains(&0) {
        bail!("--size must be at least 1");
    }
    let mut stack = None;
    for (i, &size) in sizes.iter().enumerate() {
        let run = Run {
            size,
            more: i + 1 < sizes.len(),
        };
        client(args, &mut stack, run, (i == 0, !run.more))?;
    }
    Ok(())
}

/// The bytes of a write that carry the iteration number: its last 8, or
/// all of a shorter one.
fn counter_len(size: usize) -> usize {
    size.min(8)
}

/// `n` as the last `counter_len(size)` bytes of a write carry it.
fn counter(n: u64, size: usize) -> Vec<u8> {
    n.to_le_bytes()[..counter_len(size)].to_vec()
}

/// Completions seen so far: sends acknowledged and messages received.
#[derive(Default)]
struct Seen {
    sends: u64,
    recvs: u64,
}

impl Seen {
    /// Reaps the CQ; a received message gets its buffer reposted at once.
    fn poll(&mut self, conn: &Conn, op: Op) -> anyhow::Result<()> {
        let mut wcs = [Wc::default(); 8];
        let n = conn.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            check_wc(wc, op.name())?;
            if wc.opcode == xroce::verbs::WcOpcode::Recv {
                self.recvs += 1;
                post_recv(conn)?;
            } else {
                self.sends += 1;
            }
        }
        Ok(())
    }

    /// Spins until `done(self, conn)` or the stall limit.
    fn until(
        &mut self,
        conn: &Conn,
        stack: &Stack,
        op: Op,
        what: &str,
        mut done: impl FnMut(&Seen, &Conn) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + STALL;
        // Where an empty poll runs the transport (AF_XDP), keep polling, as
        // perftest does: yielding gives the core to the other spinning
        // threads of a small host. Elsewhere (UDP) the I/O thread does the
        // work and needs the core. A WRITE's memory check takes the
        // engine's lock: it yields.
        let spin = op != Op::Write && conn.qps[0].device().polls_drive_transport();
        loop {
            self.poll(conn, op)?;
            if done(self, conn)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                stack.check_running()?;
                bail!(
                    "{what} within {STALL:?}; is the peer alive?\n{}",
                    qp_state(conn)
                );
            }
            if spin {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Waits for the peer's message `i`.
    fn message(
        &mut self,
        conn: &Conn,
        stack: &Stack,
        op: Op,
        i: u64,
        size: usize,
    ) -> anyhow::Result<()> {
        let what = format!("message {i} did not arrive");
        match op {
            Op::Write => {
                let w = counter_len(size);
                let at = conn.slot_offset(0, 0) + size - w;
                let want = counter(i + 1, size);
                let mut got = vec![0u8; w];
                // The engine of the QP (with --io-threads, the one it was
                // placed on), not necessarily the stack's first.
                let device = conn.qps[0].device();
                self.until(conn, stack, op, &what, |_, c| {
                    // The engine writes MR memory only with the device
                    // locked: holding the lock, the peer's WRITE cannot be
                    // landing on these bytes while we read them.
                    let _engine = device.lock();
                    // SAFETY: no concurrent writer while the engine lock is held.
                    unsafe { c.mr.read(at, &mut got) }?;
                    Ok(got == want)
                })
            }
            _ => {
                self.until(conn, stack, op, &what, |s, _| Ok(s.recvs > i))?;
                // Its last bytes carry the peer's iteration number. The
                // buffer is posted again already, but the next message
                // comes only after our answer (and a duplicate is never
                // placed): the bytes stay.
                let w = counter_len(size);
                let mut got = vec![0u8; w];
                {
                    let _engine = conn.qps[0].device().lock();
                    // (UD: the message lands after the 40-byte GRH.)
                    let at = conn.slot_offset(0, 0) + conn.grh + size - w;
                    // SAFETY: the engine writes MR memory only with the device locked.
                    unsafe { conn.mr.read(at, &mut got) }?;
                }
                if got != counter(i + 1, size) {
                    bail!("message {i} carried {got:?}, not its iteration number");
                }
                Ok(())
            }
        }
    }

    /// Waits until `n` sends (or READs) have completed.
    fn sends(&mut self, conn: &Conn, stack: &Stack, op: Op, n: u64) -> anyhow::Result<()> {
        let what = format!("the {} was not acknowledged", op.name());
        self.until(conn, stack, op, &what, |s, _| Ok(s.sends >= n))
    }
}

fn post_recv(conn: &Conn) -> anyhow::Result<()> {
    conn.qps[0].post_recv(&RecvWr {
        wr_id: 0,
        sg_list: vec![conn.mr.sge(conn.slot_offset(0, 0), conn.slot_len)],
    })?;
    Ok(())
}

/// Sends message `i`: a SEND or a WRITE whose last 8 bytes carry `i + 1`
/// (the receiver checks them).
fn ping(conn: &Conn, remote: &Remote, op: Op, i: u64, size: usize) -> anyhow::Result<()> {
    let src = conn.slot_offset(0, 1);
    let w = counter_len(size);
    // SAFETY: the last message from slot 1 completed (`sends` waits each); the peer writes slot 0.
    unsafe { conn.mr.write(src + size - w, &counter(i + 1, size)) }?;
    let opcode = match op {
        Op::Write => WrOpcode::RdmaWrite {
            remote_addr: remote.mr_addr + conn.slot_offset(0, 0) as u64,
            rkey: remote.rkey,
        },
        _ => WrOpcode::Send,
    };
    // Unsignaled would be cheaper, but a failed send must still surface.
    conn.post(0, &conn.send_wr(remote, 0, 1, opcode, src, size))
        .context("post")
}

fn serve(mut side: ServerSide<'_>) -> anyhow::Result<()> {
    let op = Op::from_name(&side.hello.op)?;
    let (conn, remote) = server_connect(&mut side)?;
    let ServerSide {
        stack,
        mut peer,
        hello,
        ..
    } = side;
    if op == Op::Read {
        // SAFETY: before sync(1) the client posts no READ, and this side posts nothing.
        unsafe {
            conn.mr
                .write(conn.slot_offset(0, 0), &pattern::make(0, 0, hello.size))
        }?;
    }
    if op == Op::Send {
        post_recv(&conn)?;
    }
    peer.sync(1)?;
    let iters: u64 = match op {
        Op::Read => 0,
        _ => hello.iters.context("the client sent no iteration count")?,
    };
    // Pong every ping.
    let mut seen = Seen::default();
    let mut last = recovery(&stack.device.stats());
    let mut waits = RunQueueWait::open();
    let mut slow = 0;
    let mut t0 = Instant::now();
    for i in 0..iters {
        seen.message(&conn, stack, op, i, hello.size)?;
        ping(&conn, &remote, op, i, hello.size)?;
        seen.sends(&conn, stack, op, i + 1)?;
        // From the end of the last iteration: the client's part, the wire
        // both ways and this side's acknowledgement wait.
        let took = t0.elapsed();
        if took > SLOW {
            slow += 1;
            report_slow("server", i, took, stack, &mut last, waits.as_ref());
        }
        if let Some(w) = &mut waits {
            w.start();
        }
        t0 = Instant::now();
    }
    report_recovery("server", stack, slow);
    peer.session.set_timeout(hello.run_timeout());
    let _done: Done = peer.recv("the end of the run")?;
    peer.session.set_timeout(super::OOB_TIMEOUT);
    peer.send(
        &Verdict {
            verified: true,
            detail: String::new(),
            cnps_sent: stack.device.stats().tx_cnps,
            ce_marked: stack.device.stats().rx_ce_marked,
            sent: None,
            sent_seconds: None,
        },
        "the verdict",
    )
}

/// One size's run; `rows`: whether it prints the table's header and its
/// closing rule (-a prints one table).
fn client(
    args: &PerfArgs,
    stack: &mut Option<Stack>,
    run: Run,
    rows: (bool, bool),
) -> anyhow::Result<()> {
    let size = run.size;
    let iters = match args.run_length(DEFAULT_ITERS) {
        RunLength::Iters(n) => n,
        RunLength::Duration(_) => bail!("lat runs a number of iterations: use --iters"),
    };
    let ClientSide {
        mut peer,
        remote,
        stack,
        conn,
        hello: _,
    } = client_setup_lat(args, stack, run, iters)?;
    let op = args.op;
    let mut samples = Vec::with_capacity(iters as usize);
    let mut verified = true;
    let mut seen = Seen::default();
    let mut last = recovery(&stack.device.stats());
    let mut waits = RunQueueWait::open();
    let mut slow = 0;
    let start = Instant::now();
    for i in 0..iters {
        if let Some(w) = &mut waits {
            w.start();
        }
        let t0 = Instant::now();
        match op {
            Op::Read => {
                let read = WrOpcode::RdmaRead {
                    remote_addr: remote.mr_addr + conn.slot_offset(0, 0) as u64,
                    rkey: remote.rkey,
                };
                conn.post(
                    0,
                    &conn.send_wr(&remote, 0, i, read, conn.slot_offset(0, 1), size),
                )?;
                seen.sends(&conn, stack, op, i + 1)?;
                samples.push(t0.elapsed().as_nanos() as u64);
            }
            _ => {
                ping(&conn, &remote, op, i, size)?;
                seen.message(&conn, stack, op, i, size)?;
                samples.push(t0.elapsed().as_nanos() as u64 / 2);
                seen.sends(&conn, stack, op, i + 1)?;
            }
        }
        let took = t0.elapsed();
        if took > SLOW {
            slow += 1;
            report_slow("client", i, took, stack, &mut last, waits.as_ref());
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    report_recovery("client", stack, slow);
    if op == Op::Read {
        // SAFETY: every READ into slot 1 has completed (`sends` waited for each).
        let got = unsafe { conn.mr.to_vec(conn.slot_offset(0, 1), size) }?;
        verified = got == pattern::make(0, 0, size);
    }
    peer.send(
        &Done {
            completed: vec![iters],
        },
        "the end of the run",
    )?;
    let _verdict: Verdict = peer.recv("the server's verdict")?;
    let stats = stack.device.stats();
    let bytes = iters * size as u64;
    let report = LatReport {
        op: op.name().into(),
        size: size as u64,
        iters,
        qps: 1,
        mtu: conn.mtu.bytes(),
        backend: stack.backend.into(),
        seconds: Some(seconds),
        bytes: Some(bytes),
        gbps: Some(bytes as f64 * 8.0 / seconds / 1e9),
        msgs_per_sec: Some(iters as f64 / seconds),
        verified: Some(verified),
        retransmits: stats.tx_retransmitted,
        cnps: stats.rx_cnps,
        lat_us: Latency::from_ns(samples),
        perftest: None,
    };
    if args.json {
        print_json(&report)?;
    } else if args.all {
        let l = &report.lat_us;
        let (first, last) = rows;
        if first {
            println!("{RULE}");
            println!(
                " xroce {}{} latency   backend {}   path MTU {}",
                report.op,
                if args.connection == Transport::Rc {
                    String::new()
                } else {
                    format!(" {}", args.connection.name())
                },
                report.backend,
                report.mtu
            );
            println!(
                " #bytes     #iterations    t_min[usec]    t_p50[usec]    t_p99[usec]    t_max[usec]    t_avg[usec]    verified"
            );
        }
        println!(
            " {:<10} {:<14} {:<14.2} {:<14.2} {:<14.2} {:<14.2} {:<14.2} {}",
            report.size,
            iters,
            l.min,
            l.p50,
            l.p99,
            l.max,
            l.avg,
            report
                .verified
                .map_or_else(|| "n/a".to_string(), |v| v.to_string())
        );
        if last {
            println!("{RULE}");
        }
    } else {
        let l = &report.lat_us;
        Table {
            op: &report.op,
            backend: &report.backend,
            mtu: report.mtu,
            qps: report.qps,
            cc: None,
            size: report.size,
            iters,
            gbps: bytes as f64 * 8.0 / seconds / 1e9,
            msgs_per_sec: iters as f64 / seconds,
            retransmits: report.retransmits,
            verified: report.verified,
            title: if args.connection == Transport::Rc {
                String::new()
            } else {
                format!(" {}", args.connection.name())
            },
        }
        .print();
        println!(
            " latency [us]: min {:.2}  p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}  avg {:.2}",
            l.min, l.p50, l.p99, l.p999, l.max, l.avg
        );
    }
    if !verified {
        bail!("READ data differs from the server's buffer");
    }
    Ok(())
}

/// The bandwidth client's setup with two slots (receive, send) and, for
/// sends, a receive posted before the server may answer.
fn client_setup_lat<'a>(
    args: &PerfArgs,
    stack: &'a mut Option<Stack>,
    run: Run,
    iters: u64,
) -> anyhow::Result<ClientSide<'a>> {
    client_setup_until_ready(
        args,
        stack,
        "lat",
        run,
        2,
        RunLength::Iters(iters),
        |conn| {
            if args.op == Op::Send {
                post_recv(conn)?;
            }
            Ok(())
        },
    )
}

/// Where the connection's QPs stand, for a stall's report: what was sent,
/// acknowledged and received, what waits in the queues.
fn qp_state(conn: &Conn) -> String {
    conn.qps
        .iter()
        .filter_map(|qp| {
            let qpn = qp.qp_num();
            let infos = qp.device().lock().qp_infos();
            let q = infos.into_iter().find(|q| q.qpn == qpn)?;
            Some(format!(
                "QP {qpn:#x} {:?}: next send PSN {}, oldest unacked {}, expected recv PSN {}, \
                 {} in flight, {} in the send queue, {} in the receive queue, \
                 {} retransmitted, {} timeouts, {} RNR NAKs in",
                q.state,
                q.next_send_psn,
                q.oldest_unacked_psn,
                q.expected_recv_psn,
                q.inflight_pkts,
                q.send_queue,
                q.recv_queue,
                q.counters.retransmitted,
                q.counters.timeouts,
                q.counters.rnr_naks_received,
            ))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
