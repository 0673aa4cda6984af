//! An in-memory link: two [`ChannelIo`] ends joined back to back, for tests
//! of whatever drives a [`PacketIo`] (the engine's runtime loop) without
//! namespaces or root. Buffers are allocated once, when the pair is made,
//! and recycled; a full direction refuses frames as a full TX ring would.

use std::{
    collections::VecDeque,
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use super::{IoError, IoStats, PacketIo, Result};

struct Pipe {
    queue: VecDeque<(Box<[u8]>, usize)>,
    free: Vec<Box<[u8]>>,
    /// Set when either end is dropped.
    closed: bool,
}

struct Shared {
    pipe: Mutex<Pipe>,
    /// Signalled when a frame is queued or a buffer is freed.
    changed: Condvar,
}

impl Shared {
    fn new(depth: usize, frame_len: usize) -> Arc<Self> {
        Arc::new(Self {
            pipe: Mutex::new(Pipe {
                queue: VecDeque::with_capacity(depth),
                free: (0..depth)
                    .map(|_| vec![0u8; frame_len].into_boxed_slice())
                    .collect(),
                closed: false,
            }),
            changed: Condvar::new(),
        })
    }
}

/// One end of an in-memory link.
pub struct ChannelIo {
    tx: Arc<Shared>,
    rx: Arc<Shared>,
    max_frame_len: usize,
    batch: usize,
    stats: IoStats,
    /// Buffers taken from the RX queue in one batch, returned after it.
    scratch: Vec<(Box<[u8]>, usize)>,
}

impl ChannelIo {
    /// Two ends joined back to back; each direction holds `depth` frames of
    /// up to `max_frame_len` bytes.
    pub fn pair(depth: usize, max_frame_len: usize) -> (ChannelIo, ChannelIo) {
        let ab = Shared::new(depth, max_frame_len);
        let ba = Shared::new(depth, max_frame_len);
        let end = |tx: &Arc<Shared>, rx: &Arc<Shared>| ChannelIo {
            tx: tx.clone(),
            rx: rx.clone(),
            max_frame_len,
            batch: 64,
            stats: IoStats::default(),
            scratch: Vec::with_capacity(64),
        };
        (end(&ab, &ba), end(&ba, &ab))
    }
}

impl Drop for ChannelIo {
    fn drop(&mut self) {
        for shared in [&self.tx, &self.rx] {
            if let Ok(mut p) = shared.pipe.lock() {
                p.closed = true;
            }
            shared.changed.notify_all();
        }
    }
}

impl PacketIo for ChannelIo {
    fn name(&self) -> &'static str {
        "channel"
    }

    fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    fn recv_batch(&mut self, timeout: Duration, on_frame: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        {
            let mut pipe = self.rx.pipe.lock().expect("channel lock");
            while pipe.queue.is_empty() {
                if pipe.closed {
                    return Err(IoError::Closed);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(0);
                }
                pipe = self
                    .rx
                    .changed
                    .wait_timeout(pipe, left)
                    .expect("channel lock")
                    .0;
            }
            let n = pipe.queue.len().min(self.batch);
            self.scratch.extend(pipe.queue.drain(..n));
        }
        // The callback runs without the lock, so it may send on this end.
        for (buf, len) in &self.scratch {
            on_frame(&buf[..*len]);
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += *len as u64;
        }
        let n = self.scratch.len();
        let mut pipe = self.rx.pipe.lock().expect("channel lock");
        pipe.free.extend(self.scratch.drain(..).map(|(b, _)| b));
        drop(pipe);
        self.rx.changed.notify_all();
        Ok(n)
    }

    fn transmit(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Result<usize> {
        let mut pipe = self.tx.pipe.lock().expect("channel lock");
        if pipe.closed {
            return Err(IoError::Closed);
        }
        let mut sent = 0;
        while let Some(mut buf) = pipe.free.pop() {
            match fill(&mut buf) {
                Some(len) if len > 0 && len <= buf.len() => {
                    self.stats.tx_frames += 1;
                    self.stats.tx_bytes += len as u64;
                    pipe.queue.push_back((buf, len));
                    sent += 1;
                }
                Some(len) if len > buf.len() => {
                    pipe.free.push(buf);
                    self.stats.tx_errors += 1;
                    return Err(IoError::FrameTooBig {
                        len,
                        max: self.max_frame_len,
                        hint: "",
                    });
                }
                Some(_) => {
                    pipe.free.push(buf);
                    break;
                }
                None => {
                    pipe.free.push(buf);
                    break;
                }
            }
        }
        drop(pipe);
        if sent > 0 {
            self.stats.tx_kicks += 1;
            self.tx.changed.notify_all();
        }
        Ok(sent)
    }

    fn wait_writable(&mut self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let mut pipe = self.tx.pipe.lock().expect("channel lock");
        while pipe.free.is_empty() {
            if pipe.closed {
                return Err(IoError::Closed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            pipe = self
                .tx
                .changed
                .wait_timeout(pipe, left)
                .expect("channel lock")
                .0;
        }
        Ok(true)
    }

    fn stats(&mut self) -> IoStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::send_all;

    #[test]
    fn frames_cross_both_ways_in_order() {
        let (mut a, mut b) = ChannelIo::pair(8, 64);
        assert_eq!(a.send_batch(&[b"one", b"two"]).unwrap(), 2);
        let mut got = Vec::new();
        let n = b
            .recv_batch(Duration::from_millis(10), &mut |f| got.push(f.to_vec()))
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!(got, vec![b"one".to_vec(), b"two".to_vec()]);
        b.send_batch(&[b"back"]).unwrap();
        let mut back = Vec::new();
        a.recv_batch(Duration::from_millis(10), &mut |f| {
            back.extend_from_slice(f)
        })
        .unwrap();
        assert_eq!(back, b"back");
        assert_eq!(a.stats().tx_frames, 2);
        assert_eq!(b.stats().rx_bytes, 6);
    }

    #[test]
    fn full_direction_refuses_then_recovers() {
        let (mut a, mut b) = ChannelIo::pair(4, 16);
        let frames: Vec<&[u8]> = vec![b"x"; 6];
        assert_eq!(a.send_batch(&frames).unwrap(), 4);
        assert!(!a.wait_writable(Duration::from_millis(1)).unwrap());
        let t = std::thread::spawn(move || {
            let mut n = 0;
            while n < 6 {
                n += b
                    .recv_batch(Duration::from_millis(100), &mut |_| {})
                    .unwrap();
            }
            n
        });
        assert_eq!(
            send_all(&mut a, &frames[4..], Duration::from_secs(2)).unwrap(),
            2
        );
        assert_eq!(t.join().unwrap(), 6);
    }

    #[test]
    fn oversized_frame_is_an_error_and_empty_recv_times_out() {
        let (mut a, mut b) = ChannelIo::pair(4, 16);
        let big = [0u8; 17];
        assert!(matches!(
            a.send_batch(&[&big]),
            Err(IoError::FrameTooBig {
                len: 17,
                max: 16,
                ..
            })
        ));
        let t0 = Instant::now();
        assert_eq!(
            b.recv_batch(Duration::from_millis(20), &mut |_| {})
                .unwrap(),
            0
        );
        assert!(t0.elapsed() >= Duration::from_millis(20));
        drop(a);
        assert!(matches!(
            b.recv_batch(Duration::ZERO, &mut |_| {}),
            Err(IoError::Closed)
        ));
    }
}
