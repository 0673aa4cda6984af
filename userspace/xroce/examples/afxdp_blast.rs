//! The raw AF_XDP ceiling `cargo xtask bench` holds xroce's RDMA WRITE
//! against: frames of the size a 64 KiB WRITE puts on the wire (RoCE
//! path MTU payload + headers), blasted from one namespace to another
//! through the same AF_XDP backend xroce runs on (the same UMEM
//! configuration, the same XDP program redirecting to the same socket),
//! with no RDMA at all: no engine, no ICRC per frame, no ACKs.
//!
//! ```text
//! afxdp_blast recv IFACE SECONDS           # prints {"frames","bytes","seconds","payload_gbps"}
//! afxdp_blast send IFACE PEER_IP SECONDS PAYLOAD
//! ```
//!
//! The receiver measures from its first frame for SECONDS; the rate it
//! prints counts RoCE payload bytes (what WRITE goodput counts), so the two
//! figures compare directly.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use xroce::{
    device::{BackendKind, NetDevice, NetDeviceConfig},
    io::{
        wire::{emit_frame, BthRepr, FrameRepr, Gid, Opcode, TransportRepr},
        PacketIo,
    },
    xdp,
};

/// The destination QP of the blasted frames (in QPN block 0, whose frames
/// the XDP program steers to the sockets opened here).
const QPN: u32 = 0x11;
/// RoCE path MTU the blast uses: xroce's on a 3500-byte veth.
const PATH_MTU: u32 = 2048;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["recv", iface, secs] => recv(iface, seconds(secs)),
        ["send", iface, peer, secs, payload] => send(
            iface,
            peer.parse().expect("PEER_IP"),
            seconds(secs),
            payload.parse().expect("PAYLOAD bytes"),
        ),
        _ => {
            Err("usage: afxdp_blast recv IFACE SECONDS | send IFACE PEER_IP SECONDS PAYLOAD".into())
        }
    };
    if let Err(e) = result {
        eprintln!("afxdp_blast: {e}");
        std::process::exit(1);
    }
}

fn seconds(s: &str) -> Duration {
    Duration::from_secs_f64(s.parse().expect("SECONDS"))
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn open(iface: &str) -> Result<(NetDevice, Box<dyn PacketIo>)> {
    let dev = NetDevice::open(iface, NetDeviceConfig::default())?;
    let io = dev.open_io(BackendKind::AfXdp, PATH_MTU)?;
    xdp::set_xsk_block(iface, 0)?;
    xdp::register_qpn(iface, QPN)?;
    Ok((dev, io))
}

fn recv(iface: &str, span: Duration) -> Result<()> {
    let (_dev, mut io) = open(iface)?;
    // Ready: the sender starts after this line.
    eprintln!("afxdp_blast: receiving on {iface}");
    let (mut frames, mut bytes) = (0u64, 0u64);
    let mut first: Option<Instant> = None;
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let now = Instant::now();
        match first {
            Some(t) if now - t >= span => break,
            None if now > give_up => return Err("no frame arrived in 30 s".into()),
            _ => {}
        }
        let mut payload = 0u64;
        let n = io.recv_batch(Duration::from_millis(10), &mut |f| {
            payload += f.len().saturating_sub(HEADERS) as u64;
        })?;
        if n > 0 && first.is_none() {
            first = Some(Instant::now());
            continue; // the clock starts after the first batch
        }
        if first.is_some() {
            frames += n as u64;
            bytes += payload;
        }
    }
    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    println!(
        "{{\"frames\":{frames},\"bytes\":{bytes},\"seconds\":{secs:.3},\"payload_gbps\":{:.4}}}",
        bytes as f64 * 8.0 / secs / 1e9
    );
    Ok(())
}

/// Ethernet + IPv4 + UDP + BTH + ICRC: what is not payload in a WRITE
/// middle packet.
const HEADERS: usize = 14 + 20 + 8 + 12 + 4;

fn send(iface: &str, peer: IpAddr, span: Duration, payload: usize) -> Result<()> {
    let (dev, mut io) = open(iface)?;
    let me = dev.ip()?;
    let peer_mac = dev.neighbour_mac(peer, Duration::from_secs(5))?;
    let repr = FrameRepr::new(
        dev.mac(),
        peer_mac,
        Gid::from(me),
        Gid::from(peer),
        xroce::io::wire::rocev2_src_port(0, QPN, QPN),
        TransportRepr::new(BthRepr::new(Opcode::RC_RDMA_WRITE_MIDDLE, QPN, 0)),
    );
    let data = vec![0x5au8; payload];
    let mut frame = vec![0u8; repr.frame_len(payload)];
    emit_frame(&repr, &data, &mut frame)?;
    let end = Instant::now() + span;
    let mut sent = 0u64;
    while Instant::now() < end {
        // One copy per frame into the TX buffer, as the engine writes its
        // frames into the backend's buffers.
        let n = io.transmit(&mut |buf| {
            buf[..frame.len()].copy_from_slice(&frame);
            Some(frame.len())
        })?;
        sent += n as u64;
        if n == 0 {
            io.wait_writable(Duration::from_millis(1))?;
        }
    }
    eprintln!("afxdp_blast: sent {sent} frames of {} bytes", frame.len());
    Ok(())
}
