//! The hot path of one socket: frames in through the RX and fill rings,
//! out through the TX and completion rings, kicking the kernel only when it
//! asks (XDP_USE_NEED_WAKEUP). Nothing here allocates.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use xroce_common::rx_meta::{self, RxMeta};
use xsk_rs::{FrameDesc, Umem};

use super::{datagram_at, BusyPollStatus, XskError, XskSocket, MTU4096_HINT, XDP_PKT_CONTD};
use crate::io::{poll_ms, IoStats, PacketIo, Received};
use crate::runtime::MonotonicToEngine;

/// Kicks the kernel on `fd`: sendto for TX, recvfrom for RX/fill.
fn kick(fd: i32, rx: bool) -> std::io::Result<()> {
    // SAFETY: zero-length calls with null buffers are how AF_XDP is woken.
    let rc = unsafe {
        if rx {
            libc::recvfrom(
                fd,
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        } else {
            libc::sendto(
                fd,
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        }
    };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN | libc::EINTR) => {}
            _ => return Err(e),
        }
    }
    Ok(())
}

/// Takes the XDP program's arrival time (CLOCK_MONOTONIC) from the
/// [`RxMeta`] right in front of the data of the received chunk `desc` and
/// clears its magic, so that the chunk, recycled through the fill ring,
/// never shows it again (a frame redirected without metadata leaves those
/// bytes as they were). `None` if there is none.
///
/// # Safety
///
/// `desc` must be a descriptor of `umem` that the RX ring handed us and
/// that is not back on the fill ring yet (the chunk is ours), and
/// `frame_size` the UMEM's (power of two) chunk size.
#[inline]
unsafe fn take_arrival(umem: &Umem, desc: &FrameDesc, frame_size: u32) -> Option<u64> {
    // The kernel puts a received frame XDP_PACKET_HEADROOM (256) bytes into
    // its chunk (plus any UMEM headroom; an XDP program moving the start
    // moves it by less), and the metadata right in front of it. Checked,
    // not assumed: the LEN bytes in front must be in the same chunk.
    if desc.addr() & (frame_size as usize - 1) < rx_meta::LEN {
        return None;
    }
    // SAFETY: per this function's contract the chunk is ours: the kernel
    // is done writing it and does not touch it until it is back on the
    // fill ring, and nothing else in this process reads or writes it.
    let data = unsafe { umem.data(desc) }.contents().as_ptr();
    // The address LEN bytes in front of the data, with the UMEM mapping's
    // provenance: it comes from mmap(2) in xsk-rs and was handed to the
    // kernel (libxdp's xsk_umem__create), so it is exposed, and `data` is
    // only a view of part of it.
    let meta =
        std::ptr::with_exposed_provenance_mut::<[u8; rx_meta::LEN]>(data.addr() - rx_meta::LEN);
    // SAFETY: the check above puts these LEN bytes inside the same chunk
    // as the frame (between its start and the data), which is ours (see
    // above) and mapped for as long as `umem` lives; the reads and the
    // write are unaligned-safe.
    unsafe {
        let t = RxMeta::parse(&meta.read_unaligned())?;
        meta.cast::<u32>().write_unaligned(0);
        Some(t)
    }
}

/// Splits the [`RxMeta`] `xroce_xdp_head` put at the start of a frame off
/// it: the arrival time (CLOCK_MONOTONIC) and the frame. `None` if the
/// frame does not start with one (the program found no room for it). A
/// frame of its own would have to start with the destination MAC
/// 58:52:54:53:00:00 and a source MAC 00:00:.. to be mistaken for one.
#[inline]
fn split_head_arrival(part: &[u8]) -> Option<(u64, &[u8])> {
    let (head, frame) = part.split_first_chunk::<{ rx_meta::LEN }>()?;
    let [.., r0, r1, r2, r3, _, _, _, _, _, _, _, _] = *head;
    if [r0, r1, r2, r3] != [0; 4] {
        return None;
    }
    Some((RxMeta::parse(head)?, frame))
}

