//! Sharing a device between processes: each process holds one QPN block
//! of it ([`xroce_common::qpn_block`]), and at most one holds its AF_XDP
//! sockets.
//!
//! Who may hold what: any user a block below [`qpn_block::ROOT_FIRST`];
//! root alone the blocks from there up, the AF_XDP sockets and the right
//! to attach the XDP program (both need root anyway).
//!
//! A user's block is an abstract Unix socket bound to a name made of the
//! device's ifindex and the block (`@xroce/<ifindex>/block/<b>`): bind is
//! atomic, so two processes never get the same block; the kernel frees the
//! name the moment the process exits, however it ends (SIGKILL included);
//! abstract names belong to the network namespace, as the device does; and
//! no privilege is needed. `ss -xl | grep xroce` lists them. They carry no
//! permissions either, so root's holds are locks only root can take
//! ([`super::root_lock`]): a local user who binds every name and UDP port
//! open to users cannot keep root's xroce from a block or from AF_XDP.
//! A block whose UDP port another socket has is skipped.

use std::os::fd::OwnedFd;

use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
use xroce_common::qpn_block;

use super::root_lock::{self, RootLock};

/// What a hold is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Hold {
    Block(u32),
    AfXdp,
    /// Held while a process attaches the XDP program (two at once would
    /// each load one, and the loser's clean-up would unpin the winner's).
    Attaching,
    /// Held by `xroce capture`: one at a time, as the program's perf
    /// buffers take one reader per CPU.
    Capture,
}

impl Hold {
    /// Whether only root may take it ([`root_lock`]), else it is an
    /// abstract name anyone may bind.
    fn is_root_only(self) -> bool {
        match self {
            Hold::Block(b) => qpn_block::is_root_only(b),
            Hold::AfXdp | Hold::Attaching | Hold::Capture => true,
        }
    }

    /// Its root lock's name.
    fn lock_name(self) -> String {
        match self {
            Hold::Block(b) => format!("block.{b}"),
            Hold::AfXdp => "afxdp".into(),
            Hold::Attaching => "attaching".into(),
            Hold::Capture => "capture".into(),
        }
    }

    /// The hold of a root lock's name.
    pub(super) fn of_lock_name(what: &str) -> Option<Hold> {
        match what {
            "afxdp" => Some(Hold::AfXdp),
            "attaching" => Some(Hold::Attaching),
            "capture" => Some(Hold::Capture),
            w => Some(Hold::Block(w.strip_prefix("block.")?.parse().ok()?)),
        }
    }
}

/// The abstract name of a user's block.
fn name(ifindex: u32, block: u32) -> String {
    format!("xroce/{ifindex}/block/{block}")
}

/// The device (ifindex) and block of an abstract name as /proc/net/unix
/// shows it (`@xroce/<ifindex>/block/<b>`); None for any other name.
pub(super) fn parse_name(shown: &str) -> Option<(u32, Hold)> {
    let (ifindex, what) = shown.strip_prefix("@xroce/")?.split_once('/')?;
    let block = what.strip_prefix("block/")?.parse().ok()?;
    let ifindex = ifindex.parse().ok()?;
    (format!("@{}", name(ifindex, block)) == shown && !qpn_block::is_root_only(block))
        .then_some((ifindex, Hold::Block(block)))
}

fn unix_socket() -> nix::Result<OwnedFd> {
    socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
}

/// What keeps a hold: a bound name or a root lock.
#[derive(Debug)]
enum Held {
    Name { _socket: OwnedFd },
    Lock { _lock: RootLock },
}

/// Takes `hold`: Ok(None) if another process holds it.
fn take(ifindex: u32, hold: Hold) -> std::io::Result<Option<Held>> {
    if hold.is_root_only() {
        return Ok(
            root_lock::try_take(ifindex, &hold.lock_name())?.map(|l| Held::Lock { _lock: l })
        );
    }
    let Hold::Block(block) = hold else {
        unreachable!("only blocks are names")
    };
    let fd = unix_socket()?;
    let addr = UnixAddr::new_abstract(name(ifindex, block).as_bytes())?;
    match bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
        Ok(()) => Ok(Some(Held::Name { _socket: fd })),
        Err(nix::Error::EADDRINUSE) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a process holds user block `block` (its name is bound).
fn name_bound(ifindex: u32, block: u32) -> bool {
    let Ok(fd) = unix_socket() else {
        return false;
    };
    let Ok(addr) = UnixAddr::new_abstract(name(ifindex, block).as_bytes()) else {
        return false;
    };
    // A datagram connect succeeds exactly when the name is bound.
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).is_ok()
}

