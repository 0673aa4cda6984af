//! Sharing a device between processes: each process holds one QPN block
//! of it ([`xroce_common::qpn_block`]), and at most one holds its AF_XDP
//! sockets.
//!
//! A hold is an abstract Unix socket bound to a name made of the device's
//! ifindex and the block (`@xroce/<ifindex>/block/<b>`, `.../afxdp`): bind
//! is atomic, so two processes never get the same block; the kernel frees
//! the name the moment the process exits, however it ends (SIGKILL
//! included), so nothing is left to clean; abstract names belong to the
//! network namespace, as the device does; and no privilege is needed.
//! `ss -xl | grep xroce` lists the holders.

use std::os::fd::OwnedFd;

use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
use xroce_common::qpn_block;

/// What a hold is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Hold {
    Block(u32),
    AfXdp,
    /// Held while a process attaches the XDP program (two at once would
    /// each load one, and the loser's clean-up would unpin the winner's).
    Attaching,
}

fn name(ifindex: u32, hold: Hold) -> String {
    match hold {
        Hold::Block(b) => format!("xroce/{ifindex}/block/{b}"),
        Hold::AfXdp => format!("xroce/{ifindex}/afxdp"),
        Hold::Attaching => format!("xroce/{ifindex}/attaching"),
    }
}

/// The device (ifindex) and hold of an abstract name as /proc/net/unix
/// shows it (`@xroce/<ifindex>/...`); None for any other name.
pub(super) fn parse_name(shown: &str) -> Option<(u32, Hold)> {
    let (ifindex, what) = shown.strip_prefix("@xroce/")?.split_once('/')?;
    let hold = match what {
        "afxdp" => Hold::AfXdp,
        "attaching" => Hold::Attaching,
        w => Hold::Block(w.strip_prefix("block/")?.parse().ok()?),
    };
    let ifindex = ifindex.parse().ok()?;
    (format!("@{}", name(ifindex, hold)) == shown).then_some((ifindex, hold))
}

fn unix_socket() -> nix::Result<OwnedFd> {
    socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
}

/// Binds the abstract name of `hold`: Ok(None) if another process holds it.
fn take(ifindex: u32, hold: Hold) -> std::io::Result<Option<OwnedFd>> {
    let fd = unix_socket()?;
    let addr = UnixAddr::new_abstract(name(ifindex, hold).as_bytes())?;
    match bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
        Ok(()) => Ok(Some(fd)),
        Err(nix::Error::EADDRINUSE) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a process holds `hold` (its name is bound).
fn held(ifindex: u32, hold: Hold) -> bool {
    let Ok(fd) = unix_socket() else {
        return false;
    };
    let Ok(addr) = UnixAddr::new_abstract(name(ifindex, hold).as_bytes()) else {
        return false;
    };
    // A datagram connect succeeds exactly when the name is bound.
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).is_ok()
}

/// Why no block could be had.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error(
        "all {} QPN blocks of interface index {ifindex} are held: {} processes use this \
         device already",
        qpn_block::COUNT,
        qpn_block::COUNT
    )]
    Full { ifindex: u32 },
    #[error("claiming a QPN block: {0}")]
    Io(#[from] std::io::Error),
}

/// This process's QPN block on one device (released on drop or exit).
#[derive(Debug)]
pub struct QpnBlock {
    ifindex: u32,
    block: u32,
    hold: Option<OwnedFd>,
}

impl QpnBlock {
    /// Takes the lowest free block of device `ifindex` (in the calling
    /// thread's network namespace).
    pub fn claim(ifindex: u32) -> Result<Self, BlockError> {
        for block in 0..qpn_block::COUNT {
            if let Some(hold) = take(ifindex, Hold::Block(block))? {
                return Ok(Self {
                    ifindex,
                    block,
                    hold: Some(hold),
                });
            }
        }
        Err(BlockError::Full { ifindex })
    }

