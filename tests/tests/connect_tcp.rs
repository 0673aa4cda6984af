//! Connection setup over real TCP (loopback, ephemeral ports): xroce's own
//! exchange, ibv_rc_pingpong's and perftest's, and the clear errors for a
//! peer that disconnects, stalls or sends garbage.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    thread,
    time::{Duration, Instant},
};

use xroce::{
    connect::{
        perftest::{BwReport, PerftestConn, PerftestDest},
        pingpong::{self, PingpongDest, PingpongServer},
        ConnInfo, ConnectError, Session,
    },
    io::wire::Gid,
};

const T: Duration = Duration::from_secs(5);

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

fn info(qpn: u32, last: u8) -> ConnInfo {
    ConnInfo {
        qpn,
        psn: qpn * 3,
        gid: Gid::from_ipv4([10, 0, 0, last]),
        mac: [2, 0, 0, 0, 0, last],
        mtu: 2048,
        mr_addr: 0x1000 * qpn as u64,
        rkey: 0xabc0 + qpn,
        mr_len: 1 << 20,
    }
}

#[test]
fn xroce_sessions_exchange_sixteen_qps_sync_and_results() {
    let (l, addr) = listener();
    let server = thread::spawn(move || {
        let mut s = Session::accept(&l, T).unwrap();
        let mine: Vec<_> = (100..116).map(|q| info(q, 2)).collect();
        let theirs = s.exchange(&mine).unwrap();
        s.sync(1).unwrap();
        let blob = s.exchange_blob(b"{\"server\":1}").unwrap();
        s.sync(2).unwrap();
        (theirs, blob)
    });
    // The client may start before the server listens: it retries.
    let mut c = Session::connect(addr, T).unwrap();
    let mine: Vec<_> = (200..216).map(|q| info(q, 1)).collect();
    let theirs = c.exchange(&mine).unwrap();
    c.sync(1).unwrap();
    let blob = c.exchange_blob(b"{\"client\":1}").unwrap();
    c.sync(2).unwrap();
    let (server_saw, server_blob) = server.join().unwrap();
    assert_eq!(server_saw, mine);
    assert_eq!(theirs, (100..116).map(|q| info(q, 2)).collect::<Vec<_>>());
    assert_eq!(blob, b"{\"server\":1}");
    assert_eq!(server_blob, b"{\"client\":1}");
}

#[test]
fn peer_that_disconnects_stalls_or_sends_garbage_gets_a_clear_error() {
    // Disconnect right after accepting.
    let (l, addr) = listener();
    let t = thread::spawn(move || drop(l.accept().unwrap()));
    let mut c = Session::connect(addr, T).unwrap();
    t.join().unwrap();
    let e = c.exchange(&[info(5, 1)]).unwrap_err();
    assert!(matches!(e, ConnectError::Closed { .. }), "{e}");
    assert!(e.to_string().contains("closed the connection"), "{e}");

    // Stall: accept and say nothing.
    let (l, addr) = listener();
    let t = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        thread::sleep(Duration::from_millis(800));
        drop(s);
    });
    let mut c = Session::connect(addr, Duration::from_millis(300)).unwrap();
    let t0 = Instant::now();
    let e = c.exchange(&[info(5, 1)]).unwrap_err();
    assert!(matches!(e, ConnectError::Timeout { .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_millis(700), "bounded wait");
    assert!(e.to_string().contains("did not answer"), "{e}");
    t.join().unwrap();

    // Garbage: an HTTP request instead of connection data.
    let (l, addr) = listener();
    let t = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 128];
        let _ = s.read(&mut buf);
        s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        thread::sleep(Duration::from_millis(100));
    });
    let mut c = Session::connect(addr, T).unwrap();
    let e = c.exchange(&[info(5, 1)]).unwrap_err();
    assert!(matches!(e, ConnectError::Garbage { .. }), "{e}");
    assert!(e.to_string().contains("XRCE"), "{e}");
    t.join().unwrap();

    // Nobody listening: a bounded, named failure.
    let (l, addr) = listener();
    drop(l);
    let e = Session::connect(addr, Duration::from_millis(200))
        .err()
        .unwrap();
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}