/// Why no block could be had.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error(
        "all {blocks} QPN blocks of interface index {ifindex} that {who} may hold are held, \
         or their UDP ports are bound: `xroce status` and `ss -uaxp` show by whom{hint}"
    )]
    Full {
        ifindex: u32,
        blocks: u32,
        who: &'static str,
        hint: &'static str,
    },
    #[error("claiming a QPN block: {0}")]
    Io(#[from] std::io::Error),
}

/// This process's QPN block on one device (released on drop or exit).
#[derive(Debug)]
pub struct QpnBlock {
    ifindex: u32,
    block: u32,
    hold: Option<Held>,
}

impl QpnBlock {
    /// Takes the lowest free block of device `ifindex` (in the calling
    /// thread's network namespace): a user's first, then, for root, root's
    /// own.
    pub fn claim(ifindex: u32) -> Result<Self, BlockError> {
        Ok(Self::claim_run(ifindex, 1, |_| true)?.remove(0))
    }

    /// Takes the lowest free block of root's ([`qpn_block::ROOT_FIRST`] and
    /// up): a process that must count as a user of the device (so that the
    /// last process does not detach the XDP program under it) without
    /// taking a block others would use.
    pub fn claim_root(ifindex: u32) -> Result<Self, BlockError> {
        for block in qpn_block::ROOT_FIRST..qpn_block::COUNT {
            if let Some(hold) = take(ifindex, Hold::Block(block))? {
                return Ok(Self {
                    ifindex,
                    block,
                    hold: Some(hold),
                });
            }
        }
        Err(BlockError::Full {
            ifindex,
            blocks: qpn_block::COUNT - qpn_block::ROOT_FIRST,
            who: "root",
            hint: "",
        })
    }

    /// Takes the lowest run of `n` consecutive free blocks of device
    /// `ifindex` whose UDP ports `port_free` finds free (the backend binds
    /// them; [`crate::io::udp::port_free`]), all a user's or all root's: a
    /// device whose QPs are spread over `n` I/O threads
    /// (`xroce::runtime::shards`), one block each.
    pub fn claim_run(
        ifindex: u32,
        n: u32,
        port_free: impl Fn(u16) -> bool,
    ) -> Result<Vec<Self>, BlockError> {
        let n = n.max(1);
        // Root's blocks are root's alone.
        let root = crate::xdp::is_root();
        let ranges = [
            Some(0..qpn_block::ROOT_FIRST),
            root.then_some(qpn_block::ROOT_FIRST..qpn_block::COUNT),
        ];
        for range in ranges.into_iter().flatten() {
            'first: for first in range.start..=range.end.saturating_sub(n) {
                let mut run = Vec::new();
                for block in first..first + n {
                    match take(ifindex, Hold::Block(block))? {
                        Some(hold) if port_free(qpn_block::udp_port(block)) => run.push(Self {
                            ifindex,
                            block,
                            hold: Some(hold),
                        }),
                        // Dropping `run` (and `hold`) gives back what it took.
                        _ => continue 'first,
                    }
                }
                return Ok(run);
            }
        }
        Err(BlockError::Full {
            ifindex,
            blocks: if root {
                qpn_block::COUNT
            } else {
                qpn_block::ROOT_FIRST
            },
            who: if root { "root" } else { "a user" },
            hint: if root {
                ""
            } else {
                "; root's processes have blocks of their own"
            },
        })
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

    /// The blocks of this device other processes hold now (root's only
    /// when we are root: no one else may see them).
    pub fn others(&self) -> Vec<u32> {
        let mut others: Vec<u32> = (0..qpn_block::ROOT_FIRST)
            .filter(|&b| b != self.block && name_bound(self.ifindex, b))
            .collect();
        others.extend(
            root_lock::held()
                .into_iter()
                .filter(|(ifindex, _, _)| *ifindex == self.ifindex)
                .filter_map(|(_, what, _)| match Hold::of_lock_name(&what)? {
                    Hold::Block(b) if b != self.block => Some(b),
                    _ => None,
                }),
        );
        others.sort_unstable();
        others
    }

