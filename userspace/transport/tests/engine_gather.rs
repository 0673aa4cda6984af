//! Gathered sends (issue 27): the engine leaves a WRITE's or a READ
//! response's payload in its MR and says where; the frame the backend
//! then sends is the one a copying engine makes, and the data arrives
//! exactly once. Payloads in more pieces than a datagram may have, and
//! inline data, are copied as before.

use std::sync::Mutex;

use xroce_transport::engine::completion::{Completion, WcStatus};
use xroce_transport::engine::frame::complete_frame;
use xroce_transport::engine::gather::{Gather, GATHER_SEGMENTS};
use xroce_transport::engine::sim::{
    connect_engines, pattern, EngineEndpoint, EngineHost, LinkConfig, PairParams, Sim,
};
use xroce_transport::engine::work::{SendFlags, SendWr, WrOpcode};
use xroce_transport::engine::Engine;

const MS: u64 = 1_000_000;

fn lk(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    EngineHost::lock(m)
}

/// What crossed in one direction: frames, and of them how many had their
/// payload gathered.
#[derive(Default)]
struct Carried {
    frames: usize,
    gathered: usize,
}

/// Every frame `from` has ready, taken with a gather, its payload then
/// copied into place (what the kernel does from the iovec) and handed to
/// `to` as a whole checked frame. The buffer is poisoned first so that a
/// payload the engine neither wrote nor named cannot pass.
fn carry(from: &Mutex<Engine>, to: &Mutex<Engine>, now: u64, c: &mut Carried) {
    let mut buf = vec![0u8; 9000];
    let mut g = Gather::enabled();
    loop {
        buf.fill(0xa5);
        let Some(t) = lk(from).poll_transmit_gather(now, &mut buf, &mut g) else {
            break;
        };
        if let Some((at, len)) = g.payload() {
            let payload = t.payload_at..t.payload_at + t.len;
            assert!(payload.contains(&at) && at + len <= payload.end);
            assert!(
                buf[at..at + len].iter().all(|&b| b == 0xa5),
                "a gathered payload is not also copied"
            );
            c.gathered += 1;
        }
        g.copy_into(&mut buf);
        assert_eq!(g.payload(), None, "copy_into forgets the pieces");
        let n = complete_frame(&t, &mut buf);
        lk(to).handle_frame(&buf[..n], now);
        c.frames += 1;
    }
}

/// Runs both directions until A has `want` completions.
fn run(
    sim: &Sim<Mutex<Engine>>,
    want: usize,
    ab: &mut Carried,
    ba: &mut Carried,
) -> Vec<Completion> {
    let mut now = sim.now;
    let mut done = Vec::new();
    let deadline = now + 100 * MS;
    while done.len() < want && now < deadline {
        carry(&sim.a, &sim.b, now, ab);
        carry(&sim.b, &sim.a, now, ba);
        lk(&sim.a).take_completions(&mut done);
        now += 10_000;
        sim.fire_due_timers(now);
    }
    done
}

fn pair(seed: u64) -> (Sim<Mutex<Engine>>, EngineEndpoint, EngineEndpoint) {
    let sim = Sim::engine_pair(LinkConfig::default(), seed);
    let (a, b) = connect_engines(&sim, &PairParams::default());
    (sim, a, b)
}

fn signaled(mut wr: SendWr) -> SendWr {
    wr.flags |= SendFlags::SIGNALED;
    wr
}

#[test]
fn a_write_from_two_sges_is_gathered_and_lands_exactly() {
    let (sim, a, b) = pair(71);
    let len = 10_000;
    let data = pattern(71, len);
    // SAFETY: no work request is posted yet.
    unsafe { a.mr.write(0, &data).unwrap() };
    // Two SGEs cut mid-packet (MTU 1024), so a packet straddles them.
    let wr = signaled(SendWr::new(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr() + 64,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, 3000), a.mr.sge(3000, len - 3000)],
    ));
    lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    let (mut ab, mut ba) = (Carried::default(), Carried::default());
    let done = run(&sim, 1, &mut ab, &mut ba);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].wc.status, WcStatus::Success);
    assert_eq!(ab.frames, len.div_ceil(1024), "no retransmission");
    assert_eq!(ab.gathered, ab.frames, "every WRITE packet was gathered");
    let mut got = vec![0u8; len + 128];
    // SAFETY: the WRITE completed; nothing else uses B's MR.
    unsafe { b.mr.read(0, &mut got).unwrap() };
    assert!(got[..64].iter().all(|&x| x == 0), "nothing before");
    assert_eq!(&got[64..64 + len], &data[..], "the data, exactly");
    assert!(got[64 + len..].iter().all(|&x| x == 0), "nothing after");
}

#[test]
fn read_responses_are_gathered_from_the_responders_mr() {
    let (sim, a, b) = pair(72);
    let len = 5000;
    let data = pattern(72, len);
    // SAFETY: no work request is posted yet.
    unsafe { b.mr.write(128, &data).unwrap() };
    let wr = signaled(SendWr::new(
        2,
        WrOpcode::RdmaRead {
            remote_addr: b.mr.addr() + 128,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, len)],
    ));
    lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    let (mut ab, mut ba) = (Carried::default(), Carried::default());
    let done = run(&sim, 1, &mut ab, &mut ba);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].wc.status, WcStatus::Success);
    assert_eq!(ba.frames, len.div_ceil(1024));
    assert_eq!(ba.gathered, ba.frames, "every response was gathered");
    let mut got = vec![0u8; len];
    // SAFETY: the READ completed.
    unsafe { a.mr.read(0, &mut got).unwrap() };
    assert_eq!(got, data);
}

#[test]
fn too_many_pieces_and_inline_data_are_copied() {
    let (sim, a, b) = pair(73);
    let data = pattern(73, 1024);
    // SAFETY: no work request is posted yet.
    unsafe { a.mr.write(0, &data).unwrap() };
    // One packet from more SGEs than a datagram may gather.
    let n = GATHER_SEGMENTS + 1;
    let piece = 1024 / n;
    let mut sges: Vec<_> = (0..n - 1).map(|k| a.mr.sge(k * piece, piece)).collect();
    sges.push(a.mr.sge((n - 1) * piece, 1024 - (n - 1) * piece));
    let wr = signaled(SendWr::new(
        3,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        sges,
    ));
    lk(&sim.a).post_send(a.qpn, &wr).unwrap();
    // Inline data: the WR's own copy, never an MR.
    let mut inline = signaled(SendWr::new(
        4,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.addr() + 2048,
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, 100)],
    ));
    inline.flags |= SendFlags::INLINE;
    lk(&sim.a).post_send(a.qpn, &inline).unwrap();
    let (mut ab, mut ba) = (Carried::default(), Carried::default());
    let done = run(&sim, 2, &mut ab, &mut ba);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|c| c.wc.status == WcStatus::Success));
    assert_eq!((ab.frames, ab.gathered), (2, 0), "both copied");
    let mut got = vec![0u8; 2148];
    // SAFETY: both WRITEs completed.
    unsafe { b.mr.read(0, &mut got).unwrap() };
    assert_eq!(&got[..1024], &data[..]);
    assert_eq!(&got[2048..2148], &data[..100]);
}