#[test]
fn ibv_rc_pingpong_exchange_both_roles() {
    let (l, addr) = listener();
    let server_dest = PingpongDest {
        lid: 0,
        qpn: 0x12,
        psn: 0xabcdef,
        gid: Gid::from_ipv4([10, 77, 1, 2]),
    };
    let server = thread::spawn(move || {
        let (srv, client) = PingpongServer::accept(&l, T).unwrap();
        // ... here ibv_rc_pingpong moves its QP to RTR/RTS ...
        srv.reply(&server_dest).unwrap();
        client
    });
    let client_dest = PingpongDest {
        lid: 0,
        qpn: 0x11,
        psn: 0x123456,
        gid: Gid::from_ipv4([10, 77, 1, 1]),
    };
    let got = pingpong::client_exchange(addr, &client_dest, T).unwrap();
    assert_eq!(got, server_dest);
    assert_eq!(server.join().unwrap(), client_dest);

    // Raw bytes, as the C tool writes them: one 52-byte message, then "done".
    let (l, addr) = listener();
    let server = thread::spawn(move || {
        let (srv, client) = PingpongServer::accept(&l, T).unwrap();
        srv.reply(&server_dest).unwrap();
        client
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"0000:000011:123456:00000000000000000000ffff0a4d0101\0")
        .unwrap();
    let mut m = [0u8; 52];
    s.read_exact(&mut m).unwrap();
    assert_eq!(&m, b"0000:000012:abcdef:00000000000000000000ffff0a4d0102\0");
    s.write_all(b"done\0").unwrap();
    assert_eq!(server.join().unwrap(), client_dest);

    // A client that sends garbage gets named as such.
    let (l, addr) = listener();
    let server = thread::spawn(move || PingpongServer::accept(&l, T).err().unwrap());
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[b'x'; 52]).unwrap();
    let e = server.join().unwrap();
    assert!(e.to_string().contains("LID:QPN:PSN:GID"), "{e}");
}

#[test]
fn perftest_sequence_between_client_and_server() {
    let (l, addr) = listener();
    let dest = |qpn: u32, last: u8| PerftestDest {
        lid: 0,
        out_reads: 16,
        qpn,
        psn: qpn * 7,
        rkey: 0x100 + qpn,
        vaddr: 0x7f00_0000_0000 + qpn as u64,
        gid: Some(Gid::from_ipv4([10, 77, 1, last])),
        srqn: 0,
    };
    let server = thread::spawn(move || {
        let mut c = PerftestConn::accept(&l, T).unwrap();
        let v = c.exchange_versions("6.06").unwrap();
        let sys = c.exchange_sys_data(4096, 64).unwrap();
        let mtu = c.exchange_mtu(4096).unwrap();
        let rem = c.hand_shake(&dest(0x21, 2)).unwrap();
        c.hand_shake(&dest(0x21, 2)).unwrap(); // barrier after RTS
        let rep = c
            .exchange_bw_report(&BwReport {
                size: 65536,
                iters: 5000,
                bw_peak: 1.5,
                bw_avg: 1.25,
                msg_rate_avg: 0.02,
            })
            .unwrap();
        c.close(&dest(0x21, 2)).unwrap();
        (v, sys, mtu, rem, rep)
    });
    let mut c = PerftestConn::connect(addr, T).unwrap();
    assert_eq!(c.exchange_versions("6.06").unwrap(), "6.06");
    assert_eq!(c.exchange_sys_data(8192, 64).unwrap(), (4096, 64));
    assert_eq!(c.exchange_mtu(1024).unwrap(), 1024, "the smaller MTU");
    assert_eq!(c.hand_shake(&dest(0x11, 1)).unwrap(), dest(0x21, 2));
    c.hand_shake(&dest(0x11, 1)).unwrap();
    let rep = c.exchange_bw_report(&BwReport::default()).unwrap();
    assert_eq!(rep.iters, 5000);
    assert_eq!(rep.bw_avg, 1.25);
    c.close(&dest(0x11, 1)).unwrap();
    let (v, sys, mtu, rem, _) = server.join().unwrap();
    assert_eq!(v, "6.06");
    assert_eq!(sys, (8192, 64));
    assert_eq!(mtu, 1024);
    assert_eq!(rem, dest(0x11, 1));

    // An old perftest is refused as perftest refuses it.
    let (l, addr) = listener();
    let server = thread::spawn(move || {
        let mut c = PerftestConn::accept(&l, T).unwrap();
        c.exchange_versions("5.60").err().unwrap()
    });
    let mut c = PerftestConn::connect(addr, T).unwrap();
    let e = c.exchange_versions("5.60").unwrap_err();
    assert!(e.to_string().contains("5.70"), "{e}");
    server.join().unwrap();
}
