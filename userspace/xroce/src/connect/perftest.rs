//! perftest's out-of-band exchange over its TCP socket (ib_write_bw,
//! ib_read_bw, ib_send_bw, ib_atomic_bw and the *_lat tools, without
//! `--rdma_cm`), as in perftest 4.5-0.17 (Debian 12; its VERSION is "6.06")
//! and kept compatible since.
//!
//! Every exchange is symmetric in size; the client (the side given a server
//! name) writes first and then reads, the server reads first and then
//! writes. The tools run this sequence:
//!
//! 1. versions: 16 bytes each way, the version string NUL padded
//!    ([`PerftestConn::exchange_versions`]); a peer older than 5.70 is
//!    refused by perftest.
//! 2. if the remote version >= 5.32: cycle buffer, then cache line size,
//!    each a 4-byte big-endian int ([`PerftestConn::exchange_sys_data`]).
//! 3. if the remote version >= 5.1: the MTU as `sprintf("%d", ibv_mtu)` in 2
//!    bytes (4 if the remote version < 5.31); each side takes the smaller
//!    ([`PerftestConn::exchange_mtu`]).
//! 4. one [`PerftestDest`] per QP ("hand shake"): `KEY_PRINT_FMT_GID`, 108
//!    bytes, when a GID is used (always on RoCE), else `KEY_PRINT_FMT`, 59
//!    bytes ([`PerftestConn::hand_shake`]).
//! 5. further hand shakes of QP 0's data as barriers (after RTS, before and
//!    after the measurement).
//! 6. bw tools: the results ([`BwReport`], [`PerftestConn::exchange_bw_report`]).
//! 7. close: one more hand shake, then "done\0" written (not read) by both.

use std::{
    net::{TcpListener, TcpStream, ToSocketAddrs},
    time::Duration,
};

use xroce_wire::Gid;

use super::{accept_timeout, connect_retry, garbage, read_exact, write_all, Result, Role};

/// perftest's default TCP port.
pub const PORT: u16 = 18515;
/// The version we announce (perftest 4.5-0.17's).
pub const VERSION: &str = "6.06";
/// Size of the version field.
pub const VERSION_LEN: usize = 16;
/// `KEY_MSG_SIZE`: message without GID, NUL included.
pub const KEY_MSG_SIZE: usize = 59;
/// `KEY_MSG_SIZE_GID`: message with GID, NUL included.
pub const KEY_MSG_SIZE_GID: usize = 108;

/// `struct pingpong_dest` as perftest exchanges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerftestDest {
    pub lid: u16,
    /// Outstanding RDMA reads/atomics the QP accepts.
    pub out_reads: u16,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    /// Address of the buffer the peer may access.
    pub vaddr: u64,
    /// Present on RoCE (selects the 108-byte form).
    pub gid: Option<Gid>,
    /// SRQ number (XRC/DC only; 0 otherwise).
    pub srqn: u32,
}

impl PerftestDest {
    /// Size of this message on the wire.
    pub fn message_len(&self) -> usize {
        if self.gid.is_some() {
            KEY_MSG_SIZE_GID
        } else {
            KEY_MSG_SIZE
        }
    }

    /// `KEY_PRINT_FMT[_GID]` + NUL.
    pub fn to_message(&self) -> Vec<u8> {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        match self.gid {
            Some(g) => {
                for b in g.0 {
                    text.push_str(&format!("{b:02x}:"));
                }
                text.push_str(&format!("{:08x}:", self.srqn));
            }
            None => text.push_str(&format!("{:08x}", self.srqn)),
        }
        let mut m = text.into_bytes();
        m.push(0);
        debug_assert_eq!(m.len(), self.message_len());
        m
    }

