//! UDP GSO / GRO in the UDP backend, end to end: a stream of 64 KiB RDMA
//! WRITEs from the UDP backend in namespace a to namespace b across a veth
//! pair (MTU 3500, path MTU 2048), with b on the UDP backend and with b on
//! AF_XDP. Asserted: the sender batches (most data frames leave inside UDP
//! GSO messages, a few sendmmsg calls per 64 KiB), the receiver's ICRC
//! check never fails, and every byte arrives as written. The sender sends
//! as the runtime does, each payload gathered from the MR by the kernel
//! (the ICRC computed over it there).
//!
//! With b on AF_XDP the sending veth segments in software (veth gives up
//! GSO towards a peer running XDP), so b sees every segment with the IPv4
//! header the kernel wrote: each one's ICRC is verified over it here, and
//! the ids follow the kernel's GSO numbering (0, 1, 2, .. in a message; 0
//! for a datagram alone) that the sender computed the ICRCs with.
//!
//! Run under `flock /tmp/xroce-netns.lock` beside other namespace tests.

use std::{
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use xroce::{
    device::{self, BackendKind, NetDevice, NetDeviceConfig},
    engine::EngineConfig,
    io::{
        udp::{UdpBackend, UdpConfig, UdpStats},
        wire::icrc,
        Gather, IoStats, PacketIo, Result as IoResult, Transmit,
    },
    runtime::{Runtime, RuntimeConfig},
    verbs::*,
};
use xroce_tests::{in_netns, require_root, VethPair};

const MSG: usize = 64 * 1024;
const MSGS: usize = 256;
/// WRITEs in flight at once.
const WINDOW: usize = 32;

/// The UDP backend, its counters copied out after every call (the runtime
/// owns the backend).
struct SeenUdp {
    io: UdpBackend,
    seen: Arc<Mutex<UdpStats>>,
}

impl PacketIo for SeenUdp {
    fn name(&self) -> &'static str {
        self.io.name()
    }
    fn max_frame_len(&self) -> usize {
        self.io.max_frame_len()
    }
    fn recv_batch(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> IoResult<usize> {
        let n = self.io.recv_batch(timeout, on_frame);
        *self.seen.lock().unwrap() = self.io.udp_stats();
        n
    }
    fn transmit(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> IoResult<usize> {
        let n = self.io.transmit(fill);
        *self.seen.lock().unwrap() = self.io.udp_stats();
        n
    }
    /// The runtime's path: payloads gathered from the MRs.
    fn transmit_gathered(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8], &mut Gather) -> Option<Transmit>,
    ) -> IoResult<usize> {
        let n = self.io.transmit_gathered(fill);
        *self.seen.lock().unwrap() = self.io.udp_stats();
        n
    }
    fn wait_writable(&mut self, timeout: Duration) -> IoResult<bool> {
        self.io.wait_writable(timeout)
    }
    fn stats(&mut self) -> IoStats {
        self.io.stats()
    }
    fn poll_fd(&self) -> Option<i32> {
        self.io.poll_fd()
    }
    fn poll_fds(&self) -> Vec<i32> {
        self.io.poll_fds()
    }
}

/// What a receiving backend saw of the frames from a, as they came off
/// the wire (AF_XDP: the real headers).
#[derive(Debug, Default)]
struct Wire {
    frames: u64,
    bad_icrc: u64,
    /// Data frames whose IPv4 id was not 0 (segments after the first of a
    /// GSO message).
    nonzero_ids: u64,
    /// Data frames whose id was neither 0 nor one more than the frame
    /// before it.
    out_of_run: u64,
    max_id: u16,
    last_id: Option<u16>,
}

/// A backend whose received frames are checked on the way in.
struct Checked {
    io: Box<dyn PacketIo>,
    from: Ipv4Addr,
    wire: Arc<Mutex<Wire>>,
}

