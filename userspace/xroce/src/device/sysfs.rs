//! What an xroce device shows in sysfs, as rxe's files show it: the
//! content of `class/infiniband/xroce_IF/...` and
//! `class/infiniband_verbs/uverbsN/...`.
//!
//! One source of truth for two readers: the drop-in libibverbs answers
//! `ibv_read_sysfs_file` from [`DeviceFacts::file`], and `xroce run`
//! writes [`DeviceFacts::files`] into the private sysfs view it gives the
//! program (UCX, hwloc and pyverbs' tests read these paths with plain
//! open/read, past libibverbs).
//!
//! The files, as the kernel's `drivers/infiniband/core/sysfs.c` formats
//! them for rxe on the same interface: `node_type` "1: CA", the GUIDs in
//! four groups of hex digits, `ports/1/{state,phys_state,link_layer,lid,
//! sm_lid,sm_sl,lid_mask_count,cap_mask,rate}`, the whole 1024-entry
//! `ports/1/gids/N` table (zero GIDs past the populated entries), and
//! `ports/1/gid_attrs/{types,ndevs}/N` for the populated entries ("RoCE v2"
//! and the interface; the kernel's files for empty entries fail their read
//! with EINVAL, which a file of a view cannot do, so the view has none).
//! The uverbs class device has `ibdev`, `abi_version` and `dev` (the
//! kernel's uverbs char device numbers, 231:192+N).
//!
//! Everything is read in the caller's network namespace (getifaddrs for
//! addresses and carrier, ioctls for the MTU and the ethtool link speed),
//! never from /sys/class/net, which under `nsenter --net` shows another
//! namespace: a device looks the same however the namespace was entered.

use std::net::{Ipv4Addr, Ipv6Addr};

use nix::{ifaddrs::getifaddrs, net::if_::InterfaceFlags};

use super::{
    gid_table, guid_from_mac, ifreq_named, interface_addrs, interface_mac, interface_mtu,
    ioctl_socket, path_mtu_for,
};

/// The one port.
pub const PORT: u32 = 1;
/// GID table length (rxe's).
pub const GID_TBL_LEN: u32 = 1024;
/// The firmware version xroce devices report.
pub const FW_VER: &str = concat!("xroce ", env!("CARGO_PKG_VERSION"));
/// The default (full member) P_Key, the only entry of the P_Key table.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// `IBV_PORT_CM_SUP` (as rxe) | `IBV_PORT_IP_BASED_GIDS` (what RoCE ports
/// report).
pub const PORT_CAP_FLAGS: u32 = (1 << 16) | (1 << 26);
/// The kernel's uverbs ABI version (`class/infiniband_verbs/abi_version`).
pub const UVERBS_ABI_VERSION: u32 = 6;
/// The kernel's uverbs char devices: major 231, minors from 192.
pub const UVERBS_MAJOR: u32 = 231;
pub const UVERBS_BASE_MINOR: u32 = 192;

/// IB PortPhysicalState values.
pub const PHYS_STATE_DISABLED: u8 = 3;
pub const PHYS_STATE_LINK_UP: u8 = 5;
/// IB link widths and speeds (`ibv_port_attr` active_width / active_speed).
pub const WIDTH_1X: u8 = 1;
pub const WIDTH_4X: u8 = 2;
pub const SPEED_SDR: u8 = 1;
pub const SPEED_DDR: u8 = 2;
pub const SPEED_QDR: u8 = 4;
pub const SPEED_FDR: u8 = 16;
pub const SPEED_EDR: u8 = 32;
pub const SPEED_HDR: u8 = 64;
pub const SPEED_NDR: u8 = 128;

/// The RDMA device of interface `iface`: `xroce_IF`.
pub fn device_name(iface: &str) -> String {
    format!("xroce_{iface}")
}

/// The uverbs class device of the `index`th device: `uverbsN`.
pub fn uverbs_name(index: usize) -> String {
    format!("uverbs{index}")
}