    /// Takes the device's AF_XDP hold, if no other process has it: only
    /// one process can own the sockets of an RX queue (a second would have
    /// to share the first one's UMEM, fill and completion rings).
    /// Root's alone (PermissionDenied for anyone else).
    pub fn claim_afxdp(&self) -> std::io::Result<Option<AfXdpHold>> {
        Ok(take(self.ifindex, Hold::AfXdp)?.map(|hold| AfXdpHold { _hold: hold }))
    }
}

/// Waits up to `timeout` to be the only process attaching the XDP program
/// to device `ifindex`; the returned descriptor holds that until dropped.
/// The capture's hold of device `ifindex` (root's alone): None while
/// another capture runs.
pub fn claim_capture(ifindex: u32) -> std::io::Result<Option<CaptureHold>> {
    Ok(take(ifindex, Hold::Capture)?.map(|hold| CaptureHold { _hold: hold }))
}

/// This process captures the device (released on drop or exit).
#[derive(Debug)]
pub struct CaptureHold {
    _hold: Held,
}

/// Root's alone.
pub(crate) fn attaching(
    ifindex: u32,
    timeout: std::time::Duration,
) -> std::io::Result<impl Sized + std::fmt::Debug> {
    let until = std::time::Instant::now() + timeout;
    loop {
        if let Some(hold) = take(ifindex, Hold::Attaching)? {
            return Ok(hold);
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
    _hold: Held,
}

/// An offset for `EngineConfig::qpn_offset`: `XROCE_QPN_OFFSET` if set
/// (decimal or 0x hex; 0 numbers a process's QPs from 0x11 as before, for
/// programs that rely on a well-known QPN), else a random one, so that a
/// restarted program does not reuse its predecessor's QPNs at once.
pub fn random_qpn_offset() -> u32 {
    if let Ok(v) = std::env::var("XROCE_QPN_OFFSET") {
        let parsed = match v.strip_prefix("0x") {
            Some(h) => u32::from_str_radix(h, 16),
            None => v.parse(),
        };
        if let Ok(n) = parsed {
            return n % qpn_block::QPNS_PER_BLOCK;
        }
        eprintln!("xroce: XROCE_QPN_OFFSET={v:?} is not a number; QPNs start at random");
    }
    rand::random::<u32>() % qpn_block::QPNS_PER_BLOCK
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
        let run = QpnBlock::claim_run(ifindex, 2, |_| true).unwrap();
        assert_eq!(run.iter().map(QpnBlock::block).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(
            QpnBlock::claim(ifindex).unwrap().block(),
            0,
            "0 was given back"
        );
        drop(second);
    }

    /// Root (the tests run as root) goes to its own blocks when every
    /// user's block is held; a block whose port is taken is skipped.
    #[test]
    fn root_has_blocks_no_user_can_squat() {
        let ifindex = 0x7ff2_0000 + std::process::id() % 0x1000;
        let squatted: Vec<OwnedFd> = (0..qpn_block::ROOT_FIRST)
            .map(|b| match take(ifindex, Hold::Block(b)).unwrap() {
                Some(Held::Name { _socket }) => _socket,
                other => panic!("block {b}: {other:?}"),
            })
            .collect();
        let root = QpnBlock::claim(ifindex).unwrap();
        assert_eq!(root.block(), qpn_block::ROOT_FIRST);
        assert_eq!(root.udp_port(), 960);
        let next = QpnBlock::claim_run(ifindex, 1, |port| port != 961).unwrap();
        assert_eq!(next[0].block(), qpn_block::ROOT_FIRST + 2, "961's skipped");
        assert!(root.others().contains(&(qpn_block::ROOT_FIRST + 2)));
        assert_eq!(root.others().len(), squatted.len() + 1);
        drop(squatted);
        let free_port = QpnBlock::claim_run(ifindex, 1, |port| port != 4791).unwrap();
        assert_eq!(free_port[0].block(), 1, "block 0's port is taken");
    }
}
