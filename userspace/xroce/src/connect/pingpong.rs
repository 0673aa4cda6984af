//! rdma-core's ibv_rc_pingpong (and ibv_uc/ud/srq_pingpong) out-of-band
//! exchange, byte for byte:
//!
//! - one message each way: `"%04x:%06x:%06x:%s"` of LID, QPN, PSN and the
//!   GID as 32 lowercase hex digits (the 16 GID bytes in order), NUL
//!   terminated: always 52 bytes (`sizeof "0000:000000:000000:" + 32`);
//! - TCP port 18515 by default; the client connects and writes first, the
//!   server reads, brings its QP to RTR/RTS, writes its own message; the
//!   client reads it and writes `"done\0"` (5 bytes), which the server reads.
//!   Then both close the connection.
//!
//! The peer parses with `sscanf("%x:%x:%x:%s")`; we parse strictly (hex
//! fields, a 32-digit GID) and say what is wrong with anything else.

use std::{
    net::{TcpListener, TcpStream, ToSocketAddrs},
    time::Duration,
};

use xroce_wire::Gid;

use super::{accept_timeout, connect_retry, garbage, read_exact, write_all, Result};

/// ibv_rc_pingpong's default TCP port.
pub const PORT: u16 = 18515;
/// Bytes of one message, NUL included.
pub const MSG_LEN: usize = 52;
/// What the client sends after reading the server's message.
pub const DONE: &[u8; 5] = b"done\0";

/// `struct pingpong_dest` as exchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingpongDest {
    /// 0 on RoCE.
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub gid: Gid,
}

impl PingpongDest {
    /// The 52-byte message (`"%04x:%06x:%06x:%s"` + NUL).
    pub fn to_message(&self) -> [u8; MSG_LEN] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.gid.hex()
        );
        let mut m = [0u8; MSG_LEN];
        m[..text.len()].copy_from_slice(text.as_bytes());
        m
    }

    /// Parses a message (up to the first NUL).
    pub fn parse(msg: &[u8]) -> Result<PingpongDest> {
        let what = "an ibv_rc_pingpong address (LID:QPN:PSN:GID)";
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end])
            .map_err(|_| garbage(what, format!("not text: {:02x?}", &msg[..end.min(16)])))?;
        let parts: Vec<&str> = text.split(':').collect();
        if parts.len() != 4 {
            return Err(garbage(
                what,
                format!("{text:?} has {} fields", parts.len()),
            ));
        }
        let hex = |s: &str, name: &str, max: u32| -> Result<u32> {
            let v = u32::from_str_radix(s, 16)
                .map_err(|_| garbage(what, format!("{name} {s:?} is not hex")))?;
            if v > max {
                return Err(garbage(what, format!("{name} {s} is out of range")));
            }
            Ok(v)
        };
        let lid = hex(parts[0], "LID", 0xffff)? as u16;
        let qpn = hex(parts[1], "QPN", 0xff_ffff)?;
        let psn = hex(parts[2], "PSN", 0xff_ffff)?;
        let gid = Gid::from_hex(parts[3])
            .filter(|_| parts[3].len() == 32)
            .ok_or_else(|| garbage(what, format!("GID {:?} is not 32 hex digits", parts[3])))?;
        Ok(PingpongDest { lid, qpn, psn, gid })
    }
}

/// Client side: connects to `addr`, sends `mine`, returns the server's and
/// sends "done".
pub fn client_exchange(
    addr: impl ToSocketAddrs,
    mine: &PingpongDest,
    timeout: Duration,
) -> Result<PingpongDest> {
    let mut s = connect_retry(addr, timeout)?;
    client_exchange_on(&mut s, mine, timeout)
}

/// [`client_exchange`] on a connected stream.
pub fn client_exchange_on(
    s: &mut TcpStream,
    mine: &PingpongDest,
    timeout: Duration,
) -> Result<PingpongDest> {
    write_all(
        s,
        &mine.to_message(),
        timeout,
        "sending our pingpong address",
    )?;
    let mut m = [0u8; MSG_LEN];
    read_exact(s, &mut m, timeout, "reading the server's pingpong address")?;
    let theirs = PingpongDest::parse(&m)?;
    write_all(s, DONE, timeout, "sending \"done\"")?;
    Ok(theirs)
}