/// The interfaces offered as devices when none are named: every Ethernet
/// interface with an IPv4 address (its RoCEv2 GID), loopback excluded,
/// sorted by name. Read with getifaddrs, so in the caller's network
/// namespace (whatever its /sys shows).
pub fn default_interfaces() -> Vec<String> {
    let Ok(all) = getifaddrs() else {
        return Vec::new();
    };
    let mut ether = Vec::new();
    let mut with_v4 = Vec::new();
    for a in all {
        let Some(addr) = a.address.as_ref() else {
            continue;
        };
        if let Some(link) = addr.as_link_addr() {
            if link.hatype() == libc::ARPHRD_ETHER {
                ether.push(a.interface_name);
            }
        } else if addr.as_sockaddr_in().is_some() {
            with_v4.push(a.interface_name);
        }
    }
    let mut out: Vec<String> = ether
        .into_iter()
        .filter(|n| n != "lo" && with_v4.contains(n))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A port's state as rxe reports it, read from the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortState {
    /// The interface is running with carrier (rxe's ACTIVE).
    pub up: bool,
    /// The path MTU in bytes (rxe's active_mtu).
    pub active_mtu: u32,
    /// The Ethernet link speed, if the interface reports one.
    pub speed_mbps: Option<u32>,
}

/// True if `iface` is up with carrier (IFF_UP and IFF_LOWER_UP, from
/// getifaddrs: this network namespace, whatever /sys shows).
fn up_with_carrier(iface: &str) -> bool {
    let Ok(all) = getifaddrs() else {
        return false;
    };
    all.filter(|a| a.interface_name == iface).any(|a| {
        a.flags
            .contains(InterfaceFlags::IFF_UP | InterfaceFlags::IFF_LOWER_UP)
    })
}

/// The legacy `struct ethtool_cmd` (linux/ethtool.h), which ETHTOOL_GSET
/// fills for every driver that reports link settings.
#[repr(C)]
#[derive(Default)]
struct EthtoolCmd {
    cmd: u32,
    supported: u32,
    advertising: u32,
    speed: u16,
    duplex: u8,
    port: u8,
    phy_address: u8,
    transceiver: u8,
    autoneg: u8,
    mdio_support: u8,
    maxtxpkt: u32,
    maxrxpkt: u32,
    speed_hi: u16,
    eth_tp_mdix: u8,
    eth_tp_mdix_ctrl: u8,
    lp_advertising: u32,
    reserved: [u32; 2],
}

const ETHTOOL_GSET: u32 = 1;
/// What ETHTOOL_GSET reports for a link without a known speed.
const SPEED_UNKNOWN: u32 = u32::MAX;

nix::ioctl_readwrite_bad!(siocethtool, libc::SIOCETHTOOL, libc::ifreq);

/// The link speed of `iface` in Mb/s as ethtool reports it (what rxe maps
/// to an IB width and speed), in this network namespace; None if unknown.
fn ethtool_speed_mbps(iface: &str) -> Option<u32> {
    let mut cmd = EthtoolCmd {
        cmd: ETHTOOL_GSET,
        ..Default::default()
    };
    let mut ifr = ifreq_named(iface)?;
    ifr.ifr_ifru.ifru_data = (&mut cmd as *mut EthtoolCmd).cast();
    let sock = ioctl_socket().ok()?;
    // SAFETY: `ifr` names the interface and points at `cmd`, a live
    // ethtool_cmd that ETHTOOL_GSET fills (and reads no further than).
    unsafe { siocethtool(std::os::fd::AsRawFd::as_raw_fd(&sock), &mut ifr) }.ok()?;
    let speed = u32::from(cmd.speed) | (u32::from(cmd.speed_hi) << 16);
    (speed != 0 && speed != SPEED_UNKNOWN && speed != u32::from(u16::MAX)).then_some(speed)
}

