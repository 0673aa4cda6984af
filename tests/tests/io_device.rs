//! `NetDevice` in a namespace: it finds the interface's MAC, MTU, addresses,
//! GID and path MTU; leaves an attachment it did not make in place; falls
//! attaches in skb mode on request; and a neighbour
//! that never answers ARP is a clear, bounded error.

use std::{net::IpAddr, time::Duration};

use xroce::{
    device::{self, Attachment, BackendKind, NetDevice, NetDeviceConfig, NetDeviceError},
    io::PacketIo,
    xdp::{self, Mode},
};
use xroce_tests::{require_root, spawn_in, VethPair};

#[test]
fn device_reports_the_interface_and_respects_existing_attachments() {
    require_root();
    let pair = VethPair::new(1500);
    let (if_a, addr_a, addr_b) = (pair.if_a.clone(), pair.addr_a, pair.addr_b);
    let out = pair.b.exec(&["ip", "-o", "link", "show", &pair.if_b]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mac_b = text
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("ip link shows a MAC")
        .to_string();
    spawn_in(&pair.a.name, move || {
        // Attached beforehand (as `xroce attach` would): the device uses it
        // and leaves it attached when dropped.
        xdp::attach(&if_a, Mode::Native).expect("attach");
        {
            let dev = NetDevice::open(&if_a, NetDeviceConfig::default()).unwrap();
            assert_eq!(dev.attachment(), &Attachment::Existing);
            assert_eq!(dev.mtu(), 1500);
            assert_eq!(dev.path_mtu(), 1024);
            assert_eq!(dev.ipv4(), &[addr_a]);
            assert_eq!(dev.ip().unwrap(), IpAddr::from(addr_a));
            let gid = dev.gid().unwrap();
            assert_eq!(
                gid.hex().to_string(),
                format!("00000000000000000000ffff{:08x}", u32::from(addr_a))
            );
            assert_ne!(dev.mac(), [0; 6]);
            assert!(dev.ifindex() > 0);
            // ARP resolution of the real peer.
            let mac = dev
                .neighbour_mac(addr_b.into(), Duration::from_secs(5))
                .unwrap();
            let shown: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(shown.join(":"), mac_b);
            // The rtnetlink lookup itself (not a fallback) found it.
            assert_eq!(
                device::netlink_neighbour(dev.ifindex(), addr_b.into()).unwrap(),
                Some(mac)
            );
            assert_eq!(
                device::netlink_neighbour(dev.ifindex(), IpAddr::from([10, 255, 255, 254]))
                    .unwrap(),
                None
            );
            // An address on the link that nobody has: bounded, named error.
            let ghost = std::net::Ipv4Addr::from(u32::from(addr_a) + 100);
            let t0 = std::time::Instant::now();
            let e = dev
                .neighbour_mac(ghost.into(), Duration::from_millis(700))
                .unwrap_err();
            assert!(matches!(e, NetDeviceError::NeighbourTimeout { .. }), "{e}");
            assert!(e.to_string().contains(&ghost.to_string()), "{e}");
            assert!(t0.elapsed() < Duration::from_secs(3));
        }
        assert!(xdp::is_attached(&if_a), "an existing attachment stays");
        xdp::detach(&if_a).unwrap();

        // Without attach: the UDP backend's case.
        let dev = NetDevice::open(
            &if_a,
            NetDeviceConfig {
                attach: false,
                ..NetDeviceConfig::default()
            },
        )
        .unwrap();
        assert_eq!(dev.attachment(), &Attachment::None);
        let e = dev.open_io(BackendKind::AfXdp, 1024).err().unwrap();
        assert!(e.to_string().contains("--backend udp"), "{e}");
        let mut udp = dev.open_io(BackendKind::Udp, 4096).unwrap();
        assert_eq!(udp.name(), "udp");
        assert!(udp.max_frame_len() >= 4096 + 80 + 14);
        assert_eq!(udp.stats().rx_frames, 0);
        drop(udp);
        drop(dev);
        let e = "rdma".parse::<BackendKind>().unwrap_err();
        assert!(e.to_string().contains("afxdp"), "{e}");

        // Skb mode on request (the native->skb fallback runs the same code
        // after a native failure, which veth gives no easy way to force).
        let dev = NetDevice::open(
            &if_a,
            NetDeviceConfig {
                mode: Mode::Skb,
                ..NetDeviceConfig::default()
            },
        )
        .unwrap();
        assert_eq!(
            dev.attachment(),
            &Attachment::Ours {
                mode: Mode::Skb,
                fallback: None
            }
        );
        let io = dev.open_io("afxdp".parse().unwrap(), 1024).unwrap();
        assert_eq!(io.name(), "afxdp");
        assert!(io.max_frame_len() >= 1024 + 80 + 14);
        drop(io);
        drop(dev);
        assert!(!xdp::is_attached(&if_a), "ours is detached on drop");
        let e = NetDevice::open("xrnosuch0", NetDeviceConfig::default()).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert_eq!(device::path_mtu_for(9000), Some(4096));
    })
    .join()
    .unwrap();
}