/// The server side, in two steps so the QP can go to RTR/RTS between
/// reading the client's address and answering (as ibv_rc_pingpong does).
pub struct PingpongServer {
    stream: TcpStream,
    timeout: Duration,
}

impl PingpongServer {
    /// Accepts one client and reads its address.
    pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<(Self, PingpongDest)> {
        let mut stream = accept_timeout(listener, timeout)?;
        let mut m = [0u8; MSG_LEN];
        read_exact(
            &mut stream,
            &mut m,
            timeout,
            "reading the client's pingpong address",
        )?;
        let theirs = PingpongDest::parse(&m)?;
        Ok((Self { stream, timeout }, theirs))
    }

    /// Sends our address and waits for the client's "done".
    pub fn reply(mut self, mine: &PingpongDest) -> Result<()> {
        let t = self.timeout;
        write_all(
            &mut self.stream,
            &mine.to_message(),
            t,
            "sending our pingpong address",
        )?;
        let mut d = [0u8; DONE.len()];
        read_exact(
            &mut self.stream,
            &mut d,
            t,
            "waiting for the client's \"done\"",
        )?;
        if &d != DONE {
            return Err(garbage(
                "\"done\"",
                format!("{:?}", String::from_utf8_lossy(&d)),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_exactly_like_ibv_rc_pingpong() {
        let d = PingpongDest {
            lid: 0,
            qpn: 0x11,
            psn: 0x5a3c1f,
            gid: Gid::from_ipv4([10, 77, 3, 1]),
        };
        let m = d.to_message();
        assert_eq!(
            MSG_LEN,
            "0000:000000:000000:00000000000000000000000000000000".len() + 1
        );
        assert_eq!(
            &m[..MSG_LEN - 1],
            b"0000:000011:5a3c1f:00000000000000000000ffff0a4d0301"
        );
        assert_eq!(m[MSG_LEN - 1], 0);
        assert_eq!(PingpongDest::parse(&m).unwrap(), d);
    }

    #[test]
    fn parses_what_rxe_peers_send() {
        // What an rxe host sends with `ibv_rc_pingpong -g 1` (IPv4-mapped GID).
        let m = b"0000:000012:e1b7a0:00000000000000000000ffffc0a87a0b\0";
        let d = PingpongDest::parse(m).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (0, 0x12, 0xe1b7a0));
        assert_eq!(d.gid.to_ipv4(), Some([192, 168, 122, 11]));
        // Anything after the NUL is ignored; uppercase hex is accepted.
        let mut m2 = *b"0001:0000AB:000001:FE800000000000000000000000000001\0";
        m2[51] = 0;
        let d2 = PingpongDest::parse(&m2).unwrap();
        assert_eq!((d2.lid, d2.qpn, d2.psn), (1, 0xab, 1));
        assert_eq!(d2.gid.0[0], 0xfe);
    }

    #[test]
    fn malformed_messages_say_why() {
        let e = |m: &[u8]| PingpongDest::parse(m).unwrap_err().to_string();
        assert!(e(b"0000:000011:000001\0").contains("3 fields"));
        assert!(e(b"zzzz:000011:000001:00000000000000000000ffff0a4d0301\0").contains("LID"));
        assert!(e(b"0000:1000000:000001:00000000000000000000ffff0a4d0301\0").contains("QPN"));
        assert!(e(b"0000:000011:000001:00000000000000000000ffff0a4d03\0").contains("32 hex"));
        assert!(e(b"0000:000011:000001:0000:0000000000000000ffff0a4d0301\0").contains("fields"));
        assert!(e(&[0xff, 0xfe, 0]).contains("not text"));
        assert!(e(b"\0").contains("1 fields"));
    }
}
