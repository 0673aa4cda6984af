//! Connection setup over TCP: how two peers learn each other's QP numbers,
//! PSNs, GIDs, MACs, MTU and memory keys before their QPs go to RTS.
//!
//! - [`Session`]: xroce's own exchange, a fixed binary layout with a magic,
//!   a version and a CRC, for any number of QPs ([`ConnInfo`]), plus
//!   barriers ([`Session::sync`]) and opaque blobs (results) afterwards.
//! - [`pingpong`]: rdma-core's ibv_rc_pingpong out-of-band format, so that
//!   tool can be the peer.
//! - [`perftest`]: perftest's (ib_write_bw, ib_read_bw, ib_send_bw,
//!   ib_atomic_bw, *_lat) exchange over its TCP socket.
//!
//! Every read has a timeout; a peer that disconnects, stalls or sends
//! garbage ends in a [`ConnectError`] that says which.
//!
//! ```ignore
//! // server                                  // client
//! let mut s = Session::accept(&listener, t)?; let mut s = Session::connect(addr, t)?;
//! let peers = s.exchange(&[mine])?;           let peers = s.exchange(&[mine])?;
//! // ... QPs to RTS with peers[i] ...
//! s.sync(1)?;                                 s.sync(1)?;
//! ```

pub mod perftest;
pub mod pingpong;

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs},
    time::{Duration, Instant},
};

use xroce_wire::Gid;

/// Default TCP port of `xroce bench` (perftest's is 18515 too).
pub const DEFAULT_PORT: u16 = 18515;

/// What went wrong while talking to the peer.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connection setup: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connection setup: the peer did not answer within {after:?} while {what}")]
    Timeout { what: String, after: Duration },
    #[error("connection setup: the peer closed the connection while {what}")]
    Closed { what: String },
    #[error("connection setup: the peer sent something that is not {what}: {detail}")]
    Garbage { what: String, detail: String },
    #[error("connection setup: peer speaks xroce exchange version {theirs}, we speak {ours}")]
    Version { ours: u16, theirs: u16 },
    #[error("connection setup: could not connect to {addr} within {after:?}: {source}")]
    Connect {
        addr: String,
        after: Duration,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = ConnectError> = std::result::Result<T, E>;

pub(crate) fn garbage(what: &str, detail: impl Into<String>) -> ConnectError {
    ConnectError::Garbage {
        what: what.into(),
        detail: detail.into(),
    }
}

/// Reads exactly `buf.len()` bytes; every read bounded by `timeout`.
pub(crate) fn read_exact(
    stream: &mut TcpStream,
    buf: &mut [u8],
    timeout: Duration,
    what: &str,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut done = 0;
    while done < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ConnectError::Timeout {
                what: what.into(),
                after: timeout,
            });
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|source| ConnectError::Io {
                what: format!("set a read timeout while {what}"),
                source,
            })?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => {
                return Err(ConnectError::Closed { what: what.into() });
            }
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(ConnectError::Timeout {
                    what: what.into(),
                    after: timeout,
                })
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                ) =>
            {
                return Err(ConnectError::Closed { what: what.into() })
            }
            Err(source) => {
                return Err(ConnectError::Io {
                    what: what.into(),
                    source,
                })
            }
        }
    }
    Ok(())
}

pub(crate) fn write_all(
    stream: &mut TcpStream,
    buf: &[u8],
    timeout: Duration,
    what: &str,
) -> Result<()> {
    let _ = stream.set_write_timeout(Some(timeout));
    stream.write_all(buf).map_err(|source| match source.kind() {
        ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => {
            ConnectError::Closed { what: what.into() }
        }
        ErrorKind::WouldBlock | ErrorKind::TimedOut => ConnectError::Timeout {
            what: what.into(),
            after: timeout,
        },
        _ => ConnectError::Io {
            what: what.into(),
            source,
        },
    })
}

