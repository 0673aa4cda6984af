//! Who holds what on the devices of this network namespace: the abstract
//! names of [`super::block`] as /proc/thread-self/net/unix lists them (the
//! calling thread's namespace), and the processes whose fd tables have
//! those sockets (`socket:[inode]`); root's holds ([`super::root_lock`])
//! for root, who alone may see them. For `xroce status` and for a capture
//! that must say who stands in its way.

use std::{collections::BTreeMap, fs};

use super::block::{parse_name, Hold};

/// One bound hold and, where /proc lets us see it, its process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub ifindex: u32,
    pub hold: Hold,
    /// None when the owner's fd table is out of sight (another user's
    /// process, read without root).
    pub pid: Option<u32>,
}

/// (inode, ifindex, hold) of every hold in a /proc/net/unix table.
fn bound(table: &str) -> Vec<(u64, u32, Hold)> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (ifindex, hold) = parse_name(f.get(7)?)?;
            Some((f.get(6)?.parse().ok()?, ifindex, hold))
        })
        .collect()
}

/// Socket inode -> pid for the inodes in `wanted`, from /proc/PID/fd;
/// processes we may not look into are skipped.
fn socket_owners(wanted: &[u64]) -> BTreeMap<u64, u32> {
    let mut owners = BTreeMap::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return owners;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(fds) = fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let inode = fs::read_link(fd.path()).ok().and_then(|link| {
                link.to_str()?
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            });
            if let Some(inode) = inode.filter(|i| wanted.contains(i)) {
                owners.insert(inode, pid);
            }
        }
    }
    owners
}

/// Every hold bound in the calling thread's network namespace, sorted.
pub fn holders() -> Vec<Holder> {
    let table = fs::read_to_string("/proc/thread-self/net/unix").unwrap_or_default();
    let bound = bound(&table);
    let inodes: Vec<u64> = bound.iter().map(|b| b.0).collect();
    let owners = socket_owners(&inodes);
    let mut out: Vec<Holder> = bound
        .into_iter()
        .map(|(inode, ifindex, hold)| Holder {
            ifindex,
            hold,
            pid: owners.get(&inode).copied(),
        })
        .collect();
    out.extend(
        super::root_lock::held()
            .into_iter()
            .filter_map(|(ifindex, what, pid)| {
                Some(Holder {
                    ifindex,
                    hold: Hold::of_lock_name(&what)?,
                    pid: Some(pid),
                })
            }),
    );
    out.sort_by_key(|h| (h.ifindex, h.hold, h.pid));
    out
}

/// The command name of `pid` (/proc/PID/comm), empty if it is gone.
pub fn command_name(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::QpnBlock;

    #[test]
    fn a_claimed_block_and_afxdp_hold_are_listed_with_our_pid() {
        let ifindex = 0x7fe0_0000 + std::process::id() % 0x1000;
        let block = QpnBlock::claim(ifindex).unwrap();
        let _afxdp = block.claim_afxdp().unwrap().unwrap();
        let mine: Vec<Holder> = holders()
            .into_iter()
            .filter(|h| h.ifindex == ifindex)
            .collect();
        let me = Some(std::process::id());
        assert_eq!(
            mine,
            [
                Holder {
                    ifindex,
                    hold: Hold::Block(0),
                    pid: me
                },
                Holder {
                    ifindex,
                    hold: Hold::AfXdp,
                    pid: me
                },
            ]
        );
        assert!(!command_name(std::process::id()).is_empty());
    }

    /// Root's holds are locks, not names: a name that looks like one is
    /// someone else's and holds nothing.
    #[test]
    fn only_names_of_users_blocks_parse() {
        let table = "Num RefCount Protocol Flags Type St Inode Path\n\
            0: 00000002 00000000 00000000 0002 01 77 @xroce/3/block/2\n\
            0: 00000002 00000000 00000000 0002 01 78 @xroce/3/afxdp\n\
            0: 00000002 00000000 00000000 0002 01 82 @xroce/3/block/200\n\
            0: 00000002 00000000 00000000 0002 01 79 @xroce/3/blockx\n\
            0: 00000002 00000000 00000000 0002 01 80 /run/other.sock\n\
            0: 00000002 00000000 00000000 0002 01 81\n";
        assert_eq!(bound(table), [(77, 3, Hold::Block(2))]);
    }
}
