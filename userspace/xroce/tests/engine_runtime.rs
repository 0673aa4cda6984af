//! Runtime properties: no heap allocation per packet in steady state, and
//! the threading model the I/O backends use (one I/O thread per device
//! driving the engine while application threads post WRs and block on the
//! CQ's eventfd).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use xroce::verbs::sim::{connect_pair, sim_pair, LinkConfig, PairParams};
use xroce::verbs::*;

struct Counting;

thread_local! {
    // Per thread: other tests run concurrently in this process.
    static ALLOCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_allocates_per_work_request_not_per_packet() {
    let sim = sim_pair(LinkConfig::default(), 1);
    let p = PairParams {
        mtu: Mtu::Mtu1024,
        mr_len: 256 * 1024,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    let wr = SendWr::new(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, 256 * 1024)],
    )
    .flags(SendFlags::SIGNALED);
    let mut buf = vec![0u8; 9000];
    let mut wcs = [Wc::default(); 16];
    let mut run = |n_wr: u64| -> (u64, u64) {
        let before = allocs();
        let mut frames = 0u64;
        let mut now = 10_000_000u64;
        for _ in 0..n_wr {
            a.qp.post_send(&wr).unwrap();
            loop {
                now += 1_000;
                let mut ga = sim.a.lock();
                let mut gb = sim.b.lock();
                while let Some(n) = ga.poll_transmit_frame(now, &mut buf) {
                    gb.handle_frame(&buf[..n], now);
                    frames += 1;
                }
                while let Some(n) = gb.poll_transmit_frame(now, &mut buf) {
                    ga.handle_frame(&buf[..n], now);
                    frames += 1;
                }
                drop((ga, gb));
                if a.cq.poll(&mut wcs).unwrap() > 0 {
                    break;
                }
            }
        }
        (allocs() - before, frames)
    };
    run(4); // warm up queues and buffers
    let (allocs, frames) = run(20);
    eprintln!("{allocs} allocations for 20 WRs, {frames} frames");
    assert!(frames > 20 * 256);
    // The per-WR SGE list (and nothing per packet).
    assert!(allocs <= 20 * 4, "{allocs} allocations for {frames} frames");
}

#[test]
fn io_threads_drive_devices_while_app_threads_post_and_wait() {
    let sim = sim_pair(LinkConfig::default(), 2);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    // The doorbell tells the I/O side that new work was posted.
    let rings = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let r2 = rings.clone();
    sim.a.set_doorbell(Some(std::sync::Arc::new(move || {
        r2.fetch_add(1, Ordering::Relaxed);
    })));
    // Two "NICs" joined by channels, each driven by its own I/O thread with
    // real time, like the AF_XDP/UDP backends will do.
    let (tx_ab, rx_ab) = mpsc::channel::<Vec<u8>>();
    let (tx_ba, rx_ba) = mpsc::channel::<Vec<u8>>();
    let t0 = Instant::now();
    let mut io = Vec::new();
    for (dev, tx, rx) in [(sim.a.clone(), tx_ab, rx_ba), (sim.b.clone(), tx_ba, rx_ab)] {
        let stop = stop.clone();
        io.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 9000];
            while !stop.load(Ordering::Relaxed) {
                let now = t0.elapsed().as_nanos() as u64;
                {
                    let mut g = dev.lock();
                    while let Ok(f) = rx.try_recv() {
                        g.handle_frame(&f, now);
                    }
                    if g.poll_timeout().is_some_and(|t| t <= now) {
                        g.handle_timeout(now);
                    }
                    while let Some(n) = g.poll_transmit_frame(now, &mut buf) {
                        let _ = tx.send(buf[..n].to_vec());
                    }
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }));
    }
    // Application: B receives, A sends; both block on their CQ's eventfd.
    let n = 200u64;
    for i in 0..n {
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![b.mr.sge(i as usize * 64, 64)],
        })
        .unwrap();
    }
    let sender = {
        std::thread::spawn(move || {
            for i in 0..n {
                // SAFETY: send i, the first WR on slot i, is posted below; earlier ones use other slots.
                unsafe { a.mr.write(i as usize * 64, &i.to_le_bytes()) }.unwrap();
                a.qp.post_send(&SendWr::new(
                    i,
                    WrOpcode::Send,
                    vec![a.mr.sge(i as usize * 64, 8)],
                ))
                .unwrap();
            }
            let mut done = 0;
            let mut wcs = [Wc::default(); 32];
            while done < n {
                assert!(
                    a.cq.wait(Duration::from_secs(20)).unwrap(),
                    "send CQ never signalled"
                );
                let k = a.cq.poll(&mut wcs).unwrap();
                assert!(wcs[..k].iter().all(|w| w.status == WcStatus::Success));
                done += k as u64;
            }
            a
        })
    };
    let mut got = 0;
    let mut wcs = [Wc::default(); 32];
    while got < n {
        assert!(
            b.cq.wait(Duration::from_secs(20)).unwrap(),
            "recv CQ never signalled"
        );
        let k = b.cq.poll(&mut wcs).unwrap();
        for w in &wcs[..k] {
            assert_eq!(w.wr_id, got);
            // SAFETY: receive w.wr_id, the only WR on its slot, has completed (polled above).
            assert_eq!(
                unsafe { b.mr.to_vec(w.wr_id as usize * 64, 8) }.unwrap(),
                got.to_le_bytes()
            );
            got += 1;
        }
    }
    let _a = sender.join().unwrap();
    assert_eq!(rings.load(Ordering::Relaxed), n);
    stop.store(true, Ordering::Relaxed);
    for t in io {
        t.join().unwrap();
    }
}
