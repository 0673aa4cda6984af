//! How many RX queues an interface has: one AF_XDP socket is needed on
//! each, since the XDP program redirects a frame to its own queue's socket.

use std::{fs, os::fd::AsRawFd};

use crate::device::{ifreq_named, ioctl_socket};

/// Number of RX queues of `iface`: ethtool's channel count (works in the
/// caller's network namespace), else /sys/class/net/IF/queues, else 1.
pub fn rx_queue_count(iface: &str) -> u32 {
    ethtool_rx_queues(iface)
        .or_else(|| sysfs_rx_queues(iface))
        .unwrap_or(1)
        .max(1)
}

fn sysfs_rx_queues(iface: &str) -> Option<u32> {
    let dir = fs::read_dir(format!("/sys/class/net/{iface}/queues")).ok()?;
    let n = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count() as u32;
    (n > 0).then_some(n)
}

/// ETHTOOL_GCHANNELS: read the channel counts.
const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// `struct ethtool_channels` (linux/ethtool.h).
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

nix::ioctl_readwrite_bad!(siocethtool, libc::SIOCETHTOOL, libc::ifreq);

fn ethtool_rx_queues(iface: &str) -> Option<u32> {
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..Default::default()
    };
    let mut ifr = ifreq_named(iface)?;
    ifr.ifr_ifru.ifru_data = (&mut ch as *mut EthtoolChannels).cast();
    let sock = ioctl_socket().ok()?;
    // SAFETY: `ifr` has a NUL-terminated name and points at `ch`, a valid
    // ethtool_channels that outlives the call; the ioctl writes only there.
    unsafe { siocethtool(sock.as_raw_fd(), &mut ifr) }.ok()?;
    let n = ch.combined_count + ch.rx_count;
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_count_falls_back_to_one() {
        assert_eq!(rx_queue_count("lo"), 1);
        assert_eq!(rx_queue_count("no-such-if0"), 1);
    }
}