/// Connects to `addr`, retrying until `timeout` (the server may not be
/// listening yet).
pub fn connect_retry(addr: impl ToSocketAddrs, timeout: Duration) -> Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| ConnectError::Io {
            what: "resolve the peer's address".into(),
            source,
        })?
        .collect();
    let shown = addrs
        .first()
        .map_or_else(|| "(no address)".to_string(), |a| a.to_string());
    let deadline = Instant::now() + timeout;
    loop {
        let mut last = std::io::Error::new(ErrorKind::NotFound, "no address to connect to");
        for a in &addrs {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        if Instant::now() >= deadline {
            return Err(ConnectError::Connect {
                addr: shown,
                after: timeout,
                source: last,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Accepts one connection on `listener`, waiting at most `timeout`.
pub fn accept_timeout(listener: &TcpListener, timeout: Duration) -> Result<TcpStream> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| ConnectError::Io { what, source }
    };
    listener
        .set_nonblocking(true)
        .map_err(io("make the listener non-blocking"))?;
    let deadline = Instant::now() + timeout;
    let result = loop {
        match listener.accept() {
            Ok((s, _)) => break Ok(s),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    break Err(ConnectError::Timeout {
                        what: "waiting for a client to connect".into(),
                        after: timeout,
                    });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(source) => {
                break Err(ConnectError::Io {
                    what: "accept a client".into(),
                    source,
                })
            }
        }
    };
    let _ = listener.set_nonblocking(false);
    let s = result?;
    s.set_nonblocking(false)
        .map_err(io("make the connection blocking"))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Which side of the TCP connection we are (the client talks first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// One QP's connection data, as xroce peers exchange it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnInfo {
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN the peer's requester uses (24 bits).
    pub psn: u32,
    pub gid: Gid,
    pub mac: [u8; 6],
    /// IB path MTU: 256, 512, 1024, 2048 or 4096.
    pub mtu: u32,
    /// Start of the memory region the peer may access.
    pub mr_addr: u64,
    pub rkey: u32,
    pub mr_len: u64,
}

/// "XRCE".
pub const MAGIC: [u8; 4] = *b"XRCE";
/// Version of the exchange layout below.
pub const VERSION: u16 = 1;
const HEADER_LEN: usize = 12;
/// Bytes of one [`ConnInfo`] on the wire.
pub const INFO_LEN: usize = 56;
/// Most QPs one exchange carries.
pub const MAX_QPS: usize = 4096;
const SYNC_MAGIC: [u8; 4] = *b"XRSY";
const BLOB_MAGIC: [u8; 4] = *b"XRBL";
/// Largest blob [`Session::exchange_blob`] accepts.
pub const MAX_BLOB: usize = 1 << 20;

impl ConnInfo {
    /// Big-endian fixed layout: qpn u32, psn u32, gid 16 bytes, mac 6 bytes,
    /// mtu u16, mr_addr u64, rkey u32, mr_len u64, 4 reserved bytes.
    pub fn encode(&self, out: &mut [u8; INFO_LEN]) {
        out[0..4].copy_from_slice(&self.qpn.to_be_bytes());
        out[4..8].copy_from_slice(&self.psn.to_be_bytes());
        out[8..24].copy_from_slice(&self.gid.0);
        out[24..30].copy_from_slice(&self.mac);
        out[30..32].copy_from_slice(&(self.mtu as u16).to_be_bytes());
        out[32..40].copy_from_slice(&self.mr_addr.to_be_bytes());
        out[40..44].copy_from_slice(&self.rkey.to_be_bytes());
        out[44..52].copy_from_slice(&self.mr_len.to_be_bytes());
        out[52..56].fill(0);
    }

    /// Parses and validates one entry.
    pub fn decode(b: &[u8; INFO_LEN]) -> Result<ConnInfo> {
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        let info = ConnInfo {
            qpn: u32_at(0),
            psn: u32_at(4),
            gid: Gid(b[8..24].try_into().unwrap()),
            mac: b[24..30].try_into().unwrap(),
            mtu: u16::from_be_bytes([b[30], b[31]]) as u32,
            mr_addr: u64_at(32),
            rkey: u32_at(40),
            mr_len: u64_at(44),
        };
        info.validate()?;
        Ok(info)
    }

    /// Checks field ranges (QPN/PSN 24 bits, a valid IB MTU, MR bounds).
    pub fn validate(&self) -> Result<()> {
        let what = "xroce connection data";
        if self.qpn > 0xff_ffff || self.qpn < 2 {
            return Err(garbage(
                what,
                format!("QPN {:#x} is not a usable QP", self.qpn),
            ));
        }
        if self.psn > 0xff_ffff {
            return Err(garbage(
                what,
                format!("PSN {:#x} has more than 24 bits", self.psn),
            ));
        }
        if !matches!(self.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(garbage(what, format!("MTU {} is not an IB MTU", self.mtu)));
        }
        if self.mr_addr.checked_add(self.mr_len).is_none() {
            return Err(garbage(what, "memory region wraps around"));
        }
        Ok(())
    }
}

/// Encodes a full exchange message for `infos`.
pub fn encode_message(infos: &[ConnInfo]) -> Vec<u8> {
    let mut m = Vec::with_capacity(HEADER_LEN + infos.len() * INFO_LEN + 4);
    m.extend_from_slice(&MAGIC);
    m.extend_from_slice(&VERSION.to_be_bytes());
    m.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    let mut e = [0u8; INFO_LEN];
    for i in infos {
        i.encode(&mut e);
        m.extend_from_slice(&e);
    }
    let crc = crc32fast::hash(&m);
    m.extend_from_slice(&crc.to_be_bytes());
    m
}

/// The QP count of a message header, after checking magic and version.
fn decode_header(h: &[u8; HEADER_LEN]) -> Result<usize> {
    if h[0..4] != MAGIC {
        return Err(garbage(
            "an xroce peer's connection data",
            format!(
                "starts with {:02x?} ({:?}), not \"XRCE\": is the peer an xroce bench?",
                &h[0..4],
                String::from_utf8_lossy(&h[0..4])
            ),
        ));
    }
    let version = u16::from_be_bytes([h[4], h[5]]);
    if version != VERSION {
        return Err(ConnectError::Version {
            ours: VERSION,
            theirs: version,
        });
    }
    let count = u16::from_be_bytes([h[6], h[7]]) as usize;
    if count == 0 || count > MAX_QPS {
        return Err(garbage(
            "xroce connection data",
            format!("QP count {count} (1..={MAX_QPS})"),
        ));
    }
    Ok(count)
}

/// Decodes a whole message (the inverse of [`encode_message`]).
pub fn decode_message(m: &[u8]) -> Result<Vec<ConnInfo>> {
    if m.len() < HEADER_LEN {
        return Err(garbage("xroce connection data", "shorter than its header"));
    }
    let count = decode_header(m[..HEADER_LEN].try_into().unwrap())?;
    let want = HEADER_LEN + count * INFO_LEN + 4;
    if m.len() != want {
        return Err(garbage(
            "xroce connection data",
            format!("{} bytes for {count} QPs, expected {want}", m.len()),
        ));
    }
    let crc = u32::from_be_bytes(m[want - 4..].try_into().unwrap());
    if crc32fast::hash(&m[..want - 4]) != crc {
        return Err(garbage("xroce connection data", "CRC mismatch"));
    }
    m[HEADER_LEN..want - 4]
        .chunks_exact(INFO_LEN)
        .map(|c| ConnInfo::decode(c.try_into().unwrap()))
        .collect()
}

/// An xroce peer connection.
pub struct Session {
    stream: TcpStream,
    role: Role,
    timeout: Duration,
}

impl Session {
    /// Wraps an established stream; `timeout` bounds every read.
    pub fn new(stream: TcpStream, role: Role, timeout: Duration) -> Self {
        let _ = stream.set_nodelay(true);
        Self {
            stream,
            role,
            timeout,
        }
    }

    /// Connects to a listening peer (retrying until `timeout`).
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Self> {
        Ok(Self::new(
            connect_retry(addr, timeout)?,
            Role::Client,
            timeout,
        ))
    }

    /// Waits for one peer on `listener`.
    pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<Self> {
        Ok(Self::new(
            accept_timeout(listener, timeout)?,
            Role::Server,
            timeout,
        ))
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Changes the bound on every later read (e.g. while the peer runs a
    /// measurement of known length).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.stream.peer_addr().ok()
    }

    /// The underlying stream (e.g. to notice the peer going away).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    fn send_then_recv<T>(
        &mut self,
        send: impl FnOnce(&mut Self) -> Result<()>,
        recv: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        match self.role {
            Role::Client => {
                send(self)?;
                recv(self)
            }
            Role::Server => {
                let r = recv(self)?;
                send(self)?;
                Ok(r)
            }
        }
    }

    /// Sends our QPs' data and returns the peer's (client first).
    pub fn exchange(&mut self, local: &[ConnInfo]) -> Result<Vec<ConnInfo>> {
        if local.is_empty() || local.len() > MAX_QPS {
            return Err(garbage(
                "a QP list to send",
                format!("{} QPs (1..={MAX_QPS})", local.len()),
            ));
        }
        for i in local {
            i.validate()?;
        }
        let msg = encode_message(local);
        let t = self.timeout;
        self.send_then_recv(
            |s| write_all(&mut s.stream, &msg, t, "sending our connection data"),
            |s| {
                let what = "reading the peer's connection data";
                let mut h = [0u8; HEADER_LEN];
                read_exact(&mut s.stream, &mut h, t, what)?;
                let count = decode_header(&h)?;
                let mut m = vec![0u8; HEADER_LEN + count * INFO_LEN + 4];
                m[..HEADER_LEN].copy_from_slice(&h);
                read_exact(&mut s.stream, &mut m[HEADER_LEN..], t, what)?;
                decode_message(&m)
            },
        )
    }

    /// A barrier: both sides send step `n` and wait for the other's.
    pub fn sync(&mut self, n: u32) -> Result<()> {
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&SYNC_MAGIC);
        msg[4..].copy_from_slice(&n.to_be_bytes());
        let t = self.timeout;
        let what = format!("waiting for the peer at sync point {n}");
        let got = self.send_then_recv(
            |s| write_all(&mut s.stream, &msg, t, &what),
            |s| {
                let mut b = [0u8; 8];
                read_exact(&mut s.stream, &mut b, t, &what)?;
                Ok(b)
            },
        )?;
        if got[..4] != SYNC_MAGIC {
            return Err(garbage("a sync message", format!("{:02x?}", &got[..4])));
        }
        let theirs = u32::from_be_bytes(got[4..].try_into().unwrap());
        if theirs != n {
            return Err(garbage(
                "the expected sync point",
                format!("peer is at {theirs}, we are at {n}"),
            ));
        }
        Ok(())
    }

    /// Exchanges opaque bytes (e.g. JSON results), at most [`MAX_BLOB`].
    pub fn exchange_blob(&mut self, ours: &[u8]) -> Result<Vec<u8>> {
        if ours.len() > MAX_BLOB {
            return Err(garbage("a blob to send", format!("{} bytes", ours.len())));
        }
        let mut msg = Vec::with_capacity(8 + ours.len());
        msg.extend_from_slice(&BLOB_MAGIC);
        msg.extend_from_slice(&(ours.len() as u32).to_be_bytes());
        msg.extend_from_slice(ours);
        let t = self.timeout;
        self.send_then_recv(
            |s| write_all(&mut s.stream, &msg, t, "sending results"),
            |s| {
                let what = "reading the peer's results";
                let mut h = [0u8; 8];
                read_exact(&mut s.stream, &mut h, t, what)?;
                if h[..4] != BLOB_MAGIC {
                    return Err(garbage("a results message", format!("{:02x?}", &h[..4])));
                }
                let len = u32::from_be_bytes(h[4..].try_into().unwrap()) as usize;
                if len > MAX_BLOB {
                    return Err(garbage("a results message", format!("{len} bytes")));
                }
                let mut b = vec![0u8; len];
                read_exact(&mut s.stream, &mut b, t, what)?;
                Ok(b)
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(qpn: u32) -> ConnInfo {
        ConnInfo {
            qpn,
            psn: 0xabcdef,
            gid: Gid::from(std::net::Ipv4Addr::new(10, 0, 0, 1)),
            mac: [2, 0, 0, 0, 0, 1],
            mtu: 1024,
            mr_addr: 0x7f00_0000_1000,
            rkey: 0x1234_5678,
            mr_len: 1 << 20,
        }
    }

    #[test]
    fn message_roundtrip_and_exact_bytes() {
        let m = encode_message(&[info(0x11)]);
        assert_eq!(m.len(), HEADER_LEN + INFO_LEN + 4);
        assert_eq!(&m[..12], b"XRCE\x00\x01\x00\x01\x00\x00\x00\x00");
        assert_eq!(&m[12..16], &[0, 0, 0, 0x11]);
        assert_eq!(&m[16..20], &[0, 0xab, 0xcd, 0xef]);
        assert_eq!(&m[20..36], &Gid::from_ipv4([10, 0, 0, 1]).0);
        assert_eq!(&m[42..44], &1024u16.to_be_bytes());
        assert_eq!(decode_message(&m).unwrap(), vec![info(0x11)]);
        let many: Vec<_> = (2..18).map(info).collect();
        assert_eq!(decode_message(&encode_message(&many)).unwrap(), many);
    }

    #[test]
    fn garbage_is_rejected_with_a_reason() {
        let good = encode_message(&[info(0x11)]);
        let err = |m: &[u8]| decode_message(m).unwrap_err().to_string();
        assert!(err(b"GET / HTTP/1.1\r\n\r\n").contains("not \"XRCE\""));
        assert!(err(&good[..20]).contains("expected"));
        assert!(err(&good[..5]).contains("shorter"));
        let mut v = good.clone();
        v[5] = 9;
        assert!(err(&v).contains("version 9"), "{}", err(&v));
        let mut c = good.clone();
        c[30] ^= 1;
        assert!(err(&c).contains("CRC"));
        let mut z = good.clone();
        z[6] = 0;
        z[7] = 0;
        assert!(err(&z).contains("QP count 0"));
        let mut bad_mtu = info(0x11);
        bad_mtu.mtu = 1500;
        assert!(bad_mtu
            .validate()
            .unwrap_err()
            .to_string()
            .contains("MTU 1500"));
        let mut bad_psn = info(0x11);
        bad_psn.psn = 1 << 24;
        assert!(bad_psn.validate().is_err());
        assert!(info(1).validate().is_err(), "QP 0/1 are special");
    }
}
