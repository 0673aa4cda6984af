//! The backend of the process that owns a shared device's AF_XDP sockets:
//! the wire through AF_XDP, the device's other processes through a UDP
//! socket on this process's QPN-block port.
//!
//! Packets between two processes of one host never touch the link: they
//! are addressed to our own MAC and IP, and an AF_XDP socket would put them
//! on the wire, where nothing brings them back. So a datagram to our own
//! MAC (whose QP is not ours: the runtime keeps those) goes out through the
//! kernel's UDP stack, which loops it to the port of the destination QP's
//! block ([`crate::io::udp`] picks the port and computes its ICRC); what
//! the other processes send us arrives on the UDP socket the same way.

use std::{collections::VecDeque, time::Duration};

use xroce_transport::engine::frame;

use super::{udp::UdpBackend, IoStats, PacketIo, Received, Result, Transmit};

/// Datagrams for local processes waiting for room in the UDP batch.
const LOCAL_QUEUE: usize = 1024;

/// A quiet UDP socket is read on every this many receive rounds.
const LOCAL_READ_EVERY: u32 = 16;

/// AF_XDP (or any wire backend) plus a UDP socket for the host's own
/// processes.
pub struct WireAndLocal {
    wire: Box<dyn PacketIo>,
    local: UdpBackend,
    own_mac: [u8; 6],
    /// Datagrams for other processes taken from the engine, not yet sent:
    /// each with the buffer it was written into, up to its end.
    pending: VecDeque<(Transmit, Vec<u8>)>,
    /// Buffers of sent datagrams, for reuse.
    spare: Vec<Vec<u8>>,
    /// Datagrams to local processes dropped because `pending` was full
    /// (the transport retransmits them).
    local_overflow: u64,
    /// Receive rounds so far.
    rounds: u32,
    /// The last read of the UDP socket delivered frames.
    local_busy: bool,
}

/// Queues datagram `t`, written in `buf`, for the local processes.
fn queue_local(
    pending: &mut VecDeque<(Transmit, Vec<u8>)>,
    spare: &mut Vec<Vec<u8>>,
    overflow: &mut u64,
    t: Transmit,
    buf: &[u8],
) {
    if pending.len() >= LOCAL_QUEUE {
        *overflow += 1;
        return;
    }
    let mut b = spare.pop().unwrap_or_default();
    b.clear();
    b.extend_from_slice(&buf[..t.payload_at + t.len]);
    pending.push_back((t, b));
}

impl WireAndLocal {
    pub fn new(wire: Box<dyn PacketIo>, local: UdpBackend, own_mac: [u8; 6]) -> Self {
        Self {
            wire,
            local,
            own_mac,
            pending: VecDeque::new(),
            spare: Vec::new(),
            local_overflow: 0,
            rounds: 0,
            local_busy: false,
        }
    }

    /// Sends what waits for local processes, as far as the socket takes it.
    fn flush_local(&mut self) -> Result<usize> {
        let (pending, spare) = (&mut self.pending, &mut self.spare);
        self.local.transmit_datagrams(&mut |slot| {
            let (t, b) = pending.pop_front()?;
            // Both are as large as the engine's buffers.
            let n = b.len().min(slot.len());
            slot[..n].copy_from_slice(&b[..n]);
            spare.push(b);
            Some(t)
        })
    }

    /// Whether to read the UDP socket this round: a spinning runtime
    /// reads it every LOCAL_READ_EVERY-th round while it is quiet, every
    /// round while it delivers (looking at the AF_XDP rings costs no
    /// syscall, the socket one recvmmsg); a sleeping one every time.
    fn local_turn(&mut self, timeout: Duration) -> bool {
        self.rounds = self.rounds.wrapping_add(1);
        self.local_busy || self.rounds.is_multiple_of(LOCAL_READ_EVERY) || !timeout.is_zero()
    }
}

impl PacketIo for WireAndLocal {
    /// The wire's rings only: the local socket's datagrams (other
    /// processes' frames, rare) are the I/O thread's, which polls it.
    fn rx_waiting(&mut self) -> Option<bool> {
        self.wire.rx_waiting()
    }
    fn coalesces_rx(&self) -> bool {
        self.wire.coalesces_rx()
    }
    fn name(&self) -> &'static str {
        self.wire.name()
    }

    fn max_frame_len(&self) -> usize {
        self.wire.max_frame_len().min(self.local.max_frame_len())
    }

    fn recv_batch(&mut self, timeout: Duration, on_frame: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut local = 0;
        if self.local_turn(timeout) {
            local = self.local.recv_batch(Duration::ZERO, on_frame)?;
            self.local_busy = local > 0;
        }
        let wait = if local > 0 { Duration::ZERO } else { timeout };
        Ok(local + self.wire.recv_batch(wait, on_frame)?)
    }

    fn recv_datagrams(
        &mut self,
        timeout: Duration,
        on_datagram: &mut dyn FnMut(Received<'_>),
    ) -> Result<usize> {
        let mut local = 0;
        if self.local_turn(timeout) {
            local = self.local.recv_datagrams(Duration::ZERO, on_datagram)?;
            self.local_busy = local > 0;
        }
        let wait = if local > 0 { Duration::ZERO } else { timeout };
        Ok(local + self.wire.recv_datagrams(wait, on_datagram)?)
    }

    fn transmit(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Result<usize> {
        let mut sent = self.flush_local()?;
        let (own_mac, pending, spare, overflow) = (
            self.own_mac,
            &mut self.pending,
            &mut self.spare,
            &mut self.local_overflow,
        );
        sent += self.wire.transmit(&mut |buf| loop {
            let len = fill(buf)?;
            if buf.get(..6) != Some(&own_mac[..]) {
                return Some(len);
            }
            match frame::transmit_of(&buf[..len]) {
                Some(t) => queue_local(pending, spare, overflow, t, buf),
                // Not RoCEv2: the local socket could not carry it.
                None => *overflow += 1,
            }
        })?;
        Ok(sent + self.flush_local()?)
    }

    fn transmit_datagrams(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<Transmit>,
    ) -> Result<usize> {
        let mut sent = self.flush_local()?;
        let (own_mac, pending, spare, overflow) = (
            self.own_mac,
            &mut self.pending,
            &mut self.spare,
            &mut self.local_overflow,
        );
        sent += self.wire.transmit_datagrams(&mut |buf| loop {
            let t = fill(buf)?;
            if t.dst_mac != own_mac {
                return Some(t);
            }
            queue_local(pending, spare, overflow, t, buf);
        })?;
        Ok(sent + self.flush_local()?)
    }
    fn oversize_hint(&self) -> &'static str {
        self.wire.oversize_hint()
    }

    fn wait_writable(&mut self, timeout: Duration) -> Result<bool> {
        self.wire.wait_writable(timeout)
    }

    fn stats(&mut self) -> IoStats {
        let mut s = self.wire.stats() + self.local.stats();
        s.tx_errors += self.local_overflow;
        s
    }

    fn poll_fds(&self) -> Vec<i32> {
        let mut fds = self.wire.poll_fds();
        fds.extend(self.local.poll_fds());
        fds
    }
}