impl XskSocket {
    /// Receives up to one batch, waiting at most `timeout_ms` for the first
    /// frame; calls `on_frame` for each and returns how many arrived.
    pub fn recv(
        &mut self,
        timeout_ms: i32,
        mut on_frame: impl FnMut(&[u8]),
    ) -> Result<usize, XskError> {
        Ok(self.recv_inner(timeout_ms, &mut |f, _| on_frame(f))?)
    }

    /// [`recv`](Self::recv), with each frame's arrival time on the
    /// engine's clock ([`crate::runtime::now_ns`]) when the XDP program
    /// stamped it (`None` otherwise).
    pub fn recv_with_arrival(
        &mut self,
        timeout_ms: i32,
        mut on_frame: impl FnMut(&[u8], Option<u64>),
    ) -> Result<usize, XskError> {
        Ok(self.recv_inner(timeout_ms, &mut on_frame)?)
    }

    fn busy(&self) -> bool {
        matches!(self.busy_poll, BusyPollStatus::On(_))
    }

    /// Receives up to one batch (see [`recv`](Self::recv)); `on_frame`
    /// gets each frame with its arrival time on the engine's clock, if the
    /// XDP program stamped it.
    pub(super) fn recv_inner(
        &mut self,
        timeout_ms: i32,
        on_frame: &mut dyn FnMut(&[u8], Option<u64>),
    ) -> std::io::Result<usize> {
        // TX progresses in the same loop that receives.
        self.complete_tx()?;
        self.refill()?;
        // SAFETY: rx_batch descriptors are only written by the ring here.
        let mut n = unsafe { self.rx.consume(&mut self.rx_batch) };
        if n == 0 && timeout_ms != 0 {
            if self.busy() {
                // Busy polling: drive NAPI from here until a frame shows up.
                let deadline = Instant::now() + Duration::from_millis(timeout_ms.max(0) as u64);
                loop {
                    kick(self.raw_fd(), true)?;
                    // SAFETY: as above.
                    n = unsafe { self.rx.consume(&mut self.rx_batch) };
                    if n > 0 || Instant::now() >= deadline {
                        break;
                    }
                }
            } else if self.rx.poll(timeout_ms)? {
                // SAFETY: as above.
                n = unsafe { self.rx.consume(&mut self.rx_batch) };
            }
        }
        // What is still queued behind this batch: a ring filling faster
        // than we read it (a loaded core, too many senders) is congested.
        self.rx_pressure = n > 0 && self.rx.nb_avail_exact() >= self.pressure_frames;
        if n == 0 {
            return Ok(0);
        }
        let mut frames = 0;
        // One clock read per batch; each timestamp is then a subtraction.
        let clock = MonotonicToEngine::now();
        for desc in &self.rx_batch[..n] {
            // Every chunk's metadata is taken, a later fragment's too (the
            // kernel writes it in front of the first only, but the chunk
            // may have carried a first fragment before).
            // With xroce_xdp_head the time is in the first fragment's data.
            let mut arrived = if self.arrival_in_head {
                None
            } else {
                // SAFETY: the RX ring handed us this chunk of our UMEM, and
                // it goes back to the fill ring only after this loop.
                unsafe { take_arrival(&self.umem, desc, self.frame_size) }
                    .and_then(|t| clock.engine_ns(t))
            };
            // SAFETY: the kernel handed this frame to us; nothing else reads it.
            let data = unsafe { self.umem.data(desc) };
            let mut part = data.contents();
            // XDP_PKT_CONTD: more fragments of this frame follow.
            let contd = desc.options() & XDP_PKT_CONTD != 0;
            let first = self.rx_reasm.is_empty() && !self.rx_reasm_bad;
            if first && self.arrival_in_head {
                if let Some((t, frame)) = split_head_arrival(part) {
                    arrived = clock.engine_ns(t);
                    part = frame;
                }
            }
            if !contd && first {
                self.io_stats.rx_timestamped += u64::from(arrived.is_some());
                on_frame(part, arrived);
                frames += 1;
                self.io_stats.rx_frames += 1;
                self.io_stats.rx_bytes += part.len() as u64;
                continue;
            }
            if first {
                // A multi-buffer frame: it arrived when its first fragment did.
                self.rx_reasm_arrived = arrived;
            }
            if self.rx_reasm.len() + part.len() <= self.mb_max {
                self.rx_reasm.extend_from_slice(part);
            } else {
                self.rx_reasm_bad = true;
            }
            if !contd {
                if self.rx_reasm_bad {
                    self.io_stats.rx_dropped += 1;
                } else {
                    let arrived = self.rx_reasm_arrived;
                    self.io_stats.rx_timestamped += u64::from(arrived.is_some());
                    on_frame(&self.rx_reasm, arrived);
                    frames += 1;
                    self.io_stats.rx_frames += 1;
                    self.io_stats.rx_bytes += self.rx_reasm.len() as u64;
                }
                self.rx_reasm.clear();
                self.rx_reasm_bad = false;
                self.rx_reasm_arrived = None;
            }
        }
        // Give the frames straight back for new arrivals.
        self.fill_pending.extend_from_slice(&self.rx_batch[..n]);
        self.refill()?;
        Ok(frames)
    }

