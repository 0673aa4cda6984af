//! `ibv_dereg_mr`'s promise: once it returns, the device never touches the
//! memory again, so the program may free it at once. The engine copies
//! under its lock after checking that the region is still registered;
//! deregistration marks the region invalid, then waits for every engine
//! using the MR table to be past the copy it may be in, and for every
//! send whose payload the kernel gathers from MRs to be done.

use std::sync::mpsc;
use std::time::Duration;

use xroce::verbs::sim::sim_configs;
use xroce::verbs::*;

/// Drops `mr` in another thread while `engine` (a held engine lock: an
/// engine in the middle of a copy) lives: the drop must not return before
/// `engine` is released, and must return after.
fn assert_dereg_waits<G>(mr: MemoryRegion, engine: G, why: &str) {
    let (done_tx, done_rx) = mpsc::channel();
    let dereg = std::thread::spawn(move || {
        drop(mr);
        done_tx.send(()).unwrap();
    });
    assert_eq!(
        done_rx.recv_timeout(Duration::from_millis(300)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "{why}"
    );
    drop(engine);
    done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("ibv_dereg_mr returns once the engine lets go");
    dereg.join().unwrap();
}

#[test]
fn dereg_returns_only_once_the_engine_is_past_its_copy() {
    let (cfg, _) = sim_configs();
    let dev = Device::new(cfg);
    let pd = dev.alloc_pd();
    let mr = pd
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_dereg_waits(
        mr,
        dev.lock(),
        "ibv_dereg_mr returned while the engine was copying into the region",
    );
}

#[test]
fn every_engine_of_a_group_is_waited_for() {
    let (a, b) = sim_configs();
    let group = Device::group(vec![a, b]);
    let pd = group[0].alloc_pd();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    // The second engine shares the MR table and is mid-copy.
    assert_dereg_waits(
        mr,
        group[1].lock(),
        "ibv_dereg_mr did not wait for the group's other engine",
    );
}

#[test]
fn a_gathered_send_in_progress_is_waited_for() {
    let (cfg, _) = sim_configs();
    let dev = Device::new(cfg);
    let pd = dev.alloc_pd();
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // The engine lock is free; the backend is in sendmmsg, the kernel
    // copying a payload out of the region.
    assert_dereg_waits(
        mr,
        dev.sending(),
        "ibv_dereg_mr returned while a send was gathering from the region",
    );
}
