//! The out-of-band exchange of `xroce bench` / `xroce lat` over TCP: one
//! JSON object per line each way, every read with a timeout, so a peer that
//! disconnects or sends garbage gets a clear error instead of a hang.

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpStream,
    time::Duration,
};

use anyhow::{bail, Context};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Identifies the protocol; bumped when messages change.
pub const MAGIC: &str = "xroce-perf/1";

/// Client -> server: what to run.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Hello {
    pub magic: String,
    pub op: String,
    /// "bw" or "lat".
    pub mode: String,
    pub size: usize,
    pub qps: usize,
    /// Outstanding WRs per QP (and message slots per QP in the MRs).
    pub depth: usize,
    pub mtu: u32,
}

/// One side's QPs and memory.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Endpoint {
    pub mac: [u8; 6],
    pub qps: Vec<QpInfo>,
    pub mr_addr: u64,
    pub rkey: u32,
    pub mr_len: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
pub struct QpInfo {
    pub qpn: u32,
    pub psn: u32,
}

/// Client -> server when the run is over.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Done {
    /// Completed operations per QP.
    pub completed: Vec<u64>,
}

/// Server -> client: the server's check of what arrived.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Verdict {
    pub verified: bool,
    pub detail: String,
    pub cnps_sent: u64,
    pub ce_marked: u64,
}

pub struct Session {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    peer: String,
}

impl Session {
    pub fn new(stream: TcpStream, timeout: Duration) -> anyhow::Result<Self> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "peer".into());
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            peer,
        })
    }

    pub fn send<T: Serialize>(&mut self, msg: &T) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(msg)?;
        line.push(b'\n');
        self.writer
            .write_all(&line)
            .with_context(|| format!("send to {}", self.peer))
    }

    pub fn recv<T: DeserializeOwned>(&mut self, what: &str) -> anyhow::Result<T> {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                anyhow::anyhow!("{} sent no {what} in time; is it an xroce peer?", self.peer)
            } else {
                anyhow::anyhow!("reading {what} from {}: {e}", self.peer)
            }
        })?;
        if n == 0 {
            bail!("{} closed the connection before sending {what}", self.peer);
        }
        serde_json::from_str(line.trim_end()).map_err(|e| {
            let shown: String = line.chars().take(60).collect();
            anyhow::anyhow!(
                "{} sent garbage instead of {what} ({e}): {shown:?}; is it an xroce peer of the same version?",
                self.peer
            )
        })
    }
}

/// Checks the client's greeting.
pub fn check_hello(hello: &Hello) -> anyhow::Result<()> {
    if hello.magic != MAGIC {
        bail!(
            "peer speaks {:?}, not {MAGIC}: run the same xroce version on both sides",
            hello.magic
        );
    }
    if hello.qps == 0 || hello.depth == 0 {
        bail!("peer asked for {} QPs of depth {}", hello.qps, hello.depth);
    }
    Ok(())
}
