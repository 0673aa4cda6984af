//! The GSI QP (QP1): two devices exchange 256-byte MADs QP1 -> QP1 as the
//! connection managers do, every frame checked on the wire; the Q_Key
//! rules (a Q_Key with the MSB set sends the QP's own, QP1 takes only the
//! GSI Q_Key) and its life cycle (one per device, QPN 1, normal QPNs
//! unchanged).

use xroce::engine::{GSI_QKEY, GSI_QPN, QPN_BASE};
use xroce::verbs::sim::sim_configs;
use xroce::verbs::*;
use xroce_wire::{parse_frame_checked, FrameRepr, Opcode};

const MAD_LEN: usize = 256;
const GRH_LEN: usize = 40;
/// A normal UD QP's Q_Key (the CM's data QPs use such values).
const UD_QKEY: u32 = 0x1111_1111;

/// One frame `poll_transmit` produced, as parsed back from its bytes.
struct Sent {
    from_a: bool,
    frame: FrameRepr,
    payload: Vec<u8>,
}

/// Two devices on a perfect link, driven by hand so that every frame is
/// seen: UD needs no timers.
struct Pair {
    a: Device,
    b: Device,
    now: u64,
}

impl Pair {
    fn new() -> Self {
        let (ca, cb) = sim_configs();
        Self {
            a: Device::new(ca),
            b: Device::new(cb),
            now: 1_000_000,
        }
    }

    /// Deliver everything both sides have to send until both are quiet.
    fn pump(&mut self) -> Vec<Sent> {
        let mut sent = Vec::new();
        let mut buf = vec![0u8; 9000];
        loop {
            let mut moved = false;
            for from_a in [true, false] {
                let (src, dst) = if from_a {
                    (&self.a, &self.b)
                } else {
                    (&self.b, &self.a)
                };
                while let Some(n) = src.poll_transmit_frame(self.now, &mut buf) {
                    let (frame, payload) =
                        parse_frame_checked(&buf[..n]).expect("the engine emits valid frames");
                    sent.push(Sent {
                        from_a,
                        frame,
                        payload: payload.to_vec(),
                    });
                    dst.handle_frame(&buf[..n], self.now);
                    moved = true;
                }
            }
            self.now += 1_000;
            if !moved {
                return sent;
            }
        }
    }
}

fn ud_init(cq: &CompletionQueue) -> QpInitAttr {
    let mut init = QpInitAttr::rc(cq);
    init.qp_type = QpType::Ud;
    init.cap.max_send_wr = 16;
    init.cap.max_recv_wr = 16;
    init
}

