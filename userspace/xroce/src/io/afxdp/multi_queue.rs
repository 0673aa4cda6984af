//! One socket per RX queue of an interface behind one [`PacketIo`]: every
//! queue is drained in turn, and a wait covers all of them in one poll(2).

use std::time::Duration;

use super::{
    datagram_at, rx_queue_count, setup_err, XskConfig, XskError, XskSocket, XskStats, MTU4096_HINT,
};
use crate::io::{poll_ms, IoStats, PacketIo, Received};

/// One socket per RX queue of an interface, behind one [`PacketIo`]: frames
/// from every queue are received; frames are sent on one queue (the first),
/// which keeps each flow's order.
pub struct XskMultiQueue {
    sockets: Vec<XskSocket>,
    pollfds: Vec<libc::pollfd>,
    /// Queue whose socket receives first next time (fairness).
    next_rx: usize,
}

impl XskMultiQueue {
    /// Opens a socket on every RX queue of `iface` (see [`rx_queue_count`]).
    pub fn open(iface: &str, config: XskConfig) -> Result<Self, XskError> {
        let queues = rx_queue_count(iface);
        Self::open_queues(iface, 0..queues, config)
    }

    /// Opens sockets on the given queues.
    pub fn open_queues(
        iface: &str,
        queues: impl IntoIterator<Item = u32>,
        config: XskConfig,
    ) -> Result<Self, XskError> {
        let sockets = queues
            .into_iter()
            .map(|q| XskSocket::open(iface, q, config))
            .collect::<Result<Vec<_>, _>>()?;
        if sockets.is_empty() {
            return Err(setup_err(iface, 0, "no RX queues to open"));
        }
        let pollfds = sockets
            .iter()
            .map(|s| libc::pollfd {
                fd: s.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        Ok(Self {
            sockets,
            pollfds,
            next_rx: 0,
        })
    }

    /// Every queue's frames available now (waiting at most `timeout` for
    /// the first), each with its arrival time (see
    /// [`XskSocket::recv_with_arrival`]).
    fn recv_all(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8], Option<u64>),
    ) -> std::io::Result<usize> {
        let count = self.sockets.len();
        let mut total = 0;
        for i in 0..count {
            let q = (self.next_rx + i) % count;
            total += self.sockets[q].recv_inner(0, on_frame)?;
        }
        self.next_rx = (self.next_rx + 1) % count;
        if total > 0 || timeout.is_zero() {
            return Ok(total);
        }
        if count == 1 {
            return self.sockets[0].recv_inner(poll_ms(timeout), on_frame);
        }
        for p in &mut self.pollfds {
            p.revents = 0;
        }
        // SAFETY: pollfds is a valid array of `count` entries.
        let rc = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                poll_ms(timeout),
            )
        };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(0);
            }
            return Err(e);
        }
        for q in 0..count {
            if self.pollfds[q].revents & libc::POLLIN != 0 {
                total += self.sockets[q].recv_inner(0, on_frame)?;
            }
        }
        Ok(total)
    }

    pub fn sockets(&self) -> &[XskSocket] {
        &self.sockets
    }

    /// The sockets, one per queue (e.g. for per-queue counters).
    pub fn sockets_mut(&mut self) -> &mut [XskSocket] {
        &mut self.sockets
    }

    /// Kernel counters summed over all queues.
    pub fn xsk_stats(&self) -> Result<XskStats, XskError> {
        let mut total = XskStats::default();
        for s in &self.sockets {
            total.add(&s.stats()?);
        }
        Ok(total)
    }
}

impl PacketIo for XskMultiQueue {
    fn rx_waiting(&mut self) -> Option<bool> {
        Some(
            self.sockets
                .iter_mut()
                .any(|s| s.rx_waiting() == Some(true)),
        )
    }

    fn name(&self) -> &'static str {
        "afxdp"
    }

    fn max_frame_len(&self) -> usize {
        self.sockets[0].max_frame_len()
    }

    fn oversize_hint(&self) -> &'static str {
        MTU4096_HINT
    }

    fn recv_batch(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> crate::io::Result<usize> {
        Ok(self.recv_all(timeout, &mut |f, _| on_frame(f))?)
    }

    /// The frames of `recv_batch`, parsed and checked, each with the
    /// arrival time the XDP program put in front of it.
    fn recv_datagrams(
        &mut self,
        timeout: Duration,
        on_datagram: &mut dyn FnMut(Received<'_>),
    ) -> crate::io::Result<usize> {
        Ok(self.recv_all(timeout, &mut |f, arrived| {
            on_datagram(datagram_at(f, arrived))
        })?)
    }

    fn transmit(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> crate::io::Result<usize> {
        Ok(self.sockets[0].transmit_inner(fill)?)
    }

    fn wait_writable(&mut self, timeout: Duration) -> crate::io::Result<bool> {
        PacketIo::wait_writable(&mut self.sockets[0], timeout)
    }

    fn stats(&mut self) -> IoStats {
        self.sockets
            .iter_mut()
            .map(|s| s.folded_stats())
            .fold(IoStats::default(), |a, b| a + b)
    }

    fn poll_fd(&self) -> Option<i32> {
        (self.sockets.len() == 1).then(|| self.sockets[0].raw_fd())
    }

    fn rx_pressure(&self) -> bool {
        self.sockets.iter().any(|s| s.rx_pressure)
    }

    fn poll_fds(&self) -> Vec<i32> {
        self.sockets.iter().map(|s| s.raw_fd()).collect()
    }
}