    /// Takes the lowest run of `n` consecutive free blocks of device
    /// `ifindex`: a device whose QPs are spread over `n` I/O threads
    /// (`xroce::runtime::shards`), one block each.
    pub fn claim_run(ifindex: u32, n: u32) -> Result<Vec<Self>, BlockError> {
        let n = n.max(1);
        'first: for first in 0..=qpn_block::COUNT.saturating_sub(n) {
            let mut run = Vec::new();
            for block in first..first + n {
                match take(ifindex, Hold::Block(block))? {
                    Some(hold) => run.push(Self {
                        ifindex,
                        block,
                        hold: Some(hold),
                    }),
                    // Dropping `run` gives back what it took.
                    None => continue 'first,
                }
            }
            return Ok(run);
        }
        Err(BlockError::Full { ifindex })
    }

    pub fn block(&self) -> u32 {
        self.block
    }

    /// The UDP port frames for this block arrive on.
    pub fn udp_port(&self) -> u16 {
        qpn_block::udp_port(self.block)
    }

    /// Gives the block back now (a process leaving the device, before it
    /// looks whether it is the last one).
    pub fn release(&mut self) {
        self.hold = None;
    }

    /// The blocks of this device other processes hold now.
    pub fn others(&self) -> Vec<u32> {
        (0..qpn_block::COUNT)
            .filter(|&b| b != self.block && held(self.ifindex, Hold::Block(b)))
            .collect()
    }

    /// Takes the device's AF_XDP hold, if no other process has it: only
    /// one process can own the sockets of an RX queue (a second would have
    /// to share the first one's UMEM, fill and completion rings).
    pub fn claim_afxdp(&self) -> std::io::Result<Option<AfXdpHold>> {
        Ok(take(self.ifindex, Hold::AfXdp)?.map(|fd| AfXdpHold { _hold: fd }))
    }
}

/// Waits up to `timeout` to be the only process attaching the XDP program
/// to device `ifindex`; the returned descriptor holds that until dropped.
pub(crate) fn attaching(ifindex: u32, timeout: std::time::Duration) -> std::io::Result<OwnedFd> {
    let until = std::time::Instant::now() + timeout;
    loop {
        if let Some(fd) = take(ifindex, Hold::Attaching)? {
            return Ok(fd);
        }
        if std::time::Instant::now() >= until {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("another process has been attaching the XDP program for {timeout:?}"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// This process owns the device's AF_XDP sockets (released on drop or exit).
#[derive(Debug)]
pub struct AfXdpHold {
    _hold: OwnedFd,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_exclusive_and_come_back_when_released() {
        // An ifindex no real interface of the test's namespace has.
        let ifindex = 0x7ff0_0000 + std::process::id() % 0x1000;
        let a = QpnBlock::claim(ifindex).unwrap();
        let b = QpnBlock::claim(ifindex).unwrap();
        assert_eq!((a.block(), b.block()), (0, 1));
        assert_eq!(a.others(), [1]);
        assert_eq!((a.udp_port(), b.udp_port()), (4791, 24791));
        let x = a.claim_afxdp().unwrap();
        assert!(x.is_some());
        assert!(b.claim_afxdp().unwrap().is_none(), "one AF_XDP owner");
        drop(x);
        assert!(b.claim_afxdp().unwrap().is_some());
        drop(a);
        assert!(b.others().is_empty());
        let c = QpnBlock::claim(ifindex).unwrap();
        assert_eq!(c.block(), 0, "a released block is taken again");
    }

    #[test]
    fn a_run_of_blocks_skips_a_held_one() {
        let ifindex = 0x7ff1_0000 + std::process::id() % 0x1000;
        let first = QpnBlock::claim(ifindex).unwrap();
        let second = QpnBlock::claim(ifindex).unwrap();
        drop(first);
        // Block 0 is free again but 1 is held: the run starts at 2.
        let run = QpnBlock::claim_run(ifindex, 2).unwrap();
        assert_eq!(run.iter().map(QpnBlock::block).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(
            QpnBlock::claim(ifindex).unwrap().block(),
            0,
            "0 was given back"
        );
        drop(second);
    }
}