impl PacketIo for Checked {
    fn name(&self) -> &'static str {
        self.io.name()
    }
    fn max_frame_len(&self) -> usize {
        self.io.max_frame_len()
    }
    fn recv_batch(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> IoResult<usize> {
        let wire = self.wire.clone();
        let from = self.from.octets();
        self.io.recv_batch(timeout, &mut |f| {
            if f.len() > 42 && f[12..14] == [8, 0] && f[26..30] == from {
                let mut w = wire.lock().unwrap();
                w.frames += 1;
                if icrc::verify_frame(f).is_err() {
                    w.bad_icrc += 1;
                }
                let id = u16::from_be_bytes([f[18], f[19]]);
                // Every RC WRITE opcode, FIRST to ONLY (ACKs do not go
                // this way). Two xroce peers agree on selective repeat, so
                // each packet is a FIRST with its RETH and the last an
                // ONLY; a GSO message runs across WRITEs, ONLY included.
                if (6..=10).contains(&f[42]) {
                    if id != 0 {
                        w.nonzero_ids += 1;
                        if w.last_id.map(|l| l.wrapping_add(1)) != Some(id) {
                            w.out_of_run += 1;
                        }
                    }
                    w.max_id = w.max_id.max(id);
                    w.last_id = Some(id);
                }
            }
            on_frame(f)
        })
    }
    fn transmit(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> IoResult<usize> {
        self.io.transmit(fill)
    }
    fn wait_writable(&mut self, timeout: Duration) -> IoResult<bool> {
        self.io.wait_writable(timeout)
    }
    fn stats(&mut self) -> IoStats {
        self.io.stats()
    }
    fn poll_fd(&self) -> Option<i32> {
        self.io.poll_fd()
    }
    fn poll_fds(&self) -> Vec<i32> {
        self.io.poll_fds()
    }
}

/// The UDP backend on `iface` / `ip` (opened in namespace `ns`).
fn udp_io(ns: &str, iface: &str, ip: Ipv4Addr) -> (UdpBackend, [u8; 6]) {
    let iface = iface.to_string();
    in_netns(ns, move || {
        let mac = device::interface_mac(&iface).unwrap();
        let mut cfg = UdpConfig::new(ip.into());
        cfg.local_mac = mac;
        // Both off by default (see UdpConfig::gso and gro).
        cfg.gso = true;
        cfg.gro = true;
        let io = UdpBackend::open(cfg).unwrap_or_else(|e| panic!("UDP backend on {ip}: {e}"));
        assert!(io.gso_enabled(), "this kernel refuses UDP_SEGMENT");
        assert!(io.gro_enabled(), "this kernel refuses UDP_GRO");
        (io, mac)
    })
}

/// Starts a runtime for `dev` on `io` from inside namespace `ns` (its
/// thread lives there too).
fn start(ns: &str, dev: &Device, io: Box<dyn PacketIo>) -> Runtime {
    let dev = dev.clone();
    in_netns(ns, move || {
        Runtime::start(dev, io, RuntimeConfig::default())
    })
}

fn pattern(msg: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| {
            (j as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(msg as u32 * 977) as u8
                ^ (j >> 8) as u8
        })
        .collect()
}

/// What a run reports.
struct Run {
    a_io: IoStats,
    a_udp: UdpStats,
    b_engine_bad_icrc: u64,
    b_engine_frames: u64,
    seconds: f64,
}

/// MSGS WRITEs of 64 KiB from a to b, each to its own place; checks every
/// completion and every byte.
fn write_stream(a_dev: &Device, b_dev: &Device, a_cfg: &EngineConfig, b_cfg: &EngineConfig) -> f64 {
    let (pd_a, pd_b) = (a_dev.alloc_pd(), b_dev.alloc_pd());
    let (cq_a, cq_b) = (a_dev.create_cq(256).unwrap(), b_dev.create_cq(256).unwrap());
    let qp_a = a_dev.create_qp(&pd_a, &QpInitAttr::rc(&cq_a)).unwrap();
    let qp_b = b_dev.create_qp(&pd_b, &QpInitAttr::rc(&cq_b)).unwrap();
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut data = Vec::with_capacity(MSG * MSGS);
    for m in 0..MSGS {
        data.extend(pattern(m, MSG));
    }
    let src = pd_a.reg_mr_with(&data, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd_b.reg_mr(MSG * MSGS, all).unwrap();
    let attr = QpAttr {
        qp_access_flags: all,
        path_mtu: Mtu::Mtu2048,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..Default::default()
    };
    let av = |c: &EngineConfig| AddressVector {
        dest_mac: c.mac,
        dest_ip: c.ip.into(),
        ..Default::default()
    };
    qp_a.connect(
        &attr,
        &RemoteQp {
            qpn: qp_b.qp_num(),
            psn: 0,
            av: av(b_cfg),
        },
    )
    .unwrap();
    qp_b.connect(
        &attr,
        &RemoteQp {
            qpn: qp_a.qp_num(),
            psn: 0,
            av: av(a_cfg),
        },
    )
    .unwrap();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(40);
    let (mut posted, mut done) = (0usize, 0usize);
    let mut wc = vec![Wc::default(); 64];
    while done < MSGS {
        while posted < MSGS && posted - done < WINDOW {
            let wr = SendWr::new(
                posted as u64,
                WrOpcode::RdmaWrite {
                    remote_addr: dst.addr() + (posted * MSG) as u64,
                    rkey: dst.rkey(),
                },
                vec![src.sge(posted * MSG, MSG)],
            );
            qp_a.post_send(&wr).unwrap();
            posted += 1;
        }
        let n = cq_a.poll(&mut wc).unwrap();
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success, "WRITE {}: {c:?}", c.wr_id);
            assert_eq!(c.opcode, WcOpcode::RdmaWrite);
        }
        done += n;
        if n == 0 {
            assert!(
                Instant::now() < deadline,
                "{done}/{MSGS} WRITEs done in 40 s"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // SAFETY: every WRITE into `dst` has completed.
    let got = unsafe { dst.to_vec(0, MSG * MSGS) }.unwrap();
    if let Some(at) = got.iter().zip(&data).position(|(g, d)| g != d) {
        panic!("data differs from byte {at} (message {})", at / MSG);
    }
    seconds
}

fn engine_cfg(mac: [u8; 6], ip: Ipv4Addr) -> EngineConfig {
    EngineConfig {
        mac,
        ip,
        ..Default::default()
    }
}

/// Common checks on the sending side: GSO carried the stream.
fn assert_batched(r: &Run, what: &str) {
    let (io, udp) = (&r.a_io, &r.a_udp);
    let gbps = (MSG * MSGS) as f64 * 8.0 / r.seconds / 1e9;
    let kicks_per_msg = io.tx_kicks as f64 / MSGS as f64;
    let segs_per_gso = udp.gso_segments as f64 / udp.gso_messages.max(1) as f64;
    eprintln!(
        "{what}: {MSGS} x 64 KiB WRITE in {:.3} s ({gbps:.2} Gb/s); sender {} frames in {} \
         messages ({} GSO carrying {}: {segs_per_gso:.1} per message), {} sendmmsg calls = \
         {kicks_per_msg:.2} per 64 KiB; receiver engine {} frames, {} bad ICRC",
        r.seconds,
        io.tx_frames,
        udp.tx_messages,
        udp.gso_messages,
        udp.gso_segments,
        io.tx_kicks,
        r.b_engine_frames,
        r.b_engine_bad_icrc,
    );
    // 64 KiB at path MTU 2048: 32 data frames, each the same size (under
    // selective repeat every one carries a RETH); a GSO message holds up
    // to 31 of them (the 64 KiB byte limit).
    let data_frames = (MSGS * MSG / 2048) as u64;
    assert!(io.tx_frames >= data_frames, "{io:?}");
    assert_eq!(udp.gso_refused, 0, "{udp:?}");
    assert!(
        udp.gso_segments * 10 >= data_frames * 8,
        "at least 80 % of the data frames in GSO messages: {udp:?}"
    );
    assert!(segs_per_gso >= 4.0, "{udp:?}");
    assert!(
        udp.tx_gathered >= data_frames,
        "every data frame's payload gathered from the MR: {udp:?}"
    );
    assert!(
        io.tx_kicks * 4 <= io.tx_frames,
        "at least 4 frames per sendmmsg: {io:?}"
    );
    assert_eq!(r.b_engine_bad_icrc, 0, "the receiver's ICRC check failed");
    assert!(r.b_engine_frames >= data_frames);
}

#[test]
fn write_stream_over_gso_to_a_udp_peer() {
    require_root();
    let pair = VethPair::new(3500);
    let (io_a, mac_a) = udp_io(&pair.a.name, &pair.if_a, pair.addr_a);
    let (io_b, mac_b) = udp_io(&pair.b.name, &pair.if_b, pair.addr_b);
    let (cfg_a, cfg_b) = (
        engine_cfg(mac_a, pair.addr_a),
        engine_cfg(mac_b, pair.addr_b),
    );
    let (dev_a, dev_b) = (Device::new(cfg_a.clone()), Device::new(cfg_b.clone()));
    let (seen_a, seen_b) = (Arc::default(), Arc::default());
    let rt_a = start(
        &pair.a.name,
        &dev_a,
        Box::new(SeenUdp {
            io: io_a,
            seen: Arc::clone(&seen_a),
        }),
    );
    let rt_b = start(
        &pair.b.name,
        &dev_b,
        Box::new(SeenUdp {
            io: io_b,
            seen: Arc::clone(&seen_b),
        }),
    );
    let seconds = write_stream(&dev_a, &dev_b, &cfg_a, &cfg_b);
    let a_io = rt_a.stop().expect("a's I/O thread");
    let b_io = rt_b.stop().expect("b's I/O thread");
    let b_stats = dev_b.stats();
    let r = Run {
        a_io,
        a_udp: *seen_a.lock().unwrap(),
        b_engine_bad_icrc: b_stats.rx_bad_icrc,
        b_engine_frames: b_io.rx_frames,
        seconds,
    };
    assert_batched(&r, "udp -> udp");
    let b_udp: UdpStats = *seen_b.lock().unwrap();
    eprintln!("receiver: {b_udp:?}");
    // The GSO messages crossed the veth whole and came out of b's socket
    // coalesced; each packet's ICRC held with the id its place predicts,
    // none had to be solved for.
    assert!(
        b_udp.gro_segments * 10 >= r.a_udp.gso_segments * 8,
        "{b_udp:?}"
    );
    assert_eq!(b_udp.icrc_unmatched, 0, "{b_udp:?}");
    assert_eq!(b_udp.ip_id_recovered, 0, "{b_udp:?}");
}

#[test]
fn write_stream_over_gso_to_an_afxdp_peer() {
    require_root();
    let pair = VethPair::new(3500);
    let (io_a, mac_a) = udp_io(&pair.a.name, &pair.if_a, pair.addr_a);
    // b: xroce's XDP program and AF_XDP sockets on every queue.
    let if_b = pair.if_b.clone();
    let (net_b, io_b) = in_netns(&pair.b.name, move || {
        let net = NetDevice::open(&if_b, NetDeviceConfig::default()).expect("open b with XDP");
        let io = net.open_io(BackendKind::AfXdp, 2048).expect("AF_XDP on b");
        (net, io)
    });
    let mac_b = net_b.mac();
    let wire = Arc::new(Mutex::new(Wire::default()));
    let io_b = Checked {
        io: io_b,
        from: pair.addr_a,
        wire: Arc::clone(&wire),
    };
    let (cfg_a, cfg_b) = (
        engine_cfg(mac_a, pair.addr_a),
        engine_cfg(mac_b, pair.addr_b),
    );
    let (dev_a, dev_b) = (Device::new(cfg_a.clone()), Device::new(cfg_b.clone()));
    let seen_a = Arc::default();
    let rt_a = start(
        &pair.a.name,
        &dev_a,
        Box::new(SeenUdp {
            io: io_a,
            seen: Arc::clone(&seen_a),
        }),
    );
    let rt_b = start(&pair.b.name, &dev_b, Box::new(io_b));
    let seconds = write_stream(&dev_a, &dev_b, &cfg_a, &cfg_b);
    let a_io = rt_a.stop().expect("a's I/O thread");
    let b_io = rt_b.stop().expect("b's I/O thread");
    let r = Run {
        a_io,
        a_udp: *seen_a.lock().unwrap(),
        b_engine_bad_icrc: dev_b.stats().rx_bad_icrc,
        b_engine_frames: b_io.rx_frames,
        seconds,
    };
    drop(net_b);
    assert_batched(&r, "udp -> afxdp");
    let w = wire.lock().unwrap();
    eprintln!("on the wire at b: {w:?}");
    // Every segment as it crossed the wire: valid RoCEv2 with its ICRC
    // right over the header the kernel wrote, the ids numbered as GSO
    // numbers them (the id-0 frame starting each message).
    assert!(w.frames >= (MSGS * MSG / 2048) as u64, "{w:?}");
    assert_eq!(w.bad_icrc, 0, "{w:?}");
    assert_eq!(w.out_of_run, 0, "{w:?}");
    assert!(
        w.nonzero_ids * 10 >= r.a_udp.gso_segments * 8,
        "segments after the first of a message carry ids 1, 2, ..: {w:?}"
    );
    assert!(w.max_id >= 4, "{w:?}");
}