    /// Puts RX frames back on the fill ring and wakes the kernel if it asks.
    fn refill(&mut self) -> std::io::Result<()> {
        if self.fill_pending.is_empty() {
            return Ok(());
        }
        // SAFETY: the frames were consumed and are ours again.
        let done = unsafe { self.fill.produce(&self.fill_pending) };
        self.fill_pending.drain(..done);
        if done > 0 && (!self.need_wakeup || self.fill.needs_wakeup()) {
            kick(self.raw_fd(), true)?;
        }
        Ok(())
    }

    /// Sends `frames`, waiting for TX frames to come back if all are in
    /// flight. Returns how many were queued.
    pub fn send<'a>(
        &mut self,
        frames: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<usize, XskError> {
        let max = self.max_frame_len();
        let mut queued = 0;
        for frame in frames {
            if frame.len() > max {
                return Err(XskError::FrameTooBig {
                    len: frame.len(),
                    frame_size: self.frame_size,
                });
            }
            let deadline = Instant::now() + Duration::from_secs(1);
            loop {
                let mut once = Some(frame);
                let n = self.transmit_inner(&mut |buf| {
                    let f = once.take()?;
                    buf[..f.len()].copy_from_slice(f);
                    Some(f.len())
                })?;
                if n == 1 {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(XskError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no TX frame came back from the completion ring within 1 s",
                    )));
                }
                self.wait_tx(1)?;
            }
            queued += 1;
        }
        Ok(queued)
    }

    /// Multi-buffer TX: the frame is staged, then spread over chunks.
    fn transmit_mb(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<usize, XskError> {
        let cap = self.chunk_capacity();
        let worst = self.mb_max.div_ceil(cap);
        let mut queued = 0;
        let mut too_big = None;
        // Offer a buffer only while a largest frame would still fit.
        while self.tx_free.len() >= worst {
            let len = match fill(&mut self.tx_stage[..self.mb_max]) {
                None => break,
                Some(0) => break,
                Some(len) if len > self.mb_max => {
                    too_big = Some(len);
                    break;
                }
                Some(len) => len,
            };
            let pieces = len.div_ceil(cap);
            for (j, chunk) in self.tx_stage[..len].chunks(cap).enumerate() {
                let mut desc = self.tx_free.pop().expect("counted above");
                // SAFETY: the descriptor came from the free list.
                let mut data = unsafe { self.umem.data_mut(&mut desc) };
                let mut c = data.cursor();
                c.set_pos(0);
                c.write_all(chunk)?;
                desc.set_options(if j + 1 < pieces { XDP_PKT_CONTD } else { 0 });
                self.tx_batch.push(desc);
            }
            self.io_stats.tx_bytes += len as u64;
            queued += 1;
        }
        self.finish_send(queued, too_big)
    }

    pub(super) fn transmit_inner(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<usize, XskError> {
        self.complete_tx()?;
        self.tx_batch.clear();
        if self.multi_buffer {
            return self.transmit_mb(fill);
        }
        let max = self.max_frame_len();
        let mut too_big = None;
        while let Some(mut desc) = self.tx_free.pop() {
            // SAFETY: the descriptor came from the free list: nobody uses it.
            let mut data = unsafe { self.umem.data_mut(&mut desc) };
            {
                let mut c = data.cursor();
                let cap = c.buf_len();
                c.set_pos(cap);
            }
            let buf = data.contents_mut();
            let cap = buf.len().min(max);
            match fill(&mut buf[..cap]) {
                Some(len) if len > 0 && len <= cap => {
                    // The length must be set every time: a descriptor back
                    // from the completion ring has none.
                    data.cursor().set_pos(len);
                    desc.set_options(0);
                    self.io_stats.tx_bytes += len as u64;
                    self.tx_batch.push(desc);
                }
                Some(0) => {
                    self.tx_free.push(desc);
                    break;
                }
                Some(len) => {
                    self.tx_free.push(desc);
                    too_big = Some(len);
                    break;
                }
                None => {
                    self.tx_free.push(desc);
                    break;
                }
            }
        }
        let queued = self.tx_batch.len();
        self.finish_send(queued, too_big)
    }

    /// Common end of a send: kick the ring, count, report an oversized frame.
    fn finish_send(&mut self, queued: usize, too_big: Option<usize>) -> Result<usize, XskError> {
        self.flush_tx()?;
        self.io_stats.tx_frames += queued as u64;
        if let Some(len) = too_big {
            self.io_stats.tx_errors += 1;
            return Err(XskError::FrameTooBig {
                len,
                frame_size: self.frame_size,
            });
        }
        Ok(queued)
    }

    fn flush_tx(&mut self) -> Result<(), XskError> {
        if self.tx_batch.is_empty() {
            return Ok(());
        }
        // The TX ring is as large as the TX half of the UMEM, so it always
        // has room for every frame we own.
        // SAFETY: the descriptors were filled above and are owned by us.
        let done = unsafe { self.tx.produce(&self.tx_batch) };
        debug_assert_eq!(done, self.tx_batch.len());
        // Anything the ring did not take goes back to the free list.
        self.tx_free.extend_from_slice(&self.tx_batch[done..]);
        self.tx_batch.clear();
        if done > 0 && (!self.need_wakeup || self.tx.needs_wakeup()) {
            // Copy mode sends at most 32 frames per kick (the kernel's TX
            // batch); kick once per 32 so the whole batch leaves now.
            for _ in 0..done.div_ceil(32) {
                self.io_stats.tx_kicks += 1;
                kick(self.raw_fd(), false)?;
            }
        }
        Ok(())
    }

    /// Kicks the kernel if frames wait on the TX ring and it asks for it
    /// (in copy mode it always does: TX only progresses inside sendto),
    /// then reclaims completed frames.
    fn complete_tx(&mut self) -> std::io::Result<()> {
        self.reclaim();
        if self.tx_waiting() && (!self.need_wakeup || self.tx.needs_wakeup()) {
            self.io_stats.tx_kicks += 1;
            kick(self.raw_fd(), false)?;
            self.reclaim();
        }
        Ok(())
    }

    /// Whether frames wait on the TX ring for the kernel to take them.
    /// Frames it took but has not completed need no kick: in copy mode on a
    /// veth they complete when the peer's NAPI frees their skbs, and a
    /// kick meanwhile is a wasted sendto(2) per round of the I/O loop.
    fn tx_waiting(&mut self) -> bool {
        if self.tx_free.len() >= self.tx_total {
            return false;
        }
        // The TX ring is as large as the TX half of the UMEM.
        (self.tx.nb_free_exact() as usize) < self.tx_total
    }

    /// Moves completed TX frames back to the free list.
    fn reclaim(&mut self) {
        loop {
            // SAFETY: completed descriptors are ours again.
            let n = unsafe { self.comp.consume(&mut self.comp_batch) };
            self.tx_free.extend_from_slice(&self.comp_batch[..n]);
            if n < self.comp_batch.len() {
                break;
            }
        }
    }

    /// Waits up to `timeout_ms` for a TX frame to complete.
    pub(super) fn wait_tx(&mut self, timeout_ms: u64) -> Result<bool, XskError> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            self.complete_tx()?;
            if !self.tx_free.is_empty() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Frames in flight (queued on the TX ring, not yet completed).
    pub fn tx_in_flight(&mut self) -> usize {
        let _ = self.complete_tx();
        self.tx_total - self.tx_free.len()
    }
}

impl PacketIo for XskSocket {
    fn rx_waiting(&mut self) -> Option<bool> {
        Some(self.rx.nb_avail_exact() > 0)
    }

    fn name(&self) -> &'static str {
        "afxdp"
    }

    fn max_frame_len(&self) -> usize {
        XskSocket::max_frame_len(self)
    }

    fn oversize_hint(&self) -> &'static str {
        MTU4096_HINT
    }

    fn recv_batch(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> crate::io::Result<usize> {
        Ok(self.recv_inner(poll_ms(timeout), &mut |f, _| on_frame(f))?)
    }

    /// The frames of `recv_batch`, parsed and checked, each with the
    /// arrival time the XDP program put in front of it.
    fn recv_datagrams(
        &mut self,
        timeout: Duration,
        on_datagram: &mut dyn FnMut(Received<'_>),
    ) -> crate::io::Result<usize> {
        Ok(self.recv_inner(poll_ms(timeout), &mut |f, arrived| {
            on_datagram(datagram_at(f, arrived))
        })?)
    }

    fn transmit(
        &mut self,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> crate::io::Result<usize> {
        Ok(self.transmit_inner(fill)?)
    }

    fn wait_writable(&mut self, timeout: Duration) -> crate::io::Result<bool> {
        Ok(self.wait_tx(timeout.as_millis() as u64)?)
    }

    fn stats(&mut self) -> IoStats {
        self.folded_stats()
    }

    fn poll_fd(&self) -> Option<i32> {
        Some(self.raw_fd())
    }

    fn rx_pressure(&self) -> bool {
        self.rx_pressure
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(frame: &[u8], meta: RxMeta) -> Vec<u8> {
        // As the program writes it: native byte order, then the frame.
        let mut v = Vec::new();
        v.extend_from_slice(&meta.magic.to_ne_bytes());
        v.extend_from_slice(&meta.reserved.to_ne_bytes());
        v.extend_from_slice(&meta.ktime_ns.to_ne_bytes());
        v.extend_from_slice(frame);
        v
    }

    #[test]
    fn a_head_stamp_comes_off_with_its_time() {
        let frame = [0x02u8, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
        let part = stamped(&frame, RxMeta::new(123_456_789));
        assert_eq!(split_head_arrival(&part), Some((123_456_789, &frame[..])));
    }

    #[test]
    fn a_frame_without_a_head_stamp_stays_whole() {
        // An ordinary frame, one too short to hold a stamp, and the magic
        // with a non-zero reserved word (a MAC that happens to match).
        let frame = [
            0x02u8, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00, 0x45, 0,
        ];
        assert_eq!(split_head_arrival(&frame), None);
        assert_eq!(split_head_arrival(&frame[..8]), None);
        let mut odd = stamped(&frame, RxMeta::new(1));
        odd[4] = 1;
        assert_eq!(split_head_arrival(&odd), None);
    }
}
