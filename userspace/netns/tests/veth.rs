//! Needs root (network namespaces); run under `flock /tmp/xroce-netns.lock`.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    time::Duration,
};

use xroce_netns::{add_veth, spawn_in, Error, Netns, VethEnd};

fn names() -> (String, String) {
    let id = std::process::id() & 0xffff;
    (format!("xrn{id:x}a"), format!("xrn{id:x}b"))
}

#[test]
fn two_namespaces_joined_by_a_veth_carry_udp_and_vanish_on_drop() {
    let (a_name, b_name) = names();
    let (addr_a, addr_b) = (Ipv4Addr::new(10, 79, 0, 1), Ipv4Addr::new(10, 79, 0, 2));
    {
        let a = Netns::create(a_name.clone()).expect("create a (needs root)");
        let b = Netns::create(b_name.clone()).unwrap();
        assert!(a.path().exists());
        // A second namespace of the same name is refused, and the refusal
        // does not delete the first.
        assert!(matches!(
            Netns::create(a_name.clone()),
            Err(Error::Failed { .. })
        ));
        assert!(a.path().exists());
        add_veth(
            VethEnd {
                netns: a.name(),
                iface: &a_name,
            },
            VethEnd {
                netns: b.name(),
                iface: &b_name,
            },
            1400,
        )
        .unwrap();
        a.configure(&a_name, 1400, addr_a.into(), 24).unwrap();
        b.configure(&b_name, 1400, addr_b.into(), 24).unwrap();
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{a_name}/mtu"));
        assert!(mtu.is_err(), "the veth end is not in the host namespace");

        let receiver = b
            .spawn(move || {
                let socket = UdpSocket::bind(SocketAddrV4::new(addr_b, 40_000)).unwrap();
                socket
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                let mut buf = [0u8; 64];
                let (n, from) = socket.recv_from(&mut buf).unwrap();
                (buf[..n].to_vec(), from)
            })
            .unwrap();
        spawn_in(a.name(), move || {
            // The address exists only inside `a`: binding to it proves entry.
            let socket = UdpSocket::bind(SocketAddrV4::new(addr_a, 40_001)).unwrap();
            for _ in 0..50 {
                socket
                    .send_to(b"xroce-netns", SocketAddrV4::new(addr_b, 40_000))
                    .unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .unwrap()
        .join()
        .unwrap();
        let (bytes, from) = receiver.join().unwrap();
        assert_eq!(bytes, b"xroce-netns");
        assert_eq!(from, SocketAddrV4::new(addr_a, 40_001).into());
    }
    assert!(!xroce_netns::path(&a_name).exists());
    assert!(!xroce_netns::path(&b_name).exists());
}
