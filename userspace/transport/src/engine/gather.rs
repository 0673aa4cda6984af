//! Payload left where it is: a backend that sends through the kernel's
//! socket layer (the UDP backend) has the kernel copy a datagram's payload
//! straight from the registered memory into its buffers, one copy instead
//! of two ([`Engine::poll_transmit_gather`](super::Engine::poll_transmit_gather)).
//!
//! The engine then writes the datagram's headers, pad and ICRC slot into
//! the backend's buffer as always, leaves the payload's bytes there
//! unwritten, and says in a [`Gather`] where they are: up to
//! [`GATHER_SEGMENTS`] pieces of MRs. A payload in more pieces, or inline
//! data, is copied as before.
//!
//! The memory must outlive the send. Each piece holds its MR's `Arc`, so
//! memory xroce allocated stays until the backend lets go; application
//! memory stays until deregistration returns, and deregistration waits
//! for the sender (the runtime's send gate, part of the device's
//! quiesce hook, see [`super::memory::MrTable::on_quiesce`]).

use std::sync::Arc;

use super::memory::MrInner;

/// Most MR pieces one datagram's payload is gathered from.
pub const GATHER_SEGMENTS: usize = 4;

struct Piece {
    mr: Arc<MrInner>,
    off: usize,
    len: usize,
}

/// Where a datagram's payload is, when it was left in registered memory.
#[derive(Default)]
pub struct Gather {
    enabled: bool,
    /// Where the payload belongs in the buffer the datagram was written to.
    at: usize,
    len: usize,
    pieces: Vec<Piece>,
}

impl Gather {
    /// A gather the engine may fill (a disabled one, [`Gather::default`],
    /// makes it copy every payload).
    pub fn enabled() -> Self {
        Self {
            enabled: true,
            pieces: Vec::with_capacity(GATHER_SEGMENTS),
            ..Self::default()
        }
    }

    /// Whether the engine may leave payloads in their MRs.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// `(at, len)`: where the left payload belongs in the datagram's
    /// buffer, `None` when the buffer holds the whole datagram.
    pub fn payload(&self) -> Option<(usize, usize)> {
        (!self.pieces.is_empty()).then_some((self.at, self.len))
    }

    /// Forgets the pieces (a datagram that was sent or dropped).
    pub fn clear(&mut self) {
        self.pieces.clear();
        self.len = 0;
    }

    /// Copies the left payload into its place in `buf` (for a datagram
    /// that must be whole in memory: looped back, captured), then forgets it.
    pub fn copy_into(&mut self, buf: &mut [u8]) {
        let mut at = self.at;
        for p in &self.pieces {
            p.mr.read_at(p.off, &mut buf[at..at + p.len]);
            at += p.len;
        }
        self.clear();
    }

    /// The pieces, in order, as (address, length), for an iovec.
    pub fn pieces(&self) -> impl Iterator<Item = (*const u8, usize)> + '_ {
        self.pieces
            .iter()
            .map(|p| (p.mr.slice_ptr(p.off, p.len), p.len))
    }

    /// Hands each piece's bytes to `f` in order (the ICRC over them).
    pub fn for_each_piece(&self, f: &mut dyn FnMut(&[u8])) {
        for p in &self.pieces {
            p.mr.with_slice(p.off, p.len, &mut *f);
        }
    }

    /// Starts a payload at `at` in the buffer.
    pub(crate) fn start(&mut self, at: usize) {
        self.clear();
        self.at = at;
    }

    /// Adds `len` bytes at `off` of `mr`; false when the payload needs
    /// more pieces than one datagram may have.
    pub(crate) fn push(&mut self, mr: &Arc<MrInner>, off: usize, len: usize) -> bool {
        if self.pieces.len() == GATHER_SEGMENTS {
            return false;
        }
        self.pieces.push(Piece {
            mr: mr.clone(),
            off,
            len,
        });
        self.len += len;
        true
    }
}