impl PortState {
    /// rxe's view of the link: ACTIVE while the interface is up with
    /// carrier, the IB rate from its ethtool speed. Read in the caller's
    /// network namespace (getifaddrs, an ioctl socket), so the same under
    /// `ip netns exec` and `nsenter --net`.
    pub fn read(iface: &str, active_mtu: u32) -> PortState {
        PortState {
            up: up_with_carrier(iface),
            active_mtu,
            speed_mbps: ethtool_speed_mbps(iface),
        }
    }

    /// IB (width, speed) for the Ethernet link speed, as the kernel maps
    /// them for RoCE ports; an unknown speed (virtual interfaces) is 1X
    /// SDR, as there.
    pub fn width_speed(&self) -> (u8, u8) {
        match self.speed_mbps.unwrap_or(0) {
            0..=2_500 => (WIDTH_1X, SPEED_SDR),
            2_501..=5_000 => (WIDTH_1X, SPEED_DDR),
            5_001..=10_000 => (WIDTH_1X, SPEED_QDR),
            10_001..=14_000 => (WIDTH_1X, SPEED_FDR),
            14_001..=25_000 => (WIDTH_1X, SPEED_EDR),
            25_001..=40_000 => (WIDTH_4X, SPEED_QDR),
            40_001..=50_000 => (WIDTH_1X, SPEED_HDR),
            50_001..=100_000 => (WIDTH_4X, SPEED_EDR),
            100_001..=200_000 => (WIDTH_4X, SPEED_HDR),
            _ => (WIDTH_4X, SPEED_NDR),
        }
    }

    /// IB PortPhysicalState.
    pub fn phys_state(&self) -> u8 {
        if self.up {
            PHYS_STATE_LINK_UP
        } else {
            PHYS_STATE_DISABLED
        }
    }
}

/// The IB rate line of `ports/1/rate`, e.g. "2.5 Gb/sec (1X SDR)".
pub fn rate_line(width: u8, speed: u8) -> String {
    let lanes = if width == WIDTH_4X { 4 } else { 1 };
    let (tenths, name) = match speed {
        SPEED_DDR => (50, "DDR"),
        SPEED_QDR => (100, "QDR"),
        SPEED_FDR => (140, "FDR"),
        SPEED_EDR => (250, "EDR"),
        SPEED_HDR => (500, "HDR"),
        SPEED_NDR => (1000, "NDR"),
        _ => (25, "SDR"),
    };
    let r = tenths * lanes;
    let half = if r % 10 != 0 { ".5" } else { "" };
    format!("{}{half} Gb/sec ({lanes}X {name})", r / 10)
}

fn hex_groups(bytes: &[u8]) -> String {
    bytes
        .chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// An xroce device as its sysfs files describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    pub iface: String,
    pub mac: [u8; 6],
    pub port: PortState,
    /// The populated GID table ([`gid_table`]).
    pub gids: Vec<Ipv6Addr>,
}

/// Why a file cannot be read: the errno of the failed open or read.
pub type Errno = i32;

impl DeviceFacts {
    /// The device of `iface` now, read in the caller's network namespace
    /// (ENOENT if there is no such interface).
    pub fn read(iface: &str) -> Result<DeviceFacts, Errno> {
        let mac = interface_mac(iface).map_err(|_| libc::ENOENT)?;
        let (v4, v6) = interface_addrs(iface).unwrap_or_default();
        let mtu = interface_mtu(iface)
            .ok()
            .and_then(path_mtu_for)
            .unwrap_or(256);
        Ok(DeviceFacts {
            iface: iface.to_string(),
            mac,
            port: PortState::read(iface, mtu),
            gids: gid_table(mac, v4.first().copied(), &v6),
        })
    }

    /// The device from given values (tests, and callers that read them
    /// already).
    pub fn new(iface: &str, mac: [u8; 6], port: PortState, v4: Option<Ipv4Addr>) -> Self {
        DeviceFacts {
            iface: iface.to_string(),
            mac,
            port,
            gids: gid_table(mac, v4, &[]),
        }
    }