/// RESET -> INIT (Q_Key, P_Key index 0, port 1) -> RTR -> RTS, as
/// ib_mad brings up QP1.
fn bring_up(qp: &QueuePair, qkey: u32) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qkey,
        pkey_index: 0,
        port_num: 1,
        ..Default::default()
    };
    qp.modify(
        &a,
        QpAttrMask::STATE | QpAttrMask::QKEY | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT,
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    qp.modify(&a, QpAttrMask::STATE).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = 0;
    qp.modify(&a, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
}

fn mad(seed: u8) -> Vec<u8> {
    (0..MAD_LEN)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect()
}

fn to(dev: &Device, qpn: u32, qkey: u32) -> UdAddress {
    let cfg = dev.lock().config().clone();
    UdAddress {
        av: AddressVector {
            dest_mac: cfg.mac,
            dest_ip: cfg.ip.into(),
            ..Default::default()
        },
        remote_qpn: qpn,
        remote_qkey: qkey,
    }
}

fn drain(cq: &CompletionQueue) -> Vec<Wc> {
    let mut out = Vec::new();
    while let Some(wc) = cq.poll_one().unwrap() {
        out.push(wc);
    }
    out
}

struct Side {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    /// Receive buffers (slot i at i * 512) and, from 8192, what is sent.
    mr: MemoryRegion,
}

fn side(dev: &Device) -> Side {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    let mr = pd.reg_mr(16384, AccessFlags::LOCAL_WRITE).unwrap();
    Side { pd, cq, mr }
}

const SEND_AT: usize = 8192;

fn post_recv(qp: &QueuePair, s: &Side, slot: usize) {
    qp.post_recv(&RecvWr {
        wr_id: 100 + slot as u64,
        sg_list: vec![s.mr.sge(slot * 512, GRH_LEN + MAD_LEN)],
    })
    .unwrap();
}

fn send_mad(qp: &QueuePair, s: &Side, wr_id: u64, data: &[u8], dest: UdAddress) {
    // SAFETY: no work request uses the send area while this is written
    // (every earlier send has been pumped and completed).
    unsafe { s.mr.write(SEND_AT, data).unwrap() };
    qp.post_send(&SendWr::new(wr_id, WrOpcode::Send, vec![s.mr.sge(SEND_AT, data.len())]).ud(dest))
        .unwrap();
}

/// The single frame of `sent`, from A if `from_a`.
fn only(sent: &[Sent], from_a: bool) -> &Sent {
    let v: Vec<&Sent> = sent.iter().filter(|s| s.from_a == from_a).collect();
    assert_eq!(v.len(), 1, "frames from {}", if from_a { "A" } else { "B" });
    v[0]
}

fn assert_ud_frame(s: &Sent, dest_qp: u32, src_qp: u32, qkey: u32, payload: &[u8]) {
    let t = &s.frame.transport;
    assert_eq!(t.bth.opcode, Opcode::UD_SEND_ONLY);
    assert_eq!(t.bth.dest_qp, dest_qp);
    assert_eq!(t.bth.pkey, 0xffff);
    let deth = t.deth.expect("a UD SEND carries a DETH");
    assert_eq!(
        (deth.qkey, deth.src_qp),
        (qkey, src_qp),
        "DETH (Q_Key, source QP)"
    );
    assert_eq!(s.payload, payload);
}

#[test]
fn gsi_qps_exchange_mads_both_ways() {
    let mut p = Pair::new();
    let (sa, sb) = (side(&p.a), side(&p.b));
    let gsi_a = p.a.create_gsi_qp(&sa.pd, &ud_init(&sa.cq)).unwrap();
    let gsi_b = p.b.create_gsi_qp(&sb.pd, &ud_init(&sb.cq)).unwrap();
    assert_eq!((gsi_a.qp_num(), gsi_b.qp_num()), (GSI_QPN, GSI_QPN));
    assert_eq!(gsi_a.state(), QpState::Reset);
    // A normal QP made after QP1 still gets the first normal number.
    let ud_a = p.a.create_qp(&sa.pd, &ud_init(&sa.cq)).unwrap();
    assert_eq!(ud_a.qp_num(), QPN_BASE);
    assert_eq!(QPN_BASE, 0x11);
    for qp in [&gsi_a, &gsi_b] {
        bring_up(qp, GSI_QKEY);
    }
    bring_up(&ud_a, UD_QKEY);

    post_recv(&gsi_b, &sb, 0);
    post_recv(&gsi_a, &sa, 0);
    let (req, rep) = (mad(0x5a), mad(0xa5));
    send_mad(&gsi_a, &sa, 1, &req, to(&p.b, GSI_QPN, GSI_QKEY));
    let sent = p.pump();
    assert_ud_frame(only(&sent, true), GSI_QPN, GSI_QPN, GSI_QKEY, &req);
    send_mad(&gsi_b, &sb, 2, &rep, to(&p.a, GSI_QPN, GSI_QKEY));
    let sent = p.pump();
    assert_ud_frame(only(&sent, false), GSI_QPN, GSI_QPN, GSI_QKEY, &rep);

    // Each side completed its send and received the other's MAD.
    for (s, recv_from, sent_id, data) in [(&sa, &p.b, 1, &rep), (&sb, &p.a, 2, &req)] {
        let wcs = drain(&s.cq);
        let send = wcs.iter().find(|w| w.opcode == WcOpcode::Send).unwrap();
        assert_eq!((send.wr_id, send.status), (sent_id, WcStatus::Success));
        let recv = wcs.iter().find(|w| w.opcode == WcOpcode::Recv).unwrap();
        assert_eq!(wcs.len(), 2, "{wcs:?}");
        assert_eq!(
            (
                recv.wr_id,
                recv.status,
                recv.qp_num,
                recv.src_qp,
                recv.byte_len
            ),
            (
                100,
                WcStatus::Success,
                GSI_QPN,
                GSI_QPN,
                (GRH_LEN + MAD_LEN) as u32
            )
        );
        assert!(recv.flags.contains(WcFlags::GRH));
        // The MAD exactly ...
        // SAFETY: receive 100 (0..296) has completed.
        let got = unsafe { s.mr.to_vec(0, GRH_LEN + MAD_LEN) }.unwrap();
        assert_eq!(&got[GRH_LEN..], &data[..]);
        // ... after a GRH: RoCEv2 over IPv4 is 20 zero bytes, then the
        // IPv4 header from the sender's address.
        assert_eq!(got[..20], [0u8; 20]);
        assert_eq!(got[20] >> 4, 4, "IPv4 version");
        let src_ip = recv_from.lock().config().ip.octets();
        assert_eq!(got[20 + 12..20 + 16], src_ip);
    }
}

#[test]
fn only_qp1_sends_and_takes_the_gsi_qkey() {
    let mut p = Pair::new();
    let (sa, sb) = (side(&p.a), side(&p.b));
    let gsi_a = p.a.create_gsi_qp(&sa.pd, &ud_init(&sa.cq)).unwrap();
    let ud_a = p.a.create_qp(&sa.pd, &ud_init(&sa.cq)).unwrap();
    let gsi_b = p.b.create_gsi_qp(&sb.pd, &ud_init(&sb.cq)).unwrap();
    let ud_b = p.b.create_qp(&sb.pd, &ud_init(&sb.cq)).unwrap();
    bring_up(&gsi_a, GSI_QKEY);
    bring_up(&ud_a, UD_QKEY);
    bring_up(&gsi_b, GSI_QKEY);
    bring_up(&ud_b, UD_QKEY);
    post_recv(&gsi_b, &sb, 0);
    post_recv(&ud_b, &sb, 1);
    let dropped = p.b.stats().rx_dropped_other;

    // A normal QP asking for the GSI Q_Key (MSB set) sends its own: QP1
    // drops it.
    let m = mad(1);
    send_mad(&ud_a, &sa, 1, &m, to(&p.b, GSI_QPN, GSI_QKEY));
    let sent = p.pump();
    assert_ud_frame(only(&sent, true), GSI_QPN, ud_a.qp_num(), UD_QKEY, &m);
    assert_eq!(p.b.stats().rx_dropped_other, dropped + 1);

    // QP1's MAD to a normal QP carries the GSI Q_Key, which that QP's
    // Q_Key check refuses.
    let m = mad(2);
    send_mad(&gsi_a, &sa, 2, &m, to(&p.b, ud_b.qp_num(), GSI_QKEY));
    let sent = p.pump();
    assert_ud_frame(only(&sent, true), ud_b.qp_num(), GSI_QPN, GSI_QKEY, &m);
    assert_eq!(p.b.stats().rx_dropped_other, dropped + 2);
    assert_eq!(p.b.stats().rx_unknown_qp, 0);

    // Neither receive completed; both sends did.
    assert_eq!(drain(&sb.cq), []);
    let wa: Vec<_> = drain(&sa.cq)
        .iter()
        .map(|w| (w.wr_id, w.status, w.qp_num))
        .collect();
    assert_eq!(
        wa,
        [
            (1, WcStatus::Success, ud_a.qp_num()),
            (2, WcStatus::Success, GSI_QPN)
        ]
    );
}

#[test]
fn one_gsi_qp_per_device_and_frames_to_a_missing_one_are_unknown() {
    let mut p = Pair::new();
    let (sa, sb) = (side(&p.a), side(&p.b));
    let gsi_a = p.a.create_gsi_qp(&sa.pd, &ud_init(&sa.cq)).unwrap();
    bring_up(&gsi_a, GSI_QKEY);
    assert_eq!(
        p.a.create_gsi_qp(&sa.pd, &ud_init(&sa.cq)).unwrap_err(),
        VerbsError::Transport(TransportError::AlreadyExists("the device's GSI QP (QP1)"))
    );
    let mut rc = ud_init(&sb.cq);
    rc.qp_type = QpType::Rc;
    assert_eq!(
        p.b.create_gsi_qp(&sb.pd, &rc).unwrap_err(),
        VerbsError::Transport(TransportError::InvalidArgument(
            "the GSI QP (QP1) is a UD QP"
        ))
    );

    // B has no QP1 (and its first normal QP is 0x11, not 1): counted as
    // an unknown QP and dropped.
    let ud_b = p.b.create_qp(&sb.pd, &ud_init(&sb.cq)).unwrap();
    assert_eq!(ud_b.qp_num(), QPN_BASE);
    send_mad(&gsi_a, &sa, 1, &mad(3), to(&p.b, GSI_QPN, GSI_QKEY));
    assert_eq!(p.pump().len(), 1);
    assert_eq!(p.b.stats().rx_unknown_qp, 1);

    // Destroyed, QP1 can be created again; a QP made meanwhile never gets 1.
    drop(gsi_a);
    let ud_a = p.a.create_qp(&sa.pd, &ud_init(&sa.cq)).unwrap();
    assert_eq!(ud_a.qp_num(), QPN_BASE);
    let again = p.a.create_gsi_qp(&sa.pd, &ud_init(&sa.cq)).unwrap();
    assert_eq!(again.qp_num(), GSI_QPN);
    assert_eq!(again.state(), QpState::Reset);
    // (A second device is independent.)
    let gsi_b = p.b.create_gsi_qp(&sb.pd, &ud_init(&sb.cq)).unwrap();
    assert_eq!(gsi_b.qp_num(), GSI_QPN);
    let mut qpns: Vec<u32> = p.a.lock().qp_numbers().collect();
    qpns.sort();
    assert_eq!(qpns, [GSI_QPN, QPN_BASE]);

    // QP1 takes only the GSI Q_Key even if INIT gave it another (as rxe):
    // a datagram with that other Q_Key is dropped.
    bring_up(&gsi_b, UD_QKEY);
    bring_up(&ud_a, UD_QKEY);
    post_recv(&gsi_b, &sb, 0);
    let dropped = p.b.stats().rx_dropped_other;
    let m = mad(4);
    send_mad(&ud_a, &sa, 2, &m, to(&p.b, GSI_QPN, UD_QKEY));
    let sent = p.pump();
    assert_ud_frame(only(&sent, true), GSI_QPN, QPN_BASE, UD_QKEY, &m);
    assert_eq!(p.b.stats().rx_dropped_other, dropped + 1);
    assert_eq!(drain(&sb.cq), []);
}
