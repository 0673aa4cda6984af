//! The post path without the engine lock (verbs/post_ring.rs): with an I/O
//! thread's doorbell installed, `post_send` and `post_recv` return while
//! another thread holds the engine; what they queued reaches the engine in
//! post order, exactly once, when it is next locked; the send queue's room
//! is what the engine's own check gives; and a refused post gets the
//! engine's error.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use xroce::verbs::sim::{connect_pair, sim_pair, LinkConfig, PairParams};
use xroce::verbs::*;

/// A doorbell that counts its rings (an I/O thread would wake).
fn counting_doorbell(dev: &Device) -> Arc<AtomicUsize> {
    let rung = Arc::new(AtomicUsize::new(0));
    let r = rung.clone();
    dev.set_doorbell(Some(Arc::new(move || {
        r.fetch_add(1, Ordering::Relaxed);
    })));
    rung
}

fn write(id: u64, ep: &xroce::verbs::sim::Endpoint, peer: &MemoryRegion, len: usize) -> SendWr {
    SendWr::new(
        id,
        WrOpcode::RdmaWrite {
            remote_addr: peer.addr(),
            rkey: peer.rkey(),
        },
        vec![ep.mr.sge(0, len)],
    )
}

#[test]
fn posts_return_while_the_engine_is_locked_and_arrive_in_order() {
    let mut sim = sim_pair(LinkConfig::default(), 3);
    let (a, b) = connect_pair(&sim, &PairParams::default());
    let rung = counting_doorbell(&sim.a);
    let posts = 64u64;
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::scope(|s| {
        // The I/O thread in the middle of a batch. Taken in the scope's own
        // closure: if the check below fails, the guard drops before the
        // scope joins the poster, which then finishes instead of hanging.
        let engine = sim.a.lock();
        s.spawn(|| {
            for id in 0..posts {
                a.qp.post_send(&write(id, &a, &b.mr, 8)).unwrap();
            }
            done_tx.send(()).unwrap();
        });
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("post_send waited for the engine lock");
        assert!(sim.a.has_posted_work());
        drop(engine);
    });
    assert_eq!(rung.load(Ordering::Relaxed), posts as usize);
    let mut wcs = Vec::new();
    let mut buf = [Wc::default(); 16];
    sim.run_until(sim.now + 1_000_000_000, |_| {
        let n = a.cq.poll(&mut buf).unwrap();
        wcs.extend_from_slice(&buf[..n]);
        wcs.len() as u64 == posts
    });
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids,
        (0..posts).collect::<Vec<_>>(),
        "in post order, once each"
    );
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert!(!sim.a.has_posted_work());
    assert_eq!(sim.a.late_post_refusals(), 0);
}

#[test]
fn many_threads_posting_to_one_qp_lose_nothing() {
    let mut sim = sim_pair(LinkConfig::default(), 4);
    let p = PairParams {
        max_wr: 512,
        cq_depth: 1024,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    counting_doorbell(&sim.a);
    let (threads, each) = (4u64, 100u64);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (a, b) = (&a, &b);
            s.spawn(move || {
                for i in 0..each {
                    a.qp.post_send(&write(t * 1000 + i, a, &b.mr, 16)).unwrap();
                }
            });
        }
    });
    let mut ids = Vec::new();
    let mut buf = [Wc::default(); 64];
    sim.run_until(sim.now + 5_000_000_000, |_| {
        let n = a.cq.poll(&mut buf).unwrap();
        ids.extend(buf[..n].iter().map(|w| w.wr_id));
        ids.len() as u64 == threads * each
    });
    assert_eq!(ids.len() as u64, threads * each);
    // Each thread's posts complete in its order; none twice.
    for t in 0..threads {
        let mine: Vec<u64> = ids.iter().copied().filter(|id| id / 1000 == t).collect();
        assert_eq!(mine, (0..each).map(|i| t * 1000 + i).collect::<Vec<_>>());
    }
}

#[test]
fn the_send_queue_is_full_at_its_capacity_and_completions_free_it() {
    let mut sim = sim_pair(LinkConfig::default(), 5);
    let p = PairParams {
        max_wr: 8,
        ..Default::default()
    };
    let (a, b) = connect_pair(&sim, &p);
    counting_doorbell(&sim.a);
    for id in 0..8 {
        a.qp.post_send(&write(id, &a, &b.mr, 8)).unwrap();
    }
    let full = a.qp.post_send(&write(8, &a, &b.mr, 8)).unwrap_err();
    assert!(
        matches!(full, VerbsError::Transport(TransportError::QueueFull(_))),
        "{full}"
    );
    // Once a completion is polled, its room is there.
    let mut buf = [Wc::default(); 8];
    let mut got = 0;
    sim.run_until(sim.now + 1_000_000_000, |_| {
        got += a.cq.poll(&mut buf).unwrap();
        got > 0
    });
    assert!(got > 0);
    a.qp.post_send(&write(9, &a, &b.mr, 8)).unwrap();
}

#[test]
fn a_refused_post_gets_the_engines_error_at_once() {
    let sim = sim_pair(LinkConfig::default(), 6);
    let pd = sim.a.alloc_pd();
    let cq = sim.a.create_cq(16).unwrap();
    let qp = sim.a.create_qp(&pd, &QpInitAttr::rc(&cq)).unwrap();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    counting_doorbell(&sim.a);
    let wr = SendWr::new(1, WrOpcode::Send, vec![mr.sge(0, 8)]);
    // RESET: neither sends nor receives.
    let e = qp.post_send(&wr).unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Transport(TransportError::BadQpState(QpState::Reset))
        ),
        "{e}"
    );
    let e = qp
        .post_recv(&RecvWr {
            wr_id: 2,
            sg_list: vec![mr.sge(0, 8)],
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Transport(TransportError::BadQpState(QpState::Reset))
        ),
        "{e}"
    );
    assert!(!sim.a.has_posted_work(), "nothing refused was queued");
}