    /// GID entry `index`: Ok(Some) populated, Ok(None) empty, Err(ENOENT)
    /// past the table.
    fn gid(&self, index: &str) -> Result<Option<Ipv6Addr>, Errno> {
        let i: u32 = index.parse().map_err(|_| libc::ENOENT)?;
        if i >= GID_TBL_LEN || index != i.to_string() {
            return Err(libc::ENOENT);
        }
        Ok(self.gids.get(i as usize).copied())
    }

    /// The content of `class/infiniband/xroce_IF/<rel>` (components of the
    /// relative path), newline-terminated as the kernel's; Err: the errno
    /// the kernel's file gives (ENOENT: no such file, EINVAL: the read of
    /// an empty GID entry's attribute).
    pub fn file(&self, rel: &[&str]) -> Result<String, Errno> {
        let guid = hex_groups(&guid_from_mac(self.mac).to_be_bytes());
        let (width, speed) = self.port.width_speed();
        let s = match rel {
            ["node_type"] => "1: CA".to_string(),
            ["node_guid"] | ["sys_image_guid"] => guid,
            ["fw_ver"] => FW_VER.to_string(),
            ["node_desc"] => format!("xroce {}", self.iface),
            ["ports", "1", f] => match *f {
                "state" if self.port.up => "4: ACTIVE".to_string(),
                "state" => "1: DOWN".to_string(),
                "phys_state" if self.port.up => "5: LinkUp".to_string(),
                "phys_state" => "3: Disabled".to_string(),
                "link_layer" => "Ethernet".to_string(),
                "lid" | "sm_lid" => "0x0".to_string(),
                "lid_mask_count" | "sm_sl" => "0".to_string(),
                "cap_mask" => format!("0x{PORT_CAP_FLAGS:08x}"),
                "rate" => rate_line(width, speed),
                _ => return Err(libc::ENOENT),
            },
            ["ports", "1", "gids", i] => {
                hex_groups(&self.gid(i)?.unwrap_or(Ipv6Addr::UNSPECIFIED).octets())
            }
            ["ports", "1", "gid_attrs", "types", i] => match self.gid(i)? {
                Some(_) => "RoCE v2".to_string(),
                None => return Err(libc::EINVAL),
            },
            ["ports", "1", "gid_attrs", "ndevs", i] => match self.gid(i)? {
                Some(_) => self.iface.clone(),
                None => return Err(libc::EINVAL),
            },
            ["ports", "1", "pkeys", "0"] => format!("0x{DEFAULT_PKEY:04x}"),
            _ => return Err(libc::ENOENT),
        };
        Ok(s + "\n")
    }