    /// Parses a message of either size (the form is told by its length).
    pub fn parse(msg: &[u8]) -> Result<PerftestDest> {
        let what = "a perftest address (LID:OUT:QPN:PSN:RKEY:VADDR[:GID]:SRQN)";
        let with_gid = match msg.len() {
            KEY_MSG_SIZE => false,
            KEY_MSG_SIZE_GID => true,
            n => {
                return Err(garbage(
                    what,
                    format!("{n} bytes, not {KEY_MSG_SIZE} or {KEY_MSG_SIZE_GID}"),
                ))
            }
        };
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end])
            .map_err(|_| garbage(what, format!("not text: {:02x?}", &msg[..end.min(16)])))?;
        let mut fields: Vec<&str> = text.split(':').collect();
        if with_gid {
            // The GID form ends with a ':'.
            if fields.last() != Some(&"") {
                return Err(garbage(what, format!("{text:?} does not end with ':'")));
            }
            fields.pop();
        }
        let want = if with_gid { 23 } else { 7 };
        if fields.len() != want {
            return Err(garbage(
                what,
                format!("{text:?} has {} fields, expected {want}", fields.len()),
            ));
        }
        let hex = |i: usize, name: &str, max: u64| -> Result<u64> {
            let s = fields[i];
            let v = u64::from_str_radix(s, 16)
                .map_err(|_| garbage(what, format!("{name} {s:?} is not hex")))?;
            if v > max {
                return Err(garbage(what, format!("{name} {s} is out of range")));
            }
            Ok(v)
        };
        let gid = if with_gid {
            let mut g = [0u8; 16];
            for (k, b) in g.iter_mut().enumerate() {
                *b = hex(6 + k, "GID byte", 0xff)? as u8;
            }
            Some(Gid(g))
        } else {
            None
        };
        Ok(PerftestDest {
            lid: hex(0, "LID", 0xffff)? as u16,
            out_reads: hex(1, "outstanding reads", 0xffff)? as u16,
            qpn: hex(2, "QPN", 0xff_ffff)? as u32,
            psn: hex(3, "PSN", 0xff_ffff)? as u32,
            rkey: hex(4, "RKEY", 0xffff_ffff)? as u32,
            vaddr: hex(5, "VADDR", u64::MAX)?,
            gid,
            srqn: hex(want - 1, "SRQN", 0xffff_ffff)? as u32,
        })
    }
}

/// `struct bw_report_data` as exchanged (remote version >= 5.33).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwReport {
    pub size: u64,
    pub iters: u64,
    /// MB/s as perftest computes them.
    pub bw_peak: f64,
    pub bw_avg: f64,
    pub msg_rate_avg: f64,
}

/// The numeric value of a version string, as perftest's `atof`.
pub fn version_number(v: &str) -> f64 {
    let v = v.trim_end_matches('\0');
    let end = v
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (c == '.' && !v[..i].contains('.'))))
        .map_or(v.len(), |(i, _)| i);
    v[..end].parse().unwrap_or(0.0)
}

