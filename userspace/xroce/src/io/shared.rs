//! The backend of the process that owns a shared device's AF_XDP sockets:
//! the wire through AF_XDP, the device's other processes through a UDP
//! socket on this process's QPN-block port.
//!
//! Frames between two processes of one host never touch the link: they
//! are addressed to our own MAC and IP, and an AF_XDP socket would put them
//! on the wire, where nothing brings them back. So a frame to our own MAC
//! (whose QP is not ours: the runtime keeps those) goes out through the
//! kernel's UDP stack, which loops it to the port of the destination QP's
//! block ([`crate::io::udp`] picks the port); what the other processes send
//! us arrives on the UDP socket the same way.

use std::{collections::VecDeque, time::Duration};

use super::{udp::UdpBackend, IoStats, PacketIo, Result};

/// Frames for local processes waiting for room in the UDP batch.
const LOCAL_QUEUE: usize = 1024;

/// A quiet UDP socket is read on every this many receive rounds.
const LOCAL_READ_EVERY: u32 = 16;

/// AF_XDP (or any wire backend) plus a UDP socket for the host's own
/// processes.
pub struct WireAndLocal {
    wire: Box<dyn PacketIo>,
    local: UdpBackend,
    own_mac: [u8; 6],
    /// Frames for other processes taken from the engine, not yet sent.
    pending: VecDeque<Vec<u8>>,
    /// Buffers of sent frames, for reuse.
    spare: Vec<Vec<u8>>,
    /// Frames to local processes dropped because `pending` was full
    /// (the transport retransmits them).
    local_overflow: u64,
    /// Receive rounds so far.
    rounds: u32,
    /// The last read of the UDP socket delivered frames.
    local_busy: bool,
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
        self.local.transmit(&mut |buf| {
            let f = pending.pop_front()?;
            let n = f.len().min(buf.len());
            buf[..n].copy_from_slice(&f[..n]);
            spare.push(f);
            Some(n)
        })
    }
}

impl PacketIo for WireAndLocal {
    fn name(&self) -> &'static str {
        self.wire.name()
    }

    fn max_frame_len(&self) -> usize {
        self.wire.max_frame_len().min(self.local.max_frame_len())
    }

    fn recv_batch(&mut self, timeout: Duration, on_frame: &mut dyn FnMut(&[u8])) -> Result<usize> {
        // Looking at the AF_XDP rings costs no syscall, the UDP socket one
        // recvmmsg: a spinning runtime reads the socket every
        // LOCAL_READ_EVERY-th round while it is quiet, every round while
        // it delivers (a sleeping runtime polls every descriptor anyway).
        self.rounds = self.rounds.wrapping_add(1);
        let mut local = 0;
        if self.local_busy || self.rounds.is_multiple_of(LOCAL_READ_EVERY) || !timeout.is_zero() {
            local = self.local.recv_batch(Duration::ZERO, on_frame)?;
            self.local_busy = local > 0;
        }
        let wait = if local > 0 { Duration::ZERO } else { timeout };
        Ok(local + self.wire.recv_batch(wait, on_frame)?)
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
            if pending.len() >= LOCAL_QUEUE {
                *overflow += 1;
                continue;
            }
            let mut f = spare.pop().unwrap_or_default();
            f.clear();
            f.extend_from_slice(&buf[..len]);
            pending.push_back(f);
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