    /// Every readable file of `class/infiniband/xroce_IF` (relative path,
    /// content), as [`Self::file`] gives it: what a view of sysfs holds.
    pub fn files(&self) -> Vec<(String, String)> {
        let mut paths: Vec<String> = [
            "node_type",
            "node_guid",
            "sys_image_guid",
            "fw_ver",
            "node_desc",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for f in [
            "state",
            "phys_state",
            "link_layer",
            "lid",
            "sm_lid",
            "lid_mask_count",
            "sm_sl",
            "cap_mask",
            "rate",
        ] {
            paths.push(format!("ports/1/{f}"));
        }
        for i in 0..GID_TBL_LEN {
            paths.push(format!("ports/1/gids/{i}"));
        }
        for i in 0..self.gids.len() {
            paths.push(format!("ports/1/gid_attrs/types/{i}"));
            paths.push(format!("ports/1/gid_attrs/ndevs/{i}"));
        }
        paths.push("ports/1/pkeys/0".to_string());
        paths
            .into_iter()
            .map(|p| {
                let content = self
                    .file(&p.split('/').collect::<Vec<_>>())
                    .expect("every listed file has content");
                (p, content)
            })
            .collect()
    }
}

/// The content of `class/infiniband_verbs/uverbsN/<rel>` for the `index`th
/// device, named `ibdev`.
pub fn uverbs_file(ibdev: &str, index: usize, rel: &[&str]) -> Result<String, Errno> {
    match rel {
        ["ibdev"] => Ok(format!("{ibdev}\n")),
        ["abi_version"] => Ok(format!("{UVERBS_ABI_VERSION}\n")),
        ["dev"] => Ok(format!(
            "{UVERBS_MAJOR}:{}\n",
            UVERBS_BASE_MINOR + index as u32
        )),
        _ => Err(libc::ENOENT),
    }
}

/// `local_cpus` of a device without locality: every possible CPU, printed
/// as the kernel prints a cpumask (32-bit hex words, most significant
/// first, comma-separated; the first word only as wide as it needs).
pub fn all_cpus_mask(ncpus: u32) -> String {
    let ncpus = ncpus.max(1);
    let words = ncpus.div_ceil(32);
    (0..words)
        .rev()
        .map(|w| {
            let bits = (ncpus - w * 32).min(32);
            let word = if bits == 32 {
                u32::MAX
            } else {
                (1u32 << bits) - 1
            };
            if w == words - 1 {
                format!("{word:0width$x}", width = (bits as usize).div_ceil(4))
            } else {
                format!("{word:08x}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// How many CPUs the kernel can have (`/sys/devices/system/cpu/possible`,
/// e.g. "0-3": 4), at least 1.
pub fn possible_cpus() -> u32 {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    list.trim()
        .split(',')
        .filter_map(|r| r.rsplit('-').next()?.trim().parse::<u32>().ok())
        .max()
        .map_or(1, |m| m + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x42, 0xac, 0x11, 0x00, 0x02];

    fn facts(up: bool) -> DeviceFacts {
        DeviceFacts::new(
            "eth0",
            MAC,
            PortState {
                up,
                active_mtu: 1024,
                speed_mbps: None,
            },
            Some(Ipv4Addr::new(10, 0, 0, 1)),
        )
    }

    fn f(d: &DeviceFacts, p: &str) -> Result<String, Errno> {
        d.file(&p.split('/').collect::<Vec<_>>())
    }

    #[test]
    fn files_hold_rxes_values() {
        let d = facts(true);
        assert_eq!(f(&d, "node_type").unwrap(), "1: CA\n");
        assert_eq!(f(&d, "node_guid").unwrap(), "0042:acff:fe11:0002\n");
        assert_eq!(f(&d, "sys_image_guid").unwrap(), "0042:acff:fe11:0002\n");
        assert_eq!(f(&d, "fw_ver").unwrap(), format!("{FW_VER}\n"));
        assert_eq!(f(&d, "ports/1/state").unwrap(), "4: ACTIVE\n");
        assert_eq!(f(&d, "ports/1/phys_state").unwrap(), "5: LinkUp\n");
        assert_eq!(f(&d, "ports/1/link_layer").unwrap(), "Ethernet\n");
        assert_eq!(f(&d, "ports/1/lid").unwrap(), "0x0\n");
        assert_eq!(f(&d, "ports/1/lid_mask_count").unwrap(), "0\n");
        assert_eq!(f(&d, "ports/1/cap_mask").unwrap(), "0x04010000\n");
        assert_eq!(f(&d, "ports/1/rate").unwrap(), "2.5 Gb/sec (1X SDR)\n");
        assert_eq!(
            f(&d, "ports/1/gids/0").unwrap(),
            "fe80:0000:0000:0000:0042:acff:fe11:0002\n"
        );
        assert_eq!(
            f(&d, "ports/1/gids/1").unwrap(),
            "0000:0000:0000:0000:0000:ffff:0a00:0001\n"
        );
        assert_eq!(
            f(&d, "ports/1/gids/1023").unwrap(),
            "0000:0000:0000:0000:0000:0000:0000:0000\n"
        );
        assert_eq!(f(&d, "ports/1/gids/1024"), Err(libc::ENOENT));
        assert_eq!(f(&d, "ports/1/gids/01"), Err(libc::ENOENT));
        assert_eq!(f(&d, "ports/1/gid_attrs/types/1").unwrap(), "RoCE v2\n");
        assert_eq!(f(&d, "ports/1/gid_attrs/types/5"), Err(libc::EINVAL));
        assert_eq!(f(&d, "ports/1/gid_attrs/ndevs/1").unwrap(), "eth0\n");
        assert_eq!(f(&d, "ports/1/pkeys/0").unwrap(), "0xffff\n");
        assert_eq!(f(&d, "ports/1/pkeys/1"), Err(libc::ENOENT));
        assert_eq!(f(&d, "ports/2/state"), Err(libc::ENOENT));
        assert_eq!(f(&d, "board_id"), Err(libc::ENOENT));
        let down = facts(false);
        assert_eq!(f(&down, "ports/1/state").unwrap(), "1: DOWN\n");
        assert_eq!(f(&down, "ports/1/phys_state").unwrap(), "3: Disabled\n");
    }

    #[test]
    fn the_view_lists_every_file_once() {
        let d = facts(true);
        let files = d.files();
        // 5 device files, 9 port files, 1024 GIDs, types+ndevs of 2, 1 P_Key.
        assert_eq!(files.len(), 5 + 9 + 1024 + 4 + 1);
        let mut names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), files.len());
        for (p, content) in &files {
            assert_eq!(f(&d, p).as_ref(), Ok(content), "{p}");
            assert!(content.ends_with('\n'), "{p}");
        }
    }

    #[test]
    fn rates_and_uverbs() {
        let mut p = facts(true).port;
        p.speed_mbps = Some(100_000);
        assert_eq!(p.width_speed(), (WIDTH_4X, SPEED_EDR));
        p.speed_mbps = Some(10_000);
        assert_eq!(p.width_speed(), (WIDTH_1X, SPEED_QDR));
        assert_eq!(rate_line(WIDTH_1X, SPEED_QDR), "10 Gb/sec (1X QDR)");
        assert_eq!(rate_line(WIDTH_4X, SPEED_EDR), "100 Gb/sec (4X EDR)");
        assert_eq!(
            uverbs_file("xroce_eth0", 1, &["ibdev"]).unwrap(),
            "xroce_eth0\n"
        );
        assert_eq!(uverbs_file("x", 0, &["abi_version"]).unwrap(), "6\n");
        assert_eq!(uverbs_file("x", 2, &["dev"]).unwrap(), "231:194\n");
        assert_eq!(uverbs_file("x", 0, &["device"]), Err(libc::ENOENT));
        assert_eq!(
            (device_name("eth1"), uverbs_name(3)),
            ("xroce_eth1".into(), "uverbs3".into())
        );
    }

    #[test]
    fn the_port_is_read_from_the_interface() {
        // Loopback is up with carrier and has no ethtool speed.
        let lo = PortState::read("lo", 4096);
        assert_eq!((lo.up, lo.speed_mbps), (true, None));
        assert_eq!(lo.width_speed(), (WIDTH_1X, SPEED_SDR));
        assert!(!PortState::read("nosuchif0", 1024).up);
        assert_eq!(ethtool_speed_mbps("nosuchif0"), None);
    }

    #[test]
    fn cpumasks_print_as_the_kernels() {
        assert_eq!(all_cpus_mask(1), "1");
        assert_eq!(all_cpus_mask(2), "3");
        assert_eq!(all_cpus_mask(8), "ff");
        assert_eq!(all_cpus_mask(32), "ffffffff");
        assert_eq!(all_cpus_mask(40), "ff,ffffffff");
        assert_eq!(all_cpus_mask(64), "ffffffff,ffffffff");
        assert!(possible_cpus() >= 1);
    }
}