/// IB MTU enum (1..5) of an MTU in bytes.
pub fn mtu_enum(mtu: u32) -> Option<i32> {
    match mtu {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// MTU in bytes of an IB MTU enum.
pub fn mtu_bytes(e: i32) -> Option<u32> {
    (1..=5).contains(&e).then(|| 128u32 << e)
}

/// A perftest-speaking TCP connection.
pub struct PerftestConn {
    stream: TcpStream,
    role: Role,
    timeout: Duration,
    /// The peer's version once [`exchange_versions`](Self::exchange_versions) ran.
    pub remote_version: Option<String>,
}

impl PerftestConn {
    /// Connects as the client (perftest run with a server name).
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Self> {
        Ok(Self {
            stream: connect_retry(addr, timeout)?,
            role: Role::Client,
            timeout,
            remote_version: None,
        })
    }

    /// Waits for a perftest client.
    pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<Self> {
        Ok(Self {
            stream: accept_timeout(listener, timeout)?,
            role: Role::Server,
            timeout,
            remote_version: None,
        })
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// The peer's address, if the socket still knows it.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.peer_addr().ok()
    }

    /// The local address of the socket (tells which interface faces the peer).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.local_addr().ok()
    }

    /// Changes the bound on every later read (perftest's server waits in a
    /// hand shake for the whole measurement).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// `ctx_xchg_data`: `ours` out, the same number of bytes in.
    pub fn xchg(&mut self, ours: &[u8], what: &str) -> Result<Vec<u8>> {
        let mut theirs = vec![0u8; ours.len()];
        let t = self.timeout;
        match self.role {
            Role::Client => {
                write_all(&mut self.stream, ours, t, what)?;
                read_exact(&mut self.stream, &mut theirs, t, what)?;
            }
            Role::Server => {
                read_exact(&mut self.stream, &mut theirs, t, what)?;
                write_all(&mut self.stream, ours, t, what)?;
            }
        }
        Ok(theirs)
    }

    fn remote_number(&self) -> f64 {
        self.remote_version.as_deref().map_or(0.0, version_number)
    }

    /// Step 1: exchanges versions; refuses peers older than 5.70 as
    /// perftest does.
    pub fn exchange_versions(&mut self, ours: &str) -> Result<String> {
        let mut v = [0u8; VERSION_LEN];
        let n = ours.len().min(VERSION_LEN - 1);
        v[..n].copy_from_slice(&ours.as_bytes()[..n]);
        let theirs = self.xchg(&v, "exchanging perftest versions")?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
        let s = std::str::from_utf8(&theirs[..end])
            .map_err(|_| garbage("a perftest version", format!("{theirs:02x?}")))?
            .to_string();
        if version_number(&s) < 5.70 {
            return Err(garbage(
                "a perftest version >= 5.70",
                format!("{s:?} (perftest refuses older peers too)"),
            ));
        }
        self.remote_version = Some(s.clone());
        Ok(s)
    }

    /// Step 2 (remote >= 5.32): cycle buffer and cache line size; returns
    /// the peer's. perftest then uses the larger of each.
    pub fn exchange_sys_data(&mut self, cycle_buffer: i32, cache_line: i32) -> Result<(i32, i32)> {
        if self.remote_number() < 5.32 {
            return Ok((cycle_buffer, cache_line));
        }
        let a = self.xchg(
            &cycle_buffer.to_be_bytes(),
            "exchanging the cycle buffer size",
        )?;
        let b = self.xchg(&cache_line.to_be_bytes(), "exchanging the cache line size")?;
        Ok((
            i32::from_be_bytes(a.try_into().unwrap()),
            i32::from_be_bytes(b.try_into().unwrap()),
        ))
    }

    /// Step 3 (remote >= 5.1): our MTU in bytes out, the MTU both use back
    /// (the smaller, as perftest picks it).
    pub fn exchange_mtu(&mut self, ours: u32) -> Result<u32> {
        let e =
            mtu_enum(ours).ok_or_else(|| garbage("an IB MTU to send", format!("{ours} bytes")))?;
        let rv = self.remote_number();
        if rv < 5.1 {
            return Ok(ours);
        }
        let size = if rv >= 5.31 { 2 } else { 4 };
        let mut m = vec![0u8; size];
        let text = e.to_string();
        m[..text.len()].copy_from_slice(text.as_bytes());
        let theirs = self.xchg(&m, "exchanging the MTU")?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(theirs.len());
        let rem = std::str::from_utf8(&theirs[..end])
            .ok()
            .and_then(|s| s.parse::<i32>().ok())
            .and_then(mtu_bytes);
        Ok(match rem {
            Some(r) if r < ours => r,
            _ => ours,
        })
    }

    /// Steps 4, 5 and 7: `ctx_hand_shake` with one QP's data.
    pub fn hand_shake(&mut self, mine: &PerftestDest) -> Result<PerftestDest> {
        let theirs = self.xchg(&mine.to_message(), "exchanging perftest QP data")?;
        PerftestDest::parse(&theirs)
    }

    /// Step 6: `xchg_bw_reports` (remote >= 5.33; no per-port reports).
    pub fn exchange_bw_report(&mut self, mine: &BwReport) -> Result<BwReport> {
        let size = self.xchg(&mine.size.to_be_bytes(), "exchanging results")?;
        let iters = self.xchg(&mine.iters.to_be_bytes(), "exchanging results")?;
        let mut f = [0f64; 3];
        for (slot, v) in f
            .iter_mut()
            .zip([mine.bw_peak, mine.bw_avg, mine.msg_rate_avg])
        {
            let b = self.xchg(&v.to_bits().to_be_bytes(), "exchanging results")?;
            *slot = f64::from_bits(u64::from_be_bytes(b.try_into().unwrap()));
        }
        Ok(BwReport {
            size: u64::from_be_bytes(size.try_into().unwrap()),
            iters: u64::from_be_bytes(iters.try_into().unwrap()),
            bw_peak: f[0],
            bw_avg: f[1],
            msg_rate_avg: f[2],
        })
    }

    /// Step 7: a last hand shake, then "done\0" (perftest never reads it).
    pub fn close(mut self, mine: &PerftestDest) -> Result<()> {
        self.finish(mine)
    }

    /// [`close`](Self::close) without giving up the connection (the
    /// caller drops it when done with it).
    pub fn finish(&mut self, mine: &PerftestDest) -> Result<()> {
        self.hand_shake(mine)?;
        let t = self.timeout;
        write_all(&mut self.stream, b"done\0", t, "sending \"done\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(gid: bool) -> PerftestDest {
        PerftestDest {
            lid: 0,
            out_reads: 0x10,
            qpn: 0x11,
            psn: 0x6a2b3c,
            rkey: 0x1a2b,
            vaddr: 0x5581_2a4f_6000,
            gid: gid.then(|| Gid::from_ipv4([192, 168, 1, 2])),
            srqn: 0,
        }
    }

    #[test]
    fn key_messages_are_byte_exact() {
        let m = dest(false).to_message();
        assert_eq!(m.len(), KEY_MSG_SIZE);
        assert_eq!(
            &m[..58],
            b"0000:0010:000011:6a2b3c:00001a2b:000055812a4f6000:00000000"
        );
        let g = dest(true).to_message();
        assert_eq!(g.len(), KEY_MSG_SIZE_GID);
        assert_eq!(
            std::str::from_utf8(&g[..107]).unwrap(),
            "0000:0010:000011:6a2b3c:00001a2b:000055812a4f6000:\
             00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:01:02:00000000:"
        );
        assert_eq!(PerftestDest::parse(&m).unwrap(), dest(false));
        assert_eq!(PerftestDest::parse(&g).unwrap(), dest(true));
    }

    #[test]
    fn malformed_key_messages_are_refused() {
        let e = |m: &[u8]| PerftestDest::parse(m).unwrap_err().to_string();
        assert!(e(b"0000:0010\0").contains("10 bytes"));
        let mut m = dest(true).to_message();
        m[2] = b'x';
        assert!(e(&m).contains("LID"), "{}", e(&m));
        let mut m = dest(true).to_message();
        m[106] = b'0'; // lose the trailing ':'
        assert!(e(&m).contains("does not end"), "{}", e(&m));
        let mut m = dest(false).to_message();
        m[4] = b'-';
        assert!(e(&m).contains("fields"), "{}", e(&m));
        let mut m = dest(true).to_message();
        m[50] = 0xff;
        assert!(e(&m).contains("not text"));
    }

    #[test]
    fn versions_and_mtus() {
        assert_eq!(version_number("6.06"), 6.06);
        assert_eq!(version_number("5.70\0\0"), 5.70);
        assert_eq!(version_number("5.5.1"), 5.5);
        assert_eq!(version_number("x"), 0.0);
        assert_eq!(mtu_enum(1024), Some(3));
        assert_eq!(mtu_bytes(5), Some(4096));
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_enum(1500), None);
    }
}
