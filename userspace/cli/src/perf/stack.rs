//! One side's RDMA stack, opened from the CLI's flags: xroce's
//! [`xroce::stack::Stack`] (interface, engine, backend, I/O thread), with
//! errors that name the flag to change.

use std::{
    net::{IpAddr, Ipv4Addr},
    ops::Deref,
    time::Duration,
};

use anyhow::{bail, Context};
use xroce::{
    cc::CcKind,
    device::BackendKind,
    stack::{Stack as XStack, StackConfig, StackError},
    verbs::Mtu,
};

use super::PerfArgs;

/// What a stack is opened with (the part of the CLI flags it needs).
#[derive(Clone, Debug)]
pub struct StackOptions {
    pub iface: String,
    pub backend: BackendKind,
    /// Path MTU in bytes; `None`: the largest the interface allows.
    pub mtu: Option<u32>,
    pub cc: CcKind,
    /// Line rate in bits per second.
    pub line_rate_bps: u64,
    pub busy_poll: bool,
    pub spin_after_activity: std::time::Duration,
    pub stream_nap: std::time::Duration,
}

impl From<&PerfArgs> for StackOptions {
    fn from(a: &PerfArgs) -> Self {
        StackOptions {
            iface: a.iface.clone(),
            backend: a.backend.into(),
            mtu: a.mtu,
            cc: a.cc,
            line_rate_bps: a.rate.value,
            busy_poll: a.busy_poll,
            spin_after_activity: std::time::Duration::from_micros(a.spin_us),
            stream_nap: std::time::Duration::from_micros(a.stream_nap_us),
        }
    }
}

/// xroce's stack ([`xroce::stack::Stack`]) opened from the CLI's flags,
/// and the address (IPv4 or IPv6) this side speaks RoCEv2 from.
pub struct Stack {
    inner: XStack,
    local_ip: IpAddr,
}

impl Deref for Stack {
    type Target = XStack;
    fn deref(&self) -> &XStack {
        &self.inner
    }
}

impl Stack {
    /// Opens `args.iface` for RoCEv2 from `local_ip`, or from the
    /// address of GID `-x N`.
    pub fn open(args: &PerfArgs, local_ip: IpAddr) -> anyhow::Result<Stack> {
        let local_ip = super::flags::source_ip(args, local_ip)?;
        Self::open_threads(
            &StackOptions::from(args),
            local_ip,
            usize::from(args.io_threads),
        )
    }

    pub fn open_with(opts: &StackOptions, local_ip: IpAddr) -> anyhow::Result<Stack> {
        Self::open_threads(opts, local_ip, 1)
    }

    /// As [`Stack::open_with`] over `io_threads` I/O threads (`--io-threads`):
    /// the stack's device then spreads the QPs created on it over them.
    pub fn open_threads(
        opts: &StackOptions,
        local_ip: IpAddr,
        io_threads: usize,
    ) -> anyhow::Result<Stack> {
        // An IPv6 address must be the interface's; the engine's IPv4 one
        // is then the interface's first, if it has one.
        let ip = match local_ip {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(a) => {
                let (_, v6) = xroce::device::interface_addrs(&opts.iface)?;
                if !v6.contains(&a) {
                    bail!("{a} is not an address of {} (-d/--iface)", opts.iface);
                }
                None
            }
        };
        let path_mtu = opts
            .mtu
            .map(|m| {
                Mtu::from_bytes(m)
                    .with_context(|| format!("--mtu {m}: use 256, 512, 1024, 2048 or 4096"))
            })
            .transpose()?;
        let stack = XStack::open(&StackConfig {
            iface: opts.iface.clone(),
            backend: Some(opts.backend),
            local_ip: ip,
            path_mtu,
            cc: opts.cc,
            line_rate_bps: opts.line_rate_bps,
            busy_poll: opts.busy_poll,
            spin_after_activity: opts.spin_after_activity,
            stream_nap: opts.stream_nap,
            io_threads,
            // Each connection sets its QPs' mode (--recovery, conn.rs).
            selective_repeat: xroce::engine::SrMode::Auto,
            app_progress: true,
        })
        .map_err(|e| match e {
            StackError::NotOurAddress { .. } => {
                anyhow::anyhow!("{e} (-d/--iface)")
            }
            StackError::MtuTooLarge { fits, .. } => anyhow::anyhow!("--mtu: {e} (--mtu {fits})"),
            e => anyhow::Error::new(e),
        })?;
        Ok(Stack {
            inner: stack,
            local_ip,
        })
    }

    /// The GID of the address this side speaks from (IPv4-mapped or IPv6).
    pub fn gid(&self) -> xroce_wire::Gid {
        xroce_wire::Gid::from(self.local_ip)
    }

    /// MAC to reach `peer` on this link (ARP/NDP).
    pub fn neighbour(&self, peer: IpAddr) -> anyhow::Result<[u8; 6]> {
        Ok(self.inner.neighbour(peer, Duration::from_secs(3))?)
    }

    /// Fails if the I/O thread stopped on an error.
    pub fn check_running(&self) -> anyhow::Result<()> {
        if !self.inner.is_running() {
            bail!("the {} packet I/O thread stopped", self.backend);
        }
        Ok(())
    }
}

/// The first IPv4 address of `iface`, for a server listening on 0.0.0.0.
pub fn first_ipv4(iface: &str) -> anyhow::Result<Ipv4Addr> {
    let (v4, _) = xroce::device::interface_addrs(iface)?;
    v4.first().copied().with_context(|| {
        format!("{iface} has no IPv4 address; add one or listen on a specific one")
    })
}
