//! Helpers for packet-I/O end-to-end tests: valid RoCEv2 frames made with
//! xroce's codec and a guard that removes XDP pins however a test ends.

use std::net::IpAddr;

use xroce::io::wire::{
    emit_frame, parse_frame_checked, BthRepr, FrameRepr, Gid, IpRepr, Opcode, TransportRepr,
};

/// What a test frame carries besides its addresses.
#[derive(Clone, Copy, Debug)]
pub struct FrameSpec {
    pub qpn: u32,
    pub psn: u32,
    /// Payload bytes (a pattern derived from the PSN).
    pub len: usize,
    /// ECN codepoint in the IP header.
    pub ecn: u8,
    /// IPv4 identification (rxe sends random ones; xroce sends 0).
    pub ip_id: u16,
}

/// The payload pattern of a PSN, so receivers can verify every byte.
pub fn pattern(psn: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (psn as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

/// An RC SEND_ONLY frame between two hosts, ICRC filled.
pub fn roce_frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: IpAddr,
    dst: IpAddr,
    spec: FrameSpec,
) -> Vec<u8> {
    let bth = BthRepr {
        ack_req: true,
        ..BthRepr::new(Opcode::RC_SEND_ONLY, spec.qpn, spec.psn)
    };
    let mut repr = FrameRepr::new(
        src_mac,
        dst_mac,
        Gid::from(src),
        Gid::from(dst),
        xroce::io::wire::rocev2_src_port(0, spec.qpn ^ 0x55, spec.qpn),
        TransportRepr::new(bth),
    );
    repr.ip.set_ecn(spec.ecn);
    if let IpRepr::V4(ref mut v4) = repr.ip {
        v4.ident = spec.ip_id;
    }
    let payload = pattern(spec.psn, spec.len);
    let mut buf = vec![0u8; repr.frame_len(payload.len())];
    emit_frame(&repr, &payload, &mut buf).expect("emit test frame");
    buf
}

/// RC SEND_ONLY frames with PSNs `0..n` between two hosts, each described
/// by `spec(psn)`.
pub fn roce_frames(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: IpAddr,
    dst: IpAddr,
    n: u32,
    spec: impl Fn(u32) -> FrameSpec,
) -> Vec<Vec<u8>> {
    (0..n)
        .map(|psn| roce_frame(src_mac, dst_mac, src, dst, spec(psn)))
        .collect()
}

/// A received frame, checked: ICRC, RoCEv2 headers, payload pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked {
    pub qpn: u32,
    pub psn: u32,
    pub len: usize,
    pub ecn: u8,
    pub udp_src_port: u16,
    pub ip_id: u16,
}

/// Parses and verifies a received frame; Err says what was wrong.
pub fn check_frame(frame: &[u8]) -> Result<Checked, String> {
    let (repr, payload) = parse_frame_checked(frame).map_err(|e| format!("{e:?}"))?;
    let psn = repr.transport.bth.psn;
    if payload != pattern(psn, payload.len()).as_slice() {
        return Err(format!("payload of PSN {psn} is corrupt"));
    }
    let ip_id = match repr.ip {
        IpRepr::V4(v4) => v4.ident,
        IpRepr::V6(_) => 0,
    };
    Ok(Checked {
        qpn: repr.transport.bth.dest_qp,
        psn,
        len: payload.len(),
        ecn: repr.ip.ecn(),
        udp_src_port: repr.udp.src_port,
        ip_id,
    })
}

/// What one side of an [`exchange`] saw.
#[derive(Debug, Default)]
pub struct Exchange {
    /// Every frame received, checked, in arrival order.
    pub received: Vec<Result<Checked, String>>,
    pub sent: usize,
    /// From the first send to the last frame received.
    pub seconds: f64,
}

/// Asserts that side `name` of an exchange received no bad frame and
/// exactly the PSNs `0..n`, each once and in order; `context` goes into the
/// message when the count is wrong. Returns the frames received.
pub fn assert_exchange(name: &str, ex: &Exchange, n: u32, context: &str) -> Vec<Checked> {
    let bad: Vec<_> = ex
        .received
        .iter()
        .filter_map(|c| c.as_ref().err())
        .collect();
    assert!(
        bad.is_empty(),
        "{name}: bad frames: {:?}",
        &bad[..bad.len().min(5)]
    );
    let got: Vec<Checked> = ex.received.iter().map(|c| *c.as_ref().unwrap()).collect();
    assert_eq!(got.len(), n as usize, "{name}: frames received ({context})");
    assert!(
        got.iter().map(|c| c.psn).eq(0..n),
        "{name}: every PSN once, in order"
    );
    got
}

/// Runs one side of a frame exchange the way an engine's runtime loop
/// drives a backend: send `frames` in batches of `batch` (sleeping `pace`
/// after each batch) while receiving, until `expect` frames arrived (then
/// 200 ms more, to catch duplicates) or `timeout` passed.
pub fn exchange(
    io: &mut dyn xroce::io::PacketIo,
    frames: &[Vec<u8>],
    expect: usize,
    batch: usize,
    pace: std::time::Duration,
    timeout: std::time::Duration,
) -> Exchange {
    use std::time::{Duration, Instant};
    let start = Instant::now();
    let deadline = start + timeout;
    let mut out = Exchange::default();
    let mut last_rx = start;
    let mut refs: Vec<&[u8]> = Vec::with_capacity(batch);
    while Instant::now() < deadline {
        if out.sent < frames.len() {
            refs.clear();
            let end = (out.sent + batch).min(frames.len());
            refs.extend(frames[out.sent..end].iter().map(|f| f.as_slice()));
            out.sent += io.send_batch(&refs).expect("send_batch");
            if !pace.is_zero() {
                std::thread::sleep(pace);
            }
        }
        let wait = if out.sent < frames.len() {
            Duration::ZERO
        } else {
            Duration::from_millis(5)
        };
        let before = out.received.len();
        // Drain what is there (a few batches), waiting only for the first.
        let mut wait = wait;
        for _ in 0..16 {
            let n = io
                .recv_batch(wait, &mut |f| out.received.push(check_frame(f)))
                .expect("recv_batch");
            if n == 0 {
                break;
            }
            wait = Duration::ZERO;
        }
        if out.received.len() > before {
            last_rx = Instant::now();
        }
        if out.sent == frames.len() && out.received.len() >= expect {
            break;
        }
    }
    // Late or duplicate frames would show up now.
    let grace = Instant::now() + Duration::from_millis(200);
    while Instant::now() < grace {
        io.recv_batch(Duration::from_millis(20), &mut |f| {
            out.received.push(check_frame(f))
        })
        .expect("recv_batch");
    }
    out.seconds = (last_rx - start).as_secs_f64();
    out
}
